"""calibrate's timings: both modes warmed up before the first timed prompt, and timings no machine can produce
(v well below 1, a measured speedup above the mean acceptance length) said beside the figures, never hidden.

An audit printed `code 1 0.690 0.488 2.82 0.018 8 2.72 0.22 9.78 10.11 GO`: v = 0.22 (a 5-token verify cheaper
than a 1-token forward) and 10.11x measured with a mean acceptance length of 2.82, with no warning: AR ran
first on the first prompt with no warm-up, so its first-call costs inflated the one-token forward."""

from __future__ import annotations

import argparse
import json

import pytest

from telemetry.calibration import StepCounts, calibrate, calibration_warnings

RERUN = ("c, bound, v, bound v and measured are unreliable (the verdict, on alpha alone, stands); rerun with more "
         "prompts (--limit) on an idle machine")


def _cal(spec_verify_ms: float | None):
    # 10 steps of K=4: 28 accepted, 5 all accepted -> alpha 28/33, mean acceptance length 1 + 28/10 = 3.8;
    # 50 AR steps in 1000 ms -> a 20 ms one-token forward; v = (spec_verify_ms / 10) / 20
    return calibrate("code", StepCounts(10, 40, 28, 5, 40.0, 50, 1000.0, spec_verify_ms=spec_verify_ms))


def test_impossible_timings_are_warned_with_their_figures_and_kept_as_measured():
    cal = _cal(44.0)  # 4.4 ms a 5-token verify / 20 ms a one-token forward = 0.22
    assert cal.verify_ratio == pytest.approx(0.22) and cal.mean_acceptance_length == pytest.approx(3.8)
    assert cal.verdict == "GO"  # alpha 0.848 >= 0.65: the verdict does not depend on the timings
    assert calibration_warnings(cal, 10.11) == [
        "v = 0.22 is below 0.8: a verify forward over K + 1 = 5 tokens cannot cost much less than a one-token "
        f"forward, so the timings are wrong (likely a loaded machine or too few prompts): {RERUN}",
        "measured 10.11x is above the mean acceptance length 3.80 (by more than 10%): a speculative step emits 3.80 "
        "tokens on average for at least one target forward, so it cannot beat AR by more than that; the AR timing "
        f"was inflated (likely a loaded machine or too few prompts): {RERUN}",
    ]
    assert cal.verify_ratio == pytest.approx(0.22)  # not clamped
    # 3.8 tokens a step / (4 * 0.05 + 0.22): the bound with the measured v stays as computed too
    assert cal.bound_with_measured_verify == pytest.approx(3.8 / 0.42)


@pytest.mark.parametrize("spec_verify_ms,measured,fires", [
    (220.0, 1.5, []),  # v 1.1, 1.5x: a plausible run
    (160.0, None, []),  # v = 0.8 exactly: at the line, not below it
    (158.0, None, ["v = 0.79"]),  # 15.8 ms / 20 ms
    (None, 4.17, []),  # 1.1 * 3.8 = 4.18: within the tolerance
    (None, 4.2, ["measured 4.20x"]),
    (None, 3.8, []),  # exactly the mean acceptance length
    (100.0, 5.0, ["v = 0.50", "measured 5.00x"]),
])
def test_sanity_lines_fire_only_past_their_thresholds(spec_verify_ms, measured, fires):
    lines = calibration_warnings(_cal(spec_verify_ms), measured)
    assert [line.split(" is ")[0] for line in lines] == fires


def test_no_drafts_no_acceptance_length_check():
    none = calibrate("x", StepCounts(0, 0, 0, 0, 0.0, 50, 1000.0, spec_verify_ms=0.0))
    assert none.mean_acceptance_length is None and calibration_warnings(none, 3.0) == []


def _report(json_out: bool, capsys) -> str:
    from app.commands.calibrate import _report

    args = argparse.Namespace(json=json_out, k=4, threshold=0.65)
    loaded = argparse.Namespace(target_dir="t", drafter_label="draft:d+ngram:3-2")
    _report(args, loaded, [(_cal(44.0), 10.11, 1, [], [], [])])
    return capsys.readouterr().out


def test_the_table_keeps_the_figures_and_says_they_are_unreliable_under_it(capsys):
    lines = _report(False, capsys).splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("code "))
    cells = lines[row].split()
    assert cells[8] == "0.22" and cells[10] == "10.11" and cells[-1] == "GO"
    # the two warnings follow the row at once, before the legend
    assert lines[row + 1].startswith("warning: code: v = 0.22 is below 0.8") and "unreliable" in lines[row + 1]
    assert lines[row + 2].startswith("warning: code: measured 10.11x is above the mean acceptance length 3.80")
    assert "unreliable" in lines[row + 2] and lines[row + 3].startswith("alpha = ")


def test_the_json_keeps_the_figures_and_carries_the_warnings(capsys):
    (d,) = json.loads(_report(True, capsys))["domains"]
    assert d["verify_ratio"] == pytest.approx(0.22) and d["measured_speedup_at_k"] == 10.11
    assert [w.split(" is ")[0] for w in d["warnings"]] == ["v = 0.22", "measured 10.11x"]


def _no_go():
    # 20 steps of K=4: 12 accepted, none all accepted -> alpha 12/32 = 0.375 (NO-GO), mean acceptance length 1.6;
    # drafting 8 ms for 80 tokens against a 20 ms one-token forward: c = 0.005, a draft cheap enough to pay
    return calibrate("chat", StepCounts(20, 80, 12, 0, 8.0, 50, 1000.0, spec_verify_ms=440.0))


def test_a_no_go_pair_measured_faster_than_ar_is_said_beside_the_verdict():
    """The verdict is alpha's alone (it stays NO-GO); a measured 1.37x beside it was left unsaid, where a GO slower
    than AR was warned."""
    cal = _no_go()
    assert cal.verdict == "NO-GO" and cal.mean_acceptance_length == pytest.approx(1.6)
    (line,) = calibration_warnings(cal, 1.37)
    assert line.startswith("NO-GO by alpha < 0.65, yet the pair measured 1.37x AR here: the verdict judges alpha "
                           "alone")
    assert calibration_warnings(cal, 1.0) == [] and calibration_warnings(cal, 0.9)[0].startswith("measured 0.90x")
    assert calibration_warnings(cal, None) == []
    # a measured speedup no machine can give (above the 1.6 tokens a step) is said as that, not as a NO-GO that pays
    assert [w.split(" is ")[0] for w in calibration_warnings(cal, 2.5)] == ["measured 2.50x"]


def test_the_no_go_note_is_in_the_table_and_the_json(capsys):
    from app.commands.calibrate import _report

    args = argparse.Namespace(json=True, k=4, threshold=0.65)
    loaded = argparse.Namespace(target_dir="t", drafter_label="draft:d")
    _report(args, loaded, [(_no_go(), 1.37, 1, [], [], [])])
    (d,) = json.loads(capsys.readouterr().out)["domains"]
    assert d["verdict"] == "NO-GO" and d["warnings"][0].startswith("NO-GO by alpha < 0.65, yet the pair measured 1.37x")
    _report(argparse.Namespace(json=False, k=4, threshold=0.65), loaded, [(_no_go(), 1.37, 1, [], [], [])])
    assert "warning: chat: NO-GO by alpha < 0.65, yet the pair measured 1.37x AR here" in capsys.readouterr().out


def test_a_verdict_on_too_few_tested_tokens_says_so_in_the_table_and_the_json(capsys):
    """`calibrate --limit 1 --max-new-tokens 8` printed verdict GO for alpha 0.667 from 6 tested draft tokens, and
    only a warning further down said they were too few to judge: the verdict column says it ("GO (too few)"), and
    --json keeps "verdict" as it was, with "verdict_provisional" beside it."""
    from app.commands.calibrate import _report

    # 2 steps of K=4: 4 accepted, none all accepted -> 6 tested, alpha 4/6 = 0.667 (GO)
    few = calibrate("code", StepCounts(2, 8, 4, 0, 1.0, 10, 100.0))
    assert (few.verdict, few.tested, few.provisional) == ("GO", 6, True)
    enough = calibrate("rewrite", StepCounts(10, 40, 28, 5, 40.0, 50, 1000.0))
    assert enough.tested >= 20 and not enough.provisional and enough.verdict_text == enough.verdict
    no_go = calibrate("chat", StepCounts(4, 16, 2, 0, 1.0, 10, 100.0))  # 6 tested, alpha 2/6
    assert (no_go.verdict_text, no_go.tested) == ("NO-GO (too few)", 6)
    loaded = argparse.Namespace(target_dir="t", drafter_label="draft:d")
    results = [(few, None, 1, [], [], []), (enough, None, 4, [], [], [])]
    _report(argparse.Namespace(json=False, k=4, threshold=0.65), loaded, results)
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()
            if line.startswith(("code ", "rewrite "))}
    assert rows["code"].endswith("  GO (too few)"), rows
    assert rows["rewrite"].endswith(f"  {enough.verdict}") and "too few" not in rows["rewrite"], rows
    _report(argparse.Namespace(json=True, k=4, threshold=0.65), loaded, results)
    doms = json.loads(capsys.readouterr().out)["domains"]
    assert [(d["verdict"], d["verdict_provisional"]) for d in doms] == [("GO", True), (enough.verdict, False)]


def test_the_legend_says_what_the_measured_column_is(capsys):
    """The table's legend explained every column but `measured`."""
    out = _report(False, capsys)
    legend = out[out.index("alpha = "):]
    assert "measured = spec tokens/s / AR tokens/s at the measured K" in legend


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A 2-layer target and a 1-layer draft sharing one tokenizer."""
    from tests.test_hf_models import hf_dir

    root = tmp_path_factory.mktemp("pair")
    return hf_dir(root / "target", seed=0), hf_dir(root / "draft", seed=1, num_hidden_layers=1)


def test_both_modes_are_warmed_up_before_the_first_timed_prompt(pair, tmp_path, monkeypatch, capsys):
    """An untimed generation in AR and in spec (drafting and verifying) comes before the first timed prompt."""
    from app.cli import main
    from serving.engine import Engine
    from serving.worker import ModeRunner

    events: list[tuple[str, str]] = []
    generate, run, step = Engine.generate, ModeRunner.run, Engine.step

    def recorded_generate(self, *a, **kw):
        events.append(("warm", "spec" if self.drafter is not None else "ar"))
        return generate(self, *a, **kw)

    def recorded_step(self, *a, **kw):
        out = step(self, *a, **kw)
        if self.drafter is not None and self.running:  # a speculative step of a sequence still running
            events.append(("spec step", ""))
        return out

    def recorded_run(self, *a, **kw):
        events.append(("timed", self.mode))
        return run(self, *a, **kw)

    monkeypatch.setattr(Engine, "generate", recorded_generate)
    monkeypatch.setattr(Engine, "step", recorded_step)
    monkeypatch.setattr(ModeRunner, "run", recorded_run)
    target, draft = pair
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "domain": "code", "prompt": f"hello {i}"}) + "\n"
                                for i in range(2)))
    assert main(["calibrate", "--target", str(target), "--draft", str(draft), "--workload", str(workload),
                 "--max-new-tokens", "3", "--dtype", "float32", "--json", "--no-telemetry"]) == 0
    assert json.loads(capsys.readouterr().out)["domains"][0]["prompts"] == 2
    first_timed = events.index(("timed", "ar"))
    warm = [e for e in events[:first_timed] if e[0] == "warm"]
    assert warm == [("warm", "ar"), ("warm", "spec")]
    assert ("spec step", "") in events[:first_timed]  # the warm-up drafted and verified, not only prefilled
    assert [e for e in events[first_timed:] if e[0] != "spec step"] == [
        ("timed", "ar"), ("timed", "spec"), ("timed", "ar"), ("timed", "spec")]


def test_an_alpha_just_under_the_line_is_not_written_as_meeting_it(capsys):
    """alpha 12999 / 20000 = 0.64995 was printed "0.650" beside its NO-GO (3 decimals round it onto the line); it
    now takes the decimals that keep it under, in the table and in the per-prompt line."""
    from app.commands.calibrate import _prompt_spread, _report
    from telemetry.calibration import PromptAcceptance

    near = calibrate("code", StepCounts(7001, 28004, 12999, 0, 40.0, 50, 1000.0, spec_verify_ms=1000.0))
    assert near.alpha == pytest.approx(0.64995) and near.verdict == "NO-GO"
    args = argparse.Namespace(json=False, k=4, threshold=0.65)
    _report(args, argparse.Namespace(target_dir="t", drafter_label="draft:d"), [(near, 1.2, 1, [], [], [])])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("code "))
    assert row.split()[2] == "0.64995" and row.split()[-1] == "NO-GO"
    rows = [PromptAcceptance("p1", 10, 20000, 12999, 12999 / 20000, 2.0), PromptAcceptance("p2", 10, 10, 7, 0.7, 1.7)]
    spread = _prompt_spread(rows, 0.65)
    assert spread.startswith("1/2 reach it; lowest p1 0.64995, p2 0.700;") and "highest p2 0.700" in spread
