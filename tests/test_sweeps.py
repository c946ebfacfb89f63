"""Concurrency sweeps: the crossover arithmetic, recording from SQL summaries, the dashboard section,
and `--spec-max-batch auto` reading it back."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session
from synthetic import Req, make_run, spec_req

from telemetry.store import open_store
from telemetry.sweeps import SweepPoint, crossover, latest_sweep, record_sweep, sweep_points


def test_crossover_is_first_level_where_spec_does_not_beat_ar():
    pts = [SweepPoint(1, 40, 80, 20, 12), SweepPoint(4, 120, 150, 30, 25), SweepPoint(16, 250, 240, 60, 70)]
    assert crossover(pts) == 16
    assert crossover(pts[:2]) is None  # paid at every measured level
    assert crossover([SweepPoint(2, 100, 100, None, None)]) == 2  # a tie does not pay
    assert crossover([SweepPoint(1, None, 80, None, None), SweepPoint(2, 90, 80, None, None)]) == 2
    assert pts[0].speedup == 2.0 and SweepPoint(1, None, 5, None, None).speedup is None


def _sweep_store(url: str) -> list[int]:
    """AR and spec runs at concurrency 1 and 8: spec 2x faster alone, slower at 8."""
    engine = open_store(url)
    ids = []
    with Session(engine) as s:
        for conc, ar_ms, spec_ms in ((1, 1000.0, 500.0), (8, 400.0, 600.0)):
            ids.append(make_run(s, "ar", concurrency=conc, requests=[Req(output_tokens=40, e2e_ms=ar_ms)]).id)
            ids.append(make_run(s, "spec", concurrency=conc,
                                requests=[spec_req(40, k=4, accepted=20, e2e_ms=spec_ms)]).id)
        s.commit()
    return ids


def test_record_sweep_computes_crossover_from_the_runs(db_url):
    ids = _sweep_store(db_url)
    engine = open_store(db_url)
    sweep_id, cross, points = record_sweep(engine, node_id="n", device="cpu", target="demo/target-tiny",
                                           drafter="demo/draft-tiny", k_policy="fixed:4", workload="code",
                                           dtype="float32", run_ids=ids)
    assert cross == 8
    assert [p.concurrency for p in points] == [1, 8]
    assert points[0].speedup == pytest.approx(1000.0 / 500.0, rel=0.05)
    row = latest_sweep(engine, target="demo/target-tiny", drafter="demo/draft-tiny")
    assert row.id == sweep_id and row.crossover_concurrency == 8 and row.run_ids == ids
    assert latest_sweep(engine, drafter="other") is None


def test_a_mode_measured_in_several_turns_is_pooled_at_its_level(sqlite_url):
    """A bench that alternated AR and spec records two runs per mode at concurrency 1: the point is their
    tokens over their summed wall time, not whichever run came last."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        ids = [make_run(s, mode, concurrency=1, requests=[Req(output_tokens=40, e2e_ms=ms)]).id
               for mode, ms in (("ar", 1000.0), ("spec", 500.0), ("ar", 3000.0), ("spec", 1500.0))]
        s.commit()
    (point,) = sweep_points(engine, ids)
    assert point.concurrency == 1
    assert point.ar_tokens_per_s == pytest.approx(80 / 4.0)
    assert point.spec_tokens_per_s == pytest.approx(80 / 2.0)
    assert point.speedup == pytest.approx(2.0)


def test_bench_turns_alternate_only_both_modes_at_concurrency_one():
    from app.commands.bench import turns

    assert [(m, list(ix)) for m, ix in turns(5, ["ar", "spec"], 1, 2)] == [
        ("ar", [0, 1]), ("spec", [0, 1]), ("ar", [2, 3]), ("spec", [2, 3]), ("ar", [4]), ("spec", [4])]
    assert [(m, list(ix)) for m, ix in turns(3, ["ar", "spec"], 1, 0)] == [("ar", [0, 1, 2]), ("spec", [0, 1, 2])]
    assert [(m, list(ix)) for m, ix in turns(3, ["ar", "spec"], 4, 1)] == [("ar", [0, 1, 2]), ("spec", [0, 1, 2])]
    assert [(m, list(ix)) for m, ix in turns(3, ["spec"], 1, 1)] == [("spec", [0, 1, 2])]


def test_cost_page_shows_the_sweep(sqlite_url, monkeypatch):
    from test_dashboard_apptest import app_for, assert_clean, metrics, open_page

    ids = _sweep_store(sqlite_url)
    record_sweep(open_store(sqlite_url), node_id="n", device="cpu", target="demo/target-tiny",
                 drafter="demo/draft-tiny", k_policy="fixed:4", workload="code", dtype="float32", run_ids=ids)
    at = open_page(app_for(sqlite_url, monkeypatch), "views/cost.py")
    assert_clean(at)
    assert metrics(at)["Crossover concurrency"] == ["8"]


def test_spec_max_batch_auto_without_a_sweep_is_a_clear_error(tmp_path, capsys):
    from app.cli import main
    from serving.models import pull

    pull(say=lambda m: None, verify=False)
    rc = main(["bench", "--limit", "1", "--max-new-tokens", "4", "--spec-max-batch", "auto",
               "--db", f"sqlite:///{tmp_path / 's.db'}"])
    assert rc == 2
    assert "no concurrency sweep recorded" in capsys.readouterr().err


def test_spec_max_batch_gates_speculation_in_step_records():
    from serving.drafters import ModelDrafter
    from serving.engine import Engine
    from serving.lookahead import BatchGatedK, FixedK
    from serving.sampling import SamplingParams
    from tests.tiny import tiny_model

    target = tiny_model(0)
    events = []
    engine = Engine(target, drafter=ModelDrafter(target, "self", slots=3, max_len=100),
                    policy=BatchGatedK(FixedK(3), max_batch_size=2), max_batch=3, max_len=80, on_step=events.append)
    for p in ([1, 2, 3], [4, 5], [6, 7, 8, 9]):
        engine.add(p, SamplingParams(max_new_tokens=12 if p[0] == 1 else 30))
    while engine.running:
        engine.step()
    steps = [e for e in events if e.step_index >= 0]
    assert {(e.batch_size, e.k_reason) for e in steps if e.batch_size == 3} == {(3, "batch-gated")}
    assert all(e.k == 0 for e in steps if e.batch_size == 3)
    assert any(e.k == 3 and e.k_reason == "fixed" for e in steps if e.batch_size <= 2)


def _swept(url: str, drafter: str, timings) -> None:
    """A sweep of `drafter` on demo/target-tiny recorded in the store at `url`: one run per (concurrency, mode,
    e2e ms) of `timings`, 40 tokens each."""
    engine = open_store(url)
    with Session(engine) as s:
        ids = [make_run(s, mode, concurrency=conc, drafter=drafter, requests=[
            Req(output_tokens=40, e2e_ms=ms) if mode == "ar" else spec_req(40, k=4, accepted=20, e2e_ms=ms)]).id
               for conc, mode, ms in timings]
        s.commit()
    record_sweep(engine, node_id="n", device="cpu", target="demo/target-tiny", drafter=drafter,
                 k_policy="fixed:4", workload="code", dtype="float32", run_ids=ids)


def test_spec_max_batch_auto_does_not_speculate_where_the_sweep_lost_at_every_level(sqlite_url, capsys):
    """A sweep that lost from concurrency 1 read "crossover at concurrency 1; speculating while <= 1 sequences run":
    the run speculated exactly where the sweep measured speculation losing."""
    from types import SimpleNamespace

    from app.commands.bench import resolve_spec_max_batch
    from serving.drafters import ModelDrafter
    from serving.engine import Engine
    from serving.lookahead import BatchGatedK, FixedK
    from serving.sampling import SamplingParams
    from tests.tiny import tiny_model

    _swept(sqlite_url, "demo/draft-tiny", ((1, "ar", 500.0), (1, "spec", 800.0), (2, "ar", 300.0), (2, "spec", 900.0)))
    loaded = SimpleNamespace(target_dir="demo/target-tiny", drafter_label="demo/draft-tiny")
    assert resolve_spec_max_batch("auto", sqlite_url, loaded) == 0
    assert "speculation paid at no measured level (it lost from concurrency 1); not speculating" \
        in capsys.readouterr().err
    target, events = tiny_model(0), []
    gen = Engine(target, drafter=ModelDrafter(target, "self", slots=1, max_len=100),
                 policy=BatchGatedK(FixedK(3), max_batch_size=0), max_batch=1, max_len=80, on_step=events.append)
    gen.add([1, 2, 3], SamplingParams(max_new_tokens=8))
    while gen.running:
        gen.step()
    assert {(e.k, e.k_reason) for e in events if e.step_index >= 0} == {(0, "batch-gated")}


def test_sweep_points_refuse_runs_of_two_temperatures(sqlite_url):
    """AR at temperature 0 and spec at 0.8 at one level used to make one point (a 'speedup' of neither); so did
    a load test's runs with a bench's. A sweep's runs must share temperature and run kind."""
    engine = open_store(sqlite_url)
    with Session(engine) as s:
        ids = [make_run(s, "ar", temperature=0.0, requests=[Req(output_tokens=40, e2e_ms=1000.0)]).id,
               make_run(s, "spec", temperature=0.8, requests=[spec_req(40, k=4, accepted=20, e2e_ms=500.0)]).id,
               make_run(s, "spec", temperature=0.0, requests=[spec_req(40, k=4, accepted=20, e2e_ms=500.0)]).id,
               make_run(s, "ar", kind="loadtest", requests=[Req(output_tokens=40, e2e_ms=900.0)]).id]
        s.commit()
    with pytest.raises(ValueError, match=r"2 groups \(temperature 0; temperature 0.8\)"):
        sweep_points(engine, ids[:2])
    with pytest.raises(ValueError, match="kind bench; kind loadtest"):
        sweep_points(engine, [ids[0], ids[3]])
    (point,) = sweep_points(engine, [ids[0], ids[2]])
    assert point.speedup == pytest.approx(2.0, rel=0.05)


def test_spec_max_batch_auto_finds_a_sweep_recorded_before_labels_named_the_drafts_weights(sqlite_url, capsys):
    """Drafter labels gained the draft's weights (folder#fingerprint): a sweep recorded under the old label was no
    longer found ("no concurrency sweep recorded"). It is used, saying it may be another draft of that name."""
    from types import SimpleNamespace

    from app.commands.bench import resolve_spec_max_batch

    _swept(sqlite_url, "feature:draft@int8+ngram:3-2",
           ((1, "ar", 800.0), (1, "spec", 500.0), (2, "ar", 300.0), (2, "spec", 900.0)))
    loaded = SimpleNamespace(target_dir="demo/target-tiny", drafter_label="feature:draft#547d12db@int8+ngram:3-2")
    assert resolve_spec_max_batch("auto", sqlite_url, loaded) == 1  # it lost from concurrency 2
    err = capsys.readouterr().err
    assert "was recorded as feature:draft@int8+ngram:3-2, before drafter labels named the draft's weights" in err
    other = SimpleNamespace(target_dir="demo/target-tiny", drafter_label="feature:other#547d12db@int8+ngram:3-2")
    with pytest.raises(ValueError, match="no concurrency sweep recorded for feature:other#547d12db"):
        resolve_spec_max_batch("auto", sqlite_url, other)
