#!/usr/bin/env bash
# Where the first epoch's extra time goes on a GPU: the fmnist CNN for 2 epochs in fp32 and bf16,
# and bf16 with one suspect changed at a time (CUDA graphs off; CUDA modules loaded eagerly;
# evaluation at the training batch, so no new convolution shapes), then a short bf16 run with
# cuDNN's API log, whose timestamps show any slow call. Prints, per run, each epoch's time and
# its phases (compute, optimizer, evaluation) from metrics.csv.
#
#   scripts/bench/gpu_first_epoch.sh DTRAIN DATA OUTDIR
set -uo pipefail
dtrain=$1 data=$2 out=$3
cd "$(dirname "$0")/../.."
mkdir -p "$out"
common=(configs/fmnist-cnn.yaml backend=cuda train.epochs=2 optimizer.warmup_epochs=1
        "data.path=$data" --results "$out/runs" --quiet)
one() {  # tag, env assignments..., -- overrides...
  local tag=$1; shift
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local t0=$SECONDS
  env "${envs[@]}" "$dtrain" run "${common[@]}" --tag "$tag" "$@" || echo "$tag: exit $?"
  echo "## $tag (${envs[*]:-default env} $*): $((SECONDS - t0)) s in all"
  awk -F, 'NR > 1 { printf "  epoch %s: %.3f s (compute %.3f, optimizer %.3f, eval %.3f)\n",
                     $1, $8, $12, $14, $15 }' "$out/runs/fmnist-cnn/$tag-g1/metrics.csv"
  # The convolutions' cuDNN plans, made before the first epoch (its log line).
  grep -ho "cuDNN planned.*" "$out/runs/fmnist-cnn/$tag-g1/log" | sed 's/^/  /'
}
one fp32 -- precision=fp32
one bf16 -- precision=bf16
one bf16-nograph -- precision=bf16 train.cuda_graph=false
one bf16-eager-modules CUDA_MODULE_LOADING=EAGER -- precision=bf16
one bf16-eval64 -- precision=bf16 train.eval_batch=64
one fp32-again -- precision=fp32
# cuDNN's own log of every API call with timestamps (a short run: the log grows per call).
CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$out/cudnn-bf16.log" "$dtrain" run \
  configs/fmnist-cnn.yaml backend=cuda "data.path=$data" --results "$out/runs" --quiet \
  --tag bf16-log precision=bf16 train.epochs=1 optimizer.warmup_epochs=0 \
  data.train_limit=1024 data.test_limit=256
gzip -f "$out/cudnn-bf16.log" 2>/dev/null || true
