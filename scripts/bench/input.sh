#!/usr/bin/env bash
# The input pipeline of dataset: folder against PyTorch's DataLoader with torchvision's
# transforms, on the same files, at the same worker counts, side by side in one run: decode,
# random-resized crop, flip and normalisation, images per second in steady state (medians).
# Three trees: Fashion-MNIST as JPEG (1x28x28, the study's) and synthetic RGB images as JPEG
# (3x256x256, cropped to 3x224x224: the ImageNet recipe's sizes; noise-like pixels, which decode
# slower than photographs), both written by `dtrain export-images`; and crops of photographs at
# ImageNet's sizes (500x375 mostly; scripts/bench/photo_tree.py, from the photographs in
# scikit-image's wheel, which pip downloads once), JPEG quality 95.
# Usage: scripts/bench/input.sh [WORKERS...]   (default 1 2; needs build/apps/dtrain)
# Writes results/bench/input-vs-pytorch.md. Installs torchvision and Pillow into .venv-bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
dtrain=$(realpath "${DTRAIN:-build/apps/dtrain}")
workers=("$@")
[ ${#workers[@]} -gt 0 ] || workers=(1 2)
py=.venv-bench/bin/python
if ! "$py" -c 'import torch, torchvision, PIL' 2>/dev/null; then
  [ -x "$py" ] || scripts/bench-cpu-vs-pytorch.sh --help >/dev/null  # creates .venv-bench
  # --no-deps: the torch already there (a torchvision wheel would pull its own).
  .venv-bench/bin/pip install -q --no-deps torchvision pillow
fi
work=${WORK:-/tmp/dtrain-input-bench}
mkdir -p "$work" results/bench
if [ ! -d "$work/fmnist-jpeg/train" ]; then
  "$dtrain" export-images configs/fmnist-cnn.yaml --out "$work/fmnist-jpeg" --format jpeg \
    --quality 90 >/dev/null
fi
if [ ! -d "$work/rgb-jpeg/train" ]; then
  "$dtrain" export-images configs/resnet50-synthetic.yaml 'data.synthetic.shape=[3,256,256]' \
    data.synthetic.train_size=1024 data.synthetic.test_size=16 data.synthetic.noise=0.3 \
    --out "$work/rgb-jpeg" --format jpeg --quality 90 >/dev/null
fi
if [ ! -d "$work/photo-jpeg/train" ]; then
  wheel=$(ls "$work"/wheel/scikit_image-0.26.0-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    .venv-bench/bin/pip download -q --no-deps --only-binary :all: scikit-image==0.26.0 \
      -d "$work/wheel"
    wheel=$(ls "$work"/wheel/scikit_image-0.26.0-*.whl | head -1)
  fi
  "$py" scripts/bench/photo_tree.py "$wheel" "$work/photo-jpeg" --quality 95 >/dev/null
fi
out=results/bench/input-vs-pytorch.md
csv=$(IFS=,; echo "${workers[*]}")
{
  echo "# Input pipeline: dtrain against PyTorch's DataLoader"
  echo
  echo "\`scripts/bench/input.sh ${workers[*]}\` on $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')),"
  echo "$(date -u +%Y-%m-%d). Decode, random-resized crop (scale [0.08, 1]), flip, to float,"
  echo "normalise; batches of 128; images per second in steady state, median of 3."
  for tree in "fmnist-jpeg 1 28 28" "rgb-jpeg 3 224 224" "photo-jpeg 3 224 224"; do
    read -r name c h w <<<"$tree"
    echo
    echo "## $name: JPEG files to ${c}x${h}x${w}"
    echo
    find "$work/$name/train" -type f -printf '%s\n' |
      awk '{s += $1} END {printf "%d training files, %.1f kB each on average.\n", NR, s / NR / 1000}'
    echo
    echo "dtrain (\`dtrain bench-input\`):"
    echo
    "$dtrain" bench-input configs/fmnist-cnn.yaml data.dataset=folder data.path="$work/$name" \
      "data.shape=[$c,$h,$w]" data.normalize=channel train.per_replica_batch=128 \
      --workers "$csv" --images 4096 | sed 's/^# .*: fashion-mnist/# fashion-mnist/'
    echo
    echo "PyTorch (\`scripts/bench/input_vs_pytorch.py\`):"
    echo
    "$py" scripts/bench/input_vs_pytorch.py "$work/$name/train" --size "$c" "$h" "$w" \
      --batch 128 --workers "${workers[@]}" --images 4096
  done
} | tee "$out"
