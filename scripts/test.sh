#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --testbed
scripts/build.sh
cd build
rc=0
ctest --output-on-failure --parallel "$(nproc)" --timeout 900 2>&1 | tee ctest.log || rc=$?
# The GPU tests pass by skipping where there is no GPU; say so rather than let it pass silently.
skip=$(./tests/dtrain_tests "[cuda]" 2>&1 | grep -o "SKIPPED (no GPU): .*" | head -n 1 || true)
if [ -n "$skip" ]; then
  echo "test: the GPU tests were skipped ($skip); run scripts/gpu-check.sh on a GPU machine"
fi
# A test that skips says why in one line (exit 77, e.g. the multi-node tests without root).
grep -hoE '^[a-z-]+: SKIPPED: .*' Testing/Temporary/LastTest.log 2>/dev/null | sed 's/^/test: skipped: /' || true
# One plain closing line with the counts.
counts=$(sed -nE 's/^[0-9]+% tests passed, ([0-9]+) tests failed out of ([0-9]+)$/\1 \2/p' ctest.log | tail -n 1)
if [ -n "$counts" ]; then
  read -r failed total <<<"$counts"
  echo "tests: $((total - failed)) passed, $failed failed"
fi
exit "$rc"
