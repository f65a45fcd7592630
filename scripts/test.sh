#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
# The GPU tests pass by skipping where there is no GPU; say so rather than let it pass silently.
if ./tests/dtrain_tests "[cuda]" 2>&1 | grep -m1 -o "SKIPPED (no GPU): .*"; then
  echo "test: the GPU tests above were skipped; run scripts/gpu-check.sh on a GPU machine"
fi
