#!/usr/bin/env bash
# The one-way include rule of lib/dtrain/ (see docs/layout.md). Each folder may include
# itself and the folders listed for it here, nothing else; backend/cpu and backend/cuda may
# include backend/ but never each other, and nothing outside them includes either. A file
# outside these folders is itself an error.
# Usage: scripts/check-layout.sh [LIB_DIR]   (default: lib/dtrain of this checkout)
# Prints one line per wrong-way include (file:line: what, and what is allowed) and exits 1.
set -euo pipefail
lib=${1:-$(cd "$(dirname "$0")/.." && pwd)/lib/dtrain}
[ -d "$lib" ] || { echo "check-layout: no such folder: $lib" >&2; exit 2; }

declare -A may_include=(
  [base]="base"
  [config]="base config"
  [data]="base config data"
  [backend]="base backend"
  [comm]="base backend comm"
  [nn]="base config backend comm nn"
  [train]="base config data backend comm nn train"
  [results]="base config train results"
)

order="base config data backend comm nn train results"
bad=0
complain() { echo "$1"; bad=$((bad + 1)); }

while IFS= read -r -d '' file; do
  rel=${file#"$lib"/}
  layer=${rel%%/*}
  if [ "$rel" = "$layer" ] || [ -z "${may_include[$layer]+x}" ]; then
    complain "lib/dtrain/$rel: outside the layers ($order)"
    continue
  fi
  sub=""  # cpu or cuda for files under backend/<sub>/
  case $rel in backend/*/*) sub=${rel#backend/}; sub=${sub%%/*} ;; esac
  while IFS=: read -r line target; do
    target=${target#*\"dtrain/}
    target=${target%%\"*}
    to=${target%%/*}
    case " ${may_include[$layer]} " in
      *" $to "*) ;;
      *) complain "lib/dtrain/$rel:$line: $layer may not include dtrain/$target ($layer may include: ${may_include[$layer]})"
         continue ;;
    esac
    case $target in
      backend/*/*)
        tsub=${target#backend/}; tsub=${tsub%%/*}
        [ "$tsub" = "$sub" ] ||
          complain "lib/dtrain/$rel:$line: only backend/$tsub/ may include dtrain/$target (the backends meet in backend/*.hpp)" ;;
    esac
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"dtrain/' "$file" | sed 's/^\([0-9]*\):.*\("dtrain\/[^"]*"\).*/\1:\2/')
done < <(find "$lib" -type f \( -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.in' -o -name '*.h' -o -name '*.cc' -o -name '*.inl' \) -print0 | sort -z)

if [ "$bad" -gt 0 ]; then
  echo "check-layout: $bad problem(s) in $lib"
  exit 1
fi
echo "check-layout: every include in $lib points down the layers"
