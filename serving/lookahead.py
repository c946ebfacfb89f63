"""Lookahead (K) policies: how many tokens the drafter proposes at the next step of a sequence.

A policy is asked once per sequence per step (`choose`) and told the outcome (`observe`). A policy may
also set `stop_below`: drafters then stop a sequence's draft early once the draft's own probability of
the token it proposed falls below it (entropy gating). The engine records the K chosen and the reason in
every step record.

  fixed:N     the same K every step (0 = the autoregressive baseline)
  heuristic   HF transformers' schedule: +2 after a fully accepted draft, -1 otherwise
  entropy     draft up to k_max tokens, stop at the first token the draft itself doubts
  cost        online alpha per domain (EWMA) and the measured cost curve pick the K that maximises
              expected tokens per second: E[tokens](alpha, K) / (K * t_draft + t_verify(K))
  auto        cost, with entropy gating on top
"""

from __future__ import annotations

from typing import Protocol

from serving.sequence import Sequence


class LookaheadPolicy(Protocol):
    name: str
    stop_below: float | None

    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        """K for this sequence's next step and a short reason."""
        ...

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float) -> None: ...

    def forget(self, seq: Sequence) -> None: ...


class FixedK:
    """The same K every step (K = 0 is the autoregressive baseline)."""

    stop_below = None

    def __init__(self, k: int):
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an integer >= 0, got {k!r}")
        self.k = k
        self.name = f"fixed:{k}"

    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        return self.k, "fixed"

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass

    def forget(self, seq: Sequence) -> None:
        pass


class HeuristicK:
    """HF transformers' schedule: +2 after a fully accepted draft, -1 otherwise (kept in [1, k_max])."""

    stop_below = None

    def __init__(self, k_start: int = 4, k_max: int = 12):
        if k_start < 1 or k_max < k_start:
            raise ValueError(f"need 1 <= k_start <= k_max, got k_start={k_start}, k_max={k_max}")
        self.k_start, self.k_max = k_start, k_max
        self.name = f"heuristic:{k_start}"
        self._k: dict[int, int] = {}

    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        return self._k.get(seq.seq_id, self.k_start), "heuristic"

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        if k == 0:
            return
        cur = self._k.get(seq.seq_id, self.k_start)
        self._k[seq.seq_id] = min(self.k_max, cur + 2) if accepted == k else max(1, cur - 1)

    def forget(self, seq: Sequence) -> None:
        self._k.pop(seq.seq_id, None)


class EntropyK(FixedK):
    """Draft up to `k_max`, but stop as soon as the draft's probability of its own token drops below
    `min_prob` (a confident draft is usually right; a doubtful one wastes verify width)."""

    def __init__(self, k_max: int = 8, min_prob: float = 0.4):
        super().__init__(k_max)
        if not 0 < min_prob < 1:
            raise ValueError(f"min_prob must be in (0, 1), got {min_prob}")
        self.stop_below = min_prob
        self.name = f"entropy:{k_max}@{min_prob:g}"

    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        return self.k, "entropy"


class CostK:
    """Pick K to maximise expected tokens per second from online estimates.

    alpha: exponentially weighted per domain (accepted / proposed of each step); cost curve: EWMA of
    drafting time per proposed token and of the verify time at each K, measured by the engine. Until a
    K has been measured its verify time is extrapolated linearly from the measured ones."""

    def __init__(self, k_max: int = 8, weight: float = 0.1, alpha0: float = 0.6, stop_below: float | None = None):
        if k_max < 1 or not 0 < weight <= 1 or not 0 <= alpha0 < 1:
            raise ValueError(f"need k_max >= 1, 0 < weight <= 1, 0 <= alpha0 < 1; got {k_max}, {weight}, {alpha0}")
        self.k_max, self.weight, self.alpha0 = k_max, weight, alpha0
        self.stop_below = stop_below
        self.name = f"cost:{k_max}" if stop_below is None else f"auto:{k_max}"
        self.alpha: dict[str, float] = {}
        self.draft_s_per_token: float | None = None
        self.verify_s: dict[int, float] = {}

    def _ewma(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.weight * (new - old)

    def verify_time(self, k: int) -> float | None:
        if k in self.verify_s:
            return self.verify_s[k]
        if not self.verify_s:
            return None
        ks = sorted(self.verify_s)
        if len(ks) == 1:
            return self.verify_s[ks[0]]  # flat until a second point is measured
        (k0, t0), (k1, t1) = (ks[0], self.verify_s[ks[0]]), (ks[-1], self.verify_s[ks[-1]])
        slope = max(0.0, (t1 - t0) / (k1 - k0))
        return t0 + slope * (k - k0)

    def expected_rate(self, alpha: float, k: int) -> float | None:
        tv = self.verify_time(k)
        if tv is None or self.draft_s_per_token is None:
            return None
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
        return tokens / (k * self.draft_s_per_token + tv)

    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        alpha = min(self.alpha.get(seq.domain, self.alpha0), 0.999)
        rates = {k: self.expected_rate(alpha, k) for k in range(1, self.k_max + 1)}
        if any(r is None for r in rates.values()):
            return min(4, self.k_max), "cost-warmup"
        return max(rates, key=rates.get), "cost"

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        if k == 0:
            return
        self.alpha[seq.domain] = self._ewma(self.alpha.get(seq.domain, self.alpha0), accepted / k)
        self.draft_s_per_token = self._ewma(self.draft_s_per_token, draft_s / k)
        self.verify_s[k] = self._ewma(self.verify_s.get(k), verify_s)

    def forget(self, seq: Sequence) -> None:
        pass


class BatchGatedK:
    """Speculate with `inner` only while the running batch is small (vLLM's disable_by_batch_size)."""

    def __init__(self, inner: LookaheadPolicy, max_batch_size: int):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.inner, self.max_batch_size = inner, max_batch_size
        self.stop_below = inner.stop_below
        self.name = f"{inner.name}|batch<={max_batch_size}"

    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        if batch_size > self.max_batch_size:
            return 0, "batch-gated"
        return self.inner.choose(seq, batch_size)

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.inner.observe(seq, k, accepted, draft_s, verify_s)

    def forget(self, seq: Sequence) -> None:
        self.inner.forget(seq)


POLICY_NAMES = ("N (an integer)", "heuristic", "entropy", "cost", "auto")


def parse_policy(spec: str | int) -> LookaheadPolicy:
    """`4` -> FixedK(4); `heuristic[:start]`, `entropy[:k_max]`, `cost[:k_max]`, `auto[:k_max]`."""
    text = str(spec).strip().lower()
    if text.isdigit():
        return FixedK(int(text))
    if text.lstrip("-").isdigit():
        raise ValueError(f"k must be >= 0, got {spec}")
    name, _, arg = text.partition(":")
    if arg and not arg.isdigit():
        raise ValueError(f"k policy {spec!r}: the part after ':' must be an integer")
    n = int(arg) if arg else None
    if name == "heuristic":
        return HeuristicK(n or 4)
    if name == "entropy":
        return EntropyK(n or 8)
    if name == "cost":
        return CostK(n or 8)
    if name == "auto":
        return CostK(n or 8, stop_below=0.4)
    raise ValueError(f"unknown k policy {spec!r}: use {', '.join(POLICY_NAMES)}")
