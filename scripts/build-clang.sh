#!/usr/bin/env bash
# Builds dtrain and its tests with clang, every warning an error (the CPU backend; nvcc builds
# the CUDA sources with the host GCC in scripts/build.sh). Installs clang and the OpenMP
# runtime it links against where they are missing.
#   scripts/build-clang.sh [BUILD_DIR]     # default build-clang
#   scripts/build-clang.sh --deps [PKG...] # only install clang, the OpenMP runtime and PKG...
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-clang}
extra=()
[ "$dir" = --deps ] && extra=("${@:2}")
missing=()
for p in clang libomp-dev "${extra[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log=$(mktemp)
  echo "build-clang: installing ${missing[*]} (log: $log)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >"$log" 2>&1 || { tail -n 30 "$log"; exit 1; }
fi
[ "$dir" = --deps ] && exit 0
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cfg_log=$(mktemp)
CC=clang CXX=clang++ cmake -S . -B "$dir" "${generator[@]}" -DDTRAIN_CUDA=OFF \
  -DCMAKE_CXX_FLAGS=-Werror >"$cfg_log" 2>&1 || { cat "$cfg_log"; exit 1; }
cmake --build "$dir" --parallel "$(nproc)"
echo "build-clang: $(clang++ --version | head -n 1): built with -Werror"
