"""A small Llama-family decoder (Llama, SmolLM, Mistral, Qwen2) with a slot-addressed KV cache.

Why our own and not `transformers`' module: the engine needs per-sequence positions and KV lengths in
one batched forward (continuous batching, ragged speculative acceptance) and a rollback that is just
"set the length back". The cache buffers are allocated once; nothing on the decode path changes shape
except the number of tokens fed.

Keys written at positions >= a sequence's committed length are stale draft state; the mask lets a
query at position p see keys 0..p only, and every position <= p has been rewritten for the current
sequence before anyone can read it, so rolling back never needs to clear memory.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from serving.kernels import decode_attention

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ACTIVATIONS = ("silu", "swish")  # transformers' names of the same function, x * sigmoid(x)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# optional fields whose null transformers refuses (null num_key_value_heads and head_dim mean their defaults)
NULL_REFUSED = ("model_type", "hidden_act", "rms_norm_eps", "rope_theta", "max_position_embeddings",
                "tie_word_embeddings", "attention_bias")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """A rope frequency rescale of Hugging Face's `rope_parameters` / `rope_scaling` (what `rope_tables` applies).
    linear: every frequency / factor. llama3 (Llama 3.1+): wavelengths shorter than original_max_position /
    high_freq_factor kept, longer than original_max_position / low_freq_factor divided by factor, in between
    interpolated."""

    rope_type: str  # linear | llama3
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-5
    rope_theta: float = 10_000.0
    max_position: int = 2048
    # the config.json field that set max_position: errors about the context name it, since a sliding_window
    # shorter than max_position_embeddings is the limit then and no other setting lifts it
    max_position_source: str = "max_position_embeddings"
    tie_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has biases on q, k, v
    model_type: str = "llama"
    rope_scaling: RopeScaling | None = None  # None = plain rope

    @classmethod
    def from_hf(cls, cfg: dict, source: str | Path | None = None) -> ModelConfig:
        """The engine's config from a Hugging Face config.json (`source`: the model directory, named in errors).
        Refuses what the torch engine does not compute as the model does, rather than run it differently."""
        where = f"{source}: " if source is not None else ""
        # null in config.json: transformers reads a null num_key_value_heads as plain multi-head attention and a
        # null head_dim as hidden_size // heads (what their absence means); a null in any other field it refuses
        nulls = [k for k in NULL_REFUSED if k in cfg and cfg[k] is None]
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        nulls += [f"{'rope_parameters' if cfg.get('rope_parameters') else 'rope_scaling'}.{k}" for k in
                  ("rope_theta", "factor", "low_freq_factor", "high_freq_factor") if k in rope and rope[k] is None]
        if nulls:
            raise ValueError(f"{where}config.json has {', '.join(nulls)} null: give {'each' if len(nulls) > 1 else 'it'}"
                             " a value, or leave it out for its default")
        model_type = cfg.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"{where}model_type {model_type!r} is not supported by the torch engine "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if cfg.get("quantization_config"):
            raise ValueError(f"{where}model config still carries a quantization_config; convert it to plain weights")
        if model_type == "llama" and cfg.get("attention_bias"):
            raise ValueError(f"{where}attention_bias true is not supported by the torch engine for llama models: "
                             "its o_proj has no bias (biases on q, k, v alone, as Qwen2 has, are)")
        if model_type == "llama" and cfg.get("mlp_bias"):  # transformers' other families have no such setting
            raise ValueError(f"{where}mlp_bias true is not supported by the torch engine: its MLP's gate, up and "
                             "down projections have no bias")
        act = cfg.get("hidden_act", "silu")
        if act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"{where}hidden_act {act!r} in config.json is not supported by the torch engine "
                             "(its MLP is SiLU-gated: hidden_act 'silu')")
        max_position, source = cfg.get("max_position_embeddings", 2048), "max_position_embeddings"
        window = sliding_window(cfg)
        if window is not None and window < max_position:
            # The torch engine attends to the whole context. Up to `window` tokens that is exactly what sliding
            # attention computes (no key is yet out of the window), so the usable context is capped there:
            # prompts longer are refused and answers end at it, rather than run differently past it.
            max_position, source = window, "sliding_window"
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10_000.0))
        missing = [k for k in REQUIRED_FIELDS if cfg.get(k) is None]
        if missing:
            raise ValueError(f"{where}config.json has no {', '.join(missing)}")
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,  # absent or null: one kv head per query head
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            max_position=max_position,
            max_position_source=source,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            model_type=model_type,
            rope_scaling=rope_scaling(rope, cfg, where),
        )


def sliding_window(cfg: dict) -> int | None:
    """The attention window a Hugging Face config asks for, None for full attention. Qwen2 configs carry a
    sliding_window that applies only with use_sliding_window (or layers typed 'sliding_attention')."""
    window = cfg.get("sliding_window")
    if window is None:
        return None
    if cfg.get("model_type") == "qwen2" and not cfg.get("use_sliding_window") and \
            "sliding_attention" not in (cfg.get("layer_types") or ()):
        return None
    return int(window)


def rope_scaling(rope: dict, cfg: dict, where: str = "") -> RopeScaling | None:
    """The rope rescale of a config's rope_parameters / rope_scaling dict; None for plain rope."""
    rope_type = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
    if rope_type in ("default", None):
        return None
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{where}rope scaling {rope_type!r} is not supported by the torch engine "
                         f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    try:
        if rope_type == "linear":
            return RopeScaling("linear", float(rope["factor"]))
        return RopeScaling("llama3", float(rope["factor"]), float(rope["low_freq_factor"]),
                           float(rope["high_freq_factor"]),
                           int(rope.get("original_max_position_embeddings") or cfg["max_position_embeddings"]))
    except KeyError as exc:
        raise ValueError(f"{where}rope scaling {rope_type!r} in config.json has no {exc.args[0]}") from None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (max_position, head_dim), float32 (HF's rotate-half convention)."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    if cfg.rope_scaling is not None:
        inv_freq = scaled_inv_freq(inv_freq, cfg.rope_scaling)
    freqs = torch.outer(torch.arange(cfg.max_position, dtype=torch.float32), inv_freq)  # (P, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (P, D)
    return emb.cos(), emb.sin()


def scaled_inv_freq(inv_freq: torch.Tensor, rs: RopeScaling) -> torch.Tensor:
    """Rope frequencies (D/2,) rescaled as transformers' `linear` and `llama3` rope types do."""
    if rs.rope_type == "linear":
        return inv_freq / rs.factor
    low_freq_wavelen = rs.original_max_position / rs.low_freq_factor  # longer wavelengths: divided by factor
    high_freq_wavelen = rs.original_max_position / rs.high_freq_factor  # shorter ones: kept
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rs.factor, inv_freq)
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled  # in between: interpolated
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, D); cos/sin: (B, 1, T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class KVCache:
    """Per-layer K and V buffers of shape (slots, kv_heads, max_len, head_dim), allocated once.

    `positions` (max_len unless given) is how many of the max_len indices are positions a token may sit at (and
    the rope table holds); the indices past them are spare room for a token tree's nodes, which take indices
    past the sequence until the accepted path is compacted but sit at their depths' positions."""

    def __init__(self, cfg: ModelConfig, num_layers: int, slots: int, max_len: int, dtype: torch.dtype,
                 positions: int | None = None):
        shape = (slots, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.slots = slots
        self.max_len = max_len
        self.positions = max_len if positions is None else positions


@dataclass(slots=True)
class ForwardBatch:
    """Where the tokens of one forward go: which cache slot, which positions, how far keys are visible."""

    slots: torch.Tensor  # (B,) cache slot per sequence
    positions: torch.Tensor  # (B, T) absolute position of each token
    kv_len: int  # keys to read: max over the batch of (last position + 1)
    mask: torch.Tensor | None  # (B, 1, T, kv_len) True = may attend; None = plain causal, slot-contiguous
    slot_view: slice | None  # the cache rows read as a view: the slots, or their span (see rows); None = gather
    write_at: torch.Tensor | None = None  # (B, T) cache index of each token's key; None = its position
    rows: torch.Tensor | None = None  # (B,) each sequence's row in the slot_view span; None = rows 0..B-1


# slots that are not one ascending run are read as the span of cache rows between the lowest and the highest (a
# view, with a query of zeros for each row no sequence uses) while the span is at most this many times the batch;
# beyond it the rows are gathered (a copy of every key of the batch, each layer: at 32 sequences that copy was
# 40% of a decode step on a 2-core CPU)
SPAN_READ_MAX = 2


def slot_layout(slots: list[int], mask: torch.Tensor) -> tuple[slice | None, torch.Tensor | None, torch.Tensor]:
    """How a forward reads the cache rows of `slots` given the batch's mask (B, 1, T, L): (slot_view, rows,
    mask). One ascending run of slots: a view, rows None. Scattered slots within a span of at most
    SPAN_READ_MAX x the batch: the span as a view, each sequence's row in it, and the mask widened to the
    span (rows no sequence uses see key 0 only, so their softmax stays finite). Otherwise (None, None, mask):
    gather."""
    lo, hi = min(slots), max(slots)
    if slots == list(range(lo, lo + len(slots))):
        return slice(lo, lo + len(slots)), None, mask
    span = hi - lo + 1
    if span > SPAN_READ_MAX * len(slots) or len(set(slots)) != len(slots):
        return None, None, mask
    rows = torch.tensor(slots) - lo
    wide = torch.zeros((span, *mask.shape[1:]), dtype=torch.bool)
    wide[..., 0] = True
    wide[rows] = mask
    return slice(lo, hi + 1), rows, wide


SMALL_T = 16  # decode / verify widths: the kernel is chosen per width by measurement (serving/kernels.py)


@functools.lru_cache(maxsize=4)
def causal_mask(T: int, kv_len: int) -> torch.Tensor:
    """(T, kv_len) bool: the T queries are the last T of kv_len positions, causal among themselves. Built
    once per forward shape, not once per layer (every layer of a forward asks for the same one)."""
    return torch.ones(T, kv_len, dtype=torch.bool).tril(kv_len - T)


def attend(kernel: str, q, keys, values, mask, kv_len: int) -> torch.Tensor:
    """Attention for a few query positions by the named kernel (serving/kernels.py DECODE_ATTENTION chooses
    per width by measurement). q (B, H, T, D); keys/values (B, Hkv, L, D); mask (B, 1, T, L) or None (the
    T queries are the last T of kv_len positions: causal among themselves). 'matmul' runs batched matmuls,
    'fused' torch's scaled_dot_product_attention; '-f32' multiplies float32 copies of the inputs and rounds
    the result back once (the more precise of the two forms, and on some CPUs the faster)."""
    dtype = q.dtype
    if kernel.endswith("-f32") and dtype != torch.float32:
        q, keys, values = q.float(), keys.float(), values.float()
    if kernel.startswith("fused"):
        T = q.shape[2]
        if mask is None and T > 1:
            mask = causal_mask(T, kv_len)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    else:
        out = matmul_attention(q, keys, values, mask, kv_len)
    return out.to(dtype)


def matmul_attention(q, keys, values, mask, kv_len: int) -> torch.Tensor:
    """Attention for a few query positions (see `attend`) by batched matmuls, in the inputs' own dtype."""
    B, H, T, D = q.shape
    Hkv = keys.shape[1]
    G = H // Hkv  # query heads per kv head
    qg = q.reshape(B, Hkv, G * T, D)  # heads of one group share their keys
    if keys.dtype == torch.bfloat16 and keys.device.type == "cpu" and not keys.is_contiguous():
        # the CPU's bf16 batched matmul reads a strided slice of the cache (the first kv_len of max_len
        # positions) against its transpose several times slower than a packed copy of it: at 48 sequences
        # over 300 keys, 1.38 ms against 0.42 ms with the copy, a layer (float32 is faster strided)
        keys = keys.contiguous()
    scores = (qg @ keys.transpose(-1, -2)).float() * (D**-0.5)  # (B, Hkv, G*T, L)
    scores = scores.view(B, Hkv, G, T, kv_len)
    if mask is None:
        if T > 1:
            scores = scores.masked_fill(~causal_mask(T, kv_len), float("-inf"))
    else:
        scores = scores.masked_fill(~mask.view(B, 1, 1, T, kv_len), float("-inf"))
    probs = scores.softmax(-1).to(values.dtype).view(B, Hkv, G * T, kv_len)
    return (probs @ values).view(B, H, T, D)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, cache: KVCache, fb: ForwardBatch) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        ck, cv = cache.k[self.layer], cache.v[self.layer]
        if fb.slot_view is not None and fb.mask is None:
            # one sequence per slot, same start position for all: contiguous write
            start = int(fb.positions[0, 0])
            ck[fb.slot_view, :, start : start + T] = k
            cv[fb.slot_view, :, start : start + T] = v
        else:
            idx_slot = fb.slots[:, None]  # (B, 1) broadcast with positions (B, T)
            at = fb.positions if fb.write_at is None else fb.write_at
            ck[idx_slot, :, at] = k.transpose(1, 2)  # (B, T, Hkv, D)
            cv[idx_slot, :, at] = v.transpose(1, 2)
        if fb.slot_view is not None:
            keys, values = ck[fb.slot_view, :, : fb.kv_len], cv[fb.slot_view, :, : fb.kv_len]
        else:
            keys, values = ck[fb.slots, :, : fb.kv_len], cv[fb.slots, :, : fb.kv_len]  # (B, Hkv, L, D)

        if fb.rows is not None:  # scattered slots read as their span: each query goes to its sequence's row
            wide = q.new_zeros((keys.shape[0], *q.shape[1:]))
            wide[fb.rows] = q
            q = wide
        if T <= SMALL_T:
            # which kernel serves decode widths is a CPU measurement; elsewhere (a GPU) they take the matmuls
            kernel = (decode_attention(q.dtype, T, fb.mask is not None, keys.shape[0] > 1)
                      if q.device.type == "cpu" else "matmul")
            out = attend(kernel, q, keys, values, fb.mask, fb.kv_len)
        elif fb.mask is None:
            # queries are the last T positions of a kv_len-long sequence: causal within them
            if fb.kv_len > T:
                mask = causal_mask(T, fb.kv_len)
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
            else:
                out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=fb.mask, enable_gqa=True)
        if fb.rows is not None:
            out = out[fb.rows]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache, fb) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, fb)
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    """Decoder-only LM. `forward(tokens, fb, cache, num_layers=N)` runs the first N layers only
    (early-exit self-speculation shares these weights with its own cache)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def new_cache(self, slots: int, max_len: int, num_layers: int | None = None, spare: int = 0) -> KVCache:
        """A cache of `max_len` positions (at most the model's max_position: no token sits past the rope
        table) and `spare` indices past them, not clamped: a token tree's nodes (see `tree_batch`), and the
        padding columns of the batch's widest tree, take indices past the sequence that are not positions."""
        n = num_layers or self.cfg.num_layers
        positions = min(max_len, self.cfg.max_position)
        return KVCache(self.cfg, n, slots, positions + spare, self.lm_head.weight.dtype, positions=positions)

    def forward(
        self,
        tokens: torch.Tensor,  # (B, T)
        fb: ForwardBatch,
        cache: KVCache,
        *,
        num_layers: int | None = None,
        last_only: bool = False,
        at: torch.Tensor | None = None,
        return_hidden: bool = False,
        feature_layers: tuple[int, ...] | None = None,
    ):
        """Logits (B, T, V) float32; (B, 1, V) for the last position with `last_only`, or for position
        at[b] of each sequence with `at` (B,) (ragged feeds whose real tokens end at different places).
        With `return_hidden`: (logits, h) where h (B, T, C) is the last block's output before the final
        norm (the features a feature-level draft reads), or with `feature_layers` the outputs of those
        blocks side by side, (B, T, C * len(feature_layers)) (a fused-feature draft's input, EAGLE-3)."""
        x = self.embed_tokens(tokens)  # (B, T, C)
        cos = self.rope_cos[fb.positions].unsqueeze(1).to(x.dtype)  # (B, 1, T, D)
        sin = self.rope_sin[fb.positions].unsqueeze(1).to(x.dtype)
        kept = []
        for i, block in enumerate(self.layers[: num_layers or self.cfg.num_layers]):
            x = block(x, cos, sin, cache, fb)
            if feature_layers and i in feature_layers:
                kept.append(x)
        hidden = torch.cat(kept, dim=-1) if feature_layers else x
        if last_only:
            x = x[:, -1:]
        elif at is not None:
            x = x[torch.arange(x.shape[0]), at].unsqueeze(1)  # (B, 1, C)
        logits = self.lm_head(self.norm(x)).float()  # (B, T, V)
        return (logits, hidden) if return_hidden else logits


def contiguous_batch(slot0: int, batch: int, start: int, num_tokens: int) -> ForwardBatch:
    """All sequences in slots slot0..slot0+batch-1 at the same length `start`: no mask needed."""
    positions = torch.arange(start, start + num_tokens).expand(batch, num_tokens)
    return ForwardBatch(
        slots=torch.arange(slot0, slot0 + batch),
        positions=positions,
        kv_len=start + num_tokens,
        mask=None,
        slot_view=slice(slot0, slot0 + batch),
    )


def ragged_batch(slots: list[int], starts: list[int], num_tokens: int, limit: int | None = None) -> ForwardBatch:
    """Sequences at different lengths: each feeds `num_tokens` tokens from its own start position.

    A row with fewer real tokens than `num_tokens` is padded, and near the end of the window its padding runs
    past the cache (and the rope table) that its real tokens fit: with `limit` (the cache's length) positions
    are clamped to limit - 1. Callers keep every real token below that last index (the engine's window leaves
    positions spare, and a draft model has at least the window's positions: serving.worker.load refuses one
    with fewer), so only padding lands there: its key is garbage no real query sees (the mask shows a
    query the keys up to its own position) and the next real token written there replaces it."""
    starts_t = torch.tensor(starts)
    positions = starts_t[:, None] + torch.arange(num_tokens)  # (B, T)
    if limit is not None:
        positions = positions.clamp(max=limit - 1)
    kv_len = int(positions.max()) + 1
    keys = torch.arange(kv_len)
    mask = (keys[None, None, :] <= positions[:, :, None]).unsqueeze(1)  # (B, 1, T, L)
    view, rows, mask = slot_layout(slots, mask)
    return ForwardBatch(slots=torch.tensor(slots), positions=positions, kv_len=kv_len, mask=mask, slot_view=view,
                        rows=rows)


def tree_batch(slots: list[int], starts: list[int], depths: torch.Tensor, visible: torch.Tensor) -> ForwardBatch:
    """Tree nodes after each sequence's first `starts[b]` cached positions (target verification, tree drafting).

    The tree's nodes so far take cache indices starts[b] + 0..S-1 and this forward feeds the last T of them
    (visible is (B, T, S)). Node t sits at position starts[b] + depths[b, t] (siblings share a position) but
    its key is written at its own index, so no two nodes collide. It sees every cached key before starts[b]
    and, among the S nodes, those with visible[b, t, j] True (its ancestors and itself). After verification
    the accepted path is moved to consecutive indices (`compact_path`).

    A row whose tree is smaller than the batch's widest is padded, and its padding columns are written at
    starts[b] + their index like its nodes: the cache needs S - 1 indices past any sequence's last position,
    however near the window's end it is (`CausalLM.new_cache`'s `spare`). Their positions are starts[b] +
    depths[b, t] (0 for padding), so the rope table is never read past a real node's position."""
    B, T, S = visible.shape
    starts_t = torch.tensor(starts)
    kv_len = int(starts_t.max()) + S
    keys = torch.arange(kv_len)
    mask = (keys[None, None, :] < starts_t[:, None, None]).expand(B, T, kv_len).clone()  # (B, T, L)
    for b, s in enumerate(starts):
        mask[b, :, s : s + S] = visible[b]
    view, rows, wide = slot_layout(slots, mask.unsqueeze(1))
    return ForwardBatch(slots=torch.tensor(slots), positions=starts_t[:, None] + depths, kv_len=kv_len, mask=wide,
                        slot_view=view, write_at=starts_t[:, None] + torch.arange(S - T, S), rows=rows)


def compact_path(cache: KVCache, slot: int, start: int, path: list[int], num_layers: int | None = None) -> None:
    """After a tree forward from `start`: move the keys and values of tree nodes `path` (indices into the
    tree, root excluded, in order of depth) to cache indices start+1, start+2, ... right after the root.
    A node's index is at least its depth, so no move overwrites a key a later move still reads."""
    if not path or path == list(range(1, len(path) + 1)):
        return  # already in place (a chain, or nothing accepted)
    src = torch.tensor(path) + start
    dst = torch.arange(1, len(path) + 1) + start
    for layer in range(num_layers or len(cache.k)):
        cache.k[layer][slot, :, dst] = cache.k[layer][slot, :, src]
        cache.v[layer][slot, :, dst] = cache.v[layer][slot, :, src]


def check_model_dir(model_dir: Path) -> tuple[ModelConfig, list[Path]]:
    """What `load_causal_lm` checks by reading files alone, no weights: a config the engine computes and weight
    files present. Its config and weight files; ValueError naming the directory or file otherwise."""
    from serving.models import WEIGHTS_WANTED, read_config, weight_files

    cfg = ModelConfig.from_hf(read_config(model_dir), source=model_dir)
    files = weight_files(model_dir)
    if not files:
        raise ValueError(f"{model_dir} has no weights ({WEIGHTS_WANTED})")
    return cfg, files


def load_causal_lm(model_dir: str | Path, dtype: torch.dtype) -> CausalLM:
    """Load a Hugging Face model directory (config.json + *.safetensors, or transformers' older pytorch_model.bin,
    whole or sharded: `serving.models.weight_files`) into `CausalLM`."""
    model_dir = Path(model_dir)
    cfg, files = check_model_dir(model_dir)
    with torch.device("meta"):
        model = CausalLM(cfg)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(read_weight_file(f))
    state = {k.removeprefix("model."): v.to(dtype) for k, v in state.items()}
    if "lm_head.weight" not in state:
        if not cfg.tie_embeddings:
            raise ValueError(f"{model_dir}: weights have no lm_head.weight and embeddings are not tied")
        state["lm_head.weight"] = state["embed_tokens.weight"]
    check_shapes(model, state, model_dir)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not m.startswith("rope_")]
    unexpected = [u for u in unexpected if "rotary_emb" not in u]
    if missing or unexpected:
        raise ValueError(f"{model_dir}: weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    cos, sin = rope_tables(cfg)
    model.rope_cos, model.rope_sin = cos, sin
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.eval()
    return model


def read_weight_file(path: Path) -> dict[str, torch.Tensor]:
    """One weight file's tensors by name: a safetensors file, or a torch.save'd state dict (pytorch_model.bin)
    read as tensors only (weights_only: no code in the file runs), memory-mapped where its format allows (the zip
    format torch has written since 1.6; the legacy one is read whole). ValueError naming the file where it does
    not read as either."""
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except SafetensorError as exc:  # truncated, or not a safetensors file at all
            raise ValueError(f"{path}: not a readable safetensors file ({exc})") from None
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # the legacy format: no mmap
    except Exception as exc:  # noqa: BLE001 - torch.load's many ways to fail on a damaged file (zip, pickle, EOF)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path}: not a readable PyTorch weights file ({first})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ValueError(f"{path}: not a state dict of named tensors")
    return state


def check_shapes(model: CausalLM, state: dict[str, torch.Tensor], model_dir: Path) -> None:
    """Refuse weights whose shapes are not those the config implies (a config.json of another size than its
    weights: vocab_size 50000 over a [49152, 64] embed_tokens.weight), naming the first such tensor. Left to
    load_state_dict, it was a multi-line RuntimeError that the CLI cut to 'Error(s) in loading state_dict'."""
    want = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    wrong = [(name, tuple(state[name].shape), shape) for name, shape in want.items()  # in the model's order
             if name in state and tuple(state[name].shape) != shape]
    if wrong:
        name, got, implied = wrong[0]
        more = f"; {len(wrong) - 1} more {'differs' if len(wrong) == 2 else 'differ'}" if len(wrong) > 1 else ""
        raise ValueError(f"{model_dir}: weights do not match the config ({name} is {list(got)} in the weights, "
                         f"the config implies {list(implied)}{more})")


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

