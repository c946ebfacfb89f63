"""`specfinops export`'s run and sampling selection: --workload, --target, --node, --mode, --run-kind, and
--temperature, --top-p, --top-k, --max-new-tokens. Requests, steps and tokens are selected by each request's
own sampling where it recorded one (a server's requests each choose theirs), else by its run's: the values the
requests CSV shows. Power samples and cost rows are per run and read the run's values."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest

from app.cli import main
from telemetry.export import ExportWindow, export_rows
from telemetry.recorder import Recorder
from telemetry.records import PowerReading, RequestRecord, RunInfo, StepRow, TokenRow
from telemetry.store import open_store

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _sample(t: datetime, power_w: float) -> PowerReading:
    return PowerReading(t=t, device_index=0, power_w=power_w, energy_mj=None, utilization_pct=None, source="estimate")


def _run(mode: str, **kw) -> RunInfo:
    base = dict(mode=mode, node_id="node-a", hostname="h", device="cpu", backend="torch", dtype="bfloat16",
                target="smol", drafter="draft" if mode == "spec" else None,
                k_policy="auto" if mode == "spec" else "none", temperature=0.0, workload="code",
                power_source="estimate", software_version="test", top_p=1.0, top_k=0, max_new_tokens=128)
    return RunInfo(**(base | kw))


def _request(ext: str, i: int, **sampling) -> RequestRecord:
    return RequestRecord(
        started_at=T0 + timedelta(seconds=i), domain="code", external_id=ext, prompt_tokens=5, output_tokens=2,
        ttft_ms=10.0, e2e_ms=30.0, **sampling,
        steps=[StepRow(step_index=0, k=2, accepted=1, num_emitted=2, draft_ms=1.0, verify_ms=9.0, t_offset_ms=30.0)],
        tokens=[TokenRow(position=0, emit_offset_ms=10.0, step_index=-1, source="ar"),
                TokenRow(position=1, emit_offset_ms=30.0, step_index=0, source="accepted")])


@pytest.fixture
def store(db_url):
    """Three runs: a greedy spec bench (cap 128), a sampled AR bench on another node and workload (0.8, top_p
    0.9, top_k 40, cap 64), and a server's run (no sampling of its own) whose requests chose theirs: one greedy
    (which recorded top_k 50: off at temperature 0), one like the sampled bench."""
    engine = open_store(db_url)
    with Recorder(engine, flush_interval_s=0.02) as rec:
        greedy = rec.start_run(_run("spec", invocation_id="inv-1"))
        rec.record_request(greedy, _request("g1", 0))
        rec.record_request(greedy, _request("g2", 1))
        rec.record_power(greedy, [_sample(T0, 100.0)])
        sampled = rec.start_run(_run("ar", invocation_id="inv-1", node_id="node-b", workload="chat", temperature=0.8, top_p=0.9, top_k=40,
                                     max_new_tokens=64))
        rec.record_request(sampled, _request("s1", 2))
        rec.record_power(sampled, [_sample(T0, 90.0),
                                   _sample(T0 + timedelta(seconds=1), 91.0)])
        served = rec.start_run(_run("spec", kind="serve", workload="serve", temperature=None, top_p=None, top_k=None,
                                    max_new_tokens=None))
        rec.record_request(served, _request("req-greedy", 3, temperature=0.0, top_p=1.0, top_k=50, max_new_tokens=128))
        rec.record_request(served, _request("req-sampled", 4, temperature=0.8, top_p=0.9, top_k=40, max_new_tokens=64))
        for run_id in (greedy, sampled, served):
            rec.end_run(run_id)
    yield engine, {"greedy": greedy, "sampled": sampled, "served": served}
    engine.dispose()


def _column(engine, what: str, window: ExportWindow, name: str) -> list:
    header, rows = export_rows(engine, what, window)
    i = header.index(name)
    return sorted(row[i] for row in rows)


def _request_ids(engine, window: ExportWindow) -> list[str]:
    return _column(engine, "requests", window, "external_id")


def test_sampling_selects_requests_by_their_own_values_else_their_runs(store):
    engine, _ = store
    assert _request_ids(engine, ExportWindow(temperature=0)) == ["g1", "g2", "req-greedy"]
    assert _request_ids(engine, ExportWindow(temperature=0.8)) == ["req-sampled", "s1"]
    assert _request_ids(engine, ExportWindow(top_k=40)) == ["req-sampled", "s1"]
    # greedy counts as top_k 0 and top_p 1 whatever it recorded (req-greedy recorded top_k 50)
    assert _request_ids(engine, ExportWindow(top_k=0)) == ["g1", "g2", "req-greedy"]
    assert _request_ids(engine, ExportWindow(top_k=50)) == []
    assert _request_ids(engine, ExportWindow(top_p=1.0)) == ["g1", "g2", "req-greedy"]
    assert _request_ids(engine, ExportWindow(top_p=0.9, temperature=0.8)) == ["req-sampled", "s1"]
    assert _request_ids(engine, ExportWindow(max_new_tokens=64)) == ["req-sampled", "s1"]
    assert _request_ids(engine, ExportWindow(max_new_tokens=32)) == []


def test_run_selectors_and_sampling_reach_steps_and_tokens(store):
    engine, ids = store
    assert _request_ids(engine, ExportWindow(mode="ar")) == ["s1"]
    assert _request_ids(engine, ExportWindow(node_id="node-b")) == ["s1"]
    assert _request_ids(engine, ExportWindow(workload="code", mode="spec")) == ["g1", "g2"]
    assert _request_ids(engine, ExportWindow(kind="serve", temperature=0.8)) == ["req-sampled"]
    assert _request_ids(engine, ExportWindow(target="other")) == []
    # one step and two token events per request
    assert _column(engine, "steps", ExportWindow(temperature=0.8), "run_id") == sorted([ids["sampled"], ids["served"]])
    assert _column(engine, "tokens", ExportWindow(kind="serve", max_new_tokens=128), "run_id") == [ids["served"]] * 2
    assert _column(engine, "tokens", ExportWindow(mode="spec", top_k=0), "run_id") == sorted(
        [ids["greedy"]] * 4 + [ids["served"]] * 2)


def test_power_and_cost_read_the_runs_values(store):
    engine, ids = store
    assert _column(engine, "power", ExportWindow(mode="ar"), "run_id") == [ids["sampled"]] * 2
    assert _column(engine, "power", ExportWindow(temperature=0), "run_id") == [ids["greedy"]]
    # a server's run records no sampling of its own: it matches no value, though its requests do
    assert _column(engine, "power", ExportWindow(kind="serve", temperature=0.8), "run_id") == []
    assert _column(engine, "cost", ExportWindow(top_k=40), "run_id") == [ids["sampled"]]
    assert _column(engine, "cost", ExportWindow(workload="code", node_id="node-a"), "run_id") == [ids["greedy"]]
    assert _column(engine, "cost", ExportWindow(), "run_id") == sorted(ids.values())


def test_a_bad_selector_is_refused_by_name():
    with pytest.raises(ValueError, match="mode"):
        ExportWindow(mode="fast")
    with pytest.raises(ValueError, match="top_p"):
        ExportWindow(top_p=1.5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ExportWindow(max_new_tokens=0)


def test_the_cli_selects_and_says_when_nothing_matches(store, db_url, capsys):
    engine, _ = store
    assert main(["export", "--db", db_url, "--what", "requests", "--temperature", "0.8", "--run-kind", "serve",
                 "--out", "-"]) == 0
    out, err = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["external_id"], r["temperature"], r["top_k"]) for r in rows] == [("req-sampled", "0.8", "40")]
    assert "no requests rows" not in err

    # runs selected, none of their rows in the window: the header alone, and a note
    assert main(["export", "--db", db_url, "--what", "steps", "--run-kind", "serve", "--since", "2099-01-01",
                 "--out", "-"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().startswith("step_id") and len(out.strip().splitlines()) == 1
    assert "no steps rows: none in the time window (at or after 2099-01-01 00:00:00 UTC); the selection's " \
           "requests with steps started from" in err, err
    # a selector no run in the store matches: refused as `cost` refuses it, nothing written
    assert main(["export", "--db", db_url, "--what", "steps", "--workload", "nothing-here", "--out", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no runs with workload 'nothing-here'" in err

    for argv, named in ((["--top-k", "-1"], "--top-k"), (["--top-p", "0"], "--top-p"),
                        (["--temperature", "hot"], "--temperature"), (["--max-new-tokens", "0"], "--max-new-tokens")):
        assert main(["export", "--db", db_url, "--what", "requests", "--out", "-", *argv]) == 2
        _, err = capsys.readouterr()
        assert named in err and "Traceback" not in err


def test_a_sampling_value_nothing_in_the_store_has_is_refused_as_cost_refuses_it(store, db_url, capsys):
    """`export --what steps --temperature 0.5` on a store sampled at 0 and 0.8 only exited 0 with a header-only
    file where `cost --temperature 0.5` fails naming the temperatures in the store: it fails alike, nothing
    written; a value only a server's request has (top_k 40 there, the run none) still selects its rows."""
    for argv, said in ((["--temperature", "0.5"], "no runs or requests with temperature 0.5 (temperatures in the "
                                                  "store: 0, 0.8"),
                       (["--top-k", "41"], "no runs or requests with top_k 41 (top_k values in the store: 0, 40"),
                       (["--top-p", "0.5"], "no runs or requests with top_p 0.5 (top_p values in the store: 0.9, 1"),
                       (["--max-new-tokens", "7"], "no runs or requests with max_new_tokens 7 "
                                                   "(max_new_tokens values in the store: 64, 128")):
        for what in ("steps", "power"):
            assert main(["export", "--db", db_url, "--what", what, "--out", "-", *argv]) == 2, argv
            out, err = capsys.readouterr()
            assert out == "" and said in err and "Traceback" not in err, err
    # top_k 50 was recorded by a greedy request only: at temperature 0 it counts as 0, so nothing has it
    assert main(["export", "--db", db_url, "--what", "requests", "--top-k", "50", "--out", "-"]) == 2
    assert "no runs or requests with top_k 50" in capsys.readouterr().err
    # each value is in the store, not together: the header and the note, as before
    assert main(["export", "--db", db_url, "--what", "requests", "--temperature", "0", "--top-k", "40",
                 "--out", "-"]) == 0
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 1 and "no requests rows match the selection" in err, err
    assert main(["export", "--db", db_url, "--what", "requests", "--temperature", "0.8", "--run-kind", "serve",
                 "--out", "-"]) == 0
    capsys.readouterr()


def test_a_sampling_value_on_a_store_without_runs_says_the_store_has_none(db_url, capsys):
    open_store(db_url).dispose()
    assert main(["export", "--db", db_url, "--what", "steps", "--temperature", "0.8", "--out", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "the store has no runs" in err, err


@pytest.mark.parametrize("extra", [["--workload", "code"], ["--mode", "spec"], ["--run-kind", "serve"],
                                   ["--temperature", "0.8"], ["--top-p", "0.9"], ["--max-new-tokens", "5"]])
def test_on_an_empty_store_a_sampling_selector_fails_as_a_run_selector_does(empty_store, tmp_path, extra, capsys):
    """docs/export.md: on a store with no runs a sampling selector fails as the run selectors do (exit 2, the
    store has no runs, nothing written); only an export with no selector (or a time window alone) writes the
    header and exits 0."""
    out = tmp_path / "e.csv"
    assert main(["export", "--db", empty_store, "--what", "requests", "--out", str(out), *extra]) == 2
    assert "the store has no runs" in capsys.readouterr().err and not out.exists()
    assert main(["export", "--db", empty_store, "--what", "requests", "--out", str(out),
                 "--since", "2026-01-01"]) == 0
    assert len(out.read_text().splitlines()) == 1 and "the store has no runs" in capsys.readouterr().err


def test_requests_and_cost_rows_name_the_invocation_that_recorded_them(store):
    """The bench or load test behind each row (runs.invocation_id, 0011): empty for a server's run."""
    engine, ids = store
    header, rows = export_rows(engine, "requests", ExportWindow())
    col = {row[header.index("external_id")]: row[header.index("invocation_id")] for row in rows}
    assert col == {"g1": "inv-1", "g2": "inv-1", "s1": "inv-1", "req-greedy": None, "req-sampled": None}
    header, rows = export_rows(engine, "cost", ExportWindow())
    col = {row[header.index("run_id")]: row[header.index("invocation_id")] for row in rows}
    assert col == {ids["greedy"]: "inv-1", ids["sampled"]: "inv-1", ids["served"]: None}
