"""The decode engine: prefill, draft, verify in one target forward, accept, roll back, repeat.

Many sequences decode together (continuous batching): `add` prefills a request into a free cache
slot between steps, `step` advances every running sequence by one speculative step, finished
sequences leave. The autoregressive baseline is the same loop with K = 0, so both modes pay the same
overheads. The engine does no I/O: each step is reported through `on_step` with a frozen record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from serving.context import context_overflow
from serving.drafters import Drafter, TreeShape
from serving.llama import CausalLM, compact_path, contiguous_batch, ragged_batch, tree_batch
from serving.lookahead import FixedK, LookaheadPolicy
from serving.sampling import SamplingParams, logits_to_probs, sample
from serving.sequence import Sequence
from serving.speculative import (
    TokenTree,
    greedy_verify,
    rejection_sample,
    tree_greedy_verify,
    tree_rejection_sample,
)

SOURCE_AR, SOURCE_ACCEPTED, SOURCE_BONUS, SOURCE_CORRECTION = "ar", "accepted", "bonus", "correction"


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One decode step of one sequence (step_index -1 is the prefill that produced the first token)."""

    seq_id: int
    request_id: str | None
    step_index: int
    k: int  # draft tokens proposed
    accepted: int  # verified drafts still emitted after an EOS / stop string / length cut (Engine._commit)
    tokens: tuple[int, ...]  # emitted (after stop/length truncation)
    sources: tuple[str, ...]
    draft_s: float
    verify_s: float
    t_end: float  # perf_counter when the tokens were emitted
    batch_size: int
    k_reason: str


class EngineError(ValueError):
    """A request the engine cannot serve (the message says why)."""


class Engine:
    def __init__(
        self,
        target: CausalLM,
        *,
        drafter: Drafter | None = None,
        policy: LookaheadPolicy | None = None,
        eos_ids: Iterable[int] = (),
        max_batch: int = 1,
        max_len: int = 2048,
        decode: Callable[[list[int]], str] | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
        tree: TreeShape | None = None,
    ):
        if tree is not None and (drafter is None or not hasattr(drafter, "propose_tree")):
            name = getattr(drafter, "name", "none")
            raise EngineError(f"drafter {name} cannot propose token trees (the feature draft and prompt lookup can)")
        self.target = target
        self.tree = tree
        self.drafter = drafter
        # the target blocks a fused-feature draft reads (None: the last block's output)
        self.feature_layers = getattr(drafter, "feature_layers", None)
        self.policy = policy or FixedK(0)
        self.eos_ids = frozenset(eos_ids)
        self.max_len = min(max_len, target.cfg.max_position)
        self.max_batch = max_batch
        self.decode = decode  # token ids -> text, needed only for stop strings
        self.on_step = on_step
        # a tree's nodes take cache indices past the sequence until the accepted path is compacted, and a sequence
        # near the window's end is padded to the batch's widest tree: spare indices, not positions, so they are
        # not clamped to the target's max_position (a tree holds at most `nodes`, a copied chain `depth`)
        self.tree_room = max(tree.nodes, tree.depth) if tree else 0
        self.cache = target.new_cache(max_batch, self.max_len + 16, spare=self.tree_room)
        self.free_slots = list(range(max_batch - 1, -1, -1))
        self.running: list[Sequence] = []
        self._next_id = 0

    # ---------------------------------------------------------------- requests
    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise EngineError("prompt is empty")
        overflow = context_overflow("prompt", len(prompt_ids), self.max_len)  # prompt and answer share max_len - 1
        if overflow:
            raise EngineError(overflow)
        if params.stop and self.decode is None:
            raise EngineError("stop strings need a tokenizer (decode) on the engine")

    def add(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
            t_start: float | None = None, speculate: bool = True, domain: str = "") -> Sequence:
        """Prefill a new sequence (target and drafter) and emit its first token."""
        self.check_request(prompt_ids, params)
        if not self.free_slots:
            raise EngineError(f"engine is full ({self.max_batch} sequences running)")
        t_start = time.perf_counter() if t_start is None else t_start
        gen = None
        if not params.greedy:
            gen = torch.Generator()
            gen.manual_seed(params.seed if params.seed is not None else torch.seed())
        seq = Sequence(
            seq_id=self._next_id, slot=self.free_slots.pop(), params=params, tokens=list(prompt_ids),
            num_prompt=len(prompt_ids), request_id=request_id, generator=gen, t_start=t_start,
            speculate=speculate, domain=domain,
        )
        self._next_id += 1
        try:
            with torch.inference_mode():
                fb = contiguous_batch(seq.slot, 1, 0, len(prompt_ids))
                logits, hidden = self.target(torch.tensor([prompt_ids]), fb, self.cache, last_only=True,
                                             return_hidden=True, feature_layers=self.feature_layers)
                first = self._sample_one(logits[0, -1], seq)
                t_verify = t_draft = time.perf_counter()
                if self.drafter is not None:
                    self.drafter.prefill(seq, hidden[0] if self.drafter.needs_features else None)
                    t_draft = time.perf_counter()
        except BaseException:
            self._release(seq)  # a failed prefill gives its slot back
            raise
        # the prefill step's draft time is the drafter's prompt pass (a feature draft's can be hundreds of ms), its
        # verify time the target's: the two account for the first token's latency (no policy observes this step)
        self._commit(seq, [first], accepted=0, k=0, draft_s=t_draft - t_verify, verify_s=t_verify - t_start,
                     step_index=-1, batch_size=1, k_reason="prefill")
        if seq.done:
            self._release(seq)
        else:
            self.running.append(seq)
        return seq

    def cancel(self, seq: Sequence, reason: str = "cancelled") -> None:
        if seq in self.running:
            self.running.remove(seq)
            seq.finish_reason = reason
            self._release(seq)

    # ---------------------------------------------------------------- one step
    def step(self) -> list[Sequence]:
        """Advance every running sequence by one draft-verify step; return those that finished."""
        seqs = self.running
        if not seqs:
            return []
        batch = len(seqs)
        t0 = time.perf_counter()
        ks, reasons = [], []
        for s in seqs:
            if self.drafter is None or not s.speculate:
                k, why = 0, "ar"
            else:
                k, why = self.policy.choose(s, batch)
            # K drafts emit up to K + 1 tokens, and the context holds max_len - 1 (one position spare)
            room = min(s.params.max_new_tokens - len(s.output), self.max_len - 1 - len(s.tokens)) - 1
            ks.append(max(0, min(k, room)))
            reasons.append(why)
        if self.tree is not None and max(ks) > 0:
            return self._tree_step(seqs, ks, reasons, t0)
        with torch.inference_mode():
            # 1) draft
            drafts: list[list[int]] = [[] for _ in seqs]
            draft_probs = None
            confs = None
            if max(ks) > 0:
                # only the sequences that draft this step reach the drafter (as in a tree step): one that opted
                # out never feeds it (a feature draft keeps no features for it), and no draft is sampled from
                # the random stream of a sequence that decodes this step as AR would
                drafting = [b for b, k in enumerate(ks) if k > 0]
                sub, sub_ks = [seqs[b] for b in drafting], [ks[b] for b in drafting]
                rules = self.policy.stop_rules(sub, sub_ks, batch)
                d = self.drafter.propose(sub, sub_ks, stop_below=self.policy.stop_below, stop_rules=rules)
                if d.probs is not None and len(drafting) == batch:
                    draft_probs = d.probs  # every sequence drafts (a bench run, most steps): rows already in order
                elif d.probs is not None:
                    draft_probs = d.probs.new_zeros(batch, *d.probs.shape[1:])
                    draft_probs[drafting] = d.probs
                confs = None if d.conf is None else [[] for _ in seqs]
                for i, b in enumerate(drafting):
                    drafts[b] = d.tokens[i]
                    if confs is not None:
                        confs[b] = d.conf[i]
                    if d.stopped is not None and d.stopped[i]:
                        reasons[b] += "+stop"  # the draft stopped itself (entropy / cost gating)
            t1 = time.perf_counter()
            # 2) verify: the pending token plus the drafts, one target forward for the whole batch
            width = 1 + max(len(x) for x in drafts)
            feed = torch.tensor([[s.tokens[-1]] + x + [0] * (width - 1 - len(x)) for s, x in zip(seqs, drafts, strict=True)])
            starts = [s.kv_len for s in seqs]
            if batch == 1:
                fb = contiguous_batch(seqs[0].slot, 1, starts[0], width)
            else:
                fb = ragged_batch([s.slot for s in seqs], starts, width, limit=self.cache.positions)
            logits, hidden = self.target(feed, fb, self.cache, return_hidden=True,  # (B, 1+Kmax, V), (B, 1+Kmax, F)
                                         feature_layers=self.feature_layers)
            # 3) accept / reject per sequence
            emitted = []
            for b, s in enumerate(seqs):
                x = drafts[b]
                k = len(x)
                rows = logits[b, : k + 1]  # (k+1, V)
                if s.params.greedy:
                    out = greedy_verify(rows, torch.tensor(x, dtype=torch.long))
                else:
                    p = logits_to_probs(rows, s.params.temperature, s.params.top_k, s.params.top_p)
                    q = draft_probs[b, :k] if draft_probs is not None else _one_hot(x, p.shape[-1])
                    out = rejection_sample(p, q, torch.tensor(x, dtype=torch.long), s.generator)
                emitted.append(out)
        t2 = time.perf_counter()
        paths = [list(range(1, len(e))) for e in emitted]  # a chain's accepted rows are 1..accepted
        return self._finish_step(seqs, emitted, [len(x) for x in drafts], paths, hidden, reasons, (t0, t1, t2),
                                 confs)

    def _tree_step(self, seqs: list[Sequence], ks: list[int], reasons: list[str], t0: float) -> list[Sequence]:
        """One step with token trees: each sequence's tree (at most ks[b] deep) is verified in one target
        forward in which every node sees only its ancestors; the accepted path's keys are then moved next
        to the committed ones, as if it had been fed as a chain."""
        with torch.inference_mode():
            drafting = [b for b, k in enumerate(ks) if k > 0]
            grown = self.drafter.propose_tree([seqs[b] for b in drafting], self.tree)
            trees = [TokenTree([], [])] * len(seqs)
            for b, tree in zip(drafting, grown, strict=True):
                # no deeper than the sequence may still grow (no node sits past the window's positions), no more
                # nodes than the cache's spare indices hold: a running sequence's kv_len is below max_len and the
                # cache has max_len + tree_room indices, so every row's nodes, and a row's padding to the widest
                # tree, stay inside it however near its end a sequence is
                trees[b] = tree.truncate(ks[b]).head(self.tree_room)
            t1 = time.perf_counter()
            width = 1 + max(len(t) for t in trees)
            feed = torch.zeros(len(seqs), width, dtype=torch.long)
            depths = torch.zeros(len(seqs), width, dtype=torch.long)
            visible = torch.zeros(len(seqs), width, width, dtype=torch.bool)
            for b, (s, tree) in enumerate(zip(seqs, trees, strict=True)):
                n = len(tree) + 1
                feed[b, :n] = torch.tensor([s.tokens[-1], *tree.tokens])
                depths[b, :n] = torch.tensor(tree.depths())
                visible[b] = tree.ancestors(width)
            fb = tree_batch([s.slot for s in seqs], [s.kv_len for s in seqs], depths, visible)
            logits, hidden = self.target(feed, fb, self.cache, return_hidden=True, feature_layers=self.feature_layers)
            emitted, paths = [], []
            for b, (s, tree) in enumerate(zip(seqs, trees, strict=True)):
                rows = logits[b, : len(tree) + 1]
                if s.params.greedy:
                    out, path = tree_greedy_verify(rows, tree)
                else:
                    p = logits_to_probs(rows, s.params.temperature, s.params.top_k, s.params.top_p)
                    out, path = tree_rejection_sample(p, tree, s.generator)
                compact_path(self.cache, s.slot, s.kv_len, path)
                emitted.append(out)
                paths.append(path)
        t2 = time.perf_counter()
        # the last token is a bonus where the path ended at a leaf (nothing left to check), else a correction
        bonus = [(path[-1] if path else 0) not in tree.parents for tree, path in zip(trees, paths, strict=True)]
        return self._finish_step(seqs, emitted, [len(t) for t in trees], paths, hidden, reasons, (t0, t1, t2),
                                 bonus=bonus)

    def _finish_step(self, seqs: list[Sequence], emitted: list[list[int]], ks: list[int], paths: list[list[int]],
                     hidden: torch.Tensor, reasons: list[str], times: tuple[float, float, float],
                     confs: list[list[float]] | None = None, bonus: list[bool] | None = None) -> list[Sequence]:
        """Commit each sequence's emitted tokens, tell the drafter (the target features of the pending token
        and the accepted rows `paths[b]`) and the policy, and retire finished sequences."""
        t0, t1, t2 = times
        batch = len(seqs)
        finished = []
        for b, s in enumerate(seqs):
            # drafts the target verified; those an EOS or a stop string then cut are not counted as accepted
            # (`_commit`), but the drafter and the policy see them all: the drafter's cache holds them, and to the
            # policy's acceptance estimates a cut is no rejection (the draft agreed with the target that far), so
            # counting only the kept ones would read every cut as a rejection right after the last kept token
            k, accepted = ks[b], len(emitted[b]) - 1
            num_before = len(s.tokens)
            self._commit(s, emitted[b], accepted=accepted, k=k, draft_s=t1 - t0, verify_s=t2 - t1,
                         step_index=s.step_index, batch_size=batch, k_reason=reasons[b],
                         bonus=bonus[b] if bonus is not None else None)
            s.step_index += 1
            if self.drafter is not None:
                feats = hidden[b, [0, *paths[b]]] if self.drafter.needs_features else None
                self.drafter.commit(s, num_before, accepted, feats)
                self.policy.observe(s, k, accepted, t1 - t0, t2 - t1, batch,
                                    conf=confs[b] if confs is not None else None)
            if s.done:
                finished.append(s)
        if finished:
            self.running = [s for s in seqs if not s.done]
            for s in finished:
                self._release(s)
        return finished

    # ---------------------------------------------------------------- helpers
    def _sample_one(self, logits: torch.Tensor, seq: Sequence) -> int:
        if seq.params.greedy:
            return int(logits.argmax())
        p = logits_to_probs(logits, seq.params.temperature, seq.params.top_k, seq.params.top_p)
        return sample(p, seq.generator)

    def _commit(self, seq: Sequence, new: list[int], *, accepted: int, k: int, draft_s: float,
                verify_s: float, step_index: int, batch_size: int, k_reason: str, bonus: bool | None = None) -> None:
        """Append emitted tokens, apply EOS / max tokens / stop strings, report the step. The last token is a
        bonus (every draft accepted) or a correction; `bonus` says which where counting cannot (a tree).

        `accepted` is the drafts the target verified; the sequence's count and the step's report take only the
        verified drafts still emitted after the cut (the first min(accepted, kept) tokens): a draft after an EOS
        or a stop string was never output, and counting it made the acceptance rate and the mean acceptance
        length read more tokens than the request produced."""
        if k == 0:
            sources = [SOURCE_AR]
        else:
            last = SOURCE_BONUS if (accepted == k if bonus is None else bonus) else SOURCE_CORRECTION
            sources = [SOURCE_ACCEPTED] * accepted + [last]
        keep = len(new)
        for i, t in enumerate(new):
            if t in self.eos_ids:
                keep, seq.finish_reason = i + 1, "stop"
                break
        # the last token AR could emit: max_new_tokens, or the context's max_len - 1 positions
        room = min(seq.params.max_new_tokens - len(seq.output), self.max_len - 1 - len(seq.tokens))
        if keep > room:  # cut before any EOS: AR would have stopped for length first
            keep, seq.finish_reason = room, "length"
        elif keep == room:
            seq.finish_reason = seq.finish_reason or "length"
        before = len(seq.tokens)
        seq.tokens.extend(new[:keep])
        if seq.params.stop:
            self._apply_stop_strings(seq, keep)
        new = seq.tokens[before:]
        accepted = min(accepted, len(new))
        if k:
            seq.num_drafts += 1
            seq.num_draft_tokens += k
            seq.num_accepted += accepted
        if len(seq.tokens) >= self.max_len - 1 and not seq.done:
            seq.finish_reason = "length"
        t_end = time.perf_counter()
        seq.emit_times.extend([t_end] * len(new))
        if self.on_step is not None:
            self.on_step(StepEvent(seq.seq_id, seq.request_id, step_index, k, accepted, tuple(new),
                                   tuple(sources[: len(new)]), draft_s, verify_s, t_end, batch_size, k_reason))

    def _apply_stop_strings(self, seq: Sequence, num_new: int) -> None:
        out = seq.output
        text = self.decode(out)
        if not any(stop in text for stop in seq.params.stop):
            return
        # shortest output prefix (at least the tokens before this step) whose text contains a stop string
        for n in range(len(out) - num_new + 1, len(out) + 1):
            if any(stop in self.decode(out[:n]) for stop in seq.params.stop):
                del seq.tokens[seq.num_prompt + n :]
                break
        seq.finish_reason = "stop"

    def _release(self, seq: Sequence) -> None:
        self.free_slots.append(seq.slot)
        self.policy.forget(seq)

    # ---------------------------------------------------------------- drivers
    def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> Sequence:
        """Decode one request to completion (other running sequences advance with it)."""
        seq = self.add(prompt_ids, params, request_id)
        while not seq.done:
            self.step()
        return seq


def _one_hot(tokens: list[int], vocab: int) -> torch.Tensor:
    q = torch.zeros(len(tokens), vocab)
    if tokens:
        q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return q
