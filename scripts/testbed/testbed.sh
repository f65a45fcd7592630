#!/usr/bin/env bash
# A small cluster on this one machine, for testing multi-node runs for real: K hosts that are
# network namespaces (node0 .. nodeK-1), each with its own hostname and one veth link to a
# private bridge, plus a Slurm controller (on node0) and a Slurm node daemon on every host,
# authenticated by munge. The bridge lives in a namespace of its own with no uplink and the
# hosts have link-local addresses (169.254.77.0/24), so no packet can leave the machine.
#
#   scripts/testbed/testbed.sh up [--hosts K]   # idempotent; K = 2 by default
#   scripts/testbed/testbed.sh down             # stops everything, removes everything
#   scripts/testbed/testbed.sh status
#   scripts/testbed/testbed.sh on HOST CMD...   # runs CMD on a host (its namespace, hostname)
#   scripts/testbed/testbed.sh link HOST up|down
#   scripts/testbed/testbed.sh delay HOST MS    # netem delay on the host's link (0 removes it)
#   scripts/testbed/testbed.sh throttle HOST KBIT  # token-bucket rate limit instead (0 removes it)
#   scripts/testbed/testbed.sh revive HOST      # restarts a host's Slurm daemon after a crash
#   scripts/testbed/testbed.sh wait-idle [S]    # until every Slurm node is idle (60 s at most)
#   scripts/testbed/testbed.sh probe            # exit 0 if a testbed can be made here, else why
#
# Needs root, iproute2, util-linux's unshare, and Debian's slurmd, slurmctld, slurm-client and
# munge (`scripts/install-deps.sh --testbed` installs them). It touches only what it made: the
# namespaces it lists in its state folder, its switch namespace, and the munge daemon it
# started. State, logs and the Slurm config are under
# $DTRAIN_TESTBED_DIR (default /run/dtrain-testbed); SLURM_CONF points there for every command
# run through `on`. Open MPI reaches the hosts through scripts/testbed/agent (its rsh agent),
# which does what ssh does on a real cluster: run a command on another host.
set -euo pipefail
# Daemons started from here inherit no descriptor of the caller's (a lock, a pipe); 255 is
# bash's own copy of this script.
for fd in /proc/$$/fd/*; do
  fd=${fd##*/}
  [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ] && eval "exec $fd>&-"
done
here=$(cd "$(dirname "$0")" && pwd)
dir=${DTRAIN_TESTBED_DIR:-/run/dtrain-testbed}
net=169.254.77
switch=dtrain-sw
# What the testbed runs (scripts/install-deps.sh --testbed names the packages that bring them).
commands=(ip tc slurmctld slurmd sinfo srun sbatch munged munge mungekey)

say() { echo "testbed: $*" >&2; }
die() { say "$*"; exit 1; }

hosts() { cat "$dir/hosts" 2>/dev/null || true; }
# A host of this testbed: a name it made (nodeN, nothing that reaches outside /run/netns).
is_host() { [[ $1 =~ ^node[0-9]+$ ]] && [ -e "/run/netns/$1" ]; }
addr_of() { echo "$net.$((${1#node} + 1))"; }

# Why no testbed can be made here, or nothing.
obstacle() {
  [ "$(id -u)" -eq 0 ] || { echo "not root (namespaces, links and daemons need it)"; return; }
  command -v unshare >/dev/null || { echo "unshare (util-linux) is missing"; return; }
  local missing=() c
  for c in "${commands[@]}"; do command -v "$c" >/dev/null || missing+=("$c"); done
  [ ${#missing[@]} -eq 0 ] ||
    { echo "${missing[*]} not found (scripts/install-deps.sh --testbed installs Slurm, munge and iproute2)"; return; }
  local t=dtrain-probe-$$
  ip netns add "$t" 2>/dev/null || { echo "no network namespace can be made here (ip netns add failed)"; return; }
  if ! ip -n "$t" link add probe0 type veth peer name probe1 2>/dev/null; then
    ip netns del "$t"; echo "no veth pair can be made here"; return
  fi
  ip netns del "$t"
  unshare --uts true 2>/dev/null || { echo "no UTS namespace can be made here (unshare --uts failed)"; return; }
}

# Runs a command on a host: in its network namespace, under its own hostname, with its own
# /tmp and the testbed's Slurm config.
on() {
  local h=$1; shift
  is_host "$h" || die "no host $h (is the testbed up? hosts: $(hosts | tr '\n' ' '))"
  # `ip netns exec` gives the command a mount namespace of its own: /tmp is the host's own
  # there, as on a real machine (Slurm's PMIx server keeps per-step folders in it).
  SLURM_CONF=$dir/slurm.conf ip netns exec "$h" unshare --uts -- \
    /bin/sh -c 'hostname "$0" && mount --bind "$1" /tmp && shift && exec "$@"' "$h" "$dir/$h/tmp" "$@"
}

write_slurm_conf() {
  local k=$1 last=$(($1 - 1)) cpus
  cpus=$(nproc)
  cat >"$dir/slurm.conf" <<EOF
# The dtrain testbed: written by scripts/testbed/testbed.sh, removed by its 'down'.
ClusterName=dtrain-testbed
SlurmctldHost=node0($net.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/slurmctld
SlurmdSpoolDir=$dir/slurmd-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
PartitionName=test Nodes=node[0-$last] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  # No cgroups: tasks are tracked by process tree (proctrack/linuxproc), and a host's /sys
  # (remounted for its network namespace) has no cgroup file system for autodetection.
  echo "CgroupPlugin=cgroup/v1" >"$dir/cgroup.conf"
  local i
  for ((i = 0; i < k; i++)); do
    mkdir -p "$dir/slurmd-node$i"
    echo "NodeName=node$i NodeAddr=$net.$((i + 1)) NodeHostname=node$i CPUs=$cpus" >>"$dir/slurm.conf"
  done
}

up() {
  local k=2
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) k=${2:?--hosts needs a number}; shift 2 ;;
      *) die "unknown option '$1' for up (valid: --hosts K)" ;;
    esac
  done
  [[ $k =~ ^[0-9]+$ ]] && [ "$k" -ge 1 ] && [ "$k" -le 8 ] || die "--hosts $k: give 1 to 8"
  if [ -f "$dir/up" ] && [ "$(hosts | wc -l)" -eq "$k" ] && check_up 2>/dev/null; then
    say "already up: $(hosts | tr '\n' ' ')"
    return
  fi
  down quiet
  local why
  why=$(obstacle)
  [ -z "$why" ] || die "cannot make a testbed here: $why"
  # Whatever stops `up` half way (a failed command, or die), what it made goes again.
  trap 'say "bringing the testbed up failed; tearing down what was made"; down quiet' EXIT
  mkdir -p "$dir/slurmctld"
  touch "$dir/.dtrain-testbed"
  : >"$dir/hosts"
  # The switch: a bridge in its own namespace, no uplink.
  ip netns add "$switch"
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  local i h
  for ((i = 0; i < k; i++)); do
    h=node$i
    ip netns add "$h" || die "cannot make network namespace $h (is one of that name in use?)"
    echo "$h" >>"$dir/hosts"
    mkdir -p "$dir/$h/tmp" && chmod 1777 "$dir/$h/tmp"
    ip -n "$h" link set lo up
    ip link add "dt-$h" netns "$switch" type veth peer name eth0 netns "$h"
    ip -n "$switch" link set "dt-$h" master br0
    ip -n "$switch" link set "dt-$h" up
    ip -n "$h" addr add "$(addr_of "$h")/24" dev eth0
    ip -n "$h" link set eth0 up
  done
  # munge: one daemon serves every host (its socket is a file, shared by the namespaces).
  if ! munge -n </dev/null >/dev/null 2>&1; then
    [ -s /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key -f; }
    mkdir -p /run/munge && chown munge:munge /run/munge /etc/munge/munge.key 2>/dev/null || true
    chmod 0400 /etc/munge/munge.key
    runuser -u munge -- munged 2>/dev/null || munged --force
    cp /run/munge/munged.pid "$dir/munged.pid"
  fi
  write_slurm_conf "$k"
  on node0 slurmctld -i
  for h in $(hosts); do on "$h" slurmd -N "$h"; done
  touch "$dir/up"
  wait_idle "$k"
  trap - EXIT
  say "up: $k hosts ($(hosts | tr '\n' ' ')) on $net.0/24, Slurm partition 'test'; SLURM_CONF=$dir/slurm.conf"
}

# Every node registered and idle (Slurm answers sinfo from node0).
wait_idle() {  # HOSTS [SECONDS]
  local k=$1 limit=${2:-30} t
  for t in $(seq 1 $((limit * 2))); do
    [ "$(on node0 sinfo -h -o '%t %D' 2>/dev/null | awk '$1=="idle"{n+=$2} END{print n+0}')" -eq "$k" ] && return
    sleep 0.5
  done
  on node0 sinfo 2>&1 | sed 's/^/testbed: /' >&2 || true
  tail -n 5 "$dir"/slurm*.log 2>/dev/null | sed 's/^/testbed: /' >&2 || true
  die "Slurm's nodes did not come up idle within $limit s (logs in $dir)"
}

check_up() {
  [ -f "$dir/up" ] || return 1
  local h
  for h in $(hosts); do [ -e "/run/netns/$h" ] || return 1; done
  on node0 sinfo -h >/dev/null 2>&1
}

pids_of() {  # daemon pid files written by Slurm
  cat "$dir"/slurmctld.pid "$dir"/slurmd-*.pid 2>/dev/null || true
}

down() {
  local quiet=${1:-}
  local p h ours
  ours=$(hosts)
  # Slurm's daemons, then anything still running inside one of our hosts (a test's leftovers).
  for p in $(pids_of); do kill "$p" 2>/dev/null || true; done
  for h in $ours; do
    for p in $(ip netns pids "$h" 2>/dev/null || true); do kill -9 "$p" 2>/dev/null || true; done
  done
  sleep 0.2
  for p in $(pids_of); do kill -9 "$p" 2>/dev/null || true; done
  for h in $ours "$switch"; do ip netns del "$h" 2>/dev/null || true; done
  [ -f "$dir/munged.pid" ] && kill "$(cat "$dir/munged.pid")" 2>/dev/null || true
  # The state folder goes only if it is one (DTRAIN_TESTBED_DIR may name any folder).
  [ -f "$dir/.dtrain-testbed" ] && rm -rf "$dir"
  [ -n "$quiet" ] || say "down: hosts, links, Slurm and munge stopped, $dir removed"
}

status() {
  if ! check_up; then say "down"; return 1; fi
  local h
  for h in $(hosts); do
    echo "$h $(addr_of "$h") link $(ip -n "$switch" -br link show "dt-$h" | awk '{print $2}')" \
         "$(ip netns exec "$h" tc qdisc show dev eth0 | grep -oE '(delay|rate) [^ ]*' || true)"
  done
  on node0 sinfo
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  on) shift; [ $# -ge 2 ] || die "usage: on HOST CMD..."; on "$@" ;;
  link)
    [ $# -eq 3 ] && [[ $3 =~ ^(up|down)$ ]] || die "usage: link HOST up|down"
    is_host "$2" || die "no host '$2' (hosts: $(hosts | tr '\n' ' '))"
    ip -n "$switch" link set "dt-$2" "$3"
    # A repaired link: forget the neighbours that went unanswered meanwhile (an entry that
    # failed makes the next connection fail at once, for seconds).
    if [ "$3" = up ]; then for h in $(hosts); do ip -n "$h" neigh flush all 2>/dev/null || true; done; fi ;;
  delay)
    [ $# -eq 3 ] && [[ $3 =~ ^[0-9]+$ ]] || die "usage: delay HOST MS (0 removes the delay)"
    is_host "$2" || die "no host '$2' (hosts: $(hosts | tr '\n' ' '))"
    if [ "$3" = 0 ]; then
      ip netns exec "$2" tc qdisc del dev eth0 root 2>/dev/null || true
    elif ! err=$(ip netns exec "$2" tc qdisc replace dev eth0 root netem delay "${3}ms" 2>&1); then
      grep -q "unknown" <<<"$err" && die "this kernel has no netem (sch_netem): use 'throttle' ($err)"
      die "tc: $err"
    fi ;;
  throttle)
    # A token bucket: the link carries KBIT kilobits a second, the rest waits in its queue.
    [ $# -eq 3 ] && [[ $3 =~ ^[0-9]+$ ]] || die "usage: throttle HOST KBIT (0 removes the limit)"
    is_host "$2" || die "no host '$2' (hosts: $(hosts | tr '\n' ' '))"
    if [ "$3" = 0 ]; then
      ip netns exec "$2" tc qdisc del dev eth0 root 2>/dev/null || true
    else
      # The bucket holds 10 ms at the rate (at least 16 KiB): a smaller one caps a fast rate.
      burst=$(($3 * 1000 / 8 / 100))
      [ "$burst" -ge 16384 ] || burst=16384
      ip netns exec "$2" tc qdisc replace dev eth0 root tbf rate "${3}kbit" burst "$burst" latency 2s
    fi ;;
  wait-idle)
    # Until Slurm has every node idle again: after a fault, a job on a host that was cut off
    # stays `completing` until its node daemon can be told to end it.
    [ $# -le 2 ] && [[ ${2:-60} =~ ^[0-9]+$ ]] || die "usage: wait-idle [SECONDS]"
    check_up || die "the testbed is not up"
    wait_idle "$(hosts | wc -l)" "${2:-60}" ;;
  revive)
    [ $# -eq 2 ] && is_host "$2" || die "usage: revive HOST (hosts: $(hosts | tr '\n' ' '))"
    for p in $(ip netns pids "$2"); do kill -9 "$p" 2>/dev/null || true; done
    if [ "$2" = node0 ]; then on node0 slurmctld -i; fi
    on "$2" slurmd -N "$2"
    wait_idle "$(hosts | wc -l)" ;;
  probe)
    why=$(obstacle)
    [ -z "$why" ] || { echo "$why"; exit 1; }
    say "a testbed can be made here" ;;
  *) die "usage: testbed.sh up [--hosts K] | down | status | on HOST CMD... | link HOST up|down | delay HOST MS | throttle HOST KBIT | revive HOST | wait-idle [S] | probe" ;;
esac
