#!/usr/bin/env bash
# CPU benchmark, dtrain against PyTorch (PyPI's torch, the build users run) on the same MLP.
# Creates .venv-bench/ with torch and numpy on first use (a large download), builds dtrain,
# and writes results/bench/cpu-mlp-vs-pytorch.{md,json}. Extra arguments go to the driver.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bench/torch-venv.sh
# Each framework runs with the best kernels it finds for this CPU: PyTorch's MKL ignores
# OPENBLAS_CORETYPE, so a value pinned in the environment (some shared machines set Haswell)
# would only hold dtrain back. The kernel family used is written into the results.
unset OPENBLAS_CORETYPE
exec .venv-bench/bin/python scripts/bench/cpu_vs_pytorch.py "$@"
