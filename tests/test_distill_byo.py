"""`specfinops distill` on a user's own target: where it writes, what it caches and resumes, what it refuses."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
import torch

from serving.distill.data import teacher_pass
from tests.test_distill import _tiny_target_dir
from tests.tiny import tiny_model


def _answers(n: int) -> list[dict]:
    rng = random.Random(0)
    return [{"id": f"t{i}", "domain": "code", "prompt_ids": [rng.randrange(3, 96) for _ in range(5)],
             "output_ids": [rng.randrange(3, 20) for _ in range(12)]} for i in range(n)]


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    """A tiny Llama target directory and data prepared from it."""
    root = tmp_path_factory.mktemp("byo")
    target = tiny_model(1)
    target_dir = Path(_tiny_target_dir(root / "target", target))
    corpus = root / "corpus"
    with torch.inference_mode():
        teacher_pass(target, _answers(8), corpus, topk=4, token_budget=256, progress=False)
    return target_dir, corpus


def _digest(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha1(f.read_bytes()).hexdigest() for f in sorted(d.iterdir()) if f.is_file()}


def _distill(argv: list[str], tmp_path: Path) -> list[str]:
    """The tiny run's options: two float32 steps, no evaluation, the checkpoint in tmp_path."""
    return ["distill", *argv, "--steps", "2", "--head-vocab", "32", "--batch-tokens", "128", "--dtype", "float32",
            "--no-eval", "--checkpoint", str(tmp_path / "ckpt.pt")]


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert len(err) == 1, err
    return err[0]


# ------------------------------------------------------------------ --out
def test_out_as_the_targets_directory_is_refused_before_anything_is_written(byo, tmp_path, capsys, monkeypatch):
    from app.cli import main

    target_dir, corpus = byo
    before = _digest(target_dir)
    monkeypatch.chdir(target_dir.parent)
    for out in (str(target_dir), f"./{target_dir.name}/../{target_dir.name}"):  # the same directory spelled twice
        assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", out], tmp_path)) == 2
        line = _one_error_line(capsys)
        assert "--out" in line and "target's own directory" in line
    assert _digest(target_dir) == before
    assert not (tmp_path / "ckpt.pt").exists()


def test_out_as_a_file_or_an_unrelated_directory_is_refused(byo, tmp_path, capsys):
    from app.cli import main

    target_dir, corpus = byo
    afile = tmp_path / "afile"
    afile.write_text("hello")
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(afile)], tmp_path)) == 2
    assert "is a file" in _one_error_line(capsys) and afile.read_text() == "hello"
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(afile / "sub")],
                         tmp_path)) == 2
    assert "is a file" in _one_error_line(capsys)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"mine": true}')
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(other)], tmp_path)) == 2
    assert "holds other files" in _one_error_line(capsys)
    assert (other / "config.json").read_text() == '{"mine": true}' and sorted(p.name for p in other.iterdir()) == [
        "config.json"]
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(corpus)], tmp_path)) == 2
    assert "data directory" in _one_error_line(capsys)
    assert not (tmp_path / "ckpt.pt").exists()


def test_an_earlier_distill_output_or_an_empty_directory_is_written_again(byo, tmp_path):
    from app.cli import main

    target_dir, corpus = byo
    out = tmp_path / "draft"
    out.mkdir()  # empty: fine
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out)], tmp_path)) == 0
    card = json.loads((out / "model_card.json").read_text())
    assert card["status"] == "trained"
    # a rerun, and a resume, into the earlier output
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out)], tmp_path)) == 0
    (out / "model_card.json").unlink()  # stopped before its first card: the draft's config.json says what it is
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out), "--resume"],
                         tmp_path)) == 0
    assert (out / "model_card.json").is_file()
