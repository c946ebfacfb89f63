"""Token-tree shapes against the chain, on one loaded engine: tokens/s, tokens per step, draft and verify time.

Every configuration decodes the same prompts (greedy) after one short warm-up; AR runs first and every
row's speedup is against it. Rows: `ar`, `chain` (the chain with --k auto), `kN` (the chain with a fixed
K = N) or a tree shape NODES[:DEPTH[:WIDTH[:MIN_PROB]]].

Examples:
  python -m scripts.bench_tree --limit 8 chain 8:4:2 16:5:4
  python -m scripts.bench_tree --limit 16 chain 16:6:4:0.25 24:8:4:0.2 --json bench-results/tree_shapes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from app.commands._common import DTYPE_HELP


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", help="chain | kN | NODES[:DEPTH[:WIDTH[:MIN_PROB]]]")
    ap.add_argument("--workload", default="code")
    ap.add_argument("--limit", type=int, default=8, help="first N prompts (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafter", default="draft+ngram")
    ap.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    ap.add_argument("--json", default=None, help="write the rows as JSON")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from serving.drafters import TreeShape
    from serving.kernels import resolve_dtype
    from serving.sampling import SamplingParams
    from serving.worker import EngineSpec, load
    from serving.workloads import load_workload

    for cfg in args.configs:
        if cfg != "chain" and not (cfg.startswith("k") and cfg[1:].isdigit()):
            TreeShape.parse(cfg)  # a bad shape fails before the model loads
    loaded = load(EngineSpec(drafter=args.drafter, dtype=resolve_dtype(args.dtype, max_batch=1)))
    prompts = load_workload(args.workload, limit=args.limit)
    encoded = [loaded.encode(p) for p in prompts]
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    rows, base = [], None
    for cfg in ["ar", *args.configs]:
        loaded.spec.tree = None if cfg in ("ar", "chain") or cfg.startswith("k") else cfg
        loaded.spec.k = cfg[1:] if cfg.startswith("k") else "auto"
        events = []
        engine = loaded.engine("ar" if cfg == "ar" else "spec", on_step=events.append)
        engine.generate(encoded[0], SamplingParams(temperature=0.0, max_new_tokens=8))  # warm-up
        events.clear()
        tokens, seconds = 0, 0.0
        for ids in tqdm(encoded, desc=cfg, unit="req", file=sys.stderr, leave=False):
            t = time.perf_counter()
            seq = engine.generate(ids, params)
            seconds += time.perf_counter() - t
            tokens += len(seq.output)
        steps = [e for e in events if e.step_index >= 0]
        rate = tokens / seconds
        base = base or rate
        row = {"config": cfg, "tokens_per_s": rate, "speedup": rate / base, "tokens_per_step": tokens / len(steps),
               "draft_ms": 1e3 * statistics.mean(e.draft_s for e in steps),
               "verify_ms": 1e3 * statistics.mean(e.verify_s for e in steps),
               "nodes": statistics.mean(e.k for e in steps)}
        rows.append(row)
        print(f"{cfg:14s} {rate:6.1f} tok/s {row['speedup']:5.2f}x  tokens/step {row['tokens_per_step']:.2f}  "
              f"draft {row['draft_ms']:.2f} ms  verify {row['verify_ms']:.2f} ms  nodes {row['nodes']:.1f}", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"workload": args.workload, "limit": args.limit, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
