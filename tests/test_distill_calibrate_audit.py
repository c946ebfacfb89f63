"""From a user's audit of `specfinops distill`, `calibrate` and `models` on their own models and inputs: each
test here failed before the fix it guards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


# ------------------------------------------------------------------ a model directory named like a keyword
@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_model_directory_named_like_its_role_is_that_directory_not_the_bundled_model(role, tmp_path, monkeypatch):
    """`--target target` (a folder ./target holding the user's model) silently resolved to the bundled target
    (or said it was not pulled): the path the user gave is the model they meant."""
    from serving.models import resolve_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))  # no bundled target here
    (tmp_path / role).mkdir()
    (tmp_path / role / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert resolve_model(role, role).resolve() == (tmp_path / role).resolve()
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "config.json").write_text("{}")
    assert resolve_model("default", role).resolve() == (tmp_path / "default").resolve()


def test_a_folder_named_target_that_is_no_model_still_means_the_bundled_target(tmp_path, monkeypatch):
    from serving.models import resolve_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "target").mkdir()  # a build folder, say: no config.json
    with pytest.raises(ValueError, match="bundled target is not pulled"):
        resolve_model("target", "target")


# ------------------------------------------------------------------ distill on a user's target
@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    """A tiny Llama target directory and data prepared from it."""
    from tests.test_distill_byo import byo as made

    return made.__wrapped__(tmp_path_factory)


def _distill(argv: list[str], tmp_path: Path, steps: int = 2) -> list[str]:
    return ["distill", *argv, "--steps", str(steps), "--head-vocab", "32", "--batch-tokens", "128", "--dtype",
            "float32", "--no-eval", "--checkpoint", str(tmp_path / "ckpt.pt")]


@pytest.mark.parametrize(("config", "says"), [
    ('{"model_type": "llama"', "config.json is not valid JSON"),  # cut short: was "Expecting ',' delimiter"
    ("[1, 2]", "config.json is not a JSON object"),  # was "TypeError: list indices must be integers", exit 1
    ('{"model_type": "llama"}', "config.json has no num_hidden_layers"),  # was "KeyError: 'num_hidden_layers'"
])
def test_a_target_whose_config_is_damaged_is_one_line_naming_the_file(config, says, byo, tmp_path, capsys):
    import shutil

    from app.cli import main

    target_dir, corpus = byo
    bad = tmp_path / "target"
    shutil.copytree(target_dir, bad)
    (bad / "config.json").write_text(config)
    assert main(_distill(["--target", str(bad), "--corpus", str(corpus), "--out", str(tmp_path / "d")], tmp_path)) == 2
    line = _one_error_line(capsys)
    assert str(bad / "config.json") in line and says in line, line
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("how", ["garbage", "truncated", "not a checkpoint"])
def test_resuming_from_a_damaged_checkpoint_is_one_line_naming_it(how, byo, tmp_path, capsys):
    """A checkpoint cut short was 'OSError: [Errno 22] Invalid argument' (no file named); a file of other bytes
    'RuntimeError: mmap can only be used with files saved with ...' and exit 1."""
    import torch

    from app.cli import main

    target_dir, corpus = byo
    argv = _distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(tmp_path / "d")], tmp_path)
    ckpt = tmp_path / "ckpt.pt"
    if how == "garbage":
        ckpt.write_bytes(b"not a checkpoint\n")
    elif how == "truncated":
        assert main(argv) == 0
        ckpt.write_bytes(ckpt.read_bytes()[:5000])
    else:
        torch.save(torch.zeros(3), ckpt)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("specfinops distill: error: --resume:") and str(ckpt) in line, line
    assert "drop --resume" in line


def test_c_is_measured_on_a_target_with_few_positions():
    """distill's evaluation ended in 'IndexError: index 256 is out of bounds for dimension 0 with size 256' (exit 1,
    after training) on a target whose max_position_embeddings is 256: c was timed at position 256."""
    import torch

    from serving.distill.train import measure_c
    from serving.eagle import EagleDraft
    from tests.tiny import TINY, tiny_model

    target = tiny_model(1)
    assert TINY.max_position == 256
    draft = EagleDraft.init_from_target(target, torch.arange(32)).eval()
    cost = measure_c(draft, target, reps=2)
    assert cost["context"] == 255 and cost["c"] > 0


# ------------------------------------------------------------------ --help
def _parsers():
    from tests.test_cli_help import COMMANDS

    return [(n, p) for n, p in COMMANDS if n.split()[1] in ("distill", "calibrate", "models")]


@pytest.mark.parametrize(("name", "parser"), _parsers(), ids=[n for n, _ in _parsers()])
def test_every_option_says_what_it_does(name, parser):
    """distill's --lr, --seed, --eval-max-new-tokens and models path's --role said only their default."""
    import re

    from tests.test_cli_help import _help_of

    bare = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        words = re.sub(r"\(default:? [^)]*\)", "", action.help or "").split()
        if len(words) < 3:
            bare.append(_help_of(parser, action))
    assert not bare, f"{name}: options with no explanation: {bare}"


def _example_commands(text: str) -> list[list[str]]:
    import shlex

    joined = text.replace("\\\n", " ")  # a shell line continuation
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip().startswith("specfinops")]


@pytest.mark.parametrize("module", ["distill", "calibrate", "models"])
def test_the_examples_parse_as_written(module, capsys):
    """Every example of --help is a command the parser takes as it stands (distill's first example showed
    '--gen-batch 48       --out': the line continuation was eaten by the Python string)."""
    import importlib

    from app.cli import build_parser

    examples = importlib.import_module(f"app.commands.{module}").EXAMPLES
    commands = _example_commands(examples)
    assert commands
    for argv in commands:
        args = build_parser().parse_args(argv[1:])
        assert args.command == module and getattr(args, "handler", None), argv
    if module == "distill":
        assert "--gen-batch 48 \\\n      --out serving/bundled/draft" in examples


# ------------------------------------------------------------------ a draft a Ctrl-C left
@pytest.mark.parametrize("status", ["training (intermediate checkpoint)", "trained", None])
def test_a_draft_whose_training_did_not_finish_is_said_to_be_one_when_loaded(status, tmp_path, caplog):
    """A Ctrl-C'd distill leaves the draft so far in --out (whole files, its card saying 'training (intermediate
    checkpoint)'): calibrate and bench loaded it without a word, as if it were the finished draft."""
    import logging

    import torch

    from serving.distill.pipeline import save_draft
    from serving.eagle import EagleDraft, load_eagle
    from tests.tiny import tiny_model

    target = tiny_model(1)
    out = tmp_path / "draft"
    save_draft(EagleDraft.init_from_target(target, torch.arange(32)), out, {})
    if status is not None:
        (out / "model_card.json").write_text(json.dumps({"status": status, "results": {"steps": 40}}))
    with caplog.at_level(logging.WARNING, logger="serving.eagle"):
        load_eagle(out, target, torch.float32)
    said = [r.getMessage() for r in caplog.records if r.name == "serving.eagle"]
    if status is None or status == "trained":
        assert said == []
    else:
        assert len(said) == 1 and "not a finished draft" in said[0] and "(step 40)" in said[0]
        assert str(out) in said[0] and "--resume" in said[0]


def test_a_draft_whose_evaluation_alone_was_interrupted_is_a_finished_draft(tmp_path, caplog):
    """A Ctrl-C during distill's evaluation leaves the final weights with a card saying 'trained; evaluation
    interrupted (...)': bench and calibrate warned it was "not a finished draft ... resume that run"."""
    import logging

    import torch

    from serving.distill.pipeline import EVALUATION_INTERRUPTED, save_draft
    from serving.eagle import EagleDraft, load_eagle
    from tests.tiny import tiny_model

    target = tiny_model(1)
    out = tmp_path / "draft"
    save_draft(EagleDraft.init_from_target(target, torch.arange(32)), out, {})
    (out / "model_card.json").write_text(json.dumps({"status": EVALUATION_INTERRUPTED, "results": {"steps": 40}}))
    with caplog.at_level(logging.INFO, logger="serving.eagle"):
        load_eagle(out, target, torch.float32)
    said = [r.getMessage() for r in caplog.records if r.name == "serving.eagle"]
    assert not any("not a finished draft" in s or "resume" in s for s in said), said
    assert all(r.levelno < logging.WARNING for r in caplog.records if r.name == "serving.eagle"), said
    # what it is instead: a finished draft whose alpha and c were not measured, said at INFO
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "serving.eagle"] == [
        (logging.INFO, f"draft {out}: its training finished but distill's evaluation was interrupted, so its model "
                       "card holds no measured alpha or c")], said


# ------------------------------------------------------------------ calibrate
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A 2-layer target and a 1-layer draft sharing one tokenizer."""
    from tests.test_hf_models import hf_dir

    root = tmp_path_factory.mktemp("pair")
    return hf_dir(root / "target", seed=0), hf_dir(root / "draft", seed=1, num_hidden_layers=1)


def test_calibrate_shows_progress_prompt_by_prompt(pair, tmp_path, capsys):
    """The bar counted domains: `calibrate --workload code --limit 8` (one domain) sat at 0/1 with no ETA until
    the end. It counts prompts now, naming the domain in progress."""
    from app.cli import main

    target, draft = pair
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "domain": "code", "prompt": f"hello {i}"}) + "\n"
                                for i in range(3)))
    assert main(["calibrate", "--target", str(target), "--draft", str(draft), "--workload", str(workload),
                 "--max-new-tokens", "3", "--dtype", "float32", "--json", "--no-telemetry"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["domains"][0]["prompts"] == 3
    bar = captured.err.replace("\r", "\n")
    assert "3/3" in bar and "prompt" in bar and "code" in bar  # (tqdm may skip redrawing 1/3 and 2/3 on a fast run)


def test_calibrate_measures_no_speedup_where_no_step_drafted(pair, tmp_path, capsys):
    """One-token answers run no speculative step (the modes ran the same prefills), yet `measured` read 1.02 beside
    a row of missing figures."""
    from app.cli import main

    target, draft = pair
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "p0", "domain": "code", "prompt": "hello"}) + "\n")
    assert main(["calibrate", "--target", str(target), "--draft", str(draft), "--workload", str(workload),
                 "--max-new-tokens", "1", "--dtype", "float32", "--json", "--no-telemetry"]) == 0
    (dom,) = json.loads(capsys.readouterr().out)["domains"]
    assert dom["alpha"] is None and dom["measured_speedup_at_k"] is None, dom


@pytest.mark.parametrize("value", ["0", "-5"])
def test_calibrate_names_its_max_new_tokens_option(value, capsys):
    """Was 'max_new_tokens must be an integer >= 1' (the engine's field, not the option), after loading."""
    from app.cli import main

    assert main(["calibrate", "--max-new-tokens", value]) == 2
    said = _one_error_line(capsys)
    assert said == f"specfinops calibrate: error: --max-new-tokens must be an integer >= 1, got {value}", said


# ------------------------------------------------------------------ the model card
def test_the_card_of_a_run_without_evaluation_reruns_without_one_and_names_its_data_wholly(byo, tmp_path,
                                                                                          monkeypatch):
    """A --no-eval run's card recorded a command without --no-eval (its rerun made the evaluation data and
    measured alpha: minutes this run never spent), and a relative --corpus as given ('corpus') under data_dirs,
    which names nothing from another directory."""
    import os
    import shlex

    from app.cli import build_parser, main
    from serving.distill.pipeline import resume_command

    target_dir, corpus = byo
    monkeypatch.chdir(corpus.parent)
    out = tmp_path / "d"
    assert main(_distill(["--target", str(target_dir), "--corpus", os.path.relpath(corpus), "--out", str(out)],
                         tmp_path)) == 0
    card = json.loads((out / "model_card.json").read_text())
    assert card["corpus"]["data_dirs"] == [str(corpus)]
    argv = shlex.split(card["command"])
    assert argv.count("--no-eval") == 1 and "--eval-max-new-tokens" not in argv
    args = build_parser().parse_args(argv[1:])
    assert args.no_eval and args.steps == "2"
    assert shlex.split(resume_command(args)).count("--no-eval") == 1  # said once when resuming too


# ------------------------------------------------------------------ models list
@pytest.mark.parametrize("how", ["empty weights", "damaged manifest"])
def test_models_list_says_a_damaged_target_is_damaged_not_present(how, tmp_path, monkeypatch, capsys):
    """A target whose model.safetensors was cut to nothing, or whose manifest was damaged, was listed as
    'present' (and then failed in bench, calibrate and distill)."""
    from app.cli import main
    from serving.models import MANIFEST, bundled_target_dir

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path))
    model = bundled_target_dir()
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "model.safetensors").write_bytes(b"" if how == "empty weights" else b"\x08" + b"\x00" * 7 + b"{}      ")
    (model / MANIFEST).write_text(json.dumps({"safetensors_sha256": "0" * 64}) if how == "empty weights" else "{")
    assert main(["models", "list"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("target")]
    assert line.split()[2] == "damaged", line
    assert ("model.safetensors: not a readable safetensors file" if how == "empty weights" else MANIFEST) in line
    assert line.count("specfinops models pull --force") == 1


def test_models_list_says_present_for_whole_files(tmp_path, monkeypatch, capsys):
    import torch
    from safetensors.torch import save_file

    from app.cli import main
    from serving.models import MANIFEST, bundled_target_dir

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path))
    model = bundled_target_dir()
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": torch.zeros(2)}, str(model / "model.safetensors"))
    (model / MANIFEST).write_text(json.dumps({"safetensors_sha256": "0" * 64}))
    assert main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x.split()[2] for x in lines] == ["present", "present"]  # the bundled draft too


@pytest.mark.parametrize("json_out", [True, False])
def test_calibrate_stopped_by_ctrl_c_reports_the_domains_it_measured(json_out, pair, tmp_path, capsys,
                                                                   monkeypatch):
    """Ctrl-C (or SIGTERM) in the last domain of a long calibrate threw away the domains already measured: only
    'interrupted' was printed."""
    import app.commands.calibrate as command
    from app.cli import main

    target, draft = pair
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"{d}{i}", "domain": d, "prompt": f"hello {i}"}) + "\n"
                                for d in ("aa", "bb") for i in range(2)))
    measured = command._interleaved

    def second_domain_stopped(loaded, ps, *rest, **kw):
        if ps[0].domain == "bb":
            raise KeyboardInterrupt
        return measured(loaded, ps, *rest, **kw)

    monkeypatch.setattr(command, "_interleaved", second_domain_stopped)
    argv = ["calibrate", "--target", str(target), "--draft", str(draft), "--workload", str(workload),
            "--max-new-tokens", "3", "--dtype", "float32", "--no-telemetry"]
    assert main(argv + ["--json"] * json_out) == 130
    captured = capsys.readouterr()
    assert "reporting the 1 of 2 domain(s) measured" in captured.err and captured.err.strip().endswith("interrupted")
    if json_out:
        report = json.loads(captured.out)
        assert report["interrupted"] is True and [d["domain"] for d in report["domains"]] == ["aa"]
        assert report["domains"][0]["prompts"] == 2
    else:
        assert captured.out.startswith("interrupted: the 1 domain(s) measured")
        rows = [line.split()[0] for line in captured.out.splitlines() if line.strip()]
        assert "aa" in rows and "bb" not in rows


@pytest.mark.parametrize(("argv", "says"), [
    (["--k-max", "100000000"], "--k and --k-max must be at most 64, got 4 and 100000000"),  # spun for minutes
    (["--k", "1000"], "--k and --k-max must be at most 64, got 1000 and 8"),
    (["--drafter", "ngram", "--early-exit-layers", "3"],  # was silently ignored
     "--early-exit-layers applies to --drafter early-exit only; this run drafts with ngram"),
])
def test_calibrate_refuses_what_it_would_spin_on_or_ignore(argv, says, capsys):
    from app.cli import main

    assert main(["calibrate", "--workload", "code", "--limit", "1", *argv]) == 2
    assert says in _one_error_line(capsys)


def test_distill_checks_its_data_dir_before_loading_anything(tmp_path, monkeypatch, capsys):
    """--data-dir holding other files got distill's arrays written among them; a file as --data-dir failed with
    'File exists' once the target had loaded."""
    from app.cli import main

    ran = []
    monkeypatch.setattr("serving.distill.pipeline.run", lambda args: ran.append(args) or 0)
    other, a_file, ours = tmp_path / "other", tmp_path / "afile", tmp_path / "ours"
    other.mkdir()
    (other / "x.txt").write_text("mine")
    a_file.write_text("")
    ours.mkdir()
    (ours / "sequences.jsonl").write_text("")  # what an interrupted generation leaves: continued, not refused
    base = ["distill", "--generate-prompts", "2", "--out", str(tmp_path / "d"), "--steps", "1", "--data-dir"]
    assert main([*base, str(other)]) == 2
    assert "--data-dir " + str(other) + " holds other files, not distillation data" in _one_error_line(capsys)
    assert main([*base, str(a_file)]) == 2
    assert "--data-dir " + str(a_file) + " is a file: give a folder" in _one_error_line(capsys)
    assert ran == []
    assert main([*base, str(ours)]) == 0 and main([*base, str(tmp_path / "new")]) == 0 and len(ran) == 2


def test_distill_stopped_by_sigterm_stops_as_on_ctrl_c(tmp_path, monkeypatch, capsys):
    """`docker stop` / a preempted job killed distill outright (exit 143): no checkpoint, no line to resume."""
    import os
    import signal
    import time

    from app.cli import main

    def run(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this, as Ctrl-C interrupts training (which saves its checkpoint)
        return 0

    monkeypatch.setattr("serving.distill.pipeline.run", run)
    try:
        assert main(["distill", "--generate-prompts", "2", "--out", str(tmp_path / "d"), "--steps", "1"]) == 130
    finally:  # fired, the handler ignores SIGTERM until the process exits: not this test process's later tests
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert "distill: SIGTERM: stopping as on Ctrl-C" in capsys.readouterr().err


def test_distill_evaluation_leaves_alpha_missing_where_nothing_was_drafted():
    """`--eval-max-new-tokens 1` drafts nothing: alpha and the acceptance rate read 0, the mean acceptance length
    1, on the card and in distill's last line."""
    from serving.distill.train import acceptance_figures

    nothing = {"drafted": 0, "accepted": 0, "drafts": 0, "rejections": 0}
    assert acceptance_figures(nothing) == {"alpha": None, "acceptance_rate": None, "mean_accept_len": None}
    # 10 drafted in 4 steps, 6 accepted, 3 rejections: 6 / 9 tested, 6 / 10 drafted, 1 + 6 / 4
    some = {"drafted": 10, "accepted": 6, "drafts": 4, "rejections": 3}
    assert acceptance_figures(some) == {"alpha": 0.6667, "acceptance_rate": 0.6, "mean_accept_len": 2.5}


@pytest.mark.parametrize("command, option", [("calibrate", "--draft"), ("bench", "--draft-model")])
def test_a_draft_given_as_the_target_is_named_as_a_draft(command, option, capsys):
    """It loaded as a target, printed transformers' warnings about an unknown model type, then failed on its
    tokenizer without saying the folder is a draft."""
    from app.cli import main
    from serving.models import BUNDLED_DRAFT_DIR

    assert main([command, "--target", str(BUNDLED_DRAFT_DIR), "--workload", "code", "--limit", "1"]) == 2
    assert "a draft made by `specfinops distill` (a feature draft), not a target model: give it as the draft " \
           f"({option}), with the model it was distilled for as --target" in _one_error_line(capsys)


def test_a_workload_path_that_is_a_directory_is_named_as_one(tmp_path):
    from serving.workloads import load_workload

    (tmp_path / "prompts.jsonl").mkdir()
    with pytest.raises(ValueError, match="is a directory, not a .jsonl file"):
        load_workload(tmp_path / "prompts.jsonl")


@pytest.mark.parametrize("given", ["folder", "name"])
def test_a_draft_given_as_distills_target_is_named_as_a_draft(given, tmp_path, monkeypatch, capsys):
    """distill said ".../config.json has no num_hidden_layers ... not the config of a causal LM" of the bundled
    draft given as --target, where bench and calibrate say it is a feature draft."""
    from app.cli import main
    from serving.models import BUNDLED_DRAFT, BUNDLED_DRAFT_DIR

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    target = str(BUNDLED_DRAFT_DIR) if given == "folder" else BUNDLED_DRAFT
    assert main(["distill", "--corpus", str(tmp_path), "--target", target, "--out", str(tmp_path / "d3"),
                 "--steps", "1", "--no-eval"]) == 2
    line = _one_error_line(capsys)
    assert f"--target {target}: a draft made by `specfinops distill` (a feature draft), not a target model" in line
    assert "num_hidden_layers" not in line and not (tmp_path / "d3").exists()
    # distill has no draft option: it is told to give the target model, not to give this as the draft
    assert "--draft" not in line and "calibrate" not in line and "the target model it was distilled for" in line
