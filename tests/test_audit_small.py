"""Small problems a user audit found: errors that name what was wrong, help that matches behaviour."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run

from app.cli import main
from telemetry.store import open_store

INV_A = "a1b2c3d4" + "0" * 24
INV_B = "b1b2c3d4" + "0" * 24


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err


# ---- 1. a --db that is a directory, or a file that is not a SQLite database, is named ----------------


@pytest.mark.parametrize("argv", [
    ["cost"],
    ["invocations"],
    ["export", "--what", "requests", "--out", "-"],
    ["report", "--period", "weekly", "--out", "{tmp}/report"],
    ["db", "upgrade"],
    ["db", "current"],
    ["db", "check"],
])
def test_a_directory_or_a_non_database_is_named_by_every_command(argv, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    folder = tmp_path / "adir"
    folder.mkdir()
    assert main([*argv, "--db", str(folder)]) == 2
    err = _err(capsys)
    assert f"--db {folder} is a directory: give a SQLite file path" in err and len(err.splitlines()) == 1
    junk = tmp_path / "junk.db"
    junk.write_text("hello, not a database\n")
    assert main([*argv, "--db", str(junk)]) == 2
    err = _err(capsys)
    assert f"--db {junk}: not a SQLite database (cannot use the database: file is not a database)" in err
    assert junk.read_text() == "hello, not a database\n"  # left as it was


def test_the_store_check_leaves_good_and_missing_and_empty_files_alone(tmp_path, monkeypatch):
    from telemetry.store import StoreError, refuse_unusable_sqlite_file

    refuse_unusable_sqlite_file(str(tmp_path / "missing.db"))
    (tmp_path / "empty.db").touch()  # SQLite takes an empty file as an empty database
    refuse_unusable_sqlite_file(str(tmp_path / "empty.db"))
    open_store(str(tmp_path / "good.db")).dispose()
    refuse_unusable_sqlite_file(str(tmp_path / "good.db"))
    refuse_unusable_sqlite_file("postgresql://u@h/db")  # a server: nothing to look at
    monkeypatch.setenv("SPECFINOPS_DB_URL", str(tmp_path))
    with pytest.raises(StoreError, match=f"SPECFINOPS_DB_URL {tmp_path} is a directory"):
        open_store()


# ---- 2. export says why nothing matched: no power measured, a --run outside the selection -------------


@pytest.fixture
def runs_store(sqlite_url) -> str:
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        one = make_run(s, "ar", requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50)])
        two = make_run(s, "spec", requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50)],
                       started_at=BASE_TIME.replace(day=3))
        one.invocation_id, two.invocation_id = INV_A, INV_B
        s.commit()
    engine.dispose()
    return sqlite_url


def test_export_power_of_runs_that_measured_none_says_so(runs_store, capsys):
    assert main(["export", "--db", runs_store, "--what", "power", "--out", "-"]) == 0
    err = _err(capsys)
    assert "no power rows: the 2 runs selected measured no power (power_source 'none'" in err
    assert main(["export", "--db", runs_store, "--what", "power", "--mode", "ar", "--out", "-"]) == 0
    err = _err(capsys)
    assert "the run selected measured no power" in err and "match the selection" not in err


def test_export_power_where_some_run_measured_power_keeps_the_general_line(sqlite_url, capsys):
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(output_tokens=5, ttft_ms=10, e2e_ms=50)], power_source="nvml",
                 power_w=[100.0, 110.0])
        s.commit()
    engine.dispose()
    # the run is selected (workload code), its power samples lie before the window: no rows
    assert main(["export", "--db", sqlite_url, "--what", "power", "--workload", "code", "--since", "2099-01-01",
                 "--out", "-"]) == 0
    err = _err(capsys)
    assert "measured no power" not in err and "no power rows: none in the time window (at or after 2099-01-01 " \
        "00:00:00 UTC); the selection's power samples were taken at 2026-11-02 09:00:00 UTC" in err, err


def test_export_a_run_outside_the_other_selectors_is_named(runs_store, tmp_path, capsys):
    out = tmp_path / "out.csv"
    assert main(["export", "--db", runs_store, "--what", "requests", "--run", "1", "--invocation", INV_B[:8],
                 "--out", str(out)]) == 0
    err = _err(capsys)
    assert "wrote 0 requests rows" in err
    assert f"no requests rows: run 1 does not match the selection (run 1 has invocation '{INV_A}', not '{INV_B}')" \
        in err
    assert main(["export", "--db", runs_store, "--what", "requests", "--run", "1", "--mode", "spec",
                 "--out", "-"]) == 0
    assert "run 1 does not match the selection (run 1 has mode 'ar', not 'spec')" in _err(capsys)
    # the run within the selection: its rows, no such line
    assert main(["export", "--db", runs_store, "--what", "requests", "--run", "1", "--invocation", INV_A[:8],
                 "--out", "-"]) == 0
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 2 and "does not match" not in err


# ---- 3. help that matches behaviour -------------------------------------------------------------------


def _help(capsys, *command: str) -> str:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone


def test_bench_help_says_both_interleaves_and_workload_all(capsys):
    text = _help(capsys, "bench")
    assert "both (AR then spec, compared)" not in text
    assert "AR and spec take turns every 4 prompts (--interleave)" in text
    assert ("--workload WORKLOAD builtin name (code, chat, rewrite, mixed) or a .jsonl path (or .txt: a prompt a "
            "line; format below) (default: code); all = mixed (every builtin domain, round-robin)") in text
    assert "all of AR, then all of spec (default: both)" in text


def test_serve_early_exit_layers_default_is_what_serve_does(tmp_path, monkeypatch, capsys):
    import json

    import serving.server_setup as setup

    assert "--early-exit-layers EARLY_EXIT_LAYERS target layers used by --drafter early-exit (default: 8, or half " \
           "the layers of a target with 8 or fewer)" in _help(capsys, "serve")
    served = []
    monkeypatch.setattr(setup, "serve", lambda opts, **_: served.append(opts.spec.early_exit_layers))
    small = tmp_path / "small"
    small.mkdir()
    (small / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    common = ["serve", "--drafter", "early-exit", "--no-telemetry", "--port", "0", "--power", "none"]
    assert main([*common, "--target", str(small)]) == 0
    assert main(common) == 0  # the bundled target: 30 layers
    assert served == [2, 8]
    # checked before the target loads, as bench does
    assert main([*common, "--early-exit-layers", "30"]) == 2
    assert "--early-exit-layers must be below the target's 30 layers" in _err(capsys)
    assert served == [2, 8]


def test_readme_points_at_definitions_in_the_repository():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert "DESIGN.md" not in readme and not (root / "DESIGN.md").exists()
    assert "[metric definitions](#metric-definitions)" in readme and "\n## Metric definitions\n" in readme


# ---- 4. a model option that names no model, a --max-len too small: said before any model loads --------


@pytest.fixture
def no_load(monkeypatch):
    import serving.worker as worker

    def refuse(*_a, **_k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(worker, "load", refuse)
    monkeypatch.setattr(worker, "load_causal_lm", refuse)


@pytest.mark.parametrize(("argv", "needle"), [
    (["bench", "--draft-model", "/no/such/dir"], "--draft-model /no/such/dir: unknown model '/no/such/dir'"),
    (["bench", "--draft-model", "{tmp}"], "--draft-model {tmp}: {tmp} is not a Hugging Face model directory"),
    (["bench", "--target", "/no/such/dir"], "--target /no/such/dir: unknown model"),
    (["bench", "--max-len", "4"], "--max-len 4: prompt code-001 of --workload code is "),
    (["calibrate", "--draft", "/no/such/dir"], "--draft /no/such/dir: unknown model '/no/such/dir'"),
    (["serve", "--draft-model", "/no/such/dir"], "--draft-model /no/such/dir: unknown model '/no/such/dir'"),
])
def test_model_options_and_max_len_are_checked_before_loading(argv, needle, no_load, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    extra = {"bench": ["--limit", "1", "--no-telemetry"], "calibrate": ["--limit", "1"],
             "serve": ["--no-telemetry", "--port", "0"]}[argv[0]]
    assert main([*argv, *extra]) == 2
    err = _err(capsys)
    assert needle.format(tmp=tmp_path) in err and len(err.splitlines()) == 1, err
    if "--max-len" in argv:
        assert "the context window (4 tokens) fits at most 2 prompt tokens" in err


def test_a_prompt_one_past_what_fits_is_told_how_many_fit_not_longer_than_the_window(no_load, tmp_path, capsys):
    """--max-len 33 and a 32-token prompt: bench said the prompt was 'longer than the context window (33
    tokens)', which it is not (the engine keeps a position spare); the error says how many prompt tokens fit,
    and --help what --max-len bounds."""
    from serving.models import load_tokenizer, resolve_model
    from serving.worker import encode_prompt
    from serving.workloads import load_workload

    work = tmp_path / "w.txt"
    work.write_text("Hello world\n")
    (prompt,) = load_workload(str(work))
    n = len(encode_prompt(load_tokenizer(resolve_model(None, "target")), prompt))  # with the chat template
    assert main(["bench", "--workload", str(work), "--max-len", str(n + 1), "--mode", "ar", "--max-new-tokens", "1",
                 "--no-telemetry"]) == 2
    err = _err(capsys)
    assert (f"--max-len {n + 1}: prompt {prompt.id} of --workload {work} is {n} tokens; the context window "
            f"({n + 1} tokens) fits at most {n - 1} prompt tokens") in err, err
    assert "longer than" not in err and len(err.splitlines()) == 1, err
    for command in ("bench", "serve"):
        assert ("a prompt and its answer share --max-len - 1 positions (one is kept spare), so at most --max-len - 2 "
                "prompt tokens fit") in _help(capsys, command)


# ---- 5. serve --no-telemetry: no warning that energy is not measured ----------------------------------


def test_serve_without_telemetry_does_not_warn_of_no_power_meter(monkeypatch, caplog):
    import telemetry.power as power
    from serving.server_setup import ServeOptions, power_source

    def no_meter(*_a, **_k):
        raise power.PowerSourceError("not here")

    monkeypatch.setattr(power, "NvmlPowerSource", no_meter)
    monkeypatch.setattr(power, "RaplPowerSource", no_meter)
    monkeypatch.setattr(power, "_said", set())
    with caplog.at_level("WARNING", logger="telemetry.power"):
        assert power_source(ServeOptions(telemetry=False)).source == "none"
    assert not [r for r in caplog.records if r.name == "telemetry.power"]
    with caplog.at_level("WARNING", logger="telemetry.power"):
        assert power_source(ServeOptions(telemetry=True)).source == "none"
    assert any("energy not measured" in r.getMessage() for r in caplog.records)  # recorded: still said


# ---- 6. report --out that is a file -------------------------------------------------------------------


def test_report_out_that_is_a_file_says_so(runs_store, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["report", "--db", runs_store, "--period", "weekly", "--out", str(afile)]) == 2
    err = _err(capsys)
    assert f"--out {afile} is a file, not a directory" in err and "File exists" not in err
    assert main(["report", "--db", runs_store, "--period", "weekly", "--out", str(afile / "sub")]) == 2
    err = _err(capsys)
    assert f"--out {afile / 'sub'} is not a writable directory: {afile} is a file, not a directory" in err


def test_dashboard_names_a_store_that_is_not_sqlite_once(tmp_path, capsys):
    from app.cli import main

    junk = tmp_path / "junk.db"
    junk.write_text("not a database\n" * 20)
    assert main(["dashboard", "--db", str(junk), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "cannot open the store: --db " in err and "not a SQLite database" in err, err
    assert err.count("junk.db") == 1, err


def test_bench_says_when_a_speedup_rests_on_too_few_requests():
    from app.commands.bench import small_sample_note
    from telemetry.costing import MIN_STABLE_REQUESTS

    def report(n_ar: int, n_spec: int, levels=("1",)) -> dict:
        runs = [{"concurrency": int(level), "mode": mode, "requests": [{}] * n}
                for level in levels for mode, n in (("ar", n_ar), ("spec", n_spec))]
        return {"runs": runs, "speedup_by_concurrency": {level: 1.5 for level in levels}}

    note = small_sample_note(report(2, 2), left_out=26)
    assert note is not None and note.startswith("note: a speedup above rests on 2 requests per mode")
    assert f"under {MIN_STABLE_REQUESTS}" in note
    assert note.endswith("a run without --limit also measures the 26 prompts of the workload it left out")
    # no --limit (or one the workload did not exceed): the bench ran every prompt; running without it adds none
    note = small_sample_note(report(2, 2))
    assert "without --limit" not in note, note
    assert note.endswith("no --limit left a prompt out: a workload of more prompts steadies it"), note
    assert small_sample_note(report(28, 28)) is None
    assert "rests on 19 requests" in small_sample_note(report(28, 19))  # the fewer of the two modes
    assert small_sample_note({"runs": report(2, 2)["runs"], "speedup_by_concurrency": {}}) is None  # nothing compared
    # an interrupted bench's level shows no speedup ('—'): nothing rests on its few requests
    assert small_sample_note({"runs": report(0, 0)["runs"], "speedup_by_concurrency": {"1": None}}) is None
    # a sweep: a level is its own comparison; turns of one level add up (interleaved turns are runs of one row)
    sweep = report(20, 20, levels=("1", "4"))
    assert small_sample_note(sweep) is None
    sweep["runs"].append({"concurrency": 8, "mode": "ar", "requests": [{}]})  # a level with no spec: not compared
    assert small_sample_note(sweep) is None


def test_calibrate_on_another_target_without_a_draft_runs_what_bench_runs(tmp_path, capsys):
    """`calibrate --target OWN` with no --draft judged the bundled draft, which no one named, and failed on its
    hidden size; it judges what bench and serve run on that target (prompt lookup), as their default does."""
    import json

    from app.cli import main
    from tests.test_hf_models import hf_dir

    target = hf_dir(tmp_path / "target")
    assert main(["calibrate", "--target", str(target), "--workload", "code", "--limit", "1", "--max-new-tokens",
                 "6", "--dtype", "float32", "--json", "--no-telemetry"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["drafter"].startswith("ngram")


def test_a_mean_k_is_said_as_a_mean_in_the_verify_warning():
    from telemetry.calibration import StepCounts, calibrate, calibration_warnings

    # 10 drafting steps of K 3 and 4 alike (35 drafted): the mean K 3.5; v = (4.4 / 10) / 20 = 0.022
    cal = calibrate("code", StepCounts(10, 35, 20, 2, 35.0, 50, 1000.0, spec_verify_ms=4.4))
    (v_line,) = [w for w in calibration_warnings(cal, None) if w.startswith("v = ")]
    assert "a verify forward over the mean K + 1 = 4.5 tokens" in v_line


def test_bench_times_a_run_as_the_store_does_without_a_store_too(tmp_path):
    """--no-telemetry: a run's wall time is its first request's start to its last one's end (the store's rule),
    not the turn's own clock, which also counted the time before the first request; and a store that cannot be
    read back leaves the bench's figures, said in a warning."""
    from datetime import UTC, datetime, timedelta

    from app.commands.bench import span_wall, store_figures
    from serving.worker import ModeResult, RequestResult
    from telemetry.records import RequestRecord

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    res = ModeResult("ar", None, "none", wall_s=9.0)
    for start_s, e2e_ms in ((1.0, 500.0), (1.5, 1500.0)):
        rec = RequestRecord(started_at=t0 + timedelta(seconds=start_s), output_tokens=4, e2e_ms=e2e_ms)
        res.results.append(RequestResult(None, [1, 2, 3, 4], "", rec, "length"))
    span_wall(res)
    assert res.wall_s == 2.0 and res.tokens_per_s == 4.0  # 1.0 s -> 3.0 s, 8 tokens
    empty = ModeResult("ar", None, "none", wall_s=0.25)
    span_wall(empty)
    assert empty.wall_s == 0.25  # no request ended: its own clock stays

    report = {"invocation_id": "ab" * 16, "speedup": 1.5, "speedup_by_concurrency": {"1": 1.5},
              "runs": [{"mode": "ar", "run_ids": [1], "tokens_per_s": 4.0, "wall_s": 2.0}]}
    warning = store_figures(report, f"sqlite:///{tmp_path / 'gone.db'}")
    assert warning.startswith("warning: could not read invocation abababab back from the store"), warning
    assert report["speedup"] == 1.5 and report["runs"][0]["tokens_per_s"] == 4.0
    assert store_figures({"invocation_id": None, "runs": []}, None) is None  # --no-telemetry: nothing to read
