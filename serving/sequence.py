"""Per-sequence decode state. Tensors are batched by the engine; everything here is per sequence."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from serving.sampling import SamplingParams


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: int
    slot: int  # KV-cache slot (target and drafter use the same index)
    params: SamplingParams
    tokens: list[int]  # prompt + committed output; tokens[-1] is not yet in the target cache
    num_prompt: int
    request_id: str | None = None
    domain: str = ""  # workload domain, for per-domain lookahead estimates
    generator: torch.Generator | None = None
    t_start: float = 0.0  # perf_counter at request start
    emit_times: list[float] = field(default_factory=list)  # perf_counter per output token
    step_index: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    finish_reason: str | None = None  # stop | length | cancelled | error
    error: str | None = None
    draft_len: int = 0  # tokens of `tokens` held in the drafter's cache
    draft_feats: torch.Tensor | None = None  # (P, C) target features the drafter has not consumed yet
    speculate: bool = True  # False: this sequence decodes autoregressively (K = 0) in any batch

    @property
    def output(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def kv_len(self) -> int:
        """Valid entries in the target cache: everything but the last committed token."""
        return len(self.tokens) - 1

    @property
    def done(self) -> bool:
        return self.finish_reason is not None
