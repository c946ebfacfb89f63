"""Draft distillation: data pipeline shapes, training lowers the loss, the model card, bad input."""

from __future__ import annotations

import json
import random

import pytest
import torch

from serving.distill.data import load_prepared, teacher_pass
from serving.distill.train import (
    TOKEN_KINDS,
    TrainConfig,
    _step_mask,
    distill_loss,
    new_draft,
    simulate_alpha,
    teacher_forced_agreement,
    token_kind,
    train,
)
from tests.tiny import tiny_model


def _answers(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, 96) for _ in range(rng.randrange(4, 9))]
        # a repetitive answer, so a draft can learn it quickly
        base = [rng.randrange(3, 20) for _ in range(3)]
        answer = (base * 10)[: rng.randrange(12, 24)]
        out.append({"id": f"t{i}", "domain": "code" if i % 2 else "chat", "prompt_ids": prompt, "output_ids": answer})
    return out


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    torch.manual_seed(0)
    target = tiny_model(1)
    out = tmp_path_factory.mktemp("prep")
    with torch.inference_mode():
        teacher_pass(target, _answers(24), out, topk=4, token_budget=256, progress=False)
    return target, out


def test_teacher_pass_writes_features_and_topk(prepared):
    target, out = prepared
    prep = load_prepared(out)
    n = prep.meta["num_tokens"]
    assert prep.feats.shape == (n, target.cfg.hidden_size) and prep.feats.dtype == torch.bfloat16
    assert prep.topk_ids.shape == (n, 4) and prep.topk_probs.shape == (n, 4)
    assert len(prep.seqs) == 24 and sum(s["length"] for s in prep.seqs) == n
    # the stored top-1 is the target's argmax at that position
    s = prep.seqs[0]
    toks = prep.tokens[s["offset"]: s["offset"] + s["length"]]
    from serving.llama import contiguous_batch

    with torch.inference_mode():
        logits, hidden = target(toks[None], contiguous_batch(0, 1, 0, len(toks)), target.new_cache(1, len(toks)),
                                return_hidden=True)
    assert torch.equal(prep.topk_ids[s["offset"]: s["offset"] + s["length"], 0], logits[0].argmax(-1))
    assert torch.allclose(prep.feats[s["offset"]: s["offset"] + s["length"]].float(), hidden[0].float(), atol=0.05, rtol=0.02)


def test_step_mask_matches_the_inference_cache_layout():
    m = _step_mask(4, 2)  # step 2 at p: real keys < p, own key at p
    assert m[2, :4].tolist() == [True, True, False, False] and m[2, 4:].tolist() == [False, False, True, False]
    m3 = _step_mask(5, 3)  # step 3 at p=4: real <= 2, step-2 key at 3, step-3 key at 4
    assert m3[4, :5].tolist() == [True, True, True, False, False]
    assert m3[4, 5:10].tolist() == [False, False, False, True, False]
    assert m3[4, 10:].tolist() == [False, False, False, False, True]


def test_distillation_lowers_the_loss(prepared):
    target, out = prepared
    prep = load_prepared(out)
    cfg = TrainConfig(head_vocab=32, lr=3e-3, batch_tokens=256, unroll=2, steps=40, warmup_steps=2,
                      save_every_s=1e9, feat_noise=0.0)
    draft, coverage = new_draft(target, [prep], cfg, eos_ids=(2,))
    assert 0 < coverage["chosen"] <= 1
    vocab_to_head = draft.head_index()
    from serving.distill.train import Batches

    fixed = Batches([prep], 64, 1024, 0).next()
    with torch.no_grad():
        before, _ = distill_loss(draft, fixed, cfg, vocab_to_head, 1.0, train=False)
    summary = train(draft, [prep], cfg, progress=False)
    with torch.no_grad():
        after, _ = distill_loss(draft, fixed, cfg, vocab_to_head, 1.0, train=False)
    assert summary["steps"] == 40 and summary["curve"]
    assert float(after) < 0.8 * float(before)
    res = simulate_alpha(draft, prep, k=3)
    assert set(res) == {"code", "chat"} and all(0 <= r["alpha"] <= 1 for r in res.values())


def test_a_frozen_head_keeps_the_targets_rows_and_still_learns(prepared):
    """--freeze-head: the final norm and head rows stay the target's own (the draft learns to produce
    features that head reads), everything else trains, and the loss still falls."""
    target, out = prepared
    prep = load_prepared(out)
    cfg = TrainConfig(head_vocab=32, lr=3e-3, batch_tokens=256, unroll=2, steps=40, warmup_steps=2,
                      save_every_s=1e9, feat_noise=0.0, freeze_head=True)
    draft, _ = new_draft(target, [prep], cfg, eos_ids=(2,))
    head0, norm0 = draft.head.weight.detach().clone(), draft.norm.weight.detach().clone()
    fc0, layer0 = draft.fc.weight.detach().clone(), next(draft.layers.parameters()).detach().clone()
    from serving.distill.train import Batches

    fixed = Batches([prep], 64, 1024, 0).next()
    with torch.no_grad():
        before, _ = distill_loss(draft, fixed, cfg, draft.head_index(), 1.0, train=False)
    train(draft, [prep], cfg, progress=False)
    with torch.no_grad():
        after, _ = distill_loss(draft, fixed, cfg, draft.head_index(), 1.0, train=False)
    assert torch.equal(draft.head.weight, head0) and torch.equal(draft.norm.weight, norm0)
    assert not torch.equal(draft.fc.weight, fc0) and not torch.equal(next(draft.layers.parameters()), layer0)
    # still the target's rows: head row i is the LM-head row of the i-th proposable token
    assert torch.equal(draft.head.weight, target.lm_head.weight[draft.head_token_ids].float())
    assert float(after) < 0.8 * float(before)


def test_simulated_drafting_shows_its_progress_over_the_answer_tokens_on_a_terminal(prepared, monkeypatch, capsys):
    """distill's evaluation (82 answers of up to 128 tokens, drafted token by token) was minutes of silence after
    the last training step. With `progress`, a bar over the answer tokens where stderr is a terminal; none
    without it or into a pipe or a log file, and the figures are the same."""
    import serving.distill.train as train_module

    target, out = prepared
    prep = load_prepared(out)
    draft, _ = new_draft(target, [prep], TrainConfig(head_vocab=32), eos_ids=(2,))
    total = sum(s["length"] - s["num_prompt"] for s in prep.seqs)
    monkeypatch.setattr(train_module, "stderr_is_terminal", lambda: True)
    with torch.inference_mode():
        quiet = simulate_alpha(draft, prep, k=3)
        assert capsys.readouterr().err == ""
        assert simulate_alpha(draft, prep, k=3, progress=True) == quiet
        err = capsys.readouterr().err
        assert "evaluate" in err and f"{total}/{total}" in err and "tok" in err
        code = sum(s["length"] - s["num_prompt"] for s in prep.seqs if s["domain"] == "code")
        simulate_alpha(draft, prep, k=3, domains=("code",), progress=True)  # the tokens it verifies, no others
        assert f"{code}/{code}" in capsys.readouterr().err
        monkeypatch.setattr(train_module, "stderr_is_terminal", lambda: False)
        assert simulate_alpha(draft, prep, k=3, progress=True) == quiet
        assert capsys.readouterr().err == ""


def test_simulated_drafting_asks_a_lookup_first(prepared):
    """simulate_alpha's lookup hook (draft+ngram, or a store, in front of the draft): a lookup that knows
    the answers is accepted in full, one that never answers changes nothing, a wrong one is rejected."""
    from serving.datastore import SuffixStore, answers_of

    target, out = prepared
    prep = load_prepared(out)
    draft, _ = new_draft(target, [prep], TrainConfig(head_vocab=32), eos_ids=(2,))
    store = SuffixStore.build(answers_of(out, prompt_tail=100), key=12)
    with torch.inference_mode():
        plain = simulate_alpha(draft, prep, k=3)
        assert simulate_alpha(draft, prep, k=3, lookup=lambda ctx, k: []) == plain
        known = simulate_alpha(draft, prep, k=3, lookup=lambda ctx, k: store.continuation(ctx, k).tokens)
        wrong = simulate_alpha(draft, prep, k=3, lookup=lambda ctx, k: [1] * k)
    for dom in ("code", "chat"):
        assert known[dom]["alpha"] > 0.95 and known[dom]["mean_accept_len"] > plain[dom]["mean_accept_len"]
        assert wrong[dom]["alpha"] == 0 and wrong[dom]["mean_accept_len"] == 1


def test_simulated_drafting_with_the_copy_prior(prepared):
    """simulate_alpha's copy_bias is the engine's copy prior: the head rows of the tokens that followed the
    current token earlier in the context get + b. b = 0 is plain drafting; a prior that outweighs any
    logit makes the draft propose such a follower wherever one exists, which changes what it proposes."""
    from serving.drafters import ContextFollowers

    def _followers(context, row_of):  # the index simulate_alpha grows, built in one go
        index = ContextFollowers()
        index.update(context, row_of)
        return index.rows

    # rows: token t -> head row t - 10 (tokens below 10 are not in the head)
    row_of = [-1] * 10 + list(range(10))
    assert _followers([12, 13, 12, 14, 12, 13, 5, 12], row_of) == {12: [3, 4], 13: [2], 14: [2], 5: [2]}
    assert _followers([], row_of) == {} and _followers([12], row_of) == {}
    target, out = prepared
    prep = load_prepared(out)
    draft, _ = new_draft(target, [prep], TrainConfig(head_vocab=32), eos_ids=(2,))
    with torch.inference_mode():
        plain = simulate_alpha(draft, prep, k=3)
        assert simulate_alpha(draft, prep, k=3, copy_bias=0.0) == plain
        forced = simulate_alpha(draft, prep, k=3, copy_bias=1e4)
    assert forced != plain
    assert all(0 <= r["alpha"] <= 1 for r in forced.values())


def _assert_unrolled_matches_inference(draft, prep) -> None:
    """Training's parallel steps 1 and 2 equal the cached inference forward (EagleDraft.forward) on the
    first sequence: step 1 on the real features, step 2 at p=5 on (x_6, h1[4]) over real entries < 5."""
    from serving.distill.train import unrolled_forward
    from serving.llama import contiguous_batch

    s = prep.seqs[0]
    toks = prep.tokens[s["offset"]: s["offset"] + s["length"]][None]
    feats = prep.feats[s["offset"]: s["offset"] + s["length"]].float()[None]
    with torch.no_grad():
        h1, h2 = unrolled_forward(draft, toks, feats, 2)
        T = toks.shape[1]
        nxt = torch.zeros_like(toks)
        nxt[:, :-1] = toks[:, 1:]
        cache = draft.new_cache(1, T + 2)
        h, _ = draft(nxt, feats, contiguous_batch(0, 1, 0, T), cache)
        assert torch.allclose(h, h1, atol=1e-4)
        cache = draft.new_cache(1, T + 2)
        draft(nxt[:, :5], feats[:, :5], contiguous_batch(0, 1, 0, 5), cache)
        h2_inf, _ = draft(nxt[:, 5:6], h1[:, 4:5], contiguous_batch(0, 1, 5, 1), cache)
        assert torch.allclose(h2_inf[0, 0], h2[0, 5], atol=1e-4)


def test_unrolled_step1_equals_the_inference_forward(prepared):
    """Training's parallel step 1 and the cached inference forward (EagleDraft.forward) agree."""
    target, out = prepared
    prep = load_prepared(out)

    draft, _ = new_draft(target, [prep], TrainConfig(head_vocab=32), eos_ids=(2,))
    _assert_unrolled_matches_inference(draft, prep)


def test_model_card_has_the_reproducible_command(tmp_path):
    from app.cli import build_parser
    from serving.distill.pipeline import command_line
    from serving.kernels import resolve_dtype

    args = build_parser().parse_args(["distill", "--out", str(tmp_path), "--generate-prompts", "10", "--minutes", "1",
                                      "--package-prompts", "7", "--resume"])
    args.minutes = 1.0
    cmd = command_line(args)
    assert cmd.startswith("specfinops distill ") and "--generate-prompts 10" in cmd and "--minutes 1" in cmd
    assert "--package-prompts 7" in cmd and "--stdlib-prompts" not in cmd  # unset sources are left out
    assert "--resume" not in cmd and "--head-vocab 8192" in cmd and "--seed 0" in cmd
    assert "--dtype auto" not in cmd and f"--dtype {resolve_dtype('auto')}" in cmd  # the precision used, spelled out
    assert "--freeze-head" not in cmd
    frozen = build_parser().parse_args(["distill", "--out", str(tmp_path), "--generate-prompts", "10", "--freeze-head"])
    assert "--freeze-head" in command_line(frozen).split()
    assert "--batch-pool 256" in cmd  # the default, spelled out
    unsorted = build_parser().parse_args(["distill", "--out", str(tmp_path), "--generate-prompts", "10",
                                          "--batch-pool", "0"])
    assert "--batch-pool 0" in command_line(unsorted)  # random batches: 0 is not left out as unset


def test_the_card_command_keeps_options_set_to_zero_and_parses_back_to_the_same_run(tmp_path, monkeypatch):
    """--w-feat 0, --w-hard 0 and --feat-noise 0 differ from their defaults (0.5, 0.5, 0.05): a card command
    without them retrains with the defaults. Every training option the run had comes back from the card."""
    import shlex

    import serving.distill.pipeline as pipeline
    from app.cli import build_parser
    from app.commands.distill import handle

    seen = []
    monkeypatch.setattr(pipeline, "run", lambda a: seen.append(a) or 0)  # the options as the pipeline gets them
    argv = ["distill", "--out", str(tmp_path / "d"), "--corpus", str(tmp_path), "--steps", "40", "--w-feat", "0",
            "--w-hard", "0", "--feat-noise", "0", "--seed", "0", "--batch-pool", "0", "--dtype", "float32"]
    assert handle(build_parser().parse_args(argv)) == 0
    cmd = shlex.split(pipeline.command_line(seen[0]))
    for flag in ("--w-feat", "--w-hard", "--feat-noise", "--seed", "--batch-pool"):
        assert cmd[cmd.index(flag) + 1] == "0", flag
    assert "--generate-prompts" not in cmd and "--stdlib-code" not in cmd  # 0 there is the default: no such data
    assert handle(build_parser().parse_args(cmd[1:])) == 0
    first, again = seen
    for name in pipeline.REPRO_OPTIONS:
        assert getattr(again, name) == getattr(first, name), name
    # an option whose default is 0 is left out at 0 only where 0 means "none of this data"
    defaults = build_parser().parse_args(["distill", "--out", "x"])
    zero_default = {n for n in pipeline.REPRO_OPTIONS if getattr(defaults, n, None) == 0
                    and not isinstance(getattr(defaults, n), bool)}
    assert zero_default - {"seed", "batch_pool"} <= set(pipeline.ZERO_IS_UNSET)


def test_a_negative_batch_pool_is_refused(tmp_path, capsys):
    from app.cli import main

    assert main(["distill", "--out", str(tmp_path / "d"), "--generate-prompts", "4", "--batch-pool", "-3"]) == 2
    assert "--batch-pool must be 0 (random batches) or a number of sequences, got -3" in capsys.readouterr().err


def test_a_total_budget_gives_training_what_the_data_left():
    from serving.distill.pipeline import BUDGET_MARGIN_MINUTES as m
    from serving.distill.pipeline import training_minutes

    assert training_minutes(90, 30.0) == pytest.approx(60 - m)
    assert training_minutes(90, 30.0, minutes=40) == 40  # an explicit --minutes that fits wins
    assert training_minutes(90, 80.0, minutes=40) == pytest.approx(10 - m)  # ... and is cut where it does not
    # a resumed run: TrainConfig.minutes counts the 25 minutes trained before, this run gets 60 - m more
    assert training_minutes(90, 30.0, trained_minutes=25) == pytest.approx(85 - m)
    with pytest.raises(ValueError, match="leaves no time to train"):
        training_minutes(90, 89.8)


def test_the_model_card_command_keeps_the_total_budget(tmp_path, monkeypatch):
    import serving.distill.pipeline as pipeline
    from app.cli import build_parser
    from app.commands.distill import handle

    seen = []
    monkeypatch.setattr(pipeline, "run", lambda a: seen.append(a) or 0)  # the options as the pipeline gets them
    args = build_parser().parse_args(["distill", "--out", str(tmp_path), "--generate-prompts", "10",
                                      "--total-minutes", "90"])
    assert handle(args) == 0
    a = seen[0]
    assert a.total_minutes == 90.0 and a.minutes is None  # no 30-minute default under a total budget
    cmd = pipeline.command_line(a).split()
    assert cmd[cmd.index("--total-minutes") + 1] == "90" and "--minutes" not in cmd


@pytest.mark.parametrize("argv, needle", [
    (["distill", "--out", "X", "--corpus", "/nonexistent/corpus"], "corpus"),
    (["distill", "--out", "X", "--corpus", ".", "--minutes", "-3"], "--minutes"),
    (["distill", "--out", "X"], "--corpus"),
    (["distill", "--out", "X", "--package-prompts", "-1"], "--package-prompts"),
    (["distill", "--out", "X", "--corpus", ".", "--minutes", "nan"], "--minutes"),
    (["distill", "--out", "X", "--corpus", ".", "--lr", "-1"], "--lr"),
    (["distill", "--out", "X", "--corpus", ".", "--w-feat", "nan"], "--w-feat"),
    (["distill", "--out", "X", "--corpus", ".", "--k", "0"], "--k"),
    (["distill", "--out", "X", "--corpus", ".", "--total-minutes", "0"], "--total-minutes"),
    (["distill", "--out", "X", "--corpus", ".", "--steps", "2.5"], "--steps must be a positive whole number, got '2.5'"),
    (["distill", "--out", "X", "--corpus", ".", "--total-minutes", "inf"], "--total-minutes"),
    # a budget that can never train was refused only after the target loaded and the data was made
    (["distill", "--out", "X", "--corpus", ".", "--total-minutes", "0.6"], "--total-minutes 0.6 leaves no time to train"),
    (["distill", "--out", "X", "--corpus", ".", "--total-minutes", "90", "--steps", "10"], "not both"),
    (["distill", "--out", "X", "--corpus", "/etc/hostname"], "is not a directory"),
    (["distill", "--out", "X", "--corpus", ".", "--feature-layers", "29"], "two or more"),
    (["distill", "--out", "X", "--corpus", ".", "--feature-layers", "14", "1"], "increasing order"),
    (["distill", "--out", "X", "--generate-prompts", "4", "--feature-layers", "1", "40"], "blocks 0..29"),
    (["distill", "--out", "X", "--generate-prompts", "4", "--feature-layers", "1", "14",
      "--data-feature-layers", "1", "29"], "must include"),
])
def test_bad_input_is_one_clear_line(argv, needle, capsys, tmp_path):
    from app.cli import main

    argv = [a if a != "X" else str(tmp_path / "out") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_generation_records_what_a_teacher_pass_would(tmp_path):
    """One pass: the features and top-k captured while generating equal a teacher-forcing pass over the
    same tokens, and the answers are the greedy chain (each token is the previous position's top-1)."""
    from serving.distill.data import record_generation

    torch.manual_seed(0)
    target = tiny_model(3)
    rng = random.Random(1)
    encoded = [({"id": f"g{i}", "domain": "code"}, [rng.randrange(3, 96) for _ in range(rng.randrange(3, 12))])
               for i in range(7)]
    gen = tmp_path / "gen"
    meta = record_generation(target, encoded, gen, eos=2, max_new_tokens=9, batch=3, topk=4, progress=False)
    prep = load_prepared(gen)
    assert meta["num_sequences"] == 7 and prep.meta["teacher_seconds"] == 0.0
    answers = []
    for s in prep.seqs:
        o, L, P = s["offset"], s["length"], s["num_prompt"]
        toks = prep.tokens[o: o + L].tolist()
        assert 1 <= L - P <= 9
        # greedy: every answer token is the argmax recorded at the position before it
        assert toks[P:] == prep.topk_ids[o + P - 1: o + L - 1, 0].tolist()
        answers.append({"id": s["id"], "domain": s["domain"], "prompt_ids": toks[:P], "output_ids": toks[P:]})
    ref = tmp_path / "ref"
    with torch.inference_mode():
        teacher_pass(target, answers, ref, topk=4, progress=False)
    tp = load_prepared(ref)
    by_id = {s["id"]: s for s in tp.seqs}
    for s in prep.seqs:
        r = by_id[s["id"]]
        a = slice(s["offset"], s["offset"] + s["length"])
        b = slice(r["offset"], r["offset"] + r["length"])
        assert torch.equal(prep.tokens[a], tp.tokens[b])
        assert torch.equal(prep.topk_ids[a, 0], tp.topk_ids[b, 0])
        assert torch.allclose(prep.topk_probs[a], tp.topk_probs[b], atol=2e-3)
        assert torch.allclose(prep.feats[a].float(), tp.feats[b].float(), atol=0.05, rtol=0.02)


def test_generation_resumes_after_an_interruption(tmp_path):
    from serving.distill.data import record_generation

    torch.manual_seed(0)
    target = tiny_model(3)
    encoded = [({"id": f"g{i}", "domain": "chat"}, [5 + i, 7, 9, 11]) for i in range(6)]
    full = tmp_path / "full"
    record_generation(target, encoded, full, eos=2, max_new_tokens=6, batch=2, topk=4, progress=False)
    part = tmp_path / "part"
    record_generation(target, encoded[:4], part, eos=2, max_new_tokens=6, batch=2, topk=4, progress=False)
    (part / "meta.json").unlink()  # as if stopped before the end ...
    with (part / "feats.bin").open("ab") as fh:
        fh.write(b"\0" * 100)  # ... in the middle of writing a sequence
    record_generation(target, encoded, part, eos=2, max_new_tokens=6, batch=2, topk=4, progress=False)
    a, b = load_prepared(full), load_prepared(part)
    assert sorted(s["id"] for s in b.seqs) == [f"g{i}" for i in range(6)]
    fa = {s["id"]: a.tokens[s["offset"]: s["offset"] + s["length"]].tolist() for s in a.seqs}
    fb = {s["id"]: b.tokens[s["offset"]: s["offset"] + s["length"]].tolist() for s in b.seqs}
    assert fa == fb


def test_generation_runs_shortest_prompts_first_and_answers_do_not_depend_on_the_order(tmp_path):
    """Prompts of similar length decode together (a step reads keys up to the batch's longest context):
    generation takes them shortest first, ties in their given order, and each sequence's recorded tokens,
    features and top-k are what any other order gives."""
    from serving.distill.data import record_generation, shortest_first

    entries = [({"id": f"p{i}"}, [0] * n) for i, n in enumerate([5, 2, 9, 2, 7, 5])]
    assert [e[0]["id"] for e in shortest_first(entries)] == ["p1", "p3", "p0", "p5", "p4", "p2"]

    torch.manual_seed(0)
    target = tiny_model(3)
    rng = random.Random(4)
    encoded = [({"id": f"o{i}", "domain": "code"}, [rng.randrange(3, 96) for _ in range(rng.randrange(2, 20))])
               for i in range(9)]
    runs = {}
    for name, order in (("given", encoded), ("reversed", encoded[::-1])):
        record_generation(target, order, tmp_path / name, eos=2, max_new_tokens=7, batch=3, topk=4, progress=False)
        prep = load_prepared(tmp_path / name)
        # written as they finish: the first to finish was one of the 3 shortest (the first batch), whatever
        # order the prompts came in
        assert prep.seqs[0]["num_prompt"] <= sorted(len(ids) for _, ids in encoded)[2]
        rows = {s["id"]: slice(s["offset"], s["offset"] + s["length"]) for s in prep.seqs}
        runs[name] = {pid: (prep.tokens[r].tolist(), prep.feats[r].float(), prep.topk_ids[r].tolist())
                      for pid, r in rows.items()}
    assert runs["given"].keys() == runs["reversed"].keys() == {e[0]["id"] for e in encoded}
    for pid, (toks, feats, top) in runs["given"].items():
        toks2, feats2, top2 = runs["reversed"][pid]
        assert toks == toks2 and top == top2
        assert torch.allclose(feats, feats2, atol=1e-2)


def test_stdlib_prompts_are_deterministic_code_prompts_and_never_evaluation_prompts():
    from serving.distill.prompts import _evaluation_texts, interleave, make_prompts, stdlib_prompts

    a, b = stdlib_prompts(60, seed=0), stdlib_prompts(60, seed=0)
    assert a == b and len(a) == 60 and len({p["id"] for p in a}) == 60
    assert all(p["domain"] == "code" and "answer" not in p and p["prompt"].strip() for p in a)
    assert any("```python" in p["prompt"] for p in a) and any(p["prompt"].startswith(("Write", "How", "I need", "Implement"))
                                                             for p in a)
    assert stdlib_prompts(20, seed=0) == a[:20]  # a smaller count is a prefix: cached data is reusable
    evaluation = _evaluation_texts()
    assert not any(p["prompt"] in evaluation for p in stdlib_prompts(seed=0))
    t = make_prompts(30)
    mixed = interleave(t, a)
    assert sorted(x["id"] for x in mixed) == sorted(x["id"] for x in t + a)
    # any prefix holds both sources in proportion (30:60)
    head = mixed[:30]
    assert 8 <= sum(x in t for x in head) <= 12
    assert interleave([], a) == a and interleave(t, []) == t


def test_package_prompts_spread_over_installed_packages_and_are_reproducible():
    from serving.distill.prompts import (
        _evaluation_texts,
        _stdlib_functions,
        package_prompts,
        package_versions,
        stdlib_prompts,
    )

    versions = package_versions(("sqlalchemy", "jinja2", "click", "no_such_package_xyz"))
    assert set(versions) == {"sqlalchemy", "jinja2", "click"}  # what is not installed is skipped, not invented
    assert all(v and v[0].isdigit() for v in versions.values())
    pkgs = ("sqlalchemy", "jinja2", "click")
    a = package_prompts(90, seed=0, packages=pkgs)
    assert a == package_prompts(90, seed=0, packages=pkgs) and len(a) == 90
    assert package_prompts(30, seed=0, packages=pkgs) == a[:30]  # a smaller count is a prefix
    assert package_prompts(30, seed=1, packages=pkgs) != a[:30]
    assert all(p["domain"] == "code" and p["id"].startswith("package-prompt-") and "answer" not in p for p in a)
    # round-robin: the first prompts already cover every package
    assert {p["id"].split("-")[2].split("/")[0] for p in a[:6]} == set(pkgs)
    assert any("```python" in p["prompt"] for p in a) and any(p["prompt"].startswith(("Write", "How", "I need",
                                                                                     "Implement")) for p in a)
    evaluation = _evaluation_texts()
    assert not any(p["prompt"] in evaluation for p in a)
    # none of them repeats a standard-library function's prompt
    assert not {p["prompt"] for p in a} & {p["prompt"] for p in stdlib_prompts(seed=0)}
    assert all(len(f) == 5 for f in _stdlib_functions()[:5])


def test_teacher_forced_agreement_matches_a_position_by_position_count(prepared):
    """The parallel agreement count equals feeding the draft one position at a time (real features) and
    comparing its argmax with the target's token; top-k grows with k; the confidence bins add up."""
    from serving.llama import contiguous_batch

    target, out = prepared
    prep = load_prepared(out)
    cfg = TrainConfig(head_vocab=32, lr=3e-3, batch_tokens=256, unroll=2, steps=15, warmup_steps=2,
                      save_every_s=1e9, feat_noise=0.0)
    draft, _ = new_draft(target, [prep], cfg, eos_ids=(2,))
    train(draft, [prep], cfg, progress=False)
    res = teacher_forced_agreement(draft, prep, ks=(1, 2, 4, 32), kind_of=lambda t: "even" if t % 2 == 0 else "odd")
    assert set(res) == {"code", "chat"}
    hits, n, kinds, ctx = {}, {}, {}, {}
    with torch.inference_mode():
        for s in prep.seqs:
            o, L, P = s["offset"], s["length"], s["num_prompt"]
            toks, feats = prep.tokens[o: o + L], prep.feats[o: o + L].to(draft.fc.weight.dtype)
            cache = draft.new_cache(1, L)
            seen = toks.tolist()
            for i in range(L - 2):
                _, logits = draft(toks[i + 1: i + 2][None], feats[i: i + 1][None], contiguous_batch(0, 1, i, 1), cache)
                if i + 2 >= P:
                    d, want = s["domain"], int(toks[i + 2])
                    hit = int(draft.head_token_ids[logits[0, -1].argmax()] == want)
                    n[d] = n.get(d, 0) + 1
                    hits[d] = hits.get(d, 0) + hit
                    k = kinds.setdefault((d, "even" if want % 2 == 0 else "odd"), [0, 0])
                    k[0], k[1] = k[0] + 1, k[1] + hit
                    # did x_{i+2} follow x_{i+1} anywhere in x_0 .. x_{i+1}?
                    if any(seen[j] == seen[i + 1] and seen[j + 1] == want for j in range(i + 1)):
                        c = ctx.setdefault(d, [0, 0])
                        c[0], c[1] = c[0] + 1, c[1] + hit
    for dom, r in res.items():
        assert r["positions"] == n[dom]
        assert r["top"][1] == pytest.approx(hits[dom] / n[dom], abs=1e-4)
        tops = [r["top"][k] for k in (1, 2, 4, 32)]
        assert tops == sorted(tops) and r["top"][32] == pytest.approx(r["in_head"], abs=1e-4)  # the whole head
        bins = r["by_target_confidence"]
        assert sum(b["share"] for b in bins) == pytest.approx(1.0, abs=1e-3)
        assert sum(b["share"] * (b["top1"] or 0) for b in bins) == pytest.approx(r["top"][1], abs=2e-3)
        c = ctx.get(dom, [0, 0])
        assert r["in_context"]["share"] == pytest.approx(c[0] / n[dom], abs=1e-4)
        assert r["in_context"]["top1"] == (pytest.approx(c[1] / c[0], abs=1e-4) if c[0] else None)
        by_kind = {k["kind"]: k for k in r["by_kind"]}
        assert set(by_kind) == {kind for (d, kind) in kinds if d == dom}
        for kind, k in by_kind.items():
            count, hit = kinds[(dom, kind)]
            assert k["share"] == pytest.approx(count / n[dom], abs=1e-4)
            assert k["top1"] == pytest.approx(hit / count, abs=1e-4)
            assert 0 <= k["in_head"] <= 1
        if hits[dom] < n[dom]:
            assert sum(k["share_of_misses"] for k in by_kind.values()) == pytest.approx(1.0, abs=1e-3)
    assert "by_kind" not in teacher_forced_agreement(draft, prep, ks=(1,))["code"]


def test_token_kind_sorts_whitespace_punctuation_and_words():
    assert [token_kind(t) for t in ("\n    ", " ", "):", "```", " return", "\nfor", "ify", "0", "_name")] == [
        "whitespace", "whitespace", "punctuation", "punctuation", "word start", "word start", "word piece",
        "word piece", "word piece"]
    assert set(TOKEN_KINDS) == {"whitespace", "punctuation", "word start", "word piece"}


def test_draft_diagnostics_refuses_a_directory_that_is_no_draft(tmp_path, capsys):
    from scripts.draft_diagnostics import main

    assert main(["--draft", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--draft" in err[0] and "config.json" in err[0]


def test_draft_generalization_holds_out_what_the_training_seed_made(capsys):
    """scripts.draft_generalization: its held-out sets are code prompts the training seed never made, and
    a held-out seed equal to the training seed is refused."""
    from scripts.draft_generalization import heldout_sets, main
    from serving.distill.prompts import make_prompts, stdlib_prompts

    sets = heldout_sets(15, train_seed=0, heldout_seed=1, packages=("packaging", "click"))
    assert {k: len(v) for k, v in sets.items()} == {"templated": 15, "stdlib": 15, "packages": 15}
    assert all(p["domain"] == "code" for v in sets.values() for p in v)
    trained = {p.get("prompt") for p in make_prompts(None, seed=0)} | {p["prompt"] for p in stdlib_prompts(None, seed=0)}
    assert not any(p["prompt"] in trained for p in sets["templated"] + sets["stdlib"])
    assert main(["--seed-heldout", "0"]) == 2
    assert "--seed-heldout" in capsys.readouterr().err


def test_fused_features_are_the_named_blocks_side_by_side(tmp_path):
    """--feature-layers data: the target's named block outputs concatenated; a selection of them equals data
    recorded with only those blocks; a block the data lacks is named in the error."""
    from serving.distill.data import select_features
    from serving.llama import contiguous_batch

    torch.manual_seed(0)
    target = tiny_model(1)
    both, last = tmp_path / "both", tmp_path / "last"
    with torch.inference_mode():
        teacher_pass(target, _answers(6), both, topk=4, progress=False, feature_layers=(0, 2))
        teacher_pass(target, _answers(6), last, topk=4, progress=False)
        toks = torch.tensor([[5, 9, 14, 3, 7]])
        _, h_last = target(toks, contiguous_batch(0, 1, 0, 5), target.new_cache(1, 5), return_hidden=True)
        _, h_both = target(toks, contiguous_batch(0, 1, 0, 5), target.new_cache(1, 5), return_hidden=True,
                           feature_layers=(0, 2))
        _, h_first = target(toks, contiguous_batch(0, 1, 0, 5), target.new_cache(1, 5), return_hidden=True,
                            num_layers=1)
    C = target.cfg.hidden_size
    assert h_both.shape == (1, 5, 2 * C)
    assert torch.equal(h_both[..., C:], h_last) and torch.equal(h_both[..., :C], h_first)
    prep = load_prepared(both)
    assert prep.feature_layers == (0, 2) and prep.feats.shape == (prep.meta["num_tokens"], 2 * C)
    only_last = select_features(prep, (), target.cfg.num_layers)
    assert only_last.feature_layers == () and torch.equal(only_last.feats, load_prepared(last).feats)
    assert select_features(prep, (0, 2), target.cfg.num_layers) is prep
    with pytest.raises(ValueError, match=r"not of \[1\]"):
        select_features(prep, (0, 1), target.cfg.num_layers)


def _fused_prepared(tmp_path, num_answers: int):
    """A tiny target (seeded) and its teacher-pass data recording all three blocks' outputs."""
    torch.manual_seed(0)
    target = tiny_model(1)
    with torch.inference_mode():
        teacher_pass(target, _answers(num_answers), tmp_path, topk=4, token_budget=256, progress=False,
                     feature_layers=(0, 1, 2))
    return target, load_prepared(tmp_path)


def test_a_fused_feature_draft_trains_and_matches_its_inference_forward(tmp_path):
    """EAGLE-3-style fusion: the training forward's step 1 equals the cached inference forward on fused
    features, later steps read the draft's own h (width C), and distillation lowers the loss."""
    from serving.distill.train import Batches

    target, prep = _fused_prepared(tmp_path, 24)
    cfg = TrainConfig(head_vocab=32, lr=3e-3, batch_tokens=256, unroll=2, steps=40, warmup_steps=2,
                      save_every_s=1e9, feat_noise=0.0, w_feat=0.0, feature_layers=(0, 1, 2))
    draft, _ = new_draft(target, [prep], cfg, eos_ids=(2,))
    C = target.cfg.hidden_size
    assert draft.fuse is not None and draft.fuse.weight.shape == (C, 3 * C)
    with torch.no_grad():
        draft.fuse.weight.add_(0.1 * torch.randn_like(draft.fuse.weight))
    _assert_unrolled_matches_inference(draft, prep)
    vocab_to_head = draft.head_index()
    fixed = Batches([prep], 64, 1024, 0).next()
    with torch.no_grad():
        before, stats = distill_loss(draft, fixed, cfg, vocab_to_head, 1.0, train=False)
    assert stats["feat1"] == 0.0  # w_feat 0: no feature loss
    train(draft, [prep], cfg, progress=False)
    with torch.no_grad():
        after, _ = distill_loss(draft, fixed, cfg, vocab_to_head, 1.0, train=False)
    assert float(after) < 0.8 * float(before)
    res = simulate_alpha(draft, prep, k=3)
    assert all(0 <= r["alpha"] <= 1 for r in res.values())


def test_a_fused_drafts_feature_loss_aims_at_its_own_fuse_of_the_next_real_features(tmp_path):
    """h_p regresses on g_{p+1} = fuse(f_{p+1}) scaled by g's RMS, with no gradient through the g side:
    checked against the loss and gradients computed by hand on one batch."""
    import torch.nn.functional as F

    from serving.distill.train import Batches, unrolled_forward

    target, prep = _fused_prepared(tmp_path, 8)
    cfg = TrainConfig(head_vocab=32, unroll=1, w_soft=0.0, w_hard=0.0, w_feat=1.0, feat_noise=0.0,
                      feature_layers=(0, 1, 2))
    draft, _ = new_draft(target, [prep], cfg, eos_ids=(2,))
    with torch.no_grad():
        draft.fuse.weight.add_(0.1 * torch.randn_like(draft.fuse.weight))
    vocab_to_head = draft.head_index()
    batch = Batches([prep], 64, 1024, 0).next()
    loss, stats = distill_loss(draft, batch, cfg, vocab_to_head, 1.0)
    loss.backward()
    got = draft.fuse.weight.grad.clone()
    draft.zero_grad()
    # by hand
    feats = batch["feats"].float()
    T = feats.shape[1]
    (h,) = unrolled_forward(draft, batch["tokens"], feats, 1)
    nxt = torch.zeros_like(feats)
    nxt[:, :-1] = feats[:, 1:]
    g = draft.fuse(nxt).detach()
    pos = torch.arange(T)[None, :]
    valid = (pos >= batch["num_prompt"][:, None] - 1) & (pos <= batch["length"][:, None] - 2)
    s = g[valid].pow(2).mean().sqrt()
    want = F.smooth_l1_loss(h[valid] / s, g[valid] / s)
    want.backward()
    assert stats["feat1"] > 0 and abs(float(loss.detach()) - float(want.detach())) < 1e-5
    assert torch.allclose(got, draft.fuse.weight.grad, atol=1e-6)  # only through h: the g side is detached


def test_draft_ceiling_gate_rules_reproduce_simulate_alpha(prepared):
    """scripts.draft_ceiling's gate walks the same steps as simulate_alpha: its engine rule (lookup where it
    answers, else the draft) and its draft-only rule give simulate_alpha's alpha with and without the
    lookup (a lookup that answers every other step, right on its first token only)."""
    from scripts.draft_ceiling import gate_alpha, main

    target, out = prepared
    prep = load_prepared(out)
    draft, _ = new_draft(target, [prep], TrainConfig(head_vocab=32), eos_ids=(2,))
    answers = {}
    for s in prep.seqs:
        answers[tuple(prep.tokens[s["offset"]: s["offset"] + s["num_prompt"]].tolist())] = s

    def half_right(ctx, k):  # a lookup that answers on even lengths, right for its first token only
        if len(ctx) % 2:
            return []
        for prompt, s in answers.items():
            if tuple(ctx[: len(prompt)]) == prompt and len(ctx) < s["length"]:
                nxt = int(prep.tokens[s["offset"] + len(ctx)])
                return [nxt] + [1] * (k - 1)
        return []

    with torch.inference_mode():
        with_lookup = simulate_alpha(draft, prep, k=3, domains=("code",), lookup=half_right, copy_bias=2.0)
        without = simulate_alpha(draft, prep, k=3, domains=("code",), copy_bias=2.0)
    assert gate_alpha(draft, prep, "engine", 3, half_right, 2.0) == pytest.approx(with_lookup["code"]["alpha"], abs=1e-4)
    assert gate_alpha(draft, prep, "draft", 3, half_right, 2.0) == pytest.approx(without["code"]["alpha"], abs=1e-4)
    assert main(["gate", "--k", "0"]) == 2


def test_draft_ceiling_sure_gives_the_target_token_only_where_it_is_sure(prepared):
    """simulate_alpha's force hook: no forcing reproduces the draft; forcing the target's token everywhere (min_p
    0) accepts every drafted token; forcing above a confidence lands in between and never lowers alpha."""
    from scripts.draft_ceiling import main, sure_oracle

    target, out = prepared
    prep = load_prepared(out)
    draft, _ = new_draft(target, [prep], TrainConfig(head_vocab=32), eos_ids=(2,))
    with torch.inference_mode():
        plain = simulate_alpha(draft, prep, k=3, domains=("code",))["code"]
        never = simulate_alpha(draft, prep, k=3, domains=("code",), force=lambda seq, m: None)["code"]
        always = simulate_alpha(draft, prep, k=3, domains=("code",), force=sure_oracle(prep, 0.0))["code"]
        p1 = prep.topk_probs[:, 0].float()
        mid = float(p1.median())
        some = simulate_alpha(draft, prep, k=3, domains=("code",), force=sure_oracle(prep, mid))["code"]
        none_of_kind = simulate_alpha(draft, prep, k=3, domains=("code",),
                                      force=sure_oracle(prep, 0.0, {"word piece"}, lambda t: "word start"))["code"]
    assert never == plain and none_of_kind == plain
    assert plain["alpha"] < 1.0
    assert always["alpha"] == 1.0 and always["acceptance_rate"] == 1.0
    assert plain["alpha"] <= some["alpha"] <= always["alpha"]
    assert main(["sure", "--min-p", "1.5"]) == 2
    assert main(["sure", "--kinds", "emoji"]) == 2


def _tiny_target_dir(path, model) -> str:
    """`model` as a Hugging Face Llama directory (config, safetensors, a word-level tokenizer with an EOS)."""
    import json

    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    c = model.cfg
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position,
        "tie_word_embeddings": False}))
    state = {(k if k == "lm_head.weight" else "model." + k): v.contiguous()
             for k, v in model.state_dict().items() if not k.startswith("rope_")}
    save_file(state, str(path / "model.safetensors"))
    vocab = {"<unk>": 0, "</s>": 1, **{f"w{i}": i for i in range(2, c.vocab_size)}}
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            "eos_token": "</s>", "unk_token": "<unk>"}))
    return str(path)


def test_distill_end_to_end_under_a_total_budget(prepared, tmp_path, capsys):
    """`specfinops distill` on a tiny target and prepared data: training gets what --total-minutes left after
    set-up (less the margin kept for saving), and the draft, tokenizer and model card are written."""
    import json

    from app.cli import main
    from serving.distill.pipeline import BUDGET_MARGIN_MINUTES
    from serving.eagle import load_eagle
    from serving.llama import load_causal_lm

    target, prep = prepared
    target_dir = _tiny_target_dir(tmp_path / "target", target)
    out = tmp_path / "draft"
    total = BUDGET_MARGIN_MINUTES + 0.4  # set-up (imports, loading) takes a few seconds of it, training the rest
    assert main(["distill", "--target", target_dir, "--corpus", str(prep), "--out", str(out), "--total-minutes",
                 str(total), "--head-vocab", "32", "--batch-tokens", "128", "--dtype", "float32", "--no-eval",
                 "--checkpoint", str(tmp_path / "ckpt.pt")]) == 0
    assert "training gets" in capsys.readouterr().err
    card = json.loads((out / "model_card.json").read_text())
    budget = card["training"]["budget"]
    assert budget["total_minutes"] == total
    assert budget["spent_before_training_minutes"] + budget["training_minutes"] == pytest.approx(
        total - BUDGET_MARGIN_MINUTES, abs=0.01)
    assert card["training"]["minutes"] == pytest.approx(budget["training_minutes"], abs=0.01)
    assert card["status"] == "trained" and card["results"]["steps"] >= 1
    assert "--total-minutes" in card["command"].split() and (out / "tokenizer.json").is_file()
    draft = load_eagle(out, load_causal_lm(target_dir, torch.float32), torch.float32)
    assert draft.cfg.head_vocab == 32


@pytest.mark.parametrize("j", [1, 2, 3, 4])
def test_unrolled_attention_equals_attention_under_the_step_mask(j):
    """Scoring only the keys `_step_mask` shows gives what attention over all of them under the mask gives."""
    from serving.distill.train import unrolled_attention

    g = torch.Generator().manual_seed(j)
    B, H, Hkv, T, D = 2, 6, 2, 9, 8
    q = torch.randn(B, H, T, D, generator=g, requires_grad=True)
    keys = [torch.randn(B, Hkv, T, D, generator=g) for _ in range(j)]
    vals = [torch.randn(B, Hkv, T, D, generator=g) for _ in range(j)]
    ref = torch.nn.functional.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(vals, 2),
                                                           attn_mask=_step_mask(T, j), enable_gqa=True)
    out = unrolled_attention(q, keys, vals)
    assert torch.allclose(out, ref, atol=1e-5)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), q)
    (g_out,) = torch.autograd.grad(out.square().sum(), q)
    assert torch.allclose(g_out, g_ref, atol=1e-4)


@pytest.mark.parametrize("j", [2, 3, 4])
def test_unrolled_attention_over_a_window_equals_the_rows_it_keeps(j):
    """Queries and later steps' keys from position `start` on (the unrolled steps' window): each row from
    start + j - 1 on attends as that row does over all positions."""
    from serving.distill.train import unrolled_attention

    g = torch.Generator().manual_seed(10 + j)
    B, H, Hkv, T, D, start = 2, 6, 2, 11, 8, 4
    q = torch.randn(B, H, T, D, generator=g)
    keys = [torch.randn(B, Hkv, T, D, generator=g) for _ in range(j)]
    vals = [torch.randn(B, Hkv, T, D, generator=g) for _ in range(j)]
    full = unrolled_attention(q, keys, vals)
    window = unrolled_attention(q[:, :, start:], keys[:1] + [k[:, :, start:] for k in keys[1:]],
                                vals[:1] + [v[:, :, start:] for v in vals[1:]], start=start)
    assert window.shape == (B, H, T - start, D)
    assert torch.allclose(window[:, :, j - 1:], full[:, :, start + j - 1:], atol=1e-5)


def test_the_unrolled_window_leaves_the_loss_and_its_gradients_as_they_were(prepared, monkeypatch):
    """distill_loss runs steps 2.. only from the batch's first answer position on; running them over
    every position instead gives the same loss, statistics and gradients."""
    import serving.distill.train as tr

    target, out = prepared
    prep = load_prepared(out)
    cfg = TrainConfig(head_vocab=32, unroll=3, feat_noise=0.0)
    draft, _ = new_draft(target, [prep], cfg, eos_ids=(2,))
    batch = tr.Batches([prep], 64, 256, 0, pool=8).next()
    assert int(batch["num_prompt"].min()) > 2  # the window starts after position 0

    def run():
        draft.zero_grad(set_to_none=True)
        loss, stats = distill_loss(draft, batch, cfg, draft.head_index(), 1.0)
        loss.backward()
        return loss.detach(), stats, [p.grad.clone() for p in draft.parameters() if p.grad is not None]

    seen = []
    windowed = tr.unrolled_forward

    def spy(*args, **kw):
        seen.append(kw["start"])
        return windowed(*args, **kw)

    monkeypatch.setattr(tr, "unrolled_forward", spy)
    loss, stats, grads = run()
    assert seen == [int(batch["num_prompt"].min()) - 1]

    def everywhere(draft_, tokens, feats, unroll, detach=False, start=0):
        outs = windowed(draft_, tokens, feats, unroll, detach, 0)
        return outs[:1] + [h[:, start:] for h in outs[1:]]

    monkeypatch.setattr(tr, "unrolled_forward", everywhere)
    ref_loss, ref_stats, ref_grads = run()
    assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert stats.keys() == ref_stats.keys() and all(abs(stats[k] - ref_stats[k]) < 1e-4 for k in stats)
    assert len(grads) == len(ref_grads) > 0
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads, ref_grads, strict=True))


def test_pooled_batches_cover_each_sequence_once_an_epoch_with_less_padding(prepared):
    from serving.distill.train import Batches

    _, out = prepared
    prep = load_prepared(out)
    n = len(prep.seqs)

    def epoch(b):
        """Batches until every sequence came once: (each batch's sequences as token tuples, padded, real)."""
        seqs, padded, real = [], 0, 0
        while sum(map(len, seqs)) < n:
            x = b.next()
            B, T = x["tokens"].shape
            assert B * T <= 256 or B == 1
            padded, real = padded + B * T, real + int(x["length"].sum())
            seqs.append([tuple(x["tokens"][r, : int(x["length"][r])].tolist()) for r in range(B)])
        return seqs, padded, real

    def stored(s):
        return tuple(prep.tokens[s["offset"]: s["offset"] + s["length"]].tolist())

    pooled = Batches([prep], 64, 256, 0, pool=n)
    seqs, padded, real = epoch(pooled)
    assert sorted(t for b in seqs for t in b) == sorted(stored(s) for s in prep.seqs)  # each once
    _, padded0, real0 = epoch(Batches([prep], 64, 256, 0, pool=0))
    assert real / padded > real0 / padded0 and real / padded > 0.9
    assert epoch(pooled)[0] != seqs  # the next epoch is another order
    with pytest.raises(ValueError, match="pool -1"):
        Batches([prep], 64, 256, 0, pool=-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_head_log_probs_are_log_softmax_gathered(dtype):
    """head_log_probs: the values and gradient of log_softmax(z).gather(1, idx), the gradient in z's dtype."""
    from serving.distill.train import head_log_probs

    g = torch.Generator().manual_seed(3)
    z = (torch.randn(7, 50, generator=g, dtype=torch.float64) * 4).to(dtype).requires_grad_()
    idx = torch.randint(0, 50, (7, 4), generator=g)
    idx[0, 1] = idx[0, 0]  # a row may name one head row twice (a zero-probability top-k entry)
    w = torch.rand(7, 4, generator=g, dtype=torch.float64)
    out, top = head_log_probs(z, idx)
    ref = torch.log_softmax(z.detach().double().requires_grad_(), -1)
    assert torch.equal(top, z.detach().float().argmax(-1)) and not top.requires_grad
    assert out.dtype == torch.float32 or dtype == torch.float64
    (gz,) = torch.autograd.grad((out * w.to(out.dtype)).sum(), z)
    zd = z.detach().double().requires_grad_()
    (gref,) = torch.autograd.grad((torch.log_softmax(zd, -1).gather(1, idx) * w).sum(), zd)
    tol = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert torch.allclose(out.double(), ref.gather(1, idx), atol=tol)
    assert gz.dtype == dtype and torch.allclose(gz.double(), gref, atol=tol)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda t: head_log_probs(t, idx)[0], (z.detach().requires_grad_(),))


def test_head_log_probs_go_by_chunks_of_rows(monkeypatch):
    """Rows split over several chunks, the last one partial, give what one chunk gives."""
    import serving.distill.train as tr

    g = torch.Generator().manual_seed(4)
    z = torch.randn(11, 30, generator=g, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, 30, (11, 3), generator=g)
    w = torch.rand(11, 3, generator=g, dtype=torch.float64)
    got = []
    for rows in (64, 4):
        monkeypatch.setattr(tr, "HEAD_CHUNK_ROWS", rows)
        lq, top = tr.head_log_probs(z, idx)
        got.append((lq.detach(), top, torch.autograd.grad((lq * w).sum(), z)[0]))
    (a, ta, ga), (b, tb, gb) = got
    assert torch.allclose(a, b) and torch.equal(ta, tb) and torch.allclose(ga, gb)


def test_the_bundled_card_command_parses_to_the_options_it_trained_with_and_says_what_a_rerun_matches():
    """The bundled draft's card: its command is one `distill` accepts, with the options its training record
    holds, and its "rerun" says a time budget reproduces the options, not the steps it trained."""
    import shlex

    from app.cli import build_parser
    from serving.models import BUNDLED_DRAFT_DIR

    card = json.loads((BUNDLED_DRAFT_DIR / "model_card.json").read_text())
    words = shlex.split(card["command"])
    assert words[:2] == ["specfinops", "distill"]
    args = build_parser().parse_args(words[1:])
    training = card["training"]
    for option in ("head_vocab", "layers", "lr", "batch_tokens", "batch_pool", "unroll", "w_feat", "w_hard",
                   "feat_noise", "seed", "dtype"):
        assert getattr(args, option) == training[option], option
    assert float(args.total_minutes) == training["budget"]["total_minutes"] and args.steps is None
    rerun = card["rerun"]
    assert rerun["matches"] == "options" and rerun["steps_trained"] == card["results"]["steps"]
