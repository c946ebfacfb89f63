"""Distillation data: the target's own greedy answers (or given answers, teacher-forced) with, per
position, the target's feature (its last block's output before the final norm, bf16) and its top-k
next-token ids and probabilities.

Generated answers are recorded by the forwards that produce them (`generate_prepared`: the prefill
gives the prompt positions, each batched decode step the next position), so making data costs one
generation and no second pass; given answers go through `teacher_pass`.

A prepared data directory holds:
  meta.json          what it is (target, prompts, tokens, top-k, hidden size, how it was made); written last
  sequences.jsonl    one line per sequence: id, domain, num_prompt, offset, length (rows in the arrays below)
  tokens.bin         int32 (N,)       every position's token id
  feats.bin          bf16 (N, F)      the target's feature at each position: its last block's output (F = C),
                                      or with `feature_layers` in meta.json those blocks' outputs side by side
  topk_ids.bin       int32 (N, k)     the target's top-k next-token ids at each position
  topk_probs.bin     float16 (N, k)   their probabilities (full-vocabulary softmax)
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from serving.kernels import pack_for_inference

META = "meta.json"
# the settings generated data is made with (extra_meta's "settings"), written before its first answer so that data
# cut short says them too (serving/distill/pipeline.py `data_settings_refusal` compares them with a later run's)
SETTINGS = "settings.json"


# on a GPU a forward costs about the same for one prompt as for many: prompts waiting for free cache slots are
# read together, right-padded, up to this many padded tokens a forward (the logits of all of them are kept)
GPU_PREFILL_TOKENS = 4096
# ... and free slots wait until this share of the batch is free, so a few wide forwards fill them instead of
# a narrow one after nearly every step (on an H200, decode steps with prompts read between them took ~130 ms
# at batch 384, ~65 ms without)
GPU_REFILL_SHARE = 1 / 8


def refill_at(batch: int, prefill_tokens: int) -> int:
    """How many cache slots must be free before waiting prompts are read: 1 (at once) when each prompt
    has its own forward (`prefill_tokens` 0, the CPU's way), else GPU_REFILL_SHARE of the batch."""
    return max(1, int(batch * GPU_REFILL_SHARE)) if prefill_tokens else 1


def prefill_budget(device: torch.device) -> int:
    """`prefill_tokens` for a target on `device`: GPU_PREFILL_TOKENS on a GPU, 0 (one prompt a forward,
    no padding wasted) on the CPU."""
    return 0 if device.type == "cpu" else GPU_PREFILL_TOKENS


def load_target_on(target_dir: str | Path, dtype: torch.dtype, device: torch.device):
    """The target in `dtype` on `device`, for forwards without gradients: on the CPU its linears are packed
    for the kernels measured fastest there (`pack_for_inference`)."""
    from serving.llama import load_causal_lm

    target = load_causal_lm(target_dir, dtype).to(device)
    if device.type == "cpu":
        pack_for_inference(target)
    return target


def admit(queue: deque, free: list[int], live: dict, batch: int, budget: int, usable: Callable[[list[int]], bool],
          skip: Callable[[], None]):
    """The waiting prompts to prefill now, as (slots, group) pairs, each group taking its slots from `free`:
    nothing until `refill_at` slots are free (or nothing runs, or the rest of the queue fits), then groups
    (`prefill_groups`) until the free slots or the queue run out."""
    if not (queue and free and (len(free) >= min(refill_at(batch, budget), len(queue)) or not live)):
        return
    while queue and free:
        group = prefill_groups(queue, len(free), budget, usable, skip)
        if group:
            yield [free.pop() for _ in group], group


def to_host(logits: torch.Tensor, hidden: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A forward's features (bf16) and top-k next-token probabilities and ids, copied to the host in one go
    per forward (a no-op on the CPU), not one copy per sequence."""
    tp, ti = torch.softmax(logits, dim=-1).topk(topk, dim=-1)
    return hidden.to(torch.bfloat16).cpu(), tp.cpu(), ti.cpu()


def shortest_first(encoded: list[tuple[dict, list[int]]]) -> list[tuple[dict, list[int]]]:
    """The order prompts are generated in: by prompt length, shortest first (ties keep their given order).

    A batched decode step reads every sequence's keys up to the longest context in the batch, so prompts of
    similar lengths running together waste less of it on padding. Over the bundled recipe's 4,401 prompts
    (mean 91 tokens, longest 431) the longest context in a step of 48 sequences averaged 336 positions in
    the given order and 213 in this one, against a mean context of ~143; generation ran 7% faster (234
    against 218 answer tokens/s on 192 prompts, bf16, batch 48, a 2-core avx512_bf16 CPU; the full recipe's
    data took 30.8 minutes, 37.5 in the given order a session earlier on that class). A query sees
    only its own sequence's keys, so each answer is the same greedy chain in any order (up to the rounding
    of batched bf16 kernels); the data's order on disk changes, and training shuffles it."""
    return sorted(encoded, key=lambda entry: len(entry[1]))


def prefill_groups(queue: deque, free: int, budget: int, usable: Callable[[list[int]], bool],
                   skip: Callable[[], None]) -> list:
    """Take the next prompts from `queue` (entries (..., ids)) for one prefill forward: at most `free` of
    them and, past the first, no more than `budget` padded tokens (0: one prompt a forward). Entries that
    are not `usable` are dropped on the way, `skip` counting each."""
    group: list = []
    longest = 0
    while queue and len(group) < free:
        ids = queue[0][-1]
        if not usable(ids):
            queue.popleft()
            skip()
            continue
        wider = max(longest, len(ids))
        if group and wider * (len(group) + 1) > budget:
            break
        group.append(queue.popleft())
        longest = wider
    return group


def padded_prefill(target, cache, slots: list[int], prompts: list[list[int]], **kwargs):
    """One forward over several prompts, each from position 0 of its own cache slot, right-padded to the
    longest: a query sees only keys at or before its own position, so the padding changes nothing of the
    real positions, and the padded keys it writes are overwritten by the decode steps before any query
    can see them. A single prompt takes the plain (unmasked) path."""
    from serving.llama import contiguous_batch, ragged_batch

    if len(prompts) == 1:
        return target(torch.tensor([prompts[0]]), contiguous_batch(slots[0], 1, 0, len(prompts[0])), cache, **kwargs)
    T = max(map(len, prompts))
    toks = torch.zeros(len(prompts), T, dtype=torch.long)
    for r, ids in enumerate(prompts):
        toks[r, : len(ids)] = torch.tensor(ids)
    return target(toks, ragged_batch(slots, [0] * len(prompts), T), cache, **kwargs)


def _say_nothing(msg: str) -> None:
    pass


def encode_prompt(tokenizer, item: dict) -> list[int]:
    messages = item.get("messages") or [{"role": "user", "content": item["prompt"]}]
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    return tokenizer.encode(messages[-1]["content"])


def target_context(target_dir: str | Path) -> tuple[int, str]:
    """The positions a target holds and the config.json field that sets them (max_position_embeddings, or a
    shorter sliding_window), read from its config alone."""
    from serving.llama import ModelConfig
    from serving.models import read_config

    cfg = ModelConfig.from_hf(read_config(Path(target_dir)), source=target_dir)
    return cfg.max_position, cfg.max_position_source


def fitting(encoded: list[tuple[dict, list[int]]], context: tuple[int, str],
            say: Callable[[str], None] = _say_nothing) -> list[tuple[dict, list[int]]]:
    """The (item, prompt ids) pairs whose prompt leaves room for an answer in the target's `context` (positions,
    the field that sets them); the others are left out and counted in a line to `say`. A draft serves only
    prompts that fit the target, so the rest teach it nothing, and answers running past the context end there,
    as serving ends them. ValueError when no prompt fits (nothing to distill from)."""
    positions, source = context
    kept = [(item, ids) for item, ids in encoded if len(ids) < positions]
    if encoded and not kept:
        shortest = min(len(ids) for _, ids in encoded)
        raise ValueError(f"none of the {len(encoded)} prompts fits the target's context ({positions} positions, its "
                         f"{source}): the shortest is {shortest} tokens and leaves no room for an answer; give prompts "
                         f"of fewer than {positions} tokens (--corpus data made from them) or a target with a longer "
                         "context")
    if len(kept) < len(encoded):
        say(f"left out {len(encoded) - len(kept)} of {len(encoded)} prompts of {positions} tokens or more: they leave "
            f"no room for an answer in the target's context ({positions} positions, its {source})")
    return kept


def _row_bytes(hidden: int, topk: int) -> dict[str, int]:
    return {"tokens.bin": 4, "feats.bin": 2 * hidden, "topk_ids.bin": 4 * topk, "topk_probs.bin": 2 * topk}


def _write_rows(files: dict, ids: list[int], feats: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor) -> None:
    np.asarray(ids, dtype=np.int32).tofile(files["tokens.bin"])
    feats.to(torch.bfloat16).cpu().contiguous().view(torch.int16).numpy().tofile(files["feats.bin"])
    top_ids.to(torch.int32).cpu().numpy().tofile(files["topk_ids.bin"])
    top_p.to(torch.float16).cpu().numpy().tofile(files["topk_probs.bin"])


def feature_width(hidden: int, feature_layers: tuple[int, ...] | None) -> int:
    return hidden * (len(feature_layers) if feature_layers else 1)


def _write_meta(out_dir: Path, target, topk: int, index: list[dict], extra: dict,
                feature_layers: tuple[int, ...] | None = None) -> dict:
    """meta.json from the sequence index (written last: it marks the directory complete)."""
    domains: dict[str, int] = {}
    for r in index:
        domains[r["domain"]] = domains.get(r["domain"], 0) + 1
    meta = {"format": "specfinops-distill-data/1", "hidden_size": target.cfg.hidden_size,
            "vocab_size": target.cfg.vocab_size, "topk": topk, "num_sequences": len(index),
            "num_tokens": sum(r["length"] for r in index),
            "answer_tokens": sum(r["length"] - r["num_prompt"] for r in index), "domains": domains,
            **({"feature_layers": list(feature_layers)} if feature_layers else {}), **extra}
    (out_dir / META).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def generate_prepared(target_dir: str | Path, prompts: list[dict], out_dir: Path, *, max_new_tokens: int = 192,
                      batch: int = 32, topk: int = 8, max_prompt: int = 700, progress: bool = True,
                      say: Callable[[str], None] = _say_nothing, extra_meta: dict | None = None,
                      dtype: torch.dtype = torch.float32, feature_layers: tuple[int, ...] | None = None,
                      device: torch.device | str = "cpu") -> dict:
    """The target's greedy answers to `prompts` (in its chat format) as a prepared directory, the target run
    in `dtype` (bf16 is what serving runs, so its answers are the ones the draft will be verified against)
    on `device`; see `record_generation`."""
    from serving.models import load_tokenizer

    device = torch.device(device)
    tok = load_tokenizer(Path(target_dir))
    encoded = [(item, encode_prompt(tok, item)) for item in prompts]
    encoded = fitting(encoded, target_context(target_dir), say)  # refused before the target loads or a file is made
    if len(encoded) < len(prompts):  # meta.json's "prompts" counts those generated from
        extra_meta = {**(extra_meta or {}), "prompts_past_context": len(prompts) - len(encoded)}
    target = load_target_on(target_dir, dtype, device)
    with torch.device(device):  # the caches, feeds and batch indices are made where the target runs
        return record_generation(target, encoded, out_dir, eos=tok.eos_token_id, max_new_tokens=max_new_tokens,
                                 batch=batch, topk=topk, max_prompt=max_prompt, progress=progress, say=say,
                                 extra_meta=extra_meta, feature_layers=feature_layers,
                                 prefill_tokens=prefill_budget(device))


@torch.inference_mode()
def record_generation(target, encoded: list[tuple[dict, list[int]]], out_dir: Path, *, eos: int | None,
                      max_new_tokens: int = 192, batch: int = 32, topk: int = 8, max_prompt: int = 700,
                      progress: bool = True, say: Callable[[str], None] = _say_nothing,
                      extra_meta: dict | None = None, feature_layers: tuple[int, ...] | None = None,
                      prefill_tokens: int = 0) -> dict:
    """Greedy answers generated in batches (continuous batching over cache slots), with each position's
    feature and top-k next-token distribution captured by the very forward that produced it: prompt
    positions from the prefill, answer positions from the decode steps. No second (teacher) pass.

    Prompts run shortest first (`shortest_first`). Finished sequences are appended to the arrays and to
    sequences.jsonl as they end, so an interrupted run resumes where it stopped; meta.json is written last
    and marks the directory complete.
    `prefill_tokens`: read waiting prompts together up to this many padded tokens (`prefill_groups`), once
    `refill_at` slots are free (0, the CPU's choice: one prompt a forward, each slot refilled at once)."""
    from tqdm import tqdm

    from serving.llama import ragged_batch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (extra_meta or {}).get("settings") is not None:
        (out_dir / SETTINGS).write_text(json.dumps(extra_meta["settings"], indent=2) + "\n")
    C = feature_width(target.cfg.hidden_size, feature_layers)
    # ---- resume: keep the sequences recorded in full, cut the arrays back to them
    index_path = out_dir / "sequences.jsonl"
    index = read_jsonl(index_path)
    offset = sum(r["length"] for r in index)
    rows = _row_bytes(C, topk)
    for name, nbytes in rows.items():
        f = out_dir / name
        if f.exists():
            with f.open("r+b") as fh:
                fh.truncate(offset * nbytes)
    index_path.write_text("".join(json.dumps(r) + "\n" for r in index))
    done = {r["id"] for r in index}
    queue = deque(shortest_first([(item, ids) for item, ids in encoded if item["id"] not in done]))
    progress_path = out_dir / "progress.json"  # generation seconds spent so far, across resumed runs
    prior_s = json.loads(progress_path.read_text())["seconds"] if progress_path.is_file() and index else 0.0
    skipped, capped = 0, 0
    # a sequence's every position is fed to the target, the last answer token too: it ends at the target's context
    # (an answer cut there, as serving cuts it), and a prompt must leave room for one answer token
    positions = target.cfg.max_position
    longest_prompt = min(max_prompt, positions - 1)
    cache = target.new_cache(batch, max_prompt + max_new_tokens + 1)
    free = list(range(batch - 1, -1, -1))
    live: dict[int, dict] = {}
    files = {n: (out_dir / n).open("ab") for n in rows}
    idx_fh = index_path.open("a")
    t0, ntok = time.perf_counter(), 0
    bar = tqdm(total=len(queue), desc="generate", unit="prompt", disable=not progress)

    def record(slot: int, hidden: torch.Tensor, tp: torch.Tensor, ti: torch.Tensor) -> None:
        """Keep one forward's rows (T, .) of a sequence; append its next (greedy) token or finish it."""
        nonlocal capped
        st = live[slot]
        st["feats"].append(hidden)  # bf16, on the host (to_host)
        st["ti"].append(ti)
        st["tp"].append(tp)
        if st["ending"]:
            finish(slot)
            return
        nxt = int(ti[-1, 0])
        st["tokens"].append(nxt)  # the pending token: fed (and given its feature) by the next step
        st["ending"] = nxt == eos or len(st["tokens"]) - st["num_prompt"] >= max_new_tokens
        if not st["ending"] and len(st["tokens"]) >= positions:
            st["ending"] = True
            capped += 1

    def finish(slot: int) -> None:
        nonlocal offset, ntok
        st = live.pop(slot)
        free.append(slot)
        L = len(st["tokens"])
        _write_rows(files, st["tokens"], torch.cat(st["feats"]), torch.cat(st["ti"]), torch.cat(st["tp"]))
        for f in files.values():
            f.flush()
        item = st["item"]
        idx_fh.write(json.dumps({"id": item["id"], "domain": item["domain"], "num_prompt": st["num_prompt"],
                                 "offset": offset, "length": L}) + "\n")
        idx_fh.flush()
        progress_path.write_text(json.dumps({"seconds": round(prior_s + time.perf_counter() - t0, 1)}))
        offset += L
        ntok += L - st["num_prompt"]
        ended[0] += 1

    # the bar advances once a forward, by the prompts it finished (a batch often ends together): advanced one
    # by one, tqdm timed the first prompt alone and showed a batch's time per prompt (an ETA many times too long)
    ended, shown = [0], [0]  # prompts finished or skipped so far; those the bar counts

    def advance() -> None:
        if ended[0] > shown[0]:
            bar.update(ended[0] - shown[0])
            shown[0] = ended[0]
            bar.set_postfix(tok_s=f"{ntok / (time.perf_counter() - t0):.0f}")

    try:
        def skip() -> None:
            nonlocal skipped
            skipped += 1
            ended[0] += 1

        while queue or live:
            fits = lambda ids: 0 < len(ids) <= longest_prompt  # noqa: E731 - admit's filter
            for slots, group in admit(queue, free, live, batch, prefill_tokens, fits, skip):
                for slot, (item, ids) in zip(slots, group, strict=True):
                    live[slot] = {"item": item, "tokens": list(ids), "num_prompt": len(ids), "feats": [], "ti": [],
                                  "tp": [], "ending": False}
                logits, hidden = padded_prefill(target, cache, slots, [ids for _, ids in group], return_hidden=True,
                                                feature_layers=feature_layers)
                hidden, tp, ti = to_host(logits, hidden, topk)  # (n, P, .)
                for r, (slot, (_, ids)) in enumerate(zip(slots, group, strict=True)):
                    record(slot, hidden[r, : len(ids)], tp[r, : len(ids)], ti[r, : len(ids)])
            advance()
            if not live:
                break
            slots = sorted(live)
            feed = torch.tensor([[live[s]["tokens"][-1]] for s in slots])
            fb = ragged_batch(slots, [len(live[s]["tokens"]) - 1 for s in slots], 1)
            logits, hidden = target(feed, fb, cache, return_hidden=True, feature_layers=feature_layers)
            hidden, tp, ti = to_host(logits, hidden, topk)  # (B, 1, .), once for the batch
            for r, s in enumerate(slots):
                record(s, hidden[r], tp[r], ti[r])
            advance()
    finally:
        advance()
        bar.close()
        for f in files.values():
            f.close()
        idx_fh.close()
    elapsed = time.perf_counter() - t0
    say(f"generated {ntok} answer tokens for {len(encoded) - len(done) - skipped} prompts in {elapsed:.0f} s"
        + (f" ({skipped} prompts longer than {longest_prompt} tokens skipped)" if skipped else "")
        + (f"; {capped} answers stopped at the target's context ({positions} positions)" if capped else ""))
    return _write_meta(out_dir, target, topk, read_jsonl(index_path), {
        "prompts": len(encoded), "max_new_tokens": max_new_tokens,
        "compute_dtype": str(target.lm_head.weight.dtype).replace("torch.", ""),
        "generate_seconds": round(prior_s + elapsed, 1), "teacher_seconds": 0.0,
        "how": "greedy generation; features and top-k captured by the generating forwards", **(extra_meta or {})},
        feature_layers=feature_layers)


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


def read_jsonl(path: Path) -> list[dict]:
    """The records of a sequences.jsonl being written (lines cut by an interruption left out). ValueError naming
    the file when it is not text (another file in its place)."""
    if not path.is_file():
        return []
    out = []
    for line in _read_text(path).splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by an interruption
    return out


@torch.inference_mode()
def teacher_pass(target, answers: list[dict], out_dir: Path, *, topk: int = 8, token_budget: int = 4096,
                 progress: bool = True, extra_meta: dict | None = None,
                 feature_layers: tuple[int, ...] | None = None) -> dict:
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
    C = feature_width(target.cfg.hidden_size, feature_layers)
    files = {n: (out_dir / n).open("wb") for n in _row_bytes(C, topk)}
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
        logits, hidden = target(toks, contiguous_batch(0, len(b), 0, T), cache, return_hidden=True,
                                feature_layers=feature_layers)
        probs = torch.softmax(logits, dim=-1)
        tp, ti = probs.topk(topk, dim=-1)
        for r, i in enumerate(b):
            a, ids = seqs[i]
            L = len(ids)
            _write_rows(files, ids, hidden[r, :L], ti[r, :L], tp[r, :L])
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
    return _write_meta(out_dir, target, topk, index,
                       {"teacher_seconds": round(time.perf_counter() - t0, 1), **(extra_meta or {})},
                       feature_layers=feature_layers)


@dataclass
class Prepared:
    """A prepared data directory loaded into memory (features stay bf16)."""

    path: Path
    meta: dict
    seqs: list[dict]
    tokens: torch.Tensor  # (N,) long
    feats: torch.Tensor  # (N, F) bf16

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target blocks whose outputs `feats` holds side by side; () = the last block only."""
        return tuple(self.meta.get("feature_layers") or ())
    topk_ids: torch.Tensor  # (N, k) long
    topk_probs: torch.Tensor  # (N, k) float32

    @property
    def answer_tokens(self) -> int:
        return sum(s["length"] - s["num_prompt"] for s in self.seqs)


def is_prepared(path: Path) -> bool:
    return (path / META).is_file() and (path / "sequences.jsonl").is_file()


# how damaged data is made again: distill reuses a prepared directory it finds (cached under the target's name
# and the data options), so the directory has to go first
REPREPARE = ("delete the directory and prepare it again (the distill command that made it, with --generate-prompts, "
             "--stdlib-prompts, --package-prompts, --self-prompts or --stdlib-code, makes it anew)")
META_FIELDS = ("hidden_size", "topk", "num_tokens")  # what reading the arrays needs


def read_meta(path: str | Path) -> dict:
    """A prepared directory's meta.json. ValueError naming the file when it is not a JSON object with the
    fields the arrays are read by (a file cut short or overwritten)."""
    f = Path(path) / META
    try:
        meta = json.loads(f.read_text())
    except ValueError as exc:  # not JSON, or not text
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{f} is not valid JSON ({first}): the prepared data in {path} is damaged; {REPREPARE}") \
            from None
    if not isinstance(meta, dict):
        raise ValueError(f"{f} is not a JSON object: the prepared data in {path} is damaged; {REPREPARE}")
    missing = [k for k in META_FIELDS if not isinstance(meta.get(k), int) or isinstance(meta.get(k), bool)]
    if missing:
        raise ValueError(f"{f} has no {', '.join(missing)}: the prepared data in {path} is damaged; {REPREPARE}")
    return meta


DATA_BLOCK = 1 << 16  # bytes of each large array file a prepared directory's fingerprint reads at each sampled spot
DATA_SAMPLES = 64  # how many spots, spread evenly over the file


def data_fingerprint(path: str | Path) -> str:
    """A short name for a prepared directory's content (12 hex digits), what a --resume compares: its meta.json
    (parsed, keys sorted), sequences.jsonl and tokens.bin whole (which sequences and tokens: 4 bytes a position),
    and each other array file's size and DATA_SAMPLES blocks of it (the features and top-k the target computed
    for those tokens, gigabytes in large data). Modification times are not read: a copy or a touched file is the
    same data, and data made again in place with other prompts or another target is other data."""
    import hashlib

    from serving.models import hash_spread_blocks

    path = Path(path)
    h = hashlib.sha256()
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError):
        meta = None
    h.update(json.dumps(meta, sort_keys=True).encode())
    for name in ("sequences.jsonl", "tokens.bin", "feats.bin", "topk_ids.bin", "topk_probs.bin"):
        f = path / name
        if not f.is_file():
            h.update(f"\0{name}\0absent".encode())
            continue
        size = f.stat().st_size
        h.update(f"\0{name}\0{size}\0".encode())
        whole = name in ("sequences.jsonl", "tokens.bin")  # which sequences and tokens: every byte
        with f.open("rb") as fh:
            hash_spread_blocks(fh, h, size, None if whole else DATA_SAMPLES, DATA_BLOCK)
    return h.hexdigest()[:12]


def _read_text(f: Path) -> str:
    """A prepared directory's text file; ValueError naming it (and how to make the data again) when it is not
    UTF-8 text."""
    try:
        return f.read_text()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{f} is not UTF-8 text ({exc.reason} at byte {exc.start}): the prepared data in {f.parent} "
                         f"is damaged; {REPREPARE}") from None


def _read_sequences(path: Path, num_tokens: int) -> list[dict]:
    """sequences.jsonl, each line checked to lie within the arrays' `num_tokens` rows."""
    f = path / "sequences.jsonl"
    seqs = []
    for n, line in enumerate(_read_text(f).splitlines(), 1):
        if not line.strip():
            continue
        try:
            s = json.loads(line)
            ok = (isinstance(s, dict) and all(isinstance(s.get(k), int) for k in ("offset", "length", "num_prompt"))
                  and 0 <= s["offset"] and s["offset"] + s["length"] <= num_tokens)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{f} line {n} is not a sequence within the data's {num_tokens} positions: the "
                             f"prepared data in {path} is damaged; {REPREPARE}")
        seqs.append(s)
    return seqs


def check_prepared(path: str | Path, layers: tuple[int, ...] | None = None, num_layers: int | None = None) -> dict:
    """Prepared data's meta.json, once its files hold the rows it says (and, given `layers` and `num_layers`, the
    features of those target blocks): ValueError naming what is wrong. Reads sizes and meta only, so distill
    checks a --corpus before it makes (or waits for) any other data."""
    path = Path(path)
    if not is_prepared(path):
        raise FileNotFoundError(f"{path} is not a prepared distillation data directory (no meta.json)")
    meta = read_meta(path)
    k, C = meta["topk"], feature_width(meta["hidden_size"], meta.get("feature_layers"))
    n = meta["num_tokens"]
    for name, nbytes in _row_bytes(C, k).items():  # a file cut short (or grown) would not split into rows
        f = path / name
        size = f.stat().st_size if f.is_file() else None
        if size != n * nbytes:
            held = "is missing" if size is None else f"holds {size} bytes"
            raise ValueError(f"{f} {held}, meta.json's {n} positions need {n * nbytes}: the prepared data in "
                             f"{path} is incomplete or damaged; {REPREPARE}")
    if num_layers is not None:
        _feature_blocks(path, meta.get("feature_layers"), layers, num_layers)
    return meta


def _feature_blocks(path: Path, held, layers, num_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the target blocks prepared data at `path` holds features of, the blocks `layers` asks for; () = the last
    block only); ValueError naming the blocks it lacks."""
    have = tuple(held or ()) or (num_layers - 1,)
    want = tuple(layers or ()) or (num_layers - 1,)
    missing = [i for i in want if i not in have]
    if missing:
        raise ValueError(f"{path} holds the features of target blocks {list(have)}, not of {missing} "
                         "(generate the data with those --feature-layers)")
    return have, want


def load_prepared(path: str | Path) -> Prepared:
    path = Path(path)
    meta = check_prepared(path)
    k, C = meta["topk"], feature_width(meta["hidden_size"], meta.get("feature_layers"))
    n = meta["num_tokens"]
    seqs = _read_sequences(path, n)
    tokens = torch.from_numpy(np.fromfile(path / "tokens.bin", dtype=np.int32)).long()
    feats = torch.from_numpy(np.fromfile(path / "feats.bin", dtype=np.int16)).view(torch.bfloat16).view(-1, C)
    ids = torch.from_numpy(np.fromfile(path / "topk_ids.bin", dtype=np.int32)).long().view(-1, k)
    probs = torch.from_numpy(np.fromfile(path / "topk_probs.bin", dtype=np.float16)).float().view(-1, k)
    if not (len(tokens) == len(feats) == len(ids) == len(probs) == meta["num_tokens"]):
        raise ValueError(f"{path}: array sizes disagree with meta.json (interrupted teacher pass?)")
    return Prepared(path, meta, seqs, tokens, feats, ids, probs)


def select_features(prep: Prepared, layers: tuple[int, ...], num_layers: int) -> Prepared:
    """`prep` with only the features of target blocks `layers` (() = the last block only), taken from the
    blocks it holds, so one generation with several blocks' features can train drafts that read fewer."""
    have, want = _feature_blocks(prep.path, prep.feature_layers, layers, num_layers)
    if have == want:
        return prep
    n = prep.feats.shape[0]
    per_block = prep.feats.view(n, len(have), -1)
    feats = per_block[:, [have.index(i) for i in want]].reshape(n, -1).contiguous()
    meta = {k: v for k, v in prep.meta.items() if k != "feature_layers"}
    if layers:
        meta["feature_layers"] = list(want)
    return Prepared(prep.path, meta, prep.seqs, prep.tokens, feats, prep.topk_ids, prep.topk_probs)


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
            extra_meta: dict | None = None, dtype: torch.dtype = torch.float32,
            feature_layers: tuple[int, ...] | None = None, device: torch.device | str = "cpu") -> dict:
    """A complete prepared directory: either the target's own greedy answers to `prompts` (one pass that
    generates and records), or, for items that carry their own "answer", a teacher-forcing pass; the target
    runs on `device`."""
    out_dir = Path(out_dir)
    written = [p for p in prompts if "answer" in p]
    if written and len(written) != len(prompts):
        raise ValueError("a prepared directory holds either generated answers or written answers, not both")
    if not written:
        return generate_prepared(target_dir, prompts, out_dir, max_new_tokens=max_new_tokens, batch=batch,
                                 topk=topk, progress=progress, say=say, extra_meta=extra_meta, dtype=dtype,
                                 feature_layers=feature_layers, device=device)
    answers = written_answers(target_dir, written)
    positions, _ = context = target_context(target_dir)
    kept = {item["id"] for item, _ in fitting([(a, a["prompt_ids"]) for a in answers], context, say)}
    if len(kept) < len(answers):
        extra_meta = {**(extra_meta or {}), "prompts_past_context": len(answers) - len(kept)}
    answers = [a for a in answers if a["id"] in kept]
    cut = sum(len(a["prompt_ids"]) + len(a["output_ids"]) > positions for a in answers)
    if cut:  # teacher-forced up to the context, as far as the target reads
        answers = [{**a, "output_ids": a["output_ids"][: positions - len(a["prompt_ids"])]} for a in answers]
        say(f"{cut} answers cut at the target's context ({positions} positions)")
    device = torch.device(device)
    with torch.inference_mode(), torch.device(device):
        target = load_target_on(target_dir, dtype, device)
        return teacher_pass(target, answers, out_dir, topk=topk, progress=progress, feature_layers=feature_layers,
                            extra_meta={"prompts": len(answers), "compute_dtype": str(dtype).replace("torch.", ""),
                                        **(extra_meta or {})})
