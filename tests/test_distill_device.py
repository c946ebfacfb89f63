"""`specfinops distill --device`: the data and the training run where the user says, with the same results.

The CUDA tests need a GPU (they are skipped on CPU-only machines and in CI); the option's validation runs
everywhere."""

from __future__ import annotations

import random

import pytest
import torch

from serving.distill.data import load_prepared, record_generation, teacher_pass
from serving.distill.train import Batches, TrainConfig, distill_loss, new_draft, train
from tests.tiny import tiny_model

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _encoded(n: int, seed: int = 1) -> list[tuple[dict, list[int]]]:
    rng = random.Random(seed)
    return [({"id": f"g{i}", "domain": "code" if i % 2 else "chat"},
             [rng.randrange(3, 96) for _ in range(rng.randrange(3, 12))]) for i in range(n)]


def test_resolve_device_names_what_is_wrong():
    from serving.distill.pipeline import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="not a device"):
        resolve_device("gpu please")
    with pytest.raises(ValueError, match="cpu or a CUDA GPU"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA GPU"):
            resolve_device("cuda")
    else:
        assert resolve_device("cuda").type == "cuda"
        with pytest.raises(ValueError, match="CUDA GPU\\(s\\)"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_the_cli_refuses_cuda_without_a_gpu_in_one_line(capsys, tmp_path):
    from app.cli import main

    assert main(["distill", "--out", str(tmp_path / "d"), "--generate-prompts", "4", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device 'cuda'" in err[0] and "no CUDA GPU" in err[0]
    assert not (tmp_path / "d").exists()  # refused before anything was written


def test_a_gpu_run_says_so_in_the_reproducing_command(tmp_path):
    from app.cli import build_parser
    from serving.distill.pipeline import command_line

    cpu = build_parser().parse_args(["distill", "--out", str(tmp_path), "--generate-prompts", "10"])
    assert "--device" not in command_line(cpu)  # CPU cards read as they always did
    gpu = build_parser().parse_args(["distill", "--out", str(tmp_path), "--generate-prompts", "10",
                                     "--device", "cuda:0"])
    assert "--device cuda:0" in command_line(gpu)


@cuda
def test_generation_on_the_gpu_records_the_cpu_answers(tmp_path):
    """Greedy answers, top-k and features recorded on a GPU match the CPU's (float32, sharp logits)."""
    target = tiny_model(3)
    encoded = _encoded(9)
    meta_cpu = record_generation(target, encoded, tmp_path / "cpu", eos=2, max_new_tokens=9, batch=4, topk=4,
                                 progress=False)
    gpu_target = tiny_model(3).cuda()
    with torch.device("cuda"):
        meta_gpu = record_generation(gpu_target, encoded, tmp_path / "gpu", eos=2, max_new_tokens=9, batch=4,
                                     topk=4, progress=False)
    assert meta_cpu["num_sequences"] == meta_gpu["num_sequences"] == 9
    a, b = load_prepared(tmp_path / "cpu"), load_prepared(tmp_path / "gpu")
    by_id = {s["id"]: s for s in b.seqs}
    for s in a.seqs:
        r = by_id[s["id"]]
        x, y = slice(s["offset"], s["offset"] + s["length"]), slice(r["offset"], r["offset"] + r["length"])
        assert torch.equal(a.tokens[x], b.tokens[y])
        assert torch.equal(a.topk_ids[x, 0], b.topk_ids[y, 0])
        assert torch.allclose(a.topk_probs[x], b.topk_probs[y], atol=2e-3)
        assert torch.allclose(a.feats[x].float(), b.feats[y].float(), atol=0.05, rtol=0.02)


@cuda
def test_training_on_the_gpu_lowers_the_loss_and_saves_host_weights(tmp_path):
    from serving.distill.pipeline import save_draft
    from serving.eagle import load_eagle

    target = tiny_model(1)
    rng = random.Random(0)
    answers = []
    for i in range(24):
        base = [rng.randrange(3, 20) for _ in range(3)]
        answers.append({"id": f"t{i}", "domain": "code", "prompt_ids": [rng.randrange(3, 96) for _ in range(6)],
                        "output_ids": (base * 10)[: rng.randrange(12, 24)]})
    with torch.inference_mode():
        teacher_pass(target, answers, tmp_path / "prep", topk=4, token_budget=256, progress=False)
    prep = load_prepared(tmp_path / "prep")
    cfg = TrainConfig(head_vocab=32, lr=3e-3, batch_tokens=256, unroll=2, steps=40, warmup_steps=2,
                      save_every_s=1e9, feat_noise=0.05, dtype="bfloat16")
    draft, _ = new_draft(target, [prep], cfg, eos_ids=(2,))
    target.cuda()
    draft.cuda()
    fixed = {k: v.cuda() for k, v in Batches([prep], 64, 1024, 0).next().items()}
    with torch.no_grad(), torch.device("cuda"):
        before, _ = distill_loss(draft, fixed, cfg, draft.head_index(), 1.0, train=False)
    summary = train(draft, [prep], cfg, progress=False, device="cuda", checkpoint=tmp_path / "ckpt.pt")
    with torch.no_grad(), torch.device("cuda"):
        after, _ = distill_loss(draft, fixed, cfg, draft.head_index(), 1.0, train=False)
    assert summary["steps"] == 40 and next(draft.parameters()).is_cuda
    assert float(after) < 0.8 * float(before)
    save_draft(draft, tmp_path / "draft", {})
    loaded = load_eagle(tmp_path / "draft", tiny_model(1), torch.bfloat16)  # a CPU target reads it back
    assert all(p.device.type == "cpu" for p in loaded.parameters())


@cuda
def test_self_prompt_sampling_runs_on_the_gpu_and_is_seeded():
    from serving.distill.selfprompts import sample_continuations

    target = tiny_model(2).cuda()
    prefixes = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    with torch.device("cuda"):
        a = sample_continuations(target, prefixes, {2, 3, 4}, max_tokens=12, seed=7, batch=2)
        b = sample_continuations(target, prefixes, {2, 3, 4}, max_tokens=12, seed=7, batch=2)
    assert a == b and len(a) == 3


def test_prompts_read_together_record_what_one_at_a_time_records(tmp_path):
    """The GPU's grouped, right-padded prefill (run here on the CPU) gives the same answers, top-k and
    features as reading each prompt alone; prompts too long are still skipped and counted."""
    target = tiny_model(3)
    encoded = _encoded(11) + [({"id": "long", "domain": "code"}, list(range(3, 40)))]
    kw = dict(eos=2, max_new_tokens=9, batch=5, topk=4, max_prompt=30, progress=False)
    one = record_generation(target, encoded, tmp_path / "one", **kw)
    grouped = record_generation(target, encoded, tmp_path / "grouped", prefill_tokens=48, **kw)
    assert one["num_sequences"] == grouped["num_sequences"] == 11
    a, b = load_prepared(tmp_path / "one"), load_prepared(tmp_path / "grouped")
    by_id = {s["id"]: s for s in b.seqs}
    assert set(by_id) == {s["id"] for s in a.seqs} and "long" not in by_id
    for s in a.seqs:
        r = by_id[s["id"]]
        assert (s["num_prompt"], s["length"]) == (r["num_prompt"], r["length"])
        x, y = slice(s["offset"], s["offset"] + s["length"]), slice(r["offset"], r["offset"] + r["length"])
        assert torch.equal(a.tokens[x], b.tokens[y])
        assert torch.equal(a.topk_ids[x], b.topk_ids[y])
        # stored as float16 / bf16, and a padded batch may take another attention kernel than one prompt
        assert torch.allclose(a.topk_probs[x], b.topk_probs[y], atol=2e-3)
        assert torch.allclose(a.feats[x].float(), b.feats[y].float(), atol=0.05, rtol=0.02)


def test_prefill_groups_respect_free_slots_and_the_token_budget():
    from collections import deque

    from serving.distill.data import prefill_groups

    skipped = []
    q = deque([("a", [1] * 10), ("b", [1] * 12), ("bad", []), ("c", [1] * 3), ("d", [1] * 20)])
    take = lambda free, budget: prefill_groups(q, free, budget, lambda ids: bool(ids), lambda: skipped.append(1))  # noqa: E731
    assert [g[0] for g in take(5, 0)] == ["a"]  # budget 0: one prompt a forward
    assert [g[0] for g in take(5, 36)] == ["b", "c"] and skipped == [1]  # 3 x 12 = 36 padded tokens
    assert [g[0] for g in take(1, 1000)] == ["d"] and not q  # never more than the free slots


def test_self_prompt_sampling_reads_prefixes_together_with_the_same_draws():
    from serving.distill.selfprompts import sample_continuations

    target = tiny_model(2)
    prefixes = [[5, 6, 7], [9, 10], [11, 12, 13, 14], [20, 21]]
    one = sample_continuations(target, prefixes, {2, 3, 4}, max_tokens=12, seed=7, batch=3)
    grouped = sample_continuations(target, prefixes, {2, 3, 4}, max_tokens=12, seed=7, batch=3, prefill_tokens=64)
    assert one == grouped


def test_slots_refilled_in_waves_give_the_same_answers_in_fewer_prefills(tmp_path):
    """The GPU's way (prompts read together once an eighth of the slots are free), run here on the CPU:
    the same greedy answers as one prompt a forward at once, with far fewer prefill forwards."""
    from serving.distill.data import refill_at

    assert refill_at(384, 0) == 1 and refill_at(384, 4096) == 48 and refill_at(4, 4096) == 1

    class Counting:
        def __init__(self, model):
            self.model, self.cfg, self.lm_head, self.prefills = model, model.cfg, model.lm_head, 0

        def new_cache(self, *a):
            return self.model.new_cache(*a)

        def __call__(self, tokens, fb, cache, **kw):
            self.prefills += tokens.shape[1] > 1
            return self.model(tokens, fb, cache, **kw)

    target = tiny_model(3)
    rng = random.Random(5)
    encoded = [({"id": f"w{i}", "domain": "code"}, [rng.randrange(3, 96) for _ in range(rng.randrange(3, 12))])
               for i in range(40)]
    kw = dict(eos=2, max_new_tokens=rng.randrange(6, 10), batch=16, topk=4, progress=False)
    at_once, waves = Counting(target), Counting(target)
    record_generation(at_once, encoded, tmp_path / "a", **kw)
    record_generation(waves, encoded, tmp_path / "b", prefill_tokens=96, **kw)
    a, b = load_prepared(tmp_path / "a"), load_prepared(tmp_path / "b")
    by_id = {s["id"]: s for s in b.seqs}
    assert len(by_id) == 40
    for s in a.seqs:
        r = by_id[s["id"]]
        assert torch.equal(a.tokens[s["offset"]: s["offset"] + s["length"]], b.tokens[r["offset"]: r["offset"] + r["length"]])
    assert at_once.prefills == 40 and waves.prefills <= 40 // 4


def test_batch_defaults_follow_the_device_and_a_zero_batch_is_refused(tmp_path, capsys, monkeypatch):
    import app.commands.distill as cmd
    from app.cli import build_parser, main

    seen = {}
    monkeypatch.setattr("serving.distill.pipeline.run", lambda args: seen.update(vars(args)) or 0)
    args = build_parser().parse_args(["distill", "--out", str(tmp_path / "d"), "--generate-prompts", "4"])
    assert cmd.handle(args) == 0 and (seen["gen_batch"], seen["batch_tokens"], seen["device"]) == (32, 3072, "cpu")
    assert main(["distill", "--out", str(tmp_path / "d"), "--generate-prompts", "4", "--gen-batch", "0"]) == 2
    assert "--gen-batch must be a whole number >= 1, got 0" in capsys.readouterr().err
