#!/usr/bin/env bash
# What simulating N replicas on this machine costs: an N-replica run at per-replica batch 64
# against one replica at batch N x 64 (the same arithmetic per epoch), for N = 2, 4, 8, 16, 64,
# on the quickstart MLP and the CNN, side by side in one invocation. Also the peak resident
# memory of each run (summary.json's peak_rss_mib). Replicas run as threads in one process,
# each with threads/N cores (at least one thread each).
#
#   scripts/bench/replicas.sh [EPOCHS]    # default 2; needs build/apps/dtrain (or DTRAIN=...)
#
# Writes results/bench/replicas.md and the run folders under a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=${1:-2}
dtrain=$(realpath "${DTRAIN:-build/apps/dtrain}")
out=results/bench/replicas.md
runs=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-bench-replicas.XXXXXX")
trap 'rm -rf "$runs"' EXIT
# The CNN on 24576 training images keeps a run to seconds; the MLP uses all 60000.
models=("mlp|configs/quickstart.yaml|"
        "cnn|configs/fmnist-cnn.yaml|data.train_limit=24576")
counts=(2 4 8 16 64)
field() { grep -o "\"$2\": [0-9.e+-]*" "$1/summary.json" | head -n 1 | cut -d' ' -f2; }
{
  echo "# N replicas at batch 64 against 1 replica at batch N x 64"
  echo
  echo "\`scripts/bench/replicas.sh $epochs\` on $(nproc) cores, $(date -u +%Y-%m-%d), dtrain $("$dtrain" --version | cut -d' ' -f2-)."
  echo "Median epoch time of $epochs epochs (no warmup, no evaluation cost removed); ratio = N replicas /"
  echo "1 replica at the same global batch; peak memory is the process's resident peak."
  echo
  echo "| model | N | 1 x (N*64) epoch s | N x 64 epoch s | ratio | peak MiB 1 x (N*64) | peak MiB N x 64 | devices |"
  echo "|---|---|---|---|---|---|---|---|"
  for m in "${models[@]}"; do
    IFS='|' read -r name config extra <<<"$m"
    for n in "${counts[@]}"; do
      common=("$config" train.epochs="$epochs" optimizer.warmup_epochs=0 data.test_limit=1000
              train.eval_batch=64
              --quiet --results "$runs/$name")
      [ -n "$extra" ] && common+=("$extra")
      "$dtrain" run "${common[@]}" gpus=1 train.per_replica_batch=$((64 * n)) --tag one$n >/dev/null 2>&1
      "$dtrain" run "${common[@]}" gpus="$n" train.per_replica_batch=64 --tag many >/dev/null 2>&1
      one=$(ls -d "$runs/$name"/*/one$n-g1)
      many=$(ls -d "$runs/$name"/*/many-g$n)
      a=$(field "$one" median_epoch_time_s) b=$(field "$many" median_epoch_time_s)
      devices=$(grep -o '"devices": "[^"]*"' "$many/summary.json" | cut -d'"' -f4)
      awk -v m="$name" -v n="$n" -v a="$a" -v b="$b" -v ra="$(field "$one" peak_rss_mib)" \
          -v rb="$(field "$many" peak_rss_mib)" -v d="$devices" \
        'BEGIN { printf "| %s | %d | %.3f | %.3f | %.2fx | %.0f | %.0f | %s |\n", m, n, a, b, b / a, ra, rb, d }'
    done
  done
} | tee "$out"
