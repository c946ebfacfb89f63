"""Prompts the target writes itself: user questions sampled from its own chat template (Magpie, Xu et al. 2024).

An instruction-tuned model given only the template's text up to the start of a user turn continues it
with a plausible user request. Each request here starts from an opener ("Fix the bug in", "Write a Go",
...) so the questions spread over the coding tasks a code workload holds, and is sampled (temperature 1,
top-p 0.95), so every seed gives new ones. Templated prompts repeat a few hundred sentence shapes and the
draft learns their answers' shapes; the target's own questions are phrased as loosely as real ones. The
target then answers them greedily like any other training prompt.

Requests that do not end within `max_tokens`, are shorter than 20 characters, repeat an earlier one or
are an evaluation prompt are dropped (and more are sampled), so `n` are always returned unless the model
cannot end a request at all.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

SYSTEM = "You are a helpful AI assistant that answers programming questions."
CODE_OPENERS = (
    "Write a Python function", "Write a function", "Write a", "Fix", "Fix the bug in", "Explain",
    "Explain what this", "How do I", "How can I", "Convert", "Why does", "Refactor", "Can you",
    "Write a SQL query", "Write a bash", "Write a JavaScript", "Write a Go", "Write a Rust", "Write a TypeScript",
    "Add", "Write unit tests", "What is the difference between", "Make this", "Write a class", "Write a script",
    "I have a", "Review", "Write a regular expression", "Implement", "Rewrite",
)
SENTINEL = "\x00QUERY\x00"
MIN_CHARS = 20


def pre_query(tokenizer, system: str = SYSTEM) -> tuple[str, str]:
    """(the template's text before a user message's content, the text that ends that content), read off
    the tokenizer's own chat template by rendering a sentinel message, so any chat template works."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the target's tokenizer has no chat template: it cannot write its own prompts")
    text = tokenizer.apply_chat_template([{"role": "system", "content": system},
                                          {"role": "user", "content": SENTINEL}], tokenize=False)
    if SENTINEL not in text:
        raise ValueError("the target's chat template does not show the user's message verbatim")
    before, after = text.split(SENTINEL, 1)
    return before, after


def stop_ids(tokenizer, after: str) -> set[int]:
    """Tokens that end a sampled request: the first token of the text that closes a user turn, and EOS."""
    ids = tokenizer.encode(after, add_special_tokens=False) if after.strip() else []
    out = {ids[0]} if ids else set()
    if tokenizer.eos_token_id is not None:
        out.add(int(tokenizer.eos_token_id))
    if not out:
        raise ValueError("the target's chat template closes a user turn with nothing the model can emit")
    return out


@torch.inference_mode()
def sample_continuations(target, prefixes: list[list[int]], stops: set[int], *, max_tokens: int, seed: int,
                         batch: int = 16, temperature: float = 1.0, top_p: float = 0.95,
                         prefill_tokens: int = 0) -> list[list[int] | None]:
    """Sampled continuations of each prefix, each up to (not including) its first stop token; None where no
    stop came within `max_tokens`. Continuous batching over `batch` cache slots, waiting prefixes read
    together up to `prefill_tokens` padded tokens once `refill_at` slots are free (0: one a forward, at
    once); deterministic for a seed."""
    from collections import deque

    from serving.llama import ragged_batch
    from serving.sampling import logits_to_probs

    from .data import admit, padded_prefill

    gen = torch.Generator(device=target.lm_head.weight.device).manual_seed(seed)  # draws where the logits are
    longest = max((len(p) for p in prefixes), default=0)
    cache = target.new_cache(batch, longest + max_tokens + 1)
    out: list[list[int] | None] = [None] * len(prefixes)
    queue = deque((i, prefixes[i]) for i in range(len(prefixes)))
    free = list(range(batch - 1, -1, -1))
    live: dict[int, dict] = {}  # slot -> {"i", "tokens", "new"}

    def take(slot: int, logits: torch.Tensor) -> None:
        st = live[slot]
        tok = int(torch.multinomial(logits_to_probs(logits, temperature, 0, top_p), 1, generator=gen))
        if tok in stops:
            out[st["i"]] = st["new"]
        elif len(st["new"]) < max_tokens:
            st["new"].append(tok)
            st["tokens"].append(tok)
            return
        live.pop(slot)
        free.append(slot)

    while queue or live:
        for slots, group in admit(queue, free, live, batch, prefill_tokens, lambda ids: True, lambda: None):
            for slot, (i, ids) in zip(slots, group, strict=True):
                live[slot] = {"i": i, "tokens": list(ids), "new": []}
            logits = padded_prefill(target, cache, slots, [ids for _, ids in group],
                                    at=torch.tensor([len(ids) - 1 for _, ids in group]))  # (n, 1, V)
            for r, slot in enumerate(slots):
                take(slot, logits[r, -1])
        if not live:
            break
        slots = sorted(live)
        feed = torch.tensor([[live[s]["tokens"][-1]] for s in slots])
        logits = target(feed, ragged_batch(slots, [len(live[s]["tokens"]) - 1 for s in slots], 1), cache,
                        last_only=True)
        for r, s in enumerate(slots):
            take(s, logits[r, -1])
    return out


def question_room(target_dir: str | Path, tok=None, *, openers: tuple[str, ...] = CODE_OPENERS,
                  system: str = SYSTEM) -> tuple[int, str, int]:
    """(the target's positions, the config field that sets them, the longest chat prefix a question is written
    after, in tokens); ValueError where no question fits after the prefix. Distill asks before it makes any data,
    so a short-context target's --self-prompts is refused before other sources' data is generated."""
    from serving.models import load_tokenizer

    from .data import target_context

    tok = tok if tok is not None else load_tokenizer(Path(target_dir))
    before, _ = pre_query(tok, system)
    positions, source = target_context(target_dir)
    longest = max(len(tok.encode(before + o, add_special_tokens=False)) for o in openers)
    if longest >= positions:
        raise ValueError(f"the target's context ({positions} positions, its {source}) leaves no room for a question "
                         f"after the {longest}-token chat prefix the target writes it after; give prompts of your own "
                         "(--generate-prompts, --stdlib-prompts, --corpus) instead of --self-prompts")
    return positions, source, longest


def self_prompts(target_dir: str | Path, n: int, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 openers: tuple[str, ...] = CODE_OPENERS, system: str = SYSTEM, max_tokens: int = 96,
                 batch: int = 16, progress: bool = True, device: torch.device | str = "cpu") -> list[dict]:
    """`n` code prompts the target writes itself, as workload-style dicts {id, domain, prompt}, the target
    sampling on `device` (the same seed draws different questions on a GPU than on the CPU)."""
    from tqdm import tqdm

    from serving.models import load_tokenizer

    from .data import load_target_on, prefill_budget
    from .prompts import _evaluation_texts

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    tok = load_tokenizer(Path(target_dir))
    before, after = pre_query(tok, system)
    stops = stop_ids(tok, after)
    # a question is sampled after its prefix, within the target's positions (its rope table ends there)
    positions, source, longest = question_room(target_dir, tok, openers=openers, system=system)
    room = (f", all the target's context ({positions} positions, its {source}) leaves after the prefix"
            if positions - longest < max_tokens else "")
    max_tokens = min(max_tokens, positions - longest)
    device = torch.device(device)
    target = load_target_on(target_dir, dtype, device)  # sampling only: no gradients
    rng = random.Random(seed)
    skip = _evaluation_texts()
    items: list[dict] = []
    seen: set[str] = set()
    rounds = 0
    bar = tqdm(total=n, desc="self-prompts", unit="prompt", disable=not progress)
    while len(items) < n:
        want = max(batch, int((n - len(items)) * 1.3))
        chosen = [rng.choice(openers) for _ in range(want)]
        prefixes = [tok.encode(before + o, add_special_tokens=False) for o in chosen]
        with torch.device(device):
            texts = sample_continuations(target, prefixes, stops, max_tokens=max_tokens, seed=seed * 1000 + rounds,
                                         batch=batch, prefill_tokens=prefill_budget(device))
        rounds += 1
        got = 0
        for opener, ids in zip(chosen, texts, strict=True):
            if ids is None or len(items) >= n:
                continue
            text = (opener + tok.decode(ids, skip_special_tokens=True)).strip()
            if len(text) < MIN_CHARS or text in seen or text in skip:
                continue
            seen.add(text)
            items.append({"id": f"self-s{seed}-{len(items):05d}", "domain": "code", "prompt": text})
            got += 1
        bar.update(got)  # the round's questions at once: the rate is per question, the ETA right
        if not got and rounds >= 3:
            bar.close()
            raise ValueError(f"the target wrote no usable request in {rounds} rounds of {want} (none ended within "
                             f"{max_tokens} tokens{room}): it may not follow its chat template")
    bar.close()
    return items
