#!/usr/bin/env bash
# Builds the libFuzzer targets in the sanitize tree (clang, ASan and UBSan; the `sanitize`
# preset, shared with scripts/sanitize.sh, so CI compiles the library once for both) and runs
# each for a bounded time on a copy of its committed seed corpus (fuzz/corpus/<target>), with a
# memory limit that catches a reader allocating what a hostile header claims.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     # default 60 seconds each, targets config, idx, cifar, image and tokens
#
# Prints one line per target (executions, crashes, timeouts, out-of-memory) and exits 1 if any
# target found a crash; its input is kept in build-sanitize/fuzz-findings/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config idx cifar image tokens)
case $seconds in '' | *[!0-9]*) echo "fuzz: SECONDS must be a whole number, got '$seconds'"; exit 2 ;; esac
for t in "${targets[@]}"; do
  [ -f "fuzz/fuzz_$t.cpp" ] || { echo "fuzz: no target '$t' (valid: config, idx, cifar, image, tokens)"; exit 2; }
done

scripts/install-deps.sh
scripts/build-clang.sh --deps libclang-rt-14-dev  # clang, and libFuzzer with the sanitizers
command -v ninja >/dev/null && [ ! -f build-sanitize/Makefile ] && export CMAKE_GENERATOR=Ninja
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize --parallel "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}") >/dev/null

found=0
for t in "${targets[@]}"; do
  work=build-sanitize/fuzz-corpus/$t findings=build-sanitize/fuzz-findings/$t
  mkdir -p "$work" "$findings"
  cp -n fuzz/corpus/"$t"/* "$work"/
  log=build-sanitize/fuzz-$t.log
  dict=()
  [ -f fuzz/"$t".dict ] && dict=(-dict=fuzz/"$t".dict)
  rc=0
  # The outer timeout bounds a run whose exit hangs (leak checking a huge heap after an OOM).
  ASAN_OPTIONS=detect_leaks=1 timeout -k 10 $((seconds + 120)) build-sanitize/fuzz/fuzz_"$t" "$work" "${dict[@]}" -max_total_time="$seconds" \
    -rss_limit_mb=1024 -malloc_limit_mb=1024 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$findings/" >"$log" 2>&1 || rc=$?
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -n 1)
  crashes=$(find "$findings" -name 'crash-*' | wc -l)
  timeouts=$(find "$findings" -name 'timeout-*' | wc -l)
  ooms=$(find "$findings" -name 'oom-*' | wc -l)
  echo "fuzz: $t: ${execs:-0} executions in ${seconds} s, $crashes crashes, $timeouts timeouts, $ooms out-of-memory (log: $log)"
  if [ "$rc" != 0 ] || [ $((crashes + timeouts + ooms)) -gt 0 ]; then
    grep -E 'ERROR|SUMMARY|what\(\)' "$log" | head -n 5
    found=1
  fi
done
exit "$found"
