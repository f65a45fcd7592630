#!/usr/bin/env bash
# Installs dependencies, builds, and runs the quickstart scaling comparison on Fashion-MNIST:
# the same MLP recipe at 1, 2 and 4 data-parallel replicas, ending with the comparison table.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec build/apps/dtrain run configs/quickstart.yaml gpus=1,2,4 --results results/local "$@"
