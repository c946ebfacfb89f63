"""The top_p / top_k run filters: queries.Filters, `cost` / `project` / `report` / `scheduler` --top-p / --top-k, and
the dashboard's top_p / top_k selectors. Comparable groups are keyed on the cut-offs as they act on decoding
(queries.effective_cutoffs: a greedy run's are off, 1 and 0); the filters choose a group by the same reading, so
a group that differs from the others only in top_p or top_k can be chosen."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req
from test_report import D0, add_day
from test_run_sampling import T0, _record_bench
from test_scheduler import StepClock, job_rows, no_blocking, reports  # noqa: F401 (no_blocking: a fixture)

from app.cli import main
from telemetry import scheduler as sched_mod
from telemetry.costing import no_runs_reason, run_groups
from telemetry.queries import (
    Filters,
    cutoffs_text,
    effective_cutoffs,
    reuse_collections,
    run_summaries,
    speedups,
)
from telemetry.scheduler import persisted_jobs
from telemetry.store import open_store


def _record_top_k_groups(engine) -> dict:
    """As test_run_sampling's top_k_store: sampled at 0.8, top_k 0: spec 1.00x AR; top_k 40: spec 1.62x."""
    return {(mode, top_k): _record_bench(engine, mode, top_k, e2e_ms, T0 + timedelta(minutes=n))
            for n, (mode, top_k, e2e_ms) in enumerate(
                [("ar", 0, 1000.0), ("spec", 0, 1000.0), ("ar", 40, 1000.0), ("spec", 40, 1000.0 / 1.62)])}


@pytest.fixture
def top_k_store(db_url):
    engine = open_store(db_url)
    ids = _record_top_k_groups(engine)
    yield engine, ids
    engine.dispose()


# ---- queries.Filters -----------------------------------------------------------------------------------------


@pytest.fixture
def cutoff_runs(db_url):
    """One AR run each (name -> id): sampled with top_k 40 (top_p 1, and 0.9), sampled with top_k 0, greedy runs
    that recorded no top_k and that recorded top_k 40 / top_p 0.9 (greedy: neither acts), a sampled run recorded
    before top_k was (unknown), and a server's run (no sampling of its own)."""
    engine = open_store(db_url)
    specs = {
        "k40": dict(temperature=0.8, top_k=40),
        "k40_p09": dict(temperature=0.8, top_k=40, top_p=0.9),
        "k0": dict(temperature=0.8, top_k=0),
        "greedy_unknown": dict(temperature=0.0, top_k=None),
        "greedy_k40_p09": dict(temperature=0.0, top_k=40, top_p=0.9),
        "sampled_unknown": dict(temperature=0.8, top_k=None),
    }
    with Session(engine) as s:
        ids = {name: make_run(s, "ar", requests=[Req(30, ttft_ms=10, e2e_ms=1000)], **kw).id
               for name, kw in specs.items()}
        server = make_run(s, "ar", kind="serve", requests=[Req(30, ttft_ms=10, e2e_ms=1000)])
        server.temperature = server.top_p = server.top_k = None
        s.flush()
        ids["server"] = server.id
        s.commit()
    yield engine, ids
    engine.dispose()


def _ids(engine, **filters) -> set[int]:
    return {r.run_id for r in run_summaries(engine, Filters(**filters))}


def test_top_k_and_top_p_filters_keep_the_runs_whose_cut_off_acts_so(cutoff_runs):
    engine, ids = cutoff_runs
    assert _ids(engine, top_k=40) == {ids["k40"], ids["k40_p09"]}  # the greedy run that recorded 40 is off
    assert _ids(engine, top_k=0) == {ids["k0"], ids["greedy_unknown"], ids["greedy_k40_p09"]}
    assert _ids(engine, top_k=5) == set()
    assert _ids(engine, top_p=0.9) == {ids["k40_p09"]}
    assert _ids(engine, top_p=1) == {ids["k40"], ids["k0"], ids["greedy_unknown"], ids["greedy_k40_p09"],
                                     ids["sampled_unknown"]}
    assert _ids(engine, temperature=0.8, top_k=0) == {ids["k0"]}
    assert _ids(engine, top_p=1.0, top_k=40) == {ids["k40"]}
    # the filters read the cut-offs as the groups do: a run matches exactly the value its group is keyed on
    for r in run_summaries(engine):
        top_p, top_k = effective_cutoffs(r.temperature, r.top_p, r.top_k)
        for k in (0, 40):
            assert (r.run_id in _ids(engine, top_k=k)) == (top_k == k), (r.run_id, k)
        for p in (0.9, 1.0):
            assert (r.run_id in _ids(engine, top_p=p)) == (top_p == p), (r.run_id, p)


def test_filters_of_other_cut_offs_are_other_keys_of_the_shared_reads(cutoff_runs):
    """Inside reuse_collections a page reads each filter's requests once, keyed on the Filters: top_k 40 and
    top_k 0 must not share one read."""
    engine, ids = cutoff_runs
    assert len({Filters(top_k=40), Filters(top_k=0), Filters(top_p=0.9), Filters()}) == 4
    with reuse_collections():
        assert {r.run_id for r in run_summaries(engine, Filters(top_k=40))} == {ids["k40"], ids["k40_p09"]}
        assert ids["k0"] in {r.run_id for r in run_summaries(engine, Filters(top_k=0))}


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(top_k=-1), "top_k must be a whole number >= 0, got -1"),
    (dict(top_k=1.5), "top_k must be a whole number >= 0, got 1.5"),
    (dict(top_k=True), "top_k must be a whole number >= 0, got True"),
    (dict(top_k=2**31), "top_k must be at most 2147483647"),
    (dict(top_p=0), "top_p must be a number in (0, 1], got 0"),
    (dict(top_p=1.5), "top_p must be a number in (0, 1], got 1.5"),
    (dict(top_p=float("nan")), "top_p must be a number in (0, 1], got nan"),
])
def test_filters_refuse_a_cut_off_no_run_can_have(kw, needle):
    with pytest.raises(ValueError) as info:
        Filters(**kw)
    assert needle in str(info.value)


def test_no_runs_reason_names_the_cut_off_and_the_values_there_are(cutoff_runs):
    engine, ids = cutoff_runs
    # a sampled run that recorded no top_k is listed as unknown, not left out
    assert no_runs_reason(engine, Filters(top_k=5)) == (
        "no runs with top_k 5 (top_k values in the store: 0, 40, unknown)")
    assert no_runs_reason(engine, Filters(top_p=0.5)) == (  # 'unknown': the server's run recorded none
        "no runs with top_p 0.5 (top_p values in the store: 0.9, 1, unknown)")
    # greedy runs recorded top_k 40, but at temperature 0 it acts as 0: the message says why none matches
    assert no_runs_reason(engine, Filters(temperature=0.0, top_k=40)) == (
        "no run has temperature 0.0 and top_k 40 together (at temperature 0 every run counts as top_p 1 and "
        "top_k 0: greedy decoding ignores them)")
    assert no_runs_reason(engine, Filters(run_ids=(ids["greedy_k40_p09"],), top_k=40)) == (
        f"run {ids['greedy_k40_p09']} has top_k 0 (greedy: any top_k counts as 0; it recorded 40), not 40")
    assert no_runs_reason(engine, Filters(run_ids=(ids["sampled_unknown"],), top_k=40)) == (
        f"run {ids['sampled_unknown']} has top_k unknown, not 40")  # not a Python 'None'


def test_a_sampled_groups_unknown_cut_off_is_named_not_read_as_off(cutoff_runs):
    """A sampled run recorded before top_k was (NULL) is 'top_k unknown' in every group text, never the text of a
    top_k-0 group; greedy runs say nothing of cut-offs; a server's runs (per-request sampling) neither."""
    engine, ids = cutoff_runs
    groups = run_groups(run_summaries(engine, Filters(run_ids=(ids["sampled_unknown"], ids["k0"]))))
    assert groups == ["workload code, temperature 0.8, bench runs, top_k 0",
                      "workload code, temperature 0.8, top_k unknown, bench runs"]
    assert cutoffs_text(None, None, 0.8) == ", top_p unknown, top_k unknown"
    assert cutoffs_text(0.9, 40, 0.0) == ""  # greedy: neither acts
    assert cutoffs_text(None, None, None) == ""  # a server's runs: each request chose its own
    assert cutoffs_text(1.0, 0, 0.8) == ""
    assert cutoffs_text(0.9, 40, 0.8) == ", top_p 0.9, top_k 40"


# ---- cost, project, report ---------------------------------------------------------------------------------

PROJECT = ["--daily-tokens", "1e6", "--peak-factor", "1", "--p95-tpot-sla-ms", "1e6", "--node-hourly-usd", "1"]


def _url(engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("top_k", "speedup"), [("40", 1.62), ("0", 1.00)])
def test_cost_and_project_of_one_top_k_give_that_groups_figures(top_k_store, capsys, top_k, speedup):
    engine, ids = top_k_store
    url = _url(engine)
    assert main(["cost", "--db", url, "--json", "--top-k", top_k]) == 0
    modes = {m["mode"]: m["run_ids"] for m in _json(capsys)["modes"]}
    assert modes == {"spec": [ids[("spec", int(top_k))]], "ar": [ids[("ar", int(top_k))]]}

    assert main(["project", "--db", url, *PROJECT, "--json", "--top-k", top_k]) == 0
    got = _json(capsys)
    assert got["capacity_tokens_per_s_spec"] / got["capacity_tokens_per_s_ar"] == pytest.approx(speedup, abs=1e-6)
    assert got["assumptions"]["compared"]["top_k"] == int(top_k)
    assert got["assumptions"]["compared"]["other_groups"] == []  # the other top_k is out of view


def test_project_without_a_cut_off_names_the_options_that_choose_another_group(top_k_store, capsys):
    engine, _ = top_k_store
    assert main(["project", "--db", _url(engine), *PROJECT]) == 0
    out = capsys.readouterr().out
    assert "1 other comparable group in view" in out and "(choose with --top-k)" in out, out
    assert "--invocation" not in out, out  # the runs are of no invocation: --invocation ID selects neither
    assert "--top-p" not in out, out  # the groups differ in top_k only: --top-p selects neither


@pytest.mark.parametrize(("argv", "needle"), [
    (["cost", "--top-k", "-1"], "--top-k must be a whole number >= 0, got '-1'"),
    (["cost", "--top-k", "4.5"], "--top-k must be a whole number >= 0, got '4.5'"),
    (["cost", "--top-p", "0"], "--top-p must be a number in (0, 1], got '0'"),
    (["cost", "--top-p", "nan"], "--top-p must be a number in (0, 1], got 'nan'"),
    (["project", *PROJECT, "--top-p", "1.5"], "--top-p must be a number in (0, 1], got '1.5'"),
    (["project", *PROJECT, "--top-k", "forty"], "--top-k must be a whole number >= 0, got 'forty'"),
    (["report", "--period", "daily", "--top-k", "-3"], "--top-k must be a whole number >= 0, got '-3'"),
    (["report", "--period", "daily", "--top-p", "2"], "--top-p must be a number in (0, 1], got '2'"),
    (["scheduler", "--cron", "0 6 * * *", "--top-k", "x"], "--top-k must be a whole number >= 0, got 'x'"),
])
def test_bad_cut_offs_are_refused_naming_the_option(empty_store, tmp_path, capsys, argv, needle):
    out = tmp_path / "reports"
    extra = ["--out", str(out)] if argv[0] in ("report", "scheduler") else []
    assert main([argv[0], "--db", empty_store, *argv[1:], *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not out.exists()  # refused before anything is written


def test_a_top_k_no_run_has_is_said_with_the_values_there_are(top_k_store, capsys):
    engine, _ = top_k_store
    assert main(["cost", "--db", _url(engine), "--top-k", "7"]) == 2
    assert "no runs with top_k 7 (top_k values in the store: 0, 40)" in capsys.readouterr().err


def test_a_report_of_one_top_k_has_that_groups_figures_and_says_so(top_k_store, tmp_path, capsys):
    engine, ids = top_k_store
    url = _url(engine)
    assert main(["cost", "--db", url, "--json", "--top-k", "40"]) == 0
    narrowed = {m["mode"]: m for m in _json(capsys)["modes"]}
    assert main(["report", "--db", url, "--out", str(tmp_path / "reports"), "--period", "daily", "--since", "2026-12-09",
                 "--temperature", "0.8", "--top-k", "40"]) == 0
    said = capsys.readouterr().out
    assert "(temperature 0.8, top_k 40 only)" in said, said
    [rec] = reports(engine)
    assert (rec.summary["temperature"], rec.summary["top_k"], rec.summary["top_p"]) == (0.8, 40, None)
    assert rec.summary["output_tokens"] == 400  # two runs of two 100-token prompts, not the top_k 0 runs
    [row] = rec.summary["speedups"]
    assert row["top_k"] == 40 and row["speedup"] == pytest.approx(1.62, abs=1e-6)
    assert (row["spec_run_ids"], row["ar_run_ids"]) == ([ids[("spec", 40)]], [ids[("ar", 40)]])
    for mode, got in rec.summary["modes"].items():
        assert got["total_usd_per_1m"] == narrowed[mode]["total_usd_per_1m"], mode
    assert "(temperature 0.8, top_k 40 only)" in open(rec.html_path, encoding="utf-8").read()


def test_every_speedup_of_the_top_k_store_is_one_filter_away(top_k_store):
    engine, _ = top_k_store
    for k, speedup in ((0, 1.00), (40, 1.62)):
        [row] = speedups(engine, Filters(top_k=k))
        assert (row.top_k, row.speedup) == (k, pytest.approx(speedup, abs=1e-6))


# ---- scheduler ---------------------------------------------------------------------------------------------


@pytest.fixture
def greedy_day(sqlite_url, tmp_path, monkeypatch):
    """test_scheduler's store: greedy runs on D0 (top_k unknown); a scheduled run reports D0, then D0 + 1 day."""
    engine = open_store(sqlite_url)
    add_day(engine, D0)
    monkeypatch.setattr(sched_mod, "_clock", StepClock(D0 + timedelta(days=1, hours=6), timedelta(days=1)))
    yield sqlite_url, engine, tmp_path / "reports"
    engine.dispose()


def test_a_scheduled_job_keeps_its_cut_offs_across_a_restart(greedy_day, no_blocking, capsys):  # noqa: F811
    url, engine, out = greedy_day  # D0's runs: greedy (temperature 0), top_k recorded as unknown
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    assert main([*base, "--top-k", "0", "--top-p", "1"]) == 0
    assert "job report-daily added" in capsys.readouterr().out
    assert main([*base, "--top-k", "0", "--top-p", "1"]) == 0  # a restart with the same options
    assert "job report-daily kept" in capsys.readouterr().out
    fresh = open_store(url)  # as a new process reads the job store
    try:
        [stored] = persisted_jobs(fresh)
    finally:
        fresh.dispose()
    assert (stored.kwargs["top_k"], stored.kwargs["top_p"]) == (0, 1.0)
    assert main(["scheduler", "--db", url, "--list"]) == 0
    assert "daily reports of top_p 1, top_k 0 only into" in capsys.readouterr().out
    assert sched_mod.run_report_job(**stored.kwargs) is not None  # greedy runs count as top_k 0: traffic
    [row] = reports(engine)
    assert (row.summary["top_k"], row.summary["top_p"], row.summary["traffic"]) == (0, 1.0, True)
    # another top_k replaces the job, and its run has no traffic (no run of D0 was cut at top_k 40)
    assert main([*base, "--top-k", "40"]) == 0
    assert "job report-daily replaced" in capsys.readouterr().out
    [job] = no_blocking[-1]
    assert job.kwargs["top_k"] == 40 and "top_p" not in job.kwargs
    # a job without them stores neither (a job stored before they existed compares equal)
    assert main(base) == 0
    [job] = no_blocking[-1]
    assert "top_k" not in job.kwargs and "top_p" not in job.kwargs
    assert job_rows(engine) == ["report-daily"]


# ---- dashboard ---------------------------------------------------------------------------------------------


def test_the_dashboards_top_k_filter_narrows_the_page_to_one_group(sqlite_url, monkeypatch):
    from test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    engine = open_store(sqlite_url)
    _record_top_k_groups(engine)
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    keys = {s.key for s in at.sidebar.selectbox}
    assert "f_top_k" in keys and "f_top_p" not in keys  # every run sampled with top_p 1: nothing to pick
    box = at.sidebar.selectbox(key="f_top_k")
    assert box.options == ["All", "0", "40"]
    tile = [m for m in at.metric if m.label == "Speedup"][0]
    assert tile.value == "1.00–1.62x"
    captions = [c.value for c in at.caption]
    assert any("other comparable group in view" in c and "top_k" in c.split("pick another")[-1]
               for c in captions), captions

    box.set_value(40).run()
    assert_clean(at)
    tile = [m for m in at.metric if m.label == "Speedup"][0]
    assert tile.value == "1.62x" and "top_k 40" in tile.help
    assert not any("other comparable group" in c.value for c in at.caption)

    at.sidebar.selectbox(key="f_top_k").set_value(0).run()
    assert_clean(at)
    assert [m for m in at.metric if m.label == "Speedup"][0].value == "1.00x"


def test_the_dashboard_offers_top_p_where_runs_differ_in_it_and_greedy_runs_count_as_1(sqlite_url, monkeypatch):
    from test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for top_p, spec_ms in ((0.9, 500), (1.0, 800)):
            make_run(s, "ar", temperature=0.8, top_p=top_p, top_k=0, requests=[Req(33, ttft_ms=100, e2e_ms=1000)])
            make_run(s, "spec", temperature=0.8, top_p=top_p, top_k=0,
                     requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=spec_ms)])
        make_run(s, "ar", temperature=0.0, top_p=0.5, requests=[Req(33, ttft_ms=100, e2e_ms=1000)])  # greedy
        s.commit()
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Runs"])
    assert_clean(at)
    box = at.sidebar.selectbox(key="f_top_p")
    assert box.options == ["All", "0.9", "1"]  # the greedy run's 0.5 does not act: it counts as 1
    assert "f_top_k" not in {s.key for s in at.sidebar.selectbox}
    box.set_value(1.0).run()
    assert_clean(at)
    runs = at.dataframe[0].value
    assert sorted(runs["run"]) == [3, 4, 5]
