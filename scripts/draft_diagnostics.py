"""Where a feature-level draft misses: its agreement with the target, position by position.

Every answer position of the target's greedy answers to the builtin evaluation workloads is fed the
target's real feature (what the first token of every draft chain sees). Printed per domain:

  top-k   share of positions whose target token is among the draft's k best (top-1 bounds a chain's
          first token; top-2.. is what drafting several candidates, a token tree, could recover)
  in head share the draft's reduced-vocabulary head can propose at all
  by target confidence: share of positions whose target top-1 probability lies in a bin, and the
          draft's top-1 agreement there (a draft that misses where the target is sure has room to learn)
  in context: share of positions whose token followed the current token earlier in the sequence (what
          prompt lookup and the copy prior can supply), and the draft's own top-1 there
  by kind (with --by-kind): per kind of target token (whitespace, punctuation, a word start, a word
          piece) its share of positions, the draft's top-1 there, the share the head can propose, and
          its share of the draft's misses (many misses on tokens outside the head: raise --head-vocab)

The evaluation answers are generated once and cached (~/.cache/specfinops/distill/...-eval-...).

Examples:
  python -m scripts.draft_diagnostics                          # the bundled pair
  python -m scripts.draft_diagnostics --draft /tmp/my-draft --draft serving/bundled/draft --json out.json
  python -m scripts.draft_diagnostics --by-kind --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.commands._common import DTYPE_HELP


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target model name or directory (default: the bundled target)")
    ap.add_argument("--draft", action="append", default=None,
                    help="feature-level draft directory (repeatable; default: the bundled draft)")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"), help=DTYPE_HELP)
    ap.add_argument("--max-new-tokens", type=int, default=128, help="answer length of the evaluation data")
    ap.add_argument("--by-kind", action="store_true",
                    help="also break the agreement down by the kind of target token (needs the target's tokenizer)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)

    import torch

    from serving.distill.data import load_prepared
    from serving.distill.pipeline import eval_data
    from serving.distill.train import kind_of_token, teacher_forced_agreement
    from serving.eagle import load_eagle
    from serving.kernels import resolve_dtype
    from serving.llama import load_causal_lm
    from serving.models import load_tokenizer, model_path, resolve_model

    dtype = getattr(torch, resolve_dtype(args.dtype))
    target_dir = resolve_model(args.target, "target")
    drafts = [Path(d).expanduser() for d in (args.draft or [str(model_path("draft"))])]
    for d in drafts:
        if not (d / "config.json").is_file():
            print(f"error: --draft {d} is not a draft model directory (no config.json)", file=sys.stderr)
            return 2
    target = load_causal_lm(target_dir, dtype)
    kind_of = kind_of_token(load_tokenizer(target_dir)) if args.by_kind else None
    results, evals = {}, {}
    for d in drafts:
        try:
            draft = load_eagle(d, target, dtype)
        except (ValueError, KeyError) as e:
            print(f"error: --draft {d}: {e}", file=sys.stderr)
            return 2
        layers = draft.cfg.feature_layers or None  # a fused-feature draft reads several blocks' outputs
        if layers not in evals:
            evals[layers] = load_prepared(eval_data(target_dir, args.max_new_tokens,
                                                    lambda m: print(m, file=sys.stderr), dtype, layers))
        res = teacher_forced_agreement(draft, evals[layers], kind_of=kind_of)
        results[str(d)] = res
        print(f"\n{d}")
        print(f"{'domain':8} {'positions':>9} {'top-1':>6} {'top-2':>6} {'top-4':>6} {'top-8':>6} {'in head':>7}   "
              "target top-1 p: share / draft top-1 there")
        for dom, r in res.items():
            bins = "  ".join(f"[{b['from']:.2f},{b['to']:.2f}{']' if b['to'] >= 1 else ')'} {b['share']:.2f}/"
                             + ("-" if b["top1"] is None else f"{b['top1']:.2f}") for b in r["by_target_confidence"])
            tops = " ".join(f"{r['top'].get(k, float('nan')):6.3f}" for k in (1, 2, 4, 8))
            print(f"{dom:8} {r['positions']:9d} {tops} {r['in_head']:7.3f}   {bins}")
        print("in context (the token followed the current one earlier): share / draft top-1 there")
        for dom, r in res.items():
            ctx = r["in_context"]
            print(f"  {dom:8} {ctx['share']:.3f} / " + ("-" if ctx["top1"] is None else f"{ctx['top1']:.3f}"))
        if kind_of is not None:
            print(f"{'domain':8} {'kind':12} {'share':>6} {'top-1':>6} {'in head':>7} {'of misses':>9}")
            for dom, r in res.items():
                for k in r["by_kind"]:
                    of_misses = "-" if k["share_of_misses"] is None else f"{k['share_of_misses']:9.3f}"
                    print(f"{dom:8} {k['kind']:12} {k['share']:6.3f} {k['top1']:6.3f} {k['in_head']:7.3f} {of_misses:>9}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
