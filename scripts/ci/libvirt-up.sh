#!/usr/bin/env bash
# Brings up a real libvirtd + QEMU (TCG) and an sshd on loopback for the kvm provider's tests,
# and a host-only bridge with a DHCP server for the VMs of the KVM end-to-end tier.
# Idempotent: running it again reuses what is already up. Needs root (creates accounts, starts daemons).
# No systemd, no /dev/kvm, no polkit: libvirtd gets a private config with unix-group auth.
# Everything it starts listens on 127.0.0.1, a unix socket or the bridge ($BRIDGE, a documentation
# range with no route out: VM traffic stays on this machine); state, keys and logs live under $LIBVIRT_CI_DIR.
# Tests read $LIBVIRT_CI_DIR/env.json (see test/support/libvirt.ts). Undo with scripts/ci/libvirt-down.sh.
set -euo pipefail

DIR=${LIBVIRT_CI_DIR:-/var/tmp/egress-proxies-ci/libvirt}
SSH_PORT=${LIBVIRT_CI_SSH_PORT:-2222}
SSH_USER=${LIBVIRT_CI_SSH_USER:-virtci}
POOL=${LIBVIRT_CI_POOL:-ci-pool}
BRIDGE=${LIBVIRT_CI_BRIDGE:-epo-ci-br0}
BRIDGE_ADDR=${LIBVIRT_CI_BRIDGE_ADDR:-198.51.100.1}
BRIDGE_NET=${BRIDGE_ADDR%.*} # the /24 the address is in
SOCK=/var/run/libvirt/libvirt-sock
V=(virsh -q -c qemu:///system)

T0=$(date +%s%N)
log() { echo "[libvirt-up +$((($(date +%s%N) - T0) / 1000000)) ms] $*"; }
die() { echo "libvirt-up: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (creates accounts and starts libvirtd/sshd)"
for bin in libvirtd virtlogd virsh qemu-system-x86_64 /usr/sbin/sshd ssh-keygen ip dnsmasq; do
  command -v "$bin" >/dev/null || die "$bin not found: install libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils openssh-server iproute2 dnsmasq-base"
done

# Alive = the pid exists and is not a zombie (PID 1 on CI boxes may reap orphans lazily).
alive() { [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
pid_of() { [ -f "$1" ] && cat "$1" 2>/dev/null || true; }

# qemu runs as libvirt-qemu and must traverse down to the pool.
mkdir -p "$DIR"/{run,logs,ssh,pool}
chmod 0755 "$DIR" "$DIR/pool" "$(dirname "$DIR")"

# Package postinst scripts must never start daemons behind our back.
if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; fi

# 1. Accounts that libvirt-daemon-system's postinst would create (that package pulls in systemd).
getent group libvirt >/dev/null || groupadd --system libvirt
getent group kvm >/dev/null || groupadd --system kvm
getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
getent passwd libvirt-qemu >/dev/null ||
  useradd --system --gid kvm --groups libvirt-qemu --home-dir /var/lib/libvirt --no-create-home --shell /usr/sbin/nologin libvirt-qemu
# The unprivileged SSH user reaches libvirt only through group 'libvirt'; /bin/sh keeps logins fast.
getent passwd "$SSH_USER" >/dev/null || useradd --create-home --shell /bin/sh --groups libvirt "$SSH_USER"
usermod -a -G libvirt "$SSH_USER"
usermod -p '*' "$SSH_USER" # a fresh account is locked ('!'); sshd with UsePAM no refuses locked accounts
# /dev/kvm as Debian's udev rule leaves it (root:kvm 0660). Where it exists but only root may open
# it, QEMU's capability probe (as root) finds KVM while libvirt's check (as libvirt-qemu) does not,
# so libvirtd discards its capabilities cache on every call and re-probes for seconds each time.
if [ -c /dev/kvm ]; then chgrp kvm /dev/kvm && chmod 0660 /dev/kvm; fi

# 2. virtlogd + libvirtd. keepalive_interval is short so tests see the daemon's PINGs within seconds.
cat >"$DIR/libvirtd.conf" <<CONF
unix_sock_group = "libvirt"
unix_sock_ro_perms = "0777"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
keepalive_interval = 2
keepalive_count = 5
log_outputs = "3:file:$DIR/logs/libvirtd.log"
CONF

if ! alive "$(pid_of "$DIR/run/virtlogd.pid")"; then
  setsid virtlogd --pid-file "$DIR/run/virtlogd.pid" >"$DIR/logs/virtlogd.out" 2>&1 </dev/null &
fi
if alive "$(pid_of "$DIR/run/libvirtd.pid")"; then
  log "libvirtd already running (pid $(pid_of "$DIR/run/libvirtd.pid"))"
elif [ -S "$SOCK" ] && "${V[@]}" version >/dev/null 2>&1; then
  # Someone else's libvirtd: reuse it, but our tests need group auth without polkit.
  log "WARNING: a libvirtd not started by this script answers on $SOCK; reusing it"
else
  setsid libvirtd -f "$DIR/libvirtd.conf" --pid-file "$DIR/run/libvirtd.pid" >"$DIR/logs/libvirtd.out" 2>&1 </dev/null &
fi

# 3. sshd on loopback with a throwaway host key and one client key for $SSH_USER.
[ -f "$DIR/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C ci-host -f "$DIR/ssh/host_ed25519"
[ -f "$DIR/ssh/client_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C ci-client -f "$DIR/ssh/client_ed25519"
cp "$DIR/ssh/client_ed25519.pub" "$DIR/ssh/authorized_keys"
chmod 0644 "$DIR/ssh/authorized_keys"
# Plain (unhashed) known_hosts line in the [host]:port form OpenSSH writes for non-22 ports.
echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$DIR/ssh/host_ed25519.pub")" >"$DIR/ssh/known_hosts"
cat >"$DIR/ssh/sshd_config" <<CONF
ListenAddress 127.0.0.1
Port $SSH_PORT
HostKey $DIR/ssh/host_ed25519
PidFile $DIR/run/sshd.pid
AuthorizedKeysFile $DIR/ssh/authorized_keys
AllowUsers $SSH_USER
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding local
AllowStreamLocalForwarding yes
X11Forwarding no
PermitTTY no
PrintMotd no
CONF
mkdir -p /run/sshd && chmod 0755 /run/sshd
/usr/sbin/sshd -t -f "$DIR/ssh/sshd_config" || die "sshd config invalid"
if ! alive "$(pid_of "$DIR/run/sshd.pid")"; then
  setsid /usr/sbin/sshd -D -e -f "$DIR/ssh/sshd_config" >"$DIR/logs/sshd.log" 2>&1 </dev/null &
fi

# 4. Readiness (the first libvirtd start probes QEMU's capabilities: a few seconds).
wait_for() {
  local what=$1; shift
  for _ in $(seq 1 300); do "$@" >/dev/null 2>&1 && { log "$what ready"; return 0; }; sleep 0.1; done
  die "$what not ready after 30 s (logs in $DIR/logs)"
}
wait_for libvirtd "${V[@]}" version
wait_for sshd bash -c "exec 3<>/dev/tcp/127.0.0.1/$SSH_PORT"

# 5. A directory storage pool for the tests.
"${V[@]}" pool-info "$POOL" >/dev/null 2>&1 || "${V[@]}" pool-define-as "$POOL" dir --target "$DIR/pool" >/dev/null
"${V[@]}" pool-build "$POOL" >/dev/null 2>&1 || true
[ "$("${V[@]}" pool-info "$POOL" | awk '/^State:/{print $2}')" = running ] || "${V[@]}" pool-start "$POOL" >/dev/null
log "pool $POOL active"

# 6. The VMs' network: a bridge with no uplink and no forwarding, DHCP from dnsmasq (no DNS:
# port 0; no router option: the guests have no default route).
ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
ip addr show dev "$BRIDGE" | grep -q "inet $BRIDGE_ADDR/24" || ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
if ! alive "$(pid_of "$DIR/run/dnsmasq.pid")"; then
  dnsmasq --conf-file=/dev/null --pid-file="$DIR/run/dnsmasq.pid" --user=root \
    --interface="$BRIDGE" --bind-dynamic --except-interface=lo --port=0 \
    --dhcp-range="$BRIDGE_NET.10,$BRIDGE_NET.250,255.255.255.0,1h" --dhcp-option=3 --dhcp-authoritative \
    --dhcp-leasefile="$DIR/run/dnsmasq.leases" --log-dhcp --log-facility="$DIR/logs/dnsmasq.log"
fi
wait_for dnsmasq bash -c "[ -s '$DIR/run/dnsmasq.pid' ]"
log "bridge $BRIDGE $BRIDGE_ADDR/24 with DHCP up"

cat >"$DIR/env.json" <<JSON
{
  "socketPath": "$SOCK",
  "uri": "qemu:///system",
  "pool": "$POOL",
  "poolPath": "$DIR/pool",
  "sshHost": "127.0.0.1",
  "sshPort": $SSH_PORT,
  "sshUser": "$SSH_USER",
  "sshKeyFile": "$DIR/ssh/client_ed25519",
  "knownHostsFile": "$DIR/ssh/known_hosts",
  "hostKeyPub": "$DIR/ssh/host_ed25519.pub",
  "domainPrefix": "ci-",
  "keepaliveIntervalSeconds": 2,
  "bridge": "$BRIDGE",
  "bridgeAddress": "$BRIDGE_ADDR"
}
JSON
log "all up; tests read $DIR/env.json"
