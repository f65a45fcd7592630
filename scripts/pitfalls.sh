#!/usr/bin/env bash
# Runs the three pitfall configs, each as a small grid against its fix, and collects the
# comparison tables in results/pitfalls.md (run folders under results/pitfalls/).
#   scripts/pitfalls.sh [TAG]      (TAG defaults to "study"; existing run folders are an error)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh > /dev/null
out=results/pitfalls
tag=${1:-study}
studies=(
  "pitfall-sum-reduction|gpus=1,8 train.reduction=mean,sum"
  "pitfall-unscaled-lr|gpus=1,8 optimizer.lr_scaling=none,linear,sqrt optimizer.warmup_epochs=0,2"
  "pitfall-sorted-contiguous|gpus=1,4 data.shuffle=none,batch,sample"
)
for s in "${studies[@]}"; do
  exp=${s%%|*}
  # shellcheck disable=SC2086 # the overrides are meant to split into words
  build/apps/dtrain run "configs/$exp.yaml" ${s#*|} --results "$out" --tag "$tag" --quiet \
    > /dev/null
done
{
  echo "# Pitfalls, measured"
  echo
  echo "Produced by \`scripts/pitfalls.sh\` on $(date -u +%Y-%m-%d), commit"
  echo "$(git rev-parse --short=12 HEAD), $(nproc) cores, CPU backend. Each table is the comparison"
  echo "table dtrain wrote for the command above it; run folders are in \`results/pitfalls/\`."
  for s in "${studies[@]}"; do
    exp=${s%%|*}
    printf '\n## %s\n\n`dtrain run configs/%s.yaml %s`\n\n' "$exp" "$exp" "${s#*|}"
    cat "$out/$exp/comparison-$tag.md"
  done
} > results/pitfalls.md
cat results/pitfalls.md
