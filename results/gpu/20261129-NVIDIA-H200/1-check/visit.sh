#!/usr/bin/env bash
# One GPU call: every check stage but the benchmark and the profile, then where bf16's first
# epoch goes, then the sanitizer with what is left of the call's 560 s.
o=$OUT; t0=$SECONDS
export OUT=/tmp/gc DTRAIN_GPU_CHECK_CPU_TESTS=0 DTRAIN_SANITIZER_RUN_LIMIT=90 PYTHONUNBUFFERED=1
DTRAIN_GPU_CHECK_BUDGET=230 scripts/gpu-check.sh probe build devices tests runs > "$o/check.log" 2>&1
cat /tmp/gc/*/stages.md
echo "checks done at $((SECONDS - t0)) s"
bin=$(cat build-gpu/.route)/apps/dtrain; data=.gpu-carry/data/fashion-mnist
timeout -k 5 100 scripts/bench/gpu_first_epoch.sh "$bin" "$data" /tmp/fe > "$o/first-epoch.log" 2>&1
tar -C /tmp -czf "$o/first-epoch.tar.gz" fe
grep '^## ' "$o/first-epoch.log"
echo "first epoch done at $((SECONDS - t0)) s"
left=$((560 - (SECONDS - t0)))
DTRAIN_GPU_CHECK_BUDGET=$left scripts/gpu-check.sh sanitizer >> "$o/check.log" 2>&1
tar -C /tmp/gc -czf "$o/check.tar.gz" .
grep -E '^(memcheck|racecheck|synccheck) [a-z0-9-]+:' "$o/check.log"
cat /tmp/gc/*/stages.md
echo "all done at $((SECONDS - t0)) s"
