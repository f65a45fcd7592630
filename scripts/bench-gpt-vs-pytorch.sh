#!/usr/bin/env bash
# CPU benchmark, dtrain's GPT (model.type gpt on data.dataset bytes) against the same GPT in
# PyTorch (PyPI's torch: eager and torch.compile), interleaved in one invocation. Creates
# .venv-bench/ with torch and numpy on first use (a large download), builds dtrain, and writes
# results/bench/gpt-vs-pytorch.{md,json}. Extra arguments go to the driver
# (scripts/bench/gpt_vs_pytorch.py: --epochs, --train-limit, --repeats, --n-embd, --block, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bench/torch-venv.sh
# Each framework runs with the best kernels it finds for this CPU (see bench-cpu-vs-pytorch.sh).
unset OPENBLAS_CORETYPE
exec .venv-bench/bin/python scripts/bench/gpt_vs_pytorch.py "$@"
