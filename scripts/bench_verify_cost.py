"""What verification costs on this machine: the target's forward time for 1..8 tokens per sequence, at
one or more batch sizes.

Speculative decoding assumes that verifying K drafted tokens plus the pending one costs about one
forward. Where it does not (CPUs without fast low-precision matrix units, or a batch already large
enough to keep the matrix units busy), no draft can make up for it; this prints the ceiling: with a
perfect draft (every token accepted) that costs nothing, at batch size B,

    ceiling(B, K) = (K + 1) * t(B, 1) / t(B, K + 1)

where t(B, n) is one forward over n new tokens for each of B sequences. The ceiling falls as B grows:
where it nears 1, speculation stops paying whatever the draft (the crossover a concurrency sweep,
`specfinops bench --concurrency 1,2,4,8`, measures end to end).

Widths are timed in rounds (1, 2, ..., max, then again), so a machine whose speed drifts during the run
slows every width alike; each figure is the median of its rounds.

Examples:
  python -m scripts.bench_verify_cost
  python -m scripts.bench_verify_cost --dtypes bfloat16 --context 512
  python -m scripts.bench_verify_cost --dtypes bfloat16 --batch 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def forward_ms_by_width(model, batch: int, widths: list[int], context: int, reps: int) -> dict[int, float]:
    """Median ms of one target forward over n new tokens for each of `batch` sequences with `context`
    cached tokens each, for every n in `widths`, with every position's logits, as verification needs.
    The widths take turns, `reps` rounds."""
    import torch

    from serving.llama import contiguous_batch, ragged_batch

    vocab = model.cfg.vocab_size
    times: dict[int, list[float]] = {n: [] for n in widths}
    with torch.inference_mode():
        cache = model.new_cache(batch, context + max(widths) + 1)
        for slot in range(batch):
            model(torch.randint(0, vocab, (1, context)), contiguous_batch(slot, 1, 0, context), cache)
        for _ in range(reps):
            for n in widths:
                x = torch.randint(0, vocab, (batch, n))
                fb = (contiguous_batch(0, 1, context, n) if batch == 1
                      else ragged_batch(list(range(batch)), [context] * batch, n))
                t0 = time.perf_counter()
                model(x, fb, cache)
                times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(v) * 1e3 for n, v in times.items()}


def ceilings(ms: dict[int, float]) -> dict[int, float]:
    """Perfect-draft ceiling by K from forward times by width: (K + 1) t(1) / t(K + 1)."""
    return {k: (k + 1) * ms[1] / ms[k + 1] for k in range(1, max(ms)) if k + 1 in ms}


def summary(ms: dict[int, float]) -> dict:
    ceiling = ceilings(ms)
    best = max(ceiling, key=ceiling.get)
    return {"forward_ms": {str(t): round(v, 2) for t, v in ms.items()},
            "verify_ratio": {str(t): round(v / ms[1], 3) for t, v in ms.items()},
            "ceiling_by_k": {str(k): round(v, 3) for k, v in ceiling.items()},
            "best_k": best, "ceiling": round(ceiling[best], 3)}


def _batches(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch takes a comma-separated list of integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"--batch sizes must be >= 1, got {text!r}")
    return values


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache, per sequence")
    ap.add_argument("--max-tokens", type=int, default=8, help="largest number of new tokens per sequence (>= 2)")
    ap.add_argument("--batch", type=_batches, default=[1], metavar="B[,B...]",
                    help="batch sizes (sequences verified together), e.g. 1,2,4,8 (default 1)")
    ap.add_argument("--reps", type=int, default=9, help="rounds over the widths (the median is kept)")
    ap.add_argument("--json", default="bench-results/verify_cost.json")
    args = ap.parse_args()
    if args.max_tokens < 2 or args.reps < 1 or args.context < 1:
        ap.error("--max-tokens must be >= 2, --reps and --context >= 1")

    import torch
    from tqdm import tqdm

    from serving.kernels import pack_for_inference
    from serving.llama import load_causal_lm
    from serving.models import resolve_model

    torch.set_grad_enabled(False)
    target_dir = resolve_model(None, "target")
    widths = list(range(1, args.max_tokens + 1))
    out: dict = {"target": target_dir.name, "context": args.context, "threads": torch.get_num_threads(),
                 "batches": args.batch, "dtypes": {}}
    for name in args.dtypes.split(","):
        model = load_causal_lm(target_dir, getattr(torch, name))
        pack_for_inference(model)  # as the engine runs it
        by_batch = {}
        for b in tqdm(args.batch, desc=name, file=sys.stderr):
            ms = forward_ms_by_width(model, b, widths, args.context, args.reps)
            by_batch[b] = summary(ms)
            print(f"{name} batch {b}: forward ms by tokens per sequence "
                  f"{', '.join(f'{t}:{v:.1f}' for t, v in ms.items())}; "
                  f"perfect-draft ceiling {by_batch[b]['ceiling']:.2f}x at K={by_batch[b]['best_k']}")
        # batch 1 (or the smallest batch) at the top level, as before; every batch under by_batch
        out["dtypes"][name] = {**by_batch[args.batch[0]], "batch": args.batch[0],
                               "by_batch": {str(b): s for b, s in by_batch.items()}}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
