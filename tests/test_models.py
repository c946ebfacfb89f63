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


@pytest.mark.parametrize("manifest, needle", [
    ('{"name": "smollm2-135m-instruct",\n  "source": ', "not valid JSON"),
    ("{}", "no safetensors_sha256 checksum"),
    ("[1, 2]", "no safetensors_sha256 checksum"),
])
def test_a_damaged_manifest_is_one_line_naming_it_and_the_fix(manifest, needle, tmp_path, monkeypatch, capsys):
    """Invalid JSON was 'error: Expecting property name enclosed in double quotes...' (no file, no --force);
    '{}' was 'KeyError: 'safetensors_sha256'' with exit 1."""
    from app.cli import main
    from serving.models import MANIFEST, bundled_target_dir

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path))
    model = bundled_target_dir()
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    (model / MANIFEST).write_text(manifest)
    assert main(["models", "pull"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert str(model / MANIFEST) in err[0] and needle in err[0] and "specfinops models pull --force" in err[0]
