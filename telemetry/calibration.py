"""Calibration arithmetic: per domain, alpha, mean acceptance length, the cost ratio c, the K that
maximises the Leviathan et al. speedup bound, and a GO / NO-GO verdict. Pure functions over step
counts, so the figures can be checked by hand."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from telemetry.finops import speedup_bound, speedup_exceeds_acceptance, speedup_over_acceptance_text

DEFAULT_THRESHOLD = 0.65
MIN_TESTED_TOKENS = 20  # fewer tested draft tokens than this and alpha (so the verdict and bound) is mostly noise
# timings no machine can produce, said beside the figures (never clamped): a verify forward over K + 1 tokens costs
# at least about one one-token forward (v >= 1), and a speculative step, emitting the mean acceptance length in
# tokens for at least one target forward, cannot beat AR by more than that length (finops'
# MAX_SPEEDUP_OVER_ACCEPTANCE_LENGTH, the rule every speedup shown beside money applies); the margins allow for noise
MIN_VERIFY_RATIO = 0.8


@dataclass(frozen=True, slots=True)
class StepCounts:
    """What one domain's speculative and AR decode steps added up to."""

    num_drafts: int  # steps that proposed at least one token
    num_draft_tokens: int
    num_accepted_tokens: int
    # steps that ended in no rejection: every drafted token accepted, or cut by an EOS / stop string inside the
    # accepted drafts (alpha_k); the others ended in a rejection
    num_full_accepts: int
    draft_ms: float  # total drafting time of those steps
    ar_steps: int  # AR (K = 0) decode steps of the same prompts
    ar_verify_ms: float  # their total target forward time
    spec_verify_ms: float | None = None  # total target (verify) forward time of the speculative steps


@dataclass(frozen=True, slots=True)
class Calibration:
    domain: str
    alpha: float | None  # per-token acceptance probability (Leviathan et al.'s alpha, the bound's a)
    mean_acceptance_length: float | None
    c: float | None  # draft time per proposed token / target time per one-token forward
    best_k: int | None
    bound_at_best_k: float | None
    verdict: str  # GO | NO-GO | UNKNOWN
    threshold: float
    # the bound assumes verifying K+1 tokens costs one forward; v measures what it costs on this machine
    verify_ratio: float | None = None  # mean verify forward of the speculative steps / one-token forward
    k_measured: float | None = None  # mean draft length of those steps
    bound_with_measured_verify: float | None = None  # tokens per step / (K c + v) at the measured K
    acceptance_rate: float | None = None  # accepted / drafted tokens at the measured K (vLLM's metric)
    tested: int | None = None  # draft tokens tested: alpha's denominator (accepted + the rejections ending steps)

    @property
    def provisional(self) -> bool:
        """True where the verdict rests on fewer than MIN_TESTED_TOKENS tested draft tokens: too few to judge
        (calibration_warnings says so); the verdict is then shown as 'GO (too few)' / 'NO-GO (too few)'."""
        return self.alpha is not None and self.tested is not None and 0 < self.tested < MIN_TESTED_TOKENS

    @property
    def verdict_text(self) -> str:
        """The verdict as the table shows it: 'GO', 'NO-GO', 'UNKNOWN', or 'GO (too few)' where provisional."""
        return f"{self.verdict} (too few)" if self.provisional else self.verdict


def calibrate(domain: str, counts: StepCounts, *, threshold: float = DEFAULT_THRESHOLD, k_max: int = 8) -> Calibration:
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    alpha = per_token_alpha(counts)
    rate = counts.num_accepted_tokens / counts.num_draft_tokens if counts.num_draft_tokens else None
    mal = 1 + counts.num_accepted_tokens / counts.num_drafts if counts.num_drafts else None
    c = None
    if counts.num_draft_tokens and counts.ar_steps and counts.ar_verify_ms > 0:
        c = (counts.draft_ms / counts.num_draft_tokens) / (counts.ar_verify_ms / counts.ar_steps)
    best_k = bound = None
    if alpha is not None and c is not None:
        best_k, bound = max(((k, speedup_bound(alpha, k, c)) for k in range(1, k_max + 1)), key=lambda kv: kv[1])
    verdict = "UNKNOWN" if alpha is None else ("GO" if alpha >= threshold else "NO-GO")
    v = k_meas = bound_v = None
    if counts.spec_verify_ms is not None and counts.num_drafts and counts.ar_steps and counts.ar_verify_ms > 0:
        v = (counts.spec_verify_ms / counts.num_drafts) / (counts.ar_verify_ms / counts.ar_steps)
        k_meas = counts.num_draft_tokens / counts.num_drafts
        if c is not None and mal is not None:
            bound_v = mal / (k_meas * c + v)
    tested = counts.num_accepted_tokens + counts.num_drafts - counts.num_full_accepts if counts.num_draft_tokens else 0
    return Calibration(domain, alpha, mal, c, best_k, bound, verdict, threshold, v, k_meas, bound_v, rate, tested)


def calibration_warnings(cal: Calibration, measured_speedup: float | None = None) -> list[str]:
    """What the verdict does not say: it is defined on alpha alone (alpha >= threshold), so a GO can come with a
    bound or a measured speedup below 1 (the draft too slow for its acceptance), a NO-GO with a measured speedup
    above 1 (a draft cheap enough to pay at that alpha; not said where that speedup is itself impossible, below),
    and a verdict on a handful of tested tokens is noise; and where the timings are impossible (v below
    MIN_VERIFY_RATIO, a measured speedup above what the mean acceptance length allows: finops'
    speedup_exceeds_acceptance), that c, the bounds and the measured speedup cannot be trusted while the verdict
    (alpha, timing-free) stands. One sentence each, empty when nothing needs saying."""
    out = []
    if cal.tested is not None and 0 < cal.tested < MIN_TESTED_TOKENS:
        out.append(f"alpha rests on only {cal.tested} tested draft tokens (fewer than {MIN_TESTED_TOKENS}): too few "
                   "to judge; run more or longer prompts (--limit, --max-new-tokens)")
    if cal.bound_at_best_k is not None and cal.bound_at_best_k < 1:
        out.append(f"the speedup bound is {cal.bound_at_best_k:.2f}x at its best K: with c = {cal.c:.2f} "
                   "speculation would be slower than AR")
    if measured_speedup is not None and measured_speedup < 1:
        out.append(f"measured {measured_speedup:.2f}x: speculation was slower than AR here")
    if (cal.verdict == "NO-GO" and measured_speedup is not None and round(measured_speedup, 2) > 1
            and not speedup_exceeds_acceptance(measured_speedup, cal.mean_acceptance_length)):
        out.append(f"NO-GO by alpha < {cal.threshold:g}, yet the pair measured {measured_speedup:.2f}x AR here: the "
                   "verdict judges alpha alone, and a draft cheap enough (c) pays at a lower alpha; weigh the "
                   "measured speedup (on an idle machine, over more prompts) before dropping the pair")
    rerun = ("c, bound, v, bound v and measured are unreliable (the verdict, on alpha alone, stands); rerun with "
             "more prompts (--limit) on an idle machine")
    if cal.verify_ratio is not None and cal.verify_ratio < MIN_VERIFY_RATIO:
        k = cal.k_measured  # the mean K of the measured steps (an adaptive drafter's vary): said as a mean then
        tokens = ("K + 1" if k is None else f"K + 1 = {k + 1:g}" if float(k).is_integer()
                  else f"the mean K + 1 = {k + 1:.3g}")
        out.append(f"v = {cal.verify_ratio:.2f} is below {MIN_VERIFY_RATIO:g}: a verify forward over {tokens} tokens "
                   "cannot cost much less than a one-token forward, so the timings are wrong (likely a loaded "
                   f"machine or too few prompts): {rerun}")
    above = speedup_over_acceptance_text(measured_speedup, cal.mean_acceptance_length, rerun)
    if above:
        out.append(above)
    return out


def per_token_alpha(counts: StepCounts) -> float | None:
    """The bound's alpha: the probability that a drafted token is accepted given that the ones before it
    were. Drafting stops testing at the first rejection, so each step tested its accepted tokens plus one
    rejected token unless all were accepted; the maximum-likelihood estimate of that geometric model is
    accepted / tested. (accepted / drafted, the acceptance rate, is lower by construction at K > 1: the
    tokens after a rejection were never tested, and it would understate the bound.)"""
    if not counts.num_draft_tokens:
        return None
    rejections = counts.num_drafts - counts.num_full_accepts
    if rejections < 0 or counts.num_full_accepts < 0:
        raise ValueError(f"num_full_accepts must be in [0, num_drafts], got {counts.num_full_accepts}")
    tested = counts.num_accepted_tokens + rejections
    return counts.num_accepted_tokens / tested if tested else None


@dataclass(frozen=True, slots=True)
class PositionAcceptance:
    position: int  # 1-based draft position
    tested: int  # steps that drafted this position and accepted every position before it
    accepted: int  # ... and accepted this one too
    rate: float | None  # accepted / tested: P(position accepted | the ones before it were)


def acceptance_by_position(steps: Iterable[tuple[int, int]]) -> list[PositionAcceptance]:
    """Per draft position i, the conditional acceptance the bound's alpha assumes constant: among steps
    (k drafted, a accepted) that drafted position i (k >= i) and accepted the i - 1 before it (a >= i - 1),
    the share that accepted position i too (a >= i). alpha (accepted / tested) is these counts summed over
    the positions, so a curve that rises with i means a larger K measures a larger alpha. (The dashboard's
    chart of the same name shows the unconditional share: accepted > i among the steps with K > i.)"""
    counts: dict[tuple[int, int], int] = {}
    for k, a in steps:
        if k < 0 or not 0 <= a <= k:
            raise ValueError(f"a step must have 0 <= accepted <= k, got k={k}, accepted={a}")
        counts[(k, a)] = counts.get((k, a), 0) + 1
    k_max = max((k for k, _ in counts), default=0)
    out = []
    for i in range(1, k_max + 1):
        tested = sum(n for (k, a), n in counts.items() if k >= i and a >= i - 1)
        accepted = sum(n for (k, a), n in counts.items() if k >= i and a >= i)
        out.append(PositionAcceptance(i, tested, accepted, accepted / tested if tested else None))
    return out


@dataclass(frozen=True, slots=True)
class PromptAcceptance:
    prompt_id: str
    steps: int  # speculative steps that drafted at least one token
    tested: int  # accepted tokens plus the rejections that ended steps
    accepted: int
    alpha: float | None  # accepted / tested, the domain's alpha restricted to this prompt
    mean_acceptance_length: float | None  # tokens each of its steps emitted (accepted + the target's own)


def alpha_k(k: int, accepted: int, num_emitted: int) -> int:
    """The k a step's alpha counts: k, unless an EOS or a stop string cut the step inside its accepted drafts
    (num_emitted <= accepted: no bonus or correction token followed them). The engine counts only the drafts it
    kept as accepted, so such a step ended in no rejection: it counts as a step that drafted its kept drafts and
    accepted them all (counting k would add a rejection that never happened, one per request that stops so)."""
    return k if num_emitted > accepted else accepted


def _tested(k: int, a: int) -> int:
    """Tokens a drafting step tested: its a accepted ones, plus the rejection that ended it if a < k."""
    return a + (a < k)


def acceptance_by_prompt(steps: Iterable[tuple[str, int, int]]) -> list[PromptAcceptance]:
    """Per prompt, from its steps (prompt id, k drafted, a accepted), the same alpha a domain gets, lowest
    first: where a domain misses the threshold, which requests pull it down. Steps with k = 0 (no draft)
    are not counted. The domain's alpha is these counts summed, not the mean of the per-prompt alphas."""
    acc: dict[str, list[int]] = {}
    for pid, k, a in steps:
        if k < 0 or not 0 <= a <= k:
            raise ValueError(f"a step must have 0 <= accepted <= k, got k={k}, accepted={a} (prompt {pid})")
        if k == 0:
            continue
        row = acc.setdefault(pid, [0, 0, 0])  # steps, tested, accepted
        row[0] += 1
        row[1] += _tested(k, a)
        row[2] += a
    out = [PromptAcceptance(pid, n, t, a, a / t if t else None, 1 + a / n if n else None)
           for pid, (n, t, a) in acc.items()]
    return sorted(out, key=lambda p: (p.alpha if p.alpha is not None else 2.0, p.prompt_id))


REPEAT_NGRAM = 16  # a token "repeats" when the 16 tokens ending at it occurred earlier in prompt + answer
ANSWER_SPAN = 32  # output tokens per span of alpha by answer span (calibrate, the dashboard's Speculation page)


def repeated_tokens(prompt_ids: list[int], output_ids: list[int], n: int = REPEAT_NGRAM) -> list[bool]:
    """Per output token: whether the n tokens ending at it (prompt and answer taken as one sequence) stood
    earlier in that sequence. Long copies of the prompt and a target stuck in a loop both repeat; prompt
    lookup accepts such tokens almost for free, so a span full of them measures a high alpha whatever
    the draft. Output tokens with fewer than n - 1 tokens before them count as not repeated."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    seq = list(prompt_ids) + list(output_ids)
    seen: set[tuple[int, ...]] = set()
    out = []  # one pass: the n-gram ending at each index, remembered once it has been looked up
    for j in range(n - 1, len(seq)):
        gram = tuple(seq[j - n + 1: j + 1])
        if j >= len(prompt_ids):
            out.append(gram in seen)
        seen.add(gram)
    return [False] * (len(output_ids) - len(out)) + out


@dataclass(frozen=True, slots=True)
class SpanAcceptance:
    start: int  # first output token of the span (0-based; token 0 is the prefill's)
    end: int  # one past its last
    steps: int  # speculative steps that started in the span and drafted at least one token
    tested: int
    accepted: int
    alpha: float | None  # accepted / tested over those steps
    repeated: float | None  # share of the span's output tokens that repeat an earlier n-gram (repeated_tokens)


def acceptance_by_span(requests: Iterable[tuple[list[tuple[int, int, int]], list[bool]]],
                       width: int = ANSWER_SPAN) -> list[SpanAcceptance]:
    """Alpha by where in the answer a step starts: per request its steps (emitted before the step, k drafted,
    a accepted) and its output tokens' repeated flags, pooled in spans of `width` output tokens. Where the
    answers run long, alpha grows along them as copies become possible, and the repeated share says how
    much of that is the answer copying itself (a small target looping) rather than the draft."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    acc: dict[int, list[int]] = {}  # span -> steps, tested, accepted, tokens, repeated tokens
    for steps, repeated in requests:
        for before, k, a in steps:
            if before < 0 or k < 0 or not 0 <= a <= k:
                raise ValueError(f"a step must have emitted >= 0 and 0 <= accepted <= k, got {before}, k={k}, "
                                 f"accepted={a}")
            if k == 0:
                continue
            row = acc.setdefault(before // width, [0] * 5)
            row[0] += 1
            row[1] += _tested(k, a)
            row[2] += a
        for i, rep in enumerate(repeated):
            row = acc.setdefault(i // width, [0] * 5)
            row[3] += 1
            row[4] += rep
    return [SpanAcceptance(s * width, (s + 1) * width, n, t, a, a / t if t else None, r / m if m else None)
            for s, (n, t, a, m, r) in sorted(acc.items())]
