"""From a user's audit of `specfinops distill`, `calibrate` and `models` on their own models and inputs: each
test here failed before the fix it guards."""

from __future__ import annotations

import json

import pytest


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


# ------------------------------------------------------------------ a model directory named like a keyword
@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_model_directory_named_like_its_role_is_that_directory_not_the_bundled_model(role, tmp_path, monkeypatch):
    """`--target target` (a folder ./target holding the user's model) silently resolved to the bundled target
    (or said it was not pulled): the path the user gave is the model they meant."""
    from serving.models import resolve_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))  # no bundled target here
    (tmp_path / role).mkdir()
    (tmp_path / role / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert resolve_model(role, role).resolve() == (tmp_path / role).resolve()
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "config.json").write_text("{}")
    assert resolve_model("default", role).resolve() == (tmp_path / "default").resolve()


def test_a_folder_named_target_that_is_no_model_still_means_the_bundled_target(tmp_path, monkeypatch):
    from serving.models import resolve_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "target").mkdir()  # a build folder, say: no config.json
    with pytest.raises(ValueError, match="bundled target is not pulled"):
        resolve_model("target", "target")
