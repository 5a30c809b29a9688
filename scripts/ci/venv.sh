#!/usr/bin/env bash
# Creates a private virtual environment of a Python tool the tests run: `venv.sh schemathesis`
# (the API fuzzing test, test/integration/discovery/openapi-fuzz.test.ts), `venv.sh moto` (the
# aws provider tests' moto_server, test/support/moto.ts) or `venv.sh pytools` (the Python
# package's mypy, ruff, pytest, build and twine, and the Scrapy its test matrix installs:
# test/integration/clients/python-package.test.ts, test/e2e/clients/scrapy-crawl.test.ts).
# Debian's python3 -m venv, then pip installs scripts/ci/<name>/requirements.txt (the tool and
# every dependency pinned) from PyPI. pytools first downloads its pins as wheels into the
# environment's wheelhouse/ and installs from there: the tests make fresh environments from that
# wheelhouse without a network. It lives outside the repository, keyed by the tool's version and
# a hash of the pins and this script, so a second run finds it and only prints its directory; the
# system Python is never touched. Prints that directory as its last line. `--check` creates nothing: it prints the
# directory when the environment is ready, else says how to create it and exits 1.
# npm test runs it before the tests (scripts/test/run.ts, scripts/test/tiers.ts); see docs/testing.md.
set -euo pipefail
name="${1:-}"
# The package whose pinned version names the environment.
case "$name" in
  schemathesis | moto) pkg="$name" ;;
  pytools) pkg=mypy ;;
  *) echo "usage: venv.sh schemathesis|moto|pytools [--check]" >&2; exit 2 ;;
esac
shift
here="$(cd "$(dirname "$0")" && pwd)"
req="$here/$name/requirements.txt"
# The pin of the tool itself; an extra (moto[server]) does not change the version.
version="$(sed -n "s/^$pkg\(\[[a-z,]*\]\)\{0,1\}==//p" "$req")"
[ -n "$version" ] || { echo "venv.sh: $req pins no $pkg version" >&2; exit 1; }
# Every pin file of the tool (requirements.txt may include others with -r).
key="$(cat "$here/$name"/*.txt "$here/venv.sh" | sha256sum | cut -c1-12)"
# SCHEMATHESIS_VENV_CACHE is the older name of VENV_CACHE and still honoured.
CACHE_ROOT="${VENV_CACHE:-${SCHEMATHESIS_VENV_CACHE:-/var/tmp/egress-proxies-ci/venv}}"
# Debian's interpreter, not whatever a version manager puts first on PATH.
PYTHON="${VENV_PYTHON:-${SCHEMATHESIS_PYTHON:-/usr/bin/python3}}"
out="$CACHE_ROOT/${name}-${version}-${key}"

# Ready = finished (the marker is written last) and its interpreter still runs and finds the
# tool at that version: an upgraded system Python breaks a venv made from the old one, and that
# one is then made again.
installed() {
  "$out/bin/python" -c "import importlib.metadata as m; print(m.version('$pkg'))" 2>/dev/null
}
ready() {
  [ -f "$out/.ready" ] && [ "$(installed)" = "$version" ]
}

if [ "${1:-}" = --check ]; then
  if ready; then echo "$out"; exit 0; fi
  echo "no $name $version virtual environment at $out; create it with: bash scripts/ci/venv.sh $name (npm test does this itself)" >&2
  exit 1
fi

mkdir -p "$CACHE_ROOT" || { echo "venv.sh: cannot create $CACHE_ROOT (set VENV_CACHE to a writable directory)" >&2; exit 1; }
# Two runs at once build it once: the second waits, then finds it ready.
exec 9>"$CACHE_ROOT/.lock"
flock 9
if ready; then echo "$out"; exit 0; fi

echo "venv.sh: creating $out ($name $version from PyPI)" >&2
start=$(date +%s)
rm -rf "$out"
# A venv is not relocatable (its scripts name their interpreter by path): it is made where it
# stays, and only the marker written last says it is complete.
if ! "$PYTHON" -m venv "$out"; then
  rm -rf "$out"
  echo "venv.sh: $PYTHON -m venv failed: install python3-venv (bash .ci/install-system-packages.sh as root)" >&2
  exit 1
fi
pip=("$out/bin/python" -m pip --disable-pip-version-check --no-input)
from=()
if [ "$name" = pytools ]; then
  # Every pin as a wheel (each has one on PyPI): fresh environments of the tests install from here.
  if ! "${pip[@]}" download --quiet --only-binary=:all: --no-deps -r "$req" -d "$out/wheelhouse"; then
    rm -rf "$out"
    echo "venv.sh: downloading the wheels of $req from PyPI failed (see above)" >&2
    exit 1
  fi
  from=(--no-index --find-links "$out/wheelhouse")
fi
if ! "${pip[@]}" install --quiet "${from[@]}" -r "$req" \
  || ! "$out/bin/python" -m pip check >&2; then
  rm -rf "$out"
  echo "venv.sh: installing $req from PyPI failed (see above)" >&2
  exit 1
fi
echo "venv.sh: $name ($pkg $(installed))" >&2
touch "$out/.ready"
echo "venv.sh: created in $(( $(date +%s) - start )) s" >&2
# Environments of other versions or pins of this tool go once they are a week old (a run of
# another checkout may still be using a recent one).
find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -type d -name "${name}-*" -mmin +10080 ! -name "$(basename "$out")" -exec rm -rf {} +
echo "$out"
