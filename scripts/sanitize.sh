#!/usr/bin/env bash
# Builds the library, the binary and the tests with AddressSanitizer and UndefinedBehaviorSanitizer
# (the `sanitize` CMake preset, in build-sanitize/) and runs the tests there: a memory error, a
# leak or undefined behaviour fails the test it happens in.
#
#   scripts/sanitize.sh           # every test
#   scripts/sanitize.sh --fast    # all but the slow ones (MPI, full Fashion-MNIST training)
set -euo pipefail
cd "$(dirname "$0")/.."
filter=()
if [ "${1:-}" = --fast ]; then
  # Under the sanitizers these take minutes; the rest takes about one.
  filter=(-E "mpirun|under mpirun|Fashion-MNIST|quickstart|fmnist|sweep script|killed rank|rank that throws")
elif [ $# -gt 0 ]; then
  echo "sanitize: unknown argument '$1' (valid: --fast)"; exit 2
fi
scripts/install-deps.sh
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j"$(nproc)"
ctest --preset sanitize --parallel "$(nproc)" "${filter[@]}"
