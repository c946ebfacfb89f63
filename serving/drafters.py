"""Drafters propose K tokens per sequence for the target to verify.

- `ModelDrafter`: a separate small model with the target's vocabulary, or the target's own first N
  layers (early-exit self-speculation: weights shared, own KV cache).
- `FeatureDrafter`: an EAGLE-style draft that reads the target's last hidden states (serving/eagle.py),
  optionally with a copy prior (`copy_bias`: a logit bonus for tokens that followed the current token
  earlier in the sequence, which a one-layer draft does not learn to copy by itself).
- `NgramDrafter`: prompt lookup: find the latest earlier occurrence of the sequence's last n tokens and
  propose what followed it. No model, deterministic (q is one-hot).
- `HybridDrafter`: prompt lookup where the context has a match, a model drafter everywhere else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from serving.eagle import EagleDraft
from serving.llama import CausalLM, contiguous_batch, ragged_batch, tree_batch
from serving.sampling import logits_to_probs
from serving.sequence import Sequence
from serving.speculative import TokenTree

# A per-sequence stop rule, asked after the draft proposed token j (0-based) with probability `conf`:
# None = go on, an integer n = stop and keep the first n tokens (j + 1 keeps token j, j drops it).
StopRule = Callable[[int, float], "int | None"]


@dataclass(slots=True)
class Draft:
    tokens: list[list[int]]  # per sequence, len <= its k (may be shorter: nothing to propose)
    probs: torch.Tensor | None  # (B, Kmax, V) draft distributions; None = deterministic proposals
    conf: list[list[float]] | None = None  # per sequence, the draft's probability of each kept token
    stopped: list[bool] | None = None  # per sequence: a stop threshold or rule ended it before its k


class Drafter(Protocol):
    name: str
    needs_features: bool  # wants the target's last hidden states of committed tokens
    feature_layers: tuple[int, ...] | None  # ... or these blocks' outputs side by side (fused features)

    def prefill(self, seq: Sequence, features: torch.Tensor | None = None) -> None: ...

    def propose(self, seqs: list[Sequence], ks: list[int], stop_below: float | None = None,
                stop_rules: list[StopRule | None] | None = None) -> Draft:
        """Up to ks[b] tokens per sequence; with `stop_below`, a sequence's draft ends after the first token
        whose draft probability is below it; with `stop_rules`, where sequence b's rule says."""
        ...

    def commit(self, seq: Sequence, num_before: int, accepted: int, features: torch.Tensor | None = None) -> None: ...


class ModelDrafter:
    """Autoregressive drafting with a small causal LM (or the target's first `num_layers` layers)."""

    needs_features = False
    feature_layers = None

    def __init__(self, model: CausalLM, name: str, *, slots: int, max_len: int, num_layers: int | None = None,
                 vocab: int | None = None):
        self.model, self.name, self.num_layers = model, name, num_layers
        self.cache = model.new_cache(slots, max_len, num_layers)
        self.vocab = vocab  # the target's vocabulary size, where the draft's table is padded to another

    def fit(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits over the target's vocabulary: rows past the target's cut (padding of the draft's
        larger table), rows past the draft's given no probability. q is then the distribution the drafts are
        sampled from and the one verification divides by, so the output stays exactly the target's."""
        have = logits.shape[-1]
        if self.vocab is None or have == self.vocab:
            return logits
        if have > self.vocab:
            return logits[..., : self.vocab]
        return torch.nn.functional.pad(logits, (0, self.vocab - have), value=float("-inf"))

    def known(self, tokens: torch.Tensor) -> torch.Tensor:
        """`tokens` as the draft can read them: an id past its table (a padding row of the target's larger one,
        which sampling can still emit) is read as id 0; only the draft's guesses after it suffer."""
        rows = self.model.cfg.vocab_size
        if self.vocab is None or self.vocab <= rows:
            return tokens
        return torch.where(tokens < rows, tokens, torch.zeros_like(tokens))

    def prefill(self, seq: Sequence, features: torch.Tensor | None = None) -> None:
        prompt = seq.tokens[: seq.num_prompt]
        fb = contiguous_batch(seq.slot, 1, 0, len(prompt))
        self.model(self.known(torch.tensor([prompt])), fb, self.cache, num_layers=self.num_layers, last_only=True)
        seq.draft_len = len(prompt)

    def propose(self, seqs: list[Sequence], ks: list[int], stop_below: float | None = None,
                stop_rules: list[StopRule | None] | None = None) -> Draft:
        k_max = max(ks)
        greedy = all(s.params.greedy for s in seqs)
        # 1) catch up on the tokens committed since this drafter last ran (ragged: 1..K+1 per sequence)
        pending = [s.tokens[s.draft_len :] for s in seqs]
        width = max(len(p) for p in pending)
        feed = torch.tensor([p + [0] * (width - len(p)) for p in pending])  # (B, T)
        fb = self._batch(seqs, [s.draft_len for s in seqs], width, self.cache.max_len)
        last = torch.tensor([len(p) - 1 for p in pending])
        logits = self.fit(self.model(self.known(feed), fb, self.cache, num_layers=self.num_layers, at=last)[:, 0])
        # 2) K draft tokens, feeding each one back (the K-th needs no forward)
        loop = _DraftLoop(seqs, ks, greedy, logits.shape[-1], stop_below, stop_rules)
        fed = 0
        for j in range(k_max):
            loop.pick(j, logits, None)
            if not loop.wants(j + 1):
                break
            fb = self._batch(seqs, [len(s.tokens) + j for s in seqs], 1, self.cache.max_len)
            logits = self.fit(self.model(loop.tokens[:, j : j + 1], fb, self.cache, num_layers=self.num_layers)[:, 0])
            fed += 1
        for s in seqs:
            s.draft_len = len(s.tokens) + fed  # what the cache now holds
        return loop.result()

    def commit(self, seq: Sequence, num_before: int, accepted: int, features: torch.Tensor | None = None) -> None:
        # the cache holds the sequence up to num_before plus the drafts fed back; keep the accepted ones
        seq.draft_len = min(seq.draft_len, num_before + accepted)

    @staticmethod
    def _batch(seqs: list[Sequence], starts: list[int], width: int, limit: int):
        """One sequence feeds its own tokens; several are ragged, each padded to `width` and the padding kept
        inside the cache of length `limit` (a sequence drafting fewer tokens than the batch's largest K is fed
        the padding positions past its own, which near the window's end lie past the cache)."""
        if len(seqs) == 1:
            return contiguous_batch(seqs[0].slot, 1, starts[0], width)
        return ragged_batch([s.slot for s in seqs], starts, width, limit)


class NgramDrafter:
    """Prompt lookup decoding: copy the continuation of the latest earlier match of the last n tokens."""

    needs_features = False
    feature_layers = None

    def __init__(self, n_max: int = 3, n_min: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_max, self.n_min = n_max, n_min
        self.name = f"ngram:{n_max}"

    def prefill(self, seq: Sequence, features: torch.Tensor | None = None) -> None:
        pass

    def propose(self, seqs: list[Sequence], ks: list[int], stop_below: float | None = None,
                stop_rules: list[StopRule | None] | None = None) -> Draft:
        """A copy is certain as far as the drafter knows (probability 1 for each token); stop rules still
        judge each copied token by what such tokens are measured to be worth."""
        tokens = [self.lookup(s.tokens, k) for s, k in zip(seqs, ks, strict=True)]
        if not stop_rules:
            return Draft(tokens=tokens, probs=None)
        stopped = [self.cut(tokens, b, ks[b], rule) for b, rule in enumerate(stop_rules)]
        return Draft(tokens=tokens, probs=None, conf=[[1.0] * len(t) for t in tokens], stopped=stopped)

    @staticmethod
    def cut(tokens: list[list[int]], b: int, k: int, rule: StopRule | None) -> bool:
        """Ask `rule` about each copied token of sequence b (probability 1) and cut tokens[b] where it says;
        True when that left the draft shorter than its k."""
        for j in range(len(tokens[b]) if rule is not None else 0):
            keep = rule(j, 1.0)
            if keep is not None:
                tokens[b] = tokens[b][:keep]
                return keep < k
        return False

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        if k == 0:
            return []
        n_tokens = len(tokens)
        for n in range(min(self.n_max, n_tokens - 1), self.n_min - 1, -1):
            tail = tokens[n_tokens - n :]
            # latest earlier start i with tokens[i:i+n] == tail and something after it
            for i in range(n_tokens - n - 1, -1, -1):
                if tokens[i : i + n] == tail:
                    return tokens[i + n : i + n + k]
        return []

    def commit(self, seq: Sequence, num_before: int, accepted: int, features: torch.Tensor | None = None) -> None:
        pass

    def propose_tree(self, seqs: list[Sequence], shape: TreeShape) -> list[TokenTree]:
        """A copy is one continuation: a chain up to the tree's depth."""
        return [TokenTree.chain(self.lookup(s.tokens, shape.depth)) for s in seqs]


class HybridDrafter:
    """Prompt lookup where the sequence's last `n_min`+ tokens occurred earlier in its context, the model
    drafter (`inner`) for the other sequences of the batch.

    Code answers copy names and lines from the prompt and from themselves, which a copy gets right for free,
    while a small draft predicts the rest. The inner drafter still sees every committed token: a sequence
    that copied this step keeps its features (or tokens) queued, and the inner drafter's next catch-up for
    it feeds them all in one forward. Sampling stays exact: a copied token's q is one-hot."""

    def __init__(self, inner: ModelDrafter | FeatureDrafter, n_max: int = 3, n_min: int = 2):
        self.inner, self.ngram = inner, NgramDrafter(n_max=n_max, n_min=n_min)
        self.needs_features, self.feature_layers = inner.needs_features, inner.feature_layers
        self.name = f"{inner.name}+ngram:{n_max}-{n_min}"

    def prefill(self, seq: Sequence, features: torch.Tensor | None = None) -> None:
        self.inner.prefill(seq, features)

    def commit(self, seq: Sequence, num_before: int, accepted: int, features: torch.Tensor | None = None) -> None:
        self.inner.commit(seq, num_before, accepted, features)

    def propose_tree(self, seqs: list[Sequence], shape: TreeShape) -> list[TokenTree]:
        """The copy as a chain where the context has a match, the inner drafter's tree everywhere else."""
        trees = self.ngram.propose_tree(seqs, shape)
        model_rows = [b for b, t in enumerate(trees) if not len(t)]
        if model_rows:
            for b, tree in zip(model_rows, self.inner.propose_tree([seqs[b] for b in model_rows], shape), strict=True):
                trees[b] = tree
        return trees

    def propose(self, seqs: list[Sequence], ks: list[int], stop_below: float | None = None,
                stop_rules: list[StopRule | None] | None = None) -> Draft:
        tokens = [self.ngram.lookup(s.tokens, k) for s, k in zip(seqs, ks, strict=True)]
        rules = stop_rules or [None] * len(seqs)
        model_rows = [b for b, c in enumerate(tokens) if not c and ks[b] > 0]
        copied = [b for b, c in enumerate(tokens) if c]
        # a copy is certain as far as lookup knows: rules judge its worth
        stopped = [self.ngram.cut(tokens, b, ks[b], rules[b]) for b in range(len(seqs))]
        conf = [[1.0] * len(t) for t in tokens]
        probs = None
        if model_rows:
            sub = self.inner.propose([seqs[b] for b in model_rows], [ks[b] for b in model_rows], stop_below,
                                     [rules[b] for b in model_rows] if stop_rules else None)
            for i, b in enumerate(model_rows):
                tokens[b], stopped[b] = sub.tokens[i], sub.stopped[i]
                conf[b] = sub.conf[i] if sub.conf is not None else []
            if sub.probs is not None:  # sampling: q rows for every sequence, one-hot for copies
                probs = torch.zeros(len(seqs), max(ks), sub.probs.shape[-1])
                probs[model_rows, : sub.probs.shape[1]] = sub.probs
                for b in copied:
                    if tokens[b]:
                        probs[b, torch.arange(len(tokens[b])), torch.tensor(tokens[b])] = 1.0
        want_conf = stop_below is not None or any(r is not None for r in rules)
        return Draft(tokens=tokens, probs=probs, conf=conf if want_conf else None, stopped=stopped)


class ContextFollowers:
    """One sequence's in-context bigrams: for each token, the draft-head rows of the tokens that followed it
    earlier in the sequence (prompt and committed output). Grows as tokens are committed."""

    __slots__ = ("upto", "rows")

    def __init__(self):
        self.upto = 1  # tokens[:upto] are indexed
        self.rows: dict[int, list[int]] = {}

    def update(self, tokens: list[int], row_of: list[int]) -> None:
        for i in range(self.upto, len(tokens)):
            r = row_of[tokens[i]]
            if r >= 0:
                rows = self.rows.setdefault(tokens[i - 1], [])
                if r not in rows:
                    rows.append(r)
        self.upto = max(self.upto, len(tokens))


class FeatureDrafter:
    """Feature-level drafting: the draft layer reads the target's features f_j and the next token.

    Per sequence, `draft_len` counts draft positions filled from TRUE target features; positions after
    it hold the draft's own guesses from the last proposal and are simply rewritten (rolled back) by
    the next catch-up, which feeds the true features the verification produced.

    Copy prior: with `copy_bias` b > 0 the draft's distribution after token x is

        q(y) ~ exp(logit(y) + b * [x was followed by y earlier in this sequence])

    Code and rewrites repeat names and phrases; a one-layer draft rarely learns to copy (an induction
    head takes two layers), and the prior puts in-context continuations first when the draft is unsure.
    It is part of q, so sampled drafts stay exact (rejection sampling reads the same q).
    """

    needs_features = True

    def __init__(self, draft: EagleDraft, name: str, *, slots: int, max_len: int, copy_bias: float = 0.0):
        if not math.isfinite(copy_bias) or copy_bias < 0:
            raise ValueError(f"copy_bias must be finite and >= 0, got {copy_bias}")
        self.draft, self.name, self.copy_bias = draft, name, float(copy_bias)
        self.feature_layers = draft.cfg.feature_layers or None
        self.cache = draft.new_cache(slots, max_len)
        self.row_of: list[int] = []  # full vocabulary id -> draft head row (-1: not in the head)
        self.followers: dict[int, ContextFollowers] = {}  # by cache slot
        if self.copy_bias:
            self.row_of = draft.head_index().tolist()

    def prefill(self, seq: Sequence, features: torch.Tensor | None = None) -> None:
        """Feed the prompt's pairs (x_{j+1}, f_j), j < P - 1, now, this sequence alone; f_{P-1} waits for
        the first generated token, for the first proposal's catch-up. (Deferred whole to that catch-up,
        batched with the running sequences, the prompt padded every one of them to its length: a forward
        of B x P rows at each join.)"""
        seq.draft_feats = features  # (P, C)
        seq.draft_len = 0
        if self.copy_bias:
            self.followers[seq.slot] = ContextFollowers()
        n = 0 if features is None else features.shape[0] - 1
        if n > 0 and seq.speculate:
            nxt = torch.tensor([seq.tokens[1 : 1 + n]])  # the prompt without its first token
            self.draft(nxt, features[None, :n], contiguous_batch(seq.slot, 1, 0, n), self.cache)
            seq.draft_len, seq.draft_feats = n, features[n:].clone()

    def with_copy_prior(self, seqs: list[Sequence], logits: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """Reduced logits (B, Vh) or (B, W, Vh) plus `copy_bias` on the head rows of the tokens that followed
        each sequence's `current` token (B,) or (B, W) earlier in its context."""
        if not self.copy_bias:
            return logits
        out = logits.clone()
        flat, cur = out.view(len(seqs), -1, out.shape[-1]), current.view(len(seqs), -1).tolist()
        for b, s in enumerate(seqs):
            seen = self.followers.get(s.slot)
            if seen is None:  # prefilled before the prior was on
                seen = self.followers[s.slot] = ContextFollowers()
            seen.update(s.tokens, self.row_of)  # reads only the tokens committed since the last call
            for w, x in enumerate(cur[b]):
                rows = seen.rows.get(x)
                if rows:
                    flat[b, w, rows] += self.copy_bias
        return out

    def commit(self, seq: Sequence, num_before: int, accepted: int, features: torch.Tensor | None = None) -> None:
        # features of the pending token and the accepted drafts: positions num_before-1 .. num_before-1+accepted
        if not seq.speculate:
            return  # opted out of speculation for good: nothing will read them
        seq.draft_feats = features if seq.draft_feats is None else torch.cat([seq.draft_feats, features])

    def propose(self, seqs: list[Sequence], ks: list[int], stop_below: float | None = None,
                stop_rules: list[StopRule | None] | None = None) -> Draft:
        k_max = max(ks)
        greedy = all(s.params.greedy for s in seqs)
        h, logits = self._catch_up(seqs)
        # 2) K tokens; each next step feeds the draft's own h in place of the target feature
        loop = _DraftLoop(seqs, ks, greedy, self.draft.cfg.vocab_size, stop_below, stop_rules)
        for j in range(k_max):
            current = torch.tensor([s.tokens[-1] for s in seqs]) if j == 0 else loop.tokens[:, j - 1]
            loop.pick(j, self.with_copy_prior(seqs, logits, current), self.draft)
            if not loop.wants(j + 1):
                break
            fb = ModelDrafter._batch(seqs, [s.draft_len + j for s in seqs], 1, self.cache.max_len)
            h, logits = self.draft(loop.tokens[:, j : j + 1], h[:, None], fb, self.cache)
            h, logits = h[:, 0], logits[:, 0]
        return loop.result()

    def _catch_up(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """Position j takes (x_{j+1}, f_j) for every true feature not consumed yet. Returns the draft's h and
        reduced logits at each sequence's last committed token: (B, C), (B, Vh)."""
        widths = [s.draft_feats.shape[0] for s in seqs]
        width = max(widths)
        c = seqs[0].draft_feats.shape[-1]
        feats = torch.zeros(len(seqs), width, c, dtype=seqs[0].draft_feats.dtype)
        nxt = torch.zeros(len(seqs), width, dtype=torch.long)
        for b, s in enumerate(seqs):
            n = widths[b]
            feats[b, :n] = s.draft_feats
            nxt[b, :n] = torch.tensor(s.tokens[s.draft_len + 1 : s.draft_len + 1 + n])
        fb = ModelDrafter._batch(seqs, [s.draft_len for s in seqs], width, self.cache.max_len)
        h, logits = self.draft(nxt, feats, fb, self.cache)  # (B, T, C), (B, T, Vh)
        last = torch.tensor([n - 1 for n in widths])
        rows = torch.arange(len(seqs))
        h, logits = h[rows, last], logits[rows, last]  # (B, C), (B, Vh)
        for b, s in enumerate(seqs):
            s.draft_len += widths[b]
            s.draft_feats = None
        return h, logits

    def propose_tree(self, seqs: list[Sequence], shape: TreeShape) -> list[TokenTree]:
        """A token tree per sequence, grown as in EAGLE-2: a candidate's score is the draft's log-probability
        of its whole path. Each round feeds the `width` best-scoring newest candidates (one draft forward for
        all of them, each attending to its own ancestors) and gives each its `width` likeliest children;
        after `depth` levels the `nodes` best-scoring candidates form the tree. A parent always scores at
        least as well as its children, so the chosen nodes include their ancestors."""
        B, W = len(seqs), shape.width
        h, logits = self._catch_up(seqs)
        ids = self.draft.head_token_ids
        logits = self.with_copy_prior(seqs, logits, torch.tensor([s.tokens[-1] for s in seqs]))
        logp, top = logits.log_softmax(-1).topk(W, dim=-1)  # (B, W): the root's children
        # every candidate so far: token, score (path log-probability), parent candidate (-1 = the root)
        tok, score, parent = ids[top], logp, torch.full((B, W), -1)
        front = torch.arange(W).expand(B, W)  # candidates to expand next
        front_h = h[:, None].expand(B, W, h.shape[-1])  # the h of their parents
        parent_row = None  # (B, W) row of each front candidate's parent among the fed ones (None: the root)
        starts = [s.draft_len for s in seqs]
        visible = torch.zeros(B, 0, 0, dtype=torch.bool)  # ancestors-or-self among the fed candidates
        floor = math.log(shape.min_prob) if shape.min_prob > 0 else -math.inf
        for d in range(1, shape.depth):
            front_score = score.gather(1, front)  # (B, W)
            if float(front_score.max()) < floor:
                break  # nothing left worth growing
            n = visible.shape[1]  # (d - 1) * W candidates fed so far
            if max(starts) + n + W > self.cache.max_len:
                break  # the draft's cache has no room for another level
            # a fed candidate sees what its parent sees, and itself
            grown = torch.zeros(B, n + W, n + W, dtype=torch.bool)
            grown[:, :n, :n] = visible
            if parent_row is not None:
                grown[:, n:, :n] = visible.gather(1, parent_row[:, :, None].expand(B, W, n))
            grown[:, n:, n:] = torch.eye(W, dtype=torch.bool)
            visible = grown
            fb = tree_batch([s.slot for s in seqs], starts, torch.full((B, W), d - 1), visible[:, n:])
            fed = tok.gather(1, front)
            h_out, logits = self.draft(fed, front_h, fb, self.cache)  # (B, W, C), (B, W, Vh)
            logits = self.with_copy_prior(seqs, logits, fed)
            logp, top = logits.log_softmax(-1).topk(W, dim=-1)  # (B, W, W)
            child_score = (front_score[:, :, None] + logp).reshape(B, W * W)
            base = tok.shape[1]
            tok = torch.cat([tok, ids[top].reshape(B, W * W)], dim=1)
            score = torch.cat([score, child_score], dim=1)
            parent = torch.cat([parent, front[:, :, None].expand(B, W, W).reshape(B, W * W)], dim=1)
            best = child_score.topk(W, dim=-1).indices  # (B, W) among the new candidates
            front = base + best
            parent_row = n + best // W
            front_h = h_out.gather(1, (best // W)[:, :, None].expand(B, W, h_out.shape[-1]))
        return [select_tree(tok[b].tolist(), score[b].tolist(), parent[b].tolist(), shape.nodes, floor)
                for b in range(B)]


class _DraftLoop:
    """Token choice and early stopping shared by the model drafters.

    Greedy: the draft's argmax; otherwise a sample from the draft's processed distribution, whose rows
    are kept as q for rejection sampling. With `stop_below`, a sequence's draft ends after the first
    token the draft gave a probability below it; with `stop_rules`, where its rule says."""

    def __init__(self, seqs: list[Sequence], ks: list[int], greedy: bool, vocab: int, stop_below: float | None,
                 stop_rules: list[StopRule | None] | None = None):
        self.seqs, self.greedy, self.stop_below = seqs, greedy, stop_below
        self.rules = stop_rules if stop_rules and any(r is not None for r in stop_rules) else None
        self.want_conf = stop_below is not None or self.rules is not None
        self.conf: list[list[float]] = [[] for _ in seqs]
        self.ks, self.lengths = list(ks), list(ks)
        k_max = max(ks)
        self.tokens = torch.zeros(len(seqs), k_max, dtype=torch.long)
        self.probs = None if greedy else torch.zeros(len(seqs), k_max, vocab)

    def pick(self, j: int, logits: torch.Tensor, eagle: EagleDraft | None) -> None:
        """Choose token j of every sequence from the draft's logits (B, V) (reduced head for `eagle`)."""
        if self.greedy:
            if not self.want_conf:
                best, conf = logits.argmax(-1), None
            else:
                conf, best = logits.softmax(-1).max(-1)  # (B,), (B,)
            self.tokens[:, j] = eagle.head_token_ids[best] if eagle is not None else best
        else:
            full = eagle.full_logits(logits) if eagle is not None else logits
            conf = torch.empty(len(self.seqs))
            for b, s in enumerate(self.seqs):
                p = logits_to_probs(full[b], s.params.temperature, s.params.top_k, s.params.top_p)
                self.probs[b, j] = p
                tok = torch.multinomial(p, 1, generator=s.generator)
                self.tokens[b, j] = tok
                conf[b] = p[tok]
        if conf is not None and self.want_conf:
            cl = conf.tolist()
            for b, n in enumerate(self.lengths):
                if j >= n:
                    continue  # this sequence's draft already ended
                self.conf[b].append(cl[b])
                if self.stop_below is not None and cl[b] < self.stop_below:
                    self.lengths[b] = j + 1
                if self.rules is not None and self.rules[b] is not None:
                    keep = self.rules[b](j, cl[b])
                    if keep is not None:
                        # a sampled token is verified whatever it is: dropping it for its own q(x) would make
                        # which tokens reach rejection sampling depend on them, and the output not the target's
                        self.lengths[b] = min(self.lengths[b], keep if self.greedy else max(keep, j + 1))

    def wants(self, n: int) -> bool:
        """Does any sequence still want more than `n` tokens?"""
        return max(self.lengths) > n

    def result(self) -> Draft:
        rows = self.tokens.tolist()
        conf = [c[:n] for c, n in zip(self.conf, self.lengths, strict=True)] if self.want_conf else None
        stopped = [n < k for n, k in zip(self.lengths, self.ks, strict=True)]  # only a cut shortens a draft
        return Draft(tokens=[rows[b][: n] for b, n in enumerate(self.lengths)], probs=self.probs, conf=conf,
                     stopped=stopped)


@dataclass(frozen=True, slots=True)
class TreeShape:
    """How big a draft tree grows: `depth` levels, `width` candidates expanded per level (and children per
    expanded candidate), the best `nodes` kept for the target to verify."""

    nodes: int
    depth: int = 6
    width: int = 4
    min_prob: float = 0.0  # candidates whose path probability (by the draft) is below this are not verified

    def __post_init__(self):
        if self.nodes < 1 or self.depth < 1 or self.width < 1:
            raise ValueError(f"a draft tree needs nodes, depth and width >= 1, got {self.nodes}, {self.depth}, "
                             f"{self.width}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"a draft tree's MIN_PROB must be in [0, 1), got {self.min_prob}")

    @classmethod
    def parse(cls, text: str) -> TreeShape:
        """NODES[:DEPTH[:WIDTH[:MIN_PROB]]], e.g. '24' or '24:6:4' or '16:6:4:0.1'."""
        parts = str(text).split(":")
        try:
            values = [int(x) for x in parts[:3]] + [float(x) for x in parts[3:]]
        except ValueError:
            values = []
        if not 1 <= len(values) <= 4:
            raise ValueError(f"tree shape must be NODES[:DEPTH[:WIDTH[:MIN_PROB]]], got {text!r}")
        return cls(*values)

    @property
    def label(self) -> str:
        return f"tree:{self.nodes}:{self.depth}:{self.width}:{self.min_prob:g}"


def select_tree(tokens: list[int], scores: list[float], parents: list[int], nodes: int,
                floor: float = -math.inf) -> TokenTree:
    """The `nodes` best-scoring candidates as a breadth-first TokenTree (ties go to the shallower one).
    parents[i] is candidate i's parent candidate, -1 for the root."""
    depth: list[int] = []
    for up in parents:
        depth.append(1 if up < 0 else depth[up] + 1)
    worth = [i for i in range(len(tokens)) if scores[i] >= floor]
    chosen = sorted(worth, key=lambda i: (-scores[i], depth[i]))[:nodes]
    order = sorted(chosen, key=lambda i: (depth[i], -scores[i]))  # breadth first, likeliest sibling first
    index = {c: i + 1 for i, c in enumerate(order)}  # candidate -> tree index
    return TokenTree([tokens[c] for c in order], [0 if parents[c] < 0 else index[parents[c]] for c in order])
