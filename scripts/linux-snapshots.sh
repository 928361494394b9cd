#!/usr/bin/env bash
# Snapshots of Linux guests under exitless, checked from inside the restored guests by
# typing commands at a busybox shell on the serial console:
#   1. huge pages: a guest on 2 MiB hugetlbfs pages (machine-config huge_pages "2M") keeps
#      a 4 MiB file in its RAM (`seq`'s output, written from user space: the kernel's own
#      work, /dev/urandom's too, runs emulated and slow on a nested host); it is
#      snapshotted and restored through a page-fault handler (`exitless uffd-handler`,
#      Firecracker's handshake with 2 MiB pages) and, in another VMM, from the memory
#      file: each restored guest's md5 of the file is the one it had before, and the
#      restored VMM's memory is in huge pages (the host pool's available pages fall by
#      the guest's size while it runs);
#   2. virtio-mem: a guest given 256 MiB of hotpluggable memory (online movable, where its
#      new page cache goes first) keeps such a file; restored, its MemTotal,
#      plugged_size_mib and the file's md5 are the ones before;
#   3. VMGenID: two guests restored from one snapshot read 16 bytes of /dev/urandom each,
#      and they differ (the generation id changed at each load and Linux reseeded: each
#      says "crng reseeded due to virtual machine fork"), and Linux's vmgenid driver is
#      bound to the device (a device under /sys/bus/*/drivers/vmgenid/: an ACPI driver in
#      6.1, a platform driver in later kernels).
#   scripts/linux-snapshots.sh [KERNEL]   (also scripts/linux-check.sh --snapshots)
# Prints one PASS/FAIL line per check and a summary; exits non-zero if any failed.
# Needs root (the huge page pool: 140 pages more are reserved in /proc/sys/vm/nr_hugepages
# while it runs and given back), busybox-static (apt-get download), python3 and curl.
# Env: EXITLESS, TIMEOUT (s per boot, 600), ONLY (huge, mem or vmgenid), WORK (default
# /tmp/exitless-linux-snapshots).
# Not in CI: each boot takes a minute or more here.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
timeout=${TIMEOUT:-600}
work=${WORK:-/tmp/exitless-linux-snapshots}
say() { echo "linux-snapshots: $*" >&2; }
fail() { say "FAILED at step $1"; exit 1; }
pids=()
pool=/proc/sys/vm/nr_hugepages
pool_was=
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$pool_was" ] && echo "$pool_was" >"$pool" || true
}
trap cleanup EXIT
[ -x "$exitless" ] || fail "setup: no exitless binary at $exitless (cargo build --release)"
[ "$(id -u)" = 0 ] || fail "setup: root is needed for the huge page pool"
mkdir -p "$work" && cd "$work"
rm -f ./*.sock ./*.fifo ./*.out ./*.err ./*.state ./*.mem

kernel=${1:-}
[ -n "$kernel" ] || kernel=$("$here/scripts/guest-kernel.sh") || fail "kernel (scripts/guest-kernel.sh)"
. "$here/scripts/guest-busybox.sh"
fetch_busybox
write_console_shell_init "LINUX-SNAPSHOTS: ready"
python3 "$here/scripts/make-initramfs.py" initrd.cpio pkg/bin/busybox init || fail "initramfs"

passed=0; failed=0
. "$here/scripts/linux-lib.sh"
# What the guest echoed as "<tag> <word>", the last one (carriage returns dropped).
said() { grep -a "^$2 " "$1.out" | tr -d '\r' | tail -n 1 | cut -d' ' -f2-; }
available() { echo $(($(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages) - $(cat /sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages))); }
vmm() { # name: a VMM with its console on a FIFO the script writes; sets pid
  local name=$1
  rm -f "$name.fifo" "$name.sock"
  mkfifo "$name.fifo"
  "$exitless" --api-sock "$name.sock" --id "linux-snapshots-${name//_/-}" <"$name.fifo" >"$name.out" 2>"$name.err" &
  pid=$!
  pids+=("$pid")
  exec {fd}>"$name.fifo"
  eval "console_$name=$fd"
  local i=0
  until [ -S "$name.sock" ]; do i=$((i + 1)); [ "$i" -gt 100 ] && fail "$name: no API socket"; sleep 0.05; done
}
# Runs `command` in the guest, then waits for its "<tag>-42".
run() { # name, tag, command, seconds
  local fd_var="console_$1"
  echo "$3; echo $2-\$((6 * 7))" >&"${!fd_var}"
  wait_for "$1.out" "$2-42" "$4" || fail "$1: '$3' did not finish within $4 s ($(tail -c 300 "$1.out"))"
}
boot() { # name, machine-config body, boot args, more "PUT path body" requests...: booted to the shell
  local name=$1 config=$2 args=$3
  shift 3
  vmm "$name"
  [ "$(api "$name.sock" PUT /machine-config "$config")" = 204 ] || fail "$name: machine-config ($(cat answer))"
  [ "$(api "$name.sock" PUT /boot-source "{\"kernel_image_path\": \"$kernel\", \"initrd_path\": \"$work/initrd.cpio\", \"boot_args\": \"console=ttyS0 reboot=k panic=-1 nokaslr $args\"}")" = 204 ] \
    || fail "$name: boot-source"
  local request
  for request in "$@"; do
    [ "$(api "$name.sock" PUT "${request%% *}" "${request#* }")" = 204 ] || fail "$name: PUT ${request%% *} ($(cat answer))"
  done
  [ "$(api "$name.sock" PUT /actions '{"action_type": "InstanceStart"}')" = 204 ] || fail "$name: InstanceStart ($(cat answer))"
  wait_for "$name.out" "LINUX-SNAPSHOTS: ready" "$timeout" || fail "$name: not ready within $timeout s ($(tail -c 300 "$name.out"))"
}
snapshot() { # name: paused, snapshotted to name.state and name.mem, its VMM ended
  [ "$(api "$1.sock" PATCH /vm '{"state": "Paused"}')" = 204 ] || fail "$1: pause ($(cat answer))"
  [ "$(api "$1.sock" PUT /snapshot/create "{\"snapshot_path\": \"$work/$1.state\", \"mem_file_path\": \"$work/$1.mem\"}")" = 204 ] \
    || fail "$1: snapshot/create ($(cat answer))"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
load() { # name, snapshot's name, backend type, backend path[, resume (true)]: a new VMM loads it
  vmm "$1"
  [ "$(api "$1.sock" PUT /snapshot/load "{\"snapshot_path\": \"$work/$2.state\", \"mem_backend\": {\"backend_type\": \"$3\", \"backend_path\": \"$4\"}, \"resume_vm\": ${5:-true}}")" = 204 ] \
    || fail "$1: snapshot/load ($(cat answer))"
}
poweroff() { # name: the guest powered off (its VMM ended within 60 s, else killed, and said)
  local fd_var="console_$1" i=0
  echo "poweroff -f" >&"${!fd_var}"
  while kill -0 "$pid" 2>/dev/null; do
    i=$((i + 1))
    if [ "$i" -gt 600 ]; then say "$1: poweroff -f did not end the VMM within 60 s: killed"; kill "$pid"; break; fi
    sleep 0.1
  done
  wait "$pid" 2>/dev/null || true
}
wanted() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }

# 1. A guest on huge pages, restored through a page-fault handler and from its file.
if wanted huge; then
  say "huge pages: boot"
  pool_was=$(cat "$pool")
  echo $((pool_was + 140)) >"$pool"
  [ "$(available)" -ge 128 ] || fail "huge: the pool has $(available) free 2 MiB pages after reserving 140 more"
  boot huge '{"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "2M"}' ""
  run huge pattern "seq 1 600000 >/tmp/pattern; echo md5 \$(md5sum /tmp/pattern)" 300
  md5=$(said huge md5 | cut -d' ' -f1)
  [ ${#md5} = 32 ] || fail "huge: no md5 before the snapshot ($(tail -c 300 huge.out))"
  snapshot huge
  before=$(available)
  rm -f uffd.sock
  "$exitless" uffd-handler --socket "$work/uffd.sock" --mem-file "$work/huge.mem" >handler.out 2>handler.err &
  handler=$!
  pids+=("$handler")
  i=0; until [ -S uffd.sock ]; do i=$((i + 1)); [ "$i" -gt 100 ] && fail "huge: no handler socket"; sleep 0.05; done
  say "huge pages: restore through the handler"
  load huge_uffd huge Uffd "$work/uffd.sock" false
  taken=$((before - $(available)))
  [ "$(api huge_uffd.sock PATCH /vm '{"state": "Resumed"}')" = 204 ] || fail "huge_uffd: resume ($(cat answer))"
  run huge_uffd after "echo md5 \$(md5sum /tmp/pattern)" 300
  got=$(said huge_uffd md5 | cut -d' ' -f1)
  poweroff huge_uffd
  wait "$handler" 2>/dev/null || true
  check "huge-page snapshot through UFFD" "$([ "$got" = "$md5" ] && [ "$taken" = 64 ]; echo $?)" \
    "md5 of 4 MiB in guest RAM $got after the restore, $md5 before; $taken 2 MiB pages taken while it ran (64 wanted); the handler: $(tr -d '\n' <handler.out)"
  say "huge pages: restore from the file"
  load huge_file huge File "$work/huge.mem" false
  taken=$((before - $(available)))
  [ "$(api huge_file.sock PATCH /vm '{"state": "Resumed"}')" = 204 ] || fail "huge_file: resume ($(cat answer))"
  run huge_file after "echo md5 \$(md5sum /tmp/pattern)" 300
  got=$(said huge_file md5 | cut -d' ' -f1)
  poweroff huge_file
  check "huge-page snapshot from a file" "$([ "$got" = "$md5" ] && [ "$taken" = 64 ]; echo $?)" \
    "md5 of 4 MiB in guest RAM $got after the restore, $md5 before; $taken 2 MiB pages taken while it ran (64 wanted)"
  echo "$pool_was" >"$pool"
  pool_was=
fi

# 2. A guest with plugged hotpluggable memory (virtio-mem).
if wanted mem; then
  say "virtio-mem: boot"
  boot mem '{"vcpu_count": 1, "mem_size_mib": 256}' memhp_default_state=online_movable '/hotplug/memory {"total_size_mib": 512}'
  [ "$(api mem.sock PATCH /hotplug/memory '{"requested_size_mib": 256}')" = 204 ] || fail "mem: PATCH 256 ($(cat answer))"
  i=0
  until [ "$(api mem.sock GET /hotplug/memory)" = 200 ] && [ "$(field plugged_size_mib)" = 256 ]; do
    i=$((i + 1)); [ "$i" -gt 1500 ] && fail "mem: 256 MiB not plugged within 300 s ($(cat answer))"; sleep 0.2
  done
  run mem pattern "seq 1 600000 >/tmp/pattern; echo md5 \$(md5sum /tmp/pattern); echo memtotal \$(sed -n 's/^MemTotal: *\\([0-9]*\\).*/\\1/p' /proc/meminfo)" 300
  md5=$(said mem md5 | cut -d' ' -f1)
  total=$(said mem memtotal)
  snapshot mem
  say "virtio-mem: restore"
  load mem_restored mem File "$work/mem.mem"
  run mem_restored after "echo md5 \$(md5sum /tmp/pattern); echo memtotal \$(sed -n 's/^MemTotal: *\\([0-9]*\\).*/\\1/p' /proc/meminfo)" 300
  got=$(said mem_restored md5 | cut -d' ' -f1)
  got_total=$(said mem_restored memtotal)
  api mem_restored.sock GET /hotplug/memory >/dev/null
  plugged=$(field plugged_size_mib)
  poweroff mem_restored
  check "virtio-mem snapshot" "$([ ${#md5} = 32 ] && [ "$got" = "$md5" ] && [ -n "$total" ] && [ "$got_total" = "$total" ] && [ "$plugged" = 256 ]; echo $?)" \
    "4 MiB file md5 $got after the restore, $md5 before; MemTotal $got_total kB, $total before; plugged_size_mib $plugged (256 wanted)"
fi

# 3. Two guests restored from one snapshot: VMGenID.
if wanted vmgenid; then
  say "VMGenID: boot"
  boot gen '{"vcpu_count": 1, "mem_size_mib": 128}' ""
  run gen ready "echo booted" 60
  snapshot gen
  for clone in gen_a gen_b; do
    say "VMGenID: restore $clone"
    load "$clone" gen File "$work/gen.mem"
    run "$clone" read "dd if=/dev/urandom of=/tmp/r bs=16 count=1 2>/dev/null; echo bytes \$(od -An -tx1 /tmp/r); mount -t sysfs sys /sys 2>/dev/null; echo bound /sys/bus/*/drivers/vmgenid/*:*" 60
    poweroff "$clone"
  done
  a=$(said gen_a bytes | tr -d ' '); b=$(said gen_b bytes | tr -d ' ')
  bound=$(said gen_a bound)
  # Linux says so when the generation id changes under it (drivers/virt/vmgenid.c).
  forks=$(cat gen_a.out gen_b.out | grep -ac 'crng reseeded due to virtual machine fork' || true)
  check "VMGenID" "$([ ${#a} = 32 ] && [ ${#b} = 32 ] && [ "$a" != "$b" ] && case "$bound" in */drivers/vmgenid/*:* ) ! echo "$bound" | grep -q '[*]' ;; *) false ;; esac && [ "$forks" = 2 ]; echo $?)" \
    "16 bytes of /dev/urandom in two guests restored from one snapshot: $a and $b; the vmgenid driver bound to: ${bound:-nothing}; 'crng reseeded due to virtual machine fork' in $forks of 2 restored guests"
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
