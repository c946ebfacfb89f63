"""Cost per run and per mode (node price x wall hours + energy), and node projections from the measured
runs. Built on the SQL summaries of `telemetry.queries` and the pure math of `telemetry.finops`: the
CLI, the dashboard and the reports all price runs here, so every figure has one implementation."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from telemetry.db import Run
from telemetry.finops import (
    ENERGY_NOT_MEASURED,
    HOURS_PER_MONTH,
    HOURS_PER_YEAR,
    J_PER_KWH,
    MONTHLY_COST_FORMULA,
    NOT_ATTAINABLE,
    NOT_MEASURED,
    CostBreakdown,
    Projection,
    SlaPoint,
    capacity_at_sla,
    cost_per_1m_from_totals,
    cost_per_1m_tokens,
    project,
    sla_curve,
)
from telemetry.prices import (
    NodePrice,
    NoPriceError,
    PriceCatalog,
    _snapshot_price,
    catalog_name_for_device,
    device_gpus,
    energy_prices,
    get_price,
    gpu_chip,
    load_catalog,
    own_price_text,
    resolve_node_price,
    snapshot_energy,
)
from telemetry.queries import (
    COMPARED_FIELDS,
    CONFIG_FIELDS,
    MODES,
    ConfigSummary,
    Filters,
    RunSummary,
    Speedup,
    _ratio,
    above_acceptance_text,
    config_summaries,
    cutoff_matches,
    cutoffs_text,
    effective_cutoffs,
    empty_store_hint,
    failed_span_s,
    field_text,
    key_of,
    record_both,
    run_summaries,
    serve_node_shares,
    speedups,
    target_is,
    target_matches,
    varying_fields,
    workload_is,
    workload_matches,
)


@dataclass(frozen=True, slots=True)
class RunCost:
    run: RunSummary
    node_price: NodePrice
    measured_on: str
    priced_differs: bool  # say "priced as X, measured on Y"
    usd_per_kwh: float
    pue: float
    cost: CostBreakdown
    # the part of the run's wall seconds its hardware is priced over: a server run that shared its node with the
    # other mode's run is priced over its share of the node's time (queries.serve_node_shares); 1 otherwise
    node_share: float = 1.0


@dataclass(frozen=True, slots=True)
class ModeCost:
    mode: str
    run_ids: tuple[int, ...]
    output_tokens: int
    wall_s: float | None
    tokens_per_s: float | None
    priced_as: tuple[str, ...]
    measured_on: tuple[str, ...]
    cost: CostBreakdown
    # runs with output tokens, and how many of them have an energy figure (the mode's total adds energy
    # only when every one has: a share of the runs' energy over all of their tokens would under-price it)
    runs_with_tokens: int = 0
    runs_with_energy: int = 0


MEASURED, ESTIMATED, PARTLY_ESTIMATED = "measured", "estimated", "partly estimated"
# Why a cost holds no energy although the runs measured (or estimated) some: they are priced as other hardware
# than they ran on (NodePrice.differs_from), and energy measured on one device is not the energy of another.
_OTHER_HARDWARE = "energy left out: priced as other hardware than measured"


def energy_other_hardware(source: str | None) -> str:
    """'measured energy left out: priced as other hardware than measured' ('estimated ...', 'partly estimated
    ...': `source`, energy_source of the runs whose energy is left out; measured where None)."""
    return f"{source or MEASURED} {_OTHER_HARDWARE}"


def is_energy_other_hardware(reason: str | None) -> bool:
    """Whether a cost's reason is energy_other_hardware's, whatever the energy's source."""
    return reason is not None and reason.endswith(_OTHER_HARDWARE) and \
        reason.removesuffix(_OTHER_HARDWARE).strip() in (MEASURED, ESTIMATED, PARTLY_ESTIMATED)


ENERGY_OTHER_HARDWARE = energy_other_hardware(MEASURED)
# Why a run's cost holds no energy although it has some: only some of its requests have an energy figure.
SOME_REQUESTS = "energy for only some requests"
WALL_UNKNOWN = "wall time unknown"  # a run with tokens but no request span: nothing prices its hours
# How `cost` and `project` price runs no catalog entry covers (`unpriced_text`; other callers give their own)
UNPRICED_FLAGS = ("leave these runs out with a filter (--invocation, --node, --run), or price every run in view as "
                  "one device; pass --gpu NAME or --node-hourly-usd X")


def energy_source(runs: Iterable[RunSummary]) -> str | None:
    """Where the energy figures of `runs` come from: 'measured' (a meter: NVML, RAPL), 'estimated' (a TDP power
    model), 'partly estimated' (some runs of each, pooled); None when none of them has an energy figure."""
    estimated = {r.stats.energy_estimated for r in runs if r.stats.energy_j is not None}
    if not estimated:
        return None
    return PARTLY_ESTIMATED if len(estimated) == 2 else ESTIMATED if True in estimated else MEASURED


def cost_basis_text(total: float | None, *, energy_included: bool, source: str | None, partial: bool,
                    note: str | None, priced_over: str | None = None) -> str:
    """What a mode's measured cost per 1M tokens holds, in the words every surface writes beside it (the report's
    tiles, its e-mail): 'incl. energy', 'incl. energy (estimated)' or '(partly estimated)', 'hardware only (...)'
    with why. A total without energy must not read as the full cost, nor one with estimated energy as measured.

    `source`: where the energy in the total comes from (`energy_source`: measured, estimated, partly estimated);
    `partial`: some of the mode's requests have an energy figure and some do not; `note`: why the total is missing
    or hardware only (the report's `cost_note`: 'energy not measured', 'measured energy left out: priced as other
    hardware than measured', 'estimated energy for 1 of 2 runs: hardware only', ...); `priced_over`: where the
    total leaves some of the mode's runs out, having no price ('over 1 of 2 runs; run 7 (device 'X') has no
    price': `priced_share_text`), said after what it holds: a figure over part of the runs is not the whole's."""
    if total is None:
        return note or ""
    if not energy_included:
        if partial:
            basis = f"hardware only ({SOME_REQUESTS})"
        else:
            note = note or ENERGY_NOT_MEASURED
            basis = note if "hardware only" in note else f"hardware only ({note})"
    else:
        basis = f"incl. energy ({source})" if source in (ESTIMATED, PARTLY_ESTIMATED) else "incl. energy"
    return f"{basis}; {priced_over}" if priced_over else basis


def run_energy_estimated(run: RunSummary) -> bool:
    """Whether the run's energy figure rests on estimated power (power_source 'estimate', as the mode-level
    `energy_estimated` says): True wherever the run has an energy figure from a TDP model, whether or not that
    energy is in its cost (`CostBreakdown.energy_included` says that; its own `energy_estimated` flags an
    estimated energy part *in the total* only, so is False where the energy is left out, e.g. priced as other
    hardware). The per-run "energy estimated" column of `export --what cost` and the report says this."""
    return run.stats.energy_j is not None and bool(run.stats.energy_estimated)


def ids_text(ids: list[int], shown: int | None = None) -> str:
    """'run 3', 'runs 1, 4-6': consecutive ids as ranges. With `shown`, at most that many ranges, then the count:
    '100 runs (1, 3, 5, ...)' (a page's line is not a list of a hundred ids)."""
    spans: list[list[int]] = []
    for i in sorted(ids):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    listed = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    if shown is not None and len(listed) > shown:
        return f"{len(ids):,} runs ({', '.join(listed[:shown])}, ...)"
    return ("run " if len(ids) == 1 else "runs ") + ", ".join(listed)


def energy_sources_text(runs: Iterable[RunSummary], shown: int | None = None) -> str:
    """Which runs' energy was estimated and which metered, as 'run 1 estimated, run 3 measured by nvml': what
    a figure pooled over both says beside 'partly estimated'. Runs without an energy figure are left out.
    `shown`: at most that many id ranges per source (`ids_text`)."""
    by_source: dict[str, list[int]] = defaultdict(list)
    for r in runs:
        if r.stats.energy_j is not None:
            by_source[ESTIMATED if r.stats.energy_estimated else f"{MEASURED} by {r.power_source}"].append(r.run_id)
    return ", ".join(f"{ids_text(ids, shown)} {source}"
                     for source, ids in sorted(by_source.items(), key=lambda kv: min(kv[1])))


_INCOMPLETE_NOTES = {
    "running": " (in progress, or its process was killed)",
    "stale": " (its process is gone: killed or crashed before it could end the run)",
}


def incomplete_runs_text(runs: Iterable[RunSummary], shown: int | None = None) -> str:
    """One line on the runs in view that did not end 'completed': an interrupted bench (cancelled), one that
    raised (failed), one still 'running' (in progress, such as a live server, or its process was killed on a
    machine this one cannot look at), or 'stale' (its process is gone: killed or crashed before it could end the
    run, telemetry.liveness). Their finished requests count like any others. '' when every run completed."""
    by_status: dict[str, list[int]] = defaultdict(list)
    for r in runs:
        if r.status != "completed":
            by_status[r.status].append(r.run_id)
    if not by_status:
        return ""
    parts = [f"{ids_text(ids, shown)} {status}" + _INCOMPLETE_NOTES.get(status, "")
             for status, ids in sorted(by_status.items())]
    return (f"not every run completed: {'; '.join(parts)}. Their finished requests are counted; a run cut short "
            f"measured fewer prompts than its command asked for.")


# Below this many ok requests in a mode, its p95 TPOT is set by its one or two slowest requests and its tokens/s
# by a handful of prompts: a capacity, node count or cost read from them moves with the next run.
MIN_STABLE_REQUESTS = 20
# How to measure enough of them, by the runs' kind: bench's --limit is what cuts a run short of its workload's
# prompts; a load test sends what its --duration holds; a server's runs hold the traffic it was sent.
MEASURE_MORE = "measure more (bench without --limit)"
MEASURE_MORE_BY_KIND = {
    "bench": MEASURE_MORE,
    "loadtest": "measure longer (loadtest with a longer --duration)",
    "serve": "let the server take more traffic (its runs hold the requests it was sent), or measure with loadtest",
}


def measure_more_text(kinds: Iterable[str] = ("bench",)) -> str:
    """How to measure more requests for runs of `kinds` (runs.kind), each kind's way once; bench's for none."""
    found = [k for k in MEASURE_MORE_BY_KIND if k in set(kinds)] or ["bench"]
    return "; ".join(MEASURE_MORE_BY_KIND[k] for k in found)


def _mode_word(mode: str) -> str:
    return "AR" if mode == "ar" else mode


def _counts_text(requests: dict[str, int]) -> str:
    """'2 spec and 1 AR requests' ('1 AR request' alone)."""
    counts = " and ".join(f"{requests[m]:,} {_mode_word(m)}" for m in MODES if m in requests)
    return f"{counts} request{'' if len(requests) == 1 and sum(requests.values()) == 1 else 's'}"


def small_sample_text(requests: dict[str, int], what: str = "a p95 and a capacity figure",
                      kinds: Iterable[str] | Mapping[str, Iterable[str]] = ("bench",)) -> str | None:
    """'based on 2 spec and 2 AR requests: too few for a p95 and a capacity figure to be stable; ...' where a mode
    measured (some ok requests, `requests`: mode -> count) has fewer than MIN_STABLE_REQUESTS; None otherwise. A
    mode with none is not a small sample: the figures say it was not measured (missing_mode_text says how to
    measure it). `kinds`: the kinds of the runs counted, whose way to measure more is said (measure_more_text);
    given per mode (mode -> the kinds of the runs its count is over), those of the modes too small only."""
    measured = {m: n for m, n in requests.items() if n}
    if not measured or min(measured.values()) >= MIN_STABLE_REQUESTS:
        return None
    if isinstance(kinds, Mapping):
        kinds = {k for m, n in measured.items() if n < MIN_STABLE_REQUESTS for k in kinds.get(m, ())}
    return (f"based on {_counts_text(requests)}: too few for {what} to be stable (under {MIN_STABLE_REQUESTS} per "
            f"mode); {measure_more_text(kinds)}")


def missing_mode_text(requests: dict[str, int], record: Callable[[str], str], elsewhere: dict[str, int] | None = None,
                      choose: str | None = None) -> str | None:
    """'based on 0 spec and 1 AR requests: the spec runs are missing (none in view), so AR is compared with nothing;
    record both modes ...: `specfinops bench ... --mode both --db STORE`' where a mode of `requests` (mode -> ok
    requests) has none and another has some; None otherwise. `record`: how to record both modes into the store
    read, given which runs ("AR "): queries.record_both's text. Not 'too few': more of the measured mode would not
    give the missing one.
    `elsewhere` (mode -> ok requests in the other comparable groups in view, `Comparison.elsewhere`): a missing mode
    with some there is said to be in another group, not missing, with `choose` (a clause saying how to project
    that group, or that no filter selects it: Comparison.pick_text)."""
    missing = [m for m in MODES if m in requests and not requests[m]]
    measured = [m for m in MODES if requests.get(m)]
    if not missing or not measured:
        return None
    small = any(requests[m] < MIN_STABLE_REQUESTS for m in measured)
    more = (f" (without --limit: a stable p95 and capacity take {MIN_STABLE_REQUESTS} or more requests per mode)"
            if small else "")
    words = " and ".join(map(_mode_word, measured))
    record_both = f"{record(words + ' ')}{more}"
    apart = [m for m in missing if (elsewhere or {}).get(m)]
    if apart:  # measured, in another comparable group: not comparable with these, but not missing either
        n = sum(elsewhere[m] for m in apart)
        there = " and ".join(map(_mode_word, apart))
        pick = f"{choose}; " if choose else ""
        return (f"based on {_counts_text(requests)}: the {there} runs in view ({n:,} request{'' if n == 1 else 's'}) "
                f"are in another comparable group, so {words} is compared with nothing here; {pick}to compare the "
                f"modes, {record_both}")
    return (f"based on {_counts_text(requests)}: the {' and '.join(map(_mode_word, missing))} runs are missing "
            f"(none in view), so {words} is compared with nothing; {record_both}")


# What a configuration field is called where a pooled figure names what its runs differ in.
_CONFIG_FIELD_NAMES = {"kind": "run kind", "dtype": "precision", "max_new_tokens": "max new tokens",
                       "k_policy": "K policy"}
# The filter flags of `cost` and `project` that keep one value of a configuration field.
_CONFIG_FIELD_FLAGS = {"workload": "--workload", "target": "--target", "temperature": "--temperature",
                       "top_p": "--top-p", "top_k": "--top-k", "max_new_tokens": "--max-new-tokens",
                       "kind": "--run-kind"}  # no flag keeps one device (a node may hold several): --invocation
_TARGET_PATH_HINT = "--target PATH (a full folder path narrows it)"


@dataclass(frozen=True, slots=True)
class ConfigSpread:
    """The configurations (queries.CONFIG_FIELDS, as `speedups` and `project` group runs) that some runs of one
    mode span, and the fields in which they differ (top_p and top_k among sampled runs only: at temperature 0
    they change nothing)."""

    num_configurations: int
    differs_in: tuple[str, ...]  # CONFIG_FIELDS names

    def text(self, given: Collection[str] = ()) -> str | None:
        """'pools 3 configurations that differ in concurrency, run kind: narrow with --run-kind, ... or
        --run ID'; None for one configuration. `given`: the filter flags the command was given ('--invocation'):
        --invocation and --run are not advised again; a field's flag is advised while that field still differs
        among the pooled runs, given or not (`--target target-tiny` keeps that folder name on every node and path:
        /models/a/target-tiny and /models/b/target-tiny are still pooled: advised then as --target PATH, a full
        folder path narrowing them)."""
        if self.num_configurations < 2:
            return None
        names = ", ".join(_CONFIG_FIELD_NAMES.get(f, f) for f in self.differs_in)
        flags = [_CONFIG_FIELD_FLAGS[f] for f in self.differs_in if f in _CONFIG_FIELD_FLAGS]
        # --target given and still pooling paths: it kept a folder name; a full path is what narrows it
        flags = [_TARGET_PATH_HINT if f == "--target" and f in given else f for f in flags]
        options = [*flags, *(f"{flag} ID" for flag in ("--invocation", "--run") if flag not in given)]
        if not options:  # (every one given: no several configurations are left to pool)
            return f"pools {self.num_configurations} configurations that differ in {names}"
        listed = options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"
        return f"pools {self.num_configurations} configurations that differ in {names}: narrow with {listed}"


def config_spread(runs: Iterable[RunSummary]) -> ConfigSpread:
    """How many configurations `runs` span and what they differ in (ConfigSpread)."""
    keys = [dict(zip(CONFIG_FIELDS, k, strict=True)) for k in dict.fromkeys(key_of(r, CONFIG_FIELDS) for r in runs)]

    def matters(key: dict, f: str) -> bool:
        return f not in ("top_p", "top_k") or key["temperature"] != 0

    differs = tuple(f for f in CONFIG_FIELDS if len({k[f] for k in keys if matters(k, f)}) > 1)
    return ConfigSpread(len(keys), differs)


# Said where server runs are costed: their hardware is priced over what queries calls wall_s.
SERVE_PRICED_OVER = "requests' span"
SERVE_SPAN_NOTE = ("hardware priced over the requests' span (first request start to last request end): idle "
                   "time before the first and after the last request is not priced; gaps between requests are; "
                   "a server's spec and AR runs share its node's time")


# Said where a projection sizes nodes on server runs: their tokens/s is the traffic the server was sent (priced over
# its requests' span), not the most a node serves within the SLA, which a load test or a bench measures.
SERVE_CAPACITY_NOTE = ("these are server runs (kind 'serve'): they measure the traffic the server got, not its "
                       "capacity: their tokens/s is what it was sent over its requests' span, so a server idle between "
                       "requests reads slow, and the capacity per node at the SLA, node counts and costs here rest on "
                       "that traffic; to size a fleet, measure capacity with `specfinops loadtest` against the server "
                       "(or `specfinops bench`), then choose with --run-kind")


def _energy_prices(engine: Engine, snapshot: dict | None, usd_per_kwh: float | None, pue: float | None,
                   catalog: PriceCatalog | None = None):
    """($/kWh, PUE) of one run: the flag > the run's recorded price > the catalog."""
    default_kwh, default_pue = energy_prices(engine, catalog=catalog)

    def pick(given, key, default):
        if given is not None:
            return float(given)
        v = snapshot_energy(snapshot, key)
        return default if v is None else v

    return pick(usd_per_kwh, "usd_per_kwh", default_kwh), pick(pue, "pue", default_pue)


def _price_run(engine: Engine, run: RunSummary, gpu, node_hourly_usd, usd_per_kwh, pue,
               catalog: PriceCatalog | None = None, node_share: float = 1.0) -> RunCost:
    """The run's cost: its hardware over its wall seconds times `node_share` (its share of a node that other
    server runs shared: queries.serve_node_shares)."""
    price = resolve_node_price(  # a GPU price (--gpu) counts each GPU the run's device spans
        engine, device=run.device, price_snapshot=run.price_snapshot, gpu=gpu, node_hourly_usd=node_hourly_usd,
        gpus_per_node=device_gpus(run.device), catalog=catalog,
    )
    kwh_price, pue_value = _energy_prices(engine, run.price_snapshot, usd_per_kwh, pue, catalog)
    st = run.stats
    differs = price.differs_from(run.device)
    if st.output_tokens and st.wall_s is None:
        cost = CostBreakdown(st.output_tokens, None, None, None, False, False, WALL_UNKNOWN)
    elif differs and st.energy_j is not None:  # energy measured here is not the priced hardware's
        cost = cost_per_1m_tokens(price.usd_per_hour, (st.wall_s or 0.0) * node_share / 3600, None, pue_value, kwh_price,
                                  st.output_tokens, no_energy_reason=energy_other_hardware(energy_source([run])))
    else:
        energy_kwh = st.energy_j / J_PER_KWH if st.energy_complete and st.energy_j is not None else None
        partial = st.energy_j is not None and not st.energy_complete
        cost = cost_per_1m_tokens(
            price.usd_per_hour,
            (st.wall_s or 0.0) * node_share / 3600,
            energy_kwh,
            pue_value,
            kwh_price,
            st.output_tokens,
            energy_estimated=st.energy_estimated,
            no_energy_reason=f"{energy_source([run])} {SOME_REQUESTS}: hardware only" if partial
            else ENERGY_NOT_MEASURED,
        )
    return RunCost(run, price, run.device, differs, kwh_price, pue_value, cost, node_share)


def _configs_energy_source(configs: Iterable[ConfigSummary]) -> str | None:
    """energy_source of pooled configurations: measured, estimated, partly estimated; None without energy."""
    estimated = {c.stats.energy_estimated for c in configs if c.stats.energy_j is not None}
    if not estimated:
        return None
    return PARTLY_ESTIMATED if len(estimated) == 2 else ESTIMATED if True in estimated else MEASURED


def partial_energy_reason(with_energy: list[RunCost], runs_with_tokens: int, left_out: int = 0,
                          some_requests: list[RunCost] | None = None, left_out_source: str | None = None) -> str:
    """Why a mode's total is hardware only: 'estimated energy for 3 of 5 runs: hardware only' (measured,
    partly estimated) where some of its runs with tokens have an energy figure in the cost, else
    energy_other_hardware where the `left_out` runs' energy was left out for that reason (`left_out_source`: their
    energy_source), else 'measured energy for
    only some requests (2 of 5 runs): hardware only' where the `some_requests` runs measured some of their requests,
    else 'energy not measured'."""
    if not with_energy:
        if left_out:
            return energy_other_hardware(left_out_source)
        if some_requests:
            return (f"{energy_source(rc.run for rc in some_requests)} {SOME_REQUESTS} ({len(some_requests)} of "
                    f"{runs_with_tokens} runs): hardware only")  # fmt: skip
        return ENERGY_NOT_MEASURED
    text = f"{_energy_share_text(with_energy, runs_with_tokens)}: hardware only"
    return text + (f" ({left_out} more left out: priced as other hardware than measured)" if left_out else "")


def _energy_share_text(with_energy: list[RunCost], runs_with_tokens: int) -> str:
    return f"{energy_source(rc.run for rc in with_energy)} energy for {len(with_energy)} of {runs_with_tokens} runs"


def mode_runs(mc: ModeCost, run_costs: list[RunCost]) -> list[RunSummary]:
    """The runs whose tokens (and energy) a mode's cost pools: its runs with output tokens."""
    return [rc.run for rc in run_costs if rc.run.run_id in mc.run_ids and rc.run.stats.output_tokens]


def partial_energy_text(mc: ModeCost, run_costs: list[RunCost]) -> str | None:
    """'estimated energy for 3 of 5 runs' ('measured ...', 'partly estimated ...'): where only some of a mode's
    runs with output tokens have an energy figure, so its total is hardware only (`_mode_cost`); None where
    all or none of them have one. The CLI and the dashboard say it in these words."""
    c = mc.cost
    if c.total_usd_per_1m is None or c.energy_included or not mc.runs_with_energy:
        return None
    with_energy = [rc for rc in run_costs if rc.run.run_id in mc.run_ids and rc.cost.energy_included]
    return _energy_share_text(with_energy, mc.runs_with_tokens)


def _mode_cost(mode: str, items: list[RunCost]) -> ModeCost:
    with_tokens = [rc for rc in items if rc.run.stats.output_tokens]
    tokens = sum(rc.run.stats.output_tokens for rc in with_tokens)
    walls = [rc.run.stats.wall_s for rc in with_tokens]
    wall_s = None if not walls or any(w is None for w in walls) else sum(walls)
    with_energy = [rc for rc in with_tokens if rc.cost.energy_included]
    left = [rc for rc in with_tokens if is_energy_other_hardware(rc.cost.reason)]
    left_out = len(left)
    some_requests = [rc for rc in with_tokens if rc.run.stats.energy_j is not None and not rc.run.stats.energy_complete
                     and not is_energy_other_hardware(rc.cost.reason)]  # fmt: skip
    if wall_s is None:
        cost = CostBreakdown(
            tokens,
            None,
            None,
            None,
            False,
            False,
            "no output tokens" if not tokens else WALL_UNKNOWN,
        )
    else:
        hardware_usd = sum(rc.node_price.usd_per_hour * rc.run.stats.wall_s * rc.node_share / 3600
                           for rc in with_tokens)
        energy_known = len(with_energy) == len(with_tokens)
        # energy $ summed run by run (each at its own PUE and $/kWh), expressed as kWh at PUE 1, $1/kWh
        energy_usd = (
            sum(rc.run.stats.energy_j / J_PER_KWH * rc.pue * rc.usd_per_kwh for rc in with_tokens)
            if energy_known
            else None
        )
        # estimated only where estimated energy is in the total; the reason in the words `cost` prints
        estimated = energy_known and any(rc.run.stats.energy_estimated for rc in with_tokens)
        cost = cost_per_1m_from_totals(hardware_usd, energy_usd, 1.0, 1.0, tokens, energy_estimated=estimated,
                                       no_energy_reason=partial_energy_reason(
                                           with_energy, len(with_tokens), left_out, some_requests,
                                           energy_source(rc.run for rc in left)))  # fmt: skip
    return ModeCost(
        mode=mode,
        run_ids=tuple(rc.run.run_id for rc in items),
        output_tokens=tokens,
        wall_s=wall_s,
        tokens_per_s=_ratio(tokens, wall_s) if tokens else None,
        priced_as=tuple(sorted({rc.node_price.priced_as for rc in items})),
        measured_on=tuple(sorted({rc.measured_on for rc in items})),
        cost=cost,
        runs_with_tokens=len(with_tokens),
        runs_with_energy=sum(1 for rc in with_tokens if rc.cost.energy_included),
    )


def costs(
    engine: Engine,
    filters: Filters | None = None,
    *,
    gpu: str | None = None,
    node_hourly_usd: float | None = None,
    usd_per_kwh: float | None = None,
    pue: float | None = None,
    unpriced_ways: str | None = UNPRICED_FLAGS,
) -> tuple[list[RunCost], list[ModeCost]]:
    """Cost per 1M output tokens per run and per mode. Node price: `node_hourly_usd` > `gpu` (times the GPUs
    of the run's device) > the run's price snapshot > the catalog entry of the run's device (times its units:
    prices.device_units). The RunCosts' run summaries carry no TTFT/TPOT percentiles (None): a price reads
    none, and ordering every request's latencies was most of a cost call's time at 1M requests. NoPriceError
    (`unpriced_text`) where some run in view has no price: `costs_and_unpriced` costs the others."""
    run_costs, mode_costs, unpriced = costs_and_unpriced(engine, filters, gpu=gpu, node_hourly_usd=node_hourly_usd,
                                                         usd_per_kwh=usd_per_kwh, pue=pue)
    if unpriced:
        raise NoPriceError(unpriced_text(unpriced_by_device(unpriced), unpriced_ways))
    return run_costs, mode_costs


def costs_and_unpriced(
    engine: Engine,
    filters: Filters | None = None,
    *,
    gpu: str | None = None,
    node_hourly_usd: float | None = None,
    usd_per_kwh: float | None = None,
    pue: float | None = None,
) -> tuple[list[RunCost], list[ModeCost], list[RunSummary]]:
    """`costs` of the runs in view that a price covers, and the runs none covers (a device no catalog entry
    matches, and no price recorded with the run), where `costs` refuses them all: `specfinops cost` shows the
    priced runs' costs and names the others. Each mode's figures are over its priced runs only."""
    runs = run_summaries(engine, filters, latency=False)
    catalog = load_catalog(engine) if runs else None  # the price table read once, not a few queries per run
    shares = serve_node_shares(engine, filters or Filters(), runs)  # a server's runs share its node's time
    run_costs, unpriced = [], []
    for r in runs:
        try:
            run_costs.append(_price_run(engine, r, gpu, node_hourly_usd, usd_per_kwh, pue, catalog,
                                        shares.get(r.run_id, 1.0)))
        except NoPriceError:
            unpriced.append(r)
    by_mode: dict[str, list[RunCost]] = defaultdict(list)
    for rc in run_costs:
        by_mode[rc.run.mode].append(rc)
    return run_costs, [_mode_cost(m, by_mode[m]) for m in MODES if by_mode.get(m)], unpriced


def unpriced_by_device(runs: Iterable[RunSummary]) -> dict[str, list[int]]:
    """The run ids of `runs` (those `costs_and_unpriced` found no price for) by device, as `unpriced_text` takes
    them."""
    out: dict[str, list[int]] = defaultdict(list)
    for r in runs:
        out[r.device].append(r.run_id)
    return dict(out)


# How to price a device no catalog entry covers, wherever the runs on it are named (`unpriced_text`)
PRICE_A_DEVICE = ("add an entry named as the device string names the hardware (`specfinops prices set NAME X --kind "
                  "gpu|node --source ...`)")


def unpriced_text(unpriced: dict[str, list[int]], ways: str | None = UNPRICED_FLAGS) -> str:
    """Why `costs` cannot price the runs in view: the runs no price covers, by device, and the ways to price
    them: a catalog entry, then `ways` (the caller's own: `cost`'s flags by default, which the dashboard puts
    in its own words)."""
    return (f"no price for {_unpriced_runs_text(unpriced)}: no catalog entry matches the device and the runs "
            f"recorded none; {PRICE_A_DEVICE}" + (f", {ways}" if ways else ""))


def _unpriced_runs_text(unpriced: dict[str, list[int]], shown: int = 5) -> str:
    """'run 7 (device 'X'); runs 8-9 (device 'Y')'."""
    return "; ".join(f"{ids_text(ids, shown=shown)} (device {device!r})" for device, ids in sorted(unpriced.items()))


def priced_share_text(mc: ModeCost | None, mode: str, unpriced: Iterable[RunSummary]) -> str | None:
    """'over 3 of 4 runs; run 7 (device 'X') has no price': what a mode's cost figure (`costs_and_unpriced`'s
    ModeCost, over its priced runs) says where some of the mode's runs in view have no price, so that a figure
    over part of the mode's runs never reads as the whole's; 'no price for any of its 2 runs; ...' where none
    of them has one (`mc` None). None where every run of the mode is priced."""
    left = [r for r in unpriced if r.mode == mode]
    if not left:
        return None
    named = _unpriced_runs_text(unpriced_by_device(left))
    verb = "has" if len(left) == 1 else "have"
    if mc is None:
        return f"no price for any of its {len(left)} run{'s' if len(left) > 1 else ''}: {named} {verb} none"
    return f"over {len(mc.run_ids)} of {len(mc.run_ids) + len(left)} runs; {named} {verb} no price"


def run_cost(
    engine: Engine,
    run_id: int,
    *,
    gpu: str | None = None,
    node_hourly_usd: float | None = None,
    usd_per_kwh: float | None = None,
    pue: float | None = None,
) -> RunCost:
    """Cost of one run; ValueError naming `run_id` when the store has no requests for it."""
    filters = Filters(run_ids=(run_id,))
    found = run_summaries(engine, filters, latency=False)
    if not found:
        raise ValueError(f"run_id {run_id!r} not found (or it has no requests)")
    share = serve_node_shares(engine, filters, found).get(run_id, 1.0)
    return _price_run(engine, found[0], gpu, node_hourly_usd, usd_per_kwh, pue, node_share=share)



# The run filters a "no runs" message can name: (Filters field, what it is called, plural, Run column).
_RUN_FILTERS = (
    ("workload", "workload", "workloads", Run.workload),
    ("target", "target", "targets", Run.target),
    ("node_id", "node", "nodes", Run.node_id),
    ("drafter", "drafter", "drafters", Run.drafter),
    ("mode", "mode", "modes", Run.mode),
    ("temperature", "temperature", "temperatures", Run.temperature),
    ("top_p", "top_p", "top_p values", Run.top_p),
    ("top_k", "top_k", "top_k values", Run.top_k),
    ("max_new_tokens", "max_new_tokens", "max_new_tokens values", Run.max_new_tokens),
    ("kind", "run kind", "run kinds", Run.kind),
    ("invocation_id", "invocation", "invocations", Run.invocation_id),
)
_CUTOFF_OFF = {"top_p": 1.0, "top_k": 0}  # a cut-off's value as a greedy run counts it (effective_cutoffs)


def _run_matches(field: str, col, want):
    """SQL: the run filter `field` keeps a run (a cut-off as it acts, a target by its name too: Filters.where)."""
    if field == "target":
        return target_matches(col, want)
    if field == "workload":
        return workload_matches(col, want)
    return cutoff_matches(col, want, off=_CUTOFF_OFF[field]) if field in _CUTOFF_OFF else col == want


def _same_value(field: str, have, want) -> bool:
    """A run's value `have` of the filter `field` is the `want` it keeps (a target by its name too, either name of
    the mixed workload), as _run_matches says in SQL."""
    if field == "target":
        return target_is(have, want)
    return workload_is(have, want) if field == "workload" else have == want


def _run_value(run, field: str, col):
    """A run's value of the filter `field`, a cut-off as it acts (a greedy run's is off)."""
    if field in _CUTOFF_OFF:
        return dict(zip(("top_p", "top_k"), effective_cutoffs(run.temperature, run.top_p, run.top_k),
                        strict=True))[field]
    return getattr(run, col.key)


def _store_values(c, field: str, col) -> set:
    """The values of the filter `field` the store's runs have (cut-offs as they act)."""
    if field in _CUTOFF_OFF:
        return {_run_value(r, field, col) for r in c.execute(select(Run.temperature, Run.top_p, Run.top_k).distinct())}
    return set(c.execute(select(col).distinct()).scalars())


def _listed(values, shown: int = 10) -> str:
    """The values, sorted (numbers by number: 64 before 256); None (a run that recorded none) as 'unknown', last."""
    known = [v for v in values if v is not None]
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in known)
    known = [f"{v:g}" if isinstance(v, float) else str(v) for v in sorted(known, key=None if numeric else str)]
    values = known + (["unknown"] if None in values else [])
    return ", ".join(values[:shown]) + (f", ... ({len(values)} in all)" if len(values) > shown else "")


def _value_text(run, field: str, col) -> str:
    """A run's value of the filter `field` in a message: 'unknown' for None; a greedy run's cut-off says it
    counts as off whatever was recorded ('0 (greedy: any top_k counts as 0; it recorded 40)')."""
    have = _run_value(run, field, col)
    if field in _CUTOFF_OFF and run.temperature == 0:
        recorded = getattr(run, field)
        said = "nothing" if recorded is None else f"{recorded:g}"
        return f"{have:g} (greedy: any {field} counts as {have:g}; it recorded {said})"
    if have is None:
        return "unknown"
    return f"{have:g}" if isinstance(have, float) else repr(have)


def no_runs_reason(engine: Engine, filters: Filters | None = None) -> str:
    """Why no run has a request matching `filters`, in one line: the store has no runs at all (and how to
    measure some), or which filter matches nothing, with the values that exist, or which run is missing."""
    f = filters or Filters()
    with engine.connect() as c:
        if not c.execute(select(func.count(Run.id))).scalar():
            return f"the store has no runs; {empty_store_hint(engine)}"
        if f.run_ids is not None:
            found = {r.id: r for r in c.execute(select(Run).where(Run.id.in_(f.run_ids)))}
            missing = [i for i in f.run_ids if i not in found]
            if missing:
                ids = [str(i) for i in c.execute(select(Run.id).order_by(Run.id)).scalars()]
                shown = ", ".join(ids) if len(ids) <= 12 else f"{ids[0]} to {ids[-1]}, {len(ids)} in all"
                return f"no run {', '.join(map(str, missing))} in the store (runs in the store: {shown})"
            for run in found.values():
                for field, name, _, col in _RUN_FILTERS:
                    want, have = getattr(f, field), _run_value(run, field, col)
                    if want is not None and not _same_value(field, have, want):
                        return f"run {run.id} has {name} {_value_text(run, field, col)}, not {want!r}"
        conds = []
        for field, name, plural, col in _RUN_FILTERS:
            want = getattr(f, field)
            if want is None:
                continue
            if not c.execute(select(func.count(Run.id)).where(_run_matches(field, col, want))).scalar():
                have = _store_values(c, field, col)
                return f"no runs with {name} {want!r} ({plural} in the store: {_listed(have)})"
            conds.append((name, want, _run_matches(field, col, want)))
        named = " and ".join(f"{name} {want!r}" for name, want, _ in conds)
        if len(conds) > 1 and not c.execute(
            select(func.count(Run.id)).where(*(cond for _, _, cond in conds))
        ).scalar():
            greedy = (f.temperature == 0 and any(getattr(f, k) not in (None, v) for k, v in _CUTOFF_OFF.items()))
            return f"no run has {named} together" + (
                " (at temperature 0 every run counts as top_p 1 and top_k 0: greedy decoding ignores them)"
                if greedy else "")
    if f.run_ids is not None:
        what = (f"run {f.run_ids[0]} has" if len(f.run_ids) == 1
                else "runs " + ", ".join(map(str, f.run_ids)) + " have")
    else:
        what = f"the runs with {named} have" if named else "the store's runs have"
    def when(t: datetime | None, default: str) -> str:
        if t is None:
            return default
        return f"{(t.astimezone(UTC) if t.tzinfo is not None else t):%Y-%m-%d %H:%M} UTC"

    extra = []
    if f.domain is not None:
        extra.append(f"in domain {f.domain!r}")
    if f.since is not None or f.until is not None:
        extra.append(f"started between {when(f.since, 'the start')} and {when(f.until, 'now')}")
    return f"{what} no requests" + "".join(f" {e}" for e in extra)


# What a projection's cost_per_1m_tokens_* is: not the measured cost per 1M tokens of `costs()`.
FLEET_COST_LABEL = "fleet cost per 1M served tokens (sized for peak, whole nodes)"
FLEET_COST_FORMULA = (
    "nodes needed at peak x node $/h x 24 / daily tokens x 1e6, plus the energy part where measured; not the "
    "measured cost per 1M tokens of `specfinops cost` (node $/h x the runs' wall hours / their tokens), which "
    "has no peak headroom and no rounding up to whole nodes"
)
COST_PER_1M_BASIS = f"{FLEET_COST_LABEL}: {FLEET_COST_FORMULA}"


def fleet_energy_text(sp: StoreProjection, mode: str) -> str:
    """What the mode's fleet cost per 1M served tokens holds, as `project` and the report print beside it: 'node
    price only', 'incl. energy', or 'incl. energy (estimated)' / '(partly estimated)' where its capacity
    configuration's energy rests (partly) on estimated power. A missing figure says why it is missing, not what
    it would hold: 'not attainable: no run meets the SLA', or 'not measured: no spec runs in view' (or in the
    compared group, where the mode's runs in view are in another comparable group)."""
    if getattr(sp.projection, f"cost_per_1m_tokens_{mode}_usd") is None:
        name = "AR" if mode == "ar" else "spec"
        if getattr(sp.projection, f"measured_{mode}"):
            return f"{NOT_ATTAINABLE}: no {name} run meets the SLA"
        elsewhere = sp.comparison is not None and sp.comparison.elsewhere.get(mode)
        return f"{NOT_MEASURED}: no {name} runs {'in the compared group' if elsewhere else 'in view'}"
    if not getattr(sp.projection, f"energy_included_{mode}"):
        return "node price only"
    if not getattr(sp, f"energy_estimated_{mode}"):
        return "incl. energy"
    return f"incl. energy ({PARTLY_ESTIMATED if getattr(sp, f'energy_partly_estimated_{mode}') else ESTIMATED})"


def estimated_energy_modes(sp: StoreProjection) -> str:
    """The modes whose projected energy rests on estimated power, in words ('spec', 'AR (partly) and spec'); ''
    where neither's does. What a line saying "the energy part is an estimate" names: one mode's estimate is not
    the other's."""
    return " and ".join(("AR" if m == "ar" else "spec") + (" (partly)" if getattr(sp, f"energy_partly_estimated_{m}")
                                                          else "")
                        for m in ("ar", "spec") if getattr(sp, f"energy_estimated_{m}"))


COMPARISON_RULE = (
    "where the runs in view hold several comparable groups (workload, temperature, top_p, top_k, max_new_tokens, "
    "run kind, target, device, backend, precision), the projection compares spec and AR within one: the group whose less-measured mode "
    "has the most ok requests (then the most requests in all, then the first measured)"
)


def temperature_text(t: float | None) -> str:
    """'temperature 0', 'temperature 0.8'; a server's run records none (its requests chose theirs)."""
    return "per-request temperatures (server runs)" if t is None else f"temperature {t:g}"


# How a CLI user picks another comparable group than the one a projection chose (Comparison.text).
# The filter flags of `project` that select one comparable group, per COMPARED_FIELDS field, in the order the
# choice names them; device, backend and precision have none (a node may hold several devices): --node selects
# the runs of a node the chosen group has none on, and --invocation ID one bench's runs, where the other groups'
# runs are of benches (or load tests) the chosen group's are not (a server's runs are of none).
CHOOSE_FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k",
                "max_new_tokens": "--max-new-tokens", "kind": "--run-kind", "workload": "--workload",
                "target": "--target"}
CHOOSE_BY_NODE = "--node NODE"
CHOOSE_BY_INVOCATION = "--invocation ID"
# where no `project` filter selects another group: they differ in a field with no filter, on the same nodes and
# in the same invocations
NO_CHOOSE = ("no `project` filter selects another alone: device, backend and precision have none, and the groups' "
             "runs share nodes and invocations")  # no parentheses: Comparison.text puts it in its own


@dataclass(frozen=True, slots=True)
class Comparison:
    """The comparable group a projection sizes both modes on (one value of each COMPARED_FIELDS), how many ok
    requests each mode measured in it, and the other groups that were in view (each as its `label`)."""

    workload: str
    temperature: float | None
    kind: str
    target: str
    device: str
    backend: str
    dtype: str
    requests_ar: int
    requests_spec: int
    others: tuple[str, ...] = ()
    top_p: float | None = None  # None: unknown (runs recorded before it was, server runs)
    top_k: int | None = None  # 0 = off
    max_new_tokens: int | None = None  # the answer length cap; None: unknown (as top_p)
    # the fields _group_text leaves out (target, backend, device, precision, answer length cap) in which another
    # group in view differs: the label names this group's value of each, as each other group's label names its own
    named: tuple[str, ...] = ()
    # every COMPARED_FIELDS field in which another group in view differs from this one (choose_flags)
    apart: tuple[str, ...] = ()
    # ok requests per mode in the other groups in view: a mode this group lacks may be measured there
    elsewhere_ar: int = 0
    elsewhere_spec: int = 0
    # another group in view has runs on a node this one has none on (--node selects it), or of an invocation
    # none of this one's runs is of (--invocation ID selects it): comparable_group's `runs`
    by_node: bool = False
    by_invocation: bool = False

    @property
    def elsewhere(self) -> dict[str, int]:
        return {"ar": self.elsewhere_ar, "spec": self.elsewhere_spec}

    def choose_flags(self) -> tuple[str, ...]:
        """The `project` filter flags that select another group than this one: those of the fields the groups
        differ in (CHOOSE_FLAGS), then --node NODE where another group's runs are on a node this one's are not,
        then --invocation ID where they are of an invocation this one's are not; () where none does."""
        return (*(flag for f, flag in CHOOSE_FLAGS.items() if f in self.apart),
                *([CHOOSE_BY_NODE] if self.by_node else []), *([CHOOSE_BY_INVOCATION] if self.by_invocation else []))

    def choose_text(self) -> str:
        """'choose with --temperature or --invocation ID': only flags that tell the groups in view apart;
        NO_CHOOSE where none does."""
        flags = self.choose_flags()
        if not flags:
            return NO_CHOOSE
        return "choose with " + (flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} or {flags[-1]}")

    def pick_text(self) -> str:
        """How to project another group, as a clause: 'to project that group, choose with ...', or NO_CHOOSE."""
        return f"to project that group, {self.choose_text()}" if self.choose_flags() else NO_CHOOSE

    @property
    def label(self) -> str:
        return _group_text(self.workload, self.temperature, self.kind, self.top_p, self.top_k) + "".join(
            f", {field_text(f, getattr(self, f))}" for f in self.named)

    def text(self, choose: str | None = None) -> str:
        """One line: what is compared, and why this group where there were others (`choose`: how to pick another
        where the caller can; by default the `project` flags that do, choose_text)."""
        choose = self.choose_text() if choose is None else choose
        head = (f"spec and AR compared at {self.label} ({self.dtype} on {self.device}; {self.requests_spec:,} spec "
                f"and {self.requests_ar:,} AR requests)")
        if not self.others:
            return head
        return (f"{head}; {len(self.others)} other comparable group{'s' if len(self.others) > 1 else ''} in view "
                f"({'; '.join(self.others)}): this one is the group whose less-measured mode has the most requests "
                f"({choose})")

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in COMPARED_FIELDS} | {
            "requests_ar": self.requests_ar, "requests_spec": self.requests_spec, "other_groups": list(self.others),
            "rule": COMPARISON_RULE,
        }


def _group_text(workload: str, temperature: float | None, kind: str, top_p: float | None = None,
                top_k: int | None = None) -> str:
    """'workload code, temperature 0.8, top_k 40, bench runs': top_p and top_k where they cut (cutoffs_text)."""
    return f"workload {workload}, {temperature_text(temperature)}{cutoffs_text(top_p, top_k, temperature)}, {kind} runs"


def _in_group_text(field: str, value, temperature: float | None = None) -> bool:
    """Whether _group_text names this field's value already (top_p and top_k only where they cut), or need not:
    at temperature 0 no cut-off changes a token (queries.effective_cutoffs). It never names the answer length cap
    (max_new_tokens): that is named where groups differ in it."""
    if field in ("top_p", "top_k") and temperature == 0:
        return True
    if field in ("top_p", "top_k") and value is None:
        return temperature is not None  # a sampled group's unknown cut-off is named ('top_k unknown')
    if field == "top_p":
        return value != 1
    if field == "top_k":
        return bool(value)
    return field in ("workload", "temperature", "kind")


def _text_of(fields: dict) -> str:
    return _group_text(fields["workload"], fields["temperature"], fields["kind"], fields["top_p"], fields["top_k"])


def _group_label(key: tuple, configs: list[ConfigSummary], chosen: tuple | None = None) -> str:
    """The group in words; a field _group_text leaves out is named where it differs from the `chosen` group's
    (two groups of one workload on two devices, at top_k 0 and unknown, or capped at 64 and 256 new tokens, would
    otherwise read the same)."""
    fields = dict(zip(COMPARED_FIELDS, key, strict=True))
    best = dict(zip(COMPARED_FIELDS, chosen, strict=True)) if chosen is not None else None
    modes = {c.mode for c in configs}
    only = "" if modes >= set(MODES) else f" ({'spec' if 'spec' in modes else 'AR'} only)"
    differs = "".join(f", {field_text(f, v)}" for f, v in fields.items()
                      if not _in_group_text(f, v, fields["temperature"]) and best is not None and best[f] != v)
    return _text_of(fields) + differs + only


def run_groups(runs: Iterable[RunSummary]) -> list[str]:
    """The comparable groups (COMPARED_FIELDS) that runs span, each in words, in the order first seen; a field
    _group_text leaves out is named where the groups differ in it. More than one: pooled figures of a mode mix
    groups, and one mode's pooled figure against the other's compares unlike runs."""
    keys = [dict(zip(COMPARED_FIELDS, k, strict=True))
            for k in dict.fromkeys(key_of(r, COMPARED_FIELDS) for r in runs)]
    varying = varying_fields(keys)
    return [_text_of(k) + "".join(f", {field_text(f, k[f])}" for f in varying
                                  if not _in_group_text(f, k[f], k["temperature"]))
            for k in keys]


def comparable_group(configs: list[ConfigSummary], runs: dict[int, tuple[str | None, str | None]] | None = None
                     ) -> tuple[Comparison, list[ConfigSummary]]:
    """The configurations a projection compares: those of one comparable group (COMPARED_FIELDS), chosen by
    COMPARISON_RULE among the groups in view (a group where both modes were measured over one where only one
    was); with the Comparison that says which group it is and which others there were. `runs` (run id ->
    (node id, invocation id), `_run_places`): whether --node or --invocation selects another group
    (Comparison.by_node, by_invocation); without it, neither is offered."""
    groups: dict[tuple, list[ConfigSummary]] = defaultdict(list)
    for c in configs:  # in the order each group was first measured
        groups[key_of(c, COMPARED_FIELDS)].append(c)

    def requests(cs: list[ConfigSummary], mode: str) -> int:
        return sum(c.stats.num_requests_ok for c in cs if c.mode == mode)

    def rank(key: tuple) -> tuple:
        n = [requests(groups[key], m) for m in MODES]
        return (min(n) > 0, min(n), sum(n))

    best = max(groups, key=rank)  # max keeps the first of equals: the first measured
    chosen = groups[best]
    others = tuple(_group_label(k, cs, best) for k, cs in groups.items() if k != best)
    fields = dict(zip(COMPARED_FIELDS, best, strict=True))
    apart = tuple(f for f in COMPARED_FIELDS
                  if any(dict(zip(COMPARED_FIELDS, k, strict=True))[f] != fields[f] for k in groups))
    named = tuple(f for f in apart if not _in_group_text(f, fields[f], fields["temperature"]))
    rest = [c for k, cs in groups.items() if k != best for c in cs]
    places = runs or {}

    def placed(cs: list[ConfigSummary], i: int) -> set:
        return {places[r][i] for c in cs for r in c.run_ids if r in places} - {None}

    comparison = Comparison(**fields, requests_ar=requests(chosen, "ar"), requests_spec=requests(chosen, "spec"),
                            others=others, named=named, apart=apart, elsewhere_ar=requests(rest, "ar"),
                            elsewhere_spec=requests(rest, "spec"), by_node=bool(placed(rest, 0) - placed(chosen, 0)),
                            by_invocation=bool(placed(rest, 1) - placed(chosen, 1)))
    return comparison, chosen


@dataclass(frozen=True, slots=True)
class StoreProjection:
    projection: Projection
    node_price: NodePrice
    measured_on: tuple[str, ...]
    priced_differs: bool
    usd_per_kwh: float
    pue: float
    energy_estimated: bool
    capacity_run_ar: int | None  # first run of the configuration whose throughput is the AR capacity
    capacity_run_spec: int | None
    capacity_runs_ar: tuple[int, ...] = ()  # every run of that configuration (pooled into the capacity)
    capacity_runs_spec: tuple[int, ...] = ()
    # (tokens/s, p95 TPOT ms) of every configuration per mode: what finops.sla_curve draws
    points_ar: tuple[tuple[float | None, float | None], ...] = ()
    points_spec: tuple[tuple[float | None, float | None], ...] = ()
    energy_estimated_ar: bool = False  # the energy part of that mode's figure is (partly) estimated
    energy_estimated_spec: bool = False
    # ... and partly: its capacity configuration pools runs of an estimated and a metered power source
    energy_partly_estimated_ar: bool = False
    energy_partly_estimated_spec: bool = False
    gpus_per_node: int = 1  # the GPUs of a node (priced as this many x the GPU price)
    replicas_per_node: int = 1  # a node holds this many replicas of the measured device (capacity x this)
    device_gpus: int = 1  # the GPUs the measured device spans (a vLLM run's tensor x pipeline parallel size)
    # priced as other hardware than measured while the runs measured energy: that energy is left out
    energy_left_out: bool = False
    # where it is: whether that energy was measured or estimated (energy_source's words)
    energy_left_out_source: str | None = None
    energy_prices_from: str = ""  # where usd_per_kwh and pue come from, in words
    comparison: Comparison | None = None  # the comparable group both modes were sized on
    # p95 TPOT (ms) of each mode's capacity configuration: what meets the SLA in the projection
    capacity_tpot_p95_ms_ar: float | None = None
    capacity_tpot_p95_ms_spec: float | None = None
    # what the figures do not say by themselves (a small sample, priced as other hardware than measured, a speedup
    # above its mean acceptance length): the CLI prints each as a warning, --json adds them to assumptions.notes
    caveats: tuple[str, ...] = ()
    # a speedup of the compared group is above what its spec runs' mean acceptance length allows: the AR timing
    # was inflated, so AR's capacity reads low and the savings high (`above_acceptance_caveats`, among the caveats)
    speedup_above_acceptance: bool = False

    @property
    def replica_note(self) -> str | None:
        """What a node of several GPUs means here; None for one."""
        n, r = self.gpus_per_node, self.replicas_per_node
        if r == 1:
            return None
        each = "" if self.device_gpus == 1 else f", {self.device_gpus} GPUs"
        return (f"capacity per node = {r} x the measured device (a node of {n} GPUs holds {r} replicas of it; "
                f"the measured tokens/s are per device{each})")

    def sla_curve(self) -> list[SlaPoint]:
        """This projection's traffic and node price at every SLA where the answer can change."""
        p = self.projection
        return sla_curve(self.points_ar, self.points_spec, daily_tokens=p.daily_tokens,
                         peak_factor=p.peak_factor, node_hourly_usd=p.node_hourly_usd)

    def as_dict(self) -> dict:
        """The `project --json` contract: these top-level keys, the first eight as they always were, then the
        monthly cost per mode (nodes x node_hourly_usd x hours_per_month, node-hours only: the figure `project`
        prints; assumptions.monthly_cost_basis says so), then the fleet cost per 1M served tokens under a name
        that says so, added after them. cost_per_1m_tokens_*_usd hold that same fleet figure (sized for the peak
        in whole nodes, not the measured unit cost `cost` prints) and keep their names for existing readers."""
        p = self.projection
        return {
            "nodes_ar": p.nodes_ar,
            "nodes_spec": p.nodes_spec,
            "cost_per_1m_tokens_ar_usd": p.cost_per_1m_tokens_ar_usd,
            "cost_per_1m_tokens_spec_usd": p.cost_per_1m_tokens_spec_usd,
            "annual_savings_usd": p.annual_savings_usd,
            "capacity_tokens_per_s_ar": p.capacity_tokens_per_s_ar,
            "capacity_tokens_per_s_spec": p.capacity_tokens_per_s_spec,
            "monthly_cost_ar_usd": p.monthly_cost_ar_usd,
            "monthly_cost_spec_usd": p.monthly_cost_spec_usd,
            "fleet_cost_per_1m_served_tokens_ar_usd": p.cost_per_1m_tokens_ar_usd,
            "fleet_cost_per_1m_served_tokens_spec_usd": p.cost_per_1m_tokens_spec_usd,
            "assumptions": {
                "node_hourly_usd": p.node_hourly_usd,
                "daily_tokens": p.daily_tokens,
                "peak_factor": p.peak_factor,
                "p95_tpot_sla_ms": p.sla_ms,
                "priced_as": self.node_price.priced_as,
                "measured_on": list(self.measured_on),
                "priced_differs_from_measured": self.priced_differs,
                "pue": self.pue,
                "usd_per_kwh": self.usd_per_kwh,
                "energy_prices_from": self.energy_prices_from,
                "energy_included_ar": p.energy_included_ar,
                "energy_included_spec": p.energy_included_spec,
                "energy_estimated": self.energy_estimated,
                "energy_estimated_ar": self.energy_estimated_ar,
                "energy_estimated_spec": self.energy_estimated_spec,
                "energy_partly_estimated_ar": self.energy_partly_estimated_ar,
                "energy_partly_estimated_spec": self.energy_partly_estimated_spec,
                # the runs' measured energy is not in the fleet cost: priced as other hardware than measured
                "energy_left_out_other_hardware": self.energy_left_out,
                # and whether that energy was measured, estimated or partly estimated; None where none is left out
                "energy_left_out_source": self.energy_left_out_source if self.energy_left_out else None,
                # a speedup of the compared group above its spec runs' mean acceptance length: the AR timing was
                # inflated and the savings overstated (why: among the notes)
                "speedup_above_acceptance_length": self.speedup_above_acceptance,
                "capacity_basis": "highest measured tokens/s of one configuration (its runs pooled: tokens "
                "over their summed wall time, p95 TPOT over all of their requests; aggregate over its "
                "concurrency) whose p95 TPOT meets the SLA, "
                + ("taken as one node" if self.replicas_per_node == 1 else
                   f"times {self.replicas_per_node}: a node of {self.gpus_per_node} GPUs holds "
                   f"{self.replicas_per_node} replicas of the measured device"),
                "gpus_per_node": self.gpus_per_node,
                "replicas_per_node": self.replicas_per_node,
                "capacity_run_ar": self.capacity_run_ar,
                "capacity_run_spec": self.capacity_run_spec,
                "capacity_runs_ar": list(self.capacity_runs_ar),
                "capacity_runs_spec": list(self.capacity_runs_spec),
                "capacity_tpot_p95_ms_ar": self.capacity_tpot_p95_ms_ar,
                "capacity_tpot_p95_ms_spec": self.capacity_tpot_p95_ms_spec,
                "compared": None if self.comparison is None else self.comparison.as_dict(),
                "cost_per_1m_tokens_basis": COST_PER_1M_BASIS,
                "hours_per_year": HOURS_PER_YEAR,
                "hours_per_month": HOURS_PER_MONTH,
                "monthly_cost_basis": f"{MONTHLY_COST_FORMULA}; node-hours only",
                # why a figure is null (e.g. SLA not attainable), then the caveats (small sample, other hardware)
                "notes": list(p.notes) + list(self.caveats),
            },
        }


def projection_caveats(comparison: Comparison, cap_configs: dict[str, ConfigSummary | None], price: NodePrice,
                       devices: tuple[str, ...], differs: bool, engine: Engine | None = None,
                       always_db: bool = False) -> tuple[str, ...]:
    """What a projection's figures do not say by themselves: that a mode's capacity comes from too few requests
    (those of its capacity configuration, else of the compared group: MIN_STABLE_REQUESTS) or that a mode has
    none (how to record it into the store `engine` reads: queries.record_both of the group, `always_db` naming the
    store as bench_command's), and that the capacity is the measured device's throughput priced as other hardware
    (NodePrice.differs_from)."""
    def record(words: str) -> str:
        return record_both(engine, comparison, comparison.workload, always_db=always_db, words=words)[1]

    requests = {"spec": comparison.requests_spec, "ar": comparison.requests_ar}
    requests |= {m: c.stats.num_requests_ok for m, c in cap_configs.items() if c is not None}
    # a mode with no requests is missing, not measured too little: how to record it, in place of 'too few'
    small = (missing_mode_text(requests, record, comparison.elsewhere, comparison.pick_text())
             or small_sample_text(requests, kinds=(comparison.kind,)))
    out = [small] if small else []
    if comparison.kind == "serve":
        out.append(SERVE_CAPACITY_NOTE)
    if differs:
        other = price.catalog_name or price.priced_as
        out.append(f"the capacity is the throughput measured on {', '.join(devices)}, priced as {price.priced_as}: "
                   f"these node counts and costs are not {other}'s; to project {other}, measure on it; "
                   + own_price_text(devices))
    elif price.catalog_kind == "node" and any(gpu_chip(d) is not None and
                                              (catalog_name_for_device(d) or "").lower() != price.catalog_name.lower()
                                              for d in devices):
        # a node entry of the measured GPU's chip (my-h100-node for runs on an H100) is the same hardware, but how
        # many GPUs its price covers the catalog does not say: each projected node is one measured device
        out.append(f"each projected node is one measured device ({', '.join(devices)}) priced at {price.priced_as}'s "
                   f"${price.usd_per_hour:g}/h, a node entry: if that price covers a node of several GPUs, price the "
                   "GPU instead (--gpu with a GPU entry and --gpus-per-node N)")
    return tuple(out)


# what rests on a speedup above its mean acceptance length, as `project` and `cost` say it
SAVINGS_ON_IMPOSSIBLE = "the node counts and savings rest on a speedup no machine can produce"
COSTS_ON_IMPOSSIBLE = ("these runs measured a speedup no machine can produce, so the AR cost per 1M tokens reads "
                       "high against spec's")


def above_acceptance_caveats(found: list[Speedup], run_ids: Iterable[int],
                             lead: str = SAVINGS_ON_IMPOSSIBLE) -> tuple[str, ...]:
    """One line per speedup among `found` that compares some of `run_ids` and is above what its spec runs' mean
    acceptance length allows (`queries.above_acceptance_text`): the AR timing was inflated, so AR reads slower
    than it is and the figures `lead` names overstate speculation. () where none is."""
    ids = set(run_ids)
    return tuple(f"{lead} (drafter {s.drafter}, {s.k_policy}, concurrency {s.concurrency}): "
                 f"{above_acceptance_text(s)}"
                 for s in found if s.above_acceptance and ids & {*s.spec_run_ids, *s.ar_run_ids})


def runs_text(run_ids: tuple[int, ...], shown: int = 4) -> str:
    """'run 7' or '7 runs pooled: #3, #5, #7, #9, ...': which runs a capacity figure comes from."""
    if not run_ids:
        return ""
    if len(run_ids) == 1:
        return f"run {run_ids[0]}"
    listed = ", ".join(f"#{i}" for i in run_ids[:shown]) + (", ..." if len(run_ids) > shown else "")
    return f"{len(run_ids)} runs pooled: {listed}"


def _meets_sla(config: ConfigSummary, sla_ms: float) -> bool:
    """The configuration is a candidate for the capacity at the SLA (`finops.capacity_at_sla`'s rule): a tokens/s
    above 0 and a p95 TPOT within the SLA."""
    return capacity_at_sla([(config.stats.tokens_per_s, config.stats.tpot_p95_ms)], sla_ms) is not None


def _capacity_config(configs: list[ConfigSummary], sla_ms: float) -> ConfigSummary | None:
    """The configuration whose pooled tokens/s is the capacity at the SLA (the first measured on a tie)."""
    points = [(c.stats.tokens_per_s, c.stats.tpot_p95_ms) for c in configs]
    cap = capacity_at_sla(points, sla_ms)
    if cap is None:
        return None
    return next(c for c, (tps, p95) in zip(configs, points, strict=True)
                if tps == cap and p95 is not None and p95 <= sla_ms)


PRICING_HINT = "give --gpu NAME [--gpus-per-node N] or --node-hourly-usd X"


def _power_sources(engine: Engine, run_ids: list[int]) -> dict[int, str]:
    """Each run's power source (runs.power_source: nvml, rapl, estimate, none), one query (none for no runs)."""
    if not run_ids:
        return {}
    with engine.connect() as c:
        return dict(c.execute(select(Run.id, Run.power_source).where(Run.id.in_(run_ids))).all())


def _run_places(engine: Engine, run_ids: list[int]) -> dict[int, tuple[str | None, str | None]]:
    """Run id -> (node id, invocation id) of the runs, one query: which filters tell comparable groups apart."""
    with engine.connect() as c:
        return {i: (node, inv) for i, node, inv in
                c.execute(select(Run.id, Run.node_id, Run.invocation_id).where(Run.id.in_(run_ids)))}


def _run_snapshots(engine: Engine, run_ids: list[int]) -> list[dict | None]:
    """The runs' recorded prices (runs.price_snapshot), one query (the summaries are in hand already)."""
    with engine.connect() as c:
        return list(c.execute(select(Run.price_snapshot).where(Run.id.in_(run_ids))).scalars())


def _node_gpus(device: str, gpus_per_node: int, gpu: str | None) -> tuple[int, int]:
    """(GPUs of a node, replicas of the measured device it holds). The measured device may span several GPUs (a
    vLLM run with tensor parallelism: prices.device_gpus); a node holds whole replicas of it, so GPUs per node
    is a multiple of the device's GPUs, and left at 1 (or without a GPU price) the node is the device itself.
    ValueError naming --gpus-per-node when a node cannot hold a whole replica."""
    spans = device_gpus(device)
    if gpu is None or gpus_per_node == 1:
        return spans, 1
    if gpus_per_node % spans:
        raise ValueError(f"GPUs per node (--gpus-per-node {gpus_per_node}) must be a multiple of the {spans} GPUs "
                         f"the measured device spans ({device!r}): a node holds whole replicas of it")
    return gpus_per_node, gpus_per_node // spans


def _projection_price(engine: Engine, snapshots: list[dict | None], recorded: list[NodePrice | None], device: str,
                      gpu: str | None, gpus_per_node: int, node_hourly_usd: float | None) -> NodePrice:
    """The node price of a projection: `node_hourly_usd` > `gpu` x `gpus_per_node` > the runs' recorded price
    (`recorded`, read from `snapshots`: when they all recorded the same $/h, whatever names they recorded it
    under) > the catalog price of the measured device, as `costs()` prices each run. ValueError with the flags
    to give when nothing prices it."""
    snapshot = None
    if gpu is None and node_hourly_usd is None:
        rates = {None if p is None else p.usd_per_hour for p in recorded}
        if len(rates) == 1 and None not in rates:
            snapshot = snapshots[0]
    try:
        return resolve_node_price(engine, device=device, price_snapshot=snapshot, gpu=gpu,
                                  gpus_per_node=gpus_per_node, node_hourly_usd=node_hourly_usd)
    except ValueError as exc:
        if gpu is not None or node_hourly_usd is not None:
            raise
        known = sorted({p.usd_per_hour for p in recorded if p is not None})
        what = ("the runs recorded no price" if not known else  # the projection prices every run at one price
                f"only some of the runs recorded a price (${known[0]:g}/h)" if len(known) == 1 else
                "the runs recorded different prices (" + ", ".join(f"${v:g}/h" for v in known) + ")")
        raise ValueError(f"node pricing missing: {what} and no catalog price matches the measured device "
                         f"{device!r}; {PRICING_HINT}") from exc


# How `project` says runs of several recorded prices can be priced otherwise (the dashboard puts it in its words)
RECORDED_PRICES_WAYS = ("give --node-hourly-usd X (or --gpu NAME) to price them otherwise, or narrow to runs of one "
                        "price (--invocation ID)")


# share of a configuration's wall time that failed requests may add before `project` warns that they lower its capacity
FAILED_SPAN_WARN_SHARE = 0.10


def failed_span_caveats(engine: Engine, filters: Filters | None, candidates: list[ConfigSummary],
                        chosen: Sequence[ConfigSummary | None] = ()) -> tuple[str, ...]:
    """One caveat per configuration of `candidates` (those whose p95 TPOT meets the SLA: the ones a capacity may
    come from) whose failed or cancelled requests (a timeout that ends last) add more than FAILED_SPAN_WARN_SHARE
    of its wall time (queries.failed_span_s): its tokens/s counts that time, as it should (the node was paid while
    they ran), but a reader should know that it is failures, not speed, that lower it; for a configuration of
    `chosen` (the capacity configurations) the capacity taken from it too. Names the runs, the seconds they add,
    and the tokens/s over the ok requests' span alone beside the measured one. Nothing under a domain or prompt
    filter (`failed_span_s`)."""
    with_tokens = [c for c in candidates if c.stats.output_tokens and c.stats.wall_s]
    spans = failed_span_s(engine, filters, [i for c in with_tokens for i in c.run_ids])
    capacity = {c.run_ids for c in chosen if c is not None}
    out = []
    for c in with_tokens:
        added = {i: spans[i][0] - spans[i][1] for i in c.run_ids if i in spans and spans[i][0] > spans[i][1]}
        total = sum(added.values())
        if total <= FAILED_SPAN_WARN_SHARE * c.stats.wall_s:
            continue
        name = "AR" if c.mode == "ar" else "spec"
        each = (f" (run {', run '.join(f'{i} +{a:,.1f} s' for i, a in added.items())})"
                if len(c.run_ids) > 1 else "")
        ok_wall = c.stats.wall_s - total
        without = (f", {_ratio(c.stats.output_tokens, ok_wall):,.3g} tokens/s over its ok requests' span alone"
                   if ok_wall > 0 else "")
        counts = (", and the capacity taken from it, count" if c.run_ids in capacity else " counts")
        out.append(f"failed or cancelled requests of the {name} configuration of {runs_text(c.run_ids)} (concurrency "
                   f"{c.concurrency}) add {total:,.1f} s{each} to its {c.stats.wall_s:,.1f} s of wall time "
                   f"({total / c.stats.wall_s:.0%}): its measured {c.stats.tokens_per_s:,.3g} tokens/s{counts} that "
                   f"time, as the node was paid for it{without}; "
                   "`specfinops export --what requests` shows their errors")
    return tuple(out)


def _recorded_prices_caveat(recorded: list[NodePrice | None], price: NodePrice) -> tuple[str, ...]:
    """Why a projection's node price is the catalog's when its runs recorded prices of their own (they differ,
    or some recorded none): said, not switched silently. () where the runs' price or a flag priced it (a flag's
    price has another origin than the catalog)."""
    known = sorted({p.usd_per_hour for p in recorded if p is not None})
    if price.origin != "catalog" or not known:
        return ()
    what = ("the runs recorded different node prices (" + ", ".join(f"${v:g}/h" for v in known) + ")"
            if len(known) > 1 else f"only some runs recorded a node price (${known[0]:g}/h)")
    return (f"{what}: priced at the catalog's current {price.priced_as} (${price.usd_per_hour:g}/h) instead; "
            f"{RECORDED_PRICES_WAYS}",)


def _projection_energy_prices(engine: Engine, snapshots: list[dict | None], usd_per_kwh: float | None,
                              pue: float | None) -> tuple[float, float, str]:
    """($/kWh, PUE) of a projection and where they come from, in words: each is the flag > the value every run
    recorded (when they all recorded the same one, as the node price) > the catalog's."""
    default_kwh, default_pue = energy_prices(engine)
    picked, said = [], []
    for key, given, default, flag, name in (("usd_per_kwh", usd_per_kwh, default_kwh, "--usd-per-kwh", "$/kWh"),
                                            ("pue", pue, default_pue, "--pue", "PUE")):
        recorded = {snapshot_energy(snap, key) for snap in snapshots}
        if given is not None:
            picked.append(float(given))
            said.append(f"{name} given ({flag})")
        elif len(recorded) == 1 and None not in recorded:
            picked.append(recorded.pop())
            said.append(f"{name} recorded by the runs")
        else:
            picked.append(default)
            why = "the runs recorded different ones" if len(recorded - {None}) > 1 else (
                "not every run recorded a valid one" if recorded - {None} else "the runs recorded none")
            said.append(f"{name} from the catalog ({why})")
    return picked[0], picked[1], "; ".join(said)


def _capacity_speedups(engine: Engine, filters: Filters | None, run_ids: list[int], cap_ids: list[int],
                       in_view: Sequence[Speedup] | None) -> list[Speedup]:
    """The speedups of the compared group's runs (`run_ids`) that the capacity runs (`cap_ids`) were paired in.
    Taken from `in_view` (the speedups of every run in view) where each of those compares the group's runs only:
    a speedup pools the runs of one configuration, so it is then the one the group's runs alone give. Queried
    where none was given, or where one pools runs of another group (the speedup key has no backend)."""
    if not cap_ids:
        return []
    if in_view is not None:
        group, caps = set(run_ids), set(cap_ids)
        found = [s for s in in_view if caps & {*s.spec_run_ids, *s.ar_run_ids}]
        if all({*s.spec_run_ids, *s.ar_run_ids} <= group for s in found):
            return found
    return speedups(engine, dataclasses.replace(filters or Filters(), run_ids=tuple(run_ids)))


def project_from_store(
    engine: Engine,
    filters: Filters | None = None,
    *,
    daily_tokens: float,
    peak_factor: float,
    sla_ms: float,
    gpu: str | None = None,
    gpus_per_node: int = 1,
    node_hourly_usd: float | None = None,
    usd_per_kwh: float | None = None,
    pue: float | None = None,
    speedups_in_view: Sequence[Speedup] | None = None,
    name_store: bool = False,
) -> StoreProjection:
    """finops.project fed with the measured runs: capacity per mode = the best configuration's tokens/s
    meeting the SLA, each configuration's runs pooled (`queries.config_summaries`: the turns of an
    interleaved bench, repeated runs of one command), both modes within one comparable group
    (`comparable_group`: same workload, sampling (temperature, top_p, top_k), run kind, target, device, backend,
    precision; where the
    runs in view hold several, the one COMPARISON_RULE picks, named in `comparison`). With `gpu` and `gpus_per_node` N (1..64, GPU
    entries only), a node holds N / g replicas of the measured device, which spans g GPUs (1, or a vLLM run's
    tp x pp; N a multiple of g, `_node_gpus`): N x the GPU price and N / g x its measured tokens/s (so the node
    count shrinks by N / g, the cost per token stays that of one replica). The energy part
    is added only when the priced hardware is the measured one (per GPU: J/token is the same for N
    replicas). ValueError on an empty store or a filter that matches nothing (`no_runs_reason`).
    `speedups_in_view`: `queries.speedups(engine, filters)` where the caller has it already (the report shows
    them), so that the impossible-speedup caveat does not query them again (`_capacity_speedups`). `name_store`:
    the bench a caveat suggests names the store with --db even where it is this process's default (the
    dashboard's, `queries.bench_command`'s `always_db`)."""
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or not 1 <= gpus_per_node <= 64:
        raise ValueError(f"GPUs per node (--gpus-per-node) must be a whole number in 1..64, got {gpus_per_node!r}")
    if gpus_per_node != 1:
        if gpu is None:
            raise ValueError("GPUs per node (--gpus-per-node) needs a GPU price (--gpu NAME)")
        entry = get_price(engine, gpu)
        if entry.kind == "node":
            raise ValueError(f"GPUs per node (--gpus-per-node) applies to GPU prices; {entry.name!r} is a "
                             f"{entry.kind} price (a whole node already): leave GPUs per node at 1")
    configs = config_summaries(engine, filters)
    if not configs:
        raise ValueError(no_runs_reason(engine, filters))
    if not any(c.stats.output_tokens for c in configs):
        # the runs are there: say what became of their requests, not only how to measure new ones
        failed = sum(c.stats.num_requests_failed for c in configs)
        ok = sum(c.stats.num_requests_ok for c in configs)
        which = f"all {failed:,} of their requests" if not ok else f"{failed:,} of their {ok + failed:,} requests"
        said = (f": {which} failed or were cancelled (`specfinops export --what requests` shows their errors)"
                if failed else " in the store")
        raise ValueError(f"no measured runs with output tokens{said}; {empty_store_hint(engine)}")
    comparison, configs = comparable_group(configs, _run_places(engine, [i for c in configs for i in c.run_ids]))
    devices = tuple(sorted({c.device for c in configs}))
    gpus_per_node, replicas = _node_gpus(devices[0], gpus_per_node, gpu)
    run_ids = [i for c in configs for i in c.run_ids]
    snapshots = _run_snapshots(engine, run_ids)
    recorded = [_snapshot_price(snap, devices[0]) for snap in snapshots]
    price = _projection_price(engine, snapshots, recorded, devices[0], gpu, gpus_per_node, node_hourly_usd)
    kwh_price, pue_value, energy_prices_from = _projection_energy_prices(engine, snapshots, usd_per_kwh, pue)
    differs = any(price.differs_from(d) for d in devices)
    by_mode = {m: [c for c in configs if c.mode == m] for m in MODES}
    cap_configs = {m: _capacity_config(by_mode[m], sla_ms) for m in MODES}
    # per node: `replicas` of the measured device, each at its measured tokens/s and p95 TPOT
    points = {m: tuple((None if c.stats.tokens_per_s is None else c.stats.tokens_per_s * replicas,
                        c.stats.tpot_p95_ms) for c in by_mode[m]) for m in MODES}

    def j_per_token(m: str) -> float | None:
        # as costs(): energy only where every request of the configuration has a figure; J/token over the
        # requests that have one would price energy `cost` reports as not measured
        c = cap_configs[m]
        if differs or c is None or not c.stats.energy_complete:
            return None
        return c.stats.j_per_token

    projection = project(
        daily_tokens=daily_tokens,
        peak_factor=peak_factor,
        sla_ms=sla_ms,
        node_hourly_usd=price.usd_per_hour,
        points_ar=points["ar"],
        points_spec=points["spec"],
        j_per_token_ar=j_per_token("ar"),
        j_per_token_spec=j_per_token("spec"),
        pue=pue_value,
        usd_per_kwh=kwh_price,
        unmeasured_why={m: "its runs in view are in another comparable group" for m in MODES
                        if not points[m] and comparison.elsewhere[m]},
    )
    # energy from a configuration whose runs mix an estimated and a measured power source is labelled estimated
    estimated_by_mode = {
        m: c is not None and c.stats.energy_estimated and j_per_token(m) is not None for m, c in cap_configs.items()
    }
    estimated = any(estimated_by_mode.values())
    sources = _power_sources(engine, [i for m in MODES if estimated_by_mode[m] for i in cap_configs[m].run_ids])
    partly = {m: estimated_by_mode[m] and len({sources[i] for i in cap_configs[m].run_ids}) > 1 for m in MODES}
    # the speedups the capacity configurations' runs were paired in (the group's other concurrencies are not
    # what the nodes rest on): where one is impossible, AR's capacity was measured slow
    cap_ids = [i for c in cap_configs.values() if c is not None for i in c.run_ids]
    above = above_acceptance_caveats(_capacity_speedups(engine, filters, run_ids, cap_ids, speedups_in_view),
                                     cap_ids)
    return StoreProjection(
        caveats=projection_caveats(comparison, cap_configs, price, devices, differs, engine, name_store)
        + _recorded_prices_caveat(recorded, price) + above
        + failed_span_caveats(engine, filters, [c for c in configs if _meets_sla(c, sla_ms)], list(cap_configs.values())),
        speedup_above_acceptance=bool(above),
        projection=projection,
        node_price=price,
        measured_on=devices,
        priced_differs=differs,
        usd_per_kwh=kwh_price,
        pue=pue_value,
        energy_estimated=estimated,
        energy_estimated_ar=estimated_by_mode["ar"],
        energy_estimated_spec=estimated_by_mode["spec"],
        energy_partly_estimated_ar=partly["ar"],
        energy_partly_estimated_spec=partly["spec"],
        capacity_run_ar=cap_configs["ar"].run_ids[0] if cap_configs["ar"] else None,
        capacity_run_spec=cap_configs["spec"].run_ids[0] if cap_configs["spec"] else None,
        capacity_runs_ar=cap_configs["ar"].run_ids if cap_configs["ar"] else (),
        capacity_runs_spec=cap_configs["spec"].run_ids if cap_configs["spec"] else (),
        points_ar=points["ar"],
        points_spec=points["spec"],
        gpus_per_node=gpus_per_node,
        replicas_per_node=replicas,
        device_gpus=device_gpus(devices[0]),
        energy_left_out=differs and any(c.stats.energy_j is not None for c in configs),
        energy_left_out_source=_configs_energy_source(configs) if differs else None,
        energy_prices_from=energy_prices_from,
        comparison=comparison,
        capacity_tpot_p95_ms_ar=cap_configs["ar"].stats.tpot_p95_ms if cap_configs["ar"] else None,
        capacity_tpot_p95_ms_spec=cap_configs["spec"].stats.tpot_p95_ms if cap_configs["spec"] else None,
    )
