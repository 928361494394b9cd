#!/usr/bin/env bash
# Boots a Linux guest under exitless to a busybox shell on its serial console, with a
# virtio-blk drive, a virtio-net NIC and virtio-rng in use, snapshots it through the API,
# kills that VMM, restores the snapshot in a new one and types commands at the restored
# shell: the drive read again past the page cache, the host pinged through the NIC, entropy
# read; prints the boot time beside the restore time. A busybox process that dies on
# its first TLS access now and then on this host (before and after a restore alike; see
# docs/linux.md) is why the pings may be tried again, and why no pipelines are typed.
#   scripts/linux-snapshot.sh [KERNEL]
# KERNEL defaults to the microVM kernel (scripts/guest-kernel.sh). Needs root (a tap that
# outlives the first VMM, 192.0.2.1/24 on its end, in a network namespace), busybox-static (apt-get download),
# python3 and curl.
# Env: EXITLESS (binary, default target/x86_64-unknown-linux-gnu/release/exitless), TIMEOUT (s for the boot, 900),
# WORK (default /tmp/exitless-linux-snapshot).
# Not in CI: the boot takes a minute or more here.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
timeout=${TIMEOUT:-900}
work=${WORK:-/tmp/exitless-linux-snapshot}
say() { echo "linux-snapshot: $*" >&2; }
fail() { say "FAILED at step $1"; exit 1; }
pids=()
tap=exsnap$$
ns=exitless-snap-$$
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT
[ -x "$exitless" ] || fail "setup: no exitless binary at $exitless (cargo build --release)"
[ "$(id -u)" = 0 ] || fail "setup: root is needed for the tap"
mkdir -p "$work" && cd "$work"
rm -f ./*.sock ./*.fifo state.json memory.bin ./*.out ./*.err
# The drive: 4 MiB the guest reads and sums before the snapshot and after the restore.
head -c $((4 << 20)) /dev/urandom >disk.img
disk_md5=$(md5sum disk.img | cut -d' ' -f1)
# The NIC's tap, made here so it (and its address) outlive the VMM that is killed, in a
# network namespace of its own where the VMMs run.
ip netns add "$ns" && ip -n "$ns" tuntap add dev "$tap" mode tap && ip -n "$ns" addr add 192.0.2.1/24 dev "$tap" \
  && ip -n "$ns" link set "$tap" up && ip -n "$ns" link set lo up || fail "setup: tap $tap in $ns"

kernel=${1:-}
[ -n "$kernel" ] || kernel=$("$here/scripts/guest-kernel.sh") || fail "kernel (scripts/guest-kernel.sh)"
. "$here/scripts/guest-busybox.sh"
fetch_busybox
# /init: says it is ready, then runs each line typed on the console.
write_console_shell_init "LINUX-SNAPSHOT: ready"
python3 "$here/scripts/make-initramfs.py" initrd.cpio pkg/bin/busybox init || fail "initramfs"

api() { # socket, method, path[, body]: the status code
  curl -s -o /dev/null -w "%{http_code}" --unix-socket "$1" -X "$2" "http://localhost$3" \
    ${4:+-H 'Content-Type: application/json' -d "$4"}
}
. "$here/scripts/linux-lib.sh"
vmm() { # name: a VMM with its console on a FIFO the script writes
  mkfifo "$1.fifo"
  ip netns exec "$ns" "$exitless" --api-sock "$1.sock" <"$1.fifo" >"$1.out" 2>"$1.err" &
  pids+=($!)
  exec {fd}>"$1.fifo"
  eval "console_$1=$fd"
  local i=0
  until [ -S "$1.sock" ]; do i=$((i + 1)); [ "$i" -gt 100 ] && fail "$1: no API socket"; sleep 0.05; done
}

cmdline="console=ttyS0 reboot=k panic=-1 noxsave clearcpuid=137,147,148,153,129 rodata=off nokaslr"
vmm boot
start=$(date +%s.%N)
[ "$(api boot.sock PUT /machine-config '{"vcpu_count": 1, "mem_size_mib": 128}')" = 204 ] || fail "machine-config"
[ "$(api boot.sock PUT /boot-source "{\"kernel_image_path\": \"$kernel\", \"initrd_path\": \"$work/initrd.cpio\", \"boot_args\": \"$cmdline\"}")" = 204 ] || fail "boot-source"
[ "$(api boot.sock PUT /drives/work "{\"drive_id\": \"work\", \"path_on_host\": \"$work/disk.img\", \"is_root_device\": false, \"is_read_only\": true}")" = 204 ] || fail "drive"
[ "$(api boot.sock PUT /network-interfaces/eth0 "{\"iface_id\": \"eth0\", \"host_dev_name\": \"$tap\", \"guest_mac\": \"06:00:c0:00:02:02\"}")" = 204 ] || fail "network-interfaces"
[ "$(api boot.sock PUT /entropy '{}')" = 204 ] || fail "entropy"
[ "$(api boot.sock PUT /actions '{"action_type": "InstanceStart"}')" = 204 ] || fail "InstanceStart"
wait_for boot.out "LINUX-SNAPSHOT: ready" "$timeout" || fail "boot: not ready within $timeout s ($(tail -c 300 boot.out))"
boot_s=$(echo "$(date +%s.%N) - $start" | bc)
say "booted to the shell in $(printf %.1f "$boot_s") s"
# The devices in use before the snapshot: the drive read, the NIC up with an address and
# answering, entropy read.
eval "echo 'ip link set eth0 up; ip addr add 192.0.2.2/24 dev eth0; for try in 1 2 3; do ping -c 3 -W 10 192.0.2.1 >/tmp/ping; n=\$(grep -c ttl= /tmp/ping); [ \$n -gt 0 ] && break; done; echo pings-before-\$n; echo before-md5 \$(md5sum /dev/vda); dd if=/dev/hwrng of=/tmp/rng bs=16 count=1 2>/dev/null; echo rng-before-\$(wc -c </tmp/rng); echo before-snapshot-\$((6 * 7))' >&\$console_boot"
wait_for boot.out "before-snapshot-42" 120 || fail "the booted shell did not answer"
grep -aq "before-md5 $disk_md5" boot.out || fail "the drive read before the snapshot ($(grep -a before-md5 boot.out))"
grep -aq "pings-before-[1-3]" boot.out || fail "the host did not answer the pings before the snapshot"
[ "$(api boot.sock PATCH /vm '{"state": "Paused"}')" = 204 ] || fail "pause"
t0=$(date +%s.%N)
[ "$(api boot.sock PUT /snapshot/create "{\"snapshot_path\": \"$work/state.json\", \"mem_file_path\": \"$work/memory.bin\"}")" = 204 ] \
  || fail "snapshot/create"
create_ms=$(echo "($(date +%s.%N) - $t0) * 1000" | bc)
kill "${pids[0]}"

vmm restored
t0=$(date +%s.%N)
[ "$(api restored.sock PUT /snapshot/load "{\"snapshot_path\": \"$work/state.json\", \"mem_backend\": {\"backend_type\": \"File\", \"backend_path\": \"$work/memory.bin\"}, \"resume_vm\": true}")" = 204 ] \
  || fail "snapshot/load ($(tail -2 restored.err))"
load_ms=$(echo "($(date +%s.%N) - $t0) * 1000" | bc)
eval "echo 'echo after-restore-\$((6 * 7)); uname -r' >&\$console_restored"
t1=$(date +%s.%N)
wait_for restored.out "after-restore-42" 60 || fail "the restored shell did not answer ($(tail -c 300 restored.out))"
answer_ms=$(echo "($(date +%s.%N) - $t1) * 1000" | bc)
# The devices go on: the drive read again (the page cache dropped first), the host pinged,
# entropy read.
eval "echo 'echo 3 > /proc/sys/vm/drop_caches; echo after-md5 \$(md5sum /dev/vda); for try in 1 2 3; do ping -c 3 -W 10 192.0.2.1 >/tmp/ping; n=\$(grep -c ttl= /tmp/ping); [ \$n -gt 0 ] && break; done; echo pings-after-\$n-try-\$try; dd if=/dev/hwrng of=/tmp/rng2 bs=16 count=1 2>/dev/null; echo rng-after-\$(wc -c </tmp/rng2); echo devices-checked-\$((6 * 7))' >&\$console_restored"
wait_for restored.out "devices-checked-42" 120 || fail "the restored devices did not answer ($(tail -c 300 restored.out))"
grep -aq "after-md5 $disk_md5" restored.out || fail "the drive after the restore ($(grep -a after-md5 restored.out))"
grep -aq "pings-after-3-try" restored.out || fail "the NIC after the restore ($(grep -a pings-after restored.out))"
grep -aq "rng-after-16" restored.out || fail "virtio-rng after the restore"
eval "echo 'poweroff -f' >&\$console_restored"
wait "${pids[1]}" && status=0 || status=$?
printf 'boot to the shell:        %8.1f s\n' "$boot_s"
printf 'snapshot/create:          %8.1f ms (%s of state, %s KiB of memory written)\n' "$create_ms" "$(du -h state.json | cut -f1)" "$(du -k memory.bin | cut -f1)"
printf 'snapshot/load (resumed):  %8.1f ms\n' "$load_ms"
printf 'first command answered:   %8.1f ms after it was typed\n' "$answer_ms"
printf 'restored shell said:      %s\n' "$(grep -a after-restore-42 restored.out | tail -1 | tr -d '\r')"
printf 'restored devices:         drive md5 %s (the file %s), %s of 3 pings answered, %s bytes of entropy\n' \
  "$(grep -a after-md5 restored.out | tail -1 | cut -d' ' -f2)" "$disk_md5" \
  "$(grep -ao 'pings-after-[0-9]*-try-[0-9]' restored.out | tail -1 | sed 's/pings-after-\([0-9]*\)-try-\([0-9]\)/\1 (attempt \2)/')" "$(grep -ao 'rng-after-[0-9]*' restored.out | tail -1 | cut -d- -f3)"
printf 'poweroff of the restored guest: status %s\n' "$status"
