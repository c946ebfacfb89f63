"""Ctrl-C / SIGTERM in the middle of `specfinops bench` (and `loadtest`): the table and --json of what ran,
marked interrupted, agree with what the store holds (completed runs, the stopped one 'cancelled', no sweep);
the exit status stays 130. A real signal each time: to a bench in a subprocess, or to this process, whose
SIGINT handler the command installs. Tiny random models; the signal goes once a chosen request is recorded."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

import serving.worker as worker
from app.cli import main
from tests.test_bench_loadtest_edges import KERNEL_SWITCHES, _tiny_bench, tiny_target
from tests.test_loadtest_stub import stub_factory  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_kernel_races(monkeypatch):
    """Tiny models need no CPU kernel measurement."""
    for name in KERNEL_SWITCHES:
        monkeypatch.setenv(name, "off")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("interrupt"))


def _store(db_url: str) -> tuple[list[tuple], dict[int, dict[str, int]], int]:
    """(runs as (id, mode, status, concurrency), {run id: {request status: count}}, sweeps recorded)."""
    with create_engine(db_url).connect() as c:
        runs = [tuple(r) for r in c.execute(text("select id, mode, status, concurrency from runs order by id"))]
        counts: dict[int, dict[str, int]] = {}
        for run_id, status, n in c.execute(text("select run_id, status, count(*) from requests "
                                                "group by run_id, status")):
            counts.setdefault(run_id, {})[status] = n
        sweeps = c.execute(text("select count(*) from sweeps")).scalar_one()
    return runs, counts, sweeps


def _rows_match_the_store(doc: dict, counts: dict[int, dict[str, int]]) -> None:
    """Each row of the report counts exactly the requests its runs hold finished ('ok') in the store."""
    for run in doc["runs"]:
        stored = sum(counts.get(rid, {}).get("ok", 0) for rid in run["run_ids"])
        assert len(run["requests"]) == stored, (run["mode"], run["concurrency"], run["run_ids"], counts)


# ------------------------------------------------------------------ a real signal to a bench in a subprocess

# The child: `specfinops bench` whose third turn (ar on prompts 2-3) waits after its first request is recorded,
# having touched MARKER, until the parent's signal stops it; without the signal it goes on and finishes.
CHILD = """
import sys, time
from pathlib import Path

import serving.worker as worker
from app.cli import main

marker, argv = Path(sys.argv[1]), sys.argv[2:]
real_run, calls = worker.ModeRunner.run, []


def run(self, prompts, encoded, params, *, on_request=None, **kw):
    calls.append(self.mode)
    if len(calls) == 3:
        recorded = on_request

        def on_request(res):
            recorded(res)
            marker.write_text("recorded")
            for _ in range(600):  # the signal lands here
                time.sleep(0.1)

    return real_run(self, prompts, encoded, params, on_request=on_request, **kw)


worker.ModeRunner.run = run
sys.exit(main(argv))
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_bench_prints_and_writes_what_ran_and_the_store_agrees(signum, target, tmp_path):
    script, marker, out_json = tmp_path / "child.py", tmp_path / "recorded", tmp_path / "out.json"
    script.write_text(CHILD)
    db = f"sqlite:///{tmp_path / 's.db'}"
    argv = _tiny_bench(target, "--mode", "both", "--interleave", "2", "--limit", "4", "--max-new-tokens", "4",
                       "--db", db, "--json", str(out_json))
    env = {**os.environ, "PYTHONPATH": str(ROOT), **{k: "off" for k in KERNEL_SWITCHES}}
    child = subprocess.Popen([sys.executable, str(script), str(marker), *argv], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180  # the child's imports and model load; not measured
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), child.communicate(timeout=60)
        child.send_signal(signum)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, err
    assert err.strip().endswith("interrupted"), err
    # the table of what ran: turns ar 0-1, spec 0-1 completed, ar 2-3 stopped after prompt 2
    assert "interrupted (Ctrl-C or SIGTERM): 5 of 8 requests done; partial results" in out, out
    assert "ar c=1 was interrupted (Ctrl-C or SIGTERM): its row counts the 3 request(s) finished" in out, out
    assert "speedup spec vs AR at concurrency 1: — (interrupted" in out, out
    runs, counts, sweeps = _store(db)
    assert [(mode, status) for _, mode, status, _ in runs] == [("ar", "completed"), ("spec", "completed"),
                                                                ("ar", "cancelled")]
    cancelled = runs[2][0]
    assert f"in the store: run {cancelled} ended 'cancelled'" in out, out
    assert counts[cancelled] == {"ok": 1}  # prompt 3 never started: nothing in flight
    doc = json.loads(out_json.read_text())
    assert doc["interrupted"] is True and (doc["requests_done"], doc["requests_planned"]) == (5, 8)
    assert doc["cancelled_run_ids"] == [cancelled] and doc["speedup"] is None
    ar, spec = doc["runs"]
    assert (ar["mode"], ar["interrupted"], ar["run_ids"]) == ("ar", True, [runs[0][0], cancelled])
    assert (spec["mode"], spec["interrupted"], spec["run_ids"]) == ("spec", False, [runs[1][0]])
    assert [r["id"] for r in ar["requests"]] == [r["id"] for r in spec["requests"]] + [ar["requests"][2]["id"]]
    _rows_match_the_store(doc, counts)
    assert sweeps == 0
    # greedy: the identical rate is over the prompts both modes finished (0 and 1), as an uncut level's
    assert spec["token_identical_rate"] is not None


# ------------------------------------------------------------------ SIGINT to this process, inside a sweep


def _sigint_in_turn(monkeypatch, turn: int, after_requests: int) -> None:
    """SIGINT to this process once the `turn`-th ModeRunner.run has recorded `after_requests` requests."""
    real_run, calls = worker.ModeRunner.run, []

    def run(self, prompts, encoded, params, *, on_request=None, **kw):
        calls.append(self.mode)
        if len(calls) == turn:
            recorded, seen = on_request, []

            def on_request(res):
                recorded(res)
                seen.append(res)
                if len(seen) == after_requests:
                    os.kill(os.getpid(), signal.SIGINT)

        return real_run(self, prompts, encoded, params, on_request=on_request, **kw)

    monkeypatch.setattr(worker.ModeRunner, "run", run)


def test_ctrl_c_in_a_sweeps_last_level_records_no_sweep_and_the_json_on_stdout_says_interrupted(
        target, tmp_path, monkeypatch, capsys):
    """--concurrency 1,2 --mode both: ar c=1, spec c=1, ar c=2, then Ctrl-C in spec c=2 after one request. The
    levels' rows are printed (on stderr: `--json -`), level 1's speedup stands, level 2 has none; no sweep."""
    _sigint_in_turn(monkeypatch, turn=4, after_requests=1)
    db = f"sqlite:///{tmp_path / 's.db'}"
    rc = main(_tiny_bench(target, "--mode", "both", "--concurrency", "1,2", "--limit", "3", "--interleave", "0",
                          "--max-new-tokens", "6", "--db", db, "--json", "-"))
    out = capsys.readouterr()
    assert rc == 130, out.err
    doc = json.loads(out.out)  # stdout holds the JSON alone
    assert doc["interrupted"] is True and doc["requests_planned"] == 12
    assert [(r["mode"], r["concurrency"], r["interrupted"]) for r in doc["runs"]] == [
        ("ar", 1, False), ("spec", 1, False), ("ar", 2, False), ("spec", 2, True)]
    assert doc["requests_done"] == 9 + len(doc["runs"][3]["requests"]) and doc["runs"][3]["requests"]
    assert doc["speedup_by_concurrency"]["1"] is not None and doc["speedup_by_concurrency"]["2"] is None
    assert doc["speedup"] == doc["speedup_by_concurrency"]["1"]
    assert doc["sweep_id"] is None and "crossover_concurrency" not in doc
    runs, counts, sweeps = _store(db)
    assert [status for _, _, status, _ in runs] == ["completed"] * 3 + ["cancelled"] and sweeps == 0
    assert doc["cancelled_run_ids"] == [runs[3][0]]
    _rows_match_the_store(doc, counts)
    assert f"interrupted (Ctrl-C or SIGTERM): {doc['requests_done']} of 12 requests done" in out.err, out.err
    assert "spec c=2 was interrupted" in out.err and "no sweep recorded" in out.err, out.err
    assert f"speedup spec vs AR at concurrency 1: {doc['speedup']:.2f}x\n" in out.err, out.err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_an_uninterrupted_bench_reports_no_interruption(target, tmp_path, capsys):
    out_json = tmp_path / "b.json"
    rc = main(_tiny_bench(target, "--mode", "ar", "--limit", "2", "--max-new-tokens", "3", "--no-telemetry",
                          "--json", str(out_json)))
    out = capsys.readouterr().out
    assert rc == 0 and "interrupted" not in out, out
    doc = json.loads(out_json.read_text())
    assert "interrupted" not in doc and all("interrupted" not in r for r in doc["runs"])



def _after_the_ar_warm_up(monkeypatch, then) -> None:
    """`then()` once the AR warm-up has run, in place of the spec one."""
    real_warm_up = worker.warm_up

    def warm_up(loaded, mode, *a, **kw):
        if mode == "spec":
            return then()
        return real_warm_up(loaded, mode, *a, **kw)

    monkeypatch.setattr(worker, "warm_up", warm_up)


def test_a_bench_stopped_in_its_warm_up_leaves_no_store_behind(target, tmp_path, monkeypatch, capsys):
    """SIGINT in the warm-up, before any run was recorded: the store file (and the folder) bench made for --db are
    removed again, as where it is stopped while the models load; they stayed, empty."""
    _after_the_ar_warm_up(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGINT))
    db = tmp_path / "new" / "s.db"
    rc = main(_tiny_bench(target, "--mode", "both", "--limit", "2", "--max-new-tokens", "3", "--db",
                          f"sqlite:///{db}"))
    out = capsys.readouterr()
    assert rc == 130 and out.err.strip().endswith("interrupted"), out.err
    assert "stopped before its first run: nothing recorded in the store" in out.out, out.out
    assert not (tmp_path / "new").exists(), list((tmp_path / "new").iterdir())


def test_a_bench_whose_database_refuses_its_first_run_leaves_no_store_behind(target, tmp_path, monkeypatch,
                                                                               capsys):
    """The database raises as the first run is inserted (a trigger: as a database that fails does): one line of
    error, and the store bench made, with nothing recorded in it, removed."""
    db = tmp_path / "s.db"

    def refuse_runs():
        with create_engine(f"sqlite:///{db}").begin() as c:
            c.execute(text("create trigger refuse before insert on runs "
                           "begin select raise(abort, 'the database refused the run'); end"))

    _after_the_ar_warm_up(monkeypatch, refuse_runs)
    rc = main(_tiny_bench(target, "--mode", "both", "--limit", "2", "--max-new-tokens", "3", "--db",
                          f"sqlite:///{db}"))
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    # the bar (leave=False) cleared: the cursor back at the line's start (\r), the error written from there
    said = err.split("\n")[-2].split("\r")[-1]
    assert said == "specfinops bench: error: cannot use the database: the database refused the run", err
    assert not any(tmp_path.glob("s.db*"))


# ------------------------------------------------------------------ loadtest: the same first line


def test_an_interrupted_loadtest_says_how_many_level_runs_it_did(stub_factory, tmp_path, capsys, monkeypatch):  # noqa: F811
    import serving.loadtest as lt

    stub = stub_factory(chunks=2, chunk_s=0.02)
    real_run_level, levels = lt.run_level, []

    async def run_level(client, model, prompts, spec, level, mode, **kwargs):
        levels.append(level)
        task = asyncio.ensure_future(real_run_level(client, model, prompts, spec, level, mode, **kwargs))
        if len(levels) == 2:  # the second level's requests under way: Ctrl-C
            sent = stub.num_chat
            while stub.num_chat < sent + 2:
                await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)
        return await task

    monkeypatch.setattr(lt, "run_level", run_level)
    rc = main(["loadtest", "--url", stub.url, "--concurrency", "1,2,4", "--duration", "1", "--mode", "spec",
               "--max-tokens", "8", "--workload", "code", "--no-telemetry", "--json", "-"])
    out = capsys.readouterr()
    assert rc == 130, out.err
    assert json.loads(out.out)["interrupted"] is True
    assert "interrupted (Ctrl-C or SIGTERM): 1 of 3 level runs done; partial results" in out.err, out.err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_bench_stopped_before_its_first_run_says_nothing_was_recorded(capsys):
    """Stopped while the models loaded: the table said "in the store: the runs above 'completed'" and named an
    invocation whose `specfinops cost --invocation` then found nothing."""
    from app.commands.bench import print_table

    report = {"interrupted": True, "requests_done": 0, "requests_planned": 16, "runs": [],
              "speedup_by_concurrency": {}, "cancelled_run_ids": [], "invocation_id": "01ebb302" + "0" * 24}
    print_table(report, recorded=True)
    out = capsys.readouterr().out
    assert "stopped before its first run: nothing recorded in the store" in out
    assert "in the store:" not in out and "--invocation" not in out, out
