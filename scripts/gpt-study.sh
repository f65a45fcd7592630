#!/usr/bin/env bash
# The GPT study in results/gpt-study/: configs/bytes-gpt.yaml (4 layers, width 128, context 64,
# on the text of Debian's fortunes package, pinned by its SHA-256), one epoch (36,234 windows),
# at 1 replica x 32 and at 4 replicas x 32 (global batch 128, the same epoch, so a quarter of the
# steps) with the square-root LR rule that adaptive optimizers follow; then `dtrain explain` on
# the pitfall config, AdamW with linear scaling and no warmup at 4 replicas, rung by rung. About
# 30 minutes on 2 cores, one thread a run; resumable.
#
#   scripts/gpt-study.sh
set -euo pipefail
cd "$(dirname "$0")/.."
results=${RESULTS:-results/gpt-study}
bin=${DTRAIN:-build/apps/dtrain}
# One thread by default: the study measures losses, not speed, and shares the machine well.
threads=${THREADS:-1}
case $threads in "" | *[!0-9]*) echo "gpt-study: THREADS is a whole number"; exit 2 ;; esac
[ -x "$bin" ] || scripts/build.sh >/dev/null
resume=()
[ -f "$results/bytes-gpt/index-sqrt.csv" ] && resume=(--resume)
"$bin" run configs/bytes-gpt.yaml gpus=1,4 threads="$threads" train.epochs=1 \
  optimizer.lr_scaling=sqrt optimizer.warmup_epochs=0.25 \
  --results "$results" --tag sqrt "${resume[@]}"
resume=()
[ -d "$results/bytes-gpt" ] && ls "$results"/bytes-gpt/explain-pitfall-* >/dev/null 2>&1 &&
  resume=(--resume)
"$bin" explain configs/bytes-gpt.yaml gpus=4 threads="$threads" train.epochs=1 \
  optimizer.lr_scaling=linear optimizer.warmup_epochs=0 --results "$results" --tag pitfall \
  "${resume[@]}"
"$bin" doctor configs/bytes-gpt.yaml gpus=4 train.epochs=1 optimizer.lr_scaling=linear \
  optimizer.warmup_epochs=0 --no-data >"$results/doctor-pitfall.txt" 2>&1 || true
"$bin" report "$results" --out "$results/report" --baseline sqrt-g1
