#!/usr/bin/env bash
# Tears down what scripts/ci/libvirt-up.sh started: test domains ('ci-' and 'px-'), the test pool and its
# volumes, then sshd, libvirtd, virtlogd and dnsmasq by pid file, and the VMs' bridge. Safe to run
# when nothing is up.
set -uo pipefail

DIR=${LIBVIRT_CI_DIR:-/var/tmp/egress-proxies-ci/libvirt}
POOL=${LIBVIRT_CI_POOL:-ci-pool}
PREFIX=${LIBVIRT_CI_DOMAIN_PREFIX:-ci-}
BRIDGE=${LIBVIRT_CI_BRIDGE:-epo-ci-br0}
V=(virsh -q -c qemu:///system)

alive() { [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
pid_of() { [ -f "$1" ] && cat "$1" 2>/dev/null || true; }

if alive "$(pid_of "$DIR/run/libvirtd.pid")"; then
  # Domains first: a running qemu outlives libvirtd.
  # 'px-': VMs the operator created in the KVM end-to-end tier (test/e2e/kvm), if a run was cut off.
  for d in $("${V[@]}" list --all --name 2>/dev/null | grep -E "^($PREFIX|px-)"); do
    "${V[@]}" destroy "$d" >/dev/null 2>&1
    "${V[@]}" undefine "$d" --nvram >/dev/null 2>&1 || "${V[@]}" undefine "$d" >/dev/null 2>&1
  done
  for v in $("${V[@]}" vol-list "$POOL" 2>/dev/null | awk '$1 {print $1}'); do
    "${V[@]}" vol-delete --pool "$POOL" "$v" >/dev/null 2>&1
  done
  "${V[@]}" pool-destroy "$POOL" >/dev/null 2>&1
  "${V[@]}" pool-undefine "$POOL" >/dev/null 2>&1
fi

for n in sshd libvirtd virtlogd dnsmasq; do
  f="$DIR/run/$n.pid"
  p=$(pid_of "$f")
  if alive "$p"; then
    kill -TERM "$p"
    for _ in $(seq 1 100); do alive "$p" || break; sleep 0.1; done
    alive "$p" && kill -KILL "$p"
  fi
  rm -f "$f"
done
ip link del "$BRIDGE" >/dev/null 2>&1
rm -f "$DIR/env.json"
echo "libvirt-down: done"
