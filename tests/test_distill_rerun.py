"""`specfinops distill` run again: an unfinished run's checkpoint is not overwritten without --resume or --fresh,
a finished run removes its checkpoint, the weights' file mode follows the umask, progress bars count prompts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.test_distill_byo import _ctrl_c_at, target_and_corpus
from tests.tiny import tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama target directory and data prepared from it."""
    return target_and_corpus(tmp_path_factory.mktemp("rerun"))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    import serving.distill.pipeline  # noqa: F401 - imported before the variable is set

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "distill"


def _argv(tiny, out: Path, steps: int = 2, *extra: str) -> list[str]:
    target_dir, corpus = tiny
    return ["distill", "--target", str(target_dir), "--corpus", str(corpus), "--out", str(out), "--steps", str(steps),
            "--head-vocab", "32", "--batch-tokens", "128", "--dtype", "float32", "--no-eval", *extra]


def _checkpoints(cache: Path) -> list[Path]:
    return sorted((cache / "checkpoints").glob("*.pt")) if (cache / "checkpoints").is_dir() else []


def _interrupted(tiny, out: Path, tmp_path: Path, monkeypatch, *, at: int, steps: int) -> None:
    """A distill run of `steps` stopped by Ctrl-C at step `at` (exit 130); the Ctrl-C patch undone after it and
    the cache the `cache` fixture set kept."""
    from app.cli import main

    _ctrl_c_at(monkeypatch, at)
    assert main(_argv(tiny, out, steps)) == 130
    monkeypatch.undo()
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))


def test_a_rerun_after_an_interrupted_run_is_refused_and_fresh_starts_over(tiny, tmp_path, cache, monkeypatch,
                                                                            capsys):
    from app.cli import main

    out = tmp_path / "draft"
    _interrupted(tiny, out, tmp_path, monkeypatch, at=3, steps=20)
    (ckpt,) = _checkpoints(cache)
    assert torch.load(ckpt, weights_only=False)["step"] == 3
    card = json.loads((out / "model_card.json").read_text())
    assert card["status"].startswith("interrupted at step 3") and "--resume" in card["status"]
    before = ckpt.read_bytes()
    capsys.readouterr()
    # the same command without --resume: refused before anything is done, the checkpoint untouched
    assert main(_argv(tiny, out, 20)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "checkpoint at step 3" in err[0] and str(ckpt) in err[0] and "--resume" in err[0] and "--fresh" in err[0]
    assert ckpt.read_bytes() == before
    # with other options it is refused too (a --resume could not continue it)
    assert main(_argv(tiny, out, 20, "--lr", "0.01")) == 2
    assert "--fresh" in capsys.readouterr().err and ckpt.read_bytes() == before
    assert main(_argv(tiny, out, 4, "--resume", "--fresh")) == 2
    # --fresh starts over from step 0: 4 steps trained in this run, and the finished run removes its checkpoint
    assert main(_argv(tiny, out, 4, "--fresh")) == 0
    assert "resumed from" not in capsys.readouterr().err
    card = json.loads((out / "model_card.json").read_text())
    assert card["status"] == "trained" and card["results"]["steps"] == 4
    assert card["results"]["curve"][0]["step"] == 1
    assert _checkpoints(cache) == []


def test_resume_continues_the_interrupted_run_and_then_removes_its_checkpoint(tiny, tmp_path, cache, monkeypatch,
                                                                              capsys):
    from app.cli import main

    out = tmp_path / "draft"
    _interrupted(tiny, out, tmp_path, monkeypatch, at=2, steps=5)
    assert len(_checkpoints(cache)) == 1  # interrupted: kept for --resume
    capsys.readouterr()
    assert main(_argv(tiny, out, 5, "--resume")) == 0
    assert "resumed from" in capsys.readouterr().err
    assert json.loads((out / "model_card.json").read_text())["results"]["steps"] == 5
    assert _checkpoints(cache) == []


def test_a_finished_run_leaves_no_checkpoint_and_a_rerun_is_not_refused(tiny, tmp_path, cache):
    from app.cli import main

    out = tmp_path / "draft"
    assert main(_argv(tiny, out)) == 0
    assert _checkpoints(cache) == [] and not list((cache / "checkpoints").iterdir())
    assert main(_argv(tiny, out, 2, "--overwrite")) == 0  # the finished draft replaced: nothing unfinished to lose


def test_a_checkpoint_given_with_checkpoint_is_kept_finished_and_not_refused(tiny, tmp_path, cache):
    from app.cli import main

    out, ckpt = tmp_path / "draft", tmp_path / "mine.pt"
    assert main(_argv(tiny, out, 2, "--checkpoint", str(ckpt))) == 0
    assert torch.load(ckpt, weights_only=False)["finished"] is True
    assert main(_argv(tiny, out, 2, "--checkpoint", str(ckpt), "--overwrite")) == 0  # nothing unfinished to lose


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_the_weights_file_gets_the_mode_the_umask_gives(tiny, tmp_path, cache, umask):
    from app.cli import main

    out = tmp_path / "draft"
    previous = os.umask(umask)
    try:
        assert main(_argv(tiny, out)) == 0
    finally:
        os.umask(previous)
    want = 0o666 & ~umask
    for name in ("model.safetensors", "config.json", "model_card.json"):
        assert (out / name).stat().st_mode & 0o777 == want, name


def test_the_generation_bar_advances_by_the_prompts_each_forward_finished(tmp_path, monkeypatch):
    import tqdm

    from serving.distill.data import record_generation

    updates: list[int] = []

    class Spy(tqdm.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(tqdm, "tqdm", Spy)
    torch.manual_seed(0)
    target = tiny_model(3)
    encoded = [({"id": f"g{i}", "domain": "chat"}, [5 + i, 7, 9, 11]) for i in range(8)]
    record_generation(target, encoded, tmp_path / "g", eos=None, max_new_tokens=4, batch=4, topk=4, progress=False)
    assert sum(updates) == 8
    assert updates == [4, 4]  # a batch of four ends together: one update of four, not four of one


def test_resumed_generation_says_how_many_answers_were_already_made(tmp_path):
    from serving.distill.pipeline import _made_so_far

    d = tmp_path / "d"
    items = [{"id": f"p{i}"} for i in range(300)]
    assert _made_so_far(d, items) == ""
    d.mkdir()
    (d / "sequences.jsonl").write_text("".join(json.dumps({"id": f"p{i}"}) + "\n" for i in range(192)))
    assert _made_so_far(d, items) == " (192 already made, 108 to go)"


def test_resume_of_a_finished_draft_is_refused_not_trained_from_scratch(tiny, tmp_path, cache, capsys):
    """A finished run removes its checkpoint, so `--resume` on its --out said "starting from scratch" and replaced
    the trained draft with a 2-step one."""
    from app.cli import main

    out = tmp_path / "draft"
    assert main(_argv(tiny, out, 4)) == 0
    card = (out / "model_card.json").read_bytes()
    capsys.readouterr()
    assert main(_argv(tiny, out, 2, "--resume")) == 2
    err = capsys.readouterr().err
    assert "--resume: no checkpoint" in err and "which holds a finished draft" in err and "Drop --resume" in err
    assert (out / "model_card.json").read_bytes() == card
    assert main(_argv(tiny, tmp_path / "new", 2, "--resume")) == 0  # a new --out: from scratch, as it says


def test_a_resume_with_another_budget_says_a_rerun_matches_options_only(tiny, tmp_path, cache, monkeypatch, capsys):
    """Steps trained toward --steps 20 followed that budget's learning-rate schedule; resumed with --steps 5 the card
    said its command ("--steps 5") reproduces the weights, which a rerun does not."""
    from app.cli import main

    out = tmp_path / "draft"
    _interrupted(tiny, out, tmp_path, monkeypatch, at=2, steps=20)
    assert main(_argv(tiny, out, 5, "--resume")) == 0
    rerun = json.loads((out / "model_card.json").read_text())["rerun"]
    assert rerun["matches"] == "options" and "trained toward --steps 20" in rerun["why"], rerun
    # the same budget resumed: the command reproduces the run
    out2 = tmp_path / "draft2"
    _interrupted(tiny, out2, tmp_path, monkeypatch, at=2, steps=5)
    assert main(_argv(tiny, out2, 5, "--resume")) == 0
    assert json.loads((out2 / "model_card.json").read_text())["rerun"]["matches"] == "options and steps"


def test_a_time_budget_resumed_as_given_is_not_said_to_have_changed(tiny, tmp_path, cache, monkeypatch):
    """The checkpoint holds the training minutes a --total-minutes budget leaves (cfg.minutes), which the resumed
    run's options (no --minutes) never equal: every such resume was said to have changed its budget, naming a
    --minutes nobody gave."""
    from app.cli import main
    from tests.test_distill_byo import _ctrl_c_at

    out = tmp_path / "draft"
    target_dir, corpus = tiny
    argv = ["distill", "--target", str(target_dir), "--corpus", str(corpus), "--out", str(out), "--total-minutes",
            "5", "--head-vocab", "32", "--batch-tokens", "128", "--dtype", "float32", "--no-eval"]
    for again in ([], ["--resume"]):  # stopped twice (a 5-minute budget would train on): the card says its rerun
        _ctrl_c_at(monkeypatch, 2)
        assert main([*argv, *again]) == 130
        monkeypatch.undo()
        monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    rerun = json.loads((out / "model_card.json").read_text())["rerun"]
    assert rerun["matches"] == "options" and "trained toward" not in rerun["why"], rerun
    assert rerun["why"].startswith("a time budget trains as many steps")


@pytest.mark.parametrize("record", ["run", "none"])
def test_total_minutes_after_a_resume_counts_the_earlier_runs_as_train_minutes_does(record, tiny, tmp_path, cache,
                                                                                     monkeypatch):
    """train_minutes summed the training of every run a --resume continued; total_minutes timed only the last
    invocation, so a card said train_minutes 0.92 beside total_minutes 0.11. `none`: a checkpoint from before the
    runs' minutes were kept (no "run" entry) counts its training at least, and no data minutes."""
    import itertools
    import time

    from app.cli import main

    out = tmp_path / "draft"
    real, ticks = time.perf_counter, itertools.count()
    # the first run is slow: every clock reading is 3 s after the one before (its training and data too)
    monkeypatch.setattr(time, "perf_counter", lambda: real() + 3.0 * next(ticks))
    _interrupted(tiny, out, tmp_path, monkeypatch, at=3, steps=5)  # (undoes the clock after the run)
    (ckpt,) = _checkpoints(cache)
    saved = torch.load(ckpt, weights_only=False)
    first = saved["run"]  # the first run's wall-clock and data minutes, as its checkpoint keeps them
    assert first["data_minutes"] >= 0.05 and first["total_minutes"] > first["data_minutes"], first
    if record == "none":
        del saved["run"]
        torch.save(saved, ckpt)
    assert main(_argv(tiny, out, 5, "--resume")) == 0
    results = json.loads((out / "model_card.json").read_text())["results"]
    assert results["steps"] == 5 and results["train_minutes"] >= 0.1, results
    assert results["total_minutes"] >= results["train_minutes"] + results["data_minutes"], results
    if record == "run":  # this run's data minutes are next to nothing (the real clock): the first run's are summed
        assert results["data_minutes"] >= round(first["data_minutes"], 2), (results, first)
        assert results["total_minutes"] >= round(first["total_minutes"], 2), (results, first)
    else:  # the first run's data minutes are unknown: not counted
        assert results["data_minutes"] < round(first["data_minutes"], 2), (results, first)


def test_a_resume_with_fewer_steps_than_the_checkpoint_trained_is_refused(tiny, tmp_path, cache, monkeypatch,
                                                                           capsys):
    """`--steps 3 --resume` from a checkpoint already at step 4 passed silently and wrote a card saying
    training.steps 3 beside results.steps 4."""
    from app.cli import main

    out = tmp_path / "draft"
    _interrupted(tiny, out, tmp_path, monkeypatch, at=4, steps=30)
    (ckpt,) = _checkpoints(cache)
    before = {p.name: p.read_bytes() for p in [ckpt, *out.iterdir()] if p.is_file()}
    capsys.readouterr()
    assert main(_argv(tiny, out, 3, "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step 4" in err[0] and "--steps 3" in err[0] and str(ckpt) in err[0], err
    assert {p.name: p.read_bytes() for p in [ckpt, *out.iterdir()] if p.is_file()} == before


def test_a_corpus_whose_generation_was_interrupted_is_named_as_one(tiny, tmp_path, cache, capsys):
    """--corpus on a folder a Ctrl-C'd --generate-prompts left said it "is not a prepared distillation data
    directory (make one with --generate-prompts N ...)", as of any folder: not that rerunning the command that made
    it goes on from the answers it finished."""
    from app.cli import main
    from serving.distill.data import META, record_generation

    torch.manual_seed(0)
    unfinished = tmp_path / "gen"
    encoded = [({"id": f"g{i}", "domain": "chat"}, [5 + i, 7, 9, 11]) for i in range(3)]
    record_generation(tiny_model(3), encoded, unfinished, eos=None, max_new_tokens=2, batch=2, topk=4,
                      progress=False)
    (unfinished / META).unlink()  # written last: a generation stopped before it has every other file
    target_dir, _ = tiny
    argv = _argv((target_dir, unfinished), tmp_path / "draft")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"corpus {unfinished} is an unfinished generation" in err[0] and "3 answers" in err[0], err
    assert "--generate-prompts" in err[0] and "goes on from the answers finished so far" in err[0], err
    # a folder that is no distillation data at all is still said to be none
    other = tmp_path / "other"
    other.mkdir()
    assert main(_argv((target_dir, other), tmp_path / "draft")) == 2
    assert "is not a prepared distillation data directory" in capsys.readouterr().err


def test_the_card_records_the_feature_layers_training_used(tiny, tmp_path, cache):
    """training.feature_layers read [] (the option's "the last block") beside architecture.feature_layers [29]."""
    from app.cli import main
    from serving.models import BUNDLED_DRAFT_DIR

    out = tmp_path / "draft"
    assert main(_argv(tiny, out)) == 0
    card = json.loads((out / "model_card.json").read_text())
    blocks = json.loads((tiny[0] / "config.json").read_text())["num_hidden_layers"]
    assert card["training"]["feature_layers"] == card["architecture"]["feature_layers"] == [blocks - 1], card
    bundled = json.loads((BUNDLED_DRAFT_DIR / "model_card.json").read_text())
    assert bundled["training"]["feature_layers"] == bundled["architecture"]["feature_layers"] == [29]


def _budget_argv(tiny, out: Path, *budget: str) -> list[str]:
    target_dir, corpus = tiny
    return ["distill", "--target", str(target_dir), "--corpus", str(corpus), "--out", str(out), *budget,
            "--head-vocab", "32", "--batch-tokens", "128", "--dtype", "float32", "--no-eval"]


def _interrupted_budget(tiny, out: Path, tmp_path: Path, monkeypatch, cache: Path, *budget: str) -> Path:
    """A distill run under a time `budget` (_budget_argv) stopped by Ctrl-C at step 2 (exit 130), as _interrupted
    stops a --steps run: its checkpoint."""
    from app.cli import main

    _ctrl_c_at(monkeypatch, 2)
    assert main(_budget_argv(tiny, out, *budget)) == 130
    monkeypatch.undo()
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    (ckpt,) = _checkpoints(cache)
    return ckpt


def test_a_total_minutes_resume_counts_the_earlier_runs_against_the_budget(tiny, tmp_path, cache, monkeypatch,
                                                                           capsys):
    """--total-minutes bounds the whole run (README): a --resume gave training what the budget left after its own
    set-up only, so a 5-minute run stopped after 3 minutes trained up to 4.5 more and its card's total_minutes
    passed training.budget.total_minutes."""
    import serving.distill.train as tr
    from app.cli import main
    from serving.distill.pipeline import BUDGET_MARGIN_MINUTES

    out = tmp_path / "draft"
    argv = _budget_argv(tiny, out, "--total-minutes", "5")
    ckpt = _interrupted_budget(tiny, out, tmp_path, monkeypatch, cache, "--total-minutes", "5")
    saved = torch.load(ckpt, weights_only=False)
    trained = saved["elapsed"] / 60
    saved["run"] = {"total_minutes": 3.0, "data_minutes": 1.0}  # the earlier run took 3 minutes of wall clock
    torch.save(saved, ckpt)
    seen = {}

    def stop(draft, preps, cfg, **kw):  # what training was given, then stopped (not minutes of training here)
        seen["minutes"] = cfg.minutes
        raise KeyboardInterrupt

    monkeypatch.setattr(tr, "train", stop)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 130
    err = capsys.readouterr().err
    assert 0 < seen["minutes"] - trained <= 5 - 3 - BUDGET_MARGIN_MINUTES, (seen, trained)
    assert "the runs this --resume continues took 3.0 min" in err, err
    # the earlier runs took nearly all of it: refused before anything is done, the checkpoint untouched
    saved["run"]["total_minutes"] = 4.6
    torch.save(saved, ckpt)
    kept = ckpt.read_bytes()
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--total-minutes 5" in err[0] and "took 4.6 minutes" in err[0], err
    assert "no time to train" in err[0] and ckpt.read_bytes() == kept


def test_the_card_of_a_resumed_total_minutes_run_records_the_earlier_runs_and_their_training(tiny, tmp_path, cache,
                                                                                            monkeypatch):
    """training.budget after a real --resume under --total-minutes: runs_before_resume_minutes (the earlier runs'
    wall-clock) includes trained_before_resume_minutes (their training), as the README says; with this run's set-up
    and training they fill the budget less its margin, and the whole run stays within it."""
    from app.cli import main
    from serving.distill.pipeline import BUDGET_MARGIN_MINUTES

    out = tmp_path / "draft"
    total = BUDGET_MARGIN_MINUTES + 0.4
    argv = _budget_argv(tiny, out, "--total-minutes", f"{total:g}")
    ckpt = _interrupted_budget(tiny, out, tmp_path, monkeypatch, cache, "--total-minutes", f"{total:g}")
    saved = torch.load(ckpt, weights_only=False)
    earlier, trained = saved["run"]["total_minutes"], saved["elapsed"] / 60
    del saved
    assert main([*argv, "--resume"]) == 0
    card = json.loads((out / "model_card.json").read_text())
    budget = card["training"]["budget"]
    assert budget["total_minutes"] == total
    assert budget["runs_before_resume_minutes"] == pytest.approx(earlier, abs=0.01), budget
    assert budget["trained_before_resume_minutes"] == pytest.approx(trained, abs=0.01), budget
    assert budget["trained_before_resume_minutes"] <= budget["runs_before_resume_minutes"], budget  # they overlap
    assert budget["runs_before_resume_minutes"] + budget["spent_before_training_minutes"] + \
        budget["training_minutes"] == pytest.approx(total - BUDGET_MARGIN_MINUTES, abs=0.02), budget
    assert card["status"] == "trained" and card["results"]["total_minutes"] <= total, card["results"]
    assert card["results"]["train_minutes"] == pytest.approx(trained + budget["training_minutes"], abs=0.05)


def test_a_total_minutes_resume_with_nothing_left_is_refused_before_the_target_loads(tiny, tmp_path, cache,
                                                                                       monkeypatch, capsys):
    """The refusal of a --resume whose earlier runs took the --total-minutes budget came after the data was made and
    the target loaded (minutes, for a real target): it is said once the checkpoint is read, naming the least budget
    that leaves time to train and --minutes as the other way, which then continues the run."""
    import serving.llama
    from app.cli import main

    out = tmp_path / "draft"
    argv = _budget_argv(tiny, out, "--total-minutes", "5")
    ckpt = _interrupted_budget(tiny, out, tmp_path, monkeypatch, cache, "--total-minutes", "5")
    saved = torch.load(ckpt, weights_only=False)
    saved["run"] = {"total_minutes": 4.6, "data_minutes": 1.0}
    torch.save(saved, ckpt)
    kept = ckpt.read_bytes()
    load = serving.llama.load_causal_lm

    def no_load(*a, **kw):
        raise AssertionError("the target was loaded before the budget refusal")

    monkeypatch.setattr(serving.llama, "load_causal_lm", no_load)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--total-minutes 5:" in err[0] and "took 4.6 minutes" in err[0], err
    assert "no time to train" in err[0] and "--total-minutes 5.2 or more" in err[0], err
    trained = saved["elapsed"] / 60
    assert "--minutes in place of --total-minutes" in err[0] and f"the {trained:.2f} minutes" in err[0], err
    assert ckpt.read_bytes() == kept
    monkeypatch.setattr(serving.llama, "load_causal_lm", load)
    # the other way it names: a training budget, past what the checkpoint trained
    assert main([*_budget_argv(tiny, out, "--minutes", f"{trained + 0.02:.2f}"), "--resume"]) == 0


def test_an_interrupted_total_minutes_run_with_no_time_left_says_its_resume_needs_more(tmp_path):
    """The continue command an interrupted --total-minutes run printed was refused for its budget when the run had
    used it up: the note says so, and names a budget that trains."""
    from app.cli import build_parser
    from serving.distill.pipeline import interrupted_note, resume_budget_refusal

    args = build_parser().parse_args(["distill", "--corpus", str(tmp_path), "--out", str(tmp_path / "d"),
                                      "--total-minutes", "5"])
    args.total_minutes = 5.0  # as the command checks it
    note = interrupted_note(args, 7, tmp_path / "c.pt", tmp_path / "d", 4.6)
    assert "--total-minutes 5 " in note.splitlines()[1] and resume_budget_refusal(5, 4.6, 1.0), note
    assert "no time to train" in note and "--total-minutes 5.2 or more" in note, note
    roomy = interrupted_note(args, 7, tmp_path / "c.pt", tmp_path / "d", 1.0)
    assert "no time to train" not in roomy and len(roomy.splitlines()) == 2, roomy


def test_a_resume_with_fewer_minutes_than_the_checkpoint_trained_is_refused(tiny, tmp_path, cache, monkeypatch,
                                                                             capsys):
    """`--minutes 1 --resume` from a checkpoint that trained 2 minutes is refused as fewer --steps are: the
    minutes trained cannot be undone."""
    from app.cli import main

    out = tmp_path / "draft"
    ckpt = _interrupted_budget(tiny, out, tmp_path, monkeypatch, cache, "--minutes", "5")
    saved = torch.load(ckpt, weights_only=False)
    saved["elapsed"] = 120.0
    torch.save(saved, ckpt)
    before = {p.name: p.read_bytes() for p in [ckpt, *out.iterdir()] if p.is_file()}
    capsys.readouterr()
    assert main([*_budget_argv(tiny, out, "--minutes", "1"), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2.00 minutes" in err[0] and "--minutes 1" in err[0] and str(ckpt) in err[0], err
    assert "--fresh" in err[0] and "--overwrite" not in err[0]  # an unfinished draft in --out: --fresh does it
    assert {p.name: p.read_bytes() for p in [ckpt, *out.iterdir()] if p.is_file()} == before


def test_a_finished_time_budget_resumed_as_given_is_not_refused_for_its_last_step(tiny, tmp_path, cache):
    """A --minutes run stops after the step that passes its minutes: its finished checkpoint resumed with the same
    --minutes (an evaluation to measure) has trained a little more than them, and is not refused for it."""
    from app.cli import main

    out, ckpt = tmp_path / "draft", tmp_path / "mine.pt"
    argv = [*_budget_argv(tiny, out, "--minutes", "0.01"), "--checkpoint", str(ckpt)]
    assert main(argv) == 0
    saved = torch.load(ckpt, weights_only=False)
    assert saved["finished"] is True
    saved["elapsed"] = 0.9  # 0.015 minutes: past 0.01
    torch.save(saved, ckpt)
    assert main([*argv, "--resume"]) == 0


def test_fewer_steps_on_a_finished_checkpoint_advises_overwrite_too(tiny, tmp_path, cache, capsys):
    """The --steps refusal said "drop --resume and give --fresh", which is refused in turn where --out holds a
    finished draft ("give --overwrite"): a kept (--checkpoint) finished run's."""
    from app.cli import main

    out, ckpt = tmp_path / "draft", tmp_path / "mine.pt"
    assert main(_argv(tiny, out, 4, "--checkpoint", str(ckpt))) == 0
    capsys.readouterr()
    assert main(_argv(tiny, out, 3, "--checkpoint", str(ckpt), "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step 4" in err[0] and "--fresh --overwrite" in err[0], err
    assert main(_argv(tiny, out, 3, "--checkpoint", str(ckpt), "--fresh", "--overwrite")) == 0  # as it says


def test_resume_without_a_checkpoint_of_a_draft_whose_evaluation_was_interrupted_says_finished(tiny, tmp_path,
                                                                                              cache, capsys):
    """The --resume refusal called only a card saying "trained" finished: one whose evaluation was interrupted
    ("trained; evaluation interrupted ...") was "a draft (trained; ...)"."""
    from app.cli import main
    from serving.distill.pipeline import EVALUATION_INTERRUPTED

    out = tmp_path / "draft"
    assert main(_argv(tiny, out, 2)) == 0
    card = json.loads((out / "model_card.json").read_text())
    (out / "model_card.json").write_text(json.dumps({**card, "status": EVALUATION_INTERRUPTED}))
    capsys.readouterr()
    assert main(_argv(tiny, out, 2, "--resume")) == 2
    err = capsys.readouterr().err
    assert "which holds a finished draft" in err and "--overwrite" in err, err
    # its status's "(the same command with --resume measures it)" is not quoted in a refusal of --resume: calibrate
    # measures it
    assert "--resume measures it" not in err and "trained; evaluation interrupted" in err, err
    assert f"`specfinops calibrate --draft {out} --target {tiny[0]}` measures it" in err, err
    from app.cli import build_parser

    parsed = build_parser().parse_args(["calibrate", "--draft", str(out), "--target", str(tiny[0])])  # its options
    assert (parsed.draft, parsed.target) == (str(out), str(tiny[0]))
