"""Calibrate's arithmetic against hand computation, and its bad input."""

from __future__ import annotations

import pytest

from app.cli import main
from telemetry.calibration import StepCounts, calibrate


def test_calibration_by_hand():
    # 10 steps of K=4: 28 of 40 drafted tokens accepted; drafting 40 ms in all = 1 ms per token;
    # 50 AR steps took 1000 ms = 20 ms per target forward -> c = 0.05
    cal = calibrate("code", StepCounts(10, 40, 28, 40.0, 50, 1000.0), threshold=0.65, k_max=8)
    assert cal.alpha == pytest.approx(0.7)
    assert cal.mean_acceptance_length == pytest.approx(1 + 28 / 10)
    assert cal.c == pytest.approx(0.05)
    bounds = {k: (1 - 0.7 ** (k + 1)) / ((1 - 0.7) * (k * 0.05 + 1)) for k in range(1, 9)}
    best = max(bounds, key=bounds.get)
    assert cal.best_k == best and cal.bound_at_best_k == pytest.approx(bounds[best])
    assert cal.verdict == "GO"


def test_no_go_and_unknown():
    assert calibrate("chat", StepCounts(10, 40, 20, 40.0, 50, 1000.0)).verdict == "NO-GO"
    unknown = calibrate("chat", StepCounts(0, 0, 0, 0.0, 50, 1000.0))
    assert unknown.verdict == "UNKNOWN" and unknown.alpha is None and unknown.best_k is None
    with pytest.raises(ValueError, match="threshold"):
        calibrate("x", StepCounts(1, 1, 1, 1.0, 1, 1.0), threshold=0)


@pytest.mark.parametrize("argv,expected", [
    (["--threshold", "1.5"], "--threshold"),
    (["--k", "0"], "--k"),
    (["--workload", "nope"], "unknown workload"),
])
def test_calibrate_bad_input(argv, expected, capsys):
    assert main(["calibrate", *argv]) == 2
    assert expected in capsys.readouterr().err
