"""Token-tree drafting: the tree's bookkeeping, exact verification, tree attention and the engine's tree step."""

from __future__ import annotations

import math

import pytest
import torch

from serving.drafters import FeatureDrafter, HybridDrafter, ModelDrafter, NgramDrafter, TreeShape, select_tree
from serving.eagle import EagleDraft
from serving.engine import Engine, EngineError
from serving.llama import KVCache, compact_path, contiguous_batch, tree_batch
from serving.lookahead import FixedK
from serving.sampling import SamplingParams
from serving.speculative import TokenTree, tree_greedy_verify, tree_rejection_sample
from tests.test_engine import DRAFT, FEATURE, GREEDY, PROMPTS, SHORT, TARGET, ar_outputs
from tests.tiny import TINY

torch.set_num_threads(1)

#        root
#       /  |  \
#     a=7 b=3 c=4        tree indices 1, 2, 3
#     / \       \
#   d=1 e=2     f=0      tree indices 4, 5, 6
#    |
#   g=9                  tree index 7
TREE = TokenTree(tokens=[7, 3, 4, 1, 2, 0, 9], parents=[0, 0, 0, 1, 1, 3, 4])


def test_tree_bookkeeping():
    assert len(TREE) == 7
    assert TREE.depths() == [0, 1, 1, 1, 2, 2, 2, 3]
    assert TREE.children() == [[1, 2, 3], [4, 5], [], [6], [7], [], [], []]
    anc = TREE.ancestors(10)
    assert anc.shape == (10, 10)
    assert anc[7].nonzero().flatten().tolist() == [0, 1, 4, 7]  # g sees the root, a, d and itself
    assert anc[6].nonzero().flatten().tolist() == [0, 3, 6]
    assert anc[9].nonzero().flatten().tolist() == [9]  # padding sees only itself
    assert TREE.truncate(1).tokens == [7, 3, 4] and TREE.truncate(2).parents == [0, 0, 0, 1, 1, 3]
    assert TREE.head(4).tokens == [7, 3, 4, 1]
    chain = TokenTree.chain([5, 6, 7])
    assert chain.parents == [0, 1, 2] and chain.depths() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="parent 3 must be an earlier tree index"):
        TokenTree([1, 2], [0, 3])
    with pytest.raises(ValueError, match="2 tokens but 1 parents"):
        TokenTree([1, 2], [0])


def _logits_with_argmax(best: list[int], vocab: int = 12) -> torch.Tensor:
    logits = torch.zeros(len(best), vocab)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


def test_greedy_tree_verify_follows_the_targets_argmax_down_any_branch():
    # root -> a (index 1), a -> d (index 4), d -> g (index 7), then g's argmax 5 is the bonus token
    best = [7, 1, 0, 0, 9, 0, 0, 5]
    assert tree_greedy_verify(_logits_with_argmax(best), TREE) == ([7, 1, 9, 5], [1, 4, 7])
    # the second sibling: root -> c (index 3) -> f (index 6, a leaf): bonus from f's row
    best = [4, 0, 0, 0, 0, 0, 11, 0]
    assert tree_greedy_verify(_logits_with_argmax(best), TREE) == ([4, 0, 11], [3, 6])
    # nothing matches at the root: one corrected token
    best = [8, 0, 0, 0, 0, 0, 0, 0]
    assert tree_greedy_verify(_logits_with_argmax(best), TREE) == ([8], [])


def test_tree_rejection_sampling_emits_exactly_the_targets_distribution():
    """Each node's row is a different distribution; the first token must follow the root's row, the second
    the row of the node the first one was accepted at (or nothing follows a corrected token)."""
    vocab = 5
    gen = torch.Generator().manual_seed(11)
    rows = torch.softmax(torch.randn(4, vocab, generator=gen) * 1.5, -1)
    rows[0] = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10])
    rows[2, 4] = 0.0  # the row of the leaf at index 2 gives token 4 no mass: never emitted after it
    rows[2] /= rows[2].sum()
    # the root's children: 2 (index 1), 0 (index 2), 4 (index 3); index 1's children: 4 (index 4), 1 (index 5)
    tree = TokenTree(tokens=[2, 0, 4, 4, 1], parents=[0, 0, 0, 1, 1])
    probs = torch.stack([rows[0], rows[1], rows[2], rows[3], rows[3], rows[3]])  # (1 + nodes, V)
    trials = 30_000
    first = torch.zeros(vocab)
    second = torch.zeros(vocab, vocab)
    lengths = torch.zeros(4)
    for _ in range(trials):
        out, path = tree_rejection_sample(probs, tree, gen)
        assert out[: len(path)] == [tree.tokens[i - 1] for i in path]
        first[out[0]] += 1
        lengths[len(out)] += 1
        if len(out) > 1:
            second[out[0], out[1]] += 1
    assert torch.allclose(first / trials, rows[0], atol=0.01), first / trials
    # after 2 (accepted at index 1) the next token follows index 1's row
    assert torch.allclose(second[2] / second[2].sum(), rows[1], atol=0.02)
    # after 0 (accepted at index 2, a leaf) the bonus follows index 2's row, which gives token 4 no mass
    assert torch.allclose(second[0] / second[0].sum(), rows[2], atol=0.02) and second[0, 4] == 0
    # 1 and 3 are not children of the root: emitted as corrections, nothing after them
    assert second[1].sum() == 0 and second[3].sum() == 0
    assert lengths[3] > 0  # some steps accepted two draft tokens (2 then 4 or 1) plus one more


def test_select_tree_keeps_the_best_paths_with_their_ancestors_breadth_first():
    tokens = [10, 11, 12, 13, 14, 15]
    scores = [-0.1, -1.0, -0.3, -0.5, -2.0, -0.4]
    parents = [-1, -1, 0, 0, 1, 2]  # 12, 13 under 10; 14 under 11; 15 under 12
    tree = select_tree(tokens, scores, parents, nodes=4)
    assert tree.tokens == [10, 12, 13, 15]  # breadth first, likelier sibling first
    assert tree.parents == [0, 1, 1, 2]
    # a floor drops whatever the draft thinks is less likely than it
    tree = select_tree(tokens, scores, parents, nodes=10, floor=math.log(0.65))
    assert tree.tokens == [10, 12, 15] and tree.parents == [0, 1, 2]
    assert len(select_tree(tokens, scores, parents, nodes=10, floor=0.0)) == 0


def test_tree_shape_parses_and_refuses_bad_shapes():
    assert TreeShape.parse("16") == TreeShape(16)
    assert TreeShape.parse("16:5:3:0.2") == TreeShape(16, 5, 3, 0.2)
    assert TreeShape.parse("8:4:2").label == "tree:8:4:2:0"
    for bad in ("", "x", "16:0", "0", "8:4:2:1.5", "1:2:3:0.1:9"):
        with pytest.raises(ValueError, match="tree"):
            TreeShape.parse(bad)


def _prefilled(prompt: list[int]) -> KVCache:
    cache = TARGET.new_cache(1, 128)
    TARGET(torch.tensor([prompt]), contiguous_batch(0, 1, 0, len(prompt)), cache)
    return cache


@torch.inference_mode()
def test_tree_attention_scores_every_branch_as_if_it_were_fed_alone_and_compaction_keeps_the_path():
    prompt = PROMPTS[2][:12]
    cache = _prefilled(prompt[:-1])
    start, last = len(prompt) - 1, prompt[-1]  # the root is the last prompt token, not yet in the cache
    feed = torch.tensor([[last, *TREE.tokens]])
    fb = tree_batch([0], [start], torch.tensor([TREE.depths()]), TREE.ancestors()[None])
    logits = TARGET(feed, fb, cache)[0]  # (1 + nodes, V)
    for node in range(1, len(TREE) + 1):
        path, i = [], node
        while i:
            path.insert(0, TREE.tokens[i - 1])
            i = TREE.parents[i - 1]
        ref_cache = _prefilled(prompt[:-1])
        chain = torch.tensor([[last, *path]])
        ref = TARGET(chain, contiguous_batch(0, 1, start, chain.shape[1]), ref_cache)[0, -1]
        assert torch.allclose(logits[node], ref, atol=1e-4), node
    # accept a -> d -> g (tree indices 1, 4, 7): after compaction the cache continues that path exactly
    compact_path(cache, 0, start, [1, 4, 7])
    nxt = torch.tensor([[5]])
    got = TARGET(nxt, contiguous_batch(0, 1, start + 4, 1), cache)[0, -1]
    ref_cache = _prefilled(prompt[:-1] + [last, 7, 1, 9])
    want = TARGET(nxt, contiguous_batch(0, 1, start + 4, 1), ref_cache)[0, -1]
    assert torch.allclose(got, want, atol=1e-4)


def tree_drafters():
    return {
        "feature": lambda slots: FeatureDrafter(FEATURE, "feature", slots=slots, max_len=256),
        "feature+ngram": lambda slots: HybridDrafter(FeatureDrafter(FEATURE, "feature", slots=slots, max_len=256)),
        "ngram": lambda slots: NgramDrafter(),
    }


@pytest.mark.parametrize("name", list(tree_drafters()))
@pytest.mark.parametrize("shape", ["1:1:1", "6:3:2", "12:5:3", "24:6:4:0.05"])
def test_greedy_tree_decoding_equals_ar(name, shape):
    reference = ar_outputs()
    tree = TreeShape.parse(shape)
    events = []
    engine = Engine(TARGET, drafter=tree_drafters()[name](1), policy=FixedK(tree.depth), max_batch=1, max_len=200,
                    tree=tree, on_step=events.append)
    for prompt, ref in zip(PROMPTS, reference, strict=True):
        assert engine.generate(prompt, GREEDY).output == ref
    steps = [e for e in events if e.step_index >= 0]
    assert all(e.k <= tree.nodes and e.accepted <= tree.depth for e in steps)
    assert len(steps) < sum(len(r) for r in reference)  # drafts were accepted: fewer steps than tokens


def test_tree_decoding_accepts_more_than_a_chain_of_the_same_depth():
    counts = {}
    for label, tree in (("chain", None), ("tree", TreeShape(24, 4, 4))):
        engine = Engine(TARGET, drafter=tree_drafters()["feature"](1), policy=FixedK(4), max_len=200, tree=tree)
        seqs = [engine.generate(p, GREEDY) for p in PROMPTS]
        counts[label] = sum(s.step_index for s in seqs)  # steps taken for the same tokens
    assert counts["tree"] < counts["chain"]


def test_batched_tree_sequences_joining_and_leaving_equal_solo():
    reference = ar_outputs()
    engine = Engine(TARGET, drafter=tree_drafters()["feature+ngram"](3), policy=FixedK(5), max_batch=3,
                    max_len=200, tree=TreeShape(12, 5, 3))
    pending = list(enumerate(PROMPTS))
    seqs = {}
    while pending or engine.running:
        while pending and engine.free_slots:
            i, p = pending.pop(0)
            params = SamplingParams(max_new_tokens=40 if i % 2 else 25)  # different lengths: they leave apart
            seqs[i] = engine.add(p, params)
        engine.step()
    for i, ref in enumerate(reference):
        n = 40 if i % 2 else 25
        assert seqs[i].output == ref[:n]


def test_tree_sampling_is_seeded_and_reproducible():
    params = SamplingParams(temperature=0.9, max_new_tokens=24, seed=3)
    outs = []
    for _ in range(2):
        engine = Engine(TARGET, drafter=tree_drafters()["feature+ngram"](1), policy=FixedK(4), max_len=200,
                        tree=TreeShape(10, 4, 3))
        outs.append(engine.generate(PROMPTS[0], params).output)
    assert outs[0] == outs[1] and len(outs[0]) == 24


def test_tree_needs_a_drafter_that_can_grow_trees():
    with pytest.raises(EngineError, match="cannot propose token trees"):
        Engine(TARGET, drafter=ModelDrafter(DRAFT, "draft", slots=1, max_len=220), policy=FixedK(3), tree=TreeShape(8))
    with pytest.raises(EngineError, match="cannot propose token trees"):
        Engine(TARGET, tree=TreeShape(8))


def test_a_tree_never_outgrows_the_cache_or_the_token_budget():
    # a context window of the model's positions: the cache's rows past them are the tree's spare indices only
    cfg_max = TINY.max_position
    engine = Engine(TARGET, drafter=tree_drafters()["feature"](1), policy=FixedK(6), max_len=cfg_max,
                    tree=TreeShape(40, 6, 4))
    prompt = list(range(1, 90)) * 2 + [3] * 50  # 228 tokens: ~28 left before the window is full
    seq = engine.generate(prompt, SamplingParams(max_new_tokens=100))
    assert seq.finish_reason == "length" and len(seq.tokens) <= cfg_max
    ref = Engine(TARGET, max_len=cfg_max).generate(prompt, SamplingParams(max_new_tokens=100))
    assert seq.output == ref.output


@pytest.mark.parametrize("drafter", ["feature", "ngram"])
@pytest.mark.parametrize("shape", ["8:4:2", "12:5:3"])
def test_a_sequence_at_the_window_end_batched_with_a_wider_tree_equals_solo(drafter, shape, monkeypatch):
    """A sequence near the end of a window as long as the target's positions, its tree cut to what it may
    still grow, beside one verifying a full tree: the batch pads the first to the widest tree and writes its
    padding at its start + column, past its last position. A cache clamped to the target's positions had no
    room there (IndexError, and the whole step failed: every running sequence with it); the tree's indices
    are spare cache rows, not positions, and no position fed to the rope table reaches the window's end."""
    window = SHORT.cfg.max_position
    tree = TreeShape.parse(shape)
    make = {"feature": lambda: FeatureDrafter(EagleDraft.init_from_target(SHORT, torch.arange(64)).eval(), "f",
                                              slots=2, max_len=window + 16),
            "ngram": lambda: NgramDrafter()}[drafter]
    prompts = [[5, 6, 7, 8, 9] * 4, [(i * 7) % 90 + 1 for i in range(window - 8)]]
    params = SamplingParams(max_new_tokens=40)
    solo = [Engine(SHORT, max_len=window).generate(p, params).output for p in prompts]
    fed = []
    forward = SHORT.forward

    def recording(tokens, fb, cache, **kw):
        fed.append((int(fb.positions.max()), fb.positions.shape[1]))
        return forward(tokens, fb, cache, **kw)

    monkeypatch.setattr(SHORT, "forward", recording)
    engine = Engine(SHORT, drafter=make(), policy=FixedK(tree.depth), max_batch=2, max_len=window, tree=tree)
    seqs = [engine.add(p, params) for p in prompts]
    while engine.running:
        engine.step()
    assert [s.output for s in seqs] == solo
    assert seqs[1].finish_reason == "length" and len(seqs[1].tokens) == window - 1
    assert max(p for p, _ in fed) < window - 1  # a real token's position: the context holds window - 1
    assert any(width > 1 for _, width in fed[2:])  # tree steps verified drafts beside the long sequence


def test_a_sequence_that_opts_out_decodes_ar_inside_a_tree_batch():
    reference = ar_outputs()
    engine = Engine(TARGET, drafter=tree_drafters()["feature"](2), policy=FixedK(4), max_batch=2, max_len=200,
                    tree=TreeShape(8, 4, 2))
    a = engine.add(PROMPTS[0], GREEDY)
    b = engine.add(PROMPTS[1], GREEDY, speculate=False)
    while engine.running:
        engine.step()
    assert a.output == reference[0] and b.output == reference[1]
    assert a.num_drafts > 0 and b.num_drafts == 0


class _OracleTree:
    """Offers a wrong token and the target's next greedy token at the root, then the one after that below
    the right one: every step accepts two drafts and ends at a leaf, with three nodes verified."""

    needs_features, name = False, "oracle"

    def __init__(self, reference: list[int]):
        self.reference = reference

    def prefill(self, seq, features=None):
        pass

    def commit(self, seq, num_before, accepted, features=None):
        pass

    def propose_tree(self, seqs, shape):
        trees = []
        for s in seqs:
            nxt = self.reference[len(s.output) : len(s.output) + 2]
            wrong = (nxt[0] + 1) % TINY.vocab_size
            trees.append(TokenTree([wrong, nxt[0], nxt[1]], [0, 0, 2]) if len(nxt) == 2 else TokenTree([], []))
        return trees


def test_tree_step_events_label_bonus_and_correction_tokens():
    reference = ar_outputs()[2]
    events = []
    engine = Engine(TARGET, drafter=_OracleTree(reference + [0, 0]), policy=FixedK(3), max_len=200,
                    tree=TreeShape(6, 3, 2), on_step=events.append)
    seq = engine.generate(PROMPTS[2], GREEDY)
    assert seq.output == reference
    steps = [e for e in events if e.step_index >= 0 and len(e.tokens) == 3]
    assert len(steps) >= 10
    # the path ended at a leaf: its last token is a bonus although only 2 of the 3 nodes were accepted
    assert all(e.k == 3 and e.accepted == 2 and e.sources == ("accepted", "accepted", "bonus") for e in steps)


def test_a_tree_step_cut_by_an_eos_counts_only_the_drafts_it_kept():
    """The oracle's steps accept two drafts and emit a bonus; an EOS at a step's first accepted draft ends the
    request there: that step counts one accepted draft, not the two the target verified."""
    reference = ar_outputs()[2]
    # the prefill emits token 0, each step tokens 3j+1, 3j+2 (accepted) and 3j+3 (bonus)
    i = next(i for i in range(4, len(reference)) if i % 3 == 1 and reference.index(reference[i]) == i)
    events = []
    engine = Engine(TARGET, drafter=_OracleTree(reference + [0, 0]), policy=FixedK(3), max_len=200,
                    tree=TreeShape(6, 3, 2), eos_ids=[reference[i]], on_step=events.append)
    seq = engine.generate(PROMPTS[2], GREEDY)
    assert seq.output == reference[: i + 1] and seq.finish_reason == "stop"
    last = events[-1]
    assert (last.k, last.accepted, last.tokens, last.sources) == (3, 1, (reference[i],), ("accepted",))
    assert seq.num_accepted == sum(e.accepted for e in events) == 2 * (len(events) - 2) + 1
