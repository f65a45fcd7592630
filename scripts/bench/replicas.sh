#!/usr/bin/env bash
# What simulating N replicas on this machine costs: an N-replica run at per-replica batch 64
# against one replica at batch N x 64 (the same arithmetic per epoch), for N = 2, 4, 8, 16, 64,
# on the quickstart MLP and the CNN, side by side in one invocation. The N-replica run goes
# twice: as dtrain runs it by default (replicas: auto, which shares one copy of the weights and,
# with more replicas than threads, runs them in turn) and with replicas: threads (every replica
# its own copy and thread, as before). Also the peak resident memory of each run
# (summary.json's peak_rss_mib) and whether the accuracies agree.
#
#   scripts/bench/replicas.sh [EPOCHS]    # default 2; needs build/apps/dtrain (or DTRAIN=...)
#
# Writes results/bench/replicas.md; the run folders go to a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=${1:-2}
dtrain=$(realpath "${DTRAIN:-build/apps/dtrain}")
out=results/bench/replicas.md
runs=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-bench-replicas.XXXXXX")
trap 'rm -rf "$runs"' EXIT
# The CNN on 24576 training images keeps a run to seconds; the MLP uses all 60000. The LR is
# low enough for 64 x 64 without warmup not to diverge (a diverged run stops early).
models=("mlp|configs/quickstart.yaml|optimizer.lr=0.005"
        "cnn|configs/fmnist-cnn.yaml|data.train_limit=24576 optimizer.lr=0.005")
counts=(2 4 8 16 64)
field() { grep -o "\"$2\": [0-9.e+-]*" "$1/summary.json" | head -n 1 | cut -d' ' -f2; }
text() { grep -o "\"$2\": \"[^\"]*\"" "$1/summary.json" | head -n 1 | cut -d'"' -f4; }
{
  echo "# N replicas at batch 64 against 1 replica at batch N x 64"
  echo
  echo "\`scripts/bench/replicas.sh $epochs\` on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(date -u +%Y-%m-%d), dtrain $("$dtrain" --version | cut -d' ' -f2-)."
  echo "Median epoch time of $epochs epochs (evaluation excluded); ratio = N replicas / 1 replica at the"
  echo "same global batch. *auto*: dtrain's default (\`replicas: auto\`: one shared copy of the weights,"
  echo "replicas in turn on one thread per core where they outnumber the cores); *threads*:"
  echo "\`replicas: threads\` (each replica its own weights and thread). Peak memory is the process's"
  echo "resident peak. *same metrics*: the two N-replica runs' metrics.csv agree in every epoch's LR,"
  echo "losses, accuracies and noise-scale estimates (printed to 9 significant digits; the"
  echo "equivalence tests compare the bits)."
  echo
  echo "| model | N | 1 x (N*64) s | auto s | auto ratio | threads s | threads ratio | peak MiB 1 x (N*64) | peak MiB auto | peak MiB threads | same metrics | auto devices |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for m in "${models[@]}"; do
    IFS='|' read -r name config extra <<<"$m"
    read -r -a extra_args <<<"$extra"
    for n in "${counts[@]}"; do
      common=("$config" train.epochs="$epochs" optimizer.warmup_epochs=0 data.test_limit=1000
              train.eval_batch=64 "${extra_args[@]}" --quiet --results "$runs/$name")
      "$dtrain" run "${common[@]}" gpus=1 train.per_replica_batch=$((64 * n)) --tag one$n >/dev/null 2>&1
      "$dtrain" run "${common[@]}" gpus="$n" train.per_replica_batch=64 --tag auto >/dev/null 2>&1
      "$dtrain" run "${common[@]}" gpus="$n" train.per_replica_batch=64 replicas=threads --tag threads >/dev/null 2>&1
      one=$(ls -d "$runs/$name"/*/one$n-g1)
      auto=$(ls -d "$runs/$name"/*/auto-g"$n")
      thr=$(ls -d "$runs/$name"/*/threads-g"$n")
      # Every epoch's losses, accuracies and noise-scale estimates, as metrics.csv prints them.
      same=no
      if [ "$(cut -d, -f2-7,20-22 "$auto/metrics.csv")" = "$(cut -d, -f2-7,20-22 "$thr/metrics.csv")" ]; then same=yes; fi
      awk -v m="$name" -v n="$n" -v a="$(field "$one" median_epoch_time_s)" \
          -v b="$(field "$auto" median_epoch_time_s)" -v c="$(field "$thr" median_epoch_time_s)" \
          -v ra="$(field "$one" peak_rss_mib)" -v rb="$(field "$auto" peak_rss_mib)" \
          -v rc="$(field "$thr" peak_rss_mib)" -v s="$same" -v d="$(text "$auto" devices)" \
        'BEGIN { printf "| %s | %d | %.3f | %.3f | %.2fx | %.3f | %.2fx | %.0f | %.0f | %.0f | %s | %s |\n",
                 m, n, a, b, b / a, c, c / a, ra, rb, rc, s, d }'
    done
  done
} | tee "$out"
