#!/usr/bin/env bash
# The ResNet accuracy study in results/resnet-study/: configs/fmnist-resnet.yaml (ResNet-20's
# layout at widths 8/16/32 on Fashion-MNIST) at 1 replica x 128 and 4 replicas x 32 (the same
# global batch; BatchNorm per replica, as DDP does without SyncBatchNorm), 20 epochs with flips,
# each seed given. About 25 minutes per seed on a quiet 2-core machine; resumable (the same
# SEED again continues its runs).
#
#   scripts/resnet-study.sh [SEED...]      # default: 1
set -euo pipefail
cd "$(dirname "$0")/.."
results=${RESULTS:-results/resnet-study}
bin=${DTRAIN:-build/apps/dtrain}
[ -x "$bin" ] || scripts/build.sh >/dev/null
for seed in "${@:-1}"; do
  case $seed in '' | *[!0-9]*) echo "resnet-study: a seed is a whole number, got '$seed'"; exit 2 ;; esac
  # Two commands under one tag: the index and the comparison of the tag hold both runs.
  for run in "gpus=1 train.per_replica_batch=128" "gpus=4 train.per_replica_batch=32"; do
    resume=()
    [ -f "$results/fmnist-resnet/index-seed$seed.csv" ] && resume=(--resume)
    # shellcheck disable=SC2086  # two overrides, split on purpose
    "$bin" run configs/fmnist-resnet.yaml train.seed="$seed" $run --results "$results" \
      --tag "seed$seed" "${resume[@]}"
  done
done
"$bin" report "$results" --out "$results/report" --baseline seed1-g1
