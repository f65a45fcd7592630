#!/usr/bin/env bash
# Builds the library, the binary and the tests with clang, every warning an error, and
# AddressSanitizer and UndefinedBehaviorSanitizer (the `sanitize` preset of CMakePresets.json, in
# build-sanitize/), then runs the tests there: a memory error, a leak or undefined behaviour
# fails the test it happens in. CI runs it with --fast (it is also CI's clang build).
#
#   scripts/sanitize.sh           # every test
#   scripts/sanitize.sh --fast    # all but the slow ones (MPI, multi-node, Fashion-MNIST training,
#                                 # the docs test, which reads Fashion-MNIST once per command
#                                 # line), the probe, whose memory bounds mean nothing under ASan,
#                                 # and the straggler run test, whose phase times do not either
#                                 # (instrumented elementwise loops against uninstrumented BLAS)
set -euo pipefail
cd "$(dirname "$0")/.."
filter=()
if [ "${1:-}" = --fast ]; then
  filter=(-E "^probe$|^docs$|^multinode$|mpirun|under mpirun|Fashion-MNIST|quickstart|fmnist|sweep script|killed rank|rank that throws|slowed on purpose")
elif [ $# -gt 0 ]; then
  echo "sanitize: unknown argument '$1' (valid: --fast)"; exit 2
fi
scripts/install-deps.sh
scripts/build-clang.sh --deps libclang-rt-14-dev  # the sanitizers' runtime libraries
command -v ninja >/dev/null && [ ! -f build-sanitize/Makefile ] && export CMAKE_GENERATOR=Ninja
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize --parallel "$(nproc)"
ctest --preset sanitize --parallel "$(nproc)" "${filter[@]}"
