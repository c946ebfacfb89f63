"""The answer length cap (runs.max_new_tokens, store 0008) keys configurations, comparable groups and speedups:
per-token latency grows with the answer and acceptance rises along it, so a spec run capped at 64 new tokens and
an AR run capped at 256 are no comparison, and runs that differ only in their cap never pool. An unknown cap
(NULL: a server's run, a run recorded before 0008) groups with unknown only. `queries.Filters(max_new_tokens=N)`,
`cost` / `project` / `report` / `scheduler --max-new-tokens N` and the dashboard's Max new tokens selector choose
one cap."""

from __future__ import annotations

import csv
import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run, spec_req
from test_report import D0
from test_scheduler import StepClock, job_rows, no_blocking, reports  # noqa: F401 (no_blocking: a fixture)

from app.cli import main
from telemetry import scheduler as sched_mod
from telemetry.costing import comparable_group, no_runs_reason, project_from_store, run_groups
from telemetry.queries import Filters, config_summaries, reuse_collections, run_summaries, speedups
from telemetry.scheduler import persisted_jobs
from telemetry.store import open_store
from telemetry.sweeps import sweep_points

# cap -> (AR, spec) e2e ms of each of a run's two requests (one after the other), `cap` tokens each: AR decodes
# 64 tokens/s at either cap; spec 80 tokens/s capped at 64 (1.25x), 128 tokens/s capped at 256 (2.00x). Pooled
# across the caps, spec's 640 tokens in 5.6 s against AR's 640 in 10 s would read 1.79x, neither measurement.
E2E_MS = {64: (1000.0, 800.0), 256: (4000.0, 2000.0)}
SPEEDUP = {64: 1.25, 256: 2.00}
POOLED = (2 * 64 + 2 * 256) / 5.6 / ((2 * 64 + 2 * 256) / 10.0)
PROJECT = ["--daily-tokens", "1e6", "--peak-factor", "1", "--p95-tpot-sla-ms", "1e6", "--node-hourly-usd", "1"]


def _req(mode: str, cap: int, e2e_ms: float, i: int) -> Req:
    kw = dict(ttft_ms=10.0, e2e_ms=e2e_ms, start_s=i * e2e_ms / 1000, external_id=f"p{i + 1}")
    return Req(cap, **kw) if mode == "ar" else spec_req(cap, 4, cap * 5 // 8, **kw)


def record_caps(engine, *, unknown: bool = False) -> dict:
    """A greedy spec/AR pair capped at 64 new tokens, then one capped at 256 ((mode, cap) -> run id); with
    `unknown`, also an AR run that recorded no cap (as one recorded before 0008), under the key ('ar', None)."""
    ids = {}
    with Session(engine) as s:
        n = 0
        for cap, (ar_ms, spec_ms) in E2E_MS.items():
            for mode, e2e_ms in (("ar", ar_ms), ("spec", spec_ms)):
                run = make_run(s, mode, max_new_tokens=cap, started_at=BASE_TIME + timedelta(minutes=n),
                               requests=[_req(mode, cap, e2e_ms, i) for i in range(2)])
                ids[(mode, cap)] = run.id
                n += 1
        if unknown:
            ids[("ar", None)] = make_run(s, "ar", max_new_tokens=None, started_at=BASE_TIME + timedelta(minutes=n),
                                         requests=[_req("ar", 64, 1000.0, i) for i in range(2)]).id
        s.commit()
    return ids


@pytest.fixture
def cap_store(db_url):
    engine = open_store(db_url)
    ids = record_caps(engine)
    yield engine, ids
    engine.dispose()


def _url(engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


# ---- keys: configurations, speedups, comparable groups ------------------------------------------------------


def test_runs_that_differ_only_in_their_cap_are_two_configurations_and_two_speedups(cap_store):
    engine, ids = cap_store
    # first what a key without the cap got wrong, in figures any version has: one 1.79x pooled from both caps
    assert sorted(s.speedup for s in speedups(engine)) == pytest.approx([1.25, 2.00], rel=1e-9)
    configs = config_summaries(engine)
    assert sorted((c.mode, c.max_new_tokens) for c in configs) == [("ar", 64), ("ar", 256), ("spec", 64),
                                                                    ("spec", 256)]
    assert {(c.mode, c.max_new_tokens): c.run_ids for c in configs} == {k: (v,) for k, v in ids.items()}
    tps = {(c.mode, c.max_new_tokens): c.stats.tokens_per_s for c in configs}
    assert tps == pytest.approx({("ar", 64): 64.0, ("spec", 64): 80.0, ("ar", 256): 64.0, ("spec", 256): 128.0})

    rows = {s.max_new_tokens: s for s in speedups(engine)}
    assert set(rows) == {64, 256}  # not one row pooling both (it would read 1.79x)
    assert rows[64].speedup == pytest.approx(1.25, rel=1e-9)
    assert rows[256].speedup == pytest.approx(2.00, rel=1e-9)
    assert rows[64].speedup != pytest.approx(rows[256].speedup) and POOLED == pytest.approx(1.7857, abs=1e-4)
    for cap in (64, 256):
        assert (rows[cap].spec_run_ids, rows[cap].ar_run_ids) == ((ids[("spec", cap)],), (ids[("ar", cap)],))
        assert rows[cap].prompts == "the same 2 prompts"

    # the projection compares one cap (the first measured: both have 2 requests a mode) and names the other
    comparison, chosen = comparable_group(configs)
    assert {c.max_new_tokens for c in chosen} == {64} and comparison.as_dict()["max_new_tokens"] == 64
    assert comparison.label == "workload code, temperature 0, bench runs, 64 new tokens"
    assert comparison.others == ("workload code, temperature 0, bench runs, 256 new tokens",)
    assert "--max-new-tokens" in comparison.text()
    sp = project_from_store(engine, daily_tokens=1e6, peak_factor=1.0, sla_ms=1e6, node_hourly_usd=1.0)
    assert sp.projection.capacity_tokens_per_s_spec / sp.projection.capacity_tokens_per_s_ar == pytest.approx(1.25)

    assert run_groups(run_summaries(engine)) == ["workload code, temperature 0, bench runs, 64 new tokens",
                                                 "workload code, temperature 0, bench runs, 256 new tokens"]


def test_an_unknown_cap_groups_with_unknown_only_and_is_named_so(sqlite_url):
    engine = open_store(sqlite_url)
    ids = record_caps(engine, unknown=True)
    with Session(engine) as s:  # a second run recorded before 0008: it pools with the first unknown one
        ids["old"] = make_run(s, "ar", max_new_tokens=None, started_at=BASE_TIME + timedelta(minutes=9),
                              requests=[_req("ar", 64, 1000.0, i) for i in range(2)]).id
        s.commit()
    ars = {c.max_new_tokens: c.run_ids for c in config_summaries(engine) if c.mode == "ar"}
    assert ars == {64: (ids[("ar", 64)],), 256: (ids[("ar", 256)],), None: (ids[("ar", None)], ids["old"])}
    groups = run_groups(run_summaries(engine))
    assert groups == ["workload code, temperature 0, bench runs, 64 new tokens",
                      "workload code, temperature 0, bench runs, 256 new tokens",
                      "workload code, temperature 0, bench runs, max new tokens unknown"]
    comparison, _ = comparable_group(config_summaries(engine))
    said = comparison.text()
    assert "max new tokens unknown (AR only)" in said and "None" not in said, said
    # the unknown AR runs have no spec counterpart: no speedup of theirs, and neither known cap pairs with them
    assert {s.max_new_tokens: s.speedup for s in speedups(engine)} == pytest.approx({64: 1.25, 256: 2.00})
    engine.dispose()


def test_a_sweep_over_two_caps_is_refused_naming_them(cap_store):
    engine, ids = cap_store
    with pytest.raises(ValueError) as info:
        sweep_points(engine, list(ids.values()))
    assert "answer length cap (max_new_tokens)" in str(info.value)
    assert "(64 new tokens; 256 new tokens)" in str(info.value), str(info.value)


# ---- queries.Filters ---------------------------------------------------------------------------------------


def test_the_cap_filter_picks_one_pair(cap_store):
    engine, ids = cap_store
    for cap in (64, 256):
        assert {r.run_id for r in run_summaries(engine, Filters(max_new_tokens=cap))} == {
            ids[("ar", cap)], ids[("spec", cap)]}
        [row] = speedups(engine, Filters(max_new_tokens=cap))
        assert (row.max_new_tokens, row.speedup) == (cap, pytest.approx(SPEEDUP[cap], rel=1e-9))
        [group] = run_groups(run_summaries(engine, Filters(max_new_tokens=cap)))
        assert group == "workload code, temperature 0, bench runs"  # one group: nothing differs to name
    assert run_summaries(engine, Filters(max_new_tokens=128)) == []
    # inside reuse_collections each cap is its own read (Filters stay hashable and differ)
    assert len({Filters(max_new_tokens=64), Filters(max_new_tokens=256), Filters()}) == 3
    with reuse_collections():
        assert [s.speedup for s in speedups(engine, Filters(max_new_tokens=64))] == [pytest.approx(1.25)]
        assert [s.speedup for s in speedups(engine, Filters(max_new_tokens=256))] == [pytest.approx(2.00)]


@pytest.mark.parametrize(("value", "needle"), [
    (0, "max_new_tokens must be a whole number >= 1, got 0"),
    (-64, "max_new_tokens must be a whole number >= 1, got -64"),
    (64.5, "max_new_tokens must be a whole number >= 1, got 64.5"),
    (True, "max_new_tokens must be a whole number >= 1, got True"),
    ("64", "max_new_tokens must be a whole number >= 1, got '64'"),
    (2**31, "max_new_tokens must be at most 2147483647"),
])
def test_filters_refuse_a_cap_no_run_can_have(value, needle):
    with pytest.raises(ValueError) as info:
        Filters(max_new_tokens=value)
    assert needle in str(info.value)


def test_no_runs_reason_names_the_cap_and_the_caps_there_are(sqlite_url):
    engine = open_store(sqlite_url)
    ids = record_caps(engine, unknown=True)
    assert no_runs_reason(engine, Filters(max_new_tokens=128)) == (
        "no runs with max_new_tokens 128 (max_new_tokens values in the store: 64, 256, unknown)")
    unknown = ids[("ar", None)]
    assert no_runs_reason(engine, Filters(run_ids=(unknown,), max_new_tokens=64)) == (
        f"run {unknown} has max_new_tokens unknown, not 64")
    assert no_runs_reason(engine, Filters(run_ids=(ids[("ar", 64)],), max_new_tokens=256)) == (
        f"run {ids[('ar', 64)]} has max_new_tokens 64, not 256")
    engine.dispose()


# ---- cost, project, report ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [64, 256])
def test_cost_and_project_of_one_cap_give_that_pairs_figures(cap_store, capsys, cap):
    engine, ids = cap_store
    url = _url(engine)
    assert main(["cost", "--db", url, "--json", "--max-new-tokens", str(cap)]) == 0
    modes = {m["mode"]: m["run_ids"] for m in _json(capsys)["modes"]}
    assert modes == {"spec": [ids[("spec", cap)]], "ar": [ids[("ar", cap)]]}

    assert main(["project", "--db", url, *PROJECT, "--json", "--max-new-tokens", str(cap)]) == 0
    got = _json(capsys)
    assert got["capacity_tokens_per_s_spec"] / got["capacity_tokens_per_s_ar"] == pytest.approx(SPEEDUP[cap])
    assert got["assumptions"]["compared"]["max_new_tokens"] == cap
    assert got["assumptions"]["compared"]["other_groups"] == []  # the other cap is out of view


def test_project_without_a_cap_names_both_and_the_option_that_chooses(cap_store, capsys):
    engine, _ = cap_store
    assert main(["project", "--db", _url(engine), *PROJECT]) == 0
    out = capsys.readouterr().out
    assert "compared at workload code, temperature 0, bench runs, 64 new tokens" in out, out
    assert "1 other comparable group in view (workload code, temperature 0, bench runs, 256 new tokens)" in out
    assert "--max-new-tokens" in out


def test_a_cap_no_run_has_is_said_with_the_caps_there_are(cap_store, capsys):
    engine, _ = cap_store
    assert main(["cost", "--db", _url(engine), "--max-new-tokens", "128"]) == 2
    assert "no runs with max_new_tokens 128 (max_new_tokens values in the store: 64, 256)" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["cost"], ["project", *PROJECT], ["report", "--period", "daily"], ["scheduler", "--cron", "0 6 * * *"],
])
@pytest.mark.parametrize(("value", "needle"), [
    ("0", "--max-new-tokens must be a whole number >= 1, got '0'"),
    ("64.5", "--max-new-tokens must be a whole number >= 1, got '64.5'"),
    ("many", "--max-new-tokens must be a whole number >= 1, got 'many'"),
    ("2147483648", "--max-new-tokens must be at most 2147483647, got '2147483648'"),
])
def test_bad_caps_are_refused_naming_the_option(empty_store, tmp_path, capsys, argv, value, needle):
    out = tmp_path / "reports"
    extra = ["--out", str(out)] if argv[0] in ("report", "scheduler") else []
    assert main([argv[0], "--db", empty_store, *argv[1:], *extra, "--max-new-tokens", value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not out.exists()  # refused before anything is written


def test_a_report_of_one_cap_has_that_pairs_figures_and_says_so(cap_store, tmp_path, capsys):
    engine, ids = cap_store
    url = _url(engine)
    assert main(["report", "--db", url, "--out", str(tmp_path / "reports"), "--period", "daily",
                 "--since", f"{D0:%Y-%m-%d}", "--max-new-tokens", "256"]) == 0
    said = capsys.readouterr().out
    assert "(256 new tokens only)" in said, said
    [rec] = reports(engine)
    assert rec.summary["max_new_tokens"] == 256
    assert rec.summary["output_tokens"] == 4 * 256  # the two runs capped at 256, two answers each
    [row] = rec.summary["speedups"]
    assert (row["max_new_tokens"], row["speedup"]) == (256, pytest.approx(2.00))
    assert (row["spec_run_ids"], row["ar_run_ids"]) == ([ids[("spec", 256)]], [ids[("ar", 256)]])
    page = open(rec.html_path, encoding="utf-8").read()
    assert "(256 new tokens only)" in page
    assert ">max new tokens<" not in page  # one cap in the table: the page leaves its column out (the CSV has it)

    # every run: two speedup rows, each of one cap; the page's table has the cap column where they differ
    assert main(["report", "--db", url, "--out", str(tmp_path / "all"), "--period", "daily",
                 "--since", f"{D0:%Y-%m-%d}"]) == 0
    capsys.readouterr()
    rec = reports(engine)[-1]
    assert rec.summary["max_new_tokens"] is None
    assert {r["max_new_tokens"]: r["speedup"] for r in rec.summary["speedups"]} == pytest.approx(SPEEDUP)
    assert ">max new tokens<" in open(rec.html_path, encoding="utf-8").read()
    with open(Path(rec.csv_dir) / "speedups.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["max new tokens"] for r in rows) == ["256", "64"]


# ---- scheduler ---------------------------------------------------------------------------------------------


def test_a_scheduled_job_keeps_its_cap_across_a_restart(db_url, tmp_path, monkeypatch, no_blocking,  # noqa: F811
                                                        capsys):
    engine = open_store(db_url)
    ids = record_caps(engine)  # on D0: a scheduled run reports D0, then D0 + 1 day
    monkeypatch.setattr(sched_mod, "_clock", StepClock(D0 + timedelta(days=1, hours=6), timedelta(days=1)))
    url, out = _url(engine), tmp_path / "reports"
    base = ["scheduler", "--db", url, "--cron", "0 6 * * *", "--out", str(out)]
    try:
        assert main([*base, "--max-new-tokens", "256"]) == 0
        assert "job report-daily added" in capsys.readouterr().out
        assert main([*base, "--max-new-tokens", "256"]) == 0  # a restart with the same options
        assert "job report-daily kept" in capsys.readouterr().out
        fresh = open_store(url)  # as a new process reads the job store
        try:
            [stored] = persisted_jobs(fresh)
        finally:
            fresh.dispose()
        assert stored.kwargs["max_new_tokens"] == 256
        assert main(["scheduler", "--db", url, "--list"]) == 0
        assert "daily reports of 256 new tokens only into" in capsys.readouterr().out
        assert sched_mod.run_report_job(**stored.kwargs) is not None
        [row] = reports(engine)
        assert (row.summary["max_new_tokens"], row.summary["output_tokens"]) == (256, 4 * 256)
        [speedup] = row.summary["speedups"]
        assert (speedup["max_new_tokens"], speedup["speedup"]) == (256, pytest.approx(2.00))
        assert speedup["spec_run_ids"] == [ids[("spec", 256)]]
        # another cap replaces the job; a job without one stores none (an older job compares equal)
        assert main([*base, "--max-new-tokens", "64"]) == 0
        assert "job report-daily replaced" in capsys.readouterr().out
        [job] = no_blocking[-1]
        assert job.kwargs["max_new_tokens"] == 64
        assert main(base) == 0
        [job] = no_blocking[-1]
        assert "max_new_tokens" not in job.kwargs
        assert job_rows(engine) == ["report-daily"]
    finally:
        engine.dispose()


# ---- dashboard ---------------------------------------------------------------------------------------------


def test_the_dashboards_cap_selector_narrows_the_runs_to_one_pair(sqlite_url, monkeypatch):
    from test_dashboard_apptest import PAGES, app_for, assert_clean, open_page

    engine = open_store(sqlite_url)
    ids = record_caps(engine)
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    box = at.sidebar.selectbox(key="f_max_new_tokens")
    assert box.options == ["All", "64", "256"]  # the caps the runs hold, by number
    tile = [m for m in at.metric if m.label == "Speedup"][0]
    assert tile.value == "1.25–2.00x", tile.value  # two speedups, not one pooled 1.79x
    assert "64 new tokens" in tile.help and "256 new tokens" in tile.help, tile.help
    captions = [c.value for c in at.caption]
    assert any("other comparable group in view" in c and "Max new tokens" in c.split("pick another")[-1]
               for c in captions), captions

    box.set_value(256).run()
    assert_clean(at)
    tile = [m for m in at.metric if m.label == "Speedup"][0]
    assert tile.value == "2.00x", tile.value
    assert not any("other comparable group" in c.value for c in at.caption)

    at.switch_page(PAGES["Runs"]).run()
    assert_clean(at)
    assert at.sidebar.selectbox(key="f_max_new_tokens").value == 256  # the sidebar holds across pages
    assert sorted(at.dataframe[0].value["run"]) == sorted([ids[("ar", 256)], ids[("spec", 256)]])
    at.sidebar.selectbox(key="f_max_new_tokens").set_value(64).run()
    assert_clean(at)
    assert sorted(at.dataframe[0].value["run"]) == sorted([ids[("ar", 64)], ids[("spec", 64)]])
