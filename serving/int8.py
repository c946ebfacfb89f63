"""Weight-only int8 linears for drafts: the draft's cost ratio c is mostly its weights streaming in.

A one-token draft forward is memory-bound like the target's: the bundled draft streams ~18 MB of bf16
weights (half of it the 8,192-token head) for every token it proposes, about 4 draft forwards per step.
Keeping those weights as int8 with one scale per output channel,

    w[o, i] ~ scale[o] * q[o, i],   q = round(w / scale) in [-127, 127],   scale[o] = max_i |w[o, i]| / 127

halves the bytes, and the CPU kernel multiplies the activations (kept in their dtype) by q directly,
applying the scale to the result. Only drafts are quantized: a draft only proposes, the target verifies
with its own weights, so what the engine emits is unchanged (greedy: the target's argmax; sampling:
rejection sampling against the quantized draft's own q is exact for any q). The target never is.

The choice is made by measurement, per dtype and per row count, like the packed kernels
(serving/kernels.py): int8 serves the row counts at which it was clearly faster than what the draft's
linear would otherwise run (packed or plain), the original linear the rest. `SPECFINOPS_DRAFT_INT8`
(`auto` | `on` | `off`) overrides the measurement. The measured row count is remembered per machine
(serving/tuning.py, `SPECFINOPS_TUNING`), so every run on a machine quantizes alike.
"""

from __future__ import annotations

import functools
import logging
import time

import torch
from torch import nn

from serving.kernels import FASTER, PackedLinear, _as_linear, _plan, _setting
from serving.tuning import remembered

log = logging.getLogger(__name__)

# The CPU kernel (torch 2.13) reads every input row with 64-byte-aligned vector loads: a row that does
# not start on a 64-byte boundary gave wrong numbers (bf16 width 40: the second row starts 80 bytes in)
# or killed the process (width 100; and a width-1728 row that was a view 16 bytes into a buffer). So only
# widths whose bf16 rows are whole multiples of 64 bytes are quantized (every width of a LLaMA-style
# model is), and an input that is a view at an unaligned address is copied first (fresh CPU tensors are
# 64-byte aligned).
INT8_BLOCK = 32
ALIGN = 64  # bytes
QUANT_DTYPES = (torch.bfloat16, torch.float32)
ROWS = (1, 2, 5, 20)  # draft forwards feed 1 row per sequence, catch-ups 1..K+1, batches B times that
SHAPES = ((8192, 576), (1536, 576), (576, 1536), (576, 1152))  # a small draft's head, MLP and fc
# A draft step: the target's forward has just streamed ~270 MB of weights through the CPU's caches, then
# the draft runs its few MB of weights K times back to back. Timed that way (EVICT_MB read before each
# timed step), int8 took 0.65 of the packed bf16 kernel's time at 1 row on an AVX-512 EPYC (the real
# draft forward: 2.16 -> 1.72 ms), and lost from 5 rows on.
EVICT_MB = 64
DRAFT_FORWARDS = 4
KERNEL_TOLERANCE = 0.01  # the kernel against the same product in float32 (bf16 rounding: ~0.003)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (out, in), scale (out,) in the weight's dtype) with weight ~ scale[:, None] * q."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.to(weight.dtype)


def _int8_mm(x2d: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int8pack_mm(x2d, q, scale)


def supported(linear: nn.Module) -> bool:
    weight = getattr(linear, "weight", None)
    return (weight is not None and weight.dim() == 2 and weight.dtype in QUANT_DTYPES
            and weight.shape[1] % INT8_BLOCK == 0 and hasattr(torch.ops.aten, "_weight_int8pack_mm"))


class Int8Linear(nn.Module):
    """A linear whose weight is also kept as per-channel int8, used for inputs of up to `max_rows` rows;
    larger inputs (and anything that wants gradients) go through `fallback`, the linear it replaced.
    `weight` and `bias` stay the original parameters, so readers of `.weight` see no difference."""

    def __init__(self, fallback: nn.Module, max_rows: int):
        super().__init__()
        if not supported(fallback):
            raise ValueError(f"int8 needs a 2-D bf16/float32 weight whose input width is a multiple of "
                             f"{INT8_BLOCK}, got {tuple(fallback.weight.shape)} {fallback.weight.dtype}")
        self.fallback = fallback
        self.max_rows = max_rows
        self.q, self.scale = quantize_rows(fallback.weight)

    @property
    def weight(self) -> torch.Tensor:
        return self.fallback.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.fallback.bias

    @property
    def in_features(self) -> int:
        return self.q.shape[1]

    @property
    def out_features(self) -> int:
        return self.q.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > self.max_rows or rows == 0 or x.dtype != self.scale.dtype or (
                torch.is_grad_enabled() and self.weight.requires_grad):
            return self.fallback(x)
        x2d = x.reshape(rows, self.in_features)
        if not x2d.is_contiguous() or x2d.data_ptr() % ALIGN:
            x2d = x2d.clone(memory_format=torch.contiguous_format)  # the kernel's aligned loads (see ALIGN)
        y = _int8_mm(x2d, self.q, self.scale)  # (rows, out)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def kernel_error(self, x: torch.Tensor) -> float:
        """Worst |kernel - float32 product with the dequantized weight| on `x` (rows, in), relative to the
        largest output: the kernel's own error, apart from what quantizing the weight changed."""
        with torch.inference_mode():
            exact = x.float() @ (self.q.float() * self.scale.float()[:, None]).T
            got = _int8_mm(x, self.q, self.scale).float()
        return float((got - exact).abs().max() / exact.abs().max().clamp(min=1e-12))


def _baseline(weight: torch.Tensor) -> nn.Module:
    """The linear a draft would run without int8: packed where the packed kernel was measured faster."""
    lin = _as_linear(weight)
    rows, span = _plan(lin)
    return PackedLinear(lin, rows, span) if rows is not None or span is not None else lin


@functools.cache
def int8_max_rows(dtype: torch.dtype = torch.bfloat16) -> int:
    """Up to how many input rows a `dtype` draft linear runs from int8 weights here (0: never).

    Measured once per dtype over a draft's shapes: the largest row count up to which int8 was clearly
    faster (FASTER) at every measured count; only where the kernel gives the expected numbers."""
    setting = _setting("SPECFINOPS_DRAFT_INT8")
    if setting == "off" or dtype not in QUANT_DTYPES or not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return 0
    gen = torch.Generator().manual_seed(0)

    def candidates() -> tuple[list[nn.Module], list[nn.Module]] | None:
        """(int8, baseline) linears of a draft's shapes, or None where the kernel strays or is missing."""
        try:
            plain = [_baseline(torch.randn(n, k, generator=gen).to(dtype)) for n, k in SHAPES]
            quant = [Int8Linear(p, max(ROWS)) for p in plain]
            for lin in quant:
                for m in ROWS:
                    if lin.kernel_error(torch.randn(m, lin.in_features, generator=gen).to(dtype)) > KERNEL_TOLERANCE:
                        return None
        except (RuntimeError, NotImplementedError):
            return None  # no int8 kernel for this dtype in this build
        return quant, plain

    if setting == "on":
        return max(ROWS) if candidates() is not None else 0

    def race() -> int:
        found = candidates()
        if found is None:
            return 0
        quant, plain = found
        evict = torch.ones(EVICT_MB << 18)  # float32
        best = 0
        for m in ROWS:
            xs = {k: torch.randn(m, k, generator=gen).to(dtype) for _, k in SHAPES}
            t_int8, t_plain = _step_race(quant, plain, xs, evict)
            if t_int8 >= FASTER * t_plain:
                break
            best = m
        return best

    # near parity the race goes either way from one process to the next, and int8 changes what the
    # draft proposes: remembered per machine, so repeated runs record the same drafter (serving/tuning.py);
    # the key holds the CPU flags and torch build the kernel check passed on, so a remembered value skips it
    # (quantize_draft still checks every layer it quantizes)
    return remembered(f"int8_max_rows/{str(dtype).removeprefix('torch.')}", race)


def _step_race(quant: list[nn.Module], plain: list[nn.Module], xs: dict[int, torch.Tensor], evict: torch.Tensor,
               reps: int = 4, rounds: int = 7) -> tuple[float, float]:
    """Best mean time of a draft step's linears (DRAFT_FORWARDS passes over the layers) with each
    candidate, after `evict` is read as a target forward would; the candidates take turns (see _race)."""
    def step(mods) -> float:
        float(evict.sum())  # not timed: what the target's forward does to the caches
        t = time.perf_counter()
        for _ in range(DRAFT_FORWARDS):
            for mod in mods:
                mod(xs[mod.in_features])
        return time.perf_counter() - t

    best = {"int8": float("inf"), "plain": float("inf")}
    with torch.inference_mode():
        step(quant), step(plain)  # warm-up
        for r in range(rounds):
            for name in (("int8", "plain") if r % 2 == 0 else ("plain", "int8")):
                mods = quant if name == "int8" else plain
                best[name] = min(best[name], sum(step(mods) for _ in range(reps)) / reps)
    return best["int8"], best["plain"]


def quantize_draft(model: nn.Module) -> int:
    """Give the linears of a draft model (plain or packed) an int8 copy of their weights, used up to the
    row count at which int8 measured faster here; returns how many. Layers whose input width the kernel
    cannot take, or where the kernel strays from the same product in float32 on a check input, are left
    alone. What quantizing costs in acceptance is measured end to end (`calibrate`, `bench`).
    Call it on drafts only, once their weights are final (after `pack_for_inference`)."""
    gen = torch.Generator().manual_seed(0)
    done = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) not in (nn.Linear, PackedLinear) or not supported(child):
                continue
            rows = int8_max_rows(child.weight.dtype)
            if rows == 0:
                continue
            quant = Int8Linear(child, rows)
            check = torch.randn(4, quant.in_features, generator=gen).to(child.weight.dtype)
            if quant.kernel_error(check) > KERNEL_TOLERANCE:
                log.warning("draft layer %s keeps its %s weights: the int8 kernel strays", name, child.weight.dtype)
                continue
            setattr(parent, name, quant)
            done += 1
    return done
