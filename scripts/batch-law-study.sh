#!/usr/bin/env bash
# The batch-size law on the Fashion-MNIST MLP (configs/fmnist-batch-law.yaml) into
# results/batch-law/: for each global batch B from 64 to 8192, the peak LR 0.05 x (B/64)^a for
# a = 0, 1/4, 1/2, 3/4 and 1 (from no scaling to linear scaling; at B = 64, where these are one
# LR, 0.025, 0.05 and 0.1 instead), seeds 1 to 3; each run scored
# every max(1, 4096/B) steps, stopped at 85% test accuracy, and given max(10, B/64) epochs to
# get there. Then `dtrain report --batch-law`: each batch's best LR, the fit of
# S = S_min (1 + B_noise / B), B_simple beside it, and the reference convergence points.
# Resumable (a finished run is skipped). About 40 minutes on 2 cores.
# Environment: RESULTS (default results/batch-law), BATCHES, SEEDS (default 1,2,3), DTRAIN.
set -euo pipefail
cd "$(dirname "$0")/.."
results=${RESULTS:-results/batch-law}
dtrain=${DTRAIN:-build/apps/dtrain}
[ -x "$dtrain" ] || scripts/build.sh > /dev/null
for b in ${BATCHES:-64 128 256 512 1024 2048 4096 8192}; do
  # The five exponents give one LR at B = 64; %.6g keeps the list short and exact enough.
  lrs=$(awk -v b="$b" 'BEGIN {
    n = 0; out = "";
    for (i = 0; i <= 4; i++) {
      v = sprintf("%.6g", 0.05 * (b / 64) ^ (i / 4));
      if (!(v in seen)) { seen[v] = 1; out = out (n++ ? "," : "") v }
    }
    print out }')
  [ "$b" = 64 ] && lrs=0.025,0.05,0.1
  every=$(( b >= 4096 ? 1 : 4096 / b ))
  epochs=$(( b / 64 > 10 ? b / 64 : 10 ))
  "$dtrain" run configs/fmnist-batch-law.yaml "train.global_batch=$b" "train.epochs=$epochs" \
    "train.eval_steps=$every" "optimizer.lr=$lrs" "train.seed=${SEEDS:-1,2,3}" \
    --results "$results" --tag "b$b" --resume --quiet
done
"$dtrain" report "$results" --batch-law --out "$results/report"
