"""Synthetic request records for recorder benchmarks and fault tests — never shown as measured data."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from telemetry.records import RequestRecord, StepRow, TokenRow


def synthetic_request(rng: random.Random, num_tokens: int, k: int = 4, domain: str = "synthetic") -> RequestRecord:
    """A speculative request of `num_tokens` output tokens: random acceptance per step, every token
    accounted for by a step (accepted drafts, then a bonus or correction token)."""
    steps: list[StepRow] = []
    tokens: list[TokenRow] = []
    t_ms = 10.0
    while len(tokens) < num_tokens:
        accepted = rng.randint(0, k)
        emit = min(accepted + 1, num_tokens - len(tokens))
        t_ms += 3.0
        step = len(steps)
        steps.append(StepRow(step, k, accepted, emit, draft_ms=1.0, verify_ms=2.0, t_offset_ms=t_ms))
        for i in range(emit):
            source = "accepted" if i < accepted else ("bonus" if accepted == k else "correction")
            tokens.append(TokenRow(len(tokens), t_ms, step, source))
    return RequestRecord(
        started_at=datetime.now(UTC),
        domain=domain,
        prompt_tokens=32,
        output_tokens=len(tokens),
        num_drafts=len(steps),
        num_draft_tokens=k * len(steps),
        num_accepted_tokens=sum(s.accepted for s in steps),
        ttft_ms=10.0,
        e2e_ms=t_ms,
        steps=steps,
        tokens=tokens,
    )
