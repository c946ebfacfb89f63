"""Sampled speculative decoding through the Engine, on a target with a 24-token vocabulary."""


from __future__ import annotations

import pytest
import torch

from serving.drafters import FeatureDrafter, HybridDrafter, ModelDrafter, NgramDrafter
from serving.eagle import EagleDraft
from serving.engine import Engine
from serving.llama import ModelConfig
from serving.lookahead import FixedK
from serving.sampling import SamplingParams
from tests.tiny import tiny_model

torch.set_num_threads(1)
V = 24
SMALL = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position=256)
TARGET = tiny_model(0, SMALL, scale=1.5)  # flat enough that no token takes more than ~0.45 at temperature 1
SHARP = tiny_model(0, SMALL, scale=3.0)  # the target twice as sharp: q > p on its favourites
OTHER = tiny_model(1, SMALL, scale=1.5)  # an unrelated draft
# a feature draft whose head holds 16 of the 24 tokens: q is 0 where p is not (disjoint support)
FEATURE = EagleDraft.init_from_target(TARGET, torch.arange(16)).eval()
PROMPT = [1, 2, 3, 4, 1, 2]  # the bigram (1, 2) repeats: prompt lookup copies from the first step
ML = 96


def drafter(name: str, slots: int):
    return {
        "draft": lambda: ModelDrafter(OTHER, "draft", slots=slots, max_len=ML + 16),
        "sharp": lambda: ModelDrafter(SHARP, "sharp", slots=slots, max_len=ML + 16),
        "self": lambda: ModelDrafter(TARGET, "self", slots=slots, max_len=ML + 16),
        "early-exit": lambda: ModelDrafter(TARGET, "ee", slots=slots, max_len=ML + 16, num_layers=1),
        "ngram": lambda: NgramDrafter(),
        "feature": lambda: FeatureDrafter(FEATURE, "feature", slots=slots, max_len=ML + 16),
        "feature+copy": lambda: FeatureDrafter(FEATURE, "feature", slots=slots, max_len=ML + 16, copy_bias=3.0),
        "feature+copy+ngram": lambda: HybridDrafter(FeatureDrafter(FEATURE, "feature", slots=slots, max_len=ML + 16,
                                                                   copy_bias=3.0)),
        "sharp+ngram": lambda: HybridDrafter(ModelDrafter(SHARP, "sharp", slots=slots, max_len=ML + 16), n_min=1),
    }[name]()


def _fields(params: SamplingParams) -> dict:
    return {f: getattr(params, f) for f in params.__slots__}



# ---------------------------------------------------------------- a request that opts out of speculation
@pytest.mark.parametrize("name", ["feature", "feature+copy", "draft", "sharp+ngram"])
def test_an_opted_out_request_decodes_as_ar_would_seed_for_seed_beside_speculating_ones(name):
    """It never reaches the drafter: a feature draft kept no features for it (its second step raised
    AttributeError and failed the whole batch), and a model draft sampled a draft from its random stream every
    step, so its sampled output was not the one AR gives the same seed."""
    alone = Engine(TARGET, max_len=ML)
    for params in (SamplingParams(max_new_tokens=12), SamplingParams(temperature=1.0, top_k=8, max_new_tokens=12)):
        engine = Engine(TARGET, drafter=drafter(name, 3), policy=FixedK(3), max_batch=3, max_len=ML)
        seqs = [engine.add(p, SamplingParams(**{**_fields(params), "seed": i}), speculate=i != 1)
                for i, p in enumerate([PROMPT, [5, 9, 14, 7], [3, 8, 3, 8]])]
        while engine.running:
            engine.step()
        ar = [alone.generate(p, SamplingParams(**{**_fields(params), "seed": i}))
              for i, p in enumerate([PROMPT, [5, 9, 14, 7], [3, 8, 3, 8]])]
        assert seqs[1].output == ar[1].output and seqs[1].num_drafts == 0
        assert seqs[0].num_drafts > 0 and len(seqs[0].output) == len(seqs[2].output) == 12
        if params.greedy:
            assert [s.output for s in seqs] == [a.output for a in ar]
