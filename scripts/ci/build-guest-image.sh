#!/usr/bin/env bash
# Builds the Debian guest the KVM end-to-end tier boots (test/e2e/kvm/guest.test.ts): a
# debootstrap minbase root with a kernel, systemd, cloud-init, qemu-guest-agent, Squid and
# htpasswd, turned into a disk without loop devices (`mkfs.ext4 -d`, then `qemu-img convert`).
# The guest boots directly from the kernel and initrd copied next to the disk (the kvm provider's
# `kernel` / `initrd` / `cmdline` image options), so the disk needs no bootloader.
#
# Output, cached by this script's own hash (a second run on the same machine does nothing):
#   /var/tmp/egress-proxies-ci/guest-image/<hash>/{root.qcow2,vmlinuz,initrd.img,image.json}
# image.json names the files, the disk's sha256 and the kernel command line.
# Prints that directory on stdout (progress goes to stderr). Needs root, debootstrap, e2fsprogs,
# qemu-utils, and the Debian mirror ($GUEST_IMAGE_MIRROR) — the only step of the tier that
# leaves this machine.
set -euo pipefail

SELF=$(readlink -f "$0")
HASH=$(sha256sum "$SELF" | cut -c1-16)
BASE=${GUEST_IMAGE_CACHE:-/var/tmp/egress-proxies-ci/guest-image}
OUT=$BASE/$HASH
MIRROR=${GUEST_IMAGE_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
SIZE=2G

T0=$(date +%s%N)
log() { echo "[build-guest-image +$((($(date +%s%N) - T0) / 1000000)) ms] $*" >&2; }
die() { echo "build-guest-image: $*" >&2; exit 1; }

if [ -f "$OUT/image.json" ]; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap chroots)"
for bin in debootstrap mkfs.ext4 qemu-img chroot; do
  command -v "$bin" >/dev/null || die "$bin not found: install debootstrap e2fsprogs qemu-utils"
done

mkdir -p "$BASE"
chmod 0755 "$(dirname "$BASE")" "$BASE"
WORK=$(mktemp -d "$BASE/.build-$HASH.XXXXXX")
cleanup() {
  for m in proc sys dev/pts dev; do umount -l "$WORK/rootfs/$m" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
ROOT=$WORK/rootfs

# python3-cffi-backend is named explicitly: debootstrap does not resolve the virtual
# python3-cffi-backend-api-* that python3-cryptography (pulled in by cloud-init) depends on.
PACKAGES=(
  linux-image-amd64 systemd-sysv udev dbus
  cloud-init python3-cffi-backend qemu-guest-agent
  ifupdown isc-dhcp-client iproute2 netbase locales
  squid apache2-utils ca-certificates
)
log "debootstrap $SUITE minbase (${PACKAGES[*]})"
IFS=, debootstrap --variant=minbase --include="${PACKAGES[*]}" "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
  # Packages debootstrap could not order are left unconfigured; apt can finish them.
  log "debootstrap reported a failure; finishing the configuration with apt (log: tail follows)"
  tail -5 "$WORK/debootstrap.log" >&2
  mount -t proc proc "$ROOT/proc"
  chroot "$ROOT" sh -c 'DEBIAN_FRONTEND=noninteractive dpkg --configure -a && DEBIAN_FRONTEND=noninteractive apt-get -y -f install' >&2
  umount "$ROOT/proc"
}
for p in "${PACKAGES[@]}"; do
  chroot "$ROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    die "package $p is not installed in the guest"
done
log "root tree ready ($(du -sh "$ROOT" | cut -f1))"

# Guest settings. cloud-init brings the rest (hostname, network, our user-data).
echo "/dev/vda / ext4 defaults,errors=remount-ro 0 1" >"$ROOT/etc/fstab"
: >"$ROOT/etc/machine-id" # generated at first boot: every clone gets its own
rm -f "$ROOT/var/lib/dbus/machine-id"
echo 'datasource_list: [ NoCloud, None ]' >"$ROOT/etc/cloud/cloud.cfg.d/90-epo-ci.cfg"
sed -i 's/^# *en_US.UTF-8/en_US.UTF-8/' "$ROOT/etc/locale.gen"
chroot "$ROOT" locale-gen >/dev/null
# Squid waits for the Proxy's user-data (which writes the config and starts it); the guest
# agent is started by udev when its virtio port appears.
chroot "$ROOT" systemctl disable squid.service >/dev/null 2>&1 || true
# No time wasted waiting for a network that cloud-init configures later.
chroot "$ROOT" systemctl mask systemd-networkd-wait-online.service >/dev/null 2>&1 || true
chroot "$ROOT" apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/tmp/* "$ROOT"/var/log/*.log

KVER=$(ls "$ROOT/lib/modules" | head -1)
cp "$ROOT/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
cp "$ROOT/boot/initrd.img-$KVER" "$WORK/initrd.img"

log "mkfs.ext4 -d ($SIZE)"
mkfs.ext4 -q -F -d "$ROOT" -L rootfs "$WORK/root.raw" "$SIZE"
log "qemu-img convert to qcow2"
qemu-img convert -O qcow2 "$WORK/root.raw" "$WORK/root.qcow2"
rm -f "$WORK/root.raw"

SHA256=$(sha256sum "$WORK/root.qcow2" | cut -d' ' -f1)

cat >"$WORK/image.json" <<JSON
{
  "suite": "$SUITE",
  "kernelVersion": "$KVER",
  "disk": "$OUT/root.qcow2",
  "sha256": "$SHA256",
  "kernel": "$OUT/vmlinuz",
  "initrd": "$OUT/initrd.img",
  "cmdline": "root=/dev/vda rw console=ttyS0 net.ifnames=0",
  "buildSeconds": $((($(date +%s%N) - T0) / 1000000000))
}
JSON
chmod 0644 "$WORK"/{root.qcow2,vmlinuz,initrd.img,image.json}
mkdir -p "$OUT"
mv "$WORK"/{root.qcow2,vmlinuz,initrd.img} "$OUT/"
mv "$WORK/image.json" "$OUT/image.json" # last: its presence marks a complete image
chmod 0755 "$OUT"
# Older builds (another version of this script) are no longer used.
find "$BASE" -mindepth 1 -maxdepth 1 -type d ! -name "$HASH" ! -name '.build-*' -exec rm -rf {} + 2>/dev/null || true
log "built $OUT ($(du -sh "$OUT" | cut -f1))"
echo "$OUT"
