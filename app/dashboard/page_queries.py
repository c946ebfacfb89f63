"""Page-specific SQL aggregations the shared `telemetry.queries` does not provide.

Plain functions of (engine, Filters, ...) returning small pandas frames; no Streamlit here, so the
benchmark and tests call them directly. Everything is aggregated in SQL (GROUP BY, window functions):
token events and steps are never loaded row by row. Works on SQLite >= 3.25 and PostgreSQL.

    itl_histogram        inter-token latency, 0.1 ms buckets per mode (LAG over token_events; sampled
                         by whole requests above 300k token events, see `sampled_requests`)
    latency_histograms   TTFT and TPOT, 0.1 ms buckets per mode
    latency_over_time    requests, mean TTFT and TPOT per time bucket and mode
    acceptance_over_time acceptance rate, mean acceptance length and mean K per time bucket
    acceptance_by_position  P(draft position i accepted | K > i) from steps
    power_over_time      mean power per time bucket, device and source
    filter_options       runs and distinct values for the sidebar
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd
from sqlalchemy import Integer, and_, case, cast, func, literal_column, or_, select
from sqlalchemy.engine import Engine

from telemetry.calibration import ANSWER_SPAN
from telemetry.db import PowerSample, Request, Run, Step, TokenEvent
from telemetry.liveness import shown_status
from telemetry.queries import Filters, step_rejected
from telemetry.queries import as_utc as queries_as_utc

BUCKETS_PER_MS = 10  # histogram resolution: 0.1 ms
NICE_BUCKETS_S = (1, 5, 10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86_400, 7 * 86_400)


def nice_bucket_s(span_s: float, target_points: int = 80) -> int:
    """A round time-bucket size giving about `target_points` points over `span_s` seconds."""
    want = max(span_s, 1.0) / target_points
    return next((b for b in NICE_BUCKETS_S if b >= want), NICE_BUCKETS_S[-1])


def bucket_label(bucket_s: int) -> str:
    """A time bucket as people say it: '30 s', '5 min', '3 h', '1 day', '7 days'."""
    for unit_s, unit in ((86_400, "day"), (3600, "h"), (60, "min")):
        if bucket_s >= unit_s and bucket_s % unit_s == 0:
            n = bucket_s // unit_s
            return f"{n} {unit}s" if unit == "day" and n != 1 else f"{n} {unit}"
    return f"{bucket_s} s"


def _floor_int(engine: Engine, expr):
    """floor() of a non-negative expression as an integer on both dialects (PG rounds a CAST)."""
    if engine.dialect.name == "sqlite":
        return cast(expr, Integer)  # truncates: floor for x >= 0
    return cast(func.floor(expr), Integer)


def _epoch_s(engine: Engine, col):
    if engine.dialect.name == "sqlite":
        return cast(func.strftime("%s", col), Integer)  # stored as naive UTC text
    return func.extract("epoch", col)


WEEK_S = 7 * 86_400
MONDAY_S = 4 * 86_400  # the epoch's first Monday, 1970-01-05 00:00 UTC (the epoch began on a Thursday)


def _time_bucket(engine: Engine, col, bucket_s: int):
    """The start (epoch seconds) of the bucket holding `col`: whole multiples of `bucket_s` from the epoch, except
    that weeks start on Mondays 00:00 UTC, as the weekly reports' periods do (from the epoch they ran Thursday to
    Thursday, and no weekly point matched a weekly report)."""
    origin = MONDAY_S if bucket_s % WEEK_S == 0 else 0
    return _floor_int(engine, (_epoch_s(engine, col) - origin) / bucket_s) * bucket_s + origin


def _to_time(frame: pd.DataFrame, col: str = "t") -> pd.DataFrame:
    if not frame.empty:
        frame[col] = pd.to_datetime(frame[col].astype("int64"), unit="s", utc=True)
    return frame


def _frame(engine: Engine, stmt, columns: list[str]) -> pd.DataFrame:
    with engine.connect() as c:
        rows = c.execute(stmt).all()
    return pd.DataFrame([tuple(r) for r in rows], columns=columns)


def _conds(f: Filters) -> list:
    return [*f.where(), Request.status == "ok"]


ITL_EXACT_MAX_TOKENS = 300_000  # above this many token events, ITL comes from a sample of requests

# Sampling whole requests: a request is kept when a multiplicative hash of its id (Knuth's 2654435761, about
# 2^32 / golden ratio) falls in the lowest 1/stride of [0, 2^32). Not `id % stride`: ids are handed out in
# blocks per run, and `bench --mode both` records turns of 4 prompts per mode, so with a stride of 8 every
# kept id was a speculative one. The hash's high bits spread each run's ids evenly over [0, 2^32), so every
# run, and so every mode, keeps about 1 in `stride` of its requests. (Its low bits would not do: the low k
# bits of id x an odd constant are a permutation of the id's low k bits, so `hash % 8` is `id % 8` again.)
# The id is reduced below 2^31 first so that the product stays below 2^63: no bigint overflow error on
# PostgreSQL, no silent switch to floating point on SQLite. Constants are inlined: PostgreSQL types them bigint.
_HASH_ID_MOD, _HASH_MULT, _HASH_RANGE = 2**31, 2654435761, 2**32


def request_hash(id_col):
    """A deterministic hash of a request id in [0, 2^32), in SQL, identical on SQLite and PostgreSQL."""
    return (id_col % literal_column(str(_HASH_ID_MOD))) * literal_column(str(_HASH_MULT)) % literal_column(
        str(_HASH_RANGE))


def sampled_requests(id_col, stride: int):
    """The condition keeping about 1 in `stride` requests, each run and mode in proportion (see above)."""
    return request_hash(id_col) < literal_column(str(_HASH_RANGE // stride))


@dataclass(frozen=True, slots=True)
class ItlHistogram:
    """ITL histogram (mode, itl_ms bucket lower edge, count) and how it was sampled."""

    frame: pd.DataFrame
    total_tokens: int  # output tokens of the filtered requests
    stride: int  # 1 = every request; n = about 1 in n requests, each run in proportion (`sampled_requests`)


def itl_histogram(engine: Engine, f: Filters, max_tokens: int = ITL_EXACT_MAX_TOKENS) -> ItlHistogram:
    """ITL: gaps between consecutive distinct emissions of a request (tokens of one step count once).

    LAG over (request, position) in SQL; only (mode, 0.1 ms bucket, count) rows come back. Above
    `max_tokens` token events the window runs over a deterministic sample of whole requests (about 1 in n
    of every run's requests, by a hash of the id), so the page stays interactive and each mode keeps its
    share of the sample.
    """
    with engine.connect() as c:
        total = int(c.scalar(
            select(func.coalesce(func.sum(Request.output_tokens), 0))
            .select_from(Request).join(Run, Run.id == Request.run_id).where(*_conds(f))
        ) or 0)
    stride = max(1, math.ceil(total / max_tokens))
    picked = select(Request.id.label("id"), Run.mode.label("mode")).join(Run, Run.id == Request.run_id).where(*_conds(f))
    if stride > 1:
        picked = picked.where(sampled_requests(Request.id, stride))
    picked = picked.cte("picked")
    prev = func.lag(TokenEvent.emit_offset_ms).over(partition_by=TokenEvent.request_id, order_by=TokenEvent.position)
    ev = (
        select(TokenEvent.request_id.label("rid"), (TokenEvent.emit_offset_ms - prev).label("gap"))
        .where(TokenEvent.request_id.in_(select(picked.c.id)))
        .cte("ev")
    )
    bucket = _floor_int(engine, ev.c.gap * BUCKETS_PER_MS)
    stmt = (
        select(picked.c.mode, bucket.label("b"), func.count().label("n"))
        .select_from(ev)
        .join(picked, picked.c.id == ev.c.rid)
        .where(ev.c.gap > 0)
        .group_by(picked.c.mode, bucket)
        .order_by(picked.c.mode, bucket)
    )
    frame = _frame(engine, stmt, ["mode", "b", "count"])
    frame["itl_ms"] = frame.pop("b") / BUCKETS_PER_MS
    return ItlHistogram(frame[["mode", "itl_ms", "count"]], total, stride)


def _latency_metrics():
    """(metric, per-request value, the condition for having one): as telemetry.queries counts TTFT and TPOT."""
    tpot = (Request.e2e_ms - Request.ttft_ms) / (Request.output_tokens - 1)
    return (
        ("ttft", Request.ttft_ms, Request.ttft_ms.is_not(None)),
        ("tpot", tpot, and_(Request.output_tokens > 1, Request.e2e_ms.is_not(None), Request.ttft_ms.is_not(None))),
    )


def latency_histograms(engine: Engine, f: Filters) -> pd.DataFrame:
    """TTFT and TPOT per request in 0.1 ms buckets. Columns: metric (ttft|tpot), mode, value_ms, count."""
    parts = []
    for metric, expr, extra in _latency_metrics():
        bucket = _floor_int(engine, expr * BUCKETS_PER_MS)
        stmt = (
            select(Run.mode, bucket.label("b"), func.count().label("n"))
            .select_from(Request)
            .join(Run, Run.id == Request.run_id)
            .where(*_conds(f), extra, expr >= 0)
            .group_by(Run.mode, bucket)
        )
        part = _frame(engine, stmt, ["mode", "b", "count"])
        part.insert(0, "metric", metric)
        parts.append(part)
    # typed: a metric no request has (one-token answers have no TPOT) is an empty part, and concat with it
    # leaves object columns that numpy's rounding refuses
    frame = pd.concat(parts, ignore_index=True).astype({"b": "int64", "count": "int64"})
    frame["value_ms"] = frame.pop("b") / BUCKETS_PER_MS
    return frame[["metric", "mode", "value_ms", "count"]]


def histogram_percentiles(hist: pd.DataFrame, value_col: str, qs=(50, 95, 99)) -> dict[str, dict[int, float | None]]:
    """Percentiles per mode from a bucketed histogram, interpolated between the two ranks around each as
    `telemetry.queries.percentile` (numpy's linear) does over the raw values, so the Latency page agrees
    with the Overview and the SLA projection; each value is its bucket's midpoint (within 0.05 ms)."""
    out: dict[str, dict[int, float | None]] = {}
    for mode, part in hist.groupby("mode", sort=False):
        part = part.sort_values(value_col)
        cum = part["count"].cumsum().to_numpy()
        total = int(cum[-1]) if len(cum) else 0
        values = part[value_col].to_numpy() + 0.5 / BUCKETS_PER_MS

        row: dict[int, float | None] = {}
        for q in qs:
            if total == 0:
                row[q] = None
                continue
            pos = (total - 1) * q / 100
            lo, hi = math.floor(pos), math.ceil(pos)
            # the r-th smallest value (0-based) lies in the first bucket whose running count exceeds r
            v_lo, v_hi = (float(values[int(np.searchsorted(cum, r, side="right"))]) for r in (lo, hi))
            row[q] = v_lo + (v_hi - v_lo) * (pos - lo)
        out[str(mode)] = row
    return out


def latency_percentiles(engine: Engine, f: Filters, hist: pd.DataFrame, qs=(50, 95, 99)
                        ) -> dict[str, dict[str, dict[int, float | None]]]:
    """Exact TTFT and TPOT percentiles per metric and mode, the Overview's figures (numpy's linear interpolation
    over the raw values, as `telemetry.queries.percentile`), without reading every request: the histogram
    `hist` (latency_histograms) says which 0.1 ms bucket holds each rank needed, and one query per metric reads
    only the values in those buckets."""
    out: dict[str, dict[str, dict[int, float | None]]] = {}
    for metric, expr, extra in _latency_metrics():
        part = hist[hist["metric"] == metric]
        # per mode: the ranks each percentile interpolates between, and where each lies in the bucket order
        wanted: dict[str, dict[int, tuple[int, int]]] = {}  # mode -> rank -> (bucket, rank within it)
        plan: dict[str, dict[int, tuple[int, int, float]]] = {}  # mode -> q -> (rank lo, rank hi, weight)
        for mode, rows in part.groupby("mode", sort=False):
            rows = rows.sort_values("value_ms")
            buckets = np.rint(rows["value_ms"].to_numpy() * BUCKETS_PER_MS).astype(int)
            cum = rows["count"].cumsum().to_numpy()
            total = int(cum[-1]) if len(cum) else 0
            if not total:
                continue
            plan[str(mode)] = {}
            for q in qs:
                pos = (total - 1) * q / 100
                lo, hi = math.floor(pos), math.ceil(pos)
                plan[str(mode)][q] = (lo, hi, pos - lo)
                for r in (lo, hi):
                    i = int(np.searchsorted(cum, r, side="right"))
                    wanted.setdefault(str(mode), {})[r] = (int(buckets[i]), r - (int(cum[i - 1]) if i else 0))
        if not wanted:
            continue
        bucket = _floor_int(engine, expr * BUCKETS_PER_MS)
        picks = or_(*(and_(Run.mode == mode, bucket.in_(sorted({b for b, _ in ranks.values()})))
                      for mode, ranks in wanted.items()))
        stmt = (
            select(Run.mode, bucket.label("b"), expr.label("v"))
            .select_from(Request)
            .join(Run, Run.id == Request.run_id)
            .where(*_conds(f), extra, expr >= 0, picks)
        )
        held: dict[tuple[str, int], list[float]] = {}
        with engine.connect() as c:
            for mode, b, v in c.execute(stmt):
                held.setdefault((mode, int(b)), []).append(float(v))
        for values in held.values():
            values.sort()

        def value(mode: str, r: int, wanted=wanted, held=held) -> float:
            b, within = wanted[mode][r]
            return held[(mode, b)][within]

        try:
            out[metric] = {mode: {q: value(mode, lo) + (value(mode, hi) - value(mode, lo)) * w
                                  for q, (lo, hi, w) in by_q.items()} for mode, by_q in plan.items()}
        except (KeyError, IndexError):  # requests recorded between the two queries moved the ranks
            out[metric] = histogram_percentiles(part, "value_ms", qs)
    return out


def latency_over_time(engine: Engine, f: Filters, bucket_s: int) -> pd.DataFrame:
    """Columns: t, mode, requests, ttft_mean_ms, tpot_mean_ms (mean per bucket of request start time)."""
    tpot = case(
        (and_(Request.output_tokens > 1, Request.e2e_ms.is_not(None)),
         (Request.e2e_ms - Request.ttft_ms) / (Request.output_tokens - 1)),
        else_=None,
    )
    t = _time_bucket(engine, Request.started_at, bucket_s)
    stmt = (
        select(t.label("t"), Run.mode, func.count(), func.avg(Request.ttft_ms), func.avg(tpot))
        .select_from(Request)
        .join(Run, Run.id == Request.run_id)
        .where(*_conds(f))
        .group_by(t, Run.mode)
        .order_by(t)
    )
    return _to_time(_frame(engine, stmt, ["t", "mode", "requests", "ttft_mean_ms", "tpot_mean_ms"]))


def acceptance_over_time(engine: Engine, f: Filters, bucket_s: int) -> pd.DataFrame:
    """Speculative requests per time bucket and K policy, from the raw request counts.

    Columns: t, k_policy, drafts, drafted, accepted, acceptance_rate, mean_acceptance_length, mean_k
    (mean_k = drafted / drafts: the mean K proposed per drafting step).
    """
    t = _time_bucket(engine, Request.started_at, bucket_s)
    stmt = (
        select(t.label("t"), Run.k_policy, func.sum(Request.num_drafts), func.sum(Request.num_draft_tokens),
               func.sum(Request.num_accepted_tokens))
        .select_from(Request)
        .join(Run, Run.id == Request.run_id)
        .where(*_conds(f), Run.mode == "spec")
        .group_by(t, Run.k_policy)
        .order_by(t)
    )
    return with_rates(_to_time(_frame(engine, stmt, ["t", "k_policy", "drafts", "drafted", "accepted"])))


def with_rates(frame: pd.DataFrame) -> pd.DataFrame:
    """Add acceptance_rate, mean_acceptance_length and mean_k from summed counts (NaN where undefined)."""
    drafts = frame["drafts"].where(frame["drafts"] > 0).astype("float64")
    drafted = frame["drafted"].where(frame["drafted"] > 0).astype("float64")
    frame["acceptance_rate"] = frame["accepted"] / drafted
    frame["mean_acceptance_length"] = 1 + frame["accepted"] / drafts
    frame["mean_k"] = frame["drafted"] / drafts
    return frame


def acceptance_by_position(engine: Engine, f: Filters) -> pd.DataFrame:
    """Position i (0-based) of a draft is accepted when accepted > i, among steps with K > i.

    SQL groups steps by (K, accepted) — a few dozen rows — and the per-position rates follow from those
    counts. Columns: position (1-based, as users count draft tokens), offered, accepted, rate. A step an EOS or
    a stop string cut inside its accepted drafts counts with its kept drafts as its K (telemetry.calibration.
    alpha_k): the positions after the cut were not left unaccepted, the request ended there.
    """
    k = case((Step.num_emitted > Step.accepted, Step.k), else_=Step.accepted)
    stmt = (
        select(k, Step.accepted, func.count())
        .select_from(Step)
        .join(Request, Request.id == Step.request_id)
        .join(Run, Run.id == Request.run_id)
        .where(*_conds(f), Step.k > 0)
        .group_by(k, Step.accepted)
    )
    counts = _frame(engine, stmt, ["k", "accepted", "n"])
    if counts.empty:
        return pd.DataFrame(columns=["position", "offered", "accepted", "rate"])
    rows = []
    for i in range(int(counts["k"].max())):
        offered = int(counts.loc[counts["k"] > i, "n"].sum())
        accepted = int(counts.loc[(counts["k"] > i) & (counts["accepted"] > i), "n"].sum())
        rows.append((i + 1, offered, accepted, accepted / offered if offered else None))
    return pd.DataFrame(rows, columns=["position", "offered", "accepted", "rate"])


ALONG_EXACT_MAX_DRAFTS = 200_000  # above this many drafting steps, the spans come from a sample of requests


@dataclass(frozen=True, slots=True)
class AnswerSpans:
    """Acceptance per span of the answer and how it was sampled."""

    frame: pd.DataFrame
    total_drafts: int  # drafting steps of the filtered speculative requests
    stride: int  # 1 = every request; n = about 1 in n requests, each run in proportion (`sampled_requests`)


def acceptance_along_answer(engine: Engine, f: Filters, width: int = ANSWER_SPAN,
                            max_drafts: int = ALONG_EXACT_MAX_DRAFTS) -> AnswerSpans:
    """Acceptance by where in the answer a drafting step starts, in spans of `width` output tokens.

    A step starts after 1 + the tokens its request's earlier steps emitted (the prefill emitted the first);
    a window sum over each request's steps gives that in SQL, and the steps are then grouped by span, so
    only one row per span comes back. Above `max_drafts` drafting steps the window runs over a
    deterministic sample of whole requests (about 1 in n of every run's, by a hash of the id), as the ITL
    histogram does.
    Frame columns: start, end (output tokens [start, end)), steps, drafted, accepted, tested (accepted plus
    the rejections that ended steps), acceptance_rate (accepted / drafted), alpha (accepted / tested, as
    `specfinops calibrate` reports it), mean_acceptance_length.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    spec_requests = select(Request).join(Run, Run.id == Request.run_id).where(*_conds(f), Run.mode == "spec")
    with engine.connect() as c:
        total = int(c.scalar(spec_requests.with_only_columns(func.coalesce(func.sum(Request.num_drafts), 0)))
                    or 0)
    stride = max(1, math.ceil(total / max_drafts))
    picked = spec_requests.with_only_columns(Request.id)  # the window is driven from the chosen requests
    if stride > 1:
        picked = picked.where(sampled_requests(Request.id, stride))
    emitted_before = func.coalesce(func.sum(Step.num_emitted).over(
        partition_by=Step.request_id, order_by=Step.step_index, rows=(None, -1)), 0)
    steps = (
        select(Step.k.label("k"), Step.accepted.label("accepted"), Step.num_emitted.label("num_emitted"),
               (1 + emitted_before).label("before"))
        .where(Step.request_id.in_(picked))
        .subquery()
    )
    span = cast(steps.c.before // width, Integer)
    stmt = (
        select(span, func.count(), func.sum(steps.c.k), func.sum(steps.c.accepted),
               func.sum(case((step_rejected(steps.c), 1), else_=0)))
        .where(steps.c.k > 0)
        .group_by(span)
        .order_by(span)
    )
    frame = _frame(engine, stmt, ["span", "steps", "drafted", "accepted", "rejections"])
    cols = ["start", "end", "steps", "drafted", "accepted", "tested", "acceptance_rate", "alpha",
            "mean_acceptance_length"]
    if frame.empty:
        return AnswerSpans(pd.DataFrame(columns=cols), total, stride)
    frame = frame.astype({"span": "int64", "steps": "int64", "drafted": "int64", "accepted": "int64",
                          "rejections": "int64"})
    frame["start"], frame["end"] = frame["span"] * width, (frame["span"] + 1) * width
    frame["tested"] = frame["accepted"] + frame["rejections"]
    frame["acceptance_rate"] = frame["accepted"] / frame["drafted"]
    frame["alpha"] = frame["accepted"] / frame["tested"].where(frame["tested"] > 0)
    frame["mean_acceptance_length"] = 1 + frame["accepted"] / frame["steps"]
    return AnswerSpans(frame[cols], total, stride)


def _matching_run_ids(f: Filters):
    return select(Request.run_id).join(Run, Run.id == Request.run_id).where(*f.where()).distinct()


def power_over_time(engine: Engine, f: Filters, bucket_s: int) -> pd.DataFrame:
    """Columns: t, node_id, device_index, source, power_w (mean per bucket), samples.

    `source` is 'estimate' for estimated power: charts draw it dashed and label it as an estimate.
    """
    t = _time_bucket(engine, PowerSample.t, bucket_s)
    conds = [PowerSample.run_id.in_(_matching_run_ids(f)), PowerSample.power_w.is_not(None)]
    if f.since is not None:
        conds.append(PowerSample.t >= f.since)
    if f.until is not None:
        conds.append(PowerSample.t < f.until)
    stmt = (
        select(t.label("t"), Run.node_id, PowerSample.device_index, PowerSample.source,
               func.avg(PowerSample.power_w), func.count())
        .select_from(PowerSample)
        .join(Run, Run.id == PowerSample.run_id)
        .where(*conds)
        .group_by(t, Run.node_id, PowerSample.device_index, PowerSample.source)
        .order_by(t)
    )
    return _to_time(_frame(engine, stmt, ["t", "node_id", "device_index", "source", "power_w", "samples"]))


def filter_options(engine: Engine) -> dict:
    """Everything the sidebar offers: the run list (with request time bounds) and the domains."""
    runs_q = (
        select(Run.id, Run.mode, Run.node_id, Run.hostname, Run.target, Run.drafter, Run.k_policy, Run.workload,
               Run.device, Run.concurrency, Run.temperature, Run.kind, Run.started_at, Run.status,
               Run.top_p, Run.top_k, Run.max_new_tokens, Run.invocation_id, func.min(Request.started_at),
               func.max(Request.started_at), func.count(Request.id), Run.pid, Run.process_key)
        .select_from(Run)
        .outerjoin(Request, Request.run_id == Run.id)
        .group_by(Run.id)
        .order_by(Run.id)
    )
    cols = ["run_id", "mode", "node_id", "hostname", "target", "drafter", "k_policy", "workload", "device",
            "concurrency", "temperature", "kind", "started_at", "status", "top_p", "top_k", "max_new_tokens",
            "invocation_id", "first_request", "last_request", "requests", "pid", "process_key"]
    runs = _frame(engine, runs_q, cols)
    # a 'running' run whose process is gone reads 'stale' (telemetry.liveness), as in every other view
    runs["status"] = [shown_status(status, None if pd.isna(pid) else int(pid), None if pd.isna(key) else key,
                                   None if pd.isna(start) else start)
                      for status, pid, key, start in zip(runs["status"], runs["pid"], runs["process_key"],
                                                         runs["started_at"], strict=True)]
    runs = runs.drop(columns=["pid", "process_key"])
    with engine.connect() as c:
        domains = sorted(d for (d,) in c.execute(select(Request.domain).distinct()) if d is not None)
    return {"runs": runs, "domains": domains}


def as_utc(value) -> datetime | None:
    """A datetime from the store (naive on SQLite) as an aware UTC datetime; None for missing."""
    if value is None or value is pd.NaT:
        return None
    return queries_as_utc(pd.Timestamp(value).to_pydatetime(), "a store time")


def count_runs(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.scalar(select(func.count()).select_from(Run)) or 0)

