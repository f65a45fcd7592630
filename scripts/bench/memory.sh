#!/usr/bin/env bash
# Peak memory of a run against the shape engine's estimate (`dtrain validate --print`, the
# '# memory:' line): ResNet-18 (configs/cifar10-resnet18.yaml) at batch 128 on synthetic 3x32x32,
# and the Fashion-MNIST ResNet and CNN, each for one short epoch on this machine's CPU.
# The peak is the process's maximum RSS (summary.json's peak_rss_mib, from getrusage), which also
# holds what no estimate counts: the program and its libraries, oneDNN's staging buffers and
# scratchpads, the allocator's slack.
# Usage: scripts/bench/memory.sh   (needs build/apps/dtrain)
# Writes results/bench/memory.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
dtrain=$(realpath "${DTRAIN:-build/apps/dtrain}")
out=results/bench
scratch=$(mktemp -d /tmp/dtrain-memory.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$out"
cases=(
  "resnet18|configs/cifar10-resnet18.yaml data.dataset=synthetic data.synthetic.shape=[3,32,32] data.synthetic.train_size=1280 data.synthetic.test_size=1000"
  "fmnist-resnet|configs/fmnist-resnet.yaml data.train_limit=6400"
  "fmnist-cnn|configs/fmnist-cnn.yaml data.train_limit=6400"
)
rows=()
for c in "${cases[@]}"; do
  name=${c%%|*}
  read -r -a args <<<"${c#*|}"
  args+=(train.epochs=1 optimizer.warmup_epochs=0 threads=2)
  # The estimate: "# memory: about N MiB per replica (...), and D MiB for the data set".
  line=$("$dtrain" validate "${args[@]}" --print | grep '^# memory:')
  replica=$(sed -E 's/^# memory: about ([0-9]+) MiB per replica.*/\1/' <<<"$line")
  data=$(sed -E 's/.*, and ([0-9]+) MiB for the data set$/\1/' <<<"$line")
  "$dtrain" run "${args[@]}" --results "$scratch" --tag "$name" --quiet >/dev/null 2>&1
  summary=$(ls "$scratch"/*/"$name"-g1/summary.json)
  peak=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["peak_rss_mib"]))' "$summary")
  rows+=("$name|${args[*]}|$replica|$data|$peak")
done
{
  echo "# Peak memory against the estimate"
  echo
  echo "\`scripts/bench/memory.sh\`, $(date -u +%Y-%m-%d), commit $(git describe --always --dirty --abbrev=12), CPU backend,"
  echo "1 replica, 2 threads. Estimate: \`dtrain validate --print\`'s '# memory:' line (per replica,"
  echo "plus the data set); peak: the run's maximum RSS (\`summary.json\` peak_rss_mib)."
  echo
  echo "| run | estimate per replica (MiB) | data set (MiB) | estimate (MiB) | peak RSS (MiB) | peak / estimate |"
  echo "|---|---|---|---|---|---|"
  for r in "${rows[@]}"; do
    IFS='|' read -r name _ replica data peak <<<"$r"
    awk -v n="$name" -v r="$replica" -v d="$data" -v p="$peak" \
      'BEGIN { printf "| %s | %d | %d | %d | %d | %.2fx |\n", n, r, d, r + d, p, p / (r + d) }'
  done
  echo
  echo "Runs:"
  echo
  for r in "${rows[@]}"; do
    IFS='|' read -r name args _ <<<"$r"
    echo "- $name: \`dtrain run $args\`"
  done
} >"$out/memory.md"
cat "$out/memory.md"
