#!/usr/bin/env bash
# Builds the tools the real-API-server tier runs, each into a cache outside the repository keyed
# by its version and a hash of the files it is built from; a second run finds them and only
# prints their directory:
#   build.sh            the control plane — kube-apiserver, kube-controller-manager, kubectl
#                       (k8s.io/kubernetes at the version in KUBE_VERSION) and etcd (the
#                       go.etcd.io/etcd/server/v3 that release requires) — from this wrapper
#                       module; then helm too. Prints the control plane's directory last.
#   build.sh helm       helm (helm.sh/helm/v4 at the version in helm/HELM_VERSION) from the
#                       sibling wrapper module helm/. Prints its directory last.
# Two modules, because helm requires newer k8s.io modules than the control-plane release pins.
set -euo pipefail
cd "$(dirname "$0")"
CACHE_ROOT="${KUBE_CONTROL_PLANE_CACHE:-/var/tmp/egress-proxies-ci/control-plane}"
target="${1:-control-plane}"

# cached PREFIX VERSION RECIPE BINS... -- FILES...: sets $out, the directory keyed by the version
# and a hash of FILES and of the function RECIPE that builds them (its text, so an edit of the
# other recipe keeps this cache); returns 0 when all BINS are there.
cached() {
  local prefix="$1" version="$2" recipe="$3"; shift 3
  local bins=()
  while [ "$1" != "--" ]; do bins+=("$1"); shift; done
  shift
  local key
  key="$( { cat "$@"; declare -f "$recipe"; } | sha256sum | cut -c1-12)"
  out="$CACHE_ROOT/${prefix}${version}-${key}"
  for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done
  return 0
}

# publish PREFIX TMPDIR: moves a finished build into place ($out); builds of other versions or
# module files go once they are a week old (a run of another checkout may still use a recent one).
publish() {
  local prefix="$1" tmp="$2"
  rm -rf "$out"
  chmod 755 "$tmp"
  mv "$tmp" "$out"
  find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -type d -name "${prefix}v*" -mmin +10080 \
    ! -name "$(basename "$out")" -exec rm -rf {} +
}

need_go() {
  command -v go >/dev/null || { echo "build.sh: no go on PATH: the real-API-server tier builds its $1 with Go >= $2 (see docs/testing.md)" >&2; exit 1; }
}

build_helm() {
  local version
  version="$(cat helm/HELM_VERSION)"
  if cached helm- "$version" build_helm helm -- helm/HELM_VERSION helm/go.mod helm/go.sum helm/tools.go; then
    echo "$out"; return 0
  fi
  need_go helm 1.26
  mkdir -p "$CACHE_ROOT"
  local tmp start
  tmp="$(mktemp -d "$CACHE_ROOT/.build-XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  start=$(date +%s)
  echo "build.sh: building helm ${version}" >&2
  # The version stamp `helm version` prints (helm's own Makefile sets the same variables).
  (cd helm && CGO_ENABLED=0 go build -mod=readonly -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=${version} -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    -o "$tmp/helm" helm.sh/helm/v4/cmd/helm)
  echo "build.sh: built helm in $(( $(date +%s) - start )) s" >&2
  publish helm- "$tmp"
  trap - EXIT
  echo "$out"
}

build_control_plane() {
  local version
  version="$(cat KUBE_VERSION)"
  if cached "" "$version" build_control_plane kube-apiserver kube-controller-manager kubectl etcd -- \
    KUBE_VERSION go.mod go.sum tools.go cmd/etcd/main.go; then
    echo "$out"; return 0
  fi
  need_go "control plane" 1.24
  mkdir -p "$CACHE_ROOT"
  local tmp start minor ldflags
  tmp="$(mktemp -d "$CACHE_ROOT/.build-XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  minor="${version#v1.}"; minor="${minor%%.*}"
  # Without the version stamp the server reports v0.0.0 and kubectl warns about the skew.
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${version}"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=${version}"
  start=$(date +%s)
  export CGO_ENABLED=0
  for cmd in kube-apiserver kube-controller-manager kubectl; do
    echo "build.sh: building $cmd ${version}" >&2
    go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd"
  done
  echo "build.sh: building etcd" >&2
  go build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/etcd" ./cmd/etcd
  echo "build.sh: built the control plane in $(( $(date +%s) - start )) s" >&2
  publish "" "$tmp"
  trap - EXIT
  echo "$out"
}

case "$target" in
  helm) build_helm ;;
  control-plane)
    build_helm >/dev/null
    build_control_plane
    ;;
  *) echo "usage: build.sh [helm]" >&2; exit 2 ;;
esac
