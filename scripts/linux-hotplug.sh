#!/usr/bin/env bash
# Device hotplug seen from inside Linux (issue 55 item 3), run by
# `scripts/linux-check.sh --hotplug [KERNEL]` or alone: a Linux guest started through the
# API with --enable-pci is given, while it runs, a drive, a pmem device and a NIC
# (PUT after InstanceStart, as Firecracker v1.16.1 takes them); each must appear in the
# guest without a rescan (ACPI PCI hotplug: acpiphp), be used (the drive and the pmem
# device read whole with the host's md5, the NIC pings the host), then be unplugged
# (DELETE: the guest ejects it) and be gone from the guest (no block device, no eth0, no
# PCI function but the host bridge). Prints one PASS/FAIL line per check.
# Env: EXITLESS, TIMEOUT (s to wait for each guest step, 300), WORK (/tmp/exitless-linux-hotplug).
# Needs root (a network namespace and a tap), busybox-static and python3. Not in CI.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
timeout=${TIMEOUT:-300}
work=${WORK:-/tmp/exitless-linux-hotplug}
ns=exitless-hp-$$
tap=exhp$$
host_ip=192.0.2.1
guest_ip=192.0.2.2
say() { echo "linux-hotplug: $*" >&2; }
fail() { say "FAILED at step $1"; exit 1; }
vmm=
cleanup() {
  [ -n "$vmm" ] && kill "$vmm" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$work"
cd "$work"
kernel=${1:-}
if [ -z "$kernel" ]; then
  kernel=$("$here/scripts/guest-kernel.sh") || fail "kernel (scripts/guest-kernel.sh)"
fi
. "$here/scripts/guest-busybox.sh"
fetch_busybox
# The guest waits for each device in turn, uses it, then waits for all to go.
cat > init <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
r() { echo "HOTPLUG-RESULT \$1 \$2"; }
until_there() { i=0; until [ -e "\$1" ]; do sleep 1; i=\$((i + 1)); [ \$i -ge $timeout ] && return 1; done; return 0; }
r waiting yes
until_there /dev/vda && r vda "\$(md5sum /dev/vda | cut -d' ' -f1)" || r vda none
until_there /dev/pmem0 && r pmem "\$(md5sum /dev/pmem0 | cut -d' ' -f1)" || r pmem none
until_there /sys/class/net/eth0 && { ip link set eth0 up; ip addr add $guest_ip/24 dev eth0; }
i=0; until ping -c 1 -W 1 $host_ip >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -ge 60 ] && break; done
if ping -c 3 -W 2 $host_ip >/dev/null 2>&1; then r ping ok; else r ping failed; fi
i=0; while [ -e /dev/vda ] || [ -e /dev/pmem0 ] || [ -e /sys/class/net/eth0 ]; do sleep 1; i=\$((i + 1)); [ \$i -ge $timeout ] && break; done
r left "vda=\$([ -e /dev/vda ] && echo yes || echo no) pmem0=\$([ -e /dev/pmem0 ] && echo yes || echo no) eth0=\$([ -e /sys/class/net/eth0 ] && echo yes || echo no) pci=\$(ls /sys/bus/pci/devices | tr '\n' ,)"
poweroff -f
EOF
python3 "$here/scripts/make-initramfs.py" initrd.cpio pkg/bin/busybox init || fail "initramfs"
head -c $((4 << 20)) /dev/urandom > drive.img
head -c $((4 << 20)) /dev/urandom > pmem.img
drive_md5=$(md5sum drive.img | cut -d' ' -f1)
pmem_md5=$(md5sum pmem.img | cut -d' ' -f1)

ip netns add "$ns" || fail "network: ip netns add"
sock="$work/api.sock"
rm -f "$sock"
ip netns exec "$ns" "$exitless" --api-sock "$sock" --enable-pci </dev/null >console.log 2>vmm.err &
vmm=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
api() { # method, path, body
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$sock" -X "$1" "http://localhost$2" \
    -H 'Content-Type: application/json' ${3:+-d "$3"}) || code=000
  case "$code" in 2*) ;; *) say "API $1 $2 answered $code"; return 1 ;; esac
}
result() { grep -a "^HOTPLUG-RESULT $1 " console.log | tr -d '\r' | tail -n 1 | cut -d' ' -f3- || true; }
await() { # name: waits for the guest's result line
  for _ in $(seq "$timeout"); do [ -n "$(result "$1")" ] && return 0; kill -0 "$vmm" 2>/dev/null || break; sleep 1; done
  say "no result $1 from the guest (see $work/console.log)"; return 1
}
api PUT /machine-config '{"vcpu_count": 1, "mem_size_mib": 256}' &&
api PUT /boot-source "{\"kernel_image_path\": \"$kernel\", \"initrd_path\": \"$work/initrd.cpio\",
  \"boot_args\": \"console=ttyS0 reboot=k panic=-1 nokaslr\"}" &&
api PUT /actions '{"action_type": "InstanceStart"}' || fail "starting the guest"
await waiting || fail "the guest's /init"
passed=0 failed=0
check() { if [ "$2" = 0 ]; then echo "PASS $1: $3"; passed=$((passed + 1)); else echo "FAIL $1: $3"; failed=$((failed + 1)); fi; }
api PUT /drives/hp0 "{\"drive_id\": \"hp0\", \"path_on_host\": \"$work/drive.img\", \"is_root_device\": false}" || true
await vda || true
check "hotplug drive" "$([ "$(result vda)" = "$drive_md5" ]; echo $?)" "/dev/vda appeared without a rescan, md5 $(result vda) (host $drive_md5)"
api PUT /pmem/hp1 "{\"id\": \"hp1\", \"path_on_host\": \"$work/pmem.img\"}" || true
await pmem || true
check "hotplug pmem" "$([ "$(result pmem)" = "$pmem_md5" ]; echo $?)" "/dev/pmem0 appeared without a rescan, md5 $(result pmem) (host $pmem_md5)"
api PUT /network-interfaces/hp2 "{\"iface_id\": \"hp2\", \"host_dev_name\": \"$tap\"}" || true
for _ in $(seq 100); do ip netns exec "$ns" ip link show "$tap" >/dev/null 2>&1 && break; sleep 0.1; done
ip netns exec "$ns" ip addr add "$host_ip/24" dev "$tap" && ip netns exec "$ns" ip link set "$tap" up || say "the tap's host side"
await ping || true
check "hotplug NIC" "$([ "$(result ping)" = ok ]; echo $?)" "eth0 appeared without a rescan, ping of the host: $(result ping)"
start=$(date +%s.%N)
unplugged=yes
for d in drives/hp0 pmem/hp1 network-interfaces/hp2; do api DELETE "/$d" || unplugged=no; done
took=$(echo "$(date +%s.%N) - $start" | bc)
await left || true
left=$(result left)
check "hot-unplug" "$([ "$unplugged" = yes ] && [ "${left%% pci=*}" = "vda=no pmem0=no eth0=no" ] && [ "${left##* pci=}" = "0000:00:00.0," ]; echo $?)" \
  "three DELETEs answered 204: $unplugged (${took%.*} s, the guest ejecting each); in the guest after: $left"
wait "$vmm" 2>/dev/null || true
vmm=
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
