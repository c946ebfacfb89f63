"""`specfinops distill` guards: a training run that diverges is no finished draft (and a draft with NaN weights
does not load), the model card is strict JSON, a finished draft at --out is not replaced without --overwrite,
--data-dir data made with other settings is refused, Ctrl-C during the evaluation says so on the card and how to
measure it, an --out that cannot be written is refused before any work."""

# ruff: noqa: F811 - the fixtures `tiny` and `cache` are imported from test_distill_rerun and used by name
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.test_distill_rerun import (
    _argv,
    _checkpoints,
    cache,  # noqa: F401 - the fixture, used by name
    tiny,  # noqa: F401 - the fixture, used by name
)


def _strict(text: str):
    """json.loads refusing NaN / Infinity, as strict parsers (JavaScript's JSON.parse, jq) do."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _nan_loss_at(monkeypatch, call: int) -> None:
    """The `call`-th training step's loss (and every later one) is NaN."""
    import serving.distill.train as tr

    loss, calls = tr.distill_loss, []

    def diverged(*args, **kw):
        calls.append(1)
        total, stats = loss(*args, **kw)
        if len(calls) >= call:
            total, stats = total * float("nan"), {**stats, "loss": float("nan")}
        return total, stats

    monkeypatch.setattr(tr, "distill_loss", diverged)


def test_a_diverging_run_writes_no_trained_draft_and_says_why(tiny, tmp_path, cache, capsys):
    """--lr 1e4 went to loss=nan at step 2 and still wrote a "trained" card (results all NaN) and exited 0."""
    from app.cli import main

    out = tmp_path / "draft"
    assert main(_argv(tiny, out, 25, "--lr", "1e4")) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "diverged" in line and "--lr" in line and "models pull --force" in line
    card = out / "model_card.json"
    assert not card.is_file() or json.loads(card.read_text()).get("status") != "trained"


def test_divergence_stops_at_the_first_nan_loss_and_keeps_the_last_good_checkpoint(tiny, tmp_path, cache,
                                                                                    monkeypatch, capsys):
    from app.cli import main

    out = tmp_path / "draft"
    _nan_loss_at(monkeypatch, 4)
    # a checkpoint after every step: the last one before the NaN is at step 3
    assert main(_argv(tiny, out, 10, "--save-every", "1e-9")) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "at step 4" in line and "checkpoint at step 3" in line
    (ckpt,) = _checkpoints(cache)
    state = torch.load(ckpt, weights_only=False)
    assert state["step"] == 3 and not state["finished"]
    assert all(bool(torch.isfinite(v).all()) for v in state["draft"].values() if v.is_floating_point())
    card = _strict((out / "model_card.json").read_text())
    assert card["status"] != "trained"


def test_a_card_never_holds_nan(tmp_path):
    from serving.distill.pipeline import card_json

    text = card_json({"results": {"final": {"loss": float("nan"), "acc1": float("inf")}, "curve": [{"x": 1.5}]}})
    assert _strict(text) == {"results": {"final": {"loss": None, "acc1": None}, "curve": [{"x": 1.5}]}}


def test_a_draft_with_nan_weights_does_not_load(tmp_path):
    from safetensors.torch import load_file, save_file

    from serving.distill.pipeline import save_draft
    from serving.eagle import EagleDraft, load_eagle
    from serving.llama import load_causal_lm
    from tests.test_distill import _tiny_target_dir
    from tests.tiny import tiny_model

    target = tiny_model(1)
    target_dir = _tiny_target_dir(tmp_path / "target", target)
    d = tmp_path / "draft"
    save_draft(EagleDraft.init_from_target(target, torch.arange(32)), d, {})
    state = load_file(str(d / "model.safetensors"))
    state["fc.weight"][0, 0] = math.nan
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        load_eagle(d, load_causal_lm(target_dir, torch.float32), torch.float32)
    msg = str(err.value)
    assert "\n" not in msg and str(d) in msg and "NaN" in msg and "fc.weight" in msg


# ------------------------------------------------------------------ --data-dir made with other settings
def _generating(pair, data: Path, out: Path, *extra: str) -> list[str]:
    target_dir, _ = pair
    return ["distill", "--target", str(target_dir), "--generate-prompts", "2", "--max-new-tokens", "3", "--gen-batch",
            "2", "--data-dir", str(data), "--out", str(out), "--steps", "1", "--head-vocab", "32", "--batch-tokens",
            "128", "--dtype", "float32", "--no-eval", *extra]


def test_a_data_dir_made_with_other_settings_is_refused_naming_the_setting(tiny, tmp_path, cache, capsys):
    """--data-dir data made with --max-new-tokens 3 was reused for a run asking 4 (or another seed, or more prompts),
    and the card described it as the run's; the card's command left --data-dir out."""
    from app.cli import main

    data = tmp_path / "data"
    assert main(_generating(tiny, data, tmp_path / "a")) == 0
    card = json.loads((tmp_path / "a" / "model_card.json").read_text())
    assert card["command"].split()[card["command"].split().index("--data-dir") + 1] == str(data.resolve())
    capsys.readouterr()
    meta = (data / "meta.json").read_bytes()
    for extra, needle in [(["--max-new-tokens", "4"], "--max-new-tokens 3; this run has --max-new-tokens 4"),
                          (["--seed", "1"], "--seed 0; this run has --seed 1"),
                          (["--stdlib-prompts", "1"], "--stdlib-prompts 0; this run has --stdlib-prompts 1")]:
        assert main(_generating(tiny, data, tmp_path / "b", *extra)) == 2, extra
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert str(data) in line and needle in line, line
        assert (data / "meta.json").read_bytes() == meta and not (tmp_path / "b").exists()
    assert main(_generating(tiny, data, tmp_path / "c")) == 0  # the same settings: reused


def test_a_half_made_data_dir_made_with_other_settings_is_refused(tiny, tmp_path, cache, capsys):
    """Resuming a half-made --data-dir matched its prompts by id alone: answers cut at another length, made in
    another precision, went into the data."""
    from app.cli import main

    data = tmp_path / "data"
    assert main(_generating(tiny, data, tmp_path / "a")) == 0
    (data / "meta.json").unlink()  # as a run stopped before the last answers were written leaves it
    capsys.readouterr()
    assert main(_generating(tiny, data, tmp_path / "b", "--max-new-tokens", "5")) == 2
    assert "--max-new-tokens 3; this run has --max-new-tokens 5" in capsys.readouterr().err
    assert main(_generating(tiny, data, tmp_path / "c")) == 0  # the settings it was started with: finished
    assert (data / "meta.json").is_file()


# ------------------------------------------------------------------ a finished draft at --out
def test_a_finished_draft_at_out_is_replaced_only_with_overwrite(tiny, tmp_path, cache, monkeypatch,
                                                                  capsys):
    """A rerun (or a run for another target) replaced the finished draft at --out without asking, the bundled
    draft's folder too; an unfinished run's --out stays replaceable."""
    from app.cli import main
    from tests.test_distill_byo import _ctrl_c_at

    out = tmp_path / "draft"
    assert main(_argv(tiny, out, 2)) == 0
    card = (out / "model_card.json").read_bytes()
    capsys.readouterr()
    assert main(_argv(tiny, out, 3)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "finished draft" in err[0] and "--overwrite" in err[0], err
    assert (out / "model_card.json").read_bytes() == card
    assert main(_argv(tiny, out, 3, "--overwrite")) == 0
    assert json.loads((out / "model_card.json").read_text())["results"]["steps"] == 3
    # an unfinished run's --out: replaced without --overwrite
    unfinished = tmp_path / "unfinished"
    _ctrl_c_at(monkeypatch, 2)
    assert main(_argv(tiny, unfinished, 20)) == 130
    monkeypatch.undo()
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    assert main(_argv(tiny, unfinished, 2, "--fresh")) == 0


# ------------------------------------------------------------------ Ctrl-C during the evaluation
def test_ctrl_c_during_the_evaluation_says_so_on_the_card_and_resume_goes_straight_to_it(tiny, tmp_path,
                                                                                        cache, monkeypatch, capsys):
    """Ctrl-C while alpha was measured left a card saying "trained" with no alpha and no line to measure it."""
    import serving.distill.train as tr
    from app.cli import main

    reached, losses = [], []

    def interrupted(*args, **kw):
        reached.append(1)
        raise KeyboardInterrupt

    loss = tr.distill_loss

    def counted(*args, **kw):
        losses.append(1)
        return loss(*args, **kw)

    monkeypatch.setattr("serving.eagle.load_eagle", interrupted)  # the evaluation's first step
    monkeypatch.setattr(tr, "distill_loss", counted)
    out = tmp_path / "draft"
    argv = [a for a in _argv(tiny, out, 3) if a != "--no-eval"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert reached == [1] and len(losses) == 3
    card = _strict((out / "model_card.json").read_text())
    assert card["status"].startswith("trained; evaluation interrupted") and "alpha" not in card["results"]
    resume = [line.strip() for line in err.splitlines() if line.strip().startswith("specfinops distill")]
    assert "interrupted during the evaluation" in err and resume and resume[-1].endswith("--resume")
    # --resume: no step trained again, straight to the evaluation
    assert main([*argv, "--resume"]) == 130
    assert reached == [1, 1] and len(losses) == 3


# ------------------------------------------------------------------ an --out that cannot be written
def test_an_out_that_cannot_be_written_is_refused_before_any_work(tiny, tmp_path, cache, monkeypatch,
                                                                   capsys):
    """On a file system where the permission bits said writable and writing failed, distill made the data and
    trained, and failed only when writing the draft."""
    import errno
    import pathlib

    import serving.distill.train as tr
    from app.cli import main

    out = tmp_path / "draft"
    mkdir, trained = pathlib.Path.mkdir, []

    def read_only(self, *args, **kw):
        if self.name.startswith(".draft.partial"):
            raise OSError(errno.EROFS, "Read-only file system")
        return mkdir(self, *args, **kw)

    monkeypatch.setattr(pathlib.Path, "mkdir", read_only)
    monkeypatch.setattr(tr, "train", lambda *a, **kw: trained.append(1))
    assert main(_argv(tiny, out, 2)) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert str(out) in line and "Read-only file system" in line and trained == []
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
