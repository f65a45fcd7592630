#!/usr/bin/env bash
# The batch-size law into RESULTS: for each global batch B from 64 to 8192, the peak LR
# LR0 x (B/64)^a for each exponent a (from no scaling, 0, to linear scaling, 1; at B = 64, where
# these are one LR, LR0/2, LR0 and 2 LR0 instead), each seed; each run scored every
# max(1, 4096/B) steps, stopped at the config's train.target_accuracy (train.stop_at_target),
# and given max(10, B/64) epochs (at most MAX_EPOCHS) to get there. Then `dtrain report
# --batch-law`: each batch's best LR, the fit of S = S_min (1 + B_noise / B), B_simple beside
# it, and the reference convergence points. Resumable (a finished run is skipped).
#
# The default is the MLP study in results/batch-law (configs/fmnist-batch-law.yaml, about 40
# minutes on 2 cores). The small ResNet's (configs/fmnist-resnet-batch-law.yaml: ResNet-8 at
# widths 8/16/32) takes hours; it resumes where it stopped:
#   CONFIG=configs/fmnist-resnet-batch-law.yaml RESULTS=results/batch-law-resnet \
#     EXPONENTS="0 1/2 1" MAX_EPOCHS=30 scripts/batch-law-study.sh
# With a warmup from 0 (the configs have none: a constant LR from the first step):
#   RESULTS=results/batch-law-warmup EXTRA="optimizer.warmup_epochs=1 optimizer.warmup_from=zero" \
#     scripts/batch-law-study.sh
# Environment: CONFIG, RESULTS, BATCHES, SEEDS (default 1,2,3), LR0 (default 0.05), EXPONENTS
# (default "0 1/4 1/2 3/4 1"), MAX_EPOCHS (default 1000), THREADS (default: the config's),
# EXTRA (more overrides, split at blanks, each passed to dtrain as one argument), DTRAIN.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${CONFIG:-configs/fmnist-batch-law.yaml}
results=${RESULTS:-results/batch-law}
dtrain=${DTRAIN:-build/apps/dtrain}
lr0=${LR0:-0.05}
exponents=${EXPONENTS:-0 1/4 1/2 3/4 1}
max_epochs=${MAX_EPOCHS:-1000}
number='^[0-9]+([.][0-9]+)?$'
[[ $lr0 =~ $number ]] || { echo "batch-law-study: LR0 is a number, got '$lr0'"; exit 2; }
[[ $max_epochs =~ ^[1-9][0-9]*$ ]] || { echo "batch-law-study: MAX_EPOCHS is a whole number"; exit 2; }
for a in $exponents; do
  [[ $a =~ ^[0-9]+(/[1-9][0-9]*)?$ ]] || { echo "batch-law-study: an exponent is N or N/M, got '$a'"; exit 2; }
done
threads=()
if [ -n "${THREADS:-}" ]; then
  [[ $THREADS =~ ^[0-9]+$ ]] || { echo "batch-law-study: THREADS is a whole number"; exit 2; }
  threads=("threads=$THREADS")
fi
read -r -a extra <<< "${EXTRA:-}"
[ -x "$dtrain" ] || scripts/build.sh > /dev/null
for b in ${BATCHES:-64 128 256 512 1024 2048 4096 8192}; do
  [[ $b =~ ^[1-9][0-9]*$ ]] || { echo "batch-law-study: a batch is a whole number, got '$b'"; exit 2; }
  # The exponents give one LR at B = 64; %.6g keeps the list short and exact enough.
  lrs=$(awk -v b="$b" -v lr0="$lr0" -v ex="$exponents" 'BEGIN {
    n = split(ex, e, " "); k = 0; out = "";
    for (i = 1; i <= n; i++) {
      split(e[i], f, "/"); a = f[1] / (f[2] == "" ? 1 : f[2]);
      v = sprintf("%.6g", lr0 * (b / 64) ^ a);
      if (!(v in seen)) { seen[v] = 1; out = out (k++ ? "," : "") v }
    }
    print out }')
  [ "$b" = 64 ] && lrs=$(awk -v lr0="$lr0" 'BEGIN { printf "%.6g,%.6g,%.6g", lr0 / 2, lr0, 2 * lr0 }')
  every=$(( b >= 4096 ? 1 : 4096 / b ))
  epochs=$(( b / 64 > 10 ? b / 64 : 10 ))
  epochs=$(( epochs > max_epochs ? max_epochs : epochs ))
  "$dtrain" run "$config" "train.global_batch=$b" "train.epochs=$epochs" \
    "train.eval_steps=$every" "optimizer.lr=$lrs" "train.seed=${SEEDS:-1,2,3}" "${threads[@]}" "${extra[@]}" \
    --results "$results" --tag "b$b" --resume --quiet
done
"$dtrain" report "$results" --batch-law --out "$results/report"
