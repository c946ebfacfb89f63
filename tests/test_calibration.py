"""Calibrate's arithmetic against hand computation, and its bad input."""

from __future__ import annotations

import pytest

from app.cli import main
from telemetry.calibration import StepCounts, calibrate


def test_calibration_by_hand():
    # 10 steps of K=4: 28 of 40 drafted tokens accepted, 5 steps accepted all 4 (20 tokens), the other 5
    # accepted 8 tokens and each ended in a rejection -> 28 + 5 = 33 tokens tested, alpha = 28 / 33;
    # drafting 40 ms in all = 1 ms per token; 50 AR steps took 1000 ms = 20 ms per target forward -> c = 0.05
    cal = calibrate("code", StepCounts(10, 40, 28, 5, 40.0, 50, 1000.0), threshold=0.65, k_max=8)
    a = 28 / 33
    assert cal.alpha == pytest.approx(a)
    assert cal.acceptance_rate == pytest.approx(0.7)
    assert cal.mean_acceptance_length == pytest.approx(1 + 28 / 10)
    assert cal.c == pytest.approx(0.05)
    bounds = {k: (1 - a ** (k + 1)) / ((1 - a) * (k * 0.05 + 1)) for k in range(1, 9)}
    best = max(bounds, key=bounds.get)
    assert cal.best_k == best and cal.bound_at_best_k == pytest.approx(bounds[best])
    assert cal.verdict == "GO"


def test_alpha_is_per_token_not_per_drafted():
    # K=1 steps test exactly one token each: both estimates agree
    assert calibrate("x", StepCounts(10, 10, 6, 6, 10.0, 10, 100.0)).alpha == pytest.approx(0.6)
    # K=4, every step accepts 2 then rejects: 2 of 3 tested tokens accepted, but only 2 of 4 drafted
    cal = calibrate("x", StepCounts(10, 40, 20, 0, 10.0, 10, 100.0), threshold=0.65)
    assert cal.alpha == pytest.approx(2 / 3) and cal.acceptance_rate == pytest.approx(0.5)
    assert cal.verdict == "GO"
    # every draft fully accepted: alpha 1, the bound's (K + 1) / (K c + 1) limit
    assert calibrate("x", StepCounts(5, 20, 20, 5, 10.0, 10, 100.0)).alpha == 1.0
    with pytest.raises(ValueError, match="num_full_accepts"):
        calibrate("x", StepCounts(5, 20, 20, 6, 10.0, 10, 100.0))


def test_a_step_cut_inside_its_accepted_drafts_ended_in_no_rejection():
    """An EOS or a stop string that cuts a step inside its accepted drafts: the engine counts the drafts it kept
    (here 1 of 3 drafted), no correction token follows. Counted with its k, alpha invented a rejection (1 of 2
    tested); it is a step that drafted and accepted its kept drafts."""
    from telemetry.calibration import acceptance_by_position, alpha_k

    assert [alpha_k(3, 1, 1), alpha_k(3, 1, 2), alpha_k(3, 3, 4), alpha_k(3, 0, 1)] == [1, 3, 3, 3]
    steps = [(4, 2, 3), (4, 1, 1)]  # (k, accepted, emitted): a rejection at position 3; a cut after position 1
    pos = acceptance_by_position((alpha_k(k, a, e), a) for k, a, e in steps)
    assert [(p.tested, p.accepted) for p in pos] == [(2, 2), (1, 1), (1, 0), (0, 0)]  # the cut step: position 1 only
    full = sum(a >= alpha_k(k, a, e) for k, a, e in steps)
    assert calibrate("x", StepCounts(2, 8, 3, full, 1.0, 1, 10.0)).alpha == pytest.approx(3 / 4)


def test_measured_verify_cost_by_hand():
    # same steps; the 10 verify forwards (5 tokens each) took 600 ms = 60 ms, 3x the 20 ms one-token forward
    cal = calibrate("code", StepCounts(10, 40, 28, 5, 40.0, 50, 1000.0, spec_verify_ms=600.0))
    assert cal.verify_ratio == pytest.approx(3.0) and cal.k_measured == pytest.approx(4.0)
    # 3.8 tokens per step / (4 * 0.05 + 3) one-token forwards
    assert cal.bound_with_measured_verify == pytest.approx(3.8 / 3.2)
    assert calibrate("code", StepCounts(10, 40, 28, 5, 40.0, 50, 1000.0)).verify_ratio is None


def test_no_go_and_unknown():
    assert calibrate("chat", StepCounts(10, 40, 5, 0, 40.0, 50, 1000.0)).verdict == "NO-GO"
    unknown = calibrate("chat", StepCounts(0, 0, 0, 0, 0.0, 50, 1000.0))
    assert unknown.verdict == "UNKNOWN" and unknown.alpha is None and unknown.best_k is None
    with pytest.raises(ValueError, match="threshold"):
        calibrate("x", StepCounts(1, 1, 1, 1, 1.0, 1, 1.0), threshold=0)


@pytest.mark.parametrize("argv,expected", [
    (["--threshold", "1.5"], "--threshold"),
    (["--k", "0"], "--k"),
    (["--workload", "nope"], "unknown workload"),
])
def test_calibrate_bad_input(argv, expected, capsys):
    assert main(["calibrate", *argv]) == 2
    assert expected in capsys.readouterr().err


def test_acceptance_by_position_by_hand():
    from telemetry.calibration import acceptance_by_position

    # four K=3 steps accepting 0, 1, 3, 3 and one K=1 step accepting 1:
    # position 1 tested by all 5, accepted by 4; position 2 tested by the 3 K=3 steps that accepted
    # position 1, accepted by 2; position 3 tested by those 2, accepted by both
    steps = [(3, 0), (3, 1), (3, 3), (3, 3), (1, 1)]
    rows = acceptance_by_position(steps)
    assert [(r.position, r.tested, r.accepted) for r in rows] == [(1, 5, 4), (2, 3, 2), (3, 2, 2)]
    assert [r.rate for r in rows] == pytest.approx([0.8, 2 / 3, 1.0])
    # summed over positions they are alpha's accepted / tested
    full = sum(a >= k for k, a in steps)
    cal = calibrate("x", StepCounts(5, 13, 8, full, 1.0, 1, 1.0))
    assert sum(r.accepted for r in rows) / sum(r.tested for r in rows) == pytest.approx(cal.alpha)
    assert acceptance_by_position([]) == []
    with pytest.raises(ValueError, match="accepted"):
        acceptance_by_position([(2, 3)])


def test_acceptance_by_prompt_by_hand():
    from telemetry.calibration import acceptance_by_prompt

    # prompt a: K=4 steps accepting 4 (tests 4) and 1 (tests 2) -> 5 / 6; a K=0 step is not a draft
    # prompt b: K=2 steps accepting 0 and 0 -> 0 / 2
    # prompt c: one K=3 step accepting 2 -> 2 / 3
    steps = [("a", 4, 4), ("b", 2, 0), ("a", 4, 1), ("c", 3, 2), ("b", 2, 0), ("a", 0, 0)]
    rows = acceptance_by_prompt(steps)
    assert [r.prompt_id for r in rows] == ["b", "c", "a"]  # lowest alpha first
    assert [(r.steps, r.tested, r.accepted) for r in rows] == [(2, 2, 0), (1, 3, 2), (2, 6, 5)]
    assert [r.alpha for r in rows] == pytest.approx([0.0, 2 / 3, 5 / 6])
    assert [r.mean_acceptance_length for r in rows] == pytest.approx([1.0, 3.0, 3.5])
    # the domain's alpha is the counts summed (7 / 11), not the mean of the prompts' alphas
    assert sum(r.accepted for r in rows) / sum(r.tested for r in rows) == pytest.approx(7 / 11)
    cal = calibrate("x", StepCounts(5, 16, 7, 1, 1.0, 1, 1.0))
    assert cal.alpha == pytest.approx(7 / 11)
    assert acceptance_by_prompt([("a", 0, 0)]) == []
    with pytest.raises(ValueError, match="prompt z"):
        acceptance_by_prompt([("z", 2, 3)])


def test_repeated_tokens_by_hand():
    from telemetry.calibration import repeated_tokens

    # n = 2 over prompt [1, 2, 3] + answer [1, 2, 9, 1, 2, 9]: the answer's bigrams end at (3,1) new,
    # (1,2) seen in the prompt, (2,9) new, (9,1) new, (1,2) seen, (2,9) seen
    assert repeated_tokens([1, 2, 3], [1, 2, 9, 1, 2, 9], n=2) == [False, True, False, False, True, True]
    # a loop of period 3 repeats from its second lap; nothing before n - 1 tokens of context
    assert repeated_tokens([], [5, 6, 7, 5, 6, 7, 5], n=3) == [False] * 5 + [True, True]
    assert repeated_tokens([4], [4], n=1) == [True]
    assert repeated_tokens([1], [], n=4) == []
    with pytest.raises(ValueError, match="n must be"):
        repeated_tokens([1], [1], n=0)


def test_acceptance_by_span_by_hand():
    from telemetry.calibration import acceptance_by_span

    # request 1: steps starting after 1, 3 and 6 emitted tokens (K=2: accepted 1 -> tests 2; accepted 2
    # -> tests 2; accepted 0 -> tests 1), 8 output tokens of which 5 and 7 repeat
    # request 2: a K=0 step (no draft) and a K=2 step after 4 tokens accepting 2; 4 tokens, none repeated
    reqs = [([(1, 2, 1), (3, 2, 2), (6, 2, 0)], [False] * 5 + [True, False, True]),
            ([(1, 0, 0), (4, 2, 2)], [False] * 4)]
    rows = acceptance_by_span(reqs, width=4)
    assert [(r.start, r.end, r.steps, r.tested, r.accepted) for r in rows] == [(0, 4, 2, 4, 3), (4, 8, 2, 3, 2)]
    assert [r.alpha for r in rows] == pytest.approx([3 / 4, 2 / 3])
    assert [r.repeated for r in rows] == pytest.approx([0.0, 2 / 4])  # span 0: 8 tokens; span 1: 4 tokens
    # summed over spans the counts are the whole alpha's
    assert sum(r.accepted for r in rows) / sum(r.tested for r in rows) == pytest.approx(5 / 7)
    # a span with tokens but no draft step has no alpha
    (only,) = acceptance_by_span([([(1, 0, 0)], [False, True])], width=32)
    assert only.alpha is None and only.repeated == pytest.approx(0.5) and only.steps == 0
    assert acceptance_by_span([]) == []
    with pytest.raises(ValueError, match="accepted"):
        acceptance_by_span([([(1, 2, 3)], [])])
    with pytest.raises(ValueError, match="width"):
        acceptance_by_span([], width=0)


def test_warnings_say_what_a_go_does_not():
    """The verdict stays alpha >= threshold; a bound or a measured speedup below 1, and a verdict on a handful of
    tested tokens, are said beside it (a GO was printed with alpha 1.0, c 1.48, measured 0.64x)."""
    from telemetry.calibration import calibration_warnings

    # 5 steps of K=4, all accepted: alpha 1, 20 tokens tested; drafting 296 ms = 14.8 ms a token, AR 10 ms -> c 1.48
    slow = calibrate("code", StepCounts(5, 20, 20, 5, 296.0, 10, 100.0))
    assert slow.verdict == "GO" and slow.c == pytest.approx(1.48) and slow.tested == 20
    assert slow.bound_at_best_k == pytest.approx(2 / 2.48)  # K = 1: (K + 1) / (K c + 1), the best of a falling curve
    assert calibration_warnings(slow, 0.64) == [
        "the speedup bound is 0.81x at its best K: with c = 1.48 speculation would be slower than AR",
        "measured 0.64x: speculation was slower than AR here",
    ]
    # one step of 4 tokens, all accepted, a cheap draft: a bound of ~4.8x from 4 tested tokens
    lucky = calibrate("chat", StepCounts(1, 4, 4, 1, 0.4, 10, 100.0))
    assert lucky.tested == 4 and lucky.bound_at_best_k > 4
    assert calibration_warnings(lucky, 1.2) == [
        "alpha rests on only 4 tested draft tokens (fewer than 20): too few to judge; run more or longer prompts "
        "(--limit, --max-new-tokens)"]
    fine = calibrate("code", StepCounts(10, 40, 28, 5, 40.0, 50, 1000.0))
    assert fine.tested == 33 and calibration_warnings(fine, 1.5) == [] and calibration_warnings(fine) == []
    assert calibration_warnings(calibrate("x", StepCounts(0, 0, 0, 0, 0.0, 50, 1000.0)), None) == []


def test_a_workload_file_that_is_not_text_names_the_file_and_line(tmp_path, capsys):
    """Was "'utf-8' codec can't decode byte 0x82 in position 3: invalid start byte", naming no file."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"id": "a", "domain": "code", "prompt": "hi"}\n\x00\x01\x02\x82\xff binary\n')
    assert main(["calibrate", "--workload", str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"{path}:2: not UTF-8 text (byte 0x82 at column 4)" in err[0]


def test_no_bundled_draft_points_to_calibrates_own_option(tmp_path, monkeypatch, capsys):
    """calibrate suggested bench's --draft-model DIR; calibrate names a draft with --draft."""
    import serving.models as models

    monkeypatch.setattr(models, "BUNDLED_DRAFT_DIR", tmp_path / "no-draft")
    assert main(["calibrate", "--workload", "code", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "pass a draft model directory with --draft DIR" in err and "--draft-model" not in err
    with pytest.raises(ValueError, match="with --draft-model DIR"):  # bench and serve name it so
        models.model_path("draft")
