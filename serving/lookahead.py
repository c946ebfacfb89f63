"""Lookahead (K) policies: how many tokens the drafter proposes at the next step of a sequence.

A policy is asked once per sequence per step (`choose`) and told the outcome (`observe`). The engine
records the K chosen and the policy's reason in every step record.
"""

from __future__ import annotations

from typing import Protocol


class LookaheadPolicy(Protocol):
    name: str

    def choose(self, seq_id: int, batch_size: int) -> tuple[int, str]:
        """K for this sequence's next step and a short reason."""
        ...

    def observe(self, seq_id: int, k: int, accepted: int) -> None: ...

    def forget(self, seq_id: int) -> None: ...


class FixedK:
    """The same K every step (K = 0 is the autoregressive baseline)."""

    def __init__(self, k: int):
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an integer >= 0, got {k!r}")
        self.k = k
        self.name = f"fixed:{k}"

    def choose(self, seq_id: int, batch_size: int) -> tuple[int, str]:
        return self.k, "fixed"

    def observe(self, seq_id: int, k: int, accepted: int) -> None:
        pass

    def forget(self, seq_id: int) -> None:
        pass


class HeuristicK:
    """HF transformers' schedule: +2 after a fully accepted draft, -1 otherwise (kept in [1, k_max])."""

    def __init__(self, k_start: int = 4, k_max: int = 12):
        if k_start < 1 or k_max < k_start:
            raise ValueError(f"need 1 <= k_start <= k_max, got k_start={k_start}, k_max={k_max}")
        self.k_start, self.k_max = k_start, k_max
        self.name = f"heuristic:{k_start}"
        self._k: dict[int, int] = {}

    def choose(self, seq_id: int, batch_size: int) -> tuple[int, str]:
        return self._k.get(seq_id, self.k_start), "heuristic"

    def observe(self, seq_id: int, k: int, accepted: int) -> None:
        if k == 0:
            return
        cur = self._k.get(seq_id, self.k_start)
        self._k[seq_id] = min(self.k_max, cur + 2) if accepted == k else max(1, cur - 1)

    def forget(self, seq_id: int) -> None:
        self._k.pop(seq_id, None)


class BatchGatedK:
    """Speculate with `inner` only while the running batch is small (vLLM's disable_by_batch_size)."""

    def __init__(self, inner: LookaheadPolicy, max_batch_size: int):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.inner, self.max_batch_size = inner, max_batch_size
        self.name = f"{inner.name}|batch<={max_batch_size}"

    def choose(self, seq_id: int, batch_size: int) -> tuple[int, str]:
        if batch_size > self.max_batch_size:
            return 0, "batch-gated"
        return self.inner.choose(seq_id, batch_size)

    def observe(self, seq_id: int, k: int, accepted: int) -> None:
        self.inner.observe(seq_id, k, accepted)

    def forget(self, seq_id: int) -> None:
        self.inner.forget(seq_id)


def parse_policy(spec: str | int) -> LookaheadPolicy:
    """`4` -> FixedK(4); `heuristic` or `heuristic:4` -> HeuristicK."""
    text = str(spec).strip().lower()
    if text.isdigit():
        return FixedK(int(text))
    if text.startswith("heuristic"):
        _, _, start = text.partition(":")
        return HeuristicK(int(start) if start else 4)
    if text.lstrip("-").isdigit():
        raise ValueError(f"k must be >= 0, got {spec}")
    raise ValueError(f"unknown k policy {spec!r}: use an integer K >= 0 or 'heuristic'")
