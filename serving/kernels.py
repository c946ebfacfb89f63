"""CPU fast paths for the engine's decode-time kernels, each chosen by measurement once per process.

Decoding feeds a handful of tokens per forward, so a 135M-parameter model runs hundreds of tiny matrix
products per step and the per-call cost of the kernel decides the speed more than the arithmetic does.
Which kernel is cheapest depends on the CPU:

- **Pre-packed linears.** `F.linear` re-lays-out a bf16 weight for oneDNN on every call. Packing it
  once into oneDNN's blocked layout (what torch.compile's CPU freezing does) halved the cost of every
  decode-sized product on a Xeon with AMX (576x1536 at 1-20 rows: 80-100 us -> 35-55 us), with the same
  results. On an AVX2-only EPYC the float32 products gained most: MKL's sgemm at a few rows cost nearly
  as much as at fifty (the 49152x576 LM head: 14 ms at 1 row, 38 ms at 5), oneDNN's packed kernel
  scaled with the rows (9 ms, 12 ms) while plain `F.linear` stayed best at a single row. So the choice is
  made per dtype and per row count: from how many rows on (if any) the packed kernel runs. Where
  oneDNN cannot pack bf16 (no AVX-512), a bf16 weight gets a float32 packed copy (its values widened
  exactly; products accumulate in float32 as a bf16 kernel's do, and round back to bf16): the emulated
  bf16 `F.linear` streams half the bytes and stays best at a few rows, the copy wins at many (batch-48
  decode step 1.20 -> 0.47 s there). It is inference-only: a module that still needs gradients keeps
  `F.linear`.
- **A bf16 kernel for CPUs that emulate bf16.** Where oneDNN cannot multiply bf16 (AVX2 only), torch's
  bf16 product costs about as much for every row as for the first, so a 5-token verification forward
  cost 1.9x a 1-token one on an AVX2-only EPYC (61 -> 116 ms). `serving/bf16_kernel.py` builds a small
  AVX2 kernel that reads each bf16 weight once per call and reuses it for every row (float32
  accumulation, rounded to bf16): 48 decoder-sized products at 5 rows 25 -> 15 ms. It is raced like the
  packed kernel, against whatever would run otherwise, at 1 to 64 rows; the rows where it wins use it.
- **Attention for a few queries.** On a CPU without AVX-512 plain batched matmuls beat the fused
  `scaled_dot_product_attention` for decode widths; on an AVX-512 Xeon the fused kernel won at every
  decode width (1 query over 300 keys: 129 us -> 28 us); on an AVX-512 EPYC it lost at 1 query and won
  at 5. Measured per dtype and per width: from how many queries on (if any) the fused kernel runs.
- **Matmul attention in float32.** On an AVX2-only EPYC (bf16 emulated), batched bf16 matmuls of
  decode shapes (one to nine query rows per head against a few hundred keys) took 1.4x (one query,
  256 keys) to 9x (nine queries, 800 keys) the time of the same products with q, keys and values
  widened to float32 and the result rounded back; the fused kernel was slower than the widened
  matmuls at one query. Measured per dtype, before the fused kernel's race (which then runs against
  the faster matmul form).

Each choice is made by timing both candidates on decode-sized inputs the first time it is asked for, and
only where the candidate gives the same numbers (the widened attention is the more precise of the two).
`SPECFINOPS_PACKED_LINEAR`, `SPECFINOPS_BF16_KERNEL`, `SPECFINOPS_DECODE_ATTENTION` and
`SPECFINOPS_ATTENTION_FLOAT32` (`auto` | `on` | `off`) override the measurement.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from serving.tuning import remembered

T = TypeVar("T")

log = logging.getLogger(__name__)

PACK_BATCH_HINT = 8  # oneDNN picks its blocking for about this many rows; decode feeds 1-40
FASTER = 0.85  # a fast path must take at most this share of the default's time


def _setting(name: str) -> str:
    value = os.environ.get(name, "auto").strip().lower()
    if value not in ("auto", "on", "off", "1", "0"):
        raise ValueError(f"{name} must be auto, on or off, got {value!r}")
    return {"1": "on", "0": "off"}.get(value, value)


def _race(fast: Callable[[], object], plain: Callable[[], object], reps: int = 30, rounds: int = 5) -> tuple[float, float]:
    """Best mean time of each candidate over `rounds` rounds in which they run in turn (after a warm-up).
    Timing one candidate and then the other lets a neighbour that is busy for a second slow only one of
    them, and the choice flipped from one process to the next on a shared VM (AR measured 15-20% slower
    in the processes whose one-row choice had flipped); taking turns makes such a slowdown hit both."""
    with torch.inference_mode():
        for fn in (fast, plain):
            for _ in range(3):
                fn()
        best = {fast: float("inf"), plain: float("inf")}
        for r in range(rounds):
            for fn in ((fast, plain) if r % 2 == 0 else (plain, fast)):
                t = time.perf_counter()
                for _ in range(reps):
                    fn()
                best[fn] = min(best[fn], (time.perf_counter() - t) / reps)
    return best[fast], best[plain]


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


PACKABLE = (torch.bfloat16, torch.float32)
ROWS = (1, 2, 5, 20)  # decode feeds 1 row (AR, one sequence) to ~40 (a batch verifying K+1 each)
SHAPES = ((1536, 576), (576, 1536), (576, 576))  # a small decoder's MLP and attention projections
TOLERANCE = {torch.bfloat16: (1e-2, 0.1), torch.float32: (1e-4, 1e-4)}
COPIES = 16  # of each shape, timed in turn


def _can_pack(dtype: torch.dtype) -> bool:
    try:
        _pack(torch.zeros(8, 8, dtype=dtype))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False  # this build or CPU has no oneDNN linear for this dtype (bf16 wants AVX-512 or AVX-NE)
    return True


@functools.cache
def pack_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The precision a `dtype` weight's packed copy is kept and multiplied in: `dtype` itself where
    oneDNN packs it; for bf16 on a CPU without bf16 instructions, float32 (the bf16 values widened
    exactly, products accumulated in float32 as a bf16 kernel does, the result rounded back to bf16);
    None where nothing can be packed."""
    if dtype not in PACKABLE or not torch.backends.mkldnn.is_available():
        return None
    if _can_pack(dtype):
        return dtype
    if dtype == torch.bfloat16 and _can_pack(torch.float32):
        return torch.float32
    return None


def _packed_call(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                 compute: torch.dtype) -> torch.Tensor:
    if x.dtype == compute:
        return _packed_linear(x, packed, bias)
    return _packed_linear(x.to(compute), packed, bias).to(x.dtype)


@functools.cache
def packed_linear_rows(dtype: torch.dtype = torch.bfloat16) -> int | None:
    """From how many input rows on a `dtype` linear runs pre-packed in this process (None: never).

    Measured once per dtype on decode-sized products: the packed kernel is used from the smallest
    measured row count at which it is clearly faster than `F.linear` and stays so at every larger one."""
    setting = _setting("SPECFINOPS_PACKED_LINEAR")
    compute = pack_dtype(dtype)
    if setting == "off" or compute is None:
        return None
    gen = torch.Generator().manual_seed(0)
    if not _gives_linear_numbers(lambda x, w, b: _packed_call(x, _pack(w.to(compute)), None, compute), dtype, ROWS, gen):
        return None
    if setting == "on":
        return 1
    # A forward streams every weight from memory once, so time a pass over more weights than a CPU cache
    # holds (~140 MB in float32), not one small product that stays cached: where memory is slow, a float32
    # copy of bf16 weights that wins in cache loses at a row or two.
    weights = [torch.randn(n, k, generator=gen).to(dtype) for _ in range(COPIES) for n, k in SHAPES]
    packed = [_pack(w.to(compute)) for w in weights]
    wins = {}
    for m in ROWS:
        xs = {k: torch.randn(m, k, generator=gen).to(dtype) for _, k in SHAPES}

        def plain(xs=xs):
            for w in weights:
                F.linear(xs[w.shape[1]], w)

        def fast(xs=xs):
            for w, p in zip(weights, packed, strict=True):
                _packed_call(xs[w.shape[1]], p, None, compute)

        t_fast, t_plain = _race(fast, plain, reps=3)
        wins[m] = t_fast < FASTER * t_plain
    return rows_from(wins)


def _gives_linear_numbers(product: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
                          dtype: torch.dtype, rows: tuple[int, ...], gen: torch.Generator, bias: bool = False) -> bool:
    """Whether `product(x, w, b)` equals `F.linear(x, w, b)` within `dtype`'s tolerance on decode shapes."""
    rtol, atol = TOLERANCE[dtype]
    with torch.inference_mode():
        for n, k in SHAPES:
            w = torch.randn(n, k, generator=gen).to(dtype)
            b = torch.randn(n, generator=gen).to(dtype) if bias else None
            for m in rows:
                x = torch.randn(m, k, generator=gen).to(dtype)
                got = product(x, w, b)
                if got.dtype != dtype or not torch.allclose(got.float(), F.linear(x, w, b).float(), rtol=rtol, atol=atol):
                    return False
    return True


def _as_linear(weight: torch.Tensor) -> nn.Linear:
    """An inference `nn.Linear` (no bias) around an existing weight, nothing else allocated."""
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype, device="meta")
    lin.weight = nn.Parameter(weight, requires_grad=False)
    return lin


def rows_from(wins: dict[int, bool]) -> int | None:
    """The smallest measured row count from which the packed kernel won at every larger one (None: it
    lost at the largest)."""
    first = None
    for m in sorted(wins, reverse=True):
        if not wins[m]:
            break
        first = m
    return first


KERNEL_ROWS = (1, 2, 3, 5, 20, 64)  # decode widths (AR 1, verifying K drafts K + 1) and a short prefill chunk


def rows_between(wins: dict[int, bool]) -> tuple[int, int | None] | None:
    """The row range a kernel measured at `wins` (row count -> won) runs for: from the smallest winning
    count through the run of wins that follows it, up to the next losing count (exclusive; None: no
    upper bound, it won at the largest). None where it never won."""
    counts = sorted(wins)
    first = next((m for m in counts if wins[m]), None)
    if first is None:
        return None
    for m in counts[counts.index(first):]:
        if not wins[m]:
            return first, m - 1
    return first, None


@functools.cache
def bf16_kernel_rows(dtype: torch.dtype = torch.bfloat16) -> tuple[int, int | None] | None:
    """For which input rows a `dtype` linear runs the C bf16 kernel in this process: (from, to) with
    `to` None for no upper bound, or None (never).

    Only for bf16 on a CPU without bf16 instructions, where the kernel builds, and only where it gives
    F.linear's numbers (bf16 tolerance). Measured on a pass over more weights than a CPU cache holds,
    at 1 to 64 rows, against what would run otherwise (F.linear or the packed copy, as
    `packed_linear_rows` chose): the rows where it is clearly faster (FASTER) use it."""
    from serving import bf16_kernel

    setting = _setting("SPECFINOPS_BF16_KERNEL")
    if setting == "off" or dtype != torch.bfloat16 or native_bf16():
        return None
    if not bf16_kernel.available():
        log.info("bf16 kernel not used: %s", bf16_kernel.unavailable_reason())
        return None
    gen = torch.Generator().manual_seed(0)
    if not _gives_linear_numbers(bf16_kernel.bf16_linear, dtype, KERNEL_ROWS, gen, bias=True):
        log.warning("bf16 kernel not used: its products differ from F.linear's here")
        return None
    if setting == "on":
        return 1, None
    rows = packed_linear_rows(dtype)
    weights = [torch.randn(n, k, generator=gen).to(dtype) for _ in range(COPIES) for n, k in SHAPES]
    current = [PackedLinear(_as_linear(w), rows) if rows is not None else _as_linear(w) for w in weights]
    wins = {}
    for m in KERNEL_ROWS:
        xs = {k: torch.randn(m, k, generator=gen).to(dtype) for _, k in SHAPES}

        def plain(xs=xs):
            for w, lin in zip(weights, current, strict=True):
                lin(xs[w.shape[1]])

        def fast(xs=xs):
            for w in weights:
                bf16_kernel.bf16_linear(xs[w.shape[1]], w)

        t_fast, t_plain = _race(fast, plain, reps=2, rounds=3)
        wins[m] = t_fast < FASTER * t_plain
    return rows_between(wins)


def _in_range(rows: int, span: tuple[int, int | None] | None) -> bool:
    return span is not None and rows >= span[0] and (span[1] is None or rows <= span[1])


@functools.cache
def widen_matmul_attention(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the matmul attention path multiplies `dtype` (not float32) inputs in float32: timed on a
    decode step of one sequence (1 query over 256 keys) and a masked batch of four verifying 4 drafts
    (5 queries each), both forms taking turns (`_race`)."""
    if dtype == torch.float32:
        return False
    setting = _setting("SPECFINOPS_ATTENTION_FLOAT32")
    if setting != "auto":
        return setting == "on"
    from serving.llama import causal_mask, matmul_attention

    gen = torch.Generator().manual_seed(0)
    L = 256
    shapes = []
    for B, T in ((1, 1), (4, 5)):
        q = torch.randn(B, 9, T, 64, generator=gen).to(dtype)
        k = torch.randn(B, 3, L, 64, generator=gen).to(dtype)
        v = torch.randn(B, 3, L, 64, generator=gen).to(dtype)
        shapes.append((q, k, v, causal_mask(T, L).expand(B, 1, T, L) if B > 1 else None))

    def wide():
        for q, k, v, m in shapes:
            out = matmul_attention(q.float(), k.float(), v.float(), m, L).to(dtype)
        return out

    def plain():
        for q, k, v, m in shapes:
            out = matmul_attention(q, k, v, m, L)
        return out

    def race() -> int:
        t_wide, t_plain = _race(wide, plain)
        return int(t_wide < FASTER * t_plain)

    # remembered per machine (serving/tuning.py): a choice that flips between processes changes the numerics
    return bool(remembered(f"attention_float32/{str(dtype).removeprefix('torch.')}", race))


ATTENTION_WIDTHS = (1, 2, 3, 5, 9)  # queries a decode forward feeds per sequence: AR 1, verifying K <= 8 drafts K + 1


def fused_attention_from(dtype: torch.dtype = torch.bfloat16, masked: bool = False, batched: bool = True) -> int | None:
    """From how many queries per sequence on attention over a decode-length cache runs the fused
    `scaled_dot_product_attention` (None: never; narrower forwards use plain batched matmuls).

    Measured per width and per call form, because AR feeds one query and verification K + 1, and the
    kernels rank differently at the two: on an AVX-512 EPYC, for one sequence, the fused kernel took
    1.8-2.2x the matmuls' time at 1 query and 0.63-0.94x at 2-9; through an explicit mask (`masked`: a
    ragged batch or a token tree) it took 1.2-3.6x at every width. Unmasked, the queries are one
    sequence's last T positions, causal among themselves; masked and `batched` (a ragged batch), a batch
    of four reads through a (B, 1, T, L) mask; masked and not batched, one sequence does (a token tree).
    The last two rank apart: on an AMX Xeon the fused kernel took 0.22-0.56x the matmuls' time for one
    masked sequence at every width, and 0.39-1.21x for four by width and cache length, where the 0.85 bar
    made the choice for four flip from one process to the next (trees, sent down the matmuls with it,
    paid ~5 ms a forward). Each form is raced once a process (`batched` matters only when masked)."""
    return _fused_from(dtype, masked, 4 if masked and batched else 1)


@functools.cache
def _fused_from(dtype: torch.dtype, masked: bool, B: int) -> int | None:
    """fused_attention_from's race for `B` sequences of the given form."""
    setting = _setting("SPECFINOPS_DECODE_ATTENTION")
    if setting != "auto":
        return 1 if setting == "on" else None
    from serving.llama import causal_mask, small_attention  # the matmul path lives with the model

    def race() -> int:
        gen = torch.Generator().manual_seed(0)
        L = 256
        wins = {}
        for T in ATTENTION_WIDTHS:
            q = torch.randn(B, 9, T, 64, generator=gen).to(dtype)
            k = torch.randn(B, 3, L, 64, generator=gen).to(dtype)
            v = torch.randn(B, 3, L, 64, generator=gen).to(dtype)
            if masked:
                mask = small_mask = causal_mask(T, L).expand(B, 1, T, L)
            else:
                mask, small_mask = (None if T == 1 else causal_mask(T, L)), None
            t_fast, t_plain = _race(
                lambda q=q, k=k, v=v, m=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
                lambda q=q, k=k, v=v, m=small_mask: small_attention(q, k, v, m, L))
            wins[T] = t_fast < FASTER * t_plain
        return rows_from(wins) or 0  # 0: never

    # remembered per machine (serving/tuning.py): on an AMX Xeon the masked batch's choice flipped between
    # processes, so two runs of one sampled bf16 command at concurrency 2 decoded different tokens
    name = f"fused_attention_from/{str(dtype).removeprefix('torch.')}/{'masked' if masked else 'causal'}/{B}"
    return remembered(name, race) or None


fused_attention_from.cache_clear = _fused_from.cache_clear  # a changed setting (or a test) measures again


def attention_label(dtype: torch.dtype) -> str:
    """'fused' (every decode width), 'matmul' (none) or 'fused>=N' (from N queries on); when masked
    batches choose otherwise, '/mask-' and theirs, e.g. 'fused>=2/mask-matmul'; when one masked sequence
    (a token tree) chooses otherwise than one causal sequence, '/tree-' and its choice; '(f32)' at the end
    when the widths that run matmuls multiply in float32, e.g. 'fused>=2(f32)'."""

    def one(first: int | None) -> str:
        return "matmul" if first is None else "fused" if first == 1 else f"fused>={first}"

    plain, masked = fused_attention_from(dtype), fused_attention_from(dtype, masked=True)
    tree = fused_attention_from(dtype, masked=True, batched=False)
    label = one(plain) if plain == masked else f"{one(plain)}/mask-{one(masked)}"
    if tree != plain:
        label += f"/tree-{one(tree)}"
    if not plain == masked == tree == 1 and widen_matmul_attention(dtype):
        label += "(f32)"  # the matmul widths multiply in float32
    return label


def kernels_label(dtype: torch.dtype) -> str:
    """What serves `dtype` decode here, for run records: e.g. 'packed+fused', 'packed>=5+matmul',
    'packed+fused>=3', 'packed-f32>=2+fused' (bf16 weights multiplied from a float32 packed copy)."""
    rows = packed_linear_rows(dtype)
    linear = "plain" if rows is None else "packed" if pack_dtype(dtype) == dtype else "packed-f32"
    if rows is not None and rows > 1:
        linear += f">={rows}"
    span = bf16_kernel_rows(dtype)
    if span is not None:  # e.g. 'bf16c2-63,packed-f32>=20': the C kernel at 2-63 rows
        linear = "bf16c" + (f">={span[0]}" if span[1] is None else f"{span[0]}-{span[1]}") + "," + linear
    return f"{linear}+{attention_label(dtype)}"


class PackedLinear(nn.Module):
    """`nn.Linear` for inference that runs the kernel measured fastest here for the rows it is given:
    the C bf16 kernel for rows in `kernel_rows` (see `bf16_kernel_rows`), else, from `min_rows` rows on,
    a copy of the weight pre-packed for oneDNN (in `pack_dtype` of its dtype), else `F.linear`.
    `min_rows=None`: no packed copy (none is made, so no memory is spent on it).

    `weight` and `bias` stay the module's parameters (state dicts, tied embeddings and readers of
    `.weight` see no difference); where gradients are wanted it falls back to `F.linear`."""

    def __init__(self, linear: nn.Linear, min_rows: int | None = 1,
                 kernel_rows: tuple[int, int | None] | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.min_rows, self.kernel_rows = min_rows, kernel_rows
        self.compute = pack_dtype(linear.weight.dtype) or linear.weight.dtype
        self.packed = self.packed_bias = None
        if min_rows is not None:
            self.packed = _pack(linear.weight.detach().to(self.compute))
            self.packed_bias = None if linear.bias is None else linear.bias.detach().to(self.compute)
        self._bf16 = self._kernel_weight = None
        if kernel_rows is not None:
            from serving import bf16_kernel

            if bf16_kernel.fits(linear.weight):
                self._bf16, self._kernel_weight = bf16_kernel, linear.weight.detach()  # shares the storage
            else:
                self.kernel_rows = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // self.in_features
        if _in_range(rows, self.kernel_rows) and x.dtype == torch.bfloat16:
            return self._bf16.bf16_linear(x, self._kernel_weight, self.bias)
        if self.packed is not None and rows >= self.min_rows:
            return _packed_call(x, self.packed, self.packed_bias, self.compute)
        return F.linear(x, self.weight, self.bias)


def _available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _plan(linear: nn.Linear) -> tuple[int | None, tuple[int, int | None] | None]:
    """(rows from which the packed copy runs or None, rows the C bf16 kernel runs for or None) for
    `linear` here; the packed copy is left out where the kernel takes every row it would serve."""
    dtype = linear.weight.dtype
    rows = packed_linear_rows(dtype) if dtype in PACKABLE else None
    span = bf16_kernel_rows(dtype) if dtype == torch.bfloat16 else None
    if span is not None:
        from serving import bf16_kernel

        if not bf16_kernel.fits(linear.weight):
            span = None
    if rows is not None and span is not None and span[0] <= rows and span[1] is None:
        rows = None  # every row the packed copy would take, the kernel takes
    return rows, span


def pack_for_inference(model: nn.Module) -> int:
    """Swap the bf16 / float32 `nn.Linear`s of `model` for `PackedLinear` where a faster kernel was
    measured here (packed copy, C bf16 kernel; for the row counts where it won); returns how many were
    swapped. Packed copies are extra memory (a float32 copy of bf16 weights is twice their size): where
    they would take more than half of the memory still available, none is made. Call it once, after the
    weights are final."""
    swaps = [(parent, name, child, *_plan(child)) for parent in model.modules()
             for name, child in parent.named_children()
             if type(child) is nn.Linear and child.weight.dtype in PACKABLE]
    swaps = [s for s in swaps if s[3] is not None or s[4] is not None]
    extra = sum(c.weight.numel() * pack_dtype(c.weight.dtype).itemsize for _, _, c, rows, _ in swaps if rows is not None)
    available = _available_bytes()
    if extra and available is not None and extra > available / 2:
        log.warning("not packing %d linears: their copies (%.1f GB) would take more than half of the %.1f GB "
                    "of memory available", len(swaps), extra / 1e9, available / 1e9)
        swaps = [(p, n, c, None, span) for p, n, c, _, span in swaps if span is not None]
    for parent, name, child, rows, span in swaps:
        setattr(parent, name, PackedLinear(child, rows, span))
    return len(swaps)


# ------------------------------------------------------------------ threads
def in_passing_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """`fn(*args, **kwargs)` run in a thread that ends when it returns; its result, or its exception.

    OpenMP keeps a pool of worker threads for each thread that has run parallel torch work. Where the
    main thread holds such a pool and another thread (the server's engine thread) then runs torch, the two
    pools oversubscribe the cores, libgomp stops spinning, and every parallel op pays a sleeping worker's
    wake-up: on a 2-core AVX2 EPYC a (1, 9, 64) softmax went 4 -> 148 us and AR decoding 51 -> 124-141 ms a
    token. A pool goes with its thread, so work done here (loading, kernel races, warm-up) leaves none
    behind in the caller."""
    result: list = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            error.append(exc)

    thread = threading.Thread(target=target, name=f"specfinops-{getattr(fn, '__name__', 'work')}",
                              daemon=True)  # Ctrl-C in the caller is not held up by it
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


# ------------------------------------------------------------------ the run's precision
DTYPE_CHOICES = ("auto", "bfloat16", "float32")


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX). Without it bf16 products are
    emulated: on an AVX2-only EPYC a 576x1536 product at 5 rows cost 617 us in bf16 against 161 us in
    packed float32, and distill's batched data generation ran at 23 answer tokens/s."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


# The largest batch for which `auto` takes bfloat16 on a CPU that emulates it (with the C kernel). On an AVX2
# EPYC (bench, code workload, tokens/s float32 -> bfloat16): concurrency 1 AR 13.2 -> 19.5 and spec 15.5 -> 30.3;
# at 4 AR 37.4 -> 41.5, spec 43.5 -> 43.2; at 8 AR 52.4 -> 51.8, spec 45.5 -> 47.2; at 16 AR 62.5 -> 51.0.
AUTO_BF16_MAX_BATCH = 8


def emulated_bf16_pays(max_batch: int | None) -> bool:
    """On a CPU without bf16 instructions: whether bfloat16 still beats float32 for a run that decodes at most
    `max_batch` sequences together. Few rows per product run the C bf16 kernel (half the bytes of float32
    streamed, `bf16_kernel_rows`); many rows are arithmetic-bound, where float32's packed kernels win. An
    unknown batch, or no C kernel here, keeps float32."""
    if max_batch is None or max_batch > AUTO_BF16_MAX_BATCH or _setting("SPECFINOPS_BF16_KERNEL") == "off":
        return False
    from serving import bf16_kernel

    return bf16_kernel.available()


def resolve_dtype(name: str, backend: str = "torch", max_batch: int | None = None, device: str = "cpu") -> str:
    """`auto` -> the precision that runs fastest here for a run of at most `max_batch` sequences at a time
    (None: unknown or large, as distill's batched generation and training):
    bfloat16 where the CPU multiplies bf16 in hardware (`native_bf16`) or on a GPU backend; on a CPU that
    emulates bf16, bfloat16 only for small batches (`emulated_bf16_pays`), else float32. The torch backend
    on a CUDA `device`: bfloat16 where the GPU has bf16 arithmetic (Ampere and later), else float32 (V100,
    T4). Other names are checked."""
    if name not in DTYPE_CHOICES:
        raise ValueError(f"unknown dtype {name!r}: use {', '.join(DTYPE_CHOICES)}")
    if name != "auto":
        return name
    if backend == "torch" and torch.device(device).type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float32"
    if backend != "torch" or native_bf16():
        return "bfloat16"
    return "bfloat16" if emulated_bf16_pays(max_batch) else "float32"
