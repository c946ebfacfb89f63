"""`make bench` (scripts/bench_all.py): a failed command fails the whole run, and SUMMARY.md shows only what
this invocation measured (a result file left by an earlier run never reads as current)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts import bench_all


def _writer(name: str, rc: int, body: dict | None = None) -> list[str]:
    """A command that writes bench-results/NAME (when body is given) and exits with rc."""
    code = (f"import json, sys; json.dump({body!r}, open('bench-results/{name}', 'w')); " if body is not None else
            "import sys; ") + f"sys.exit({rc})"
    return [sys.executable, "-c", code]


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bench_all.OUT.mkdir()
    return tmp_path / "bench-results"


def test_a_failed_command_is_counted_and_leaves_no_result(results):
    runs = bench_all.Runs()
    assert runs.sh(_writer("a.json", 0, {"x": 1}), "a.json") == 0
    (results / "b.json").write_text('{"stale": true}')  # from an earlier run
    assert runs.sh(_writer("b.json", 2, {"half": 1}), "b.json") == 2
    assert runs.sh(_writer("c.json", 0), "c.json") == 0  # succeeded but wrote nothing
    assert runs.fresh == {"a.json"} and not (results / "b.json").exists()
    assert len(runs.failed) == 1 and "b.json" in runs.failed[0] and "exit 2" in runs.failed[0]
    assert runs.load("a.json") == {"x": 1} and runs.load("b.json") == {} and runs.load("c.json") == {}


def test_summary_reads_only_this_runs_files_and_shows_a_measured_zero(results):
    ar = {"mode": "ar", "drafter": None, "tokens_per_s": 10.0, "acceptance_rate": None,
          "mean_acceptance_length": None, "dtype": "float32"}
    spec = {"mode": "spec", "drafter": "early-exit", "tokens_per_s": 8.0, "acceptance_rate": 0.0,
            "mean_acceptance_length": 1.0}
    (results / "engine_ngram.json").write_text(json.dumps({"runs": [ar]}))
    (results / "engine_early_exit.json").write_text(json.dumps({"runs": [spec]}))
    (results / "engine_draft.json").write_text(json.dumps({"runs": [ar, {**spec, "drafter": "draft"}], "speedup": 9}))
    runs = bench_all.Runs()
    runs.fresh = {"engine_ngram.json", "engine_early_exit.json"}  # engine_draft.json: an earlier run's
    bench_all.summarize(runs.load)
    page = (results / "SUMMARY.md").read_text()
    assert "| ours spec early-exit | 8.0 | 0.000 | 1.00 | 0.80x |" in page, page
    assert "draft" not in page.replace("early-exit", ""), page


def test_make_bench_exits_1_and_names_what_failed(results, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_all", "--only", "recorder", "--dtype", "float32"])
    monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: 3)
    assert bench_all.main() == 1
    err = capsys.readouterr().err
    assert "1 command(s) failed" in err and "recorder.json (exit 3)" in err, err
