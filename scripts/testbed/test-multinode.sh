#!/usr/bin/env bash
# Multi-node tests on the testbed (scripts/testbed/testbed.sh): two hosts that are network
# namespaces joined by a veth link, a real Slurm controller and node daemons, Open MPI started
# across the hosts. Each test prints "ok" or "not ok" with its time; the last line counts them.
#
#   scripts/testbed/test-multinode.sh [--dtrain PATH] [--only NAME]...
#
# Tests: mpirun (2 hosts x 2 ranks, host file), srun (-n 2, -n 4), sbatch, and faults: a slow
# link (the run finishes, same results), a link taken down and every process of a host killed,
# each under mpirun and srun (after a kill, --resume finishes the run with the uninterrupted
# results).
# Where no testbed can be made (not root, no namespaces, Slurm not installable) it prints one
# line saying why and exits 77, which CTest reports as skipped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tb=$repo/scripts/testbed/testbed.sh
dtrain=$repo/build/apps/dtrain
only=()
while [ $# -gt 0 ]; do
  case $1 in
    --dtrain) dtrain=$(readlink -f "${2:?--dtrain needs a path}"); shift 2 ;;
    --only) only+=("${2:?--only needs a test name}"); shift 2 ;;
    *) echo "multinode: unknown option '$1' (valid: --dtrain PATH, --only NAME)" >&2; exit 2 ;;
  esac
done
[ -x "$dtrain" ] || { echo "multinode: no dtrain binary at $dtrain (build first, or give --dtrain)" >&2; exit 2; }
libs=$(ldd "$dtrain")  # not piped into grep -q: under pipefail, ldd's SIGPIPE would fail it
grep -q libmpi <<<"$libs" || { echo "multinode: SKIPPED: $dtrain is built without MPI"; exit 77; }
if ! why=$("$tb" probe 2>&1); then
  echo "multinode: SKIPPED: no testbed here: $why"
  exit 77
fi

# One run at a time: the testbed is this machine's.
exec 9>/run/dtrain-testbed.lock
flock -w 600 9 || { echo "multinode: another multi-node test held the testbed for 10 minutes" >&2; exit 1; }

work=$(mktemp -d /var/tmp/dtrain-multinode.XXXXXX)  # shared by the hosts, like a cluster's home
cleanup() { [ -n "${DTRAIN_TESTBED_KEEP:-}" ] || { "$tb" down >/dev/null 2>&1 || true; rm -rf "$work"; }; }
trap cleanup EXIT
"$tb" up --hosts 2

timeout_s=10  # train.collective_timeout_s in the fault tests
# A short MLP run on synthetic data: about 0.1 s an epoch at 4 ranks.
cat >"$work/mn.yaml" <<'EOF'
name: mn
data:
  dataset: synthetic
  synthetic: {train_size: 3000, test_size: 500, shape: [24], classes: 4, noise: 1.5}
model: {hidden: [32, 16]}
train: {epochs: 3, per_replica_batch: 8, target_accuracy: 0}
optimizer: {lr: 0.05, base_batch: 8, momentum: 0.9, warmup_epochs: 0, schedule: cosine}
EOF
printf 'node0 slots=2\nnode1 slots=2\n' >"$work/hosts"
# What a user's mpirun needs across hosts, with our agent in place of ssh. The keepalive
# settings let mpirun notice a host that stopped answering in about 10 s instead of 8 minutes.
mpirun_hosts=(mpirun --allow-run-as-root --hostfile "$work/hosts" --map-by slot
              --mca plm_rsh_agent "$repo/scripts/testbed/agent"
              --mca oob_tcp_keepalive_time 4 --mca oob_tcp_keepalive_intvl 2
              --mca oob_tcp_keepalive_probes 3)

passed=0
failed=0
failures=()
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b-a}'; }
wanted() {
  [ ${#only[@]} -eq 0 ] && return 0
  local o
  for o in "${only[@]}"; do [ "$o" = "$1" ] && return 0; done
  return 1
}
# run_test NAME FUNCTION: FUNCTION fails with a message on stdout.
run_test() {
  wanted "$1" || return 0
  local t0 out rc=0
  t0=$(now)
  out=$("$2" 2>&1) || rc=$?
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1))
    echo "ok - $1 ($(secs "$t0" "$(now)") s)${out:+: $(tail -n 1 <<<"$out")}"
  else
    failed=$((failed + 1))
    failures+=("$1")
    echo "not ok - $1 ($(secs "$t0" "$(now)") s)"
    sed 's/^/    /' <<<"$out" | tail -n 40
    kill_job
  fi
}
# Each test runs in a subshell ($(...)): fail ends that test, and its EXIT trap undoes its fault.
fail() { echo "$*"; exit 1; }

# The first seven columns of metrics.csv: epoch, losses and accuracies, no times.
numbers() { cut -d, -f1-7 "$1/metrics.csv"; }
reference() {  # the in-process run of the same config at $1 replicas
  local d=$work/res/mn/threads-g$1
  [ -d "$d" ] || "$dtrain" run "$work/mn.yaml" "gpus=$1" --quiet --tag threads --results "$work/res" >/dev/null
  echo "$d"
}
same_as_threads() {  # RUN_DIR N
  [ "$(cat "$1/status")" = done ] || fail "$1 says $(cat "$1/status"), not done"
  diff <(numbers "$1") <(numbers "$(reference "$2")") >/dev/null ||
    fail "$1: metrics differ from the in-process run: $(diff <(numbers "$1") <(numbers "$(reference "$2")") | head -n 4)"
}
json_number() { grep -o "\"$2\": [0-9.e+-]*" "$1" | head -n 1 | grep -o '[0-9.e+-]*$'; }
json_text() { grep -o "\"$2\": \"[^\"]*\"" "$1" | head -n 1 | cut -d'"' -f4; }
tx_bytes() { ip -n dtrain-sw -s -j link show "dt-$1" | sed -E 's/.*"tx":\{"bytes":([0-9]+).*/\1/'; }

t_mpirun() {
  local before after
  before=$(tx_bytes node1) || fail "cannot read node1's link counters"
  "$tb" on node0 "${mpirun_hosts[@]}" -np 4 "$dtrain" run "$work/mn.yaml" gpus=4 --quiet \
    --tag mpirun --results "$work/res" >"$work/mpirun.out" 2>&1 ||
    fail "mpirun exited $?: $(tail -n 5 "$work/mpirun.out")"
  after=$(tx_bytes node1) || fail "cannot read node1's link counters"
  local run=$work/res/mn/mpirun-g4
  same_as_threads "$run" 4
  grep -q "mpirun (Open MPI), 2 hosts: node0 node1" <<<"$(json_text "$run/summary.json" devices)" ||
    fail "devices: $(json_text "$run/summary.json" devices)"
  # --map-by slot: ranks 0,1 on node0 and 2,3 on node1, local ranks 0,1 on each.
  [ "$(json_text "$run/summary.json" placement)" = "0 node0/0, 1 node0/1, 2 node1/0, 3 node1/1" ] ||
    fail "placement: $(json_text "$run/summary.json" placement)"
  local bytes
  bytes=$(json_number "$run/summary.json" exchange_bytes_per_step)
  # Every step node1's two ranks receive their chunks of node0's gradients over the link.
  [ $((after - before)) -gt $((bytes * 93 * 3 / 2)) ] ||
    fail "only $((after - before)) bytes crossed node1's link; exchange is $bytes per step"
  echo "identical to in-process; $(((after - before) / 1024)) KiB crossed the link to node1"
}

t_srun() {
  local n run
  for n in 2 4; do
    "$tb" on node0 srun -N 2 -n "$n" "$dtrain" run "$work/mn.yaml" "gpus=$n" --quiet \
      --tag "srun$n" --results "$work/res" >"$work/srun$n.out" 2>&1 ||
      fail "srun -n $n exited $?: $(tail -n 5 "$work/srun$n.out")"
    run=$work/res/mn/srun$n-g$n
    same_as_threads "$run" "$n"
    grep -q "srun (Slurm), 2 hosts: node0 node1" <<<"$(json_text "$run/summary.json" devices)" ||
      fail "devices: $(json_text "$run/summary.json" devices)"
  done
  # Slurm's block distribution: -n 4 on 2 nodes puts 2 tasks on each; SLURM_STEP_TASKS_PER_NODE
  # then gives each process 1 of the host's 2 cores.
  [ "$(json_text "$run/summary.json" placement)" = "0 node0/0, 1 node0/1, 2 node1/0, 3 node1/1" ] ||
    fail "placement: $(json_text "$run/summary.json" placement)"
  grep -q "4 replicas as processes (mpi), 1 thread each" <<<"$(json_text "$run/summary.json" devices)" ||
    fail "threads: $(json_text "$run/summary.json" devices)"
  echo "-n 2 and -n 4 identical to in-process"
}

t_sbatch() {
  local job out
  out=$(cd "$work" && DTRAIN=$dtrain "$tb" on node0 sbatch --parsable --wait -N 2 \
          --ntasks-per-node=2 "$repo/scripts/dtrain.sbatch" mn.yaml --quiet --results res 2>&1) ||
    fail "sbatch failed: $out"
  job=$(head -n 1 <<<"$out" | tr -dc 0-9)
  [ -n "$job" ] || fail "sbatch printed no job id: $out"
  same_as_threads "$work/res/mn/slurm-$job-g4" 4
  echo "job $job identical to in-process"
}

# Starts a 4-rank run of many epochs in the background under $launch (mpirun or srun across
# both hosts); waits until $2 epochs are done.
start_long() {  # TAG EPOCHS_BEFORE_FAULT
  local tag=$1 want=$2
  "$tb" on node0 "${launch[@]}" "$dtrain" run "$work/mn.yaml" gpus=4 train.epochs=60 \
    "train.collective_timeout_s=$timeout_s" --quiet --tag "$tag" --results "$work/res" \
    >"$work/$tag.out" 2>&1 &
  launcher=$!
  local run=$work/res/mn/$tag-g4 i
  for i in $(seq 1 300); do
    [ -f "$run/metrics.csv" ] && [ "$(wc -l <"$run/metrics.csv")" -gt "$want" ] && return 0
    kill -0 "$launcher" 2>/dev/null || fail "the run ended before the fault: $(tail -n 5 "$work/$tag.out")"
    sleep 0.1
  done
  fail "no $want epochs within 30 s"
}
dtrain_pids() {  # the dtrain processes still alive on the hosts (a zombie has ended)
  local h p
  for h in node0 node1; do
    for p in $(ip netns pids "$h"); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dtrain ] || continue
      grep -q '^State:[[:space:]]*Z' "/proc/$p/status" 2>/dev/null && continue
      echo "$p"
    done
  done
}
# Every launcher, daemon of Open MPI and rank still running on the hosts (a test that failed
# leaves none behind for the next).
kill_job() {
  local h p
  for h in node0 node1; do
    for p in $(ip netns pids "$h"); do
      case $(cat "/proc/$p/comm" 2>/dev/null) in dtrain | mpirun | orted | srun) kill -9 "$p" 2>/dev/null || true ;; esac
    done
  done
}
# After a fault at $1: every rank must be gone within timeout + 10 s, the launcher soon after.
expect_ranks_end() {
  local t_fault=$1 i
  for i in $(seq 1 $(((timeout_s + 10) * 10))); do
    [ -z "$(dtrain_pids)" ] && break
    sleep 0.1
  done
  [ -z "$(dtrain_pids)" ] || fail "ranks still running $((timeout_s + 10)) s after the fault: $(dtrain_pids | tr '\n' ' ')"
  ranks_s=$(secs "$t_fault" "$(now)")
  for i in $(seq 1 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher" 2>/dev/null; then
    kill_job
    fail "every rank ended in $ranks_s s, but ${launch[0]} was still running 30 s later"
  fi
  wait "$launcher" && fail "${launch[0]} exited 0 after the fault" || true
}
expect_failed_kept() {  # RUN_DIR EPOCHS_DONE_BEFORE
  [ "$(cat "$1/status")" = failed ] || fail "$1 says $(cat "$1/status"), not failed"
  [ "$(($(wc -l <"$1/metrics.csv") - 1))" -ge "$2" ] || fail "metrics.csv lost epochs: $(wc -l <"$1/metrics.csv") lines"
  [ -s "$1/checkpoint.bin" ] || fail "no checkpoint.bin in $1"
}

# A heavily delayed link: netem's delay where the kernel has it, else a token-bucket rate limit
# (this machine's kernel has no sch_netem), which holds every packet in a queue.
t_slow_link() {
  local how
  trap '"$tb" delay node1 0' EXIT
  if "$tb" delay node1 20 2>/dev/null; then
    how="netem delay 20 ms"
  else
    "$tb" throttle node1 2000 || fail "cannot throttle node1's link"
    how="no netem in this kernel; tbf at 2 Mbit/s"
  fi
  "$tb" on node0 "${mpirun_hosts[@]}" -np 4 "$dtrain" run "$work/mn.yaml" gpus=4 \
    train.epochs=1 --quiet --tag slow --results "$work/res" >"$work/slow.out" 2>&1 ||
    fail "mpirun exited $? with node1's link slowed ($how): $(tail -n 5 "$work/slow.out")"
  "$tb" delay node1 0 || fail "cannot restore node1's link"
  "$dtrain" run "$work/mn.yaml" gpus=4 train.epochs=1 --quiet --tag threads1 --results "$work/res" >/dev/null
  local run=$work/res/mn/slow-g4
  [ "$(cat "$run/status")" = done ] || fail "$run says $(cat "$run/status")"
  diff <(numbers "$run") <(numbers "$work/res/mn/threads1-g4") >/dev/null ||
    fail "a slow link changed the results: $(diff <(numbers "$run") <(numbers "$work/res/mn/threads1-g4"))"
  local slow fast
  slow=$(json_number "$run/summary.json" median_epoch_time_s)
  fast=$(json_number "$work/res/mn/mpirun-g4/summary.json" median_epoch_time_s)
  awk -v s="$slow" -v f="$fast" 'BEGIN { exit !(s > 2 * f) }' ||
    fail "the slowed link did not slow the run: epoch $slow s against $fast s"
  echo "$how: same results, epoch $slow s against $fast s"
}

# node1's link taken down mid-run: no process dies, nothing arrives any more.
link_down() {  # TAG
  local tag=$1
  start_long "$tag" 2
  local t_fault
  t_fault=$(now)
  trap '"$tb" link node1 up' EXIT
  "$tb" link node1 down || fail "cannot take node1's link down"
  expect_ranks_end "$t_fault"
  "$tb" link node1 up || fail "cannot bring node1's link up"
  # Slurm ends the cut-off host's job step once it can reach it again; the next test needs it.
  "$tb" wait-idle 60 || fail "Slurm's nodes did not come back idle after the link came up"
  local run=$work/res/mn/$tag-g4 recorded
  expect_failed_kept "$run" 2
  recorded=$(json_text "$run/summary.json" error)
  # Rank 1, on node0 too, may be named first: its ring partner is across the cut link. Where
  # mpirun ends the job (it too loses node1) before the collective's timeout, the record says
  # where the rank was stopped first: "stopped while waiting in ..., nothing from ...".
  grep -qE "rank [01] \(node0\): (stopped [^,]*, )?nothing from (rank [0-9]+ \(node[01]\), )*rank [23] \(node1\)" \
    <<<"$recorded" || fail "rank 0 did not record the ranks on node1: $recorded"
  echo "ranks ended ${ranks_s} s after the link went down; recorded \"$(cut -c1-60 <<<"$recorded")...\""
}
t_link_down_mpirun() { launch=("${mpirun_hosts[@]}" -np 4); link_down linkmpirun; }
t_link_down_srun() { launch=(srun -N 2 -n 4 --kill-on-bad-exit=1); link_down linksrun; }

# Every process of node1 killed (a host that crashed), under mpirun or srun; then the run is
# continued with --resume and must end with the uninterrupted run's metrics.
kill_host() {  # TAG
  local tag=$1
  start_long "$tag" 2
  local t_fault
  t_fault=$(now)
  trap '"$tb" revive node1 >/dev/null 2>&1 || true' EXIT  # the next test needs node1's slurmd
  ip netns pids node1 | xargs -r kill -9
  expect_ranks_end "$t_fault"
  local run=$work/res/mn/$tag-g4
  expect_failed_kept "$run" 2
  # The failure rank 0 recorded names the ranks it waited for, and their host.
  local recorded
  recorded=$(json_text "$run/summary.json" error)
  grep -qE "rank [23] \(node1\)" <<<"$recorded" ||
    fail "the recorded failure does not name node1's ranks: $recorded"
  "$tb" revive node1 || fail "cannot revive node1"
  "$tb" on node0 "${launch[@]}" "$dtrain" run "$work/mn.yaml" gpus=4 train.epochs=60 \
    "train.collective_timeout_s=$timeout_s" --quiet --tag "$tag" --resume \
    --results "$work/res" >"$work/$tag-resume.out" 2>&1 ||
    fail "--resume exited $?: $(tail -n 5 "$work/$tag-resume.out")"
  [ -d "$work/res/mn/whole-g4" ] ||
    "$dtrain" run "$work/mn.yaml" gpus=4 train.epochs=60 --quiet --tag whole --results "$work/res" >/dev/null
  [ "$(cat "$run/status")" = done ] || fail "resumed run says $(cat "$run/status")"
  diff <(numbers "$run") <(numbers "$work/res/mn/whole-g4") >/dev/null ||
    fail "the resumed run differs from an uninterrupted one: $(diff <(numbers "$run") <(numbers "$work/res/mn/whole-g4") | head -n 4)"
  echo "ranks ended ${ranks_s} s after the kill; recorded \"$(cut -c1-90 <<<"$recorded")...\"; --resume gave the uninterrupted metrics"
}
t_kill_host_mpirun() { launch=("${mpirun_hosts[@]}" -np 4); kill_host killmpirun; }
t_kill_host_srun() { launch=(srun -N 2 -n 4 --kill-on-bad-exit=1); kill_host killsrun; }

echo "multinode: dtrain $dtrain, hosts node0 node1 (2 cores shared), collective timeout ${timeout_s} s in the fault tests"
run_test mpirun-2-hosts t_mpirun
run_test srun t_srun
run_test sbatch t_sbatch
run_test slow-link t_slow_link
run_test link-down-mpirun t_link_down_mpirun
run_test link-down-srun t_link_down_srun
run_test kill-host-mpirun t_kill_host_mpirun
run_test kill-host-srun t_kill_host_srun
echo "multinode: $passed passed, $failed failed${failures:+ (${failures[*]})}"
[ "$failed" = 0 ]
