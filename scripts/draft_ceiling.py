"""Three ceilings on the draft+ngram alpha of a feature-level draft, on the code workload (simulated, greedy).

  transfer  Does a little workload-style data help on unseen workload prompts? The draft is fine-tuned
            on the target's answers to half of the code workload's prompts (every other one) and
            measured on the other half, then the other way round. A diagnostic only: a shipped draft
            never trains on evaluation prompts.
  gate      Would choosing per step between prompt lookup and the draft raise alpha? Both proposals are
            made at every step and alpha is measured under several rules, including an oracle that takes
            whichever one the target accepts further.
  sure      How much of the gap is tokens the target is sure of? Wherever the target's own probability of
            its next token is at least --min-p (optionally only for --kinds of token), the draft's proposal
            is replaced by the target's token (an oracle for those positions only, while the chain is on
            the target's path); alpha is measured for each --min-p beside the engine as it is.

All three walk the target's stored greedy answers (no target forward runs; the answers are generated once and
cached, as scripts.draft_generalization does) with K tokens a step, the draft's first token reading the
target's real feature and the engine's copy prior applied.

Examples:
  python -m scripts.draft_ceiling gate
  python -m scripts.draft_ceiling transfer --steps 30 --lr 1e-4
  python -m scripts.draft_ceiling gate --draft /tmp/my-draft --json gate.json
  python -m scripts.draft_ceiling sure --dtype bfloat16 --max-new-tokens 96 --min-p 0.95 0.8 0.5
  python -m scripts.draft_ceiling sure --min-p 0.95 --kinds "word piece"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from app.commands._common import DTYPE_HELP

RULES = ("engine", "draft", "oracle", "agree", "conf0.5", "conf0.3")
RULE_HELP = {
    "engine": "the engine's rule: prompt lookup where the last two tokens repeat, else the draft",
    "draft": "the draft only",
    "oracle": "whichever of the two the target accepts further (not realisable: an upper bound)",
    "agree": "lookup only where its first token equals the draft's",
    "conf0.5": "lookup unless the draft gives its own first token p >= 0.5 (and disagrees)",
    "conf0.3": "lookup unless the draft gives its own first token p >= 0.3 (and disagrees)",
}



def _f(value, spec: str) -> str:
    """A simulate_alpha figure, or '—' where nothing was drafted (None)."""
    width = spec.split(".")[0]  # '>6' of '>6.3f': the column keeps its width
    return format("—", width) if value is None else format(value, spec)


def _accepted(props: list[int], toks, n: int) -> int:
    a = 0
    while a < len(props) and props[a] == int(toks[n + 1 + a]):
        a += 1
    return a


def gate_alpha(draft, prep, rule: str, k: int, lookup, copy_bias: float) -> float:
    """Per-token alpha (accepted / tested) over the code sequences of `prep` when `rule` picks, step by
    step, between prompt lookup's and the draft's proposals."""
    import torch

    from serving.distill.train import primed_draft
    from serving.drafters import ContextFollowers
    from serving.llama import contiguous_batch

    row_of = draft.head_index().tolist()
    accepted = tested = 0
    with torch.inference_mode():
        for s in prep.seqs:
            if s["domain"] != "code":
                continue
            L, P = s["length"], s["num_prompt"]
            toks, feats, cache = primed_draft(draft, prep, s, k)
            tok_list, followers = toks.tolist(), ContextFollowers()
            n, real_upto = P, P - 1
            while n + 1 <= L - 1:
                kk, s0 = min(k, L - 1 - n), n - 1
                if real_upto < s0:  # the cache's real entries up to the step's last verified position
                    draft(toks[real_upto + 1: s0 + 1][None], feats[real_upto: s0][None],
                          contiguous_batch(0, 1, real_upto, s0 - real_upto), cache)
                    real_upto = s0
                looked = lookup(tok_list[: n + 1], kk)[:kk]
                followers.update(tok_list[: n + 1], row_of)
                tok, f, chain, conf = toks[n: n + 1], feats[s0: s0 + 1], [], []
                for j in range(kk):
                    h, logits = draft(tok[None], f[None], contiguous_batch(0, 1, s0 + j, 1), cache)
                    lg = logits[0, -1].clone()
                    rows = followers.rows.get(int(tok[0]))
                    if rows:
                        lg[rows] += copy_bias
                    i = lg.argmax()
                    conf.append(float(torch.softmax(lg.float(), -1)[i]))
                    tok, f = draft.head_token_ids[i].view(1), h[0, -1:]
                    chain.append(int(tok[0]))
                real_upto = s0 + 1
                a_look, a_draft = _accepted(looked, toks, n), _accepted(chain, toks, n)
                if rule == "engine":
                    use_lookup = bool(looked)
                elif rule == "draft":
                    use_lookup = False
                elif rule == "oracle":
                    use_lookup = bool(looked) and a_look >= a_draft
                elif rule == "agree":
                    use_lookup = bool(looked) and looked[0] == chain[0]
                else:  # confX: the draft overrides lookup only where it is sure and disagrees
                    sure = conf[0] >= float(rule[len("conf"):])
                    use_lookup = bool(looked) and (looked[0] == chain[0] or not sure)
                props, a = (looked, a_look) if use_lookup else (chain, a_draft)
                accepted += a
                tested += a + (a < len(props))
                n += a + 1
    return accepted / max(tested, 1)


def sure_oracle(prep, min_p: float, kinds: set[str] | None = None, kind_of=None):
    """`simulate_alpha`'s force hook: the target's own token wherever its probability is >= min_p (and its
    kind is among `kinds`, when given); the draft's proposal elsewhere."""

    def force(seq: dict, m: int) -> int | None:
        o = seq["offset"]
        if float(prep.topk_probs[o + m - 1, 0]) < min_p:  # row m-1 holds the target's confidence in token m
            return None
        want = int(prep.tokens[o + m])
        return want if kinds is None or kind_of(want) in kinds else None

    return force


def sure(draft, prep, args, lookup, copy_bias: float, kind_of) -> list[dict]:
    import torch

    from serving.distill.train import simulate_alpha

    kinds = set(args.kinds) if args.kinds else None
    rows = []
    with torch.inference_mode():
        for min_p in [None, *args.min_p]:
            force = None if min_p is None else sure_oracle(prep, min_p, kinds, kind_of)
            r = simulate_alpha(draft, prep, k=args.k, domains=("code",), lookup=lookup, copy_bias=copy_bias,
                               force=force)["code"]
            rows.append({"min_p": min_p, "kinds": sorted(kinds) if kinds and min_p is not None else None,
                         "alpha": r["alpha"], "acceptance_rate": r["acceptance_rate"],
                         "mean_accept_len": r["mean_accept_len"]})
            what = ("the engine as it is" if min_p is None else
                    f"the target's token where it is >= {min_p:g} sure" + (f" ({', '.join(sorted(kinds))})" if kinds else ""))
            r = rows[-1]  # None where nothing was drafted (simulate_alpha)
            print(f"{_f(r['alpha'], '>6.3f')} {_f(r['acceptance_rate'], '>9.3f')} {_f(r['mean_accept_len'], '>8.2f')}   {what}",
                  flush=True)
    return rows


def transfer(draft_dir: Path, target, prep, args, lookup, copy_bias: float) -> list[dict]:
    import torch

    from serving.distill.train import TrainConfig, simulate_alpha, train
    from serving.eagle import load_eagle

    code = [s for s in prep.seqs if s["domain"] == "code"]
    halves = {"A": code[0::2], "B": code[1::2]}

    def alpha(d, seqs) -> float:
        sub = dataclasses.replace(prep, seqs=seqs)
        return simulate_alpha(d, sub, k=args.k, domains=("code",), lookup=lookup, copy_bias=copy_bias)["code"]["alpha"]

    base = load_eagle(draft_dir, target, torch.float32)
    before = {h: alpha(base, seqs) for h, seqs in halves.items()}
    out = []
    for tuned, other in (("A", "B"), ("B", "A")):
        d = load_eagle(draft_dir, target, torch.float32)
        for p in d.parameters():
            p.requires_grad_(True)
        for p in target.parameters():
            p.requires_grad_(False)
        cfg = TrainConfig(steps=args.steps, lr=args.lr, warmup_steps=min(5, args.steps), dtype="float32")
        train(d, [dataclasses.replace(prep, seqs=halves[tuned])], cfg, progress=True)
        d.eval()
        out.append({"tuned_on": tuned, "measured_on": other, "before": before[other], "after": alpha(d, halves[other]),
                    "tuned_half_before": before[tuned], "tuned_half_after": alpha(d, halves[tuned])})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=("transfer", "gate", "sure"))
    ap.add_argument("--target", default=None, help="target model name or directory (default: the bundled target)")
    ap.add_argument("--draft", default=None, help="feature-level draft directory (default: the bundled draft)")
    ap.add_argument("--k", type=int, default=4, help="tokens drafted a step (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="answer length (default 128)")
    ap.add_argument("--dtype", default="float32", choices=("auto", "bfloat16", "float32"), help=DTYPE_HELP)
    ap.add_argument("--steps", type=int, default=30, help="transfer: fine-tuning steps (default 30)")
    ap.add_argument("--lr", type=float, default=1e-4, help="transfer: learning rate (default 1e-4)")
    ap.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES,
                    help="gate: rules to measure; " + "; ".join(f"{r}: {h}" for r, h in RULE_HELP.items()))
    ap.add_argument("--min-p", type=float, nargs="+", default=[0.95, 0.8, 0.5],
                    help="sure: the target confidences from which its token is given (default 0.95 0.8 0.5)")
    ap.add_argument("--kinds", nargs="+", default=None,
                    help="sure: give only tokens of these kinds: whitespace, punctuation, 'word start', 'word piece' "
                         "(default: every kind)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.k < 1 or args.max_new_tokens < 2 or args.steps < 1 or args.lr <= 0:
        print("error: --k and --steps must be >= 1, --max-new-tokens >= 2, --lr > 0", file=sys.stderr)
        return 2
    if not all(0 <= p <= 1 for p in args.min_p):
        print(f"error: --min-p values must lie in [0, 1], got {args.min_p}", file=sys.stderr)
        return 2

    from serving.distill.train import TOKEN_KINDS

    if args.kinds and set(args.kinds) - set(TOKEN_KINDS):
        print(f"error: --kinds must be among {', '.join(TOKEN_KINDS)}, got {args.kinds}", file=sys.stderr)
        return 2

    import torch

    from scripts.draft_generalization import engine_lookup, resolve_draft
    from serving.distill.data import load_prepared
    from serving.distill.pipeline import eval_data
    from serving.eagle import load_eagle
    from serving.kernels import resolve_dtype
    from serving.llama import load_causal_lm
    from serving.models import resolve_model

    dtype = getattr(torch, resolve_dtype(args.dtype))
    model_dtype = torch.float32 if args.experiment != "sure" else dtype  # sure: the draft as the engine runs it
    target_dir = resolve_model(args.target, "target")
    draft_dir = resolve_draft(args.draft)
    if draft_dir is None:
        return 2
    prep = load_prepared(eval_data(target_dir, args.max_new_tokens, lambda m: print(m, file=sys.stderr), dtype))
    target = load_causal_lm(target_dir, model_dtype)
    lookup, bias = engine_lookup()
    try:
        if args.experiment == "sure":
            from serving.distill.train import kind_of_token
            from serving.models import load_tokenizer

            kind_of = kind_of_token(load_tokenizer(target_dir))
            print(f"{'alpha':>6} {'acc. rate':>9} {'acc. len':>8}   the draft's proposals, except ...")
            result = sure(load_eagle(draft_dir, target, model_dtype), prep, args, lookup, bias, kind_of)
        elif args.experiment == "gate":
            draft = load_eagle(draft_dir, target, torch.float32)
            result = {}
            print(f"{'rule':<8} {'alpha':>6}  what picks the step's proposal")
            for rule in args.rules:
                result[rule] = round(gate_alpha(draft, prep, rule, args.k, lookup, bias), 4)
                print(f"{rule:<8} {result[rule]:>6.3f}  {RULE_HELP[rule]}", flush=True)
        else:
            result = transfer(draft_dir, target, prep, args, lookup, bias)
            print(f"{'tuned on':<9} {'measured on':<12} {'before':>6} {'after':>6}   tuned half before -> after")
            for r in result:
                print(f"{r['tuned_on']:<9} {r['measured_on']:<12} {r['before']:>6.3f} {r['after']:>6.3f}   "
                      f"{r['tuned_half_before']:.3f} -> {r['tuned_half_after']:.3f}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps({"experiment": args.experiment, "draft": str(draft_dir), "k": args.k,
                                               "dtype": args.dtype, "result": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
