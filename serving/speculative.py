"""The speculative decoding step (Leviathan et al. 2023; Chen et al. 2023).

The draft proposed tokens x_1..x_K with its probabilities q; the target scored the same positions in
one forward, giving p for each of them plus one more position. Walk the drafts left to right:

    q(x) <= p(x): always accept                 (the target likes it at least as much)
    q(x) >  p(x): accept with probability p(x) / q(x)

At the first rejection, emit a token from the residual norm(max(p - q, 0)) and stop; if all K are
accepted, emit a bonus token from the target's distribution at position K + 1. Every step therefore
emits between 1 and K + 1 tokens, and each emitted token is distributed exactly as the target's.

At temperature 0 (greedy) the same walk becomes: accept while the draft token is the target's argmax,
then emit the target's argmax.
"""

from __future__ import annotations

import torch

from serving.sampling import sample


def rejection_sample(
    target_probs: torch.Tensor,  # (K+1, V)
    draft_probs: torch.Tensor,  # (K, V)
    draft_tokens: torch.Tensor,  # (K,)
    generator: torch.Generator | None = None,
) -> list[int]:
    """Accepted draft tokens followed by exactly one corrected or bonus token."""
    k = draft_tokens.shape[0]
    if target_probs.shape[0] != k + 1 or draft_probs.shape[0] != k:
        raise ValueError(
            f"shapes disagree: target_probs {tuple(target_probs.shape)}, draft_probs "
            f"{tuple(draft_probs.shape)}, draft_tokens {tuple(draft_tokens.shape)} (need K+1, K, K)"
        )
    rows = torch.arange(k)
    p = target_probs[rows, draft_tokens]  # (K,)
    q = draft_probs[rows, draft_tokens]  # (K,)
    accept_prob = torch.clamp(p / q, max=1.0)  # q > 0: the draft sampled these tokens
    u = torch.rand(k, generator=generator)
    rejected = (u >= accept_prob).nonzero()
    drafts = draft_tokens.tolist()
    if rejected.numel() == 0:
        return drafts + [sample(target_probs[k], generator)]  # bonus token
    n = int(rejected[0])
    residual = torch.clamp(target_probs[n] - draft_probs[n], min=0.0)
    total = residual.sum()
    # total == 0 only when p == q at row n, where rejection has probability 0; guard rounding anyway
    residual = residual / total if total > 0 else target_probs[n]
    return drafts[:n] + [sample(residual, generator)]


def greedy_verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> list[int]:
    """Temperature 0: accept drafts while they equal the target's argmax, then the target's argmax.
    target_logits (K+1, V), draft_tokens (K,)."""
    best = target_logits.argmax(-1).tolist()  # (K+1,)
    drafts = draft_tokens.tolist()
    n = 0
    while n < len(drafts) and drafts[n] == best[n]:
        n += 1
    return drafts[:n] + [best[n]]


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens emitted per step] = (1 - a^(K+1)) / (1 - a) for a constant acceptance rate a."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)
