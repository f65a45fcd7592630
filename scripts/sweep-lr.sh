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
config=$1; shift
RESULTS=${RESULTS:-results/sweeps}
TAG=${TAG:-sweep-lr}
GPUS=${GPUS:-1,2,4,8}
LRS=${LRS:-0.025,0.05,0.1}
RULES=${RULES:-none,linear,sqrt}
dtrain=${DTRAIN:-build/apps/dtrain}
[ -x "$dtrain" ] || scripts/build.sh > /dev/null || exit 1
"$dtrain" run "$config" "gpus=$GPUS" "optimizer.lr=$LRS" "optimizer.lr_scaling=$RULES" "$@" \
  --results "$RESULTS" --tag "$TAG" --resume
rc=$?
[ "$rc" -eq 2 ] && exit 2
grep -h ",failed," "$RESULTS"/*/"index-$TAG.csv" 2>/dev/null | sed 's/^/sweep: failed run: /' >&2
"$dtrain" report "$RESULTS" --out "$RESULTS/report" --plots > /dev/null || true
echo "sweep: report in $RESULTS/report/index.md"
exit "$rc"
