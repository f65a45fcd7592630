#!/usr/bin/env bash
# Loss check, dtrain's GPT against the same GPT in PyTorch from one shared start: dtrain's
# weights and Adam state after its first step, the same batches in the same order
# (scripts/bench/gpt_same_start.py). Creates .venv-bench/ with torch and numpy on first use (a
# large download), builds dtrain, and writes results/bench/gpt-same-start.{md,json}. Extra
# arguments go to the driver (--epochs, --n-embd, --block, --batch, --train-limit, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bench/torch-venv.sh
exec .venv-bench/bin/python scripts/bench/gpt_same_start.py "$@"
