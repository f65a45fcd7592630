#!/usr/bin/env bash
# Runs a command in a clean clone of this repository inside a freshly made Debian 12 root:
# nothing installed beyond `debootstrap --variant=minbase bookworm`, plus /usr/local/cuda
# bind-mounted read-only (every development machine has the CUDA toolkit there). This is how
# CI shows that the README's commands work on a new machine, not only on one that has had
# packages installed by hand.
#
#   scripts/fresh-root.sh [--worktree] [--carry PATH]... [--export PATH]... -- COMMAND [ARG...]
#   scripts/fresh-root.sh --probe      # exit 0 if a root can be made here, else one line why
#
# COMMAND runs as root in /src, the clone of HEAD (--worktree: with the working tree's
# uncommitted and untracked, not ignored, files on top). --carry copies an ignored path of the
# checkout (such as .gpu-carry) to the same place under /src; --export copies a path of /src
# back into the checkout after COMMAND succeeded (replacing what was there).
#
# The bootstrapped base, the downloaded packages and the package lists are kept in
# $DTRAIN_ROOT_CACHE (default /var/cache/dtrain-root), so a run needs the network only when
# the package list changes. Every run gets its own copy of the base (an overlay where the
# kernel allows it) and leaves nothing behind; the base itself is never changed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DTRAIN_ROOT_CACHE:-/var/cache/dtrain-root}
suite=bookworm

say() { echo "fresh-root: $*" >&2; }

# The Debian mirror this machine's apt already uses (so it works wherever apt works here).
mirror() {
  local m
  m=$(awk 'tolower($1)=="uris:" {u=$2} tolower($1)=="suites:" && u!="" && / bookworm( |$)/ {print u; exit}' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '$1=="deb" {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {if ($(i+1)=="bookworm") {print $i; exit}}}' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
  echo "${m:-http://deb.debian.org/debian}"
}

# Why no root can be made here, or nothing.
obstacle() {
  [ "$(id -u)" -eq 0 ] || { echo "not running as root (debootstrap, mount and chroot need it)"; return; }
  command -v unshare >/dev/null || { echo "unshare (util-linux) is missing"; return; }
  command -v git >/dev/null || { echo "git is missing"; return; }
  if ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap \
      >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap \
      >/dev/null 2>&1; } || { echo "debootstrap is missing and apt-get could not install it"; return; }
  fi
  mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] || { echo "cannot write the cache folder $cache"; return; }
  unshare --mount --propagation private --pid --fork --kill-child true 2>/dev/null ||
    { echo "no mount namespace can be made here (unshare --mount failed)"; return; }
  if [ ! -f "$cache/base-$suite/.complete" ]; then
    make_base >"$cache/bootstrap.log" 2>&1 || {
      echo "debootstrap $suite from $(mirror) failed (see $cache/bootstrap.log: $(tail -n 1 "$cache/bootstrap.log"))"
      return
    }
  fi
}

# Every step is checked by hand: this runs inside `$(...) || ...`, where `set -e` is off, and a
# half-made base must never be marked complete.
make_base() {
  (
    flock 9 || exit 1
    [ -f "$cache/base-$suite/.complete" ] && exit 0
    local tmp=$cache/base-$suite.tmp
    rm -rf "$tmp" || exit 1
    debootstrap --variant=minbase "$suite" "$tmp" "$(mirror)" || exit 1
    [ -x "$tmp/usr/bin/apt-get" ] && [ -x "$tmp/bin/bash" ] || exit 1
    # Package lists live outside the base so that a refresh (install-deps' apt-get update) is kept.
    mkdir -p "$cache/apt-lists" "$cache/apt-archives/partial" || exit 1
    cp -a "$tmp/var/lib/apt/lists/." "$cache/apt-lists/" || exit 1
    touch "$tmp/.complete" || exit 1
    rm -rf "$cache/base-$suite" && mv "$tmp" "$cache/base-$suite"
  ) 9>"$cache/.lock"
}

# Inside a private mount namespace: assemble the root, mount what it needs, run the command.
inner() {
  local run=$1; shift
  local root=$run/root base=$cache/base-$suite
  mkdir -p "$root" "$run/upper" "$run/work"
  if ! mount -t overlay overlay -o "lowerdir=$base,upperdir=$run/upper,workdir=$run/work" "$root" 2>/dev/null; then
    cp -a "$base/." "$root/"
    cp -a "$run/upper/." "$root/"
  fi
  mount -t proc proc "$root/proc"  # this namespace's processes only (unshare --pid)
  mount -t sysfs -o ro sysfs "$root/sys" 2>/dev/null || mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs tmpfs "$root/tmp"
  mount --bind "$cache/apt-archives" "$root/var/cache/apt/archives"
  mount --bind "$cache/apt-lists" "$root/var/lib/apt/lists"
  if [ -d /usr/local/cuda/ ]; then
    mkdir -p "$root/usr/local/cuda"
    mount --bind /usr/local/cuda/ "$root/usr/local/cuda"
    mount -o remount,bind,ro "$root/usr/local/cuda"
  fi
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  local envs=(HOME=/root LANG=C.UTF-8 TERM=dumb
              PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  [ -n "${CI:-}" ] && envs+=("CI=$CI")
  local v
  for v in $(compgen -e | grep -E '^(DTRAIN_|OPENBLAS_)' || true); do envs+=("$v=${!v}"); done
  chroot "$root" /usr/bin/env -i "${envs[@]}" /bin/bash -c 'cd /src && exec "$@"' fresh-root "$@"
}

if [ "${1:-}" = --inner ]; then
  shift
  inner "$@"
  exit
fi

worktree=0
carry=()
export_paths=()
while [ $# -gt 0 ]; do
  case $1 in
    --probe)
      why=$(obstacle)
      [ -z "$why" ] && { say "a fresh $suite root can be made here (cache $cache)"; exit 0; }
      echo "$why"; exit 1 ;;
    --worktree) worktree=1; shift ;;
    --carry) carry+=("${2:?--carry needs a path}"); shift 2 ;;
    --export) export_paths+=("${2:?--export needs a path}"); shift 2 ;;
    --) shift; break ;;
    *) say "unknown option '$1' (valid: --probe, --worktree, --carry PATH, --export PATH, -- COMMAND...)"; exit 2 ;;
  esac
done
for p in "${carry[@]}" "${export_paths[@]}"; do
  case /$p/ in */../*|//*) say "--carry/--export $p: give a path inside the checkout, without .."; exit 2 ;; esac
done
[ $# -gt 0 ] || { say "no command given (usage: scripts/fresh-root.sh [--worktree] [--carry PATH]... -- COMMAND...)"; exit 2; }

why=$(obstacle)
[ -z "$why" ] || { say "cannot make a fresh root: $why"; exit 3; }

# One run at a time on this machine: the package cache is shared, and apt does not wait for
# its lock. Whatever is in runs/ then was left by a killed run (its mounts died with its
# namespace), so it can go.
exec 8>"$cache/.run.lock"
if ! flock -n 8; then
  say "waiting for another fresh-root run on this machine to finish"
  flock -w 3600 8 || { say "gave up after an hour of waiting for another fresh-root run"; exit 3; }
fi
mkdir -p "$cache/runs"
rm -rf "${cache:?}"/runs/*
run=$cache/runs/$$
rm -rf "$run"
trap 'rm -rf "$run"' EXIT
mkdir -p "$run/upper"
git clone --quiet --no-hardlinks "$repo" "$run/upper/src"
if [ "$worktree" = 1 ]; then
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
     tar -cf - --null -T - --ignore-failed-read 2>/dev/null) | tar -C "$run/upper/src" -xf -
fi
for p in "${carry[@]}"; do
  [ -e "$repo/$p" ] || { say "--carry $p: no such path in $repo"; exit 2; }
  mkdir -p "$run/upper/src/$(dirname "$p")"
  cp -a "$repo/$p" "$run/upper/src/$p"
done
say "root: $suite from $(mirror), run folder $run"
# Own mount and process namespaces: mounts and any process the command leaves behind end with it.
unshare --mount --propagation private --pid --fork --kill-child -- \
  "$(readlink -f "$0")" --inner "$run" "$@"
for p in "${export_paths[@]}"; do
  # What the command wrote is in the overlay's upper layer (or the copied root without one).
  src=$run/upper/src/$p
  [ -e "$src" ] || src=$run/root/src/$p
  [ -e "$src" ] || { say "--export $p: the command left no /src/$p"; exit 1; }
  rm -rf "${repo:?}/$p"
  mkdir -p "$repo/$(dirname "$p")"
  cp -a "$src" "$repo/$p"
done
