#!/usr/bin/env bash
# Two dtrain binaries on in-process replicas, side by side: the quickstart MLP at N = 2, 4, 8
# and 16 replicas of batch 64 (replicas: auto, the default: one shared copy of the weights,
# and from 3 replicas on 2 cores, replicas in turn on one worker thread per core), the two
# binaries alternated ROUNDS times in one session (their order swapped every round) so that
# both see the same machine. Compared by the median epoch time (each run's first epoch dropped
# as warm-up); the script checks that both binaries end every run with the same losses, as
# metrics.csv prints them. For changes to how replicas sum, update or wait for each other.
# Usage: scripts/bench/replicas_ab.sh A_BINARY B_BINARY [ROUNDS] [EPOCHS]
# Writes results/bench/replicas-ab.md (OUT=... for another file).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/epoch-times.sh
[ $# -ge 2 ] || { echo "usage: replicas_ab.sh A_BINARY B_BINARY [ROUNDS] [EPOCHS]"; exit 2; }
a_bin=$1 b_bin=$2 rounds=${3:-3} epochs=${4:-3}
check_rounds_epochs replicas_ab "$rounds" "$epochs"
for b in "$a_bin" "$b_bin"; do
  [ -x "$b" ] || { echo "replicas_ab: no dtrain binary at $b"; exit 2; }
done
out_file=${OUT:-results/bench/replicas-ab.md}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
counts=(2 4 8 16)
run() {  # run SIDE BINARY ROUND N
  "$2" run configs/quickstart.yaml gpus="$4" train.per_replica_batch=64 train.epochs="$epochs" \
    optimizer.warmup_epochs=0 data.test_limit=1000 train.eval_batch=64 optimizer.lr=0.005 \
    --results "$tmp/$1" --tag "r$3" --quiet >/dev/null
}
for r in $(seq "$rounds"); do
  for n in "${counts[@]}"; do
    if [ $((r % 2)) = 1 ]; then run a "$a_bin" "$r" "$n"; run b "$b_bin" "$r" "$n"
    else run b "$b_bin" "$r" "$n"; run a "$a_bin" "$r" "$n"; fi
  done
done
out=$tmp/replicas-ab.md  # moved into place only once whole
{
  echo "# Two dtrain binaries on in-process replicas"
  echo
  echo "\`scripts/bench/replicas_ab.sh A B $rounds $epochs\` on $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')),"
  echo "$(date -u +%Y-%m-%d), A: \`$("$a_bin" --version)\`, B: \`$("$b_bin" --version)\`."
  echo "The quickstart MLP at N replicas of batch 64 (replicas: auto), $rounds rounds of both binaries"
  echo "alternated, $epochs epochs a run; median epoch time over epochs 2..$epochs of every run."
  echo
  echo "| N | A s/epoch | B s/epoch | A / B | same losses |"
  echo "|---|---|---|---|---|"
  for n in "${counts[@]}"; do
    a=$(steady_epoch_times "$tmp"/a/*/r*-g"$n"/metrics.csv | median)
    b=$(steady_epoch_times "$tmp"/b/*/r*-g"$n"/metrics.csv | median)
    same=yes
    for r in $(seq "$rounds"); do
      [ "$(last_losses "$tmp"/a/*/r$r-g$n/metrics.csv)" = \
        "$(last_losses "$tmp"/b/*/r$r-g$n/metrics.csv)" ] || same=NO
    done
    echo "| $n | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3fx", a / b }') | $same |"
  done
} > "$out"
mkdir -p "$(dirname "$out_file")"
mv "$out" "$out_file"
cat "$out_file"
