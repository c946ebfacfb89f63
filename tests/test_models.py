"""Model pairing: a draft must share the target's tokenizer."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from serving.models import check_same_vocab, resolve_model


def _model_dir(path, vocab: dict[str, int]):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8}))
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(path / "tokenizer.json"))
    return path


def test_same_tokenizer_passes_and_different_one_is_refused(tmp_path):
    words = {"<unk>": 0, "a": 1, "b": 2, "c": 3}
    target = _model_dir(tmp_path / "t", words)
    check_same_vocab(target, _model_dir(tmp_path / "same", dict(words)))
    other = _model_dir(tmp_path / "other", {"<unk>": 0, "a": 1, "b": 2, "d": 3})
    with pytest.raises(ValueError, match="tokenizers of target .* differ"):
        check_same_vocab(target, other)


def test_unknown_model_and_non_model_dir(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        resolve_model("no/such/model")
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))
