"""Adaptive lookahead vs every fixed K, per workload domain (--dtype precision, greedy, one process, same prompts).

Policies are interleaved prompt by prompt (each prompt is decoded by every policy in turn, the order
rotating), so a slow spell of the machine lands on all of them alike; each policy keeps one engine for
the whole run, so adaptive policies learn as they would in a server. tokens/s = all tokens a policy
emitted / all its wall time (prefills included), over every prompt and repeat.

Examples:
  python -m scripts.bench_lookahead
  python -m scripts.bench_lookahead --domains code --limit 4 --policies 1,2,4,auto
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from app.commands._common import DTYPE_HELP


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domains", default="code,chat,rewrite")
    ap.add_argument("--policies", default="1,2,3,4,5,6,7,8,heuristic,entropy,cost,auto")
    ap.add_argument("--drafter", default=None, help="default: the bundled draft when present, else ngram")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2, help="passes over the prompts; all of them count")
    ap.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    ap.add_argument("--json", default="bench-results/lookahead.json")
    args = ap.parse_args()

    from tqdm import tqdm

    from serving.kernels import resolve_dtype
    from serving.models import BUNDLED_DRAFT_DIR
    from serving.sampling import SamplingParams
    from serving.worker import EngineSpec, default_drafter, load, warm_up
    from serving.workloads import load_workload

    drafter = args.drafter or ("draft" if (BUNDLED_DRAFT_DIR / "config.json").is_file() else default_drafter(None))
    loaded = load(EngineSpec(drafter=drafter, dtype=resolve_dtype(args.dtype, max_batch=1)))
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    policies = args.policies.split(",")
    out: dict = {"drafter": loaded.drafter_label, "method": "interleaved per prompt", "repeats": args.repeats,
                 "limit": args.limit, "max_new_tokens": args.max_new_tokens, "domains": {}}
    for domain in args.domains.split(","):
        prompts = load_workload(domain, limit=args.limit)
        enc = [loaded.encode(p) for p in prompts]
        warm_up(loaded, "spec", enc)
        engines = {}
        for pol in policies:
            loaded.spec.k = pol
            engines[pol] = loaded.engine("spec", max_batch=1)
        tokens = dict.fromkeys(policies, 0)
        seconds = dict.fromkeys(policies, 0.0)
        accepted = dict.fromkeys(policies, 0)
        drafted = dict.fromkeys(policies, 0)
        turn = 0
        with tqdm(total=args.repeats * len(enc) * len(policies), desc=domain, file=sys.stderr) as bar:
            for _ in range(args.repeats):
                for ids in enc:
                    order = policies[turn % len(policies):] + policies[: turn % len(policies)]
                    turn += 1
                    for pol in order:
                        t0 = time.perf_counter()
                        seq = engines[pol].add(ids, params, domain=domain)
                        while not seq.done:
                            engines[pol].step()
                        seconds[pol] += time.perf_counter() - t0
                        tokens[pol] += len(seq.output)
                        accepted[pol] += seq.num_accepted
                        drafted[pol] += seq.num_draft_tokens
                        bar.update()
        best = {p: tokens[p] / seconds[p] for p in policies}
        for pol in policies:
            print(f"{domain:<8} {pol:<10} {best[pol]:7.1f} tok/s  acceptance {accepted[pol] / max(drafted[pol], 1):.3f}",
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
