#!/usr/bin/env bash
# Winograd's convolutions against the direct ones in dtrain's CPU backend: the same dtrain binary
# run with DTRAIN_CPU_CONV=onednn-direct and DTRAIN_CPU_CONV=onednn (the default: Winograd's
# F(4x4, 3x3) where winograd_suits a convolution), alternated ROUNDS times in one session so both
# see the same machine, on four workloads: ResNet-20 on 4,096 synthetic 3x32x32 samples, the
# Fashion-MNIST ResNet and the small CNN on 6,400 images, and the CIFAR ResNet-18 on 1,280
# synthetic samples (the memory benchmark's run). Compared by the median epoch time (each run's
# first epoch dropped as warm-up) and the median peak RSS; then oneDNN's own time per pass and
# convolution shape (ONEDNN_VERBOSE=1) over one epoch of ResNet-20 on 1,024 samples.
# Usage: scripts/bench/cpu_conv.sh [ROUNDS] [EPOCHS]   (needs build/apps/dtrain built with oneDNN)
# Writes results/bench/cpu-conv.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/epoch-times.sh
rounds=${1:-2} epochs=${2:-3}
check_rounds_epochs cpu_conv "$rounds" "$epochs"
dtrain=${DTRAIN:-build/apps/dtrain}
[ -x "$dtrain" ] || { echo "cpu_conv: no dtrain at $dtrain (scripts/build.sh, or DTRAIN=...)"; exit 2; }
DTRAIN_CPU_CONV=onednn-direct "$dtrain" devices >/dev/null ||
  { echo "cpu_conv: this dtrain has no oneDNN to compare"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
r20=(configs/fmnist-resnet.yaml data.dataset=synthetic 'data.synthetic.shape=[3,32,32]'
  data.synthetic.test_size=256 data.augment.flip=false data.augment.crop_padding=0)
r18=(configs/cifar10-resnet18.yaml data.dataset=synthetic 'data.synthetic.shape=[3,32,32]'
  data.synthetic.train_size=1280 data.synthetic.test_size=1000 optimizer.warmup_epochs=0)
small=(data.train_limit=6400 optimizer.warmup_epochs=0)
run() {  # run NAME CONV ROUND CONFIG OVERRIDES...
  local name=$1 conv=$2 r=$3
  shift 3
  DTRAIN_CPU_CONV=$conv "$dtrain" run "$@" gpus=1 threads=2 train.epochs="$epochs" \
    --results "$tmp/$name" --tag "r$r-$conv" --quiet >/dev/null
}
for r in $(seq "$rounds"); do
  for conv in onednn-direct onednn; do
    run resnet20 "$conv" "$r" "${r20[@]}" data.synthetic.train_size=4096
    run fmnist-resnet "$conv" "$r" configs/fmnist-resnet.yaml "${small[@]}"
    run resnet18 "$conv" "$r" "${r18[@]}"
    run cnn "$conv" "$r" configs/fmnist-cnn.yaml "${small[@]}"
  done
done
# oneDNN's milliseconds per pass and shape over one epoch of ResNet-20 on 1,024 samples (batch
# 128 only: evaluation's last chunk left out), for one convolution setting.
verbose_ms() {  # verbose_ms CONV
  ONEDNN_VERBOSE=1 DTRAIN_CPU_CONV=$1 "$dtrain" run "${r20[@]}" data.synthetic.train_size=1024 \
    gpus=1 threads=2 train.epochs=1 --results "$tmp/verbose-$1" --tag v --quiet |
    awk -F, '$1 == "onednn_verbose" && $2 == "exec" && $4 == "convolution" && $(NF-1) ~ /^mb128_/ {
      split($(NF-1), s, "_"); t[$6 " " s[2]] += $NF } END { for (k in t) printf "%s %.1f\n", k, t[k] }' |
    sort
}
verbose_ms onednn-direct >"$tmp/direct.ms"
verbose_ms onednn >"$tmp/wino.ms"
out=$tmp/cpu-conv.md  # moved into results/bench only once whole
{
  echo "# Winograd's convolutions against direct ones in dtrain's CPU backend"
  echo
  echo "\`scripts/bench/cpu_conv.sh $rounds $epochs\` on $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')),"
  echo "$(date -u +%Y-%m-%d), commit $(git describe --always --dirty --abbrev=12);"
  echo "$("$dtrain" devices | head -1)."
  echo "$rounds rounds of both settings alternated, 1 replica x 2 threads, $epochs epochs a run;"
  echo "median epoch time over epochs 2..$epochs of every run of a setting, median peak RSS."
  echo
  echo "| workload | direct s/epoch | Winograd s/epoch | direct / Winograd | direct peak MiB | Winograd peak MiB |"
  echo "|---|---|---|---|---|---|"
  for name in resnet20 fmnist-resnet resnet18 cnn; do
    d=$(steady_epoch_times "$tmp/$name"/*/r*-onednn-direct-g1/metrics.csv | median)
    w=$(steady_epoch_times "$tmp/$name"/*/r*-onednn-g1/metrics.csv | median)
    dp=$(peaks "$tmp/$name"/*/r*-onednn-direct-g1/summary.json | median)
    wp=$(peaks "$tmp/$name"/*/r*-onednn-g1/summary.json | median)
    echo "| $name | $d | $w | $(awk -v a="$d" -v b="$w" 'BEGIN { printf "%.2fx", a / b }') | $dp | $wp |"
  done
  echo
  echo "oneDNN's time per pass and shape (ResNet-20, 1,024 samples, one epoch, batch 128,"
  echo "\`ONEDNN_VERBOSE=1\`; the kernel each setting ran is in the log of a run):"
  echo
  echo "| pass | channels in, out | direct ms | with Winograd ms | ratio |"
  echo "|---|---|---|---|---|"
  join -j1 <(awk '{ print $1 "|" $2, $3 }' "$tmp/direct.ms" | sort) \
    <(awk '{ print $1 "|" $2, $3 }' "$tmp/wino.ms" | sort) |
    awk '{ split($1, k, "|"); printf "| %s | %s | %.1f | %.1f | %.2fx |\n", k[1], k[2], $2, $3, $3 / $2 }'
  echo
  echo "Total: direct $(awk '{ s += $3 } END { printf "%.1f", s }' "$tmp/direct.ms") ms," \
    "with Winograd $(awk '{ s += $3 } END { printf "%.1f", s }' "$tmp/wino.ms") ms."
} > "$out"
mkdir -p results/bench
mv "$out" results/bench/cpu-conv.md
cat results/bench/cpu-conv.md
