"""FinOps formulas against hand computations (telemetry/finops.py: pure functions)."""

from __future__ import annotations

import math

import pytest

from telemetry.finops import (
    annual_savings,
    capacity_at_sla,
    cost_per_1m_tokens,
    energy_usd_per_1m,
    monthly_cost,
    nodes_needed,
    project,
    sla_curve,
    sla_steps,
    sla_verdict,
    spec_pays_below,
    speedup_bound,
)

# ---- cost per 1M tokens ---------------------------------------------------------------------------------


def test_cost_per_1m_tokens_hardware_and_energy_parts():
    # $2/h x 0.5 h = $1 over 250k tokens -> $4 per 1M; 0.3 kWh x 1.5 x $0.10 = $0.045 -> $0.18 per 1M
    c = cost_per_1m_tokens(2.0, 0.5, 0.3, 1.5, 0.10, 250_000)
    assert c.hardware_usd_per_1m == pytest.approx(4.0)
    assert c.energy_usd_per_1m == pytest.approx(0.18)
    assert c.total_usd_per_1m == pytest.approx(4.18)
    assert c.energy_included and not c.energy_estimated and c.reason is None


def test_cost_per_1m_tokens_unknown_energy_is_none_not_zero():
    c = cost_per_1m_tokens(8.806, 1.0, None, 1.2, 0.13, 1_000_000, energy_estimated=True)
    assert c.hardware_usd_per_1m == pytest.approx(8.806)
    assert c.energy_usd_per_1m is None
    assert c.total_usd_per_1m == pytest.approx(8.806)
    assert not c.energy_included and not c.energy_estimated  # nothing estimated is in the total
    assert c.reason == "energy not measured"
    c = cost_per_1m_tokens(1.0, 1.0, None, 1.2, 0.13, 1000, no_energy_reason="estimated energy for 1 of 2 runs")
    assert c.reason == "estimated energy for 1 of 2 runs"


def test_cost_per_1m_tokens_estimated_flag_is_carried():
    assert cost_per_1m_tokens(1.0, 1.0, 0.1, 1.2, 0.1, 1000, energy_estimated=True).energy_estimated


def test_cost_per_1m_tokens_zero_tokens_gives_none_with_reason():
    c = cost_per_1m_tokens(6.88, 1.0, 0.5, 1.2, 0.13, 0)
    assert (c.hardware_usd_per_1m, c.energy_usd_per_1m, c.total_usd_per_1m) == (None, None, None)
    assert c.reason == "no output tokens"


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((-1.0, 1.0, None, 1.2, 0.1, 10), "node_hourly_usd"),
        ((1.0, -1.0, None, 1.2, 0.1, 10), "node_hours"),
        ((1.0, 1.0, -0.1, 1.2, 0.1, 10), "energy_kwh"),
        ((1.0, 1.0, None, 0.9, 0.1, 10), "pue"),
        ((1.0, 1.0, None, 1.2, -0.1, 10), "usd_per_kwh"),
        ((1.0, 1.0, None, 1.2, 0.1, -5), "tokens"),
        ((1.0, 1.0, None, 1.2, 0.1, 2.5), "tokens"),
        ((math.nan, 1.0, None, 1.2, 0.1, 10), "node_hourly_usd"),
    ],
)
def test_cost_per_1m_tokens_rejects_bad_input_naming_it(args, name):
    with pytest.raises(ValueError, match=name):
        cost_per_1m_tokens(*args)


def test_energy_usd_per_1m_from_j_per_token():
    # 3.6 J/token x 1e6 tokens = 3.6e6 J = 1 kWh; x PUE 1.2 x $0.10 = $0.12
    assert energy_usd_per_1m(3.6, 1.2, 0.10) == pytest.approx(0.12)
    assert energy_usd_per_1m(None, 1.2, 0.10) is None


# ---- capacity, nodes, savings ----------------------------------------------------------------------------


def test_capacity_at_sla_takes_best_throughput_meeting_the_sla():
    points = [(100.0, 40.0), (200.0, 60.0), (150.0, 50.0), (300.0, None)]
    assert capacity_at_sla(points, 50.0) == 150.0  # 200 misses, 300 has no TPOT to show
    assert capacity_at_sla(points, 60.0) == 200.0
    assert capacity_at_sla(points, 30.0) is None  # not attainable
    assert capacity_at_sla([], 50.0) is None
    assert capacity_at_sla([(0.0, 10.0)], 50.0) is None  # zero throughput is no capacity


@pytest.mark.parametrize("sla", [0, -1.0, math.inf])
def test_capacity_at_sla_rejects_bad_sla(sla):
    with pytest.raises(ValueError, match="sla_ms"):
        capacity_at_sla([(1.0, 1.0)], sla)


def test_nodes_needed_hand_computed():
    # 864,000 tokens/day = 10 tokens/s average, x2 peak = 20 tokens/s, / 7 per node = 2.86 -> 3
    assert nodes_needed(864_000, 2.0, 7.0) == 3
    # exactly 16.0 nodes must stay 16 (no float noise pushing it to 17)
    assert nodes_needed(16 * 1000 * 86_400, 1.0, 1000.0) == 16
    assert nodes_needed(16 * 1000 * 86_400, 1.0, 1800.0) == 9  # 8.89 -> 9
    assert nodes_needed(1, 1.0, 1000.0) == 1
    # a billionth of a node's capacity is still a node (rounding to 9 places took it to 0 nodes and $0)
    assert nodes_needed(1, 1.0, 1e9) == 1


def test_nodes_needed_zero_or_unknown_capacity_is_not_attainable():
    assert nodes_needed(86_400, 1.0, 0.0) is None
    assert nodes_needed(86_400, 1.0, None) is None


@pytest.mark.parametrize(
    ("daily", "peak", "cap", "name"),
    [
        (0, 1.0, 10.0, "daily_tokens"),
        (1e-305, 1.0, 10.0, "daily_tokens must be >= 1"),  # a whole node's cost over it: $inf per 1M
        (-5, 1.0, 10.0, "daily_tokens"),
        (100, 0.5, 10.0, "peak_factor"),
        (100, 1.0, -1.0, "capacity_tokens_per_s"),
        (1e15, 1.0, 10.0, "daily_tokens must be at most 1e\\+14"),  # past them, figures no one reads (or inf)
        (100, 1e308, 10.0, "peak_factor must be at most 100"),
    ],
)
def test_nodes_needed_rejects_bad_input(daily, peak, cap, name):
    with pytest.raises(ValueError, match=name):
        nodes_needed(daily, peak, cap)


def test_case_study_16_to_9_nodes_saves_about_540k_a_year():
    savings = annual_savings(16, 9, 8.806)
    assert savings == pytest.approx(7 * 8.806 * 8760)
    assert savings == pytest.approx(539_983.92, abs=0.01)
    assert round(savings, -4) == 540_000


def test_annual_savings_and_monthly_cost_edge_cases():
    assert annual_savings(None, 9, 8.806) is None
    assert annual_savings(5, 7, 1.0) == pytest.approx(-2 * 8760)  # spec costing more is shown, not hidden
    assert monthly_cost(3, 2.0) == pytest.approx(3 * 2.0 * 730)
    assert monthly_cost(None, 2.0) is None
    with pytest.raises(ValueError, match="node_hourly_usd"):
        annual_savings(2, 1, -1.0)


# ---- speedup bound ----------------------------------------------------------------------------------------


def test_speedup_bound_hand_computed():
    # (1 - 0.8^5) / (0.2 x (4 x 0.05 + 1)) = 0.67232 / 0.24
    assert speedup_bound(0.8, 4, 0.05) == pytest.approx(0.67232 / 0.24)
    assert speedup_bound(0.8, 4, 0.05) == pytest.approx(2.801333, rel=1e-6)
    assert speedup_bound(0.0, 4, 0.1) == pytest.approx(1 / 1.4)  # nothing accepted: pure overhead
    assert speedup_bound(0.7, 0, 0.3) == pytest.approx(1.0)  # K = 0 is AR


def test_speedup_bound_alpha_one_is_the_limit():
    assert speedup_bound(1.0, 4, 0.05) == pytest.approx(5 / 1.2)
    assert speedup_bound(1.0 - 1e-9, 4, 0.05) == pytest.approx(speedup_bound(1.0, 4, 0.05), rel=1e-6)


@pytest.mark.parametrize(
    ("alpha", "k", "c", "name"),
    [
        (1.1, 4, 0.1, "alpha"),
        (-0.1, 4, 0.1, "alpha"),
        (0.5, -1, 0.1, "k"),
        (0.5, 1.5, 0.1, "k"),
        (0.5, 4, -0.1, "c"),
    ],
)
def test_speedup_bound_rejects_bad_input(alpha, k, c, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        speedup_bound(alpha, k, c)


# ---- projection -------------------------------------------------------------------------------------------


def test_project_case_study_numbers_agree_with_each_other():
    daily = 16 * 1000 * 86_400  # 16 nodes of 1000 tokens/s at peak factor 1
    p = project(
        daily_tokens=daily,
        peak_factor=1.0,
        sla_ms=50.0,
        node_hourly_usd=8.806,
        points_ar=[(1000.0, 38.0), (1400.0, 70.0)],  # the faster AR point misses the SLA
        points_spec=[(1800.0, 14.0)],
    )
    assert (p.capacity_tokens_per_s_ar, p.capacity_tokens_per_s_spec) == (1000.0, 1800.0)
    assert (p.nodes_ar, p.nodes_spec) == (16, 9)
    assert p.annual_savings_usd == pytest.approx((16 - 9) * 8.806 * 8760)
    assert p.monthly_cost_ar_usd == pytest.approx(16 * 8.806 * 730)
    assert p.monthly_cost_spec_usd == pytest.approx(9 * 8.806 * 730)
    assert p.cost_per_1m_tokens_ar_usd == pytest.approx(16 * 8.806 * 24 / daily * 1e6)
    assert p.cost_per_1m_tokens_spec_usd == pytest.approx(9 * 8.806 * 24 / daily * 1e6)
    assert not p.energy_included_ar and p.notes == ()


def test_project_adds_measured_energy_part():
    p = project(
        daily_tokens=86_400,
        peak_factor=1.0,
        sla_ms=50.0,
        node_hourly_usd=1.0,
        points_ar=[(1.0, 10.0)],
        points_spec=[(2.0, 10.0)],
        j_per_token_ar=3.6,
        pue=1.2,
        usd_per_kwh=0.10,
    )
    # AR: 1 node x $1 x 24 h / 86,400 tokens x 1e6 = $277.78, + 3.6 J/token -> $0.12
    assert p.cost_per_1m_tokens_ar_usd == pytest.approx(24 / 86_400 * 1e6 + 0.12)
    assert p.energy_included_ar and not p.energy_included_spec
    assert p.cost_per_1m_tokens_spec_usd == pytest.approx(24 / 86_400 * 1e6)


def test_project_unreachable_sla_and_missing_mode_are_explained():
    p = project(
        daily_tokens=1e6,
        peak_factor=2.0,
        sla_ms=10.0,
        node_hourly_usd=3.0,
        points_ar=[(100.0, 25.0)],
        points_spec=[],
    )
    assert p.nodes_ar is None and p.nodes_spec is None and p.annual_savings_usd is None
    assert p.cost_per_1m_tokens_ar_usd is None
    assert any("ar: not attainable" in n and "25.0 ms" in n for n in p.notes)
    assert any("spec: not measured: no spec runs in view" in n for n in p.notes)
    assert "annual savings: not computed (no spec runs measured)" in p.notes


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"daily_tokens": 0}, "daily_tokens"),
        ({"peak_factor": 0.9}, "peak_factor"),
        ({"sla_ms": 0}, "sla_ms"),
        ({"node_hourly_usd": 0}, "node_hourly_usd"),
    ],
)
def test_project_validates_inputs(kw, name):
    args = dict(
        daily_tokens=1e6, peak_factor=1.0, sla_ms=50.0, node_hourly_usd=1.0, points_ar=[], points_spec=[]
    )
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        project(**args)


# ---- nodes by SLA -----------------------------------------------------------------------------------------


def test_sla_curve_steps_at_each_measured_p95_by_hand():
    """AR: 30 tokens/s at p95 40 ms (one stream), 90 at 60 ms (a batch). Spec: 50 at 25 ms, 80 at 70 ms.
    Traffic: 86,400 x 100 tokens a day, peak 1 -> 100 tokens/s -> nodes = ceil(100 / capacity)."""
    ar, spec = [(30.0, 40.0), (90.0, 60.0)], [(50.0, 25.0), (80.0, 70.0)]
    curve = sla_curve(ar, spec, daily_tokens=8_640_000, peak_factor=1.0, node_hourly_usd=1.0)
    got = [(c.sla_ms, c.capacity_ar, c.capacity_spec, c.nodes_ar, c.nodes_spec) for c in curve]
    assert got == [
        (25.0, None, 50.0, None, 2),   # only speculation meets 25 ms
        (40.0, 30.0, 50.0, 4, 2),      # ceil(100/30) = 4 vs 2
        (60.0, 90.0, 50.0, 2, 2),      # AR's batch meets it
        (70.0, 90.0, 80.0, 2, 2),
    ]
    assert curve[0].annual_savings_usd is None
    assert curve[1].annual_savings_usd == pytest.approx(2 * 8_760)
    assert spec_pays_below(curve) == "speculation needs fewer nodes than AR at p95 TPOT SLAs of 25.0 up to 59.9 ms"


def test_spec_pays_below_names_separate_ranges_and_an_open_end():
    ar, spec = [(100.0, 30.0), (10.0, 50.0)], [(200.0, 20.0)]
    # SLA 20: spec only; 30: AR 100 < spec 200 capacity? nodes: ceil(100/100)=1 vs ceil(100/200)=1 -> tie
    curve = sla_curve(ar, spec, daily_tokens=8_640_000, peak_factor=1.0, node_hourly_usd=1.0)
    assert [(c.nodes_ar, c.nodes_spec) for c in curve] == [(None, 1), (1, 1), (1, 1)]
    assert spec_pays_below(curve) == "speculation needs fewer nodes than AR at p95 TPOT SLAs of 20.0 up to 29.9 ms"
    # spec ahead at the loosest SLA too: an open end
    curve = sla_curve([(10.0, 30.0)], [(20.0, 40.0)], daily_tokens=8_640_000, peak_factor=1.0, node_hourly_usd=1.0)
    assert spec_pays_below(curve) == "speculation needs fewer nodes than AR at p95 TPOT SLAs of 40.0 ms and looser"
    # AR never worse: nothing to say
    curve = sla_curve([(100.0, 10.0)], [(50.0, 20.0)], daily_tokens=8_640_000, peak_factor=1.0, node_hourly_usd=1.0)
    assert spec_pays_below(curve) is None


def test_spec_pays_below_shows_thresholds_a_user_can_type_and_get_that_result():
    """A spec p95 of 21.02 ms read "SLAs of 21.0 ms and looser" beside `project --sla-ms 21.0` saying spec is
    not attainable (best 21.02 ms): the lower bound rounds up, the upper one down to below the next step
    (at 60.0 ms AR's batch ties it), and a range narrower than a tenth keeps the decimals it needs."""
    kw = {"daily_tokens": 8_640_000, "peak_factor": 1.0, "node_hourly_usd": 1.0}
    curve = sla_curve([(10.0, 35.4)], [(20.0, 21.0234)], **kw)
    line = spec_pays_below(curve)
    assert line == "speculation needs fewer nodes than AR at p95 TPOT SLAs of 21.1 ms and looser"
    assert capacity_at_sla([(20.0, 21.0234)], 21.0) is None and capacity_at_sla([(20.0, 21.0234)], 21.1) == 20.0
    # spec wins from 25.04 up to (not at) 60.0, where AR's batch ties it
    curve = sla_curve([(30.0, 40.0), (90.0, 60.0)], [(50.0, 25.04), (80.0, 70.0)], **kw)
    assert spec_pays_below(curve) == "speculation needs fewer nodes than AR at p95 TPOT SLAs of 25.1 up to 59.9 ms"
    # spec wins only between 21.02 and 21.08: "21.1 up to 21.0" would be empty
    curve = sla_curve([(10.0, 35.4), (90.0, 21.08)], [(50.0, 21.02)], **kw)
    assert spec_pays_below(curve) == "speculation needs fewer nodes than AR at p95 TPOT SLAs of 21.02 up to 21.07 ms"


def test_the_verdict_compares_nothing_where_one_mode_has_no_measured_configuration():
    """A store of spec runs only read "speculation needs fewer nodes than AR at p95 TPOT SLAs of 13.1 ms and
    looser" (AR meeting no SLA counted as a spec win at every one), one of AR runs only "no fewer nodes"."""
    spec_only = sla_curve([], [(50.0, 13.1)], daily_tokens=8_640_000, peak_factor=1.0, node_hourly_usd=1.0)
    assert spec_pays_below(spec_only) is None
    assert sla_verdict(spec_only) == "not compared: no AR configuration with a measured p95 TPOT"
    ar_only = sla_curve([(50.0, 13.1)], [(None, 20.0)], daily_tokens=8_640_000, peak_factor=1.0, node_hourly_usd=1.0)
    assert sla_verdict(ar_only) == "not compared: no spec configuration with a measured p95 TPOT"
    assert sla_verdict([]) == "not compared: neither mode has a configuration with a measured p95 TPOT"
    both = sla_curve([(100.0, 10.0)], [(50.0, 20.0)], daily_tokens=8_640_000, peak_factor=1.0, node_hourly_usd=1.0)
    assert sla_verdict(both) == "speculation needs no fewer nodes than AR at any measured SLA"


def test_sla_curve_skips_points_without_a_p95_or_throughput_and_checks_inputs():
    curve = sla_curve([(30.0, None), (0.0, 20.0)], [(None, 30.0)], daily_tokens=1e6, peak_factor=1.0,
                      node_hourly_usd=1.0)
    assert curve == []
    with pytest.raises(ValueError, match="peak_factor"):
        sla_curve([], [], daily_tokens=1e6, peak_factor=0.5, node_hourly_usd=1.0)


def test_sla_steps_hold_the_last_step_out_to_a_looser_sla():
    ar, spec = [(30.0, 40.0)], [(50.0, 25.0)]
    curve = sla_curve(ar, spec, daily_tokens=8_640_000, peak_factor=1.0, node_hourly_usd=1.0)
    steps = sla_steps(curve, 55.0)  # the SLA in use (50 ms) lies past the last measured p95 (40 ms)
    assert steps[:2] == curve
    assert [(s.sla_ms, s.nodes_ar, s.nodes_spec) for s in steps[2:]] == [(55.0, 4, 2)]
    assert steps[2].annual_savings_usd == curve[-1].annual_savings_usd
    assert sla_steps(curve, 40.0) == curve and sla_steps(curve, 30.0) == curve  # nothing looser to draw
    assert sla_steps([], 50.0) == []
    with pytest.raises(ValueError, match="through_ms"):
        sla_steps(curve, float("nan"))


def test_the_sla_note_keeps_the_best_p95_on_its_side_of_the_sla():
    """"no run meets p95 TPOT <= 38.8 ms (best measured p95 TPOT is 38.8 ms)": the best, 38.83, rounded onto
    the SLA; likewise 50.04 beside an SLA of 50.03."""
    from telemetry.finops import ms_apart

    assert ms_apart(38.83, 38.8) == "38.83"
    assert ms_apart(50.04, 50.03) == "50.04"
    assert ms_apart(38.84, 38.83) == "38.84"
    assert ms_apart(12.3, 50.0) == "12.3"
    assert float(ms_apart(38.80001, 38.8)) == 38.80001
