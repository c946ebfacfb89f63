"""Does the draft reach alpha on prompts like its training data but not on the evaluation workload?

Simulated greedy draft+ngram drafting (as the engine drafts: prompt lookup where the last two tokens
occurred before, else the draft with the engine's copy prior; K tokens a step, step 1 reads the target's
real feature) along the target's own greedy answers to four sets of code prompts:

  eval       the builtin code workload (what #6's alpha is judged on; never trained on)
  templated  templated prompts made with --seed-heldout that the training seed never made
  stdlib     standard-library code prompts made with --seed-heldout that the training seed never made
             (the same functions, other languages or tasks)
  packages   code prompts from documented functions of installed packages (functions never trained on)

No target forward runs during the simulation: the stored answers are the verification. Each set's answers
are generated once and cached under ~/.cache/specfinops/distill/heldout-*.

Examples:
  python -m scripts.draft_generalization                       # the bundled pair, 40 prompts a set
  python -m scripts.draft_generalization --prompts 80 --dtype bfloat16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.commands._common import DTYPE_HELP


def _f(value, spec: str) -> str:
    """A simulate_alpha figure, or '—' where nothing was drafted (None)."""
    width = spec.split(".")[0]  # '>6' of '>6.3f': the column keeps its width
    return format("—", width) if value is None else format(value, spec)


def heldout_sets(n: int, train_seed: int, heldout_seed: int, packages: tuple[str, ...] | None = None) -> dict[str, list[dict]]:
    """Code prompts the generators make with `heldout_seed` but not with `train_seed` (exact texts), and
    package prompts (from `packages`, default serving.distill.prompts.PACKAGES)."""
    from serving.distill.prompts import PACKAGES, make_prompts, package_prompts, stdlib_prompts

    def text(p: dict) -> str:
        return p.get("prompt") or json.dumps(p.get("messages"))

    seen = {text(p) for p in make_prompts(None, seed=train_seed)}
    templ = [p for p in make_prompts(None, seed=heldout_seed) if p["domain"] == "code" and text(p) not in seen]
    seen_std = {p["prompt"] for p in stdlib_prompts(None, seed=train_seed)}
    std = [p for p in stdlib_prompts(None, seed=heldout_seed) if p["prompt"] not in seen_std]
    return {"templated": templ[:n], "stdlib": std[:n], "packages": package_prompts(n, seed=train_seed, packages=packages or PACKAGES)}


def resolve_draft(arg: str | None) -> Path | None:
    """The draft directory `--draft` names (default: the bundled draft); None, after saying why on
    stderr, where it holds no draft."""
    from serving.models import model_path

    draft_dir = Path(arg).expanduser() if arg else model_path("draft")
    if not (draft_dir / "config.json").is_file():
        print(f"error: --draft {draft_dir} is not a draft model directory (no config.json)", file=sys.stderr)
        return None
    return draft_dir


def engine_lookup():
    """draft+ngram's prompt lookup and copy prior, as the engine runs them: (lookup(context, k), b)."""
    from serving.drafters import NgramDrafter
    from serving.worker import COPY_BIAS, HYBRID_NGRAM_MIN

    return NgramDrafter(n_max=3, n_min=HYBRID_NGRAM_MIN).lookup, COPY_BIAS["draft+ngram"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target model name or directory (default: the bundled target)")
    ap.add_argument("--draft", default=None, help="feature-level draft directory (default: the bundled draft)")
    ap.add_argument("--prompts", type=int, default=40, help="prompts per held-out set (default 40)")
    ap.add_argument("--train-seed", type=int, default=0, help="the seed the draft's training prompts were made with")
    ap.add_argument("--seed-heldout", type=int, default=1, help="the seed that makes the held-out prompts")
    ap.add_argument("--k", type=int, default=4, help="tokens drafted a step (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="answer length (default 128)")
    ap.add_argument("--dtype", default="float32", choices=("auto", "bfloat16", "float32"), help=DTYPE_HELP)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.k < 1 or args.max_new_tokens < 2:
        print("error: --prompts and --k must be >= 1, --max-new-tokens >= 2", file=sys.stderr)
        return 2
    if args.seed_heldout == args.train_seed:
        print("error: --seed-heldout must differ from --train-seed", file=sys.stderr)
        return 2

    import torch

    from serving.distill.data import is_prepared, load_prepared, prepare
    from serving.distill.pipeline import CACHE, _dtype_tag, eval_data
    from serving.distill.train import simulate_alpha
    from serving.eagle import load_eagle
    from serving.kernels import resolve_dtype
    from serving.llama import load_causal_lm
    from serving.models import resolve_model

    dtype = getattr(torch, resolve_dtype(args.dtype))
    target_dir = resolve_model(args.target, "target")
    draft_dir = resolve_draft(args.draft)
    if draft_dir is None:
        return 2
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    dirs = {"eval": eval_data(target_dir, args.max_new_tokens, say, dtype)}
    for name, items in heldout_sets(args.prompts, args.train_seed, args.seed_heldout).items():
        d = CACHE / (f"heldout-{target_dir.name}-{name}-n{args.prompts}-t{args.train_seed}-h{args.seed_heldout}"
                     f"-{args.max_new_tokens}{_dtype_tag(dtype)}")
        if not is_prepared(d):
            say(f"{name}: the target's greedy answers to {len(items)} held-out code prompts -> {d}")
            prepare(target_dir, items, d, max_new_tokens=args.max_new_tokens, dtype=dtype, say=say)
        dirs[name] = d
    target = load_causal_lm(target_dir, dtype)
    try:
        draft = load_eagle(draft_dir, target, dtype)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lookup, bias = engine_lookup()
    results = {}
    print(f"draft {draft_dir}, draft+ngram (copy prior {bias}), K={args.k}, {args.dtype} answers")
    print(f"{'set':<10} {'prompts':>7} {'alpha':>6} {'acc rate':>8} {'mean acc len':>12}")
    for name, d in dirs.items():
        prep = load_prepared(d)
        with torch.inference_mode():
            res = simulate_alpha(draft, prep, k=args.k, domains=("code",), lookup=lookup, copy_bias=bias)
        r = res.get("code")
        if r is None:
            continue
        r["prompts"] = sum(s["domain"] == "code" for s in prep.seqs)
        results[name] = r
        print(f"{name:<10} {r['prompts']:>7} {_f(r['alpha'], '>6.3f')} {_f(r['acceptance_rate'], '>8.3f')} "
              f"{_f(r['mean_accept_len'], '>12.2f')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"draft": str(draft_dir), "k": args.k, "copy_bias": bias,
                                               "dtype": args.dtype, "sets": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
