"""What verification costs on this machine: the target's forward time for 1..8 tokens (batch 1).

Speculative decoding assumes that verifying K drafted tokens plus the pending one costs about one
forward. Where it does not (CPUs without fast low-precision matrix units), no draft can make up for
it; this prints the ceiling: with a perfect draft (every token accepted) that costs nothing,

    ceiling(K) = (K + 1) * t(1) / t(K + 1)

Examples:
  python -m scripts.bench_verify_cost
  python -m scripts.bench_verify_cost --dtypes bfloat16 --context 512
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def forward_ms(model, tokens: int, context: int, reps: int, cache=None) -> float:
    """Median ms of one target forward over `tokens` new tokens after `context` cached ones (batch 1),
    with every position's logits, as verification needs."""
    import torch

    from serving.llama import contiguous_batch

    with torch.inference_mode():
        if cache is None:
            cache = model.new_cache(1, context + tokens + 1)
            model(torch.randint(0, model.cfg.vocab_size, (1, context)), contiguous_batch(0, 1, 0, context), cache)
        x = torch.randint(0, model.cfg.vocab_size, (1, tokens))
        fb = contiguous_batch(0, 1, context, tokens)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            model(x, fb, cache)
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", default="bench-results/verify_cost.json")
    args = ap.parse_args()

    import torch
    from tqdm import tqdm

    from serving.kernels import pack_for_inference
    from serving.llama import contiguous_batch, load_causal_lm
    from serving.models import resolve_model

    torch.set_grad_enabled(False)
    target_dir = resolve_model(None, "target")
    out: dict = {"target": target_dir.name, "context": args.context, "threads": torch.get_num_threads(),
                 "dtypes": {}}
    for name in args.dtypes.split(","):
        model = load_causal_lm(target_dir, getattr(torch, name))
        pack_for_inference(model)  # as the engine runs it
        cache = model.new_cache(1, args.context + args.max_tokens + 1)
        model(torch.randint(0, model.cfg.vocab_size, (1, args.context)), contiguous_batch(0, 1, 0, args.context), cache)
        ms = {t: forward_ms(model, t, args.context, args.reps, cache)
              for t in tqdm(range(1, args.max_tokens + 1), desc=name, file=sys.stderr)}
        ceiling = {k: (k + 1) * ms[1] / ms[k + 1] for k in range(1, args.max_tokens)}
        best = max(ceiling, key=ceiling.get)
        out["dtypes"][name] = {"forward_ms": {str(t): round(v, 2) for t, v in ms.items()},
                               "verify_ratio": {str(t): round(v / ms[1], 3) for t, v in ms.items()},
                               "ceiling_by_k": {str(k): round(v, 3) for k, v in ceiling.items()},
                               "best_k": best, "ceiling": round(ceiling[best], 3)}
        print(f"{name}: forward ms by tokens {', '.join(f'{t}:{v:.1f}' for t, v in ms.items())}; "
              f"perfect-draft ceiling {ceiling[best]:.2f}x at K={best}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
