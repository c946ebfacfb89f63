"""Sampled speculative decoding emits exactly the target's distribution, end to end through the Engine.

A target with a 24-token vocabulary lets the exact joint of the first output tokens be enumerated from the
target's processed probabilities (temperature, top_k, top_p: what AR samples from). Thousands of seeded
requests go through the real Engine in batches and the empirical distribution of the first tokens the
speculative steps emit (o1 alone and the pair (o1, o2), which catches dependence between the tokens of one
step) is held against the exact one: total variation under twice what sampling noise alone gives (the
noise measured by drawing as many tokens from the exact distribution). AR runs the same check as a control.

Longer outputs, where lookahead policies reach their steady state and prompt lookup finds matches in the
output itself, are checked token by token against the target's exact conditional given each sequence's own
prefix (a martingale test: under exactness the surprisal and the top-1 hits have known means whatever the
prefixes are).
"""

from __future__ import annotations

import pytest
import torch

from serving.drafters import FeatureDrafter, HybridDrafter, ModelDrafter, NgramDrafter, TreeShape
from serving.eagle import EagleDraft
from serving.engine import Engine
from serving.llama import ModelConfig, contiguous_batch
from serving.lookahead import FixedK, parse_policy
from serving.sampling import SamplingParams, logits_to_probs
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
END = V  # "nothing emitted here" (after EOS or the length cap)
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


# ---------------------------------------------------------------- exact distributions and the TV check
@torch.inference_mode()
def exact_first_tokens(prompt: list[int], params: SamplingParams, eos: tuple[int, ...] = (), tokens: int = 3,
                       max_len: int = ML) -> torch.Tensor:
    """Joint of the first `tokens` output symbols over (V + 1)^tokens (END after EOS / the length cap), by
    enumerating every prefix through the target's processed probabilities."""
    cap = min(tokens, params.max_new_tokens, max_len - 1 - len(prompt))
    joint = torch.zeros([V + 1] * tokens, dtype=torch.float64)
    prefixes, mass = torch.tensor([prompt]), torch.ones(1, dtype=torch.float64)
    keys: list[tuple[int, ...]] = [()]
    for depth in range(cap):
        n, length = prefixes.shape
        logits = TARGET(prefixes, contiguous_batch(0, n, 0, length), TARGET.new_cache(n, length + 1),
                        last_only=True)[:, -1]
        p = logits_to_probs(logits, params.temperature, params.top_k, params.top_p).double() * mass[:, None]
        grow = []
        for r, key in enumerate(keys):
            for t in (p[r] > 0).nonzero()[:, 0].tolist():
                if t in eos or depth + 1 == cap:
                    joint[key + (t,) + (END,) * (tokens - len(key) - 1)] += p[r, t]
                else:
                    grow.append((r, t))
        if not grow:
            break
        prefixes = torch.tensor([prefixes[r].tolist() + [t] for r, t in grow])
        mass = torch.stack([p[r, t] for r, t in grow])
        keys = [keys[r] + (t,) for r, t in grow]
    assert abs(float(joint.sum()) - 1) < 1e-6
    return joint


def tv_and_noise(counts: torch.Tensor, exact: torch.Tensor, draws: int = 64) -> tuple[float, float]:
    """TV between the empirical and exact distributions, and the mean TV of as many draws from the exact
    distribution (what sampling noise alone gives; the normal approximation overstates it for rare cells)."""
    n = int(counts.sum())
    e = (exact / exact.sum()).flatten().float()
    tv = 0.5 * float((counts.flatten().float() / n - e).abs().sum())
    gen = torch.Generator().manual_seed(0)
    null = [0.5 * float((torch.bincount(torch.multinomial(e, n, replacement=True, generator=gen),
                                        minlength=e.numel()).float() / n - e).abs().sum()) for _ in range(draws)]
    return tv, sum(null) / draws


def sample_first_tokens(engine: Engine, prompt: list[int], params: SamplingParams, n: int, tokens: int = 3,
                        batch: int = 32, seed0: int = 0, neighbours=(), join: bool = False) -> torch.Tensor:
    """Counts of the first `tokens` output symbols of n seeded requests, `batch` at a time; `neighbours`
    (prompt, params, speculate) requests decode beside them, unscored. With `join`, requests join the running
    batch as soon as others leave it (a neighbour after every 8th)."""
    counts = torch.zeros([V + 1] * tokens)
    seqs: list = []

    def add(i: int) -> None:
        seqs.append(engine.add(prompt, SamplingParams(**{**_fields(params), "seed": seed0 + i})))

    if join:
        i = 0
        while i < n or engine.running:
            while i < n and engine.free_slots:
                add(i)
                i += 1
                if neighbours and i % 8 == 0 and engine.free_slots:
                    p, par, speculate = neighbours[(i // 8) % len(neighbours)]
                    engine.add(p, par, speculate=speculate)
            engine.step()
    else:
        for start in range(0, n, batch):
            for i in range(start, min(start + batch, n)):
                add(i)
            for p, par, speculate in neighbours:
                engine.add(p, par, speculate=speculate)
            while engine.running:
                engine.step()
    for s in seqs:
        out = s.output[:tokens]
        counts[tuple(out + [END] * (tokens - len(out)))] += 1
    return counts


def _fields(params: SamplingParams) -> dict:
    return {f: getattr(params, f) for f in params.__slots__}


def assert_exact(counts: torch.Tensor, exact: torch.Tensor, label: str = "") -> list[tuple[str, float, float]]:
    """o1 alone and the pair (o1, o2) (o0 comes from the prefill, AR's own sampler) within 2x the noise."""
    views = {"o1": (1,), "o1o2": (1, 2)}
    out = []
    for name, keep in views.items():
        drop = tuple(a for a in range(counts.dim()) if a not in keep)
        tv, noise = tv_and_noise(counts.sum(drop), exact.sum(drop))
        out.append((name, tv, noise))
    assert all(tv < 2 * noise for _, tv, noise in out), (label, out)
    return out


# ---------------------------------------------------------------- the matrix
T1 = SamplingParams(temperature=1.0, max_new_tokens=3)
CUT = SamplingParams(temperature=0.8, top_k=5, max_new_tokens=3)  # q outside p's support: residual is p
NUCLEUS = SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=4)
BOTH = SamplingParams(temperature=1.0, top_k=6, top_p=0.9, max_new_tokens=4)

# (drafter, policy, tree shape, params): every drafter, every policy family, chains and trees, with and without
# top_k / top_p; max_new_tokens 3 lets the first step draft one token (o2 is its bonus when o1 is accepted),
# 4 lets it draft two (o1 and o2 both verified drafts)
MATRIX = [
    ("draft", "1", None, T1),
    ("sharp", "2", None, CUT),
    ("self", "2", None, NUCLEUS),  # q = p: everything accepted, the bonus comes from p
    ("early-exit", "heuristic", None, BOTH),
    ("ngram", "1", None, CUT),  # one-hot q: accept with p(x), else p without x
    ("feature", "entropy", None, T1),
    ("feature+copy", "cost", None, NUCLEUS),
    ("feature+copy+ngram", "auto", None, BOTH),
    ("sharp+ngram", "auto", None, T1),
    ("feature+copy", "3", "8:3:3", T1),  # several children per node: rejection without replacement
    ("feature+copy+ngram", "3", "6:3:2", CUT),
    ("ngram", "3", "4:3:1", NUCLEUS),
]


@pytest.mark.parametrize("name,policy,tree,params", MATRIX,
                         ids=[f"{d}-{p}-{t or 'chain'}-t{s.temperature}k{s.top_k}p{s.top_p}"
                              for d, p, t, s in MATRIX])
def test_sampled_spec_emits_the_targets_first_tokens(name, policy, tree, params):
    engine = Engine(TARGET, drafter=drafter(name, 32), policy=parse_policy(policy), max_batch=32, max_len=ML,
                    tree=TreeShape.parse(tree) if tree else None)
    counts = sample_first_tokens(engine, PROMPT, params, n=1024)
    assert_exact(counts, exact_first_tokens(PROMPT, params), f"{name} {policy} {tree}")


def test_ar_control_passes_the_same_check():
    counts = sample_first_tokens(Engine(TARGET, max_batch=32, max_len=ML), PROMPT, BOTH, n=1024)
    assert_exact(counts, exact_first_tokens(PROMPT, BOTH), "ar")


def test_the_check_catches_a_biased_sampler(monkeypatch):
    """The same check fails on a verifier that accepts every draft (it emits the draft's distribution)."""
    def accept_all(p, q, drafts, generator=None):
        return drafts.tolist() + [int(torch.multinomial(p[-1], 1, generator=generator))]

    monkeypatch.setattr("serving.engine.rejection_sample", accept_all)
    engine = Engine(TARGET, drafter=drafter("sharp", 32), policy=FixedK(1), max_batch=32, max_len=ML)
    counts = sample_first_tokens(engine, PROMPT, T1, n=512)
    with pytest.raises(AssertionError):
        assert_exact(counts, exact_first_tokens(PROMPT, T1))


def test_stops_batches_that_join_and_leave_and_opted_out_neighbours():
    """EOS inside the first tokens while requests join the running batch as others leave it, beside requests of
    other lengths and temperatures, greedy ones and one that opted out; then the context limit cutting the
    output after two tokens."""
    eos = (int(exact_first_tokens(PROMPT, T1).sum((0, 2)).argmax()),)  # the likeliest o1 is an EOS
    neighbours = [([5, 9, 14, 7], SamplingParams(max_new_tokens=7), True),  # greedy
                  ([3, 3, 3, 3], SamplingParams(temperature=0.5, max_new_tokens=9, seed=7), False),  # opted out
                  (list(range(1, 20)), SamplingParams(temperature=1.5, top_k=3, max_new_tokens=5, seed=9), True)]
    params = SamplingParams(temperature=1.0, max_new_tokens=5)
    engine = Engine(TARGET, drafter=drafter("feature+copy+ngram", 16), policy=FixedK(3), max_batch=16, max_len=ML,
                    eos_ids=eos)
    counts = sample_first_tokens(engine, PROMPT, params, n=768, neighbours=neighbours, join=True)
    assert_exact(counts, exact_first_tokens(PROMPT, params, eos=eos), "eos + neighbours")
    assert counts[:, eos[0]].sum() > 100  # EOS was emitted (and ended the output) often
    short = len(PROMPT) + 3  # room for two output tokens
    engine = Engine(TARGET, drafter=drafter("sharp+ngram", 32), policy=FixedK(4), max_batch=32, max_len=short)
    counts = sample_first_tokens(engine, PROMPT, params, n=768)
    assert_exact(counts, exact_first_tokens(PROMPT, params, max_len=short), "context limit")
    assert counts[..., :END].sum() == 0  # never a third token


# ---------------------------------------------------------------- long outputs, token by token
@torch.inference_mode()
def calibration(outputs: list[tuple[list[int], list[int]]], params: SamplingParams) -> tuple[float, float]:
    """z-scores of the total surprisal and of the top-1 hits of every emitted token against the target's exact
    conditional given the sequence's own prefix (teacher-forced). Both are sums of martingale differences under
    exactness: about N(0, 1) whatever the prefixes."""
    surprise = var_s = hits = var_h = 0.0
    for prompt, out in outputs:
        toks = prompt + out
        logits = TARGET(torch.tensor([toks]), contiguous_batch(0, 1, 0, len(toks)), TARGET.new_cache(1, len(toks)))[0]
        p = logits_to_probs(logits[len(prompt) - 1 : -1], params.temperature, params.top_k, params.top_p).double()
        x = torch.tensor(out)
        px = p[torch.arange(len(out)), x]
        assert (px > 0).all(), "a token the target's cut-offs exclude was emitted"
        logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
        h = -(p * logp).sum(-1)
        surprise += float((-px.log() - h).sum())
        var_s += float(((p * logp**2).sum(-1) - h**2).sum())
        top = p.max(-1)
        hits += float(((x == top.indices).double() - top.values).sum())
        var_h += float((top.values * (1 - top.values)).sum())
    return surprise / var_s**0.5, hits / var_h**0.5


LONG = [("sharp", "auto", None), ("feature+copy+ngram", "cost", None), ("sharp+ngram", "entropy", None),
        ("feature+copy", "heuristic", None), ("feature+copy+ngram", "6", "12:4:3")]


@pytest.mark.parametrize("name,policy,tree", LONG, ids=[f"{d}-{p}-{t or 'chain'}" for d, p, t in LONG])
def test_long_sampled_outputs_follow_the_targets_conditionals(name, policy, tree):
    params = SamplingParams(temperature=1.0, top_k=12, max_new_tokens=40)
    prompts = [PROMPT, [5, 9, 14, 7], [3, 8, 3, 8, 3, 8, 3]]
    engine = Engine(TARGET, drafter=drafter(name, 16), policy=parse_policy(policy), max_batch=16, max_len=ML,
                    tree=TreeShape.parse(tree) if tree else None)
    seqs = []
    for i in range(0, 96, 16):
        seqs += [(prompts[(i + j) % 3], engine.add(prompts[(i + j) % 3],
                                                    SamplingParams(**{**_fields(params), "seed": 100 + i + j})))
                 for j in range(16)]
        while engine.running:
            engine.step()
    assert sum(s.num_accepted for _, s in seqs) > 100  # drafts were accepted
    z_surprise, z_top = calibration([(p, s.output) for p, s in seqs], params)
    assert abs(z_surprise) < 4 and abs(z_top) < 4, (z_surprise, z_top)


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
