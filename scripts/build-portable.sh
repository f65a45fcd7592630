#!/usr/bin/env bash
# Builds self-contained dtrain and test binaries (static C++ and OpenMP runtimes and libraries;
# only glibc and the CUDA libraries shared) for a GPU machine that lacks the Debian development
# packages, and packs them with Fashion-MNIST into .gpu-carry/ (ignored by git; about 36 MB):
#   .gpu-carry/dtrain-portable.tar.gz   apps/dtrain and tests/dtrain_tests
#   .gpu-carry/data/fashion-mnist/      the four IDX files
#   .gpu-carry/commit                   the commit the binaries were built from
# scripts/gpu-check.sh unpacks them where it cannot build. Needs glibc 2.36 or newer where it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
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
git rev-parse --short=12 HEAD > .gpu-carry/commit 2>/dev/null || echo unknown > .gpu-carry/commit
du -sh .gpu-carry
