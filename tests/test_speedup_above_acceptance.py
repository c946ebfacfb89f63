"""A speedup above the spec runs' mean acceptance length cannot be (a speculative step emits that many tokens for
at least one target forward): the AR timing was inflated, and every surface that shows the speedup or the money
resting on it says so, with both figures, beside them (never instead of them).

An audit on a loaded machine: bench printed `speedup spec vs AR at concurrency 1: 4.09x` beside a mean acceptance
length of 1.82, then the report "Projected annual savings $7,697,924" and `project` "annual savings:
$4,071,017,280", none with a word of warning; only `calibrate` applied the rule."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest
from synthetic import BASE_TIME

from app.cli import main
from telemetry import report_writer
from telemetry.report import period_window
from telemetry.store import open_store
from tests.test_dashboard_apptest import PAGES, app_for, assert_clean, open_page
from tests.test_paired_speedups import inflated_ar

ABOVE = "measured 4.00x is above the mean acceptance length 2.54 (by more than 10%)"
INFLATED = "the AR timing was inflated"


# ---- bench ----------------------------------------------------------------------------------------------


def _bench_report(spec_tps: float, mean_acceptance_length: float | None) -> dict:
    from app.commands.bench import build_report

    def mode(name: str, tps: float, mal: float | None):
        return SimpleNamespace(mode=name, drafter="draft" if name == "spec" else None, results=[], run_id=1,
                               run_ids=[1], tokens_per_s=tps, output_tokens=100, wall_s=1.0, acceptance_rate=None,
                               mean_acceptance_length=mal)

    loaded = SimpleNamespace(spec=SimpleNamespace(k="4", tree=None, dtype="float32"), target_dir="t")
    params = SimpleNamespace(temperature=0.0, top_p=1.0, top_k=0, seed=0, max_new_tokens=8, greedy=False)
    return build_report([(1, mode("ar", 10.0, None)), (1, mode("spec", spec_tps, mean_acceptance_length))],
                        loaded, params)


def test_bench_warns_under_its_speedup_and_in_its_json(capsys):
    from app.commands.bench import print_table

    report = _bench_report(40.9, 1.82)  # the audit's 4.09x beside 1.82 tokens a step
    assert report["speedup"] == pytest.approx(4.09)  # kept as measured
    (level, text), = report["speedup_warnings"].items()
    assert level == "1" and text.startswith("measured 4.09x is above the mean acceptance length 1.82")
    assert INFLATED in text and "quiet machine" in text and "--interleave" in text
    print_table(report, recorded=False)
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("speedup spec vs AR at concurrency 1: 4.09x")
    assert lines[at + 1] == f"warning: concurrency 1: {text}"


@pytest.mark.parametrize("spec_tps,mal", [(18.0, 1.82), (20.0, 1.82), (40.9, None)])  # 1.1 x 1.82 = 2.002
def test_bench_says_nothing_of_a_speedup_its_acceptance_length_allows_or_cannot_judge(spec_tps, mal, capsys):
    from app.commands.bench import print_table

    report = _bench_report(spec_tps, mal)
    assert report["speedup_warnings"] == {}
    print_table(report, recorded=False)
    assert "mean acceptance length" not in capsys.readouterr().out


# ---- the store's commands ---------------------------------------------------------------------------------


def test_invocations_marks_the_speedup_and_says_why_in_the_table_and_the_json(db_url, capsys):
    inflated_ar(db_url, "1nf1a7ed" + "0" * 24)
    assert main(["invocations", "--db", db_url]) == 0
    out = capsys.readouterr().out
    assert "4.00x!" in out
    (line,) = [x for x in out.splitlines() if x.startswith("warning: ")]
    assert line.startswith("warning: 1nf1a7ed demo/draft-tiny (fixed:4), concurrency 1: " + ABOVE) and INFLATED in line
    assert main(["invocations", "--db", db_url, "--json"]) == 0
    (sp,) = json.loads(capsys.readouterr().out)["invocations"][0]["speedups"]
    assert sp["speedup"] == pytest.approx(4.0)  # the fields it had, as they were
    assert sp["mean_acceptance_length"] == pytest.approx(1 + 60 / 39)
    assert sp["speedup_warning"].startswith(ABOVE)


def test_cost_of_the_invocation_warns_that_ars_cost_reads_high(db_url, capsys):
    inflated_ar(db_url, "1nf1a7ed" + "0" * 24)
    assert main(["cost", "--db", db_url, "--invocation", "latest", "--node-hourly-usd", "2"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "no machine can produce" in x]
    assert line.startswith("warning: these runs measured a speedup no machine can produce") and ABOVE in line
    assert main(["cost", "--db", db_url, "--invocation", "latest", "--node-hourly-usd", "2", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(ABOVE in n for n in notes)


def test_project_warns_that_its_node_counts_and_savings_rest_on_it(db_url, capsys):
    inflated_ar(db_url)
    args = ["project", "--db", db_url, "--daily-tokens", "1e9", "--peak-factor", "1", "--p95-tpot-sla-ms", "1000",
            "--node-hourly-usd", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "annual savings: $" in out  # still shown
    (line,) = [x for x in out.splitlines() if "no machine can produce" in x]
    assert line.startswith("warning: the node counts and savings rest on a speedup no machine can produce")
    assert ABOVE in line and INFLATED in line
    assert main([*args, "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["speedup_above_acceptance_length"] is True and any(ABOVE in n for n in a["notes"])


def test_project_of_a_plausible_speedup_says_nothing_of_it(db_url, capsys):
    from tests.test_paired_speedups import _ar, _spec

    engine = open_store(db_url)
    from sqlalchemy.orm import Session

    with Session(engine) as s:  # 2.00x beside 2.54 tokens a step
        _ar(s, "quiet", BASE_TIME, 2000)
        _spec(s, "quiet", BASE_TIME + timedelta(seconds=3), 1000)
        s.commit()
    engine.dispose()
    assert main(["project", "--db", db_url, "--daily-tokens", "1e9", "--peak-factor", "1", "--p95-tpot-sla-ms",
                 "1000", "--node-hourly-usd", "2", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["speedup_above_acceptance_length"] is False and not any("acceptance length" in n for n in a["notes"])


def test_project_sized_on_a_plausible_concurrency_says_nothing_of_an_impossible_one(db_url, capsys):
    """One bench: AR timed on a loaded machine at concurrency 1 (4.00x beside 2.54 tokens a step), a plausible
    1.25x at concurrency 8, where both modes' capacity at the SLA comes from: the nodes and savings do not rest
    on the impossible figure (the caveat once took every run of the compared group, at every concurrency)."""
    from sqlalchemy.orm import Session
    from synthetic import Req, spec_req

    from tests.test_paired_speedups import _run

    engine = open_store(db_url)
    inv = "c0ffee00" + "0" * 24
    with Session(engine) as s:
        _run(s, inv, "ar", BASE_TIME, [Req(100, ttft_ms=50, e2e_ms=4000, external_id=f"p{i}", start_s=4.1 * i)
                                       for i in range(25)])
        _run(s, inv, "spec", BASE_TIME + timedelta(minutes=5),
             [spec_req(100, 4, 60, ttft_ms=50, e2e_ms=1000, external_id=f"p{i}", start_s=1.1 * i) for i in range(25)])
        _run(s, inv, "ar", BASE_TIME + timedelta(minutes=10),
             [Req(100, ttft_ms=50, e2e_ms=2000, external_id=f"p{i}", start_s=2.0 * (i // 8)) for i in range(24)],
             concurrency=8)
        _run(s, inv, "spec", BASE_TIME + timedelta(minutes=15),
             [spec_req(100, 4, 60, ttft_ms=50, e2e_ms=1600, external_id=f"p{i}", start_s=1.6 * (i // 8))
              for i in range(24)], concurrency=8)
        s.commit()
    engine.dispose()
    assert main(["project", "--db", db_url, "--daily-tokens", "1e8", "--peak-factor", "2", "--sla-ms", "1000",
                 "--node-hourly-usd", "2", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["speedup_above_acceptance_length"] is False, a["notes"]


def test_report_page_summary_and_command_say_it_beside_the_speedup_and_the_savings(db_url, tmp_path, capsys):
    inflated_ar(db_url)
    engine = open_store(db_url)
    result = report_writer.write_report(engine, period_window("daily", since=BASE_TIME.replace(hour=0)), tmp_path,
                                        now=BASE_TIME + timedelta(days=2), daily_tokens=1e9)
    engine.dispose()
    (row,) = result.summary["speedups"]
    assert row["speedup"] == pytest.approx(4.0) and row["above_acceptance_length"] is True
    assert row["mean_acceptance_length"] == pytest.approx(1 + 60 / 39) and ABOVE in row["speedup_warning"]
    projection = result.summary["projection"]
    assert projection["assumptions"]["speedup_above_acceptance_length"] is True
    page = result.html_path.read_text(encoding="utf-8")
    assert "<p class='notice'>Speedup invocation inflated: " + ABOVE in page  # above the tiles
    assert "above the mean acceptance length of the spec runs, which no speedup can exceed" in page  # Speedup card
    assert "overstated: rests on a speedup above the mean acceptance length" in page  # savings card
    assert "the node counts and savings rest on a speedup no machine can produce" in page  # the assumptions
    assert main(["report", "--db", db_url, "--out", str(tmp_path / "cli"), "--period", "custom", "--invocation",
                 "latest", "--daily-tokens", "1e9"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning: ")]
    assert line.startswith("warning: code, concurrency 1, demo/draft-tiny: speedup invocation inflated: " + ABOVE)


def _count_speedups(monkeypatch) -> list:
    """Every call of queries.speedups from here on, wherever it is imported from."""
    from telemetry import costing, queries

    calls, real = [], queries.speedups

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(queries, "speedups", counted)
    monkeypatch.setattr(costing, "speedups", counted)
    return calls


@pytest.mark.parametrize("command", [
    ["report", "--period", "custom", "--invocation", "latest", "--daily-tokens", "1e9"],
    ["project", "--daily-tokens", "1e9", "--peak-factor", "1", "--sla-ms", "1000", "--node-hourly-usd", "2"],
    ["cost"],
])
def test_report_project_and_cost_query_the_speedups_once_and_still_flag_the_impossible_one(
        command, db_url, tmp_path, monkeypatch, capsys):
    """`report` ran the speedups query twice (once for its table, once inside project_from_store for the
    projection's caveat): the projection takes the report's. The caveat is said all the same."""
    inflated_ar(db_url)
    calls = _count_speedups(monkeypatch)
    out_dir = ["--out", str(tmp_path / "out")] if command[0] == "report" else []
    assert main([command[0], "--db", db_url, *out_dir, *command[1:]]) == 0
    assert len(calls) == 1, calls
    assert ABOVE in capsys.readouterr().out


def test_the_projection_queries_the_speedups_where_those_given_pool_another_group(db_url, monkeypatch):
    """project_from_store takes the caller's speedups only where each it needs compares the compared group's runs
    alone; one that pools other runs (the speedup key has no backend) is not the group's: queried again."""
    from dataclasses import replace

    from telemetry import costing, queries

    inflated_ar(db_url)
    engine = open_store(db_url)
    kwargs = dict(daily_tokens=1e9, peak_factor=1.0, sla_ms=1000.0, node_hourly_usd=2.0)
    own = costing.project_from_store(engine, **kwargs)
    (s,) = queries.speedups(engine)
    calls = _count_speedups(monkeypatch)
    given = costing.project_from_store(engine, speedups_in_view=[s], **kwargs)
    assert calls == [] and given.caveats == own.caveats and given.speedup_above_acceptance
    pooled = replace(s, ar_run_ids=(*s.ar_run_ids, 999))  # a run of another group in it
    assert costing.project_from_store(engine, speedups_in_view=[pooled], **kwargs).caveats == own.caveats
    assert len(calls) == 1
    engine.dispose()


# ---- the dashboard ----------------------------------------------------------------------------------------


def test_overview_warns_beside_the_speedup_tile_and_the_projection(sqlite_url, monkeypatch):
    inflated_ar(sqlite_url)
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    assert [m.value for m in at.metric if m.label == "Speedup"] == ["4.00x"]  # kept as measured
    warnings = [w.value for w in at.warning]
    assert any(w.startswith("Speedup: speedup invocation inflated: " + ABOVE) for w in warnings), warnings
    assert any(w.startswith("Projection: the node counts and savings rest on a speedup no machine can produce")
               for w in warnings), warnings
    table = at.dataframe[0].value
    assert list(table["above acc len"]) == [True]
    assert list(table["spec mean acc len"]) == pytest.approx([1 + 60 / 39])


def test_a_sweeps_speedup_above_its_acceptance_length_is_warned_on_the_cost_page(sqlite_url, monkeypatch):
    from sqlalchemy.orm import Session
    from synthetic import Req, make_run, spec_req

    from telemetry.sweeps import record_sweep, sweep_points

    engine = open_store(sqlite_url)
    with Session(engine) as s:  # concurrency 1: 8.00x beside 1 + 20 / 19 = 2.05 tokens a step; 8: 0.67x
        ids = []
        for conc, ar_ms, spec_ms in ((1, 4000.0, 500.0), (8, 400.0, 600.0)):
            ids.append(make_run(s, "ar", concurrency=conc, requests=[Req(output_tokens=40, e2e_ms=ar_ms)]).id)
            ids.append(make_run(s, "spec", concurrency=conc,
                                requests=[spec_req(40, k=4, accepted=20, e2e_ms=spec_ms)]).id)
        s.commit()
    record_sweep(engine, node_id="node-a", device="cpu (2 cores)", target="demo/target-tiny",
                 drafter="demo/draft-tiny", k_policy="fixed:4", workload="code", dtype="float32", run_ids=ids)
    assert [p.spec_mean_acceptance_length for p in sweep_points(engine, ids)] == pytest.approx([1 + 20 / 19] * 2)
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    sweep = [w.value for w in at.warning if w.value.startswith("Sweep, ")]
    assert len(sweep) == 1 and sweep[0].startswith("Sweep, concurrency 1: measured 8.00x is above the mean "
                                                   "acceptance length 2.05"), sweep


def test_the_overview_queries_the_speedups_once_and_still_flags_the_impossible_one(sqlite_url, monkeypatch):
    """The Overview queried the speedups for its own tile and table, and again inside its projection
    (project_from_store) for the same runs: the projection takes the page's (speedups_in_view). Its caveat is
    said all the same."""
    inflated_ar(sqlite_url)
    calls = _count_speedups(monkeypatch)
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    assert len(calls) == 1, calls
    assert any(w.value.startswith("Projection: the node counts and savings rest on a speedup no machine can produce")
               for w in at.warning), [w.value for w in at.warning]
