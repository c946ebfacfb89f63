"""What every page shares: the store/filter context, the error guard, the empty-store message, formatting.

A page body runs inside `run_page`, which turns any exception into one `st.error` line (the traceback goes
to the server log only). Missing figures are shown as "—", never as 0.
"""

from __future__ import annotations

import inspect
import logging
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import streamlit as st

from app.dashboard import data
from app.dashboard.charts import MODE_NAMES
from app.dashboard.filters import Selection, sidebar
from telemetry import finops, labels, prices
from telemetry.costing import (
    NO_CHOOSE,
    RECORDED_PRICES_WAYS,
    estimated_energy_modes,
    priced_share_text,
    run_groups,
    unpriced_by_device,
    unpriced_text,
)
from telemetry.prices import snapshot_energy  # the one rule for a valid recorded $/kWh or PUE

logger = logging.getLogger(__name__)

MISSING = "—"
SHOWN_RUN_IDS = 6  # a line names at most this many ranges of run ids, then their count (the Runs page: all)
FILL_COMMAND = "specfinops bench --workload code --mode both --limit 4"
CTX_KEY = "_specfinops_ctx"
PREPARED_KEY = "_specfinops_prepared"  # set by the entry file's run, taken by the page of the same run


@dataclass(frozen=True, slots=True)
class Context:
    url: str
    sel: Selection


# emphasis, links, strikethrough and a backslash; an underscore inside a word (top_p, x_y.db) never emphasises
_MARKDOWN = re.compile(r"[\\*\[\]~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md_safe(text: str) -> str:
    """`text` as Streamlit's markdown shows it letter for letter: a recorded name (a workload 'prompts/*_v2_*', a
    node, a domain, a path, an error) lost its asterisks and underscores to italics. Code spans (`specfinops ...`,
    the commands a line suggests) are kept as code."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code span
        return _MARKDOWN.sub(r"\\\g<0>", text).replace("`", "\\`")
    return "`".join(p if i % 2 else _MARKDOWN.sub(r"\\\g<0>", p) for i, p in enumerate(parts))


def fmt(value: float | int | None, spec: str = ",.2f", prefix: str = "", suffix: str = "") -> str:
    """`value` formatted, or "—" when it is missing (None or NaN)."""
    if value is None or value != value:
        return MISSING
    return f"{prefix}{value:{spec}}{suffix}"


def sla_ms_text(value: float | None, sla_ms: float) -> str:
    """A p95 TPOT judged against `sla_ms`, to as many decimals as keep it on its side of the SLA ("21.02 ms",
    not the "21.0 ms" that reads as an SLA of 21 ms met), or "—"."""
    if value is None or value != value:
        return MISSING
    return f"{finops.ms_apart(value, sla_ms)} ms"


def projection_notes(sp) -> list[str]:
    """What every page showing a node projection says under it: its own notes, and how it was priced
    where that is not the measured device, or where the energy part is an estimate."""
    notes = list(sp.projection.notes)
    if sp.replica_note:
        notes.append(sp.replica_note)
    if sp.priced_differs:
        notes.append(f"priced as {sp.node_price.priced_as}, measured on {', '.join(sp.measured_on)}: "
                     "the energy part is left out of the projected cost")
    if sp.energy_estimated:  # one mode's estimate is not the other's: the note names whose it is
        notes.append(f"the energy part of the projected cost is an estimate for {estimated_energy_modes(sp)}")
    if getattr(sp, "energy_prices_from", "") and (sp.projection.energy_included_ar
                                                  or sp.projection.energy_included_spec):
        notes.append(f"energy prices: {energy_prices_from(sp)}")
    return notes


# costing.missing_mode_text's "the spec runs are missing (none in view), so AR is compared with nothing; record
# both modes ...": the advice after it is replaced where the sidebar hides the store's runs of the missing mode
_MISSING_MODE = re.compile(r"the (spec|AR) runs are missing \(none in view\), so .+? is compared with nothing; ")


def show_projection_caveats(sp, ctx: Context) -> None:
    """What the projection's figures do not say by themselves (`StoreProjection.caveats`: too few requests for a
    stable p95 and capacity, a mode with none, the measured throughput priced as other hardware), as warnings:
    `project` prints them as warnings too. A mode with none whose runs the store holds and the sidebar's filters
    leave out says so (`left_out_text`), not "record both modes ... --mode both": they are recorded."""
    for caveat in sp.caveats:
        text = in_page_words(caveat)
        found = _MISSING_MODE.search(text)
        left_out = found and left_out_text(ctx, "ar" if found.group(1) == "AR" else "spec")
        if left_out:
            text = text[:found.end()] + left_out
        st.warning(md_safe(f"Projection: {text}."))


# costing says where a projection's energy prices came from in the CLI's words; the dashboard's inputs instead
_PRICE_FLAGS = {"$/kWh given (--usd-per-kwh)": "$/kWh your input", "PUE given (--pue)": "PUE your input"}
# and how the Comparison says another group is chosen: the sidebar box of each `project` filter that tells the
# groups apart (Comparison.choose_flags; each box is shown where the runs hold several values of its field)
SIDEBAR_BOX = {"--temperature": "Temperature", "--top-p": "top_p", "--top-k": "top_k",
               "--max-new-tokens": "Max new tokens", "--run-kind": "Run kind", "--workload": "Workload",
               "--target": "Model pair", "--node": "Node", "--invocation": "Invocation"}
# where none does: the sidebar's Runs box picks any runs
NO_CHOOSE_HERE = "pick another group's runs in the sidebar's Runs: no other sidebar filter selects one alone"


def choose_here(flags: Iterable[str], pick: str = "pick another") -> str:
    """'pick another with the sidebar's Temperature or Invocation': the sidebar boxes of `flags` (`project` flags,
    'NODE'/'ID' placeholders allowed); NO_CHOOSE_HERE where there are none."""
    boxes = list(dict.fromkeys(SIDEBAR_BOX[f.split()[0]] for f in flags))
    if not boxes:
        return NO_CHOOSE_HERE
    return f"{pick} with the sidebar's " + (boxes[0] if len(boxes) == 1 else f"{', '.join(boxes[:-1])} or {boxes[-1]}")


# and how a page's figures pooled over several comparable groups are narrowed to one
PICK_ONE_GROUP = ("pick one with the sidebar (Workload, Temperature, top_p, top_k, Max new tokens, Run kind, "
                  "Model pair, Node)")


def warn_pooled(runs, figures: str) -> list[str]:
    """A warning above `figures` (spec and AR side by side, each mode's pooled over every run in view) where
    `runs` span several comparable groups (costing.run_groups: workload, temperature, max new tokens, ...): the
    two sides then compare unlike runs, and spec can be dearer in one group and cheaper in another while the
    pooled figures say one thing. The projection compares within one group only (its caption names which).
    Returns the groups, each in words."""
    groups = run_groups(runs)
    if len(groups) < 2:
        return groups
    st.warning(md_safe(f"{figures[0].upper()}{figures[1:]} pool {len(groups)} comparable groups "
                       f"({'; '.join(groups)}): each mode's figure mixes them, so spec against AR here is not "
                       f"like for like, and within each group it can go the other way. To compare, "
                       f"{PICK_ONE_GROUP}. The projection compares within one of them (its caption names which)."))
    return groups


def energy_prices_from(sp) -> str:
    """`sp.energy_prices_from` in the dashboard's words (its inputs, not CLI flags)."""
    text = sp.energy_prices_from
    for cli, page in _PRICE_FLAGS.items():
        text = text.replace(cli, page)
    return text


def comparison_text(sp) -> str | None:
    """Which comparable group (workload, temperature, run kind, ...) the projection sized both modes on and
    which others were in view, in the dashboard's words; None where the projection holds none."""
    comparison = getattr(sp, "comparison", None)
    return None if comparison is None else comparison.text(choose=choose_here(comparison.choose_flags()))


def usd_amount(value: float | None) -> str:
    """A dollar figure of any size as `specfinops cost` and the reports write it (telemetry.labels.usd_amount):
    every money figure of the dashboard (tiles, captions, chart labels, table columns) goes through it, so that one
    figure never reads two ways ($0.00 on a tile for $0.0004 in `cost`)."""
    return labels.usd_amount(value, MISSING)


def usd_rate(value: float | None) -> str:
    """A price per hour or per kWh (telemetry.labels.usd_rate: $98.32/h, $0.0832/h, $5/h); "—" when missing."""
    return labels.usd_rate(value, MISSING)


def node_price(price) -> str:
    """A NodePrice named once (telemetry.labels.node_price_text): "custom $12.00/h", "H100 x8 at $55.04/h"."""
    return labels.node_price_text(price.priced_as, price.usd_per_hour, price.origin == "flag")


def cost_pricing(a: dict) -> dict:
    """The price inputs of the assumptions (assumptions.get, the Cost & capacity page's widgets) as
    `data.costs` keywords: the measured cost per 1M tokens is priced as the projection is. An input left
    at its default (None) keeps each run's recorded price (else the catalog's)."""
    return {k: a.get(k) for k in ("gpu", "node_hourly_usd", "usd_per_kwh", "pue")}


# what a missing node price says in the CLI, and what to do about it here
_PRICE_HINTS = ("; give --gpu NAME [--gpus-per-node N] or --node-hourly-usd X",
                "; pass --gpu NAME or --node-hourly-usd X")
PRICE_IT_HERE = ("; pick a catalog GPU or a custom $/h as the Node price on the Cost & capacity page, or record "
                 "the device's price with `specfinops prices set`")


# and how a projection over runs of several recorded prices is priced otherwise: the page's own controls
RECORDED_PRICES_HERE = ("pick a catalog GPU or a custom $/h as the Node price on the Cost & capacity page to price "
                        "them otherwise, or narrow to runs of one price (the sidebar's Invocation)")


# and how a projection's caveat says to choose another comparable group (Comparison.pick_text): the sidebar
_CHOOSE_FLAGS_TEXT = re.compile(r"choose with (--[a-z-]+(?: [A-Z]+)?(?:(?:, | or )--[a-z-]+(?: [A-Z]+)?)*)")
_FLAG = re.compile(r"--[a-z-]+")


# and how a projection's other-hardware caveat says to price the measured device itself (prices.own_price_text):
# the Node price box, with the entry named after the device's model or a custom $/h per node
_OWN_PRICE = re.compile(r"to price the measured (.+?) itself, (.*?)" + re.escape(prices.OTHER_HARDWARE))
_OWN_ENTRY = re.compile(r'prices set "(.+?)" X --kind (gpu|node) --source')
CUSTOM_PRICE_HERE = ("a custom $/h per node (the whole measured device's $/h) as the Node price on the Cost & "
                     "capacity page")


def own_price_here(match: re.Match) -> str:
    """prices.own_price_text (matched by _OWN_PRICE) in the page's words: pick the entry named after the device's
    model as the Node price (`specfinops prices set` records it: the page sets no prices), or a custom $/h."""
    entries = _OWN_ENTRY.findall(match.group(2))
    if not entries:
        which = match.group(1)  # the one device's string, else "hardware"
        return (f"to price the measured {which} itself, pick {CUSTOM_PRICE_HERE}: {'a' if which == 'hardware' else 'its'} "
                f"device string names no model that a catalog entry could be named after, and {prices.OTHER_HARDWARE}")
    named = "; ".join(f'"{name}", a {kind} entry at {prices.OWN_X[kind]}' for name, kind in entries)
    return (f"to price the measured hardware itself, pick as the Node price the entry named after the device's "
            f"model, as it stands in the device string ({named}; `specfinops prices set` records it), or pick "
            f"{CUSTOM_PRICE_HERE}; {prices.OTHER_HARDWARE}")


def in_page_words(message: str) -> str:
    """A costing message in the dashboard's words: how to price a device the catalog does not know, or runs that
    recorded different prices, or choose another comparable group, is the Node price input and the sidebar, not
    CLI flags."""
    for hint in _PRICE_HINTS:
        message = message.replace(hint, PRICE_IT_HERE)
    message = _CHOOSE_FLAGS_TEXT.sub(lambda m: choose_here(_FLAG.findall(m.group(1)), "pick it"), message)
    message = message.replace(NO_CHOOSE, NO_CHOOSE_HERE)
    message = _OWN_PRICE.sub(own_price_here, message)
    return message.replace(RECORDED_PRICES_WAYS, RECORDED_PRICES_HERE)


@dataclass(frozen=True, slots=True)
class PricedCosts:
    """The costs of the runs in view at the page's prices (`priced_costs`): the priced runs' (`run_costs`; each
    mode's figure in `mode_costs` over its priced runs only), the runs no price covers (`unpriced`, their costs
    missing), or no costs at all and why (`error`: a price input the costing refused)."""

    run_costs: list
    mode_costs: list
    unpriced: list
    error: str | None = None

    @property
    def note(self) -> str | None:
        """Why some or all costs are missing, in the page's words: the runs no price covers and how to price
        them here (`costing.unpriced_text` with UNPRICED_HERE), or the error; None where every run is priced."""
        if self.error:
            return self.error
        if not self.unpriced:
            return None
        return in_page_words(unpriced_text(unpriced_by_device(self.unpriced), data.UNPRICED_HERE))

    def share(self, mode: str) -> str | None:
        """'over 1 of 2 runs; run 7 (device 'X') has no price' where the mode's figure leaves runs out
        (costing.priced_share_text); None where all its runs are priced."""
        by_mode = {m.mode: m for m in self.mode_costs}
        return priced_share_text(by_mode.get(mode), mode, self.unpriced)

    def runs(self) -> list:
        """Every run in view costed or not (their summaries, without latency percentiles), oldest first."""
        return sorted([*(rc.run for rc in self.run_costs), *self.unpriced], key=lambda r: r.run_id)


def priced_costs(url: str, f, a: dict) -> PricedCosts:
    """`data.costs` at the assumptions' prices (`cost_pricing`): the priced runs' costs stand where some runs
    have no price (a device the catalog does not know, no price recorded with the run), those named with how to
    price them here; a price the costing refuses leaves no costs and says why, in the page's words (that
    ValueError took the Overview and this page whole)."""
    try:
        run_costs, mode_costs, unpriced = data.costs(url, f, **cost_pricing(a))
    except ValueError as exc:
        return PricedCosts([], [], [], in_page_words(str(exc)))
    return PricedCosts(run_costs, mode_costs, unpriced)


def _recorded(run_costs, key: str) -> str:
    """Where the runs' own `key` price came from: their price snapshots, the catalog, or some of each
    (costing prices a run from its snapshot where it holds a valid one: $/kWh >= 0, a recorded $0 being a real
    price, and PUE >= 1; else from the catalog)."""
    found = [snapshot_energy(rc.run.price_snapshot, key) is not None for rc in run_costs]
    return ("recorded with the runs" if all(found) else "the catalog's" if not any(found)
            else "recorded with the runs, else the catalog's")


def _span(values: list[float], show: Callable[[float], str]) -> str:
    lo, hi = min(values), max(values)
    return show(lo) if lo == hi else f"{show(lo)}–{show(hi)}"


def prices_text(run_costs, a: dict) -> str:
    """The prices `data.costs(..., **cost_pricing(a))` used for `run_costs`, and whose they are: the page's
    input, or the runs' own (recorded with them, else the catalog's)."""
    if not run_costs:
        return ""
    # a custom price named once ("custom $10.00/h", not "custom $10/h node at $10.00/h"): node_price
    node = ", ".join(sorted({node_price(rc.node_price) for rc in run_costs}))
    origins = {rc.node_price.origin for rc in run_costs}
    node_whose = ("your input" if origins <= {"flag", "gpu"} else "recorded with the runs" if origins == {"snapshot"}
                  else "the catalog's, for the measured device" if origins == {"catalog"}
                  else "recorded with the runs, else the catalog's")
    kwh = _span([rc.usd_per_kwh for rc in run_costs], usd_rate) + "/kWh"
    pue = _span([rc.pue for rc in run_costs], lambda v: f"{v:g}")
    kwh_whose = "your input" if a.get("usd_per_kwh") else _recorded(run_costs, "usd_per_kwh")
    pue_whose = "your input" if a.get("pue") else _recorded(run_costs, "pue")
    return (f"node {node} ({node_whose}); electricity {kwh} ({kwh_whose}); PUE {pue} ({pue_whose})")


def cost_vs_savings_note(spec_cost, ar_cost, projection) -> str | None:
    """A line for when the measured cost per 1M tokens (ModeCost per mode) and the projected savings
    (finops.Projection) point different ways: they answer different questions, and a reader should not
    have to guess which one to plan with."""
    if spec_cost is None or ar_cost is None or projection is None:
        return None
    spec, ar, savings = spec_cost.total_usd_per_1m, ar_cost.total_usd_per_1m, projection.annual_savings_usd
    if spec is None or ar is None or savings is None or spec == ar or not savings or (spec < ar) == (savings > 0):
        return None
    return (f"Why the cost per 1M tokens and the savings disagree: the cost pools every run in view, each at its "
            f"own concurrency; the projection sizes each mode by its fastest configuration whose p95 TPOT meets "
            f"the {projection.sla_ms:g} ms SLA (AR {throughput(projection.capacity_tokens_per_s_ar)}, "
            f"speculative {throughput(projection.capacity_tokens_per_s_spec)} tokens/s per node). Plan with the "
            f"projection; the Cost & capacity page shows both.")


def _error(what: str, exc: Exception) -> None:
    logger.exception("dashboard: %s failed", what)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    st.error(f"{what} could not be shown: {type(exc).__name__}{': ' + md_safe(first) if first else ''}. "
             "Details are in the dashboard's log.")


# Tiles in a narrow column (half the page split in two, a 1024 px window beside the sidebar) cut their figures
# short ("16.2 ..." for 16.2 ms, "1539.2 ..." for a TPOT of four digits, "$0.0832/..." for a node price), their
# labels mid-word ("Cost per 1M tokens (incl. est...") and their change against AR ("+100% vs AR (temperature 0,
# b..." at 1440 px too): the figures shrink with the window (down to 21.6 px; 36 px, Streamlit's own, from 1500 px
# up), and a figure still too wide, a long label or a long change wraps onto a second line instead of being cut.
_WHOLE = "white-space: normal !important; overflow: visible !important; text-overflow: clip !important; height: auto;"
TILE_STYLE = f"""<style>
[data-testid="stMetricValue"] {{ font-size: clamp(1.35rem, 2.4vw, 2.25rem); }}
[data-testid="stMetricValue"], [data-testid="stMetricValue"] *,
[data-testid="stMetricLabel"], [data-testid="stMetricLabel"] *,
[data-testid="stMetricDelta"], [data-testid="stMetricDelta"] * {{ {_WHOLE} }}
</style>"""


def prepare() -> None:
    """Entry-file step: find the store, render the sidebar filters, keep the context for the page."""
    st.html(TILE_STYLE)
    st.session_state[CTX_KEY] = None
    st.session_state[PREPARED_KEY] = True
    try:
        url = data.db_url()
        if data.count_runs(url) == 0:
            return
        sel = sidebar(data.filter_options(url))
        st.sidebar.caption(f"Store: {shown_url(url)}")
        st.session_state[CTX_KEY] = Context(url, sel)
    except Exception as exc:  # noqa: BLE001 - shown to the user as one line, logged with its traceback
        _error("The store", exc)
        st.session_state[CTX_KEY] = "error"


def shown_url(url: str) -> str:
    """The store URL as the page may show it: as the user writes it (postgresql://), a password masked."""
    from telemetry.db import shown_db_url

    try:
        return shown_db_url(url)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: show nothing of it
        return "(the configured store)"


def on_store(command: str, url: str) -> str:
    """`command` pointed at this store: `--db URL`, quoted for the shell (without it, the command would use the
    default store, not the one in view)."""
    return f"{command} --db {shlex.quote(shown_url(url))}"


def fill_command(url: str) -> str:
    """FILL_COMMAND writing to this store (without --db, bench would fill the default one)."""
    return on_store(FILL_COMMAND, url)


def left_out_text(ctx: Context, mode: str) -> str | None:
    """"the sidebar's filters leave out the store's 1 speculative run; widen them" where no run of `mode` ("spec",
    "ar") is in view and the store holds some: a page whose figures of that mode are missing says why (its own
    "no runs" line read as if the store had none). None where runs of it are in view or the store has none."""
    if (ctx.sel.runs["mode"] == mode).any():
        return None
    stored = int((data.filter_options(ctx.url)["runs"]["mode"] == mode).sum())
    if not stored:
        return None
    name = MODE_NAMES[mode]
    return f"the sidebar's filters leave out the store's {stored} {name} run{'s' if stored > 1 else ''}; widen them"


def show_left_out(ctx: Context) -> None:
    """One line per mode that `left_out_text` finds left out: the page's figures of it read "—" or are not drawn,
    and this says they are in the store."""
    for mode in ("spec", "ar"):
        text = left_out_text(ctx, mode)
        if text:
            st.info(md_safe(f"No {MODE_NAMES[mode]} runs in view: {text} to compare."))


def empty_store_message(url: str) -> None:
    st.info(f"The store has no runs yet ({shown_url(url)}). Measure speculative and autoregressive runs to "
            "fill it:")
    st.code(fill_command(url), language="bash")
    st.caption("Then reload this page. `specfinops dashboard --db URL` points the dashboard at another store.")


def run_page(title: str, body: Callable[[Context], None], caption: str | None = None, *,
             filtered: bool = True) -> None:
    """Title, the empty-store / synthetic-data notices, then `body(ctx)` guarded against exceptions. A page that
    the sidebar filters do not apply to (`filtered` False: the Reports page) is shown whatever they match, without
    the notices of the runs they select (the synthetic-data banner: the page says what its own figures hold)."""
    st.title(title)
    if caption:
        st.caption(caption)
    if not st.session_state.pop(PREPARED_KEY, False):  # the page runs on its own, without the entry file
        prepare()
        st.session_state.pop(PREPARED_KEY, None)
    ctx = st.session_state.get(CTX_KEY)
    if ctx == "error":
        return
    if ctx is None:
        empty_store_message(data.db_url())
        return
    if ctx.sel.synthetic and filtered:  # of the sidebar's runs: not what an unfiltered page shows
        st.warning("Synthetic data: some runs in view were made by the benchmark generator "
                   "(workload 'synthetic', host 'synthetic-generator'). They are not measurements.")
    if ctx.sel.runs.empty and filtered:
        st.info("No runs match these filters (none has requests in the selected time range or domain, or none "
                "has this invocation, node, pair, workload, temperature, top_p, top_k, max new tokens, run kind or "
                "concurrency). Widen the time range or reset the filters in the sidebar.")
        return
    try:
        body(ctx)
    except Exception as exc:  # noqa: BLE001 - shown to the user as one line, logged with its traceback
        _error(f"The {title} page", exc)


def throughput(value: float | None) -> str:
    """Tokens/s to three significant digits (3.02, 7.36, 43.2, 6.90), whole from 100 up (270, 1,234): a capacity
    of 3.02 read "3" hid the figure a node count is computed from, and 6.90 read "6.9" beside a "3.14". "—" when
    missing."""
    if value is None or value != value:
        return MISSING
    if abs(value) >= 100:
        return f"{value:,.0f}"
    shown = f"{value:#.3g}"  # '#': trailing zeros kept (6.90); 99.96 rounds to "100." (its point dropped)
    return f"{float(shown):,.0f}" if abs(float(shown)) >= 100 else shown.rstrip(".")


def number(value) -> str:
    """A table's number: whole thousands with separators, smaller figures to 4 significant digits (a node
    price of $0.0832/h is not "0.083", an energy cost of $0.00042 per 1M not "0.000"), "—" when missing."""
    if value is None or value != value:
        return MISSING
    if isinstance(value, bool):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def table_style(frame, money: Iterable[str] = ()):
    """How show_table renders `frame`: missing cells "—" (never blank, never "None" or 0), floats by
    `number`, the `money` columns (dollar amounts) by `usd_amount` as every other money figure ("4.2e-05" was an
    energy cost per 1M tokens of $0.000042), times to the second (a run's start read "23:41:27.786169")."""
    import pandas as pd

    times = [c for c in frame.columns if pd.api.types.is_datetime64_any_dtype(frame[c])]
    money = [c for c in money if c in frame.columns]
    floats = [c for c in frame.columns if pd.api.types.is_float_dtype(frame[c]) and c not in money]
    styled = frame.style.format(na_rep=MISSING, precision=3, thousands=",")
    if floats:
        styled = styled.format(number, subset=floats)
    if money:
        styled = styled.format(lambda v: usd_amount(None if pd.isna(v) else v), subset=money)
    if times:
        styled = styled.format(lambda v: MISSING if pd.isna(v) else f"{v:%Y-%m-%d %H:%M:%S}", subset=times)
    return styled


# st.dataframe's text for a null cell, where this Streamlit has the option (>= 1.52)
_MISSING_PLACEHOLDER = {"placeholder": MISSING} if "placeholder" in inspect.signature(st.dataframe).parameters else {}


def show_table(frame, height: int | None = None, money: Iterable[str] = ()) -> None:
    """`frame` as table_style renders it (`money`: its dollar-amount columns). A null cell reads "—" too: the grid
    draws nulls itself (as "None") whatever the Styler says, unless given its `placeholder` (Streamlit >= 1.52)."""
    st.dataframe(table_style(frame, money), hide_index=True, width="stretch", height=height if height else "auto",
                 **_MISSING_PLACEHOLDER)



def table_height(rows: int) -> int:
    """Pixel height that shows every row of a short table without an inner scrollbar."""
    return 36 * (rows + 1) + 4


def download_csv(label: str, frame, file_name: str, key: str) -> None:
    """A download button for a table, built (formula-safe) by telemetry.export only when clicked."""
    from telemetry.export import frame_to_csv_bytes

    st.download_button(label, data=lambda: frame_to_csv_bytes(frame), file_name=file_name, mime="text/csv",
                       key=key, on_click="ignore")
