"""Retrieval drafting: propose what followed the current context in a store of the target's own answers.

A small target answers alike across prompts: the same openings ("Here is a Python function that"), the
same docstring layouts, the same `if __name__ == "__main__":` blocks. A draft model learns part of that;
an exact index of earlier answers recalls it whole. This is retrieval-based speculation in the manner of
REST (He et al. 2023) and SuffixDecoding (Oliaro et al. 2024), over the target's own greedy answers to
training prompts (never the evaluation prompts).

`SuffixStore` indexes every position of a token corpus by the tokens that end there, read backwards
(position i sorts by tokens[i], tokens[i-1], ... for `key` tokens). The occurrences of a context's last n
tokens are then one contiguous range, and extending the match by one more token back narrows the range
with one binary search, so the longest match is found in one pass. What followed the occurrences is
counted token by token: the proposal is the most frequent continuation, as long as it stays likely.

Proposals are deterministic (q one-hot), so sampling stays exact as with prompt lookup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEP = -1  # between documents: never equal to a real token, so no match crosses a document boundary
STORE_FILE = "datastore.npz"


@dataclass(frozen=True, slots=True)
class Continuation:
    tokens: list[int]
    conf: list[float]  # per token: estimated probability that it follows (count / (occurrences + prior))
    matched: int  # how many context tokens the occurrences share with the query


class SuffixStore:
    def __init__(self, tokens: np.ndarray, order: np.ndarray, key: int):
        if tokens.ndim != 1 or order.shape != tokens.shape:
            raise ValueError(f"a store needs 1-d tokens and an order of the same length, got {tokens.shape} "
                             f"and {order.shape}")
        self.tokens = tokens.astype(np.int32, copy=False)
        self.order = order.astype(np.int64, copy=False)
        self.key = int(key)
        self._first = self.tokens[self.order]  # sorted: the token at each indexed position

    # ---- building and saving
    @classmethod
    def build(cls, documents: list[list[int]], key: int = 16, tail: int = 0) -> SuffixStore:
        """Index `documents` (token id lists). Matches are exact for up to `key` context tokens."""
        if key < 1:
            raise ValueError(f"key must be >= 1, got {key}")
        parts = [np.array([SEP], dtype=np.int32)]
        for d in documents:
            if any(t < 0 for t in d):
                raise ValueError("token ids must be >= 0")
            parts += [np.asarray(d, dtype=np.int32), np.array([SEP], dtype=np.int32)]
        tokens = np.concatenate(parts)
        n = len(tokens)
        padded = np.concatenate([np.full(key, SEP, dtype=np.int32), tokens])
        # np.lexsort sorts by the last key first: the primary key is tokens[i], then tokens[i-1], ...
        keys = [padded[key - j : key - j + n] for j in range(key - 1, -1, -1)]
        order = np.lexsort(keys)
        return cls(tokens, order, key)

    def save(self, path: str | Path) -> None:
        np.savez_compressed(path, tokens=self.tokens, order=self.order.astype(np.int32), key=np.int32(self.key))

    @classmethod
    def load(cls, path: str | Path) -> SuffixStore:
        with np.load(path) as z:
            return cls(z["tokens"], z["order"], int(z["key"]))

    def __len__(self) -> int:
        return len(self.tokens)

    # ---- lookup
    def match(self, context: list[int]) -> tuple[int, int, int]:
        """The longest tail of `context` (at most `key` tokens) that occurs in the store: (n, lo, hi), where
        order[lo:hi] are the positions where its last token occurs preceded by the rest. n = 0: no match."""
        if not context:
            return 0, 0, 0
        last = context[-1]
        lo = int(np.searchsorted(self._first, last, "left"))
        hi = int(np.searchsorted(self._first, last, "right"))
        if lo == hi:
            return 0, 0, 0
        n = 1
        while n < min(self.key, len(context)):
            want = context[-1 - n]
            back = self.tokens[self.order[lo:hi] - n]  # sorted within a range that shares n tokens
            a = int(np.searchsorted(back, want, "left"))
            b = int(np.searchsorted(back, want, "right"))
            if a == b:
                break
            lo, hi, n = lo + a, lo + b, n + 1
        return n, lo, hi

    def continuation(self, context: list[int], k: int, *, min_match: int = 1, min_conf: float = 0.0,
                     prior: float = 1.0, max_occurrences: int = 256) -> Continuation:
        """Up to k tokens: what most often followed the longest matching tail of `context`, one token at a
        time among the occurrences that agree so far, while its estimated probability stays >= min_conf."""
        n, lo, hi = self.match(context)
        if n < min_match or k <= 0:
            return Continuation([], [], n)
        pos = self.order[lo : min(hi, lo + max_occurrences)]
        out, conf = [], []
        last = len(self.tokens) - 1
        for s in range(1, k + 1):
            pos = pos[pos + s <= last]
            if not len(pos):
                break
            nxt = self.tokens[pos + s]
            values, counts = np.unique(nxt, return_counts=True)
            best = int(np.argmax(counts))
            p = float(counts[best]) / (len(nxt) + prior)
            if values[best] == SEP or p < min_conf:
                break
            out.append(int(values[best]))
            conf.append(p)
            pos = pos[nxt == values[best]]
        return Continuation(out, conf, n)


def answers_of(prepared_dir: str | Path, prompt_tail: int = 3) -> list[list[int]]:
    """The answers of a prepared distillation data directory (serving/distill/data.py) as documents, each
    led by the last `prompt_tail` prompt tokens (the chat format's assistant header), so an answer's
    opening is matched by what precedes every answer."""
    d = Path(prepared_dir)
    tokens = np.fromfile(d / "tokens.bin", dtype=np.int32)
    docs = []
    for line in (d / "sequences.jsonl").read_text().splitlines():
        if line.strip():
            s = json.loads(line)
            start = s["offset"] + max(s["num_prompt"] - prompt_tail, 0)
            docs.append(tokens[start : s["offset"] + s["length"]].tolist())
    return docs
