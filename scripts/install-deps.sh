#!/usr/bin/env bash
# Installs what dtrain needs to build and run, from Debian's packages. Idempotent.
#   scripts/install-deps.sh             # build and run
#   scripts/install-deps.sh --testbed   # also, as root, what the multi-node tests need (Slurm's
#                                       # daemons, munge, iproute2), with their services left off
set -euo pipefail
testbed=0
case ${1:-} in
  --testbed) testbed=1 ;;
  "") ;;
  *) echo "install-deps: unknown option '$1' (valid: --testbed)"; exit 2 ;;
esac
packages=(
  build-essential cmake git pkg-config
  libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev catch2 nlohmann-json3-dev
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev zlib1g-dev libturbojpeg0-dev
  libjpeg62-turbo-dev libpng-dev libssl-dev
  libopenmpi-dev openmpi-bin
  gnuplot-nox
  universal-ctags time
  dataset-fashion-mnist fortunes
)
# The multi-node tests need root (namespaces, daemons); without it they skip, so nothing to add.
[ "$testbed" = 1 ] && [ "$(id -u)" -eq 0 ] && packages+=(slurmd slurmctld slurm-client munge iproute2)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
log=$(mktemp "${TMPDIR:-/tmp}/dtrain-install-deps.XXXXXX.log")
echo "install-deps: installing ${#missing[@]} packages and what they need: ${missing[*]} (log: $log)"
install() {
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
}
# Services that packages would start (munge, Slurm's daemons) stay off: the testbed starts its
# own. A policy-rc.d that answers 101 is Debian's way to say so, to invoke-rc.d and
# deb-systemd-invoke alike; one already there is left alone.
if [ "$testbed" = 1 ] && [ "$(id -u)" -eq 0 ] && [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
# Try the package lists already on the machine first (no network when the packages are cached);
# refresh them only when they are missing or stale.
{ install || { echo "install-deps: refreshing the package lists (apt-get update)"
               $SUDO apt-get update -q && install; }; } >"$log" 2>&1 || {
  tail -n 30 "$log"
  echo "install-deps: apt-get could not install the packages above (full log: $log)"
  exit 1
}
echo "install-deps: done"
