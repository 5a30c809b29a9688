#!/usr/bin/env bash
# Uninstalls egress-proxies-operator from a cluster without leaking instances (docs/deployment.md,
# "Uninstalling"):
#   1. every ProxyPool, waited for (a pool would re-create the Proxies deleted in step 2);
#   2. every Proxy, waited for until the operator has deleted its instance and released its
#      finalizer;
#   3. only then the installation: kubectl delete -k <kustomization>, or with --helm
#      `helm uninstall <release>` (which leaves the CRDs: Helm never deletes a chart's crds/).
# Before deleting anything it checks that an operator is leading (its leader Lease is renewed):
# without one nobody would release the finalizers. If a Proxy is still there after the timeout it
# stops and deletes nothing more, so the operator stays installed to finish the job.
#
# usage: scripts/uninstall.sh [kustomization dir, default config/default]
#        scripts/uninstall.sh --helm <release>
# environment: UNINSTALL_TIMEOUT (kubectl duration, default 15m), OPERATOR_NAMESPACE (default
# egress-proxies-system; the Helm release's namespace), KUBECTL (default kubectl), HELM (default
# helm).
set -euo pipefail

timeout=${UNINSTALL_TIMEOUT:-15m}
namespace=${OPERATOR_NAMESPACE:-egress-proxies-system}
kubectl=${KUBECTL:-kubectl}
helm=${HELM:-helm}
pools=proxypools.crawl.example.com
proxies=proxies.crawl.example.com

say() { printf 'uninstall: %s\n' "$*" >&2; }

release=
kustomization=
if [ "${1:-}" = --helm ]; then
  release=${2:-}
  if [ -z "$release" ]; then
    say "usage: $0 --helm <release>"
    exit 2
  fi
  if ! command -v "$helm" >/dev/null; then
    say "no $helm on PATH (HELM names another binary)"
    exit 2
  fi
  if ! "$helm" status "$release" --namespace "$namespace" >/dev/null 2>&1; then
    say "no Helm release $release in namespace $namespace (OPERATOR_NAMESPACE names another)"
    exit 2
  fi
else
  kustomization=${1:-config/default}
  if [ ! -d "$kustomization" ]; then
    say "$kustomization is not a kustomization directory"
    exit 2
  fi
fi

leader() {
  "$kubectl" -n "$namespace" get lease egress-proxies-operator-leader \
    -o 'jsonpath={.spec.holderIdentity}{" "}{.spec.renewTime}' 2>/dev/null || true
}

# Whether an operator leads now: a holder whose renewTime moves (it renews every 2 s).
operator_leading() {
  local first now
  first=$(leader)
  [ -n "${first%% *}" ] || return 1
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 2
    now=$(leader)
    [ -n "${now%% *}" ] || return 1
    [ "$now" != "$first" ] && return 0
  done
  return 1
}

names() { "$kubectl" get "$1" --all-namespaces -o name; }

if "$kubectl" get crd "$proxies" >/dev/null 2>&1; then
  if [ -n "$(names "$pools")$(names "$proxies")" ]; then
    if ! operator_leading; then
      say "no operator is leading in namespace $namespace (Lease egress-proxies-operator-leader not renewed):"
      say "nobody would delete the instances and release the Proxies' finalizers. Nothing was deleted."
      say "Start the operator (kubectl -n $namespace get pods), or abandon a Proxy's instance on"
      say "purpose with the annotation crawl.example.com/skip-cleanup=true, then run this again."
      exit 1
    fi
    say "1/3 deleting every ProxyPool"
    "$kubectl" delete "$pools" --all --all-namespaces --wait --timeout="$timeout"
    say "2/3 deleting every Proxy, waiting for the operator to delete their instances"
    "$kubectl" delete "$proxies" --all --all-namespaces --wait=false
    if [ -n "$(names "$proxies")" ]; then
      "$kubectl" wait --for=delete "$proxies" --all --all-namespaces --timeout="$timeout" || true
    fi
    if [ -n "$(names "$proxies")" ]; then
      "$kubectl" get "$proxies" --all-namespaces >&2 || true
      say "these Proxies are still waiting for their instances to be deleted (kubectl describe px shows why)."
      say "The installation was NOT deleted: the operator keeps working on them. Run this again later."
      exit 1
    fi
  fi
fi
if [ -n "$release" ]; then
  say "3/3 no Proxy left: uninstalling the Helm release $release (the CRDs stay)"
  "$helm" uninstall "$release" --namespace "$namespace" --wait --timeout "$timeout"
else
  say "3/3 no Proxy left: deleting the installation ($kustomization)"
  "$kubectl" delete -k "$kustomization" --wait --ignore-not-found
fi
say "done"
