#!/usr/bin/env bash
# Installs the Debian packages the test suite runs for real (list: scripts/ci/system-packages.txt).
# Idempotent; quick when everything is installed. Needs root and apt-get.
# `npm test` runs this itself when it is root and something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
while read -r pkg _probe; do
  [ -z "$pkg" ] || [ "${pkg:0:1}" = "#" ] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < scripts/ci/system-packages.txt

[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-system-packages: installing ${missing[*]}"
# Package postinst scripts must not start system daemons (squid would grab :3128).
if [ ! -f /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
