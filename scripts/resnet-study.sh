#!/usr/bin/env bash
# The ResNet accuracy study in results/resnet-study/epochs30/: configs/fmnist-resnet.yaml
# (ResNet-20 at widths 16/32/64 on Fashion-MNIST, random crops and flips, 30 epochs) at 1
# replica x 128 and 4 replicas x 32 (the same global batch; BatchNorm per replica, as DDP does
# without SyncBatchNorm), each seed given. About 50 minutes a run on a quiet 2-core machine;
# resumable (the same SEED again continues its runs). THREADS (default: all cores) is the
# threads a run uses; EPOCHS (default: the config's 30) the epochs of every run; RESULTS the
# results folder. (results/resnet-study/standard/ holds the same recipe at 20 epochs, and
# results/resnet-study/fmnist-resnet/ the earlier runs at widths 8/16/32 with flips alone, both
# made by this script before the config changed.)
#
#   scripts/resnet-study.sh [SEED...]      # default: 1
#   RESULTS=results/resnet-study/standard EPOCHS=20 scripts/resnet-study.sh 1 2 3
set -euo pipefail
cd "$(dirname "$0")/.."
results=${RESULTS:-results/resnet-study/epochs30}
threads=${THREADS:-0}
case $threads in '' | *[!0-9]*) echo "resnet-study: THREADS is a whole number"; exit 2 ;; esac
epochs=()
if [ -n "${EPOCHS:-}" ]; then
  case $EPOCHS in *[!0-9]*) echo "resnet-study: EPOCHS is a whole number"; exit 2 ;; esac
  epochs=("train.epochs=$EPOCHS")
fi
bin=${DTRAIN:-build/apps/dtrain}
[ -x "$bin" ] || scripts/build.sh >/dev/null
for seed in "${@:-1}"; do
  case $seed in '' | *[!0-9]*) echo "resnet-study: a seed is a whole number, got '$seed'"; exit 2 ;; esac
  # Two commands under one tag: the index and the comparison of the tag hold both runs.
  for run in "gpus=1 train.per_replica_batch=128" "gpus=4 train.per_replica_batch=32"; do
    resume=()
    [ -f "$results/fmnist-resnet/index-seed$seed.csv" ] && resume=(--resume)
    # shellcheck disable=SC2086  # two overrides, split on purpose
    "$bin" run configs/fmnist-resnet.yaml threads="$threads" train.seed="$seed" $run "${epochs[@]}" \
      --results "$results" \
      --tag "seed$seed" "${resume[@]}"
  done
done
"$bin" report "$results" --out "$results/report" --baseline seed1-g1
