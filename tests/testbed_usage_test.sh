#!/usr/bin/env bash
# The multi-node scripts' user mistakes: each must fail with its one line naming what is valid,
# before it touches anything (no root needed).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tb=$root/scripts/testbed/testbed.sh
failures=0
expect() {  # CODE TEXT COMMAND...
  local code=$1 text=$2
  shift 2
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" != "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $* -> exit $rc (want $code), output: $out (want: $text)"
    failures=$((failures + 1))
  fi
}
expect 1 "--hosts 9: give 1 to 8" "$tb" up --hosts 9
expect 1 "unknown option '--nodes' for up (valid: --hosts K)" "$tb" up --nodes 2
expect 1 "usage: link HOST up|down" "$tb" link node0 sideways
expect 1 "usage: delay HOST MS" "$tb" delay node0 abc
expect 1 "usage: throttle HOST KBIT" "$tb" throttle node0 fast
expect 1 "no host ../x" "$tb" on ../x true
expect 1 "no host 'node0;true'" "$tb" link 'node0;true' down
expect 1 "usage: wait-idle [SECONDS]" "$tb" wait-idle soon
expect 1 "usage: testbed.sh up [--hosts K]" "$tb" frobnicate
expect 2 "unknown option '--bogus' (valid: --dtrain PATH, --only NAME)" \
  "$root/scripts/testbed/test-multinode.sh" --bogus
expect 2 "unknown option '--bogus' (valid: --testbed)" "$root/scripts/install-deps.sh" --bogus
[ "$failures" = 0 ] && echo "testbed usage: all mistakes refused with their line"
exit "$failures"
