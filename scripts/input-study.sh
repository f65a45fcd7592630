#!/usr/bin/env bash
# The input study in results/input-study/: Fashion-MNIST written as JPEG files of 448 x 448
# (photo-sized files of a small image, which is what makes decoding cost more than the step),
# trained by the small CNN at 1x28x28 with 1, 2 and 4 replicas and 1 and 2 decode workers
# each, 3 epochs; the 1-replica run with OpenMP's passive wait, on the images in memory, and on
# the images stored at 28 x 28, and with data.jpeg_draft (the files decoded at 1/8 of their
# size); then `dtrain doctor` on the 1-replica configs (its input-bound rule), and `dtrain
# project` from the 1-replica run with 2 workers, which assumes no input wait.
# About 15 minutes on a quiet 2-core machine; the tree (about 0.8 GB) is written once under
# WORK (default /tmp/dtrain-input-study).
#
#   scripts/input-study.sh
set -euo pipefail
cd "$(dirname "$0")/.."
results=${RESULTS:-results/input-study}
bin=$(realpath "${DTRAIN:-build/apps/dtrain}")
tree=${WORK:-/tmp/dtrain-input-study}/fmnist-jpeg-448
if [ ! -d "$tree/train" ]; then
  rm -rf "$tree"
  "$bin" export-images configs/fmnist-cnn.yaml --out "$tree" --format jpeg --quality 90 --side 448
fi
# The fix on the CPU: the same images stored at the size trained (28 x 28).
small=${WORK:-/tmp/dtrain-input-study}/fmnist-jpeg-28
if [ ! -d "$small/train" ]; then
  rm -rf "$small"
  "$bin" export-images configs/fmnist-cnn.yaml --out "$small" --format jpeg --quality 90
fi
# The data keys of every command below: decoded to 1x28x28, crops of 60-100% of the image.
data=(data.dataset=folder "data.shape=[1,28,28]" "data.augment.crop_scale=[0.6,1]")
rm -rf "$results"
mkdir -p "$results"
"$bin" run configs/fmnist-cnn.yaml "${data[@]}" "data.path=$tree" gpus=1,2,4 data.workers=1,2 \
  train.epochs=3 optimizer.warmup_epochs=1 --results "$results" --tag study
# The same 1-replica run with the step's OpenMP threads sleeping instead of spinning while they
# wait, so that the decode thread gets their core; and on the images held in memory (no
# decoding, no random-resized crops), the step alone.
OMP_WAIT_POLICY=passive "$bin" run configs/fmnist-cnn.yaml "${data[@]}" "data.path=$tree" \
  data.workers=1 train.epochs=3 optimizer.warmup_epochs=1 --results "$results" --tag passive
"$bin" run configs/fmnist-cnn.yaml train.epochs=3 optimizer.warmup_epochs=1 \
  --results "$results" --tag memory
OMP_WAIT_POLICY=passive "$bin" run configs/fmnist-cnn.yaml train.epochs=3 \
  optimizer.warmup_epochs=1 --results "$results" --tag memory-passive
"$bin" run configs/fmnist-cnn.yaml "${data[@]}" "data.path=$small" data.workers=1 train.epochs=3 \
  optimizer.warmup_epochs=1 --results "$results" --tag small-files
# The other fix: the large files decoded smaller (a crop of 60% of 448 x 448 is 347 pixels a
# side: at 1/8, 43, still more than the 28 trained).
"$bin" run configs/fmnist-cnn.yaml "${data[@]}" "data.path=$tree" data.workers=1 \
  data.jpeg_draft=true train.epochs=3 optimizer.warmup_epochs=1 --results "$results" --tag draft
for w in 1 2; do
  "$bin" doctor configs/fmnist-cnn.yaml "${data[@]}" "data.path=$tree" data.workers=$w \
    train.epochs=3 optimizer.warmup_epochs=1
done | tee "$results/doctor.txt"
"$bin" doctor configs/fmnist-cnn.yaml "${data[@]}" "data.path=$small" data.workers=1 \
  train.epochs=3 optimizer.warmup_epochs=1 | tee -a "$results/doctor.txt"
"$bin" doctor configs/fmnist-cnn.yaml "${data[@]}" "data.path=$tree" data.workers=1 \
  data.jpeg_draft=true train.epochs=3 optimizer.warmup_epochs=1 | tee -a "$results/doctor.txt"
"$bin" project "$results/fmnist-cnn/study-g1-workers2" --gpus 1,2,4 | tee "$results/project.txt"
# The folders name the tree under WORK; the summaries say where it was.
"$bin" report "$results" --out "$results/report"
