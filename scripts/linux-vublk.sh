#!/usr/bin/env bash
# vhost-user-blk seen from a Linux guest (`scripts/linux-check.sh --vublk` runs it): a drive
# `socket` served by qemu-storage-daemon (and, with CH=1, by Cloud Hypervisor's
# vhost_user_block), on virtio-mmio and on PCI (--enable-pci), from a configuration file:
# the guest reads the host image's first 8 MiB with the host's md5, writes 4 MiB of a
# pattern after them with O_DIRECT and fsync, and the host then finds them in the image
# byte for byte.
# With --mem, only virtio-mem beside the drive (qemu-storage-daemon, virtio-mmio): 256 MiB
# of hotpluggable memory onlined movable, plugged by PATCH /hotplug/memory; once the guest
# sees it, the same reads and writes, their buffers (user pages: the movable zone first)
# in the plugged memory the backend maps through the memfd.
# With --reconnect, only a backend restarted under the guest (qemu-storage-daemon, on
# virtio-mmio and PCI): the guest reads the image's first 1 MiB thirty times, 4 KiB at a
# time with O_DIRECT (one request in flight: qemu-storage-daemon completes deeper queues
# out of order, which exitless does not replay; 1 MiB because a 4 KiB request takes
# several ms of emulated guest kernel on a nested host, and 8 MiB a pass outlasted the
# boot's timeout); the host kills the backend in the middle
# and starts it again on the same socket; every pass must read the host's bytes, and the
# writes after it land as above.
# Prints one PASS/FAIL line per check and a summary; exits non-zero on a failure.
#   scripts/linux-vublk.sh [--mem|--reconnect] [KERNEL]
# Env: EXITLESS (binary), TIMEOUT (s per boot, 600), WORK (default /tmp/exitless-linux-vublk),
# CH_BLOCK (Cloud Hypervisor's vhost_user_block binary, if built: also run on it; it serves
# one connection and exits), BACKENDS (which of "qsd ch" to run, default both).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
timeout=${TIMEOUT:-600}
work=${WORK:-/tmp/exitless-linux-vublk}
. "$here/scripts/linux-lib.sh"
harness linux-vublk LINUX-VUBLK-RESULT

[ -x "$exitless" ] || fail "setup: no exitless binary at $exitless (cargo build --release)"
qsd=$(command -v qemu-storage-daemon) || fail "setup: qemu-storage-daemon is not installed (Debian's qemu-system-common)"
only=""
case "${1:-}" in --mem | --reconnect) only=${1#--}; shift ;; esac
kernel=${1:-}
[ -n "$kernel" ] || kernel=$("$here/scripts/guest-kernel.sh") || fail "kernel (scripts/guest-kernel.sh)"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
. "$here/scripts/guest-busybox.sh"
fetch_busybox

cat > init <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
r() { echo "LINUX-VUBLK-RESULT $1 $2"; }
memtotal() { grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2; }
if grep -q exitless.mem=1 /proc/cmdline; then
  m0=$(memtotal); r memtotal0 "$m0"; echo LINUX-VUBLK-MEM-READY
  i=0; while [ $(($(memtotal) - m0)) -lt 204800 ] && [ $i -lt 600 ]; do sleep 0.5; i=$((i + 1)); done
  r memtotal1 "$(memtotal)"
fi
if grep -q exitless.reconnect=1 /proc/cmdline; then
  pass() { dd if=/dev/vda bs=4k count=256 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1; }
  first=$(pass); ok=0 bad=0 i=0
  echo LINUX-VUBLK-LOOP-START
  while [ $i -lt 30 ]; do
    if [ "$(pass)" = "$first" ]; then ok=$((ok + 1)); else bad=$((bad + 1)); fi
    i=$((i + 1))
    echo "LINUX-VUBLK-PASS $i"
  done
  echo LINUX-VUBLK-LOOP-END
  r loop "$first $ok $bad"
fi
movable() { awk '/zone +Movable/{m=1} m&&/pages free/{print $3; exit}' /proc/zoneinfo; }
f0=$(movable)
r size $(cat /sys/block/vda/size)
r read-md5 $(dd if=/dev/vda bs=1M count=8 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
# A pattern made at CPL3 (/dev/urandom's crypto would run at the emulated CPL0 here).
yes exitless-vublk-pattern | head -c 4194304 > /w.bin
r written-md5 $(md5sum < /w.bin | cut -d' ' -f1)
# The pattern's pages (user pages, as dd's buffers): from the plugged movable zone if any.
[ -n "$f0" ] && r movable-used $((f0 - $(movable)))
dd if=/w.bin of=/dev/vda bs=1M seek=8 oflag=direct conv=fsync 2>/dev/null && r write ok
echo 3 > /proc/sys/vm/drop_caches
r reread-md5 $(dd if=/dev/vda bs=1M skip=8 count=4 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
poweroff -f
EOF
python3 "$here/scripts/make-initramfs.py" initrd.cpio pkg/bin/busybox init || fail "initramfs: writing the cpio archive"
cmdline="console=ttyS0 reboot=k panic=-1 nokaslr"

run() { # name, backend command (with SOCK and IMG for the socket and image), exitless flags[, mem|reconnect]
  local name=$1 backend=$2 flags=$3 mode=${4:-} img=$work/$1.img sock=$work/$1.sock log=$work/$1.log status=0 backend_pid
  local hotplug="" args=$cmdline mem=""
  [ "$mode" = mem ] && mem=1
  head -c $((8 << 20)) /dev/urandom > "$img"
  head -c $((8 << 20)) /dev/zero >> "$img"
  rm -f "$sock"
  # exec: the pid is the backend's own, to end it after the boot.
  eval "exec ${backend//SOCK/$sock}" >"$work/$name.backend.log" 2>&1 &
  backend_pid=$!
  pids+=("$backend_pid")
  for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
  if [ -n "$mem" ]; then
    hotplug=', "memory-hotplug": {"total_size_mib": 256}'
    args="$cmdline memhp_default_state=online_movable exitless.mem=1"
    flags="$flags --api-sock $work/$name.api"
    rm -f "$work/$name.api"
    # Plugged once the guest has noted its memory (its init says so).
    (wait_for "$log" LINUX-VUBLK-MEM-READY "$timeout" && api "$work/$name.api" PATCH /hotplug/memory '{"requested_size_mib": 256}' >"$work/$name.patch") &
    pids+=("$!")
  else
    flags="--no-api $flags"
  fi
  rm -f "$work/$name.restarted"
  if [ "$mode" = reconnect ]; then
    args="$cmdline exitless.reconnect=1"
    # Killed in the middle of the guest's reads, started again a second later; its pid
    # and whether the guest was still reading when it died go to $name.restarted.
    (
      wait_for "$log" LINUX-VUBLK-LOOP-START "$timeout" || exit 0
      sleep 0.5
      kill "$backend_pid"
      grep -aq LINUX-VUBLK-LOOP-END "$log" && echo late > "$work/$name.restarted"
      sleep 1
      rm -f "$sock"
      eval "exec ${backend//SOCK/$sock}" >>"$work/$name.backend.log" 2>&1 &
      echo "$! mid-loop" >> "$work/$name.restarted"
    ) &
    pids+=("$!")
  fi
  cat > "$name.json" <<JSON
{"boot-source": {"kernel_image_path": "$kernel", "initrd_path": "$work/initrd.cpio", "boot_args": "$args"},
 "machine-config": {"vcpu_count": 2, "mem_size_mib": 256},
 "drives": [{"drive_id": "vu", "is_root_device": false, "socket": "$sock", "cache_type": "Writeback"}]$hotplug}
JSON
  # shellcheck disable=SC2086
  timeout "$timeout" "$exitless" $flags --config-file "$name.json" </dev/null >"$log" 2>"$work/$name.err" || status=$?
  kill "$backend_pid" 2>/dev/null || true
  wait "$backend_pid" 2>/dev/null || true
  if [ "$mode" = reconnect ]; then
    local restarted loop
    restarted=$(cat "$work/$name.restarted" 2>/dev/null || true)
    kill "${restarted%% *}" 2>/dev/null || true
    loop=$(result loop "$log")
    check "$name: backend restarted mid-read" "$([ "${restarted#* }" = mid-loop ] && grep -aq "reconnected to" "$work/$name.err"; echo $?)" \
      "killed and started again while the guest read (${restarted:-never}); exitless: $(grep -ao 'reconnected to.*' "$work/$name.err" | head -n 1)"
    check "$name: every pass read the host's bytes" "$(set -- $loop; [ "${2:-}" = 30 ] && [ "${3:-}" = 0 ] && [ "$1" = "$(head -c $((1 << 20)) "$img" | md5sum | cut -d' ' -f1)" ]; echo $?)" \
      "md5, good passes, bad passes: ${loop:-none}"
  fi
  local host_read host_written
  host_read=$(head -c $((8 << 20)) "$img" | md5sum | cut -d' ' -f1)
  host_written=$(dd if="$img" bs=1M skip=8 count=4 2>/dev/null | md5sum | cut -d' ' -f1)
  if [ -n "$mem" ]; then
    local m0 m1
    m0=$(result memtotal0 "$log") m1=$(result memtotal1 "$log")
    check "$name: plugged" "$([ -n "$m0" ] && [ -n "$m1" ] && [ $((m1 - m0)) -ge 204800 ] && [ "$(cat "$work/$name.patch" 2>/dev/null)" = 204 ]; echo $?)" \
      "PATCH /hotplug/memory 256 answered $(cat "$work/$name.patch" 2>/dev/null); guest MemTotal $m0 -> $m1 kB"
    local used
    used=$(result movable-used "$log")
    check "$name: user pages in plugged memory" "$([ -n "$used" ] && [ "$used" -ge 512 ]; echo $?)" \
      "the 4 MiB pattern took ${used:-no} pages of the plugged (movable) zone (of its 1024, at least half wanted: per-CPU page lists hold some)"
  fi
  check "$name: capacity" "$([ "$(result size "$log")" = $((16 << 11)) ]; echo $?)" "guest sees $(result size "$log") sectors"
  check "$name: read" "$([ "$(result read-md5 "$log")" = "$host_read" ]; echo $?)" "guest md5 $(result read-md5 "$log"), host $host_read"
  check "$name: written" "$([ "$(result write "$log")" = ok ] && [ "$(result written-md5 "$log")" = "$host_written" ] && [ "$host_written" = "$want" ]; echo $?)" \
    "guest wrote $(result written-md5 "$log"), host image holds $host_written, the pattern is $want"
  check "$name: read back, guest ended" "$([ "$(result reread-md5 "$log")" = "$host_written" ] && [ "$status" = 0 ]; echo $?)" \
    "guest reads $(result reread-md5 "$log"); exit status $status"
}

want=$({ yes exitless-vublk-pattern || :; } | head -c 4194304 | md5sum | cut -d' ' -f1)
say "kernel $kernel; exitless $exitless"
qsd_cmd="$qsd --blockdev driver=file,node-name=f,filename=\$img --export type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path=SOCK,writable=on"
if [ -n "$only" ]; then
  run "qsd-$only" "$qsd_cmd" "" "$only"
  [ "$only" = reconnect ] && run qsd-reconnect-pci "$qsd_cmd" "--enable-pci" reconnect
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit
fi
if [[ " ${BACKENDS:-qsd ch} " == *" qsd "* ]]; then
  run qsd-mmio "$qsd_cmd" ""
  run qsd-pci "$qsd_cmd" "--enable-pci"
fi
if [ -n "${CH_BLOCK:-}" ] && [[ " ${BACKENDS:-qsd ch} " == *" ch "* ]]; then
  ch_cmd="$CH_BLOCK --block-backend path=\$img,socket=SOCK,num_queues=1"
  run ch-mmio "$ch_cmd" ""
  run ch-pci "$ch_cmd" "--enable-pci"
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
