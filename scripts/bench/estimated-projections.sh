#!/usr/bin/env bash
# Projections from configs alone, for GPUs this machine does not have: `dtrain project CONFIG
# --gpu h100-sxm` estimates the 1-replica step from the model's FLOPs at an assumed share of the
# H100's bf16 dense peak (MFU) and the update at its memory bandwidth, then projects it to 8 GPUs
# over NVLink (one machine) and to 32 over 400G InfiniBand (4 machines of 8; one link type for
# all GPUs, see the model's limits). Estimates and projections, not measurements. Seconds to run.
#   gpt2-124m  configs/gpt2-124m.yaml (GPT-2 124M, 16 x 1024 tokens x 4 micro-steps a GPU)
#   resnet50   configs/resnet50-synthetic.yaml at bf16 (3x224x224, 64 images a GPU)
# Usage: scripts/bench/estimated-projections.sh [MFU...]   (default: 0.4 0.6; needs the binary)
# Writes results/projections/estimated/MODEL-mfuMFU-LINK.{md,json} and README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
dtrain=$(realpath "${DTRAIN:-build/apps/dtrain}")
out=results/projections/estimated
mfus=("${@:-0.4}")
[ $# -eq 0 ] && mfus=(0.4 0.6)
for m in "${mfus[@]}"; do
  [[ $m =~ ^(0\.[0-9]+|1(\.0+)?)$ ]] || { echo "estimated-projections: MFU '$m' is not in (0, 1]"; exit 2; }
done
mkdir -p "$out"
# ResNet-50 in bf16, as a GPU would train it.
models=("gpt2-124m configs/gpt2-124m.yaml" "resnet50 configs/resnet50-synthetic.yaml precision=bf16")
links=("nvlink-h100 1,2,4,8" "ib-ndr400 8,16,32")
{
  echo "# Estimated projections (a model, not a measurement)"
  echo
  echo "\`scripts/bench/estimated-projections.sh\` ($(date -u +%F)): no run behind these. Each"
  echo "1-replica step is estimated from the shape engine's FLOPs at the MFU given (an assumption)"
  echo "of the H100 SXM's bf16 dense peak (989.4 TFLOP/s, datasheet) and the update at its 3.35"
  echo "TB/s; then projected with the ring all-reduce model of [docs/project.md](../../../docs/project.md)."
  echo "A higher MFU means a shorter backward to hide the exchange under. Project from a measured"
  echo "1-replica GPU run (\`dtrain project RUN_DIR\`) where one exists."
} >"$out/README.md"
for model in "${models[@]}"; do
  read -r name cfg overrides <<<"$model"
  for m in "${mfus[@]}"; do
    for l in "${links[@]}"; do
      read -r link gpus <<<"$l"
      stem="$out/$name-mfu$m-$link"
      # shellcheck disable=SC2086  # no override, or one
      "$dtrain" project "$cfg" $overrides --gpu h100-sxm --mfu "$m" --gpus "$gpus" \
        --link "$link" --out "$stem" >/dev/null
      { echo; echo "## $name, MFU $m, $link"; echo; sed '1,2d' "$stem.md"; } >>"$out/README.md"
    done
  done
done
echo "estimated-projections: $out/README.md"
