#!/usr/bin/env bash
# The sweep script end to end on a tiny synthetic experiment: runs, index, report, and a rerun
# that skips everything already finished. Usage: sweep_script_test.sh DTRAIN_BINARY
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/tiny.yaml" <<'YAML'
name: tiny
threads: 1
data:
  dataset: synthetic
  synthetic: {train_size: 512, test_size: 128, shape: [8], classes: 3}
model: {hidden: [16]}
train: {epochs: 2, per_replica_batch: 16, target_accuracy: 0}
YAML
export DTRAIN=$1 RESULTS=$tmp/res GPUS=1,2
"$here/scripts/sweep-gpus.sh" "$tmp/tiny.yaml" > "$tmp/first.log" 2>&1
[ "$(grep -c ',done,' "$tmp/res/tiny/index-sweep-gpus.csv")" -eq 2 ] || { echo "index not complete"; cat "$tmp/res/tiny/index-sweep-gpus.csv"; exit 1; }
grep -q "| sweep-gpus-g2" "$tmp/res/report/tiny.md" || { echo "report lacks the 2-replica run"; exit 1; }
if command -v gnuplot > /dev/null; then
  [ -s "$tmp/res/report/tiny-speedup.png" ] || { echo "no speedup figure"; exit 1; }
fi
before=$(md5sum "$tmp/res/tiny/sweep-gpus-g1/summary.json")
"$here/scripts/sweep-gpus.sh" "$tmp/tiny.yaml" > "$tmp/second.log" 2>&1
[ "$(grep -c 'skipped' "$tmp/second.log")" -eq 2 ] || { echo "rerun did not skip both runs"; cat "$tmp/second.log"; exit 1; }
[ "$before" = "$(md5sum "$tmp/res/tiny/sweep-gpus-g1/summary.json")" ] || { echo "a finished run was redone"; exit 1; }
echo "sweep script: ok"
