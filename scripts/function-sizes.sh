#!/usr/bin/env bash
# The longest functions in DIR, lib/dtrain by default (Universal Ctags finds where each begins
# and ends). The tests run it on lib/dtrain and on apps/dtrain.
# Usage: scripts/function-sizes.sh [--top N] [--limit L] [DIR]
# Prints the N longest (default 10) as "lines  file:line  name"; exits 1 when one is longer
# than L lines (default 80), naming each.
set -euo pipefail
top=10 limit=80
dir=$(cd "$(dirname "$0")/.." && pwd)/lib/dtrain
while [ $# -gt 0 ]; do
  case $1 in
    --top) top=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) dir=$1; shift ;;
  esac
done
ctags=$(command -v ctags-universal || command -v ctags || true)
if [ -z "$ctags" ] || ! "$ctags" --version 2>/dev/null | grep -q "Universal Ctags"; then
  echo "function-sizes: needs Universal Ctags (apt-get install universal-ctags)" >&2
  exit 2
fi
[ -d "$dir" ] || { echo "function-sizes: no such folder: $dir" >&2; exit 2; }
sizes=$("$ctags" -R --languages=C++ --langmap=C++:+.cu.cuh --kinds-C++=f --fields=+ne -o - "$dir" |
  awk -F'\t' '{
    line = ""; end = "";
    for (i = 4; i <= NF; i++) {
      if ($i ~ /^line:/) line = substr($i, 6);
      if ($i ~ /^end:/) end = substr($i, 5);
    }
    if (line != "" && end != "") printf "%d\t%s:%s\t%s\n", end - line + 1, $2, line, $1;
  }' | sort -t$'\t' -k1,1nr)
head -n "$top" <<<"$sizes" | awk -F'\t' '{ printf "%5d  %s  %s\n", $1, $2, $3 }'
over=$(printf '%s\n' "$sizes" | awk -F'\t' -v l="$limit" '$1 > l' | wc -l)
if [ "$over" -gt 0 ]; then
  echo "function-sizes: $over function(s) longer than $limit lines:"
  printf '%s\n' "$sizes" | awk -F'\t' -v l="$limit" '$1 > l { printf "  %s  %s (%d lines)\n", $2, $3, $1 }'
  exit 1
fi
echo "function-sizes: none longer than $limit lines"
