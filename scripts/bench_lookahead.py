"""Adaptive lookahead vs every fixed K, per workload domain (bf16, greedy, one process, same prompts).

Examples:
  python -m scripts.bench_lookahead
  python -m scripts.bench_lookahead --domains code --limit 4 --policies 1,2,4,auto
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domains", default="code,chat,rewrite")
    ap.add_argument("--policies", default="1,2,3,4,5,6,7,8,heuristic,entropy,cost,auto")
    ap.add_argument("--drafter", default=None, help="default: the bundled draft when present, else ngram")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repeats; the best tokens/s counts")
    ap.add_argument("--json", default="bench-results/lookahead.json")
    args = ap.parse_args()

    from serving.models import BUNDLED_DRAFT_DIR
    from serving.sampling import SamplingParams
    from serving.worker import EngineSpec, default_drafter, load, run_prompts, warm_up
    from serving.workloads import load_workload

    drafter = args.drafter or ("draft" if (BUNDLED_DRAFT_DIR / "config.json").is_file() else default_drafter(None))
    loaded = load(EngineSpec(drafter=drafter, dtype="bfloat16"))
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    policies = args.policies.split(",")
    out: dict = {"drafter": loaded.drafter_label, "domains": {}}
    for domain in args.domains.split(","):
        prompts = load_workload(domain, limit=args.limit)
        enc = [loaded.encode(p) for p in prompts]
        warm_up(loaded, "spec", enc)
        best: dict[str, float] = {}
        for _ in range(args.repeats):
            for pol in policies:
                loaded.spec.k = pol
                res = run_prompts(loaded, "spec", prompts, enc, params)
                best[pol] = max(best.get(pol, 0.0), res.tokens_per_s or 0.0)
                print(f"{domain:<8} {pol:<10} {res.tokens_per_s:7.1f} tok/s  alpha {res.acceptance_rate or 0:.3f}",
                      file=sys.stderr)
        fixed = {p: v for p, v in best.items() if p.isdigit()}
        row = {"tokens_per_s": best}
        if fixed:
            row["best_fixed_k"] = max(fixed, key=fixed.get)
            row["best_fixed_tokens_per_s"] = max(fixed.values())
            row["median_fixed_tokens_per_s"] = statistics.median(fixed.values())
            if "auto" in best:
                row["auto_vs_best_fixed"] = best["auto"] / row["best_fixed_tokens_per_s"]
                row["auto_vs_median_fixed"] = best["auto"] / row["median_fixed_tokens_per_s"]
        out["domains"][domain] = row
        print(json.dumps({domain: row}, indent=1))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
