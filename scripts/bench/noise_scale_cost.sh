#!/usr/bin/env bash
# What measuring the gradient noise scale costs: the quickstart MLP at 4 replicas with
# train.noise_scale true and false, alternated ROUNDS times in one session so both see the same
# machine, compared by the median epoch time (the first epoch of each run dropped as warm-up).
# Usage: scripts/bench/noise_scale_cost.sh [ROUNDS] [EPOCHS]   (needs build/apps/dtrain)
# Writes results/bench/noise-scale-cost.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/epoch-times.sh
rounds=${1:-3} epochs=${2:-4}
check_rounds_epochs noise_scale_cost "$rounds" "$epochs"
dtrain=${DTRAIN:-build/apps/dtrain}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
  for on in true false; do
    "$dtrain" run configs/quickstart.yaml gpus=4 train.epochs="$epochs" optimizer.warmup_epochs=0 \
      train.noise_scale="$on" --results "$tmp" --tag "r$r-$on" --quiet >/dev/null
  done
done
on=$(steady_epoch_times "$tmp"/fmnist-mlp/r*-true-g4/metrics.csv | median)
off=$(steady_epoch_times "$tmp"/fmnist-mlp/r*-false-g4/metrics.csv | median)
b=$(grep -o '"b_simple": [0-9.e+-]*' "$tmp"/fmnist-mlp/r1-true-g4/summary.json | head -n 1 |
  cut -d' ' -f2)
mkdir -p results/bench
{
  echo "# Cost of the gradient noise scale (quickstart MLP, 4 replicas, CPU)"
  echo
  echo "\`scripts/bench/noise_scale_cost.sh $rounds $epochs\` on $(nproc) cores, $(date -u +%Y-%m-%d):"
  echo "$rounds rounds of two runs, alternated; median epoch time over epochs 2..$epochs of every run."
  echo
  echo "| train.noise_scale | median epoch s | runs |"
  echo "|---|---|---|"
  echo "| true | $on | $rounds |"
  echo "| false | $off | $rounds |"
  echo
  awk -v a="$on" -v b="$off" 'BEGIN { printf "Ratio on/off: %.3f (%+.1f%%). B_simple at the end of round 1: %s.\n", a / b, 100 * (a / b - 1), "'"$b"'" }'
} | tee results/bench/noise-scale-cost.md
