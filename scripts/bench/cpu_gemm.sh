#!/usr/bin/env bash
# Whose sgemm the CPU backend should call: the same dtrain binary run with DTRAIN_CPU_GEMM=openblas
# and DTRAIN_CPU_GEMM=onednn, alternated ROUNDS times in one session so both see the same
# machine, on four workloads: the GPT of results/bench/gpt-vs-pytorch.md (4 layers, width 256,
# context 128, batch 32, 384 windows of /usr/share/common-licenses), the quickstart MLP, the small
# CNN and the small ResNet (6,000 samples each). Compared by the median epoch time (each run's
# first epoch dropped as warm-up), with each run's last test loss: the two libraries round
# differently, so the losses differ in their last digits and drift apart over a run.
# Usage: scripts/bench/cpu_gemm.sh [ROUNDS] [EPOCHS]   (needs build/apps/dtrain built with oneDNN)
# Writes results/bench/cpu-gemm.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/epoch-times.sh
rounds=${1:-3} epochs=${2:-3}
check_rounds_epochs cpu_gemm "$rounds" "$epochs"
dtrain=${DTRAIN:-build/apps/dtrain}
[ -x "$dtrain" ] || { echo "cpu_gemm: no dtrain at $dtrain (scripts/build.sh, or DTRAIN=...)"; exit 2; }
DTRAIN_CPU_GEMM=onednn "$dtrain" devices >/dev/null ||
  { echo "cpu_gemm: this dtrain has no oneDNN to compare"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gpt=(configs/bytes-gpt.yaml data.path=/usr/share/common-licenses 'data.exclude=[]' 'data.sha256=""'
  model.n_embd=256 data.block_size=128 data.train_limit=384)
small=(data.train_limit=6000 optimizer.warmup_epochs=0)
run() {  # run NAME LIB ROUND CONFIG OVERRIDES...
  local name=$1 lib=$2 r=$3
  shift 3
  DTRAIN_CPU_GEMM=$lib "$dtrain" run "$@" gpus=1 threads=2 train.epochs="$epochs" \
    --results "$tmp/$name" --tag "r$r-$lib" --quiet >/dev/null
}
for r in $(seq "$rounds"); do
  for lib in openblas onednn; do
    run gpt "$lib" "$r" "${gpt[@]}"
    run mlp "$lib" "$r" configs/quickstart.yaml
    run cnn "$lib" "$r" configs/fmnist-cnn.yaml "${small[@]}"
    run resnet "$lib" "$r" configs/fmnist-resnet.yaml "${small[@]}"
  done
done
last_loss() {  # the test loss after the last epoch of each run, space-separated
  for f in "$@"; do
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "test_loss") c = i; next }
             { v = $c } END { printf "%.7g ", v }' "$f"
  done
}
out=$tmp/cpu-gemm.md  # moved into results/bench only once whole
{
  echo "# oneDNN's sgemm against OpenBLAS's in dtrain's CPU backend"
  echo
  echo "\`scripts/bench/cpu_gemm.sh $rounds $epochs\` on $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')),"
  echo "$(date -u +%Y-%m-%d), commit $(git describe --always --dirty --abbrev=12);"
  echo "$("$dtrain" devices | head -1)."
  echo "$rounds rounds of both libraries alternated, 1 replica x 2 threads, $epochs epochs a run;"
  echo "median epoch time over epochs 2..$epochs of every run of a library."
  echo
  echo "| workload | OpenBLAS s/epoch | oneDNN s/epoch | OpenBLAS / oneDNN | test loss, OpenBLAS runs | test loss, oneDNN runs |"
  echo "|---|---|---|---|---|---|"
  for name in gpt mlp cnn resnet; do
    runs=("$tmp/$name"/*/r*-openblas-g1/metrics.csv)
    mine=("$tmp/$name"/*/r*-onednn-g1/metrics.csv)
    ob=$(steady_epoch_times "${runs[@]}" | median)
    dn=$(steady_epoch_times "${mine[@]}" | median)
    echo "| $name | $ob | $dn | $(awk -v a="$ob" -v b="$dn" 'BEGIN { printf "%.2fx", a / b }') | $(last_loss "${runs[@]}")| $(last_loss "${mine[@]}")|"
  done
} > "$out"
mkdir -p results/bench
mv "$out" results/bench/cpu-gemm.md
cat results/bench/cpu-gemm.md
