#!/usr/bin/env bash
# Local against synchronised BatchNorm on the small CNN: 8 replicas x 8 and x 32 per replica,
# each with local and sync statistics, against 1 replica x 64, for several seeds. About 25 CPU
# minutes per seed on a 2-core machine. Writes results/bn-study/ and its report.
#   scripts/bn-study.sh [SEEDS]      # default: "1 2 3"
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-"1 2 3"}
scripts/build.sh >/dev/null
bin=build/apps/dtrain
out=results/bn-study
for seed in $seeds; do
  "$bin" run configs/fmnist-cnn.yaml train.seed="$seed" --results "$out" --tag "s$seed" \
    --resume --quiet
  "$bin" run configs/fmnist-cnn.yaml gpus=8 train.per_replica_batch=32,8 \
    model.batchnorm=local,sync train.seed="$seed" --results "$out" --tag "s$seed" --resume --quiet
done
# The seeds of each setting aggregated into one row: mean, standard deviation and the values.
"$bin" report "$out" --plots --by train.seed
cp "$out/report/fmnist-cnn-by-train.seed.md" "$out/seeds.md"
