"""The kernel races at start-up say what they are doing the first time on a machine, and nothing after."""

from __future__ import annotations

import pytest

from serving import kernels
from tests.test_hf_models import hf_dir

LINE = "timing kernel choices for this CPU (once per machine"


@pytest.fixture
def fresh_machine(tmp_path, monkeypatch):
    """A cache with nothing remembered; the linear races off and the attention race instant (a real one takes
    minutes on a small CPU): what is said is under test, not what is chosen."""
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECFINOPS_TUNING", raising=False)
    for name in ("SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_BF16_KERNEL", "SPECFINOPS_DRAFT_INT8"):
        monkeypatch.setenv(name, "off")
    races = []
    monkeypatch.setattr(kernels, "_attention_race",
                        lambda dtype, masked, B, T, candidates, rounds=3: races.append(T) or candidates[-1])
    for fn in (kernels.packed_linear_rows, kernels.bf16_kernel_rows, kernels.decode_attention):
        fn.cache_clear()
    yield races
    for fn in (kernels.packed_linear_rows, kernels.bf16_kernel_rows, kernels.decode_attention):
        fn.cache_clear()


def test_first_load_on_a_machine_says_it_times_kernels_and_the_next_says_nothing(fresh_machine, tmp_path, capsys):
    from serving.worker import EngineSpec, load

    target = hf_dir(tmp_path / "target", seed=0)
    spec = EngineSpec(target=str(target), drafter="ngram", dtype="float32", k="3", max_len=128)
    load(spec)
    first = capsys.readouterr().err
    assert LINE in first and "remembered in" in first, first
    assert fresh_machine, "the races ran"
    raced = len(fresh_machine)

    kernels.decode_attention.cache_clear()  # as a new process: only the machine's memory is left
    load(spec)
    second = capsys.readouterr().err
    assert "timing kernel choices" not in second, second
    assert len(fresh_machine) == raced  # nothing raced again


def test_measure_mode_says_it_times_at_every_start(fresh_machine, monkeypatch, capsys):
    import io

    import torch

    monkeypatch.setenv("SPECFINOPS_TUNING", "measure")
    out = io.StringIO()
    kernels.measure_choices(torch.float32, out)
    assert "SPECFINOPS_TUNING=measure: at every start" in out.getvalue()
    assert LINE not in out.getvalue()


def test_into_a_pipe_or_a_log_the_notice_is_said_without_a_progress_bar(fresh_machine, monkeypatch):
    """The tqdm bar wrote carriage-return redraws into logs where stderr is no terminal; there the notice line
    alone is said, and on a terminal the bar still follows it."""
    import io

    import torch

    out = io.StringIO()  # isatty() False, as a pipe or a file
    kernels.measure_choices(torch.float32, out)
    said = out.getvalue()
    assert LINE in said and "\r" not in said and "kernel choices:" not in said, repr(said)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("SPECFINOPS_TUNING", "measure")  # timed again, not read from what the first call kept
    kernels.decode_attention.cache_clear()
    terminal = Terminal()
    kernels.measure_choices(torch.float32, terminal)
    assert "kernel choices:" in terminal.getvalue() and "\r" in terminal.getvalue(), repr(terminal.getvalue())
