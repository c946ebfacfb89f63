"""Replay lookahead policies offline, without timing noise, on the bundled draft's real proposals.

Greedy speculative decoding is deterministic: at each position n of the target's greedy answer the draft
proposes the same chain whatever K is asked for (a longer K only extends it). So one pass records, for
every position, how many of the draft's next 8 tokens match the target (m) and the draft's confidence in
each; any policy can then be replayed in microseconds against a step-time model

    T(K) = K * draft_ms + verify_ms(K + 1)

measured on this machine (the target's forward for K+1 tokens, batch 1). The replay drives the real
policy objects of serving/lookahead.py, so their logic is what is compared; `make bench` (section
lookahead) measures the same policies with real wall-clock time.

Examples:
  python -m scripts.sim_lookahead
  python -m scripts.sim_lookahead --max-new-tokens 128 --policies 1,2,3,4,heuristic,cost,auto
  python -m scripts.sim_lookahead --policies 3,4,auto --noise 0.05,0.02,40   # timing noise as on a shared VM
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

K_MAX = 8


def record_chains(draft, prep, k_max: int = K_MAX) -> list[dict]:
    """Per sequence: m[i] (matched draft tokens, 0..k_max) and conf[i][j] for pending position P + i."""
    import torch

    from serving.distill.train import primed_draft
    from serving.llama import contiguous_batch

    out = []
    with torch.inference_mode():
        for s in prep.seqs:
            L, P = s["length"], s["num_prompt"]
            toks, feats, cache = primed_draft(draft, prep, s, k_max)
            ms, confs = [], []
            for n in range(P, L - 1):
                s0 = n - 1
                tok, f = toks[n: n + 1], feats[s0: s0 + 1]
                props, conf = [], []
                for j in range(min(k_max, L - 1 - n)):
                    h, logits = draft(tok[None], f[None], contiguous_batch(0, 1, s0 + j, 1), cache)
                    p, i = logits[0, -1].softmax(-1).max(-1)
                    t = draft.head_token_ids[i]
                    props.append(int(t))
                    conf.append(round(float(p), 4))
                    tok, f = t.view(1), h[0, -1:]
                a = 0
                while a < len(props) and props[a] == int(toks[n + 1 + a]):
                    a += 1
                ms.append(a)
                confs.append(conf)
            out.append({"domain": s["domain"], "m": ms, "conf": confs})
    return out


def noisy_clock(seed: int, sigma: float = 0.05, stall_p: float = 0.02, drift: float = 0.01):
    """A machine as a shared 2-core VM is: each step's time times a speed that wanders (a random walk
    within 0.8-1.3x), a lognormal jitter of `sigma`, and now and then (`stall_p`) a stall of 1.2-2.8x,
    under the 3x beyond which the policy ignores a step. Returns ms -> the ms the policy is told."""
    import random

    rng, speed = random.Random(seed), [1.0]

    def clock(ms: float) -> float:
        speed[0] = min(1.3, max(0.8, speed[0] * (1 + rng.gauss(0, drift))))
        out = ms * speed[0] * rng.lognormvariate(0, sigma)
        return out * rng.uniform(1.2, 2.8) if rng.random() < stall_p else out

    return clock


def replay(policy, chains: list[dict], step_ms, draft_ms: float = 0.0, clock=None) -> dict:
    """Run `policy` over every recorded sequence; returns tokens, ms and tokens/s. With `clock` (see
    `noisy_clock`) the policy is told noisy step times, while ms and tokens/s stay the steps' true cost:
    what is scored is the policy's choices, not the noise's luck."""
    tokens = 0
    ms = 0.0
    for sid, c in enumerate(chains):
        seq = SimpleNamespace(seq_id=sid, domain=c["domain"])
        n, L = 0, len(c["m"])
        while n < L:
            k, _ = policy.choose(seq, 1)
            k = min(k, L - n)
            rules = policy.stop_rules([seq], [k], 1) if k else None
            for j, p in enumerate(c["conf"][n][:k]):
                keep = j + 1 if policy.stop_below is not None and p < policy.stop_below else None
                if rules and rules[0] is not None:
                    r = rules[0](j, p)
                    keep = r if keep is None or (r is not None and r < keep) else keep
                if keep is not None:
                    k = keep
                    break
            a = min(c["m"][n], k)
            t = step_ms(k)
            d = draft_ms * k
            told = clock(t) if clock else t
            policy.observe(seq, k, a, d * told / t / 1000.0, (told - d * told / t) / 1000.0, 1,
                           conf=c["conf"][n][:k])
            tokens += a + 1
            ms += t
            n += a + 1
        policy.forget(seq)
    return {"tokens": tokens, "ms": ms, "tokens_per_s": 1000.0 * tokens / ms}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domains", default="code,chat,rewrite")
    ap.add_argument("--policies", default="1,2,3,4,5,6,7,8,heuristic,entropy,cost,auto")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--verify-ms", default=None,
                    help="comma list of the target's forward ms for 1..9 tokens (default: measure)")
    ap.add_argument("--draft-ms", type=float, default=None, help="draft ms per token (default: measure)")
    ap.add_argument("--chains", default="bench-results/sim_chains.json", help="cache of the recorded chains")
    ap.add_argument("--noise", default=None, metavar="SIGMA,STALL,SEEDS",
                    help="also replay under a noisy clock (noisy_clock: jitter SIGMA, stall chance STALL) with "
                         "SEEDS seeds, and print each policy's worst and median tokens/s, e.g. 0.05,0.02,40")
    ap.add_argument("--json", default="bench-results/sim_lookahead.json")
    args = ap.parse_args()

    import torch

    from serving.distill.data import load_prepared
    from serving.distill.pipeline import eval_data
    from serving.eagle import load_eagle
    from serving.int8 import quantize_draft
    from serving.kernels import pack_for_inference
    from serving.llama import load_causal_lm
    from serving.lookahead import parse_policy
    from serving.models import BUNDLED_DRAFT_DIR, resolve_model

    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    target_dir = resolve_model(None, "target")
    target = load_causal_lm(target_dir, torch.bfloat16)
    draft = load_eagle(BUNDLED_DRAFT_DIR, target, torch.bfloat16)
    pack_for_inference(target)  # as the engine runs them
    pack_for_inference(draft)
    quantize_draft(draft)
    cache = Path(args.chains)
    key = f"{BUNDLED_DRAFT_DIR.resolve()}:{(BUNDLED_DRAFT_DIR / 'model.safetensors').stat().st_mtime}:{args.max_new_tokens}"
    if cache.is_file() and json.loads(cache.read_text()).get("key") == key:
        chains = json.loads(cache.read_text())["chains"]
    else:
        prep = load_prepared(eval_data(target_dir, args.max_new_tokens, say))
        t0 = time.perf_counter()
        chains = record_chains(draft, prep)
        say(f"recorded {sum(len(c['m']) for c in chains)} positions in {time.perf_counter() - t0:.0f} s")
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"key": key, "chains": chains}))
    if args.verify_ms:
        verify = [0.0] + [float(x) for x in args.verify_ms.split(",")]
    else:
        from scripts.bench_verify_cost import forward_ms
        verify = [0.0] + [forward_ms(target, n, 200, 9) for n in range(1, K_MAX + 2)]
    draft_ms = args.draft_ms
    if draft_ms is None:
        from serving.distill.train import measure_c
        draft_ms = measure_c(draft, target)["draft_ms"]
    say("verify ms " + ", ".join(f"{v:.1f}" for v in verify[1:]) + f"; draft {draft_ms:.2f} ms/token")
    step_ms = lambda k: k * draft_ms + verify[k + 1]  # noqa: E731
    out = {"verify_ms": verify, "draft_ms": draft_ms, "domains": {}}
    for dom in args.domains.split(","):
        cs = [c for c in chains if c["domain"] == dom]
        row = {p: round(replay(parse_policy(p), cs, step_ms, draft_ms)["tokens_per_s"], 2) for p in args.policies.split(",")}
        fixed = {p: v for p, v in row.items() if p.isdigit() and p != "0"}
        line = "  ".join(f"{p}:{v:.1f}" for p, v in row.items())
        if fixed and "auto" in row:
            best, med = max(fixed.values()), statistics.median(fixed.values())
            line += f"   auto/best {row['auto'] / best:.3f}  auto/median {row['auto'] / med:.3f}"
        print(f"{dom:<8} {line}")
        out["domains"][dom] = row
        if args.noise:
            sigma, stall, seeds = (float(x) for x in args.noise.split(","))
            noisy = {}
            for p in args.policies.split(","):
                got = [replay(parse_policy(p), cs, step_ms, draft_ms, noisy_clock(seed, sigma, stall))["tokens_per_s"]
                       for seed in range(int(seeds))]
                noisy[p] = {"worst": round(min(got), 2), "median": round(statistics.median(got), 2)}
            print(f"{'':<8} noisy clock (jitter {sigma:g}, stalls {stall:g}, {int(seeds)} seeds), worst/median: "
                  + "  ".join(f"{p}:{v['worst']:.1f}/{v['median']:.1f}" for p, v in noisy.items()))
            out["domains"][dom + ":noisy"] = noisy
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
