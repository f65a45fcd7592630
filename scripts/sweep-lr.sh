#!/usr/bin/env bash
# Learning-rate sweep: CONFIG over LR x LR-scaling rule x replica count, then the report with
# figures (including an LR x replicas accuracy heatmap per rule).
#   scripts/sweep-lr.sh CONFIG [key=value ...]
# Environment: RESULTS (default results/sweeps), TAG (default sweep-lr), GPUS (default
# 1,2,4,8), LRS (default 0.025,0.05,0.1), RULES (default none,linear,sqrt).
# Resumable and failure-tolerant like scripts/sweep-gpus.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
source scripts/sweep-common.sh
config=$1
shift
run_sweep "${TAG:-sweep-lr}" "$config" "gpus=${GPUS:-1,2,4,8}" "optimizer.lr=${LRS:-0.025,0.05,0.1}" \
  "optimizer.lr_scaling=${RULES:-none,linear,sqrt}" "$@"
