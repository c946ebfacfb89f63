"""Synthetic stores for tests: realistic runs, requests, steps, token events and power samples written
straight through the ORM, so tests can hand-compute every aggregate they expect.

    with Session(engine) as s:
        ar = make_run(s, "ar", requests=[Req(output_tokens=33, ttft_ms=100, e2e_ms=900)])
        sp = make_run(s, "spec", requests=[spec_req(output_tokens=33, k=4, accepted=24, ttft_ms=100, e2e_ms=500)],
                      with_events=True, power_w=[250.0, 260.0])
        s.commit()

`Req.start_s` is the request start in seconds after the run start; the run's ended_at defaults to the last
request end. With `with_events=True` every request gets step rows and one token event per output token
that agree with its counts (drafts, drafted, accepted).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from telemetry.db import PowerSample, Request, Run, Step, TokenEvent

BASE_TIME = datetime(2026, 11, 2, 9, 0, 0, tzinfo=UTC)


@dataclass
class Req:
    """One request as a test describes it; counts are raw, as the store holds them."""

    output_tokens: int = 32
    ttft_ms: float | None = 50.0
    e2e_ms: float | None = 500.0
    start_s: float = 0.0  # seconds after the run start
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    energy_j: float | None = None
    domain: str = "code"
    status: str = "ok"
    prompt_tokens: int = 16
    external_id: str | None = None


def spec_req(output_tokens: int, k: int, accepted: int, **kw) -> Req:
    """A speculative request whose drafts follow from its length: each step emits accepted_i + 1 tokens
    after the prefill token, so drafts = output_tokens - 1 - accepted and drafted = drafts x k."""
    drafts = output_tokens - 1 - accepted
    if drafts < 0 or accepted > drafts * k:
        raise ValueError(
            f"inconsistent spec request: output_tokens={output_tokens} k={k} accepted={accepted}"
        )
    return Req(
        output_tokens=output_tokens,
        num_drafts=drafts,
        num_draft_tokens=drafts * k,
        num_accepted_tokens=accepted,
        **kw,
    )


def _steps_and_tokens(req: Req, k: int) -> tuple[list[Step], list[TokenEvent]]:
    """Steps and token events consistent with the request's counts (AR: one token per step)."""
    if not req.output_tokens:
        return [], []
    ttft = req.ttft_ms or 0.0
    e2e = req.e2e_ms if req.e2e_ms is not None else ttft
    tokens = [TokenEvent(position=0, emit_offset_ms=ttft, step_index=-1, source="ar")]  # sampled at prefill
    steps: list[Step] = []
    n_steps = req.num_drafts if k else req.output_tokens - 1
    base, extra = divmod(req.num_accepted_tokens, n_steps) if k and n_steps else (0, 0)
    pos = 1
    for i in range(n_steps):
        t = ttft + (e2e - ttft) * (i + 1) / n_steps
        if k:
            acc = base + (1 if i < extra else 0)  # <= k because accepted <= drafts x k
            emitted = acc + 1
            sources = ["accepted"] * acc + ["bonus" if acc == k else "correction"]
        else:
            acc, emitted, sources = 0, 1, ["ar"]
        steps.append(
            Step(
                step_index=i,
                k=k,
                accepted=acc,
                num_emitted=emitted,
                draft_ms=0.5 * k,
                verify_ms=10.0,
                t_offset_ms=t,
            )
        )
        for src in sources:
            tokens.append(TokenEvent(position=pos, emit_offset_ms=t, step_index=i, source=src))
            pos += 1
    return steps, tokens


def make_run(
    session: Session,
    mode: str = "spec",
    *,
    requests: list[Req] | None = None,
    started_at: datetime = BASE_TIME,
    ended_at: datetime | None = None,
    node_id: str = "node-a",
    hostname: str = "host-a",
    device: str = "cpu (2 cores)",
    backend: str = "torch",
    dtype: str = "float32",
    target: str = "demo/target-tiny",
    drafter: str | None = "demo/draft-tiny",
    k: int = 4,
    k_policy: str | None = None,
    temperature: float = 0.0,
    top_p: float | None = 1.0,
    top_k: int | None = 0,  # as a run records it now (0 = off); None: unknown, as one recorded before migration 0008
    seed: int | None = None,
    max_new_tokens: int | None = None,
    concurrency: int = 1,
    workload: str = "code",
    power_source: str = "none",
    price_snapshot: dict | None = None,
    kind: str = "bench",
    status: str = "completed",
    with_events: bool = False,
    power_w: list[float] | None = None,
) -> Run:
    """Add one run with its requests (and optionally steps, token events, power samples); flushes, does not
    commit. AR runs get drafter None, k_policy "none"."""
    if mode not in ("spec", "ar"):
        raise ValueError(f"mode must be 'spec' or 'ar', got {mode!r}")
    requests = requests or []
    k = k if mode == "spec" else 0
    if ended_at is None:
        ends = [started_at + timedelta(seconds=r.start_s, milliseconds=r.e2e_ms or 0.0) for r in requests]
        ended_at = max(ends, default=started_at + timedelta(seconds=1))
    run = Run(
        kind=kind,
        mode=mode,
        node_id=node_id,
        hostname=hostname,
        device=device,
        backend=backend,
        dtype=dtype,
        target=target,
        drafter=drafter if mode == "spec" else None,
        k_policy=(k_policy or f"fixed:{k}") if mode == "spec" else "none",
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        max_new_tokens=max_new_tokens,
        concurrency=concurrency,
        workload=workload,
        power_source=power_source,
        software_version="0.1.0-test",
        price_snapshot=price_snapshot,
        started_at=started_at,
        ended_at=ended_at,
        status=status,
    )
    session.add(run)
    session.flush()
    for r in requests:
        row = Request(
            run_id=run.id,
            external_id=r.external_id,
            domain=r.domain,
            started_at=started_at + timedelta(seconds=r.start_s),
            prompt_tokens=r.prompt_tokens,
            output_tokens=r.output_tokens,
            num_drafts=r.num_drafts,
            num_draft_tokens=r.num_draft_tokens,
            num_accepted_tokens=r.num_accepted_tokens,
            ttft_ms=r.ttft_ms,
            e2e_ms=r.e2e_ms,
            energy_j=r.energy_j,
            status=r.status,
            error=None if r.status == "ok" else "synthetic failure",
        )
        session.add(row)
        session.flush()
        if with_events and r.status == "ok":
            steps, tokens = _steps_and_tokens(r, k)
            for item in (*steps, *tokens):
                item.request_id = row.id
            session.add_all([*steps, *tokens])
    if power_w:
        span = (ended_at - started_at).total_seconds()
        for i, w in enumerate(power_w):
            t = started_at + timedelta(seconds=span * i / max(1, len(power_w) - 1))
            session.add(
                PowerSample(
                    run_id=run.id,
                    t=t,
                    device_index=0,
                    power_w=w,
                    energy_mj=None,
                    utilization_pct=None,
                    source="estimate"
                    if power_source == "estimate"
                    else power_source
                    if power_source in ("nvml", "rapl")
                    else "estimate",
                )
            )
    session.flush()
    return run


def h100_runs_of_two_recorded_prices(session: Session) -> None:
    """An AR run and a spec run on one H100 that recorded different node prices ($4/h and $5/h); committed."""
    for usd, mode in ((4.0, "ar"), (5.0, "spec")):
        req = Req(100, ttft_ms=100, e2e_ms=10_000) if mode == "ar" else spec_req(200, 4, 150, ttft_ms=100,
                                                                                e2e_ms=10_000)
        make_run(session, mode, device="NVIDIA H100 80GB HBM3",
                 price_snapshot={"name": "H100", "units": 1, "node_hourly_usd": usd}, requests=[req])
    session.commit()
