#!/usr/bin/env bash
# CPU benchmark, dtrain against PyTorch (PyPI's torch, the build users run) on the same MLP.
# Creates .venv-bench/ with torch and numpy on first use (a large download), builds dtrain,
# and writes results/bench/cpu-mlp-vs-pytorch.{md,json}. Extra arguments go to the driver.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if ! python3 -c 'import venv' 2>/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get install -y -qq python3-venv
fi
if [ ! -x .venv-bench/bin/python ] || ! .venv-bench/bin/python -c 'import torch, numpy' 2>/dev/null; then
  python3 -m venv .venv-bench
  .venv-bench/bin/pip install -q --upgrade pip
  .venv-bench/bin/pip install -q torch numpy
fi
scripts/build.sh
# Each framework runs with the best kernels it finds for this CPU: PyTorch's MKL ignores
# OPENBLAS_CORETYPE, so a value pinned in the environment (some shared machines set Haswell)
# would only hold dtrain back. The kernel family used is written into the results.
unset OPENBLAS_CORETYPE
exec .venv-bench/bin/python scripts/bench/cpu_vs_pytorch.py "$@"
