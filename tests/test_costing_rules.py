"""Costing rules the audit of session 36 found broken: recorded energy prices ($0/kWh is a price), projections
that compare spec and AR only within comparable configurations, speedups keyed on temperature and run kind."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session
from synthetic import BASE_TIME, Req, make_run, spec_req

from app.cli import main
from telemetry.costing import NO_CHOOSE, costs, project_from_store, run_cost
from telemetry.queries import Filters
from telemetry.report import report_choose
from telemetry.store import open_store


def _snap_run(s, mode: str, snap: dict) -> None:
    req = (Req(33, ttft_ms=100, e2e_ms=900, energy_j=50.0) if mode == "ar"
           else spec_req(33, 4, 24, ttft_ms=100, e2e_ms=500, energy_j=30.0))
    make_run(s, mode, power_source="nvml", price_snapshot=snap, requests=[req])


def test_recorded_free_electricity_prices_the_runs_and_the_projection(sqlite_url, capsys):
    """$0/kWh is a price (own solar, a flat lease): a run that recorded it is costed at it (it was ignored as
    <= 0); a PUE below 1 is not one. The projection prices energy at the runs' recorded prices when they all
    agree (it used the catalog's), and says which it used."""
    engine = open_store(sqlite_url)
    snap = {"name": "cpu-2core", "node_hourly_usd": 0.0832, "usd_per_kwh": 0.0, "pue": 1.5}
    with Session(engine) as s:
        _snap_run(s, "ar", snap)
        _snap_run(s, "spec", snap)
        s.commit()
    run_costs, modes = costs(engine)
    assert {(rc.usd_per_kwh, rc.pue) for rc in run_costs} == {(0.0, 1.5)}
    assert all(mc.cost.energy_included and mc.cost.energy_usd_per_1m == 0.0 for mc in modes)
    kw = {"daily_tokens": 1e6, "peak_factor": 1.0, "sla_ms": 100.0}
    sp = project_from_store(engine, **kw)
    assert (sp.usd_per_kwh, sp.pue) == (0.0, 1.5)
    assert sp.energy_prices_from == "$/kWh recorded by the runs; PUE recorded by the runs"
    assert sp.projection.cost_per_1m_tokens_ar_usd == pytest.approx(1 * 0.0832 * 24 / 1e6 * 1e6)  # no energy $
    sp = project_from_store(engine, usd_per_kwh=0.2, **kw)
    assert sp.usd_per_kwh == 0.2 and sp.energy_prices_from.startswith("$/kWh given (--usd-per-kwh)")
    assert main(["project", "--db", sqlite_url, "--daily-tokens", "1e6", "--peak-factor", "1",
                 "--p95-tpot-sla-ms", "100"]) == 0
    assert "PUE 1.5, $0/kWh ($/kWh recorded by the runs; PUE recorded by the runs)" in capsys.readouterr().out

    with Session(engine) as s:  # a third run recorded other prices, one of them not a PUE: the catalog's
        _snap_run(s, "ar", {**snap, "usd_per_kwh": 0.3, "pue": 0.5})
        s.commit()
    run_costs, _ = costs(engine)
    assert (run_costs[-1].usd_per_kwh, run_costs[-1].pue) == (0.3, 1.2)  # PUE 0.5 ignored: the catalog's 1.2
    sp = project_from_store(engine, **kw)
    assert (sp.usd_per_kwh, sp.pue) == (0.13, 1.2)
    assert sp.energy_prices_from == ("$/kWh from the catalog (the runs recorded different ones); PUE from the "
                                     "catalog (not every run recorded a valid one)")


def _tpot_req(mode: str, tpot_ms: float, start_s: float = 0.0):
    """33 tokens with the given TPOT after a 100 ms first token."""
    e2e = 100 + 32 * tpot_ms
    if mode == "ar":
        return Req(33, ttft_ms=100, e2e_ms=e2e, start_s=start_s)
    return spec_req(33, 4, 20, ttft_ms=100, e2e_ms=e2e, start_s=start_s)


@pytest.fixture
def two_temperatures(sqlite_url) -> str:
    """At temperature 0 spec meets a 50 ms SLA (10 ms) and AR does not (60 ms); at 0.8 AR does (20 ms) and spec
    does not (80 ms). 0.8 has two requests per mode, 0 one."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", temperature=0.0, requests=[_tpot_req("ar", 60)])
        make_run(s, "spec", temperature=0.0, requests=[_tpot_req("spec", 10)])
        make_run(s, "ar", temperature=0.8, requests=[_tpot_req("ar", 20), _tpot_req("ar", 20, 1.0)])
        make_run(s, "spec", temperature=0.8, requests=[_tpot_req("spec", 80), _tpot_req("spec", 80, 3.0)])
        s.commit()
    return sqlite_url


PROJECT = ["--daily-tokens", "8.64e6", "--peak-factor", "1", "--p95-tpot-sla-ms", "50"]


def test_project_names_the_target_it_compared_where_another_group_has_another(sqlite_url, capsys):
    """Two groups that differ only in the target model: the chosen group's label named neither target, so the
    line read as if the other group's target were the one projected."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for target, n in (("m/big", 3), ("m/small", 2)):  # m/big: more requests, chosen by the rule
            for mode in ("ar", "spec"):
                make_run(s, mode, target=target, requests=[_tpot_req(mode, 20, i) for i in range(n)])
        s.commit()
    assert main(["project", "--db", sqlite_url, *PROJECT]) == 0
    text = capsys.readouterr().out
    assert "spec and AR compared at workload code, temperature 0, bench runs, target m/big (" in text, text
    assert "1 other comparable group in view (workload code, temperature 0, bench runs, target m/small)" in text
    assert main(["project", "--db", sqlite_url, *PROJECT, "--target", "m/small"]) == 0
    text = capsys.readouterr().out  # one group in view: nothing to tell it from
    assert "spec and AR compared at workload code, temperature 0, bench runs (" in text, text


def test_project_compares_modes_at_one_temperature_and_says_which(two_temperatures, capsys):
    """AR's capacity came from its temperature-0.8 runs and spec's from its temperature-0 runs: savings from two
    measurements that compare nothing, with no word on the temperatures. Now both modes are sized within one
    comparable group, picked by the documented rule (0.8: its less-measured mode has more requests) and named."""
    assert main(["project", "--db", two_temperatures, *PROJECT, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    c = out["assumptions"]["compared"]
    assert (c["temperature"], c["kind"], c["workload"]) == (0.8, "bench", "code")
    assert (c["requests_ar"], c["requests_spec"]) == (2, 2)
    assert c["other_groups"] == ["workload code, temperature 0, bench runs"]
    assert out["assumptions"]["capacity_runs_ar"] == [3] and out["nodes_spec"] is None  # spec misses at 0.8
    assert out["annual_savings_usd"] is None
    assert main(["project", "--db", two_temperatures, *PROJECT]) == 0
    text = capsys.readouterr().out
    assert "spec and AR compared at workload code, temperature 0.8, bench runs" in text
    assert "1 other comparable group in view (workload code, temperature 0, bench runs)" in text

    assert main(["project", "--db", two_temperatures, *PROJECT, "--temperature", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["assumptions"]["compared"]["temperature"] == 0.0
    assert out["assumptions"]["compared"]["other_groups"] == []
    assert out["assumptions"]["capacity_runs_spec"] == [2] and out["nodes_ar"] is None
    assert main(["project", "--db", two_temperatures, *PROJECT, "--temperature", "0.5"]) == 2
    assert "no runs with temperature 0.5 (temperatures in the store: 0, 0.8)" in capsys.readouterr().err
    assert main(["cost", "--db", two_temperatures, "--temperature", "0", "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]] == [1, 2]


def test_load_test_runs_are_not_pooled_with_bench_runs(sqlite_url, capsys):
    """A load test's client-side runs of the same workload and temperature made one configuration with a
    bench's runs (and one group in the projection): they are their own now, chosen by --run-kind."""
    from telemetry.queries import config_summaries

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[_tpot_req("ar", 20)])
        make_run(s, "spec", requests=[_tpot_req("spec", 10)])
        make_run(s, "ar", kind="loadtest", requests=[_tpot_req("ar", 40), _tpot_req("ar", 40, 2.0)])
        make_run(s, "spec", kind="loadtest", requests=[_tpot_req("spec", 30), _tpot_req("spec", 30, 2.0)])
        s.commit()
    assert sorted((c.mode, c.kind, c.run_ids) for c in config_summaries(engine)) == [
        ("ar", "bench", (1,)), ("ar", "loadtest", (3,)), ("spec", "bench", (2,)), ("spec", "loadtest", (4,))]
    sp = project_from_store(engine, daily_tokens=8.64e6, peak_factor=1.0, sla_ms=50.0)
    assert sp.comparison.kind == "loadtest" and sp.capacity_runs_ar == (3,)
    assert main(["project", "--db", sqlite_url, *PROJECT, "--run-kind", "bench", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["compared"]["kind"] == "bench" and a["capacity_runs_ar"] == [1] and a["capacity_runs_spec"] == [2]


def test_another_comparable_group_is_named_by_what_differs(sqlite_url):
    """Two groups of one workload, temperature and run kind on two targets read the same ('1 other comparable
    group in view (workload code, temperature 0, bench runs)'): the other is now named by its target."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        for target, n in (("demo/small", 3), ("demo/large", 1)):
            make_run(s, "ar", target=target, requests=[Req(33, ttft_ms=100, e2e_ms=900, start_s=i) for i in range(n)])
            make_run(s, "spec", target=target,
                     requests=[spec_req(33, 4, 20, ttft_ms=100, e2e_ms=500, start_s=i) for i in range(n)])
        s.commit()
    sp = project_from_store(engine, daily_tokens=1e6, peak_factor=1.0, sla_ms=1000.0)
    assert sp.comparison.target == "demo/small"
    assert sp.comparison.others == ("workload code, temperature 0, bench runs, target demo/large",)


def test_a_turn_stopped_before_its_first_token_is_timed_alike_by_capacity_cost_and_speedup(sqlite_url):
    """A bench interrupted at the start of a spec turn leaves a cancelled run: one request, 5 s, no token. The
    mode's cost and the speedup left its 5 s out (no tokens to price or compare), the pooled tokens/s behind
    `project`'s capacity, the report's modes table and the dashboard counted it: 10.4 against 6.9 tokens/s for
    the same runs, a 2.00x speedup beside a 1.33x capacity ratio."""
    from telemetry.queries import config_summaries, mode_summaries, speedups

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "ar", requests=[Req(26, ttft_ms=100, e2e_ms=5000, start_s=5.0 * i) for i in range(4)])
        make_run(s, "spec", requests=[spec_req(26, 4, 12, ttft_ms=100, e2e_ms=2500, start_s=2.5 * i)
                                      for i in range(4)])
        make_run(s, "spec", status="cancelled", requests=[Req(0, ttft_ms=None, e2e_ms=5000, status="cancelled")])
        s.commit()
    _, modes = costs(engine, node_hourly_usd=1.0)
    cost_tps = {m.mode: m.tokens_per_s for m in modes}
    assert cost_tps["spec"] == pytest.approx(104 / 10.0) and cost_tps["ar"] == pytest.approx(104 / 20.0)
    assert {m.mode: m.stats.tokens_per_s for m in mode_summaries(engine)} == pytest.approx(cost_tps)
    assert {c.mode: c.stats.tokens_per_s for c in config_summaries(engine)} == pytest.approx(cost_tps)
    (speedup,) = speedups(engine)
    assert speedup.speedup == pytest.approx(2.0)
    p = project_from_store(engine, daily_tokens=1e6, peak_factor=1.0, sla_ms=5000.0, node_hourly_usd=1.0)
    assert p.projection.capacity_tokens_per_s_spec == pytest.approx(cost_tps["spec"])


def test_tokens_whose_runs_have_no_wall_time_are_not_timed_by_a_run_without_tokens(sqlite_url):
    """The only spec run with tokens has no wall time (no request span; its start is its end); a cancelled one
    without tokens has 5 s: the pooled tokens/s was those tokens over the other run's 5 s, not unknown."""
    from telemetry.queries import mode_summaries

    engine = open_store(sqlite_url)
    with Session(engine) as s:
        make_run(s, "spec", requests=[Req(26, ttft_ms=None, e2e_ms=None)], ended_at=BASE_TIME)
        make_run(s, "spec", status="cancelled", requests=[Req(0, ttft_ms=None, e2e_ms=5000, status="cancelled")],
                 started_at=BASE_TIME + timedelta(minutes=1))
        s.commit()
    (spec,) = mode_summaries(engine)
    assert spec.stats.output_tokens == 26 and spec.stats.tokens_per_s is None, spec.stats


def test_a_servers_idle_time_goes_to_the_runs_whose_span_covers_it(db_url):
    """An A/B hour on a server (AR busy from 0 to 1 h, spec's first request at 0), then spec alone until its
    request at 9 h 59 min: the nine idle hours were shared by busy time across both runs, and AR, which ended after
    one hour, was charged $9.75 of the node's $10. Idle time goes to the runs whose own span covers it: AR pays
    its busy hour (less the 30 s it shared), spec the rest; together the node's ten hours."""
    engine = open_store(db_url)
    snap = {"name": "cpu-2core", "node_hourly_usd": 1.0, "usd_per_kwh": 0.1, "pue": 1.5}
    serve = {"kind": "serve", "workload": "serve", "temperature": None, "price_snapshot": snap}
    with Session(engine) as s:
        make_run(s, "ar", **serve, requests=[Req(100, e2e_ms=60000, start_s=t) for t in range(0, 3600, 60)])
        make_run(s, "spec", **serve, requests=[spec_req(101, 4, 60, e2e_ms=60000, start_s=t) for t in (0, 35940)])
        s.commit()
    by_id = {rc.run.run_id: rc for rc in costs(engine)[0]}
    usd = {i: rc.cost.hardware_usd_per_1m * rc.run.stats.output_tokens / 1e6 for i, rc in by_id.items()}
    assert usd[1] == pytest.approx((3600 - 30) / 3600)  # AR: its hour, half of the first minute shared
    assert usd[2] == pytest.approx((30 + 60 + 32340) / 3600)  # spec: its two minutes' share and the idle hours
    assert sum(usd.values()) == pytest.approx(10.0)
    # the cost CSV says what share of its wall time each run is priced over (wall_s x $/h is not its cost here)
    from telemetry.export import ExportWindow, cost_rows

    header, rows = cost_rows(engine, ExportWindow())
    share = {row[header.index("run_id")]: row[header.index("node_share")] for row in rows}
    assert share[1] == pytest.approx((3600 - 30) / 3600) and share[2] == pytest.approx(32430 / 36000)


def test_a_servers_domains_split_each_runs_node_share_and_add_up_to_the_node(db_url):
    """A server's two runs share its node (each its half of the hour) and each run served two domains: under a
    domain filter a run is priced over the domain's part of its node share, so the two domains of a run add up
    to the run's unfiltered hardware cost, and all four to the node's one hour, not more."""
    engine = open_store(db_url)
    snap = {"name": "cpu-2core", "node_hourly_usd": 1.0, "usd_per_kwh": 0.1, "pue": 1.5}
    serve = {"kind": "serve", "workload": "serve", "temperature": None, "price_snapshot": snap}
    # 60 s requests alternating between the modes; in each mode code takes two turns out of three
    spec_starts, ar_starts = range(0, 3600, 120), range(60, 3600, 120)

    def domain(i: int) -> str:
        return "chat" if i % 3 == 2 else "code"

    with Session(engine) as s:
        make_run(s, "spec", **serve, requests=[spec_req(101, 4, 60, e2e_ms=60000, start_s=t, domain=domain(i))
                                               for i, t in enumerate(spec_starts)])
        make_run(s, "ar", **serve, requests=[Req(100, e2e_ms=60000, start_s=t, domain=domain(i))
                                             for i, t in enumerate(ar_starts)])
        s.commit()

    def hardware_usd(filters: Filters | None = None) -> dict[int, float]:
        return {rc.run.run_id: rc.cost.hardware_usd_per_1m * rc.run.stats.output_tokens / 1e6
                for rc in costs(engine, filters)[0]}

    whole, code, chat = hardware_usd(), hardware_usd(Filters(domain="code")), hardware_usd(Filters(domain="chat"))
    assert whole[1] == pytest.approx(0.5) and whole[2] == pytest.approx(0.5)
    for run_id in (1, 2):
        assert code[run_id] + chat[run_id] == pytest.approx(whole[run_id])
        assert code[run_id] == pytest.approx(2 * chat[run_id])  # two of its three turns, as busy as each other
    assert sum(code.values()) + sum(chat.values()) == pytest.approx(1.0)


def test_a_servers_spec_and_ar_runs_share_its_nodes_time(db_url, capsys):
    """`specfinops serve` keeps one run per mode open on one node, their requests interleaved: each was priced over
    its own span, so one node-hour at $0.0832 was charged $0.1636. The node's time is shared (while n requests are
    in flight, k of a run's, k / n of it; idle gaps to the runs whose span covers them): the two runs'
    hardware adds up to the node's span x its price, under --mode spec too. A server run on another node, or one
    whose span overlaps no other, keeps its own span."""
    engine = open_store(db_url)
    snap = {"name": "cpu-2core", "node_hourly_usd": 0.0832, "usd_per_kwh": 0.1, "pue": 1.5}
    serve = {"kind": "serve", "workload": "serve", "temperature": None, "price_snapshot": snap}
    with Session(engine) as s:
        # 60 s requests alternating between the modes every 60 s, over one hour (0 .. 3600 s)
        make_run(s, "spec", **serve, requests=[spec_req(101, 4, 60, e2e_ms=60000, start_s=t)
                                               for t in range(0, 3600, 120)])
        make_run(s, "ar", **serve, requests=[Req(100, e2e_ms=60000, start_s=t) for t in range(60, 3600, 120)])
        # the same server on another node: alone there, it is priced over its own span (600 s)
        make_run(s, "ar", **serve, node_id="node-b", requests=[Req(100, e2e_ms=60000, start_s=t)
                                                               for t in range(0, 600, 120)])
        s.commit()

    def hardware_usd(rc) -> float:
        return rc.cost.hardware_usd_per_1m * rc.run.stats.output_tokens / 1e6

    run_costs, modes = costs(engine)
    by_id = {rc.run.run_id: rc for rc in run_costs}
    assert by_id[1].run.stats.wall_s == by_id[2].run.stats.wall_s == 3540.0  # throughput keeps each run's span
    assert hardware_usd(by_id[1]) + hardware_usd(by_id[2]) == pytest.approx(0.0832)  # one node-hour, not two
    assert hardware_usd(by_id[1]) == pytest.approx(0.0832 / 2)  # as busy as the other: half of it
    assert hardware_usd(by_id[3]) == pytest.approx(0.0832 * 540 / 3600)  # node-b: its own span
    mode_usd = {mc.mode: mc.cost.hardware_usd_per_1m * mc.output_tokens / 1e6 for mc in modes}
    assert sum(mode_usd.values()) == pytest.approx(0.0832 * (3600 + 540) / 3600)
    spec_alone, = costs(engine, Filters(mode="spec"))[0]  # the other mode's run still holds its share
    assert hardware_usd(spec_alone) == pytest.approx(0.0832 / 2)
    assert run_cost(engine, 2).cost.hardware_usd_per_1m == pytest.approx(by_id[2].cost.hardware_usd_per_1m)
    assert main(["cost", "--db", db_url, "--json"]) == 0
    runs = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert sum(r["hardware_usd_per_1m"] * r["output_tokens"] / 1e6 for i, r in runs.items() if i != 3) \
        == pytest.approx(0.0832)


def _bench(s, mode: str, device: str, n: int, invocation: str | None, **kw):
    run = make_run(s, mode, device=device, requests=[_tpot_req(mode, 20, i) for i in range(n)], **kw)
    run.invocation_id = invocation
    return run


AR_BENCH, SPEC_BENCH, HOT_BENCH = ("a" * 32, "b" * 32, "c" * 32)


def _two_device_groups(engine, ar_invocation: str | None, spec_invocation: str | None, *, ar: dict | None = None,
                       spec: dict | None = None) -> None:
    """Two AR runs on 'cpu (2 cores)' and a spec run on 'cpu: AMD EPYC (2 threads)': two comparable groups that
    differ in the device string, one of each mode (`ar`, `spec`: more make_run settings of each)."""
    with Session(engine) as s:
        for _ in range(2):
            _bench(s, "ar", "cpu (2 cores)", 3, ar_invocation, **(ar or {}))
        _bench(s, "spec", "cpu: AMD EPYC (2 threads)", 2, spec_invocation, **(spec or {}))
        s.commit()


def test_project_says_a_missing_modes_runs_are_in_another_group_and_how_to_choose_it(sqlite_url, capsys):
    """AR recorded by one bench on one device string, spec by another bench on another of the same node: two
    comparable groups, one of each mode. `project` said "the spec runs are missing (none in view)" and "no spec
    runs in view" though they were, and told to choose with --temperature ... or --node, none of which selects
    either group. It now says where the spec runs are and offers only --invocation, which does."""
    engine = open_store(sqlite_url)
    _two_device_groups(engine, AR_BENCH, SPEC_BENCH)
    assert main(["project", "--db", sqlite_url, *PROJECT]) == 0
    text = capsys.readouterr().out
    assert "none in view" not in text and "no spec runs in view" not in text, text
    assert "the spec runs in view (2 requests) are in another comparable group" in text, text
    assert "spec: not measured: its runs in view are in another comparable group" in text, text
    assert "to project that group, choose with --invocation ID" in text, text
    assert "1 other comparable group in view" in text and "(choose with --invocation ID)" in text, text
    said = re.sub(r"`specfinops bench [^`]*`", "", text)  # the bench command to record both modes
    for flag in ("--temperature", "--node", "--top-p", "--workload", "--target", "--run-kind"):
        assert flag not in said, (flag, text)
    assert "annual savings: not computed (no spec runs measured in the compared group)" in text, text
    # groups that a filter does tell apart: that filter is offered, with --invocation
    with Session(engine) as s:
        _bench(s, "ar", "cpu (2 cores)", 1, HOT_BENCH, temperature=0.8, top_k=0)
        s.commit()
    assert main(["project", "--db", sqlite_url, *PROJECT]) == 0
    text = capsys.readouterr().out
    assert "choose with --temperature or --invocation ID" in text, text
    assert "--node" not in text and "--top-p" not in text, text


def test_project_offers_no_invocation_where_the_groups_runs_have_none(sqlite_url, capsys):
    """Runs of no invocation (a server's; recorded before the store kept invocations) on one node, in two groups
    that differ in the device string only: --invocation ID selects neither, nor does any other filter: it was
    offered all the same. It says no filter selects one, and the dashboard names the sidebar's Runs."""
    from app.dashboard.common import NO_CHOOSE_HERE, comparison_text, in_page_words

    engine = open_store(sqlite_url)
    _two_device_groups(engine, None, None)
    assert main(["project", "--db", sqlite_url, *PROJECT]) == 0
    text = capsys.readouterr().out
    assert "--invocation" not in text and "choose with" not in text, text
    assert "no `project` filter selects another alone" in text, text
    sp = project_from_store(engine, daily_tokens=1e6, peak_factor=1, sla_ms=50)
    (caveat,) = [c for c in sp.caveats if "another comparable group" in c]
    assert NO_CHOOSE_HERE in in_page_words(caveat) and "`project`" not in in_page_words(caveat), caveat
    assert NO_CHOOSE_HERE in comparison_text(sp), comparison_text(sp)
    assert report_choose(sp.comparison) == NO_CHOOSE
    # Comparison.text puts the way to choose in parentheses: NO_CHOOSE (and the dashboard's) had its own, "...))"
    for said in (sp.comparison.text(), comparison_text(sp), sp.comparison.text(report_choose(sp.comparison))):
        choose = re.search(r"has the most requests \((.*)\)$", said)
        assert choose and "(" not in choose[1] and ")" not in choose[1], said
    engine.dispose()


def test_project_offers_node_where_server_runs_of_two_groups_are_on_two_nodes(sqlite_url, capsys):
    """A server's AR runs on node-a and its spec runs on node-b, on two device strings: two comparable groups,
    runs of no invocation. --node node-b selects the spec group: it is offered (it never was), --invocation ID
    (which selects neither) is not; on the dashboard, the sidebar's Node."""
    from app.dashboard.common import comparison_text, in_page_words

    engine = open_store(sqlite_url)
    kw = {"kind": "serve", "temperature": None, "top_p": None, "top_k": None}
    _two_device_groups(engine, None, None, ar={"node_id": "node-a", **kw},
                       spec={"node_id": "node-b", "hostname": "host-b", **kw})
    assert main(["project", "--db", sqlite_url, *PROJECT]) == 0
    text = capsys.readouterr().out
    assert "to project that group, choose with --node NODE" in text, text
    assert "(choose with --node NODE)" in text and "--invocation" not in text, text
    sp = project_from_store(engine, daily_tokens=1e6, peak_factor=1, sla_ms=50)
    (caveat,) = [c for c in sp.caveats if "another comparable group" in c]
    assert "to project that group, pick it with the sidebar's Node;" in in_page_words(caveat), caveat
    assert "(pick another with the sidebar's Node)" in comparison_text(sp), comparison_text(sp)
    assert report_choose(sp.comparison) == "`specfinops project --node NODE` projects another"
    engine.dispose()
    assert main(["project", "--db", sqlite_url, *PROJECT, "--node", "node-b"]) == 0  # the flag does select it
    text = capsys.readouterr().out
    assert "on cpu: AMD EPYC (2 threads); 2 spec and 0 AR requests" in text, text
