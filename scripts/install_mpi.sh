#!/usr/bin/env bash
# Installs what `tracejit::distributed` over MPI needs from Debian's
# packages: MPICH (`mpiexec`, `mpicc`, its headers and libraries) and
# libclang (the `mpi` crate's bindgen reads mpi.h with it).
#
# Idempotent and quiet when everything is in place: it asks dpkg first and
# runs apt-get only for what is missing. Needs root (or sudo) otherwise.
#
# Usage: scripts/install_mpi.sh
set -euo pipefail

PACKAGES=(mpich libmpich-dev libclang-dev)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install_mpi: installing ${missing[*]}" >&2
SUDO=()
[ "$(id -u)" -eq 0 ] || SUDO=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
command -v mpiexec >/dev/null || { echo "install_mpi: mpiexec is still missing" >&2; exit 1; }
