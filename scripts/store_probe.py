"""What a retrieval store adds to draft+ngram: simulated greedy drafting on the evaluation answers.

The bundled draft drafts along the target's own greedy answers to the builtin workloads (as
`specfinops distill` measures alpha: K tokens a step, step 1 reads the target's real feature), with
prompt lookup asked first (draft+ngram), and then with a store of the target's answers to training
prompts asked next (serving/datastore.py), for each store setting given. No target forward is run: the
answers are the verification.

Examples:
  python -m scripts.store_probe --data ~/.cache/specfinops/distill/smollm2-135m-instruct-generated-t1784-l2617-s0-n128
  python -m scripts.store_probe --data DIR --min-match 3 4 6 --min-conf 0.3 0.5 --domains code chat
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from app.commands._common import DTYPE_HELP


def _f(value, spec: str) -> str:
    """A simulate_alpha figure, or '—' where nothing was drafted (None)."""
    width = spec.split(".")[0]  # '>6' of '>6.3f': the column keeps its width
    return format("—", width) if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", action="append", default=[], help="prepared data directory whose answers make the store")
    ap.add_argument("--store", default=None, help="a saved store (datastore.npz) instead of --data")
    ap.add_argument("--draft", default=None, help="feature-level draft directory (default: the bundled draft)")
    ap.add_argument("--min-match", type=int, nargs="+", default=[4])
    ap.add_argument("--min-conf", type=float, nargs="+", default=[0.5])
    ap.add_argument("--min-len", type=int, nargs="+", default=[1],
                    help="use the store only where its continuation is at least this long")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--domains", nargs="+", default=["code"])
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"), help=DTYPE_HELP)
    ap.add_argument("--max-new-tokens", type=int, default=128, help="answer length of the evaluation data")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)

    import torch

    from serving.datastore import SuffixStore, answers_of
    from serving.distill.data import load_prepared
    from serving.distill.pipeline import eval_data
    from serving.distill.train import simulate_alpha
    from serving.drafters import NgramDrafter
    from serving.eagle import load_eagle
    from serving.kernels import resolve_dtype
    from serving.llama import load_causal_lm
    from serving.models import model_path, resolve_model

    if not args.data and not args.store:
        print("error: give --data DIR (prepared answers) or --store FILE", file=sys.stderr)
        return 2
    dtype = getattr(torch, resolve_dtype(args.dtype))
    target_dir = resolve_model(None, "target")
    ev = load_prepared(eval_data(target_dir, args.max_new_tokens, lambda m: print(m, file=sys.stderr), dtype))
    target = load_causal_lm(target_dir, dtype)
    draft = load_eagle(Path(args.draft) if args.draft else model_path("draft"), target, dtype).eval()
    t0 = time.perf_counter()
    if args.store:
        store = SuffixStore.load(args.store)
    else:
        docs = [d for p in args.data for d in answers_of(p)]
        store = SuffixStore.build(docs)
    print(f"store: {len(store)} tokens ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    ngram = NgramDrafter(n_max=3, n_min=2)
    domains = tuple(args.domains)
    rows = []

    def run(label, lookup):
        with torch.inference_mode():
            r = simulate_alpha(draft, ev, k=args.k, domains=domains, lookup=lookup)
        for dom in domains:
            rows.append({"drafter": label, "domain": dom, **r[dom]})
            print(f"{label:32s} {dom:8s} alpha {_f(r[dom]['alpha'], '.3f')}  mean acc. len "
                  f"{_f(r[dom]['mean_accept_len'], '.3f')}",
                  flush=True)

    run("draft+ngram", lambda ctx, k: ngram.lookup(ctx, k))
    for mm in args.min_match:
        for mc in args.min_conf:
            for ml in args.min_len:
                def lookup(ctx, k, mm=mm, mc=mc, ml=ml):
                    found = ngram.lookup(ctx, k)
                    if found:
                        return found
                    t = store.continuation(ctx, k, min_match=mm, min_conf=mc).tokens
                    return t if len(t) >= min(ml, k) else []
                run(f"draft+ngram+store m{mm} c{mc} l{ml}", lookup)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
