#!/usr/bin/env bash
# Regenerates go.mod/go.sum of this wrapper module for one Kubernetes release: requires
# k8s.io/kubernetes at KUBE_VERSION and replaces every staging module that release's own go.mod
# points at ./staging/src/... by its published v0.MINOR.PATCH. Run it only to move to another
# release (the committed go.mod/go.sum are the pin); build.sh builds from them.
set -euo pipefail
KUBE_VERSION="${1:?usage: generate.sh v1.34.4}"
cd "$(dirname "$0")"
staging_version="v0.${KUBE_VERSION#v1.}"
release_mod="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
[ -f "$release_mod" ] || { echo "generate.sh: no go.mod for k8s.io/kubernetes@${KUBE_VERSION}" >&2; exit 1; }

rm -f go.mod go.sum
go mod init egress-proxies-operator.test/control-plane >/dev/null 2>&1
go mod edit -go=1.24.0 -require="k8s.io/kubernetes@${KUBE_VERSION}"
# The replace list is read from the release, never written by hand.
modules="$(sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$release_mod")"
[ -n "$modules" ] || { echo "generate.sh: no staging replaces found in $release_mod" >&2; exit 1; }
for m in $modules; do go mod edit -replace="${m}=${m}@${staging_version}"; done
echo "$KUBE_VERSION" > KUBE_VERSION
go mod tidy
echo "generate.sh: k8s.io/kubernetes ${KUBE_VERSION}, $(echo "$modules" | wc -l) staging modules at ${staging_version}"
