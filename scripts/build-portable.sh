#!/usr/bin/env bash
# Builds self-contained dtrain and test binaries (static C++ runtime and libraries, CUDA
# libraries shared) for a GPU machine that lacks the Debian development packages, and packs
# them into .gpu-carry/dtrain-portable.tar.xz (about 6 MB), which scripts/gpu-check.sh unpacks
# when it cannot build there. Needs glibc 2.36 or newer where it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build-portable -G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_PORTABLE=ON \
  -DCMAKE_CUDA_ARCHITECTURES="80;90"
cmake --build build-portable -j"$(nproc)"
mkdir -p .gpu-carry
tar -C build-portable -cJf .gpu-carry/dtrain-portable.tar.xz apps/dtrain tests/dtrain_tests
ls -la .gpu-carry/dtrain-portable.tar.xz
