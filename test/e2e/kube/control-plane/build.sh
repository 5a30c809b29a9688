#!/usr/bin/env bash
# Builds the real control plane the real-API-server tier runs — kube-apiserver,
# kube-controller-manager, kubectl (k8s.io/kubernetes at the version in KUBE_VERSION) and etcd
# (the go.etcd.io/etcd/server/v3 that release requires) — from this wrapper module, into a cache
# outside the repository keyed by that version and a hash of the module files. A second run
# finds the binaries and only prints their directory. Prints that directory as its last line.
set -euo pipefail
cd "$(dirname "$0")"
KUBE_VERSION="$(cat KUBE_VERSION)"
CACHE_ROOT="${KUBE_CONTROL_PLANE_CACHE:-/var/tmp/egress-proxies-ci/control-plane}"
key="$(cat KUBE_VERSION go.mod go.sum tools.go cmd/etcd/main.go build.sh | sha256sum | cut -c1-12)"
out="$CACHE_ROOT/${KUBE_VERSION}-${key}"
bins=(kube-apiserver kube-controller-manager kubectl etcd)
have=1
for b in "${bins[@]}"; do [ -x "$out/$b" ] || have=0; done
if [ "$have" = 1 ]; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: no go on PATH: the real-API-server tier builds its control plane with Go >= 1.24 (see docs/testing.md)" >&2; exit 1; }
mkdir -p "$CACHE_ROOT"
tmp="$(mktemp -d "$CACHE_ROOT/.build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
# Without the version stamp the server reports v0.0.0 and kubectl warns about the skew.
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=${KUBE_VERSION}"
start=$(date +%s)
export CGO_ENABLED=0
for cmd in kube-apiserver kube-controller-manager kubectl; do
  echo "build.sh: building $cmd ${KUBE_VERSION}" >&2
  go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd"
done
echo "build.sh: building etcd" >&2
go build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/etcd" ./cmd/etcd
echo "build.sh: built in $(( $(date +%s) - start )) s" >&2
rm -rf "$out"
chmod 755 "$tmp"
mv "$tmp" "$out"
trap - EXIT
# Builds of other versions or module files go once they are a week old (a run of another
# checkout may still be using a recent one).
find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -type d -mmin +10080 ! -name "$(basename "$out")" -exec rm -rf {} +
echo "$out"
