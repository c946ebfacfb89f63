"""CPU fast paths for the engine's decode-time kernels, each chosen by measurement once per machine.

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
- **Attention for a few queries.** Four kernels serve decode widths (`DECODE_ATTENTION`): batched
  matmuls or the fused `scaled_dot_product_attention`, each on the model's dtype or on float32 copies
  of q, keys and values rounded back once. On a CPU without AVX-512 plain matmuls beat the fused kernel
  at every decode width; on an AVX-512 Xeon the fused kernel won at every width (1 query over 300 keys:
  129 us -> 28 us); on an AVX-512 EPYC it lost at 1 query and won at 5; on an AVX2-only EPYC (bf16
  emulated) bf16 matmuls took 1.4-9x the time of the widened ones; on a Zen 5 EPYC bf16 matmuls paid
  ~4 ms a forward for each new cache length (every decode step), where the widened fused kernel paid
  nothing. Measured per dtype, per width and per call form, with the cache growing as in decoding; a
  widened kernel must also clearly beat its own form in the model's dtype (`_choose`: the numerics a
  feature draft was trained on).

Each choice is made by timing the candidates on decode-sized inputs the first time it is asked for on a
machine (remembered after, serving/tuning.py: `SPECFINOPS_TUNING`), and only where the candidate gives the
same numbers (the widened attention is the more precise of the two).
`SPECFINOPS_PACKED_LINEAR`, `SPECFINOPS_BF16_KERNEL`, `SPECFINOPS_DECODE_ATTENTION` and
`SPECFINOPS_ATTENTION_FLOAT32` (`auto` | `on` | `off`) override the measurement.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from serving.tuning import is_remembered, remembered, tuning_file, tuning_mode

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

    Measured once per machine and dtype on decode-sized products (remembered, serving/tuning.py): the packed
    kernel is used from the smallest measured row count at which it is clearly faster than `F.linear` and
    stays so at every larger one. SPECFINOPS_PACKED_LINEAR on / off decides without measuring."""
    setting = _setting("SPECFINOPS_PACKED_LINEAR")
    compute = pack_dtype(dtype)
    if setting == "off" or compute is None:
        return None
    gen = torch.Generator().manual_seed(0)
    if not _gives_linear_numbers(lambda x, w, b: _packed_call(x, _pack(w.to(compute)), None, compute), dtype, ROWS, gen):
        return None
    if setting == "on":
        return 1
    # remembered per machine: the race took seconds to a minute at every start on a loaded small CPU, and
    # near parity its outcome flipped between processes (different kernels, different bf16 numerics)
    value = remembered(_packed_name(dtype, compute), lambda: _encode_rows(_packed_race(dtype, compute, gen)),
                       valid=_valid_rows)
    _made.add(("packed", dtype))
    return _decode_rows(value)


def _packed_race(dtype: torch.dtype, compute: torch.dtype, gen: torch.Generator) -> int | None:
    """The race behind `packed_linear_rows`: the packed kernel against `F.linear` at each of ROWS."""
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


# How the linear choices are remembered (serving/tuning.py stores ints): 0 is None (no packed copy, no C
# kernel); a packed row threshold is itself; a C-kernel span (lo, hi) is lo * SPAN_BASE + hi, and an open
# one (lo, None) lo * SPAN_BASE. Only values a race can give are read back; any other is measured over.
NO_ROWS = 0
SPAN_BASE = 1000
_made: set[tuple[str, torch.dtype]] = set()  # ("packed" | "bf16", dtype): the race's choice made in this process


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _packed_name(dtype: torch.dtype, compute: torch.dtype) -> str:
    """The name `packed_linear_rows`' choice is remembered under: per dtype, and the precision of its copy."""
    return f"packed_linear_rows/{_name(dtype)}" + ("" if compute == dtype else f"/{_name(compute)}-copy")


def _encode_rows(rows: int | None) -> int:
    return NO_ROWS if rows is None else rows


def _valid_rows(value: int) -> bool:
    return value == NO_ROWS or value in ROWS


def _decode_rows(value: int) -> int | None:
    return None if value == NO_ROWS else value


def _encode_span(span: tuple[int, int | None] | None) -> int:
    if span is None:
        return NO_ROWS
    lo, hi = span
    return lo * SPAN_BASE + (0 if hi is None else hi)


def _decode_span(value: int) -> tuple[int, int | None] | None:
    if value == NO_ROWS:
        return None
    lo, hi = divmod(value, SPAN_BASE)
    return lo, (hi or None)


def _valid_span(value: int) -> bool:
    """Whether `value` encodes a span `rows_between` can give over KERNEL_ROWS (or None)."""
    if value == NO_ROWS:
        return True
    if value < 0:
        return False
    lo, hi = divmod(value, SPAN_BASE)
    return lo in KERNEL_ROWS and (hi == 0 or (hi >= lo and hi + 1 in KERNEL_ROWS))


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
    F.linear's numbers (bf16 tolerance). Measured once per machine (remembered, serving/tuning.py) on a pass over more weights than a CPU cache holds,
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
    # remembered per machine, as packed_linear_rows: the span came out (1, 19) in one process and (3, 4) in the
    # next on one AVX2 EPYC. Per what the kernel raced against (the packed copy's threshold, or plain F.linear)
    value = remembered(_bf16_name(dtype, rows), lambda: _encode_span(_bf16_race(dtype, rows, gen)), valid=_valid_span)
    _made.add(("bf16", dtype))
    return _decode_span(value)


def _bf16_name(dtype: torch.dtype, rows: int | None) -> str:
    """The name `bf16_kernel_rows`' choice is remembered under: per dtype and what runs otherwise."""
    return f"bf16_kernel_rows/{_name(dtype)}/against-" + ("plain" if rows is None else f"packed>={rows}")


def _bf16_race(dtype: torch.dtype, rows: int | None, gen: torch.Generator) -> tuple[int, int | None] | None:
    """The race behind `bf16_kernel_rows`: the C kernel against what runs otherwise (packed from `rows` on, or
    F.linear) at each of KERNEL_ROWS."""
    from serving import bf16_kernel

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


DECODE_ATTENTION = ("matmul", "matmul-f32", "fused", "fused-f32")  # serving/llama.py `attend` runs each
ATTENTION_WIDTHS = (1, 2, 3, 5, 9)  # queries a decode forward feeds per sequence: AR 1, verifying K <= 8 drafts K + 1
DECODER_LAYERS = 30  # a small decoder's depth: a forward calls attention this often at one cache length
RACE_LENGTHS = 4  # cache lengths each candidate is timed at, a round


@functools.cache  # asked by every layer of every forward
def decode_attention(dtype: torch.dtype = torch.bfloat16, width: int = 1, masked: bool = False,
                     batched: bool = True) -> str:
    """Which kernel (one of DECODE_ATTENTION) serves attention for `width` queries per sequence over a
    decode-length cache: measured once per machine, per dtype, call form and width (ATTENTION_WIDTHS; a
    width between two takes the narrower one's choice).

    The forms: unmasked, one sequence's last `width` positions, causal among themselves; masked and
    `batched`, a ragged batch reading through a (B, 1, T, L) mask (raced as four sequences); masked and not
    batched, one sequence through a mask (a token tree). The kernels rank differently by CPU, width and form:
    on an AVX-512 EPYC the fused kernel took 1.8-2.2x the matmuls' time at 1 query and 0.63-0.94x at 2-9;
    through a mask 1.2-3.6x at every width; on an AMX Xeon it took 0.22-0.56x for one masked sequence. On a
    Zen 5 EPYC, bf16 batched matmuls cost ~4 ms more a forward whenever the cache length was new to them
    (every decode step): one query over 100-700 keys took 6.0-6.5 ms a 30-layer forward as matmuls in bf16,
    1.1-2.4 ms in float32 and 0.7-2.0 ms as the fused kernel in float32, so the race grows the cache
    length as decoding does rather than timing one length over and over."""
    plan = _decode_plan(dtype, masked, 4 if masked and batched else 1)
    return plan[max((w for w in ATTENTION_WIDTHS if w <= width), default=ATTENTION_WIDTHS[0])]


def _attention_candidates(dtype: torch.dtype) -> tuple[str, ...]:
    """The kernels the settings leave to race: SPECFINOPS_DECODE_ATTENTION on / off keeps only the fused /
    matmul ones, SPECFINOPS_ATTENTION_FLOAT32 on / off only the widened / unwidened ones (float32 inputs
    have nothing to widen)."""
    fused, wide = _setting("SPECFINOPS_DECODE_ATTENTION"), _setting("SPECFINOPS_ATTENTION_FLOAT32")
    keep = []
    for name in DECODE_ATTENTION:
        is_fused, is_wide = name.startswith("fused"), name.endswith("-f32")
        if fused != "auto" and is_fused != (fused == "on"):
            continue
        if is_wide and (dtype == torch.float32 or wide == "off"):
            continue
        if not is_wide and dtype != torch.float32 and wide == "on":
            continue
        keep.append(name)
    return tuple(keep)


_PLAN_LOCK = threading.Lock()  # one race at a time: threads asking at once get one plan
_plans: dict[tuple, dict[int, str]] = {}  # (dtype, masked, B, candidates) -> width -> kernel


def _decode_plan(dtype: torch.dtype, masked: bool, B: int, tick: Callable[[], object] | None = None) -> dict[int, str]:
    """decode_attention's choice per width for `B` sequences of the given form, measured once a process
    (`tick` is called after each width, for a progress bar)."""
    candidates = _attention_candidates(dtype)
    key = (dtype, masked, B, candidates)
    with _PLAN_LOCK:
        if key not in _plans:
            _plans[key] = _measure_plan(dtype, masked, B, candidates, tick)
        return _plans[key]


def _plan_names(dtype: torch.dtype, masked: bool, B: int, candidates: tuple[str, ...]) -> dict[int, str]:
    """The name each measured width's choice is remembered under (serving/tuning.py)."""
    form = f"{_name(dtype)}/{'masked' if masked else 'causal'}/{B}"
    every = tuple(k for k in DECODE_ATTENTION if dtype != torch.float32 or not k.endswith("-f32"))
    restricted = "" if candidates == every else "/" + "+".join(candidates)  # settings narrowed the race
    return {T: f"decode_attention/{form}/{T}{restricted}" for T in ATTENTION_WIDTHS}


def _measure_plan(dtype: torch.dtype, masked: bool, B: int, candidates: tuple[str, ...],
                  tick: Callable[[], object] | None = None) -> dict[int, str]:
    """The kernel of each measured width: the remembered choice, else a race (`_attention_race`)."""
    if len(candidates) == 1:
        return dict.fromkeys(ATTENTION_WIDTHS, candidates[0])
    plan = {}
    for T, name in _plan_names(dtype, masked, B, candidates).items():
        # remembered per machine (serving/tuning.py): on an AMX Xeon the masked batch's choice flipped between
        # processes, so two runs of one sampled bf16 command at concurrency 2 decoded different tokens
        index = remembered(name, lambda T=T: DECODE_ATTENTION.index(_attention_race(dtype, masked, B, T, candidates)))
        known = 0 <= index < len(DECODE_ATTENTION) and DECODE_ATTENTION[index] in candidates
        plan[T] = DECODE_ATTENTION[index] if known else candidates[0]  # a value no candidate has: the default
        if tick is not None:
            tick()
    return plan


# (masked, sequences raced) of each attention form a run asks for: one sequence, a ragged batch, a token tree
ATTENTION_FORMS = ((False, 1), (True, 4), (True, 1))


def _unremembered_cases(dtype: torch.dtype) -> int:
    """How many attention choices for `dtype` this process has yet to make and this machine has not remembered."""
    candidates = _attention_candidates(dtype)
    if len(candidates) == 1:
        return 0
    with _PLAN_LOCK:
        forms = [(m, B) for m, B in ATTENTION_FORMS if (dtype, m, B, candidates) not in _plans]
    return sum(not is_remembered(name) for m, B in forms for name in _plan_names(dtype, m, B, candidates).values())


def _unremembered_linear(dtype: torch.dtype) -> int:
    """How many linear races (packed copy, C bf16 kernel) for `dtype` this process has yet to run and this machine
    has not remembered. Where the packed one is pending the C kernel's is counted too (its name depends on the
    packed choice)."""
    from serving import bf16_kernel

    pending, packed_pending = 0, False
    compute = pack_dtype(dtype)
    if (_setting("SPECFINOPS_PACKED_LINEAR") == "auto" and compute is not None and ("packed", dtype) not in _made
            and not is_remembered(_packed_name(dtype, compute), _valid_rows)):
        pending, packed_pending = 1, True
    if (_setting("SPECFINOPS_BF16_KERNEL") != "auto" or dtype != torch.bfloat16 or ("bf16", dtype) in _made
            or native_bf16() or not bf16_kernel.available()):
        return pending
    if packed_pending or not is_remembered(_bf16_name(dtype, packed_linear_rows(dtype)), _valid_span):
        pending += 1
    return pending


def measure_choices(dtype: torch.dtype, out: TextIO | None = None) -> str:
    """Make every kernel choice for `dtype` decode now, rather than inside the first request; returns
    `kernels_label(dtype)`. The first time on a machine the linear and attention races take minutes on a small CPU
    (they are remembered after, serving/tuning.py): then a line on `out` (stderr) says so, and on a terminal a progress bar
    follows the cases (not into a pipe or a log file). Nothing is said where every remembered choice is already
    known."""
    pending = _unremembered_linear(dtype) + _unremembered_cases(dtype)
    if not pending:
        return kernels_label(dtype)
    out = sys.stderr if out is None else out
    from tqdm import tqdm

    if tuning_mode() == "measure":
        when = "SPECFINOPS_TUNING=measure: at every start"
    else:
        when = f"once per machine, remembered in {tuning_file()}"
    print(f"timing kernel choices for this CPU ({when}; {pending} case{'s' if pending != 1 else ''}, can take minutes) ...",
          file=out, flush=True)
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    # the bar on a terminal only: into a pipe or a log file it wrote carriage returns (its draws and its
    # clearing) around nothing the notice line does not say
    with tqdm(total=2 + len(ATTENTION_FORMS) * len(ATTENTION_WIDTHS), desc="kernel choices", unit="case", file=out,
              leave=False, mininterval=0.1, maxinterval=30.0, disable=not tty) as bar:
        packed_linear_rows(dtype)
        bar.update()
        bf16_kernel_rows(dtype)
        bar.update()
        for masked, B in ATTENTION_FORMS:
            before = bar.n
            _decode_plan(dtype, masked, B, tick=bar.update)
            bar.update(before + len(ATTENTION_WIDTHS) - bar.n)  # a form already planned ticks nothing
    return kernels_label(dtype)


def _clear_decode_attention() -> None:
    """A changed setting (or a test) measures again."""
    with _PLAN_LOCK:
        _plans.clear()
    _decode_attention_cached_clear()


_decode_attention_cached_clear = decode_attention.cache_clear
decode_attention.cache_clear = _clear_decode_attention


def _forgetting(fn: Callable[..., object], kind: str) -> Callable[[], None]:
    """`fn.cache_clear` that also forgets which of `kind`'s choices this process made (`_unremembered_linear`)."""
    cached_clear = fn.cache_clear

    def clear() -> None:
        _made.difference_update({made for made in _made if made[0] == kind})
        cached_clear()

    return clear


packed_linear_rows.cache_clear = _forgetting(packed_linear_rows, "packed")
bf16_kernel_rows.cache_clear = _forgetting(bf16_kernel_rows, "bf16")


RACE_BAND = 64  # cache lengths a race may use: a warm-up and len(DECODE_ATTENTION) x 3 rounds x RACE_LENGTHS


def _race_band(dtype: torch.dtype, masked: bool) -> int:
    """The first cache length of the races of one dtype and mask form. One sequence's causal and tree (masked)
    races feed the same query shapes, and a bf16 race's widened candidates the float32 race's shapes, so each
    (dtype, form) takes its own band of lengths (from 200, a decode-length cache): no race times a shape another
    race in the process has prepared."""
    kinds = (torch.bfloat16, torch.float32, torch.float16)
    index = kinds.index(dtype) if dtype in kinds else len(kinds)
    return 200 + RACE_BAND * (2 * index + int(masked))


def _attention_race(dtype: torch.dtype, masked: bool, B: int, T: int, candidates: tuple[str, ...],
                    rounds: int = 3) -> str:
    """The fastest of `candidates` for T queries per sequence, as a small decoder's forwards call them: each
    candidate runs DECODER_LAYERS calls at each of RACE_LENGTHS cache lengths that it has not seen before
    (a kernel that prepares itself per shape pays for it as decoding would), taking turns over `rounds`.
    The first candidate is the default: another must take at most FASTER of its time."""
    from serving.llama import attend, causal_mask  # the kernels live with the model

    gen = torch.Generator().manual_seed(0)
    warm = _race_band(dtype, masked)  # the warm-up's length; the timed lengths follow it, none seen before
    start = warm + 1
    longest = start + len(candidates) * rounds * RACE_LENGTHS
    q = torch.randn(B, 9, T, 64, generator=gen).to(dtype)
    keys = torch.randn(B, 3, longest, 64, generator=gen).to(dtype)  # a cache: each length reads a slice of it
    values = torch.randn(B, 3, longest, 64, generator=gen).to(dtype)
    lengths = iter(range(start, longest))

    def run(kernel: str) -> float:
        t = time.perf_counter()
        for _ in range(RACE_LENGTHS):
            L = next(lengths)
            mask = causal_mask(T, L).expand(B, 1, T, L) if masked else None
            k, v = keys[:, :, :L], values[:, :, :L]
            for _ in range(DECODER_LAYERS):
                attend(kernel, q, k, v, mask, L)
        return (time.perf_counter() - t) / RACE_LENGTHS

    with torch.inference_mode():
        for kernel in candidates:  # first-call costs (thread pools, one-off set-up) out of the timings
            attend(kernel, q, keys[:, :, :warm], values[:, :, :warm],
                   causal_mask(T, warm).expand(B, 1, T, warm) if masked else None, warm)
        best = dict.fromkeys(candidates, float("inf"))
        for r in range(rounds):
            for kernel in (candidates if r % 2 == 0 else candidates[::-1]):
                best[kernel] = min(best[kernel], run(kernel))
    return _choose(best, candidates)


def _choose(best: dict[str, float], candidates: tuple[str, ...]) -> str:
    """The kernel to keep from the race's times: the fastest, where it takes at most FASTER of the default's
    (the first candidate's) time. A widened kernel must also beat its own form in the model's dtype by FASTER:
    widening changes the numerics (float32 attention rounded once), and a feature draft trained on bf16 target
    features accepts less on float32-like ones (on a Zen 5 EPYC, fused-f32 at every width measured alpha
    0.567 where fused bf16 from two queries on measured 0.592), so it is kept only where it clearly pays."""
    default = candidates[0]
    fastest = min(candidates, key=best.__getitem__)
    own = fastest.removesuffix("-f32")
    if own != fastest and own in best and best[fastest] > FASTER * best[own]:
        fastest = own
    return fastest if best[fastest] <= FASTER * best[default] else default


def attention_label(dtype: torch.dtype) -> str:
    """The decode-width attention kernels, for run records: one kernel name where every width and form
    takes it ('fused', 'matmul-f32'); else per width, e.g. 'fused-f32@1,fused@2+' (one query widened,
    two and more in bf16); '/mask-' and the ragged batches' choice where they differ from one sequence's,
    '/tree-' and one masked sequence's (a token tree) where that differs."""

    def one(masked: bool, batched: bool) -> str:
        # a measured width serves every width up to the next measured one (decode_attention)
        last = [*(w - 1 for w in ATTENTION_WIDTHS[1:]), None]
        runs: list[list] = []
        for w, up_to in zip(ATTENTION_WIDTHS, last, strict=True):
            kernel = decode_attention(dtype, w, masked, batched)
            if runs and runs[-1][1] == kernel:
                runs[-1][2] = up_to
            else:
                runs.append([w, kernel, up_to])
        if len(runs) == 1:
            return runs[0][1]
        parts = [f"{k}@{a}" + ("+" if b is None else "" if a == b else f"-{b}") for a, k, b in runs]
        return ",".join(parts)

    plain, masked, tree = one(False, True), one(True, True), one(True, False)
    label = plain if masked == plain else f"{plain}/mask-{masked}"
    if tree != plain:
        label += f"/tree-{tree}"
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
        raise ValueError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {name!r}")
    if name != "auto":
        return name
    if backend == "torch" and torch.device(device).type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float32"
    if backend != "torch" or native_bf16():
        return "bfloat16"
    return "bfloat16" if emulated_bf16_pays(max_batch) else "float32"
