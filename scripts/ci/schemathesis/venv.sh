#!/usr/bin/env bash
# Creates the private virtual environment the API fuzzing test runs schemathesis from
# (test/integration/discovery/openapi-fuzz.test.ts): Debian's python3 -m venv, then pip installs
# requirements.txt beside this script (schemathesis and every dependency pinned) from PyPI. It
# lives outside the repository, keyed by the schemathesis version and a hash of the pins and
# this script, so a second run finds it and only prints its directory; the system Python is
# never touched. Prints that directory as its last line. `--check` creates nothing: it prints
# the directory when the environment is ready, else says how to create it and exits 1.
# npm test runs it before the tests (scripts/test/run.ts); see docs/testing.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
req="$here/requirements.txt"
version="$(sed -n 's/^schemathesis==//p' "$req")"
[ -n "$version" ] || { echo "venv.sh: $req pins no schemathesis version" >&2; exit 1; }
key="$(cat "$req" "$here/venv.sh" | sha256sum | cut -c1-12)"
CACHE_ROOT="${SCHEMATHESIS_VENV_CACHE:-/var/tmp/egress-proxies-ci/venv}"
# Debian's interpreter, not whatever a version manager puts first on PATH.
PYTHON="${SCHEMATHESIS_PYTHON:-/usr/bin/python3}"
out="$CACHE_ROOT/schemathesis-${version}-${key}"

# Ready = finished (the marker is written last) and still runs: an upgraded system Python
# breaks a venv made from the old one, and that one is then made again.
ready() {
  [ -f "$out/.ready" ] && [ "$("$out/bin/schemathesis" --version 2>/dev/null)" = "schemathesis, version $version" ]
}

if [ "${1:-}" = --check ]; then
  if ready; then echo "$out"; exit 0; fi
  echo "no schemathesis $version virtual environment at $out; create it with: bash scripts/ci/schemathesis/venv.sh (npm test does this itself)" >&2
  exit 1
fi

mkdir -p "$CACHE_ROOT" || { echo "venv.sh: cannot create $CACHE_ROOT (set SCHEMATHESIS_VENV_CACHE to a writable directory)" >&2; exit 1; }
# Two runs at once build it once: the second waits, then finds it ready.
exec 9>"$CACHE_ROOT/.lock"
flock 9
if ready; then echo "$out"; exit 0; fi

echo "venv.sh: creating $out (schemathesis $version from PyPI)" >&2
start=$(date +%s)
rm -rf "$out"
# A venv is not relocatable (its scripts name their interpreter by path): it is made where it
# stays, and only the marker written last says it is complete.
if ! "$PYTHON" -m venv "$out"; then
  rm -rf "$out"
  echo "venv.sh: $PYTHON -m venv failed: install python3-venv (bash .ci/install-system-packages.sh as root)" >&2
  exit 1
fi
if ! "$out/bin/python" -m pip install --disable-pip-version-check --no-input --quiet -r "$req" \
  || ! "$out/bin/python" -m pip check >&2; then
  rm -rf "$out"
  echo "venv.sh: installing $req from PyPI failed (see above)" >&2
  exit 1
fi
"$out/bin/schemathesis" --version >&2
touch "$out/.ready"
echo "venv.sh: created in $(( $(date +%s) - start )) s" >&2
# Environments of other versions or pins go once they are a week old (a run of another
# checkout may still be using a recent one).
find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -type d -name 'schemathesis-*' -mmin +10080 ! -name "$(basename "$out")" -exec rm -rf {} +
echo "$out"
