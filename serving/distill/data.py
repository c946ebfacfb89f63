"""Distillation data: the target's own greedy answers to templated prompts, then a teacher-forcing
pass of the target over prompt + answer that stores, per position, the target's feature (its last
block's output before the final norm, bf16) and its top-k next-token ids and probabilities.

A prepared data directory holds:
  meta.json          what it is (target, prompts, tokens, top-k, hidden size, how it was made)
  answers.jsonl      one line per prompt: id, domain, prompt_ids, output_ids (written as generated; resumable)
  sequences.jsonl    one line per sequence: id, domain, num_prompt, offset, length (rows in the arrays below)
  tokens.bin         int32 (N,)       every position's token id
  feats.bin          bf16 (N, C)      the target's feature at each position
  topk_ids.bin       int32 (N, k)     the target's top-k next-token ids at each position
  topk_probs.bin     float16 (N, k)   their probabilities (full-vocabulary softmax)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ANSWERS = "answers.jsonl"
META = "meta.json"


def _say_nothing(msg: str) -> None:
    pass


def encode_prompt(tokenizer, item: dict) -> list[int]:
    messages = item.get("messages") or [{"role": "user", "content": item["prompt"]}]
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    return tokenizer.encode(messages[-1]["content"])


def generate_answers(target_dir: str | Path, prompts: list[dict], out_dir: Path, *, max_new_tokens: int = 192,
                     batch: int = 32, dtype: str = "bfloat16", progress: bool = True,
                     say: Callable[[str], None] = _say_nothing) -> list[dict]:
    """The target's greedy answers (continuous batching), appended to out_dir/answers.jsonl as they finish.
    Prompts already answered there are skipped, so an interrupted run resumes."""
    from tqdm import tqdm

    from serving.sampling import SamplingParams
    from serving.worker import EngineSpec, load

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ANSWERS
    done = {r["id"]: r for r in read_answers(path)}
    todo = [p for p in prompts if p["id"] not in done]
    if not todo:
        return [done[p["id"]] for p in prompts if p["id"] in done]
    loaded = load(EngineSpec(target=str(target_dir), dtype=dtype, max_batch=batch, max_len=1024))
    engine = loaded.engine("ar", max_batch=batch)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    live: dict[int, tuple[dict, list[int]]] = {}
    queue = list(todo)
    bar = tqdm(total=len(todo), desc="generate", unit="prompt", disable=not progress)
    t0, ntok = time.perf_counter(), 0
    with path.open("a") as fh:
        def finish(seq):
            nonlocal ntok
            item, ids = live.pop(seq.seq_id)
            rec = {"id": item["id"], "domain": item["domain"], "prompt_ids": ids, "output_ids": list(seq.output)}
            fh.write(json.dumps(rec) + "\n")
            done[item["id"]] = rec
            ntok += len(rec["output_ids"])
            bar.update(1)
            bar.set_postfix(tok_s=f"{ntok / (time.perf_counter() - t0):.0f}")

        while queue or engine.running:
            while queue and len(engine.running) < batch:
                item = queue.pop(0)
                ids = encode_prompt(loaded.tokenizer, item)
                if len(ids) > 700:
                    continue
                seq = engine.add(ids, params)
                live[seq.seq_id] = (item, ids)
                if seq.done:
                    finish(seq)
            finished = engine.step()
            for seq in finished or []:
                finish(seq)
            fh.flush()
    bar.close()
    say(f"generated {ntok} answer tokens for {len(todo)} prompts in {time.perf_counter() - t0:.0f} s")
    return [done[p["id"]] for p in prompts if p["id"] in done]


def written_answers(target_dir: str | Path, items: list[dict]) -> list[dict]:
    """Items that carry their own "answer" text: tokenized in the target's chat format, not generated."""
    from serving.models import load_tokenizer

    tok = load_tokenizer(Path(target_dir))
    out = []
    for item in items:
        ids = encode_prompt(tok, item)
        ans = tok.encode(item["answer"], add_special_tokens=False)
        if tok.eos_token_id is not None:
            ans = ans + [tok.eos_token_id]
        out.append({"id": item["id"], "domain": item["domain"], "prompt_ids": ids, "output_ids": ans})
    return out


def read_answers(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by an interruption
    return out


@torch.inference_mode()
def teacher_pass(target, answers: list[dict], out_dir: Path, *, topk: int = 8, token_budget: int = 4096,
                 progress: bool = True, extra_meta: dict | None = None) -> dict:
    """Teacher-force the target over prompt+answer (batched by similar length, right-padded) and write
    features and top-k distributions for every position. Returns the meta dict."""
    from tqdm import tqdm

    from serving.llama import contiguous_batch

    out_dir.mkdir(parents=True, exist_ok=True)
    seqs = [(a, a["prompt_ids"] + a["output_ids"]) for a in answers if a["output_ids"]]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][1]))
    batches, cur = [], []
    for i in order:
        L = len(seqs[i][1])
        if cur and (len(cur) + 1) * L > token_budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    C = target.cfg.hidden_size
    files = {n: (out_dir / n).open("wb") for n in ("tokens.bin", "feats.bin", "topk_ids.bin", "topk_probs.bin")}
    index: list[dict | None] = [None] * len(seqs)
    offset = 0
    t0 = time.perf_counter()
    bar = tqdm(total=sum(len(s[1]) for s in seqs), desc="teacher", unit="tok", disable=not progress)
    for b in batches:
        T = max(len(seqs[i][1]) for i in b)
        toks = torch.zeros(len(b), T, dtype=torch.long)
        for r, i in enumerate(b):
            toks[r, : len(seqs[i][1])] = torch.tensor(seqs[i][1])
        cache = target.new_cache(len(b), T)
        logits, hidden = target(toks, contiguous_batch(0, len(b), 0, T), cache, return_hidden=True)
        probs = torch.softmax(logits, dim=-1)
        tp, ti = probs.topk(topk, dim=-1)
        for r, i in enumerate(b):
            a, ids = seqs[i]
            L = len(ids)
            np.asarray(ids, dtype=np.int32).tofile(files["tokens.bin"])
            hidden[r, :L].to(torch.bfloat16).contiguous().view(torch.int16).numpy().tofile(files["feats.bin"])
            ti[r, :L].to(torch.int32).numpy().tofile(files["topk_ids.bin"])
            tp[r, :L].to(torch.float16).numpy().tofile(files["topk_probs.bin"])
            index[i] = {"id": a["id"], "domain": a["domain"], "num_prompt": len(a["prompt_ids"]),
                        "offset": offset, "length": L}
            offset += L
            bar.update(L)
    bar.close()
    for f in files.values():
        f.close()
    with (out_dir / "sequences.jsonl").open("w") as fh:
        for rec in index:
            fh.write(json.dumps(rec) + "\n")
    domains: dict[str, int] = {}
    for a, _ in seqs:
        domains[a["domain"]] = domains.get(a["domain"], 0) + 1
    meta = {"format": "specfinops-distill-data/1", "hidden_size": C, "vocab_size": target.cfg.vocab_size,
            "topk": topk, "num_sequences": len(seqs), "num_tokens": offset,
            "answer_tokens": sum(len(a["output_ids"]) for a, _ in seqs), "domains": domains,
            "teacher_seconds": round(time.perf_counter() - t0, 1), **(extra_meta or {})}
    (out_dir / META).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


@dataclass
class Prepared:
    """A prepared data directory loaded into memory (features stay bf16)."""

    path: Path
    meta: dict
    seqs: list[dict]
    tokens: torch.Tensor  # (N,) long
    feats: torch.Tensor  # (N, C) bf16
    topk_ids: torch.Tensor  # (N, k) long
    topk_probs: torch.Tensor  # (N, k) float32

    @property
    def answer_tokens(self) -> int:
        return sum(s["length"] - s["num_prompt"] for s in self.seqs)


def is_prepared(path: Path) -> bool:
    return (path / META).is_file() and (path / "sequences.jsonl").is_file()


def load_prepared(path: str | Path) -> Prepared:
    path = Path(path)
    if not is_prepared(path):
        raise FileNotFoundError(f"{path} is not a prepared distillation data directory (no meta.json)")
    meta = json.loads((path / META).read_text())
    seqs = [json.loads(x) for x in (path / "sequences.jsonl").read_text().splitlines() if x.strip()]
    k, C = meta["topk"], meta["hidden_size"]
    tokens = torch.from_numpy(np.fromfile(path / "tokens.bin", dtype=np.int32)).long()
    feats = torch.from_numpy(np.fromfile(path / "feats.bin", dtype=np.int16)).view(torch.bfloat16).view(-1, C)
    ids = torch.from_numpy(np.fromfile(path / "topk_ids.bin", dtype=np.int32)).long().view(-1, k)
    probs = torch.from_numpy(np.fromfile(path / "topk_probs.bin", dtype=np.float16)).float().view(-1, k)
    if not (len(tokens) == len(feats) == len(ids) == len(probs) == meta["num_tokens"]):
        raise ValueError(f"{path}: array sizes disagree with meta.json (interrupted teacher pass?)")
    return Prepared(path, meta, seqs, tokens, feats, ids, probs)


def token_frequencies(preps: list[Prepared], vocab_size: int) -> torch.Tensor:
    """Counts of each token among the answer tokens (what the target generates)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for p in preps:
        for s in p.seqs:
            ids = p.tokens[s["offset"] + s["num_prompt"]: s["offset"] + s["length"]]
            counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def prepare(target_dir: str | Path, prompts: list[dict], out_dir: str | Path, *, max_new_tokens: int = 192,
            batch: int = 32, topk: int = 8, progress: bool = True, say: Callable[[str], None] = _say_nothing,
            extra_meta: dict | None = None) -> dict:
    """Generate the target's answers and run the teacher pass: a complete prepared directory."""
    from serving.llama import load_causal_lm

    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    to_generate = [p for p in prompts if "answer" not in p]
    answers = generate_answers(target_dir, to_generate, out_dir, max_new_tokens=max_new_tokens, batch=batch,
                               progress=progress, say=say) if to_generate else []
    answers += written_answers(target_dir, [p for p in prompts if "answer" in p])
    t_gen = time.perf_counter() - t0
    torch.set_grad_enabled(False)
    target = load_causal_lm(target_dir, torch.bfloat16)
    meta = teacher_pass(target, answers, out_dir, topk=topk, progress=progress,
                        extra_meta={"prompts": len(prompts), "max_new_tokens": max_new_tokens,
                                    "generate_seconds": round(t_gen, 1), **(extra_meta or {})})
    torch.set_grad_enabled(True)
    return meta
