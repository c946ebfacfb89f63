"""`specfinops bench`: the same prompts through speculative decoding and the AR baseline, measured and recorded."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid

from app.commands._common import (
    DTYPE_HELP,
    MAX_K,
    add_command,
    add_db_option,
    check_max_k,
    check_power_options,
    check_recording_options,
    check_writable,
    context_len,
    local_target_option,
    lost_records,
    model_option,
    printable_name,
    sigterm_as_ctrl_c,
    store_opened_for,
)
from app.commands._interrupt import ctrl_c_once, interrupted_line, write_json
from app.commands._interrupt import table_file as _table_file
from app.errors import UsageError
from serving.context import context_overflow
from serving.lookahead import DEFAULT_K, VLLM_DEFAULT_K
from serving.workloads import FILE_FORMAT

DEFAULT_INTERLEAVE = 4  # prompts per turn: short enough that a drift of the machine's speed hits both modes

EXAMPLES = """  specfinops bench --workload code --mode both --limit 4
  specfinops bench --workload chat --drafter early-exit --early-exit-layers 12 --k 3
  specfinops bench --workload code --mode both --dtype float32 --temperature 0 --json out.json
  specfinops bench --workload code --limit 8 --json - | jq '.runs[] | {mode, tokens_per_s}'
  specfinops bench --workload code --mode both --tree 16:6:4:0.25
  specfinops bench --workload mixed --mode both --concurrency 1,4,16 --max-new-tokens 64
  specfinops bench --workload prompts.jsonl --target ~/models/my-llama --drafter draft --draft-model ~/models/my-draft
  specfinops bench --workload code --db postgresql://postgres@127.0.0.1/test --node-id gpu-node-3
  specfinops bench --backend vllm --workload code --mode both --power nvml --vllm-args '{"tensor_parallel_size": 2}'
"""

WORKLOAD_HELP = "builtin name (code, chat, rewrite, mixed) or a .jsonl path (or .txt: a prompt a line; format below)"
WORKLOAD_ALL = "all = mixed (every builtin domain, round-robin)"
# the epilog of the commands that read a workload: their examples, then what a workload file holds
WORKLOAD_EPILOG = "\n" + FILE_FORMAT


def register(sub) -> None:
    p = add_command(sub, "bench", "Run spec vs AR decoding on a workload, print a table, record telemetry.",
                    EXAMPLES + WORKLOAD_EPILOG, handle)
    p.add_argument("--workload", default="code", help=f"{WORKLOAD_HELP} (default: code); {WORKLOAD_ALL}")
    p.add_argument("--mode", choices=("spec", "ar", "both"), default="both",
                   help="speculative decoding, autoregressive, or both, compared: at concurrency 1 AR and spec take "
                        f"turns every {DEFAULT_INTERLEAVE} prompts (--interleave); at higher concurrency, or on "
                        "--backend vllm, all of AR, then all of spec")
    p.add_argument("--backend", choices=("torch", "vllm"), default="torch",
                   help="torch: the built-in engine (default); vllm: vLLM on GPUs (pip install 'specfinops[gpu]')")
    p.add_argument("--vllm-args", metavar="JSON", default=None,
                   help="extra vllm.LLM(...) keywords for --backend vllm, e.g. '{\"gpu_memory_utilization\": 0.8}'")
    p.add_argument("--drafter", default=None, help="draft | draft+ngram (prompt lookup where the context matches, the draft elsewhere) | early-exit | ngram (default: draft+ngram with the bundled target or a --draft-model, measured fastest; ngram with any other target)")
    p.add_argument("--k", default=None, help=f"lookahead: an integer K in 0..{MAX_K} (0 = no drafting), or "
                   f"heuristic | entropy | cost | auto (default: {DEFAULT_K}; on --backend vllm, which runs a fixed "
                   f"K: {VLLM_DEFAULT_K})")
    p.add_argument("--tree", default=None, metavar="NODES[:DEPTH[:WIDTH[:MIN_PROB]]]",
                   help="draft a token tree instead of one chain (EAGLE-2 style; feature draft or prompt lookup): "
                        "up to NODES nodes verified in one target forward, DEPTH levels (the lookahead; replaces --k), "
                        "WIDTH candidates grown per level, nodes the draft gives a path probability below MIN_PROB "
                        "skipped. Example: 16:6:4:0.25 (default: no tree)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the most likely tokens up to this "
                   "probability mass (1 = off)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the K most likely tokens only (0 = off)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="answer length cap per prompt (tokens)")
    p.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    p.add_argument("--seed", type=int, default=0, help="random seed of the sampling (a sampled spec run repeats "
                   "with a fixed --k: the auto policy picks K by the step times it measures, and each K draws "
                   "its own random numbers)")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of the workload (default: all prompts)")
    p.add_argument("--domain", default=None, help="only prompts of this domain (default: all domains)")
    p.add_argument("--concurrency", default="1", help="sequences in flight; a list like 1,2,4,8 runs a sweep")
    p.add_argument("--interleave", type=int, default=DEFAULT_INTERLEAVE, metavar="N",
                   help="with --mode both at concurrency 1: AR and spec take turns every N prompts (each turn "
                        "recorded as its own run), so a machine whose speed drifts during the benchmark (a "
                        "shared VM, a busy neighbour, thermal limits) slows both modes alike; 0 = all of AR, then "
                        f"all of spec (default: {DEFAULT_INTERLEAVE}). Higher concurrency always runs the modes one "
                        "after the other: a block would have to drain, which a loaded server never does")
    p.add_argument("--target", default=None, help="target model name or local HF directory (default: bundled)")
    p.add_argument("--draft-model", "--draft", dest="draft_model", default=None,
                   help="draft model directory, or specfinops-draft (the bundled draft), for --drafter draft or "
                        "draft+ngram (given alone: draft+ngram; --draft: as calibrate names it)")
    p.add_argument("--early-exit-layers", type=int, default=None,
                   help="target layers used by --drafter early-exit (default: 8, or half the layers of a target "
                        "with 8 or fewer)")
    p.add_argument("--max-len", type=context_len, default=2048,
                   help="context window used by the engine (tokens): a prompt and its answer share --max-len - 1 "
                        "positions (one is kept spare), so at most --max-len - 2 prompt tokens fit and a longer answer "
                        "is cut there (finish reason 'length')")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="write the results as JSON to PATH; '-': to stdout (the table then goes to stderr)")
    add_db_option(p)
    p.add_argument("--node-id", type=node_id, default=None,
                   help="node id recorded with the runs, up to 128 characters (default: $SPECFINOPS_NODE_ID, else the host name)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="do not record anything in the store (refused beside --db, --node-id, --power "
                        "nvml|rapl|estimate or --tdp-w, which only shape the record; --spec-max-batch auto still "
                        "reads --db)")
    p.add_argument("--spec-max-batch", default=None, metavar="N|auto",
                   help="speculate only while at most N sequences run together (AR above); 'auto' = below the "
                        "crossover of the latest recorded sweep for this target and drafter")
    p.add_argument("--power", default="auto", help="auto | nvml | rapl | estimate | none")
    p.add_argument("--tdp-w", type=float, default=None, help="TDP in watts of one device for --power estimate, "
                   "and --power auto's fallback where neither NVML nor RAPL can be read (on --backend vllm: where "
                   "NVML cannot); labelled estimate; a --backend vllm run counts it once per GPU it spans")


def node_id(text: str) -> str:
    """argparse type of --node-id: it is stored in runs.node_id (and sweeps.node_id), so no longer than that
    column (SQLite stores a longer one anyway; PostgreSQL refused it only when the first run was recorded, after
    the model had loaded, and without naming the option), and printable (`printable_name`)."""
    from telemetry.db import Run

    limit = Run.__table__.c.node_id.type.length
    if not text.strip():  # fell back to the hostname unsaid
        raise argparse.ArgumentTypeError("must not be empty (leave --node-id out for the hostname)")
    if len(text) > limit:
        raise argparse.ArgumentTypeError(f"must be at most {limit} characters (the store's runs.node_id), "
                                         f"got {len(text)}: {text[:20]!r}...")
    return printable_name(text)  # `cost --node` printed it back raw: a newline, a terminal escape sequence


def parse_concurrency(text: str) -> list[int]:
    """--concurrency: levels like 1,2,4 (a space after a comma allowed). An empty item ('1,,2', '4,') or a
    level given twice ('1,1', which ran twice and recorded a sweep of one level) is a typo: refused."""
    items = [x.strip() for x in str(text).split(",")]
    try:
        levels = [int(x) for x in items]
    except ValueError:
        raise ValueError(f"--concurrency must be integers like 1,2,4, got {text!r}") from None
    if not levels or any(n < 1 for n in levels):
        raise ValueError(f"--concurrency levels must be >= 1, got {text!r}")
    if len(set(levels)) < len(levels):
        twice = sorted({n for n in levels if levels.count(n) > 1})
        raise ValueError(f"--concurrency gives level {', '.join(map(str, twice))} more than once: {text!r}")
    return levels


def sampling_params(args: argparse.Namespace, **cutoffs):
    """SamplingParams of --temperature, --max-new-tokens and --seed (and `cutoffs`: bench's --top-k, --top-p),
    its refusal said under the option's name: "--top-p must be in (0, 1], got 2.0", where "top_p must be ..."
    named the engine's field (and "--top-p: top_p must be ..." both)."""
    from serving.sampling import SamplingParams

    try:
        return SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed,
                              **cutoffs)
    except ValueError as exc:
        field, _, rest = str(exc).partition(" ")
        raise UsageError(f"--{field.replace('_', '-')} {rest}") from None


def check_sampling_options(args: argparse.Namespace) -> None:
    """What the engine or the store would refuse only after the model loaded, without naming the option: a seed
    torch cannot take (failed at the first sampled token), a --top-k or --max-new-tokens past the 32-bit
    columns that record them (PostgreSQL: 'integer out of range' when the first run was recorded)."""
    # the seeds torch's generator takes (as the server checks them) and the store's 32-bit columns
    from serving.request_limits import SEED_MAX, SEED_MIN
    from telemetry.queries import MAX_NEW_TOKENS, MAX_TOP_K

    if not SEED_MIN <= args.seed <= SEED_MAX:
        raise UsageError(f"--seed must be within [{SEED_MIN}, {SEED_MAX}] (a 64-bit seed), got {args.seed}")
    top_k = getattr(args, "top_k", 0)  # calibrate has no --top-k
    for flag, value, limit in (("--top-k", top_k, MAX_TOP_K), ("--max-new-tokens", args.max_new_tokens,
                                                               MAX_NEW_TOKENS)):
        if value > limit:
            raise UsageError(f"{flag} must be at most {limit}, got {value}")


def check_k(k: str | None, max_len: int) -> None:
    """--k: a policy `parse_policy` takes, whose number (K, or a policy's K_max) fits the context window: more
    draft tokens than --max-len can never be verified (and `fixed:<30 digits>` overflowed runs.k_policy); and at
    most MAX_K, as calibrate's (bench and serve)."""
    from serving.lookahead import parse_policy

    if k is None:
        return
    try:
        parse_policy(k)
    except ValueError as exc:  # "k must be >= 0, got -1" / "unknown k policy 'abc'": said under --k
        raise UsageError(f"--k: {exc}") from None
    number = str(k).strip().rpartition(":")[2]
    if number.isdigit() and int(number) > max_len:
        raise UsageError(f"--k {k}: at most --max-len ({max_len}) draft tokens can be verified at once")
    if number.isdigit():  # as calibrate's --k and --k-max: more only spins, after the model has loaded
        check_max_k("--k", k, int(number))


MODEL_FREE_DRAFTERS = ("ngram", "early-exit")  # drafters that read no draft model


def drafter_for(drafter: str | None, draft_model: str | None, flag: str, otherwise, model_drafter: str = "draft+ngram"):
    """The drafter a run uses: the one named; with only a draft model named, `model_drafter` (draft+ngram: the
    draft with prompt lookup, as the bundled pair runs); with neither, `otherwise()`. A draft model beside a
    drafter that reads none is refused rather than silently left unused."""
    if draft_model is None:
        return drafter or otherwise()
    if drafter is None:
        return model_drafter
    if drafter in MODEL_FREE_DRAFTERS:
        raise UsageError(f"{flag} {draft_model}: --drafter {drafter} uses no draft model; drop {flag}, or use "
                         "--drafter draft or draft+ngram to run it")
    return drafter


# dest, flag: how speculative decoding runs (None: not given). --drafter / --draft-model name the model pair, which
# a script comparing modes passes alike, so an AR run takes them (and records no drafter)
SPEC_ONLY_OPTIONS = (("k", "--k"), ("tree", "--tree"), ("spec_max_batch", "--spec-max-batch"))


def check_combinations(args: argparse.Namespace) -> None:
    """Options that the run would silently ignore: speculation's with --mode ar, vLLM's on the torch engine."""
    if args.mode == "ar":
        given = [flag for dest, flag in SPEC_ONLY_OPTIONS if getattr(args, dest, None) is not None]
        if given:
            one = len(given) == 1
            raise UsageError(f"{', '.join(given)} shape{'s' if one else ''} speculative decoding, which --mode ar "
                             f"does not run: drop {'it' if one else 'them'}, or use --mode spec or both")
    if args.vllm_args is not None and args.backend != "vllm":
        raise UsageError("--vllm-args applies to --backend vllm; the torch engine (the default --backend) takes none")


def recording_options_given(args: argparse.Namespace) -> list[str]:
    """The options given that only shape what the bench records (`check_recording_options`): --db (unless
    --spec-max-batch auto reads its sweep there), --node-id, a power meter (--power nvml, rapl or estimate, and
    --tdp-w: without a recorder no meter is opened); --power none says what --no-telemetry does."""
    given = [flag for flag, on in (("--db", args.db is not None and args.spec_max_batch != "auto"),
                                   ("--node-id", args.node_id is not None),
                                   ("--power", args.power not in ("auto", "none")),
                                   ("--tdp-w", args.tdp_w is not None)) if on]
    return [f"--power {args.power}" if flag == "--power" else flag for flag in given]


def early_exit_layers(given: int | None, target: str | None, drafter: str) -> int:
    """--early-exit-layers, checked against the target before it loads; by default 8 (DEFAULT_EARLY_EXIT_LAYERS),
    or half the layers of a target that has no more than that (an early exit must stop before the last layer)."""
    from serving.models import resolve_model
    from serving.worker import DEFAULT_EARLY_EXIT_LAYERS

    if drafter != "early-exit":
        if given is not None:  # it would be silently ignored, as --draft beside a model-free drafter would be
            raise UsageError(f"--early-exit-layers applies to --drafter early-exit only; this run drafts with "
                             f"{drafter}: drop it, or give --drafter early-exit")
        return DEFAULT_EARLY_EXIT_LAYERS
    if given is not None and given < 1:
        raise UsageError(f"--early-exit-layers must be >= 1, got {given}")
    layers = json.loads((resolve_model(target, "target") / "config.json").read_text()).get("num_hidden_layers")
    if not isinstance(layers, int):
        return DEFAULT_EARLY_EXIT_LAYERS if given is None else given  # loading the target will say what is wrong
    if layers < 2:
        raise UsageError(f"--drafter early-exit needs a target of 2 layers or more; this one has {layers}")
    if given is None:
        return DEFAULT_EARLY_EXIT_LAYERS if layers > DEFAULT_EARLY_EXIT_LAYERS else layers // 2
    if given >= layers:
        raise UsageError(f"--early-exit-layers must be below the target's {layers} layers (the draft is its first "
                         f"N layers), got {given}")
    return given


def handle(args: argparse.Namespace) -> int:
    """The first Ctrl-C (or SIGTERM) stops the bench (`ctrl_c_once`): its run ends 'cancelled', the requests in
    flight recorded so, the table and --json of what ran are written, marked interrupted; exit status 130."""
    with ctrl_c_once(), sigterm_as_ctrl_c("bench: SIGTERM: stopping as on Ctrl-C"):
        return _handle(args)


def _handle(args: argparse.Namespace) -> int:
    from serving.workloads import load_workload

    # validate everything cheap before loading a model
    if args.json != "-":
        check_writable(args.json, "--json")
    check_combinations(args)
    check_power_options(args.power, args.tdp_w)
    check_recording_options(args.no_telemetry, recording_options_given(args))
    params = sampling_params(args, top_k=args.top_k, top_p=args.top_p)
    check_sampling_options(args)
    check_k(args.k, args.max_len)
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.interleave < 0:
        raise ValueError(f"--interleave must be >= 0 (0 = the modes one after the other), got {args.interleave}")
    levels = parse_concurrency(args.concurrency)
    from serving.workloads import canonical_workload

    args.workload = canonical_workload(args.workload)  # 'all' is recorded as 'mixed': the same prompts
    every = load_workload(args.workload, domain=args.domain)
    prompts = every[:args.limit] if args.limit is not None else every
    args.prompts_left_out = len(every) - len(prompts)  # what --limit left out (`small_sample_note`)
    if max(levels) > len(prompts):  # a level is recorded as its concurrency: one no prompt set could reach is not
        raise UsageError(f"--concurrency {max(levels)}: the bench has {len(prompts)} prompt"
                         f"{'s' if len(prompts) != 1 else ''} (--workload {args.workload}"
                         f"{f' --limit {args.limit}' if args.limit else ''}), so at most {len(prompts)} run at once "
                         "and the level would be recorded as a concurrency it never reached; lower it, or give "
                         "more prompts")
    modes = ["ar", "spec"] if args.mode == "both" else [args.mode]
    from serving.kernels import resolve_dtype

    chosen = args.dtype == "auto"
    args.dtype = resolve_dtype(args.dtype, args.backend, max_batch=max(levels))
    if args.backend == "vllm":
        local_target_option("--target", args.target)  # a feature draft named as the target; hub ids are vLLM's
        if args.tree is not None:
            raise ValueError("--tree runs on the torch engine; vLLM's speculative config chooses its own proposals")
        args.drafter = drafter_for(args.drafter, args.draft_model, "--draft-model", lambda: "ngram", model_drafter="draft")
        return _write_json(args, run_bench_vllm(args, prompts, params, modes, levels))

    from serving.worker import EngineSpec, default_drafter, say_thread_cap

    say_thread_cap()  # a junk MKL_NUM_THREADS / OMP_NUM_THREADS: a part of the machine measured, said before it
    target_dir = model_option("--target", args.target, "target")  # before any model loads, named by option
    drafter = drafter_for(args.drafter, args.draft_model, "--draft-model", lambda: default_drafter(args.target))
    model_option("--draft-model", args.draft_model, "draft")
    spec = EngineSpec(target=args.target, drafter=drafter, draft_model=args.draft_model,
                      early_exit_layers=early_exit_layers(args.early_exit_layers, args.target, drafter),
                      k=args.k or DEFAULT_K, dtype=args.dtype,
                      max_batch=max(levels), max_len=args.max_len, tree=args.tree)
    spec.validate()
    encoded = check_prompts_fit(args, target_dir, prompts)
    gate = args.spec_max_batch
    if gate is not None and gate != "auto" and (not str(gate).isdigit() or int(gate) < 1):
        raise ValueError(f"--spec-max-batch must be an integer >= 1 or 'auto', got {gate!r}")
    # the whole bench in the block: a store file made for it is removed again where it is refused or stopped (Ctrl-C,
    # SIGTERM) before its first run is recorded (loading, checking, warming up; `_write_json` raises the
    # KeyboardInterrupt that run_bench reported), kept once it holds one
    with store_opened_for(args.db, args.no_telemetry):
        loaded = _load_and_check(args, spec, prompts, encoded, params, gate, chosen, levels)
        report = run_bench(args, loaded, prompts, encoded, params, modes, levels)
        return _write_json(args, report)


def check_prompts_fit(args, target_dir, prompts) -> list[list[int]]:
    """Every prompt fits --max-len, checked with the target's tokenizer alone (it loads in a moment) before the
    models load: a prompt longer than the window was said only after the target had loaded. Returns the prompts'
    token ids, which the run then uses. The target's own positions (max_position_embeddings, or a shorter
    sliding_window), which may be fewer, are checked once it has loaded."""
    from serving.models import load_tokenizer, resolve_model
    from serving.worker import encode_prompt

    tokenizer = load_tokenizer(target_dir or resolve_model(None, "target"))
    encoded = [encode_prompt(tokenizer, p) for p in prompts]  # as the engine encodes them (its chat template)
    for p, ids in zip(prompts, encoded, strict=True):
        overflow = context_overflow(f"prompt {p.id} of --workload {args.workload}", len(ids), args.max_len,
                                    advice="drop it or raise --max-len")
        if overflow:
            raise UsageError(f"--max-len {args.max_len}: {overflow}")
    return encoded


def context_window(max_len: int, cfg) -> tuple[int, str]:
    """The engine's context (the lesser of --max-len and the target's positions) and what sets it, in words: the
    config.json field that limits the target (max_position_embeddings, or a shorter sliding_window) where that
    is the lesser."""
    if max_len < cfg.max_position:
        return max_len, f"--max-len {max_len}"
    more = f"; --max-len {max_len} is more" if max_len > cfg.max_position else ""
    return cfg.max_position, f"the target's {cfg.max_position} positions ({cfg.max_position_source}{more})"


def check_context(workload: str, prompts, encoded, ctx: int, window: str, advice: str) -> None:
    """Every prompt leaves room for an answer in the engine's context `ctx` (`window`: what sets it, in words);
    else a ValueError naming the prompt, the window and `advice` (what the command can do about it)."""
    for p, ids in zip(prompts, encoded, strict=True):
        overflow = context_overflow(f"prompt {p.id}", len(ids), ctx, window=window, advice=advice)
        if overflow:
            raise ValueError(f"--workload {workload}: {overflow}")


def _load_and_check(args, spec, prompts, encoded, params, gate, chosen: bool, levels: list[int]):
    """Load the models and check what needs them (the prompts' lengths against the target's positions, a gate
    read from a sweep); `encoded`: the prompts' token ids (check_prompts_fit)."""
    from serving.worker import load

    if chosen and args.dtype == "float32" and args.backend == "torch" and 1 in levels:
        from serving.kernels import AUTO_BF16_MAX_BATCH, emulated_bf16_pays

        why = (f"concurrency up to {max(levels)} is past {AUTO_BF16_MAX_BATCH}, where emulated bf16 loses"
               if emulated_bf16_pays(1) else "the C bf16 kernel is unavailable or off here")
        print(f"note: float32 chosen for every level: this CPU has no bf16 instructions and {why}; at concurrency "
              "1 bfloat16 can still be faster (AR 1.5x, spec 2x on an AVX2 EPYC). To price the low levels in "
              "bfloat16, run them separately with `--dtype bfloat16`.", file=sys.stderr)
    print(f"loading target ({args.dtype}) ...", file=sys.stderr)
    loaded = load(spec)
    if gate is not None:
        loaded.spec.spec_max_batch = resolve_spec_max_batch(gate, args.db, loaded)
    # the engine's context: --max-len, or the target's positions where it has fewer (the engine keeps the lesser)
    ctx, window = context_window(spec.max_len, loaded.target.cfg)
    check_context(args.workload, prompts, encoded, ctx, window,
                  "drop it or raise --max-len" if ctx < loaded.target.cfg.max_position
                  else "drop it (the target holds no more positions, whatever --max-len)")
    # the prompt and its answer share ctx - 1 positions: a longer answer is cut there, finish reason 'length'
    capped = [len(ids) for ids in encoded if len(ids) + params.max_new_tokens > ctx - 1]
    if capped:
        print(f"note: --max-new-tokens {params.max_new_tokens} does not fit {window} after "
              f"{len(capped)} of {len(encoded)} prompts (the longest {max(capped)} tokens): their answers stop at "
              f"{ctx - 1} tokens of prompt and answer, finish reason 'length'", file=sys.stderr)
    return loaded


def resolve_spec_max_batch(gate: str, db_url: str | None, loaded) -> int | None:
    """An explicit N, or from the latest recorded sweep: speculate below its crossover."""
    if gate != "auto":
        return int(gate)
    from telemetry.store import NoStoreError, open_store
    from telemetry.sweeps import latest_sweep

    try:  # only read: with --no-telemetry a missing store was created (empty) just to find no sweep in it
        store = open_store(db_url, must_exist=True)
    except NoStoreError as exc:
        raise UsageError(f"--spec-max-batch auto reads the latest recorded sweep: {exc}") from None
    try:  # disposed of: an open connection keeps a store bench made and then refused (store_opened_for)
        sweep = latest_sweep(store, target=str(loaded.target_dir), drafter=loaded.drafter_label)
        unmarked = re.sub(r"#[0-9a-f]{8}(?=[@+]|$)", "", loaded.drafter_label or "")
        if sweep is None and unmarked != loaded.drafter_label:  # swept before labels named the draft's weights
            sweep = latest_sweep(store, target=str(loaded.target_dir), drafter=unmarked)
            if sweep is not None:
                print(f"sweep {sweep.id} was recorded as {unmarked}, before drafter labels named the draft's "
                      "weights: it may be another draft of that folder name; rerun the sweep to be sure",
                      file=sys.stderr)
    finally:
        store.dispose()
    if sweep is None:
        raise ValueError(
            f"--spec-max-batch auto: no concurrency sweep recorded for {loaded.drafter_label} on this target; "
            "run `specfinops bench --mode both --concurrency 1,2,4,8,16,32` first"
        )
    if sweep.crossover_concurrency is None:
        print(f"sweep {sweep.id}: speculation paid at every measured level; not gated", file=sys.stderr)
        return None
    limit = sweep.crossover_concurrency - 1
    if limit < 1:  # it lost at the lowest level measured: speculating there is what the sweep measured losing
        print(f"sweep {sweep.id}: speculation paid at no measured level (it lost from concurrency "
              f"{sweep.crossover_concurrency}); not speculating: every step decodes as AR", file=sys.stderr)
        return 0
    print(f"sweep {sweep.id}: crossover at concurrency {sweep.crossover_concurrency}; "
          f"speculating while <= {limit} sequences run", file=sys.stderr)
    return limit


def table_file(args: argparse.Namespace):
    """Where the table goes: stdout, unless the JSON goes there (`--json -`): then stderr, beside the progress."""
    return _table_file(args.json)


def _write_json(args: argparse.Namespace, report: dict) -> int:
    """--json (with the records the runs lost, `dropped_records`); a warning and exit status 1 where they lost any;
    then, where the bench was interrupted (the table and JSON hold what ran), KeyboardInterrupt again: the exit
    status stays 130 (app.cli)."""
    inv = report.get("invocation_id")
    lost, warning = lost_records(args.db, inv)
    if inv is not None:
        report["dropped_records"] = lost  # None: the store could not be read to count them
    write_json(args.json, report, say_wrote=True)
    if warning:  # never silent: the store holds less than the table, or cannot be read to tell
        print(warning, file=sys.stderr)
    if report.get("interrupted"):
        raise KeyboardInterrupt
    return 1 if warning else 0


def run_bench_vllm(args, prompts, params, modes, levels) -> dict:
    """--backend vllm: serving.vllm_backend runs and records; the report and table are the same as torch's.
    Ctrl-C / SIGTERM: the (mode, level) runs that completed are reported, marked interrupted; the stopped one,
    whose result vLLM gives only at its end, is named in the notes (and `stopped_run` of the JSON)."""
    from serving.vllm_backend import BenchInterrupted, config_from_options, import_vllm, run_bench
    from serving.worker import default_node_id

    import_vllm()  # says what to install before anything else is checked
    config = config_from_options(target=args.target, drafter=args.drafter, draft_model=args.draft_model,
                                 k=args.k or VLLM_DEFAULT_K,
                                 dtype=args.dtype, max_len=args.max_len, seed=args.seed, engine_args=args.vllm_args)
    print(f"loading {config.target} on vLLM ({args.dtype}) ...", file=sys.stderr)
    invocation_id = uuid.uuid4().hex  # every run of this command: speedups pair its spec and AR runs
    try:
        results, view = run_bench(config, prompts, params, modes, levels, workload=args.workload,
                                  node_id=args.node_id or default_node_id(), power=args.power, tdp_w=args.tdp_w,
                                  db_url=args.db, record=not args.no_telemetry, invocation_id=invocation_id)
        stop = None
    except BenchInterrupted as exc:
        results, view, stop = exc.results, exc.view, exc
    for _, res in results:
        span_wall(res)
    report = build_report(results, view, params)
    report["invocation_id"] = None if args.no_telemetry else invocation_id
    for run, (_, res) in zip(report["runs"], results, strict=True):
        run["backend"], run["accepted_per_pos"] = "vllm", list(res.accepted_per_pos)
    if stop is not None:
        report["interrupted"] = True
        report["requests_done"] = sum(len(res.results) for _, res in results)
        report["requests_planned"] = len(prompts) * len(modes) * len(levels)
        report["cancelled_run_ids"] = stop.cancelled_run_ids
        cut = stop.stopped
        report["stopped_run"] = None if cut is None else {
            "mode": cut.mode, "concurrency": cut.concurrency, "run_id": cut.run_id, "requests_done": cut.requests_done}
        for run in report["runs"]:
            run["interrupted"] = False  # every row is a run that completed
        if len(modes) == 2:  # a level that ran in one mode only: no speedup ('—'), as a cut level of torch's
            by_level = report["speedup_by_concurrency"]
            for level in dict.fromkeys(level for level, _ in results):
                by_level.setdefault(str(level), None)
            report["speedup_by_concurrency"] = dict(sorted(by_level.items(), key=lambda kv: int(kv[0])))
    unread = store_figures(report, args.db)
    print_table(report, not args.no_telemetry, file=table_file(args), left_out=args.prompts_left_out)
    if unread:
        print(unread, file=sys.stderr)
    return report


PIPE_REFRESH_S = 10.0  # progress into a pipe or a log file: an update every this many seconds, not every request


def progress_refresh_s() -> float:
    """How often progress on stderr is redrawn: live on a terminal; into a pipe or a log file (where every
    redraw is kept, a bench at concurrency 32 wrote ten a second) every PIPE_REFRESH_S."""
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        tty = False
    return 0.1 if tty else PIPE_REFRESH_S


def progress_bar(total: int, desc: str):
    """A bench level's progress on stderr (requests done), redrawn at most every `progress_refresh_s`."""
    from tqdm import tqdm

    every = progress_refresh_s()
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, leave=False, mininterval=every,
                maxinterval=max(every, 10.0))


def turns(n_prompts: int, modes: list[str], level: int, interleave: int) -> list[tuple[str, range]]:
    """(mode, prompt indices) in the order they run: with both modes at concurrency 1 and interleave N > 0,
    AR then spec on each block of N prompts; otherwise each mode on every prompt, one after the other."""
    if interleave > 0 and len(modes) == 2 and level == 1:
        return [(m, range(i, min(i + interleave, n_prompts))) for i in range(0, n_prompts, interleave) for m in modes]
    return [(m, range(n_prompts)) for m in modes]


class TurnInterrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM stopped a turn: `partial` holds the requests it finished until then (its run, ended
    'cancelled' in the store, holds them too, beside those in flight, recorded 'cancelled')."""

    def __init__(self, partial):
        super().__init__()
        self.partial = partial


def run_bench(args, loaded, prompts, encoded, params, modes, levels) -> dict:
    """Run each concurrency level in each mode, record it, print the table; return the JSON report. Ctrl-C /
    SIGTERM: the levels that ran, and what the stopped one finished, are reported, marked interrupted."""
    from serving.worker import ModeResult, ModeRunner, default_node_id, run_info, warm_up
    from telemetry.power import detect_power_source

    recorder = None
    if not args.no_telemetry:
        from telemetry.recorder import Recorder
        from telemetry.store import open_store

        recorder = Recorder(open_store(args.db))
    # --no-telemetry: no energy is recorded, so no meter is opened (nor a warning given that none can be)
    try:
        source = detect_power_source("none") if recorder is None else detect_power_source(args.power,
                                                                                          tdp_w=args.tdp_w)
    except BaseException:  # no meter (--power nvml without a GPU): the recorder stopped, its engine disposed of
        if recorder is not None:
            try:
                recorder.close()
            finally:
                recorder.engine.dispose()
        raise
    node_id = args.node_id or default_node_id()
    # one id on every run this command records (modes, turns, concurrency levels): speedups pair its spec and
    # AR runs, measured under the same machine conditions, instead of pooling them with other invocations' runs
    invocation_id = uuid.uuid4().hex
    results = []
    cut: ModeResult | None = None  # the turn Ctrl-C stopped (None: stopped between turns, or not stopped)
    cut_level = None  # the level it stopped, whose turns did not all run
    interrupted = False
    try:
        for mode in modes:
            warm_up(loaded, mode, encoded, params)
        for level in levels:
            runners = {mode: ModeRunner(loaded, mode, level) for mode in modes}  # one engine per mode and level
            merged: dict[str, ModeResult] = {}
            plan = turns(len(prompts), modes, level, args.interleave)
            bar = progress_bar(sum(len(ix) for _, ix in plan), f"{'+'.join(modes)} c={level}")
            try:
                for mode, ix in plan:
                    bar.set_postfix(mode=mode, refresh=False)
                    try:
                        res = _run_turn(args, loaded, runners[mode], recorder, source, node_id, params, level,
                                        [prompts[i] for i in ix], [encoded[i] for i in ix], bar, invocation_id)
                    except TurnInterrupted as exc:
                        res, cut, cut_level, interrupted = exc.partial, exc.partial, level, True
                    if mode in merged:
                        merged[mode].absorb(res)
                    else:
                        merged[mode] = res
                    if interrupted:
                        break
            except KeyboardInterrupt:  # between turns
                cut_level, interrupted = level, True
            finally:
                bar.close()
            results.extend((level, merged[mode]) for mode in modes if mode in merged)
            if interrupted:
                break
    except KeyboardInterrupt:  # in the warm-up, or making a level's engines
        interrupted = True
    finally:
        try:
            if recorder:
                recorder.close()
        finally:
            if recorder:  # its pooled connections closed: a store it recorded nothing in can be removed
                recorder.engine.dispose()  # (store_opened_for), which one open connection keeps (in use)
            source.close()
    report = build_report(results, loaded, params, cut_level=cut_level)
    report["interleave"] = args.interleave if len(modes) == 2 and 1 in levels else 0
    report["invocation_id"] = invocation_id if recorder is not None else None
    unread = None
    if recorder is not None:
        try:  # the figures the store gives the runs just recorded (`store_figures`)
            unread = store_figures(report, args.db)
        except KeyboardInterrupt:  # stopped while it was read: the bench's own figures, no sweep
            interrupted = True
    sweep = recorder is not None and len(levels) > 1 and len(modes) == 2
    if sweep and not interrupted:
        from telemetry.store import open_store
        from telemetry.sweeps import record_sweep

        info = run_info(loaded, "spec", workload=args.workload, params=params, node_id=node_id,
                        power_source=source.source, concurrency=1, k_policy=loaded.spec.k_policy("spec"))
        try:  # one transaction: stopped, it records nothing
            sweep_id, cross, _ = record_sweep(
                open_store(args.db), node_id=node_id, device=info.device, target=info.target,
                drafter=info.drafter, k_policy=info.k_policy, workload=args.workload, dtype=info.dtype,
                run_ids=[rid for _, res in results for rid in res.run_ids])
            report["sweep_id"], report["crossover_concurrency"] = sweep_id, cross
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        report["interrupted"] = True
        report["requests_done"] = sum(len(res.results) for _, res in results)
        report["requests_planned"] = len(prompts) * len(modes) * len(levels)
        report["cancelled_run_ids"] = list(cut.run_ids) if cut is not None else []
        if sweep:
            report["sweep_id"] = None  # not recorded: its levels did not all run
        for run in report["runs"]:
            run["interrupted"] = cut is not None and run["concurrency"] == cut_level and run["mode"] == cut.mode
    print_table(report, recorder is not None, file=table_file(args), left_out=args.prompts_left_out)
    if unread:
        print(unread, file=sys.stderr)
    return report


def _run_turn(args, loaded, runner, recorder, source, node_id, params, level, prompts, encoded, bar,
              invocation_id: str | None = None):
    """One recorded run: `prompts` through `runner`'s mode, its power sampled while it runs. Ctrl-C / SIGTERM:
    TurnInterrupted, with the requests finished until then, timed until the last of them finished."""
    from serving.worker import ModeResult, run_info
    from telemetry.recorder import recorded_run

    mode = runner.mode
    k_policy = loaded.spec.k_policy(mode)
    if mode == "spec" and loaded.spec.spec_max_batch is not None:
        k_policy += f"|batch<={loaded.spec.spec_max_batch}"
    info = run_info(loaded, mode, workload=args.workload, params=params, node_id=node_id,
                    power_source=source.source, concurrency=level, k_policy=k_policy, invocation_id=invocation_id)
    partial = ModeResult(mode, loaded.drafter_label if mode == "spec" else None, k_policy)
    t_begin = t_last = time.perf_counter()
    try:
        with recorded_run(recorder, source, info) as (run_id, sampler):
            partial.run_ids = [run_id] if run_id is not None else []

            def energy_for(windows):
                sampler.sample_now()  # cover the request's end: a request shorter than the interval
                return sampler.energy_share_j(windows)  # would otherwise have no reading after it

            def on_request(res):
                nonlocal t_last
                if recorder:
                    recorder.record_request(run_id, res.record)
                partial.results.append(res)  # recorded: what a stopped turn reports
                t_last = time.perf_counter()
                bar.update(1)

            def on_abandoned(rec):  # in flight when Ctrl-C / SIGTERM stopped the run: recorded 'cancelled'
                if recorder:
                    recorder.record_request(run_id, rec)

            t_begin = t_last = time.perf_counter()
            res = runner.run(prompts, encoded, params, on_request=on_request, energy_for=energy_for,
                             on_abandoned=on_abandoned)
    except KeyboardInterrupt:
        partial.results.sort(key=lambda r: prompts.index(r.prompt))
        partial.wall_s = t_last - t_begin
        span_wall(partial)
        raise TurnInterrupted(partial) from None
    res.run_ids = list(partial.run_ids)
    span_wall(res)
    return res


def span_wall(res) -> None:
    """The run's wall seconds by the store's rule (`telemetry.records.requests_span_s`): its first request's start
    to its last one's end. The bench's own clock (the turn from its start to its end) also counted the time before
    its first request began, in every turn of an interleaved bench, so its tokens/s and speedup were not the ones
    the store gives the same runs (1.33x printed, 1.32x in `invocations`). Kept where no request has an end."""
    from telemetry.records import requests_span_s

    res.wall_s = requests_span_s(r.record for r in res.results) or res.wall_s


def store_figures(report: dict, db: str | None) -> str | None:
    """A recorded bench's tokens/s and wall seconds per row and its speedup per level, read back from the store for
    its invocation: those of `queries.mode_summaries` over the row's runs and of `queries.speedups` over the
    invocation, what `invocations`, `cost --invocation`, the dashboard and the reports show for it, to the last
    digit (the records the store lost, and those of requests a Ctrl-C cut, count there as everywhere else). A
    level without a speedup (interrupted: the modes ran different prompts) stays without. Where the store cannot be
    read, the figures stay the bench's own, by the same span rule (`span_wall`), and the warning returned says so.
    Also the runs other commands recorded on this node meanwhile (`invocations.overlapping_runs`), warned of."""
    inv = report.get("invocation_id")
    if inv is None:
        return None
    from telemetry.invocations import overlap_text, overlapping_runs
    from telemetry.queries import Filters, mode_summaries, speedups
    from telemetry.store import open_store

    engine = None
    try:
        engine = open_store(db, must_exist=True)
        rows = [mode_summaries(engine, Filters(run_ids=tuple(run["run_ids"]))) if run["run_ids"] else []
                for run in report["runs"]]
        by_level = {s.concurrency: s for s in speedups(engine, Filters(invocation_id=inv))}
        neighbours = overlapping_runs(engine, inv)
    except Exception as exc:  # noqa: BLE001 - said, not raised: what ran must still be reported
        return (f"warning: could not read invocation {inv[:8]} back from the store ({type(exc).__name__}); the "
                "tokens/s and speedups above are the bench's own and may differ from `invocations` in the last digit")
    finally:
        if engine is not None:
            engine.dispose()
    for run, found in zip(report["runs"], rows, strict=True):
        stats = found[0].stats if found else None
        run["tokens_per_s"], run["wall_s"] = (stats.tokens_per_s, stats.wall_s) if stats else (None, None)
    levels = report["speedup_by_concurrency"]
    compared = [level for level, speedup in levels.items() if speedup is not None]
    from telemetry.finops import speedup_over_acceptance_text

    warnings = {}
    for level in compared:
        found = by_level.get(int(level))
        levels[level] = found.speedup if found else None
        text = found and speedup_over_acceptance_text(found.speedup, found.mean_acceptance_length)
        if text:  # judged on the store's figures, as `invocations` judges them
            warnings[level] = text
    report["speedup_warnings"] = warnings
    report["overlapping_run_ids"] = [r.id for r in neighbours]
    report["overlap_warning"] = overlap_text(neighbours)
    if report.get("speedup") is not None:  # the lowest level's, as build_report gives it
        report["speedup"] = levels[min(compared, key=int)]
    return None


def build_report(results, loaded, params, cut_level: int | None = None) -> dict:
    """The JSON report of `results` ((level, ModeResult) pairs). `cut_level`: the level Ctrl-C stopped, whose
    modes may have run different prompts: no speedup there, and the identical rate over the prompts both ran."""
    from telemetry.finops import speedup_over_acceptance_text
    from telemetry.queries import percentile

    runs = []
    by_level: dict[int, dict[str, object]] = {}
    for level, res in results:
        by_level.setdefault(level, {})[res.mode] = res
        tpots = [r.tpot_ms for r in res.results if r.tpot_ms is not None]
        ttfts = [r.record.ttft_ms for r in res.results if r.record.ttft_ms is not None]
        runs.append({
            # k: the lookahead as given (an integer K or a policy name such as "auto"), a string in both modes
            "mode": res.mode, "drafter": res.drafter, "k": str(loaded.spec.k) if res.mode == "spec" else "0",
            "tree": loaded.spec.tree if res.mode == "spec" else None,
            "dtype": loaded.spec.dtype, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "seed": params.seed, "max_new_tokens": params.max_new_tokens, "concurrency": level,
            "run_id": res.run_id, "run_ids": list(res.run_ids),
            "tokens_per_s": res.tokens_per_s, "output_tokens": res.output_tokens,
            "wall_s": res.wall_s, "acceptance_rate": res.acceptance_rate,
            "mean_acceptance_length": res.mean_acceptance_length,
            "ttft_p50_ms": percentile(ttfts, 50), "tpot_p50_ms": percentile(tpots, 50),
            "tpot_p95_ms": percentile(tpots, 95),
            "requests": [{
                "id": r.prompt.id, "domain": r.prompt.domain, "output_token_ids": r.output_ids,
                "output_text": r.output_text, "ttft_ms": r.record.ttft_ms, "tpot_ms": r.tpot_ms,
                "e2e_ms": r.record.e2e_ms, "finish_reason": r.finish_reason,
            } for r in res.results],
        })
    speedups = {}
    for level, modes in by_level.items():
        ar, sp = modes.get("ar"), modes.get("spec")
        if ar and sp:
            cut = level == cut_level
            entry = {"speedup": (sp.tokens_per_s / ar.tokens_per_s)
                     if ar.tokens_per_s and sp.tokens_per_s and not cut else None}
            if params.greedy:
                if cut:  # the prompts both modes finished
                    spec_ids = {r.prompt: r.output_ids for r in sp.results}
                    pairs = [(a.output_ids, spec_ids[a.prompt]) for a in ar.results if a.prompt in spec_ids]
                else:
                    pairs = [(a.output_ids, s.output_ids) for a, s in zip(ar.results, sp.results, strict=True)]
                entry["token_identical_rate"] = sum(a == s for a, s in pairs) / len(pairs) if pairs else None
            speedups[level] = entry
    for run in runs:
        extra = speedups.get(run["concurrency"], {})
        run["token_identical_rate"] = extra.get("token_identical_rate") if run["mode"] == "spec" else None
    first = speedups.get(min(speedups)) if speedups else None
    return {
        "runs": runs,
        "speedup": first["speedup"] if first else None,
        "speedup_by_concurrency": {str(k): v["speedup"] for k, v in speedups.items()},
        # per level whose speedup is above its spec run's mean acceptance length: why it cannot be (the table's
        # warning); {} where none is
        "speedup_warnings": {str(k): text for k, v in speedups.items()
                             if (text := speedup_over_acceptance_text(v["speedup"],
                                                                      by_level[k]["spec"].mean_acceptance_length))},
        "target": str(loaded.target_dir),
    }


def _fmt(x, spec=".1f", dash="—") -> str:
    return dash if x is None else format(x, spec)


def _run_label(run: dict) -> str:
    """The run's id, or the runs its turns were recorded as (all of them in the JSON's run_ids)."""
    ids = run.get("run_ids") or ([run["run_id"]] if run.get("run_id") is not None else [])
    if not ids:
        return "-"
    return ",".join(map(str, ids)) if len(ids) <= 2 else f"{len(ids)} runs"


TABLE_COLUMNS = (  # header, alignment (< left, > right), narrowest width, cell of a run
    ("mode", "<", 5, lambda r: r["mode"]),
    ("drafter", "<", 14, lambda r: r["drafter"] or "-"),
    ("K", ">", 3, lambda r: f"tree {r['tree']}" if r.get("tree") else str(r["k"])),
    ("conc", ">", 4, lambda r: str(r["concurrency"])),
    ("tok/s", ">", 7, lambda r: _fmt(r["tokens_per_s"])),
    ("TTFT p50", ">", 9, lambda r: _fmt(r["ttft_p50_ms"])),
    ("TPOT p50", ">", 9, lambda r: _fmt(r["tpot_p50_ms"])),
    ("TPOT p95", ">", 9, lambda r: _fmt(r["tpot_p95_ms"])),
    ("accept", ">", 7, lambda r: _fmt(r["acceptance_rate"], ".3f")),
    ("mean acc len", ">", 12, lambda r: _fmt(r["mean_acceptance_length"], ".2f")),
    ("identical", ">", 9, lambda r: _fmt(r["token_identical_rate"], ".0%")),
    ("run", ">", 5, _run_label),
)


def table_lines(runs: list[dict]) -> list[str]:
    """The runs as a table whose every column is as wide as its widest cell (a drafter label such as
    'draft:my-draft@int8+ngram:3-2' or a sweep's run list no longer pushes the columns after it out of line)."""
    cells = [[cell(r) for *_, cell in TABLE_COLUMNS] for r in runs]
    widths = [max([narrowest, len(head), *(len(row[i]) for row in cells)])
              for i, (head, _, narrowest, _) in enumerate(TABLE_COLUMNS)]
    aligns = [align for _, align, *_ in TABLE_COLUMNS]

    def line(values) -> str:
        return " ".join(f"{v:{a}{w}}" for v, a, w in zip(values, aligns, widths, strict=True))

    head = line([head for head, *_ in TABLE_COLUMNS])
    return [head, "-" * len(head), *(line(row) for row in cells)]


def print_table(report: dict, recorded: bool, file=None, left_out: int = 0) -> None:
    """The bench's table and notes. `left_out`: the workload's prompts --limit left out (`small_sample_note`)."""
    out = file or sys.stdout
    stopped = report.get("interrupted", False)
    if stopped and recorded and not _any_run_recorded(report):  # stopped while loading: no run was opened
        recorded = False
        print("stopped before its first run: nothing recorded in the store", file=out)
    if stopped:
        print(interrupted_line(report["requests_done"], report["requests_planned"], "requests"), file=out)
    for text in table_lines(report["runs"]):
        print(text, file=out)
    for level, sp in report["speedup_by_concurrency"].items():
        rows = [r for r in report["runs"] if str(r["concurrency"]) == level]
        cut = stopped and any(r.get("interrupted") for r in rows)
        alone = stopped and len(rows) == 1  # --backend vllm: the other mode's run at this level did not complete
        print(f"speedup spec vs AR at concurrency {level}: "
              + ("— (interrupted: the modes did not finish the same prompts)" if cut
                 else f"— (interrupted: only {rows[0]['mode']} completed this level)" if alone
                 else f"{_fmt(sp, '.2f')}x"),
              file=out)
        above = report.get("speedup_warnings", {}).get(level)
        if above and not cut and not alone:
            print(f"warning: concurrency {level}: {above}", file=out)
    if report.get("overlap_warning"):
        print(f"warning: {report['overlap_warning']}", file=out)
    small = small_sample_note(report, left_out)
    if small:
        print(small, file=out)
    if stopped:
        for note in interrupted_notes(report, recorded):
            print(note, file=out)
    if "crossover_concurrency" in report:
        cross = report["crossover_concurrency"]
        print(f"sweep {report['sweep_id']}: " + (f"speculation stops paying at concurrency {cross}" if cross
              else "speculation paid at every measured concurrency"), file=out)
    print("times in ms; TPOT = (E2E - TTFT) / (output tokens - 1); acceptance = accepted / drafted tokens", file=out)
    if recorded:
        inv = report.get("invocation_id") or ""
        print(f"recorded in the store as invocation {inv}: its costs with `specfinops cost --invocation {inv[:8]}`; "
              "every bench with `specfinops invocations` and `specfinops dashboard`", file=out)


def _any_run_recorded(report: dict) -> bool:
    """Whether an interrupted bench recorded a run: one in its table, one it ended 'cancelled', or the run vLLM was
    stopped in."""
    stopped = report.get("stopped_run") or {}
    return bool(report["runs"] or report.get("cancelled_run_ids") or stopped.get("run_id") is not None)


def small_sample_note(report: dict, left_out: int = 0) -> str | None:
    """Where a level's speedup rests on fewer requests per mode than costing.MIN_STABLE_REQUESTS (a --limit of
    2 read 4.72x and then 0.80x on a loaded machine), one line saying so; None where every compared level has
    enough, or nothing was compared. Its remedy: the `left_out` prompts of the workload that --limit left out,
    where it left some out; else (no --limit, or one the workload did not exceed) a workload of more prompts."""
    from telemetry.costing import MIN_STABLE_REQUESTS

    counts = {}
    for level, speedup in report["speedup_by_concurrency"].items():
        if speedup is None:  # no speedup shown at this level (interrupted, a mode missing): nothing rests on it
            continue
        for run in report["runs"]:
            if str(run["concurrency"]) == level:
                counts[(level, run["mode"])] = counts.get((level, run["mode"]), 0) + len(run["requests"])
    fewest = min(counts.values(), default=None)
    if fewest is None or fewest >= MIN_STABLE_REQUESTS:
        return None
    remedy = (f"a run without --limit also measures the {left_out} prompt{'' if left_out == 1 else 's'} of the "
              "workload it left out" if left_out > 0
              else "no --limit left a prompt out: a workload of more prompts steadies it")
    return (f"note: a speedup above rests on {fewest} request{'' if fewest == 1 else 's'} per mode: too few to be "
            f"stable (under {MIN_STABLE_REQUESTS}; one slow request, or another process on the machine, moves it); "
            + remedy)


def interrupted_notes(report: dict, recorded: bool) -> list[str]:
    """What an interrupted table holds, and what the store holds of it."""
    if "stopped_run" in report:
        return _vllm_interrupted_notes(report, recorded)
    notes = []
    for run in report["runs"]:
        if run.get("interrupted"):
            notes.append(f"{run['mode']} c={run['concurrency']} was interrupted (Ctrl-C or SIGTERM): its row counts "
                         f"the {len(run['requests'])} request(s) finished until then")
    if recorded:
        cancelled = report.get("cancelled_run_ids") or []
        notes.append("in the store: "
                     + (f"run {', '.join(map(str, cancelled))} ended 'cancelled', with these requests and those in "
                        "flight (recorded 'cancelled'); the others 'completed'" if cancelled
                        else "the runs above 'completed'")
                     + ("; no sweep recorded" if "sweep_id" in report and report["sweep_id"] is None else ""))
    return notes


def _vllm_interrupted_notes(report: dict, recorded: bool) -> list[str]:
    """--backend vllm: every row is a run that completed; the stopped run, whose result vLLM gives only at its
    end, is not in the table, but the store holds what it finished."""
    stopped = report["stopped_run"]
    if stopped is None:
        notes = ["stopped between runs (Ctrl-C or SIGTERM): the table holds the runs that completed"]
    else:
        notes = [f"{stopped['mode']} c={stopped['concurrency']} was interrupted (Ctrl-C or SIGTERM): not in the "
                 "table (a vLLM run reports at its end); the rows above are the runs that completed"]
    if recorded:
        if stopped is not None and stopped["run_id"] is not None:
            notes.append(f"in the store: run {stopped['run_id']} ({stopped['mode']} c={stopped['concurrency']}) "
                         f"ended 'cancelled', with the {stopped['requests_done']} request(s) it finished until then "
                         "and those in flight (recorded 'cancelled'); the runs above 'completed'")
        else:
            notes.append("in the store: the runs above 'completed'")
    return notes
