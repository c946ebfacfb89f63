"""scripts.bench_verify_cost: forward times per batch size and the perfect-draft ceiling arithmetic."""

from __future__ import annotations

import argparse

import pytest

from scripts.bench_verify_cost import _batches, ceilings, forward_ms_by_width, summary
from tests.tiny import tiny_model


def test_ceiling_by_hand():
    # t(1) = 10 ms, t(2) = 12, t(3) = 15, t(4) = 40: K=1 -> 2*10/12, K=2 -> 3*10/15, K=3 -> 4*10/40
    ms = {1: 10.0, 2: 12.0, 3: 15.0, 4: 40.0}
    got = ceilings(ms)
    assert got == pytest.approx({1: 20 / 12, 2: 2.0, 3: 1.0})
    s = summary(ms)
    assert s["best_k"] == 2 and s["ceiling"] == 2.0
    assert s["verify_ratio"] == {"1": 1.0, "2": 1.2, "3": 1.5, "4": 4.0}


@pytest.mark.parametrize("batch", [1, 3])
def test_every_width_is_timed_at_every_batch(batch):
    ms = forward_ms_by_width(tiny_model(0), batch, [1, 2, 3], context=5, reps=2)
    assert sorted(ms) == [1, 2, 3]
    assert all(v > 0 for v in ms.values())


def test_batch_list_is_checked():
    assert _batches("4,1,2,4") == [1, 2, 4]
    for bad in ("0", "", "1,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="--batch"):
            _batches(bad)
