"""The dashboard compares spec and AR like for like (192e24d, 4c79283, cc6c71e): speedups per temperature and run
kind, a tokens/s delta that is one of those comparisons (never two pooled modes of mixed temperatures), the
projection's comparable group said in the dashboard's words, the temperature and run-kind filters, the p95 of
the configurations the projection sizes, and a recorded $0/kWh counted as the runs' price."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req
from test_dashboard_apptest import PAGES, app_for, assert_clean, fill_store, metrics, open_page

from app.dashboard.common import energy_prices_from, prices_text, projection_notes
from telemetry import costing, queries
from telemetry.finops import ms_apart
from telemetry.store import open_store

PROMPTS = ("p1", "p2")


def _tpot_req(mode: str, tpot_ms: float, i: int):
    """33 tokens with the given TPOT after a 100 ms first token, prompt PROMPTS[i], one second apart."""
    e2e = 100 + 32 * tpot_ms
    if mode == "ar":
        return Req(33, ttft_ms=100, e2e_ms=e2e, start_s=float(i), external_id=PROMPTS[i])
    return spec_req(33, 4, 20, ttft_ms=100, e2e_ms=e2e, start_s=float(i), external_id=PROMPTS[i])


@pytest.fixture
def two_temperatures(sqlite_url) -> str:
    """Spec and AR of one workload at temperature 0 (spec 10 ms TPOT, AR 30 ms) and 0.8 (spec 40 ms, AR 20 ms),
    each on the same two prompts: spec is faster at 0 and slower at 0.8."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for t, ar_ms, spec_ms in ((0.0, 30, 10), (0.8, 20, 40)):
            make_run(s, "ar", temperature=t, requests=[_tpot_req("ar", ar_ms, i) for i in range(2)])
            make_run(s, "spec", temperature=t, requests=[_tpot_req("spec", spec_ms, i) for i in range(2)])
        s.commit()
    engine.dispose()
    return sqlite_url


def _metric(at, label: str, index: int = 0):
    return [m for m in at.metric if m.label == label][index]


def _table(at, column: str):
    for df in at.dataframe:
        frame = df.value
        frame = getattr(frame, "data", frame)  # a Styler holds its frame
        if column in frame.columns:
            return frame
    raise AssertionError(f"no table with a {column!r} column")


def test_speedup_tile_names_its_temperature_run_kind_and_prompts(two_temperatures, monkeypatch):
    at = open_page(app_for(two_temperatures, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    tile = _metric(at, "Speedup")
    assert "not pooled across temperatures or run kinds" in tile.help, tile.help
    assert "temperature 0; temperature 0.8" in tile.help and "bench runs" in tile.help
    table = _table(at, "speedup")
    assert {"temperature", "run kind", "prompts"} <= set(table.columns)
    assert list(table["temperature"]) == ["0", "0.8"] and set(table["run kind"]) == {"bench"}
    assert set(table["prompts"]) == {"the same 2 prompts"}

    # one temperature in view (the sidebar's new filter): one row, its temperature, run kind and prompts said
    at.sidebar.selectbox(key="f_temperature").set_value(0.8).run()
    assert_clean(at)
    (row,) = queries.speedups(open_store(two_temperatures), queries.Filters(temperature=0.8))
    tile = _metric(at, "Speedup")
    assert tile.value == f"{row.speedup:.2f}x"
    assert "at temperature 0.8, bench runs, the same 2 prompts" in tile.help, tile.help


def test_speedup_rows_lead_with_the_columns_they_differ_in(sqlite_url, monkeypatch):
    """Two configurations differing only in their target read alike: the target was the table's last column,
    off-screen, and two models of one directory name both read 'llama'. The columns that differ lead (before the
    speedup), a short name two rows share is shown whole, and the tile's range names what they differ in."""
    targets = ("/models/a/llama", "/models/b/llama")
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for target, spec_ms in zip(targets, (10, 15), strict=True):
            make_run(s, "ar", target=target, requests=[_tpot_req("ar", 30, i) for i in range(2)])
            make_run(s, "spec", target=target, requests=[_tpot_req("spec", spec_ms, i) for i in range(2)])
        s.commit()
    engine.dispose()
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    table = _table(at, "speedup")
    assert list(table.columns[:2]) == ["target", "speedup"], list(table.columns)
    assert list(table["target"]) == list(targets)
    assert list(table.columns[2:]).index("workload") > list(table.columns[2:]).index("AR tokens/s")  # shared: last
    tile = _metric(at, "Speedup")
    assert "2 configurations (range), differing in target;" in tile.help, tile.help


def test_tokens_per_s_delta_is_one_like_for_like_comparison(two_temperatures, monkeypatch):
    """Pooled over both temperatures spec and AR tokens/s compare 0 with 0.8 mixed: no delta, and the help says
    why; within one temperature the delta is that speedup's, named."""
    at = open_page(app_for(two_temperatures, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    spec_tile = _metric(at, "Tokens/s", 0)
    assert not spec_tile.delta, spec_tile.delta
    assert "No change against AR shown: several speedup rows" in spec_tile.help

    at.sidebar.selectbox(key="f_temperature").set_value(0.0).run()
    assert_clean(at)
    (row,) = queries.speedups(open_store(two_temperatures), queries.Filters(temperature=0.0))
    spec_tile = _metric(at, "Tokens/s", 0)
    assert spec_tile.delta == f"{row.speedup - 1:+.0%} vs AR (temperature 0, bench)", spec_tile.delta
    assert "the Speedup's comparison (temperature 0, bench runs, the same 2 prompts)" in spec_tile.help


def test_tpot_and_cost_deltas_only_where_the_runs_in_view_are_one_comparable_group(two_temperatures, monkeypatch):
    """Pooled over both temperatures, spec's TPOT (10 and 40 ms) against AR's (30 and 20 ms) is no comparison:
    no delta on the TPOT and cost tiles, and their help names the groups; within one temperature each delta
    is there again, from the figures on the tiles."""
    at = open_page(app_for(two_temperatures, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    for label in ("TPOT p50", "TPOT p95", "Cost per 1M tokens"):
        tile = _metric(at, label, 0)
        assert not tile.delta, (label, tile.delta)
        assert "the runs in view span 2 comparable groups" in tile.help, (label, tile.help)
        assert "temperature 0, bench runs; workload code, temperature 0.8, bench runs" in tile.help, tile.help

    at.sidebar.selectbox(key="f_temperature").set_value(0.0).run()
    assert_clean(at)
    spec_tile, ar_tile = _metric(at, "TPOT p50", 0), _metric(at, "TPOT p50", 1)
    spec_ms, ar_ms = float(spec_tile.value.removesuffix(" ms")), float(ar_tile.value.removesuffix(" ms"))
    assert spec_tile.delta == f"{(spec_ms - ar_ms) / ar_ms:+.0%} vs AR", spec_tile.delta
    assert "comparable groups" not in spec_tile.help
    assert _metric(at, "Cost per 1M tokens", 0).delta


def test_run_groups_name_the_fields_where_groups_differ():
    def run(**kw):
        base = dict(workload="code", temperature=0.0, kind="bench", target="t", device="cpu", backend="torch",
                    dtype="bfloat16", top_p=1.0, top_k=0, max_new_tokens=None)
        return type("Run", (), base | kw)()

    assert costing.run_groups([run(), run()]) == ["workload code, temperature 0, bench runs"]
    assert costing.run_groups([run(), run(device="H100"), run(temperature=0.8)]) == [
        "workload code, temperature 0, bench runs, device cpu",
        "workload code, temperature 0, bench runs, device H100",
        "workload code, temperature 0.8, bench runs, device cpu",
    ]
    # top_k and top_p: in the text where they cut; named where the groups differ and the text would not say it
    assert costing.run_groups([run(temperature=0.8), run(temperature=0.8, top_k=40), run(temperature=0.8, top_k=None),
                               run(temperature=0.8, top_p=0.9)]) == [
        "workload code, temperature 0.8, bench runs, top_p 1, top_k 0",
        "workload code, temperature 0.8, top_k 40, bench runs, top_p 1",
        "workload code, temperature 0.8, top_k unknown, bench runs, top_p 1",
        "workload code, temperature 0.8, top_p 0.9, bench runs, top_k 0",
    ]


def test_projection_names_the_compared_group_in_the_dashboards_words(two_temperatures, monkeypatch):
    engine = open_store(two_temperatures)
    for page in ("Overview", "Cost & capacity"):
        at = open_page(app_for(two_temperatures, monkeypatch), PAGES[page])
        assert_clean(at)
        captions = [c.value for c in at.caption]
        said = [c for c in captions if "spec and ar compared at workload code, temperature" in c.lower()]
        assert len(said) == 1, captions
        assert "1 other comparable group in view" in said[0], said[0]
        # the sidebar boxes that tell the groups apart, and only those (no Invocation: the runs are of none)
        assert "(pick another with the sidebar's Temperature)" in said[0], said[0]
        assert not any("--temperature" in c or "--run-kind" in c for c in captions), captions
    # the Cost page's p95 tiles are those of the configurations the projection sizes, not all requests pooled
    sp = costing.project_from_store(engine, daily_tokens=500e6, peak_factor=2.0, sla_ms=50.0)
    m = metrics(at)
    assert m["p95 TPOT at capacity (AR)"] == [f"{ms_apart(sp.capacity_tpot_p95_ms_ar, 50.0)} ms"]
    assert m["p95 TPOT at capacity (spec)"] == [f"{ms_apart(sp.capacity_tpot_p95_ms_spec, 50.0)} ms"]
    at = open_page(app_for(two_temperatures, monkeypatch), PAGES["Overview"])
    assert f"configuration with p95 TPOT {ms_apart(sp.capacity_tpot_p95_ms_spec, 50.0)} ms" in _metric(at, "TPOT p95", 0).help
    assert f"configuration with p95 TPOT {ms_apart(sp.capacity_tpot_p95_ms_ar, 50.0)} ms" in _metric(at, "TPOT p95", 1).help
    at = open_page(app_for(two_temperatures, monkeypatch), PAGES["Cost & capacity"])
    cap = _metric(at, "Capacity AR (tokens/s per node)")
    assert f"p95 TPOT {sp.capacity_tpot_p95_ms_ar:.1f} ms" in cap.help


def test_one_temperature_offers_no_temperature_or_kind_filter_and_renders(sqlite_url, monkeypatch):
    fill_store(sqlite_url)
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    keys = {s.key for s in at.sidebar.selectbox}
    assert "f_temperature" not in keys and "f_kind" not in keys
    tile = _metric(at, "Speedup")
    assert "at temperature 0, bench runs, prompts not matched" in tile.help, tile.help
    captions = [c.value for c in at.caption]
    compared = [c for c in captions if "spec and AR compared at workload code, temperature 0, bench runs" in c]
    assert compared and "other comparable group" not in compared[0], captions


def test_run_kind_filter_keeps_one_kind(two_temperatures, monkeypatch):
    engine = open_store(two_temperatures)
    with Session(engine) as s:
        make_run(s, "ar", kind="loadtest", requests=[Req(33, ttft_ms=100, e2e_ms=900)])
        s.commit()
    engine.dispose()
    at = open_page(app_for(two_temperatures, monkeypatch), PAGES["Overview"])
    assert_clean(at)
    at.sidebar.selectbox(key="f_kind").set_value("loadtest").run()
    assert_clean(at)
    assert _metric(at, "Speedup").value == "—"  # a load test of AR alone: nothing to compare it with
    # the store has spec runs (bench ones): the filter leaves them out, not a bench left to run
    assert any(i.value.startswith("No speculative runs in view: the sidebar's filters leave out the store's ")
               and "widen them" in i.value for i in at.info), [i.value for i in at.info]


def _free_power_store(url: str) -> None:
    engine = open_store(url)
    snap = {"name": "cpu-2core", "node_hourly_usd": 0.0832, "usd_per_kwh": 0.0, "pue": 1.5}
    with Session(engine) as s:
        make_run(s, "ar", power_source="nvml", price_snapshot=snap,
                 requests=[Req(33, ttft_ms=100, e2e_ms=900, energy_j=50.0)])
        make_run(s, "spec", power_source="nvml", price_snapshot=snap,
                 requests=[spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, energy_j=30.0)])
        s.commit()
    engine.dispose()


def test_a_recorded_zero_per_kwh_is_the_runs_price(sqlite_url, monkeypatch):
    """$0/kWh recorded with the runs is their price (costing prices them at it), not 'the catalog's'."""
    _free_power_store(sqlite_url)
    engine = open_store(sqlite_url)
    run_costs, _ = costing.costs(engine)
    text = prices_text(run_costs, {})
    assert "electricity $0/kWh (recorded with the runs); PUE 1.5 (recorded with the runs)" in text, text
    sp = costing.project_from_store(engine, daily_tokens=1e6, peak_factor=1.0, sla_ms=100.0)
    assert "energy prices: $/kWh recorded by the runs; PUE recorded by the runs" in projection_notes(sp)
    sp = costing.project_from_store(engine, daily_tokens=1e6, peak_factor=1.0, sla_ms=100.0, usd_per_kwh=0.2)
    assert energy_prices_from(sp).startswith("$/kWh your input; PUE recorded by the runs")
    # the Cost page's fleet cost says the recorded prices priced it (it said "the catalog's" for any input left at 0)
    at = open_page(app_for(sqlite_url, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    captions = [c.value for c in at.caption]
    assert any("energy at $0/kWh (recorded with the runs) x PUE 1.5 (recorded with the runs)" in c
               for c in captions), captions


@pytest.fixture
def two_workloads(sqlite_url) -> str:
    """Spec and AR of `code` capped at 16 new tokens (spec 40 ms TPOT, AR 10 ms: spec dearer) and of `chat` capped
    at 12 (spec 10 ms, AR 40 ms: spec cheaper): two comparable groups that point opposite ways."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for workload, cap, ar_ms, spec_ms in (("code", 16, 10, 40), ("chat", 12, 40, 10)):
            for mode, ms in (("ar", ar_ms), ("spec", spec_ms)):
                make_run(s, mode, workload=workload, max_new_tokens=cap,
                         requests=[_tpot_req(mode, ms, i) for i in range(2)])
        s.commit()
    engine.dispose()
    return sqlite_url


POOLED = ("pool 2 comparable groups (workload code, temperature 0, bench runs, 16 new tokens; workload chat, "
          "temperature 0, bench runs, 12 new tokens)")


def _pooled_warnings(at) -> list[str]:
    return [w.value.replace("\\", "") for w in at.warning if "comparable groups" in w.value]


@pytest.mark.parametrize(("page", "figures"), [("Overview", "The speculative and AR tiles below"),
                                               ("Cost & capacity", "The speculative and AR bars below")])
def test_side_by_side_figures_say_they_pool_unlike_groups(two_workloads, monkeypatch, page, figures):
    """Spec and AR side by side, each pooled over `code` at 16 new tokens and `chat` at 12, where spec is dearer on
    one and cheaper on the other: the pooled pair says one thing for both. A warning above the figures names the
    groups and how to pick one (in the tiles' help alone it went unseen); one group in view: none."""
    at = open_page(app_for(two_workloads, monkeypatch), PAGES[page])
    assert_clean(at)
    [warning] = _pooled_warnings(at)
    assert warning.startswith(f"{figures} {POOLED}: each mode's figure mixes them"), warning
    assert "pick one with the sidebar (Workload, Temperature, top_p, top_k, Max new tokens" in warning
    assert "The projection compares within one of them" in warning

    at.sidebar.selectbox(key="f_workload").set_value("chat").run()
    assert_clean(at)
    assert not _pooled_warnings(at)


def test_the_monthly_cost_says_its_hours(two_workloads, monkeypatch):
    """A monthly cost is node-hours x 730: the tile says it is 730 hours a month (a year's 8,760 / 12)."""
    at = open_page(app_for(two_workloads, monkeypatch), PAGES["Cost & capacity"])
    assert_clean(at)
    for label in ("Monthly cost AR", "Monthly cost spec"):
        assert "x 730 hours a month (8,760 a year / 12)" in _metric(at, label).help


def test_the_missing_mode_caveat_says_how_to_choose_its_group_in_the_dashboards_words(sqlite_url):
    """AR and spec in two comparable groups (another device string, recorded by two benches): the projection's
    caveat says where the spec runs are and how to choose that group; on a page it names the sidebar's box that
    tells them apart (Invocation), not CLI flags, and the comparison's caption names the same box."""
    from app.dashboard.common import comparison_text, in_page_words

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        ar = make_run(s, "ar", device="cpu (2 cores)", requests=[_tpot_req("ar", 20, 0)])
        spec = make_run(s, "spec", device="cpu: AMD EPYC (2 threads)", requests=[_tpot_req("spec", 10, 0)])
        ar.invocation_id, spec.invocation_id = "a" * 32, "b" * 32
        s.commit()
    sp = costing.project_from_store(engine, daily_tokens=1e6, peak_factor=1, sla_ms=50)
    (caveat,) = [c for c in sp.caveats if "another comparable group" in c]
    assert "choose with --invocation ID" in caveat, caveat
    said = in_page_words(caveat)
    assert "to project that group, pick it with the sidebar's Invocation;" in said and "--invocation" not in said, said
    assert "(pick another with the sidebar's Invocation)" in comparison_text(sp), comparison_text(sp)
    engine.dispose()


def test_p95_tiles_keep_a_p95_on_its_side_of_the_sla():
    """The Cost page's "p95 TPOT at capacity" tiles and the Overview's help wrote a p95 to one decimal: 20.96 ms
    beside an SLA of 20.99 ms read "21.0 ms", as if it missed."""
    from app.dashboard.common import sla_ms_text

    assert sla_ms_text(20.96, 20.99) == "20.96 ms"
    assert sla_ms_text(21.02, 21.0) == "21.02 ms"
    assert sla_ms_text(12.5, 50.0) == "12.5 ms"
    assert sla_ms_text(None, 50.0) == "—"
