"""The float options of `serve` and `loadtest`: NaN and infinities are refused in one line naming the option,
before a model loads or a store is made (`--graceful-s nan` was accepted and meant no grace at all)."""

from __future__ import annotations

import math
import socket

import pytest

from app.cli import main
from serving.loadtest import LoadSpec
from serving.server_setup import ServeOptions


@pytest.fixture
def busy_port():
    """A port something listens on: a serve whose options pass stops at its port check, never loading a model."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_serve_refuses_a_graceful_s_that_is_not_a_finite_number_of_seconds(value, busy_port, tmp_path, capsys):
    db = tmp_path / "serve.db"
    rc = main(["serve", f"--graceful-s={value}", "--port", str(busy_port), "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == 2 and not db.exists(), err
    assert err.strip().splitlines() == [
        f"specfinops serve: error: --graceful-s must be a finite number of seconds >= 0, got {float(value):g}"]


@pytest.mark.parametrize("field,value,option", [
    ("graceful_s", math.nan, "--graceful-s"), ("graceful_s", math.inf, "--graceful-s"),
    ("tdp_w", math.nan, "--tdp-w"), ("tdp_w", math.inf, "--tdp-w"), ("tdp_w", 0.0, "--tdp-w"),
])
def test_serve_options_refuse_non_finite_floats(field, value, option):
    opts = ServeOptions(**{field: value})
    with pytest.raises(ValueError, match=f"^{option} must be a finite number"):
        opts.validate()


@pytest.mark.parametrize("field,value,option", [
    ("duration_s", math.nan, "--duration"), ("duration_s", math.inf, "--duration"),
    ("temperature", math.nan, "--temperature"), ("temperature", math.inf, "--temperature"),
    ("temperature", -math.inf, "--temperature"),
])
def test_load_spec_refuses_non_finite_floats(field, value, option):
    spec = LoadSpec(**{"url": "http://127.0.0.1:8000", "levels": (1,), "duration_s": 1.0, field: value})
    with pytest.raises(ValueError, match=f"^{option} must be within"):
        spec.validate()


@pytest.mark.parametrize("option,value", [("--duration", "nan"), ("--duration", "inf"), ("--temperature", "nan"),
                                          ("--temperature", "inf"), ("--temperature=-inf", None)])
def test_loadtest_refuses_non_finite_floats_in_one_line_before_anything(option, value, tmp_path, capsys):
    db = tmp_path / "load.db"
    args = [option] if value is None else [option, value]
    rc = main(["loadtest", "--url", "http://127.0.0.1:9", *args, "--db", str(db)])
    err = capsys.readouterr().err
    name = option.split("=")[0]
    assert rc == 2 and not db.exists(), err
    assert len(err.strip().splitlines()) == 1 and f"error: {name} must be within" in err, err
