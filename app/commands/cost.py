"""`specfinops cost`, `specfinops project` and `specfinops prices`: cost per 1M output tokens of the measured
runs, node-count projections against a latency SLA, and the editable price catalog.

All figures come from `telemetry.queries` (the same functions the dashboard and reports use).
"""

from __future__ import annotations

import json
import sys

from app.commands._common import (
    INVOCATION_FILTER_HELP,
    MAX_NEW_TOKENS_FILTER_HELP,
    TARGET_FILTER_HELP,
    TOP_K_FILTER_HELP,
    TOP_P_FILTER_HELP,
    WORKLOAD_FILTER_HELP,
    add_command,
    add_db_option,
    invocation_filter,
    max_new_tokens_filter,
    number_option,
    run_id,
    stopped_as_on_ctrl_c,
    top_k_filter,
    top_p_filter,
    usage_shows_required,
)
from app.errors import UsageError
from telemetry.finops import MONTHLY_COST_FORMULA, NOT_ATTAINABLE, NOT_MEASURED, nodes_verdict
from telemetry.labels import node_price_text, short_workload, usd_amount

COST_EXAMPLES = """  specfinops cost
  specfinops cost --run 3 --json
  specfinops cost --gpu H100                  # price every run at H100 GPU-hours, one per GPU it ran on
  specfinops cost --node-hourly-usd 8.806 --workload code
  specfinops cost --temperature 0.8 --top-k 40  # only the runs sampled at temperature 0.8 with top_k 40
  specfinops cost --max-new-tokens 128          # only the runs whose answers were capped at 128 new tokens
  specfinops cost --invocation latest           # only the last bench's (or load test's) runs

runs no price covers (a device no catalog entry matches, and no price recorded with the run) are listed with
their costs missing ("—"; in --json: null, "priced": false, and the top-level "unpriced" list of devices and
run ids), with a warning (a note in --json) naming them and how to price them: `specfinops prices set NAME X
--kind gpu|node --source ...` named as the device string names the hardware, or --gpu / --node-hourly-usd.
Each mode's figures are then over its priced runs only (in --json: its "num_priced_runs" of its "num_runs", the
others in "unpriced_run_ids"; a mode with no priced run has its figures null).

exit status: 0 when the figures were shown, even with some runs unpriced (a script checks "unpriced" in
--json, or the warning); 2 on a bad option, when no run matches, or when no run in view has a price at all.
"""

PROJECT_EXAMPLES = """  specfinops project --daily-tokens 5e8 --peak-factor 2 --p95-tpot-sla-ms 50
  specfinops project --daily-tokens 5e8 --peak-factor 2 --p95-tpot-sla-ms 50 --gpu H100 --gpus-per-node 8
  specfinops project --daily-tokens 1e9 --peak-factor 1.5 --p95-tpot-sla-ms 40 --node-hourly-usd 8.806 --json
  specfinops project --daily-tokens 5e8 --peak-factor 2 --p95-tpot-sla-ms 50 --temperature 0.8 --top-p 0.9 --top-k 40
  specfinops project --daily-tokens 5e8 --peak-factor 2 --p95-tpot-sla-ms 50 --max-new-tokens 256
  specfinops project --daily-tokens 5e8 --peak-factor 2 --p95-tpot-sla-ms 50 --invocation latest  # the newest bench alone

node price: --node-hourly-usd X, else --gpu NAME [--gpus-per-node N], else the runs' recorded price (when
they all recorded the same one), else the catalog price of the measured device, as `specfinops cost` and
`specfinops report` price them. Where none of these prices it: --gpu NAME [--gpus-per-node N] or
--node-hourly-usd X.

capacity per node: a mode's fastest measured configuration (workload, model pair, device, precision,
concurrency, temperature, top_p, top_k, answer length cap, run kind, drafter, K policy) whose p95 TPOT meets the
SLA, with that configuration's runs pooled: tokens over their summed wall time, p95 over all of their requests
(the turns of an interleaved `bench --mode both`, repeats of one command). Spec and AR are compared only within
one comparable group (same workload, temperature, top_p, top_k, max new tokens, run kind, target, device,
backend, precision): where the runs in view hold several, the one whose less-measured mode has the most ok
requests, and the output says which and names the others.
Choose another with the filter of a field the groups differ in (--temperature, --top-p, --top-k,
--max-new-tokens, --run-kind, --workload, --target), with --node where the groups' runs are on other nodes, or
with --invocation ID where they were recorded by other benches or load tests: the output names only the filters
that tell them apart. Device, backend and precision have no filter of their own. Capacity pools the runs of
every bench in view: --invocation ID keeps one bench's (or load test's).

fleet cost per 1M served tokens: the fleet sized for peak traffic in whole nodes, per token it serves in a
day (nodes x node $/h x 24 / daily tokens x 1e6, plus energy where measured). It is not `specfinops cost`'s
cost per 1M tokens (node $/h x the measured runs' wall hours / their tokens): idle headroom for the peak
and the rounding up to whole nodes make it higher.
"""

PRICES_EXAMPLES = """  specfinops prices                      # list the catalog (defaults loaded on first use)
  specfinops prices list --json
  specfinops prices set H100 5.50 --source "our AWS EDP rate, 2026-11"
  specfinops prices set my-node 12.0 --kind node --source "on-prem TCO / 3 years"
  specfinops prices set electricity 0.09 --source "utility contract 2026"

A run records the prices in force when it starts (its price snapshot) and is costed at those: an edit here
prices the runs started after it, and the runs that recorded no price (recorded before snapshots, or while no
entry priced their device), which `prices set` counts. To cost recorded runs at other prices, give `cost` or
`project` --gpu NAME, --node-hourly-usd X, --usd-per-kwh X or --pue X.
"""

IDS_SHOWN = 8  # run id ranges a summary line lists before it counts the rest (the table lists every run)


def add_pricing_options(p, *, gpus_per_node: bool) -> None:
    """The options that price the runs in view at other prices than they recorded (`cost`; with
    `gpus_per_node`, `project`, `report` and `scheduler`, whose node is projected); read by `pricing_options`."""
    p.add_argument("--gpu", metavar="NAME", help="price at this catalog entry (see `specfinops prices`)")
    if gpus_per_node:
        p.add_argument(
            "--gpus-per-node", metavar="N", default=None,
            help="GPUs per node with --gpu NAME of kind gpu, 1..64 (default 1: the node is the measured device, "
            "all the GPUs it spans): a node holds N / g replicas of a device spanning g GPUs (a vLLM run's tp x pp; "
            "N a multiple of g), N x the GPU price and N / g x its measured tokens/s",
        )
    p.add_argument("--node-hourly-usd", metavar="X", help="price at X dollars per node-hour")
    p.add_argument("--usd-per-kwh", metavar="X", help="electricity price (default: the runs' recorded price, else catalog 'electricity')")
    p.add_argument("--pue", metavar="X", help="data-centre PUE (default: the runs' recorded PUE, else catalog 'pue')")


def _add_filters(p) -> None:
    p.add_argument("--workload", help=WORKLOAD_FILTER_HELP)
    p.add_argument("--target", help=TARGET_FILTER_HELP)
    p.add_argument("--node", help="only runs of this node id")
    p.add_argument("--temperature", metavar="T", help="only runs recorded at this sampling temperature (e.g. 0)")
    p.add_argument("--top-p", metavar="P", help=TOP_P_FILTER_HELP)
    p.add_argument("--top-k", metavar="K", help=TOP_K_FILTER_HELP)
    p.add_argument("--max-new-tokens", metavar="N", help=MAX_NEW_TOKENS_FILTER_HELP)
    p.add_argument("--run-kind", choices=("bench", "loadtest", "serve"),
                   help="only runs of this kind (a bench times the engine, a load test its HTTP clients)")
    p.add_argument("--invocation", metavar="ID", help=INVOCATION_FILTER_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def register(sub) -> None:
    p = add_command(
        sub,
        "cost",
        "Cost per 1M output tokens per run and per mode (hardware + energy).",
        COST_EXAMPLES,
        run_cost_command,
    )
    add_db_option(p)
    p.add_argument("--run", type=run_id, metavar="ID", help="only this run")
    add_pricing_options(p, gpus_per_node=False)
    _add_filters(p)

    p = add_command(
        sub,
        "project",
        "Nodes, monthly cost and annual savings for a traffic profile under a "
        "p95 TPOT SLA, AR vs speculative, from the measured runs.",
        PROJECT_EXAMPLES,
        run_project_command,
    )
    add_db_option(p)
    traffic = p.add_argument_group("required options (the traffic profile)")
    traffic.add_argument("--daily-tokens", metavar="N", help="output tokens per day (e.g. 5e8)")
    traffic.add_argument("--peak-factor", metavar="F", help="peak-to-average traffic ratio, >= 1")
    traffic.add_argument("--p95-tpot-sla-ms", "--sla-ms", dest="p95_tpot_sla_ms", metavar="X",
                         help="p95 time per output token the service must meet (--sla-ms: as `report` names it)")
    add_pricing_options(p, gpus_per_node=True)
    _add_filters(p)
    usage_shows_required(p, "daily_tokens", "peak_factor", "p95_tpot_sla_ms")  # checked by run_project_command

    p = add_command(
        sub,
        "prices",
        "List or edit the price catalog ($/GPU-hour, $/node-hour, $/kWh, PUE).",
        PRICES_EXAMPLES,
        stopped_as_on_ctrl_c("prices", run_prices_command),
    )
    add_db_option(p)
    p.add_argument("action", nargs="?", default="list", metavar="list|set")
    p.add_argument("name", nargs="?", help="entry name for `set` (case-insensitive)")
    p.add_argument("value", nargs="?", help="new value for `set`")
    p.add_argument("--source", help="where the price comes from (required for `set`)")
    p.add_argument("--kind", help="gpu | node | electricity | pue (required for a new name)")
    p.add_argument("--as-of", help="date of the price, YYYY-MM-DD (default: today in UTC)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


# ---- parsing -------------------------------------------------------------------------------------------


def pricing_options(args) -> dict:
    """The pricing options (`add_pricing_options`) checked, as costing.costs / project_from_store take them."""
    if args.gpu is not None and args.node_hourly_usd is not None:
        raise UsageError("give either --gpu NAME or --node-hourly-usd X, not both")
    from telemetry.prices import MAX_PUE, MAX_USD_PER_HOUR, MAX_USD_PER_KWH

    out = {
        "gpu": args.gpu,
        "node_hourly_usd": _at_most("--node-hourly-usd", args.node_hourly_usd,
                                    number_option("--node-hourly-usd", args.node_hourly_usd, minimum=0),
                                    MAX_USD_PER_HOUR, "$/h"),
        "usd_per_kwh": _at_most("--usd-per-kwh", args.usd_per_kwh,
                                number_option("--usd-per-kwh", args.usd_per_kwh, minimum=0, strict=False),
                                MAX_USD_PER_KWH, "$/kWh"),
        "pue": _at_most("--pue", args.pue, number_option("--pue", args.pue, minimum=1, strict=False), MAX_PUE, ""),
    }
    if hasattr(args, "gpus_per_node"):
        n = number_option("--gpus-per-node", args.gpus_per_node, minimum=1, strict=False)
        if n is not None and (n != int(n) or n > MAX_GPUS_PER_NODE):
            raise UsageError(
                f"--gpus-per-node must be a whole number in 1..{MAX_GPUS_PER_NODE}, got {args.gpus_per_node!r}"
            )
        if args.gpu is None and n is not None:
            raise UsageError("--gpus-per-node needs --gpu NAME (a GPU price of the catalog)")
        out["gpus_per_node"] = 1 if n is None else int(n)
    return out


MAX_GPUS_PER_NODE = 64


def _at_most(flag: str, text: str | None, value: float | None, maximum: float, unit: str) -> float | None:
    """`value` (of `flag`, given as `text`) where it is at most `maximum` (telemetry.prices' bound of that price:
    far beyond any real one); else a UsageError naming the flag and the value."""
    if value is not None and value > maximum:
        raise UsageError(f"{flag} must be at most {maximum:g}{' ' + unit if unit else ''} (far beyond any real "
                         f"price: a typo or a unit slip?), got {text!r}")
    return value


def check_gpu_entry(engine, args) -> None:
    """--gpu NAME names an entry of the store's catalog (a report or a scheduled job priced at a typo would say
    'cost n/a' for every period: refused before anything is written); --gpus-per-node multiplies a GPU price: a
    node entry is a whole node already."""
    if args.gpu is None:
        return
    from telemetry.prices import hourly_entry, load_catalog

    try:
        entry = hourly_entry(load_catalog(engine), args.gpu)
    except ValueError as exc:  # it names the hourly entries --gpu takes, or says the entry is not one
        raise UsageError(str(exc)) from None
    if getattr(args, "gpus_per_node", None) is not None and entry.kind == "node":
        raise UsageError(f"--gpus-per-node applies to GPU prices; {entry.name!r} is a {entry.kind} price "
                         "(a whole node already): drop --gpus-per-node")


def _filters(args, engine, run_id: int | None = None):
    from telemetry.queries import Filters

    return Filters(
        invocation_id=invocation_filter(engine, args.invocation),
        workload=args.workload,
        target=args.target,
        node_id=args.node,
        run_ids=(run_id,) if run_id is not None else None,
        temperature=number_option("--temperature", args.temperature, minimum=0, strict=False),
        kind=args.run_kind,
        top_p=top_p_filter(args.top_p),
        top_k=top_k_filter(args.top_k),
        max_new_tokens=max_new_tokens_filter(args.max_new_tokens),
    )


def _usd(x: float | None) -> str:
    return usd_amount(x, "n/a")


def _num(x: float | None, fmt: str = ",.1f") -> str:
    return "n/a" if x is None else format(x, fmt)


# ---- cost ----------------------------------------------------------------------------------------------


def _energy_text(c, runs=None) -> str:
    """The energy part; `runs` (a mode's): where it pools estimated and metered energy, it says which is which."""
    from telemetry.costing import (
        PARTLY_ESTIMATED,
        SOME_REQUESTS,
        WALL_UNKNOWN,
        energy_source,
        energy_sources_text,
        is_energy_other_hardware,
    )

    if c.energy_usd_per_1m is None:
        if c.tokens == 0:  # nothing to spread energy over (a run cancelled before its first token): not unmeasured
            return "n/a"
        if is_energy_other_hardware(c.reason):
            return "left out (other hw)"
        if c.reason == WALL_UNKNOWN:  # energy may be measured: the run's figure is n/a as a whole
            return "n/a (wall unknown)"
        return "partial (some requests)" if c.reason and SOME_REQUESTS in c.reason else "not measured"
    if runs is not None and energy_source(runs) == PARTLY_ESTIMATED:
        return f"{_usd(c.energy_usd_per_1m)} ({PARTLY_ESTIMATED}: {energy_sources_text(runs, shown=IDS_SHOWN)})"
    return _usd(c.energy_usd_per_1m) + (" (estimated)" if c.energy_estimated else "")


def _total_text(c, runs=None) -> str:
    """The total, and what it holds where that is not metered hardware and energy: hardware only, or an energy
    part that was estimated (the total is then partly an estimate, and says so), or partly estimated."""
    from telemetry.costing import PARTLY_ESTIMATED, energy_source

    if c.total_usd_per_1m is None:
        return f"n/a ({c.reason})"
    if c.energy_included:
        if not c.energy_estimated:
            return _usd(c.total_usd_per_1m)
        partly = runs is not None and energy_source(runs) == PARTLY_ESTIMATED
        return _usd(c.total_usd_per_1m) + f" (incl. {PARTLY_ESTIMATED if partly else 'estimated'} energy)"
    return _usd(c.total_usd_per_1m) + ("" if c.tokens == 0 else " (hardware only)")


def _cost_dict(c) -> dict:
    """A cost's figures as --json gives them; of None (a mode no price covers), the same keys, null."""
    if c is None:
        return dict.fromkeys(("hardware_usd_per_1m", "energy_usd_per_1m", "total_usd_per_1m", "energy_included",
                              "energy_estimated", "reason"))
    return {
        "hardware_usd_per_1m": c.hardware_usd_per_1m,
        "energy_usd_per_1m": c.energy_usd_per_1m,
        "total_usd_per_1m": c.total_usd_per_1m,
        "energy_included": c.energy_included,
        "energy_estimated": c.energy_estimated,
        "reason": c.reason,
    }


# the filters of `cost` that narrow its runs, as dest -> flag: a pooled figure's hint does not advise --invocation or
# --run again once given; a field's flag it advises while that field still differs (ConfigSpread.text)
_FILTER_FLAGS = {"workload": "--workload", "target": "--target", "temperature": "--temperature", "top_p": "--top-p",
                 "top_k": "--top-k", "max_new_tokens": "--max-new-tokens", "run_kind": "--run-kind",
                 "invocation": "--invocation", "run": "--run"}


def _filter_flags_given(args) -> set[str]:
    return {flag for dest, flag in _FILTER_FLAGS.items() if getattr(args, dest, None) is not None}


def _cost_caveats(run_costs, mode_costs) -> tuple[dict, list[str], list[str]]:
    """Per mode, the configurations its pooled figure spans (costing.ConfigSpread); the notes on the runs in
    view (server runs priced over their requests' span) and the warnings (too few requests for stable figures)."""
    from telemetry.costing import SERVE_SPAN_NOTE, config_spread, ids_text, mode_runs, small_sample_text

    spreads = {mc.mode: config_spread(mode_runs(mc, run_costs)) for mc in mode_costs}
    serve = [rc.run.run_id for rc in run_costs if rc.run.kind == "serve"]
    notes = [f"{ids_text(serve, shown=IDS_SHOWN)} (server): {SERVE_SPAN_NOTE}"] if serve else []
    # how to measure more, for the kinds of the runs each mode's count is over (not every run in view)
    kinds = {mc.mode: {rc.run.kind for rc in run_costs if rc.run.run_id in mc.run_ids} for mc in mode_costs}
    small = small_sample_text({mc.mode: _requests_ok(mc, run_costs) for mc in mode_costs},
                              what="a tokens/s and a cost per 1M tokens", kinds=kinds)
    return spreads, notes, [small] if small else []


def _requests_ok(mc, run_costs) -> int:
    return sum(rc.run.stats.num_requests_ok for rc in run_costs if rc.run.run_id in mc.run_ids)


def run_cost_command(args) -> int:
    from telemetry.costing import (
        COSTS_ON_IMPOSSIBLE,
        SERVE_PRICED_OVER,
        above_acceptance_caveats,
        costs_and_unpriced,
        energy_source,
        ids_text,
        incomplete_runs_text,
        no_runs_reason,
        run_energy_estimated,
        unpriced_by_device,
        unpriced_text,
    )
    from telemetry.prices import NoPriceError
    from telemetry.queries import speedups
    from telemetry.store import open_store

    pricing = pricing_options(args)
    _filters(args, None, args.run)  # every option checked before the store is opened
    engine = open_store(args.db, must_exist=True)
    filters = _filters(args, engine, args.run)
    run_costs, mode_costs, unpriced = costs_and_unpriced(engine, filters, **pricing)
    if not run_costs and unpriced:  # nothing to show a cost of: refused as a whole (exit 2), as before
        raise NoPriceError(unpriced_text(unpriced_by_device(unpriced)))
    if not run_costs:
        reason = no_runs_reason(engine, filters)
        raise UsageError(f"--run {args.run}: {reason}" if args.run is not None else reason)
    spreads, notes, warnings = _cost_caveats(run_costs, mode_costs)
    # the priced runs and those no price covers in one list, oldest first (as queries.run_summaries)
    everyone = sorted([rc.run for rc in run_costs] + unpriced, key=lambda r: (r.started_at, r.run_id))
    order = {r.run_id: i for i, r in enumerate(everyone)}
    if unpriced:  # the priced runs' costs stand; these are named, with how to price them
        warnings.insert(0, f"{unpriced_text(unpriced_by_device(unpriced))}. {UNPRICED_SHOWN}")
    warnings += above_acceptance_caveats(speedups(engine, filters), [rc.run.run_id for rc in run_costs],
                                         COSTS_ON_IMPOSSIBLE)
    if filters.invocation_id is not None:
        from telemetry.invocations import one_mode_text

        notes += [one] if (one := one_mode_text(engine, filters.invocation_id)) else []
    if args.json:
        print(
            json.dumps(
                {
                    "runs": sorted([
                        {
                            "run_id": rc.run.run_id,
                            "mode": rc.run.mode,
                            "kind": rc.run.kind,  # bench | loadtest | serve
                            "status": rc.run.status,  # completed | failed | cancelled | running
                            "workload": rc.run.workload,
                            "concurrency": rc.run.concurrency,
                            "output_tokens": rc.run.stats.output_tokens,
                            "wall_s": rc.run.stats.wall_s,
                            # what the hardware is priced over (wall_s): first request start to last request
                            # end; for a server, idle time before its first and after its last request is left
                            # out, gaps between requests are priced
                            "priced_over": SERVE_PRICED_OVER,
                            # the part of wall_s the hardware is priced over: a server's spec and AR runs on one
                            # node share its time (each its share of the node's span); 1 for any other run
                            "node_share": rc.node_share,
                            "tokens_per_s": rc.run.stats.tokens_per_s,
                            "node_hourly_usd": rc.node_price.usd_per_hour,
                            "priced_as": rc.node_price.priced_as,
                            "measured_on": rc.measured_on,
                            "priced_differs_from_measured": rc.priced_differs,
                            "usd_per_kwh": rc.usd_per_kwh,
                            "pue": rc.pue,
                            **_cost_dict(rc.cost),
                            # whether the run's energy rests on estimated power, in its cost or not (as export
                            # and a report's Cost per run say it; energy_included says whether it is in the cost)
                            "energy_estimated": run_energy_estimated(rc.run),
                            "priced": True,  # false: no price covers the run (`unpriced`), its costs null
                        }
                        for rc in run_costs
                    ] + [_unpriced_dict(r, SERVE_PRICED_OVER, run_energy_estimated(r)) for r in unpriced],
                        key=lambda row: order[row["run_id"]]),  # oldest first, as the table
                    # every mode with a run in view, priced or not: a mode's figures are over its priced runs
                    # (num_priced_runs of its num_runs); where none is priced, its figures are null
                    "modes": _modes_json(run_costs, mode_costs, unpriced, spreads),
                    # the runs no price covers, by device (their rows above: priced false, costs null); the
                    # modes' figures leave them out, and the notes say how to price them
                    "unpriced": [{"device": d, "run_ids": ids} for d, ids in unpriced_by_device(unpriced).items()],
                    # server runs' priced span, too few requests for stable figures, a speedup above its mean
                    # acceptance length (the AR timing inflated), runs with no price
                    "notes": notes + warnings,
                },
                indent=2,
            )
        )
        return 0
    print("cost per 1M output tokens (USD): hardware = node $/h x wall hours; energy = kWh x PUE x $/kWh")
    header = (
        f"{'run':>5} {'mode':<5} {'workload':<12} {'conc':>4} {'tokens':>9} {'tok/s':>9} "
        f"{'hardware':>10} {'energy':>22} {'total':>32}  priced as"
    )
    print(header)
    for row in sorted([*run_costs, *unpriced], key=lambda x: order[getattr(x, "run", x).run_id]):
        r = getattr(row, "run", row)  # a RunCost, or the RunSummary of a run no price covers
        st = r.stats
        if row is r:
            cells = f"{MISSING:>10} {MISSING:>22} {MISSING:>32}  no price (device {r.device})"
        else:
            c, price = row.cost, row.node_price
            cells = (f"{_usd(c.hardware_usd_per_1m):>10} {_energy_text(c):>22} {_total_text(c):>32}  "
                     f"{node_price_text(price.priced_as, price.usd_per_hour, price.origin == 'flag')}")
        print(f"{r.run_id:>5} {r.mode:<5} {short_workload(r.workload)[:12]:<12} {r.concurrency:>4} "
              f"{st.output_tokens:>9,} {_num(st.tokens_per_s):>9} {cells}")
    print()
    priced_modes = {mc.mode for mc in mode_costs}
    for mc in mode_costs:
        print(f"{mc.mode:<5} {ids_text(list(mc.run_ids), shown=IDS_SHOWN)}: {_mode_cost_text(mc, run_costs)}")
        pooled = spreads[mc.mode].text(given=_filter_flags_given(args))
        if pooled:
            print(f"      {pooled}")
        left_out = [r.run_id for r in unpriced if r.mode == mc.mode]
        if left_out:
            print(f"      left out: {ids_text(left_out, shown=IDS_SHOWN)} (no price; see the warning)")
    for mode in dict.fromkeys(r.mode for r in unpriced if r.mode not in priced_modes):
        ids = [r.run_id for r in unpriced if r.mode == mode]
        print(f"{mode:<5} {ids_text(ids, shown=IDS_SHOWN)}: cost {MISSING} (no price; see the warning)")
    differing: dict[tuple[str, str], list] = {}
    for rc in run_costs:
        if rc.priced_differs:
            differing.setdefault((rc.node_price.priced_as, rc.measured_on), []).append(rc)
    for (priced_as, measured_on), rcs in differing.items():  # one line per pair, not one per run
        print(f"{ids_text([rc.run.run_id for rc in rcs], shown=IDS_SHOWN)}: priced as {priced_as}, measured on "
              f"{measured_on}"
              + (other_hardware_energy(energy_source(rc.run for rc in rcs))
                 if any(rc.run.stats.energy_j is not None for rc in rcs) else ""))
    custom = sorted({rc.node_price.priced_as for rc in run_costs if rc.node_price.origin == "flag"})
    if custom:
        print(f"{', '.join(custom)}: {CUSTOM_PRICE_NOTE}")
    incomplete = incomplete_runs_text((rc.run for rc in run_costs), shown=IDS_SHOWN)
    if incomplete:
        print(f"note: {incomplete}")
    for note in notes:
        print(f"note: {note}")
    for warning in warnings:
        print(f"warning: {warning}")
    return 0


# What `cost` says of the runs no price covers, after how to price them (costing.unpriced_text)
UNPRICED_SHOWN = ("Their costs are missing (—; null in --json), and each mode's figures are over its priced runs "
                  "only")
MISSING = "—"


def _unpriced_dict(r, priced_over: str, energy_estimated: bool) -> dict:
    """A `cost --json` run row of a run no price covers: the keys of a priced run's, its costs and prices null."""
    return {
        "run_id": r.run_id, "mode": r.mode, "kind": r.kind, "status": r.status, "workload": r.workload,
        "concurrency": r.concurrency, "output_tokens": r.stats.output_tokens, "wall_s": r.stats.wall_s,
        "priced_over": priced_over, "node_share": None, "tokens_per_s": r.stats.tokens_per_s,
        "node_hourly_usd": None, "priced_as": None, "measured_on": r.device, "priced_differs_from_measured": None,
        "usd_per_kwh": None, "pue": None, "hardware_usd_per_1m": None, "energy_usd_per_1m": None,
        "total_usd_per_1m": None, "energy_included": None, "energy_estimated": energy_estimated,
        "reason": f"no price for device {r.device!r}", "priced": False,
    }


# Said where runs are priced as other hardware than they ran on (`cost` and `project` alike): the energy
# measured (or estimated) on one device is not the energy of another, so it is left out of the figure.
def other_hardware_energy(source: str | None, only: str = "hardware only") -> str:
    """'; the energy measured there is not that hardware's: left out (hardware only)' ('estimated there', 'measured
    and estimated there': `source`, costing.energy_source of the runs whose energy is left out)."""
    how = {"estimated": "estimated", "partly estimated": "measured and estimated"}.get(source or "", "measured")
    return f"; the energy {how} there is not that hardware's: left out ({only})"

# What --node-hourly-usd means (`cost` and `project` alike): the measured hardware at this price.
CUSTOM_PRICE_NOTE = ("a custom price is taken as the measured hardware's price per node-hour, so its measured "
                     "energy stays in (to price other hardware, name it: --gpu NAME)")


def _modes_json(run_costs, mode_costs, unpriced, spreads) -> list[dict]:
    """`cost --json`'s modes: one per mode with a run in view (queries.MODES order). A mode's figures are over its
    priced runs; `num_priced_runs` of `num_runs` say how many of its runs those are, `unpriced_run_ids` which are
    left out and `cost_priced_over` says so in words (as a report's summary does). A mode none of whose runs has
    a price has the same keys, its figures null (never 0)."""
    from telemetry.costing import (
        ESTIMATED,
        MIN_STABLE_REQUESTS,
        PARTLY_ESTIMATED,
        energy_source,
        mode_runs,
        priced_share_text,
    )
    from telemetry.queries import MODES

    by_mode = {mc.mode: mc for mc in mode_costs}
    out = []
    for mode in MODES:
        mc, left = by_mode.get(mode), [r.run_id for r in unpriced if r.mode == mode]
        if mc is None and not left:
            continue
        counts = {
            # the mode's runs in view, and those a price covers: its figures are over these only
            "num_runs": (0 if mc is None else len(mc.run_ids)) + len(left),
            "num_priced_runs": 0 if mc is None else len(mc.run_ids),
            "unpriced_run_ids": left,
            # 'over 1 of 2 runs; run 7 (device 'X') has no price' (as a report's summary says it); null where every
            # run of the mode is priced
            "cost_priced_over": priced_share_text(mc, mode, unpriced),
        }
        if mc is None:
            devices = dict.fromkeys(r.device for r in unpriced if r.mode == mode)
            out.append(_unpriced_mode_dict(mode, counts, ", ".join(map(repr, devices))))
            continue
        ok = _requests_ok(mc, run_costs)
        out.append({
            "mode": mc.mode,
            "run_ids": list(mc.run_ids),
            **counts,
            "incomplete_run_ids": _incomplete(mc.run_ids, run_costs),
            # configurations (queries.CONFIG_FIELDS) the pooled figure spans, and the fields in which they differ
            # ([] for one)
            "configurations": spreads[mc.mode].num_configurations,
            "differs_in": list(spreads[mc.mode].differs_in),
            "num_requests_ok": ok,
            "small_sample": 0 < ok < MIN_STABLE_REQUESTS,
            "output_tokens": mc.output_tokens,
            "wall_s": mc.wall_s,
            "tokens_per_s": mc.tokens_per_s,
            "priced_as": list(mc.priced_as),
            "measured_on": list(mc.measured_on),
            **_cost_dict(mc.cost),
            # where the mode's energy figures come from, in its cost or not (energy_included says whether they
            # are), as its runs' energy_estimated and a report's modes say it: measured | estimated | partly
            # estimated (runs of both pooled); null: no energy figure
            "energy_source": (source := energy_source(mode_runs(mc, run_costs))),
            "energy_estimated": source in (ESTIMATED, PARTLY_ESTIMATED),
        })
    return out


def _unpriced_mode_dict(mode: str, counts: dict, devices: str) -> dict:
    """A `cost --json` mode none of whose runs has a price (on `devices`, as a run row names them): the keys of a
    priced mode's, its figures (over its priced runs: none) null, its run lists empty but `unpriced_run_ids`."""
    return {
        "mode": mode, "run_ids": [], **counts, "incomplete_run_ids": [], "configurations": None,
        "differs_in": [], "num_requests_ok": None, "small_sample": False, "output_tokens": None, "wall_s": None,
        "tokens_per_s": None, "priced_as": [], "measured_on": [], **_cost_dict(None), "energy_estimated": False,
        "reason": f"no price for device {devices}", "energy_source": None,
    }


def _incomplete(run_ids, run_costs) -> list[int]:
    return [rc.run.run_id for rc in run_costs if rc.run.run_id in run_ids and rc.run.status != "completed"]


def _mode_cost_text(mc, run_costs) -> str:
    """A mode's tokens, tokens/s and cost per 1M tokens. Its total adds energy only when every run with
    output tokens has an energy figure (costing._mode_cost): where only some have, it says how many."""
    from telemetry.costing import mode_runs, partial_energy_text

    c = mc.cost
    head = f"{mc.output_tokens:,} tokens, {_num(mc.tokens_per_s)} tokens/s, hardware {_usd(c.hardware_usd_per_1m)}"
    partial = partial_energy_text(mc, run_costs)
    if partial:
        return f"{head}; {partial}: hardware only, {_usd(c.total_usd_per_1m)} per 1M tokens"
    runs = mode_runs(mc, run_costs)
    return f"{head} + energy {_energy_text(c, runs)} = {_total_text(c, runs)} per 1M tokens"


# ---- project -------------------------------------------------------------------------------------------


def run_project_command(args) -> int:
    from telemetry.costing import FLEET_COST_LABEL, fleet_energy_text, project_from_store, runs_text
    from telemetry.finops import MAX_DAILY_TOKENS, MAX_PEAK_FACTOR, MAX_SLA_MS, MIN_DAILY_TOKENS
    from telemetry.store import open_store

    missing = [
        f
        for f, v in (
            ("--daily-tokens", args.daily_tokens),
            ("--peak-factor", args.peak_factor),
            ("--p95-tpot-sla-ms", args.p95_tpot_sla_ms),
        )
        if v is None
    ]
    if missing:
        raise UsageError(f"missing {', '.join(missing)}")
    daily = number_option("--daily-tokens", args.daily_tokens, minimum=MIN_DAILY_TOKENS, strict=False,
                          maximum=MAX_DAILY_TOKENS)
    peak = number_option("--peak-factor", args.peak_factor, minimum=1, strict=False, maximum=MAX_PEAK_FACTOR)
    sla = number_option("--p95-tpot-sla-ms", args.p95_tpot_sla_ms, minimum=0, maximum=MAX_SLA_MS)
    pricing = pricing_options(args)
    _filters(args, None)  # every option checked before the store is opened
    engine = open_store(args.db, must_exist=True)
    filters = _filters(args, engine)
    check_gpu_entry(engine, args)
    sp = project_from_store(engine, filters, daily_tokens=daily, peak_factor=peak, sla_ms=sla, **pricing)
    if args.json:
        print(json.dumps(sp.as_dict(), indent=2))
        return 0
    p = sp.projection

    def nodes(n, measured):
        return f"{n:,}" if n is not None else NOT_ATTAINABLE if measured else NOT_MEASURED

    print(f"traffic: {daily:,.0f} output tokens/day, peak factor {peak:g}, p95 TPOT SLA {sla:g} ms")
    if sp.comparison is not None:
        print(sp.comparison.text())
    print(
        f"capacity per node at the SLA: AR {_num(p.capacity_tokens_per_s_ar)} tokens/s"
        f"{f' ({runs_text(sp.capacity_runs_ar)})' if sp.capacity_runs_ar else ''}, spec "
        f"{_num(p.capacity_tokens_per_s_spec)} tokens/s"
        f"{f' ({runs_text(sp.capacity_runs_spec)})' if sp.capacity_runs_spec else ''}"
    )
    if sp.replica_note:
        print(sp.replica_note)
    print(f"nodes needed: AR {nodes(p.nodes_ar, p.measured_ar)}, spec {nodes(p.nodes_spec, p.measured_spec)}")
    print(f"monthly cost: AR {_usd(p.monthly_cost_ar_usd)}, spec {_usd(p.monthly_cost_spec_usd)} "
          f"({MONTHLY_COST_FORMULA}; node-hours only)")
    verdict = nodes_verdict(p.nodes_ar, p.nodes_spec)
    print(f"annual savings: {_usd(p.annual_savings_usd)}{f' ({verdict})' if verdict else ''}")
    print(
        f"{FLEET_COST_LABEL}: AR {_usd(p.cost_per_1m_tokens_ar_usd)} ({fleet_energy_text(sp, 'ar')}), "
        f"spec {_usd(p.cost_per_1m_tokens_spec_usd)} ({fleet_energy_text(sp, 'spec')})"
    )
    line = "priced as " + node_price_text(sp.node_price.priced_as, sp.node_price.usd_per_hour,
                                          sp.node_price.origin == "flag")
    if sp.priced_differs:
        line += f", measured on {', '.join(sp.measured_on)}"
        if sp.energy_left_out:
            line += other_hardware_energy(sp.energy_left_out_source, "node price only")
    print(line + f"; PUE {sp.pue:g}, ${sp.usd_per_kwh:g}/kWh ({sp.energy_prices_from})")
    for caveat in sp.caveats:  # small sample, other hardware than measured
        print(f"warning: {caveat}")
    if sp.node_price.origin == "flag":
        print(f"note: {CUSTOM_PRICE_NOTE}")
    for note in p.notes:
        print(f"note: {note}")
    from telemetry.finops import sla_verdict

    curve = sp.sla_curve()
    if len(curve) > 1:
        print(f"where the SLA matters: {sla_verdict(curve)} (the dashboard's Cost & capacity page draws nodes by SLA)")
    return 0


# ---- prices --------------------------------------------------------------------------------------------


def run_prices_command(args) -> int:
    from telemetry.prices import KIND_UNITS, check_price, default_entries, list_prices, listed, set_price
    from telemetry.store import KEEPS_PRICES, NoStoreError, NotAStoreError, open_store

    if args.action not in ("list", "set"):
        raise UsageError(f"action must be 'list' or 'set', got {args.action!r}")
    if args.kind is not None and args.kind not in KIND_UNITS:  # said alike by list and set, under the option
        raise UsageError(f"--kind must be one of {', '.join(KIND_UNITS)}, got {args.kind!r}")
    if args.action == "list":
        extra = [x for x in (args.name, args.value) if x is not None]
        if extra:
            raise UsageError(f"`prices list` takes no NAME or VALUE, got {' '.join(extra)!r} (to edit: prices set)")
        if args.source is not None or args.as_of is not None:
            raise UsageError("--source and --as-of apply to `prices set`, not `prices list`")
        try:
            entries = list_prices(open_store(args.db, must_exist=True))
        except NoStoreError as e:  # listing creates no store: show what a new one starts with
            if isinstance(e, NotAStoreError) and e.foreign:  # another application's database: no store starts there
                raise
            print(f"note: no store at {e.path} yet; these are the default prices it will start with "
                  "(`prices set` or a recording command creates it)", file=sys.stderr)
            entries = listed(default_entries())  # in the order a store lists them
        return _print_prices([e for e in entries if args.kind in (None, e.kind)], args.json)
    if args.name is None or args.value is None:
        raise UsageError("usage: specfinops prices set NAME VALUE --source TEXT [--kind KIND]")
    if not args.source:
        raise UsageError("--source is required: say where the price comes from")
    value = number_option("VALUE", args.value, minimum=0, strict=False)  # > 0 but electricity: check_price says
    value, as_of = check_price(args.name, value, source=args.source, kind=args.kind, as_of=args.as_of)
    try:  # everything checked before a new store is created; a read-only one is named as such
        engine = open_store(args.db, must_exist=True, to_write=KEEPS_PRICES)
    except NoStoreError as e:  # a new store holds the defaults only: judge the name, kind and value against those
        if isinstance(e, NotAStoreError) and e.foreign:  # another application's database: refused as such
            raise
        default = {e.name.lower(): e for e in default_entries()}.get(args.name.strip().lower())
        if default is not None and args.kind is not None and args.kind != default.kind:  # as set_price refuses it
            raise UsageError(f"kind of {default.name!r} is {default.kind!r}, cannot change it to {args.kind!r}"
                             ) from None
        kind = default.kind if default is not None else args.kind
        if kind is None:
            raise UsageError(f"--kind is required for a new price name {args.name!r} "
                             f"(one of {', '.join(KIND_UNITS)})") from None
        check_price(args.name, value, source=args.source, kind=kind, as_of=as_of)
        engine = open_store(args.db)
    e = set_price(engine, args.name, value, source=args.source, kind=args.kind, as_of=as_of)
    print(f"{e.name} ({e.kind}) = {e.value:g} {e.unit}; source: {e.source}; as of {e.as_of}")
    print(PRICES_SET_NOTE)
    if e.unit == "usd_per_hour":  # runs that recorded no node price are priced by the entry as it stands
        from telemetry.prices import runs_priced_by_entry

        for device, n in sorted(runs_priced_by_entry(engine, e.name).items()):
            print(f"note: {n} run{'s' if n != 1 else ''} recorded without a node price for {device} "
                  f"{'are' if n != 1 else 'is'} priced by this entry (and by later edits of it)")
    return 0


PRICES_SET_NOTE = (
    "note: applies to runs started from now on; runs already recorded keep the prices they recorded (their "
    "price snapshot), and those that recorded none are priced by the catalog as it stands. To cost them at other "
    "prices: `specfinops cost` or `specfinops project` with --gpu NAME, --node-hourly-usd X, --usd-per-kwh X or "
    "--pue X"
)


def _print_prices(entries, as_json: bool) -> int:
    if as_json:
        keys = ("name", "kind", "value", "unit", "source", "as_of")
        print(json.dumps([{k: getattr(e, k) for k in keys} for e in entries], indent=2))
        return 0
    print(f"{'name':<20} {'kind':<12} {'value':>10} {'unit':<13} {'as of':<11} source")
    for e in entries:
        print(f"{e.name:<20} {e.kind:<12} {e.value:>10g} {e.unit:<13} {e.as_of:<11} {e.source}")
    return 0
