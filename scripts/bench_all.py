"""`make bench`: every measured target of the project, printed and recorded under bench-results/.

Sections (each can be picked with --only):
  verify     the target's forward time for 1..8 tokens per sequence at batch 1, 2, 4 and 8, and the
             speedup no draft can exceed at each
  engine     spec vs AR tokens/s on the code workload, greedy, with each drafter (and draft+ngram
             with token trees)
  calibrate  alpha, c and GO / NO-GO per domain for the bundled draft, and for draft+ngram on code
  peer       Hugging Face transformers' assisted generation on the same models, prompts and K
  telemetry  bench tokens/s with telemetry on vs off
  recorder   recorder throughput into SQLite and PostgreSQL
  sweep      concurrency sweep 1..32, AR vs spec, crossover (mixed and code workloads)
  lookahead  adaptive K policies vs every fixed K per domain
  dashboard  every dashboard page's queries over 5M synthetic token events
  serve      HTTP serving under load (if the serve benchmark exists)

Examples:
  python -m scripts.bench_all
  python -m scripts.bench_all --only engine,peer --limit 4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from app.commands._common import DTYPE_HELP

OUT = Path("bench-results")
TREE = "16:6:4:0.25"  # the token-tree shape measured (docs/benchmarks.md has the sweep it came from)
SECTIONS = ("verify", "engine", "calibrate", "peer", "telemetry", "recorder", "sweep", "lookahead", "dashboard",
            "serve")


class Runs:
    """The commands of one `make bench`: which result files each wrote, and which failed. A command's result
    files are removed before it runs, so a failed command leaves none behind, and the summary reads only the
    files this invocation wrote (a file from an earlier run is never shown as current)."""

    def __init__(self) -> None:
        self.fresh: set[str] = set()
        self.failed: list[str] = []

    def sh(self, cmd: list[str], *outputs: str, stdout: Path | None = None) -> int:
        """Run `cmd` (its output streamed, or written to `stdout`); `outputs`: the bench-results/ files it
        writes. Returns its exit status."""
        for name in (*outputs, *([stdout.name] if stdout else [])):
            (OUT / name).unlink(missing_ok=True)
        print("$ " + " ".join(cmd), flush=True)
        t = time.perf_counter()
        if stdout is None:
            rc = subprocess.call(cmd)
        else:
            with stdout.open("w") as fh:
                rc = subprocess.call(cmd, stdout=fh)
        print(f"  ({time.perf_counter() - t:.0f} s, exit {rc})", flush=True)
        made = [*outputs, *([stdout.name] if stdout else [])]
        if rc != 0:
            self.failed.append(f"{' '.join(cmd[2:4])} -> {', '.join(made) or 'its output'} (exit {rc})")
            for name in made:
                (OUT / name).unlink(missing_ok=True)  # a half-written result is not a result
        else:
            self.fresh.update(name for name in made if (OUT / name).is_file())
        return rc

    def load(self, name: str) -> dict:
        """A result file this invocation wrote ({} for one it did not)."""
        return load(name) if name in self.fresh else {}


def bench(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", "bench", *args]


def load(name: str) -> dict:
    path = OUT / name
    return json.loads(path.read_text()) if path.is_file() else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--limit", type=int, default=8,
                    help="prompts per run of the engine and peer sections, half of it for telemetry (default 8; "
                         "the other sections run their own fixed sizes)")
    ap.add_argument("--max-new-tokens", type=int, default=128,
                    help="tokens per answer in the engine and peer sections (default 128)")
    ap.add_argument("--k", type=int, default=4, help="draft length of the engine and peer runs (default 4)")
    ap.add_argument("--early-exit-layers", type=int, default=8,
                    help="layers of the early-exit draft in the engine and peer sections (default 8)")
    ap.add_argument("--dtype", default="auto", help="precision of every engine run: " + DTYPE_HELP)
    args = ap.parse_args()
    only = set(args.only.split(","))
    unknown = only - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    from serving.kernels import resolve_dtype

    # spelled out, so every section runs (and records) the same precision: the fastest for the largest batch run
    dtype = resolve_dtype(args.dtype, max_batch=32 if only & {"sweep", "serve"} else 1)
    print(f"precision: {dtype}", flush=True)
    OUT.mkdir(exist_ok=True)
    db = f"sqlite:///{OUT / 'bench.db'}"
    shared = ["--workload", "code", "--dtype", dtype, "--temperature", "0", "--limit", str(args.limit),
              "--max-new-tokens", str(args.max_new_tokens)]
    common = [*shared, "--k", str(args.k)]
    from serving.models import model_path

    target = str(model_path("target"))
    runs = Runs()
    sh = runs.sh

    if "verify" in only:
        sh([sys.executable, "-m", "scripts.bench_verify_cost", "--batch", "1,2,4,8"], "verify_cost.json")
    if "engine" in only:
        sh(bench(*common, "--mode", "both", "--drafter", "ngram", "--db", db, "--json", str(OUT / "engine_ngram.json")),
           "engine_ngram.json")
        sh(bench(*common, "--mode", "spec", "--drafter", "early-exit", "--early-exit-layers",
                 str(args.early_exit_layers), "--db", db, "--json", str(OUT / "engine_early_exit.json")),
           "engine_early_exit.json")
        from serving.models import BUNDLED_DRAFT_DIR

        if (BUNDLED_DRAFT_DIR / "config.json").is_file():
            sh(bench(*common, "--mode", "both", "--drafter", "draft", "--db", db,
                     "--json", str(OUT / "engine_draft.json")), "engine_draft.json")
            sh(bench(*common, "--mode", "both", "--drafter", "draft+ngram", "--db", db,
                     "--json", str(OUT / "engine_draft_ngram.json")), "engine_draft_ngram.json")
            sh(bench(*shared, "--mode", "both", "--drafter", "draft+ngram", "--tree", TREE, "--db", db,  # its depth is the K
                     "--json", str(OUT / "engine_draft_ngram_tree.json")), "engine_draft_ngram_tree.json")
    if "calibrate" in only:
        from serving.models import BUNDLED_DRAFT_DIR

        if (BUNDLED_DRAFT_DIR / "config.json").is_file():
            for drafter, extra in (("draft", []), ("draft+ngram", ["--workload", "code"])):
                sh([sys.executable, "-m", "app.cli", "calibrate", "--drafter", drafter, "--limit", "6", "--k", "4",
                    "--dtype", dtype, "--json", *extra], stdout=OUT / f"calibrate_{drafter.replace('+', '_')}.json")
    if "peer" in only:
        sh([sys.executable, "-m", "scripts.hf_peer", "--target", target, "--workload", "code", "--k", str(args.k),
            "--max-new-tokens", str(args.max_new_tokens), "--limit", str(args.limit), "--dtype", dtype,
            "--early-exit", str(args.early_exit_layers), "--json", str(OUT / "hf_peer.json")], "hf_peer.json")
    if "telemetry" in only:
        tel = ["--workload", "code", "--mode", "ar", "--dtype", dtype, "--limit", str(max(2, args.limit // 2)), "--max-new-tokens", "64"]
        (OUT / "telemetry_overhead.json").unlink(missing_ok=True)
        for i in range(2):  # interleaved, best of two each: the machine is shared
            sh(bench(*tel, "--no-telemetry", "--json", str(OUT / f"telemetry_off_{i}.json")), f"telemetry_off_{i}.json")
            sh(bench(*tel, "--db", db, "--json", str(OUT / f"telemetry_on_{i}.json")), f"telemetry_on_{i}.json")
        offs = [r["runs"][0]["tokens_per_s"] for i in range(2) if (r := runs.load(f"telemetry_off_{i}.json"))]
        ons = [r["runs"][0]["tokens_per_s"] for i in range(2) if (r := runs.load(f"telemetry_on_{i}.json"))]
        if offs and ons:
            off, on = max(offs), max(ons)
            result = {"tokens_per_s_off": off, "tokens_per_s_on": on, "overhead": 1 - on / off}
            (OUT / "telemetry_overhead.json").write_text(json.dumps(result, indent=1))
            runs.fresh.add("telemetry_overhead.json")
            print(f"telemetry overhead: off {off:.1f} tok/s, on {on:.1f} tok/s -> {result['overhead']:+.1%}")
    if "recorder" in only:
        sh([sys.executable, "-m", "scripts.bench_recorder"], "recorder.json")
    if "sweep" in only:
        # mixed: what a general deployment sees; code: the domain the bundled pair is aligned for
        for workload, name in (("mixed", "sweep.json"), ("code", "sweep_code.json")):
            sh(bench("--workload", workload, "--mode", "both", "--dtype", dtype, "--limit", "32", "--max-new-tokens", "64",
                     "--concurrency", "1,2,4,8,16,32", "--db", db, "--json", str(OUT / name)), name)
    if "lookahead" in only:
        sh([sys.executable, "-m", "scripts.bench_lookahead", "--dtype", dtype, "--policies", "1,2,3,4,5,6,7,8,heuristic,entropy,cost,auto",
            "--limit", "4", "--max-new-tokens", "64", "--repeats", "2"], "lookahead.json")
        sh([sys.executable, "-m", "scripts.sim_lookahead"], "sim_lookahead.json")
    if "dashboard" in only:
        sh([sys.executable, "-m", "scripts.bench_dashboard"], "dashboard.json")
    if "serve" in only and Path("scripts/bench_serve.py").is_file():
        sh([sys.executable, "-m", "scripts.bench_serve", "--dtype", dtype, "--levels", "1,4,16,32", "--duration", "30"],
           "serve.json")
    summarize(runs.load)
    if runs.failed:
        print(f"make bench: {len(runs.failed)} command(s) failed, their results left out of SUMMARY.md:", file=sys.stderr)
        for line in runs.failed:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


def _num(value, spec: str = ".3f", suffix: str = "") -> str:
    """A figure as SUMMARY.md shows it: rounded; a measured 0 is 0, only a missing figure is '—'."""
    return "—" if value is None else f"{value:{spec}}{suffix}"


def summarize(load=load) -> None:
    """One page with the headline numbers of whatever sections ran (bench-results/SUMMARY.md); `load` reads a
    result file (Runs.load: only those this invocation wrote)."""
    lines = ["# Benchmark summary", ""]
    vc = load("verify_cost.json")
    if vc:
        lines += ["## Verification cost (target forward per batch size)", "",
                  "| dtype | batch | ms for 1 / 2 / 4 / 8 tokens per sequence | perfect free draft ceiling |",
                  "|---|---|---|---|"]
        for name, d in vc["dtypes"].items():
            for b, row in (d.get("by_batch") or {"1": d}).items():
                f = row["forward_ms"]
                cells = " / ".join(f"{f[t]:.1f}" for t in ("1", "2", "4", "8") if t in f)
                lines.append(f"| {name} | {b} | {cells} | {row['ceiling']:.2f}x at K={row['best_k']} |")
        lines.append("")
    ng, ee, peer = load("engine_ngram.json"), load("engine_early_exit.json"), load("hf_peer.json")
    dr = load("engine_draft.json")
    hy = load("engine_draft_ngram.json")
    tr = load("engine_draft_ngram_tree.json")
    if ng:
        lines += [f"## Engine (code workload, {ng['runs'][0].get('dtype', '?')}, greedy)", "", "| run | tokens/s | acceptance | mean acc. len | speedup |",
                  "|---|---|---|---|---|"]
        ar = next(r for r in ng["runs"] if r["mode"] == "ar")
        for r in ng["runs"] + ee.get("runs", []):
            sp = r["tokens_per_s"] / ar["tokens_per_s"]
            lines.append(f"| ours {r['mode']} {r['drafter'] or ''} | {r['tokens_per_s']:.1f} | {_num(r['acceptance_rate'])} "
                         f"| {_num(r['mean_acceptance_length'], '.2f')} | {sp:.2f}x |")
        for run in (dr, hy, tr):
            if run:
                own = next(r for r in run["runs"] if r["mode"] == "ar")
                sp = next(r for r in run["runs"] if r["mode"] == "spec")
                lines.append(f"| ours spec {sp['drafter']}{' --tree ' + sp['tree'] if sp.get('tree') else ''} (own AR run {own['tokens_per_s']:.1f} tok/s) | "
                             f"{sp['tokens_per_s']:.1f} | {_num(sp['acceptance_rate'])} | "
                             f"{_num(sp['mean_acceptance_length'], '.2f')} | {_num(run.get('speedup'), '.2f', 'x')} |")
        for r in peer.get("runs", []):
            lines.append(f"| HF {r['mode']} | {r['tokens_per_s']:.1f} | — | — | {r.get('speedup_vs_ar') or 0:.2f}x |")
        lines.append("")
    cals = [(n, load(f"calibrate_{n}.json")) for n in ("draft", "draft_ngram")]
    if any(c for _, c in cals):
        lines += ["## calibrate (--limit 6 --k 4, AR and spec alternating)", "",
                  "| drafter | domain | alpha | acceptance rate | c | measured at K=4 | verdict |", "|---|---|---|---|---|---|---|"]
        for _, c in cals:
            for d in c.get("domains", []):
                m = d["measured_speedup_at_k"]
                lines.append(f"| {c['drafter']} | {d['domain']} | {d['alpha']:.3f} | {d['acceptance_rate']:.3f} | "
                             f"{d['c']:.3f} | {'—' if m is None else format(m, '.2f') + 'x'} | {d['verdict']} |")
        lines.append("")
    tel = load("telemetry_overhead.json")
    if tel:
        lines += [f"Telemetry overhead: {tel['overhead']:+.1%} (off {tel['tokens_per_s_off']:.1f}, "
                  f"on {tel['tokens_per_s_on']:.1f} tokens/s)", ""]
    rec = load("recorder.json")
    if rec:
        lines += ["Recorder: " + json.dumps(rec)[:400], ""]
    for workload, name in (("mixed", "sweep.json"), ("code", "sweep_code.json")):
        sweep = load(name)
        if not sweep:
            continue
        lines += [f"## Concurrency sweep ({workload} workload)", "", "| concurrency | mode | tokens/s | TPOT p95 ms |",
                  "|---|---|---|---|"]
        for r in sweep["runs"]:
            lines.append(f"| {r['concurrency']} | {r['mode']} | {r['tokens_per_s']:.1f} | {r['tpot_p95_ms'] or 0:.1f} |")
        lines += ["", f"speedup by concurrency: {sweep.get('speedup_by_concurrency')}",
                  f"crossover: {sweep.get('crossover_concurrency', 'n/a')}", ""]
    look = load("lookahead.json")
    if look:
        lines += [f"## Lookahead policies ({look.get('drafter')})", ""]
        for dom, row in look.get("domains", {}).items():
            lines.append(f"- {dom}: best fixed K={row.get('best_fixed_k')} {row.get('best_fixed_tokens_per_s', 0):.1f} tok/s; "
                         f"auto {row['tokens_per_s'].get('auto', 0):.1f} tok/s "
                         f"({row.get('auto_vs_best_fixed', 0):.2f}x best, {row.get('auto_vs_median_fixed', 0):.2f}x median)")
        lines.append("")
    dash = load("dashboard.json")
    if dash:
        lines += ["Dashboard: " + json.dumps(dash)[:600], ""]
    serve = load("serve.json")
    if serve:
        lines += ["Serve: " + json.dumps(serve)[:800], ""]
    (OUT / "SUMMARY.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
