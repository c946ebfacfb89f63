"""Ctrl-C / SIGTERM in the middle of `specfinops bench --backend vllm`: the (mode, level) runs that completed are
in the table and the --json, marked interrupted; the stopped run (vLLM gives its result only at its end) is named
in the notes and ends 'cancelled' in the store with the requests it finished until then; a level that ran in one
mode only has no speedup; the engine, the recorder and the power meter are closed; exit status 130. The fake vLLM
(tests/fake_vllm.py) runs the engines; the interrupt is raised from a chosen engine step."""

from __future__ import annotations

import json
import re
import signal
import sys

import pytest
from sqlalchemy import create_engine, text

import serving.vllm_backend as vb
import telemetry.recorder
from app.cli import main
from tests import fake_vllm
from tests.fake_vllm import FakeNvml


class CountingNvml(FakeNvml):
    """FakeNvml that counts nvmlShutdown (the power source's close)."""

    def __init__(self) -> None:
        super().__init__()
        self.shutdowns = 0

    def nvmlShutdown(self):  # noqa: N802 - pynvml's name
        self.shutdowns += 1


@pytest.fixture
def nvml(monkeypatch):
    fake_vllm.install(monkeypatch)
    meter = CountingNvml()
    monkeypatch.setitem(sys.modules, "pynvml", meter)
    return meter


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "target"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def recorders_closed(monkeypatch):
    """How many times a Recorder was closed."""
    closed = []
    real_close = telemetry.recorder.Recorder.close

    def close(self):
        closed.append(self)
        return real_close(self)

    monkeypatch.setattr(telemetry.recorder.Recorder, "close", close)
    return closed


def stop_run(monkeypatch, nth: int, after_finished: int) -> list[tuple[str, int]]:
    """Make the `nth` call of run_prompts (1-based) raise KeyboardInterrupt from the engine step that follows
    its `after_finished`-th finished request, as Ctrl-C would; the calls before run untouched. Returns the
    (mode, concurrency) of every call."""
    real, calls = vb.run_prompts, []

    def run_prompts(engine, prompts, encoded, params, **kw):
        calls.append((engine.mode, kw["concurrency"]))
        if len(calls) == nth:
            core = engine.llm.llm_engine
            real_step, finished = core.step, [0]

            def step():
                if finished[0] >= after_finished:
                    raise KeyboardInterrupt
                outs = real_step()
                finished[0] += sum(o.finished for o in outs)
                return outs

            core.step = step  # this engine's only: it is closed after the interrupt
        return real(engine, prompts, encoded, params, **kw)

    monkeypatch.setattr(vb, "run_prompts", run_prompts)
    return calls


def _store(url: str) -> tuple[list[tuple], dict[int, dict[str, int]]]:
    """(runs as (id, mode, concurrency, status), {run id: {request status: count}})."""
    engine = create_engine(url)
    with engine.connect() as c:
        runs = [tuple(r) for r in c.execute(text("select id, mode, concurrency, status from runs order by id"))]
        counts: dict[int, dict[str, int]] = {}
        for run_id, status, n in c.execute(text("select run_id, status, count(*) from requests "
                                                "group by run_id, status")):
            counts.setdefault(run_id, {})[status] = n
    engine.dispose()
    return runs, counts


BENCH = ["bench", "--backend", "vllm", "--mode", "both", "--workload", "code", "--limit", "3", "--k", "3",
         "--max-new-tokens", "8", "--power", "nvml", "--concurrency", "1,2"]


def test_a_run_stopped_mid_way_leaves_the_completed_runs_in_the_table_and_json_and_itself_cancelled(
        monkeypatch, tmp_path, capsys, nvml, target, recorders_closed):
    # runs in order: ar c=1, ar c=2, spec c=1, spec c=2; the last stopped once 2 of its 3 requests finished
    calls = stop_run(monkeypatch, nth=4, after_finished=2)
    url, out = f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "bench.json"
    rc = main([*BENCH, "--target", str(target), "--db", url, "--json", str(out)])
    printed = capsys.readouterr()
    assert rc == 130, printed.err
    assert calls == [("ar", 1), ("ar", 2), ("spec", 1), ("spec", 2)]

    runs, counts = _store(url)
    assert [(m, n, s) for _, m, n, s in runs] == [("ar", 1, "completed"), ("ar", 2, "completed"),
                                                  ("spec", 1, "completed"), ("spec", 2, "cancelled")]
    ids = [i for i, *_ in runs]
    # the stopped run holds the 2 requests it finished and the one in flight, recorded 'cancelled'
    assert counts == {ids[0]: {"ok": 3}, ids[1]: {"ok": 3}, ids[2]: {"ok": 3},
                      ids[3]: {"ok": 2, "cancelled": 1}}

    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True
    assert (doc["requests_done"], doc["requests_planned"]) == (9, 12)
    assert doc["cancelled_run_ids"] == [ids[3]]
    assert doc["stopped_run"] == {"mode": "spec", "concurrency": 2, "run_id": ids[3], "requests_done": 2}
    assert [(r["mode"], r["concurrency"], r["run_ids"], r["interrupted"], len(r["requests"]))
            for r in doc["runs"]] == [("ar", 1, [ids[0]], False, 3), ("ar", 2, [ids[1]], False, 3),
                                      ("spec", 1, [ids[2]], False, 3)]
    assert all(r["backend"] == "vllm" for r in doc["runs"])
    assert doc["speedup_by_concurrency"]["2"] is None
    assert doc["speedup_by_concurrency"]["1"] == pytest.approx(doc["speedup"]) and doc["speedup"] > 0
    assert doc["invocation_id"]

    table = printed.out
    assert table.splitlines()[0] == "interrupted (Ctrl-C or SIGTERM): 9 of 12 requests done; partial results"
    lines = table.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1  # under the header's rule
    end = next(i for i, line in enumerate(lines) if line.startswith("speedup"))
    rows = [line.split() for line in lines[first:end]]
    assert [(r[0], r[3]) for r in rows] == [("ar", "1"), ("ar", "2"), ("spec", "1")]
    assert re.search(r"speedup spec vs AR at concurrency 1: \d+\.\d\dx", table), table
    assert "speedup spec vs AR at concurrency 2: — (interrupted: only ar completed this level)" in table
    assert "spec c=2 was interrupted (Ctrl-C or SIGTERM): not in the table" in table
    assert (f"in the store: run {ids[3]} (spec c=2) ended 'cancelled', with the 2 request(s) it finished until "
            "then and those in flight (recorded 'cancelled'); the runs above 'completed'") in table
    assert "interrupted" in printed.err  # app.cli's last word, as on the torch path

    # the engines (the stopped one too), the recorder and the power meter are closed
    assert len(fake_vllm.LLM.instances) == 2
    assert all(llm.llm_engine.engine_core.shut_down for llm in fake_vllm.LLM.instances)
    assert len(recorders_closed) == 1 and nvml.shutdowns >= 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_stop_between_runs_cancels_nothing_and_json_to_stdout_keeps_the_table_on_stderr(
        monkeypatch, tmp_path, capsys, nvml, target, recorders_closed):
    # Ctrl-C while the spec engine warms up: the AR runs completed, no run was stopped
    real_warm_up, warmed = vb.warm_up, []

    def warm_up(engine, encoded):
        warmed.append(engine.mode)
        if engine.mode == "spec":
            raise KeyboardInterrupt
        return real_warm_up(engine, encoded)

    monkeypatch.setattr(vb, "warm_up", warm_up)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    rc = main([*BENCH, "--target", str(target), "--db", url, "--json", "-"])
    printed = capsys.readouterr()
    assert rc == 130, printed.err
    assert warmed == ["ar", "spec"]

    runs, counts = _store(url)
    assert [(m, n, s) for _, m, n, s in runs] == [("ar", 1, "completed"), ("ar", 2, "completed")]
    assert all(c == {"ok": 3} for c in counts.values()) and len(counts) == 2

    doc = json.loads(printed.out)  # the JSON alone on stdout
    assert doc["interrupted"] is True and doc["cancelled_run_ids"] == [] and doc["stopped_run"] is None
    assert (doc["requests_done"], doc["requests_planned"]) == (6, 12)
    assert [(r["mode"], r["concurrency"]) for r in doc["runs"]] == [("ar", 1), ("ar", 2)]
    assert doc["speedup_by_concurrency"] == {"1": None, "2": None} and doc["speedup"] is None

    table = printed.err
    assert "interrupted (Ctrl-C or SIGTERM): 6 of 12 requests done; partial results" in table
    for level in (1, 2):
        assert f"speedup spec vs AR at concurrency {level}: — (interrupted: only ar completed this level)" in table
    assert "stopped between runs (Ctrl-C or SIGTERM): the table holds the runs that completed" in table
    assert "in the store: the runs above 'completed'" in table
    assert all(llm.llm_engine.engine_core.shut_down for llm in fake_vllm.LLM.instances)
    assert len(recorders_closed) == 1 and nvml.shutdowns >= 1


def test_without_telemetry_the_stopped_run_is_named_and_nothing_is_said_of_a_store(
        monkeypatch, tmp_path, capsys, nvml, target):
    # --mode spec, stopped in its first run before any request finished: an empty table, 0 of 6 done
    stop_run(monkeypatch, nth=1, after_finished=0)
    out = tmp_path / "bench.json"
    at = BENCH.index("--power")  # no meter where nothing is recorded: --power beside --no-telemetry is refused
    no_power = BENCH[:at] + BENCH[at + 2:]
    rc = main([*no_power[:4], "spec", *no_power[5:], "--target", str(target), "--no-telemetry", "--json", str(out)])
    printed = capsys.readouterr()
    assert rc == 130, printed.err
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True and doc["runs"] == [] and doc["cancelled_run_ids"] == []
    assert doc["stopped_run"] == {"mode": "spec", "concurrency": 1, "run_id": None, "requests_done": 0}
    assert (doc["requests_done"], doc["requests_planned"]) == (0, 6)
    assert doc["speedup_by_concurrency"] == {}
    assert "spec c=1 was interrupted (Ctrl-C or SIGTERM): not in the table" in printed.out
    assert "in the store" not in printed.out and "speedup" not in printed.out
    assert all(llm.llm_engine.engine_core.shut_down for llm in fake_vllm.LLM.instances)


def test_run_bench_raises_bench_interrupted_with_the_completed_runs(monkeypatch, nvml, tmp_path):
    stop_run(monkeypatch, nth=2, after_finished=2)  # ar c=2: prompts 0 and 1 finish together, 2 in flight
    config = vb.VllmConfig(target="fake", method="ngram", num_speculative_tokens=3)
    from serving.sampling import SamplingParams
    from serving.workloads import load_workload

    prompts = load_workload("code", limit=3)
    with pytest.raises(vb.BenchInterrupted) as caught:
        vb.run_bench(config, prompts, SamplingParams(max_new_tokens=8), ["ar"], [1, 2], workload="code",
                     node_id="n", power="nvml", db_url=f"sqlite:///{tmp_path / 's.db'}")
    exc = caught.value
    assert isinstance(exc, KeyboardInterrupt)
    assert [(level, res.mode, len(res.results)) for level, res in exc.results] == [(1, "ar", 3)]
    assert exc.stopped is not None and (exc.stopped.mode, exc.stopped.concurrency) == ("ar", 2)
    assert exc.stopped.requests_done == 2 and exc.cancelled_run_ids == [exc.stopped.run_id]
    assert exc.view.spec.k == "3" and exc.view.target_dir == "fake"
    runs, counts = _store(f"sqlite:///{tmp_path / 's.db'}")
    assert [s for *_, s in runs] == ["completed", "cancelled"]
    assert counts[exc.stopped.run_id] == {"ok": 2, "cancelled": 1}
