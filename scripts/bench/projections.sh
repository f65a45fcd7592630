#!/usr/bin/env bash
# dtrain's own projections for docs/project.md: each model from a 1-replica run on this machine,
# to 8 GPUs over NVLink (one H100 machine) and to 32 GPUs over 400G InfiniBand (4 machines of 8;
# one link type for all GPUs, see the model's limits). Projections, not measurements: the step
# time is this machine's CPU step.
#   mlp       configs/quickstart.yaml
#   cnn       configs/fmnist-cnn.yaml
#   resnet18  configs/cifar10-resnet18.yaml on synthetic 3x32x32, batch 128, 640 samples an epoch
#   resnet50  configs/resnet50-synthetic.yaml (3x224x224), batch 8, 64 samples an epoch
# Usage: scripts/bench/projections.sh [EPOCHS [MODEL...]]   (needs build/apps/dtrain)
# Writes results/projections/MODEL-LINK.{md,json} and the 1-replica runs under runs/, then
# README.md from every model's files present (results/projections/h100/ is left as it is).
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=${1:-2}
shift || true
models=("${@:-mlp cnn resnet18 resnet50}")
read -r -a models <<<"${models[*]}"
dtrain=$(realpath "${DTRAIN:-build/apps/dtrain}")
out=results/projections
mkdir -p "$out/runs"
links=("nvlink-h100 1,2,4,8" "ib-ndr400 1,8,16,32")
run() {  # MODEL: a 1-replica run, no warmup (only the step time matters here)
  local args
  case $1 in
    mlp) args=(configs/quickstart.yaml) ;;
    cnn) args=(configs/fmnist-cnn.yaml) ;;
    resnet18)
      args=(configs/cifar10-resnet18.yaml data.dataset=synthetic "data.synthetic.shape=[3,32,32]"
            data.synthetic.train_size=640 data.synthetic.test_size=128) ;;
    resnet50)
      args=(configs/resnet50-synthetic.yaml train.per_replica_batch=8 train.eval_batch=8
            data.synthetic.train_size=64 data.synthetic.test_size=16) ;;
    *) echo "projections: unknown model '$1' (mlp, cnn, resnet18, resnet50)" >&2; exit 2 ;;
  esac
  rm -rf "$out"/runs/*/"$1"-g1
  "$dtrain" run "${args[@]}" gpus=1 train.epochs="$epochs" optimizer.warmup_epochs=0 --tag "$1" \
    --results "$out/runs" --quiet >/dev/null 2>&1
  local dir
  dir=$(ls -d "$out"/runs/*/"$1"-g1)
  for spec in "${links[@]}"; do
    read -r link gpus <<<"$spec"
    "$dtrain" project "$dir" --gpus "$gpus" --link "$link" --out "$out/$1-$link" >/dev/null
  done
}
for model in "${models[@]}"; do run "$model"; done
{
  echo "# Projections (a model, not a measurement)"
  echo
  echo "\`scripts/bench/projections.sh $epochs\` (last run $(date -u +%Y-%m-%d), models: ${models[*]}):"
  echo "1-replica runs on this $(nproc)-core CPU machine, projected with \`dtrain project\`. The"
  echo "compute time is this CPU's: a GPU's step is much shorter, so on a GPU the exchange weighs"
  echo "more than shown here. \"all-reduce\" is the exchange's whole time, \"exposed\" the part"
  echo "that backward does not hide. Projections from steps measured on an H100: [h100](h100/README.md)."
  for model in mlp cnn resnet18 resnet50; do
    for spec in "${links[@]}"; do
      read -r link _ <<<"$spec"
      [ -f "$out/$model-$link.md" ] || continue
      echo
      echo "## $model, $link"
      echo
      grep -E '^(Measured|Gradients)' "$out/$model-$link.md"
      echo
      grep '^|' "$out/$model-$link.md"
    done
  done
} >"$out/README.md"
cat "$out/README.md"
