"""bench and calibrate on user-supplied (tiny, random) Hugging Face models: what the options name is what runs."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from tests.test_hf_models import VOCAB, hf_dir


@pytest.fixture(autouse=True)
def no_kernel_races(monkeypatch):
    """Tiny models need no CPU kernel measurement (it takes most of a short bench on a busy 2-core machine)."""
    for name in ("SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_BF16_KERNEL", "SPECFINOPS_DECODE_ATTENTION",
                 "SPECFINOPS_ATTENTION_FLOAT32", "SPECFINOPS_DRAFT_INT8"):
        monkeypatch.setenv(name, "off")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A 2-layer target and a 1-layer draft sharing one tokenizer."""
    root = tmp_path_factory.mktemp("byo")
    return hf_dir(root / "target", seed=0), hf_dir(root / "draft", seed=1, num_hidden_layers=1)


def _bench_json(tmp_path, *extra) -> dict:
    out = tmp_path / "bench.json"
    argv = ["bench", "--workload", "code", "--limit", "1", "--max-new-tokens", "4", "--mode", "spec",
            "--dtype", "float32", "--no-telemetry", "--power", "none", "--json", str(out), *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_bench_with_a_draft_model_and_no_drafter_runs_that_draft(pair, tmp_path):
    target, draft = pair
    run = _bench_json(tmp_path, "--target", str(target), "--draft-model", str(draft))["runs"][0]
    assert run["drafter"].startswith("draft:draft") and "+ngram" in run["drafter"]  # draft+ngram, as the bundled pair


@pytest.mark.parametrize("draft_rows", [VOCAB - 16, VOCAB + 32])
def test_a_draft_whose_table_is_padded_to_another_size_drafts_exactly(pair, tmp_path, draft_rows):
    """One tokenizer of 80 tokens over a target table of 96 rows and a draft table of 80 or 128 (padding, as
    Qwen2.5-7B's and -0.5B's) was refused as a vocabulary mismatch; the draft's distribution is fitted to the
    target's vocabulary: greedy spec output is AR's token for token, and sampling runs."""
    target = hf_dir(tmp_path / "target", seed=0, tokenizer=VOCAB - 16)
    draft = hf_dir(tmp_path / "draft", seed=1, num_hidden_layers=1, tokenizer=VOCAB - 16, vocab_size=draft_rows)
    common = ("--target", str(target), "--draft-model", str(draft), "--drafter", "draft", "--k", "3")
    greedy = _bench_json(tmp_path, *common, "--mode", "both", "--max-new-tokens", "12")
    spec = [r for r in greedy["runs"] if r["mode"] == "spec"]
    assert spec and all(r["drafter"].startswith("draft:draft") for r in spec)
    assert [r["token_identical_rate"] for r in spec] == [1.0] * len(spec), spec
    sampled = _bench_json(tmp_path, *common, "--temperature", "0.8", "--seed", "3", "--max-new-tokens", "16")
    assert sampled["runs"][0]["output_tokens"] > 0


def test_a_prompt_id_past_the_drafts_table_is_read_by_the_draft_not_an_index_error(tmp_path):
    """A prompt given as token ids (the server's /v1/completions takes them, checked against the target's table)
    with an id in the target's padding rows, past the draft's smaller table: the draft's prefill read it raw
    ("IndexError: index out of range in self"; on a GPU a device-side assert)."""
    from serving.sampling import SamplingParams
    from serving.worker import EngineSpec, load

    target = hf_dir(tmp_path / "target", seed=0, tokenizer=VOCAB - 16)
    draft = hf_dir(tmp_path / "draft", seed=1, num_hidden_layers=1, tokenizer=VOCAB - 16, vocab_size=VOCAB - 16)
    loaded = load(EngineSpec(target=str(target), draft_model=str(draft), drafter="draft", dtype="float32", k="3",
                             max_len=128))
    prompt = [2, 3, VOCAB - 6]  # a row of the target's table only
    params = SamplingParams(max_new_tokens=8)
    spec, ar = (loaded.engine(mode).generate(prompt, params) for mode in ("spec", "ar"))
    assert spec.tokens == ar.tokens and len(spec.tokens) > len(prompt)


def test_a_draft_with_fewer_positions_than_the_window_is_refused_naming_max_len(pair, tmp_path, capsys):
    """Its cache and rope table end at its positions: past them a batch of drafts was written to its last slot
    with the wrong rotation (acceptance collapsed unsaid), and one sequence alone raised IndexError."""
    target, _ = pair
    short = hf_dir(tmp_path / "short-draft", seed=1, num_hidden_layers=1, max_position_embeddings=64)
    argv = ["bench", "--target", str(target), "--draft-model", str(short), "--workload", "code", "--limit", "1",
            "--max-new-tokens", "4", "--mode", "spec", "--dtype", "float32", "--no-telemetry", "--power", "none"]
    capsys.readouterr()
    assert main([*argv, "--max-len", "256"]) == 2  # the window: the target's 128 positions
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"specfinops bench: error: --draft-model {short}: the draft short-draft holds 64 "
                          "positions, fewer than the context window (128: --max-len, or the target's positions)")
    assert "give --max-len 64 or less" in err
    assert main([*argv, "--max-len", "64"]) == 0


@pytest.mark.parametrize("drafter", ["ngram", "early-exit"])
def test_bench_refuses_a_draft_model_its_drafter_would_not_use(drafter, pair, tmp_path, capsys):
    target, draft = pair
    argv = ["bench", "--target", str(target), "--draft-model", str(draft), "--drafter", drafter, "--no-telemetry"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--draft-model {draft}: --drafter {drafter} uses no draft model" in err


def test_calibrate_refuses_a_draft_its_drafter_would_not_use(pair, capsys):
    target, draft = pair
    assert main(["calibrate", "--target", str(target), "--draft", str(draft), "--drafter", "ngram"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--draft {draft}: --drafter ngram uses no draft model" in err


def test_calibrate_early_exit_on_a_small_target_defaults_to_half_its_layers(pair, capsys):
    """The default of 8 layers left no early exit on a target of 8 layers or fewer, and calibrate had no option."""
    target, _ = pair  # 2 layers
    assert main(["calibrate", "--target", str(target), "--drafter", "early-exit", "--workload", "code", "--limit",
                 "1", "--max-new-tokens", "6", "--dtype", "float32", "--json", "--no-telemetry"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["drafter"] == "early-exit:1"
    domain = report["domains"][0]  # one prompt of 6 tokens: too few tested tokens to judge, and calibrate says so
    assert domain["tested"] < 20 and any("tested draft tokens" in w for w in domain["warnings"])


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_early_exit_layers_beyond_the_target_name_the_option(command, pair, capsys):
    target, _ = pair
    assert main([command, "--target", str(target), "--drafter", "early-exit", "--early-exit-layers", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--early-exit-layers must be below the target's 2 layers" in err and "got 2" in err


def test_bench_early_exit_on_a_small_target_runs(pair, tmp_path):
    target, _ = pair
    run = _bench_json(tmp_path, "--target", str(target), "--drafter", "early-exit")["runs"][0]
    assert run["drafter"] == "early-exit:1"


def test_bench_on_a_target_whose_tokenizer_outgrows_its_vocabulary_is_one_line(tmp_path, capsys):
    """A prompt with token ids past vocab_size crashed mid-run with 'IndexError: index out of range in self'."""
    from tests.test_hf_models import VOCAB

    target = hf_dir(tmp_path / "target", tokenizer=VOCAB + 32)
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "p1", "domain": "code", "prompt": f"w2 w{VOCAB + 20} w3"}) + "\n")
    capsys.readouterr()
    assert main(["bench", "--target", str(target), "--drafter", "ngram", "--no-telemetry", "--workload",
                 str(workload), "--max-new-tokens", "4", "--dtype", "float32"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("specfinops bench: error: ") and f"tokenizer of {target} has {VOCAB + 32} tokens" in last


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_bench_on_damaged_weights_is_one_line_naming_the_file_exit_2(damage, pair, tmp_path, capsys):
    """It was 'error: SafetensorError: Error while deserializing header: ...', exit 1 (a bug), naming no file;
    the option that named the folder begins it."""
    import shutil

    target = tmp_path / "target"
    shutil.copytree(pair[0], target)
    weights = target / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a safetensors file at all")
    capsys.readouterr()
    assert main(["bench", "--target", str(target), "--drafter", "ngram", "--no-telemetry", "--limit", "1"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"specfinops bench: error: --target {target}: {weights}: not a readable safetensors file (")


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_bench_stopped_by_sigterm_or_ctrl_c_ends_its_run_cancelled(signum, tmp_path):
    """SIGTERM (kill, timeout, docker stop) left the run 'running' with ended_at NULL forever; Ctrl-C ended it
    'failed'. Both now end it 'cancelled', exit 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from sqlalchemy import create_engine, text

    target = hf_dir(tmp_path / "target", max_position_embeddings=4096)
    db = tmp_path / "runs.db"
    env = {**os.environ, **{name: "off" for name in ("SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_BF16_KERNEL",
                                                     "SPECFINOPS_DECODE_ATTENTION", "SPECFINOPS_ATTENTION_FLOAT32",
                                                     "SPECFINOPS_DRAFT_INT8")}}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "bench", "--target", str(target), "--drafter", "ngram",
                             "--mode", "ar", "--max-new-tokens", "3000", "--max-len", "4096", "--dtype", "float32",
                             "--power", "none", "--db", str(db)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    engine = create_engine(f"sqlite:///{db}")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with engine.connect() as c:
                    if c.execute(text("select count(*) from runs where status = 'running'")).scalar():
                        break
            except Exception:  # noqa: BLE001 - the store is still being made
                pass
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(getattr(signal, signum))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    with engine.connect() as c:
        rows = c.execute(text("select status, ended_at from runs")).all()
    engine.dispose()
    assert [r.status for r in rows] == ["cancelled"] and rows[0].ended_at is not None


def test_sigterm_under_asyncio_run_cancels_the_main_task_as_ctrl_c_does(tmp_path):
    """loadtest runs in asyncio.run: SIGTERM takes its SIGINT path (the main task cancelled, its cleanup run)."""
    import signal
    import subprocess
    import sys

    child = tmp_path / "child.py"
    child.write_text(
        "import asyncio, sys\n"
        "from app.commands._common import sigterm_as_ctrl_c\n"
        "async def main():\n"
        "    try:\n"
        "        print('ready', flush=True)\n"
        "        await asyncio.sleep(60)\n"
        "    except asyncio.CancelledError:\n"
        "        print('cancelled', flush=True)\n"
        "        raise\n"
        "try:\n"
        "    with sigterm_as_ctrl_c('test'):\n"
        "        asyncio.run(main())\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    sys.exit(130)\n")
    proc = subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(__import__("pathlib").Path(__file__).parent.parent))
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.split() == ["cancelled", "interrupted"] and proc.returncode == 130, err


@pytest.mark.parametrize("command", ["bench", "calibrate", "loadtest"])
def test_the_model_commands_take_sigterm_as_ctrl_c_while_they_run(command, monkeypatch):
    import importlib
    import signal

    module = importlib.import_module(f"app.commands.{command}")
    seen = []
    monkeypatch.setattr(module, "_handle", lambda args: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    before = signal.getsignal(signal.SIGTERM)
    assert main([command]) == 0
    assert seen and seen[0] is not before and seen[0].__qualname__.startswith("sigterm_as_ctrl_c")
    assert signal.getsignal(signal.SIGTERM) is before


def test_bench_json_k_is_the_lookahead_label_in_both_modes(pair, tmp_path, capsys):
    """k was "auto" or "4" (spec: the label as given; test_vllm_backend reads "3") but 0, an int, for AR."""
    from serving.lookahead import DEFAULT_K

    target, draft = pair
    runs = _bench_json(tmp_path, "--target", str(target), "--draft-model", str(draft), "--mode", "both")["runs"]
    assert {r["mode"]: r["k"] for r in runs} == {"ar": "0", "spec": DEFAULT_K}
    table = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(table) if line.startswith("mode"))
    assert len({len(line) for line in table[head: head + 2 + len(runs)]}) == 1  # the drafter label is 21 wide


def test_bench_table_columns_are_as_wide_as_their_widest_cell():
    from app.commands.bench import table_lines

    base = {"mode": "spec", "k": "4", "concurrency": 1, "tokens_per_s": 12.5, "ttft_p50_ms": 40.0, "tpot_p50_ms": 9.0,
            "tpot_p95_ms": 11.0, "acceptance_rate": 0.5, "mean_acceptance_length": 2.5, "token_identical_rate": 1.0,
            "run_ids": [7]}
    runs = [{**base, "mode": "ar", "drafter": None, "k": "0", "acceptance_rate": None},
            {**base, "drafter": "draft:my-long-draft-name@int8+ngram:3-2", "k": "auto", "run_ids": [8, 9, 10]}]
    lines = table_lines(runs)
    assert len({len(line) for line in lines}) == 1
    head = lines[0]
    for name in ("K", "tok/s", "mean acc len", "run"):  # right-aligned: every cell ends where its header ends
        end = head.index(name) + len(name)
        assert all(line[end - 1] != " " and (end == len(line) or line[end] == " ") for line in lines[2:]), name
    assert lines[3].split()[1] == "draft:my-long-draft-name@int8+ngram:3-2"
    short = table_lines([{**base, "drafter": "ngram:3"}])  # short labels keep the columns they had
    assert short[0] == ("mode  drafter          K conc   tok/s  TTFT p50  TPOT p50  TPOT p95  accept mean acc len "
                        "identical   run")


def test_serve_runs_the_draft_model_it_is_given_and_refuses_one_it_would_not_use(pair, monkeypatch, capsys):
    """serve --draft-model D without --drafter ran prompt lookup (the default for a target without a bundled
    draft) and never loaded D; with --drafter ngram it was silently unused."""
    import serving.server_setup as setup

    target, draft = pair
    seen = []
    monkeypatch.setattr(setup, "serve", lambda opts, **_: seen.append(opts) or 0)
    assert main(["serve", "--target", str(target), "--draft-model", str(draft), "--no-telemetry"]) == 0
    assert seen[0].spec.drafter == "draft+ngram" and seen[0].spec.draft_model == str(draft)
    assert main(["serve", "--target", str(target), "--draft-model", str(draft), "--drafter", "ngram",
                 "--no-telemetry"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--draft-model {draft}: --drafter ngram uses no draft model" in err
    assert len(seen) == 1


def test_a_bench_refused_after_its_store_opened_leaves_no_new_store(pair, tmp_path, capsys):
    """A draft with another vocabulary is refused once the models load, after --db was opened: the new, empty
    store it had made stayed, and a later `cost --db` found an empty store rather than 'no store at PATH'."""
    target, _ = pair
    other = hf_dir(tmp_path / "other-vocab", seed=2, vocab_size=300)
    db = tmp_path / "new.db"
    argv = ["bench", "--target", str(target), "--draft-model", str(other), "--limit", "1", "--max-new-tokens", "4",
            "--dtype", "float32", "--power", "none", "--db", f"sqlite:///{db}"]
    assert main(argv) == 2
    assert "vocab" in capsys.readouterr().err.lower()
    assert not db.exists() and not list(tmp_path.glob("new.db-*"))
    # an existing store is left as it was
    existing = tmp_path / "old.db"
    from telemetry.store import open_store

    open_store(f"sqlite:///{existing}").dispose()
    assert main([*argv[:-1], f"sqlite:///{existing}"]) == 2 and existing.exists()


def test_answers_the_context_cannot_hold_are_announced(pair, tmp_path, capsys):
    target, draft = pair
    _bench_json(tmp_path, "--target", str(target), "--draft-model", str(draft), "--max-len", "48",
                "--max-new-tokens", "400")
    err = capsys.readouterr().err
    assert "note: --max-new-tokens 400 does not fit --max-len 48 after 1 of 1 prompts" in err, err


def test_the_k_column_names_a_tree():
    from app.commands.bench import table_lines

    run = {"mode": "spec", "drafter": "draft+ngram", "k": "auto", "tree": "16:6:4:0.25", "concurrency": 1,
           "tokens_per_s": 1.0, "ttft_p50_ms": 1.0, "tpot_p50_ms": 1.0, "tpot_p95_ms": 1.0, "acceptance_rate": 0.5,
           "mean_acceptance_length": 2.0, "token_identical_rate": None, "run_ids": [1]}
    assert "tree 16:6:4:0.25" in table_lines([run])[2]


def test_an_output_file_that_cannot_be_created_is_refused_before_the_work():
    from app.commands._common import check_writable
    from app.errors import UsageError

    with pytest.raises(UsageError, match="--json /proc/x.json: not writable"):
        check_writable("/proc/x.json", "--json")


def _bad_draft(how: str, path):
    """A draft folder with one thing wrong that its files alone show."""
    if how == "no tokenizer":
        return hf_dir(path, seed=1, num_hidden_layers=1, tokenizer=False)
    if how == "other vocabulary":
        return hf_dir(path, seed=1, num_hidden_layers=1, vocab_size=VOCAB + 8, tokenizer=VOCAB + 8)
    if how == "gelu":
        return hf_dir(path, seed=1, num_hidden_layers=1, hidden_act="gelu")
    if how == "few positions":  # the target holds 128
        return hf_dir(path, seed=1, num_hidden_layers=1, max_position_embeddings=16)
    draft = hf_dir(path, seed=1, num_hidden_layers=1)
    (draft / "model.safetensors").unlink()
    return draft


@pytest.mark.parametrize(("how", "needle"), [("no tokenizer", "has no tokenizer files"),
                                             ("other vocabulary", "vocabulary mismatch"),
                                             ("gelu", "hidden_act 'gelu'"),
                                             ("few positions", "the draft draft holds 16 positions, fewer than the "
                                                               "context window (128: "),
                                             ("no weights", "has no weights (*.safetensors or pytorch_model.bin)")])
@pytest.mark.parametrize("flag", ["--draft-model", "--draft"])
def test_a_draft_folders_problem_is_said_before_any_weights_load_naming_its_option(how, needle, flag, pair,
                                                                                     tmp_path, monkeypatch):
    """Each was found only after the target had loaded (minutes for a large one), and said as
    'error: DIR has no *.safetensors weights', not saying the folder was the draft."""
    import serving.worker as worker

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the draft's files were checked")

    monkeypatch.setattr(worker, "load_causal_lm", no_weights)
    target, _ = pair
    draft = _bad_draft(how, tmp_path / "draft")
    spec = worker.EngineSpec(target=str(target), draft_model=str(draft), drafter="draft", dtype="float32")
    with pytest.raises(ValueError) as err:
        worker.load(spec, draft_flag=flag)
    assert str(err.value).startswith(f"{flag} {draft}: ") and needle in str(err.value)


def test_early_exit_layers_beyond_the_target_are_said_before_any_weights_load_naming_it(pair, monkeypatch):
    """The CLI checks --early-exit-layers itself; load's own check (for callers of the API) ran after the target's
    weights loaded, and said nothing of which folder it was."""
    import serving.worker as worker

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before --early-exit-layers was checked")

    monkeypatch.setattr(worker, "load_causal_lm", no_weights)
    target, _ = pair  # 2 layers
    spec = worker.EngineSpec(target=str(target), drafter="early-exit", early_exit_layers=2, dtype="float32")
    with pytest.raises(ValueError) as err:
        worker.load(spec)
    assert str(err.value) == f"--target {target}: --early-exit-layers must be < the target's 2 layers, got 2"


def test_a_target_without_weights_is_said_naming_its_option_before_the_draft_is_read(pair, tmp_path, capsys):
    import shutil

    target = tmp_path / "target"
    shutil.copytree(pair[0], target)
    (target / "model.safetensors").unlink()
    draft = _bad_draft("no weights", tmp_path / "draft")
    assert main(["calibrate", "--target", str(target), "--draft", str(draft), "--drafter", "draft", "--workload",
                 "code", "--limit", "1", "--no-telemetry"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"specfinops calibrate: error: --target {target}: {target} has no weights (*.safetensors or "
                    "pytorch_model.bin)")
