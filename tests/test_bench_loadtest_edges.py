"""Edges of `specfinops bench` and `specfinops loadtest` found by an audit: options refused only after the model
loaded (or by PostgreSQL), requests in flight at Ctrl-C, a second Ctrl-C, progress into a pipe, `--json -`, and a
load-test level whose requests all fail (nothing measured, not 0 tokens/s). Tiny random models and a stub server."""

from __future__ import annotations

import io
import json
import signal

import pytest
from sqlalchemy import create_engine, text

import serving.worker as worker
from app.cli import main
from tests.test_hf_models import hf_dir
from tests.test_loadtest_stub import Stub, fail_fast, stub_factory  # noqa: F401 (fixtures)

KERNEL_SWITCHES = ("SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_BF16_KERNEL", "SPECFINOPS_DECODE_ATTENTION",
                   "SPECFINOPS_ATTENTION_FLOAT32", "SPECFINOPS_DRAFT_INT8")


@pytest.fixture(autouse=True)
def no_kernel_races(monkeypatch):
    """Tiny models need no CPU kernel measurement."""
    for name in KERNEL_SWITCHES:
        monkeypatch.setenv(name, "off")


def tiny_target(root):
    """A tiny Hugging Face target under `root` with room for the builtin prompts and a few new tokens."""
    return hf_dir(root / "target", max_position_embeddings=1024)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("edges"))


def _tiny_bench(target, *extra) -> list[str]:
    return ["bench", "--target", str(target), "--drafter", "ngram", "--workload", "code", "--dtype", "float32",
            "--power", "none", "--max-len", "512", *extra]


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model is a failure of the test: the option must be refused before."""
    def refuse(spec):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(worker, "load", refuse)


# ------------------------------------------------------------------ options refused before the model loads


@pytest.mark.parametrize("extra,said", [
    # torch refused it at the first sampled token, after the model loaded: "Overflow when unpacking long long"
    (["--temperature", "0.7", "--seed", str(2**64)], "--seed must be within"),
    (["--seed", str(-(2**63) - 1)], "--seed must be within"),
    # runs.top_k / runs.max_new_tokens are 32-bit: PostgreSQL said "integer out of range" once the run started
    (["--top-k", str(2**31)], "--top-k must be at most 2147483647"),
    (["--max-new-tokens", "99999999999"], "--max-new-tokens must be at most 2147483647"),
    # more draft tokens than the context holds; 'fixed:<29 digits>' overflowed runs.k_policy (32 characters)
    (["--k", "9" * 29], "--k 999"),
    (["--k", "auto:100000"], "at most --max-len (512) draft tokens"),
    # an empty item or a level given twice ran silently ('1,1' ran level 1 twice and recorded it as a sweep)
    (["--concurrency", "1,,2"], "--concurrency must be integers"),
    (["--concurrency", "2,"], "--concurrency must be integers"),
    (["--concurrency", "1,2,1"], "--concurrency gives level 1 more than once"),
    # one prompt at "concurrency 16" ran one sequence and was recorded (and costed) as c=16
    (["--limit", "1", "--concurrency", "1,16"], "--concurrency 16: the bench has 1 prompt (--workload code --limit 1)"),
    # options the run silently ignored
    (["--mode", "ar", "--k", "4"], "--k shapes speculative decoding, which --mode ar does not run"),
    (["--mode", "ar", "--tree", "8:3", "--spec-max-batch", "2"], "--tree, --spec-max-batch shape speculative"),
    (["--vllm-args", "{"], "--vllm-args applies to --backend vllm"),
])
def test_bad_options_are_one_line_exit_2_before_the_model_loads(extra, said, target, no_model, tmp_path, capsys):
    db = tmp_path / "s.db"
    rc = main(_tiny_bench(target, "--db", str(db), *extra))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and said in err, err
    assert err.startswith("specfinops bench: error: ")
    assert not db.exists()


def test_loadtest_refuses_a_level_given_twice(capsys):
    assert main(["loadtest", "--concurrency", "4,4", "--duration", "1"]) == 2
    assert "--concurrency gives level 4 more than once" in capsys.readouterr().err


def test_a_large_seed_torch_takes_still_runs(target, tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = main(_tiny_bench(target, "--mode", "ar", "--limit", "1", "--max-new-tokens", "3", "--temperature", "0.7",
                          "--seed", str(2**64 - 1), "--no-telemetry", "--json", str(out)))
    assert rc == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["runs"][0]["seed"] == 2**64 - 1


# ------------------------------------------------------------------ Ctrl-C mid-bench


def test_requests_in_flight_at_ctrl_c_are_recorded_cancelled(target, tmp_path, monkeypatch, capsys):
    """The run ended 'cancelled', but the requests in flight were dropped: the store said 1 request where 3 ran."""
    from serving.engine import Engine

    step, calls = Engine.step, []

    def interrupted_step(self):
        if self.on_step is not None:  # a measured engine (the warm-up's has no step callback)
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(Engine, "step", interrupted_step)
    db = f"sqlite:///{tmp_path / 'c.db'}"
    rc = main(_tiny_bench(target, "--mode", "ar", "--limit", "4", "--concurrency", "3", "--max-new-tokens", "50",
                          "--db", db))
    assert rc == 130
    with create_engine(db).connect() as c:
        runs = c.execute(text("select status from runs")).scalars().all()
        reqs = c.execute(text("select status, error, output_tokens, e2e_ms from requests")).all()
    assert runs == ["cancelled"]
    cancelled = [r for r in reqs if r.status == "cancelled"]
    assert len(cancelled) == 3 - sum(r.status == "ok" for r in reqs) and cancelled, reqs
    assert all("interrupted" in r.error and r.e2e_ms is not None for r in cancelled), cancelled
    assert main(["cost", "--db", db]) == 0  # the store still reads


def test_a_second_ctrl_c_does_not_interrupt_the_stopping():
    """The first Ctrl-C raises KeyboardInterrupt; while the bench stops (the recorder flushes, the run ends), the
    next ones are ignored: they interrupted the cleanup and printed a traceback."""
    from app.commands.bench import ctrl_c_once

    with ctrl_c_once():
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ------------------------------------------------------------------ progress into a pipe


class Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_bench_progress_into_a_pipe_is_not_redrawn_per_request(monkeypatch):
    from app.commands.bench import progress_bar

    pipe = Pipe()
    monkeypatch.setattr("sys.stderr", pipe)
    bar = progress_bar(500, "ar c=32")
    for _ in range(500):
        bar.update(1)
    bar.close()
    assert pipe.getvalue().count("ar c=32") <= 3, pipe.getvalue().count("ar c=32")


def test_loadtest_progress_into_a_pipe_is_not_redrawn_twice_a_second(monkeypatch):
    from app.commands.loadtest import level_bars

    pipe = Pipe()
    monkeypatch.setattr("sys.stderr", pipe)
    tick = level_bars(60.0)("spec", 4)
    for i in range(1, 120):  # a 60 s level reports every 0.5 s
        tick(i * 0.5, i, 10 * i, False)
    tick(60.0, 120, 1200, True)
    assert pipe.getvalue().count("spec c=4") <= 10, pipe.getvalue().count("spec c=4")


# ------------------------------------------------------------------ --json -


def test_bench_json_dash_is_the_only_thing_on_stdout(target, tmp_path, monkeypatch, capsys):
    """`--json -` wrote a file named '-' in the current directory, and the table shared stdout."""
    monkeypatch.chdir(tmp_path)
    rc = main(_tiny_bench(target, "--limit", "1", "--max-new-tokens", "3", "--no-telemetry", "--json", "-"))
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert [r["mode"] for r in doc["runs"]] == ["ar", "spec"]
    assert "TPOT p50" in out.err and not (tmp_path / "-").exists()


def test_loadtest_json_dash_is_the_only_thing_on_stdout(stub_factory, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    stub = stub_factory(chunks=2, chunk_s=0.01)
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1", "--duration", "0.5", "--mode", "spec",
               "--max-tokens", "8", "--workload", "code", "--no-telemetry", "--json", "-"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert doc["levels"][0]["requests_ok"] >= 1 and "TTFT p50" in out.err
    assert not (tmp_path / "-").exists()


# ------------------------------------------------------------------ a load-test level where every request fails


def test_a_level_whose_requests_all_fail_measures_nothing_not_0_tokens_per_s(stub_factory, fail_fast, tmp_path,  # noqa: F811
                                                                             capsys):
    stub = stub_factory(refuse=True)
    db = f"sqlite:///{tmp_path / 'f.db'}"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "2", "--duration", "5", "--mode", "ar",
               "--max-tokens", "8", "--workload", "code", "--db", db, "--json", str(tmp_path / "f.json")])
    out = capsys.readouterr()
    assert rc == 1
    level = json.loads((tmp_path / "f.json").read_text())["levels"][0]
    assert level["requests_ok"] == 0 and level["requests_error"] >= 3
    assert level["tokens_per_s"] is None  # was 0.0: a measurement of a server that answered nothing
    row = next(line for line in out.out.splitlines() if line.startswith("ar "))
    assert " 0.0 " not in row and "—" in row, row
    assert "ar c=2: no request succeeded" in out.out and "nothing measured" in out.out
    with create_engine(db).connect() as c:
        assert c.execute(text("select status from runs")).scalars().all() == ["failed"]
        assert c.execute(text("select count(*) from requests where status = 'ok'")).scalar() == 0


# ------------------------------------------------------------------ a prompt longer than the context


def test_a_prompt_past_the_targets_positions_names_the_workload_and_the_window(tmp_path, capsys):
    """--max-len above the target's max_position_embeddings: the engine keeps the lesser, but bench checked the
    prompts against --max-len, so a prompt past the target's positions failed inside the warm-up ('prompt is 100
    tokens, longer than the context window (64 tokens)': which prompt, which file?) and left a new empty store."""
    small = hf_dir(tmp_path / "small", max_position_embeddings=64)
    work = tmp_path / "long.jsonl"
    work.write_text(json.dumps({"id": "long-one", "domain": "d", "prompt": " ".join(["w5"] * 100)}) + "\n")
    db = tmp_path / "s.db"
    rc = main(["bench", "--target", str(small), "--drafter", "ngram", "--workload", str(work), "--dtype", "float32",
               "--power", "none", "--max-len", "512", "--max-new-tokens", "4", "--db", str(db), "--mode", "ar"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert f"--workload {work}: prompt long-one is 100 tokens" in err and "max_position_embeddings" in err, err
    assert not db.exists()


def test_a_prompt_past_the_targets_sliding_window_names_the_window_not_max_len(tmp_path, capsys):
    """A sliding_window shorter than max_position_embeddings sets the target's context: the error said
    'max_position_embeddings' and 'raise --max-len', though --max-len was already larger and cannot lift it."""
    windowed = hf_dir(tmp_path / "windowed", "mistral", sliding_window=24)
    work = tmp_path / "long.jsonl"
    work.write_text(json.dumps({"id": "long-one", "domain": "d", "prompt": " ".join(["w5"] * 30)}) + "\n")
    rc = main(["bench", "--target", str(windowed), "--drafter", "ngram", "--workload", str(work), "--dtype",
               "float32", "--power", "none", "--max-len", "512", "--max-new-tokens", "4", "--no-telemetry",
               "--mode", "ar"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert "prompt long-one is 30 tokens" in err, err
    assert "the target's 24 positions (sliding_window; --max-len 512" in err, err
    assert "max_position_embeddings" not in err and "raise --max-len" not in err, err


def test_a_store_path_that_cannot_be_made_is_named_under_db(target, no_model, capsys):
    """'[Errno 2] No such file or directory: '/proc/x'' did not say which option named it."""
    assert main(_tiny_bench(target, "--db", "/proc/no-such-dir/s.db")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specfinops bench: error: --db /proc/no-such-dir/s.db: cannot create the store"), err


@pytest.mark.parametrize("command", ["bench", "loadtest"])
def test_an_empty_node_id_is_refused(command, target, no_model, capsys):
    """--node-id '' fell back to the hostname unsaid."""
    argv = _tiny_bench(target) if command == "bench" else ["loadtest", "--duration", "1"]
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--node-id", " "])
    assert stop.value.code == 2
    assert "argument --node-id: must not be empty" in capsys.readouterr().err


def test_a_second_ctrl_c_during_a_load_tests_stopping_still_prints_and_records(stub_factory, tmp_path,  # noqa: F811
                                                                               monkeypatch, capsys):
    """Two Ctrl-Cs in quick succession: the second raised KeyboardInterrupt inside the stopping (the recorder's
    flush), so the requests still queued were lost and the table and the --json file of what ran never written."""
    import asyncio
    import os

    import serving.loadtest as lt

    stub = stub_factory(chunks=50, chunk_s=0.02)
    real_run_level = lt.run_level

    async def run_level(client, model, prompts, spec, level, mode, **kwargs):
        task = asyncio.ensure_future(real_run_level(client, model, prompts, spec, level, mode, **kwargs))
        while stub.num_chat < 2:
            await asyncio.sleep(0.01)
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)  # the first: cancels the main task, the level stops
        return await task

    def close(self):  # the stopping flushes the recorder: the second Ctrl-C lands there
        if sent == [1]:
            sent.append(2)
            os.kill(os.getpid(), signal.SIGINT)
        real_close(self)

    sent: list[int] = []

    from telemetry.recorder import Recorder

    real_close = Recorder.close
    monkeypatch.setattr(lt, "run_level", run_level)
    monkeypatch.setattr(Recorder, "close", close)
    db = f"sqlite:///{tmp_path / 'twice.db'}"
    out_json = tmp_path / "twice.json"
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "2", "--duration", "5", "--mode", "spec",
               "--max-tokens", "8", "--workload", "code", "--db", db, "--json", str(out_json)])
    out = capsys.readouterr()
    assert rc == 130, out.err
    assert "spec c=2 was interrupted" in out.out, out.out
    assert json.loads(out_json.read_text())["interrupted"] is True
    with create_engine(db).connect() as c:
        assert c.execute(text("select status from runs")).scalars().all() == ["cancelled"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("extra,said", [
    (["--top-p", "2"], "error: --top-p must be in (0, 1]"),  # once: not "--top-p: top_p must be"
    (["--temperature", "nan"], "error: --temperature must be a finite number"),
    (["--max-new-tokens", "0"], "error: --max-new-tokens must be an integer >= 1, got 0"),
    (["--top-k", "-1"], "error: --top-k must be an integer >= 0, got -1"),
    (["--k", "abc"], "--k: unknown k policy 'abc'"),
])
def test_sampling_and_k_errors_name_the_option(extra, said, target, no_model, capsys):
    assert main(_tiny_bench(target, "--no-telemetry", *extra)) == 2
    assert said in capsys.readouterr().err


def test_an_unknown_model_is_named_under_model(stub_factory, tmp_path, capsys):  # noqa: F811
    stub = stub_factory()
    assert main(["loadtest", "--url", stub.url, "--model", "nope", "--duration", "1", "--no-telemetry"]) == 2
    assert "error: --model: the server does not serve 'nope'; it serves stub-model" in capsys.readouterr().err


def test_spec_max_batch_auto_without_telemetry_creates_no_store(target, tmp_path, capsys):
    """`--no-telemetry --spec-max-batch auto` on a store that does not exist created an empty one."""
    db = tmp_path / "none.db"
    rc = main(_tiny_bench(target, "--limit", "1", "--max-new-tokens", "3", "--no-telemetry",
                          "--spec-max-batch", "auto", "--db", str(db)))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "--spec-max-batch auto reads the latest recorded sweep: no store at" in err, err
    assert not db.exists()


def test_calibrate_names_the_prompt_and_the_window_past_which_it_runs(tmp_path, capsys):
    """calibrate said only the engine's "prompt is 30 tokens, longer than the context window (24 tokens)": which
    prompt, and what sets 24?"""
    windowed = hf_dir(tmp_path / "windowed", "mistral", sliding_window=24)
    work = tmp_path / "long.jsonl"
    work.write_text(json.dumps({"id": "long-one", "domain": "d", "prompt": " ".join(["w5"] * 30)}) + "\n")
    rc = main(["calibrate", "--target", str(windowed), "--drafter", "ngram", "--workload", str(work), "--dtype",
               "float32", "--max-new-tokens", "4", "--no-telemetry"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2, err
    assert "prompt long-one is 30 tokens" in err and "the target's 24 positions (sliding_window" in err, err


def test_a_prompt_one_past_what_the_targets_window_fits_is_told_how_many_fit(tmp_path, capsys):
    """A 23-token prompt and the target's 24 positions: it was called 'longer than the context window', which it
    is not (a position is kept spare for the answer); the error says how many prompt tokens fit."""
    windowed = hf_dir(tmp_path / "windowed", "mistral", sliding_window=24)
    work = tmp_path / "long.jsonl"
    work.write_text(json.dumps({"id": "near", "domain": "d", "prompt": " ".join(["w5"] * 23)}) + "\n")
    rc = main(["bench", "--target", str(windowed), "--drafter", "ngram", "--workload", str(work), "--dtype",
               "float32", "--power", "none", "--max-len", "512", "--max-new-tokens", "4", "--no-telemetry",
               "--mode", "ar"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert "prompt near is 23 tokens; the context window (the target's 24 positions (sliding_window" in err, err
    assert "fits at most 22 prompt tokens" in err and "longer than" not in err, err
