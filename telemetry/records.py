"""Plain records handed from the serving worker to the telemetry recorder.

They mirror the tables in `telemetry.db` but carry no database identity: the recorder assigns ids
when it writes a request together with its steps and token events in one transaction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

REQUEST_STATUSES = ("ok", "error", "cancelled")


@dataclass(frozen=True, slots=True)
class RunInfo:
    mode: str  # spec | ar
    node_id: str
    hostname: str
    device: str
    backend: str  # torch | vllm
    dtype: str
    target: str
    drafter: str | None
    k_policy: str  # "fixed:4", "auto", "none"
    temperature: float | None  # None: each request chooses its own (a server); the requests record theirs
    workload: str
    power_source: str  # nvml | rapl | estimate | none
    software_version: str
    top_p: float | None = 1.0
    concurrency: int = 1
    kind: str = "bench"  # bench | serve | loadtest
    price_snapshot: dict | None = None
    # the rest of the sampling the run used; None: unknown, or each request chose its own (a server)
    top_k: int | None = None  # 0 = off
    seed: int | None = None
    max_new_tokens: int | None = None  # the answer length cap per request
    # the command invocation that recorded the run (a uuid4 hex shared by all runs of one bench or load test);
    # None for a server's run: one per mode for the server's lifetime, each serving whatever requests arrive,
    # so nothing pairs them
    invocation_id: str | None = None


@dataclass(frozen=True, slots=True)
class StepRow:
    step_index: int
    k: int
    accepted: int
    num_emitted: int
    draft_ms: float
    verify_ms: float
    t_offset_ms: float
    batch_size: int = 1
    k_reason: str | None = None


@dataclass(frozen=True, slots=True)
class TokenRow:
    position: int
    emit_offset_ms: float
    step_index: int  # -1: the token sampled at prefill
    source: str  # accepted | bonus | correction | ar


@dataclass(slots=True)
class RequestRecord:
    started_at: datetime
    domain: str = ""
    external_id: str | None = None
    prompt_tokens: int | None = 0  # None: unknown (a load-test stream that ended without the server's usage)
    output_tokens: int = 0
    num_drafts: int | None = 0  # likewise
    num_draft_tokens: int | None = 0
    num_accepted_tokens: int | None = 0
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    energy_j: float | None = None
    temperature: float | None = None  # the request's own sampling
    top_p: float | None = None
    top_k: int | None = None  # 0 = off
    seed: int | None = None  # None: unseeded
    max_new_tokens: int | None = None  # the answer length cap applied
    status: str = "ok"  # ok | error | cancelled
    error: str | None = None
    steps: list[StepRow] = field(default_factory=list)
    tokens: list[TokenRow] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PowerReading:
    t: datetime
    device_index: int
    power_w: float | None
    energy_mj: float | None
    utilization_pct: float | None
    source: str  # nvml | rapl | estimate


class BadRecord(ValueError):
    """A record no measurement can give (a negative count, more accepted than drafted tokens): the recorder drops
    it and counts it for its run, as it does a record the database rejects, instead of storing nonsense that
    every aggregate over the run would then carry (an acceptance rate of 4.5, a negative TTFT)."""


def request_problem(rec: RequestRecord) -> str | None:
    """What makes `rec` impossible, or None. Unknown counts (None) are allowed: they are missing, not wrong."""
    counts = {"prompt_tokens": rec.prompt_tokens, "output_tokens": rec.output_tokens, "num_drafts": rec.num_drafts,
              "num_draft_tokens": rec.num_draft_tokens, "num_accepted_tokens": rec.num_accepted_tokens}
    for name, n in counts.items():
        if n is not None and n < 0:
            return f"{name} is {n}, below 0"
    if rec.output_tokens is None:
        return "output_tokens is unknown"
    drafted = rec.num_draft_tokens
    if drafted is not None and rec.num_accepted_tokens is not None and rec.num_accepted_tokens > drafted:
        return f"num_accepted_tokens {rec.num_accepted_tokens} exceeds num_draft_tokens {drafted}"
    if drafted is not None and rec.num_drafts is not None and rec.num_drafts > drafted:
        return f"num_drafts {rec.num_drafts} exceeds num_draft_tokens {drafted} (a draft proposes 1 token at least)"
    for name in ("ttft_ms", "e2e_ms", "energy_j"):
        v = getattr(rec, name)
        if v is not None and not (math.isfinite(v) and v >= 0):
            return f"{name} is {v}, not a finite value >= 0"
    if rec.status not in REQUEST_STATUSES:
        return f"status {rec.status!r} is not one of {', '.join(REQUEST_STATUSES)}"
    for s in rec.steps:
        if not 0 <= s.accepted <= s.k or s.num_emitted < 0:
            return f"step {s.step_index}: k {s.k}, accepted {s.accepted}, emitted {s.num_emitted}"
        if not all(math.isfinite(v) and v >= 0 for v in (s.draft_ms, s.verify_ms)):
            return f"step {s.step_index}: draft_ms {s.draft_ms}, verify_ms {s.verify_ms}: not finite values >= 0"
    return None


def requests_span_s(records: Iterable[RequestRecord]) -> float | None:
    """First request start -> last request end (start + E2E) of the records that have an end, any status: a run's
    wall time as the store computes it (`telemetry.queries._spans`, the same datetime arithmetic), so the tokens/s
    a bench or load test prints is the one `cost` and `invocations` show; None where no record has an end or the
    span is not positive."""
    ends = [(r.started_at, r.started_at + timedelta(milliseconds=r.e2e_ms)) for r in records if r.e2e_ms is not None]
    if not ends:
        return None
    span = (max(e for _, e in ends) - min(s for s, _ in ends)).total_seconds()
    return span if span > 0 else None
