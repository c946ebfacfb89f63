"""`specfinops calibrate --db` and `--temperature`: what it measured lands in the store as one invocation of bench
runs (its AR and spec turns, requests with their steps) that `invocations` reads, nothing left 'running' when it
is stopped; and alpha measured at a sampling temperature, said beside the verdict. Tiny random models."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine, text

from app.cli import main
from tests.test_bench_loadtest_edges import KERNEL_SWITCHES


@pytest.fixture(autouse=True)
def no_kernel_races(monkeypatch):
    """Tiny models need no CPU kernel measurement."""
    for name in KERNEL_SWITCHES:
        monkeypatch.setenv(name, "off")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A 2-layer target and a 1-layer draft sharing one tokenizer."""
    from tests.test_hf_models import hf_dir

    root = tmp_path_factory.mktemp("pair")
    return hf_dir(root / "target", seed=0), hf_dir(root / "draft", seed=1, num_hidden_layers=1)


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "domain": "code", "prompt": f"hello {i}"}) + "\n"
                            for i in range(2)))
    return path


def _calibrate(pair, workload, *extra) -> int:
    target, draft = pair
    return main(["calibrate", "--target", str(target), "--draft", str(draft), "--workload", str(workload),
                 "--max-new-tokens", "3", "--dtype", "float32", *extra])


def _runs(url: str) -> list[dict]:
    with create_engine(url).connect() as c:
        return [dict(r._mapping) for r in c.execute(text(
            "select id, mode, kind, status, invocation_id, temperature, seed, concurrency, workload from runs "
            "order by id"))]


def test_help_shows_temperature_seed_and_db_with_examples(capsys):
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for option in ("--temperature", "--seed", "--db URL", "--no-telemetry"):
        assert option in out
    assert "specfinops calibrate --workload chat --temperature 0.7 --seed 1" in out
    assert "specfinops calibrate --workload code --limit 4 --db postgresql://" in out


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_calibration_is_recorded_as_one_invocation_that_invocations_reads(pair, workload, db_url, capsys):
    url = db_url
    assert _calibrate(pair, workload, "--db", url) == 0
    out = capsys.readouterr().out.strip().splitlines()
    runs = _runs(url)
    # each mode on each prompt, AR first, as one invocation of bench runs, all ended
    assert [r["mode"] for r in runs] == ["ar", "spec", "ar", "spec"], runs
    assert {r["kind"] for r in runs} == {"bench"} and {r["status"] for r in runs} == {"completed"}
    (inv,) = {r["invocation_id"] for r in runs}
    assert inv and {r["temperature"] for r in runs} == {0.0} and {r["concurrency"] for r in runs} == {1}
    assert out[-1].startswith(f"recorded in the store as invocation {inv}")
    with create_engine(url).connect() as c:
        per_run = {rid: n for rid, n in c.execute(text("select run_id, count(*) from requests where status = 'ok' "
                                                       "group by run_id"))}
        steps = c.execute(text("select count(*), sum(k) from steps join requests on steps.request_id = requests.id "
                               "join runs on requests.run_id = runs.id where runs.mode = 'spec'")).one()
    assert per_run == {r["id"]: 1 for r in runs}
    assert steps[0] > 0 and steps[1] > 0  # the spec requests' steps, with their drafts
    assert main(["invocations", "--db", url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert inv in json.dumps(listed)


def test_json_names_the_invocation_on_stderr_and_in_the_document(pair, workload, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert _calibrate(pair, workload, "--db", url, "--json") == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout: the JSON alone
    (inv,) = {r["invocation_id"] for r in _runs(url)}
    assert doc["invocation_id"] == inv and doc["temperature"] == 0.0
    assert captured.err.strip().splitlines()[-1].startswith(f"recorded in the store as invocation {inv}")


def test_no_telemetry_records_nothing(pair, workload, tmp_path, monkeypatch, capsys):
    """Not in the environment's store either (--db beside --no-telemetry is refused: tests/test_cli_input.py)."""
    db = tmp_path / "store.db"
    monkeypatch.setenv("SPECFINOPS_DB_URL", f"sqlite:///{db}")
    assert _calibrate(pair, workload, "--no-telemetry", "--json") == 0
    assert json.loads(capsys.readouterr().out)["invocation_id"] is None
    assert not db.exists()


def test_at_a_temperature_alpha_is_measured_and_the_verdict_says_at_which(pair, workload, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert _calibrate(pair, workload, "--db", url, "--temperature", "0.8", "--seed", "3", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    (dom,) = doc["domains"]
    assert doc["temperature"] == 0.8 and doc["seed"] == 3
    assert dom["alpha"] is not None and 0 <= dom["alpha"] <= 1 and dom["verdict"] in ("GO", "NO-GO")
    assert {(r["temperature"], r["seed"]) for r in _runs(url)} == {(0.8, 3)}
    assert _calibrate(pair, workload, "--temperature", "0.8", "--no-telemetry") == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("domain "))
    assert header.endswith("verdict (alpha >= 0.65 at temperature 0.8)")
    assert "min(1, p/q)" in out


@pytest.mark.parametrize(("argv", "says"), [
    (["--temperature", "-0.5"], "error: --temperature must be >= 0, got -0.5"),
    (["--seed", str(2**64)], "--seed must be within"),
])
def test_bad_sampling_options_get_one_line_and_no_store(argv, says, pair, workload, tmp_path, capsys):
    db = tmp_path / "store.db"
    assert _calibrate(pair, workload, "--db", f"sqlite:///{db}", *argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err, err
    assert not db.exists()


def test_stopped_calibration_leaves_no_run_running(pair, workload, tmp_path, monkeypatch, capsys):
    """Ctrl-C in the third turn (AR on the second prompt): the two turns before it 'completed', it 'cancelled'."""
    from serving.worker import ModeRunner

    real_run, calls = ModeRunner.run, []

    def run(self, *a, **kw):
        calls.append(self.mode)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_run(self, *a, **kw)

    monkeypatch.setattr(ModeRunner, "run", run)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert _calibrate(pair, workload, "--db", url) == 130
    runs = _runs(url)
    assert [(r["mode"], r["status"]) for r in runs] == [("ar", "completed"), ("spec", "completed"),
                                                         ("ar", "cancelled")]
    (inv,) = {r["invocation_id"] for r in runs}
    assert f"in the store as invocation {inv}" in capsys.readouterr().err


def test_refused_once_the_target_loaded_leaves_no_store_behind(tmp_path, capsys):
    """A prompt past the target's window is found only once it has loaded, after --db was opened (created): the
    store file that calibrate created is removed again, as bench removes it."""
    from tests.test_hf_models import hf_dir

    windowed = hf_dir(tmp_path / "windowed", "mistral", sliding_window=24)
    work = tmp_path / "long.jsonl"
    work.write_text(json.dumps({"id": "long-one", "domain": "d", "prompt": " ".join(["w5"] * 30)}) + "\n")
    db = tmp_path / "store.db"
    assert main(["calibrate", "--target", str(windowed), "--drafter", "ngram", "--workload", str(work), "--dtype",
                 "float32", "--max-new-tokens", "4", "--db", f"sqlite:///{db}"]) == 2
    assert "prompt long-one is 30 tokens" in capsys.readouterr().err
    assert not any(tmp_path.glob("store.db*"))


def test_a_read_only_store_is_refused_before_any_model_loads(pair, workload, empty_store, read_only_url,
                                                             monkeypatch, capsys):
    import serving.worker as worker

    def no_load(spec):
        raise AssertionError("the model loaded before --db was checked")

    monkeypatch.setattr(worker, "load", no_load)
    assert _calibrate(pair, workload, "--db", read_only_url(empty_store)) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "specfinops calibrate: error: --db " in line and ": not writable: " in line, line


def test_the_warm_up_samples_at_the_temperature_measured(pair, workload, monkeypatch, capsys):
    """The untimed warm-up was greedy whatever the temperature: the first sampled prompt paid sampling's and
    rejection sampling's first calls inside the times c, v and measured divide."""
    from serving.engine import Engine

    warmed, generate = [], Engine.generate

    def recorded_generate(self, prompt_ids, params, *a, **kw):
        warmed.append((params.temperature, params.seed, params.max_new_tokens))
        return generate(self, prompt_ids, params, *a, **kw)

    monkeypatch.setattr(Engine, "generate", recorded_generate)
    assert _calibrate(pair, workload, "--temperature", "0.8", "--seed", "5", "--no-telemetry", "--json") == 0
    assert warmed == [(0.8, 5, 8), (0.8, 5, 8)]  # AR, then spec


def test_the_bench_warm_up_samples_at_the_temperature_measured_too(pair, workload, monkeypatch, capsys):
    """calibrate's warm-up was made to sample at the measured temperature; bench's stayed greedy, so a sampled
    bench's first timed turn paid sampling's first calls in its tokens/s."""
    from serving.engine import Engine

    warmed, generate = [], Engine.generate

    def recorded_generate(self, prompt_ids, params, *a, **kw):
        warmed.append((params.temperature, params.seed, params.max_new_tokens))
        return generate(self, prompt_ids, params, *a, **kw)

    monkeypatch.setattr(Engine, "generate", recorded_generate)
    target, draft = pair
    assert main(["bench", "--target", str(target), "--draft", str(draft), "--workload", str(workload), "--mode",
                 "both", "--max-new-tokens", "3", "--dtype", "float32", "--temperature", "0.8", "--seed", "5",
                 "--no-telemetry"]) == 0
    assert warmed[:2] == [(0.8, 5, 8), (0.8, 5, 8)]  # AR, then spec: the untimed warm-ups, at the run's sampling


def _stop_in(stage: str, monkeypatch) -> None:
    """Ctrl-C while the models load, in the spec warm-up (the AR one ran), or as the first turn's run opens in the
    store (before its row is written)."""
    import serving.worker as worker
    from telemetry.recorder import Recorder

    def stopped(*_a, **_kw):
        raise KeyboardInterrupt

    if stage == "loading":
        monkeypatch.setattr(worker, "load", stopped)
    elif stage == "warm-up":
        real_warm_up = worker.warm_up
        monkeypatch.setattr(worker, "warm_up", lambda loaded, mode, *a, **kw: stopped() if mode == "spec"
                            else real_warm_up(loaded, mode, *a, **kw))
    else:
        monkeypatch.setattr(Recorder, "start_run", stopped)


@pytest.mark.parametrize("stage", ["loading", "warm-up", "first run"])
def test_stopped_before_its_first_run_leaves_no_store_behind(stage, pair, workload, tmp_path, monkeypatch,
                                                             capsys):
    """Ctrl-C before a run was recorded in the store file that calibrate created (in a folder it made): file and
    folder are removed again, as bench removes them; it left an empty store once the models had loaded."""
    _stop_in(stage, monkeypatch)
    db = tmp_path / "new" / "store.db"
    assert _calibrate(pair, workload, "--db", f"sqlite:///{db}") == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted"
    assert not (tmp_path / "new").exists(), list((tmp_path / "new").iterdir())


def test_stopped_in_its_first_run_keeps_the_store_with_the_run_cancelled(pair, workload, tmp_path, monkeypatch,
                                                                         capsys):
    """Once a run is recorded the store stays, whenever Ctrl-C comes: here in the first turn."""
    from serving.worker import ModeRunner

    def stopped(*_a, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(ModeRunner, "run", stopped)
    url = f"sqlite:///{tmp_path / 'new' / 'store.db'}"
    assert _calibrate(pair, workload, "--db", url) == 130
    assert [(r["mode"], r["status"]) for r in _runs(url)] == [("ar", "cancelled")]
    capsys.readouterr()


def _refuse_runs_from(url: str, n: int) -> None:
    """The store's database refuses to insert a run once it holds `n` (a trigger: SQLite raising as a database that
    fails does)."""
    with create_engine(url).begin() as c:
        c.execute(text(f"create trigger refuse before insert on runs when (select count(*) from runs) >= {n} "
                       "begin select raise(abort, 'the database refused the run'); end"))


@pytest.mark.parametrize("refused_from", [0, 1])
def test_a_database_failing_mid_run_ends_the_bar_before_one_line_of_error(refused_from, pair, workload, tmp_path,
                                                                          monkeypatch, capsys):
    """The database raises as the first run, or the second, is inserted: the error on a line of its own after the
    progress bar, no traceback; the store kept where it holds the run before, removed where it holds none."""
    import serving.worker as worker

    url = f"sqlite:///{tmp_path / 'store.db'}"
    real_warm_up = worker.warm_up

    def warm_up(loaded, mode, *a, **kw):  # the store exists by now (calibrate made it): the database turns bad
        real_warm_up(loaded, mode, *a, **kw)
        if mode == "spec":
            _refuse_runs_from(url, refused_from)

    monkeypatch.setattr(worker, "warm_up", warm_up)
    assert _calibrate(pair, workload, "--db", url) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.split("\n")[-2] == ("specfinops calibrate: error: cannot use the database: the database refused the "
                                   "run"), err
    assert "\rcalibrate:" in err  # the bar ran ...
    assert err.split("\n")[-3].startswith("\rcalibrate:"), err  # ... and was closed: the error starts a line
    if refused_from:
        assert [(r["mode"], r["status"]) for r in _runs(url)] == [("ar", "completed")]
    else:
        assert not any(tmp_path.glob("store.db*"))


def test_a_store_that_fails_as_the_recorder_opens_it_leaves_no_bar_open(pair, workload, tmp_path, monkeypatch,
                                                                        capsys):
    """The store turned unusable while the models loaded (here: another program wrote over the file): the bar was
    drawn before the recorder opened it and never closed, so the error was written on the bar's line."""
    import serving.worker as worker

    db = tmp_path / "store.db"
    real_warm_up = worker.warm_up

    def warm_up(loaded, mode, *a, **kw):
        real_warm_up(loaded, mode, *a, **kw)
        if mode == "spec":
            db.write_bytes(b"not a database" * 100)

    monkeypatch.setattr(worker, "warm_up", warm_up)
    assert _calibrate(pair, workload, "--db", f"sqlite:///{db}") == 2
    err = capsys.readouterr().err
    last = err.split("\n")[-2]
    assert last.startswith("specfinops calibrate: error: ") and "not a SQLite database" in last, err
    assert "calibrate:" not in err.replace("specfinops calibrate:", ""), err  # no bar was drawn
