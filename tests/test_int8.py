"""Int8 draft weights (serving/int8.py): the quantization by hand, the kernel against float32, the
fallbacks, the setting, and an engine whose quantized draft still emits exactly the target's output."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from serving import int8
from serving.drafters import FeatureDrafter, HybridDrafter, ModelDrafter
from serving.eagle import EagleDraft
from serving.engine import Engine
from serving.lookahead import FixedK
from serving.sampling import SamplingParams
from tests.tiny import tiny_model

torch.set_num_threads(1)
TARGET = tiny_model(0)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3], list(range(10, 40))]
GREEDY = SamplingParams(max_new_tokens=32)


@pytest.fixture
def setting(monkeypatch):
    def set_(value: str) -> None:
        monkeypatch.setenv("SPECFINOPS_DRAFT_INT8", value)
        int8.int8_max_rows.cache_clear()

    yield set_
    int8.int8_max_rows.cache_clear()


def test_quantize_rows_by_hand():
    w = torch.tensor([[0.5, -1.0, 0.25, 0.0], [2.0, 1.0, -0.5, 0.1]])
    q, scale = int8.quantize_rows(w)
    assert scale.tolist() == pytest.approx([1.0 / 127, 2.0 / 127])
    # each row's largest |w| maps to +-127, the rest rounds to the nearest step of its row's scale
    assert q.tolist() == [[64, -127, 32, 0], [127, 64, -32, 6]]
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_is_the_dequantized_product_and_falls_back_above_max_rows(dtype, bias):
    torch.manual_seed(0)
    lin = nn.Linear(64, 48, bias=bias).to(dtype)
    quant = int8.Int8Linear(lin, max_rows=2)
    deq = quant.q.float() * quant.scale.float()[:, None]
    with torch.inference_mode():
        x = torch.randn(1, 2, 64).to(dtype)  # 2 rows: int8
        expect = x.float() @ deq.T + (lin.bias.float() if bias else 0)
        got = quant(x)
        assert got.shape == (1, 2, 48) and got.dtype == dtype
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        assert torch.allclose(got.float(), expect, rtol=tol, atol=tol * expect.abs().max())
        # and it is not the unquantized product: the int8 path really ran
        assert not torch.equal(got, lin(x))
        x3 = torch.randn(3, 64).to(dtype)  # 3 rows: the original linear, bit for bit
        assert torch.equal(quant(x3), lin(x3))


def test_int8_linear_takes_views_at_any_address():
    """The kernel's aligned loads crashed the process on a row that was a view 16 bytes into a buffer
    (distill's evaluation slices stored features): such inputs are copied to an aligned buffer first."""
    torch.manual_seed(0)
    lin = nn.Linear(96, 40).to(torch.bfloat16)
    quant = int8.Int8Linear(lin, max_rows=4)
    buf = torch.randn(2 * 100 + 40).to(torch.bfloat16)
    with torch.inference_mode():
        for offset in (0, 1, 8, 33):
            row = buf[offset:offset + 96].view(1, 96)
            rows = buf[offset:offset + 2 * 100].view(2, 100)[:, :96]  # two rows 200 bytes apart
            for inp in (row, rows):
                expect = quant(inp.clone())
                assert torch.equal(quant(inp), expect)
                assert torch.allclose(expect.float(), lin(inp).float(), rtol=0.05, atol=0.05)


def test_int8_linear_leaves_training_to_the_original_weights():
    lin = nn.Linear(32, 16)
    quant = int8.Int8Linear(lin, max_rows=8)
    out = quant(torch.randn(2, 32)).sum()
    out.backward()
    assert lin.weight.grad is not None


def test_widths_the_kernel_cannot_take_are_refused_and_left_alone(setting):
    setting("on")
    with pytest.raises(ValueError, match="multiple of 32"):
        int8.Int8Linear(nn.Linear(40, 16), max_rows=1)
    model = nn.Sequential(nn.Linear(40, 64), nn.Linear(64, 8))
    assert int8.quantize_draft(model) == 1
    assert type(model[0]) is nn.Linear and isinstance(model[1], int8.Int8Linear)


def test_off_quantizes_nothing_and_a_bad_setting_is_named(setting):
    setting("off")
    assert int8.int8_max_rows(torch.float32) == 0
    assert int8.quantize_draft(nn.Sequential(nn.Linear(64, 64))) == 0
    setting("sometimes")
    with pytest.raises(ValueError, match="SPECFINOPS_DRAFT_INT8"):
        int8.int8_max_rows(torch.float32)


def _quantized(model: nn.Module) -> nn.Module:
    model = copy.deepcopy(model)
    assert int8.quantize_draft(model) > 0
    return model


def _drafters():
    feature = _quantized(EagleDraft.init_from_target(TARGET, torch.arange(64)).eval())
    feature.embed = [TARGET.embed_tokens]  # the deep copy made its own; the engine shares the target's
    draft = _quantized(TARGET)  # the target's own weights in int8: a draft that should mostly agree
    return {
        "feature": lambda: FeatureDrafter(feature, "feature@int8", slots=1, max_len=220),
        "feature+ngram": lambda: HybridDrafter(FeatureDrafter(feature, "feature@int8", slots=1, max_len=220)),
        "draft-model": lambda: ModelDrafter(draft, "draft@int8", slots=1, max_len=220),
    }


@pytest.mark.parametrize("name", ["feature", "feature+ngram", "draft-model"])
def test_a_quantized_draft_keeps_greedy_output_exactly_the_targets(setting, monkeypatch, name):
    setting("on")
    drafter = _drafters()[name]()
    calls = []
    real = int8._int8_mm
    monkeypatch.setattr(int8, "_int8_mm", lambda *a: calls.append(1) or real(*a))
    ar = Engine(TARGET, max_batch=1, max_len=200)
    reference = [ar.generate(p, GREEDY).output for p in PROMPTS]
    events = []
    engine = Engine(TARGET, drafter=drafter, policy=FixedK(3), max_batch=1, max_len=200, on_step=events.append)
    assert [engine.generate(p, GREEDY).output for p in PROMPTS] == reference
    assert calls, "the draft never ran its int8 weights"
    assert sum(e.accepted for e in events) > 0


def test_a_quantized_draft_samples_exactly_and_reproducibly(setting):
    setting("on")
    params = SamplingParams(temperature=0.8, max_new_tokens=24, seed=11)
    outs = []
    for _ in range(2):
        engine = Engine(TARGET, drafter=_drafters()["feature"](), policy=FixedK(3), max_len=200)
        outs.append(engine.generate(PROMPTS[0], params).output)
    assert outs[0] == outs[1] and len(outs[0]) == 24
