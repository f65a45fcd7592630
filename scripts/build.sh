#!/usr/bin/env bash
# Configures and builds dtrain (Release) into build/. Extra arguments go to CMake's configure.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build --parallel "$(nproc)"
