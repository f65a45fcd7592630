#!/usr/bin/env bash
# dtrain's own projections for docs/project.md: the quickstart MLP and the small CNN, each from a
# 1-replica run on this machine, to 8 GPUs over NVLink (one H100 machine) and to 32 GPUs over
# 400G InfiniBand (4 machines of 8; one link type for all GPUs, see the model's limits).
# Projections, not measurements: the step time is this machine's CPU step.
# Usage: scripts/bench/projections.sh [EPOCHS]   (needs build/apps/dtrain)
# Writes results/projections/README.md and the two 1-replica runs beside it.
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=${1:-2}
dtrain=$(realpath "${DTRAIN:-build/apps/dtrain}")
out=results/projections
rm -rf "$out" && mkdir -p "$out"
run() {  # CONFIG TAG: a 1-replica run, no warmup (only the step time matters here)
  "$dtrain" run "$1" gpus=1 train.epochs="$epochs" optimizer.warmup_epochs=0 --tag "$2" \
    --results "$out/runs" --quiet >/dev/null 2>&1
}
run configs/quickstart.yaml mlp
run configs/fmnist-cnn.yaml cnn
{
  echo "# Projections (a model, not a measurement)"
  echo
  echo "\`scripts/bench/projections.sh $epochs\`, $(date -u +%Y-%m-%d): 1-replica runs on this $(nproc)-core CPU machine,"
  echo "projected with \`dtrain project\`. The compute time is this CPU's: a GPU's step is much"
  echo "shorter, so on a GPU the exchange weighs more than shown here."
  for model in mlp cnn; do
    dir=$(ls -d "$out"/runs/*/"$model"-g1)
    for spec in "nvlink-h100 1,2,4,8" "ib-ndr400 1,8,16,32"; do
      read -r link gpus <<<"$spec"
      "$dtrain" project "$dir" --gpus "$gpus" --link "$link" --out "$out/$model-$link" >/dev/null
      echo
      echo "## $model, $link"
      echo
      grep '^|' "$out/$model-$link.md"
    done
  done
} | tee "$out/README.md"
