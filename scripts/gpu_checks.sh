#!/usr/bin/env bash
# The GPU checks to run whenever a GPU machine is lent: one command, under ~8 minutes.
#
#   bash scripts/gpu_checks.sh [OUTDIR]          # OUTDIR: $OUT if set, else ./gpu_checks_out
#   GPU_CHECKS_SMOKE=1 bash scripts/gpu_checks.sh /tmp/x   # tiny settings: checks it runs (CPU)
#
# Steps (each under its own `timeout`; a step that fails or times out is reported and the next
# one runs):
#   1. pfl_cifar10 (pfl-research's CIFAR-10 CNN, M = 50, 5 steps) at runs 1 and 16,
#      vmapped convolutions as patches times kernel (the default) and grouped (as before):
#      `experiments.benchmarks.round --vmapped_convs=patches,grouped`, in one process.
#   2. fedjax_emnist (FedJAX's EMNIST CNN, M = 10, 20 steps), the same.
#   3. LeNet on Fashion-MNIST-sized inputs (28x28x1), M = 100, 64 examples, batch 32, the same.
#   4. the round benchmark's published command for pfl_cifar10 at runs 1,16 (auto backend,
#      baseline loop, worker processes), with the new default, to set against
#      docs/measurements/gpu.md's table of 2026-11-28 (0.41x).
# Then one compact table of steps 1-3 (docs/decisions/0106-vmapped-convolutions-as-matmuls.md).
# Everything goes to OUTDIR: a .log and a .json per step, summary.md.
set -u
cd "$(dirname "$0")/.."
DIR="${1:-${OUT:-gpu_checks_out}}"
mkdir -p "$DIR"
PY="${PYTHON:-python}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
SMOKE="${GPU_CHECKS_SMOKE:-0}"
if [ "$SMOKE" = "1" ]; then
  # Tiny settings: 2 clients, 2 steps, runs 1 and 2, one timed round.
  SIZE_CIFAR="--num_clients=2 --examples_per_client=4 --batch_size=2"
  SIZE_EMNIST="--num_clients=2 --examples_per_client=4 --batch_size=2"
  SIZE_LENET="--num_clients=2 --examples_per_client=4 --batch_size=2"
  RUNS="1,2"; ROUNDS=1; T_AB=240; T_BENCH=300
  BENCH_EXTRA="--num_clients=2 --examples_per_client=4 --batch_size=2 --max_seconds_per_case=30 --devices=1 --noceiling"
else
  SIZE_CIFAR=""; SIZE_EMNIST=""
  SIZE_LENET="--num_clients=100 --examples_per_client=64 --batch_size=32"
  RUNS="1,16"; ROUNDS=3; T_AB=120; T_BENCH=90
  BENCH_EXTRA="--max_seconds_per_case=20 --noceiling"
fi
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$DIR/jax_cache}"

step() {  # step NAME SECONDS ARGS...: one benchmark command, its own time limit
  local name="$1" limit="$2"; shift 2
  local start=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$PY" -m experiments.benchmarks.round "$@" \
    --output="$DIR/$name.json" >"$DIR/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - start))s; log $DIR/$name.log"
  [ $rc -eq 0 ] || tail -n 5 "$DIR/$name.log"
}

echo "# gpu_checks: $(date -u +%FT%TZ), smoke=$SMOKE, output in $DIR"
"$PY" -c 'import jax; print("# jax", jax.__version__, jax.devices())' 2>&1 | tail -n 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

step cifar_convs "$T_AB" --workload=pfl_cifar10 $SIZE_CIFAR --runs="$RUNS" --rounds="$ROUNDS" \
  --vmapped_convs=patches,grouped --backends=vmap_scan
step emnist_convs "$T_AB" --workload=fedjax_emnist $SIZE_EMNIST --runs="$RUNS" --rounds="$ROUNDS" \
  --vmapped_convs=patches,grouped --backends=vmap_scan
step lenet_convs "$T_AB" --models=lenet $SIZE_LENET --runs="$RUNS" --rounds="$ROUNDS" \
  --vmapped_convs=patches,grouped --backends=vmap_scan
step cifar_bench "$T_BENCH" --workload=pfl_cifar10 --runs="$RUNS" --backends=auto \
  --rounds="$ROUNDS" $BENCH_EXTRA

"$PY" - "$DIR" <<'EOF' | tee "$DIR/summary.md"
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.benchmarks.round import conv_ab_table
out = sys.argv[1]
rows, device = [], None
for name in ("cifar_convs", "emnist_convs", "lenet_convs"):
    path = os.path.join(out, name + ".json")
    if os.path.exists(path):
        with open(path) as f:
            result = json.load(f)
        rows += result["vmapped_convs"]
        device = result.get("device", device)
        if result.get("partial"):
            print(f"({name}: partial, stopped before its last case)")
    else:
        print(f"({name}: no result)")
print(f"\n## Vmapped convolutions: patches (new default) vs grouped (before), {device}\n")
print(conv_ab_table(rows) if rows else "(no rows)")
bench = os.path.join(out, "cifar_bench.log")
if os.path.exists(bench):
    with open(bench) as f:
        lines = f.read().splitlines()
    table = [l for l in lines if l.startswith("|")]
    print("\n## Round benchmark, pfl_cifar10, auto backend (new default)\n")
    print("\n".join(table[-12:]) if table else "(no table: see cifar_bench.log)")
EOF
