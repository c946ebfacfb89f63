"""End to end on the bundled real model: exactness, `specfinops bench` recording into SQLite and
PostgreSQL, and one clear line with exit 2 for every kind of bad input."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from sqlalchemy import create_engine, text

from app.cli import main
from serving import models
from serving.sampling import SamplingParams
from serving.worker import EngineSpec, default_drafter, load, run_prompts
from serving.workloads import load_workload

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target_dir():
    return models.pull(say=lambda m: None, verify=False)


@pytest.fixture(scope="module")
def loaded_f32(target_dir):
    return load(EngineSpec(dtype="float32", drafter="ngram", k="4", max_len=1024))


@pytest.mark.parametrize("drafter,k", [("ngram", 4), ("early-exit", 3), ("draft", 4), ("draft+ngram", 4)])
def test_float32_greedy_spec_is_token_identical_to_ar(loaded_f32, drafter, k):
    prompts = load_workload("code", limit=3)
    params = SamplingParams(max_new_tokens=40)
    loaded = loaded_f32
    if drafter != "ngram":
        loaded = load(EngineSpec(dtype="float32", drafter=drafter, early_exit_layers=20, k=str(k), max_len=1024))
    encoded = [loaded.encode(p) for p in prompts]
    ar = run_prompts(loaded, "ar", prompts, encoded, params)
    spec = run_prompts(loaded, "spec", prompts, encoded, params)
    for a, s in zip(ar.results, spec.results, strict=True):
        assert s.output_ids == a.output_ids, f"{a.prompt.id}: spec differs from AR"
        assert len(a.output_ids) > 5
    assert spec.results[0].record.num_drafts > 0


def test_float32_greedy_tree_decoding_is_token_identical_to_ar(loaded_f32):
    prompts = load_workload("code", limit=3)
    params = SamplingParams(max_new_tokens=40)
    loaded = load(EngineSpec(dtype="float32", drafter="draft+ngram", tree="16:5:4:0.05", max_len=1024))
    encoded = [loaded.encode(p) for p in prompts]
    ar = run_prompts(loaded_f32, "ar", prompts, encoded, params)
    spec = run_prompts(loaded, "spec", prompts, encoded, params)
    for a, s in zip(ar.results, spec.results, strict=True):
        assert s.output_ids == a.output_ids, f"{a.prompt.id}: tree decoding differs from AR"
    drafted = sum(r.record.num_draft_tokens for r in spec.results)
    accepted = sum(r.record.num_accepted_tokens for r in spec.results)
    steps = sum(r.record.num_drafts for r in spec.results)
    assert drafted > accepted > steps  # several nodes verified per step, more than one accepted on average


def test_default_drafter_is_the_bundled_pair_only_for_the_bundled_target(target_dir, tmp_path):
    assert (models.BUNDLED_DRAFT_DIR / "config.json").is_file()
    assert default_drafter(None) == default_drafter(models.BUNDLED_TARGET) == "draft+ngram"
    assert default_drafter(str(tmp_path)) == "ngram"  # another target has no distilled draft


def _bench(db_url: str, tmp_path, *extra: str) -> dict:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--workload", "code", "--mode", "both", "--limit", "2", "--max-new-tokens", "24",
               "--db", db_url, "--json", str(out), "--power", "estimate", "--tdp-w", "65", *extra])
    assert rc == 0
    return json.loads(out.read_text())


def _check_store(db_url: str, report: dict, modes: tuple | list = ("ar", "spec")) -> None:
    engine = create_engine(db_url)
    with engine.connect() as c:
        runs = c.execute(text("select id, mode, status, power_source from runs order by id")).all()
        assert [(r.mode, r.status) for r in runs] == [(m, "completed") for m in modes]
        events = c.execute(text("select count(*) from token_events")).scalar()
        tokens = c.execute(text("select sum(output_tokens) from requests")).scalar()
        assert events == tokens > 0
        assert c.execute(text("select count(*) from steps")).scalar() > 0
        acc, drafted = c.execute(text(
            "select sum(q.num_accepted_tokens), sum(q.num_draft_tokens) from requests q join runs r "
            "on r.id = q.run_id where r.mode = 'spec'")).one()
        spec_run = next(r for r in report["runs"] if r["mode"] == "spec")
        assert acc / drafted == pytest.approx(spec_run["acceptance_rate"])
        sources = {s for (s,) in c.execute(text("select distinct source from power_samples"))}
        assert sources == {"estimate"}  # every sample carries its source; these were estimated
        assert c.execute(text("select count(*) from power_samples where source is null")).scalar() == 0
        assert c.execute(text("select count(*) from requests where energy_j is null")).scalar() == 0
        # each request records the sampling it ran with (0010): a bench run's, whose cap is --max-new-tokens
        limits = c.execute(text("select distinct q.top_k, q.seed, q.max_new_tokens, r.top_k, r.seed, r.max_new_tokens "
                                "from requests q join runs r on r.id = q.run_id")).all()
        assert [tuple(x) for x in limits] == [(0, 0, 24, 0, 0, 24)]
    engine.dispose()


def test_bench_records_into_sqlite(tmp_path, target_dir):
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    report = _bench(url, tmp_path)
    assert {r["mode"] for r in report["runs"]} == {"ar", "spec"}
    for run in report["runs"]:
        assert set(run) >= {"mode", "drafter", "k", "dtype", "temperature", "tokens_per_s", "acceptance_rate",
                            "mean_acceptance_length", "requests"}
        for req in run["requests"]:
            assert set(req) >= {"id", "domain", "output_token_ids", "output_text", "ttft_ms", "tpot_ms", "e2e_ms"}
    assert report["speedup"] > 0
    _check_store(url, report)


def test_bench_alternates_ar_and_spec_in_recorded_turns(tmp_path, target_dir):
    """--interleave 1: AR then spec on each prompt, each turn its own run; the store pools them per mode."""
    from telemetry.queries import speedups

    url = f"sqlite:///{tmp_path / 'turns.db'}"
    report = _bench(url, tmp_path, "--interleave", "1")
    assert report["interleave"] == 1
    ar, spec = (next(r for r in report["runs"] if r["mode"] == m) for m in ("ar", "spec"))
    assert ar["run_ids"] == [1, 3] and spec["run_ids"] == [2, 4] and ar["run_id"] is None
    assert [q["id"] for q in ar["requests"]] == [q["id"] for q in spec["requests"]] == ["code-001", "code-002"]
    engine = create_engine(url)
    with engine.connect() as c:
        rows = c.execute(text("select r.id, r.mode, q.external_id from requests q join runs r on r.id = q.run_id "
                              "order by q.started_at")).all()
    assert [(r.id, r.mode, r.external_id) for r in rows] == [
        (1, "ar", "code-001"), (2, "spec", "code-001"), (3, "ar", "code-002"), (4, "spec", "code-002")]
    (sp,) = speedups(engine)
    assert sp.spec_run_ids == (2, 4) and sp.ar_run_ids == (1, 3)
    engine.dispose()
    _check_store(url, report, modes=["ar", "spec", "ar", "spec"])


def test_the_speedup_bench_prints_is_the_one_the_store_gives_its_invocation(tmp_path, target_dir, capsys,
                                                                           monkeypatch):
    """--interleave 1 on a workload of two prompts, no --limit: bench printed each turn's own clock (1.33x where
    `invocations`, `cost --invocation`, the dashboard and the report read 1.32x from its requests' spans), and said
    that "a run without --limit measures every prompt of the workload" where no --limit had left one out."""
    for name in ("SPECFINOPS_PACKED_LINEAR", "SPECFINOPS_BF16_KERNEL", "SPECFINOPS_DECODE_ATTENTION",
                 "SPECFINOPS_ATTENTION_FLOAT32", "SPECFINOPS_DRAFT_INT8"):
        monkeypatch.setenv(name, "off")  # no kernel races: what is tested is arithmetic, not speed
    workload = tmp_path / "my2.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "domain": "code", "prompt": text}) + "\n"
                                for i, text in enumerate(["Write a Python hello world.", "Count from 1 to 5."])))
    url = f"sqlite:///{tmp_path / 'agree.db'}"
    out = tmp_path / "bench.json"
    capsys.readouterr()
    assert main(["bench", "--workload", str(workload), "--mode", "both", "--interleave", "1", "--max-new-tokens", "6",
                 "--drafter", "ngram", "--dtype", "float32", "--db", url, "--json", str(out), "--power", "none"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert "without --limit" not in printed and "no --limit left a prompt out" in printed, printed
    assert main(["invocations", "--db", url, "--json"]) == 0
    (inv,) = json.loads(capsys.readouterr().out)["invocations"]
    assert inv["invocation_id"] == report["invocation_id"]
    (stored,) = inv["speedups"]
    assert report["speedup"] == stored["speedup"] and report["speedup_by_concurrency"] == {"1": stored["speedup"]}
    assert f"speedup spec vs AR at concurrency 1: {stored['speedup']:.2f}x" in printed
    rows = {r["mode"]: r for r in report["runs"]}
    assert (rows["spec"]["tokens_per_s"], rows["ar"]["tokens_per_s"]) == (stored["spec_tokens_per_s"],
                                                                         stored["ar_tokens_per_s"])


def test_records_the_store_refuses_are_said_and_fail_the_bench(tmp_path, target_dir, capsys):
    """A request row the database refuses is dropped by the recorder (counted in runs.dropped_records): the bench
    says so on its last line, reports the count in its JSON and exits 1, instead of 'recorded' and 0."""
    url = f"sqlite:///{tmp_path / 'refuses.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    engine = create_engine(url)
    with engine.begin() as c:  # a real refusal by the database, as PostgreSQL refused a too-long id
        c.execute(text("create trigger refuse_one before insert on requests when new.external_id = 'code-002' "
                       "begin select raise(abort, 'refused by the test'); end"))
    engine.dispose()
    out = tmp_path / "bench.json"
    capsys.readouterr()
    rc = main(["bench", "--workload", "code", "--mode", "ar", "--limit", "2", "--max-new-tokens", "8",
               "--db", url, "--json", str(out), "--power", "none"])
    err = capsys.readouterr().err
    report = json.loads(out.read_text())
    assert rc == 1
    assert report["dropped_records"] >= 1
    assert f"of invocation {report['invocation_id'][:8]} could not be written to the store" in err
    engine = create_engine(url)
    with engine.connect() as c:
        assert c.execute(text("select external_id from requests")).scalars().all() == ["code-001"]
        assert c.execute(text("select sum(dropped_records) from runs")).scalar() == report["dropped_records"]
    engine.dispose()


def test_a_store_that_cannot_be_read_at_the_end_is_said_not_raised(tmp_path):
    """Counting lost records reads the store again; where it is gone by then (a database down, often why records
    were lost) the command must still write its table and JSON: the count is unknown, said, and the exit 1."""
    from app.commands._common import lost_records

    lost, warning = lost_records(f"sqlite:///{tmp_path / 'gone.db'}", "ab" * 16)
    assert lost is None and warning.startswith("warning: could not read the store to check that invocation abababab")
    assert not (tmp_path / "gone.db").exists()  # not made again by looking
    assert lost_records(None, None) == (0, None)


@pytest.mark.postgres
def test_bench_records_into_postgres(tmp_path, target_dir, pg_url):
    report = _bench(pg_url, tmp_path)
    _check_store(pg_url, report)


def test_no_telemetry_writes_nothing(tmp_path, target_dir, monkeypatch):
    """The store --no-telemetry would otherwise record into is the environment's (--db beside it is refused as a
    contradiction: test_cli_input): nothing is made there."""
    monkeypatch.setenv("SPECFINOPS_DB_URL", f"sqlite:///{tmp_path / 'none.db'}")
    out = tmp_path / "bench.json"
    assert main(["bench", "--workload", "code", "--mode", "both", "--limit", "2", "--max-new-tokens", "24",
                 "--json", str(out), "--no-telemetry"]) == 0
    assert json.loads(out.read_text())["runs"] and not (tmp_path / "none.db").exists()


@pytest.fixture
def bad_workloads(tmp_path):
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text('{"id": "a", "domain": "code", "prompt": "hi"}\n{"id": "b", "domain": \n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"id": "a", "domain": "code", "prompt": ""}\n')
    other_vocab = tmp_path / "other-vocab"
    other_vocab.mkdir()
    (other_vocab / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 32000, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4}))
    return {"malformed": malformed, "empty": empty, "other_vocab": other_vocab}


@pytest.mark.parametrize("argv,expected", [
    (["--target", "/nonexistent/model"], "unknown model"),
    (["--workload", "nosuchworkload"], "unknown workload"),
    (["--k", "-1"], "k must be >= 0"),
    (["--interleave", "-1"], "--interleave must be >= 0"),
    (["--temperature", "-0.5"], "temperature must be >= 0"),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--workload", "{malformed}"], "malformed.jsonl:2: malformed JSON"),
    (["--workload", "{empty}"], "empty.jsonl:1"),
    (["--drafter", "draft", "--draft-model", "{other_vocab}"], "vocabulary mismatch"),
    (["--max-len", "16"], "the context window (16 tokens) fits at most 14 prompt tokens"),
    (["--drafter", "nonsense"], "unknown drafter"),
    (["--concurrency", "0"], "concurrency"),
    (["--tree", "8:4:2:1"], "--tree 8:4:2:1: a draft tree's MIN_PROB must be in [0, 1)"),
    (["--tree", "0"], "--tree 0: a draft tree needs nodes, depth and width >= 1, got 0, 6, 4"),
    (["--tree", "8:x"], "--tree 8:x: tree shape must be NODES[:DEPTH[:WIDTH[:MIN_PROB]]]"),
    (["--dtype", "float16"], "--dtype must be one of auto, bfloat16, float32, got 'float16'"),
    (["--tree", "8", "--k", "3"], "--tree sets the lookahead itself"),
    (["--tree", "8", "--drafter", "early-exit"], "not early-exit drafting"),
    (["--tree", "8", "--backend", "vllm"], "--tree runs on the torch engine"),
    (["--drafter", "early-exit", "--early-exit-layers", "0"], "--early-exit-layers must be >= 1"),
    (["--drafter", "early-exit", "--early-exit-layers", "30"], "--early-exit-layers must be below the target's 30 layers"),
])
def test_bad_input_one_line_exit_2(argv, expected, bad_workloads, target_dir, capsys, tmp_path):
    argv = [a.format(**bad_workloads) for a in argv]
    db = f"sqlite:///{tmp_path / 'bad.db'}"
    rc = main(["bench", "--limit", "1", "--max-new-tokens", "4", "--db", db, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    last = err[-1]
    assert expected in last and last.startswith("specfinops bench: error:")
    assert not any("Traceback" in line for line in err)


def test_models_path_and_list(target_dir, capsys):
    assert main(["models", "path", "--role", "target"]) == 0
    assert capsys.readouterr().out.strip() == str(target_dir)
    assert main(["models", "list"]) == 0
    assert "smollm2-135m-instruct" in capsys.readouterr().out



def test_calibrate_json_on_the_bundled_pair(target_dir, capsys):
    """`calibrate --json` end to end: the per-domain figures and the acceptance curve by draft position,
    whose counts add up to the alpha it reports (accepted / tested)."""
    assert main(["calibrate", "--workload", "code", "--limit", "1", "--max-new-tokens", "24", "--k", "3",
                 "--dtype", "float32", "--drafter", "draft+ngram", "--json", "--no-telemetry"]) == 0
    out = json.loads(capsys.readouterr().out)
    (dom,) = out["domains"]
    assert dom["domain"] == "code" and dom["prompts"] == 1 and dom["verdict"] in ("GO", "NO-GO")
    pos = dom["acceptance_by_position"]
    assert [p["position"] for p in pos] == [1, 2, 3]
    assert all(p["tested"] >= p["accepted"] >= 0 for p in pos) and pos[0]["tested"] >= pos[-1]["tested"]
    assert sum(p["accepted"] for p in pos) / sum(p["tested"] for p in pos) == pytest.approx(dom["alpha"])
    # one prompt: its own alpha is the domain's
    (row,) = dom["acceptance_by_prompt"]
    assert row["prompt_id"] == "code-001" and row["steps"] >= 1
    assert row["alpha"] == pytest.approx(dom["alpha"])
    assert row["mean_acceptance_length"] == pytest.approx(dom["mean_acceptance_length"])
    assert 0 < dom["c"] < 1 and dom["best_k"] >= 1
    # alpha by answer span: a 24-token answer fits in calibrate's first 32-token span, which then holds
    # every step, so its alpha is the domain's
    (span,) = dom["acceptance_by_span"]
    assert (span["start"], span["end"]) == (0, 32) and span["steps"] == row["steps"]
    assert span["alpha"] == pytest.approx(dom["alpha"]) and 0 <= span["repeated"] <= 1


def test_concurrent_requests_share_the_device_energy_instead_of_each_counting_it(tmp_path, target_dir):
    """At concurrency 2 the requests overlap; with a constant 65 W estimate their energies must add up to
    65 W x the time any of them was in flight (the union of their windows), not 65 W x the sum of their
    durations, which counts the overlapped time twice."""
    from datetime import timedelta

    url = f"sqlite:///{tmp_path / 'conc.db'}"
    rc = main(["bench", "--workload", "code", "--mode", "ar", "--limit", "3", "--max-new-tokens", "24",
               "--concurrency", "2", "--db", url, "--power", "estimate", "--tdp-w", "65"])
    assert rc == 0
    engine = create_engine(url)
    with engine.connect() as c:
        rows = c.execute(text("select started_at, e2e_ms, energy_j from requests order by started_at")).all()
    engine.dispose()
    windows = []
    for r in rows:
        start = r.started_at if isinstance(r.started_at, datetime) else datetime.fromisoformat(r.started_at)
        windows.append((start, start + timedelta(milliseconds=r.e2e_ms)))
    assert len(windows) == 3 and windows[1][0] < windows[0][1]  # the first two ran together
    union, reach = 0.0, None
    for a, b in sorted(windows):
        lo = a if reach is None else max(a, reach)
        union += max((b - lo).total_seconds(), 0.0)
        reach = b if reach is None else max(reach, b)
    summed = sum((b - a).total_seconds() for a, b in windows)
    assert summed > union * 1.2  # the overlap is large enough to tell the two apart
    assert sum(r.energy_j for r in rows) == pytest.approx(65.0 * union, rel=0.02)
