#!/usr/bin/env bash
# Installs what dtrain needs to build and run, from Debian's packages. Idempotent.
set -euo pipefail
packages=(
  build-essential cmake git pkg-config
  libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev catch2 nlohmann-json3-dev
  libopenblas-dev libdnnl-dev zlib1g-dev
  libopenmpi-dev openmpi-bin
  gnuplot-nox
  dataset-fashion-mnist
)
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
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
