#!/usr/bin/env bash
# Accuracy and loss check, dtrain's ResNet against the same ResNet in PyTorch from one shared
# start: dtrain's weights, momentum buffers and BatchNorm statistics after its first step, the
# same batches in the same order (scripts/bench/resnet_same_start.py). Creates .venv-bench/ with
# torch and numpy on first use (a large download), builds dtrain, and writes
# results/bench/resnet-same-start.{md,json}. Extra arguments go to the driver (--epochs,
# --train-limit, --no-decay-bn-and-bias, --label-smoothing, --stem, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bench/torch-venv.sh
exec .venv-bench/bin/python scripts/bench/resnet_same_start.py "$@"
