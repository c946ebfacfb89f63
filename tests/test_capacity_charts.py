"""The cost and capacity charts (dashboard Cost & capacity page, and the report) show what they mark where they mark it.

Nodes by SLA: the projection's curve has a point at each measured p95 TPOT; its last step holds for every
looser SLA. An SLA in use looser than every measured p95 (the common case: 50 ms against runs of 27-37 ms)
must still show the node counts the KPIs above the chart state, with markers only on measured
configurations. Throughput by concurrency: the crossover's label sits on its line on the log axis."""

from __future__ import annotations

import pytest

from app.dashboard import charts
from telemetry.finops import sla_curve, step_starts
from telemetry.palette import MODE_COLOURS


@pytest.fixture
def curve():
    # spec: 37 tokens/s at p95 27 ms; AR: 26 tokens/s at p95 36.7 ms; 500M tokens a day at peak 2
    return sla_curve([(26.0, 36.7)], [(37.0, 27.0)], daily_tokens=5e8, peak_factor=2.0, node_hourly_usd=1.0)


def _trace(fig, name):
    [trace] = [t for t in fig.data if t.name == name]
    return trace


def test_dashboard_chart_draws_the_last_step_past_the_sla_in_use(curve):
    fig = charts.nodes_by_sla(curve, 50.0)
    ar, spec = _trace(fig, "AR baseline"), _trace(fig, "speculative")
    for trace, nodes in ((ar, curve[-1].nodes_ar), (spec, curve[-1].nodes_spec)):
        assert trace.x[-1] > 50.0 and trace.y[-1] == nodes  # the value at the SLA in use is drawn
    # a marker where the mode's own configuration starts to meet the SLA: spec at 27 ms, AR at 36.7 ms;
    # none where only the other mode was measured, none on the extension
    assert list(spec.marker.size) == [8, 0, 0] and list(ar.marker.size) == [0, 8, 0]
    assert ar.y[0] is None  # AR meets no SLA as tight as 27 ms: a gap, not zero
    assert fig.layout.yaxis.rangemode == "tozero"
    [label] = fig.layout.annotations
    assert label.text == "SLA in use: 50 ms" and label.yanchor == "bottom" and label.y == 0


def test_dashboard_chart_with_the_sla_inside_the_measured_range(curve):
    fig = charts.nodes_by_sla(curve, 30.0)  # tighter than the last p95: the curve still runs on past it
    assert _trace(fig, "speculative").x[-1] == pytest.approx(36.7 * 1.1)


def test_report_chart_draws_the_last_step_past_the_reports_sla(sqlite_url):
    from datetime import timedelta

    from telemetry.report import Window, build_report
    from telemetry.report_html import sla_chart
    from telemetry.store import open_store
    from tests.test_report import D0, add_day

    engine = open_store(sqlite_url)
    add_day(engine, D0)
    data = build_report(engine, Window("daily", D0, D0 + timedelta(days=1)), sla_ms=2000.0, history=1)
    points = data.projection.sla_curve
    assert points and points[-1].sla_ms < 2000.0
    fig = sla_chart(data, points)
    for trace in fig.data:
        mode = "spec" if trace.name.startswith("spec") else "ar"
        assert trace.x[-1] > 2000.0 and trace.y[-1] == getattr(points[-1], f"nodes_{mode}")
        assert trace.line.color == MODE_COLOURS[mode]  # the dashboard's colour for the mode (AR was grey here)
        starts = step_starts(points, mode)  # checked by hand in the test below
        assert list(trace.marker.size) == [8 if s else 0 for s in starts] + [0]
        assert any(starts)  # both modes were measured in this store
    assert fig.layout.yaxis.rangemode == "tozero"
    assert fig.layout.legend.y < -0.15 and fig.layout.margin.b >= 70  # below the x-axis title, not over it


def test_sweep_chart_labels_the_crossover_at_its_level_on_the_log_axis():
    """On a log axis an annotation's x is log10 of the value; the label must sit on the crossover line, not
    at 10^crossover (where it covered the legend and stretched the axis past the last level)."""
    import math

    points = [(1, 5.9, 8.0), (2, 6.9, 8.6), (4, 12.1, 10.3)]  # (concurrency, AR tokens/s, spec tokens/s)
    fig = charts.sweep(points, 4, "Throughput by concurrency")
    assert fig.layout.xaxis.type == "log"
    [line] = fig.layout.shapes
    assert line.x0 == line.x1 == 4  # a shape's x is the value itself
    [label] = fig.layout.annotations
    assert label.text == "crossover: 4" and label.x == pytest.approx(math.log10(4)) and label.yref == "paper"
    assert not charts.sweep(points, None, "t").layout.annotations  # no crossover: nothing marked


def test_step_starts_marks_where_each_mode_was_measured():
    # AR measured at 20 and 40 ms (the second slower per node than the first would allow: no step),
    # spec at 10 and 30 ms (the second with more capacity: a step)
    c = sla_curve([(30.0, 20.0), (25.0, 40.0)], [(20.0, 10.0), (45.0, 30.0)], daily_tokens=1e6, peak_factor=1.0,
                  node_hourly_usd=1.0)
    assert [p.sla_ms for p in c] == [10.0, 20.0, 30.0, 40.0]
    assert step_starts(c, "spec") == [True, False, True, False]
    assert step_starts(c, "ar") == [False, True, False, False]
    assert step_starts([], "ar") == []
    with pytest.raises(ValueError, match="mode must be 'ar' or 'spec'"):
        step_starts(c, "both")


def test_cost_chart_names_the_hardware_part_when_energy_was_not_measured():
    fig = charts.cost_split(["spec", "ar"], [0.31, 0.57], [None, None], [False, False])
    assert [t.name for t in fig.data] == ["hardware (node $/h x hours)"]
    assert fig.layout.showlegend is True  # a lone trace's legend is hidden unless asked for
    with_energy = charts.cost_split(["spec", "ar"], [0.31, 0.57], [0.02, None], [True, False])
    assert [t.name for t in with_energy.data] == ["hardware (node $/h x hours)", "energy (estimate)"]
    # a mode pooling metered and estimated runs is named as the Overview's tiles name it (it read "estimate")
    mixed = charts.cost_split(["spec", "ar"], [0.31, 0.57], [0.02, 0.03], [True, False], [True, False])
    assert [(t.name, list(t.y)) for t in mixed.data[1:]] == [("energy (measured)", [None, 0.03]),
                                                              ("energy (partly estimated)", [0.02, None])]
    assert mixed.data[2].marker.pattern.shape == "/"


def test_cost_chart_leaves_room_above_the_tallest_bar_for_its_label():
    """The AR bar's thin energy part labels itself above the bar; with plotly's own range the axis ended at
    the bar's top and the label was clipped by the plot edge and the legend."""
    fig = charts.cost_split(["spec", "ar"], [0.31, 0.57], [0.02, 0.03], [False, False])
    assert tuple(fig.layout.yaxis.range) == pytest.approx((0, charts.COST_HEADROOM * (0.57 + 0.03)))
    assert charts.COST_HEADROOM >= 1.1
    # only hardware: the room over its top; no cost at all: plotly's own axis (no range of 0 to 0)
    assert tuple(charts.cost_split(["ar"], [0.5], [None], [False]).layout.yaxis.range) == pytest.approx(
        (0, charts.COST_HEADROOM * 0.5))
    assert charts.cost_split(["ar"], [None], [None], [False]).layout.yaxis.range is None


def test_report_cost_chart_keeps_mode_colours_for_modes():
    """The report's stacked cost bars colour the parts of a cost, not the modes: the AR bar's hardware part
    was drawn in spec's blue. Estimated energy is hatched and named so; energy never measured draws nothing."""
    from types import SimpleNamespace

    from telemetry.finops import cost_per_1m_tokens
    from telemetry.palette import HARDWARE_COLOUR
    from telemetry.report_html import cost_chart

    def data(**costs):
        modes = {m: SimpleNamespace(cost=c) for m, c in costs.items()}
        return SimpleNamespace(current=SimpleNamespace(mode_costs=modes, priced_over=lambda mode: None))  # all priced

    spec = cost_per_1m_tokens(3.0, 1.0, 0.5, 1.2, 0.13, 1_000_000, energy_estimated=True)
    ar = cost_per_1m_tokens(3.0, 2.0, 1.0, 1.2, 0.13, 1_000_000, energy_estimated=True)
    fig = cost_chart(data(spec=spec, ar=ar))
    hardware, energy = fig.data
    assert hardware.marker.color == HARDWARE_COLOUR and HARDWARE_COLOUR not in MODE_COLOURS.values()
    assert energy.name == "energy (estimated)" and energy.marker.pattern.shape == "/"
    assert list(energy.y) == pytest.approx([0.5 * 1.2 * 0.13, 1.0 * 1.2 * 0.13])
    unmeasured = cost_per_1m_tokens(3.0, 1.0, None, 1.2, 0.13, 1_000_000)
    fig = cost_chart(data(spec=unmeasured, ar=unmeasured))
    assert [t.name for t in fig.data] == ["hardware"] and fig.layout.showlegend is True



def test_go_no_go_colours_judge_alpha_where_the_domain_has_it():
    """calibrate's verdict is on alpha (accepted / tested): a domain whose acceptance rate reads under the
    line while its alpha is over it is green, as calibrate would say GO; without steps, the rate decides."""
    fig = charts.alpha_by_domain(["code", "chat", "rewrite"], [0.47, 0.47, 0.70], [10, 10, 10], [0.68, 0.60, None])
    assert list(fig.data[0].marker.color) == ["#16a34a", "#dc2626", "#16a34a"]
    assert list(charts.alpha_by_domain(["code"], [0.47], [10]).data[0].marker.color) == ["#dc2626"]


def test_store_text_is_drawn_as_written_not_as_html():
    """Plotly renders a subset of HTML in ticks, trace names and text: a workload's domain or a node id holding
    `<a href=...>Admin</a>` became a link with other visible text on the dashboard and in the HTML report."""
    import pandas as pd

    evil = 'Z<a href="https://evil.example/dm">Adm</a>'
    fig = charts.alpha_by_domain([evil], [0.5], [3], [0.6])
    assert list(fig.data[0].x) == list(fig.data[1].x) == ['Z&lt;a href="https://evil.example/dm"&gt;Adm&lt;/a&gt;']
    frame = pd.DataFrame({"t": pd.to_datetime(["2026-12-02"]), "node_id": [evil], "device_index": [0],
                          "source": ["nvml"], "power_w": [100.0], "samples": [1]})
    (trace,) = charts.power(frame).data
    assert "<a" not in trace.name and trace.name.startswith("Z&lt;a href")
    from types import SimpleNamespace as NS

    from telemetry.report_html import acceptance_chart

    report = NS(domains=[NS(domain=evil, acceptance_rate=0.5, alpha=None)])
    assert list(acceptance_chart(report).data[0].x) == [list(fig.data[0].x)[0]]


def test_nodes_bar_says_why_a_mode_has_no_bar():
    """AR filtered out is not AR failing the SLA."""
    filtered = charts.nodes_bar(None, 5, {"spec"})
    assert [a.text for a in filtered.layout.annotations] == ["— no runs of this mode in view"]
    failing = charts.nodes_bar(None, 5, {"spec", "ar"})
    assert [a.text for a in failing.layout.annotations] == ["— not attainable at this SLA"]


def test_nodes_bar_with_no_node_count_says_the_sla_is_not_attainable_on_a_whole_node_axis():
    """Neither mode meeting the SLA drew an empty chart on an axis from -1 to 1 in steps of 0.5: the chart says
    the SLA is not attainable across it, on an axis of whole nodes from 0. A node count keeps whole ticks."""
    fig = charts.nodes_bar(None, None, {"spec", "ar"}, 50.0)
    said = [a.text for a in fig.layout.annotations]
    assert said.count("— not attainable at this SLA") == 2
    [plain] = [t for t in said if "SLA is not attainable" in t]
    assert plain == "The 50 ms p95 TPOT SLA is not attainable:<br>no measured configuration of either mode meets it"
    axis = fig.layout.yaxis
    assert axis.range[0] == 0 and axis.range[1] >= 1 and axis.dtick == 1 and axis.tickformat == ",d"
    # one mode filtered out: the other's SLA is what is not attainable, named
    only_spec = charts.nodes_bar(None, None, {"spec"}, 50.0)
    assert any(a.text.endswith("no measured speculative configuration meets it") for a in only_spec.layout.annotations)
    few = charts.nodes_bar(3, 1, {"spec", "ar"}, 50.0)
    assert few.layout.yaxis.range[0] == 0 and few.layout.yaxis.dtick == 1  # 0, 1, 2, 3: no 0.5 between
    assert not few.layout.annotations
    assert charts.nodes_bar(None, 5, {"spec", "ar"}).layout.yaxis.range[0] == 0
    many = charts.nodes_bar(233, 120, {"spec", "ar"})
    assert many.layout.yaxis.tickformat == ",d" and many.layout.yaxis.rangemode == "nonnegative"


def _alpha_labels(fig):
    [alpha] = [t for t in fig.data if t.name.startswith("alpha")]
    return alpha


@pytest.mark.parametrize("which", ["dashboard", "report"])
def test_alpha_labels_stay_clear_of_the_go_no_go_line(which):
    """Alpha at 0.63 and 0.64, labelled beside its diamond and the line's own label on the line, read struck
    through by the dashed line at 0.65: a label just under the line goes below its diamond, the others above;
    the line is named in the legend, not on the plot; the acceptance rate sits at the foot of its bar."""
    from types import SimpleNamespace as NS

    from telemetry.report_html import acceptance_chart

    names, rates, alphas = ["chat", "code", "rewrite", "qa"], [0.43, 0.44, 0.7, 0.1], [0.63, 0.64, 0.72, 0.12]
    if which == "dashboard":
        fig = charts.alpha_by_domain(names, rates, [3] * 4, alphas)
    else:
        fig = acceptance_chart(NS(domains=[NS(domain=n, acceptance_rate=r, alpha=a)
                                           for n, r, a in zip(names, rates, alphas, strict=True)]))
    alpha = _alpha_labels(fig)
    assert list(alpha.textposition) == ["bottom right", "bottom right", "top right", "top right"]
    assert alpha.cliponaxis is False and fig.layout.yaxis.range[1] > 1  # room for a label above 1
    assert not [a for a in fig.layout.annotations if "go/no-go" in (a.text or "")]
    [line] = fig.layout.shapes
    assert line.y0 == line.y1 == 0.65 and line.line.dash == "dash"
    [legend] = [t for t in fig.data if t.name.startswith("go/no-go")]
    assert legend.mode == "lines" and legend.line.dash == "dash" and legend.line.color == line.line.color
    if which == "dashboard":
        assert fig.data[0].insidetextanchor == "start"  # the rate at the bar's foot, far from the line


def test_report_cost_by_period_is_titled_per_1m_tokens(sqlite_url):
    from datetime import timedelta

    from telemetry.report import Window, build_report
    from telemetry.report_html import trend_chart
    from telemetry.store import open_store
    from tests.test_report import D0, add_day

    engine = open_store(sqlite_url)
    add_day(engine, D0)
    data = build_report(engine, Window("daily", D0, D0 + timedelta(days=1)), history=1)
    assert trend_chart(data).layout.yaxis.title.text == "USD per 1M output tokens"


def test_projection_notes_name_the_price_and_the_estimate_on_every_page():
    from types import SimpleNamespace as NS

    from app.dashboard.common import projection_notes, usd_rate

    sp = NS(projection=NS(notes=("spec: best of 2 configurations",)), priced_differs=True,
            node_price=NS(priced_as="H100 x8"), measured_on=("cpu (2 cores)",), energy_estimated=True,
            energy_estimated_ar=False, energy_estimated_spec=True, energy_partly_estimated_spec=True,
            replica_note=None)
    notes = projection_notes(sp)
    assert notes[0] == "spec: best of 2 configurations"
    assert "priced as H100 x8, measured on cpu (2 cores)" in notes[1]
    # whose energy is the estimate: spec's (pooled with metered runs), not AR's
    assert notes[2] == "the energy part of the projected cost is an estimate for spec (partly)"
    assert projection_notes(NS(**{**vars(sp), "priced_differs": False, "energy_estimated": False})) == notes[:1]
    assert (usd_rate(0.0832), usd_rate(98.32), usd_rate(None)) == ("$0.0832", "$98.32", "—")


def test_sweeps_follow_the_sidebar_filters():
    """A sweep on another node, of another workload, or of none of the picked runs is not shown."""
    from app.dashboard.filters import sweeps_in_view
    from telemetry.queries import Filters

    a = {"id": 1, "node": "n1", "workload": "mixed", "run_ids": (1, 2)}
    b = {"id": 2, "node": "n2", "workload": "code", "run_ids": (3, 4)}
    ids = lambda f: [s["id"] for s in sweeps_in_view([a, b], f)]  # noqa: E731
    assert ids(Filters()) == [1, 2]
    assert ids(Filters(node_id="n2")) == [2] and ids(Filters(workload="mixed")) == [1]
    assert ids(Filters(run_ids=(2, 9))) == [1] and ids(Filters(run_ids=(9,))) == []


def test_models_shown_by_their_directory_name():
    from app.dashboard.filters import pair_label, short_model

    assert short_model("/root/.cache/specfinops/models/smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert short_model("/models/llama/") == "llama"
    assert short_model("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"  # a hub id stays whole
    assert short_model(None) is None
    assert pair_label("/a/b/smollm2", "feature:draft") == "smollm2 ← feature:draft"


def test_projection_notes_say_a_node_holds_n_replicas():
    from types import SimpleNamespace as NS

    from app.dashboard.common import projection_notes
    from telemetry.costing import StoreProjection

    def replica_note(n, spans=1):  # the property itself, on a stand-in with what it reads
        return StoreProjection.replica_note.fget(NS(gpus_per_node=n, replicas_per_node=n // spans, device_gpus=spans))

    sp = NS(projection=NS(notes=()), priced_differs=False, energy_estimated=False, replica_note=replica_note(8))
    assert projection_notes(sp) == ["capacity per node = 8 x the measured device (a node of 8 GPUs holds 8 "
                                    "replicas of it; the measured tokens/s are per device)"]
    assert projection_notes(NS(**{**vars(sp), "replica_note": replica_note(1)})) == []
    # a device over 8 GPUs (vLLM, tensor parallel): a node of 16 holds 2 of it
    assert replica_note(16, spans=8) == ("capacity per node = 2 x the measured device (a node of 16 GPUs holds 2 "
                                         "replicas of it; the measured tokens/s are per device, 8 GPUs)")
    assert replica_note(8, spans=8) is None  # the node is the device itself
