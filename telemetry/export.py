"""CSV export of the store, streamed in constant memory; shared by `specfinops export` and the dashboard.

Rows come from a server-side cursor (`stream_results` + `yield_per`), so a 5-million-row token export
never holds more than one chunk. Every text cell is neutralised against spreadsheet formula injection:
a cell that starts with = + - @ tab or CR gets a leading apostrophe (OWASP's advice for CSV files).
Numbers are written as numbers; a missing value is an empty cell, never 0. Lines end in CRLF (RFC 4180),
so a CR or LF inside a cell is always quoted.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TextIO

from sqlalchemy import Select, case, func, select
from sqlalchemy.engine import Engine

from telemetry.db import PowerSample, Request, Run, Step, TokenEvent
from telemetry.queries import as_utc

EXPORT_KINDS = ("requests", "steps", "tokens", "power", "cost")
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
YIELD_PER = 10_000


@dataclass(frozen=True, slots=True)
class ExportWindow:
    """Which rows to export: request/sample time in [since, until), optionally one run, and optionally only the
    runs of one workload, target, node, mode or run kind, or only the rows sampled one way.

    The sampling selectors (temperature, top_p, top_k, max_new_tokens) read each request's own values where
    it recorded them (a server's requests each choose theirs) and else its run's, so a requests, steps or
    tokens export holds exactly the rows whose requests CSV columns show the value asked for. Power samples and
    the cost rows are per run: they read the run's values (a server's run records none, so matches no value).
    At temperature 0 top_p and top_k are off whatever was recorded: greedy rows match top_p 1 and top_k 0 only.
    An unknown value (NULL) matches nothing."""

    since: datetime | None = None
    until: datetime | None = None
    run_id: int | None = None
    workload: str | None = None
    target: str | None = None
    node_id: str | None = None
    mode: str | None = None
    kind: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    invocation_id: str | None = None  # one bench's or load test's runs

    def __post_init__(self) -> None:
        # the run filters' checks (mode and kind names, sampling ranges, since < until), and their normalised values
        f = self.run_filters()
        for name in ("since", "until", "temperature", "top_p", "top_k", "max_new_tokens"):
            object.__setattr__(self, name, getattr(f, name))

    def run_filters(self):
        """The same selection as `queries.Filters`, read at the run level (the cost rows, power samples)."""
        from telemetry.queries import Filters

        return Filters(since=self.since, until=self.until, run_ids=None if self.run_id is None else (self.run_id,),
                       workload=self.workload, target=self.target, node_id=self.node_id, mode=self.mode,
                       kind=self.kind, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                       max_new_tokens=self.max_new_tokens, invocation_id=self.invocation_id)

    def run_selectors(self):
        """`queries.Filters` of the run selectors alone (workload, target, node, mode, kind, invocation): Run
        columns only."""
        from telemetry.queries import Filters

        return Filters(workload=self.workload, target=self.target, node_id=self.node_id, mode=self.mode,
                       kind=self.kind, invocation_id=self.invocation_id)

    def selects_runs(self) -> bool:
        """Whether any selector beyond the time window and the run id is set."""
        return any(getattr(self, name) is not None for name in SELECTORS)


SELECTORS = ("workload", "target", "node_id", "mode", "kind", "temperature", "top_p", "top_k", "max_new_tokens",
             "invocation_id")


def parse_when(value: str | None, name: str) -> datetime | None:
    """ISO-8601 date or datetime -> aware UTC datetime (naive input is taken as UTC). None -> None; an empty
    value is refused (an unset shell variable would otherwise widen the window to the whole store)."""
    if value is None:
        return None
    if not value.strip():
        raise ValueError(f"{name} is empty: give an ISO date or time (e.g. 2026-11-02 or 2026-11-02T06:00), "
                         "or leave the option out")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{name} must be an ISO date or datetime like 2025-01-31 or 2025-01-31T12:00, got {value!r}") from None
    try:
        return as_utc(when, name)
    except ValueError:
        raise ValueError(f"{name} {value!r} is out of the range of dates") from None


def neutralise(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula gets a leading apostrophe."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, datetime):  # always written in UTC, whatever zone the database session is in
        if value.tzinfo is None:  # SQLite hands back naive UTC
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat()
    if isinstance(value, dict | list):
        return neutralise(str(value))
    return neutralise(value)


def _tpot_ms():
    """(E2E - TTFT) / (tokens - 1) where a request has two tokens or more (TPOT is undefined below: a failed
    or cancelled request keeps its times with 0 tokens, which read -200 ms)."""
    return case((Request.output_tokens > 1,
                 (Request.e2e_ms - Request.ttft_ms) / func.nullif(Request.output_tokens - 1, 0)), else_=None)


def _request_window(stmt: Select, window: ExportWindow) -> Select:
    """The window on a statement over requests (joined to runs): its time, run, run selectors and sampling, the
    sampling read per request (its own value, else its run's: the requests CSV's columns)."""
    from telemetry.queries import cutoff_matches

    if window.since is not None:
        stmt = stmt.where(Request.started_at >= window.since)
    if window.until is not None:
        stmt = stmt.where(Request.started_at < window.until)
    if window.run_id is not None:
        stmt = stmt.where(Request.run_id == window.run_id)
    stmt = stmt.where(*window.run_selectors().where())
    temperature = func.coalesce(Request.temperature, Run.temperature)
    if window.temperature is not None:
        stmt = stmt.where(temperature == window.temperature)
    if window.top_p is not None:
        stmt = stmt.where(cutoff_matches(func.coalesce(Request.top_p, Run.top_p), window.top_p, off=1.0,
                                         temperature=temperature))
    if window.top_k is not None:
        stmt = stmt.where(cutoff_matches(func.coalesce(Request.top_k, Run.top_k), window.top_k, off=0,
                                         temperature=temperature))
    if window.max_new_tokens is not None:
        stmt = stmt.where(func.coalesce(Request.max_new_tokens, Run.max_new_tokens) == window.max_new_tokens)
    return stmt


def _through_requests(stmt: Select, rows: type[Step] | type[TokenEvent], window: ExportWindow) -> Select:
    """The window on a statement over steps or token events: `rows.request_id IN (the requests it selects)`.

    Written as a join with the window on requests, SQLite (which has no statistics unless ANALYZE ran) took a
    one-sided `started_at >= ?` for unselective and read the whole table in id order to spare the sort: 0.54 s
    for the last 30 s's 14k token events on a store of 1.5M, growing with the store. Through the requests it
    finds the window's requests by their index, each one's rows by ix_*_request_id, and sorts only those (as
    app/dashboard/page_queries does): 0.075 s. The sort is the price where a selection is broad (half the store,
    `--mode spec`: 13% longer). Without a window or selector the table is still read in id order (streamed, no
    sort). The rows and their order are the same either way."""
    if window == ExportWindow():
        return stmt
    chosen = _request_window(select(Request.id).join(Run, Run.id == Request.run_id), window)
    return stmt.where(rows.request_id.in_(chosen))


def requests_query(window: ExportWindow) -> Select:
    stmt = (
        select(
            Request.id.label("request_id"),
            Request.run_id,
            Run.mode,
            Run.node_id,
            Run.target,
            Run.drafter,
            Run.workload,
            Request.domain,
            Request.external_id,
            Request.started_at,
            Request.prompt_tokens,
            Request.output_tokens,
            Request.num_drafts,
            Request.num_draft_tokens,
            Request.num_accepted_tokens,
            Request.ttft_ms,
            Request.e2e_ms,
            _tpot_ms().label("tpot_ms"),
            Request.energy_j,
            Run.power_source,
            # the request's own sampling (a server's requests each choose theirs), else its run's
            func.coalesce(Request.temperature, Run.temperature).label("temperature"),
            func.coalesce(Request.top_p, Run.top_p).label("top_p"),
            # likewise (migration 0010); empty where neither has one: a request recorded before 0010 of a server's
            # run or of one recorded before 0008, or a server request that asked for no seed
            func.coalesce(Request.top_k, Run.top_k).label("top_k"),
            func.coalesce(Request.seed, Run.seed).label("seed"),
            func.coalesce(Request.max_new_tokens, Run.max_new_tokens).label("max_new_tokens"),
            Request.status,
            Request.error,
            Run.invocation_id,  # the bench or load test that recorded it (empty: a server's, or before 0011)
        )
        .join(Run, Run.id == Request.run_id)
        .order_by(Request.id)
    )
    return _request_window(stmt, window)


def steps_query(window: ExportWindow) -> Select:
    stmt = (
        select(
            Step.id.label("step_id"),
            Step.request_id,
            Request.run_id,
            Step.step_index,
            Step.k,
            Step.accepted,
            Step.num_emitted,
            Step.draft_ms,
            Step.verify_ms,
            Step.batch_size,
            Step.k_reason,
            Step.t_offset_ms,
        )
        .join(Request, Request.id == Step.request_id)
        .order_by(Step.id)
    )
    return _through_requests(stmt, Step, window)


def tokens_query(window: ExportWindow) -> Select:
    stmt = (
        select(
            TokenEvent.id.label("token_event_id"),
            TokenEvent.request_id,
            Request.run_id,
            TokenEvent.position,
            TokenEvent.emit_offset_ms,
            TokenEvent.step_index,
            TokenEvent.source,
        )
        .join(Request, Request.id == TokenEvent.request_id)
        .order_by(TokenEvent.id)
    )
    return _through_requests(stmt, TokenEvent, window)


def power_query(window: ExportWindow) -> Select:
    stmt = select(
        PowerSample.id.label("sample_id"),
        PowerSample.run_id,
        PowerSample.t,
        PowerSample.device_index,
        PowerSample.power_w,
        PowerSample.energy_mj,
        PowerSample.utilization_pct,
        PowerSample.source,
    ).order_by(PowerSample.id)
    if window.since is not None:
        stmt = stmt.where(PowerSample.t >= window.since)
    if window.until is not None:
        stmt = stmt.where(PowerSample.t < window.until)
    if window.run_id is not None:
        stmt = stmt.where(PowerSample.run_id == window.run_id)
    if window.selects_runs():  # a sample belongs to a run, not a request: the run's own values
        runs = replace(window.run_filters(), since=None, until=None, run_ids=None)  # Run columns only
        stmt = stmt.join(Run, Run.id == PowerSample.run_id).where(*runs.where())
    return stmt


QUERIES: dict[str, Callable[[ExportWindow], Select]] = {
    "requests": requests_query,
    "steps": steps_query,
    "tokens": tokens_query,
    "power": power_query,
}


def iter_query_rows(engine: Engine, stmt: Select) -> tuple[list[str], Iterator[Sequence[Any]]]:
    """Header and a lazy row iterator over a server-side cursor; the connection closes when it ends.

    PostgreSQL plans a cursor for reading only its first tenth of rows (cursor_tuple_fraction 0.1): on a store
    whose statistics are stale or missing (bulk-loaded, not yet analysed) that chose a nested loop over the whole
    of token_events in id order for one run's export, 17-21 s where the plan for reading every row, which an
    export does, took 0.2 s of them; and on an analysed store it sorted half the store's token events (`--mode
    spec`) through a nested loop, 5.1 s against 1.2 s. The export's transaction says it reads them all (SET LOCAL:
    for this transaction only, the pooled connection is left as it was)."""
    header = [c.name for c in stmt.selected_columns]

    def rows() -> Iterator[Sequence[Any]]:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET LOCAL cursor_tuple_fraction = 1")
            result = conn.execution_options(stream_results=True, yield_per=YIELD_PER).execute(stmt)
            for partition in result.partitions():
                yield from partition

    return header, rows()


COST_HEADER = [
    "run_id", "mode", "node_id", "device", "target", "drafter", "workload", "started_at", "output_tokens",
    "wall_s", "tokens_per_s", "priced_as", "node_usd_per_hour", "usd_per_kwh", "pue", "hardware_usd_per_1m",
    "energy_usd_per_1m", "total_usd_per_1m", "energy_included", "energy_estimated", "note", "invocation_id",
    # as `cost --json` has them: a run still running, cancelled or failed, and a server's or load test's, are not
    # a completed bench (appended: the columns before keep their places)
    "kind", "status", "concurrency",
    # the share of wall_s the run is priced over: below 1 where a server's spec and AR runs shared one node's time
    # (queries.serve_node_shares), so wall_s x node_usd_per_hour is not its hardware cost there
    "node_share",
    # the time window the row's figures cover (requests started in [window_since, window_until), UTC; empty: no
    # bound): a run cut by midnight is a row in each day's export with the same started_at, each its own part
    "window_since", "window_until",
]


def cost_rows(engine: Engine, window: ExportWindow, *, filters=None, unpriced: bool = False,
              prices: dict | None = None, spills: dict | None = None) -> tuple[list[str], Iterator[Sequence[Any]]]:
    """Per-run cost per 1M tokens, from the shared aggregations (one implementation of every figure).
    `filters` (queries.Filters), where given, choose the runs instead of `window` (a report's runs). A run no
    price covers refuses the export (NoPriceError naming it and how to price it); with `unpriced` (a report's
    table, which names them and how) it is a row whose prices and costs are missing (None, never 0). `prices`:
    with `unpriced`, costs_and_unpriced's price keywords (a report's --gpu, --node-hourly-usd, --usd-per-kwh,
    --pue: its per-run rows priced as its modes table is). `spills`: the runs' window_spans.window_spills under
    `filters`, where the caller has them (a report's, read once); else read here."""
    from telemetry import costing  # lazy: only the cost export needs the FinOps aggregations

    if filters is None:
        filters = window.run_filters()
    if unpriced:
        run_costs, _, left_out = costing.costs_and_unpriced(engine, filters, **(prices or {}))
    else:
        run_costs, _ = costing.costs(engine, filters, unpriced_ways="or leave these runs out with a filter "
                                     "(--invocation, --node, --run, --since/--until)")  # export has no price flags
        left_out = []
    from telemetry.window_spans import spill_note, window_spills

    # a windowed row's priced span that reaches outside its window: said in its note (adjacent windows overlap)
    if spills is None:
        spills = window_spills(engine, filters, [rc.run.run_id for rc in run_costs] + [r.run_id for r in left_out])

    def note(r, c) -> str | None:
        said = c.reason if c is not None else f"no price for device {r.device!r}"
        spill = spills.get(r.run_id)
        return "; ".join(filter(None, [said, spill and spill_note(spill, filters.since, filters.until)])) or None

    def row(r, rc) -> tuple:
        c = rc.cost if rc is not None else None
        return (
            r.run_id, r.mode, r.node_id, r.device, r.target, r.drafter, r.workload, r.started_at,
            r.stats.output_tokens, r.stats.wall_s, r.stats.tokens_per_s, *(
                (rc.node_price.priced_as, rc.node_price.usd_per_hour, rc.usd_per_kwh, rc.pue, c.hardware_usd_per_1m,
                 c.energy_usd_per_1m, c.total_usd_per_1m, c.energy_included) if rc is not None
                else (None,) * 8),
            costing.run_energy_estimated(r), note(r, c),
            r.invocation_id, r.kind, r.status, r.concurrency, rc.node_share if rc is not None else None,
            filters.since, filters.until,
        )

    def rows() -> Iterator[Sequence[Any]]:
        found = [(rc.run, rc) for rc in run_costs] + [(r, None) for r in left_out]
        for r, rc in sorted(found, key=lambda x: x[0].run_id) if left_out else found:
            yield row(r, rc)

    return list(COST_HEADER), rows()


def _is_missing(value: Any) -> bool:
    try:
        return value is None or bool(value != value)  # NaN / NaT compare unequal to themselves
    except TypeError:  # pd.NA (a nullable column's missing value): its comparison is NA, whose truth is ambiguous
        return type(value).__name__ == "NAType"
    except ValueError:
        return False


def export_rows(engine: Engine, what: str, window: ExportWindow) -> tuple[list[str], Iterator[Sequence[Any]]]:
    """Header and lazy rows for one export kind."""
    if what not in EXPORT_KINDS:
        raise ValueError(f"--what must be one of {', '.join(EXPORT_KINDS)}, got {what!r}")
    if what == "cost":
        return cost_rows(engine, window)
    return iter_query_rows(engine, QUERIES[what](window))


ROW_IDS = {"requests": Request.id, "steps": Step.id, "tokens": TokenEvent.id, "power": PowerSample.id}


def count_rows(engine: Engine, what: str, window: ExportWindow, *, at_most: int | None = None) -> int:
    """How many rows an export of `what` (not cost) would write, counted in SQL over each row's id alone (read
    from the indexes that select them, no table row). With `at_most` counting stops past it: a result above
    `at_most` means "more than at_most", whatever the selection's size (the dashboard's cap on a download it
    builds in memory)."""
    ids = QUERIES[what](window).order_by(None).with_only_columns(ROW_IDS[what], maintain_column_froms=True)
    if at_most is not None:
        ids = ids.limit(at_most + 1)
    with engine.connect() as c:
        return int(c.scalar(select(func.count()).select_from(ids.subquery())) or 0)


def unmatched_selection_reason(engine: Engine, window: ExportWindow) -> str | None:
    """Why no run at all in the store matches the run selectors (workload, target, node, mode, kind, invocation),
    in `costing.no_runs_reason`'s words ("no runs with workload 'x' (workloads in the store: ...)"), as `cost`
    says it; None where some run matches them or none is given. The time window, --run and the sampling
    selectors are left out: they select rows of matching runs (an empty result is then a note, not an error)."""
    from telemetry.costing import no_runs_reason

    selectors = window.run_selectors()
    conditions = selectors.where()
    if not conditions:
        return None
    with engine.connect() as c:
        if c.execute(select(Run.id).where(*conditions).limit(1)).first() is not None:
            return None
    return no_runs_reason(engine, selectors)


# The sampling selectors: (field, name and plural in messages, as costing.no_runs_reason says them, a cut-off's
# off value or None)
_SAMPLING = (("temperature", "temperature", "temperatures", None), ("top_p", "top_p", "top_p values", 1.0),
             ("top_k", "top_k", "top_k values", 0), ("max_new_tokens", "max_new_tokens", "max_new_tokens values", None))


def unmatched_sampling_reason(engine: Engine, window: ExportWindow) -> str | None:
    """Why a sampling selector (temperature, top_p, top_k, max_new_tokens) matches nothing in the store (or the
    store has no runs, in costing.no_runs_reason's words): no run,
    and no request (its own value, else its run's, as the rows are selected), has that value, cut-offs as they act
    (at temperature 0 top_p and top_k are off); "no runs or requests with temperature 0.8 (temperatures in the
    store: 0)", as `cost` says it of runs. None where every value given is in the store (the selection may still
    hold no rows: they are not together, or not in the other selectors' runs: a note, not an error)."""
    from telemetry.costing import _listed
    from telemetry.queries import cutoff_matches, effective_cutoffs

    asked = [(field, name, plural, off) for field, name, plural, off in _SAMPLING if getattr(window, field) is not None]
    if not asked:
        return None
    req_temperature = func.coalesce(Request.temperature, Run.temperature)
    req_cols = {"temperature": req_temperature, "top_p": func.coalesce(Request.top_p, Run.top_p),
                "top_k": func.coalesce(Request.top_k, Run.top_k),
                "max_new_tokens": func.coalesce(Request.max_new_tokens, Run.max_new_tokens)}
    run_cols = {"temperature": Run.temperature, "top_p": Run.top_p, "top_k": Run.top_k,
                "max_new_tokens": Run.max_new_tokens}

    def matches(field: str, off, cols: dict, temperature):
        want = getattr(window, field)
        if off is not None:
            return cutoff_matches(cols[field], want, off=off, temperature=temperature)
        return cols[field] == want

    from telemetry.costing import no_runs_reason

    with engine.connect() as c:
        empty = c.execute(select(Run.id).limit(1)).first() is None
    if empty:  # as the run selectors say it: "the store has no runs; ..." and how to record some
        return no_runs_reason(engine)
    with engine.connect() as c:
        for field, name, plural, off in asked:
            if c.execute(select(Run.id).where(matches(field, off, run_cols, Run.temperature)).limit(1)).first():
                continue
            requests = select(Request.id).join(Run, Run.id == Request.run_id)
            if c.execute(requests.where(matches(field, off, req_cols, req_temperature)).limit(1)).first():
                continue
            have = set()
            for cols in (run_cols, req_cols):
                stmt = select(*(cols[k] for k in ("temperature", "top_p", "top_k", "max_new_tokens"))).distinct()
                if cols is req_cols:
                    stmt = stmt.select_from(Request).join(Run, Run.id == Request.run_id)
                for t, top_p, top_k, max_new in c.execute(stmt):
                    top_p, top_k = effective_cutoffs(t, top_p, top_k)
                    have.add({"temperature": t, "top_p": top_p, "top_k": top_k, "max_new_tokens": max_new}[field])
            want = getattr(window, field)
            return f"no runs or requests with {name} {want!r} ({plural} in the store: {_listed(have)})"
    return None


def empty_export_reason(engine: Engine, what: str, window: ExportWindow) -> str | None:
    """Why an export that wrote no rows selected none, where a particular reason holds: `--run` names a run the
    other run selectors (workload, target, node, mode, kind, invocation) leave out, a power export's selected
    runs all measured no power (power_source 'none'), or the selection has rows outside --since / --until only.
    None when none of these holds (the caller's general line)."""
    from telemetry.costing import no_runs_reason

    selectors = window.run_selectors()
    if window.run_id is not None and selectors.where():
        with engine.connect() as c:
            kept = c.execute(select(func.count(Run.id)).where(Run.id == window.run_id, *selectors.where())).scalar()
        if not kept:
            why = no_runs_reason(engine, replace(selectors, run_ids=(window.run_id,)))
            return f"run {window.run_id} does not match the selection ({why})"
    if what == "power":
        runs = replace(window.run_filters(), since=None, until=None)  # Run columns only, as power_query reads them
        with engine.connect() as c:
            sources = c.execute(select(Run.power_source, func.count(Run.id)).where(*runs.where())
                                .group_by(Run.power_source)).all()
        if sources and all(source == "none" for source, _ in sources):
            n = sum(count for _, count in sources)
            which = "the run selected" if n == 1 else f"the {n} runs selected"
            return (f"{which} measured no power (power_source 'none': recorded with no power source); runs "
                    "recorded with --power nvml, rapl or estimate have power samples")
    if window.since is not None or window.until is not None:
        return _outside_window_reason(engine, what, window)
    return None


def _outside_window_reason(engine: Engine, what: str, window: ExportWindow) -> str | None:
    """Where the selection has rows outside the time window only: when they lie (the window is what left them
    out); None where it has none at all either."""
    everywhere = replace(window, since=None, until=None)
    if what == "power":
        rows = power_query(everywhere).subquery()
        span = select(func.min(rows.c.t), func.max(rows.c.t))
        noun = "power samples were taken"
    else:  # requests, steps, tokens and cost rows are chosen by their requests' start
        span = _request_window(select(func.min(Request.started_at), func.max(Request.started_at))
                               .select_from(Request).join(Run, Run.id == Request.run_id), everywhere)
        rows = {"steps": Step, "tokens": TokenEvent}.get(what)
        if rows is not None:  # only the requests that have such rows: others inside the window explain nothing
            span = span.where(select(rows.id).where(rows.request_id == Request.id).exists())
        noun = f"requests with {what} started" if rows is not None else "requests started"
    with engine.connect() as c:
        first, last = c.execute(span).one()
    if first is None:
        return None

    def when(t: datetime | None) -> str:
        return "" if t is None else f"{_cell(t)[:19].replace('T', ' ')} UTC"

    bounds = (f"at or after {when(window.since)}" if window.until is None else f"before {when(window.until)}"
              if window.since is None else f"from {when(window.since)} to {when(window.until)}")
    lies = f"from {when(first)} to {when(last)}" if when(first) != when(last) else f"at {when(first)}"
    return f"none in the time window ({bounds}); the selection's {noun} {lies}"


def write_csv(
    out: TextIO,
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    progress: Callable[[int], None] | None = None,
    progress_every: int = 250_000,
) -> int:
    """Write header + neutralised rows to `out`; returns the number of data rows written."""
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([neutralise(h) for h in header])
    n = 0
    for row in rows:
        writer.writerow([_cell(v) for v in row])
        n += 1
        if progress is not None and n % progress_every == 0:
            progress(n)
    return n


def iter_csv_chunks(header: Sequence[str], rows: Iterable[Sequence[Any]], chunk_rows: int = 5_000) -> Iterator[str]:
    """CSV text in chunks of `chunk_rows` rows: for HTTP/streamed downloads without holding the file."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow([neutralise(h) for h in header])
    n = 0
    for row in rows:
        writer.writerow([_cell(v) for v in row])
        n += 1
        if n % chunk_rows == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    tail = buf.getvalue()
    if tail:
        yield tail


def frame_to_csv_bytes(frame) -> bytes:
    """A (small) pandas DataFrame as neutralised UTF-8 CSV bytes: the dashboard's table downloads."""
    header = [str(c) for c in frame.columns]
    rows = (tuple(None if _is_missing(v) else v for v in row) for row in frame.itertuples(index=False))
    return "".join(iter_csv_chunks(header, rows)).encode("utf-8")
