#!/usr/bin/env bash
# Builds self-contained dtrain and test binaries (static C++ and OpenMP runtimes and libraries;
# only glibc and the CUDA libraries shared) for a GPU machine that lacks the Debian development
# packages, and packs them with Fashion-MNIST into .gpu-carry/ (ignored by git; about 55 MB):
#   .gpu-carry/dtrain-portable.tar.gz   apps/dtrain and tests/dtrain_tests
#   .gpu-carry/data/fashion-mnist/      the four IDX files (the training set cut to its first
#                                       images where the whole would not travel: 64 MiB)
#   .gpu-carry/commit                   the commit the binaries were built from
# scripts/gpu-check.sh unpacks them where it cannot build. Needs glibc 2.36 or newer where it runs.
set -euo pipefail
cd "$(dirname "$0")/.."

# Bytes of one IDX file, gzipped, keeping its first N rows of ROW bytes (header HDR bytes: the
# magic, then big-endian counts; the first count is rewritten to N).
idx_head() {  # FILE N ROW HDR
  local f=$1 n=$2 row=$3 hdr=$4 be
  be=$(printf '\\%03o\\%03o\\%03o\\%03o' $((n >> 24 & 255)) $((n >> 16 & 255)) $((n >> 8 & 255)) $((n & 255)))
  { gzip -dc "$f" | head -c 4 || true
    printf "$be"
    gzip -dc "$f" | tail -c +9 | head -c $((hdr - 8 + n * row)) || true
  } | gzip -9
}
# What travels to the GPU machine (tracked and untracked files outside .gitignore, plus
# .gpu-carry) may be 64 MiB, but the transfer counts more than this sum: 62.1 MiB by it was
# refused. Where it would pass 60 MiB, keep the first training images that fit (the test set
# whole) and say so.
fit_travel_limit() {
  local limit=$((60 * 1024 * 1024)) tree carry d=.gpu-carry/data/fashion-mnist n img got
  tree=$(git ls-files -z --cached --others --exclude-standard |
         xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }' || true)
  carry=$(du -sb .gpu-carry | cut -f1)
  [ $((tree + carry)) -le "$limit" ] && return 0
  img=$(stat -c %s "$d/train-images-idx3-ubyte.gz")
  n=$(( 60000 * (img - (tree + carry - limit)) / img * 97 / 100 ))
  if [ "$n" -lt 30000 ]; then
    echo "build-portable: the tree ($tree bytes) and .gpu-carry ($carry) are over 60 MiB by more" \
         "than half the training images; nothing would travel to the GPU machine"
    exit 1
  fi
  idx_head "$d/train-images-idx3-ubyte.gz" "$n" 784 16 > "$d/images.tmp"
  idx_head "$d/train-labels-idx1-ubyte.gz" "$n" 1 8 > "$d/labels.tmp"
  got=$(gzip -dc "$d/images.tmp" | wc -c)
  [ "$got" = $((16 + n * 784)) ] || { echo "build-portable: cutting the training images failed"; exit 1; }
  mv "$d/images.tmp" "$d/train-images-idx3-ubyte.gz"
  mv "$d/labels.tmp" "$d/train-labels-idx1-ubyte.gz"
  echo "build-portable: the tree ($tree bytes) and .gpu-carry came to more than 60 MiB; the" \
       "carried Fashion-MNIST keeps its first $n training images (the test set whole)"
}
scripts/install-deps.sh
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B build-portable "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_PORTABLE=ON \
  -DDTRAIN_REQUIRE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="80;90"
cmake --build build-portable -j"$(nproc)"
# Only glibc and the CUDA libraries may be needed where the binaries go.
for b in build-portable/apps/dtrain build-portable/tests/dtrain_tests; do
  extra=$(readelf -d "$b" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' |
          grep -vE '^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64)\.so|^lib(cublas|cublasLt|cudnn|nccl|cudart)\.so' || true)
  [ -z "$extra" ] || { echo "build-portable: $b needs shared libraries a bare image may lack: $extra"; exit 1; }
done
mkdir -p .gpu-carry/data
tar -C build-portable -czf .gpu-carry/dtrain-portable.tar.gz apps/dtrain tests/dtrain_tests
rm -rf .gpu-carry/data/fashion-mnist
cp -r /usr/share/datasets/fashion-mnist .gpu-carry/data/fashion-mnist
fit_travel_limit
git rev-parse --short=12 HEAD > .gpu-carry/commit 2>/dev/null || echo unknown > .gpu-carry/commit
du -sh .gpu-carry
