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


def target_and_corpus(root: Path) -> tuple[Path, Path]:
    """A tiny Llama target directory under `root` and data prepared from it."""
    target = tiny_model(1)
    target_dir = Path(_tiny_target_dir(root / "target", target))
    corpus = root / "corpus"
    with torch.inference_mode():
        teacher_pass(target, _answers(8), corpus, topk=4, token_budget=256, progress=False)
    return target_dir, corpus


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    return target_and_corpus(tmp_path_factory.mktemp("byo"))


def _target(path: Path, seed: int) -> Path:
    """A tiny Llama target directory at `path` (parents made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(_tiny_target_dir(path, tiny_model(seed)))


def _digest(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha1(f.read_bytes()).hexdigest() for f in sorted(d.iterdir()) if f.is_file()}


def _distill(argv: list[str], tmp_path: Path, steps: int = 2) -> list[str]:
    """The tiny run's options: two float32 steps, no evaluation, the checkpoint in tmp_path."""
    return ["distill", *argv, "--steps", str(steps), "--head-vocab", "32", "--batch-tokens", "128", "--dtype", "float32",
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
    # a rerun (replacing a finished draft: --overwrite), and a resume, into the earlier output
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out), "--overwrite"],
                         tmp_path)) == 0
    (out / "model_card.json").unlink()  # stopped before its first card: the draft's config.json says what it is
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out), "--resume"],
                         tmp_path)) == 0
    assert (out / "model_card.json").is_file()


def test_a_run_killed_while_writing_its_draft_leaves_the_previous_draft_whole(byo, tmp_path, monkeypatch):
    """The weights were swapped in first and config.json, tokenizer and card rewritten in place after: a kill
    between them left new weights beside the old config ('Error(s) in loading state_dict for EagleDraft:').
    Now the folder is written beside and swapped in whole: the previous draft stays as it was until then."""
    import pathlib

    from app.cli import main
    from serving.eagle import load_eagle
    from serving.llama import load_causal_lm

    target_dir, corpus = byo
    out = tmp_path / "draft"
    base = ["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out)]
    assert main(_distill(base, tmp_path)) == 0
    before = _digest(out)

    write_text = pathlib.Path.write_text

    def dies_at_the_config(self, *args, **kw):
        if self.name == "config.json" and tmp_path in self.parents:
            raise SystemExit(137)  # the process killed between the weights and the config
        return write_text(self, *args, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", dies_at_the_config)
    with pytest.raises(SystemExit):
        main(_distill([*base, "--overwrite"], tmp_path, steps=3))  # other weights
    monkeypatch.undo()
    assert _digest(out) == before  # the previous set, untouched
    assert json.loads((out / "model_card.json").read_text())["results"]["steps"] == 2
    load_eagle(out, load_causal_lm(target_dir, torch.float32), torch.float32)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".draft")) == []  # nothing half-written
    assert main(_distill([*base, "--overwrite"], tmp_path, steps=3)) == 0  # the rerun replaces the set
    assert json.loads((out / "model_card.json").read_text())["results"]["steps"] == 3
    assert _digest(out)["model.safetensors"] != before["model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".draft")) == []


def test_without_an_atomic_exchange_the_previous_folder_waits_aside_until_the_new_one_is_in(tmp_path, monkeypatch):
    import serving.distill.pipeline as pipeline

    out = tmp_path / "draft"
    out.mkdir()
    (out / "config.json").write_text("old")
    new = tmp_path / ".draft.partial-1"
    new.mkdir()
    (new / "config.json").write_text("new")
    monkeypatch.setattr(pipeline, "_exchange", lambda a, b: False)
    pipeline.swap_in(new, out)
    assert (out / "config.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["draft"]
    # a run killed between the two renames: the folder aside is put back by the next run
    out.rename(tmp_path / ".draft.previous")
    (tmp_path / ".draft.partial-999999999").mkdir()  # and the folder a dead run was writing
    pipeline.recover_output(out)
    assert (out / "config.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["draft"]


# ------------------------------------------------------------------ the data cache
@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """distill's cache in tmp_path (SPECFINOPS_CACHE, set after distill's modules were imported)."""
    import serving.distill.pipeline  # noqa: F401 - imported before the variable is set

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "distill"


def _generate(target_dir: Path, out: Path, tmp_path: Path) -> dict:
    """A tiny run that generates its data (two templated prompts, three answer tokens); its model card."""
    from app.cli import main

    assert main(_distill(["--target", str(target_dir), "--generate-prompts", "2", "--max-new-tokens", "3",
                          "--gen-batch", "2", "--out", str(out)], tmp_path)) == 0
    return json.loads((out / "model_card.json").read_text())


def test_cached_data_belongs_to_one_target_not_to_a_directory_name(tmp_path, cache):
    """Two models under one directory name, and a model retrained in place, never read each other's cached
    answers: the cache is keyed by the target's fingerprint too, and its meta.json names the target."""
    import os

    from serving.distill.data import load_prepared

    a = _target(tmp_path / "a" / "model", 1)
    b = _target(tmp_path / "b" / "model", 2)
    card_a = _generate(a, tmp_path / "da", tmp_path)
    card_b = _generate(b, tmp_path / "db", tmp_path)
    (dir_a,), (dir_b,) = card_a["corpus"]["data_dirs"], card_b["corpus"]["data_dirs"]
    assert dir_a != dir_b and Path(dir_a).parent == Path(dir_b).parent == cache
    assert load_prepared(dir_a).meta["target"] == str(a.resolve())
    assert load_prepared(dir_b).meta["target_fingerprint"] == card_b["target_fingerprint"] != card_a[
        "target_fingerprint"]
    assert _generate(a, tmp_path / "da2", tmp_path)["corpus"]["data_dirs"] == [dir_a]  # the same model: reused
    weights = a / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # retrained in place (new weights, same name)
    assert _generate(a, tmp_path / "da3", tmp_path)["corpus"]["data_dirs"] != [dir_a]


def test_evaluation_data_belongs_to_one_target(tmp_path, cache):
    from serving.distill.pipeline import eval_data

    a = _target(tmp_path / "a" / "model", 1)
    b = _target(tmp_path / "b" / "model", 2)
    da, db = (eval_data(t, 1, lambda m: None, torch.float32) for t in (a, b))
    assert da != db and da.parent == db.parent == cache
    assert json.loads((db / "meta.json").read_text())["target"] == str(b.resolve())


def test_a_data_dir_another_target_made_is_refused(tmp_path, cache, capsys):
    from app.cli import main

    a = _target(tmp_path / "a" / "model", 1)
    b = _target(tmp_path / "b" / "model", 2)
    data = tmp_path / "data"
    assert main(_distill(["--target", str(a), "--generate-prompts", "2", "--max-new-tokens", "3", "--data-dir",
                          str(data), "--out", str(tmp_path / "da")], tmp_path)) == 0
    capsys.readouterr()
    assert main(_distill(["--target", str(b), "--generate-prompts", "2", "--max-new-tokens", "3", "--data-dir",
                          str(data), "--out", str(tmp_path / "db")], tmp_path)) == 2
    assert "another target made" in _one_error_line(capsys)


def _copied(target_dir: Path, dest: Path) -> Path:
    """A plain copy of a target (as cp without -p makes it): the same files, each with a new modification time."""
    import os
    import shutil

    dest.mkdir(parents=True)
    for f in target_dir.iterdir():
        shutil.copyfile(f, dest / f.name)
        st = (dest / f.name).stat()
        os.utime(dest / f.name, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    return dest


def test_data_made_for_the_same_weights_under_another_config_json_is_refused(tmp_path, cache, capsys):
    """The target's weights fingerprint does not read config.json: data a target made (its features and answers)
    was taken for a copy whose config.json says another rope_theta, which computes other ones. meta.json records
    the config's fingerprint too; a plain copy still trains on it."""
    from app.cli import main
    from serving.distill.pipeline import target_meta
    from serving.models import config_fingerprint

    a = _target(tmp_path / "a" / "model", 1)
    corpus = tmp_path / "corpus-of-a"
    with torch.inference_mode():
        teacher_pass(tiny_model(1), _answers(8), corpus, topk=4, token_budget=256, progress=False,
                     extra_meta=target_meta(a))
    other = _copied(a, tmp_path / "rope" / "model")
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "rope_theta": 500000.0}))
    capsys.readouterr()
    assert main(_distill(["--target", str(other), "--corpus", str(corpus), "--out", str(tmp_path / "d")],
                         tmp_path)) == 2
    line = _one_error_line(capsys)
    assert f"--corpus {corpus} holds data another target made" in line and "config.json" in line, line
    assert config_fingerprint(a) in line and config_fingerprint(other) in line
    assert main(_distill(["--target", str(_copied(a, tmp_path / "copy" / "model")), "--corpus", str(corpus),
                          "--out", str(tmp_path / "d")], tmp_path)) == 0


def test_data_made_for_a_target_is_its_copys_and_another_targets_data_is_refused(tmp_path, cache, capsys):
    """Whose data it is goes by the target's weights (target_weights_fingerprint in meta.json, as model cards
    record it), not by their files' modification times: a plain copy of the target (new times, another folder)
    trains on the data made for the original, from --data-dir and --corpus alike; data of other weights is
    refused as before, and data that records only the older fingerprint is compared by that one."""
    from app.cli import main
    from serving.distill.data import load_prepared
    from serving.distill.pipeline import data_settings_refusal, target_fingerprint, target_meta
    from serving.models import weights_fingerprint

    a = _target(tmp_path / "a" / "model", 1)
    copy = _copied(a, tmp_path / "copy" / "model")
    assert target_fingerprint(copy) != target_fingerprint(a) and weights_fingerprint(copy) == weights_fingerprint(a)
    data = tmp_path / "data"
    generate = ["--generate-prompts", "2", "--max-new-tokens", "3", "--gen-batch", "2", "--data-dir", str(data)]
    assert main(_distill(["--target", str(a), *generate, "--out", str(tmp_path / "da")], tmp_path)) == 0
    made = _digest(data)
    capsys.readouterr()
    out = tmp_path / "dcopy"
    assert main(_distill(["--target", str(copy), *generate, "--out", str(out)], tmp_path)) == 0, capsys.readouterr()
    assert load_prepared(data).meta["target_weights_fingerprint"] == weights_fingerprint(a)
    assert json.loads((out / "model_card.json").read_text())["corpus"]["data_dirs"] == [str(data)]
    assert _digest(data) == made  # read as it was, not made again
    # --corpus: data the original made trains the copy
    corpus = tmp_path / "corpus-of-a"
    with torch.inference_mode():
        teacher_pass(tiny_model(1), _answers(8), corpus, topk=4, token_budget=256, progress=False,
                     extra_meta=target_meta(a))
    assert main(_distill(["--target", str(copy), "--corpus", str(corpus), "--out", str(tmp_path / "dc2")],
                         tmp_path)) == 0
    # other weights (the same shapes, names and folder name): refused, from --data-dir and --corpus
    b = _target(tmp_path / "b" / "model", 2)
    capsys.readouterr()
    assert main(_distill(["--target", str(b), *generate, "--out", str(tmp_path / "db")], tmp_path)) == 2
    line = _one_error_line(capsys)
    assert f"--data-dir {data} holds data another target made (fingerprint {weights_fingerprint(a)}" in line
    assert f"this target's is {weights_fingerprint(b)}" in line
    assert main(_distill(["--target", str(b), "--corpus", str(corpus), "--out", str(tmp_path / "db")], tmp_path)) == 2
    line = _one_error_line(capsys)
    assert f"--corpus {corpus} holds data another target made ({a.resolve()}" in line and str(b) in line
    assert not (tmp_path / "db").exists()
    # data still being made (its settings.json only, as a run cut short leaves it): the copy goes on with it
    half = tmp_path / "half"
    half.mkdir()
    (half / "settings.json").write_bytes((data / "settings.json").read_bytes())
    recorded = json.loads((half / "settings.json").read_text())
    for t in (copy, b):
        made_by = target_meta(t)
        want = {**recorded, **{k: made_by[k] for k in ("target_fingerprint", "target_weights_fingerprint")}}
        refused = data_settings_refusal(half, want)
        assert refused is None if t == copy else "made with target (weights fingerprint)" in refused, refused
    # data made before the weights' fingerprint was recorded: compared by the one it records
    old = tmp_path / "corpus-old"
    with torch.inference_mode():
        teacher_pass(tiny_model(1), _answers(8), old, topk=4, token_budget=256, progress=False,
                     extra_meta={"target": str(a.resolve()), "target_fingerprint": target_fingerprint(a)})
    assert main(_distill(["--target", str(copy), "--corpus", str(old), "--out", str(tmp_path / "dc3")],
                         tmp_path)) == 2
    assert "another target made" in _one_error_line(capsys)
    assert main(_distill(["--target", str(a), "--corpus", str(old), "--out", str(tmp_path / "dc3")], tmp_path)) == 0


def test_a_corpus_another_target_made_is_refused_naming_both_targets(byo, tmp_path, capsys):
    """--corpus data another target made trained silently (the same sizes) or crashed in a matmul (another hidden
    size): refused in one line naming the corpus and both targets, before anything is written."""
    from dataclasses import replace

    from app.cli import main
    from serving.distill.pipeline import target_meta
    from tests.tiny import TINY

    target_dir, _ = byo
    other = _target(tmp_path / "other" / "model", 2)
    corpus = tmp_path / "corpus-of-other"
    with torch.inference_mode():
        teacher_pass(tiny_model(2), _answers(8), corpus, topk=4, token_budget=256, progress=False,
                     extra_meta=target_meta(other))
    out = tmp_path / "d"
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out)], tmp_path)) == 2
    line = _one_error_line(capsys)
    assert f"--corpus {corpus}" in line and str(other.resolve()) in line and str(target_dir) in line
    assert "another target made" in line
    # data that records no target but was made by one of another hidden size (hidden 64, 2 layers)
    wide_model = tiny_model(4, replace(TINY, hidden_size=64, num_layers=2, head_dim=16))
    wide = tmp_path / "wide"
    with torch.inference_mode():
        teacher_pass(wide_model, _answers(8), wide, topk=4, token_budget=256, progress=False)
    assert main(_distill(["--target", str(target_dir), "--corpus", str(wide), "--out", str(out)], tmp_path)) == 2
    line = _one_error_line(capsys)
    assert f"--corpus {wide}" in line and "hidden_size 64" in line and "hidden_size 32" in line
    assert not out.exists() and not (tmp_path / "ckpt.pt").exists()
    # the target's own data still trains
    mine = tmp_path / "mine"
    with torch.inference_mode():
        teacher_pass(tiny_model(1), _answers(8), mine, topk=4, token_budget=256, progress=False,
                     extra_meta=target_meta(target_dir))
    assert main(_distill(["--target", str(target_dir), "--corpus", str(mine), "--out", str(out)], tmp_path)) == 0


def _damaged(corpus: Path, dest: Path, how: str) -> tuple[Path, str]:
    """A copy of prepared data damaged as `how` says; the file the error must name."""
    import shutil

    shutil.copytree(corpus, dest)
    if how == "meta not json":
        (dest / "meta.json").write_text('{"x":\n')
        return dest, "meta.json"
    if how == "meta empty object":
        (dest / "meta.json").write_text("{}")
        return dest, "meta.json"
    if how == "meta binary":
        (dest / "meta.json").write_bytes(bytes(range(128, 256)))
        return dest, "meta.json"
    if how == "sequences binary":
        (dest / "sequences.jsonl").write_bytes(bytes(range(248, 256)) * 4)
        return dest, "sequences.jsonl"
    if how == "sequences not json":
        (dest / "sequences.jsonl").write_text('{"id": "t0", "offset": 0, "len\n')
        return dest, "sequences.jsonl"
    name = how.split()[1]  # "truncated feats.bin"
    data = (dest / name).read_bytes()
    (dest / name).write_bytes(data[: len(data) // 2 + 50])
    return dest, name


@pytest.mark.parametrize("how", ["meta not json", "meta empty object", "meta binary", "sequences not json",
                                 "sequences binary", "truncated feats.bin", "truncated tokens.bin",
                                 "truncated topk_probs.bin"])
def test_damaged_prepared_data_is_one_line_naming_the_file_and_how_to_make_it_again(how, byo, tmp_path, capsys):
    from app.cli import main
    from serving.distill.data import load_prepared

    target_dir, corpus = byo
    data, name = _damaged(corpus, tmp_path / "data", how)
    with pytest.raises(ValueError, match="prepare it again"):
        load_prepared(data)
    assert main(_distill(["--target", str(target_dir), "--corpus", str(data), "--out", str(tmp_path / "d")],
                         tmp_path)) == 2
    line = _one_error_line(capsys)
    assert str(data / name) in line and "damaged" in line and "prepare it again" in line
    assert not (tmp_path / "d").exists()


def test_a_corpus_without_the_drafts_features_is_refused_before_other_data_is_made(byo, tmp_path, cache, capsys):
    """A --corpus holding the last block's features, a draft reading block 0: refused only after --generate-prompts
    had made its data (minutes to hours for a real target); now before anything is made."""
    from app.cli import main

    target_dir, corpus = byo
    argv = ["--target", str(target_dir), "--corpus", str(corpus), "--generate-prompts", "2", "--max-new-tokens", "3",
            "--feature-layers", "0", "1", "--out", str(tmp_path / "d")]
    assert main(_distill(argv, tmp_path)) == 2
    line = _one_error_line(capsys)
    assert f"{corpus} holds the features of target blocks [2], not of [0, 1]" in line, line
    assert not cache.exists() or not list(cache.glob("*")), list(cache.glob("*"))
    assert not (tmp_path / "d").exists()


def test_self_prompts_a_target_cannot_write_are_refused_before_other_data_is_made(tmp_path, cache, capsys):
    """A target that cannot write questions of its own (no chat template; or too short a context for one after its
    chat prefix): --self-prompts was refused only after --stdlib-code had made its data; now before anything is."""
    from app.cli import main
    from serving.distill.selfprompts import question_room

    target = _short_target(tmp_path, max_position_embeddings=512)  # a word tokenizer without a chat template
    with pytest.raises(ValueError, match="no chat template"):
        question_room(target)
    argv = ["--target", str(target), "--stdlib-code", "2", "--self-prompts", "2", "--out", str(tmp_path / "d")]
    capsys.readouterr()  # what making the target printed
    assert main(_distill(argv, tmp_path)) == 2
    line = _one_error_line(capsys)
    assert line.startswith("specfinops distill: error: the target's tokenizer has no chat template"), line
    assert not cache.exists() or not list(cache.glob("*")), list(cache.glob("*"))


def test_unfinished_data_whose_index_is_not_text_is_one_line_naming_it(tmp_path, cache, capsys):
    """Generation goes on from the sequences an interrupted run listed in sequences.jsonl: one that is not UTF-8
    text gave "'utf-8' codec can't decode byte 0xf8", naming neither the file nor what to do."""
    from app.cli import main

    target_dir = _target(tmp_path / "target", 1)
    data = tmp_path / "data"
    data.mkdir()
    (data / "sequences.jsonl").write_bytes(bytes(range(248, 256)) * 4)  # no meta.json: unfinished
    assert main(_distill(["--target", str(target_dir), "--generate-prompts", "2", "--max-new-tokens", "3",
                          "--data-dir", str(data), "--out", str(tmp_path / "d")], tmp_path)) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]  # after the line saying what is being made
    assert line.startswith("specfinops distill: error: ")
    assert str(data / "sequences.jsonl") in line and "damaged" in line and "prepare it again" in line, line


def test_the_card_says_whether_training_saw_the_evaluation_prompts(byo, tmp_path, capsys):
    """The card said evaluation_prompts_excluded: true whatever the data was, even a corpus generated from the
    evaluation prompts themselves."""
    from app.cli import main
    from serving.distill.pipeline import evaluation_prompt_ids
    from serving.models import load_tokenizer

    target_dir, corpus = byo
    out = tmp_path / "d"
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out)], tmp_path)) == 0
    held_out = json.loads((out / "model_card.json").read_text())["corpus"]
    assert held_out["evaluation_prompts_excluded"] is True
    assert held_out["evaluation_prompts_check"].startswith("no training sequence has one of the")
    evaluated = evaluation_prompt_ids(load_tokenizer(target_dir))
    seen = tmp_path / "seen"  # data whose first sequence is an evaluation prompt and its answer
    with torch.inference_mode():
        teacher_pass(tiny_model(1), [{"id": "e0", "domain": "code", "prompt_ids": list(min(evaluated)),
                                      "output_ids": [5, 6, 7, 5, 6, 7]}, *_answers(4)], seen, topk=4,
                     token_budget=256, progress=False)
    capsys.readouterr()
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), str(seen), "--out", str(out),
                          "--overwrite"], tmp_path)) == 0
    assert "alpha measured on them is not held out" in capsys.readouterr().err
    card = json.loads((out / "model_card.json").read_text())["corpus"]
    assert card["evaluation_prompts_excluded"] is False
    assert card["evaluation_prompts_check"].startswith("1 training sequence(s) have one of the")


# ------------------------------------------------------------------ --resume
def test_resume_refuses_a_checkpoint_made_for_another_target_or_other_options(byo, tmp_path, capsys):
    from app.cli import main

    target_dir, corpus = byo
    out = tmp_path / "draft"
    base = ["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out)]
    assert main(_distill(base, tmp_path)) == 0
    ckpt = (tmp_path / "ckpt.pt").read_bytes()
    capsys.readouterr()
    assert main(_distill([*base, "--resume", "--lr", "0.01"], tmp_path)) == 2
    line = _one_error_line(capsys)
    assert "--lr 0.0005" in line and "--lr 0.01" in line and "--resume" in line
    assert main(_distill([*base, "--resume", "--unroll", "2"], tmp_path)) == 2
    assert "--unroll 3" in _one_error_line(capsys)
    other = _target(tmp_path / "other", 2)
    assert main(_distill(["--target", str(other), "--corpus", str(corpus), "--out", str(out), "--resume"],
                         tmp_path)) == 2
    assert "another target" in _one_error_line(capsys)
    assert (tmp_path / "ckpt.pt").read_bytes() == ckpt  # refused before training
    # the budget may change: more steps continue the same checkpoint
    assert main(_distill([*base, "--resume"], tmp_path, steps=3)) == 0
    assert "resumed from" in capsys.readouterr().err
    assert json.loads((out / "model_card.json").read_text())["results"]["steps"] == 3


def _set_times(d: Path, times: dict[str, tuple[int, int]]) -> None:
    import os

    for name, (atime, mtime) in times.items():
        os.utime(d / name, ns=(atime, mtime))


def test_resume_goes_by_the_content_of_the_target_and_corpus_not_their_modification_times(byo, tmp_path,
                                                                                             capsys):
    """--resume compared the target by its files' modification times (a touched target, the same weights, was
    refused as another) and the --corpus by its path only (data made again in place was trained on as the
    checkpoint's). Both go by content now; what changed is named."""
    import os
    import shutil

    from app.cli import main

    target_src, corpus_src = byo
    target_dir = Path(shutil.copytree(target_src, tmp_path / "target"))
    corpus = Path(shutil.copytree(corpus_src, tmp_path / "corpus"))
    out = tmp_path / "draft"
    base = ["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out)]
    assert main(_distill(base, tmp_path)) == 0
    for f in target_dir.iterdir():  # the same files, touched (an rsync without -t, a checkout)
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    capsys.readouterr()
    assert main(_distill([*base, "--resume"], tmp_path, steps=3)) == 0, capsys.readouterr().err
    assert "resumed from" in capsys.readouterr().err
    # the corpus made again in place with other answers, its files keeping their sizes and modification times
    times = {f.name: (f.stat().st_atime_ns, f.stat().st_mtime_ns) for f in corpus.iterdir()}
    other = [{**a, "output_ids": a["output_ids"][::-1]} for a in _answers(8)]
    remade = tmp_path / "remade"
    with torch.inference_mode():
        teacher_pass(tiny_model(1), other, remade, topk=4, token_budget=256, progress=False)
    for f in remade.iterdir():
        shutil.copyfile(f, corpus / f.name)
    _set_times(corpus, times)
    ckpt = (tmp_path / "ckpt.pt").read_bytes()
    assert main(_distill([*base, "--resume"], tmp_path, steps=4)) == 2
    line = _one_error_line(capsys)
    assert "--resume" in line and "--corpus" in line and str(corpus.resolve()) in line and "changed" in line, line
    assert (tmp_path / "ckpt.pt").read_bytes() == ckpt  # refused before training
    # the target's config.json edited (another rope_theta), the weights as they were: named as such
    for f in corpus_src.iterdir():
        shutil.copyfile(f, corpus / f.name)
    cfg = json.loads((target_dir / "config.json").read_text())
    (target_dir / "config.json").write_text(json.dumps({**cfg, "rope_theta": 500000.0}))
    assert main(_distill([*base, "--resume"], tmp_path, steps=4)) == 2
    line = _one_error_line(capsys)
    assert "config.json" in line and "same weights" not in line and "these weights" in line, line


def test_an_older_checkpoint_knows_its_target_by_modification_times_only_and_is_compared_by_them():
    """A checkpoint from before the target was recorded by content has only target_fingerprint: compared as
    before; one that records the weights' fingerprint is not compared by the times."""
    from dataclasses import asdict

    from serving.distill.train import TrainConfig, resume_mismatch

    now = TrainConfig(extra={"target_fingerprint": "touched", "target_weights_fingerprint": "w1"})
    older = asdict(TrainConfig(extra={"target_fingerprint": "made"}))
    assert resume_mismatch(older, now) == ("target_fingerprint", "made", "touched")
    newer = asdict(TrainConfig(extra={"target_fingerprint": "made", "target_weights_fingerprint": "w1"}))
    assert resume_mismatch(newer, now) is None
    other = asdict(TrainConfig(extra={"target_fingerprint": "touched", "target_weights_fingerprint": "w0"}))
    assert resume_mismatch(other, now) == ("target_weights_fingerprint", "w0", "w1")


def test_a_copied_or_moved_corpus_of_the_same_data_resumes_and_an_older_checkpoint_compares_paths():
    """data_fingerprint calls a copy the same data, but --resume still compared the --corpus paths: a corpus
    moved or copied elsewhere, its content the same, was refused. A checkpoint that records the corpus by
    content is compared by it alone; an older one (paths only) by its paths, as before."""
    from dataclasses import asdict

    from serving.distill.train import TrainConfig, resume_mismatch

    now = TrainConfig(extra={"corpus": ["/new/place/corpus"], "corpus_fingerprint": ["0123456789ab"]})
    moved = asdict(TrainConfig(extra={"corpus": ["/old/place/corpus"], "corpus_fingerprint": ["0123456789ab"]}))
    assert resume_mismatch(moved, now) is None
    remade = asdict(TrainConfig(extra={"corpus": ["/new/place/corpus"], "corpus_fingerprint": ["ba9876543210"]}))
    assert resume_mismatch(remade, now) == ("corpus_fingerprint", ["ba9876543210"], ["0123456789ab"])
    older = asdict(TrainConfig(extra={"corpus": ["/old/place/corpus"]}))
    assert resume_mismatch(older, now) == ("corpus", ["/old/place/corpus"], ["/new/place/corpus"])
    assert resume_mismatch(asdict(TrainConfig(extra={"corpus": ["/new/place/corpus"]})), now) is None


def test_resume_without_a_checkpoint_says_it_starts_from_scratch(byo, tmp_path, capsys):
    from app.cli import main

    target_dir, corpus = byo
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(tmp_path / "d"),
                          "--resume"], tmp_path)) == 0
    err = capsys.readouterr().err
    assert "no checkpoint" in err and "starting from scratch" in err


def test_training_refuses_to_resume_a_checkpoint_of_other_options(byo, tmp_path):
    from serving.distill.data import load_prepared
    from serving.distill.train import TrainConfig, new_draft, train
    from serving.llama import load_causal_lm

    target_dir, corpus = byo
    target = load_causal_lm(target_dir, torch.float32)
    prep = load_prepared(corpus)
    cfg = TrainConfig(head_vocab=32, batch_tokens=128, steps=1, save_every_s=1e9)
    train(new_draft(target, [prep], cfg, (1,))[0], [prep], cfg, checkpoint=tmp_path / "c.pt", progress=False)
    other = TrainConfig(head_vocab=32, batch_tokens=128, steps=2, save_every_s=1e9, w_hard=0.1)
    with pytest.raises(ValueError, match="w_hard 0.5, not 0.1"):
        train(new_draft(target, [prep], other, (1,))[0], [prep], other, checkpoint=tmp_path / "c.pt", resume=True,
              progress=False)


# ------------------------------------------------------------------ targets with biases (Qwen2), set-up checks
def _qwen2_target(path: Path, seed: int = 3):
    """A tiny Qwen2 target (biases on q, k, v) as a Hugging Face directory, and the model itself."""
    from dataclasses import replace

    from tests.tiny import TINY

    model = tiny_model(seed, replace(TINY, attention_bias=True, model_type="qwen2"))
    path.parent.mkdir(parents=True, exist_ok=True)
    _tiny_target_dir(path, model)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2"}))  # qwen2: biases by default
    tok = json.loads((path / "tokenizer.json").read_text())  # transformers' Qwen2 tokenizer wants <|endoftext|>
    tok["model"]["vocab"]["<|endoftext|>"] = tok["model"]["vocab"].pop("w95")
    (path / "tokenizer.json").write_text(json.dumps(tok))
    return path, model


def test_a_qwen2_target_gets_a_draft_that_saves_and_loads_with_its_biases(tmp_path):
    from app.cli import main
    from serving.eagle import load_eagle
    from serving.llama import contiguous_batch, load_causal_lm

    target_dir, model = _qwen2_target(tmp_path / "qwen2")
    corpus = tmp_path / "corpus"
    with torch.inference_mode():
        teacher_pass(model, _answers(8), corpus, topk=4, token_budget=256, progress=False)
    out = tmp_path / "draft"
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out)], tmp_path)) == 0
    assert json.loads((out / "config.json").read_text())["attention_bias"] is True
    target = load_causal_lm(target_dir, torch.float32)
    assert target.cfg.attention_bias
    draft = load_eagle(out, target, torch.float32)
    bias = draft.layers[0].self_attn.q_proj.bias
    assert bias is not None and float(bias.detach().abs().sum()) > 0  # the target's last block's biases, trained on
    with torch.inference_mode():
        h, logits = draft(torch.tensor([[5, 6, 7]]), torch.randn(1, 3, 32), contiguous_batch(0, 1, 0, 3),
                          draft.new_cache(1, 8))
    assert logits.shape == (1, 3, 32) and torch.isfinite(logits).all()


def test_a_draft_the_target_cannot_start_is_refused_before_the_data_is_made(byo, tmp_path, capsys, cache):
    from app.cli import main

    target_dir, _ = byo  # 3 blocks
    assert main(_distill(["--target", str(target_dir), "--generate-prompts", "2", "--max-new-tokens", "3",
                          "--layers", "4", "--out", str(tmp_path / "d")], tmp_path)) == 2
    assert "--layers 4" in _one_error_line(capsys)
    assert not cache.exists()


def test_a_draft_that_cannot_be_made_fails_before_the_data_is_made(byo, tmp_path, capsys, cache, monkeypatch):
    """Whatever fails in starting the draft from the target (the Qwen2 biases did, after the data) fails first."""
    from app.cli import main
    from serving.eagle import EagleDraft

    def fails(*args, **kw):
        raise RuntimeError('Error(s) in loading state_dict for Block:\n\tUnexpected key(s) in state_dict: "x.bias".')

    monkeypatch.setattr(EagleDraft, "init_from_target", fails)
    target_dir, _ = byo
    assert main(_distill(["--target", str(target_dir), "--generate-prompts", "2", "--max-new-tokens", "3",
                          "--out", str(tmp_path / "d")], tmp_path)) == 2
    line = _one_error_line(capsys)
    assert "cannot start a draft" in line and "x.bias" in line
    assert not cache.exists()


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("option, value", [("--max-new-tokens", "0"), ("--max-new-tokens", "-3"),
                                           ("--eval-max-new-tokens", "-1"), ("--eval-max-new-tokens", "0")])
def test_token_counts_must_be_positive(option, value, byo, tmp_path, capsys, cache):
    from app.cli import main

    target_dir, _ = byo
    assert main(["distill", "--target", str(target_dir), "--generate-prompts", "2", option, value,
                 "--out", str(tmp_path / "d"), "--steps", "1"]) == 2
    assert option in _one_error_line(capsys)
    assert not cache.exists() and not (tmp_path / "d").exists()


def test_a_head_larger_than_the_vocabulary_is_refused(byo, tmp_path, capsys, cache):
    from app.cli import main

    target_dir, _ = byo  # 96 tokens
    assert main(["distill", "--target", str(target_dir), "--generate-prompts", "2", "--head-vocab", "100000",
                 "--out", str(tmp_path / "d"), "--steps", "1"]) == 2
    line = _one_error_line(capsys)
    assert "--head-vocab 100000" in line and "96 tokens" in line
    assert not cache.exists() and not (tmp_path / "d").exists()


def test_distill_caches_where_specfinops_cache_says(byo, tmp_path, cache):
    """Data and the default checkpoint go under $SPECFINOPS_CACHE/distill, read when the command runs."""
    from app.cli import main

    target_dir, _ = byo
    out = tmp_path / "d"
    assert main(["distill", "--target", str(target_dir), "--generate-prompts", "2", "--max-new-tokens", "3",
                 "--gen-batch", "2", "--steps", "1", "--head-vocab", "32", "--batch-tokens", "128", "--dtype",
                 "float32", "--no-eval", "--out", str(out)]) == 0
    (data,) = json.loads((out / "model_card.json").read_text())["corpus"]["data_dirs"]
    assert Path(data).parent == cache and (cache / "checkpoints").is_dir()
    from serving.distill.pipeline import CACHE  # the old constant, for scripts that import it

    assert CACHE == cache


def test_a_quick_trial_is_told_what_the_evaluation_costs_and_that_no_eval_skips_it(byo, tmp_path, capsys, cache,
                                                                                   monkeypatch):
    """--max-new-tokens 16 --steps 3 trained in seconds, then the evaluation (the target's answers to the builtin
    prompts at --eval-max-new-tokens 128, drafted over token by token) ran for minutes, unannounced."""
    import serving.distill.pipeline as pipeline
    from app.cli import main

    evaluated = []
    monkeypatch.setattr(pipeline, "_evaluate", lambda *args, **kwargs: evaluated.append(True))  # its cost: not here
    target_dir, _ = byo
    argv = ["distill", "--target", str(target_dir), "--generate-prompts", "2", "--gen-batch", "2", "--steps", "1",
            "--head-vocab", "32", "--batch-tokens", "128", "--dtype", "float32"]
    from serving.workloads import load_workload

    n = sum(len(load_workload(domain)) for domain in pipeline.EVAL_DOMAINS)
    assert main([*argv, "--max-new-tokens", "3", "--out", str(tmp_path / "d")]) == 0
    err = capsys.readouterr().err
    assert (f"note: after training, alpha is measured on the target's greedy answers to {n} builtin prompts of up to "
            f"128 tokens each (--eval-max-new-tokens 128, more than --max-new-tokens 3): up to {n * 128:,} answer "
            "tokens") in err
    assert "--no-eval skips the evaluation" in err and evaluated == [True]
    assert main([*argv, "--max-new-tokens", "3", "--no-eval", "--out", str(tmp_path / "e")]) == 0
    assert "--no-eval skips" not in capsys.readouterr().err and evaluated == [True]
    assert main([*argv, "--max-new-tokens", "3", "--eval-max-new-tokens", "3", "--out", str(tmp_path / "f")]) == 0
    assert "--no-eval skips" not in capsys.readouterr().err  # no longer than the run's own answers


# ------------------------------------------------------------------ the model card's command
def test_the_card_command_reproduces_with_absolute_paths_eval_tokens_and_threads(byo, tmp_path, monkeypatch):
    import os
    import shlex

    from app.cli import build_parser
    from serving.distill.pipeline import command_line

    target_dir, corpus = byo
    monkeypatch.chdir(target_dir.parent)
    os.symlink(corpus, tmp_path / "data")
    args = build_parser().parse_args(["distill", "--target", target_dir.name, "--corpus", os.path.relpath(corpus),
                                      str(tmp_path / "data"), "--out", "drafts/../d", "--eval-max-new-tokens", "64",
                                      "--threads", "1", "--steps", "5"])
    cmd = shlex.split(command_line(args))
    assert cmd[cmd.index("--target") + 1] == str(target_dir)
    assert cmd[cmd.index("--corpus") + 1: cmd.index("--corpus") + 3] == [str(corpus), str(tmp_path / "data")]
    assert cmd[cmd.index("--out") + 1] == str(target_dir.parent / "d")
    assert cmd[cmd.index("--eval-max-new-tokens") + 1] == "64" and cmd[cmd.index("--threads") + 1] == "1"
    bundled = build_parser().parse_args(["distill", "--target", "smollm2-135m-instruct", "--out", "/tmp/x",
                                         "--generate-prompts", "3", "--no-eval"])
    cmd = shlex.split(command_line(bundled))
    assert cmd[cmd.index("--target") + 1] == "smollm2-135m-instruct"  # a model's name stays its name
    assert "--eval-max-new-tokens" not in cmd  # nothing evaluated
    assert build_parser().parse_args(cmd[1:]).threads == 2  # the card's command parses back


def test_the_card_of_a_time_budget_says_a_rerun_matches_in_options_not_in_steps(byo, tmp_path):
    """A time-budgeted draft could not be reproduced from its card (118 steps, 126 on the rerun; the schedule
    follows the elapsed time): the card now records the steps trained and says what a rerun matches."""
    from app.cli import main

    target_dir, corpus = byo
    timed = ["distill", "--target", str(target_dir), "--corpus", str(corpus), "--out", str(tmp_path / "t"),
             "--minutes", "0.02", "--head-vocab", "32", "--batch-tokens", "128", "--dtype", "float32", "--no-eval",
             "--checkpoint", str(tmp_path / "t.pt")]
    assert main(timed) == 0
    card = json.loads((tmp_path / "t" / "model_card.json").read_text())
    rerun = card["rerun"]
    assert rerun["matches"] == "options" and rerun["steps_trained"] == card["results"]["steps"] >= 1
    assert "as many steps as the machine allows" in rerun["why"] and "no --steps N reproduces" in rerun["why"]
    assert "--steps" not in card["command"].split()
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(tmp_path / "s")],
                         tmp_path, steps=3)) == 0
    rerun = json.loads((tmp_path / "s" / "model_card.json").read_text())["rerun"]
    assert rerun == {"matches": "options and steps", "steps_trained": 3,
                     "why": "--steps 3: a rerun trains the same 3 steps on the same learning-rate schedule"}


# ------------------------------------------------------------------ Ctrl-C
def _ctrl_c_at(monkeypatch, call: int) -> None:
    """Ctrl-C (SIGINT to this process) during the `call`-th training step's loss."""
    import os
    import signal

    import serving.distill.train as tr

    loss, calls = tr.distill_loss, []

    def interrupted(*args, **kw):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGINT)
        return loss(*args, **kw)

    monkeypatch.setattr(tr, "distill_loss", interrupted)


def test_ctrl_c_stops_training_after_the_step_with_a_whole_checkpoint(byo, tmp_path, monkeypatch):
    import signal

    from serving.distill.data import load_prepared
    from serving.distill.train import TrainConfig, TrainingInterrupted, new_draft, train
    from serving.llama import load_causal_lm

    target_dir, corpus = byo
    target, prep = load_causal_lm(target_dir, torch.float32), load_prepared(corpus)
    cfg = TrainConfig(head_vocab=32, batch_tokens=128, steps=20, save_every_s=1e9)
    handler = signal.getsignal(signal.SIGINT)
    _ctrl_c_at(monkeypatch, 3)
    seen = []
    with pytest.raises(TrainingInterrupted) as stopped:
        train(new_draft(target, [prep], cfg, (1,))[0], [prep], cfg, checkpoint=tmp_path / "c.pt", progress=False,
              on_checkpoint=lambda d, info: seen.append(info["step"]))
    assert stopped.value.step == 3 and seen == [3]
    assert torch.load(tmp_path / "c.pt", weights_only=False)["step"] == 3
    assert signal.getsignal(signal.SIGINT) is handler  # put back


@pytest.mark.parametrize("pool", [256, 0])
def test_a_run_interrupted_and_resumed_ends_with_the_weights_of_an_uninterrupted_one(pool, byo, tmp_path,
                                                                                     monkeypatch):
    """The checkpoint kept the batch generator but not the rest of the epoch, the noise generator restarted from
    the seed and the loss average from nothing: an interrupted + resumed run drifted from step ~20 (loss
    11.4435 against 11.3747). Now it continues the same run, bit for bit on the CPU with one thread."""
    from serving.distill.data import load_prepared
    from serving.distill.train import TrainConfig, TrainingInterrupted, new_draft, train
    from serving.llama import load_causal_lm

    target_dir, corpus = byo
    prep = load_prepared(corpus)
    cfg = TrainConfig(head_vocab=32, batch_tokens=128, batch_pool=pool, steps=30, save_every_s=1e9, warmup_steps=5)
    assert cfg.feat_noise > 0  # the noise draws must continue too

    def run(checkpoint: Path | None, resume: bool = False):
        torch.manual_seed(123)  # whatever the process drew before: training seeds its own generators
        draft = new_draft(load_causal_lm(target_dir, torch.float32), [prep], cfg, (1,))[0]
        summary = train(draft, [prep], cfg, checkpoint=checkpoint, resume=resume, progress=False)
        return draft.state_dict(), summary

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        whole, whole_summary = run(None)
        _ctrl_c_at(monkeypatch, 13)
        with pytest.raises(TrainingInterrupted) as stopped:
            run(tmp_path / "c.pt")
        assert stopped.value.step == 13
        monkeypatch.undo()
        resumed, resumed_summary = run(tmp_path / "c.pt", resume=True)
    finally:
        torch.set_num_threads(threads)
    assert resumed_summary["steps"] == 30
    for name, value in whole.items():
        assert torch.equal(resumed[name], value), name

    def untimed(curve):
        return [{k: v for k, v in c.items() if k != "minutes"} for c in curve]

    assert untimed(resumed_summary["curve"]) == untimed(whole_summary["curve"])
    assert resumed_summary["final"] == whole_summary["final"]


def test_an_interrupted_distill_says_the_step_saved_and_how_to_resume(byo, tmp_path, capsys, monkeypatch):
    import shlex

    from app.cli import main

    target_dir, corpus = byo
    out = tmp_path / "draft"
    _ctrl_c_at(monkeypatch, 2)
    assert main(_distill(["--target", str(target_dir), "--corpus", str(corpus), "--out", str(out)], tmp_path,
                         steps=6)) == 130
    err = capsys.readouterr().err
    assert "checkpoint at step 2" in err and err.strip().endswith("interrupted")
    (command,) = [line for line in err.splitlines() if line.startswith("  specfinops distill ")]
    argv = shlex.split(command)
    assert argv[-1] == "--resume" and "--checkpoint" in argv and "--no-eval" in argv
    monkeypatch.undo()
    assert main(argv[1:]) == 0  # the printed command continues the run
    assert "resumed from" in capsys.readouterr().err
    assert json.loads((out / "model_card.json").read_text())["results"]["steps"] == 6


def test_distill_help_states_the_defaults(capsys):
    from app.cli import main

    with pytest.raises(SystemExit):
        main(["distill", "--help"])
    text = "".join(capsys.readouterr().out.split())  # as wrapped for any terminal width

    def said(words: str) -> bool:
        return "".join(words.split()) in text

    assert said("training budget in minutes (excluding data and evaluation; default: 30, unless --steps or "
                "--total-minutes is given)")
    assert said("answer length cap when generating data (default: 192)")


def test_an_interrupt_while_making_data_says_the_same_command_goes_on(byo, tmp_path, capsys, monkeypatch, cache):
    import serving.distill.data as data
    from app.cli import main

    def stopped(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "prepare", stopped)
    target_dir, _ = byo
    assert main(_distill(["--target", str(target_dir), "--generate-prompts", "2", "--out", str(tmp_path / "d")],
                         tmp_path)) == 130
    err = capsys.readouterr().err
    assert f"interrupted while making the data in {cache}" in err and "the same command goes on" in err


def test_a_draft_of_a_target_with_rope_scaling_rotates_as_its_target_does(tmp_path):
    """A Llama 3.1+ target (rope_type llama3): the draft's layer starts from the target's last block, so it must
    see positions as that block does; a draft saved without a rope_scaling (before drafts carried it) loads as
    it was trained, with plain rope."""
    from dataclasses import replace

    from serving.eagle import EagleDraft, load_eagle
    from serving.llama import RopeScaling
    from tests.tiny import TINY

    scaling = RopeScaling("llama3", 8.0, 1.0, 4.0, 16)
    target = tiny_model(5, replace(TINY, rope_scaling=scaling))
    draft = EagleDraft.init_from_target(target, torch.arange(32))
    assert draft.cfg.rope_scaling == scaling
    assert torch.equal(draft.rope_cos, target.rope_cos) and torch.equal(draft.rope_sin, target.rope_sin)
    draft.save(tmp_path / "draft")
    loaded = load_eagle(tmp_path / "draft", target, torch.float32)
    assert loaded.cfg.rope_scaling == scaling and torch.equal(loaded.rope_cos, target.rope_cos)

    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    del cfg["rope_scaling"]
    (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    plain = load_eagle(tmp_path / "draft", target, torch.float32)
    assert plain.cfg.rope_scaling is None
    assert (plain.rope_cos - target.rope_cos).abs().max() > 0.1


# ------------------------------------------------------------------ a target with a short context
def _words(n: int) -> str:
    return " ".join(f"w{3 + i % 90}" for i in range(n))  # n tokens with the tiny word-level tokenizer


def _short_target(root: Path, **config) -> Path:
    """A tiny transformers-made target of 16 positions (or as `config` says) with a whitespace word tokenizer."""
    from tests.test_hf_models import hf_dir

    return hf_dir(root / "short", **{"max_position_embeddings": 16, **config})


def test_generated_data_leaves_out_prompts_past_the_context_and_ends_answers_there(tmp_path):
    """A prompt plus --max-new-tokens longer than the target's positions crashed with a raw IndexError (the
    rope table's end) and left an empty data folder: a prompt that leaves no room for an answer is left out
    and counted, and an answer that reaches the context ends there, as serving ends it."""
    from serving.distill.data import load_prepared, prepare

    target = _short_target(tmp_path)
    prompts = [{"id": i, "domain": "code", "prompt": _words(n)} for i, n in (("a", 5), ("b", 12), ("c", 20))]
    said: list[str] = []
    prepare(target, prompts, tmp_path / "data", max_new_tokens=8, batch=2, topk=4, progress=False,
            say=said.append)
    prep = load_prepared(tmp_path / "data")
    assert sorted(s["id"] for s in prep.seqs) == ["a", "b"]
    assert (prep.meta["prompts"], prep.meta["prompts_past_context"]) == (2, 1)
    assert any("left out 1 of 3 prompts" in line and "(16 positions, its max_position_embeddings)" in line
               for line in said), said
    for s in prep.seqs:
        assert s["length"] <= 16 and s["length"] > s["num_prompt"], s
        ended_by_eos = int(prep.tokens[s["offset"] + s["length"] - 1]) == 1
        assert ended_by_eos or s["length"] == min(16, s["num_prompt"] + 8), s


def test_written_answers_past_the_context_are_cut_there(tmp_path):
    """The teacher pass (--stdlib-code) read prompt and answer whole, past the target's positions."""
    from serving.distill.data import load_prepared, prepare

    target = _short_target(tmp_path)
    items = [{"id": "fits", "domain": "code", "prompt": _words(5), "answer": _words(20)},
             {"id": "too-long", "domain": "code", "prompt": _words(16), "answer": _words(3)}]
    said: list[str] = []
    prepare(target, items, tmp_path / "data", topk=4, progress=False, say=said.append)
    prep = load_prepared(tmp_path / "data")
    assert [(s["id"], s["num_prompt"], s["length"]) for s in prep.seqs] == [("fits", 5, 16)]
    assert (prep.meta["prompts"], prep.meta["prompts_past_context"]) == (1, 1)
    assert any("left out 1 of 2 prompts" in line for line in said), said


@pytest.mark.parametrize(("config", "source"), [({}, "max_position_embeddings"),
                                                ({"sliding_window": 16, "max_position_embeddings": 128},
                                                 "sliding_window")])
def test_data_none_of_whose_prompts_fit_is_refused_before_a_folder_is_made(config, source, tmp_path):
    from serving.distill.data import prepare
    from tests.test_hf_models import hf_dir

    target = hf_dir(tmp_path / "short", "mistral", **{"max_position_embeddings": 16, **config})
    for items in ([{"id": "p", "domain": "code", "prompt": _words(16)}],
                  [{"id": "p", "domain": "code", "prompt": _words(20), "answer": _words(3)}]):
        with pytest.raises(ValueError, match=f"none of the 1 prompts fits the target's context \\(16 positions, its "
                                             f"{source}\\)"):
            prepare(target, items, tmp_path / "data", max_new_tokens=4, topk=4, progress=False)
        assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("data", [["--generate-prompts", "2"], ["--stdlib-code", "2"]])
def test_distill_on_a_target_too_short_for_its_prompts_is_one_line_and_leaves_no_data_folder(data, tmp_path, cache,
                                                                                              capsys):
    from app.cli import main

    target = _short_target(tmp_path, max_position_embeddings=5)  # the templated and code prompts are longer
    assert main(_distill(["--target", str(target), *data, "--max-new-tokens", "8", "--out", str(tmp_path / "d")],
                         tmp_path)) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("specfinops distill: error: none of the 2 prompts fits the target's context "
                           "(5 positions"), line
    assert not list(cache.glob("*")) and not (tmp_path / "d").exists()


def test_distill_with_evaluation_on_a_target_too_short_for_every_evaluation_prompt_refuses_before_any_work(
        tmp_path, cache, capsys):
    """Alpha is measured after training: a target too short for every evaluation prompt failed only then."""
    from app.cli import main

    target = _short_target(tmp_path, max_position_embeddings=5)  # the shortest evaluation prompt is 5 tokens
    capsys.readouterr()  # what making it printed
    argv = [a for a in _distill(["--target", str(target), "--generate-prompts", "2", "--out", str(tmp_path / "d")],
                                tmp_path) if a != "--no-eval"]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "none of the builtin evaluation prompts fits the target's context (5 positions" in line, line
    assert "add --no-eval" in line
    assert not cache.exists() or not list(cache.glob("*"))
