#!/usr/bin/env bash
# Install Suricata 7 from Debian bookworm-backports, the yardstick of bench/nfv_bench.py's
# end-to-end table (Suricata with one thread on the same trace and rules).
#
#   sudo bench/install_suricata.sh      # needs root; Debian 12 (bookworm)
#
# Adds bookworm-backports as an apt source (same mirror as the system's Debian source) when it
# is missing, then installs the package. Exit 0 with `suricata --build-info`'s version line
# when Suricata is installed, 1 with the reason otherwise.
set -euo pipefail

if command -v suricata >/dev/null; then
  suricata -V
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "install_suricata: needs root (apt-get)" >&2; exit 1; }
. /etc/os-release
[ "${VERSION_CODENAME:-}" = bookworm ] || {
  echo "install_suricata: written for Debian bookworm, this is ${PRETTY_NAME:-unknown}" >&2; exit 1; }

list=/etc/apt/sources.list.d/bpo.sources
if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
  uri=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/debian.sources 2>/dev/null | awk '{print $2}')
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: %s\n' \
    "${uri:-http://deb.debian.org/debian}" /usr/share/keyrings/debian-archive-keyring.gpg > "$list"
fi
apt-get update -qq
candidate=$(apt-cache policy suricata | awk '/Candidate:/ {print $2}')
if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
  echo "install_suricata: no suricata package in this system's apt sources (bookworm-backports added)" >&2
  exit 1
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports suricata >/dev/null
suricata -V
