"""Lookahead (K) policies: how many tokens the drafter proposes at the next step of a sequence.

A policy is asked once per sequence per step (`choose`) and told the outcome (`observe`). A policy may
also set `stop_below`: drafters then stop a sequence's draft early once the draft's own probability of
the token it proposed falls below it (entropy gating). The engine records the K chosen and the reason in
every step record.

  fixed:N     the same K every step (0 = the autoregressive baseline)
  heuristic   HF transformers' schedule: +2 after a fully accepted draft, -1 otherwise
  entropy     draft up to k_max tokens, stop at the first token the draft itself doubts
  cost        online acceptance per domain and per sequence state (how its last step ended), by draft
              depth, and the measured step-time curve pick the K (0 included) that maximises expected
              tokens per second: E[tokens | K] / step_time(K)
  auto        cost with per-token gating (CostK(gate=True)): K is a ceiling and each drafted token is
              kept only while verifying it raises the step's expected rate, from the measured acceptance
              of tokens the draft gave that probability. Measured best: the replay of the bundled draft's
              real proposals (scripts/sim_lookahead.py) and `make bench` (section lookahead); the numbers
              are in docs/benchmarks.md
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # no torch import: the CLI reads DEFAULT_K at start-up
    from serving.drafters import StopRule
    from serving.sequence import Sequence

# The policy bench and serve use when none is named (measured by `make bench`, section lookahead).
DEFAULT_K = "auto"
# vLLM runs one fixed K (num_speculative_tokens) for the whole engine: its default when none is named.
VLLM_DEFAULT_K = "4"


class LookaheadPolicy(Protocol):
    name: str
    stop_below: float | None

    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        """K for this sequence's next step and a short reason."""
        ...

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float,
                batch_size: int = 1, conf: list[float] | None = None) -> None:
        """The outcome of the step: `k` tokens drafted (the draft's probability of each in `conf` when the
        drafter reports it), `accepted` of them accepted."""
        ...

    def stop_rules(self, seqs: list[Sequence], ks: list[int], batch_size: int) -> list[StopRule | None] | None:
        """Per-sequence rules that end a draft early (see serving.drafters.StopRule); None: no rules."""
        ...

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
                batch_size: int = 1, conf: list[float] | None = None) -> None:
        pass

    def forget(self, seq: Sequence) -> None:
        pass

    def stop_rules(self, seqs: list[Sequence], ks: list[int], batch_size: int) -> list[StopRule | None] | None:
        return None


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
                batch_size: int = 1, conf: list[float] | None = None) -> None:
        if k == 0:
            return
        cur = self._k.get(seq.seq_id, self.k_start)
        self._k[seq.seq_id] = min(self.k_max, cur + 2) if accepted == k else max(1, cur - 1)

    def forget(self, seq: Sequence) -> None:
        self._k.pop(seq.seq_id, None)

    def stop_rules(self, seqs: list[Sequence], ks: list[int], batch_size: int) -> list[StopRule | None] | None:
        return None


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

    acceptance, per domain and per sequence state: a(d), the probability that drafted token d is accepted
    given that tokens 1..d-1 were. Acceptance is bursty (a draft that just got everything right is likely
    right again: copied code, boilerplate), so the estimate is kept per state, the way the sequence's
    previous step ended: "all" drafted tokens accepted, "some" accepted then a rejection, "none" (the first
    was rejected), "-" (no drafted step yet). Each a(d) is an exponentially weighted count, shrunk toward
    a(d - 1) of the same state (and a(1) toward the domain's alpha) while it has few observations.

    alpha, per domain: the per-token acceptance probability of Leviathan et al.'s i.i.d. model, estimated
    as accepted / tested: a step that drafted k tokens and accepted a of them tested a + 1 tokens when
    a < k (the first rejection ends the test) and k when all were accepted; exponentially weighted. It is
    the prior of the per-state estimates and what `set_alpha` seeds.

    cost curve, per batch-size bucket: the measured wall time of a step's verification at each K,
    exponentially weighted, and a least-squares line through those points weighted by how often each was
    measured; a step at K costs that plus K times the measured drafting time per drafted token (timing
    whole steps by K mixed up what was drafted: with draft+ngram, steps that copied five tokens for free
    were cheaper than steps where the model drafted three). A K not measured yet is read off the line; a
    measured K is its point shrunk toward the line while it has few observations (`point_prior` steps'
    worth), so one step timed during a stall cannot make a K look dear and keep the policy from ever
    trying it again. The first steps of a bucket measure K in `probes` (0 included: plain decoding is a
    candidate).

        rate(K) = E[tokens | K] / step_time(K),   E[tokens | K] = 1 + sum_{d=1..K} a(1) a(2) ... a(d)

    (with a(d) = alpha for every d this is Leviathan's (1 - alpha^(K+1)) / (1 - alpha)).

    With `gate` (drafters that report the draft's probability of each token it proposes), K is only the
    ceiling and each token is judged as it is drafted: q(p), the measured acceptance of tokens the draft
    gave probability p (per domain, in bins of 0.1), replaces a(d); the token is kept when it raises the
    step's expected rate, E' / T(j + 1) > E / (T(j) + d) with E' = E + P q (P: the chance every earlier
    kept token is accepted; d: token j's drafting time, spent either way), and drafting goes on while one
    more token as sure, one step deeper, would raise it again. q is kept apart for a draft's first token
    and the later ones (those read the draft's own features), and a token after the first must raise the
    rate by `margin` (5%) to be kept, a hedge against estimates learnt from few tokens. This is the
    cost-optimal form of entropy gating: the threshold follows from measured costs, not a constant.

    When K = 0 wins,
    every `probe_every`-th step of a sequence still drafts one token, so acceptance keeps being measured
    and speculation returns when the draft agrees again. A sequence's first step (which also catches the
    drafter up on the prompt), a bucket's first `settle` steps (cold caches) and outliers beyond 3x the
    current estimate do not move the cost curve; every `refresh_every` steps the probe K timed longest
    ago is timed again when that was over 4 x refresh_every steps ago, so no point of the curve goes
    stale while the policy avoids it."""

    def __init__(self, k_max: int = 8, weight: float = 0.1, alpha0: float = 0.6, stop_below: float | None = None,
                 probes: tuple[int, ...] = (1, 0, 2, 4), probe_every: int = 8, name: str | None = None,
                 by_state: bool = True, shrink: float = 2.0, gate: bool = False, depth_classes: int = 2,
                 margin: float = 0.05, settle: int = 3, refresh_every: int = 16, point_prior: float = 2.0):
        if k_max < 1 or not 0 < weight <= 1 or not 0 <= alpha0 < 1 or probe_every < 1 or shrink < 0:
            raise ValueError(f"need k_max >= 1, 0 < weight <= 1, 0 <= alpha0 < 1, probe_every >= 1, shrink >= 0; "
                             f"got {k_max}, {weight}, {alpha0}, {probe_every}, {shrink}")
        self.k_max, self.weight, self.alpha0, self.probe_every = k_max, weight, alpha0, probe_every
        self.by_state, self.shrink, self.gate, self.depth_classes = by_state, shrink, gate, depth_classes
        self.margin = margin
        self.settle, self.refresh_every = settle, refresh_every
        self.point_prior = point_prior
        self._timed: dict[tuple[int, int], int] = {}  # (bucket, K) -> steps timed (the point's evidence)
        # (domain, depth class, confidence bin) -> (hits, n); depth class 1 = a draft's first token, 2 = later
        self._bins: dict[tuple[str, int, int], tuple[float, float]] = {}
        self._conf_seen = False  # has the drafter reported its token probabilities?
        self.probes = tuple(k for k in probes if k <= k_max)
        self.stop_below = stop_below
        self.name = name or (f"cost:{k_max}" if stop_below is None else f"cost+entropy:{k_max}@{stop_below:g}")
        self._accepted: dict[str, float] = {}
        self._tested: dict[str, float] = {}
        self._depth: dict[tuple[str, str, int], tuple[float, float]] = {}  # (domain, state, d) -> (hits, n)
        self._state: dict[int, str] = {}
        self.step_s: dict[tuple[int, int], float] = {}  # (batch bucket, K) -> verify seconds per step
        self.draft_token_s: dict[int, float] = {}  # batch bucket -> drafting seconds per drafted token
        self._speed: dict[int, float] = {}  # batch bucket -> the machine's current speed factor (1 at start)
        self._steps: dict[int, int] = {}  # batch bucket -> steps observed
        self._last: dict[tuple[int, int], int] = {}  # (bucket, K) -> the bucket's step count when K was timed
        self._refreshing: set[int] = set()  # sequences timing a K this step (no gate)
        self.speed_weight = 0.5
        self._lines: dict[int, tuple[float, float] | None] = {}  # fitted lines, dropped when step_s changes
        self._seen: set[int] = set()
        self._ticks: dict[int, int] = {}  # per sequence: steps off (cost) or gated (gate), for probing

    # ---------------------------------------------------------------- estimates
    def alpha(self, domain: str) -> float:
        if domain not in self._tested:
            return self.alpha0
        return self._accepted[domain] / max(self._tested[domain], 1e-9)

    def set_alpha(self, domain: str, alpha: float) -> None:
        """Seed the estimate (e.g. from `specfinops calibrate`)."""
        self._accepted[domain], self._tested[domain] = alpha, 1.0

    def acceptance(self, domain: str, state: str = "-") -> list[float]:
        """a(1..k_max) for a sequence of `domain` in `state` (see the class docstring)."""
        out, prior = [], self.alpha(domain)
        for d in range(1, self.k_max + 1):
            hits, n = self._depth.get((domain, state, d), (0.0, 0.0))
            prior = (hits + self.shrink * prior) / (n + self.shrink) if n + self.shrink > 0 else prior
            out.append(min(prior, 0.999))
        return out

    def q(self, domain: str, conf: float, depth: int = 1) -> float:
        """Measured acceptance of drafted tokens at `depth` (1 or later) the draft gave probability `conf`
        (shrunk toward alpha). Later tokens read the draft's own features: the same probability is worth
        less there."""
        hits, n = self._bins.get((domain, min(depth, self.depth_classes), self._bin(conf)), (0.0, 0.0))
        return min((hits + self.shrink * self.alpha(domain)) / (n + self.shrink), 0.999)

    @staticmethod
    def _bin(conf: float) -> int:
        return min(9, max(0, int(conf * 10)))

    def expected_tokens(self, acc: list[float], k: int) -> float:
        total, p = 1.0, 1.0
        for a in acc[:k]:
            p *= a
            total += p
        return total

    def step_time(self, k: int, bucket: int = 1) -> float | None:
        """Expected step time at K (in the curve's units): verifying K drafted tokens plus drafting them."""
        line = self._line(bucket)
        if line is None:
            return None
        verify = max(1e-9, line[0] + line[1] * k)
        if (bucket, k) in self.step_s:
            n = self._evidence(bucket, k)
            verify = (n * self.step_s[(bucket, k)] + self.point_prior * verify) / (n + self.point_prior)
        return verify + k * self.draft_token_s.get(bucket, 0.0) / self._speed.get(bucket, 1.0)

    def _evidence(self, bucket: int, k: int) -> float:
        """Observations behind a point, capped at what an exponential average of this weight remembers."""
        return min(self._timed.get((bucket, k), 1), 1.0 / self.weight)

    def _line(self, bucket: int) -> tuple[float, float] | None:
        """(intercept, slope >= 0) of the least-squares line through the bucket's measured step times,
        each weighted by its evidence; fitted once per change of the curve, not per K asked about."""
        if bucket in self._lines:
            return self._lines[bucket]
        pts = [(kk, t, self._evidence(b, kk)) for (b, kk), t in self.step_s.items() if b == bucket]
        line = None
        if pts:
            n = sum(w for _, _, w in pts)
            mk = sum(w * kk for kk, _, w in pts) / n
            mt = sum(w * t for _, t, w in pts) / n
            var = sum(w * (kk - mk) ** 2 for kk, _, w in pts)
            slope = max(0.0, sum(w * (kk - mk) * (t - mt) for kk, t, w in pts) / var) if var else 0.0
            line = (mt - slope * mk, slope)
        self._lines[bucket] = line
        return line

    def expected_rate(self, alpha: float | list[float], k: int, bucket: int = 1) -> float | None:
        """Tokens per second at K for a per-token alpha (i.i.d.) or per-depth acceptances a(1..)."""
        t = self.step_time(k, bucket)
        if t is None:
            return None
        acc = alpha if isinstance(alpha, list) else [min(alpha, 0.999)] * self.k_max
        return self.expected_tokens(acc, k) / t

    # ---------------------------------------------------------------- policy
    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        bucket = batch_bucket(batch_size)
        for k in self.probes:
            if (bucket, k) not in self.step_s:
                return k, "cost-warmup"
        n = self._steps.get(bucket, 0)
        if n % self.refresh_every == 0:  # re-time the probe K timed longest ago, if long ago
            k = min(self.probes, key=lambda kk: self._last.get((bucket, kk), -1))
            if n - self._last.get((bucket, k), -1) > 4 * self.refresh_every:
                self._refreshing.add(seq.seq_id)
                return k, "cost-refresh"
        if self.gate and self._conf_seen:  # each token is judged as it is drafted (drafters that say how
            return self.k_max, "cost-gate"  # sure they are; prompt lookup does not: K by the model below)
        acc = self.acceptance(seq.domain, self._state.get(seq.seq_id, "-") if self.by_state else "-")
        rates = {k: self.expected_rate(acc, k, bucket) for k in range(self.k_max + 1)}
        best = max(rates, key=rates.get)
        if best > 0:
            return best, "cost"
        n = self._ticks[seq.seq_id] = self._ticks.get(seq.seq_id, 0) + 1
        return (1, "cost-probe") if n % self.probe_every == 0 else (0, "cost-off")

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float,
                batch_size: int = 1, conf: list[float] | None = None) -> None:
        w = self.weight
        self._conf_seen = self._conf_seen or conf is not None
        if k > 0:
            tested = k if accepted >= k else accepted + 1
            if seq.domain in self._tested:
                self._accepted[seq.domain] += w * (accepted - self._accepted[seq.domain])
                self._tested[seq.domain] += w * (tested - self._tested[seq.domain])
            else:
                self._accepted[seq.domain], self._tested[seq.domain] = float(accepted), float(tested)
            state = self._state.get(seq.seq_id, "-") if self.by_state else "-"
            for d in range(1, tested + 1):  # depth d was tested; accepted when d <= accepted
                self._count(self._depth, (seq.domain, state, d), d <= accepted)
                if conf is not None and d <= len(conf):
                    key = (seq.domain, min(d, self.depth_classes), self._bin(conf[d - 1]))
                    self._count(self._bins, key, d <= accepted)
            self._state[seq.seq_id] = "all" if accepted >= k else ("some" if accepted else "none")
        self._refreshing.discard(seq.seq_id)
        if seq.seq_id not in self._seen:
            self._seen.add(seq.seq_id)  # first step: includes catching up on the prompt
            return
        key = (batch_bucket(batch_size), k)
        n = self._steps[key[0]] = self._steps.get(key[0], 0) + 1
        if n <= self.settle:
            return  # an engine's first steps run on cold caches
        self._last[key] = n
        if k > 0:
            self._follow(self.draft_token_s, key[0], draft_s / k)
        # The machine's speed drifts (other tenants, clocks): a step time is read as speed x shape(K).
        # The speed follows every step quickly; the shape, which alone decides K, moves slowly and is not
        # left stale at a K measured only long ago.
        t = verify_s  # drafting is costed per drafted token (draft_token_s): a copied token drafts for free
        old = self.step_s.get(key)
        speed = self._speed.get(key[0], 1.0)
        stall = old is not None and t > 3 * old * speed  # beyond 3x what the K costs at the machine's speed
        if old is not None:
            speed += self.speed_weight * (min(max(t / old, speed / 3), speed * 3) - speed)
            self._speed[key[0]] = speed
        if stall:  # says nothing of the K's shape: counted even at 3x, one stall kept a K dear for a whole
            return  # run (a K the gate then shuns is retimed only as a probe); the speed follows it above
        self._timed[key] = self._timed.get(key, 0) + 1  # a stall is no evidence of the K's cost
        self._follow(self.step_s, key, t / speed, self._timed[key])
        self._lines.pop(key[0], None)  # refitted through the point as it now stands

    def _follow(self, table: dict, key, x: float, n: int = 0) -> None:
        """Exponentially weighted estimate of `x`, an outlier counting as at most 3x the estimate.

        With `n` (the estimate's readings, this one included), a reading below the estimate among its first
        1 / weight is averaged in plainly: timing noise only adds, so a lower reading says the estimate was
        taken high, and a K's first reading has no estimate to be judged an outlier against (the exponential
        average kept 90% of a first reading taken during a stall through the next, 35% through ten more,
        while the gate shunned the K and retimed it only every few dozen steps). A reading above it keeps
        the slow weight: the machine may be slowing down, which the speed factor takes up."""
        old = table.get(key)
        w = max(self.weight, 1.0 / n) if n and old is not None and x < old else self.weight
        table[key] = x if old is None else old + w * (min(x, 3 * old) - old)

    def _count(self, table: dict, key, hit: bool) -> None:
        """Exponentially weighted (hits, observations)."""
        hits, n = table.get(key, (0.0, 0.0))
        w = self.weight
        table[key] = ((1 - w) * hits + hit, (1 - w) * n + 1)

    def stop_rules(self, seqs: list[Sequence], ks: list[int], batch_size: int) -> list[StopRule | None] | None:
        if not self.gate:
            return None
        bucket = batch_bucket(batch_size)
        if any((bucket, k) not in self.step_s for k in self.probes):
            return None  # still measuring the cost curve
        return [self._rule(s, bucket) if k > 0 and s.seq_id not in self._refreshing else None
                for s, k in zip(seqs, ks, strict=True)]

    def _rule(self, seq: Sequence, bucket: int) -> StopRule:
        T = lambda k: self.step_time(k, bucket)  # noqa: E731
        e, p = 1.0, 1.0  # expected tokens of the kept draft, chance all kept tokens are accepted
        d = self.draft_token_s.get(bucket, 0.0) / self._speed.get(bucket, 1.0)  # in the curve's units
        n = self._ticks[seq.seq_id] = self._ticks.get(seq.seq_id, 0) + 1
        probe = n % self.probe_every == 0  # keep the first token now and then, so q keeps being measured

        def rule(j: int, conf: float) -> int | None:
            nonlocal e, p
            q = self.q(seq.domain, conf, j + 1)
            # token j's drafting is spent either way: keep it if verifying it raises the expected rate
            if not (probe and j == 0) and (e + p * q) / T(j + 1) <= (1 + self.margin * (j > 0)) * e / (T(j) + d):
                return j  # verifying this token costs more than it is expected to return: drop it
            e, p = e + p * q, p * q
            q_next = self.q(seq.domain, conf, j + 2)  # a next token as sure as this one, one deeper
            if (e + p * q_next) / T(j + 2) <= e / T(j + 1):
                return j + 1  # keep it; one more as likely would not pay
            return None

        return rule

    def forget(self, seq: Sequence) -> None:
        self._seen.discard(seq.seq_id)
        self._ticks.pop(seq.seq_id, None)
        self._state.pop(seq.seq_id, None)


class BatchGatedK:
    """Speculate with `inner` only while the running batch is small (vLLM's disable_by_batch_size); 0: never
    (a sweep where speculation lost at every measured level)."""

    def __init__(self, inner: LookaheadPolicy, max_batch_size: int):
        if max_batch_size < 0:
            raise ValueError(f"max_batch_size must be >= 0, got {max_batch_size}")
        self.inner, self.max_batch_size = inner, max_batch_size
        self.stop_below = inner.stop_below
        self.name = f"{inner.name}|batch<={max_batch_size}"

    def choose(self, seq: Sequence, batch_size: int) -> tuple[int, str]:
        if batch_size > self.max_batch_size:
            return 0, "batch-gated"
        return self.inner.choose(seq, batch_size)

    def observe(self, seq: Sequence, k: int, accepted: int, draft_s: float, verify_s: float,
                batch_size: int = 1, conf: list[float] | None = None) -> None:
        self.inner.observe(seq, k, accepted, draft_s, verify_s, batch_size, conf)

    def stop_rules(self, seqs: list[Sequence], ks: list[int], batch_size: int) -> list[StopRule | None] | None:
        return self.inner.stop_rules(seqs, ks, batch_size)

    def forget(self, seq: Sequence) -> None:
        self.inner.forget(seq)


POLICY_NAMES = ("N (an integer)", "heuristic", "entropy", "cost", "auto")


def fixed_k_zero(spec: str | int) -> bool:
    """A fixed lookahead of 0 (`--k 0`, as parse_policy reads it: FixedK(0)): speculative decoding that never
    drafts, plain AR."""
    text = str(spec).strip()
    return text.isdigit() and int(text) == 0


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
    if n == 0 and name in ("heuristic", "entropy", "cost", "auto"):  # `n or 8` read an explicit 0 as not given
        raise ValueError(f"k policy {spec!r}: the number after ':' must be >= 1 (K 0 is plain AR: --k 0)")
    if name == "heuristic":
        return HeuristicK(n or 4)
    if name == "entropy":
        return EntropyK(n or 8)
    if name == "cost":
        return CostK(n or 8)
    if name == "auto":
        return CostK(n or 8, gate=True, name=f"auto:{n or 8}")
    raise ValueError(f"unknown k policy {spec!r}: use {', '.join(POLICY_NAMES)}")
