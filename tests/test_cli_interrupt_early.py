"""A Ctrl-C before a command's handler runs (the parser's build imports every command module; the options are
parsed) ends with "interrupted" and exit 130, not a traceback."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

import pytest

import app.cli
from app.cli import main


def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


def test_ctrl_c_while_the_parser_is_built(monkeypatch, capsys):
    monkeypatch.setattr(app.cli, "build_parser", _interrupt)
    assert main(["cost"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted" and "Traceback" not in err


def test_ctrl_c_while_the_options_are_parsed(monkeypatch, capsys):
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", _interrupt)
    assert main(["cost", "--json"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_ctrl_c_while_a_failure_is_described(monkeypatch, capsys):
    """Past the handler: the error's description imports the store's modules too."""
    def fails(_args):
        raise RuntimeError("boom")

    def parse(self, argv=None, namespace=None):
        return argparse.Namespace(command="cost", verbose=False, handler=fails, db=None), []

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse)
    monkeypatch.setattr(app.cli, "describe_failure", _interrupt)
    assert main(["cost"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_sigint_in_the_first_moments_of_a_process(tmp_path):
    """A real SIGINT sent as the process starts, whenever it lands after app.cli is imported."""
    code = ("import sys, time, app.cli as c; real = c.build_parser\n"
            "def slow():\n    print('building', flush=True); time.sleep(30); return real()\n"
            "c.build_parser = slow; sys.exit(c.main(['cost']))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)
    assert proc.stdout.readline().strip() == "building"
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err.strip() == "interrupted", err
