#!/usr/bin/env bash
# The worked examples of docs/bench-comm.md, docs/project.md and docs/doctor-explain.md,
# measured on this machine and kept under results/readme-examples/:
#   bench-comm-2.md, bench-comm-4.md  dtrain bench-comm with 2 and 4 in-process replicas
#   projection-nvlink-h100.md         dtrain project of the quickstart MLP (1 replica, 3 epochs)
#   projection-measured.md            the same over the 4-replica bench-comm fit
#   threads.md                        the quickstart at 1 replica with threads 2, 16 and 64
#                                     (the doctor's oversubscribed-threads rule)
# Usage: scripts/bench/readme_examples.sh   (needs build/apps/dtrain, or DTRAIN=path)
set -euo pipefail
cd "$(dirname "$0")/../.."
dtrain=$(realpath "${DTRAIN:-build/apps/dtrain}")
out=results/readme-examples
rm -rf "$out" && mkdir -p "$out"
version=$("$dtrain" --version)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
where="\`scripts/bench/readme_examples.sh\` on $(nproc) cores ($cpu), $(date -u +%Y-%m-%d),"
where="$where $version."
median_epoch() {  # SUMMARY_JSON
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["median_epoch_time_s"])' "$1"
}

for n in 2 4; do
  "$dtrain" bench-comm --replicas "$n" --sizes 4K:64M --out "$out/bench-comm-$n" >/dev/null
done

"$dtrain" run configs/quickstart.yaml gpus=1 train.epochs=3 --tag mlp --results "$out/runs" \
  --quiet >/dev/null
run_dir=$(ls -d "$out"/runs/*/mlp-g1)
"$dtrain" project "$run_dir" --out "$out/projection-nvlink-h100" >/dev/null
"$dtrain" project "$run_dir" --gpus 1,2,4 --link "measured:$out/bench-comm-4.json" \
  --out "$out/projection-measured" >/dev/null

# Kernel threads beyond the cores: the median epoch (evaluation excluded) at 1 replica.
{
  echo "# The quickstart MLP at 1 replica with more kernel threads than cores"
  echo
  echo "$where"
  echo "\`dtrain run configs/quickstart.yaml threads=T train.epochs=2 optimizer.warmup_epochs=0"
  echo "data.test_limit=1000\`; median epoch time from summary.json."
  echo
  echo "| threads | median epoch s |"
  echo "|---|---|"
  for t in 2 16 64; do
    "$dtrain" run configs/quickstart.yaml threads="$t" train.epochs=2 optimizer.warmup_epochs=0 \
      data.test_limit=1000 --tag "threads$t" --results "$out/runs" --quiet >/dev/null
    s=$(ls -d "$out"/runs/*/"threads$t"-g1)/summary.json
    printf '| %s | %.2f |\n' "$t" "$(median_epoch "$s")"
  done
} >"$out/threads.md"

{
  echo "# The worked examples of the documentation"
  echo
  echo "$where"
  echo "Projections are a model, not a measurement."
  for f in bench-comm-2 bench-comm-4 projection-nvlink-h100 projection-measured threads; do
    echo
    echo "## $f"
    echo
    sed '1{/^# /d}' "$out/$f.md"
  done
} >"$out/README.md"
cat "$out/README.md"
