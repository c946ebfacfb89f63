"""Cost reports: the figures of one period, the previous period, and anomaly bands over the periods before.

Every figure comes from `telemetry.queries` (mode_summaries, costs, acceptance_by_domain, speedups,
project_from_store): the report shows the numbers `specfinops cost` and the dashboard show, never a second
computation of them. This module only picks the window, lines periods up and checks bands.

Periods (UTC): daily = the previous full day (midnight to midnight), weekly = the previous full ISO week
(Monday to Monday), monthly = the previous full calendar month (the 1st 00:00 to the next 1st 00:00),
custom = [since, until). `--since` or `--until` anchors a daily/weekly/monthly period (a month's: a 1st, 00:00).
Anomaly band: mean +- 3 sample standard deviations of the same figure over the previous `history` periods of
the same length (a month's: the calendar months before it, 28 to 31 days each); fewer than MIN_HISTORY periods
with a value -> "not enough history", said as such.

Public API:
    period_window(period, *, now=None, since=None, until=None) -> Window
    build_report(engine, window, *, sla_ms, history, daily_tokens=None, peak_factor=1.0, pricing=Pricing())
        -> ReportData
    band_check(metric, value, history, *, min_history=MIN_HISTORY, k=BAND_SD) -> BandCheck
    summary_dict(data) -> dict      # JSON-safe: reports.summary, the webhook payload
    report_tables(data, engine) -> list[Table]   # the tables of the HTML page and its CSV files
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from telemetry import costing, finops, queries
from telemetry.labels import go_text, short_device, short_model, short_workload
from telemetry.queries import Filters

PERIODS = ("daily", "weekly", "monthly", "custom")  # as report --period's help lists them
SCHEDULED_PERIODS = ("daily", "weekly", "monthly")
PERIOD_LENGTH = {"daily": timedelta(days=1), "weekly": timedelta(days=7)}  # a month has none: add_months
MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
               "November", "December")  # not %B: that follows the process's locale
ALPHA_GO = queries.GO_LINE  # the go/no-go line, judged on alpha where steps exist (as calibrate)
DEFAULT_SLA_MS = 50.0
DEFAULT_HISTORY = 7
MIN_HISTORY = 3
BAND_SD = 3.0


# ---- periods --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """A report's period, and the runs it covers: those recorded at `temperature`, of run `kind`, sampled with
    `top_p` / `top_k`, capped at `max_new_tokens` new tokens, of `workload`, of `target` and of one bench or load
    test (`invocation_id`) where set (None: every run), as `specfinops cost --temperature --run-kind --top-p --top-k
    --max-new-tokens --workload --target --invocation` filter them (a greedy run counts as top_p 1, top_k 0:
    queries.Filters)."""

    period: str
    since: datetime
    until: datetime
    temperature: float | None = None
    kind: str | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    workload: str | None = None
    target: str | None = None
    invocation_id: str | None = None  # `report --invocation` (whole id); scheduled reports have none

    def __post_init__(self) -> None:
        # the instants the store compares and the labels say ('... UTC'), whatever offset they were given at
        object.__setattr__(self, "since", queries.as_utc(self.since, "since"))
        object.__setattr__(self, "until", queries.as_utc(self.until, "until"))

    @property
    def length(self) -> timedelta:
        """The window's own length: a monthly one's is its month's (28 to 31 days)."""
        return self.until - self.since

    def shifted(self, n: int) -> Window:
        """The window n periods earlier (n=1: the previous period), of the same runs: n lengths earlier, and for
        a monthly window the n calendar months before it (moved by its own length, October's previous period
        began on Aug 31 and its history periods were all 31 days long)."""
        if self.period == "monthly":
            return replace(self, since=add_months(self.since, -n), until=add_months(self.until, -n))
        return replace(self, since=self.since - n * self.length, until=self.until - n * self.length)

    def filters(self) -> Filters:
        return Filters(since=self.since, until=self.until, temperature=self.temperature, kind=self.kind,
                       top_p=self.top_p, top_k=self.top_k, max_new_tokens=self.max_new_tokens,
                       workload=self.workload, target=self.target, invocation_id=self.invocation_id)  # fmt: skip

    def runs_text(self) -> str:
        """Which runs the window covers, in words ("" for every run)."""
        return runs_covered_text(self.temperature, self.kind, self.top_p, self.top_k, self.max_new_tokens,
                                 self.workload, self.target, self.invocation_id)  # fmt: skip

    @property
    def time_format(self) -> str:
        """To the second where a bound has seconds (a bench's own span, `report --invocation`), else to the minute;
        the same for every period of a report (they are shifted by whole lengths)."""
        return "%Y-%m-%d %H:%M:%S" if self.since.second or self.until.second else "%Y-%m-%d %H:%M"

    def span_text(self) -> str:
        """'2026-11-02 00:00 to 2026-11-03 00:00 UTC'."""
        return f"{time_text(self.since, self.time_format)} to {time_text(self.until, self.time_format)} UTC"

    def month_text(self) -> str | None:
        """'October 2026' for a monthly window (one whole calendar month), else None."""
        if self.period != "monthly" or not is_month_start(self.since) or self.until != add_months(self.since, 1):
            return None
        return f"{MONTH_NAMES[self.since.month - 1]} {self.since.year:04d}"

    def period_text(self) -> str:
        """The span in words: 'October 2026 (2026-10-01 00:00 to 2026-11-01 00:00 UTC)' for a month, else
        span_text."""
        month = self.month_text()
        return self.span_text() if month is None else f"{month} ({self.span_text()})"

    def point_text(self) -> str:
        """The period as a point of a trend: '2026-10' for a month, else its start."""
        return time_text(self.since, "%Y-%m" if self.month_text() else self.time_format)

    def label(self) -> str:
        runs = self.runs_text()
        return f"{self.period} {self.period_text()}" + (f" ({runs} only)" if runs else "")


def runs_covered_text(temperature: float | None, kind: str | None, top_p: float | None = None,
                      top_k: int | None = None, max_new_tokens: int | None = None, workload: str | None = None,
                      target: str | None = None, invocation_id: str | None = None) -> str:
    """Which runs a report covers, in words ("" for every run): "invocation 1f3a9c2e, workload 'code', target 'm',
    temperature 0.8, top_k 40, 128 new tokens, bench runs". A cut-off chosen is said even where it is off ('top_k
    0': the runs not cut by top_k, greedy ones included); an invocation by the 8 characters bench prints."""
    said = [f"invocation {invocation_id[:8]}"] if invocation_id is not None else []
    said += [f"{name} {value!r}" for name, value in (("workload", workload), ("target", target)) if value is not None]
    said += [costing.temperature_text(temperature)] if temperature is not None else []
    said += [f"{name} {value:g}" for name, value in (("top_p", top_p), ("top_k", top_k)) if value is not None]
    said += [queries.max_new_tokens_text(max_new_tokens)] if max_new_tokens is not None else []
    return ", ".join(said + ([f"{kind} runs"] if kind else []))


def time_text(when: datetime, fmt: str) -> str:
    """`when.strftime(fmt)` with %Y as four digits: glibc's strftime writes the year as it is, so year 1 was
    '1-01-08' (and a report folder 'report-3-daily-10108T0000Z'), not '0001-01-08' as ISO and the options read it."""
    return when.strftime(fmt.replace("%Y", f"{when.year:04d}"))


def is_month_start(d: datetime) -> bool:
    return d.day == 1 and (d.hour, d.minute, d.second, d.microsecond) == (0, 0, 0, 0)


def add_months(d: datetime, n: int) -> datetime:
    """`d` moved n calendar months (n < 0: back), its day and time kept: meant for a 1st, which every month has.
    OverflowError outside years 1-9999, as a timedelta's sum there."""
    months = d.year * 12 + d.month - 1 + n
    if not 1 <= months // 12 <= 9999:
        raise OverflowError(f"{n} months from {time_text(d, '%Y-%m')} is outside years 1-9999")
    return d.replace(year=months // 12, month=months % 12 + 1)


def _month_window(now: datetime | None, since: datetime | None, until: datetime | None) -> Window:
    """monthly: the last full calendar month before `now`, the month starting at `since` or the one ending at
    `until`; an anchor must be a 1st at 00:00 UTC (a date in mid-month would make a 'month' of two halves)."""
    if since is not None and until is not None:
        raise ValueError("--period monthly is one calendar month: give --since or --until, not both")
    for flag, at in (("--since", since), ("--until", until)):
        if at is not None and not is_month_start(at):
            raise ValueError(f"{flag} of --period monthly must be the first of a month at 00:00 UTC (e.g. "
                             f"{flag} 2026-10-01), got {time_text(at, '%Y-%m-%d %H:%M:%S')} UTC")
    if since is not None:
        return Window("monthly", since, add_months(since, 1))
    if until is None:
        now = queries.as_utc(now or datetime.now(UTC), "now")
        until = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return Window("monthly", add_months(until, -1), until)


def period_window(
    period: str, *, now: datetime | None = None, since: datetime | None = None, until: datetime | None = None
) -> Window:
    """The report window. daily/weekly/monthly: the last full period before `now` (UTC), or the period starting
    at `since` / ending at `until`; custom: [since, until), both required."""
    if period not in PERIODS:
        raise ValueError(f"--period must be one of {', '.join(PERIODS)}, got {period!r}")
    since = None if since is None else queries.as_utc(since, "--since")
    until = None if until is None else queries.as_utc(until, "--until")
    if period == "custom":
        if since is None or until is None:
            raise ValueError("--period custom needs both --since and --until")
        if since >= until:
            raise ValueError(f"--since ({since.isoformat()}) must be before --until ({until.isoformat()})")
        return Window(period, since, until)
    if period == "monthly":
        return _month_window(now, since, until)
    length = PERIOD_LENGTH[period]
    if since is not None and until is not None:
        raise ValueError(f"--period {period} is {length.days} day(s) long: give --since or --until, not both")
    if since is not None:
        return Window(period, since, since + length)
    if until is None:
        now = queries.as_utc(now or datetime.now(UTC), "now")
        until = now.replace(hour=0, minute=0, second=0, microsecond=0)
        if period == "weekly":
            until -= timedelta(days=until.weekday())  # Monday 00:00
    return Window(period, until - length, until)


# ---- prices ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pricing:
    """The prices a report costs its runs at where given, as `specfinops project` takes them (--gpu,
    --gpus-per-node, --node-hourly-usd, --usd-per-kwh, --pue); None (and 1 GPU per node): each run's recorded
    price, else the catalog's. Every run's cost takes them as `specfinops cost` does (--gpu x the GPUs of the
    run's device); the projection as `specfinops project` does (--gpu x --gpus-per-node)."""

    gpu: str | None = None
    gpus_per_node: int = 1
    node_hourly_usd: float | None = None
    usd_per_kwh: float | None = None
    pue: float | None = None

    def cost_prices(self) -> dict:
        """costing.costs' keywords (a run is priced per GPU it ran on: no GPUs per node)."""
        return {"gpu": self.gpu, "node_hourly_usd": self.node_hourly_usd, "usd_per_kwh": self.usd_per_kwh,
                "pue": self.pue}

    def projection_prices(self) -> dict:
        """costing.project_from_store's keywords."""
        return {**self.cost_prices(), "gpus_per_node": self.gpus_per_node}

    def flags(self) -> list[str]:
        """The options that give these prices (`specfinops report` and `project` take them); [] for none."""
        out: list[str] = []
        for flag, value, unset in (("--gpu", self.gpu, None), ("--gpus-per-node", self.gpus_per_node, 1),
                                   ("--node-hourly-usd", self.node_hourly_usd, None),
                                   ("--usd-per-kwh", self.usd_per_kwh, None), ("--pue", self.pue, None)):
            if value != unset:
                out += [flag, repr(value) if isinstance(value, float) else str(value)]  # every digit given
        return out

    def text(self) -> str | None:
        """'--gpu H100 --gpus-per-node 8'; None where no price was given."""
        return " ".join(self.flags()) or None

    def as_dict(self) -> dict:
        return {"gpu": self.gpu, "gpus_per_node": self.gpus_per_node, "node_hourly_usd": self.node_hourly_usd,
                "usd_per_kwh": self.usd_per_kwh, "pue": self.pue}


# ---- figures of one period ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeriodFigures:
    """The shared query results for one window (mode order: spec, ar)."""

    window: Window
    modes: dict[str, queries.ModeSummary]
    mode_costs: dict[str, costing.ModeCost]
    run_costs: tuple[costing.RunCost, ...] = ()
    # the runs no price covers (a device no catalog entry matches, no price recorded with the run): their costs
    # missing, each mode's cost over its priced runs only (`priced_over`)
    unpriced_runs: tuple[queries.RunSummary, ...] = ()

    @property
    def unpriced(self) -> str | None:
        """Why some of the period's runs have no cost: those runs, by device, and how to price them
        (costing.unpriced_text); None where every run is priced."""
        if not self.unpriced_runs:
            return None
        return costing.unpriced_text(costing.unpriced_by_device(self.unpriced_runs), None)

    def priced_over(self, mode: str) -> str | None:
        """'over 3 of 4 runs; run 7 (device 'X') has no price' where the mode's cost leaves some of its runs out
        (costing.priced_share_text), so that its figure is never read as the whole mode's; None otherwise."""
        return costing.priced_share_text(self.mode_costs.get(mode), mode, self.unpriced_runs)

    @property
    def has_traffic(self) -> bool:
        return bool(self.modes)

    def output_tokens(self) -> int:
        return sum(m.stats.output_tokens for m in self.modes.values())

    def requests(self) -> int:
        return sum(m.stats.num_requests_ok + m.stats.num_requests_failed for m in self.modes.values())

    def cost_per_1m(self, mode: str) -> float | None:
        mc = self.mode_costs.get(mode)
        return None if mc is None else mc.cost.total_usd_per_1m

    def hardware_per_1m(self, mode: str) -> float | None:
        mc = self.mode_costs.get(mode)
        return None if mc is None else mc.cost.hardware_usd_per_1m

    def energy_included(self, mode: str) -> bool | None:
        """Whether the mode's total cost includes energy; None where there is no total."""
        mc = self.mode_costs.get(mode)
        return None if mc is None or mc.cost.total_usd_per_1m is None else mc.cost.energy_included

    def stat(self, mode: str, name: str) -> Any:
        m = self.modes.get(mode)
        return None if m is None else getattr(m.stats, name)

    def _runs(self, mode: str, *, with_tokens: bool = False) -> list[queries.RunSummary]:
        """The mode's priced runs (those its cost is over)."""
        return [rc.run for rc in self.run_costs
                if rc.run.mode == mode and (rc.run.stats.output_tokens or not with_tokens)]

    def all_runs(self, mode: str) -> list[queries.RunSummary]:
        """Every run of the mode, priced or not (those its J/token and its other figures are over)."""
        return self._runs(mode) + [r for r in self.unpriced_runs if r.mode == mode]

    def energy_source(self, mode: str) -> str | None:
        """The energy basis of the mode's total cost: NO_ENERGY where it is hardware only, else where its energy
        comes from (costing.energy_source: measured, estimated, partly estimated); None where there is no total."""
        included = self.energy_included(mode)
        if included is None:
            return None
        return costing.energy_source(self._runs(mode, with_tokens=True)) if included else NO_ENERGY

    def j_source(self, mode: str) -> str | None:
        """Where the mode's J/token comes from (measured, estimated, partly estimated); None without one. Over
        every run of the mode, as the J/token is: over the priced runs only, a mode whose unpriced run had
        estimated power lost its 'estimated' label."""
        if self.stat(mode, "j_per_token") is None:
            return None
        return costing.energy_source(self.all_runs(mode))


def period_figures(engine: Engine, window: Window, pricing: Pricing = Pricing()) -> PeriodFigures:
    """One window's figures, its runs costed at `pricing`. Where some of its runs have no price (a device no
    catalog entry covers), the priced runs keep their costs, each mode's over its priced runs (and says so:
    `priced_over`), and the others are named with how to price them: every other figure stands (that error
    failed the report, and every scheduled run whose history held such a period; then it dropped every cost)."""
    f = window.filters()
    run_costs, mode_costs, unpriced = costing.costs_and_unpriced(engine, f, **pricing.cost_prices())
    return PeriodFigures(
        window,
        {m.mode: m for m in queries.mode_summaries(engine, f)},
        {mc.mode: mc for mc in mode_costs},
        tuple(run_costs),
        tuple(unpriced),
    )


# ---- costs on one energy basis --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CostMetric:
    """A mode's cost per 1M tokens as a compared figure: the total where the periods compared share an energy
    basis (energy included in none of them, or in all of them from the same kind of source), else the
    hardware part of each (`comparable_costs`). Called on one period it is that period's total."""

    mode: str

    def __call__(self, f: PeriodFigures) -> float | None:
        return f.cost_per_1m(self.mode)


@dataclass(frozen=True, slots=True)
class JPerTokenMetric:
    """A mode's J/token as a compared figure; `estimate_sources` says where it rests on estimated power."""

    mode: str

    def __call__(self, f: PeriodFigures) -> float | None:
        return f.stat(self.mode, "j_per_token")


TOTAL_BASIS = "total"
NO_ENERGY = "none"  # PeriodFigures.energy_source of a hardware-only total


def comparable_costs(periods: Sequence[PeriodFigures], mode: str) -> tuple[list[float | None], str]:
    """The mode's cost per 1M tokens in each period on one energy basis, and that basis in words: the totals
    when every period with a total has the same basis, else the hardware parts (a total with estimated energy
    against a hardware-only one would show the energy as a change in cost, and one with estimated energy
    against one with metered energy would show the estimate's error as one)."""
    bases = [p.energy_source(mode) for p in periods]
    known = [b for b in bases if b is not None]
    if len(set(known)) <= 1:
        return [p.cost_per_1m(mode) for p in periods], TOTAL_BASIS
    values = [p.hardware_per_1m(mode) for p in periods]
    included = [b != NO_ENERGY for b in known]
    if len(set(included)) > 1:
        if len(periods) == 2:
            where = "this period only" if bases[0] != NO_ENERGY else "the previous period only"
            return values, f"hardware part only: energy included in {where}"
        return values, (f"hardware part only: energy included in {sum(included)} of the {len(known)} periods "
                        "with a cost")
    # energy in every period with a cost, metered in some and estimated in others
    if len(periods) == 2:
        return values, f"hardware part only: energy {bases[0]} in this period, {bases[1]} in the previous one"
    counts = ", ".join(f"{source} in {known.count(source)}" for source in
                       (costing.MEASURED, costing.ESTIMATED, costing.PARTLY_ESTIMATED) if source in known)
    return values, f"hardware part only: energy {counts} of the {len(known)} periods with a cost"


def priced_over_text(get: Callable[[PeriodFigures], float | None], periods: Sequence[PeriodFigures],
                     names: Sequence[str]) -> str:
    """Where a compared cost is over only some of its mode's runs in a period (the others have no price): 'this
    period's over 1 of 2 runs; run 7 (device 'X') has no price', per period named in `names` (a change against a
    period priced over all of its runs is not like for like, and must say so); '' for other figures or where
    every run is priced."""
    if not isinstance(get, CostMetric):
        return ""
    return "; ".join(f"{name}'s over {share.removeprefix('over ')}" for name, p in zip(names, periods, strict=False)
                     if (share := p.priced_over(get.mode)) and p.cost_per_1m(get.mode) is not None)


def j_per_token_mismatch(periods: Sequence[PeriodFigures], mode: str) -> str | None:
    """Why the mode's J/token is not compared across two periods: their energy comes from different kinds of
    source (metered in one, estimated or partly estimated in the other), so the change would show the estimate's
    error as one (as `comparable_costs` says of costs); None where they are comparable or a side has none."""
    sources = [p.j_source(mode) for p in periods]
    if None in sources or len(set(sources)) <= 1:
        return None
    return f"not compared: energy {sources[0]} in this period, {sources[1]} in the previous one"


def estimate_sources(get: Callable[[PeriodFigures], float | None], periods: Sequence[PeriodFigures],
                     basis: str | None) -> list[str | None]:
    """Per period, whether its compared figure rests on estimated power: 'estimated' or 'partly estimated',
    else None (metered, no energy in it, or a figure that is no energy figure). A cost compared on its
    hardware part holds no energy."""
    if isinstance(get, CostMetric):
        sources = [p.energy_source(get.mode) if basis == TOTAL_BASIS else None for p in periods]
    elif isinstance(get, JPerTokenMetric):
        sources = [p.j_source(get.mode) for p in periods]
    else:
        return [None] * len(periods)
    return [s if s in (costing.ESTIMATED, costing.PARTLY_ESTIMATED) else None for s in sources]


def estimated_text(sources: Sequence[str | None], names: Sequence[str]) -> str:
    """'this period', 'previous period (partly)', 'this period and previous period': the periods named in
    `names` whose figure rests on estimated power; empty where none does."""
    return " and ".join(name + (" (partly)" if s == costing.PARTLY_ESTIMATED else "")
                        for name, s in zip(names, sources, strict=True) if s)


# ---- anomaly bands --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BandCheck:
    metric: str
    value: float | None
    num_history: int  # previous periods that have a value
    mean: float | None
    sd: float | None
    low: float | None
    high: float | None
    # anomaly | within band | not enough history | no value this period | not checked (NOT_CHECKED: a total of a
    # period that had not ended)
    status: str
    note: str
    basis: str | None = None  # a cost: "total", or its hardware part where the periods' energy bases differ
    estimated: str = ""  # which of the compared values rest on estimated power (`estimated_text`), if any


def band_check(
    metric: str,
    value: float | None,
    history: Sequence[float | None],
    *,
    min_history: int = MIN_HISTORY,
    k: float = BAND_SD,
) -> BandCheck:
    """Is `value` outside mean +- k sd of the known `history` values? Needs `min_history` of them."""
    if min_history < 2:
        raise ValueError(f"min_history must be >= 2 (a standard deviation needs two values), got {min_history!r}")
    known = [float(v) for v in history if v is not None and math.isfinite(v)]
    if value is None:
        return BandCheck(metric, None, len(known), None, None, None, None, "no value this period",
                         "the figure cannot be computed for this period")  # fmt: skip
    if len(known) < min_history:
        return BandCheck(
            metric, value, len(known), None, None, None, None, "not enough history",
            f"{len(known)} of the previous {len(history)} periods have this figure; the band needs {min_history}",
        )  # fmt: skip
    mean, sd = statistics.fmean(known), statistics.stdev(known)
    low, high = mean - k * sd, mean + k * sd
    tol = 1e-9 * max(1.0, abs(mean))  # a constant history must not flag float noise
    outside = value < low - tol or value > high + tol
    note = f"band = mean +- {k:g} sd of the previous {len(known)} periods with a value"
    return BandCheck(metric, value, len(known), mean, sd, low, high, "anomaly" if outside else "within band", note)


# Figures checked against their band: (name, getter). Cost per token and acceptance (issue 9).
# A CostMetric compares totals only where every period shares an energy basis (`comparable_costs`).
BAND_METRICS: tuple[tuple[str, Callable[[PeriodFigures], float | None]], ...] = (
    ("spec cost per 1M tokens (USD)", CostMetric("spec")),
    ("AR cost per 1M tokens (USD)", CostMetric("ar")),
    ("spec acceptance rate", lambda f: f.stat("spec", "acceptance_rate")),
)


def compared_values(get: Callable[[PeriodFigures], float | None],
                    periods: Sequence[PeriodFigures]) -> tuple[list[float | None], str | None]:
    """A figure over several periods, and for a cost the energy basis they are compared on (None otherwise)."""
    if isinstance(get, CostMetric):
        return comparable_costs(periods, get.mode)
    return [get(p) for p in periods], None


def _band(name: str, get: Callable[[PeriodFigures], float | None], current: PeriodFigures,
          past: Sequence[PeriodFigures]) -> BandCheck:
    periods = [current, *past]
    values, basis = compared_values(get, periods)
    sources = estimate_sources(get, periods, basis)
    parts = [estimated_text(sources[:1], ["this period"])] if values[0] is not None and sources[0] else []
    before = [src for src, v in zip(sources[1:], values[1:], strict=True) if v is not None]
    if any(before):
        parts.append(f"{sum(1 for src in before if src)} of the {len(before)} previous periods with a value")
    estimated = " and ".join(parts)
    b = replace(band_check(name, values[0], values[1:]), basis=basis, estimated=estimated)
    # a cost over only some of its mode's runs (the others have no price), this period's or a previous one's
    partly = priced_over_text(get, periods[:1], ["this period"])
    before = sum(1 for p, v in zip(periods[1:], values[1:], strict=True)
                 if v is not None and priced_over_text(get, [p], ["a period"]))
    if before:
        partly = "; ".join(filter(None, [partly, f"{before} of the previous periods' over their priced runs only"]))
    note = b.note if basis in (None, TOTAL_BASIS) else f"{basis}; {b.note}"
    return replace(b, note=f"{partly}; {note}" if partly else note)


# How a report's reader projects another comparable group than the one the report's projection chose: the
# `project` filters that tell the groups in view apart (Comparison.choose_flags), each with what it takes.
_CHOOSE_VALUES = {"--temperature": "T", "--top-p": "P", "--top-k": "N", "--max-new-tokens": "N", "--run-kind": "KIND",
                  "--workload": "W", "--target": "MODEL"}


def report_choose(comparison: costing.Comparison) -> str:
    """'`specfinops project --temperature T` or `specfinops project --invocation ID` projects another': the
    fields' filters together, --node NODE and --invocation ID each alone, only those that tell the groups apart;
    costing.NO_CHOOSE where none does."""
    flags = comparison.choose_flags()
    by_field = [f"{f} {_CHOOSE_VALUES[f]}" for f in flags if f in _CHOOSE_VALUES]
    ways = [*([" ".join(by_field)] if by_field else []), *(f for f in flags if f not in _CHOOSE_VALUES)]
    if not ways:
        return costing.NO_CHOOSE
    return f"{' or '.join(f'`specfinops project {w}`' for w in ways)} projects another"


# ---- the report -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProjectionResult:
    projection: costing.StoreProjection | None
    reason: str | None  # why there is no projection
    daily_tokens: float | None
    daily_tokens_basis: str
    peak_factor: float
    sla_ms: float
    measured_traffic: bool = False  # daily tokens = this period's own output tokens (no --daily-tokens)

    @property
    def sla_curve(self) -> list[finops.SlaPoint]:
        """The projection at every SLA where it can change (empty without a projection)."""
        return [] if self.projection is None else self.projection.sla_curve()


@dataclass(frozen=True, slots=True)
class ReportData:
    window: Window
    generated_at: datetime
    sla_ms: float
    pricing: Pricing
    current: PeriodFigures
    previous: PeriodFigures
    history: tuple[PeriodFigures, ...]  # previous periods, most recent first (history[0] is `previous`)
    domains: tuple[queries.DomainAcceptance, ...]
    speedups: tuple[queries.Speedup, ...]
    projection: ProjectionResult
    bands: tuple[BandCheck, ...]
    synthetic_runs: int = 0  # runs in the period the synthetic data generator made (queries.synthetic_runs)
    # where the period's runs' priced spans reach outside it (window_spans.spills_text): adjacent periods' costs
    # overlap by up to that; None where none does
    window_overlap: str | None = None
    # per run whose priced span reaches outside the period, by how far (window_spans.window_spills): read once,
    # for window_overlap and the runs_cost table's notes
    spills: dict = field(default_factory=dict)

    @property
    def has_traffic(self) -> bool:
        return self.current.has_traffic

    def small_sample_text(self) -> str | None:
        """`cost`'s caveat where a mode measured in the period has too few ok requests for its figures to be stable
        (costing.small_sample_text); None otherwise (a mode with none is not a small sample)."""
        requests = {mode: self.current.stat(mode, "num_requests_ok") or 0 for mode in self.current.modes}
        # how to measure more, for the kinds of the runs each mode's count is over (ModeSummary.run_ids)
        kind_of = {r.run_id: r.kind for r in (*(rc.run for rc in self.current.run_costs), *self.current.unpriced_runs)}
        kinds = {mode: {kind_of[i] for i in m.run_ids if i in kind_of} for mode, m in self.current.modes.items()}
        return costing.small_sample_text(requests, what="a tokens/s and a cost per 1M tokens", kinds=kinds)

    def synthetic_text(self) -> str | None:
        """The dashboard's synthetic-data warning, for the period's runs; None where none is synthetic."""
        n = self.synthetic_runs
        if not n:
            return None
        total = len(self.current.run_costs) + len(self.current.unpriced_runs)
        return (f"synthetic data: {n} of the {max(total, n)} runs in this period were made by the benchmark "
                f"generator (workload '{queries.SYNTHETIC_WORKLOAD}', host '{queries.SYNTHETIC_HOSTNAME}'); their "
                "figures are not measurements")


def daily_tokens_basis(tokens: int, days: float) -> str:
    """How a projection on a period's own traffic reads its daily tokens, the sum spelled out: 'this period's
    94,266 output tokens over 7 days = 13,467 per day' (the report's CSV, page and summary all show this)."""
    daily = tokens / days
    per_day = f"{daily:,.0f}" if daily >= 100 else f"{daily:.3g}"
    shown = f"{days:.4g}"
    return f"this period's {tokens:,} output tokens over {shown} day{'' if shown == '1' else 's'} = {per_day} per day"


def _projection(
    engine: Engine, current: PeriodFigures, sla_ms: float, daily_tokens: float | None, peak_factor: float,
    pricing: Pricing, speedups: Sequence[queries.Speedup] | None = None,
) -> ProjectionResult:
    """The report's projection; `speedups`: the period's (the report's own), not queried again for its caveat."""
    measured = daily_tokens is None
    if measured:
        days = current.window.length.total_seconds() / 86_400  # a month's own 28 to 31 days
        tokens = current.output_tokens()
        daily = tokens / days if tokens else None
        basis = daily_tokens_basis(tokens, days)
    else:
        daily, basis = float(daily_tokens), "given (--daily-tokens)"
    if measured and current.window.invocation_id is not None:  # 132 tokens in 2 s read as 5.7M tokens a day
        return ProjectionResult(None, "a bench's or load test's own output tokens are not daily traffic: give "
                                "--daily-tokens to size a fleet on its runs", None, "not measured (one invocation)",
                                peak_factor, sla_ms, measured)
    if daily is None:
        return ProjectionResult(None, "no output tokens in this period", None, basis, peak_factor, sla_ms, measured)
    if daily < finops.MIN_DAILY_TOKENS:  # a whole node's cost over a fraction of a token a day
        return ProjectionResult(None, f"under {finops.MIN_DAILY_TOKENS:g} output token a day in this period: too "
                                "little traffic to size a fleet on (give --daily-tokens)", daily, basis, peak_factor,
                                sla_ms, measured)  # fmt: skip
    try:
        sp = costing.project_from_store(
            engine, current.window.filters(), daily_tokens=daily, peak_factor=peak_factor, sla_ms=sla_ms,
            **pricing.projection_prices(), speedups_in_view=speedups,
        )
    except ValueError as exc:  # e.g. no catalog price for the measured device, 8 GPUs per node of a 3-GPU device
        return ProjectionResult(None, str(exc), daily, basis, peak_factor, sla_ms, measured)
    return ProjectionResult(sp, None, daily, basis, peak_factor, sla_ms, measured)


def build_report(
    engine: Engine,
    window: Window,
    *,
    sla_ms: float = DEFAULT_SLA_MS,
    history: int = DEFAULT_HISTORY,
    daily_tokens: float | None = None,
    peak_factor: float = 1.0,
    pricing: Pricing = Pricing(),
    now: datetime | None = None,
) -> ReportData:
    """All the figures of one report, every period's runs costed at `pricing`. `history` previous periods (>= 1)
    feed the change and the bands."""
    if isinstance(sla_ms, bool) or not isinstance(sla_ms, int | float) or not math.isfinite(sla_ms) or sla_ms <= 0:
        raise ValueError(f"--sla-ms must be a number > 0, got {sla_ms!r}")
    if isinstance(history, bool) or not isinstance(history, int) or not 1 <= history <= 366:
        raise ValueError(f"--history must be a whole number of periods in 1..366, got {history!r}")
    if daily_tokens is not None and not (math.isfinite(daily_tokens) and daily_tokens >= finops.MIN_DAILY_TOKENS):
        raise ValueError(f"--daily-tokens must be a number >= {finops.MIN_DAILY_TOKENS:g}, got {daily_tokens!r}")
    if not (math.isfinite(peak_factor) and peak_factor >= 1):
        raise ValueError(f"--peak-factor must be a number >= 1, got {peak_factor!r}")
    current = period_figures(engine, window, pricing)
    past = tuple(period_figures(engine, window.shifted(n), pricing) for n in range(1, history + 1))
    f = window.filters()
    generated_at = queries.as_utc(now or datetime.now(UTC), "now")
    bands = tuple(_band(name, get, current, past) for name, get in BAND_METRICS)
    if window.until > generated_at:  # a part of this period against whole ones
        bands = tuple(_unended_band(b) for b in bands)
    speedups = tuple(queries.speedups(engine, f))  # once: the projection's caveat reads them too
    # where the period's runs' priced spans reach past its end or into its start: once, for the notice and the
    # runs_cost table
    from telemetry.window_spans import spills_text, window_spills

    spills = window_spills(engine, f, [rc.run.run_id for rc in current.run_costs]
                           + [r.run_id for r in current.unpriced_runs])
    return ReportData(
        window=window,
        generated_at=generated_at,
        sla_ms=float(sla_ms),
        pricing=pricing,
        current=current,
        previous=past[0],
        history=past,
        domains=tuple(queries.acceptance_by_domain(engine, f)),
        speedups=speedups,
        projection=_projection(engine, current, float(sla_ms), daily_tokens, float(peak_factor), pricing, speedups),
        bands=bands,
        synthetic_runs=queries.synthetic_runs(engine, f),
        window_overlap=spills_text(spills, window.since, window.until),
        spills=spills,
    )


def _unended_band(b: BandCheck) -> BandCheck:
    """A band check of a period that had not ended: a total (GROWS_WITH_PERIOD) over a part of it is not judged
    against whole periods (NOT_CHECKED); a rate is, with a note that the period had not ended."""
    if b.status not in ("anomaly", "within band"):
        return b
    if b.metric in GROWS_WITH_PERIOD:
        return replace(b, status=NOT_CHECKED, note=f"{NOT_ENDED}; {b.note}")
    return replace(b, note=f"{RATE_SO_FAR}; {b.note}")


# Figures compared with the previous period: (name, getter).
CHANGE_METRICS: tuple[tuple[str, Callable[[PeriodFigures], float | None]], ...] = (
    ("output tokens", lambda f: f.output_tokens()),
    ("requests", lambda f: f.requests()),
    ("spec cost per 1M tokens (USD)", CostMetric("spec")),
    ("AR cost per 1M tokens (USD)", CostMetric("ar")),
    ("spec acceptance rate", lambda f: f.stat("spec", "acceptance_rate")),
    ("spec p95 TPOT (ms)", lambda f: f.stat("spec", "tpot_p95_ms")),
    ("AR p95 TPOT (ms)", lambda f: f.stat("ar", "tpot_p95_ms")),
    ("spec J/token", JPerTokenMetric("spec")),
    ("AR J/token", JPerTokenMetric("ar")),
)


ONE_INVOCATION = "not compared: one invocation's runs (the period before holds none of them)"
NOT_COMPARED = "not compared: "  # the one prefix of a `compared` that gives why not, its reasons joined by "; "
# A period that had not ended when its report was generated: its figures cover only the part that had passed. A
# total (whatever grows with the period's length) against a whole previous period (or a band of whole periods)
# would read as a drop: no change, no band verdict. A rate (cost per 1M tokens, acceptance rate, p95 TPOT, J/token)
# over the part is comparable: compared and judged, with a note (a cost spike mid-period is still flagged).
NOT_ENDED_REASON = "this period had not ended"
NOT_ENDED = NOT_COMPARED + NOT_ENDED_REASON
RATE_SO_FAR = "this period had not ended: a rate over its part so far"
NOT_CHECKED = "not checked"  # a band's status: a total of a period that had not ended
# The compared figures (CHANGE_METRICS, BAND_METRICS) that grow with the period's length
GROWS_WITH_PERIOD = frozenset({"output tokens", "requests"})


def period_complete(data: ReportData) -> bool:
    """The period had ended when the report was generated: its figures are final (regenerating it later gives
    the same numbers, records added since aside)."""
    return data.window.until <= data.generated_at


def no_value_text(cur: float | None, prev: float | None) -> str | None:
    """Why a figure has no change: it has no value in either period, this one or the previous; None where both
    have one."""
    if cur is None and prev is None:
        return "not compared: no value in either period"
    if cur is None:
        return "not compared: no value in this period"
    if prev is None:
        return "not compared: no value in the previous period"
    return None


def change_rows(
    data: ReportData,
) -> list[tuple[str, float | None, float | None, float | None, float | None, str, str]]:
    """(figure, this period, previous period, change, change %, compared, estimated) — None where either side
    is missing. A cost compares totals where both periods have the same energy basis, else the hardware parts;
    `compared` says which ("total" or "hardware part only: ...", empty for the other figures). A J/token
    metered in one period and estimated in the other has no change, and `compared` says why ("not compared:
    energy estimated in this period, measured in the previous one"; several reasons join under the one prefix).
    Where this period had not ended, a total (GROWS_WITH_PERIOD) has no change ("not compared: this period had
    not ended") and a rate is compared with RATE_SO_FAR in `compared`. `estimated` names the periods whose value
    rests on estimated power ("this period", "previous period (partly)", ...; empty where neither does). A
    report on one invocation (`report --invocation`) compares nothing: the period before it holds none of the
    invocation's runs (or the first part of the same bench), so each change would read as everything against
    nothing; the previous-period columns are empty and `compared` says why."""
    out = []
    periods = [data.current, data.previous]
    ended = period_complete(data)
    if data.current.window.invocation_id is not None:
        for name, get in CHANGE_METRICS:  # this period's own figure: a cost's total, on no basis shared with another
            cur = get(data.current)
            source = estimate_sources(get, [data.current], TOTAL_BASIS)[0] if cur is not None else None
            out.append((name, cur, None, None, None, ONE_INVOCATION,
                        estimated_text([source, None], ["this period", "previous period"])))
        return out
    for name, get in CHANGE_METRICS:
        # `compared_on`: the energy basis the values are on (a cost's); `basis`: what `compared` shows
        (cur, prev), compared_on = compared_values(get, periods)
        delta = None if cur is None or prev is None else cur - prev
        pct = None if delta is None or not prev else delta / prev * 100
        # a basis only where both values exist (a change was compared on it); else why no change
        missing = no_value_text(cur, prev)
        if missing is not None:
            reasons = [missing]
        else:
            # a total over a part of this period against a whole one: both values shown, no change
            reasons = [NOT_ENDED if not ended and name in GROWS_WITH_PERIOD else None,
                       # both values shown, no change: the estimate's error is no change in J/token
                       j_per_token_mismatch(periods, get.mode) if isinstance(get, JPerTokenMetric) else None]
        reasons = [r.removeprefix(NOT_COMPARED) for r in reasons if r is not None]
        if reasons:
            delta, pct, basis = None, None, NOT_COMPARED + "; ".join(reasons)
        else:  # a rate over a part of this period is compared, and says so
            basis = "; ".join(filter(None, [compared_on, None if ended else RATE_SO_FAR])) or None
        sources = [s if v is not None else None
                   for s, v in zip(estimate_sources(get, periods, compared_on), (cur, prev), strict=True)]
        estimated = estimated_text(sources, ["this period", "previous period"])
        # a cost over only some of its runs (no price for the others) in either period: said where it is compared
        partly = priced_over_text(get, periods, ["this period", "previous period"])
        basis = "; ".join(filter(None, [basis, partly]))
        out.append((name, cur, prev, delta, pct, basis, estimated))
    return out


def meets_sla(p95_ms: float | None, sla_ms: float) -> bool | None:
    return None if p95_ms is None else p95_ms <= sla_ms


# ---- summary (JSON) -------------------------------------------------------------------------------------


def _iso(d: datetime | None) -> str | None:
    return None if d is None else queries.as_utc(d, "datetime").isoformat()


def _mode_dict(data: ReportData, mode: str) -> dict:
    m, mc = data.current.modes.get(mode), data.current.mode_costs.get(mode)
    st = m.stats if m is not None else None
    c = mc.cost if mc is not None else None
    return {
        "runs": list(m.run_ids) if m else [],
        "requests_ok": st.num_requests_ok if st else 0,
        "requests_failed": st.num_requests_failed if st else 0,
        "output_tokens": st.output_tokens if st else 0,
        "tokens_per_s": st.tokens_per_s if st else None,
        "acceptance_rate": st.acceptance_rate if st else None,
        # over all of the mode's requests in the period, every configuration pooled
        "tpot_p95_ms": st.tpot_p95_ms if st else None,
        "meets_sla": meets_sla(st.tpot_p95_ms if st else None, data.sla_ms),
        # of the configuration the projection sizes this mode on (its capacity at the SLA): what the savings use
        **projection_tpot(data, mode),
        "j_per_token": st.j_per_token if st else None,
        "energy_estimated": st.energy_estimated if st else False,
        # every ok request has an energy figure; else J/token covers only those that have one
        "energy_complete": st.energy_complete if st else False,
        # where the mode's energy figures come from: measured | estimated | partly estimated (runs of both pooled)
        "energy_source": data.current.j_source(mode),
        "hardware_usd_per_1m": c.hardware_usd_per_1m if c else None,
        "energy_usd_per_1m": c.energy_usd_per_1m if c else None,
        "total_usd_per_1m": c.total_usd_per_1m if c else None,
        "energy_included": c.energy_included if c else False,
        "cost_note": cost_note(data.current, mode),
        # where some of the mode's runs have no price: the runs the total is over, and those it leaves out
        # ('over 1 of 2 runs; run 7 (device 'X') has no price'); None where every run of the mode is priced
        "cost_priced_over": data.current.priced_over(mode),
    }


def projection_tpot(data: ReportData, mode: str) -> dict:
    """The p95 TPOT the projection judged for `mode` against the SLA: that of the configuration it sizes the
    mode on (its capacity configuration: runs, p95, meets), or, where no configuration of the compared group
    meets the SLA, the best p95 of that group's configurations of the mode. None values without a projection."""
    sp = data.projection.projection
    out = {"projection_runs": [], "projection_tpot_p95_ms": None, "projection_meets_sla": None}
    if sp is None:
        return out
    runs = getattr(sp, f"capacity_runs_{mode}")
    if runs:
        return {"projection_runs": list(runs), "projection_tpot_p95_ms": getattr(sp, f"capacity_tpot_p95_ms_{mode}"),
                "projection_meets_sla": True}
    best = min((p95 for _, p95 in getattr(sp, f"points_{mode}") if p95 is not None), default=None)
    return {**out, "projection_tpot_p95_ms": best, "projection_meets_sla": False if best is not None else None}


def partial_energy(f: PeriodFigures, mode: str) -> bool:
    """Some of the mode's requests have an energy figure and some do not: its J/token covers only those that
    have one, and its total cost holds no energy (costing prices energy only where every request has it)."""
    m = f.modes.get(mode)
    return m is not None and m.stats.energy_j is not None and not m.stats.energy_complete


def cost_note(f: PeriodFigures, mode: str) -> str | None:
    """Why the mode's total is missing or hardware only ("energy not measured", ...); where only some requests
    have energy it says that, not "energy not measured" beside a J/token. Where none of the mode's runs has a
    price, those runs and how to price them ('cost n/a: no price for ...'); where only some have none, the
    total stands and `cost_priced_over` (PeriodFigures.priced_over) says which runs it leaves out."""
    mc = f.mode_costs.get(mode)
    if mc is None:
        left = [r for r in f.unpriced_runs if r.mode == mode]
        if left and mode in f.modes:
            return f"cost n/a: {costing.unpriced_text(costing.unpriced_by_device(left), None)}"
        return "no runs of this mode"
    c = mc.cost
    if c.total_usd_per_1m is None or c.energy_included or not partial_energy(f, mode):
        return c.reason
    source = costing.energy_source(f._runs(mode))  # whether or not a J/token came of it (energy over 0 tokens)
    covers = (" (J/token covers the requests that have an energy figure)"
              if f.stat(mode, "j_per_token") is not None else "")
    return f"{source + ' ' if source else ''}energy for only some requests: hardware only{covers}"


def summary_dict(data: ReportData) -> dict:
    """The report's figures as JSON-safe data (None for a missing figure, never 0)."""
    pr = data.projection
    return {
        "period": data.window.period,
        "month": data.window.month_text(),  # a monthly report's month, 'October 2026' (None for other periods)
        "since": _iso(data.window.since),
        "until": _iso(data.window.until),
        # the runs covered: None for every temperature / run kind / top_p / top_k / answer length cap / workload /
        # target
        "temperature": data.window.temperature,
        "run_kind": data.window.kind,
        "top_p": data.window.top_p,
        "top_k": data.window.top_k,
        "max_new_tokens": data.window.max_new_tokens,
        "workload": data.window.workload,
        "target": data.window.target,
        "invocation_id": data.window.invocation_id,  # `report --invocation`: one bench's or load test's runs
        "generated_at": _iso(data.generated_at),
        "traffic": data.has_traffic,
        # how many of the period's runs the synthetic data generator made (0: none): not measurements
        "synthetic": data.synthetic_runs,
        # where the period's runs' priced spans (wall_s) reach past its end or into its start: the seconds, and
        # that adjacent periods' costs overlap by up to that much (None where none does)
        "window_overlap": data.window_overlap,
        # too few requests for stable figures, as `cost` warns (costing.small_sample_text); None where enough
        "small_sample": data.small_sample_text(),
        "output_tokens": data.current.output_tokens(),
        "requests": data.current.requests(),
        "p95_tpot_sla_ms": data.sla_ms,
        # the prices given (report / scheduler --gpu, --gpus-per-node, --node-hourly-usd, --usd-per-kwh, --pue),
        # which every run's cost and the projection are at; None (1 GPU per node): not given, each run's recorded
        # price, else the catalog's (the runs' and the projection's "priced as" say which)
        "pricing": data.pricing.as_dict(),
        "priced_at": data.pricing.text(),  # those options as given ('--gpu H100 --gpus-per-node 8'), or None
        "modes": {mode: _mode_dict(data, mode) for mode in queries.MODES},
        # runs in the period that did not end 'completed' (cancelled, failed, or 'running': live or killed);
        # their finished requests are in the figures
        "incomplete_runs": [{"run_id": rc.run.run_id, "mode": rc.run.mode, "status": rc.run.status}
                            for rc in data.current.run_costs if rc.run.status != "completed"],
        "speedups": [
            {"workload": s.workload, "target": s.target, "device": s.device, "dtype": s.dtype,
             "concurrency": s.concurrency, "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
             "max_new_tokens": s.max_new_tokens, "run_kind": s.kind,
             "drafter": s.drafter, "k_policy": s.k_policy, "speedup": s.speedup,
             "spec_tokens_per_s": s.spec_tokens_per_s, "ar_tokens_per_s": s.ar_tokens_per_s,
             "prompts": s.prompts, "num_prompts": s.num_prompts,
             "spec_run_ids": list(s.spec_run_ids), "ar_run_ids": list(s.ar_run_ids),
             # paired: each invocation that recorded both modes, its own ratio (oldest first); `speedup` pools them
             "invocation_speedups": list(s.invocation_speedups), "invocation_ids": list(s.invocation_ids),
             "pooled_outside_paired": s.pooled_outside_paired, "paired": queries.paired_text(s),
             # the spec runs' 1 + accepted / drafts over the same requests (and each paired invocation's): no figure
             # can exceed it; where one does, why (the AR timing was inflated), else null
             "mean_acceptance_length": s.mean_acceptance_length,
             "invocation_acceptance_lengths": list(s.invocation_acceptance_lengths),
             "above_acceptance_length": bool(s.above_acceptance), "speedup_warning": queries.above_acceptance_text(s)}
            for s in data.speedups
        ],  # fmt: skip
        "acceptance_by_domain": [
            {"domain": d.domain, "acceptance_rate": d.acceptance_rate, "alpha": d.alpha, "requests": d.num_requests,
             "meets_go_line": d.meets_go_line(ALPHA_GO), "go_line_judges": d.go_figure_name}
            for d in data.domains
        ],  # fmt: skip
        "acceptance_go_line": ALPHA_GO,
        "projection": None if pr.projection is None else pr.projection.as_dict(),
        "projection_note": pr.reason,
        "projection_daily_tokens_basis": pr.daily_tokens_basis,
        "change": [
            {"figure": n, "this_period": c, "previous_period": p, "change": d, "change_pct": pct,
             "compared": basis or None, "estimated": est or None}
            for n, c, p, d, pct, basis, est in change_rows(data)
        ],
        "previous_period": {"since": _iso(data.previous.window.since), "until": _iso(data.previous.window.until)},
        "anomalies": [
            {"metric": b.metric, "value": b.value, "status": b.status, "band_low": b.low, "band_high": b.high,
             "history_periods": b.num_history, "note": b.note,
             "compared": b.basis, "estimated": b.estimated or None}
            for b in data.bands
        ],  # fmt: skip
    }


# ---- tables (HTML and CSV share them) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table's HTML view: the CSV column `source` under a readable `header`, its value
    passed through `show` (a shorter text: a model directory by its last part, a time to the second)."""

    header: str
    source: str
    show: Callable[[Any], Any] | None = None


@dataclass(frozen=True, slots=True)
class Table:
    name: str  # CSV file stem
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple, ...]
    # the HTML page's columns, in its order (the CSV keeps `header`); empty: the CSV columns as they are
    html_columns: tuple[Column, ...] = ()
    # page columns (by header) that may leave the table for one line under it, "in every row: ...", where every
    # row of two or more holds the same value in them (`lift_common`): the figures stay in view
    liftable: frozenset[str] = frozenset()


def to_the_second(value: Any) -> Any:
    """A time in UTC without its microseconds, as 2026-12-05 01:06:52. An aware time is converted first: a
    PostgreSQL session in another timezone hands them back in its own (19:36-08:00 is 03:36 UTC)."""
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?.*", value):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value[:19].replace("T", " ")
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return time_text(value, "%Y-%m-%d %H:%M:%S")
    return value


ACCEPTANCE_HEADER = ("domain", "requests", "drafts", "drafted tokens", "accepted tokens", "acceptance rate",
                     "tested tokens", "alpha (accepted / tested)", "mean acceptance length", "meets go line")


def alpha_text(alpha: float | None) -> str | None:
    """Alpha on the page beside the go/no-go line: to 3 decimals as calibrate prints it, more where 3 would put
    it on the other side of the line (labels.go_text: 0.64999 is not "0.65"); None (missing) as it is."""
    return None if alpha is None else go_text(alpha, ALPHA_GO)


# The HTML view of the per-run cost table (its CSV is `export --what cost`'s): the figures first, the long
# device and model names last and shortened.
RUNS_COST_COLUMNS = (
    Column("run", "run_id"), Column("mode", "mode"), Column("output tokens", "output_tokens"),
    Column("tokens/s", "tokens_per_s"), Column("hardware $/1M", "hardware_usd_per_1m"),
    Column("energy $/1M", "energy_usd_per_1m"), Column("total $/1M", "total_usd_per_1m"),
    Column("energy included", "energy_included"), Column("energy estimated", "energy_estimated"),
    Column("note", "note"), Column("status", "status"), Column("workload", "workload", short_workload),
    Column("run kind", "kind"), Column("concurrency", "concurrency"),
    Column("started (UTC)", "started_at", to_the_second),
    Column("wall time (s)", "wall_s"), Column("node share", "node_share"), Column("priced as", "priced_as"),
    Column("node $/h", "node_usd_per_hour"),
    Column("electricity $/kWh", "usd_per_kwh"), Column("PUE", "pue"), Column("node", "node_id"),
    Column("drafter", "drafter", short_model), Column("device", "device", short_device),
    Column("target", "target", short_model),
)
RUNS_COST_CSV_ONLY = frozenset({"invocation_id",  # in the CSV, not on the page: a 32-digit id widens the table
                                "window_since", "window_until"})  # the page says its period once, above


def paired_cell(text: str) -> str:
    """The page's cell of `queries.paired_text`: the paired figures and, where the pooled one lies outside them,
    that comparison, without the explanation (the full text is the cell's title and the CSV's); 'no paired
    invocation' without its reason."""
    if text.startswith(queries.PAIRED_NONE):
        return text.split(": ", 1)[0]
    return text.split(f": {queries.PAIRED_DISTRUST}", 1)[0]


SPEEDUP_COLUMNS = (
    Column("speedup", "speedup"), Column("spec tokens/s", "spec tokens/s"), Column("AR tokens/s", "AR tokens/s"),
    Column("paired invocations", "paired invocations", paired_cell),
    Column("temperature", "temperature"), Column("top_p", "top_p"), Column("top_k", "top_k"),
    Column("max new tokens", "max new tokens"), Column("run kind", "run kind"), Column("prompts", "prompts"),
    Column("workload", "workload", short_workload), Column("concurrency", "concurrency"),
    Column("drafter", "drafter", short_model), Column("K policy", "K policy"), Column("dtype", "dtype"),
    Column("device", "device", short_device), Column("target", "target", short_model),
)


def speedup_columns(speedups: Sequence[queries.Speedup]) -> tuple[Column, ...]:
    """The speedup table's columns on the page: the answer length cap only where the rows differ in it (as group
    texts name it), top_p and top_k only where a row samples (at temperature 0 no cut-off changes a token, and
    every greedy row reads top_p 1, top_k 0), so that the table keeps to its box; the CSV has them always."""
    hidden = set()
    if len({s.max_new_tokens for s in speedups}) <= 1:
        hidden.add("max new tokens")
    if all(s.temperature == 0 for s in speedups):
        hidden.update(("top_p", "top_k"))
    return tuple(c for c in SPEEDUP_COLUMNS if c.source not in hidden)


# what the rows of a speedup table are compared at: where every row shares it, it is said once under the table
SPEEDUP_LIFTABLE = frozenset({"temperature", "top_p", "top_k", "max new tokens", "run kind", "prompts", "workload",
                              "concurrency", "drafter", "K policy", "dtype", "device", "target"})


def lift_common(t: Table) -> tuple[Table, list[tuple[str, Any]]]:
    """The table as the page shows it, less its `liftable` columns whose shown value is the same in every row
    (two rows or more; an empty value stays in the table), and those (header, value) pairs in column order: a
    sampled store's speedup table, one row per configuration, ran 170 px past its box with the same workload,
    drafter, K policy, dtype, device, target and prompt text repeated in every row."""
    if len(t.rows) < 2 or not t.liftable or not t.html_columns:
        return t, []
    at = {name: i for i, name in enumerate(t.header)}
    keep, common = [], []
    for c in t.html_columns:
        shown = {(v if c.show is None else c.show(v)) for v in (row[at[c.source]] for row in t.rows)}
        if c.header in t.liftable and len(shown) == 1 and (value := next(iter(shown))) not in (None, ""):
            common.append((c.header, value))
        else:
            keep.append(c)
    return replace(t, html_columns=tuple(keep)), common


def report_tables(data: ReportData, engine: Engine) -> list[Table]:
    from telemetry.export import ExportWindow, cost_rows

    modes = [
        (mode, *(_mode_dict(data, mode)[k] for k in (
            "requests_ok", "requests_failed", "output_tokens", "tokens_per_s", "acceptance_rate", "tpot_p95_ms",
            "meets_sla", "j_per_token", "energy_estimated", "hardware_usd_per_1m", "energy_usd_per_1m",
            "total_usd_per_1m", "energy_included", "cost_note", "energy_complete", "energy_source",
            "projection_tpot_p95_ms", "projection_meets_sla", "cost_priced_over")))
        for mode in queries.MODES
        if mode in data.current.modes
    ]  # fmt: skip
    # the runs no price covers are rows too, their costs missing (the modes table says how to price them)
    header, rows = cost_rows(engine, ExportWindow(since=data.window.since, until=data.window.until),
                             filters=data.window.filters(), unpriced=True, prices=data.pricing.cost_prices(),
                             spills=data.spills)
    pr = data.projection
    curve = pr.sla_curve
    return [
        Table("modes", "Spec vs AR (cost per 1M tokens of the measured runs: node $/h x wall hours / tokens; "
              "energy complete: every request has an energy figure, else J/token covers those that do; p95 TPOT "
              "and meets SLA: over all of the mode's requests, every configuration pooled; projection p95 TPOT: "
              "of the configuration the projected savings size the mode on; cost priced over: where some of the "
              "mode's runs have no price, the runs its cost is over and those it leaves out, named in the cost per "
              "run table with their costs missing)",
              ("mode", "requests ok", "requests failed", "output tokens", "tokens/s",
               "acceptance rate", "p95 TPOT (ms)", "meets SLA", "J/token", "energy estimated",
               "hardware $/1M", "energy $/1M", "total $/1M", "energy included", "cost note",
               "energy complete", "energy source", "projection p95 TPOT (ms)", "projection meets SLA",
               "cost priced over"),
              tuple(modes)),
        Table("acceptance_by_domain", f"Acceptance per domain (go/no-go line {ALPHA_GO}, judged on alpha where "
              "steps were recorded, as calibrate; else on the acceptance rate)",
              ACCEPTANCE_HEADER,
              tuple((d.domain, d.num_requests, d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens,
                     d.acceptance_rate, d.num_tested_tokens, d.alpha, d.mean_acceptance_length,
                     d.meets_go_line(ALPHA_GO)) for d in data.domains),
              tuple(Column(h, h) for h in ACCEPTANCE_HEADER[:7]) + (Column(ACCEPTANCE_HEADER[7], ACCEPTANCE_HEADER[7],
                                                                         alpha_text),)
              + tuple(Column(h, h) for h in ACCEPTANCE_HEADER[8:])),
        # the figures first: the long model paths and device names would push them out of view
        Table("speedups", "Speedup (spec tokens/s / AR tokens/s, same workload, target, device, precision, "
              "concurrency, sampling (temperature, top_p, top_k), answer length cap (max new tokens) and run kind; "
              "over the prompts both modes ran where the runs recorded prompt ids (a load test's over all its requests: "
              "it sends the prompts round-robin for a fixed time): 'prompts' says how they compare; "
              "an empty top_p, top_k or max new tokens: not recorded; 'speedup' pools every run of the "
              "configuration, 'paired invocations' gives each bench or load test that ran both modes its own ratio, "
              "measured under one machine's conditions)",
              ("speedup", "spec tokens/s", "AR tokens/s", "workload", "concurrency", "drafter", "K policy",
               "dtype", "device", "target", "temperature", "top_p", "top_k", "max new tokens", "run kind", "prompts",
               "spec runs", "AR runs", "paired invocations", "paired speedups"),
              tuple((s.speedup, s.spec_tokens_per_s, s.ar_tokens_per_s, s.workload, s.concurrency, s.drafter,
                     s.k_policy, s.dtype, s.device, s.target, s.temperature, s.top_p, s.top_k, s.max_new_tokens,
                     s.kind, s.prompts,
                     *(costing.ids_text(list(ids)) if ids else None for ids in (s.spec_run_ids, s.ar_run_ids)),
                     queries.paired_text(s), " ".join(f"{x:.4g}" for x in s.invocation_speedups))
                    for s in data.speedups), speedup_columns(data.speedups), SPEEDUP_LIFTABLE),
        Table("runs_cost", "Cost per run", tuple(header), tuple(tuple(r) for r in rows),
              RUNS_COST_COLUMNS if set(header) - RUNS_COST_CSV_ONLY == {c.source for c in RUNS_COST_COLUMNS} else ()),
        Table("change", "Change against the previous period (a cost compares totals only where both periods "
              "have the same energy basis: no energy, or energy from the same kind of source; else the hardware "
              "parts; a J/token metered in one period and estimated in the other has no change. 'estimated' "
              "names the periods whose figure rests on estimated power)",
              ("figure", "this period", "previous period", "change", "change %", "compared", "estimated"),
              tuple(change_rows(data))),
        Table("anomalies", "Anomalies (band = mean +- 3 sd of previous periods; 'estimated' names the values "
              "that rest on estimated power)",
              ("metric", "this period", "status", "band low", "band high", "history periods", "note", "estimated"),
              tuple((b.metric, b.value, b.status, b.low, b.high, b.num_history, b.note, b.estimated)
                    for b in data.bands)),
        Table("projection", "Projected annual savings and its assumptions", ("figure", "value"),
              tuple(projection_rows(pr))),
        Table("nodes_by_sla", "Nodes by p95 TPOT SLA (the projection's traffic and price at every SLA where "
              "a measured configuration starts to meet it)",
              ("p95 TPOT SLA (ms)", "AR tokens/s per node", "spec tokens/s per node", "nodes AR", "nodes spec",
               "annual savings (USD)"),
              tuple((c.sla_ms, c.capacity_ar, c.capacity_spec, c.nodes_ar, c.nodes_spec, c.annual_savings_usd)
                    for c in curve)),
    ]  # fmt: skip


# The projection's figures and assumptions (StoreProjection.as_dict keys) as the report names them. A key
# in PROJECTION_SKIP repeats a row shown already; a key not named here is shown under its own name.
PROJECTION_LABELS = {
    "nodes_ar": "nodes AR (at peak)",
    "nodes_spec": "nodes spec (at peak)",
    "annual_savings_usd": "annual savings (USD)",
    "monthly_cost_ar_usd": "AR monthly cost (USD, node-hours only)",
    "monthly_cost_spec_usd": "spec monthly cost (USD, node-hours only)",
    "monthly_cost_basis": "monthly cost",
    "cost_per_1m_tokens_ar_usd": f"AR {costing.FLEET_COST_LABEL} (USD)",
    "cost_per_1m_tokens_spec_usd": f"spec {costing.FLEET_COST_LABEL} (USD)",
    "capacity_tokens_per_s_ar": "AR capacity per node (tokens/s)",
    "capacity_tokens_per_s_spec": "spec capacity per node (tokens/s)",
    "node_hourly_usd": "node price (USD per node-hour)",
    "priced_as": "priced as",
    "measured_on": "measured on",
    "priced_differs_from_measured": "priced as other hardware than measured",
    "gpus_per_node": "GPUs per node",
    "replicas_per_node": "replicas of the measured device per node",
    "pue": "PUE",
    "usd_per_kwh": "electricity (USD per kWh)",
    "energy_prices_from": "electricity price and PUE from",
    "energy_included_ar": "energy in the AR fleet cost",
    "energy_included_spec": "energy in the spec fleet cost",
    "energy_estimated_ar": "AR energy estimated",
    "energy_estimated_spec": "spec energy estimated",
    "energy_left_out_other_hardware": "measured or estimated energy left out (priced as other hardware than measured)",
    "energy_left_out_source": "energy left out was",
    "capacity_basis": "capacity per node",
    "capacity_runs_ar": "AR capacity run ids",
    "capacity_runs_spec": "spec capacity run ids",
    "capacity_tpot_p95_ms_ar": "AR capacity configuration p95 TPOT (ms)",
    "capacity_tpot_p95_ms_spec": "spec capacity configuration p95 TPOT (ms)",
    "compared": "spec and AR compared at",
    "cost_per_1m_tokens_basis": "fleet cost per 1M served tokens, what it is",
    "hours_per_year": "hours per year",
    "hours_per_month": "hours per month",
    "notes": "notes",
}
# shown in the traffic rows above them (daily tokens, peak factor, SLA), by mode (energy estimated), or in
# the list of runs (the first capacity run)
PROJECTION_SKIP = frozenset({"daily_tokens", "peak_factor", "p95_tpot_sla_ms", "energy_estimated",
                             "capacity_run_ar", "capacity_run_spec",
                             # said in the "energy estimated" row of the mode ("partly")
                             "energy_partly_estimated_ar", "energy_partly_estimated_spec",
                             # the cost_per_1m_tokens_* rows under their newer name
                             "fleet_cost_per_1m_served_tokens_ar_usd", "fleet_cost_per_1m_served_tokens_spec_usd"})


def projection_rows(pr: ProjectionResult) -> list[tuple[str, Any]]:
    """The projection table: each figure once, under one human name."""
    rows: list[tuple[str, Any]] = [
        ("p95 TPOT SLA (ms)", pr.sla_ms),
        ("daily output tokens", pr.daily_tokens),
        ("daily tokens basis", pr.daily_tokens_basis),
        ("peak-to-average factor", pr.peak_factor),
    ]
    if pr.projection is None:
        return [*rows, ("projection", f"not computed: {pr.reason}")]
    d = pr.projection.as_dict()
    items = [(k, v) for k, v in d.items() if k != "assumptions"] + list(d["assumptions"].items())
    for key, value in items:
        if key in PROJECTION_SKIP:
            continue
        if key == "compared":
            value = None if pr.projection.comparison is None else pr.projection.comparison.text(report_choose(pr.projection.comparison))
        if key in ("energy_estimated_ar", "energy_estimated_spec") and d["assumptions"].get(
                key.replace("energy_estimated", "energy_partly_estimated")):
            value = "partly (metered and estimated runs pooled)"
        if isinstance(value, list):
            value = "; ".join(map(str, value)) if key == "notes" else ", ".join(map(str, value))
        rows.append((PROJECTION_LABELS.get(key, key), value))
    rows.append(("where the SLA matters", finops.sla_verdict(pr.sla_curve)))
    return rows

