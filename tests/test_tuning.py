"""serving/tuning.py: measured choices remembered per machine, and int8's row count through it."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from serving import int8, tuning


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECFINOPS_TUNING", raising=False)
    return tmp_path


class Measure:
    def __init__(self, *values: int):
        self.values, self.calls = list(values), 0

    def __call__(self) -> int:
        self.calls += 1
        return self.values.pop(0)


def _stored(cache) -> dict:
    return json.loads((cache / tuning.FILE_NAME).read_text())


def test_measured_once_then_remembered_for_this_machine(cache):
    m = Measure(3, 5)
    assert tuning.remembered("choice", m) == 3
    assert tuning.remembered("choice", m) == 3 and m.calls == 1
    assert _stored(cache) == {tuning.machine_key(): {"choice": 3}}
    # another choice joins the same machine's entry
    assert tuning.remembered("other", Measure(7)) == 7
    assert _stored(cache)[tuning.machine_key()] == {"choice": 3, "other": 7}


def test_the_key_names_cpu_torch_and_threads():
    key = tuning.machine_key()
    assert f"torch {torch.__version__}" in key and f"threads {torch.get_num_threads()}" in key


def test_the_key_tells_cpu_generations_of_one_model_name_apart(monkeypatch, tmp_path):
    """Two VMs both named 'AMD EPYC' with the same flags, one a Zen 4 (family 25), one a Zen 5 (family 26): their
    kernels rank apart, so they remember apart."""
    keys, real = [], tuning.Path
    for family in (25, 26):
        info = tmp_path / f"cpuinfo{family}"
        info.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: 17\n"
                        f"model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma avx512f avx512_bf16\n\n"
                        f"processor\t: 1\ncpu family\t: {family}\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n")
        monkeypatch.setattr(tuning, "Path", lambda p, info=info: info if p == "/proc/cpuinfo" else real(p))
        keys.append(tuning.machine_key())
    assert keys[0] != keys[1]
    assert keys[1].startswith("AMD EPYC (family 26 model 17) [avx2 avx512_bf16 avx512f fma]")


def test_another_machine_measures_afresh_and_keeps_the_first_machines_entry(cache):
    (cache / tuning.FILE_NAME).write_text(json.dumps({"some other cpu": {"choice": 9}}))
    assert tuning.remembered("choice", Measure(2)) == 2
    assert _stored(cache) == {"some other cpu": {"choice": 9}, tuning.machine_key(): {"choice": 2}}


def test_measure_mode_measures_every_time_and_writes_nothing(cache, monkeypatch):
    monkeypatch.setenv("SPECFINOPS_TUNING", "measure")
    m = Measure(1, 2)
    assert [tuning.remembered("choice", m), tuning.remembered("choice", m)] == [1, 2]
    assert not (cache / tuning.FILE_NAME).exists()


def test_refresh_replaces_the_remembered_value(cache, monkeypatch):
    tuning.remembered("choice", Measure(1))
    monkeypatch.setenv("SPECFINOPS_TUNING", "refresh")
    assert tuning.remembered("choice", Measure(4)) == 4
    monkeypatch.setenv("SPECFINOPS_TUNING", "remember")
    assert tuning.remembered("choice", Measure(8)) == 4


def test_a_bad_setting_is_named(cache, monkeypatch):
    monkeypatch.setenv("SPECFINOPS_TUNING", "sometimes")
    with pytest.raises(ValueError, match="SPECFINOPS_TUNING"):
        tuning.remembered("choice", Measure(1))


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"x": 1})])
def test_an_unreadable_file_is_measured_over(cache, text, caplog):
    (cache / tuning.FILE_NAME).write_text(text)
    with caplog.at_level(logging.WARNING):
        assert tuning.remembered("choice", Measure(6)) == 6
    assert _stored(cache)[tuning.machine_key()] == {"choice": 6}


def test_an_unwritable_cache_only_loses_the_memory(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SPECFINOPS_CACHE", str(blocker / "cache"))  # a directory under a file: not creatable
    monkeypatch.delenv("SPECFINOPS_TUNING", raising=False)
    with caplog.at_level(logging.WARNING):
        assert tuning.remembered("choice", Measure(2)) == 2
    assert "could not remember" in caplog.text


def test_a_read_only_cache_warns_once_saying_how_to_avoid_it(cache, monkeypatch, caplog):
    """A bench on a read-only cache logged 'could not remember the measurement' for every choice it measured (16
    lines): once per file per process now, with what to set."""
    from tests.readonly import read_only

    monkeypatch.setattr(tuning, "_unwritable", set(), raising=False)
    read_only(monkeypatch, cache)
    with caplog.at_level(logging.WARNING, logger="serving.tuning"):
        assert [tuning.remembered(f"choice{i}", Measure(i)) for i in range(4)] == [0, 1, 2, 3]
    warned = [r.getMessage() for r in caplog.records if "could not remember" in r.getMessage()]
    assert len(warned) == 1, warned
    assert str(cache / tuning.FILE_NAME) in warned[0] and "set SPECFINOPS_CACHE to a writable folder" in warned[0]
    assert not (cache / tuning.FILE_NAME).exists()


def test_int8_rows_are_raced_once_per_machine(cache, monkeypatch):
    races = []

    def int8_wins(quant, plain, xs, evict):
        races.append(1)
        return 1.0, 2.0

    monkeypatch.setattr(int8, "_step_race", int8_wins)
    monkeypatch.setenv("SPECFINOPS_DRAFT_INT8", "auto")
    int8.int8_max_rows.cache_clear()
    try:
        assert int8.int8_max_rows(torch.float32) == max(int8.ROWS)
        raced = len(races)
        assert raced == len(int8.ROWS)
        int8.int8_max_rows.cache_clear()  # a new process
        assert int8.int8_max_rows(torch.float32) == max(int8.ROWS) and len(races) == raced
        # what is remembered is what a later process uses
        data = _stored(cache)
        data[tuning.machine_key()]["int8_max_rows/float32"] = 1
        (cache / tuning.FILE_NAME).write_text(json.dumps(data))
        int8.int8_max_rows.cache_clear()
        assert int8.int8_max_rows(torch.float32) == 1 and len(races) == raced
    finally:
        int8.int8_max_rows.cache_clear()


def test_the_attention_races_are_remembered_so_every_process_decodes_alike(cache, monkeypatch):
    """The masked batch's fused-attention choice flipped between processes on an AMX Xeon (software versions
    'packed+fused/mask-fused>=9' and 'packed+fused'), and two runs of one sampled bf16 command at concurrency 2
    decoded different tokens. The attention races now go through tuning.remembered like int8's row count."""
    from serving import kernels

    monkeypatch.setenv("SPECFINOPS_DECODE_ATTENTION", "auto")
    monkeypatch.setenv("SPECFINOPS_ATTENTION_FLOAT32", "auto")
    kernels.decode_attention.cache_clear()
    first = kernels.decode_attention(torch.bfloat16, 5, masked=True)
    entry = _stored(cache)[tuning.machine_key()]
    assert entry["decode_attention/bfloat16/masked/4/5"] == kernels.DECODE_ATTENTION.index(first)
    assert all(f"decode_attention/bfloat16/masked/4/{w}" in entry for w in kernels.ATTENTION_WIDTHS)
    # a new process (caches cleared) whose race would come out otherwise takes the remembered choice
    other = next(k for k in kernels.DECODE_ATTENTION if k != first)
    entry["decode_attention/bfloat16/masked/4/5"] = kernels.DECODE_ATTENTION.index(other)
    (cache / tuning.FILE_NAME).write_text(json.dumps({tuning.machine_key(): entry}))
    kernels.decode_attention.cache_clear()
    assert kernels.decode_attention(torch.bfloat16, 5, masked=True) == other
    kernels.decode_attention.cache_clear()


@pytest.fixture
def linear_races(cache, monkeypatch):
    """The linear races (packed copy, C bf16 kernel) made countable on any CPU: a CPU that emulates bf16, packs and
    has the C kernel, whose candidates give F.linear's numbers, and a timer (`kernels._race`) under which each new
    race comes out otherwise, as on a loaded VM (the C kernel's span came out (1, 19) then (3, 4) on one AVX2
    EPYC): the packed copy from 5 rows, then 2, then 20; the C kernel at 3-4 rows, then 1-19, then from 2 on.
    Yields {kind: one entry per race run}."""
    from serving import bf16_kernel, kernels

    races = {"packed": [], "bf16": []}
    rows = {"packed": kernels.ROWS, "bf16": kernels.KERNEL_ROWS}
    wins = {"packed": [{5, 20}, {2, 5, 20}, {20}], "bf16": [{3}, {1, 2, 3, 5}, {2, 3, 5, 20, 64}]}
    calls = {"packed": 0, "bf16": 0}

    def timer(fast, plain, reps=30, rounds=5):
        kind = "packed" if reps == 3 else "bf16"  # packed_linear_rows times 3 reps a round, the C kernel 2
        race, at = divmod(calls[kind], len(rows[kind]))
        calls[kind] += 1
        if at == 0:
            races[kind].append(race)
        return (0.5, 1.0) if rows[kind][at] in wins[kind][race] else (1.0, 1.0)

    monkeypatch.setattr(kernels, "_race", timer)
    monkeypatch.setattr(kernels, "_pack", lambda weight: weight)
    monkeypatch.setattr(kernels, "pack_dtype", lambda dtype: dtype if dtype in kernels.PACKABLE else None)
    monkeypatch.setattr(kernels, "_gives_linear_numbers", lambda *args, **kwargs: True)
    monkeypatch.setattr(kernels, "native_bf16", lambda: False)
    monkeypatch.setattr(bf16_kernel, "available", lambda: True)
    for name in ("SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_BF16_KERNEL"):
        monkeypatch.setenv(name, "auto")
    kernels.packed_linear_rows.cache_clear()
    kernels.bf16_kernel_rows.cache_clear()
    yield races
    kernels.packed_linear_rows.cache_clear()
    kernels.bf16_kernel_rows.cache_clear()


def _new_process() -> None:
    from serving import kernels

    kernels.packed_linear_rows.cache_clear()
    kernels.bf16_kernel_rows.cache_clear()
    kernels.decode_attention.cache_clear()


def test_the_linear_races_run_once_per_machine(linear_races, cache, monkeypatch):
    """The packed-copy and C-kernel races ran in every process (26 s and 66 s a start on a loaded 2-core AVX2
    machine) and their choice flipped between processes; now the first measurement is remembered."""
    from serving import kernels

    assert kernels.packed_linear_rows(torch.bfloat16) == 5
    assert kernels.bf16_kernel_rows(torch.bfloat16) == (3, 4)
    assert len(linear_races["packed"]) == len(linear_races["bf16"]) == 1
    entry = _stored(cache)[tuning.machine_key()]
    assert entry["packed_linear_rows/bfloat16"] == 5
    assert entry["bf16_kernel_rows/bfloat16/against-packed>=5"] == 3 * kernels.SPAN_BASE + 4
    _new_process()
    # the next process reads the choices (a race now would come out (1, 19)) and measures nothing
    assert kernels.packed_linear_rows(torch.bfloat16) == 5 and kernels.bf16_kernel_rows(torch.bfloat16) == (3, 4)
    assert len(linear_races["packed"]) == len(linear_races["bf16"]) == 1
    monkeypatch.setattr(kernels, "attention_label", lambda dtype: "attention")  # not under test (a real race)
    assert kernels.kernels_label(torch.bfloat16) == "bf16c3-4,packed>=5+attention"


@pytest.mark.parametrize(("packed", "span", "stored"), [(None, None, (0, 0)), (1, (2, None), (1, 2000)),
                                                       (20, (64, None), (20, 64000)), (2, (1, 1), (2, 1001))])
def test_every_linear_choice_is_read_back_as_it_was_measured(linear_races, cache, packed, span, stored):
    """None (no packed copy, no C kernel: 0) and an open span (lo, None: lo * 1000) survive the int encoding."""
    from serving import kernels

    against = "plain" if packed is None else f"packed>={packed}"
    data = {tuning.machine_key(): {"packed_linear_rows/bfloat16": stored[0],
                                   f"bf16_kernel_rows/bfloat16/against-{against}": stored[1]}}
    (cache / tuning.FILE_NAME).write_text(json.dumps(data))
    assert kernels.packed_linear_rows(torch.bfloat16) == packed
    assert kernels.bf16_kernel_rows(torch.bfloat16) == span
    assert linear_races == {"packed": [], "bf16": []}


@pytest.mark.parametrize("stored", [7, -1, True, "5", 3005, 5004, 64063])
def test_an_invalid_remembered_linear_choice_is_measured_again(linear_races, cache, stored, caplog):
    from serving import kernels

    caplog.set_level(logging.WARNING, logger="serving.tuning")
    key = tuning.machine_key()
    data = {key: {"packed_linear_rows/bfloat16": stored, "bf16_kernel_rows/bfloat16/against-packed>=5": stored}}
    (cache / tuning.FILE_NAME).write_text(json.dumps(data))
    assert kernels.packed_linear_rows(torch.bfloat16) == 5
    assert kernels.bf16_kernel_rows(torch.bfloat16) == (3, 4)
    assert len(linear_races["packed"]) == len(linear_races["bf16"]) == 1
    assert f"ignoring packed_linear_rows/bfloat16's remembered value {stored!r}" in caplog.text
    entry = _stored(cache)[key]  # replaced by the measurement
    assert entry["packed_linear_rows/bfloat16"] == 5 and entry["bf16_kernel_rows/bfloat16/against-packed>=5"] == 3004


def test_measure_mode_races_the_linears_in_every_process(linear_races, cache, monkeypatch):
    from serving import kernels

    monkeypatch.setenv("SPECFINOPS_TUNING", "measure")
    assert kernels.packed_linear_rows(torch.bfloat16) == 5
    _new_process()
    assert kernels.packed_linear_rows(torch.bfloat16) == 2 and kernels.bf16_kernel_rows(torch.bfloat16) == (3, 4)
    assert len(linear_races["packed"]) == 2 and len(linear_races["bf16"]) == 1
    assert not (cache / tuning.FILE_NAME).exists()


def test_a_linear_setting_wins_over_the_remembered_choice(linear_races, cache, monkeypatch):
    """SPECFINOPS_PACKED_LINEAR / SPECFINOPS_BF16_KERNEL on / off decide without a race or a remembered value, and
    the C kernel raced against plain F.linear (packing off) is remembered apart from its race against packing."""
    from serving import kernels

    assert kernels.packed_linear_rows(torch.bfloat16) == 5 and kernels.bf16_kernel_rows(torch.bfloat16) == (3, 4)
    for packed, bf16, expect in [("on", "on", (1, (1, None))), ("off", "off", (None, None))]:
        monkeypatch.setenv("SPECFINOPS_PACKED_LINEAR", packed)
        monkeypatch.setenv("SPECFINOPS_BF16_KERNEL", bf16)
        _new_process()
        assert (kernels.packed_linear_rows(torch.bfloat16), kernels.bf16_kernel_rows(torch.bfloat16)) == expect
    assert len(linear_races["packed"]) == len(linear_races["bf16"]) == 1
    monkeypatch.setenv("SPECFINOPS_BF16_KERNEL", "auto")  # packing still off: a race of its own, remembered apart
    _new_process()
    assert kernels.bf16_kernel_rows(torch.bfloat16) == (1, 19) and len(linear_races["bf16"]) == 2
    entry = _stored(cache)[tuning.machine_key()]
    assert entry["bf16_kernel_rows/bfloat16/against-plain"] == 1019
    assert entry["bf16_kernel_rows/bfloat16/against-packed>=5"] == 3004


def test_the_start_notice_counts_the_linear_races_and_is_silent_once_remembered(linear_races, monkeypatch):
    import io

    from serving import kernels

    attention = []
    monkeypatch.setattr(kernels, "_attention_race",
                        lambda dtype, masked, B, T, candidates, rounds=3: attention.append(T) or candidates[-1])
    _new_process()
    out = io.StringIO()
    kernels.measure_choices(torch.bfloat16, out)
    cases = len(kernels.ATTENTION_FORMS) * len(kernels.ATTENTION_WIDTHS) + 2
    assert f"; {cases} cases, can take minutes" in out.getvalue(), out.getvalue()
    assert len(linear_races["packed"]) == len(linear_races["bf16"]) == 1

    _new_process()  # every choice remembered: nothing said, nothing raced
    out = io.StringIO()
    label = kernels.measure_choices(torch.bfloat16, out)
    assert out.getvalue() == "" and label.startswith("bf16c3-4,packed>=5+")
    assert len(linear_races["packed"]) == len(linear_races["bf16"]) == 1

    # only the C kernel's choice forgotten: one case pending
    data = _stored(kernels.tuning_file().parent)
    del data[tuning.machine_key()]["bf16_kernel_rows/bfloat16/against-packed>=5"]
    kernels.tuning_file().write_text(json.dumps(data))
    _new_process()
    out = io.StringIO()
    kernels.measure_choices(torch.bfloat16, out)
    assert "; 1 case, can take minutes" in out.getvalue(), out.getvalue()
    assert len(linear_races["packed"]) == 1 and len(linear_races["bf16"]) == 2
