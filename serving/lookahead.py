"""Lookahead (K) policies: how many tokens the drafter proposes at the next step of a sequence.

A policy is asked once per sequence per step (`choose`) and told the outcome (`observe`). A policy may
also set `stop_below`: drafters then stop a sequence's draft early once the draft's own probability of
the token it proposed falls below it (entropy gating). The engine records the K chosen and the reason in
every step record.

  fixed:N     the same K every step (0 = the autoregressive baseline)
  heuristic   HF transformers' schedule: +2 after a fully accepted draft, -1 otherwise
  entropy     draft up to k_max tokens, stop at the first token the draft itself doubts
  cost        online alpha per domain (EWMA) and the measured step-time curve pick the K (0 included)
              that maximises expected tokens per second: E[tokens](alpha, K) / step_time(K)
  auto        the combination that measured best: `make bench` (section lookahead, bundled draft, bf16,
              2026-11-30) measured cost alone at 0.97x / 1.02x / 1.11x the best fixed K on code / chat /
              rewrite and cost with entropy gating (min prob 0.4) at 0.99x / 0.91x / 1.04x, so auto is
              cost; `entropy` keeps the gate for drafts whose confidence tells more
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # no torch import: the CLI reads DEFAULT_K at start-up
    from serving.sequence import Sequence

# The policy bench and serve use when none is named (measured by `make bench`, section lookahead).
DEFAULT_K = "4"


class LookaheadPolicy(Protocol):
    name: str
    stop_below: float | None

    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        """K for this sequence's next step and a short reason."""
        ...

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float,
                batch_size: int = 1) -> None: ...

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

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float,
                batch_size: int = 1) -> None:
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

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float,
                batch_size: int = 1) -> None:
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


def batch_bucket(batch_size: int) -> int:
    """1, 2, 4, 8, ...: the power of two at or above the batch size (cost curves are kept per bucket)."""
    return 1 << max(0, int(batch_size) - 1).bit_length()


class CostK:
    """Pick K (0 = plain decoding for this step) to maximise expected tokens per second.

    alpha, per domain: the per-token acceptance probability of Leviathan et al.'s i.i.d. model, estimated
    as accepted / tested: a step that drafted k tokens and accepted a of them tested a + 1 tokens when
    a < k (the first rejection ends the test) and k when all were accepted. Both counts are exponentially
    weighted, so the estimate follows the traffic.

    cost curve, per batch-size bucket: the measured wall time of a step (draft + verify) at each K,
    exponentially weighted; a K not measured yet is read off a least-squares line through the measured
    ones. The first steps of a bucket measure K in `probes` (0 included: plain decoding is a candidate).

        rate(K) = E[tokens | alpha, K] / step_time(K),   E = (1 - alpha^(K+1)) / (1 - alpha)

    When K = 0 wins, every `probe_every`-th step of a sequence still drafts one token, so alpha keeps
    being measured and speculation returns when the draft agrees again. A sequence's first step (which
    also catches the drafter up on the prompt) and outliers beyond 3x the current estimate do not move
    the cost curve."""

    def __init__(self, k_max: int = 8, weight: float = 0.1, alpha0: float = 0.6, stop_below: float | None = None,
                 probes: tuple[int, ...] = (1, 0, 2, 4), probe_every: int = 8, name: str | None = None):
        if k_max < 1 or not 0 < weight <= 1 or not 0 <= alpha0 < 1 or probe_every < 1:
            raise ValueError(f"need k_max >= 1, 0 < weight <= 1, 0 <= alpha0 < 1, probe_every >= 1; "
                             f"got {k_max}, {weight}, {alpha0}, {probe_every}")
        self.k_max, self.weight, self.alpha0, self.probe_every = k_max, weight, alpha0, probe_every
        self.probes = tuple(k for k in probes if k <= k_max)
        self.stop_below = stop_below
        self.name = name or (f"cost:{k_max}" if stop_below is None else f"cost+entropy:{k_max}@{stop_below:g}")
        self._accepted: dict[str, float] = {}
        self._tested: dict[str, float] = {}
        self.step_s: dict[tuple[int, int], float] = {}  # (batch bucket, K) -> seconds per step
        self._lines: dict[int, tuple[float, float] | None] = {}  # fitted lines, dropped when step_s changes
        self._seen: set[int] = set()
        self._off: dict[int, int] = {}

    # ---------------------------------------------------------------- estimates
    def alpha(self, domain: str) -> float:
        if domain not in self._tested:
            return self.alpha0
        return self._accepted[domain] / max(self._tested[domain], 1e-9)

    def set_alpha(self, domain: str, alpha: float) -> None:
        """Seed the estimate (e.g. from `specfinops calibrate`)."""
        self._accepted[domain], self._tested[domain] = alpha, 1.0

    def step_time(self, k: int, bucket: int = 1) -> float | None:
        if (bucket, k) in self.step_s:
            return self.step_s[(bucket, k)]
        line = self._line(bucket)
        return None if line is None else max(1e-9, line[0] + line[1] * k)

    def _line(self, bucket: int) -> tuple[float, float] | None:
        """(intercept, slope >= 0) of the least-squares line through the bucket's measured step times;
        fitted once per change of the curve, not per K asked about."""
        if bucket in self._lines:
            return self._lines[bucket]
        pts = [(kk, t) for (b, kk), t in self.step_s.items() if b == bucket]
        line = None
        if pts:
            n = len(pts)
            mk = sum(kk for kk, _ in pts) / n
            mt = sum(t for _, t in pts) / n
            var = sum((kk - mk) ** 2 for kk, _ in pts)
            slope = max(0.0, sum((kk - mk) * (t - mt) for kk, t in pts) / var) if var else 0.0
            line = (mt - slope * mk, slope)
        self._lines[bucket] = line
        return line

    def expected_rate(self, alpha: float, k: int, bucket: int = 1) -> float | None:
        t = self.step_time(k, bucket)
        if t is None:
            return None
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
        return tokens / t

    # ---------------------------------------------------------------- policy
    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        bucket = batch_bucket(batch_size)
        for k in self.probes:
            if (bucket, k) not in self.step_s:
                return k, "cost-warmup"
        alpha = min(self.alpha(seq.domain), 0.999)
        rates = {k: self.expected_rate(alpha, k, bucket) for k in range(self.k_max + 1)}
        best = max(rates, key=rates.get)
        if best > 0:
            return best, "cost"
        n = self._off.get(seq.seq_id, 0) + 1
        self._off[seq.seq_id] = n
        return (1, "cost-probe") if n % self.probe_every == 0 else (0, "cost-off")

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float,
                batch_size: int = 1) -> None:
        w = self.weight
        if k > 0:
            tested = k if accepted >= k else accepted + 1
            if seq.domain in self._tested:
                self._accepted[seq.domain] += w * (accepted - self._accepted[seq.domain])
                self._tested[seq.domain] += w * (tested - self._tested[seq.domain])
            else:
                self._accepted[seq.domain], self._tested[seq.domain] = float(accepted), float(tested)
        if seq.seq_id not in self._seen:
            self._seen.add(seq.seq_id)  # first step: includes catching up on the prompt
            return
        key = (batch_bucket(batch_size), k)
        self._lines.pop(key[0], None)
        t = draft_s + verify_s
        old = self.step_s.get(key)
        if old is None:
            self.step_s[key] = t
        else:
            self.step_s[key] = old + w * (min(t, 3 * old) - old)

    def forget(self, seq: Sequence) -> None:
        self._seen.discard(seq.seq_id)
        self._off.pop(seq.seq_id, None)


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

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float,
                batch_size: int = 1) -> None:
        self.inner.observe(seq, k, accepted, draft_s, verify_s, batch_size)

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
        return CostK(n or 8, name=f"auto:{n or 8}")
    raise ValueError(f"unknown k policy {spec!r}: use {', '.join(POLICY_NAMES)}")
