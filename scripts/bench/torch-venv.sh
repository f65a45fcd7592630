#!/usr/bin/env bash
# Makes .venv-bench/ with PyPI's torch and numpy (a large download, once) and builds dtrain: what
# every CPU benchmark against PyTorch needs before its driver runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
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
