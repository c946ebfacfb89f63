"""The worker's backend on vLLM: the same prompts, records and result shapes as `serving.worker`, on GPUs.

What is measured and how (vLLM exposes no per-step hook, so this is what can be observed honestly):

- Engine: `vllm.LLM(model=..., speculative_config={"method", "model", "num_speculative_tokens"} | None,
  tensor_parallel_size=..., disable_log_stats=False)`; one engine per mode (spec, AR), built one at a time
  (speculation is an engine setting, and two engines in one process would share vLLM's metric registry).
- Timing: requests go through `llm.llm_engine.add_request(...)` / `llm.llm_engine.step()` (the loop
  `LLM.generate` runs inside) with `output_kind=RequestOutputKind.DELTA`, so every step returns the tokens
  it emitted per request. A token's emit time is the `perf_counter` when `step()` returned it to this
  process: what a streaming client would see. Tokens returned by the same step share one emit time.
- Acceptance: the counters `vllm:spec_decode_num_drafts`, `_num_draft_tokens`, `_num_accepted_tokens`
  (and the vector `_num_accepted_tokens_per_pos`) read with `llm.get_metrics()` whenever the set of
  requests in flight changes. At concurrency 1 each request's counts are its exact counter deltas. With
  several requests in flight, vLLM does not split its counters by request: each interval's delta is
  apportioned to the requests in flight by the decode tokens each emitted in it (whole numbers, largest
  remainder), so the sums over a run are exact and only the per-request split is apportioned.
- Steps: vLLM does not report per-request draft/verify times or K per step, so `RequestRecord.steps` stays
  empty. Token events carry a step index (-1: the prefill token; then one per step that emitted tokens for
  the request) and a source: in a spec step every token but the last is an accepted draft token; the last
  is `bonus` when K drafts were all accepted, else `correction` (for `ngram`, which may propose fewer than
  K tokens, that includes steps with a short or no proposal: vLLM does not say which).
- Energy: the caller's `PowerSampler` (NVML on GPUs) is sampled when each request ends; after the run the
  readings are attributed to the request windows with `attribute_energy` (equal to `energy_for_window`
  when requests do not overlap; overlapping requests share the energy of the time they overlap).

`vllm` is imported only when an engine is built; without it the error says what to install.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from serving.context import context_overflow
from serving.sampling import SamplingParams
from serving.worker import ModeResult, RequestResult
from serving.workloads import Prompt
from telemetry.energy import attribute_energy
from telemetry.records import RequestRecord, RunInfo, TokenRow

logger = logging.getLogger(__name__)

MISSING_VLLM = "vllm is not installed: pip install 'specfinops[gpu]'"
METHODS = ("draft_model", "ngram", "eagle", "eagle3", "mtp")
NEEDS_MODEL = ("draft_model", "eagle", "eagle3")
DRAFTER_ALIASES = {"draft": "draft_model"}  # bench's --drafter names -> vLLM's methods
NGRAM_MAX, NGRAM_MIN = 3, 1  # as the torch engine's NgramDrafter(n_max=3)

M_DRAFTS = "vllm:spec_decode_num_drafts"
M_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
M_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
M_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


class VllmNotInstalled(ValueError):
    """`--backend vllm` was chosen where vllm cannot be imported."""


def import_vllm() -> tuple[ModuleType, ModuleType]:
    """(vllm, vllm.sampling_params), or VllmNotInstalled saying what to install, or, where vllm is there but
    fails to import (a CUDA or torch mismatch: "undefined symbol ..."), what failed."""
    try:
        return importlib.import_module("vllm"), importlib.import_module("vllm.sampling_params")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] == "vllm":
            raise VllmNotInstalled(MISSING_VLLM) from exc
        raise VllmNotInstalled(f"vllm is installed but cannot be imported: {type(exc).__name__}: {exc}") from exc
    except (ImportError, OSError, RuntimeError) as exc:
        raise VllmNotInstalled(f"vllm is installed but cannot be imported: {type(exc).__name__}: {exc}") from exc


# ------------------------------------------------------------------------------------------ config


@dataclass(frozen=True, slots=True)
class VllmConfig:
    target: str  # local directory or a Hugging Face model id
    method: str | None = None  # None: the AR baseline (no speculative_config)
    draft_model: str | None = None  # required for draft_model, eagle, eagle3
    num_speculative_tokens: int = 4
    tensor_parallel_size: int = 1
    dtype: str = "bfloat16"
    max_model_len: int | None = 2048  # bounds the KV cache vLLM reserves
    seed: int = 0
    engine_args: dict[str, Any] = field(default_factory=dict)  # any other LLM(...) keyword, as given

    def validate(self) -> None:
        if self.method is not None and self.method not in METHODS:
            raise ValueError(f"unknown vLLM speculative method {self.method!r}: use one of {', '.join(METHODS)}")
        if self.method in NEEDS_MODEL and not self.draft_model:
            raise ValueError(f"method {self.method!r} needs a draft model (--draft-model DIR or hub id)")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {self.num_speculative_tokens!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        clash = {"model", "speculative_config", "disable_log_stats"} & set(self.engine_args)
        if clash:
            raise ValueError(f"engine args {sorted(clash)} are set by specfinops; remove them")
        # what the runs record (precision, context window, seed) is what the engine gets: given here, the record
        # would say one thing and the engine do another
        recorded = {k: flag for k, flag in (("dtype", "--dtype"), ("max_model_len", "--max-len"), ("seed", "--seed"))
                    if k in self.engine_args}
        if recorded:
            raise ValueError("engine args " + ", ".join(f"{k!r} (give {flag})" for k, flag in recorded.items())
                             + " are recorded with the runs: set them with bench's own options")

    def speculative_config(self) -> dict[str, Any] | None:
        if self.method is None:
            return None
        cfg: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.draft_model:
            cfg["model"] = self.draft_model
        if self.method == "ngram":
            cfg.update(prompt_lookup_max=NGRAM_MAX, prompt_lookup_min=NGRAM_MIN)
        return cfg

    @property
    def gpus(self) -> int:
        """The GPUs the engine spans: tensor x pipeline parallel size (its device string says so, its price and
        its power source count them)."""
        return self.tensor_parallel_size * int(self.engine_args.get("pipeline_parallel_size", 1))

    def llm_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "model": self.target, "dtype": self.dtype, "tensor_parallel_size": self.tensor_parallel_size,
            "seed": self.seed, "speculative_config": self.speculative_config(),
            "disable_log_stats": False,  # without stat loggers get_metrics() has no spec-decode counters
            # a bench replays its prompts (warm-up, each concurrency level): cached prefixes would time prefills
            # that never ran; `--vllm-args '{"enable_prefix_caching": true}'` measures with the cache
            "enable_prefix_caching": False,
        }
        if self.max_model_len is not None:
            kw["max_model_len"] = self.max_model_len
        return kw | self.engine_args

    @property
    def drafter_label(self) -> str | None:
        if self.method is None:
            return None
        if self.method == "ngram":
            return f"vllm-ngram:{NGRAM_MAX}"
        return f"vllm-{self.method}:{vllm_draft_name(self.draft_model)}" if self.draft_model else f"vllm-{self.method}"


def vllm_draft_name(draft_model: str) -> str:
    """A vLLM draft as its drafter label names it: a local model directory as the engine's labels name a draft
    (`serving.models.draft_name`: folder name and weights fingerprint, so two drafts in folders of one name are
    two drafters); a hub id whole (ORG/NAME: the organisation tells two heads of one name apart); a path that
    is not a model directory here by its last part, as before."""
    from serving.models import draft_name, weight_files

    path = Path(draft_model).expanduser()
    try:
        if path.is_dir() and weight_files(path):
            return draft_name(path)
    except (OSError, ValueError):  # an index that does not read: vLLM says so when it loads the draft
        pass
    hub_like = draft_model.count("/") == 1 and not draft_model.startswith(("/", ".", "~")) and not path.exists()
    return draft_model if hub_like else path.name


def parse_engine_args(text: str | None) -> dict[str, Any]:
    """`--vllm-args '{"gpu_memory_utilization": 0.8, "pipeline_parallel_size": 2}'` -> a dict."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--vllm-args must be a JSON object, got {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--vllm-args must be a JSON object, got {text!r}")
    return value


# ------------------------------------------------------------------------------------------ counters


@dataclass(frozen=True, slots=True)
class SpecCounts:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    @classmethod
    def from_metrics(cls, metrics: Iterable[Any]) -> SpecCounts:
        """Sum each counter over its label sets (one per engine / model) in a `get_metrics()` snapshot."""
        sums = {M_DRAFTS: 0, M_DRAFT_TOKENS: 0, M_ACCEPTED: 0}
        per_pos: list[int] = []
        for m in metrics:
            if m.name in sums:
                sums[m.name] += int(m.value)
            elif m.name == M_ACCEPTED_PER_POS:
                per_pos += [0] * (len(m.values) - len(per_pos))
                for i, v in enumerate(m.values):
                    per_pos[i] += int(v)
        return cls(sums[M_DRAFTS], sums[M_DRAFT_TOKENS], sums[M_ACCEPTED], tuple(per_pos))

    def __sub__(self, other: SpecCounts) -> SpecCounts:
        pos = [a - (other.accepted_per_pos[i] if i < len(other.accepted_per_pos) else 0)
               for i, a in enumerate(self.accepted_per_pos)]
        return SpecCounts(self.num_drafts - other.num_drafts, self.num_draft_tokens - other.num_draft_tokens,
                          self.num_accepted_tokens - other.num_accepted_tokens, tuple(pos))


def split_count(total: int, weights: list[int]) -> list[int]:
    """`total` split in whole numbers proportionally to `weights` (largest remainder; equal if all 0)."""
    if not weights:
        return []
    if sum(weights) <= 0:
        weights = [1] * len(weights)
    s = sum(weights)
    raw = [total * w / s for w in weights]
    out = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[: total - sum(out)]:
        out[i] += 1
    return out


def split_spec_counts(delta: SpecCounts, weights: list[int]) -> list[SpecCounts]:
    """An interval's counter change split over the requests in flight: drafted tokens by `weights` (the tokens
    each decoded), then drafts and accepted tokens by those drafted shares, so no request gets more of either than
    it drafted. (Three splits by the same weights could: largest remainder may give one request the smaller share
    of the larger total, e.g. 3 accepted of 2 drafted, a record the recorder refuses as impossible.)"""
    drafted = split_count(delta.num_draft_tokens, weights)
    drafts = split_count(delta.num_drafts, drafted)
    accepted = split_count(delta.num_accepted_tokens, drafted)
    return [SpecCounts(*c) for c in zip(drafts, drafted, accepted, strict=True)]


# ------------------------------------------------------------------------------------------ engine


class VllmEngine:
    """One vLLM engine (one mode). `modules` = (vllm, vllm.sampling_params) lets tests pass a fake."""

    def __init__(self, config: VllmConfig, *, modules: tuple[ModuleType, ModuleType] | None = None) -> None:
        config.validate()
        self.config = config
        self.vllm, self._sp = modules or import_vllm()
        self.llm = self.vllm.LLM(**config.llm_kwargs())
        self.tokenizer = self.llm.get_tokenizer()
        self._next_id = 0

    @property
    def mode(self) -> str:
        return "ar" if self.config.method is None else "spec"

    @property
    def k_policy(self) -> str:
        return "none" if self.config.method is None else f"fixed:{self.config.num_speculative_tokens}"

    def encode(self, prompt: Prompt) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(list(prompt.as_messages()), add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding on some versions
        if prompt.prompt is None:
            raise ValueError(f"prompt {prompt.id}: chat messages need a model with a chat template")
        return list(tok.encode(prompt.prompt))

    def sampling_params(self, p: SamplingParams) -> Any:
        return self.vllm.SamplingParams(
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k or -1, max_tokens=p.max_new_tokens,
            seed=p.seed, stop=list(p.stop) or None, output_kind=self._sp.RequestOutputKind.DELTA)

    def counts(self) -> SpecCounts:
        return SpecCounts.from_metrics(self.llm.get_metrics())

    def new_request_id(self) -> str:
        self._next_id += 1
        return f"specfinops-{self._next_id}"

    def close(self) -> None:
        """Stop the engine core (its worker processes) and drop the engine so its GPU memory is freed."""
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        gc.collect()


# ------------------------------------------------------------------------------------------ running


@dataclass
class VllmModeResult(ModeResult):
    accepted_per_pos: tuple[int, ...] = ()  # run delta of vllm:spec_decode_num_accepted_tokens_per_pos
    unattributed: SpecCounts = SpecCounts()  # counter deltas seen while no request was in flight


@dataclass
class _Live:
    idx: int
    rec: RequestRecord
    t_start: float
    ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    emit_times: list[float] = field(default_factory=list)
    num_steps: int = 0
    interval_decode_tokens: int = 0
    finish_reason: str | None = None


def _sources(n: int, first: bool, spec: bool, k: int) -> list[str]:
    if first or not spec:
        return ["ar"] * n
    return ["accepted"] * (n - 1) + ["bonus" if n - 1 >= k else "correction"]


def run_prompts(
    engine: VllmEngine,
    prompts: list[Prompt],
    encoded: list[list[int]],
    params: SamplingParams,
    *,
    concurrency: int = 1,
    sampler: Any | None = None,
    on_request: Callable[[RequestResult], None] | None = None,
    on_abandoned: Callable[[RequestRecord], None] | None = None,
) -> VllmModeResult:
    """Every prompt through `engine` with up to `concurrency` requests in flight (closed loop), like
    `serving.worker.run_prompts`. `sampler` (a PowerSampler) is sampled when each request ends and its
    readings give each request its energy; `on_request` is called per request once energy is known.
    Ctrl-C / SIGTERM (KeyboardInterrupt) while requests run: `on_request` is called for the requests finished
    until then, `on_abandoned` with the record of each one in flight (status 'cancelled': the tokens emitted
    until then, no energy), and the KeyboardInterrupt goes on; the engine is not to be used after that."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    core = engine.llm.llm_engine
    sp = engine.sampling_params(params)
    spec, k = engine.mode == "spec", engine.config.num_speculative_tokens
    result = VllmModeResult(engine.mode, engine.config.drafter_label, engine.k_policy)
    queue = list(range(len(prompts)))
    live: dict[str, _Live] = {}
    done: list[_Live] = []
    start_counts = last_counts = engine.counts()
    unattributed = SpecCounts()

    def close_interval() -> None:
        """Give the counter delta since the last read to the requests in flight during it."""
        nonlocal last_counts, unattributed
        now = engine.counts()
        delta, last_counts = now - last_counts, now
        reqs = list(live.values())
        if not reqs:
            unattributed = SpecCounts(unattributed.num_drafts + delta.num_drafts,
                                      unattributed.num_draft_tokens + delta.num_draft_tokens,
                                      unattributed.num_accepted_tokens + delta.num_accepted_tokens)
            return
        for r, share in zip(reqs, split_spec_counts(delta, [r.interval_decode_tokens for r in reqs]), strict=True):
            r.rec.num_drafts += share.num_drafts
            r.rec.num_draft_tokens += share.num_draft_tokens
            r.rec.num_accepted_tokens += share.num_accepted_tokens
        for r in reqs:
            r.interval_decode_tokens = 0

    t_begin = time.perf_counter()
    try:
        while queue or live:
            if queue and len(live) < concurrency:
                close_interval()
                while queue and len(live) < concurrency:
                    idx = queue.pop(0)
                    key, p = engine.new_request_id(), prompts[idx]
                    rec = RequestRecord(started_at=datetime.now(UTC), domain=p.domain, external_id=p.id,
                                        prompt_tokens=len(encoded[idx]), temperature=params.temperature,
                                        top_p=params.top_p, top_k=params.top_k, seed=params.seed,
                                        max_new_tokens=params.max_new_tokens)
                    live[key] = _Live(idx, rec, time.perf_counter())
                    core.add_request(key, {"prompt_token_ids": encoded[idx]}, sp)
            outputs = core.step()
            t = time.perf_counter()
            finished = []
            for out in outputs:
                r = live[out.request_id]
                comp = out.outputs[0]
                new = list(comp.token_ids)
                if new:
                    first = not r.ids
                    step = -1 if first else r.num_steps
                    r.num_steps += 0 if first else 1
                    offset_ms = (t - r.t_start) * 1000.0
                    for i, src in enumerate(_sources(len(new), first, spec, k)):
                        r.rec.tokens.append(TokenRow(len(r.ids) + i, offset_ms, step, src))
                    r.interval_decode_tokens += len(new) - (1 if first else 0)
                    r.ids += new
                    r.text.append(comp.text)
                    r.emit_times.append(t)
                if out.finished:
                    r.finish_reason = comp.finish_reason
                    finished.append(out.request_id)
            if finished:
                close_interval()
                for key in finished:
                    done.append(live.pop(key))
                if sampler is not None:
                    sampler.sample_now()  # so the window of every finished request is covered
    except BaseException as exc:
        # Ctrl-C / SIGTERM, or vLLM failing mid-run (an engine-core error, CUDA out of memory): the requests that
        # finished are reported (they were reported only at the run's end, so a failure lost them all) and those
        # in flight recorded with their status, as the torch engine's (`serving.worker`)
        now = datetime.now(UTC)  # the requests still in flight shared the devices with the finished ones
        _report_finished(done, prompts, sampler, on_request, in_flight=[(r.rec.started_at, now) for r in live.values()])
        if on_abandoned is not None:
            interrupted = isinstance(exc, KeyboardInterrupt)
            status = "cancelled" if interrupted else "error"
            error = ("cancelled: the benchmark was interrupted (Ctrl-C or SIGTERM)" if interrupted
                     else f"{type(exc).__name__}: {exc}"[:500])
            for r in live.values():
                on_abandoned(_abandoned_record(r, status, error))
        raise
    result.wall_s = time.perf_counter() - t_begin
    run_delta = engine.counts() - start_counts
    result.accepted_per_pos, result.unattributed = run_delta.accepted_per_pos, unattributed
    result.results.extend(_report_finished(done, prompts, sampler, on_request))
    result.results.sort(key=lambda res: prompts.index(res.prompt))
    return result


def _report_finished(done: list[_Live], prompts: list[Prompt], sampler: Any | None,
                     on_request: Callable[[RequestResult], None] | None, *,
                     in_flight: Iterable[tuple[datetime, datetime]] = ()) -> list[RequestResult]:
    """The finished requests' results: times from their emitted tokens, energy from the sampler's readings
    (attributed over their windows), each passed to `on_request`. `in_flight`: the windows (start to now) of
    the requests still running when the run was stopped; they share the devices' energy of the time they
    overlap the finished ones (as `serving.worker`'s requests in flight do), their own shares are dropped."""
    for r in done:
        r.rec.output_tokens = len(r.ids)
        if r.emit_times:
            r.rec.ttft_ms = (r.emit_times[0] - r.t_start) * 1000.0
            r.rec.e2e_ms = (r.emit_times[-1] - r.t_start) * 1000.0
    windows = [(r.rec.started_at, r.rec.started_at + timedelta(milliseconds=r.rec.e2e_ms or 0.0)) for r in done]
    sharers = list(in_flight)
    energies = (attribute_energy(sampler.readings(), [*windows, *sharers])[: len(done)] if sampler is not None
                else [None] * len(done))
    out = []
    for r, energy_j in zip(done, energies, strict=True):
        r.rec.energy_j = energy_j if r.rec.e2e_ms is not None else None
        res = RequestResult(prompts[r.idx], r.ids, "".join(r.text), r.rec, r.finish_reason)
        out.append(res)
        if on_request is not None:
            on_request(res)
    return out


def _abandoned_record(r: _Live, status: str, error: str) -> RequestRecord:
    """The record of a request in flight when the run stopped (Ctrl-C / SIGTERM: 'cancelled'; a failure:
    'error'), as the torch engine's (`serving.worker.abandoned`): the tokens emitted until then, no energy."""
    rec = r.rec
    rec.status, rec.error = status, error
    rec.output_tokens = len(r.ids)
    if r.emit_times:
        rec.ttft_ms = (r.emit_times[0] - r.t_start) * 1000.0
        rec.e2e_ms = (r.emit_times[-1] - r.t_start) * 1000.0
    else:
        rec.e2e_ms = (time.perf_counter() - r.t_start) * 1000.0
    return rec


def warm_up(engine: VllmEngine, encoded: list[list[int]]) -> None:
    """One short untimed request so CUDA graph capture / compilation does not land on a measured one."""
    core = engine.llm.llm_engine
    core.add_request(engine.new_request_id(), {"prompt_token_ids": encoded[0]},
                     engine.sampling_params(SamplingParams(max_new_tokens=8)))
    while core.has_unfinished_requests():
        core.step()


# ------------------------------------------------------------------------------------------ run info


def software_version(vllm: ModuleType) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("specfinops")
    except PackageNotFoundError:
        ours = "(source)"
    return f"specfinops {ours}, vllm {getattr(vllm, '__version__', '?')}"


def device_name(config: VllmConfig) -> str:
    """'cuda: NVIDIA H200 x 8 (tp 8)'; 'vllm: device unknown x 8 (tp 8)' when torch sees no CUDA device here."""
    parallel = config.gpus
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)} x {parallel} (tp {config.tensor_parallel_size})"
    except ImportError:
        pass
    return f"vllm: device unknown x {parallel} (tp {config.tensor_parallel_size})"  # priced per GPU it spans


def run_info(engine: VllmEngine, *, workload: str, params: SamplingParams, node_id: str, power_source: str,
             concurrency: int, kind: str = "bench", invocation_id: str | None = None) -> RunInfo:
    """The run row of one (mode, level); `invocation_id` is the bench invocation's, shared by all its runs."""
    cfg = engine.config
    return RunInfo(
        mode=engine.mode, node_id=node_id, hostname=socket.gethostname(), device=device_name(cfg), backend="vllm",
        dtype=cfg.dtype, target=cfg.target, drafter=cfg.drafter_label, k_policy=engine.k_policy,
        temperature=params.temperature, workload=workload, power_source=power_source,
        software_version=software_version(engine.vllm), top_p=params.top_p, concurrency=concurrency, kind=kind,
        top_k=params.top_k, seed=params.seed, max_new_tokens=params.max_new_tokens, invocation_id=invocation_id,
    )


# ------------------------------------------------------------------------------------------ bench


def _model_ref(name: str | None, role: str) -> str:
    """A local model directory (bundled names resolved as the torch path does) or a hub id for vLLM."""
    from serving.models import resolve_model

    try:
        return str(resolve_model(name, role))
    except ValueError:
        if name and "/" in name and not Path(name).expanduser().exists():
            return name  # e.g. meta-llama/Llama-3.1-8B-Instruct: vLLM fetches it
        raise


def config_from_options(*, target: str | None, drafter: str | None, draft_model: str | None, k: str, dtype: str,
                        max_len: int | None, seed: int, engine_args: str | None,
                        tensor_parallel_size: int | None = None) -> VllmConfig:
    """bench's options -> the spec-mode VllmConfig (the AR engine is the same without speculation)."""
    method = DRAFTER_ALIASES.get(drafter or "ngram", drafter or "ngram")
    if method not in METHODS:
        raise ValueError(f"--drafter {drafter!r} is not available on --backend vllm: use draft (draft_model), "
                         f"{', '.join(m for m in METHODS if m != 'draft_model')}")
    if not str(k).isdigit() or int(k) < 1:
        raise ValueError(f"--k must be a fixed integer >= 1 on --backend vllm (num_speculative_tokens), got {k!r}")
    extra = parse_engine_args(engine_args)
    tp = tensor_parallel_size or int(extra.pop("tensor_parallel_size", 1))
    draft = _model_ref(draft_model, "draft") if method in NEEDS_MODEL or (method == "mtp" and draft_model) else None
    if draft is not None:
        from serving.eagle import is_eagle_dir

        if Path(draft).is_dir() and is_eagle_dir(draft):  # vLLM reads a draft's config through transformers
            raise ValueError(f"the draft {draft} is a specfinops feature draft (model_type specfinops-eagle), which "
                             "vLLM cannot load: on --backend vllm give a Hugging Face draft model or an EAGLE "
                             "checkpoint made for vLLM, or --drafter ngram")
    config = VllmConfig(target=_model_ref(target, "target"), method=method, draft_model=draft,
                        num_speculative_tokens=int(k), tensor_parallel_size=tp, dtype=dtype,
                        max_model_len=max_len, seed=seed, engine_args=extra)
    config.validate()
    return config


@dataclass(frozen=True, slots=True)
class _SpecView:
    k: str
    dtype: str
    tree: str | None = None  # vLLM proposes chains (bench refuses --tree there)


@dataclass(frozen=True, slots=True)
class ReportView:
    """What bench's report builder reads from a loaded backend (`spec.k`, `spec.dtype`, `target_dir`)."""

    spec: _SpecView
    target_dir: str


@dataclass(frozen=True, slots=True)
class StoppedRun:
    """The (mode, level) run Ctrl-C / SIGTERM stopped: its id in the store (None: not recorded), ended
    'cancelled' there with the `requests_done` requests it finished until then (and those in flight, recorded
    'cancelled'). Its result is not reported: vLLM's run gives its result only at its end."""

    mode: str
    concurrency: int
    run_id: int | None
    requests_done: int


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM stopped `run_bench`, whose engine, recorder and power source are closed: `results`
    holds the (level, result) of the runs that completed, `view` what bench's report reads, `stopped` the run
    it stopped (None: stopped between runs, building an engine or warming it up)."""

    def __init__(self, results: list[tuple[int, VllmModeResult]], view: ReportView, stopped: StoppedRun | None):
        super().__init__()
        self.results, self.view, self.stopped = results, view, stopped

    @property
    def cancelled_run_ids(self) -> list[int]:
        stopped = self.stopped
        return [stopped.run_id] if stopped is not None and stopped.run_id is not None else []


def _recording(recorder: Any | None, run_id: int | None, finished: list[RequestResult]):
    """`run_prompts`' callbacks for one run: (on_request: a finished request recorded and kept in `finished`;
    on_abandoned: one in flight when Ctrl-C / SIGTERM stopped the run recorded 'cancelled', None unrecorded)."""

    def on_request(res: RequestResult) -> None:
        if recorder:
            recorder.record_request(run_id, res.record)
        finished.append(res)

    def on_abandoned(rec: RequestRecord) -> None:
        recorder.record_request(run_id, rec)

    return on_request, (on_abandoned if recorder else None)


def run_bench(config: VllmConfig, prompts: list[Prompt], params: SamplingParams, modes: list[str],
              levels: list[int], *, workload: str, node_id: str, power: str = "auto", tdp_w: float | None = None,
              db_url: str | None = None, record: bool = True, modules: tuple[ModuleType, ModuleType] | None = None,
              nvml: Any | None = None, invocation_id: str | None = None,
              ) -> tuple[list[tuple[int, VllmModeResult]], ReportView]:
    """Each mode on its own engine (built, warmed up, run at every concurrency level, shut down), each
    (mode, level) recorded as one run with its power samples; returns the results for bench's report. Every
    run carries `invocation_id` (a fresh uuid4 hex when None): speedups pair the spec and AR runs of one call.
    Ctrl-C / SIGTERM (KeyboardInterrupt): the engine, recorder and power source are closed, the stopped run
    ends 'cancelled' in the store, and BenchInterrupted carries the runs that completed."""
    import uuid
    from dataclasses import replace

    from telemetry.power import detect_power_source
    from telemetry.recorder import recorded_run

    modules = modules or import_vllm()  # fail before opening anything
    recorder = None
    if record:
        from telemetry.recorder import Recorder
        from telemetry.store import open_store

        recorder = Recorder(open_store(db_url, to_write=True))  # a read-only store refused before vLLM loads
    view = ReportView(_SpecView(str(config.num_speculative_tokens), config.dtype), config.target)
    results: list[tuple[int, VllmModeResult]] = []
    stopped: StoppedRun | None = None
    try:
        # the GPUs this run spans: NVML reads those, an estimate counts each, and no CPU meter stands in for them
        source = detect_power_source(power, tdp_w=tdp_w, nvml=nvml, gpus=config.gpus)
    except BaseException:
        if recorder:
            recorder.close()
        raise
    invocation_id = invocation_id or uuid.uuid4().hex
    try:
        for mode in modes:
            engine = VllmEngine(config if mode == "spec" else replace(config, method=None), modules=modules)
            try:
                encoded = [engine.encode(p) for p in prompts]
                for p, ids in zip(prompts, encoded, strict=True):  # --max-len sets max_model_len (VllmConfig)
                    overflow = config.max_model_len and context_overflow(
                        f"prompt {p.id}", len(ids), config.max_model_len, advice="drop it or raise --max-len")
                    if overflow:
                        raise ValueError(overflow)
                warm_up(engine, encoded)
                for level in levels:
                    info = run_info(engine, workload=workload, params=params, node_id=node_id,
                                    power_source=source.source, concurrency=level, invocation_id=invocation_id)
                    run_id, finished = None, []  # the requests the run finished, recorded one by one
                    try:
                        with recorded_run(recorder, source, info) as (run_id, sampler):
                            on_request, on_abandoned = _recording(recorder, run_id, finished)
                            res = run_prompts(engine, prompts, encoded, params, concurrency=level, sampler=sampler,
                                              on_request=on_request, on_abandoned=on_abandoned)
                    except KeyboardInterrupt:
                        stopped = StoppedRun(mode, level, run_id, len(finished))
                        raise
                    res.run_ids = [run_id] if run_id is not None else []
                    if res.unattributed.num_draft_tokens:
                        logger.warning("vLLM counted %d draft tokens while no request was in flight (run %s)",
                                       res.unattributed.num_draft_tokens, run_id)
                    results.append((level, res))
            finally:
                engine.close()
    except KeyboardInterrupt:
        interrupted = True
    else:
        interrupted = False
    finally:
        if recorder:
            recorder.close()
        source.close()
    if interrupted:
        raise BenchInterrupted(results, view, stopped)
    return results, view
