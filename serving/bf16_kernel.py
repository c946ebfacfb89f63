"""A bf16 linear for CPUs that emulate bf16 (AVX2, no AVX512-BF16 / AMX), built from `csrc/bf16_linear.c`.

Without bf16 instructions torch multiplies bf16 at a cost that grows with every input row: on an
AVX2-only EPYC a target forward over 5 tokens took 1.9x one over 1 token (61 -> 116 ms), so verifying
K drafted tokens was never close to free there. The C kernel reads each weight once per call, widens it
in registers and reuses it for every row, accumulating in float32 and rounding to bf16 as a bf16 kernel
does: the same numbers up to summation order, at a cost that stays near the one-row cost for a few rows.

It is compiled once per source version with the system C compiler (`cc -O3 -mavx2 -mfma -fopenmp`,
about a second) into the cache (`kernels` in serving.models.cache_dir) and loaded with ctypes: no torch or Python
headers. Where there is no compiler, no AVX2/FMA, no writable cache, or the build fails, `available()` says
why and the engine keeps torch's kernels. Whether it runs, and for how many rows, is measured per process in
`serving.kernels` (`SPECFINOPS_BF16_KERNEL` = auto | on | off overrides).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "bf16_linear.c"
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
ALIGN = 8  # in_features must be a multiple of this (one AVX2 register of floats)


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the library, '') or (None, why not)."""
    if not {"avx2", "fma"} <= _cpu_flags():
        return None, "this CPU has no AVX2 and FMA"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc or clang) on PATH"
    from serving.models import cache_dir

    src = SOURCE.read_bytes()
    tag = hashlib.sha256(src + " ".join(FLAGS).encode()).hexdigest()[:16]
    lib_path = cache_dir() / "kernels" / f"bf16_linear-{tag}.so"
    if not lib_path.is_file():
        try:  # a read-only cache (a mounted volume, another user's HOME) is no kernel, as no compiler is
            lib_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=lib_path.parent))
        except OSError as exc:
            return None, (f"cannot build into {lib_path.parent} ({exc.strerror or exc}): set SPECFINOPS_CACHE "
                          "to a writable folder")
        try:
            out = tmp / lib_path.name
            proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(out)], capture_output=True, text=True)
            if proc.returncode != 0:
                return None, f"{cc} could not build {SOURCE.name}: {proc.stderr.strip()[-300:]}"
            out.replace(lib_path)  # atomic: a concurrent process sees the whole library or none
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as exc:
        return None, f"could not load {lib_path}: {exc}"
    fn = lib.bf16_linear
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    fn.restype = None
    return lib, ""


def available() -> bool:
    return _load()[0] is not None


def unavailable_reason() -> str:
    return _load()[1]


def supports(in_features: int) -> bool:
    return in_features % ALIGN == 0


def fits(weight: torch.Tensor) -> bool:
    """Whether the kernel can multiply by `weight` as it is: bf16, contiguous, in_features a multiple of 8."""
    return weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.is_contiguous() and supports(weight.shape[1])


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for bf16 tensors through the C kernel (inference only: no autograd).
    `weight` must be contiguous (N, K) with K a multiple of 8; `x` is (..., K)."""
    lib, why = _load()
    if lib is None:
        raise RuntimeError(f"the bf16 kernel is unavailable: {why}")
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        raise TypeError(f"bf16_linear wants bf16 tensors, got {x.dtype} and {weight.dtype}")
    N, K = weight.shape
    if x.shape[-1] != K or not supports(K) or not weight.is_contiguous():
        raise ValueError(f"bf16_linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit "
                         f"(contiguous weight, in_features a multiple of {ALIGN})")
    xs = x.reshape(-1, K).contiguous()
    M = xs.shape[0]
    y = torch.empty(M, N, dtype=torch.bfloat16)
    if M:
        scratch = torch.empty(M * K, dtype=torch.float32)
        b = None if bias is None else bias.detach().contiguous()
        lib.bf16_linear(xs.data_ptr(), weight.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr(),
                        scratch.data_ptr(), M, N, K, torch.get_num_threads())
    return y.view(*x.shape[:-1], N)
