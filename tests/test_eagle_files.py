"""A damaged feature-draft directory: one line naming the file that is wrong, as for a plain model directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from serving.eagle import EagleDraft, is_eagle_dir, load_eagle
from serving.models import check_same_vocab
from tests.test_distill import _tiny_target_dir
from tests.tiny import tiny_model


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny target directory and a feature draft of it as distill writes one (bf16 weights, config, tokenizer)."""
    from serving.distill.pipeline import copy_tokenizer, save_draft

    root = tmp_path_factory.mktemp("eagle")
    target = tiny_model(1)
    target_dir = Path(_tiny_target_dir(root / "target", target))
    draft = EagleDraft.init_from_target(target, torch.arange(32))
    save_draft(draft, root / "draft", {})
    copy_tokenizer(target_dir, root / "draft")
    return target_dir, root / "draft"


def _copy(draft: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(draft, dest)
    return dest


def _load(target_dir: Path, draft: Path):
    from serving.llama import load_causal_lm

    return load_eagle(draft, load_causal_lm(target_dir, torch.float32), torch.float32)


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_a_whole_draft_loads(pair):
    target_dir, draft = pair
    assert is_eagle_dir(draft) and _load(target_dir, draft).cfg.head_vocab == 32
    check_same_vocab(target_dir, draft)


def test_random_weights_name_the_file(pair, tmp_path):
    """Was 'SafetensorError: Error while deserializing header: header too large', naming no file."""
    target_dir, draft = pair
    d = _copy(draft, tmp_path / "d")
    (d / "model.safetensors").write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(ValueError) as err:
        _load(target_dir, d)
    assert _one_line(err).startswith(f"{d / 'model.safetensors'}: not a readable safetensors file")
    (d / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=f"{d} has no model.safetensors"):
        _load(target_dir, d)


def test_a_truncated_config_names_the_file(pair, tmp_path):
    """Was 'Expecting property name enclosed in double quotes: line 3 column 1 (char 36)', naming no file."""
    target_dir, draft = pair
    d = _copy(draft, tmp_path / "d")
    text = (d / "config.json").read_text()
    (d / "config.json").write_text(text[:36])
    for call in (lambda: _load(target_dir, d), lambda: is_eagle_dir(d), lambda: check_same_vocab(target_dir, d)):
        with pytest.raises(ValueError) as err:
            call()
        assert _one_line(err).startswith(f"{d / 'config.json'} is not valid JSON (")
    (d / "config.json").write_text(json.dumps({k: v for k, v in json.loads(text).items() if k != "hidden_size"}))
    with pytest.raises(ValueError) as err:
        _load(target_dir, d)
    assert _one_line(err).startswith(f"{d / 'config.json'} has no hidden_size")


def test_weights_of_another_config_name_both_files(pair, tmp_path):
    """New weights beside an old config.json (a run killed between the two writes) was a blank
    'RuntimeError: Error(s) in loading state_dict for EagleDraft:'."""
    target_dir, draft = pair
    d = _copy(draft, tmp_path / "d")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "head_vocab": 16}))
    with pytest.raises(ValueError) as err:
        _load(target_dir, d)
    msg = _one_line(err)
    assert msg.startswith(f"{d / 'model.safetensors'} does not match {d / 'config.json'} (") and "head" in msg


def test_calibrate_says_which_file_is_damaged(pair, tmp_path, capsys):
    from app.cli import main

    target_dir, draft = pair
    d = _copy(draft, tmp_path / "d")
    (d / "model.safetensors").write_bytes(b"\x00" * 100)
    assert main(["calibrate", "--target", str(target_dir), "--draft", str(d), "--workload", "code", "--limit", "1",
                 "--max-new-tokens", "2", "--dtype", "float32", "--no-telemetry"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and f"{d / 'model.safetensors'}: not a readable safetensors file" in err[0]


def test_is_trained_status_is_public_and_reads_the_card_statuses_distill_writes():
    """distill imported eagle's private `_trained`: the card-status test it shares is public, and says finished for
    the statuses of a finished training only."""
    from serving.distill.pipeline import EVALUATION_INTERRUPTED
    from serving.eagle import is_trained_status

    assert is_trained_status("trained") and is_trained_status(EVALUATION_INTERRUPTED)
    for status in ("interrupted at step 4 (Ctrl-C; the same command with --resume continues it)",
                   "training (intermediate checkpoint)", "trainedx", "", None, 1):
        assert not is_trained_status(status), status
