#!/usr/bin/env bash
# Checks dtrain project against measurement where this machine can measure: 2 replicas with one
# thread each on a 2-core machine, i.e. one core per replica as one GPU per replica, joined by
# the in-process all-reduce (threads) or by MPI (2 processes). The 1-replica run (1 thread) is
# projected to 2 with the link bench-comm measured for that communicator, and compared with the
# measured 2-replica run of the same per-replica batch.
# Usage: scripts/bench/project_check.sh [EPOCHS]   (needs build/apps/dtrain, mpirun for MPI)
# Writes results/project-check/README.md and the runs under results/project-check/.
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=${1:-3}
dtrain=$(realpath "${DTRAIN:-build/apps/dtrain}")
out=results/project-check
rm -rf "$out" && mkdir -p "$out"
common=(configs/quickstart.yaml threads=1 train.epochs="$epochs" optimizer.warmup_epochs=0
        --results "$out/runs" --quiet)
"$dtrain" run "${common[@]}" gpus=1 --tag one >/dev/null 2>&1
"$dtrain" run "${common[@]}" gpus=2 --tag threads >/dev/null 2>&1
"$dtrain" bench-comm --replicas 2 --sizes 64K:4M --out "$out/link-threads" >/dev/null
rows=("threads|$out/link-threads.json|$out/runs/fmnist-mlp/threads-g2")
if command -v mpirun >/dev/null; then
  mpi=(mpirun --oversubscribe -np 2)
  [ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
  "${mpi[@]}" "$dtrain" run "${common[@]}" gpus=2 --tag mpi >/dev/null 2>&1
  "${mpi[@]}" "$dtrain" bench-comm --sizes 64K:4M --out "$out/link-mpi" >/dev/null
  rows+=("mpi|$out/link-mpi.json|$out/runs/fmnist-mlp/mpi-g2")
fi
one=$out/runs/fmnist-mlp/one-g1
# The median epoch time (s) of a run folder, from its summary.json.
median_epoch() { grep -o '"median_epoch_time_s": [0-9.e+-]*' "$1/summary.json" | cut -d' ' -f2; }
{
  echo "# dtrain project against measurement (2 replicas, one core each)"
  echo
  echo "\`scripts/bench/project_check.sh $epochs\` on $(nproc) cores, $(date -u +%Y-%m-%d); quickstart MLP,"
  echo "per-replica batch 64, 1 thread per replica, $epochs epochs, no warmup. 1-replica median epoch:"
  echo "$(median_epoch "$one") s."
  echo
  echo "| communicator | projected epoch s | measured epoch s | error |"
  echo "|---|---|---|---|"
  for row in "${rows[@]}"; do
    IFS='|' read -r name link run <<<"$row"
    "$dtrain" project "$one" --gpus 1,2 --link "measured:$link" --out "$out/projection-$name" >/dev/null
    projected=$(grep -o '"epoch_s": [0-9.e+-]*' "$out/projection-$name.json" | tail -n 1 | cut -d' ' -f2)
    measured=$(median_epoch "$run")
    awk -v n="$name" -v p="$projected" -v m="$measured" \
      'BEGIN { printf "| %s | %.3f | %.3f | %+.0f%% |\n", n, p, m, 100 * (p / m - 1) }'
  done
} | tee "$out/README.md"
