"""The speculative step's math: exact target distribution, expected tokens per step, greedy verify."""

from __future__ import annotations

import pytest
import torch

from serving.sampling import SamplingParams, logits_to_probs
from serving.speculative import expected_tokens_per_step, greedy_verify, rejection_sample

P = torch.tensor([0.40, 0.25, 0.20, 0.10, 0.05])
Q = torch.tensor([0.10, 0.30, 0.05, 0.40, 0.15])


def _run_trials(k: int, trials: int, seed: int = 1234):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(P))
    emitted_total = 0
    for _ in range(trials):
        drafts = torch.multinomial(Q, k, replacement=True, generator=gen)
        out = rejection_sample(P.expand(k + 1, -1), Q.expand(k, -1), drafts, gen)
        emitted_total += len(out)
        counts[out[0]] += 1
    return counts / trials, emitted_total / trials


def test_first_emitted_token_follows_target_distribution():
    freq, _ = _run_trials(k=3, trials=20_000)
    assert torch.allclose(freq, P, atol=0.012), (freq, P)
    # and clearly not the draft's distribution
    assert (freq - Q).abs().max() > 0.2


def test_all_emitted_tokens_follow_target_distribution():
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(len(P))
    n = 0
    for _ in range(8_000):
        drafts = torch.multinomial(Q, 4, replacement=True, generator=gen)
        for t in rejection_sample(P.expand(5, -1), Q.expand(4, -1), drafts, gen):
            counts[t] += 1
            n += 1
    assert torch.allclose(counts / n, P, atol=0.012)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_mean_emitted_tokens_matches_formula(k):
    alpha = float(torch.minimum(P, Q).sum())  # acceptance probability of one draft token
    _, mean_emitted = _run_trials(k=k, trials=15_000, seed=k)
    assert mean_emitted == pytest.approx(expected_tokens_per_step(alpha, k), abs=0.03)


def test_identical_draft_accepts_everything_and_adds_bonus():
    drafts = torch.tensor([0, 1, 2])
    out = rejection_sample(P.expand(4, -1), P.expand(3, -1), drafts, torch.Generator().manual_seed(0))
    assert out[:3] == [0, 1, 2] and len(out) == 4


def test_rejected_token_never_resampled_when_target_gives_it_zero():
    p = torch.tensor([0.0, 1.0, 0.0])
    q = torch.tensor([1.0, 0.0, 0.0])
    out = rejection_sample(p.expand(2, -1), q.expand(1, -1), torch.tensor([0]))
    assert out == [1]


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="K\\+1"):
        rejection_sample(P.expand(2, -1), Q.expand(2, -1), torch.tensor([0, 1]))


def test_greedy_verify_accepts_prefix_then_target_argmax():
    logits = torch.full((4, 6), -1.0)
    for row, best in enumerate([2, 5, 1, 3]):
        logits[row, best] = 1.0
    assert greedy_verify(logits, torch.tensor([2, 5, 4])) == [2, 5, 1]
    assert greedy_verify(logits, torch.tensor([2, 5, 1])) == [2, 5, 1, 3]
    assert greedy_verify(logits, torch.tensor([0, 5, 1])) == [2]
    assert greedy_verify(logits[:1], torch.tensor([], dtype=torch.long)) == [2]


def test_expected_tokens_limits():
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)


def test_top_k_and_top_p():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    p = logits_to_probs(logits, 1.0, top_k=2)
    assert p[2] == 0 and p[3] == 0 and p.sum() == pytest.approx(1.0)
    full = logits.softmax(-1)
    p = logits_to_probs(logits, 1.0, top_p=float(full[0]) + 1e-4)  # needs the first two tokens
    assert (p > 0).tolist() == [True, True, False, False]
    p = logits_to_probs(logits, 1.0, top_p=0.1)  # the top token alone
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("top_p", [1e-30, 1e-46, 1e-300])
def test_a_top_p_below_float32s_range_keeps_the_top_token(top_p):
    """A top_p that float32 holds only as 0 (1e-46, 1e-300) dropped every token: NaN probabilities."""
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 5.0, 1.0, 0.0]])
    p = logits_to_probs(logits, 0.7, top_p=top_p)
    assert p.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"top_k": -1}, "top_k"),
    ({"temperature": float("nan")}, "temperature"),
])
def test_sampling_params_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)
