#!/usr/bin/env bash
# Replica-count sweep: CONFIG at 1, 2, 4 and 8 replicas, then the report with figures.
#   scripts/sweep-gpus.sh CONFIG [key=value ...]
# Environment: RESULTS (default results/sweeps), TAG (default sweep-gpus), GPUS (default 1,2,4,8).
# Resumable: rerun the same command and runs whose folder says done (or diverged) are skipped,
# unfinished ones run again. A failed run is reported and does not stop the sweep. Each
# experiment keeps an index of the sweep's runs in RESULTS/<name>/index-TAG.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
source scripts/sweep-common.sh
config=$1
shift
run_sweep "${TAG:-sweep-gpus}" "$config" "gpus=${GPUS:-1,2,4,8}" "$@"
