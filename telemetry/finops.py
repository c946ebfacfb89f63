"""FinOps math: pure functions, no SQL, no I/O. Every formula is the one the README's "Metric definitions" states.

    cost per 1M output tokens = (node $/h x node hours + energy kWh x PUE x $/kWh) / tokens x 1e6
    capacity at SLA           = highest measured tokens/s whose p95 TPOT <= SLA
    nodes needed              = ceil(daily tokens / 86,400 x peak factor / capacity)
    annual savings            = (nodes AR - nodes spec) x node $/h x 8,760
    monthly cost              = nodes x node $/h x 730 (hours a month: 8,760 / 12)
    speedup bound             = (1 - a^(K+1)) / ((1 - a)(K c + 1))     (Leviathan et al. 2023)
    measured speedup          <= mean acceptance length (x a margin for noise), else the AR timing was inflated

A figure that cannot be computed (no tokens, no energy measurement, no capacity) is None, with a reason
where the caller shows one; never 0 and never a ZeroDivisionError.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

SECONDS_PER_DAY = 86_400
HOURS_PER_YEAR = 8_760
HOURS_PER_MONTH = HOURS_PER_YEAR / 12  # 730
# what a monthly cost is, where one is shown (`project`, the dashboard): a month is a twelfth of a year
MONTHLY_COST_FORMULA = f"nodes x node $/h x {HOURS_PER_MONTH:g} hours a month ({HOURS_PER_YEAR:,} a year / 12)"
J_PER_KWH = 3.6e6
NOT_ATTAINABLE = "not attainable"
NOT_MEASURED = "not measured"  # a mode with no runs in view: no capacity to judge, not one short of the SLA
ENERGY_NOT_MEASURED = "energy not measured"


def _finite(name: str, value: float, *, minimum: float | None = None, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """Cost per 1M output tokens. `energy_usd_per_1m` is None when no energy was measured (or it cannot be
    priced: see `reason`); the total then holds the hardware part only and `energy_included` is False.
    `energy_estimated` marks an energy part in the total that came from an estimated power source (label it
    "(estimated)" wherever it is shown): never True without an energy part."""

    tokens: int
    hardware_usd_per_1m: float | None  # None when tokens == 0
    energy_usd_per_1m: float | None
    total_usd_per_1m: float | None
    energy_included: bool
    energy_estimated: bool
    reason: str | None = None  # why a figure is None


def cost_per_1m_tokens(
    node_hourly_usd: float,
    node_hours: float,
    energy_kwh: float | None,
    pue: float,
    usd_per_kwh: float,
    tokens: int,
    *,
    energy_estimated: bool = False,
    no_energy_reason: str = ENERGY_NOT_MEASURED,
) -> CostBreakdown:
    """(node $/h x node hours + kWh x PUE x $/kWh) / tokens x 1e6, split into hardware and energy parts."""
    _finite("node_hourly_usd", node_hourly_usd, minimum=0)
    _finite("node_hours", node_hours, minimum=0)
    return cost_per_1m_from_totals(
        node_hourly_usd * node_hours, energy_kwh, pue, usd_per_kwh, tokens, energy_estimated=energy_estimated,
        no_energy_reason=no_energy_reason,
    )


def cost_per_1m_from_totals(
    hardware_usd: float,
    energy_kwh: float | None,
    pue: float,
    usd_per_kwh: float,
    tokens: int,
    *,
    energy_estimated: bool = False,
    no_energy_reason: str = ENERGY_NOT_MEASURED,
) -> CostBreakdown:
    """The same cost per 1M tokens from a hardware dollar total (sum of node $/h x hours over several runs).
    Without `energy_kwh` the total is the hardware part, `no_energy_reason` says why, and nothing in it is
    estimated (`energy_estimated` applies to an energy part only)."""
    _finite("hardware_usd", hardware_usd, minimum=0)
    _finite("pue", pue, minimum=1)
    _finite("usd_per_kwh", usd_per_kwh, minimum=0)
    if energy_kwh is not None:
        _finite("energy_kwh", energy_kwh, minimum=0)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")
    if tokens == 0:
        return CostBreakdown(0, None, None, None, False, False, "no output tokens")
    hardware = hardware_usd / tokens * 1e6
    if energy_kwh is None:
        return CostBreakdown(tokens, hardware, None, hardware, False, False, no_energy_reason)
    energy = energy_kwh * pue * usd_per_kwh / tokens * 1e6
    return CostBreakdown(tokens, hardware, energy, hardware + energy, True, energy_estimated)


def energy_usd_per_1m(j_per_token: float | None, pue: float, usd_per_kwh: float) -> float | None:
    """Energy part of the cost per 1M tokens from a J/token figure; None when J/token is unknown."""
    if j_per_token is None:
        return None
    _finite("j_per_token", j_per_token, minimum=0)
    return (
        j_per_token
        * 1e6
        / J_PER_KWH
        * _finite("pue", pue, minimum=1)
        * _finite("usd_per_kwh", usd_per_kwh, minimum=0)
    )


def capacity_at_sla(points: Iterable[tuple[float, float | None]], sla_ms: float) -> float | None:
    """Highest tokens/s among (tokens_per_s, p95_tpot_ms) points whose p95 TPOT <= sla_ms.

    Points without a p95 TPOT (no multi-token request) cannot show they meet the SLA and are skipped.
    None when no point meets it ("not attainable").
    """
    _finite("sla_ms", sla_ms, minimum=0, strict=True)
    best: float | None = None
    for tps, p95 in points:
        if tps is None or p95 is None or not tps > 0:
            continue
        if p95 <= sla_ms and (best is None or tps > best):
            best = float(tps)
    return best


# Traffic far beyond any service's (the largest report ~1e13 tokens a day) and peaks far beyond any plan's: a
# value past these is a typo, and past them the node counts and dollars stop being numbers anyone reads
MAX_DAILY_TOKENS = 1e14
MAX_PEAK_FACTOR = 100.0
MAX_SLA_MS = 1e6  # a p95 TPOT SLA of 1,000 s per token: "no SLA" (1e6 is how one says it); past it, a typo
MIN_DAILY_TOKENS = 1.0  # a token a day: below it, cost per token of a whole node runs to infinity


def _validate_traffic(daily_tokens: float, peak_factor: float) -> None:
    _finite("daily_tokens", daily_tokens, minimum=MIN_DAILY_TOKENS)
    _finite("peak_factor", peak_factor, minimum=1)
    for name, value, maximum in (("daily_tokens", daily_tokens, MAX_DAILY_TOKENS),
                                 ("peak_factor", peak_factor, MAX_PEAK_FACTOR)):  # fmt: skip
        if value > maximum:
            raise ValueError(f"{name} must be at most {maximum:g}, got {value!r}")


def nodes_needed(daily_tokens: float, peak_factor: float, capacity_tokens_per_s: float | None) -> int | None:
    """ceil(daily / 86,400 x peak / capacity); None when the capacity is unknown or zero (not attainable)."""
    _validate_traffic(daily_tokens, peak_factor)
    if capacity_tokens_per_s is None:
        return None
    _finite("capacity_tokens_per_s", capacity_tokens_per_s, minimum=0)
    if capacity_tokens_per_s == 0:
        return None
    # round() guards against float noise turning an exact 16.0 into 16.000000000000004 -> 17; any traffic at all
    # needs a node, however small a share of one it fills (round() took 1e-10 of a node to 0)
    return max(1, math.ceil(round(daily_tokens / SECONDS_PER_DAY * peak_factor / capacity_tokens_per_s, 9)))


def annual_savings(nodes_ar: int | None, nodes_spec: int | None, node_hourly_usd: float) -> float | None:
    """(nodes AR - nodes spec) x node $/h x 8,760; None when either node count is unknown."""
    _finite("node_hourly_usd", node_hourly_usd, minimum=0)
    if nodes_ar is None or nodes_spec is None:
        return None
    return (nodes_ar - nodes_spec) * node_hourly_usd * HOURS_PER_YEAR


def monthly_cost(nodes: int | None, node_hourly_usd: float) -> float | None:
    """nodes x node $/h x 730 h (MONTHLY_COST_FORMULA); None when the node count is unknown."""
    _finite("node_hourly_usd", node_hourly_usd, minimum=0)
    return None if nodes is None else nodes * node_hourly_usd * HOURS_PER_MONTH


def speedup_bound(alpha: float, k: int, c: float) -> float:
    """Expected speedup of speculative decoding: (1 - a^(K+1)) / ((1 - a)(K c + 1)).

    alpha: acceptance rate in [0, 1]; k: lookahead depth >= 0; c: draft/target cost ratio >= 0.
    At alpha == 1 the limit (K + 1) / (K c + 1) is used.
    """
    _finite("alpha", alpha, minimum=0)
    if alpha > 1:
        raise ValueError(f"alpha must be <= 1, got {alpha!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    _finite("c", c, minimum=0)
    tokens_per_step = (k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens_per_step / (k * c + 1)


# A speculative step emits the mean acceptance length in tokens on average (the bonus token included) for at least
# one target forward (a verify over K + 1 tokens costs no less than a one-token forward; drafting only adds), so
# speculation cannot beat AR at the same concurrency by more than that length. A measured speedup above it, past
# this margin for noise, says the AR timing was inflated: the rule `calibrate` and every speedup shown beside money
# apply (`speedup_over_acceptance_text`).
MAX_SPEEDUP_OVER_ACCEPTANCE_LENGTH = 1.1
# what to do about such a speedup, where a bench or load test measured it
RERUN_QUIET = ("rerun on a quiet machine (bench --mode both takes AR and spec in turns at concurrency 1: a smaller "
               "--interleave has both modes share the load)")


def speedup_exceeds_acceptance(speedup: float | None, mean_acceptance_length: float | None) -> bool:
    """The measured `speedup` is more than MAX_SPEEDUP_OVER_ACCEPTANCE_LENGTH times the mean acceptance length of
    the spec runs it was measured on; False where either is unknown (nothing drafted, or no AR to compare)."""
    return (speedup is not None and mean_acceptance_length is not None
            and speedup > MAX_SPEEDUP_OVER_ACCEPTANCE_LENGTH * mean_acceptance_length)


def speedup_over_acceptance_text(speedup: float | None, mean_acceptance_length: float | None,
                                 advice: str = RERUN_QUIET) -> str | None:
    """Where `speedup_exceeds_acceptance`, why it cannot be, with both figures and `advice`; None where it can."""
    if not speedup_exceeds_acceptance(speedup, mean_acceptance_length):
        return None
    mal = mean_acceptance_length
    return (f"measured {speedup:.2f}x is above the mean acceptance length {mal:.2f} (by more than "
            f"{MAX_SPEEDUP_OVER_ACCEPTANCE_LENGTH - 1:.0%}): a speculative step emits {mal:.2f} tokens on average "
            "for at least one target forward, so it cannot beat AR by more than that; the AR timing was inflated "
            f"(likely a loaded machine or too few prompts): {advice}")


@dataclass(frozen=True, slots=True)
class Projection:
    """Node counts and costs for a traffic profile, AR vs speculative, at one node price.

    cost_per_1m_tokens_*_usd = provisioned node cost per day / daily tokens x 1e6, plus the energy part
    when a measured J/token was given (`energy_included_*`). None figures carry a reason in `notes`.
    """

    daily_tokens: float
    peak_factor: float
    sla_ms: float
    node_hourly_usd: float
    capacity_tokens_per_s_ar: float | None
    capacity_tokens_per_s_spec: float | None
    nodes_ar: int | None
    nodes_spec: int | None
    monthly_cost_ar_usd: float | None
    monthly_cost_spec_usd: float | None
    annual_savings_usd: float | None
    cost_per_1m_tokens_ar_usd: float | None
    cost_per_1m_tokens_spec_usd: float | None
    energy_included_ar: bool
    energy_included_spec: bool
    notes: tuple[str, ...]
    # whether the mode had runs to measure a capacity from: a node count of None is then "not attainable" (no run
    # meets the SLA), else "not measured" (no runs of the mode in view)
    measured_ar: bool = True
    measured_spec: bool = True


@dataclass(frozen=True, slots=True)
class SlaPoint:
    """Capacity and nodes per mode at one p95 TPOT SLA (None: no measured configuration meets it)."""

    sla_ms: float
    capacity_ar: float | None
    capacity_spec: float | None
    nodes_ar: int | None
    nodes_spec: int | None
    annual_savings_usd: float | None


def sla_curve(
    points_ar: Iterable[tuple[float, float | None]],
    points_spec: Iterable[tuple[float, float | None]],
    *,
    daily_tokens: float,
    peak_factor: float,
    node_hourly_usd: float,
) -> list[SlaPoint]:
    """The projection at every SLA where it can change: each measured p95 TPOT (of either mode) is where a
    configuration starts to meet the SLA, so capacities, nodes and savings are constant from one such
    value up to the next. Ascending by SLA. Tight SLAs favour the mode with the lower TPOT (speculation
    at low concurrency), loose ones the mode that batches best (AR at high concurrency)."""
    _validate_traffic(daily_tokens, peak_factor)
    _finite("node_hourly_usd", node_hourly_usd, minimum=0, strict=True)
    points_ar, points_spec = list(points_ar), list(points_spec)
    slas = sorted({float(p95) for tps, p95 in points_ar + points_spec
                   if tps is not None and tps > 0 and p95 is not None and p95 > 0})
    out = []
    for sla in slas:
        cap_ar, cap_spec = capacity_at_sla(points_ar, sla), capacity_at_sla(points_spec, sla)
        n_ar = nodes_needed(daily_tokens, peak_factor, cap_ar)
        n_spec = nodes_needed(daily_tokens, peak_factor, cap_spec)
        out.append(SlaPoint(sla, cap_ar, cap_spec, n_ar, n_spec, annual_savings(n_ar, n_spec, node_hourly_usd)))
    return out


def sla_steps(curve: list[SlaPoint], through_ms: float) -> list[SlaPoint]:
    """`curve` as a step plot draws it up to `through_ms`: its points, then the last one again at `through_ms`
    when that is looser. The last step holds for every looser SLA, so a chart that ends at the last measured
    p95 would show nothing at an SLA in use above it (the projection's own figures)."""
    _finite("through_ms", through_ms, minimum=0, strict=True)
    if not curve or through_ms <= curve[-1].sla_ms:
        return list(curve)
    return [*curve, replace(curve[-1], sla_ms=float(through_ms))]


def step_starts(curve: list[SlaPoint], mode: str) -> list[bool]:
    """For each point of `curve`, whether `mode` ('ar' or 'spec') steps there: one of its measured
    configurations starts to meet the SLA and raises its capacity. The curve has a point at every measured
    p95 of either mode, so at most points the other mode's configuration is what changed; a chart marks
    a mode's line only where that mode was measured. On `sla_steps`'s output the extension repeats the
    last point, so it never steps."""
    if mode not in ("ar", "spec"):
        raise ValueError(f"mode must be 'ar' or 'spec', got {mode!r}")
    caps = [getattr(p, f"capacity_{mode}") for p in curve]
    return [c is not None and (i == 0 or c != caps[i - 1]) for i, c in enumerate(caps)]


def spec_pays_below(curve: list[SlaPoint]) -> str | None:
    """One line on where speculation needs fewer nodes than AR along `curve`, or None when it never does, or
    when one mode has no measured configuration at all (nothing to compare: `sla_verdict` says so)."""
    if _unmeasured_mode(curve) is not None:
        return None
    wins = [(p.sla_ms, nxt.sla_ms if nxt else None) for p, nxt in zip(curve, [*curve[1:], None], strict=True)
            if p.nodes_spec is not None and (p.nodes_ar is None or p.nodes_spec < p.nodes_ar)]
    if not wins:
        return None
    spans = []
    for lo, hi in wins:  # merge adjacent ranges
        if spans and spans[-1][1] == lo:
            spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    text = ", ".join(f"{lo} ms and looser" if hi is None else f"{lo} up to {hi} ms" for lo, hi in _span_texts(spans))
    return f"speculation needs fewer nodes than AR at p95 TPOT SLAs of {text}"


def _span_texts(spans: list[tuple[float, float | None]]) -> list[tuple[str, str | None]]:
    """Each SLA range [lo, hi) as thresholds a user can type and get that result: lo rounded up (an SLA of lo
    meets the configuration's p95; "21.0" beside a p95 of 21.02 did not), hi rounded down to the last shown
    value below it (at hi the next configuration decides). One decimal, or as many (up to 6) as keep every
    range non-empty."""
    for places in range(1, 7):
        step = Decimal(1).scaleb(-places)
        out = []
        for lo, hi in spans:
            lo_d = Decimal(repr(lo)).quantize(step, rounding=ROUND_CEILING)
            if hi is None:
                out.append((str(lo_d), None))
                continue
            hi_d = Decimal(repr(hi)).quantize(step, rounding=ROUND_FLOOR)
            if hi_d == Decimal(repr(hi)):
                hi_d -= step
            out.append((str(lo_d), str(hi_d) if hi_d >= lo_d else None))
        if all(h is not None for (_, h), (_, hi) in zip(out, spans, strict=True) if hi is not None):
            return out
    return [(repr(lo), None if hi is None else f"below {hi!r}") for lo, hi in spans]


def ms_apart(value: float, other: float) -> str:
    """`value` in ms to one decimal, or to as many (up to 4) as keep it on its side of `other` ("38.83", not the
    "38.8" that reads as an SLA of 38.8 ms met; "50.04" beside 50.03, not "50.0"); else as Python writes it."""
    for places in range(1, 5):
        text = f"{value:.{places}f}"
        if (float(text) > other) == (value > other) and float(text) != other:
            return text
    return repr(value)


def _unmeasured_mode(curve: list[SlaPoint]) -> str | None:
    """'AR' or 'spec' where that mode meets no SLA of `curve` (it has no measured configuration: each measured
    p95 is a point of the curve, where its own configuration meets it); 'AR and spec' for an empty curve."""
    ar = any(p.nodes_ar is not None for p in curve)
    spec = any(p.nodes_spec is not None for p in curve)
    return None if ar and spec else "AR and spec" if not (ar or spec) else "spec" if ar else "AR"


def nodes_verdict(nodes_ar: int | None, nodes_spec: int | None) -> str | None:
    """The savings in words: which mode needs fewer nodes at the SLA, and by how many (a negative dollar
    figure alone left a reader to work out that speculation costs more); None where a mode has no count."""
    if nodes_ar is None or nodes_spec is None:
        return None
    if nodes_ar == nodes_spec:
        return f"both modes need {nodes_ar:,} node{'s' * (nodes_ar != 1)}: speculation saves no node"
    fewer = nodes_spec < nodes_ar
    n = abs(nodes_ar - nodes_spec)
    return (f"speculation needs {n:,} {'fewer' if fewer else 'more'} node{'s' * (n != 1)} than AR"
            + ("" if fewer else ": it costs more than it saves here"))


def sla_verdict(curve: list[SlaPoint]) -> str:
    """spec_pays_below's line, or that speculation never needs fewer nodes along `curve`, or that the modes
    were not compared (one has no measured configuration: no runs, or none that measured a p95 TPOT)."""
    missing = _unmeasured_mode(curve)
    if missing == "AR and spec":
        return "not compared: neither mode has a configuration with a measured p95 TPOT"
    if missing is not None:
        return f"not compared: no {missing} configuration with a measured p95 TPOT"
    return spec_pays_below(curve) or "speculation needs no fewer nodes than AR at any measured SLA"


def _cost_per_1m_projected(
    nodes: int | None, node_hourly_usd: float, daily_tokens: float, energy_part: float | None
) -> float | None:
    if nodes is None:
        return None
    hardware = nodes * node_hourly_usd * 24 / daily_tokens * 1e6
    return hardware + (energy_part or 0.0)


def project(
    *,
    daily_tokens: float,
    peak_factor: float,
    sla_ms: float,
    node_hourly_usd: float,
    points_ar: Iterable[tuple[float, float | None]],
    points_spec: Iterable[tuple[float, float | None]],
    j_per_token_ar: float | None = None,
    j_per_token_spec: float | None = None,
    pue: float = 1.0,
    usd_per_kwh: float = 0.0,
    unmeasured_why: dict[str, str] | None = None,
) -> Projection:
    """Capacity at SLA -> nodes -> monthly cost, annual savings and cost per 1M tokens, for AR and spec.

    points_*: (tokens_per_s, p95_tpot_ms) per measured run of that mode. j_per_token_*: measured J/token
    to add the energy part to the cost per 1M tokens (pass None when the priced hardware is not the
    measured hardware: that figure would not apply). unmeasured_why: mode -> why a mode without points has
    none, where the caller knows better than "no {mode} runs in view" (its runs are in another group).
    """
    _validate_traffic(daily_tokens, peak_factor)
    _finite("sla_ms", sla_ms, minimum=0, strict=True)
    _finite("node_hourly_usd", node_hourly_usd, minimum=0, strict=True)
    points_ar, points_spec = list(points_ar), list(points_spec)
    notes: list[str] = []
    caps = {}
    for mode, points in (("ar", points_ar), ("spec", points_spec)):
        caps[mode] = capacity_at_sla(points, sla_ms)
        if not points:
            why = (unmeasured_why or {}).get(mode) or f"no {mode} runs in view"
            notes.append(f"{mode}: {NOT_MEASURED}: {why}")
        elif caps[mode] is None:
            best = min((p for _, p in points if p is not None), default=None)
            why = "no run has a p95 TPOT" if best is None else f"best measured p95 TPOT is {ms_apart(best, sla_ms)} ms"
            notes.append(f"{mode}: {NOT_ATTAINABLE}: no run meets p95 TPOT <= {sla_ms:g} ms ({why})")
    n_ar = nodes_needed(daily_tokens, peak_factor, caps["ar"])
    n_spec = nodes_needed(daily_tokens, peak_factor, caps["spec"])
    savings = annual_savings(n_ar, n_spec, node_hourly_usd)
    if savings is None:
        missing = [m.upper() if m == "ar" else m for m, pts in (("ar", points_ar), ("spec", points_spec)) if not pts]
        where = " in the compared group" if missing and all(m.lower() in (unmeasured_why or {}) for m in missing) else ""
        why = f"no {' or '.join(missing)} runs measured{where}" if missing else "a node count is not attainable"
        notes.append(f"annual savings: not computed ({why})")
    e_ar = energy_usd_per_1m(j_per_token_ar, pue, usd_per_kwh)
    e_spec = energy_usd_per_1m(j_per_token_spec, pue, usd_per_kwh)
    return Projection(
        daily_tokens=float(daily_tokens),
        peak_factor=float(peak_factor),
        sla_ms=float(sla_ms),
        node_hourly_usd=float(node_hourly_usd),
        capacity_tokens_per_s_ar=caps["ar"],
        capacity_tokens_per_s_spec=caps["spec"],
        nodes_ar=n_ar,
        nodes_spec=n_spec,
        monthly_cost_ar_usd=monthly_cost(n_ar, node_hourly_usd),
        monthly_cost_spec_usd=monthly_cost(n_spec, node_hourly_usd),
        annual_savings_usd=savings,
        cost_per_1m_tokens_ar_usd=_cost_per_1m_projected(n_ar, node_hourly_usd, daily_tokens, e_ar),
        cost_per_1m_tokens_spec_usd=_cost_per_1m_projected(n_spec, node_hourly_usd, daily_tokens, e_spec),
        energy_included_ar=e_ar is not None and n_ar is not None,
        energy_included_spec=e_spec is not None and n_spec is not None,
        notes=tuple(notes),
        measured_ar=bool(points_ar),
        measured_spec=bool(points_spec),
    )
