"""Peer baseline: Hugging Face transformers' own generation on our workload prompts.

Times, per prompt and greedy (do_sample=False, EOS honoured):
  ar          plain autoregressive ``generate``
  ngram       assisted generation with ``prompt_lookup_num_tokens=K`` (prompt lookup, no model)
  draft       assisted generation with ``assistant_model=<--draft>`` (K tokens a round, constant schedule)
  early-exit  assisted generation with ``assistant_early_exit=N`` (the target's first N layers), if supported

Example:
  .venv/bin/python -m scripts.hf_peer --target DIR --draft DIR --workload code --k 4 \\
      --max-new-tokens 128 --limit 8 --dtype bfloat16 --json peer.json

tokens/s = output tokens / summed ``generate`` wall time over the prompts (one warm-up call per mode first,
not timed). Output tokens are the new ids ``generate`` returned, the EOS token included when it was emitted.
HF's adaptive draft length is switched off (``num_assistant_tokens_schedule='constant'``,
``assistant_confidence_threshold=0``) so every mode drafts exactly K tokens a round, as ours does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DTYPES = ("bfloat16", "float32", "float16")


@dataclass(slots=True)
class ModeRun:
    mode: str
    k: int
    output_tokens: int = 0
    wall_s: float = 0.0
    outputs: dict[str, list[int]] = field(default_factory=dict)
    requests: list[dict] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scripts.hf_peer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target model directory (Hugging Face causal LM)")
    p.add_argument("--draft", help="draft model directory (same tokenizer); enables the 'draft' mode")
    p.add_argument("--workload", default="code", help="builtin workload name or path to a .jsonl file")
    p.add_argument("--domain", help="keep only prompts of this domain")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round for every assisted mode")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=8, help="number of prompts")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    p.add_argument("--early-exit", type=int, metavar="N",
                   help="also time assistant_early_exit=N (the target's first N layers as draft)")
    p.add_argument("--modes", default="ar,ngram,draft,early-exit",
                   help="comma-separated subset of ar,ngram,draft,early-exit (default: all that apply)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    p.add_argument("--json", dest="json_path", help="write the results as JSON to this path")
    return p.parse_args(argv)


def validate(args: argparse.Namespace) -> list[str]:
    """Check the arguments; return the modes to run."""
    if args.k < 1:
        raise ValueError(f"--k must be >= 1, got {args.k}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.early_exit is not None and args.early_exit < 1:
        raise ValueError(f"--early-exit must be >= 1 layer, got {args.early_exit}")
    for flag, path in (("--target", args.target), ("--draft", args.draft)):
        if path is not None and not (Path(path) / "config.json").is_file():
            raise ValueError(f"{flag} {path}: not a model directory (no config.json)")
    known = ("ar", "ngram", "draft", "early-exit")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in known]
    if unknown or not modes:
        raise ValueError(f"--modes: unknown mode(s) {unknown or modes}; expected from {', '.join(known)}")
    if "draft" in modes and args.draft is None:
        modes.remove("draft")
    if "early-exit" in modes and args.early_exit is None:
        modes.remove("early-exit")
    if "ar" not in modes:
        modes.insert(0, "ar")  # the reference for speedup and token identity
    return modes


def early_exit_supported() -> bool:
    from transformers import GenerationConfig

    return hasattr(GenerationConfig(), "assistant_early_exit")


def encode(tokenizer, prompt) -> dict:
    """Token ids for one workload prompt: chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(prompt.as_messages(), add_generation_prompt=True,
                                            tokenize=True, return_dict=True, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if prompt.messages is not None:
        raise ValueError(f"prompt {prompt.id}: has 'messages' but the target tokenizer has no chat template")
    enc = tokenizer(prompt.prompt, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def fix_assistant_k(model, k: int) -> None:
    """Make HF draft exactly k tokens a round (no heuristic growth, no confidence early stop)."""
    gc = model.generation_config
    gc.num_assistant_tokens = k
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0


def mode_kwargs(mode: str, args: argparse.Namespace, draft_model) -> dict:
    if mode == "ar":
        return {}
    if mode == "ngram":
        return {"prompt_lookup_num_tokens": args.k}
    if mode == "draft":
        return {"assistant_model": draft_model}
    if mode == "early-exit":
        return {"assistant_early_exit": args.early_exit}
    raise ValueError(f"unknown mode {mode!r}")


def run(args: argparse.Namespace) -> dict:
    modes = validate(args)
    notes: list[str] = []
    if "early-exit" in modes and not early_exit_supported():
        modes.remove("early-exit")
        notes.append("assistant_early_exit is not supported by this transformers version; early-exit skipped")

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serving.workloads import load_workload

    transformers.utils.logging.disable_progress_bar()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise ValueError(f"--device {args.device!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available to this torch build")

    prompts = load_workload(args.workload, limit=args.limit, domain=args.domain)
    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    draft = None
    if "draft" in modes:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).to(device).eval()
        tv, dv = target.config.get_text_config().vocab_size, draft.config.get_text_config().vocab_size
        if tv != dv:
            raise ValueError(f"draft vocabulary ({dv}) differs from the target's ({tv}); "
                             "use a draft that shares the target's tokenizer")
        fix_assistant_k(draft, args.k)
    fix_assistant_k(target, args.k)  # the early-exit assistant is the target itself

    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = target.generation_config.eos_token_id
        if isinstance(pad_id, list):
            pad_id = pad_id[0]
    inputs = [{k: v.to(device) for k, v in encode(tokenizer, p).items()} for p in prompts]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    common = {"do_sample": False, "max_new_tokens": args.max_new_tokens, "pad_token_id": pad_id,
              "temperature": None, "top_p": None, "top_k": None}

    runs: list[ModeRun] = []
    with torch.inference_mode():
        for mode in modes:
            extra = mode_kwargs(mode, args, draft)
            warm = {**common, **extra, "max_new_tokens": min(8, args.max_new_tokens)}
            target.generate(**inputs[0], **warm)
            r = ModeRun(mode=mode, k=0 if mode == "ar" else args.k)
            for prompt, enc in zip(prompts, inputs, strict=True):
                sync()
                start = time.perf_counter()
                out = target.generate(**enc, **common, **extra)
                sync()
                wall = time.perf_counter() - start
                new_ids = out[0, enc["input_ids"].shape[1]:].tolist()
                r.output_tokens += len(new_ids)
                r.wall_s += wall
                r.outputs[prompt.id] = new_ids
                r.requests.append({"id": prompt.id, "domain": prompt.domain, "prompt_tokens":
                                   int(enc["input_ids"].shape[1]), "output_tokens": len(new_ids),
                                   "wall_s": round(wall, 4)})
            runs.append(r)
            print(f"  {mode:<10} done: {r.output_tokens} tokens in {r.wall_s:.2f} s", file=sys.stderr)

    ar = runs[0]
    return {
        "peer": "hf-transformers",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "target": str(args.target),
        "draft": str(args.draft) if args.draft else None,
        "workload": str(args.workload),
        "dtype": args.dtype,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "max_new_tokens": args.max_new_tokens,
        "prompts": len(prompts),
        "early_exit_layers": args.early_exit,
        "notes": notes,
        "runs": [
            {
                "mode": r.mode,
                "k": r.k,
                "tokens_per_s": round(r.tokens_per_s, 3),
                "output_tokens": r.output_tokens,
                "wall_s": round(r.wall_s, 4),
                "speedup_vs_ar": round(r.tokens_per_s / ar.tokens_per_s, 4) if ar.tokens_per_s else None,
                "token_identical_rate": sum(r.outputs[i] == ar.outputs[i] for i in ar.outputs) / len(ar.outputs),
                "requests": r.requests,
            }
            for r in runs
        ],
    }


def format_table(result: dict) -> str:
    head = f"{'mode':<11}{'k':>3}{'out tok':>9}{'wall s':>9}{'tok/s':>9}{'vs AR':>8}{'same ids':>10}"
    lines = [f"HF transformers {result['transformers_version']} peer, workload {result['workload']}, "
             f"{result['prompts']} prompts, {result['dtype']} on {result['device']}, greedy, max {result['max_new_tokens']} new tokens",
             head, "-" * len(head)]
    for r in result["runs"]:
        lines.append(f"{r['mode']:<11}{r['k']:>3}{r['output_tokens']:>9}{r['wall_s']:>9.2f}"
                     f"{r['tokens_per_s']:>9.1f}{r['speedup_vs_ar']:>7.2f}x{r['token_identical_rate']:>10.0%}")
    lines.extend(f"note: {n}" for n in result["notes"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except (ValueError, OSError) as exc:
        print(f"hf_peer: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(result))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
