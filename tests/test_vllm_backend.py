"""Contract test of the vLLM backend against a fake of exactly the vLLM surface it uses (tests/fake_vllm.py):
the LLM(...) it builds, per-token records from streamed DELTA outputs, acceptance from get_metrics() counter
deltas, energy from an NVML counter, the message when vllm is missing, and bench --backend vllm into SQLite."""

from __future__ import annotations

import copy
import json
import random
import sys

import pytest
from sqlalchemy import create_engine, text

from app.cli import main
from serving.sampling import SamplingParams
from serving.vllm_backend import (
    MISSING_VLLM,
    SpecCounts,
    VllmConfig,
    VllmEngine,
    VllmNotInstalled,
    config_from_options,
    run_prompts,
    split_count,
    warm_up,
)
from serving.workloads import load_workload
from telemetry.power import NvmlPowerSource, PowerSampler
from tests import fake_vllm
from tests.fake_vllm import ACCEPT_CYCLE, FakeNvml


def expected(max_tokens: int, k: int | None) -> dict:
    """What the fake's rules make one request report: counts and token sources."""
    emitted, steps, drafts, drafted, accepted, sources = 1, 0, 0, 0, 0, ["ar"]
    while emitted < max_tokens:
        if k is None:
            sources.append("ar")
            emitted += 1
            continue
        a = min(ACCEPT_CYCLE[steps % len(ACCEPT_CYCLE)], k, max_tokens - emitted - 1)
        drafts, drafted, accepted = drafts + 1, drafted + k, accepted + a
        sources += ["accepted"] * a + ["bonus" if a >= k else "correction"]
        emitted, steps = emitted + a + 1, steps + 1
    return {"num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": accepted, "sources": sources}


@pytest.fixture
def vllm(monkeypatch):
    return fake_vllm.install(monkeypatch)


def _engine(method: str | None = "ngram", k: int = 4) -> VllmEngine:
    return VllmEngine(VllmConfig(target="/models/target", method=method, num_speculative_tokens=k))


# ------------------------------------------------------------------------------------------ config


def test_llm_is_built_with_speculative_config_and_stats_on(vllm):
    spec = _engine("ngram", 3)
    kw = spec.llm.kwargs
    assert kw["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert kw["disable_log_stats"] is False and kw["tensor_parallel_size"] == 1 and kw["model"] == "/models/target"
    assert kw["enable_prefix_caching"] is False  # a replayed prompt's prefill is timed, not served from the cache
    cached = VllmConfig(target="t", engine_args={"enable_prefix_caching": True})
    assert cached.llm_kwargs()["enable_prefix_caching"] is True  # asked for: measured with the cache
    ar = _engine(None)
    assert ar.llm.kwargs["speculative_config"] is None and ar.mode == "ar" and ar.k_policy == "none"
    eagle = VllmConfig(target="t", method="eagle3", draft_model="/m/eagle3-head", num_speculative_tokens=2,
                       tensor_parallel_size=4, engine_args={"pipeline_parallel_size": 2})
    assert eagle.llm_kwargs()["speculative_config"] == {"method": "eagle3", "num_speculative_tokens": 2,
                                                        "model": "/m/eagle3-head"}
    assert eagle.llm_kwargs()["pipeline_parallel_size"] == 2 and eagle.drafter_label == "vllm-eagle3:eagle3-head"


@pytest.mark.parametrize("cfg,match", [
    (VllmConfig(target="t", method="medusa"), "unknown vLLM speculative method"),
    (VllmConfig(target="t", method="draft_model"), "needs a draft model"),
    (VllmConfig(target="t", method="ngram", num_speculative_tokens=0), "num_speculative_tokens"),
    (VllmConfig(target="t", engine_args={"disable_log_stats": True}), "set by specfinops"),
    # the runs record precision, window and seed: given here the engine would run another than recorded
    (VllmConfig(target="t", engine_args={"dtype": "half"}), r"'dtype' \(give --dtype\)"),
    (VllmConfig(target="t", engine_args={"max_model_len": 8192, "seed": 7}), "'max_model_len' .give --max-len.*'seed'"),
])
def test_bad_config_is_refused_naming_the_value(cfg, match):
    with pytest.raises(ValueError, match=match):
        cfg.validate()


def test_bench_options_map_to_vllm_methods(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = config_from_options(target=str(tmp_path), drafter="draft", draft_model="org/draft-1b", k="5",
                              dtype="bfloat16", max_len=1024, seed=1, engine_args='{"tensor_parallel_size": 2}')
    assert (cfg.method, cfg.draft_model, cfg.tensor_parallel_size, cfg.engine_args) == ("draft_model", "org/draft-1b", 2, {})
    with pytest.raises(ValueError, match="early-exit"):
        config_from_options(target=str(tmp_path), drafter="early-exit", draft_model=None, k="4", dtype="bfloat16",
                            max_len=None, seed=0, engine_args=None)
    with pytest.raises(ValueError, match="fixed integer"):
        config_from_options(target=str(tmp_path), drafter="ngram", draft_model=None, k="heuristic",
                            dtype="bfloat16", max_len=None, seed=0, engine_args=None)
    with pytest.raises(ValueError, match="JSON object"):
        config_from_options(target=str(tmp_path), drafter="ngram", draft_model=None, k="4", dtype="bfloat16",
                            max_len=None, seed=0, engine_args="[1]")


def test_a_specfinops_feature_draft_is_refused_naming_it(tmp_path):
    """scripts/gpu_check.sh gave vLLM the bundled draft, whose config transformers cannot read: the check stopped
    at its bench on any GPU machine."""
    from serving.models import BUNDLED_DRAFT_DIR

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="is a specfinops feature draft .*vLLM cannot load.*--drafter ngram"):
        config_from_options(target=str(tmp_path), drafter="draft", draft_model=str(BUNDLED_DRAFT_DIR), k="4",
                            dtype="bfloat16", max_len=None, seed=0, engine_args=None)


def test_an_intervals_speculation_counts_split_into_possible_records():
    """Three separate splits by the decoded tokens gave one request 3 accepted of 2 drafted tokens (weights 1, 3, 3;
    6 drafts, 18 drafted, 17 accepted), a record the recorder drops as impossible: accepted and drafts now follow
    each request's drafted share."""
    from serving.vllm_backend import SpecCounts, split_spec_counts

    assert [split_count(n, [1, 3, 3]) for n in (6, 18, 17)] == [[1, 3, 2], [2, 8, 8], [3, 7, 7]]  # the old way
    rng = random.Random(5)
    for _ in range(2000):
        weights = [rng.randint(0, 9) for _ in range(rng.randint(1, 8))]
        k = rng.randint(1, 8)
        drafts = rng.randint(0, 40)
        drafted = rng.randint(drafts, drafts * k)
        delta = SpecCounts(drafts, drafted, rng.randint(0, drafted))
        shares = split_spec_counts(delta, weights)
        assert all(s.num_accepted_tokens <= s.num_draft_tokens and s.num_drafts <= s.num_draft_tokens
                   for s in shares), (weights, delta, shares)
        assert [sum(getattr(s, f) for s in shares) for f in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")] \
            == [delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens]


def test_split_count_is_whole_and_exact():
    assert split_count(10, [1, 1, 2]) == [2, 3, 5] or split_count(10, [1, 1, 2]) == [3, 2, 5]
    assert sum(split_count(7, [3, 0, 5])) == 7 and split_count(7, [3, 0, 5])[1] == 0
    assert split_count(3, [0, 0, 0]) == [1, 1, 1]
    assert split_count(0, [4, 2]) == [0, 0]


def test_counts_sum_label_sets_and_positions():
    m = [fake_vllm.Counter("vllm:spec_decode_num_drafts", {"engine": "0"}, 3),
         fake_vllm.Counter("vllm:spec_decode_num_drafts", {"engine": "1"}, 4),
         fake_vllm.Counter("vllm:spec_decode_num_accepted_tokens", {}, 5),
         fake_vllm.Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "0"}, [2, 1]),
         fake_vllm.Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "1"}, [1, 1, 1]),
         fake_vllm.Gauge("vllm:num_requests_running", {}, 2.0)]
    c = SpecCounts.from_metrics(m)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, c.accepted_per_pos) == (7, 0, 5, (3, 2, 1))
    assert (c - SpecCounts(1, 0, 2, (1,))).accepted_per_pos == (2, 2, 1)


# ------------------------------------------------------------------------------------------ running


def _run(engine, prompts, max_tokens, concurrency, power=True):
    source = NvmlPowerSource(nvml=FakeNvml()) if power else None
    sampler = PowerSampler(source, interval_s=0.05).start() if source else None
    encoded = [engine.encode(p) for p in prompts]
    warm_up(engine, encoded)
    seen = []
    try:
        res = run_prompts(engine, prompts, encoded, SamplingParams(max_new_tokens=max_tokens),
                          concurrency=concurrency, sampler=sampler, on_request=seen.append)
    finally:
        if sampler:
            sampler.stop()
    return res, encoded, seen


def test_one_request_at_a_time_records_exact_counter_deltas_tokens_and_energy(vllm):
    prompts = load_workload("code", limit=3)
    engine = _engine("ngram", 4)
    res, encoded, seen = _run(engine, prompts, 17, 1)
    want = expected(17, 4)
    assert [r.prompt.id for r in res.results] == [p.id for p in prompts] and len(seen) == 3
    for r, ids in zip(res.results, encoded, strict=True):
        rec = r.record
        assert r.output_ids == [fake_vllm.token(ids, i) for i in range(17)] and rec.output_tokens == 17
        assert rec.prompt_tokens == len(ids)
        # acceptance: this request's own counter deltas (nothing else was in flight)
        assert (rec.num_drafts, rec.num_draft_tokens, rec.num_accepted_tokens) == (
            want["num_drafts"], want["num_draft_tokens"], want["num_accepted_tokens"])
        # one token event per output token, in order, from the streamed steps
        assert [t.position for t in rec.tokens] == list(range(17))
        assert [t.source for t in rec.tokens] == want["sources"]
        assert rec.tokens[0].step_index == -1 and rec.tokens[-1].step_index == want["num_drafts"] - 1
        assert rec.steps == []  # vLLM reports no per-request step timing: left empty, not invented
        offsets = [t.emit_offset_ms for t in rec.tokens]
        assert offsets == sorted(offsets) and rec.ttft_ms == offsets[0] > 0 and rec.e2e_ms == offsets[-1]
        assert r.tpot_ms == pytest.approx((rec.e2e_ms - rec.ttft_ms) / 16)
        # energy: the fake GPU draws 300 W, so a window costs 300 W x its length
        assert rec.energy_j == pytest.approx(FakeNvml.POWER_W * rec.e2e_ms / 1000, rel=0.1)
        assert r.output_text == "".join(f"<{t}>" for t in r.output_ids) and r.finish_reason == "length"
    total_accepted = 3 * want["num_accepted_tokens"]
    assert sum(res.accepted_per_pos) == total_accepted and res.unattributed == SpecCounts()
    assert res.acceptance_rate == pytest.approx(want["num_accepted_tokens"] / want["num_draft_tokens"])
    assert res.mean_acceptance_length == pytest.approx(1 + want["num_accepted_tokens"] / want["num_drafts"])
    assert res.mode == "spec" and res.drafter == "vllm-ngram:3" and res.k_policy == "fixed:4"


def test_concurrent_requests_share_counters_and_energy_with_exact_sums(vllm):
    prompts = load_workload("code", limit=4)
    res, _, _ = _run(_engine("ngram", 2), prompts, 13, 3)
    want = expected(13, 2)
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert sum(getattr(r.record, name) for r in res.results) == 4 * want[name], name
    assert all(r.record.output_tokens == 13 and len(r.record.tokens) == 13 for r in res.results)
    # overlapping windows share the energy of their overlap: the total is the energy of the time covered
    first = min(r.record.started_at for r in res.results)
    last = max(r.record.started_at.timestamp() + r.record.e2e_ms / 1000 for r in res.results)
    covered_s = last - first.timestamp()
    assert sum(r.record.energy_j for r in res.results) == pytest.approx(FakeNvml.POWER_W * covered_s, rel=0.15)


def _stopped_beside_a_finished_request(exc: BaseException):
    """An engine whose first request runs 6 tokens and second 40; three steps after the first finished, the
    second still running, its step raises `exc`."""
    engine = _engine(None)
    core = engine.llm.llm_engine
    real_add, real_step, finished = core.add_request, core.step, []

    def add_request(request_id, prompt, params):
        if core.running:
            params = copy.copy(params)
            params.max_tokens = 40
        real_add(request_id, prompt, params)

    def step():
        if len(finished) >= 3:
            raise exc
        outs = real_step()
        if finished or any(o.finished for o in outs):
            finished.append(1)
        return outs

    core.add_request, core.step = add_request, step
    return engine


def test_a_stopped_run_shares_the_energy_of_finished_requests_with_those_still_in_flight(vllm):
    """Ctrl-C with one request finished and one in flight beside it all along: the finished one was charged all
    of the devices' energy over its window, the in-flight one none (the torch worker shares it)."""
    engine = _stopped_beside_a_finished_request(KeyboardInterrupt())
    prompts = load_workload("code", limit=2)
    sampler = PowerSampler(NvmlPowerSource(nvml=FakeNvml()), interval_s=0.05).start()
    seen, abandoned = [], []
    try:
        with pytest.raises(KeyboardInterrupt):
            run_prompts(engine, prompts, [engine.encode(p) for p in prompts], SamplingParams(max_new_tokens=6),
                        concurrency=2, sampler=sampler, on_request=seen.append, on_abandoned=abandoned.append)
    finally:
        sampler.stop()
    (done,), (cancelled,) = seen, abandoned
    assert done.record.output_tokens == 6 and cancelled.status == "cancelled" and cancelled.energy_j is None
    # its whole window shared with the one in flight: half of 300 W x its length
    assert done.record.energy_j == pytest.approx(FakeNvml.POWER_W * done.record.e2e_ms / 1000 / 2, rel=0.15)


def test_vllm_failing_mid_run_keeps_the_finished_requests_and_records_those_in_flight_as_errors(vllm):
    """An engine-core error (a CUDA out-of-memory, an illegal memory access) after one request finished: the
    finished requests were reported only at the run's end, so the run was stored 'failed' with no request at
    all, and the one in flight was not recorded either."""
    engine = _stopped_beside_a_finished_request(RuntimeError("EngineCore encountered an issue"))
    prompts = load_workload("code", limit=2)
    seen, abandoned = [], []
    with pytest.raises(RuntimeError, match="EngineCore"):
        run_prompts(engine, prompts, [engine.encode(p) for p in prompts], SamplingParams(max_new_tokens=6),
                    concurrency=2, on_request=seen.append, on_abandoned=abandoned.append)
    (done,), (failed,) = seen, abandoned
    assert done.record.output_tokens == 6 and done.record.status == "ok"
    assert failed.status == "error" and failed.error == "RuntimeError: EngineCore encountered an issue"
    assert failed.output_tokens > 0 and failed.energy_j is None


def test_ar_engine_has_no_speculation_and_no_energy_without_a_sampler(vllm):
    res, _, _ = _run(_engine(None), load_workload("chat", limit=2), 6, 2, power=False)
    for r in res.results:
        assert {t.source for t in r.record.tokens} == {"ar"} and r.record.num_drafts == 0
        assert r.record.energy_j is None  # not measured is None, never 0
    assert res.acceptance_rate is None and res.drafter is None


# ------------------------------------------------------------------------------------------ missing vllm


def test_missing_vllm_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, as where it is not installed
    with pytest.raises(VllmNotInstalled, match=r"vllm is not installed: pip install 'specfinops\[gpu\]'"):
        _engine()
    assert main(["bench", "--backend", "vllm", "--limit", "1", "--no-telemetry"]) == 2
    assert MISSING_VLLM in capsys.readouterr().err


def test_a_vllm_that_fails_to_import_says_why_not_that_it_is_missing(monkeypatch):
    """A broken install ("undefined symbol": a CUDA or torch mismatch) read "vllm is not installed"."""
    import importlib

    from serving.vllm_backend import import_vllm

    real = importlib.import_module

    def broken(name, *a, **kw):
        if name == "vllm":
            raise ImportError("/x/_C.abi3.so: undefined symbol: _ZN3c10")
        return real(name, *a, **kw)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(VllmNotInstalled, match="vllm is installed but cannot be imported: ImportError: .*undefined symbol"):
        import_vllm()


# ------------------------------------------------------------------------------------------ bench end to end


def test_bench_backend_vllm_records_into_sqlite(vllm, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    url, out = f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "bench.json"
    rc = main(["bench", "--backend", "vllm", "--mode", "both", "--workload", "code", "--limit", "2", "--k", "3",
               "--max-new-tokens", "12", "--power", "nvml", "--target", str(target), "--db", url,
               "--node-id", "gpu-a", "--json", str(out)])
    assert rc == 0
    assert len(fake_vllm.LLM.instances) == 2  # one engine per mode, built one at a time
    assert all(llm.llm_engine.engine_core.shut_down for llm in fake_vllm.LLM.instances)
    report = json.loads(out.read_text())
    assert [(r["mode"], r["backend"]) for r in report["runs"]] == [("ar", "vllm"), ("spec", "vllm")]
    want = expected(12, 3)
    spec = report["runs"][1]
    assert spec["acceptance_rate"] == pytest.approx(want["num_accepted_tokens"] / want["num_draft_tokens"])
    assert sum(spec["accepted_per_pos"]) == 2 * want["num_accepted_tokens"] and spec["k"] == "3"
    assert report["runs"][0]["token_identical_rate"] is None and spec["token_identical_rate"] == 1.0

    engine = create_engine(url)
    with engine.connect() as c:
        runs = c.execute(text("select mode, backend, status, power_source, node_id, drafter from runs order by id")).all()
        assert [tuple(r) for r in runs] == [("ar", "vllm", "completed", "nvml", "gpu-a", None),
                                            ("spec", "vllm", "completed", "nvml", "gpu-a", "vllm-ngram:3")]
        assert c.execute(text("select count(*) from requests")).scalar() == 4
        assert c.execute(text("select count(*) from token_events")).scalar() == 4 * 12
        assert c.execute(text("select count(*) from steps")).scalar() == 0
        assert c.execute(text("select count(*) from requests where energy_j is null or energy_j <= 0")).scalar() == 0
        assert {s for (s,) in c.execute(text("select distinct source from power_samples"))} == {"nvml"}
        acc, drafted = c.execute(text("select sum(num_accepted_tokens), sum(num_draft_tokens) from requests q "
                                      "join runs r on r.id = q.run_id where r.mode = 'spec'")).one()
        assert (acc, drafted) == (2 * want["num_accepted_tokens"], 2 * want["num_draft_tokens"])
    engine.dispose()


def test_bench_backend_vllm_refuses_early_exit(vllm, tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    rc = main(["bench", "--backend", "vllm", "--drafter", "early-exit", "--target", str(tmp_path), "--no-telemetry"])
    assert rc == 2 and "not available on --backend vllm" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["name", "folder"])
def test_bench_backend_vllm_refuses_a_feature_draft_as_target(given, vllm, tmp_path, monkeypatch, capsys):
    """`bench --backend vllm --target specfinops-draft` returned before the torch path's --target check, so the
    bundled draft (or any feature draft folder) went to vLLM as the target model."""
    from serving.models import BUNDLED_DRAFT, BUNDLED_DRAFT_DIR

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    target = BUNDLED_DRAFT if given == "name" else str(BUNDLED_DRAFT_DIR)
    rc = main(["bench", "--backend", "vllm", "--limit", "1", "--target", target, "--no-telemetry"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--target {target}: a draft made by `specfinops distill` (a feature draft)" in err
    assert not fake_vllm.LLM.instances  # refused before any engine was built


def test_bench_backend_vllm_names_the_option_of_a_target_that_is_no_model(vllm, tmp_path, monkeypatch, capsys):
    """`--target specfinops-draft` with no bundled draft installed (or a folder without config.json) said the
    models' error without the option that gave it, as the torch path names it."""
    import serving.models
    from serving.models import BUNDLED_DRAFT

    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(serving.models, "BUNDLED_DRAFT_DIR", tmp_path / "no-bundled-draft")
    empty = tmp_path / "empty"
    empty.mkdir()
    for target, says in ((BUNDLED_DRAFT, "names the bundled draft, not a target model"),
                         (str(empty), "no config.json")):
        rc = main(["bench", "--backend", "vllm", "--limit", "1", "--target", target, "--no-telemetry"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and f"error: --target {target}: " in err[0] and says in err[0], err
    assert not fake_vllm.LLM.instances


def test_bench_backend_vllm_still_takes_a_hub_id_as_target(vllm, tmp_path, monkeypatch):
    """The --target check on --backend vllm is a local folder check: a hub id is vLLM's to fetch."""
    monkeypatch.setenv("SPECFINOPS_CACHE", str(tmp_path / "cache"))
    rc = main(["bench", "--backend", "vllm", "--limit", "1", "--max-new-tokens", "4", "--k", "2",
               "--target", "meta-llama/Llama-3.1-8B-Instruct", "--no-telemetry"])
    assert rc == 0 and fake_vllm.LLM.instances[-1].kwargs["model"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_bench_backend_vllm_says_a_prompt_too_long_as_the_torch_engine_does(vllm, tmp_path, capsys):
    """--max-len 6 and a 5-token prompt (the fake's chat template adds 2): the prompt was said to be 'longer than
    the context window (6)', which it is not (a position is kept spare), and the vLLM backend's message lacked what
    the engine's and bench's say (serving.context.context_overflow, now the one wording): how many prompt tokens
    fit, how many positions the prompt and its answer share, and what to do about it."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    work = tmp_path / "w.txt"
    work.write_text("Hello big world\n")
    rc = main(["bench", "--backend", "vllm", "--mode", "ar", "--workload", str(work), "--max-len", "6",
               "--max-new-tokens", "1", "--power", "none", "--target", str(target), "--no-telemetry"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert ("prompt w.txt:1 is 5 tokens; the context window (6 tokens) fits at most 4 prompt tokens (the prompt "
            "and its answer share 5 positions); drop it or raise --max-len") in err, err
    assert "longer than" not in err, err
