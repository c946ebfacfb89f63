"""`specfinops calibrate`: is this draft good enough for this target, per domain?"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from app.commands._common import (
    DTYPE_HELP,
    MAX_K,
    add_command,
    add_db_option,
    check_max_k,
    check_recording_options,
    model_option,
)
from app.commands.bench import WORKLOAD_ALL, WORKLOAD_EPILOG, WORKLOAD_HELP

EXAMPLES = """  specfinops calibrate                                   # bundled pair (draft+ngram), all builtin domains
  specfinops calibrate --workload code --limit 8 --json
  specfinops calibrate --target ~/models/llama --draft ~/models/llama-draft --workload prompts.jsonl
  specfinops calibrate --drafter ngram --threshold 0.5
  specfinops calibrate --drafter early-exit --early-exit-layers 12 --workload code
  specfinops calibrate --workload code --drafter draft+ngram --max-new-tokens 256   # alpha along longer answers
  specfinops calibrate --workload chat --temperature 0.7 --seed 1   # alpha at the temperature you serve
  specfinops calibrate --workload code --limit 4 --db postgresql://postgres@127.0.0.1/test   # recorded there
  specfinops calibrate --workload code --limit 4 --no-telemetry   # print only, record nothing
"""


def register(sub) -> None:
    p = add_command(sub, "calibrate", "Measure alpha, mean acceptance length and c per domain; pick K; GO / NO-GO.",
                    EXAMPLES + WORKLOAD_EPILOG, handle)
    p.add_argument("--target", default=None, help="target model name or directory (default: bundled)")
    p.add_argument("--draft", "--draft-model", dest="draft", default=None,
                   help="draft model directory, or specfinops-draft (the bundled draft) (default: the bundled "
                        "draft; --draft-model: as bench and serve name it)")
    p.add_argument("--drafter", default=None,
                   help="draft | draft+ngram | early-exit | ngram (default: what bench and serve run, draft+ngram "
                        "with the bundled target and ngram with any other; with --draft DIR: draft)")
    p.add_argument("--early-exit-layers", type=int, default=None,
                   help="target layers used by --drafter early-exit (default: 8, or half the layers of a target "
                        "with 8 or fewer)")
    p.add_argument("--workload", default="mixed", help=f"{WORKLOAD_HELP} (default: mixed); {WORKLOAD_ALL}")
    p.add_argument("--limit", type=int, default=None, help="prompts per domain (default: all)")
    p.add_argument("--k", type=int, default=4, help=f"K used while measuring (default 4; at most {MAX_K})")
    p.add_argument("--k-max", type=int, default=8,
                   help=f"largest K considered for the bound (default 8; at most {MAX_K})")
    p.add_argument("--threshold", type=float, default=0.65, help="GO when alpha >= this (default 0.65)")
    p.add_argument("--max-new-tokens", type=int, default=96,
                   help="answer length per prompt (default 96); alpha grows with it where the answers repeat "
                        "text, as the table's alpha by answer span shows")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); above 0 a drafted token is accepted with probability min(1, p/q) "
                        "(modified rejection sampling), so alpha depends on it: calibrate at the one you serve")
    p.add_argument("--seed", type=int, default=0, help="random seed of the sampling (default 0): a sampled "
                   "calibration repeats with the same seed")
    p.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_db_option(p)
    p.add_argument("--no-telemetry", action="store_true",
                   help="do not record anything in the store (by default, as bench, the AR and spec runs are "
                        "recorded as one invocation: `specfinops invocations`, `cost` and the dashboard show it); "
                        "refused beside --db")


def _interleaved(loaded, prompts, encoded, params, done=lambda: None, turn=None):
    """AR and spec on the same prompts, alternating prompt by prompt (AR first, then spec, on each), so
    that a change in the machine's speed during the run lands on both modes alike. One engine per mode
    serves every prompt; `done()` is called as each prompt is through both. `turn(runner, prompts, encoded)`
    runs one mode on one prompt (a recorded run, as bench's turns); None: unrecorded. Returns the two ModeResults
    with every request and the summed wall time."""
    from serving.worker import ModeRunner

    runners = {mode: ModeRunner(loaded, mode) for mode in ("ar", "spec")}
    merged = {}
    for p, e in zip(prompts, encoded, strict=True):
        for mode, runner in runners.items():
            r = runner.run([p], [e], params) if turn is None else turn(runner, [p], [e])
            if mode in merged:
                merged[mode].absorb(r)
            else:
                merged[mode] = r
        done()
    return merged["ar"], merged["spec"]


def handle(args: argparse.Namespace) -> int:
    """As bench: the first Ctrl-C (or SIGTERM) stops the calibration, further ones are ignored while the runs
    recorded so far are ended ('cancelled' the one stopped) and the domains measured are reported; status 130."""
    from app.commands._common import sigterm_as_ctrl_c
    from app.commands._interrupt import ctrl_c_once

    with ctrl_c_once(), sigterm_as_ctrl_c("calibrate: SIGTERM: stopping as on Ctrl-C"):
        return _handle(args)


def _sampling(args: argparse.Namespace):
    """--temperature, --seed and --max-new-tokens as bench checks them (`check_sampling_options`), before any
    model loads: said under the option's name, and within what the store's columns hold (the runs are recorded)."""
    from app.commands.bench import check_sampling_options, sampling_params

    params = sampling_params(args)  # "--temperature must be >= 0, got -1.0", as bench says it
    check_sampling_options(args)
    return params


def _handle(args: argparse.Namespace) -> int:
    from app.commands.bench import drafter_for, early_exit_layers
    from serving.worker import EngineSpec, default_drafter
    from serving.workloads import canonical_workload, load_workload

    check_recording_options(args.no_telemetry, ["--db"] if args.db is not None else [])
    if not 0 < args.threshold <= 1:
        raise ValueError(f"--threshold must be in (0, 1], got {args.threshold}")
    if args.k < 1 or args.k_max < 1:
        raise ValueError(f"--k and --k-max must be >= 1, got {args.k} and {args.k_max}")
    check_max_k("--k and --k-max", f"{args.k} and {args.k_max}", args.k, args.k_max)
    params = _sampling(args)
    args.workload = canonical_workload(args.workload)  # 'all' is recorded as 'mixed', as bench records it
    prompts = load_workload(args.workload)
    domains = sorted({p.domain for p in prompts})
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        prompts = [p for d in domains for p in [q for q in prompts if q.domain == d][: args.limit]]
    from serving.kernels import resolve_dtype

    model_option("--target", args.target, "target", draft_flag="--draft")  # no model directory: named, before loading
    model_option("--draft", args.draft, "draft")
    # judged as bench and serve would run it: the bundled draft with prompt lookup only beside the bundled target
    # (another target, no --draft: the bundled draft was refused for its hidden size, a draft nobody named)
    drafter = drafter_for(args.drafter, args.draft, "--draft", lambda: default_drafter(args.target),
                          model_drafter="draft")
    if drafter in ("draft", "draft+ngram") and args.draft is None:
        from serving.models import model_path

        model_path("draft", flag="--draft")  # no bundled draft: say so with this command's option, before loading
    spec = EngineSpec(target=args.target, drafter=drafter, draft_model=args.draft, k=str(args.k),
                      early_exit_layers=early_exit_layers(args.early_exit_layers, args.target, drafter),
                      dtype=resolve_dtype(args.dtype, max_batch=1))  # one sequence at a time
    spec.validate()
    from app.commands._common import store_opened_for

    # the whole calibration in the block: a store file made for it is removed again where it is refused or stopped
    # (Ctrl-C, SIGTERM) before its first run is recorded (loading, checking, warming up), kept once it holds one
    with store_opened_for(args.db, args.no_telemetry):
        return _calibrate(args, spec, params, prompts, domains)


def _calibrate(args: argparse.Namespace, spec, params, prompts: list, domains: list[str]) -> int:
    """Load, check the prompts' context, warm up, measure each domain and report it (`_handle`'s work once the
    options are checked and the store is open)."""
    from app.commands.bench import check_context, context_window
    from serving.worker import load, warm_up

    print("loading models ...", file=sys.stderr)
    loaded = load(spec, draft_flag="--draft")
    encoded = [loaded.encode(p) for p in prompts]
    # said with the prompt and what sets the context (the engine's own error names neither)
    check_context(args.workload, prompts, encoded, *context_window(spec.max_len, loaded.target.cfg),
                  "drop it from the workload, or calibrate a target with more positions")
    # untimed, as bench does: a first call's costs (kernel choices, allocations, lazy init) in AR, which runs first
    # on the first prompt, inflated the one-token forward time that c, v and the measured speedup divide by; at the
    # temperature measured, so that sampling's and rejection sampling's first calls are among them
    for mode in ("ar", "spec"):
        warm_up(loaded, mode, encoded, params)
    from tqdm import tqdm

    results = []
    interrupted = False  # Ctrl-C or SIGTERM: the domains measured are still reported
    # before the bar: what opening the recorder or the power meter says (or the error it raises) is not written
    # into the bar's line
    recorder, source, turn = _recording(args, loaded, params)
    try:
        # one step per prompt (AR and speculative on it), so a run of one domain shows its progress and ETA too;
        # closed however the measurement ends (a database that fails mid-run: its error on a line of its own)
        with tqdm(total=len(prompts), desc="calibrate", unit="prompt", file=sys.stderr) as bar:
            try:
                for d in domains:
                    idx = [i for i, p in enumerate(prompts) if p.domain == d]
                    ps, enc = [prompts[i] for i in idx], [encoded[i] for i in idx]
                    bar.set_postfix_str(d)
                    ar, sp = _interleaved(loaded, ps, enc, params, done=lambda: bar.update(1), turn=turn)
                    results.append(_measure(args, d, ar, sp, enc))
            except KeyboardInterrupt:
                interrupted = True
    finally:
        try:
            if recorder is not None:
                recorder.close()  # every run recorded ended ('cancelled' the one Ctrl-C stopped): none 'running'
        finally:
            if recorder is not None:  # its pooled connections closed: a store it recorded nothing in can be
                recorder.engine.dispose()  # removed (store_opened_for), which one open connection keeps (in use)
            source.close()
    invocation_id = turn.invocation_id if turn.run_ids else None  # None: nothing recorded (or not recording)
    if interrupted and not results:
        if invocation_id is not None:
            print(f"calibrate: interrupted before a domain was measured; in the store as invocation {invocation_id}: "
                  "the turns that ran (the one stopped 'cancelled')", file=sys.stderr)
        raise KeyboardInterrupt
    if interrupted:
        print(f"calibrate: interrupted: reporting the {len(results)} of {len(domains)} domain(s) measured (the one "
              "in progress is left out)", file=sys.stderr)
    _report(args, loaded, results, interrupted, temperature=params.temperature, seed=params.seed,
            invocation_id=invocation_id)
    from app.commands._common import lost_records

    _, warning = lost_records(args.db, invocation_id)
    if warning:  # never silent: the store holds less than the table, or cannot be read to tell
        print(warning, file=sys.stderr)
    if interrupted:
        raise KeyboardInterrupt
    return 1 if warning else 0


def _measure(args: argparse.Namespace, domain: str, ar, sp, enc) -> tuple:
    """One domain's row: (Calibration, measured speedup, prompts, by position, by prompt, by answer span)."""
    from telemetry.calibration import (
        StepCounts,
        acceptance_by_position,
        acceptance_by_prompt,
        acceptance_by_span,
        alpha_k,
        calibrate,
        repeated_tokens,
    )

    spec_steps = [s for r in sp.results for s in r.record.steps if s.k > 0]
    ar_steps = [s for r in ar.results for s in r.record.steps]
    counts = StepCounts(
        num_drafts=len(spec_steps), num_draft_tokens=sum(s.k for s in spec_steps),
        num_accepted_tokens=sum(s.accepted for s in spec_steps),
        num_full_accepts=sum(s.accepted >= alpha_k(s.k, s.accepted, s.num_emitted) for s in spec_steps),
        draft_ms=sum(s.draft_ms for s in spec_steps),
        ar_steps=len(ar_steps), ar_verify_ms=sum(s.verify_ms for s in ar_steps),
        spec_verify_ms=sum(s.verify_ms for s in spec_steps),
    )
    cal = calibrate(domain, counts, threshold=args.threshold, k_max=args.k_max)
    # no speculative step (answers of one token): the two modes ran the same prefills, nothing to compare
    measured = (sp.tokens_per_s / ar.tokens_per_s if spec_steps and sp.tokens_per_s and ar.tokens_per_s
                else None)
    positions = acceptance_by_position((alpha_k(s.k, s.accepted, s.num_emitted), s.accepted)
                                       for s in spec_steps)
    by_prompt = acceptance_by_prompt((r.prompt.id, alpha_k(s.k, s.accepted, s.num_emitted), s.accepted)
                                     for r in sp.results for s in r.record.steps)
    by_span = acceptance_by_span((_step_offsets(r.record.steps), repeated_tokens(e, r.output_ids))
                                 for r, e in zip(sp.results, enc, strict=True))
    return cal, measured, len(enc), positions, by_prompt, by_span


class _Turns:
    """Each mode on each prompt as one recorded run of one invocation (bench's turns at --interleave 1, kind
    'bench': the same measurement, read by `invocations`, `cost` and the dashboard as any bench's)."""

    class _NoBar:
        def update(self, n: int = 1) -> None:  # calibrate's bar counts prompts, through both modes
            pass

    def __init__(self, args, loaded, recorder, source, params) -> None:
        import uuid

        from serving.worker import default_node_id

        self.args, self.loaded, self.recorder, self.source, self.params = args, loaded, recorder, source, params
        self.node_id = default_node_id()
        self.invocation_id = uuid.uuid4().hex
        self.run_ids: list[int] = []  # the runs recorded so far, the one Ctrl-C stopped included

    def __call__(self, runner, prompts, encoded):
        from app.commands.bench import TurnInterrupted, _run_turn

        try:
            res = _run_turn(self.args, self.loaded, runner, self.recorder, self.source, self.node_id, self.params,
                            1, prompts, encoded, self._NoBar(), self.invocation_id)
        except TurnInterrupted as exc:
            self.run_ids += exc.partial.run_ids
            raise
        self.run_ids += res.run_ids
        return res


def _recording(args: argparse.Namespace, loaded, params):
    """(recorder, power source, turn): with --no-telemetry no recorder and no meter (nothing recorded, so no
    energy either), the turns still timed as the store times them (bench's span rule)."""
    from telemetry.power import detect_power_source

    if args.no_telemetry:
        source = detect_power_source("none")
        return None, source, _Turns(args, loaded, None, source, params)
    from telemetry.recorder import Recorder
    from telemetry.store import open_store

    recorder = Recorder(open_store(args.db))
    try:
        source = detect_power_source("auto")  # bench's default meter: measured where one can be read
    except BaseException:
        try:
            recorder.close()
        finally:  # its pooled connections closed: the store it made can be removed (store_opened_for)
            recorder.engine.dispose()
        raise
    return recorder, source, _Turns(args, loaded, recorder, source, params)


def temperature_text(temperature: float) -> str:
    """The sampling temperature alpha was measured at, in words: alpha (and so the verdict) depends on it."""
    return "temperature 0 (greedy)" if temperature == 0 else f"temperature {temperature:g}"


def recorded_line(invocation_id: str) -> str:
    """The last line of a recorded calibration, as bench's: where its runs are and what reads them."""
    return (f"recorded in the store as invocation {invocation_id} (its AR and spec runs, kind bench): its costs with "
            f"`specfinops cost --invocation {invocation_id[:8]}`; every bench with `specfinops invocations` and "
            "`specfinops dashboard`")


def _report(args: argparse.Namespace, loaded, results: list, interrupted: bool = False, *,
            temperature: float = 0.0, seed: int | None = None, invocation_id: str | None = None) -> None:
    """The table (or --json) of the domains measured; `interrupted`: a Ctrl-C ended the run before the rest.
    `temperature`, `seed`: the sampling measured; `invocation_id`: the invocation its runs were recorded as (None:
    not recorded), named last (on stderr beside --json, whose stdout is the JSON alone)."""
    from telemetry.calibration import REPEAT_NGRAM, calibration_warnings

    if args.json:
        print(json.dumps({"target": str(loaded.target_dir), "drafter": loaded.drafter_label, "k_measured": args.k,
                          "temperature": temperature, "seed": seed, "invocation_id": invocation_id,
                          "interrupted": interrupted,
                          "domains": [{"domain": c.domain, "prompts": n, "alpha": c.alpha,
                                       "acceptance_rate": c.acceptance_rate,
                                       "mean_acceptance_length": c.mean_acceptance_length, "c": c.c,
                                       "best_k": c.best_k, "speedup_bound": c.bound_at_best_k,
                                       "measured_speedup_at_k": m, "verdict": c.verdict,
                                       "verdict_provisional": c.provisional, "threshold": c.threshold,
                                       "tested": c.tested, "warnings": calibration_warnings(c, m),
                                       "verify_ratio": c.verify_ratio,
                                       "bound_with_measured_verify": c.bound_with_measured_verify,
                                       "acceptance_by_position": [{"position": r.position, "tested": r.tested,
                                                                   "accepted": r.accepted, "rate": r.rate}
                                                                  for r in pos],
                                       "acceptance_by_prompt": [{"prompt_id": r.prompt_id, "steps": r.steps,
                                                                 "tested": r.tested, "accepted": r.accepted,
                                                                 "alpha": r.alpha,
                                                                 "mean_acceptance_length": r.mean_acceptance_length}
                                                                for r in by],
                                       "acceptance_by_span": [{"start": r.start, "end": r.end, "steps": r.steps,
                                                               "tested": r.tested, "accepted": r.accepted,
                                                               "alpha": r.alpha, "repeated": r.repeated}
                                                              for r in spans]}
                                      for c, m, n, pos, by, spans in results]}, indent=1))
        if invocation_id is not None:
            for line in _store_notes(interrupted):
                print(line, file=sys.stderr)
            print(recorded_line(invocation_id), file=sys.stderr)
        return
    if interrupted:
        print(f"interrupted: the {len(results)} domain(s) measured before the run was stopped")
    sampled = "" if temperature == 0 else f", seed {seed}"
    print(f"target {loaded.target_dir}\ndrafter {loaded.drafter_label}, measured at K={args.k}, "
          f"{temperature_text(temperature)}{sampled}")
    print(f"{'domain':<10} {'prompts':>7} {'alpha':>6} {'acc rate':>8} {'mean acc len':>12} {'c':>6} {'best K':>6} "
          f"{'bound':>6} {'v':>5} {'bound v':>7} {'measured':>8}  verdict (alpha >= {args.threshold} at "
          f"{temperature_text(temperature)})")
    for c, m, n, *_ in results:
        print(_row(c, m, n))
    for c, m, *_ in results:
        for line in calibration_warnings(c, m):
            print(f"warning: {c.domain}: {line}")
    print("alpha = per-token acceptance probability: accepted / tested (a step tests its accepted tokens and\n"
          "the first rejected one); acc rate = accepted / drafted at the measured K")
    if temperature > 0:
        print(f"at {temperature_text(temperature)} a drafted token is accepted with probability min(1, p/q) (modified "
              "rejection sampling),\nso alpha holds for this temperature only; AR and spec sample different "
              "answers, which measured compares by tokens/s")
    print("bound = (1 - a^(K+1)) / ((1 - a)(K c + 1)); c = draft time per proposed token / target one-token forward")
    print("v = the target's verify forward at the measured K / its one-token forward (the bound assumes 1);\n"
          "bound v = mean acceptance length / (K c + v) at the measured K: what this machine allows")
    print("measured = spec tokens/s / AR tokens/s at the measured K, the modes taking turns prompt by prompt over\n"
          "the domain's prompts: the speedup this machine gave (at most about the mean acc len)")
    print("\nacceptance by draft position, given the positions before it were accepted (tested steps):")
    for c, _, _, pos, *_ in results:
        cells = "  ".join(f"{r.position}: " + ("—" if r.rate is None else f"{r.rate:.3f}") + f" ({r.tested})"
                          for r in pos)
        print(f"  {c.domain:<10} {cells or '—'}")
    print("alpha sums these counts: where the curve rises with the position, a larger K measures a larger alpha")
    print(f"\nalpha by prompt (prompts reaching alpha >= {args.threshold}; lowest three; median; highest):")
    for c, _, _, _, by, _ in results:
        print(f"  {c.domain:<10} {_prompt_spread(by, args.threshold)}")
    print("a domain's alpha pools its prompts' counts; --json lists every prompt")
    print(f"\nalpha by answer span (output tokens; rep = share of the span's tokens whose {REPEAT_NGRAM} tokens "
          "ending there\nstood earlier in the prompt or answer):")
    for c, *_, spans in results:
        cells = "  ".join(f"{r.start}-{r.end - 1}: " + ("—" if r.alpha is None else f"{r.alpha:.3f}")
                          + ("" if r.repeated is None else f" rep {r.repeated:.2f}") for r in spans)
        print(f"  {c.domain:<10} {cells or '—'}")
    print("where alpha climbs with rep, the gain is repeated text (copies of the prompt, or a target looping),\n"
          "which prompt lookup accepts whatever the draft: longer answers then measure a higher alpha")
    if invocation_id is not None:
        for line in _store_notes(interrupted):
            print(line)
        print(recorded_line(invocation_id))


def _store_notes(interrupted: bool) -> list[str]:
    """What the store holds of an interrupted calibration: more than the table, which leaves out the domain in
    progress."""
    if not interrupted:
        return []
    return ["in the store: every turn that ran, the domain in progress's included (its runs 'completed', the one "
            "Ctrl-C stopped 'cancelled' with the requests it finished)"]


def _step_offsets(steps) -> list[tuple[int, int, int]]:
    """(output tokens emitted before the step, its alpha k, accepted) per step; the prefill emitted the first
    token."""
    from telemetry.calibration import alpha_k

    out, before = [], 1
    for s in steps:
        out.append((before, alpha_k(s.k, s.accepted, s.num_emitted), s.accepted))
        before += s.num_emitted
    return out


def _row(c, measured: float | None, prompts: int) -> str:
    """A domain's line of the table. Alpha is written with the decimals it takes to stay on its verdict's side
    of the threshold (`go_text`): 0.64996 as "0.64996", not "0.650" beside NO-GO."""
    from telemetry.labels import go_text

    f = lambda x, s=".3f": "—" if x is None else format(x, s)  # noqa: E731
    return (f"{c.domain:<10} {prompts:>7} {go_text(c.alpha, c.threshold):>6} {f(c.acceptance_rate):>8} "
            f"{f(c.mean_acceptance_length, '.2f'):>12} {f(c.c):>6} {f(c.best_k, 'd'):>6} "
            f"{f(c.bound_at_best_k, '.2f'):>6} {f(c.verify_ratio, '.2f'):>5} "
            f"{f(c.bound_with_measured_verify, '.2f'):>7} {f(measured, '.2f'):>8}  {c.verdict_text}")


def _prompt_spread(rows, threshold: float) -> str:
    """One line: how many prompts reach the threshold, the three lowest, the median and the highest (alphas on
    their side of the threshold, as `_row` writes them)."""
    from telemetry.labels import go_text

    rated = [r for r in rows if r.alpha is not None]  # acceptance_by_prompt sorts them lowest first
    if not rated:
        return "—"
    cell = lambda r: f"{r.prompt_id} {go_text(r.alpha, threshold)}"  # noqa: E731
    reach = sum(r.alpha >= threshold for r in rated)
    median = statistics.median(r.alpha for r in rated)
    return (f"{reach}/{len(rated)} reach it; lowest {', '.join(cell(r) for r in rated[:3])}; "
            f"median {go_text(median, threshold)}; highest {cell(rated[-1])}")
