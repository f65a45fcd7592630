#!/usr/bin/env bash
# Two dtrain binaries on the committed studies, one after the other on this machine: the whole
# LR study (scripts/study.sh) and the BatchNorm study's seed 1 shortened to 3 epochs (its five
# runs: 1 x 64, and 8 replicas x 8 and x 32 with local and synchronised BatchNorm). Prints the
# wall time of each, and whether every run's metrics (LR, losses, accuracies, noise scale) agree
# between the two binaries.
#
#   scripts/bench/studies.sh OLD_DTRAIN NEW_DTRAIN
#
# For example OLD_DTRAIN built from an earlier commit (git worktree add /tmp/old COMMIT; cmake -S
# /tmp/old -B /tmp/old/build -G Ninja -DDTRAIN_CUDA=OFF; ninja -C /tmp/old/build dtrain).
# Writes results/bench/studies.md; the run folders go to a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
old=$(realpath "$1")
new=$(realpath "$2")
for b in "$old" "$new"; do [ -x "$b" ] || { echo "studies: $b is not an executable" >&2; exit 2; }; done
out=results/bench/studies.md
runs=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-bench-studies.XXXXXX")
trap 'rm -rf "$runs"' EXIT
now() { date +%s.%N; }
declare -A wall
for side in old new; do
  bin=$old
  [ "$side" = new ] && bin=$new
  t0=$(now)
  DTRAIN=$bin RESULTS="$runs/study-$side" scripts/study.sh > "$runs/study-$side.log" 2>&1
  t1=$(now)
  "$bin" run configs/fmnist-cnn.yaml train.seed=1 train.epochs=3 --results "$runs/bn-$side" \
    --tag s1 --quiet > "$runs/bn-$side.log" 2>&1
  "$bin" run configs/fmnist-cnn.yaml gpus=8 train.per_replica_batch=32,8 \
    model.batchnorm=local,sync train.seed=1 train.epochs=3 --results "$runs/bn-$side" \
    --tag s1 --quiet >> "$runs/bn-$side.log" 2>&1
  t2=$(now)
  wall[study-$side]=$(echo "$t1 - $t0" | bc)
  wall[bn-$side]=$(echo "$t2 - $t1" | bc)
done
# Run folders whose metrics.csv differ between the two binaries (timing columns left out).
compare() {
  local a=$1 b=$2 n=0 same=0
  for d in "$a"/*/*/; do
    [ -f "$d/metrics.csv" ] || continue
    local rel=${d#"$a"/}
    n=$((n + 1))
    if [ -f "$b/$rel/metrics.csv" ] &&
       [ "$(cut -d, -f2-7,20-22 "$d/metrics.csv")" = "$(cut -d, -f2-7,20-22 "$b/$rel/metrics.csv")" ]; then
      same=$((same + 1))
    fi
  done
  echo "$same of $n"
}
{
  echo "# The committed studies with two dtrain binaries"
  echo
  echo "\`scripts/bench/studies.sh OLD NEW\` on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(date -u +%Y-%m-%d)."
  echo "OLD: $("$old" --version). NEW: $("$new" --version). Run one after the other; wall"
  echo "times of the whole command (runs, reports and figures)."
  echo
  echo "| study | OLD wall s | NEW wall s | NEW / OLD | runs with the same metrics |"
  echo "|---|---|---|---|---|"
  awk -v a="${wall[study-old]}" -v b="${wall[study-new]}" -v s="$(compare "$runs/study-old" "$runs/study-new")" \
    'BEGIN { printf "| scripts/study.sh (LR study: 1 to 8 replicas) | %.1f | %.1f | %.2f | %s |\n", a, b, b / a, s }'
  awk -v a="${wall[bn-old]}" -v b="${wall[bn-new]}" -v s="$(compare "$runs/bn-old" "$runs/bn-new")" \
    'BEGIN { printf "| BatchNorm study, seed 1, 3 epochs (1 and 8 replicas) | %.1f | %.1f | %.2f | %s |\n", a, b, b / a, s }'
  echo
  echo "Median epoch time per run of the BatchNorm study (s):"
  echo
  echo "| run | OLD | NEW |"
  echo "|---|---|---|"
  for d in "$runs/bn-old"/fmnist-cnn/*/; do
    r=$(basename "$d")
    a=$(grep -o '"median_epoch_time_s": [0-9.]*' "$d/summary.json" | cut -d' ' -f2)
    b=$(grep -o '"median_epoch_time_s": [0-9.]*' "$runs/bn-new/fmnist-cnn/$r/summary.json" | cut -d' ' -f2)
    printf '| %s | %.2f | %.2f |\n' "$r" "$a" "$b"
  done
} | tee "$out"
