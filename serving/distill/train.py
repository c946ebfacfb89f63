"""Train a feature-level draft (serving/eagle.py `EagleDraft`) on prepared distillation data.

Training follows how the draft is used: the first draft step reads the target's real feature f_t (plus a
little noise), later steps read the draft's own previous output h in place of the feature ("training-time
test", as in HASS / EAGLE-3): step j at position p attends to the real-feature keys up to p-j+1 and to the
keys its own chain wrote at p-j+2..p, exactly the cache layout at inference. Every step is trained on the
target's next-token distribution at p+1 (soft top-k labels restricted to the head vocabulary, plus
cross-entropy to the target's greedy token) and regresses h_p on the target's feature f_{p+1} (for a
fused-feature draft: on the draft's own fuse of the next real features, g_{p+1} = fuse(f_{p+1})).
"""

from __future__ import annotations

import math
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from serving.distill.data import Prepared, token_frequencies
from serving.drafters import ContextFollowers
from serving.eagle import EagleDraft
from serving.llama import CausalLM, apply_rope


@dataclass
class TrainConfig:
    head_vocab: int = 8192
    layers: int = 1
    feature_layers: tuple[int, ...] = ()  # target blocks fused into the draft's input (EAGLE-3); () = the last
    lr: float = 5e-4
    batch_tokens: int = 3072  # padded tokens per step
    batch_pool: int = 256  # sequences sorted together by shape before batching (`Batches`); 0: random batches
    max_len: int = 448  # sequences are cut to this many positions
    unroll: int = 3  # draft steps trained per position (1 = real features only)
    detach_unroll: bool = False  # stop gradients through the draft's own features
    freeze_head: bool = False  # keep the target's final norm and head rows as they are (EAGLE-1): train fc + layers
    feat_noise: float = 0.05  # uniform noise on real features, as a fraction of their RMS
    w_soft: float = 1.0
    w_hard: float = 0.5
    w_feat: float = 0.5
    step_decay: float = 0.8  # loss weight of step j is step_decay**(j-1)
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 1.0
    minutes: float | None = None
    steps: int | None = None
    seed: int = 0
    dtype: str = "bfloat16"  # matmul precision (mixed: float32 weights and optimizer, bf16 autocast)
    save_every_s: float = 180.0
    extra: dict = field(default_factory=dict)


# what a resumed run may change: its budget and how often it saves; "target" says where the target was (its
# fingerprint, in `extra` beside it, is what must match)
RESUMABLE_CHANGES = ("minutes", "steps", "save_every_s", "target", "budget_given", "budget_changed")
# entries of `extra` an older checkpoint has in place of newer ones: the target by its files' modification times
# (target_fingerprint: touching or copying it read as another target, and an edit keeping the times as the same),
# and the --corpus data by its paths (a copied or moved corpus read as other data, and data made again in place
# as the same), where the checkpoint records them by content (the weights' and config.json's fingerprints, the
# corpus's data_fingerprint), not compared
SUPERSEDED = {"target_fingerprint": "target_weights_fingerprint", "corpus": "corpus_fingerprint"}
BUDGET_GIVEN = "budget_given"  # TrainConfig.extra: --steps / --minutes / --total-minutes as given
BUDGET_CHANGED = "budget_changed"  # TrainConfig.extra: the budget a resumed run started with, where it differed


def resume_mismatch(saved: dict, cfg: TrainConfig) -> tuple[str, object, object] | None:
    """The first option a checkpoint's TrainConfig (`saved`, as `asdict` wrote it) and `cfg` disagree on, as
    (name, saved value, this run's value), entries of `extra` under their own names; None when the checkpoint
    can be resumed with `cfg`. An option the checkpoint does not record (an older one) is not compared, nor one
    the checkpoint records a newer entry for (`SUPERSEDED`)."""
    def same(a, b) -> bool:
        return (list(a) if isinstance(a, tuple) else a) == (list(b) if isinstance(b, tuple) else b)

    now = asdict(cfg)
    saved_extra = saved.get("extra") or {}
    pairs = [(k, saved[k], v) for k, v in now.items() if k != "extra" and k in saved]
    pairs += [(k, saved_extra[k], v) for k, v in now["extra"].items()
              if k in saved_extra and SUPERSEDED.get(k) not in saved_extra]
    for name, was, is_ in pairs:
        if name not in RESUMABLE_CHANGES and not same(was, is_):
            return name, was, is_
    return None


# ------------------------------------------------------------------ head vocabulary
def choose_head_ids(preps: list[Prepared], vocab_size: int, head_vocab: int, always: tuple[int, ...] = ()) -> tuple[torch.Tensor, dict]:
    """The `head_vocab` most frequent answer tokens (plus `always`, e.g. EOS); returns ids and coverage."""
    counts = token_frequencies(preps, vocab_size)
    order = torch.argsort(counts, descending=True)
    chosen = [int(t) for t in always]
    seen = set(chosen)
    for t in order.tolist():
        if len(chosen) >= head_vocab:
            break
        if t not in seen:
            chosen.append(t)
            seen.add(t)
    ids = torch.tensor(sorted(chosen), dtype=torch.long)
    total = int(counts.sum())
    cov = {}
    for n in (1024, 2048, 4096, 8192, 16384, 32768):
        if n <= vocab_size:
            cov[str(n)] = round(float(counts[order[:n]].sum()) / max(total, 1), 4)
    cov["chosen"] = round(float(counts[ids].sum()) / max(total, 1), 4)
    return ids, cov


# ------------------------------------------------------------------ batching
class Batches:
    """Training batches of whole sequences, at most `batch_tokens` positions when padded to the longest.

    pool 0: sequences in a random order, cut into batches as they come. pool N: each epoch's random order
    is taken N sequences at a time, each group sorted by length and then prompt length, cut into batches
    and the epoch's batches shuffled. A batch then holds sequences of about one shape: little padding, and
    answers that start at about one position, so the unrolled steps' window (`unrolled_forward`) is
    about the answers alone."""

    def __init__(self, preps: list[Prepared], max_len: int, batch_tokens: int, seed: int, pool: int = 0):
        self.items = [(p, s) for p in preps for s in p.seqs if s["length"] - s["num_prompt"] >= 3]
        if not self.items:
            raise ValueError("the corpus has no sequence with an answer of at least 3 tokens")
        if pool < 0:
            raise ValueError(f"pool {pool}: give 0 (random batches) or a number of sequences to sort together")
        self.max_len, self.batch_tokens, self.pool = max_len, batch_tokens, pool
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.queue: list[list[int]] = []  # pool > 0: the epoch's batches still to come

    def state(self) -> dict:
        """Where the iteration is: its random generator and the rest of the current epoch (a checkpoint keeps it
        so that a resumed run draws the batches an uninterrupted one would)."""
        return {"rng": self.rng.getstate(), "order": list(self.order), "queue": [list(b) for b in self.queue]}

    def restore(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])
        self.queue = [list(b) for b in state["queue"]]

    def _length(self, i: int) -> int:
        return min(self.items[i][1]["length"], self.max_len)

    def _fits(self, picked: list[int], T: int, L: int) -> bool:
        return not picked or (len(picked) + 1) * max(T, L) <= self.batch_tokens

    def _epoch(self) -> list[list[int]]:
        order = list(range(len(self.items)))
        self.rng.shuffle(order)
        batches: list[list[int]] = []
        for g in range(0, len(order), self.pool):
            group = sorted(order[g: g + self.pool],
                           key=lambda i: (self._length(i), self.items[i][1]["num_prompt"]))
            picked, T = [], 0
            for i in group:
                L = self._length(i)
                if not self._fits(picked, T, L):
                    batches.append(picked)
                    picked, T = [], 0
                picked.append(i)
                T = max(T, L)
            batches.append(picked)
        self.rng.shuffle(batches)
        return batches

    def _random(self) -> list[int]:
        picked = []
        T = 0
        while True:
            if not self.order:
                self.order = list(range(len(self.items)))
                self.rng.shuffle(self.order)
            i = self.order[-1]
            L = self._length(i)
            if not self._fits(picked, T, L):
                break
            self.order.pop()
            picked.append(i)
            T = max(T, L)
        return picked

    def next(self) -> dict:
        if self.pool:
            if not self.queue:
                self.queue = self._epoch()
            picked = self.queue.pop()
        else:
            picked = self._random()
        T = max(self._length(i) for i in picked)
        B = len(picked)
        prep0 = self.items[picked[0]][0]
        C, k = prep0.feats.shape[1], prep0.topk_ids.shape[1]
        # gathered on the host from the memory-mapped arrays; `train` moves the batch to its device
        cpu = torch.device("cpu")
        tokens = torch.zeros(B, T, dtype=torch.long, device=cpu)
        feats = torch.zeros(B, T, C, dtype=torch.bfloat16, device=cpu)
        tk_ids = torch.zeros(B, T, k, dtype=torch.long, device=cpu)
        tk_p = torch.zeros(B, T, k, device=cpu)
        num_prompt = torch.zeros(B, dtype=torch.long, device=cpu)
        length = torch.zeros(B, dtype=torch.long, device=cpu)
        for r, i in enumerate(picked):
            p, s = self.items[i]
            L = min(s["length"], self.max_len)
            o = s["offset"]
            tokens[r, :L] = p.tokens[o: o + L]
            feats[r, :L] = p.feats[o: o + L]
            tk_ids[r, :L] = p.topk_ids[o: o + L]
            tk_p[r, :L] = p.topk_probs[o: o + L]
            num_prompt[r], length[r] = s["num_prompt"], L
        return {"tokens": tokens, "feats": feats, "topk_ids": tk_ids, "topk_probs": tk_p,
                "num_prompt": num_prompt, "length": length}


# ------------------------------------------------------------------ the unrolled forward
def _step_mask(T: int, j: int) -> torch.Tensor:
    """(T, j*T) bool: step j's query at p sees real keys q <= p-j+1 and step i's key at p-(j-i)."""
    p = torch.arange(T)[:, None]
    q = torch.arange(T)[None, :]
    parts = [q <= p - (j - 1)]
    for i in range(2, j + 1):
        parts.append(q == p - (j - i))
    return torch.cat(parts, dim=1)


def unrolled_attention(q: torch.Tensor, keys: list[torch.Tensor], vals: list[torch.Tensor],
                       start: int = 0) -> torch.Tensor:
    """Step j's attention (j = len(keys)) as `_step_mask(T, j)` lays it out, without scoring the keys that
    mask hides: the query at p sees the real-feature keys at or before p-j+1 (block 1: causal, shifted by
    j-1) and, of each later step i, the one key at p-(j-i). Equal to scaled_dot_product_attention over the
    keys side by side under that mask, which scores j*T keys a query where at most T+j-1 count.
    q (B, H, W, D); keys / vals: one per step so far, step 1's (B, Hkv, T, D) over all positions, later
    steps' (B, Hkv, W, D) like q over positions start..start+W-1 (`unrolled_forward`'s window; W = T when
    start is 0)."""
    j = len(keys)
    if j == 1:
        return F.scaled_dot_product_attention(q, keys[0], vals[0], is_causal=True, enable_gqa=True)
    B, H, W, D = q.shape
    Hkv, T = keys[0].shape[1], keys[0].shape[2]
    G = H // Hkv  # query heads per kv head (grouped-query attention)
    scale = D**-0.5
    qg = q.reshape(B, Hkv, G, W, D)
    pos = torch.arange(W, device=q.device)  # window positions; absolute ones are start + pos
    block = (qg.reshape(B, Hkv, G * W, D) @ keys[0].transpose(-1, -2)).view(B, Hkv, G, W, T) * scale
    block = block.masked_fill(torch.arange(T, device=q.device)[None, :] > start + pos[:, None] - (j - 1),
                              float("-inf"))
    singles, values = [], []
    for i in range(2, j + 1):
        d = j - i  # step i's key for the query at p sits at p - d
        k_i = F.pad(keys[i - 1][:, :, : W - d], (0, 0, d, 0)) if d else keys[i - 1]
        v_i = F.pad(vals[i - 1][:, :, : W - d], (0, 0, d, 0)) if d else vals[i - 1]
        score = (qg * k_i[:, :, None]).sum(-1) * scale  # (B, Hkv, G, W)
        singles.append(score.masked_fill(pos < d, float("-inf")) if d else score)
        values.append(v_i)
    w = torch.cat([block, torch.stack(singles, dim=-1)], dim=-1).float().softmax(-1).to(q.dtype)
    out = (w[..., :T].reshape(B, Hkv, G * W, T) @ vals[0]).view(B, Hkv, G, W, D)
    for n, v_i in enumerate(values):
        out = out + w[..., T + n, None] * v_i[:, :, None]
    return out.reshape(B, H, W, D)


def unrolled_forward(draft: EagleDraft, tokens: torch.Tensor, feats: torch.Tensor, unroll: int,
                     detach: bool = False, start: int = 0) -> list[torch.Tensor]:
    """h for steps 1..unroll. Step 1 reads `feats` (fused first for a fused-feature draft) at every
    position, (B, T, C); step j>1 reads step j-1's h shifted by one and runs only on the window of positions
    start..T-1, (B, T - start, C). Its value at p depends on nothing before start + j - 2 beyond step 1's
    keys, so positions from start + j - 1 on are exact; `distill_loss` sets start to the earliest answer
    position of the batch, as its loss reads no earlier one."""
    if draft.fuse is not None:
        feats = draft.fuse(feats)  # (B, T, n*C) -> (B, T, C)
    B, T, C = feats.shape
    next_tokens = torch.zeros_like(tokens)
    next_tokens[:, :-1] = tokens[:, 1:]
    emb = draft.embed[0](next_tokens).to(feats.dtype)
    cos = draft.rope_cos[:T][None, None].to(feats.dtype)
    sin = draft.rope_sin[:T][None, None].to(feats.dtype)
    keys: list[list[torch.Tensor]] = [[] for _ in draft.layers]
    vals: list[list[torch.Tensor]] = [[] for _ in draft.layers]
    outs = []
    f, first = feats, 0  # step 1: all positions
    for _ in range(unroll):  # step j reads the keys of steps 1..j (unrolled_attention)
        W = T - first
        cos_w, sin_w = cos[:, :, first:], sin[:, :, first:]
        x = draft.fc(torch.cat([emb[:, first:], f], dim=-1))
        for li, block in enumerate(draft.layers):
            a = block.self_attn
            hn = block.input_layernorm(x)
            q = a.q_proj(hn).view(B, W, a.num_heads, a.head_dim).transpose(1, 2)
            k = a.k_proj(hn).view(B, W, a.num_kv_heads, a.head_dim).transpose(1, 2)
            v = a.v_proj(hn).view(B, W, a.num_kv_heads, a.head_dim).transpose(1, 2)
            q, k = apply_rope(q, cos_w, sin_w), apply_rope(k, cos_w, sin_w)
            keys[li].append(k)
            vals[li].append(v)
            att = unrolled_attention(q, keys[li], vals[li], start=first)
            x = x + a.o_proj(att.transpose(1, 2).reshape(B, W, -1))
            x = x + block.mlp(block.post_attention_layernorm(x))
        outs.append(x)
        nxt = x.detach() if detach else x
        # the next step reads h at p-1; its first window position gets a filler it never uses
        nxt = nxt[:, start - first:]
        f, first = torch.cat([feats[:, start: start + 1], nxt[:, :-1]], dim=1), start
    return outs


HEAD_CHUNK_ROWS = 64  # rows of the (M, V) logits a CPU handles at a time: their float32 copies stay in cache


def _chunk_rows(z: torch.Tensor) -> int:
    """HEAD_CHUNK_ROWS on the CPU; all rows at once on a GPU, where a pass is cheap and a launch is not."""
    return HEAD_CHUNK_ROWS if z.device.type == "cpu" else max(z.shape[0], 1)


class _HeadLogProbs(torch.autograd.Function):
    """log softmax(z)[idx] without the (M, V) log-probabilities: the forward keeps z and its log-sum-exp,
    the backward forms softmax(z), in float32, for d/dz = onehot(idx) g - softmax(z) sum(g). On the CPU
    both go HEAD_CHUNK_ROWS rows at a time, so each float32 temporary is reused from cache rather than
    written to and read back from memory (3x faster than whole-matrix passes on a 2-core CPU)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, idx: torch.Tensor):
        M = z.shape[0]
        wide = torch.promote_types(z.dtype, torch.float32)
        lse = torch.empty(M, 1, dtype=wide, device=z.device)
        top = torch.empty(M, dtype=torch.long, device=z.device)
        lq = torch.empty(idx.shape, dtype=wide, device=z.device)
        n = _chunk_rows(z)
        for i in range(0, M, n):
            rows = slice(i, i + n)
            zf = z[rows].to(wide)
            lse[rows] = torch.logsumexp(zf, dim=-1, keepdim=True)
            top[rows] = zf.argmax(-1)
            lq[rows] = zf.gather(1, idx[rows]) - lse[rows]
        ctx.save_for_backward(z, idx, lse)
        ctx.mark_non_differentiable(top)
        return lq, top

    @staticmethod
    def backward(ctx, g: torch.Tensor, _top=None):
        z, idx, lse = ctx.saved_tensors
        grad = torch.empty_like(z)
        total = g.sum(-1, keepdim=True).neg_()
        n = _chunk_rows(z)
        for i in range(0, z.shape[0], n):
            rows = slice(i, i + n)
            p = torch.sub(z[rows].to(lse.dtype), lse[rows]).exp_()  # softmax(z), a new tensor even for float32 z
            grad[rows] = p.mul_(total[rows]).scatter_add_(1, idx[rows], g[rows])
        return grad, None


def head_log_probs(z: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, k) log-probabilities (float32, or float64 for float64 z) of the head rows `idx` (M, k) under
    the logits z (M, V), what log_softmax(z.float()).gather(1, idx) gives, and each row's argmax (M,)
    (no gradient), with a fraction of the passes over (M, V) that those take."""
    return _HeadLogProbs.apply(z, idx)


def distill_loss(draft: EagleDraft, batch: dict, cfg: TrainConfig, vocab_to_head: torch.Tensor,
                 feat_scale: float, train: bool = True) -> tuple[torch.Tensor, dict]:
    tokens, num_prompt, length = batch["tokens"], batch["num_prompt"], batch["length"]
    feats = batch["feats"].float()
    B, T, C = feats.shape
    f_in = feats
    if train and cfg.feat_noise > 0:
        f_in = feats + (torch.rand_like(feats) * 2 - 1) * (cfg.feat_noise * feat_scale)
    # steps after the first run from the batch's earliest loss position on (the first answer token)
    start = min(max(int(num_prompt.min()) - 1, 0), T - 1)
    hs = unrolled_forward(draft, tokens, f_in, cfg.unroll, detach=cfg.detach_unroll, start=start)
    pos = torch.arange(T)[None, :]
    # label at position p: the target's distribution at p+1 and its feature f_{p+1}
    tgt_feat = torch.zeros_like(feats)
    tgt_feat[:, :-1] = feats[:, 1:]
    tk_ids = torch.zeros_like(batch["topk_ids"])
    tk_ids[:, :-1] = batch["topk_ids"][:, 1:]
    tk_p = torch.zeros_like(batch["topk_probs"])
    tk_p[:, :-1] = batch["topk_probs"][:, 1:]
    fused = draft.fuse is not None
    # what h_p regresses on: the target's f_{p+1}, or for a fused draft its own g_{p+1} = fuse(f_{p+1}) (what
    # step 1 reads at p+1; no gradient through that side); None: no feature loss
    feat_target = tgt_feat
    if fused:
        with torch.no_grad():
            feat_target = draft.fuse(tgt_feat) if cfg.w_feat else None  # (B, T, C)
    head_idx = vocab_to_head[tk_ids]  # (B, T, k), -1 outside the head
    in_head = head_idx >= 0
    total = feats.new_zeros(())
    stats: dict = {}
    for j, h in enumerate(hs, start=1):
        valid = (pos >= (num_prompt[:, None] - 1 + (j - 1))) & (pos <= length[:, None] - 2)
        hv = h[valid[:, T - h.shape[1]:]]  # (M, C); steps after the first hold positions start.. only
        z = draft.head(draft.norm(hv))  # (M, Vh) logits
        hi = head_idx[valid].clamp_min(0)
        ih = in_head[valid]
        pv = tk_p[valid] * ih
        lq, top = head_log_probs(z, hi)  # (M, k), (M,)
        soft = -(pv * lq).sum(-1).mean()
        top_in = ih[:, 0]
        hard = -(lq[:, 0][top_in]).mean() if top_in.any() else total * 0
        if feat_target is None:
            feat = total * 0
        else:
            fv = feat_target[valid]
            # a fused target is scaled by its own RMS, so a shrinking fuse gains nothing
            scale = fv.pow(2).mean().sqrt().clamp_min(1e-6) if fused else feat_scale
            feat = F.smooth_l1_loss(hv / scale, fv / scale)
        w = cfg.step_decay ** (j - 1)
        total = total + w * (cfg.w_soft * soft + cfg.w_hard * hard + cfg.w_feat * feat)
        with torch.no_grad():
            acc = ((top == hi[:, 0]) & top_in).float().mean()
        stats[f"acc{j}"] = float(acc)
        stats[f"soft{j}"] = float(soft.detach())
        stats[f"feat{j}"] = float(feat.detach())
    stats["loss"] = float(total.detach())
    return total, stats


# ------------------------------------------------------------------ alpha (simulated drafting)
def primed_draft(draft: EagleDraft, prep: Prepared, seq: dict, k: int):
    """(tokens, features, draft cache) of one prepared sequence, the cache holding the real entries of
    its prompt: positions 0..P-2 (tokens x_1..x_{P-1}, features f_0..f_{P-2}), room for k drafts more."""
    from serving.llama import contiguous_batch

    o, L, P = seq["offset"], seq["length"], seq["num_prompt"]
    toks = prep.tokens[o: o + L]
    feats = prep.feats[o: o + L].to(draft.fc.weight.dtype)
    cache = draft.new_cache(1, L + k + 2)
    if P >= 2:
        draft(toks[1:P][None], feats[: P - 1][None], contiguous_batch(0, 1, 0, P - 1), cache)
    return toks, feats, cache


@torch.inference_mode()
def simulate_alpha(draft: EagleDraft, prep: Prepared, k: int = 4, domains: tuple[str, ...] | None = None,
                   lookup: Callable[[list[int], int], list[int]] | None = None, copy_bias: float = 0.0,
                   force: Callable[[dict, int], int | None] | None = None, progress: bool = False) -> dict:
    """Greedy acceptance as the engine would see it: the draft proposes K tokens from the real feature
    of the last verified position (later steps feed its own h), the target's greedy continuation (the
    stored answer) verifies, the accepted prefix plus one target token is committed, repeat.
    `lookup(context, k)`, when given, is asked first, as draft+ngram asks prompt lookup: where it returns
    tokens they are the step's proposal (and may be fewer than K) and the draft is not run.
    Returns {domain: {"alpha", "acceptance_rate", "drafted", "accepted", "mean_accept_len"}}: alpha is the
    per-token acceptance probability (accepted / tested, a step tests its accepted tokens and the first
    rejected one), acceptance_rate accepted / drafted.
    `force(seq, m)`, a diagnostic (scripts.draft_ceiling sure), may replace the draft's proposal for the
    sequence's token m while the chain is still on the target's path: the token it returns is proposed (and
    fed to the next draft step) instead of the draft's top-1; None keeps the draft's.
    `progress`: a bar over the answer tokens verified, with its ETA, on stderr where it is a terminal (minutes of
    silence on a CPU: distill's evaluation steps 82 answers of up to 128 tokens one token at a time)."""
    from tqdm import tqdm

    from serving.llama import contiguous_batch

    res: dict[str, dict] = {}
    row_of = draft.head_index().tolist() if copy_bias else []
    seqs = [s for s in prep.seqs if not domains or s["domain"] in domains]
    bar = tqdm(total=sum(s["length"] - s["num_prompt"] for s in seqs), desc="evaluate", unit="tok",
               disable=not (progress and stderr_is_terminal()))
    for s in seqs:
        L, P = s["length"], s["num_prompt"]
        toks, feats, cache = primed_draft(draft, prep, s, k)
        followers = ContextFollowers()  # the engine's copy-prior index, grown as tokens are committed
        tok_list = toks.tolist()
        n = P  # x_n is the pending token (the first answer token came from the prefill)
        real_upto = P - 1  # cache holds real entries for positions < real_upto
        drafted = accepted = steps = rejections = 0
        while n + 1 <= L - 1:
            kk = min(k, L - 1 - n)
            s0 = n - 1
            props = lookup(toks[: n + 1].tolist(), kk)[:kk] if lookup is not None else []
            if props:
                kk = len(props)
            else:
                if real_upto < s0:  # refresh real entries the previous chain overwrote or skipped
                    draft(toks[real_upto + 1: s0 + 1][None], feats[real_upto: s0][None],
                          contiguous_batch(0, 1, real_upto, s0 - real_upto), cache)
                tok = toks[n: n + 1]
                f = feats[s0: s0 + 1]
                if copy_bias:
                    followers.update(tok_list[: n + 1], row_of)
                for j in range(kk):
                    h, logits = draft(tok[None], f[None], contiguous_batch(0, 1, s0 + j, 1), cache)
                    lg = logits[0, -1]
                    rows = followers.rows.get(int(tok[0]))
                    if rows:
                        lg = lg.clone()
                        lg[rows] += copy_bias
                    t = draft.head_token_ids[lg.argmax()]
                    if force is not None and props == tok_list[n + 1: n + 1 + j]:  # still on the target's path
                        forced = force(s, n + 1 + j)
                        if forced is not None:
                            t = torch.tensor(forced)
                    props.append(int(t))
                    tok, f = t.view(1), h[0, -1:]
                real_upto = s0 + 1  # position s0 was real (step 1); s0+1.. are the chain's own
            a = 0
            while a < kk and props[a] == int(toks[n + 1 + a]):
                a += 1
            drafted += kk
            accepted += a
            rejections += a < kk
            steps += 1
            n += a + 1
        bar.update(L - P)
        r = res.setdefault(s["domain"], {"drafted": 0, "accepted": 0, "drafts": 0, "rejections": 0})
        r["rejections"] += rejections
        r["drafted"] += drafted
        r["accepted"] += accepted
        r["drafts"] += steps
    bar.close()
    for r in res.values():
        r.update(acceptance_figures(r))
    return res


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal: a progress bar is drawn there only (into a pipe or a log file its redraws
    were carriage returns around nothing a line does not say), as the kernel-choice bar is."""
    import sys

    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


def acceptance_figures(counts: dict) -> dict:
    """alpha (accepted / tested), acceptance_rate (accepted / drafted) and mean_accept_len (1 + accepted / steps)
    of simulate_alpha's counts; None where nothing was drafted: unmeasured, not 0 (as calibrate says it)."""
    tested = counts["accepted"] + counts["rejections"]
    return {"alpha": round(counts["accepted"] / tested, 4) if tested else None,
            "acceptance_rate": round(counts["accepted"] / counts["drafted"], 4) if counts["drafted"] else None,
            "mean_accept_len": round(1 + counts["accepted"] / counts["drafts"], 3) if counts["drafts"] else None}


CONFIDENCE_EDGES = (0.0, 0.5, 0.8, 0.95, 1.0)
TOKEN_KINDS = ("whitespace", "punctuation", "word start", "word piece")


def token_kind(text: str) -> str:
    """What a token's decoded text is: only whitespace (newlines, indentation); no letter or digit
    (punctuation, operators, brackets); a word that starts with a space or a newline; or a piece that
    continues the text before it (the rest of an identifier, a number's next digits)."""
    if not text.strip():
        return "whitespace"
    if not any(ch.isalnum() for ch in text):
        return "punctuation"
    return "word start" if text[0].isspace() else "word piece"


def kind_of_token(tokenizer) -> Callable[[int], str]:
    """Vocabulary id -> `token_kind` of its decoded text, each id decoded once."""
    kinds: dict[int, str] = {}

    def kind_of(t: int) -> str:
        if t not in kinds:
            kinds[t] = token_kind(tokenizer.decode([t]))
        return kinds[t]

    return kind_of


@torch.inference_mode()
def teacher_forced_agreement(draft: EagleDraft, prep: Prepared, ks: tuple[int, ...] = (1, 2, 4, 8),
                             domains: tuple[str, ...] | None = None,
                             kind_of: Callable[[int], str] | None = None) -> dict:
    """Where the draft misses, on answer positions: every position is fed the target's real feature (what
    the first token of every draft chain sees), and the target's greedy next token is looked for in the
    draft's top-k. Per domain: `positions`; `top` {k: share in the top-k} (top-1 bounds a chain's first
    token; the rest is what branching on more candidates could recover); `in_head` (share the reduced
    head can propose at all); `by_target_confidence`: for bins of the target's own top-1 probability,
    the share of positions in the bin and the draft's top-1 agreement there; `in_context`: the positions
    whose token followed the current token earlier in the sequence (a bigram a copy could supply), their
    share and the draft's top-1 there. With `kind_of` (vocabulary id -> a kind such as `token_kind` of
    its text) also `by_kind`: per kind, the share of positions, the draft's top-1 there, the share its
    head can propose, and the share of the draft's misses that are of this kind."""
    from serving.llama import contiguous_batch

    head = draft.head_token_ids
    kmax = min(max(ks), head.numel())
    bins = list(zip(CONFIDENCE_EDGES[:-1], CONFIDENCE_EDGES[1:], strict=True))  # [from, to); the last bin includes 1.0
    res: dict[str, dict] = {}
    for s in prep.seqs:
        if domains and s["domain"] not in domains:
            continue
        o, L, P = s["offset"], s["length"], s["num_prompt"]
        if L < 3:
            continue
        toks = prep.tokens[o: o + L]
        feats = prep.feats[o: o + L].to(draft.fc.weight.dtype)
        cache = draft.new_cache(1, L)
        # row i reads token x_{i+1} and feature f_i, and predicts x_{i+2}
        _, logits = draft(toks[1:L][None], feats[: L - 1][None], contiguous_batch(0, 1, 0, L - 1), cache)
        answer = torch.arange(2, L) >= P
        if not bool(answer.any()):
            continue
        want = toks[2:L][answer]
        ranked = head[logits[0, : L - 2][answer].float().topk(kmax, dim=-1).indices]  # (n, kmax) vocab ids
        hit = ranked == want[:, None]
        p1 = prep.topk_probs[o + 1: o + L - 1, 0][answer].float()  # the target's confidence in x_{i+2}
        r = res.setdefault(s["domain"], {"positions": 0, "top": {k: 0 for k in ks}, "in_head": 0,
                                         "bins": [[0, 0] for _ in bins], "context": [0, 0], "kinds": {}})
        r["positions"] += int(want.numel())
        for k in ks:
            r["top"][k] += int(hit[:, :k].any(-1).sum())
        in_head = torch.isin(want, head)
        r["in_head"] += int(in_head.sum())
        for b, (lo, hi) in enumerate(bins):
            m = (p1 >= lo) & ((p1 < hi) if hi < 1.0 else (p1 <= hi))
            r["bins"][b][0] += int(m.sum())
            r["bins"][b][1] += int(hit[m, 0].sum())
        # in context: x_{i+2} followed x_{i+1} somewhere in x_0 .. x_{i+1} (in the head or not)
        seq, followers = toks.tolist(), {}
        for i in range(L - 2):
            followers.setdefault(seq[i], set()).add(seq[i + 1])
            if i + 2 >= P and seq[i + 2] in followers.get(seq[i + 1], ()):
                r["context"][0] += 1
                r["context"][1] += int(ranked[i - max(P - 2, 0), 0]) == seq[i + 2]
        if kind_of is not None:
            for t, h1, ih in zip(want.tolist(), hit[:, 0].tolist(), in_head.tolist(), strict=True):
                c = r["kinds"].setdefault(kind_of(t), [0, 0, 0])  # positions, draft top-1 hits, in head
                c[0], c[1], c[2] = c[0] + 1, c[1] + h1, c[2] + ih
    out = {}
    for dom, r in res.items():
        n = r["positions"]
        (nc, hc) = r["context"]
        out[dom] = {"positions": n, "top": {k: round(v / n, 4) for k, v in r["top"].items()},
                    "in_head": round(r["in_head"] / n, 4),
                    "by_target_confidence": [{"from": lo, "to": hi, "share": round(c / n, 4),
                                              "top1": round(h / c, 4) if c else None}
                                             for (lo, hi), (c, h) in zip(bins, r["bins"], strict=True)],
                    "in_context": {"share": round(nc / n, 4), "top1": round(hc / nc, 4) if nc else None}}
        if kind_of is not None:
            misses = n - sum(c[1] for c in r["kinds"].values())
            out[dom]["by_kind"] = [{"kind": kind, "share": round(c / n, 4), "top1": round(h / c, 4),
                                    "in_head": round(ih / c, 4),
                                    "share_of_misses": round((c - h) / misses, 4) if misses else None}
                                   for kind, (c, h, ih) in sorted(r["kinds"].items(), key=lambda kv: -kv[1][0])]
    return out


@torch.inference_mode()
def measure_c(draft: EagleDraft, target: CausalLM, context: int = 256, reps: int = 30) -> dict:
    """Draft forward time per proposed token / target forward time for one token (batch 1, warm caches), at
    `context` tokens of cache, or as many as the models' positions allow (the token timed takes the next one)."""
    from serving.llama import contiguous_batch

    context = max(1, min(context, target.cfg.max_position - 1, draft.cfg.max_position - 1))

    def timeit(fn) -> float:
        for _ in range(5):
            fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        return ts[len(ts) // 2]

    tcache = target.new_cache(1, context + 8)
    target(torch.zeros(1, context, dtype=torch.long), contiguous_batch(0, 1, 0, context), tcache)
    dcache = draft.new_cache(1, context + 8)
    C = draft.cfg.hidden_size
    dt = draft.fc.weight.dtype
    draft(torch.zeros(1, context, dtype=torch.long), torch.zeros(1, context, C, dtype=dt),
          contiguous_batch(0, 1, 0, context), dcache)
    one = torch.zeros(1, 1, dtype=torch.long)
    feat = torch.zeros(1, 1, C, dtype=dt)
    fb = contiguous_batch(0, 1, context, 1)
    t_target = timeit(lambda: target(one, fb, tcache, last_only=True))
    t_draft = timeit(lambda: draft(one, feat, fb, dcache))
    return {"draft_ms": round(t_draft * 1e3, 3), "target_ms": round(t_target * 1e3, 3),
            "c": round(t_draft / t_target, 4), "context": context, "dtype": str(dt).replace("torch.", "")}


# ------------------------------------------------------------------ training loop
class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training. `step`: the step of the last checkpoint written to `checkpoint` (0: none)."""

    def __init__(self, step: int, checkpoint: Path | None):
        super().__init__(f"training interrupted; checkpoint at step {step}")
        self.step, self.checkpoint = step, checkpoint


class TrainingDiverged(ValueError):
    """The loss stopped being a finite number (a learning rate too high, or a target whose weights hold NaN):
    every step after it would only spread the NaN through the weights, so training stops at the first one, before
    its update (a finite loss whose gradient is not finite stops it too). `step`: the step whose loss (`what`) was
    not finite (1-based); `saved`: the step of the last checkpoint written to `checkpoint` (0: none), all of whose
    steps had finite losses."""

    def __init__(self, step: int, what: str, value: float, saved: int, checkpoint: Path | None, lr: float):
        kept = (f"the checkpoint at step {saved} ({checkpoint}) is the last good state" if saved and checkpoint
                else "no checkpoint was saved before it")
        super().__init__(f"training diverged: the {what} is {value} at step {step} (learning rate {lr:.3g}), so no "
                         f"draft was written as trained; {kept}. Likely causes: --lr too high (the default is 5e-4), "
                         "or damaged target weights (`specfinops models verify`, then "
                         "`specfinops models pull --force`)")
        self.step, self.saved, self.checkpoint = step, saved, checkpoint


class StopBetweenSteps:
    """While training, a first Ctrl-C asks to stop once the step in progress is done (`asked`), so the
    checkpoint saved then is whole; a second one stops at once. Where signals cannot be caught (not the main
    thread) Ctrl-C stops at once. `restore` puts the previous handler back."""

    def __init__(self, say: Callable[[str], None]):
        self.asked = False
        self.say = say
        try:
            self.previous = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            self.previous = None

    def _on_sigint(self, signum, frame) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True
        self.say("Ctrl-C: stopping after this step to save a checkpoint (Ctrl-C again stops at once)")

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


def rng_state(device: torch.device) -> dict:
    """The torch generators training draws from (the feature noise): the CPU's, and the GPU's where it runs."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def _lr_at(cfg: TrainConfig, step: int, frac: float) -> float:
    warm = min(1.0, (step + 1) / max(cfg.warmup_steps, 1))
    return cfg.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def train(draft: EagleDraft, preps: list[Prepared], cfg: TrainConfig, *, device: torch.device | str = "cpu",
          **options) -> dict:
    """Train in place on `device` (where the draft and its shared embedding already are); returns a summary
    (steps, minutes, loss curve). Time- or step-bounded. `options`: those of `_train`."""
    if cfg.minutes is None and cfg.steps is None:
        raise ValueError("give a training budget: minutes or steps")
    device = torch.device(device)
    with torch.device(device):  # masks, positions and index tables are made where the draft runs
        return _train(draft, preps, cfg, device=device, **options)


def _train(draft: EagleDraft, preps: list[Prepared], cfg: TrainConfig, *, device: torch.device,
           checkpoint: Path | None = None, resume: bool = False, progress: bool = True,
           on_checkpoint: Callable[[EagleDraft, dict], None] | None = None,
           say: Callable[[str], None] = lambda m: None,
           run_record: Callable[[], dict] | None = None) -> dict:
    """`run_record`: what the caller keeps in each checkpoint (under "run", read back by its --resume), asked for
    at each save: the wall-clock minutes of the runs so far, say."""
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    vocab_to_head = draft.head_index()
    sample = torch.cat([p.feats[:20000].float() for p in preps])
    feat_scale = float(sample.pow(2).mean().sqrt())
    batches = Batches(preps, cfg.max_len, cfg.batch_tokens, cfg.seed, pool=cfg.batch_pool)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    step, elapsed, curve = 0, 0.0, []
    ema = None  # the loss and accuracies' running average (the progress bar, the curve, the summary's "final")
    if resume and checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False, map_location=device)
        differs = resume_mismatch(state.get("config") or {}, cfg)
        if differs:
            name, was, is_ = differs
            raise ValueError(f"checkpoint {checkpoint} was made with {name} {was!r}, not {is_!r}: resume with the "
                             "options it was made with, or start again without resuming")
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["opt"])
        step, elapsed, curve = state["step"], state["elapsed"], state["curve"]
        if "batches" in state:  # the whole run state: the rest continues as an uninterrupted run would
            batches.restore(state["batches"])
            set_rng_state(state["torch_rng"], device)
            ema = state["ema"]
        else:  # a checkpoint of an earlier version: its epoch, noise draws and loss average start afresh
            batches.rng.setstate(state["rng"])
            say("the checkpoint keeps no batch order or noise generator (an earlier version wrote it): the resumed "
                "run draws other batches and noise than an uninterrupted one would")
        say(f"resumed from {checkpoint}: step {step}, {elapsed / 60:.1f} min trained")
    total_s = cfg.minutes * 60 if cfg.minutes is not None else None

    def frac() -> float:
        if total_s is not None:
            return elapsed / total_s
        return step / cfg.steps

    def save_ckpt(finished: bool = False) -> None:
        """`finished`: training ran to its budget (a rerun without --resume may then replace the checkpoint)."""
        if checkpoint is None:
            return
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint.with_suffix(".tmp")
        torch.save({"draft": draft.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "curve": curve, "rng": batches.rng.getstate(), "config": asdict(cfg),
                    "batches": batches.state(), "torch_rng": rng_state(device), "ema": ema,
                    "finished": finished, **({"run": run_record()} if run_record is not None else {})}, tmp)
        tmp.replace(checkpoint)

    draft.train()
    bar = tqdm(total=cfg.steps if cfg.steps is not None else int(total_s), initial=step if cfg.steps else int(elapsed),
               desc="distill", unit="step" if cfg.steps else "s", disable=not progress)
    last_save = time.perf_counter()
    saved = step if checkpoint is not None else 0  # the step of the last checkpoint written
    stop = StopBetweenSteps(say)
    try:
        while frac() < 1.0 and not stop.asked:
            t0 = time.perf_counter()
            lr = _lr_at(cfg, step, frac())
            for g in opt.param_groups:
                g["lr"] = lr
            batch = {k: v.to(device) for k, v in batches.next().items()}
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16"):
                loss, stats = distill_loss(draft, batch, cfg, vocab_to_head, feat_scale)
            if not math.isfinite(stats["loss"]):  # before its update: the weights stay those of the last good step
                bar.close()
                raise TrainingDiverged(step + 1, "loss", stats["loss"], saved, checkpoint, lr)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
            if not math.isfinite(norm):  # clipping would turn it into NaN weights
                bar.close()
                raise TrainingDiverged(step + 1, "gradient norm", norm, saved, checkpoint, lr)
            opt.step()
            step += 1
            dt = time.perf_counter() - t0
            elapsed += dt
            ema = stats if ema is None else {k: 0.9 * ema[k] + 0.1 * v for k, v in stats.items()}
            if step % 10 == 0 or step == 1:
                curve.append({"step": step, "minutes": round(elapsed / 60, 2), "lr": lr,
                              **{k: round(v, 4) for k, v in ema.items()}})
            bar.update(1 if cfg.steps else int(elapsed) - bar.n)
            bar.set_postfix(loss=f"{ema['loss']:.3f}", acc1=f"{ema['acc1']:.3f}",
                            **({f"acc{cfg.unroll}": f"{ema[f'acc{cfg.unroll}']:.3f}"} if cfg.unroll > 1 else {}))
            if time.perf_counter() - last_save > cfg.save_every_s:
                save_ckpt()
                saved = step if checkpoint is not None else saved
                if on_checkpoint is not None:
                    draft.eval()
                    on_checkpoint(draft, {"step": step, "elapsed": elapsed, "curve": curve})
                    draft.train()
                last_save = time.perf_counter()
    except KeyboardInterrupt:  # a second Ctrl-C, or one that could not be deferred
        bar.close()
        raise TrainingInterrupted(saved, checkpoint) from None
    finally:
        stop.restore()
    bar.close()
    draft.eval()
    save_ckpt(finished=not stop.asked)
    if stop.asked:  # Ctrl-C: stopped between steps, the checkpoint just saved is whole
        if on_checkpoint is not None:
            on_checkpoint(draft, {"step": step, "elapsed": elapsed, "curve": curve, "interrupted": True})
        raise TrainingInterrupted(step if checkpoint is not None else 0, checkpoint)
    return {"steps": step, "train_minutes": round(elapsed / 60, 2), "feat_scale": round(feat_scale, 4),
            "curve": curve, "final": {k: round(v, 4) for k, v in (ema or {}).items()}}


def new_draft(target: CausalLM, preps: list[Prepared], cfg: TrainConfig, eos_ids: tuple[int, ...]) -> tuple[EagleDraft, dict]:
    head_ids, coverage = choose_head_ids(preps, target.cfg.vocab_size, cfg.head_vocab, always=eos_ids)
    draft = EagleDraft.init_from_target(target, head_ids, num_layers=cfg.layers,
                                        feature_layers=tuple(cfg.feature_layers)).float()
    draft.embed = [target.embed_tokens]
    for p in target.parameters():
        p.requires_grad_(False)
    if cfg.freeze_head:  # the draft then has to predict features the target's own head reads
        for p in (*draft.norm.parameters(), *draft.head.parameters()):
            p.requires_grad_(False)
    return draft, coverage
