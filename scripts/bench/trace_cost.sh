#!/usr/bin/env bash
# What a step trace costs: the quickstart MLP (the smallest step, so the largest share) at 4
# replicas with their own weights (threads: bucket spans too) and 0.25 MB buckets, traced over
# every step (train.trace.steps 1000 covers 4 epochs of 234 steps) and not traced, alternated
# ROUNDS times in one session so both see the same machine; compared by the median epoch time
# (each run's first epoch dropped as warm-up).
# Usage: scripts/bench/trace_cost.sh [ROUNDS] [EPOCHS]   (needs build/apps/dtrain)
# Writes results/bench/trace-cost.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/epoch-times.sh
rounds=${1:-3} epochs=${2:-4}
check_rounds_epochs trace_cost "$rounds" "$epochs"
dtrain=${DTRAIN:-build/apps/dtrain}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
  for steps in 1000 0; do
    "$dtrain" run configs/quickstart.yaml gpus=4 replicas=threads train.epochs="$epochs" \
      optimizer.warmup_epochs=0 train.bucket_mb=0.25 train.trace.steps="$steps" \
      --results "$tmp" --tag "r$r-$steps" --quiet >/dev/null
  done
done
on=$(steady_epoch_times "$tmp"/fmnist-mlp/r*-1000-g4/metrics.csv | median)
off=$(steady_epoch_times "$tmp"/fmnist-mlp/r*-0-g4/metrics.csv | median)
events=$(grep -c '"ph": "X"' "$tmp"/fmnist-mlp/r1-1000-g4/trace.json)
bytes=$(stat -c %s "$tmp"/fmnist-mlp/r1-1000-g4/trace.json)
mkdir -p results/bench
{
  echo "# Cost of a step trace (quickstart MLP, 4 replicas, CPU)"
  echo
  echo "\`scripts/bench/trace_cost.sh $rounds $epochs\` on $(nproc) cores, $(date -u +%Y-%m-%d), commit $(git rev-parse --short=12 HEAD):"
  echo "$rounds rounds of two runs alternated (\`replicas=threads\`, \`train.bucket_mb=0.25\`: 3 bucket"
  echo "spans a step besides the phases); median epoch time over epochs 2..$epochs of every run."
  echo
  echo "| train.trace.steps | median epoch s | runs |"
  echo "|---|---|---|"
  echo "| 1000 (every step) | $on | $rounds |"
  echo "| 0 (off) | $off | $rounds |"
  echo
  echo "Traced/untraced epoch time: $(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.3f", a / b }')."
  echo "One traced run's trace.json: $events spans, $bytes bytes."
} > results/bench/trace-cost.md
cat results/bench/trace-cost.md
