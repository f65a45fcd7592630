#!/usr/bin/env bash
# BatchNorm's fused passes against the separate ones in dtrain's CPU backend: the same dtrain
# binary run with DTRAIN_CPU_FUSE=off (a residual block's last BatchNorm, its sum and its ReLU
# as two passes forward, the ReLU's mask and BatchNorm's sums as two backward, as the Device
# defaults run them, every pass walking its maps from the start) and with the default (one pass
# each, BatchNorm's sums walking the maps from where the pass before left off), alternated
# ROUNDS times in one session so both see the same machine, on ResNet-20 on 4,096 synthetic
# 3x32x32 samples, the Fashion-MNIST ResNet on 6,400 images and the CIFAR ResNet-18 on 1,280
# synthetic samples. Compared by the median epoch time (each run's first epoch dropped as
# warm-up). Both settings give the same bits: the script checks that each round's two runs end
# with the same losses, as metrics.csv prints them.
# Usage: scripts/bench/cpu_fuse.sh [ROUNDS] [EPOCHS]   Writes results/bench/cpu-fuse.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/bench/epoch-times.sh
rounds=${1:-3} epochs=${2:-3}
check_rounds_epochs cpu_fuse "$rounds" "$epochs"
dtrain=${DTRAIN:-build/apps/dtrain}
[ -x "$dtrain" ] || { echo "cpu_fuse: no dtrain at $dtrain (scripts/build.sh, or DTRAIN=...)"; exit 2; }
grep -q DTRAIN_CPU_FUSE "$dtrain" || { echo "cpu_fuse: this dtrain has no DTRAIN_CPU_FUSE"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
r20=(configs/fmnist-resnet.yaml data.dataset=synthetic 'data.synthetic.shape=[3,32,32]'
  data.synthetic.train_size=4096 data.synthetic.test_size=256 data.augment.flip=false
  data.augment.crop_padding=0 optimizer.warmup_epochs=0)
r18=(configs/cifar10-resnet18.yaml data.dataset=synthetic 'data.synthetic.shape=[3,32,32]'
  data.synthetic.train_size=1280 data.synthetic.test_size=1000 optimizer.warmup_epochs=0)
fm=(configs/fmnist-resnet.yaml data.train_limit=6400 optimizer.warmup_epochs=0)
run() {  # run NAME FUSE ROUND CONFIG OVERRIDES...
  local name=$1 fuse=$2 r=$3
  shift 3
  DTRAIN_CPU_FUSE=$fuse "$dtrain" run "$@" gpus=1 threads=2 train.epochs="$epochs" \
    --results "$tmp/$name" --tag "r$r-$fuse" --quiet >/dev/null
}
for r in $(seq "$rounds"); do
  for fuse in off on; do
    run resnet20 "$fuse" "$r" "${r20[@]}"
    run fmnist-resnet "$fuse" "$r" "${fm[@]}"
    run resnet18 "$fuse" "$r" "${r18[@]}"
  done
done
out=$tmp/cpu-fuse.md  # moved into results/bench only once whole
{
  echo "# BatchNorm's fused passes against separate ones in dtrain's CPU backend"
  echo
  echo "\`scripts/bench/cpu_fuse.sh $rounds $epochs\` on $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')),"
  echo "$(date -u +%Y-%m-%d), commit $(git describe --always --dirty --abbrev=12);"
  echo "$("$dtrain" devices | head -1)."
  echo "$rounds rounds of both settings alternated, 1 replica x 2 threads, $epochs epochs a run;"
  echo "median epoch time over epochs 2..$epochs of every run of a setting, median peak RSS."
  echo
  echo "| workload | separate s/epoch | fused s/epoch | separate / fused | same losses | peak MiB separate, fused |"
  echo "|---|---|---|---|---|---|"
  for name in resnet20 fmnist-resnet resnet18; do
    a=$(steady_epoch_times "$tmp/$name"/*/r*-off-g1/metrics.csv | median)
    b=$(steady_epoch_times "$tmp/$name"/*/r*-on-g1/metrics.csv | median)
    same=yes
    for r in $(seq "$rounds"); do
      [ "$(last_losses "$tmp/$name"/*/r$r-off-g1/metrics.csv)" = \
        "$(last_losses "$tmp/$name"/*/r$r-on-g1/metrics.csv)" ] || same=NO
    done
    ap=$(peaks "$tmp/$name"/*/r*-off-g1/summary.json | median)
    bp=$(peaks "$tmp/$name"/*/r*-on-g1/summary.json | median)
    echo "| $name | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3fx", a / b }') | $same | $ap, $bp |"
  done
} > "$out"
mkdir -p results/bench
mv "$out" results/bench/cpu-fuse.md
cat results/bench/cpu-fuse.md
