"""The C bf16 linear for CPUs that emulate bf16 (serving/bf16_kernel.py): F.linear's numbers, the rows
it is chosen for, and a clear fallback where it cannot be built."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from serving import bf16_kernel, kernels
from serving.engine import Engine
from serving.llama import contiguous_batch
from serving.sampling import SamplingParams
from tests.tiny import tiny_model

needs_kernel = pytest.mark.skipif(not bf16_kernel.available(), reason="no AVX2/FMA CPU or no C compiler here")


def _exact(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The product of the same bf16 values in float64: what a float32-accumulating kernel approximates."""
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 576), (2, 576), (5, 576), (4, 5, 576), (70, 576), (0, 576)])
@pytest.mark.parametrize("out_features, bias", [(1536, False), (1536, True), (1027, True)])
def test_bf16_linear_gives_the_bf16_product(shape, out_features, bias):
    torch.manual_seed(0)
    lin = nn.Linear(576, out_features, bias=bias).to(torch.bfloat16)
    x = torch.randn(*shape).to(torch.bfloat16)
    with torch.inference_mode():
        got = bf16_kernel.bf16_linear(x, lin.weight, lin.bias)
        expect = lin(x)
    assert got.dtype == torch.bfloat16 and got.shape == expect.shape == (*shape[:-1], out_features)
    # within one bf16 rounding of the exact product (every column, the N % 4 tail included)...
    exact = _exact(x, lin.weight, lin.bias)
    torch.testing.assert_close(got.double(), exact, rtol=8e-3, atol=1e-3)
    # ...and as close to torch's own bf16 linear as that one is to the exact product
    torch.testing.assert_close(got.float(), expect.float(), rtol=1e-2, atol=2e-2)


@needs_kernel
def test_bf16_linear_rounds_to_nearest_even_and_keeps_nan_and_inf():
    w = torch.zeros(4, 8, dtype=torch.bfloat16)
    w[:, 0] = 1.0
    # 1 + 2^-8 lies halfway between the bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1.0);
    # 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: the even one is 1 + 2^-6
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    x[0, 0], x[0, 1] = 1.0, 2.0 ** -8
    w[0, 1] = 1.0
    x[1, 0], x[1, 1] = 1.0 + 2.0 ** -7, 2.0 ** -8
    w[:, 1] = 1.0
    x[2, 0] = float("nan")
    x[3, 0] = float("inf")
    with torch.inference_mode():
        y = bf16_kernel.bf16_linear(x, w)
    assert y[0, 0].item() == 1.0
    assert y[1, 0].item() == 1.0 + 2.0 ** -6
    assert torch.isnan(y[2]).all()
    assert torch.isinf(y[3]).all()


@needs_kernel
def test_bf16_linear_refuses_what_it_cannot_multiply():
    w = torch.randn(8, 16).to(torch.bfloat16)
    with pytest.raises(TypeError, match="bf16 tensors"):
        bf16_kernel.bf16_linear(torch.randn(2, 16), w)
    with pytest.raises(ValueError, match="multiple of 8"):
        bf16_kernel.bf16_linear(torch.randn(2, 12).to(torch.bfloat16), torch.randn(8, 12).to(torch.bfloat16))
    with pytest.raises(ValueError, match="do not fit"):
        bf16_kernel.bf16_linear(torch.randn(2, 8).to(torch.bfloat16), w)


@contextmanager
def _an_avx2_cpu_compiling_with(monkeypatch, compiler: str | None):
    """A CPU with AVX2 and no native bf16 (where the kernel is wanted), `compiler` its C compiler (None: none);
    the kernel's and the kernel choice's cached answers cleared before and after."""
    monkeypatch.setattr(bf16_kernel, "_compiler", lambda: compiler)
    monkeypatch.setattr(bf16_kernel, "_cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr(kernels, "native_bf16", lambda: False)
    bf16_kernel._load.cache_clear()
    kernels.bf16_kernel_rows.cache_clear()
    try:
        yield
    finally:
        bf16_kernel._load.cache_clear()
        kernels.bf16_kernel_rows.cache_clear()


def test_without_a_compiler_the_kernel_is_unavailable_and_torch_kernels_stay(monkeypatch):
    with _an_avx2_cpu_compiling_with(monkeypatch, None):
        assert not bf16_kernel.available()
        assert bf16_kernel.unavailable_reason() == "no C compiler (cc, gcc or clang) on PATH"
        assert kernels.bf16_kernel_rows(torch.bfloat16) is None
        with pytest.raises(RuntimeError, match="unavailable: no C compiler"):
            bf16_kernel.bf16_linear(torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(8, 8, dtype=torch.bfloat16))


@pytest.mark.parametrize("made", [False, True])
def test_a_read_only_cache_is_no_kernel_and_torch_kernels_stay(made, tmp_path, monkeypatch):
    """A cache that cannot be written (a read-only mount, another user's HOME) raised 'Read-only file system:
    <cache>/kernels' out of `available()`, and bench failed on CPUs without native bf16; it is now no kernel, with
    the reason, as no compiler is. `made`: the kernels folder is there already (its temporary folder fails)."""
    from tests.readonly import read_only

    cache = tmp_path / "cache"
    (cache / "kernels" if made else cache).mkdir(parents=True)
    read_only(monkeypatch, cache)
    monkeypatch.setenv("SPECFINOPS_CACHE", str(cache))
    with _an_avx2_cpu_compiling_with(monkeypatch, "/no/cc"):  # never run: nothing can be built there
        assert not bf16_kernel.available()
        why = bf16_kernel.unavailable_reason()
        assert why.startswith(f"cannot build into {cache / 'kernels'} (") and "set SPECFINOPS_CACHE" in why, why
        assert kernels.bf16_kernel_rows(torch.bfloat16) is None


def test_a_cpu_without_avx2_gets_no_kernel(monkeypatch):
    monkeypatch.setattr(bf16_kernel, "_cpu_flags", lambda: {"sse4_2"})
    bf16_kernel._load.cache_clear()
    try:
        assert not bf16_kernel.available() and "AVX2" in bf16_kernel.unavailable_reason()
    finally:
        bf16_kernel._load.cache_clear()


@pytest.mark.parametrize("wins, expect", [
    ({1: False, 2: False, 5: True, 20: True, 64: True}, (5, None)),
    ({1: False, 2: True, 5: True, 20: False, 64: False}, (2, 19)),
    ({1: True, 2: True, 5: True, 20: True, 64: False}, (1, 63)),
    ({1: False, 2: False, 5: False, 20: False, 64: False}, None),
    ({1: False, 2: True, 5: False, 20: True, 64: True}, (2, 4)),  # the first run of wins only
])
def test_rows_between(wins, expect):
    assert kernels.rows_between(wins) == expect


@needs_kernel
def test_packed_linear_runs_the_kernel_only_for_its_rows(monkeypatch):
    torch.manual_seed(0)
    lin = nn.Linear(64, 32).to(torch.bfloat16)
    layer = kernels.PackedLinear(lin, min_rows=None, kernel_rows=(2, 19))
    assert layer.packed is None  # no packed copy is made where none is asked for
    calls = []
    real = bf16_kernel.bf16_linear
    monkeypatch.setattr(bf16_kernel, "bf16_linear", lambda x, *a: calls.append(tuple(x.shape)) or real(x, *a))
    with torch.inference_mode():
        for shape in [(1, 1, 64), (1, 2, 64), (1, 5, 64), (4, 5, 64), (1, 19, 64), (1, 20, 64)]:
            x = torch.randn(*shape).to(torch.bfloat16)
            got, expect = layer(x), lin(x)
            if 2 <= x.numel() // 64 <= 19:
                torch.testing.assert_close(got.float(), expect.float(), rtol=1e-2, atol=2e-2)
            else:
                assert torch.equal(got, expect)  # F.linear itself
    assert calls == [(1, 2, 64), (1, 5, 64), (1, 19, 64)]  # 4 x 5 = 20 rows: not its
    # training still goes through F.linear, with gradients
    x = torch.randn(3, 64).to(torch.bfloat16)
    layer(x).float().sum().backward()
    assert lin.weight.grad is not None and len(calls) == 3


@needs_kernel
def test_kernel_on_serves_a_bf16_model_through_the_engine(monkeypatch):
    """SPECFINOPS_BF16_KERNEL=on: every linear of a bf16 model runs the kernel; logits stay bf16-close
    and greedy decoding is unchanged on a model with sharp logits."""
    monkeypatch.setenv("SPECFINOPS_BF16_KERNEL", "on")
    monkeypatch.setenv("SPECFINOPS_PACKED_LINEAR", "off")
    monkeypatch.setattr(kernels, "native_bf16", lambda: False)
    kernels.bf16_kernel_rows.cache_clear()
    kernels.packed_linear_rows.cache_clear()
    try:
        assert kernels.bf16_kernel_rows(torch.bfloat16) == (1, None)
        assert kernels.kernels_label(torch.bfloat16).startswith("bf16c>=1,plain+")
        ref, model = tiny_model(3).to(torch.bfloat16), tiny_model(3).to(torch.bfloat16)
        linears = sum(type(m) is nn.Linear for m in ref.modules())
        assert kernels.pack_for_inference(model) == linears
        assert all(m.kernel_rows == (1, None) and m.packed is None
                   for m in model.modules() if isinstance(m, kernels.PackedLinear))
        tokens = torch.randint(0, 96, (2, 7))
        with torch.inference_mode():
            a = ref(tokens, contiguous_batch(0, 2, 0, 7), ref.new_cache(2, 32))
            b = model(tokens, contiguous_batch(0, 2, 0, 7), model.new_cache(2, 32))
        torch.testing.assert_close(b, a, rtol=3e-2, atol=8e-2)
        prompt = [4, 8, 15, 16, 23, 42]
        outs = [Engine(m, max_batch=1, max_len=64).generate(prompt, SamplingParams(max_new_tokens=12)).output
                for m in (ref, model)]
        assert outs[0] == outs[1]
    finally:
        kernels.bf16_kernel_rows.cache_clear()
        kernels.packed_linear_rows.cache_clear()


def test_kernel_off_and_float32_models_are_left_to_torch(monkeypatch):
    monkeypatch.setenv("SPECFINOPS_BF16_KERNEL", "off")
    kernels.bf16_kernel_rows.cache_clear()
    try:
        assert kernels.bf16_kernel_rows(torch.bfloat16) is None
        assert "bf16c" not in kernels.kernels_label(torch.bfloat16)
    finally:
        kernels.bf16_kernel_rows.cache_clear()
    assert kernels.bf16_kernel_rows(torch.float32) is None


def test_odd_widths_keep_torch_kernels(monkeypatch):
    """A linear whose input width is not a multiple of 8 is never given to the kernel."""
    lin = nn.Linear(12, 8).to(torch.bfloat16)
    monkeypatch.setattr(kernels, "bf16_kernel_rows", lambda dtype=torch.bfloat16: (1, None))
    monkeypatch.setattr(kernels, "packed_linear_rows", lambda dtype=torch.bfloat16: None)
    assert kernels._plan(lin) == (None, None)
    assert kernels.PackedLinear(lin, None, (1, None)).kernel_rows is None
