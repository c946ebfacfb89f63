"""The worker: builds an engine from options, runs prompts through it and turns the engine's step
events into telemetry records. This is where serving meets the store; the engine itself never does.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import torch

from serving import package_version
from serving.drafters import FeatureDrafter, HybridDrafter, ModelDrafter, NgramDrafter, TreeShape
from serving.eagle import is_eagle_dir, load_eagle
from serving.engine import Engine, StepEvent
from serving.int8 import quantize_draft
from serving.kernels import kernels_label, measure_choices, pack_for_inference
from serving.llama import CausalLM, check_model_dir, load_causal_lm
from serving.lookahead import DEFAULT_K, BatchGatedK, parse_policy
from serving.models import (
    BUNDLED_DRAFT_DIR,
    bundled_target_dir,
    check_same_vocab,
    draft_name,
    load_tokenizer,
    pull_again_hint,
    resolve_model,
)
from serving.sampling import SamplingParams
from serving.sequence import Sequence
from serving.workloads import Prompt
from telemetry.records import RequestRecord, RunInfo, StepRow, TokenRow

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
DRAFTERS = ("draft", "draft+ngram", "early-exit", "ngram")
# Measured on the code workload (`specfinops bench --mode both --limit 8`, bf16, greedy, 2-core CPU with
# AVX-512 BF16; docs/benchmarks.md): with the bundled target, the distilled draft plus prompt lookup where
# the context repeats (draft+ngram) is fastest (1.89-2.05x AR at K=4, 1.63-1.85x with auto), ahead of
# prompt lookup alone (1.51x, auto) and the draft alone (1.35x at K=4); early exit's untrained early layers almost never
# agree with the final layer on this model. Any other target has no distilled draft until `specfinops
# distill` makes one, so it gets prompt lookup; `--drafter draft --draft-model DIR` selects a draft.
DEFAULT_DRAFTER = "ngram"
BUNDLED_PAIR_DRAFTER = "draft+ngram"


def default_drafter(target: str | None) -> str:
    """The drafter bench and serve use when none is named: the one measured fastest (see above)."""
    try:
        bundled = resolve_model(target, "target").resolve() == bundled_target_dir().resolve()
    except ValueError:  # not pulled yet, or not a model: loading will say so
        bundled = False
    return BUNDLED_PAIR_DRAFTER if bundled and (BUNDLED_DRAFT_DIR / "config.json").is_file() else DEFAULT_DRAFTER


DEFAULT_EARLY_EXIT_LAYERS = 8
# draft+ngram copies from the context only where its last HYBRID_NGRAM_MIN+ tokens occurred before
# (a single repeated token is too weak a signal to overrule the draft: calibrate on code measured 1.88x
# with 1, 1.97x with 2, 1.99x with 3, the last two within noise)
HYBRID_NGRAM_MIN = 2
# a feature draft's copy prior (FeatureDrafter): the logit bonus for tokens that followed the current one
# earlier in the sequence. Chosen on the target's answers to 160 package prompts (neither trained on nor
# evaluation; docs/benchmarks.md, session 15): the draft alone gained most at 4 (alpha 0.446 -> 0.546 of
# {0, 2, 4}); beside prompt lookup, which copies already, 2 was best and gained little (0.675 -> 0.679).
# SPECFINOPS_COPY_BIAS overrides both (0 turns it off).
COPY_BIAS = {"draft": 4.0, "draft+ngram": 2.0}


def copy_bias_for(drafter: str) -> float:
    raw = os.environ.get("SPECFINOPS_COPY_BIAS")
    if raw is None or not raw.strip():
        return COPY_BIAS.get(drafter, 0.0)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"SPECFINOPS_COPY_BIAS must be a number >= 0 (0 = off), got {raw!r}")
    return value


def software_version(dtype: str | None = None) -> str:
    """Package and torch versions plus, for a run of this engine in `dtype`, the CPU kernels measured
    fastest here (serving/kernels.py): a run's speed depends on all three."""
    own = package_version()
    kernels = f", {kernels_label(DTYPES[dtype])}" if dtype in DTYPES else ""  # e.g. packed+fused>=2/mask-matmul
    return f"{own}, torch {torch.__version__}{kernels}"[:255]  # the column holds 255 (store 0009)


def device_name() -> str:
    model = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model} ({torch.get_num_threads()} threads)"


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # what caps torch's threads from the environment


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's cpuset), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this system
        return os.cpu_count() or 1


def thread_cap_warning() -> str | None:
    """A warning where torch runs on fewer threads than the usable CPUs while OMP_NUM_THREADS or MKL_NUM_THREADS
    is set (a junk MKL_NUM_THREADS=abc gives one thread, libgomp at most its own 'Invalid value' line): a run's
    tokens/s is then part of the machine's, priced as the whole node, and its device reads "(1 threads)" with
    nothing said. None otherwise: a count below the CPUs without these set is torch's own choice. The threads
    used are left as they are."""
    given = [f"{name}={os.environ[name]!r}" for name in THREAD_VARIABLES if name in os.environ]
    threads, cpus = torch.get_num_threads(), usable_cpus()
    if not given or threads >= cpus:
        return None
    return (f"warning: torch runs {threads} thread{'s' if threads != 1 else ''} on the {cpus} CPUs this process may "
            f"use, with {' and '.join(given)} set: its runs' tokens/s and costs are those of part of the machine, "
            "priced as the whole node; unset it (or give the CPU count) unless that is what you mean to measure")


@functools.cache
def say_thread_cap() -> None:
    """thread_cap_warning on stderr, once per process (bench and serve call it before their model loads)."""
    text = thread_cap_warning()
    if text is not None:
        print(text, file=sys.stderr, flush=True)


@dataclass
class EngineSpec:
    target: str | None = None  # model name or directory
    drafter: str = DEFAULT_DRAFTER
    draft_model: str | None = None
    early_exit_layers: int = DEFAULT_EARLY_EXIT_LAYERS
    k: str = DEFAULT_K
    dtype: str = "bfloat16"
    max_batch: int = 1
    max_len: int = 2048
    spec_max_batch: int | None = None  # speculate only while at most this many sequences run together
    tree: str | None = None  # NODES[:DEPTH[:WIDTH[:MIN_PROB]]]: draft token trees instead of one chain (see TreeShape)

    def validate(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ValueError(f"unknown drafter {self.drafter!r}: use one of {', '.join(DRAFTERS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be bfloat16 or float32, got {self.dtype!r}")
        parse_policy(self.k)
        if self.early_exit_layers < 1:
            raise ValueError(f"--early-exit-layers must be >= 1, got {self.early_exit_layers}")
        if self.max_batch < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.max_batch}")
        if self.tree is not None:
            try:
                TreeShape.parse(self.tree)
            except ValueError as exc:  # said as every other bad value is: naming the option
                raise ValueError(f"--tree {self.tree}: {exc}") from None
            if self.drafter == "early-exit":
                raise ValueError("--tree needs a feature draft or prompt lookup, not early-exit drafting")
            if self.k != DEFAULT_K:
                raise ValueError(f"--tree sets the lookahead itself (its depth); drop --k {self.k}")

    @property
    def tree_shape(self) -> TreeShape | None:
        return TreeShape.parse(self.tree) if self.tree is not None else None

    def k_policy(self, mode: str) -> str:
        """What decides the lookahead, as run records name it: 'none' (AR), 'fixed:4', 'auto:8', 'tree:16:6:4:0.25'."""
        if mode != "spec":
            return "none"
        if self.tree is not None:
            return self.tree_shape.label
        return f"fixed:{self.k}" if str(self.k).isdigit() else str(self.k)


@dataclass
class Loaded:
    """A target (and the drafter built on it) shared by the spec and AR engines of one process."""

    spec: EngineSpec
    target_dir: Path
    target: CausalLM
    tokenizer: object
    drafter_factory: Callable[[int, int], object]
    drafter_label: str
    eos_ids: tuple[int, ...]

    def engine(self, mode: str, on_step=None, max_batch: int | None = None) -> Engine:
        batch = max_batch or self.spec.max_batch
        tree = self.spec.tree_shape if mode == "spec" else None
        # a drafter's tree takes (depth - 1) * width cache entries past the sequence while it grows
        room = 16 + ((tree.depth - 1) * tree.width if tree else 0)
        # the engine's window: --max-len, or the target's positions where it has fewer (Engine keeps the lesser),
        # so a drafter's caches are not sized to a --max-len the target cannot reach
        window = min(self.spec.max_len, self.target.cfg.max_position)
        drafter = self.drafter_factory(batch, window + room) if mode == "spec" else None
        k = (tree.depth if tree else self.spec.k) if mode == "spec" else 0
        policy = parse_policy(k)
        if mode == "spec" and self.spec.spec_max_batch is not None:
            policy = BatchGatedK(policy, self.spec.spec_max_batch)
        return Engine(self.target, drafter=drafter, policy=policy, eos_ids=self.eos_ids, max_batch=batch,
                      max_len=self.spec.max_len, decode=self.decode, on_step=on_step, tree=tree)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """The prompt's token ids as the engine feeds them: through the chat template where the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(prompt.as_messages(), add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        return list(ids)
    if prompt.prompt is None:
        raise ValueError(f"prompt {prompt.id}: chat messages need a model with a chat template")
    return tokenizer.encode(prompt.prompt)


@contextmanager
def named_by(flag: str, value: str | None):
    """A ValueError about a model folder begins with the option that named it (`--draft-model DIR: ...`): a
    draft's missing weights read as the target's. Unchanged where the option was not given (a bundled model)."""
    try:
        yield
    except ValueError as exc:
        if value is None:
            raise
        raise ValueError(f"{flag} {value}: {exc}") from None


def check_files(spec: EngineSpec, target_dir: Path, tokenizer, draft_flag: str = "--draft-model") -> Path | None:
    """Every check of the target's and the draft's folders that reads files alone (a config the engine computes,
    weights present, a tokenizer, the pair's vocabularies, the draft's positions against the context window,
    --early-exit-layers against the target's layers), before any weights load: a draft's were made only once
    the target had loaded, minutes for a large one. The draft's folder where the drafter takes one."""
    with named_by("--target", spec.target):
        with pull_again_hint(target_dir):
            target_cfg, _ = check_model_dir(target_dir)
        if spec.drafter == "early-exit" and spec.early_exit_layers >= target_cfg.num_layers:  # no pull mends it
            raise ValueError(f"--early-exit-layers must be < the target's {target_cfg.num_layers} layers, got "
                             f"{spec.early_exit_layers}")
    if spec.drafter not in ("draft", "draft+ngram"):
        return None
    with named_by(draft_flag, spec.draft_model):
        draft_dir = resolve_model(spec.draft_model, "draft", draft_flag)
        check_same_vocab(target_dir, draft_dir, target_tok=tokenizer)  # first: a draft of another model entirely
        if is_eagle_dir(draft_dir):
            if not (draft_dir / "model.safetensors").is_file():
                raise ValueError(f"{draft_dir} has no model.safetensors (the draft's weights)")
        else:
            if spec.tree is not None:
                raise ValueError(f"--tree needs a feature draft (specfinops distill makes one); {draft_dir} is a "
                                 "plain causal LM")
            draft_cfg, _ = check_model_dir(draft_dir)
            window = min(spec.max_len, target_cfg.max_position)
            if draft_cfg.max_position < window:  # its cache and rope table end there: later drafts would be garbage
                raise ValueError(f"the draft {draft_dir.name} holds {draft_cfg.max_position} positions, fewer than the "
                                 f"context window ({window}: --max-len, or the target's positions): give --max-len "
                                 f"{draft_cfg.max_position} or less, or a draft with as many positions as the target")
    return draft_dir


def load(spec: EngineSpec, draft_flag: str = "--draft-model") -> Loaded:
    """The target and the drafter `spec` names, every file-only check of both folders made first (`check_files`).
    `draft_flag`: the command's option naming the draft, which begins errors about its folder."""
    spec.validate()
    with named_by("--target", spec.target):
        target_dir = resolve_model(spec.target, "target")
        tokenizer = load_tokenizer(target_dir)
    draft_dir = check_files(spec, target_dir, tokenizer, draft_flag)
    dtype = DTYPES[spec.dtype]
    with named_by("--target", spec.target), pull_again_hint(target_dir):  # the bundled target's weights cut short
        target = load_causal_lm(target_dir, dtype)
    measure_choices(dtype)  # every kernel choice measured now (said on stderr the first time on a machine)
    pack_for_inference(target)
    if draft_dir is not None:
        if is_eagle_dir(draft_dir):
            with named_by(draft_flag, spec.draft_model):
                eagle = load_eagle(draft_dir, target, dtype, target_dir=target_dir)
            pack_for_inference(eagle)
            bias = copy_bias_for(spec.drafter)
            label = (f"feature:{draft_name(draft_dir)}{'@int8' if quantize_draft(eagle) else ''}"  # records say so
                     + (f"+copy{bias:g}" if bias else ""))

            def factory(slots: int, max_len: int):
                return FeatureDrafter(eagle, label, slots=slots, max_len=max_len, copy_bias=bias)
        else:
            with named_by(draft_flag, spec.draft_model):
                draft = load_causal_lm(draft_dir, dtype)
            pack_for_inference(draft)
            label = f"draft:{draft_name(draft_dir)}{'@int8' if quantize_draft(draft) else ''}"

            def factory(slots: int, max_len: int):
                return ModelDrafter(draft, label, slots=slots, max_len=max_len, vocab=target.cfg.vocab_size)
    elif spec.drafter == "early-exit":
        n = spec.early_exit_layers
        label = f"early-exit:{n}"

        def factory(slots: int, max_len: int):
            return ModelDrafter(target, label, slots=slots, max_len=max_len, num_layers=n)
    else:
        label = "ngram:3"

        def factory(slots: int, max_len: int):
            return NgramDrafter(n_max=3)
    if spec.drafter == "draft+ngram":
        inner = factory
        label = f"{label}+ngram:3-{HYBRID_NGRAM_MIN}"

        def factory(slots: int, max_len: int):
            return HybridDrafter(inner(slots, max_len), n_max=3, n_min=HYBRID_NGRAM_MIN)
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen_cfg = target_dir / "generation_config.json"
    if gen_cfg.is_file():
        import json

        extra = json.loads(gen_cfg.read_text()).get("eos_token_id")
        eos.update(extra if isinstance(extra, list) else [extra] if extra is not None else [])
    return Loaded(spec, target_dir, target, tokenizer, factory, label, tuple(sorted(eos)))


# -------------------------------------------------------------------------------- results


@dataclass
class RequestResult:
    prompt: Prompt
    output_ids: list[int]
    output_text: str
    record: RequestRecord
    finish_reason: str | None

    @property
    def tpot_ms(self) -> float | None:
        r = self.record
        if r.output_tokens < 2 or r.e2e_ms is None or r.ttft_ms is None:
            return None
        return (r.e2e_ms - r.ttft_ms) / (r.output_tokens - 1)


@dataclass
class ModeResult:
    mode: str
    drafter: str | None
    k_policy: str
    results: list[RequestResult] = field(default_factory=list)
    wall_s: float = 0.0
    run_ids: list[int] = field(default_factory=list)  # the recorded run(s) behind this result (turns of a bench)

    @property
    def run_id(self) -> int | None:
        """The recorded run, where this result is exactly one."""
        return self.run_ids[0] if len(self.run_ids) == 1 else None

    def absorb(self, other: ModeResult) -> None:
        """Pool another turn of the same mode into this result: its requests, wall time and runs."""
        self.results.extend(other.results)
        self.wall_s += other.wall_s
        self.run_ids.extend(other.run_ids)

    @property
    def output_tokens(self) -> int:
        return sum(r.record.output_tokens for r in self.results)

    @property
    def tokens_per_s(self) -> float | None:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        drafted = sum(r.record.num_draft_tokens for r in self.results)
        return sum(r.record.num_accepted_tokens for r in self.results) / drafted if drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        drafts = sum(r.record.num_drafts for r in self.results)
        return 1 + sum(r.record.num_accepted_tokens for r in self.results) / drafts if drafts else None


def append_step(rec: RequestRecord, ev: StepEvent, t_start: float) -> None:
    """Add one engine step event to a request's telemetry rows (plain appends: runs on the hot path)."""
    offset_ms = (ev.t_end - t_start) * 1000.0
    if ev.step_index >= 0:
        rec.steps.append(StepRow(ev.step_index, ev.k, ev.accepted, len(ev.tokens), ev.draft_s * 1000.0,
                                 ev.verify_s * 1000.0, offset_ms, ev.batch_size, ev.k_reason))
    pos = len(rec.tokens)
    for i, src in enumerate(ev.sources):
        rec.tokens.append(TokenRow(pos + i, offset_ms, ev.step_index, src))


class _Collector:
    """Engine step events -> per-request telemetry rows (plain appends: this runs on the hot path)."""

    def __init__(self):
        self.open: dict[str, RequestRecord] = {}
        self.t0: dict[str, float] = {}

    def begin(self, key: str, rec: RequestRecord, t_start: float) -> None:
        self.open[key], self.t0[key] = rec, t_start

    def __call__(self, ev: StepEvent) -> None:
        append_step(self.open[ev.request_id], ev, self.t0[ev.request_id])


def run_prompts(
    loaded: Loaded,
    mode: str,
    prompts: list[Prompt],
    encoded: list[list[int]],
    params: SamplingParams,
    *,
    concurrency: int = 1,
    on_request: Callable[[RequestResult], None] | None = None,
    energy_for: EnergyFor | None = None,
) -> ModeResult:
    """Run every prompt in `mode` with up to `concurrency` sequences in flight (closed loop)."""
    return ModeRunner(loaded, mode, concurrency).run(prompts, encoded, params, on_request=on_request,
                                                     energy_for=energy_for)


EnergyFor = Callable[[list[tuple[datetime, datetime]]], float | None]
"""Joules of the first window when the devices' energy is shared by the overlapping windows given."""


class ModeRunner:
    """One mode's engine, kept across calls: a benchmark that runs the workload in blocks (alternating AR
    and spec) keeps what the lookahead policy learnt from one block to the next, as one long run would."""

    def __init__(self, loaded: Loaded, mode: str, concurrency: int = 1):
        self.loaded, self.mode, self.concurrency = loaded, mode, concurrency
        self.collector = _Collector()
        self.engine = loaded.engine(mode, on_step=self.collector, max_batch=concurrency)

    def run(
        self,
        prompts: list[Prompt],
        encoded: list[list[int]],
        params: SamplingParams,
        *,
        on_request: Callable[[RequestResult], None] | None = None,
        energy_for: EnergyFor | None = None,
        on_abandoned: Callable[[RequestRecord], None] | None = None,
    ) -> ModeResult:
        """Every prompt, up to `concurrency` in flight (closed loop); the result holds these prompts only.
        `on_abandoned(record)`: a request in flight when the run stops (Ctrl-C: 'cancelled'; an error: 'error');
        the runner's engine is not to be used after that.

        `energy_for(windows)` gives the joules of the first wall-clock window when the devices' energy is
        shared by all of them (requests in flight together split it, as the server's do): a finishing
        request is passed with the windows of the requests still in flight and of the finished ones that
        overlap it, so a run's requests add up to its device energy, not a multiple of it."""
        loaded, mode, concurrency = self.loaded, self.mode, self.concurrency
        collector, engine = self.collector, self.engine
        result = ModeResult(mode, loaded.drafter_label if mode == "spec" else None, engine.policy.name)
        queue = list(range(len(prompts)))
        live: dict[int, tuple[int, datetime]] = {}  # seq_id -> (prompt index, wall start)
        finished: list[tuple[datetime, datetime]] = []  # wall windows a request in flight may overlap
        t_begin = time.perf_counter()

        def finish(seq: Sequence) -> None:
            idx, wall_start = live.pop(seq.seq_id)
            key = seq.request_id
            rec = collector.open.pop(key)
            collector.t0.pop(key)
            out = seq.output
            rec.output_tokens = len(out)
            rec.num_drafts, rec.num_draft_tokens, rec.num_accepted_tokens = seq.num_drafts, seq.num_draft_tokens, seq.num_accepted
            if seq.emit_times:
                rec.ttft_ms = (seq.emit_times[0] - seq.t_start) * 1000.0
                rec.e2e_ms = (seq.emit_times[-1] - seq.t_start) * 1000.0
            if energy_for is not None and rec.e2e_ms is not None:
                window = (wall_start, wall_start + timedelta(milliseconds=rec.e2e_ms))
                now = max(datetime.now(UTC), window[1])
                in_flight = [(start, now) for _, start in live.values()]
                rec.energy_j = energy_for([window, *[w for w in finished if w[1] > window[0]], *in_flight])
                first = min((start for _, start in live.values()), default=now)  # later requests start after now
                finished[:] = [w for w in [*finished, window] if w[1] > first]  # so only these can overlap them
            text = loaded.decode(out)
            for stop in params.stop:
                if stop in text:
                    text = text[: text.index(stop)]
            res = RequestResult(prompts[idx], list(out), text, rec, seq.finish_reason)
            result.results.append(res)
            if on_request is not None:
                on_request(res)

        try:
            while queue or engine.running:
                while queue and len(engine.running) < concurrency:
                    idx = queue.pop(0)
                    key = f"{mode}:{idx}"
                    wall_start = datetime.now(UTC)
                    t_start = time.perf_counter()
                    p = prompts[idx]
                    collector.begin(key, RequestRecord(started_at=wall_start, domain=p.domain, external_id=p.id,
                                                       prompt_tokens=len(encoded[idx]),
                                                       temperature=params.temperature, top_p=params.top_p,
                                                       top_k=params.top_k, seed=params.seed,
                                                       max_new_tokens=params.max_new_tokens), t_start)
                    seq = engine.add(encoded[idx], params, request_id=key, t_start=t_start, domain=p.domain)
                    live[seq.seq_id] = (idx, wall_start)
                    if seq.done:
                        finish(seq)
                for seq in engine.step():
                    finish(seq)
        except BaseException as exc:
            # Ctrl-C / SIGTERM (or a failure) mid-step: the requests in flight are recorded with their status
            if on_abandoned is not None:
                interrupted = isinstance(exc, KeyboardInterrupt)
                status = "cancelled" if interrupted else "error"
                error = ("cancelled: the benchmark was interrupted (Ctrl-C or SIGTERM)" if interrupted
                         else f"{type(exc).__name__}: {exc}"[:500])
                for rec in abandoned(collector, status, error):
                    on_abandoned(rec)
            raise
        result.wall_s = time.perf_counter() - t_begin
        result.results.sort(key=lambda r: prompts.index(r.prompt))
        return result


def abandoned(collector: _Collector, status: str, error: str) -> list[RequestRecord]:
    """The records of the requests still in flight, ended with `status` (as a server records a request it
    cancels): the tokens emitted until then, no energy (never attributed)."""
    out = []
    now = time.perf_counter()
    for key, rec in list(collector.open.items()):
        t0 = collector.t0.pop(key)
        rec.status, rec.error = status, error
        rec.output_tokens = len(rec.tokens)
        if rec.tokens:
            rec.ttft_ms = rec.tokens[0].emit_offset_ms
            rec.e2e_ms = rec.tokens[-1].emit_offset_ms
        else:
            rec.e2e_ms = (now - t0) * 1000.0
        out.append(rec)
    collector.open.clear()
    return out


def warm_up(loaded: Loaded, mode: str, encoded: Iterable[list[int]], params: SamplingParams | None = None) -> None:
    """One short untimed generation so first-call costs do not land on the first measured request. `params`: the
    sampling then measured (None: greedy), so that a sampled run's first-call costs of sampling (and, in spec, of
    rejection sampling) are paid here too; 8 tokens of it, without its stop strings."""
    first = next(iter(encoded))
    warm = SamplingParams(max_new_tokens=8) if params is None else replace(params, max_new_tokens=8, stop=())
    loaded.engine(mode, max_batch=1).generate(first, warm)


def default_node_id() -> str:
    return os.environ.get("SPECFINOPS_NODE_ID") or socket.gethostname()


def run_info(loaded: Loaded, mode: str, *, workload: str, params: SamplingParams | None, node_id: str,
             power_source: str, concurrency: int, kind: str = "bench", k_policy: str,
             invocation_id: str | None = None) -> RunInfo:
    """The run row of one mode. `params` None: each request brings its own sampling (a server), so the run
    records none and its requests record theirs. `invocation_id`: the command invocation's id, the same on every
    run it records (a bench's modes, turns and concurrency levels), so speedups pair its spec and AR runs; None
    for a server's runs (one per mode for the server's lifetime, each serving whatever requests arrive, not the
    same prompts in turns: nothing pairs them)."""
    return RunInfo(
        mode=mode, node_id=node_id, hostname=socket.gethostname(), device=device_name(), backend="torch",
        dtype=loaded.spec.dtype, target=str(loaded.target_dir), drafter=loaded.drafter_label if mode == "spec" else None,
        k_policy=k_policy, temperature=params.temperature if params else None, workload=workload,
        power_source=power_source, software_version=software_version(loaded.spec.dtype),
        top_p=params.top_p if params else None, concurrency=concurrency, kind=kind,
        top_k=params.top_k if params else None, seed=params.seed if params else None,
        max_new_tokens=params.max_new_tokens if params else None, invocation_id=invocation_id,
    )
