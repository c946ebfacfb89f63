"""CPU fast paths for the engine's decode-time kernels, each chosen by measurement once per process.

Decoding feeds a handful of tokens per forward, so a 135M-parameter model runs hundreds of tiny matrix
products per step and the per-call cost of the kernel decides the speed more than the arithmetic does.
Which kernel is cheapest depends on the CPU:

- **Pre-packed bf16 linears.** `F.linear` re-lays-out a bf16 weight for oneDNN on every call. Packing it
  once into oneDNN's blocked layout (what torch.compile's CPU freezing does) halved the cost of every
  decode-sized product on a Xeon with AMX (576x1536 at 1-20 rows: 80-100 us -> 35-55 us), with the same
  results. It is inference-only: a module that still needs gradients keeps `F.linear`.
- **Attention for a few queries.** On a CPU without AVX-512 plain batched matmuls beat the fused
  `scaled_dot_product_attention` for decode widths; on an AVX-512 Xeon the fused kernel won at every
  decode width (1 query over 300 keys: 129 us -> 28 us).

Each choice is made by timing both candidates on decode-sized inputs the first time it is asked for, and
only where the candidate gives the same numbers. `SPECFINOPS_PACKED_LINEAR` and
`SPECFINOPS_DECODE_ATTENTION` (`auto` | `on` | `off`) override the measurement.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

PACK_BATCH_HINT = 8  # oneDNN picks its blocking for about this many rows; decode feeds 1-40
FASTER = 0.85  # a fast path must take at most this share of the default's time


def _setting(name: str) -> str:
    value = os.environ.get(name, "auto").strip().lower()
    if value not in ("auto", "on", "off", "1", "0"):
        raise ValueError(f"{name} must be auto, on or off, got {value!r}")
    return {"1": "on", "0": "off"}.get(value, value)


def _seconds(fn: Callable[[], object], reps: int = 30) -> float:
    """Best-of-three mean time of `fn` (after a warm-up): robust to a busy neighbour."""
    with torch.inference_mode():
        for _ in range(3):
            fn()
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            best = min(best, (time.perf_counter() - t) / reps)
    return best


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def packed_linear_enabled() -> bool:
    """Whether bf16 linears run with pre-packed weights in this process (measured once)."""
    setting = _setting("SPECFINOPS_PACKED_LINEAR")
    if setting == "off" or not torch.backends.mkldnn.is_available():
        return False
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(1536, 576, generator=gen).to(torch.bfloat16)
    xs = [torch.randn(m, 576, generator=gen).to(torch.bfloat16) for m in (1, 5, 20)]
    try:
        packed = _pack(w)
        with torch.inference_mode():
            for x in xs:
                if not torch.allclose(_packed_linear(x, packed, None).float(), F.linear(x, w).float(), rtol=1e-2, atol=0.1):
                    return False
    except (RuntimeError, AttributeError, NotImplementedError):
        return False  # this build or CPU has no oneDNN bf16 linear
    if setting == "on":
        return True
    plain = sum(_seconds(lambda x=x: F.linear(x, w)) for x in xs)
    fast = sum(_seconds(lambda x=x: _packed_linear(x, packed, None)) for x in xs)
    return fast < FASTER * plain


@functools.cache
def fused_decode_attention() -> bool:
    """Whether attention for a few queries uses `scaled_dot_product_attention` (else plain matmuls)."""
    setting = _setting("SPECFINOPS_DECODE_ATTENTION")
    if setting != "auto":
        return setting == "on"
    from serving.llama import small_attention  # the matmul path lives with the model

    gen = torch.Generator().manual_seed(0)
    plain = fast = 0.0
    for B, T, L in ((1, 1, 256), (1, 5, 256), (4, 5, 256)):
        q = torch.randn(B, 9, T, 64, generator=gen).to(torch.bfloat16)
        k = torch.randn(B, 3, L, 64, generator=gen).to(torch.bfloat16)
        v = torch.randn(B, 3, L, 64, generator=gen).to(torch.bfloat16)
        mask = (torch.arange(L)[None, :] <= (L - T + torch.arange(T))[:, None]).expand(B, 1, T, L)
        plain += _seconds(lambda q=q, k=k, v=v, m=mask, L=L: small_attention(q, k, v, m, L))
        fast += _seconds(lambda q=q, k=k, v=v, m=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True))
    return fast < FASTER * plain


class PackedLinear(nn.Module):
    """`nn.Linear` for inference whose bf16 weight is also kept pre-packed for oneDNN.

    `weight` and `bias` stay the module's parameters (state dicts, tied embeddings and readers of
    `.weight` see no difference); where gradients are wanted it falls back to `F.linear`."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = _pack(linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        return _packed_linear(x, self.packed, self.bias)


def pack_for_inference(model: nn.Module) -> int:
    """Swap the bf16 `nn.Linear`s of `model` for `PackedLinear` where that measured faster here;
    returns how many were swapped. Call it once, after the weights are final."""
    if not packed_linear_enabled():
        return 0
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)
