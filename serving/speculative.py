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

from dataclasses import dataclass

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


# ---------------------------------------------------------------- token trees (SpecInfer; EAGLE-2)
#
# A tree drafter proposes several continuations at once: node i holds a token and its parent, and the
# target scores every node in one forward (each node attends only to its ancestors). Verification walks
# down from the root (the last committed token), at each node trying its children in the drafter's order.
#
# The children are chosen deterministically (the drafter's top candidates), so each try is a speculative
# sampling step whose draft q is one-hot on the child c: accept with probability min(1, p(c) / 1) = p(c);
# on rejection the residual norm(max(p - q, 0)) is p with c removed and renormalised, and the next child
# is tried against that residual. When no child survives, the token comes from what is left of p; at a
# leaf, from p itself. Every emitted token is again distributed exactly as the target's.


@dataclass(frozen=True, slots=True)
class TokenTree:
    """Draft nodes in breadth-first order: tree index 0 is the root, node i is tree index i + 1."""

    tokens: list[int]
    parents: list[int]  # tree index of each node's parent (0 = the root); parents[i] <= i

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not 0 <= parent <= i:
                raise ValueError(f"node {i}: parent {parent} must be an earlier tree index (0..{i})")

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        """Depth of every tree index (root 0)."""
        d = [0]
        for parent in self.parents:
            d.append(d[parent] + 1)
        return d

    def children(self) -> list[list[int]]:
        """Tree indices of the children of every tree index, in the drafter's order."""
        kids: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, parent in enumerate(self.parents):
            kids[parent].append(i + 1)
        return kids

    def ancestors(self, size: int | None = None) -> torch.Tensor:
        """(size, size) bool, [i, j] True when tree index j is i or an ancestor of i (the attention mask among
        the nodes). Rows past the tree (padding up to `size`) see only themselves."""
        n = len(self.tokens) + 1
        size = size or n
        anc = torch.eye(size, dtype=torch.bool)
        for i, parent in enumerate(self.parents):
            anc[i + 1, : i + 1] = anc[parent, : i + 1]
        return anc

    def truncate(self, max_depth: int) -> TokenTree:
        """The nodes at depth <= max_depth (breadth-first order keeps the tree indices of those kept)."""
        depth = self.depths()
        keep = sum(1 for d in depth[1:] if d <= max_depth)
        return TokenTree(self.tokens[:keep], self.parents[:keep])

    def head(self, n: int) -> TokenTree:
        """The first n nodes (breadth-first order: still a tree)."""
        return TokenTree(self.tokens[:n], self.parents[:n])

    @classmethod
    def chain(cls, tokens: list[int]) -> TokenTree:
        return cls(list(tokens), list(range(len(tokens))))


def tree_greedy_verify(target_logits: torch.Tensor, tree: TokenTree) -> tuple[list[int], list[int]]:
    """Temperature 0: follow the child that is the target's argmax. target_logits (1 + nodes, V).
    Returns (emitted tokens: the accepted path then the target's next token, accepted tree indices)."""
    best = target_logits.argmax(-1).tolist()
    kids = tree.children()
    path, node = [], 0
    while True:
        nxt = next((c for c in kids[node] if tree.tokens[c - 1] == best[node]), None)
        if nxt is None:
            return [tree.tokens[i - 1] for i in path] + [best[node]], path
        path.append(nxt)
        node = nxt


def tree_rejection_sample(target_probs: torch.Tensor, tree: TokenTree,
                          generator: torch.Generator | None = None) -> tuple[list[int], list[int]]:
    """Sampling: at each node try its children in order, child c accepted with probability r(c) where r is
    the target's distribution with the children already rejected removed (renormalised); then the next
    token from r. target_probs (1 + nodes, V). Returns (emitted tokens, accepted tree indices)."""
    kids = tree.children()
    path, node = [], 0
    while True:
        residual = target_probs[node]
        for c in kids[node]:
            tok = tree.tokens[c - 1]
            if float(torch.rand(1, generator=generator)) < float(residual[tok]):
                path.append(c)
                node = c
                break
            residual = residual.clone()
            residual[tok] = 0.0
            total = residual.sum()
            # total == 0 only if every token of mass was tried and rejected, which has probability 0
            residual = residual / total if total > 0 else target_probs[node]
        else:
            return [tree.tokens[i - 1] for i in path] + [sample(residual, generator)], path
