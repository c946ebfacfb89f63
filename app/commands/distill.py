"""`specfinops distill`: train a feature-level draft for a target (see serving/distill)."""

from __future__ import annotations

from app.commands._common import add_command, positive_int

EXAMPLES = r"""  # the bundled draft (the command its model card records): data and training within 88 minutes,
  # training gets what the data left, and the evaluation after it ends the run within 90
  specfinops distill --generate-prompts 1784 --stdlib-prompts 2617 --max-new-tokens 128 --gen-batch 48 \
      --out /tmp/draft88 --total-minutes 88
  # the same, replacing the bundled draft (a finished draft at --out is replaced only with --overwrite)
  specfinops distill --generate-prompts 1784 --stdlib-prompts 2617 --max-new-tokens 128 --gen-batch 48 \
      --out serving/bundled/draft --total-minutes 88 --overwrite
  # a quick trial on data prepared earlier, 200 steps, no evaluation
  specfinops distill --corpus ~/.cache/specfinops/distill/DATA --out /tmp/draft --steps 200 --no-eval
  # continue an interrupted run (same arguments plus --resume)
  specfinops distill --generate-prompts 1784 --out /tmp/draft --minutes 45 --resume
  # or start its training over (the same arguments plus --fresh; the data made is reused)
  specfinops distill --generate-prompts 1784 --out /tmp/draft --minutes 45 --fresh
  # a fused-feature draft (EAGLE-3): reads the outputs of target blocks 1, 14 and 29 (of 30)
  specfinops distill --generate-prompts 1784 --feature-layers 1 14 29 --out /tmp/draft3 --minutes 45
  # twice the bundled recipe's data on a CUDA GPU (an H200 made it in 6.4 minutes), training gets the rest
  specfinops distill --generate-prompts 1784 --stdlib-prompts 2617 --package-prompts 5000 --max-new-tokens 128 \
      --gen-batch 384 --batch-tokens 16384 --lr 0.001 --device cuda --out /tmp/draft-gpu --total-minutes 30
  # your own target
  specfinops distill --target /models/my-llama --generate-prompts 3000 --out /models/my-llama-draft --minutes 60
  # add 500 code questions the target writes itself to the templated prompts
  specfinops distill --generate-prompts 1784 --self-prompts 500 --out /tmp/draft-self --minutes 45
"""


def register(sub) -> None:
    p = add_command(sub, "distill", "Train a feature-level draft (EAGLE-style, reduced-vocabulary head) that "
                    "shares the target's tokenizer.", EXAMPLES, handle)
    p.add_argument("--target", default=None, help="target model name or directory (default: the bundled target)")
    p.add_argument("--corpus", nargs="+", default=[], metavar="DIR",
                   help="prepared data directories (made by an earlier --generate-prompts / --stdlib-code run)")
    p.add_argument("--generate-prompts", type=int, default=0, metavar="N",
                   help="generate the target's greedy answers to the first N templated training prompts")
    p.add_argument("--stdlib-prompts", type=int, default=0, metavar="N",
                   help="generate the target's answers to N code prompts made from documented Python standard-library "
                        "functions (asks from docstrings, tasks on their source)")
    p.add_argument("--package-prompts", type=int, default=0, metavar="N",
                   help="generate the target's answers to N code prompts made (like --stdlib-prompts) from documented "
                        "functions of installed packages (sqlalchemy, pandas, transformers, ...; the model card records "
                        "their versions)")
    p.add_argument("--self-prompts", type=int, default=0, metavar="N",
                   help="generate the target's answers to N code questions the target writes itself (sampled from "
                        "its chat template after an opener such as 'Fix the bug in'; Magpie), phrased as loosely as "
                        "real requests; any chat target can make them")
    p.add_argument("--stdlib-code", type=int, default=0, metavar="N",
                   help="add N Python standard-library functions as chat answers, teacher-forced")
    p.add_argument("--data-dir", default=None,
                   help="where --generate-prompts writes (default: under distill/ in $SPECFINOPS_CACHE, else "
                        "$XDG_CACHE_HOME/specfinops, else ~/.cache/specfinops)")
    p.add_argument("--max-new-tokens", type=int, default=192, help="answer length cap when generating data (default: 192)")
    p.add_argument("--gen-batch", type=int, default=None,
                   help="sequences generated together (default: 32 on the CPU, 256 on a GPU)")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="precision of the target when generating data and of the draft's training matmuls "
                        "(bfloat16: mixed precision, weights and optimizer stay float32). auto (the default): "
                        "bfloat16 where the CPU multiplies bf16 in hardware (about 2x faster than float32 there), "
                        "else float32 (emulated bf16 was 4x slower at batched generation on an AVX2 CPU); the "
                        "model card's command records the precision chosen")
    p.add_argument("--out", required=True, help="output directory for the draft (weights, config, tokenizer, model card)")
    p.add_argument("--minutes", default=None,
                   help="training budget in minutes (excluding data and evaluation; default: 30, unless --steps or "
                        "--total-minutes is given)")
    p.add_argument("--steps", default=None, help="training budget in optimizer steps")
    p.add_argument("--total-minutes", default=None, metavar="M",
                   help="wall-clock budget of the whole run, data preparation and training (the evaluation after it "
                        "is not counted): training gets the minutes the data left, or --minutes if that is less; "
                        "a slower machine trains fewer steps instead of running over. The model card records the "
                        "split")
    p.add_argument("--head-vocab", type=int, default=8192, help="tokens the draft head can propose")
    p.add_argument("--layers", type=int, default=1, help="draft decoder layers")
    p.add_argument("--feature-layers", type=int, nargs="+", default=None, metavar="I",
                   help="fuse the outputs of these target blocks (0-based, increasing, two or more; e.g. a low, a "
                        "middle and the last one) into the draft's input, as EAGLE-3 does; --w-feat then weights "
                        "the regression of h on the draft's own fuse of the next real features. Default: the last "
                        "block's output only")
    p.add_argument("--data-feature-layers", type=int, nargs="+", default=None, metavar="I",
                   help="target blocks whose outputs generated data records (default: those the draft reads); "
                        "data recorded with more blocks can train drafts that read fewer of them")
    p.add_argument("--lr", type=float, default=5e-4,
                   help="peak learning rate of AdamW (after a 20-step warm-up, cosine decay to a tenth of it)")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="padded tokens per training step (default: 3072 on the CPU, 16384 on a GPU)")
    p.add_argument("--batch-pool", type=int, default=256, metavar="N",
                   help="sort each N sequences of an epoch's random order by length and prompt length before "
                        "cutting them into batches, so a batch wastes little on padding and on prompts (default "
                        "256; 0: random batches, as drafts made before this option were trained)")
    p.add_argument("--unroll", type=int, default=3, help="draft steps trained per position (own features after step 1)")
    p.add_argument("--detach-unroll", action="store_true", help="no gradient through the draft's own features")
    p.add_argument("--freeze-head", action="store_true",
                   help="keep the target's final norm and head rows fixed; train only the draft's fc and layers "
                        "(EAGLE-1: the draft must produce features the target's own head reads)")
    p.add_argument("--w-feat", type=float, default=0.5,
                   help="feature regression loss weight (h_p on f_{p+1}; on fuse(f_{p+1}) for a fused draft; 0: none)")
    p.add_argument("--w-hard", type=float, default=0.5, help="cross-entropy to the target's greedy token weight")
    p.add_argument("--feat-noise", type=float, default=0.05, help="uniform feature noise, fraction of the feature RMS")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the templated and code prompts chosen, the batch order and the feature noise")
    p.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    p.add_argument("--device", default="cpu", metavar="DEV",
                   help="where the target generates the data and the draft trains: cpu (default) or a CUDA GPU "
                        "(cuda, cuda:1); alpha and c are measured on the CPU either way, where the draft serves. "
                        "On a GPU, --dtype auto is bfloat16 where the GPU has bf16 arithmetic (Ampere and later)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint of the same --out (a run without --resume or --fresh is "
                        "refused where an unfinished run's checkpoint exists, so its steps are not lost)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the finished draft --out holds (refused without it, so a finished draft, the bundled "
                        "one or one made for another target, is not lost to a rerun; an unfinished run's --out is "
                        "replaced either way)")
    p.add_argument("--fresh", action="store_true",
                   help="start training over from step 0, removing the unfinished run's checkpoint of this --out "
                        "(the data already made is still reused)")
    p.add_argument("--checkpoint", default=None,
                   help="checkpoint file training saves to and --resume continues from (default: "
                        "distill/checkpoints/<hash of --out>.pt in $SPECFINOPS_CACHE, else $XDG_CACHE_HOME/specfinops, "
                        "else ~/.cache/specfinops; a run that finishes removes its default checkpoint and keeps it "
                        "when interrupted or failed; one given here is kept, so a later --resume can train it further)")
    p.add_argument("--save-every", type=float, default=3.0, help="minutes between checkpoints (also refreshes --out)")
    p.add_argument("--no-eval", action="store_true", help="skip measuring alpha and c")
    p.add_argument("--eval-max-new-tokens", type=int, default=128,
                   help="answer length of the target's greedy answers to the builtin workloads alpha is measured "
                        "on")
    p.add_argument("-k", "--k", type=int, default=4, help="lookahead used when measuring alpha")


def _positive(name: str, value, kind):
    if value is None:
        return None
    try:
        v = kind(value)
    except ValueError:
        v = None
    if v is None or not 0 < v < float("inf"):  # also refuses nan
        from app.errors import UsageError

        raise UsageError(f"{name} must be a positive {'whole ' if kind is int else ''}number, got {value!r}")
    return v


def handle(args) -> int:
    from pathlib import Path

    from app.errors import UsageError
    from serving.distill.pipeline import resolve_device

    try:
        args.device = str(resolve_device(args.device))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    on_gpu = args.device != "cpu"
    if args.gen_batch is None:
        args.gen_batch = 256 if on_gpu else 32
    if args.batch_tokens is None:
        args.batch_tokens = 16384 if on_gpu else 3072
    args.minutes = _positive("--minutes", args.minutes, float)
    args.steps = _positive("--steps", args.steps, int)
    args.total_minutes = _positive("--total-minutes", args.total_minutes, float)
    from serving.distill.pipeline import BUDGET_MARGIN_MINUTES, MIN_TRAIN_MINUTES

    least = BUDGET_MARGIN_MINUTES + MIN_TRAIN_MINUTES
    if args.total_minutes is not None and args.total_minutes <= least:  # said now, not after the data is made
        raise UsageError(f"--total-minutes {args.total_minutes:g} leaves no time to train: {BUDGET_MARGIN_MINUTES:g} "
                         f"are kept for saving the draft and training needs {MIN_TRAIN_MINUTES:g} more, besides "
                         f"making the data; give more than {least:g} (the bundled recipe takes 88)")
    if args.resume and args.fresh:
        raise UsageError("give --resume (continue the checkpoint) or --fresh (start over), not both")
    if args.minutes is not None and args.steps is not None:
        raise UsageError("give --minutes or --steps, not both")
    if args.total_minutes is not None and args.steps is not None:
        raise UsageError("give --total-minutes (a time budget) or --steps, not both")
    if args.minutes is None and args.steps is None and args.total_minutes is None:
        args.minutes = 30.0
    args.lr = _positive("--lr", args.lr, float)
    args.save_every = _positive("--save-every", args.save_every, float)
    for name in ("w_feat", "w_hard", "feat_noise"):
        v = getattr(args, name)
        if not 0 <= v < float("inf"):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {v!r}")
    if args.k < 1:
        raise UsageError(f"--k must be >= 1, got {args.k}")
    for c in args.corpus:
        p = Path(c).expanduser()
        if not p.is_dir():
            raise UsageError(f"corpus {c} is not a directory (a prepared data directory)" if p.exists()
                             else f"corpus {c} does not exist")
    if not (args.corpus or args.generate_prompts or args.stdlib_prompts or args.package_prompts or args.self_prompts
            or args.stdlib_code):
        raise UsageError("no training data: give --corpus DIR, --generate-prompts N, --stdlib-prompts N, "
                         "--package-prompts N, --self-prompts N or --stdlib-code N")
    if getattr(args, "data_dir", None):  # checked now, not once the target has loaded and data is being written
        d = Path(args.data_dir).expanduser()
        if d.exists() and not d.is_dir():
            raise UsageError(f"--data-dir {args.data_dir} is a file: give a folder (new, empty, or one distill made)")
        if d.is_dir() and any(d.iterdir()) and not any((d / n).is_file() for n in ("sequences.jsonl", "settings.json")):
            raise UsageError(f"--data-dir {args.data_dir} holds other files, not distillation data (no "
                             "sequences.jsonl): give a new or empty folder, or one distill made")
    if args.batch_pool < 0:
        raise UsageError(f"--batch-pool must be 0 (random batches) or a number of sequences, got {args.batch_pool}")
    at_least_one = ("head_vocab", "layers", "unroll", "batch_tokens", "gen_batch", "max_new_tokens",
                    "eval_max_new_tokens")
    for name in ("generate_prompts", "stdlib_prompts", "package_prompts", "self_prompts", "stdlib_code", *at_least_one):
        if getattr(args, name) < 0 or (name in at_least_one and getattr(args, name) < 1):
            raise UsageError(f"--{name.replace('_', '-')} must be " + ("a whole number >= 1" if name in at_least_one
                             else "a whole number >= 0 (0: none)") + f", got {getattr(args, name)}")
    for name in ("feature_layers", "data_feature_layers"):
        layers = getattr(args, name)
        if layers is not None and (len(layers) < 2 and name == "feature_layers" or min(layers) < 0
                                   or layers != sorted(set(layers))):
            raise UsageError(f"--{name.replace('_', '-')} must be distinct block indices >= 0 in increasing order"
                             + (", two or more" if name == "feature_layers" else "") + f", got {layers}")
    from app.commands._common import sigterm_as_ctrl_c
    from serving.distill.pipeline import run
    from serving.kernels import resolve_dtype

    args.dtype = resolve_dtype(args.dtype, device=args.device)  # the model card's command names the precision used
    # SIGTERM (`docker stop`, a preempted job, `timeout`) stops it as Ctrl-C does: the steps trained so far are saved
    # in the checkpoint and the line that resumes them is printed (it was killed outright, losing them)
    with sigterm_as_ctrl_c("distill: SIGTERM: stopping as on Ctrl-C"):
        return run(args)
