"""Batched forwards over cache slots in any order: an ascending run is read as a view, scattered slots as their
span (queries placed in their rows), far-apart slots gathered; each sequence's logits are the ones it gets alone."""

from __future__ import annotations

import pytest
import torch

from serving import llama
from serving.llama import contiguous_batch, ragged_batch, slot_layout, tree_batch
from tests.tiny import tiny_model

torch.set_num_threads(1)
MODEL = tiny_model(11)
PROMPTS = [[3, 14, 15, 92, 65, 35], [8, 9, 7, 9, 3], [2, 7, 18, 28, 18, 28, 45, 90], [1, 6, 18, 3]]


def _mask(B: int, T: int, L: int) -> torch.Tensor:
    return torch.ones(B, 1, T, L, dtype=torch.bool)


def test_slot_layout_reads_a_run_as_a_view_a_close_scatter_as_its_span_and_far_slots_by_gather():
    view, rows, mask = slot_layout([2, 3, 4], _mask(3, 1, 5))
    assert view == slice(2, 5) and rows is None and mask.shape[0] == 3
    view, rows, mask = slot_layout([5, 1, 3], _mask(3, 2, 5))
    assert view == slice(1, 6) and rows.tolist() == [4, 0, 2]
    assert mask.shape == (5, 1, 2, 5)
    # rows no sequence uses (slots 2 and 4 here) see key 0 only, so their softmax is finite
    assert mask[1, 0, :, 0].all() and not mask[1, 0, :, 1:].any() and mask[3, 0, :, 0].all()
    view, rows, mask = slot_layout([0, 9], _mask(2, 1, 5))  # a span of 10 for 2 sequences: gather
    assert view is None and rows is None and mask.shape[0] == 2


def _alone(prompt: list[int], feed: list[int]) -> torch.Tensor:
    cache = MODEL.new_cache(1, 64)
    MODEL(torch.tensor([prompt]), contiguous_batch(0, 1, 0, len(prompt)), cache)
    return MODEL(torch.tensor([feed]), contiguous_batch(0, 1, len(prompt), len(feed)), cache)[0]


@pytest.mark.parametrize("slots", [[5, 1, 3, 2], [0, 1, 2, 3], [3, 2, 1, 0], [0, 31, 9, 17]],
                         ids=["span", "run", "reversed-run-as-span", "gather"])
@pytest.mark.parametrize("width", [1, 3])
@torch.inference_mode()
def test_ragged_forwards_over_any_slots_equal_each_sequence_alone(slots, width):
    cache = MODEL.new_cache(32, 64)
    for slot, prompt in zip(slots, PROMPTS, strict=True):
        MODEL(torch.tensor([prompt]), contiguous_batch(slot, 1, 0, len(prompt)), cache)
    feeds = [[(7 * b + j) % 96 for j in range(width)] for b in range(len(slots))]
    fb = ragged_batch(slots, [len(p) for p in PROMPTS], width)
    got = MODEL(torch.tensor(feeds), fb, cache)
    for b, prompt in enumerate(PROMPTS):
        assert torch.allclose(got[b], _alone(prompt, feeds[b]), atol=1e-4), (slots, b)


@torch.inference_mode()
def test_span_and_gather_reads_agree_for_tree_forwards(monkeypatch):
    slots, starts = [6, 2, 4], [len(p) for p in PROMPTS[:3]]
    depths = torch.tensor([[0, 1, 1, 2]] * 3)
    visible = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    feed = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])

    def run() -> torch.Tensor:
        cache = MODEL.new_cache(8, 64)
        for slot, prompt in zip(slots, PROMPTS, strict=False):
            MODEL(torch.tensor([prompt]), contiguous_batch(slot, 1, 0, len(prompt)), cache)
        return MODEL(feed, tree_batch(slots, starts, depths, visible.expand(3, 4, 4)), cache)

    spanned = run()
    monkeypatch.setattr(llama, "SPAN_READ_MAX", 0)  # every scattered batch gathered
    gathered = run()
    assert tree_batch(slots, starts, depths, visible.expand(3, 4, 4)).rows is None
    assert torch.allclose(spanned, gathered, atol=1e-4)
