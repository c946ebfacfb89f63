"""Retrieval drafting from a store of the target's answers (serving/datastore.py)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from serving.datastore import SuffixStore, answers_of


def _occurrences(docs, tail):
    n = len(tail)
    return [(d, i + n) for d in range(len(docs)) for i in range(len(docs[d]) - n + 1) if docs[d][i : i + n] == tail]


def test_longest_match_and_its_occurrences_equal_a_brute_force_search():
    rng = random.Random(3)
    docs = [[rng.randrange(4) for _ in range(rng.randrange(1, 25))] for _ in range(40)]
    store = SuffixStore.build(docs, key=5)
    for _ in range(400):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(1, 9))]
        n, lo, hi = store.match(ctx)
        want_n, want_occ = 0, 0
        for m in range(1, min(5, len(ctx)) + 1):
            occ = len(_occurrences(docs, ctx[-m:]))
            if not occ:
                break
            want_n, want_occ = m, occ
        assert (n, hi - lo) == (want_n, want_occ), ctx


def test_continuation_is_the_most_frequent_next_tokens_with_counted_confidence():
    docs = [[1, 2, 3, 4, 5, 6], [9, 2, 3, 4, 7], [2, 3, 4, 5, 8], [5, 5, 5]]
    store = SuffixStore.build(docs, key=4)
    # (2, 3, 4) occurs three times: 5, 7, 5 follow -> 5 (2 of 3, prior 1: 0.5); then 6 or 8 (1 of 2 each)
    c = store.continuation([0, 2, 3, 4], 3)
    assert c.matched == 3 and c.tokens == [5, 6] and c.conf == pytest.approx([2 / 4, 1 / 3])
    # a longer match is more specific: (9, 2, 3, 4) occurs once, followed by 7 and the document's end
    c = store.continuation([9, 2, 3, 4], 3)
    assert c.matched == 4 and c.tokens == [7] and c.conf == pytest.approx([1 / 2])
    # no continuation crosses a document boundary, min_conf and min_match cut
    assert store.continuation([5, 6], 4).tokens == []
    assert store.continuation([2, 3, 4], 3, min_conf=0.45).tokens == [5]
    assert store.continuation([3, 4], 3, min_match=3).tokens == []
    assert store.continuation([11], 3) .matched == 0


def test_a_store_round_trips_through_a_file(tmp_path):
    store = SuffixStore.build([[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5]], key=3)
    store.save(tmp_path / "s.npz")
    back = SuffixStore.load(tmp_path / "s.npz")
    assert back.key == 3 and np.array_equal(back.tokens, store.tokens) and np.array_equal(back.order, store.order)
    assert back.continuation([1, 4], 2) == store.continuation([1, 4], 2)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="key"):
        SuffixStore.build([[1, 2]], key=0)
    with pytest.raises(ValueError, match=">= 0"):
        SuffixStore.build([[1, -4]])


def test_answers_of_a_prepared_directory_keep_the_prompt_tail(tmp_path):
    np.array([10, 11, 12, 13, 20, 21, 30, 31, 32, 40], dtype=np.int32).tofile(tmp_path / "tokens.bin")
    rows = [{"offset": 0, "num_prompt": 4, "length": 6}, {"offset": 6, "num_prompt": 3, "length": 4}]
    (tmp_path / "sequences.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert answers_of(tmp_path, prompt_tail=2) == [[12, 13, 20, 21], [31, 32, 40]]
