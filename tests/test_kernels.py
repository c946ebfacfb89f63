"""The measured CPU fast paths (serving/kernels.py): same numbers as the default kernels, clear settings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from serving import kernels
from serving.engine import Engine
from serving.llama import contiguous_batch
from serving.sampling import SamplingParams
from tests.tiny import tiny_model


def _packing_supported() -> bool:
    return kernels.pack_dtype(torch.bfloat16) is not None


needs_packing = pytest.mark.skipif(not _packing_supported(), reason="this torch build has no oneDNN linear")


@pytest.fixture
def setting(monkeypatch):
    """Set a kernel override for one test; the measured choices are recomputed before and after, by a race in
    this process (SPECFINOPS_TUNING=measure: what these tests time is the race, not a remembered value)."""
    monkeypatch.setenv("SPECFINOPS_TUNING", "measure")

    def set_(name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        kernels.packed_linear_rows.cache_clear()
        kernels.bf16_kernel_rows.cache_clear()
        kernels.decode_attention.cache_clear()

    yield set_
    kernels.packed_linear_rows.cache_clear()
    kernels.bf16_kernel_rows.cache_clear()
    kernels.decode_attention.cache_clear()


@pytest.fixture
def no_native_bf16(monkeypatch):
    """A CPU whose oneDNN refuses to pack bf16 (no AVX-512): bf16 weights get a float32 packed copy."""
    real = kernels._can_pack
    monkeypatch.setattr(kernels, "_can_pack", lambda dtype: dtype != torch.bfloat16 and real(dtype))
    kernels.pack_dtype.cache_clear()
    kernels.packed_linear_rows.cache_clear()
    yield
    kernels.pack_dtype.cache_clear()
    kernels.packed_linear_rows.cache_clear()


@needs_packing
@pytest.mark.parametrize("shape", [(1, 576), (5, 576), (4, 5, 576), (300, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_linear(shape, bias):
    torch.manual_seed(0)
    lin = nn.Linear(576, 1536, bias=bias).to(torch.bfloat16)
    packed = kernels.PackedLinear(lin)
    x = torch.randn(*shape).to(torch.bfloat16)
    with torch.inference_mode():
        expect, got = lin(x), packed(x)
    assert got.shape == expect.shape == (*shape[:-1], 1536)
    torch.testing.assert_close(got.float(), expect.float(), rtol=1e-2, atol=2e-2)


@needs_packing
def test_packed_linear_keeps_gradients_where_wanted():
    lin = nn.Linear(16, 8).to(torch.bfloat16)
    packed = kernels.PackedLinear(lin)
    x = torch.randn(3, 16).to(torch.bfloat16)
    packed(x).float().sum().backward()
    assert packed.weight.grad is not None and packed.weight.grad.shape == (8, 16)
    assert packed.weight is lin.weight  # the parameters are shared, not copied


@needs_packing
def test_pack_for_inference_swaps_bf16_linears_and_keeps_outputs(setting):
    setting("SPECFINOPS_PACKED_LINEAR", "on")
    ref = tiny_model(3).to(torch.bfloat16)
    model = tiny_model(3).to(torch.bfloat16)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert kernels.pack_for_inference(model) == linears > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.state_dict().keys() == ref.state_dict().keys()
    tokens = torch.randint(0, 96, (1, 7))
    with torch.inference_mode():
        a = ref(tokens, contiguous_batch(0, 1, 0, 7), ref.new_cache(1, 32))
        b = model(tokens, contiguous_batch(0, 1, 0, 7), model.new_cache(1, 32))
    torch.testing.assert_close(b, a, rtol=2e-2, atol=5e-2)
    # the packed model decodes through the engine like any other
    seq = Engine(model, max_batch=1, max_len=64).generate([1, 2, 3], SamplingParams(max_new_tokens=6))
    assert len(seq.output) == 6


def _fp32_packing_supported() -> bool:
    return kernels._can_pack(torch.float32)


@pytest.mark.skipif(not _fp32_packing_supported(), reason="this torch build has no oneDNN float32 linear")
def test_pack_for_inference_float32_keeps_greedy_decoding(setting):
    """float32 linears pack too (AVX2 CPUs gain most there); the results stay float32-close."""
    setting("SPECFINOPS_PACKED_LINEAR", "on")
    ref, model = tiny_model(3), tiny_model(3)
    assert kernels.pack_for_inference(model) == sum(type(m) is nn.Linear for m in ref.modules()) > 0
    tokens = torch.randint(0, 96, (2, 7))
    with torch.inference_mode():
        a = ref(tokens, contiguous_batch(0, 2, 0, 7), ref.new_cache(2, 32))
        b = model(tokens, contiguous_batch(0, 2, 0, 7), model.new_cache(2, 32))
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    prompt = [4, 8, 15, 16, 23, 42]
    outs = [Engine(m, max_batch=1, max_len=64).generate(prompt, SamplingParams(max_new_tokens=12)).output
            for m in (ref, model)]
    assert outs[0] == outs[1]


def test_pack_for_inference_off_leaves_models_alone(setting):
    setting("SPECFINOPS_PACKED_LINEAR", "off")
    setting("SPECFINOPS_BF16_KERNEL", "off")  # the C bf16 kernel has its own switch (tests/test_bf16_kernel.py)
    assert kernels.pack_for_inference(tiny_model(1)) == 0
    assert kernels.pack_for_inference(tiny_model(1).to(torch.bfloat16)) == 0
    assert kernels.packed_linear_rows(torch.float32) is None and kernels.kernels_label(torch.float32).startswith("plain+")


def test_pack_for_inference_leaves_other_dtypes_alone(setting):
    setting("SPECFINOPS_PACKED_LINEAR", "on")
    assert kernels.pack_for_inference(tiny_model(1).to(torch.float16)) == 0


@pytest.mark.skipif(not _fp32_packing_supported(), reason="this torch build has no oneDNN float32 linear")
def test_packed_linear_uses_plain_linear_below_min_rows(monkeypatch):
    """Fewer rows than `min_rows` go through F.linear (exactly), more through the packed kernel."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    packed = kernels.PackedLinear(lin, min_rows=5)
    calls = []
    real = kernels._packed_linear
    monkeypatch.setattr(kernels, "_packed_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    with torch.inference_mode():
        one = torch.randn(1, 1, 64)
        assert torch.equal(packed(one), lin(one)) and calls == []
        four = torch.randn(2, 2, 64)
        assert torch.equal(packed(four), lin(four)) and calls == []
        many = torch.randn(1, 5, 64)
        torch.testing.assert_close(packed(many), lin(many), rtol=1e-4, atol=1e-4)
    assert calls == [(1, 5, 64)]


@pytest.mark.parametrize("wins, expect", [
    ({1: True, 2: True, 5: True, 20: True}, 1),
    ({1: False, 2: True, 5: True, 20: True}, 2),
    ({1: False, 2: False, 5: True, 20: True}, 5),
    ({1: True, 2: False, 5: True, 20: True}, 5),  # a win below a loss is not trusted
    ({1: True, 2: True, 5: True, 20: False}, None),  # losing at the widest decode: never pack
    ({1: False, 2: False, 5: False, 20: False}, None),
])
def test_rows_from_takes_the_smallest_row_count_that_keeps_winning(wins, expect):
    assert kernels.rows_from(wins) == expect


@pytest.mark.parametrize("name", ["SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_DECODE_ATTENTION",
                                  "SPECFINOPS_ATTENTION_FLOAT32"])
def test_bad_setting_is_named(setting, name):
    setting(name, "fast")
    ask = {"SPECFINOPS_PACKED_LINEAR": kernels.packed_linear_rows, "SPECFINOPS_DECODE_ATTENTION": kernels.decode_attention,
           "SPECFINOPS_ATTENTION_FLOAT32": kernels.decode_attention}[name]
    with pytest.raises(ValueError, match=f"{name} must be auto, on or off"):
        ask()


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kernel", ["matmul-f32", "fused-f32"])
def test_widened_attention_is_the_float32_attention_rounded_once(masked, kernel):
    """A widened kernel's bf16 attention is the float32 attention of the same inputs rounded to bf16 once
    (the bf16 kernels round every product); all stay bf16 tensors, and float32 inputs are never converted."""
    from serving.llama import attend

    torch.manual_seed(0)
    B, T, L = (3, 5, 40) if masked else (1, 1, 40)
    q, k, v = (torch.randn(B, 9, T, 64).bfloat16(), torch.randn(B, 3, L, 64).bfloat16(),
               torch.randn(B, 3, L, 64).bfloat16())
    mask = None
    if masked:
        pos = torch.tensor([30, 35, 40])[:, None] - T + torch.arange(T)
        mask = (torch.arange(L)[None, None, :] <= pos[:, :, None]).unsqueeze(1)
    plain_kernel = kernel.removesuffix("-f32")
    exact = attend(plain_kernel, q.float(), k.float(), v.float(), mask, L)
    wide = attend(kernel, q, k, v, mask, L)
    plain = attend(plain_kernel, q, k, v, mask, L)
    assert wide.dtype == plain.dtype == torch.bfloat16
    assert torch.equal(wide, exact.bfloat16())
    torch.testing.assert_close(plain.float(), exact, rtol=3e-2, atol=3e-2)
    assert torch.equal(attend(kernel, q.float(), k.float(), v.float(), mask, L), exact)


@pytest.mark.parametrize("masked", [False, True])
def test_the_four_decode_kernels_compute_the_same_attention(masked):
    """matmul, fused and their float32 forms agree (float32 inputs: to float32 rounding), for one causal
    sequence (its last T positions, no mask) and for a ragged batch through a mask."""
    from serving.llama import attend

    g = torch.Generator().manual_seed(1)
    B, T, L = (3, 4, 20) if masked else (1, 4, 20)
    q, k, v = (torch.randn(B, 9, T, 64, generator=g), torch.randn(B, 3, L, 64, generator=g),
               torch.randn(B, 3, L, 64, generator=g))
    mask = None
    if masked:
        pos = torch.tensor([12, 16, 20])[:, None] - T + torch.arange(T)
        mask = (torch.arange(L)[None, None, :] <= pos[:, :, None]).unsqueeze(1)
    outs = [attend(kernel, q, k, v, mask, L) for kernel in kernels.DECODE_ATTENTION]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-5, atol=1e-5)


def _fake_race(times):
    """A stand-in for the per-length timing: each kernel's time from `times(kernel, T, B, masked)`, after
    running it once on the race's inputs (so a kernel that fails on them fails the test); the race's own rule
    (`kernels._choose`) picks from the times."""
    from serving import llama

    def race(dtype, masked, B, T, candidates, rounds=3):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, 9, T, 64, generator=g).to(dtype), torch.randn(B, 3, 40, 64, generator=g).to(dtype),
                   torch.randn(B, 3, 40, 64, generator=g).to(dtype))
        mask = llama.causal_mask(T, 40).expand(B, 1, T, 40) if masked else None
        outs = [llama.attend(c, q, k, v, mask, 40) for c in candidates]
        for out in outs[1:]:
            torch.testing.assert_close(out.float(), outs[0].float(), rtol=3e-2, atol=3e-2)
        return kernels._choose({c: times(c, T, B, masked) for c in candidates}, candidates)

    return race


def test_decode_attention_is_chosen_per_width_and_form(setting, monkeypatch):
    """The race runs at every decode width and form; each width takes its fastest kernel (the matmuls unless
    another wins by the FASTER margin), a width between two measured ones the narrower one's, and the label
    says which kernel serves which widths."""
    setting("SPECFINOPS_DECODE_ATTENTION", "auto")
    setting("SPECFINOPS_ATTENTION_FLOAT32", "auto")
    seen = []

    def times(kernel, T, B, masked):
        seen.append((kernel, T, B, masked))
        if T == 1:  # one query: the widened fused kernel is fastest
            return {"matmul": 6.0, "matmul-f32": 1.5, "fused": 4.0, "fused-f32": 1.0}[kernel]
        return {"matmul": 3.0, "matmul-f32": 3.0, "fused": 2.0, "fused-f32": 2.5}[kernel]

    monkeypatch.setattr(kernels, "_attention_race", _fake_race(times))
    assert kernels.decode_attention(torch.bfloat16, 1) == "fused-f32"
    assert kernels.decode_attention(torch.bfloat16, 2) == "fused"
    assert kernels.decode_attention(torch.bfloat16, 4) == "fused"  # between 3 and 5: 3's choice
    assert kernels.decode_attention(torch.bfloat16, 16) == "fused"
    assert kernels.attention_label(torch.bfloat16) == "fused-f32@1,fused@2+"
    assert {T for _, T, _, _ in seen} == set(kernels.ATTENTION_WIDTHS)
    assert {(B, masked) for _, _, B, masked in seen} == {(1, False), (4, True), (1, True)}
    assert {k for k, _, _, _ in seen} == set(kernels.DECODE_ATTENTION)
    # float32 inputs have nothing to widen: only the matmuls and the fused kernel race
    seen.clear()
    assert kernels.decode_attention(torch.float32, 1) == "fused"
    assert {k for k, _, _, _ in seen} == {"matmul", "fused"}
    kernels.decode_attention.cache_clear()
    # faster, but not by the margin: the matmuls stay
    monkeypatch.setattr(kernels, "_attention_race", _fake_race(lambda kernel, T, B, masked: 0.9 if kernel != "matmul" else 1.0))
    assert kernels.decode_attention(torch.bfloat16, 1) == "matmul" and kernels.attention_label(torch.bfloat16) == "matmul"
    kernels.decode_attention.cache_clear()
    # the forms decide apart: a mask costs the fused kernels their lead in a batch; a tree chooses on its own
    def by_form(kernel, T, B, masked):
        if masked and B > 1:
            return 1.0 if kernel == "matmul" else 2.0
        if masked:
            return 1.0 if kernel == "fused" else 2.0
        return 1.0 if kernel == "matmul-f32" else 2.0

    monkeypatch.setattr(kernels, "_attention_race", _fake_race(by_form))
    assert kernels.decode_attention(torch.bfloat16, 3, masked=True) == "matmul"
    assert kernels.decode_attention(torch.bfloat16, 3, masked=True, batched=False) == "fused"
    assert kernels.attention_label(torch.bfloat16) == "matmul-f32/mask-matmul/tree-fused"


@pytest.mark.parametrize("times, expect", [
    ({"matmul": 4.0, "matmul-f32": 3.0, "fused": 2.0, "fused-f32": 1.0}, "fused-f32"),  # widening clearly pays
    ({"matmul": 4.0, "matmul-f32": 3.0, "fused": 2.0, "fused-f32": 1.9}, "fused"),  # not by the margin: bf16
    ({"matmul": 4.0, "matmul-f32": 1.0, "fused": 3.9, "fused-f32": 3.0}, "matmul-f32"),
    ({"matmul": 1.1, "matmul-f32": 1.0, "fused": 3.0, "fused-f32": 3.0}, "matmul"),  # the default's own form
    ({"matmul": 1.0, "matmul-f32": 0.9, "fused": 0.9, "fused-f32": 0.9}, "matmul"),  # nothing beats the default
])
def test_the_rule_keeps_the_models_precision_unless_widening_clearly_pays(times, expect):
    """A widened kernel changes the numerics a feature draft was trained on: it must beat its own form in the
    model's dtype by the FASTER margin, as any kernel must beat the default."""
    assert kernels._choose(times, kernels.DECODE_ATTENTION) == expect


def test_settings_narrow_the_race_and_decide_without_it(setting, monkeypatch):
    """SPECFINOPS_DECODE_ATTENTION on / off keeps only the fused / matmul kernels, SPECFINOPS_ATTENTION_FLOAT32
    on / off only the widened / unwidened ones; where one kernel is left nothing is timed."""
    calls = []

    def times(kernel, T, B, masked):
        calls.append(kernel)
        return {"matmul": 4.0, "matmul-f32": 3.0, "fused": 2.0, "fused-f32": 1.0}[kernel]

    monkeypatch.setattr(kernels, "_attention_race", _fake_race(times))
    setting("SPECFINOPS_ATTENTION_FLOAT32", "auto")
    setting("SPECFINOPS_DECODE_ATTENTION", "off")
    assert kernels.attention_label(torch.bfloat16) == "matmul-f32" and set(calls) == {"matmul", "matmul-f32"}
    setting("SPECFINOPS_ATTENTION_FLOAT32", "off")
    calls.clear()
    assert kernels.attention_label(torch.bfloat16) == "matmul" and not calls
    setting("SPECFINOPS_DECODE_ATTENTION", "on")
    assert kernels.attention_label(torch.bfloat16) == "fused" and not calls
    setting("SPECFINOPS_ATTENTION_FLOAT32", "on")
    assert kernels.attention_label(torch.bfloat16) == "fused-f32" and not calls
    assert kernels.attention_label(torch.float32) == "fused"  # float32 has nothing to widen
    setting("SPECFINOPS_DECODE_ATTENTION", "auto")
    assert kernels.attention_label(torch.bfloat16) == "fused-f32" and set(calls) == {"matmul-f32", "fused-f32"}


def test_the_race_times_growing_cache_lengths(setting, monkeypatch):
    """Decoding reads one more key every step, so the race gives each kernel cache lengths it has not seen
    (a kernel that prepares itself per shape pays for it there, as in decoding), DECODER_LAYERS calls each:
    not the warm-up's length, not another kernel's, and not those of another form's race that feeds the same
    query shapes (one sequence's causal and tree races) or of another dtype's."""
    import serving.llama

    seen = []
    real = serving.llama.attend

    def spy(kernel, q, keys, values, mask, kv_len):
        seen.append((kernel, kv_len, mask is not None, q.dtype))
        return real(kernel, q, keys, values, mask, kv_len)

    monkeypatch.setattr(serving.llama, "attend", spy)
    lengths_of = {}
    for dtype, masked in ((torch.float32, False), (torch.float32, True), (torch.bfloat16, False)):
        seen.clear()
        winner = kernels._attention_race(dtype, masked, 1, 3, ("matmul", "fused"), rounds=2)
        assert winner in ("matmul", "fused")
        warm, timed = seen[:2], seen[2:]  # each kernel's one warm-up call first
        assert {k for k, *_ in warm} == {"matmul", "fused"}
        for kernel in ("matmul", "fused"):
            lengths = [L for k, L, *_ in timed if k == kernel]
            assert len(lengths) == 2 * kernels.RACE_LENGTHS * kernels.DECODER_LAYERS
            assert len(set(lengths)) == 2 * kernels.RACE_LENGTHS  # a new length every DECODER_LAYERS calls
            assert not set(lengths) & {L for _, L, *_ in warm}  # the warm-up's length is not timed
        assert not {L for k, L, *_ in timed if k == "matmul"} & {L for k, L, *_ in timed if k == "fused"}
        lengths_of[(dtype, masked)] = {L for _, L, *_ in seen}
    causal, tree, bf16 = lengths_of.values()
    assert not causal & tree and not causal & bf16 and not tree & bf16


def test_concurrent_first_asks_race_once(setting, monkeypatch):
    """Two threads asking for a plan at once get the same plan from one race per width, not a mix of two."""
    import threading

    calls = []

    def race(dtype, masked, B, T, candidates, rounds=3):
        calls.append(T)
        threading.Event().wait(0.01)  # long enough for the other thread to ask meanwhile
        return candidates[len(calls) % len(candidates)]

    monkeypatch.setattr(kernels, "_attention_race", race)
    setting("SPECFINOPS_DECODE_ATTENTION", "auto")
    plans = []
    threads = [threading.Thread(target=lambda: plans.append(
        [kernels.decode_attention(torch.bfloat16, w) for w in kernels.ATTENTION_WIDTHS])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(calls) == sorted(kernels.ATTENTION_WIDTHS)  # one race per width
    assert plans[0] == plans[1]


def test_the_label_gives_each_kernel_the_widths_it_serves(setting, monkeypatch):
    """A measured width serves the widths up to the next measured one: matmul measured at 3 serves 3 and 4."""
    plan = {1: "fused-f32", 2: "fused-f32", 3: "matmul", 5: "fused", 9: "fused"}
    monkeypatch.setattr(kernels, "_attention_race", lambda dtype, masked, B, T, candidates, rounds=3: plan[T])
    setting("SPECFINOPS_DECODE_ATTENTION", "auto")
    assert kernels.decode_attention(torch.bfloat16, 4) == "matmul"
    assert kernels.attention_label(torch.bfloat16) == "fused-f32@1-2,matmul@3-4,fused@5+"
    kernels.decode_attention.cache_clear()
    plan.update({3: "fused-f32", 5: "matmul"})
    assert kernels.attention_label(torch.bfloat16) == "fused-f32@1-4,matmul@5-8,fused@9+"


def test_decode_attention_paths_agree(setting, monkeypatch):
    """Greedy decoding and logits are the same whichever attention kernel serves the decode widths,
    including a split: matmuls for one query (AR), the fused kernel from three on (prefill, verify)."""
    import serving.llama

    model = tiny_model(5)
    prompt = [4, 8, 15, 16, 23, 42]
    outs, logits = [], []
    for value in ("off", "on", "split"):
        if value == "split":
            setting("SPECFINOPS_DECODE_ATTENTION", "auto")
            monkeypatch.setattr(serving.llama, "decode_attention",
                                lambda dtype, width, masked=False, batched=True: "fused" if width >= 3 else "matmul")
        else:
            setting("SPECFINOPS_DECODE_ATTENTION", value)
            assert kernels.decode_attention(torch.float32, 1) == ("fused" if value == "on" else "matmul")
        outs.append(Engine(model, max_batch=1, max_len=64).generate(prompt, SamplingParams(max_new_tokens=12)).output)
        cache = model.new_cache(1, 32)
        with torch.inference_mode():
            model(torch.tensor([prompt]), contiguous_batch(0, 1, 0, 6), cache)
            logits.append(model(torch.tensor([[1, 2, 3]]), contiguous_batch(0, 1, 6, 3), cache))
    assert outs[0] == outs[1] == outs[2]
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[2], logits[0], rtol=1e-5, atol=1e-5)


def test_fused_attention_matches_matmul_attention_with_ragged_mask():
    from serving.llama import attend

    torch.manual_seed(0)
    B, T, L = 3, 4, 20
    q, k, v = torch.randn(B, 9, T, 64), torch.randn(B, 3, L, 64), torch.randn(B, 3, L, 64)
    ends = torch.tensor([12, 16, 20])  # each sequence sees a different number of keys
    pos = ends[:, None] - T + torch.arange(T)
    mask = (torch.arange(L)[None, None, :] <= pos[:, :, None]).unsqueeze(1)
    expect = attend("matmul", q, k, v, mask, L)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("native, backend, expect", [
    (True, "torch", "bfloat16"), (False, "torch", "float32"), (False, "vllm", "bfloat16"), (True, "vllm", "bfloat16"),
])
def test_auto_dtype_follows_the_cpu(monkeypatch, native, backend, expect):
    monkeypatch.setattr(kernels, "native_bf16", lambda: native)
    assert kernels.resolve_dtype("auto", backend) == expect
    assert kernels.resolve_dtype("float32", backend) == "float32"  # an explicit choice is kept
    assert kernels.resolve_dtype("bfloat16", backend) == "bfloat16"


@pytest.mark.parametrize("max_batch, kernel, setting, expect", [
    (1, True, "auto", "bfloat16"), (8, True, "auto", "bfloat16"),  # few rows: the C kernel streams half the bytes
    (9, True, "auto", "float32"), (32, True, "auto", "float32"),  # many rows: float32's packed kernels win
    (None, True, "auto", "float32"),  # an unknown (distill: large) batch
    (1, False, "auto", "float32"), (1, True, "off", "float32"),  # no C kernel here, or switched off
])
def test_auto_dtype_on_an_emulating_cpu_follows_the_batch(monkeypatch, max_batch, kernel, setting, expect):
    from serving import bf16_kernel

    monkeypatch.setattr(kernels, "native_bf16", lambda: False)
    monkeypatch.setattr(bf16_kernel, "available", lambda: kernel)
    monkeypatch.setenv("SPECFINOPS_BF16_KERNEL", setting)
    assert kernels.resolve_dtype("auto", max_batch=max_batch) == expect
    assert kernels.resolve_dtype("auto", "vllm", max_batch=max_batch) == "bfloat16"  # a GPU backend: always bf16
    monkeypatch.setattr(kernels, "native_bf16", lambda: True)
    assert kernels.resolve_dtype("auto", max_batch=max_batch) == "bfloat16"  # hardware bf16: at every batch


def test_unknown_dtype_is_named():
    with pytest.raises(ValueError) as err:
        kernels.resolve_dtype("float16")
    assert str(err.value) == "--dtype must be one of auto, bfloat16, float32, got 'float16'"


@pytest.mark.skipif(not _fp32_packing_supported(), reason="this torch build has no oneDNN float32 linear")
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_weights_without_bf16_instructions_multiply_from_a_float32_copy(no_native_bf16, bias):
    assert kernels.pack_dtype(torch.bfloat16) == torch.float32
    torch.manual_seed(0)
    lin = nn.Linear(576, 1536, bias=bias).to(torch.bfloat16)
    packed = kernels.PackedLinear(lin)
    assert packed.compute == torch.float32 and packed.packed.dtype == torch.float32  # the widened copy
    x = torch.randn(4, 5, 576).to(torch.bfloat16)
    with torch.inference_mode():
        got, expect = packed(x), lin(x)
        exact = F.linear(x.float(), lin.weight.float(), None if lin.bias is None else lin.bias.float())
    assert got.dtype == torch.bfloat16 and got.shape == expect.shape
    torch.testing.assert_close(got.float(), expect.float(), rtol=1e-2, atol=2e-2)
    # the same bf16 values multiplied in float32: within one bf16 rounding of the exact product
    torch.testing.assert_close(got.float(), exact, rtol=8e-3, atol=1e-3)


def test_nothing_is_packed_when_the_copies_would_not_fit(setting, monkeypatch):
    setting("SPECFINOPS_PACKED_LINEAR", "on")
    model = tiny_model(1)
    if kernels.packed_linear_rows(torch.float32) is None:
        pytest.skip("this torch build has no oneDNN float32 linear")
    monkeypatch.setattr(kernels, "_available_bytes", lambda: 1000)  # a few KB left
    assert kernels.pack_for_inference(model) == 0
    assert not any(isinstance(m, kernels.PackedLinear) for m in model.modules())
    monkeypatch.setattr(kernels, "_available_bytes", lambda: None)  # unknown: pack as measured
    assert kernels.pack_for_inference(model) > 0


def test_bf16_attention_over_a_strided_cache_slice_matches_float32():
    """Decode attention reads the first kv_len positions of each cache slot (a strided view); the bf16
    path packs the keys before its matmul (faster on the CPU) and must give the float32 answer."""
    from serving.llama import causal_mask, matmul_attention

    g = torch.Generator().manual_seed(0)
    ck = torch.randn(4, 3, 50, 16, generator=g).bfloat16()
    cv = torch.randn(4, 3, 50, 16, generator=g).bfloat16()
    keys, values = ck[:, :, :20], cv[:, :, :20]
    assert not keys.is_contiguous()
    q = torch.randn(4, 9, 3, 16, generator=g).bfloat16()
    mask = causal_mask(3, 20).expand(4, 1, 3, 20)
    out = matmul_attention(q, keys, values, mask, 20)
    ref = matmul_attention(q.float(), keys.float(), values.float(), mask, 20)
    assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), ref, atol=3e-2)
    assert torch.equal(ck[:, :, :20], keys)  # the cache itself is untouched


def test_attention_asks_for_the_choice_of_its_call_form(monkeypatch):
    """A forward asks the race for its own form: one causal sequence, a ragged (masked) batch, or one
    sequence through a tree mask, and the three forms give the same logits as the matmul path."""
    import serving.llama
    from serving.llama import ragged_batch, tree_batch

    model = tiny_model(7)
    asked = []

    def choice(dtype, width, masked=False, batched=True):
        asked.append((masked, batched))
        return "fused"

    monkeypatch.setattr(serving.llama, "decode_attention", choice)
    with torch.inference_mode():
        cache = model.new_cache(2, 32)
        for slot in (0, 1):
            model(torch.tensor([[4, 8, 15, 16]]), contiguous_batch(slot, 1, 0, 4), cache)
        asked.clear()
        model(torch.tensor([[23, 42]]), contiguous_batch(0, 1, 4, 2), cache)
        assert set(asked) == {(False, False)}
        asked.clear()
        model(torch.tensor([[23, 42], [5, 6]]), ragged_batch([0, 1], [4, 4], 2), cache)
        assert set(asked) == {(True, True)}
        asked.clear()
        visible = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)  # a root and two children
        fused = model(torch.tensor([[23, 42, 7]]), tree_batch([0], [4], torch.tensor([[0, 1, 1]]), visible), cache)
        assert set(asked) == {(True, False)}
        monkeypatch.setattr(serving.llama, "decode_attention", lambda dtype, width, masked=False, batched=True: "matmul")
        plain = model(torch.tensor([[23, 42, 7]]), tree_batch([0], [4], torch.tensor([[0, 1, 1]]), visible), cache)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
