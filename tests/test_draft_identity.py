"""Which draft a run used, and for which target a draft was made. A drafter label named a draft by its folder
alone, so two drafts in folders called `draft` (the bundled one, a retrained ~/exp2/draft) pooled into one drafter
in the store; it now names the draft's weights too, and a copy of one draft is still that draft. A feature draft
distilled for another target of the same shape loaded without a word; its model card's target is checked now."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from serving.eagle import EagleDraft, foreign_target_note
from serving.models import draft_name, weights_fingerprint
from tests.test_distill import _tiny_target_dir
from tests.test_hf_models import hf_dir
from tests.tiny import tiny_model


@pytest.fixture(autouse=True)
def no_kernel_races(monkeypatch):
    """Tiny models need no CPU kernel measurement (as tests/test_bench_byo.py)."""
    for name in ("SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_BF16_KERNEL", "SPECFINOPS_DECODE_ATTENTION",
                 "SPECFINOPS_ATTENTION_FLOAT32", "SPECFINOPS_DRAFT_INT8"):
        monkeypatch.setenv(name, "off")


def _target(path: Path, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(_tiny_target_dir(path, tiny_model(seed)))


def _feature_draft(target_dir: Path, out: Path, first_token: int, card: dict | None = None) -> Path:
    """A feature draft of `target_dir` as distill writes one; `first_token` picks its head's tokens (other weights)."""
    from serving.distill.pipeline import copy_tokenizer, save_draft
    from serving.llama import load_causal_lm

    draft = EagleDraft.init_from_target(load_causal_lm(target_dir, torch.float32),
                                        torch.arange(first_token, first_token + 32))
    save_draft(draft, out, {})
    copy_tokenizer(target_dir, out)
    if card is not None:
        (out / "model_card.json").write_text(json.dumps(card))
    return out


def _copy_without_times(src: Path, dest: Path) -> Path:
    """A copy as `cp -r` makes one: new modification times (what the older, time-based fingerprint changed with)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(src, dest, copy_function=shutil.copy))


def _label(target_dir: Path, draft_dir: Path, drafter: str = "draft+ngram") -> str:
    from serving.worker import EngineSpec, load

    spec = EngineSpec(target=str(target_dir), drafter=drafter, draft_model=str(draft_dir), dtype="float32", k="2",
                      max_len=64)
    return load(spec).drafter_label


@pytest.fixture(scope="module")
def feature_drafts(tmp_path_factory):
    """A target, two different feature drafts of it in folders both called `draft`, and a copy of the first."""
    root = tmp_path_factory.mktemp("drafts")
    target = _target(root / "target", 1)
    a = _feature_draft(target, root / "bundled" / "draft", 0)
    b = _feature_draft(target, root / "exp2" / "draft", 16)
    return target, a, b, _copy_without_times(a, root / "elsewhere" / "draft-copy")


def test_two_feature_drafts_in_folders_of_one_name_are_two_drafters_and_a_copy_keeps_the_mark(feature_drafts):
    target, a, b, copy = feature_drafts
    label_a, label_b, label_copy = (_label(target, d) for d in (a, b, copy))
    assert label_a != label_b  # were both 'feature:draft+copy2+ngram:3-2': one drafter in cost, project, reports
    assert label_a.startswith("feature:draft#") and label_b.startswith("feature:draft#")  # the folder name first
    assert label_a.endswith("+copy2+ngram:3-2")
    assert label_copy == label_a.replace("feature:draft#", "feature:draft-copy#")  # the same weights, the same mark
    assert label_a.split("#")[1].split("+")[0] == weights_fingerprint(a) == weights_fingerprint(copy)
    assert _label(target, a, drafter="draft") == f"feature:{draft_name(a)}+copy4"


def test_two_plain_drafts_in_folders_of_one_name_are_two_drafters_and_a_copy_is_the_same(tmp_path):
    target = hf_dir(tmp_path / "target", seed=0)
    a = hf_dir(tmp_path / "a" / "draft", seed=1, num_hidden_layers=1)
    b = hf_dir(tmp_path / "b" / "draft", seed=2, num_hidden_layers=1)
    copy = _copy_without_times(a, tmp_path / "c" / "draft")
    label_a, label_b, label_copy = (_label(target, d, drafter="draft") for d in (a, b, copy))
    assert label_a.startswith("draft:draft#") and label_a != label_b
    assert label_copy == label_a


def test_a_large_weight_file_is_fingerprinted_by_content_without_reading_it_whole(tmp_path, monkeypatch):
    """Past FINGERPRINT_WHOLE_BYTES a file is sampled (every tensor's header entry and blocks of its data): a copy
    keeps the mark, one changed value of any tensor changes it."""
    from safetensors.torch import save_file

    import serving.models as models

    monkeypatch.setattr(models, "FINGERPRINT_WHOLE_BYTES", 1024)
    tensors = {"a": torch.zeros(64, 64), "b": torch.ones(3000)}
    (tmp_path / "m").mkdir()
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    first = weights_fingerprint(tmp_path / "m")
    assert weights_fingerprint(_copy_without_times(tmp_path / "m", tmp_path / "copy")) == first
    for name, at in (("a", (0, 0)), ("b", (-1,)), ("b", (0,))):
        changed = {k: v.clone() for k, v in tensors.items()}
        changed[name][at] = 5.0
        d = tmp_path / f"{name}{at}"
        d.mkdir()
        save_file(changed, str(d / "model.safetensors"))
        assert weights_fingerprint(d) != first, (name, at)
    (tmp_path / "no-weights").mkdir()
    assert weights_fingerprint(tmp_path / "no-weights") is None


def _with_config(src: Path, dest: Path, **changes) -> Path:
    """A copy of model directory `src` whose config.json has `changes` (the same weights)."""
    _copy_without_times(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**cfg, **changes}))
    return dest


def test_the_same_weights_under_another_config_json_get_another_config_fingerprint(tmp_path):
    """weights_fingerprint reads the weights only: two folders with one model's weights and another rope_theta or
    eos_token_id had one fingerprint. config_fingerprint, kept beside it (weights_fingerprint is stored in drafter
    labels, cards and data and must keep matching), tells them apart; the same config saved otherwise (key order,
    spacing, another transformers version) is the same one."""
    from serving.models import config_fingerprint

    model = _target(tmp_path / "model", 1)
    first = config_fingerprint(model)
    assert first and len(first) == 8
    for name, change in (("rope", {"rope_theta": 500000.0}), ("eos", {"eos_token_id": 7}),
                         ("dtype", {"torch_dtype": "float16"})):
        other = _with_config(model, tmp_path / name, **change)
        assert weights_fingerprint(other) == weights_fingerprint(model)  # stored fingerprints still match
        assert config_fingerprint(other) != first, name
    resaved = _copy_without_times(model, tmp_path / "resaved")
    cfg = json.loads((model / "config.json").read_text())
    text = json.dumps(dict(reversed(list({**cfg, "transformers_version": "9.9.9"}.items()))), indent=4)
    (resaved / "config.json").write_text(text)
    assert config_fingerprint(resaved) == first
    (tmp_path / "no-config").mkdir()
    assert config_fingerprint(tmp_path / "no-config") is None


def test_one_model_saved_by_transformers_4_and_5_has_one_config_fingerprint(tmp_path):
    """transformers 5 saves `dtype` where 4.x saved `torch_dtype`, and `rope_theta` inside `rope_parameters`: the
    same model re-saved got another fingerprint (a draft warned of as made for another config, a --resume
    refused, the corpus refused). Normalised to one form, it is one; a changed rope_theta, in either form, is
    still another. (Defaults written out or left out are no longer folded: that took the installed transformers'
    AutoConfig, which read one config.json to other fingerprints under 4.x and 5.x.)"""
    from serving.models import config_fingerprint

    model = _target(tmp_path / "model", 1)
    cfg = json.loads((model / "config.json").read_text())
    theta = cfg.pop("rope_theta")
    v4 = {**cfg, "rope_theta": theta, "torch_dtype": "float32", "transformers_version": "4.46.3"}
    v5 = {**cfg, "rope_parameters": {"rope_theta": theta, "rope_type": "default"}, "dtype": "float32",
          "transformers_version": "5.0.0", "_name_or_path": "x"}

    def saved(name: str, config: dict) -> Path:
        dest = _copy_without_times(model, tmp_path / name)
        (dest / "config.json").write_text(json.dumps(config, indent=2))
        return dest

    first = config_fingerprint(saved("v4", v4))
    assert first == config_fingerprint(saved("v5", v5))
    assert config_fingerprint(saved("v4-rope", {**v4, "rope_theta": theta * 2})) != first
    assert config_fingerprint(saved("v5-rope", {**v5, "rope_parameters": {"rope_theta": theta * 2,
                                                                          "rope_type": "default"}})) != first
    assert config_fingerprint(saved("v5-dtype", {**v5, "dtype": "bfloat16"})) != first


def test_config_fingerprint_is_read_by_this_code_alone_the_same_on_any_transformers(tmp_path):
    """config_fingerprint read config.json through the installed transformers (AutoConfig.for_model(...)
    .to_diff_dict()), so one config.json had one fingerprint under transformers 4.57 and another under 5.x
    (pyproject allows both). It is normalised by this code now: a 4.x-style and a 5.x-style config of one model
    (the bundled draft's, rope_scaling in either form too) are one, another rope_theta is another, and reading it
    imports no transformers."""
    import subprocess
    import sys

    from serving.models import config_fingerprint

    v5 = {"_name_or_path": "x", "architectures": ["LlamaForCausalLM"], "dtype": "float32", "hidden_size": 576,
          "max_position_embeddings": 8192, "model_type": "llama", "num_hidden_layers": 30,
          "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "tie_word_embeddings": True,
          "transformers_version": "5.25.0", "use_cache": True, "vocab_size": 49152}
    v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "dtype", "_name_or_path")}
    v4.update(torch_dtype="float32", rope_theta=100000.0, rope_scaling=None, transformers_version="4.57.6")

    def fp(name: str, config: dict) -> str:
        dest = tmp_path / name
        dest.mkdir()
        (dest / "config.json").write_text(json.dumps(config, indent=2))
        return config_fingerprint(dest)

    first = fp("v5", v5)
    assert fp("v4", v4) == first
    assert fp("v4-rope", {**v4, "rope_theta": 500000.0}) != first
    scaling = {"factor": 8.0, "original_max_position_embeddings": 8192}
    v4_scaled = fp("v4-scaled", {**v4, "rope_scaling": {"type": "llama3", **scaling}})
    v5_scaled = fp("v5-scaled", {**v5, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "llama3",
                                                           **scaling}})
    assert v4_scaled == v5_scaled != first
    code = ("import sys, json; from serving.models import config_fingerprint; "
            f"print(config_fingerprint({str(tmp_path / 'v4')!r})); "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parent.parent)).stdout.split()
    assert out == [first, "False"]


def test_large_files_are_fingerprinted_by_one_spread_sampling(tmp_path, monkeypatch):
    """data_fingerprint reads a large file by serving.models.hash_spread_blocks: whole where it is small, else
    evenly spread blocks, its first and last among them (a change between them goes unseen). (weights_fingerprint
    keeps its own sampling: its values are stored, see the test below.)"""
    import hashlib
    import os

    from serving import models
    from serving.distill import data

    blob = bytearray(os.urandom(100_000))
    f = tmp_path / "x.bin"

    def digest(content: bytes, samples: int | None, block: int) -> str:
        f.write_bytes(content)
        h = hashlib.sha256()
        with f.open("rb") as fh:
            models.hash_spread_blocks(fh, h, len(content), samples, block)
        return h.hexdigest()

    assert digest(blob, None, 16) == hashlib.sha256(blob).hexdigest() == digest(blob, 10_000, 16)
    first = digest(blob, 8, 64)
    between, last = bytearray(blob), bytearray(blob)
    between[500] ^= 1  # blocks at 0, 14276, ...: byte 500 is read by none
    last[-1] ^= 1
    assert digest(between, 8, 64) == first != digest(last, 8, 64)
    monkeypatch.setattr(data, "DATA_SAMPLES", 8)
    monkeypatch.setattr(data, "DATA_BLOCK", 64)
    prepared = tmp_path / "data"
    prepared.mkdir()

    def data_fp(content: bytes) -> str:
        (prepared / "feats.bin").write_bytes(content)
        return data.data_fingerprint(prepared)

    assert data_fp(blob) == data_fp(between) != data_fp(last)


def test_a_large_weight_file_that_is_not_safetensors_keeps_its_weights_fingerprint(tmp_path):
    """weights_fingerprint's values are stored (drafter labels, model cards, prepared data): sharing
    hash_spread_blocks with data_fingerprint gave a large weight file whose header is not safetensors' another
    one. The expected value is what weights_fingerprint gave before that change: `git show
    e67acae~1:serving/models.py` loaded as a scratch module and run on this very file."""
    import random

    model = tmp_path / "model"
    model.mkdir()
    content = random.Random(20261207).randbytes(70 << 20)  # past FINGERPRINT_WHOLE_BYTES; header not JSON
    (model / "model.safetensors").write_bytes(content)
    assert weights_fingerprint(model) == "7b8b8a6d"


def test_a_draft_made_for_the_same_weights_under_another_config_json_warns(tmp_path):
    """A card records its target's config.json fingerprint beside its weights': the same weights under another
    rope_theta compute other features, and the draft was silently taken as made for them."""
    from serving.models import config_fingerprint

    made_for = _target(tmp_path / "made-for" / "model", 1)
    card = {"target": "model", "target_weights_fingerprint": weights_fingerprint(made_for),
            "target_config_fingerprint": config_fingerprint(made_for)}
    draft = _feature_draft(made_for, tmp_path / "draft", 0, card)
    assert foreign_target_note(draft, made_for) is None
    assert foreign_target_note(draft, _copy_without_times(made_for, tmp_path / "copy" / "model")) is None
    other = _with_config(made_for, tmp_path / "rope" / "model", rope_theta=500000.0)
    note = foreign_target_note(draft, other)
    assert note and "config.json" in note and str(other) in note and "acceptance will suffer" in note
    assert config_fingerprint(made_for) in note and config_fingerprint(other) in note
    card.pop("target_config_fingerprint")  # a card from before it was recorded: the weights decide, as before
    (draft / "model_card.json").write_text(json.dumps(card))
    assert foreign_target_note(draft, other) is None


def test_the_labels_read_whole_in_the_tables_legends_and_reports():
    """What shows a drafter label shows it as recorded: the bench table, the dashboard's pair label, the
    report's drafter column (short_model leaves a label that is not a path as it is)."""
    from app.commands.bench import table_lines
    from app.dashboard.filters import pair_label
    from telemetry.labels import short_model

    label = "feature:draft#547d12db@int8+copy2+ngram:3-2"
    assert short_model(label) == label
    assert pair_label("/a/b/smollm2", label) == f"smollm2 ← {label}"
    base = {"mode": "spec", "k": "4", "concurrency": 1, "tokens_per_s": 10.0, "ttft_p50_ms": 1.0,
            "tpot_p50_ms": 1.0, "tpot_p95_ms": 1.0, "acceptance_rate": 0.5, "mean_acceptance_length": 2.0,
            "token_identical_rate": 1.0, "run_ids": [1]}
    lines = table_lines([{**base, "drafter": label}, {**base, "drafter": "ngram:3"}])
    assert lines[2].split()[1] == label and lines[3].split()[1] == "ngram:3"


def test_the_vllm_label_names_a_local_draft_by_its_weights_and_a_hub_draft_by_its_id(feature_drafts):
    from serving.vllm_backend import VllmConfig

    target, a, b, copy = feature_drafts

    def label(draft: str) -> str:
        return VllmConfig(target=str(target), method="eagle3", draft_model=draft).drafter_label

    assert label(str(a)) == f"vllm-eagle3:{draft_name(a)}" != label(str(b))
    assert label(str(copy)).split("#")[1] == label(str(a)).split("#")[1]
    assert label("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") == "vllm-eagle3:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert label("/not/here/eagle3-head") == "vllm-eagle3:eagle3-head"  # not a model directory here: as before


# ------------------------------------------------------------------ a draft of another target
def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "distilled for" in r.getMessage()]


def test_a_draft_distilled_for_another_target_of_the_same_shape_warns_naming_both(tmp_path, caplog):
    """SmolLM2-135M base and instruct: one shape, one vocabulary; a draft of one loaded for the other was silent
    and accepted poorly. The card's fingerprint of its target's weights is compared with this target's."""
    made_for = _target(tmp_path / "base" / "model", 1)
    other = _target(tmp_path / "instruct" / "model", 2)
    card = {"target": "model", "target_weights_fingerprint": weights_fingerprint(made_for)}
    draft = _feature_draft(made_for, tmp_path / "draft", 0, card)
    with caplog.at_level(logging.WARNING):
        _label(other, draft)
    (line,) = _warnings(caplog)
    assert "\n" not in line and str(draft) in line and str(other) in line and "acceptance will suffer" in line
    assert weights_fingerprint(made_for) in line and weights_fingerprint(other) in line
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _label(_copy_without_times(made_for, tmp_path / "copied" / "SmolLM2"), draft)  # its target, elsewhere
    assert _warnings(caplog) == []


def test_a_card_that_names_its_target_only_is_compared_by_name(tmp_path):
    """Cards written before the weights fingerprint (the bundled draft's) name the target's folder."""
    target = _target(tmp_path / "smollm2-135m-instruct", 1)
    other = _target(tmp_path / "smollm2-135m", 2)
    draft = _feature_draft(target, tmp_path / "draft", 0, {"target": "smollm2-135m-instruct"})
    assert foreign_target_note(draft, target) is None
    note = foreign_target_note(draft, other)
    assert note and "smollm2-135m-instruct" in note and str(other) in note and "acceptance will suffer" in note
    snapshot = _copy_without_times(target, tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
                                   / "snapshots" / "0123abcd")
    assert foreign_target_note(draft, snapshot) is None  # a hub snapshot by its hub id's model name
    (draft / "model_card.json").unlink()
    assert foreign_target_note(draft, other) is None  # no card: a draft made otherwise, nothing to compare


def test_the_bundled_draft_with_the_bundled_target_does_not_warn(caplog):
    from serving.models import BUNDLED_DRAFT_DIR, bundled_target_dir, is_pulled

    if not is_pulled() or not (BUNDLED_DRAFT_DIR / "config.json").is_file():
        pytest.skip("the bundled target is not pulled here")
    assert foreign_target_note(BUNDLED_DRAFT_DIR, bundled_target_dir()) is None
    with caplog.at_level(logging.WARNING):
        label = _label(bundled_target_dir(), BUNDLED_DRAFT_DIR)
    assert _warnings(caplog) == [] and label.startswith(f"feature:draft#{weights_fingerprint(BUNDLED_DRAFT_DIR)}")


def test_distill_records_its_targets_weights_on_the_card(tmp_path, monkeypatch):
    """New cards hold the fingerprint a load compares; the draft loads silently with its target."""
    from app.cli import main
    from tests.test_distill_byo import _distill

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    target = _target(tmp_path / "target", 1)
    out = tmp_path / "draft"
    assert main(_distill(["--target", str(target), "--generate-prompts", "2", "--max-new-tokens", "3",
                          "--gen-batch", "2", "--out", str(out)], tmp_path)) == 0
    card = json.loads((out / "model_card.json").read_text())
    assert card["target_weights_fingerprint"] == weights_fingerprint(target)
    assert foreign_target_note(out, target) is None
    assert foreign_target_note(out, _target(tmp_path / "other", 2)) is not None
