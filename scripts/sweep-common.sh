# Shared by the sweep scripts (sourced, not run): runs one resumable `dtrain run` with the
# given arguments, lists failed runs, and regenerates the report with figures.
#   run_sweep TAG CONFIG [dtrain run arguments ...]
run_sweep() {
  local tag=$1 config=$2
  shift 2
  local results=${RESULTS:-results/sweeps}
  local dtrain=${DTRAIN:-build/apps/dtrain}
  [ -x "$dtrain" ] || scripts/build.sh > /dev/null || return 1
  "$dtrain" run "$config" "$@" --results "$results" --tag "$tag" --resume
  local rc=$?
  [ "$rc" -eq 2 ] && return 2  # bad input: nothing ran
  grep -h ",failed," "$results"/*/"index-$tag.csv" 2>/dev/null | sed 's/^/sweep: failed run: /' >&2
  "$dtrain" report "$results" --out "$results/report" --plots > /dev/null || true
  echo "sweep: report in $results/report/index.md"
  return "$rc"
}
