#!/usr/bin/env bash
# Boots a Linux guest under exitless with Firecracker's balloon (through the API, as
# Firecracker's clients configure it) and checks each density feature from inside the
# guest and on the host, typing commands at a busybox shell on the serial console:
#   1. statistics: GET /balloon/statistics matches the guest's /proc/meminfo;
#   2. free page reporting: 256 MiB the guest fills and frees leaves the VMM's resident
#      memory (at least 90% of it within 10 s), with no API call;
#   3. inflate: PATCH /balloon to 128 MiB drops resident memory by at least 120 MiB and
#      the guest's MemTotal by 128 MiB; deflate gives MemTotal back;
#   4. free page hinting: a run started by PATCH /balloon/hinting/start ends (the guest's
#      STOP, acknowledged with DONE) and its hinted pages leave resident memory;
#   5. pmem: an ext4 image given by PUT /pmem/{id} as the root device (Firecracker's
#      root=/dev/pmem0 on the command line) is mounted with DAX: a file on it reads with
#      the host's bytes and without growing the guest's page cache; a file the guest
#      writes and syncs (a flush through the device) is in the image on the host; the
#      file truncated under the guest leaves guest and VMM running;
#   6. memory hotplug: PATCH /hotplug/memory to 256 MiB grows the guest's MemTotal by
#      256 MiB; back to 0 returns MemTotal and gives the memory the guest used back to the
#      host (resident memory falls).
# Four boots: one with free page reporting (checks 1 and 2), one without (3 and 4: the
# freed memory must stay resident for the balloon to be seen taking it), one with pmem,
# one with hotpluggable memory.
#   scripts/linux-memory.sh [KERNEL]
# Prints one PASS/FAIL line per check and a summary; exits non-zero if any failed.
# Env: EXITLESS, TIMEOUT (s per boot, 600), FILL_TIMEOUT (s for the guest to touch its
# memory, 900), VMM_FLAGS (more process flags: --enable-pci puts the devices on PCI instead
# of Firecracker's default virtio-mmio), ONLY (a boot's name: reporting, balloon,
# pmem or hotplug), WORK (default /tmp/exitless-linux-memory).
# Not in CI: each boot takes a minute or more here.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
timeout=${TIMEOUT:-600}
fill_timeout=${FILL_TIMEOUT:-900}
work=${WORK:-/tmp/exitless-linux-memory}
. "$here/scripts/linux-lib.sh"
harness linux-memory
[ -x "$exitless" ] || fail "setup: no exitless binary at $exitless (cargo build --release)"
mkdir -p "$work" && cd "$work"
rm -f ./*.sock ./*.fifo ./*.out ./*.err

kernel=${1:-}
[ -n "$kernel" ] || kernel=$("$here/scripts/guest-kernel.sh") || fail "kernel (scripts/guest-kernel.sh)"
. "$here/scripts/guest-busybox.sh"
fetch_busybox
# /init: each line typed on the console is run; /bin/fill touches memory from user space.
write_console_shell_init "LINUX-MEMORY: ready"
cc -static -O2 -o fill "$here/scripts/memory-fill.c" || fail "initramfs: building memory-fill"
python3 "$here/scripts/make-initramfs.py" initrd.cpio pkg/bin/busybox init bin/fill=fill || fail "initramfs"

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
# A value the guest echoes as "<tag>-<number>", the last one.
said() { grep -ao "$2-[0-9]*" "$1.out" | tail -n 1 | cut -d- -f2; }
type_line() { # name, command line
  local fd_var="console_$1"
  echo "$2" >&"${!fd_var}"
}
meminfo_line() { # tag, meminfo field: a command that echoes "<tag>-<kB>"
  echo "echo $1-\$(sed -n 's/^$2: *\\([0-9]*\\).*/\\1/p' /proc/meminfo)"
}
boot() { # name, device request ("PUT /path body")[, more boot args]: a VMM with its console on a FIFO, booted to the shell; sets pid
  local name=$1 sock=$1.sock
  mkfifo "$name.fifo"
  # shellcheck disable=SC2086
  "$exitless" --api-sock "$sock" --id "linux-memory-$name" ${VMM_FLAGS:-} <"$name.fifo" >"$name.out" 2>"$name.err" &
  pid=$!
  pids+=("$pid")
  exec {fd}>"$name.fifo"
  eval "console_$name=$fd"
  local i=0
  until [ -S "$sock" ]; do i=$((i + 1)); [ "$i" -gt 100 ] && fail "$name: no API socket"; sleep 0.05; done
  [ "$(api "$sock" PUT /machine-config '{"vcpu_count": 1, "mem_size_mib": 512}')" = 204 ] || fail "$name: machine-config"
  [ "$(api "$sock" PUT /boot-source "{\"kernel_image_path\": \"$kernel\", \"initrd_path\": \"$work/initrd.cpio\", \"boot_args\": \"console=ttyS0 reboot=k panic=-1 nokaslr${3:+ $3}\"}")" = 204 ] \
    || fail "$name: boot-source"
  local path=${2%% *} body=${2#* }
  [ "$(api "$sock" PUT "$path" "$body")" = 204 ] || fail "$name: PUT $path ($(cat answer))"
  [ "$(api "$sock" PUT /actions '{"action_type": "InstanceStart"}')" = 204 ] || fail "$name: InstanceStart ($(cat answer))"
  wait_for "$name.out" "LINUX-MEMORY: ready" "$timeout" || fail "$name: not ready within $timeout s ($(tail -c 300 "$name.out"))"
}
# Runs `command` in the guest, then waits for its "<tag>-42".
run() { # name, tag, command, seconds
  type_line "$1" "$3; echo $2-\$((6 * 7))"
  wait_for "$1.out" "$2-42" "$4" || fail "$1: '$3' did not finish within $4 s ($(tail -c 200 "$1.out"))"
}
get_until() { # socket, path, field, value, seconds: GET path until field = value
  local i=0
  while :; do
    [ "$(api "$1" GET "$2")" = 200 ] && [ "$(field "$3")" = "$4" ] && return 0
    i=$((i + 1)); [ "$i" -gt $(($5 * 5)) ] && return 1; sleep 0.2
  done
}
stats_until() { get_until "$1" /balloon/statistics "$2" "$3" "$4"; }

wanted() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }

# Boot 1: free page reporting (and statistics every second).
if wanted reporting; then
say "boot 1 of 4: free page reporting"
boot reporting '/balloon {"amount_mib": 0, "deflate_on_oom": false, "stats_polling_interval_s": 1, "free_page_reporting": true}'
run reporting meminfo "$(meminfo_line memtotal MemTotal); $(meminfo_line memfree MemFree)" 60
stats_until reporting.sock total_memory $(($(said reporting memtotal) * 1024)) 20 && stats=0 || stats=1
check "balloon statistics" "$stats" "GET /balloon/statistics total_memory $(field total_memory) bytes, free_memory $(field free_memory); the guest's MemTotal $(said reporting memtotal) kB, MemFree $(said reporting memfree) kB"
rss0=$(rss_kib "$pid")
# The program holds the memory 20 s (the host reads the resident size meanwhile), then
# exits: the whole 256 MiB is freed at once.
type_line reporting "fill 256 20; echo freed-\$((6 * 7))"
# Slow here: every page the guest touches costs its kernel a fault and a zeroing at
# emulated CPL0 (about 1 MiB/s on the nested host; docs/linux.md).
wait_for reporting.out "touched-256" "$fill_timeout" || fail "reporting: the guest did not fill 256 MiB ($(tail -c 200 reporting.out))"
rss1=$(rss_kib "$pid")
# Its exit frees 256 MiB page by page at emulated CPL0: a minute or more here.
wait_for reporting.out "freed-42" "$fill_timeout" || fail "reporting: the guest did not free the memory"
t0=$(date +%s.%N); rss2=$rss1
while :; do
  rss2=$(rss_kib "$pid")
  [ $((rss1 - rss2)) -ge $((256 * 1024 * 9 / 10)) ] && break
  [ "$(echo "$(date +%s.%N) - $t0 > 10" | bc)" = 1 ] && break
  sleep 0.2
done
took=$(printf %.1f "$(echo "$(date +%s.%N) - $t0" | bc)")
check "free page reporting" "$([ $((rss1 - rss2)) -ge $((256 * 1024 * 9 / 10)) ]; echo $?)" \
  "the guest filled 256 MiB ($(grep -ao 'touched-256-in-[0-9]*' reporting.out | cut -d- -f4) ms; resident $((rss0 >> 10)) -> $((rss1 >> 10)) MiB) and freed it: resident $((rss2 >> 10)) MiB after $took s (given back: $(((rss1 - rss2) >> 10)) MiB, at least 230 wanted)"
type_line reporting "poweroff -f"
wait "$pid" || true
fi

# Boot 2: no reporting (freed memory stays resident); the balloon and hinting.
if wanted balloon; then
say "boot 2 of 4: inflate, deflate, free page hinting"
boot balloon '/balloon {"amount_mib": 0, "deflate_on_oom": false, "stats_polling_interval_s": 1, "free_page_hinting": true}'
# 224 MiB touched and freed: resident but free, for the balloon to take 128 MiB of and
# for the hinting run to find the rest of.
run balloon fill "fill 224; $(meminfo_line memtotal0 MemTotal)" "$fill_timeout"
memtotal0=$(said balloon memtotal0)
rss0=$(rss_kib "$pid")
[ "$(api balloon.sock PATCH /balloon '{"amount_mib": 128}')" = 204 ] || fail "balloon: PATCH /balloon ($(cat answer))"
t0=$(date +%s.%N)
stats_until balloon.sock actual_mib 128 120 && inflated=0 || inflated=1
took=$(printf %.1f "$(echo "$(date +%s.%N) - $t0" | bc)")
rss1=$(rss_kib "$pid")
run balloon inflated "$(meminfo_line memtotal1 MemTotal)" 60
memtotal1=$(said balloon memtotal1)
check "balloon inflate" "$([ "$inflated" = 0 ] && [ $((rss0 - rss1)) -ge $((120 * 1024)) ] && [ $((memtotal0 - memtotal1)) = $((128 * 1024)) ]; echo $?)" \
  "PATCH /balloon 128 MiB: actual_mib $(field actual_mib) after $took s; resident $((rss0 >> 10)) -> $((rss1 >> 10)) MiB (at least 120 wanted); guest MemTotal $memtotal0 -> $memtotal1 kB"
[ "$(api balloon.sock GET /balloon)" = 200 ] && [ "$(field amount_mib)" = 128 ] && cfg=0 || cfg=1
check "GET /balloon" "$cfg" "amount_mib $(field amount_mib) after the PATCH"
[ "$(api balloon.sock PATCH /balloon '{"amount_mib": 0}')" = 204 ] || fail "balloon: PATCH /balloon 0 ($(cat answer))"
stats_until balloon.sock actual_mib 0 120 && deflated=0 || deflated=1
run balloon deflated "$(meminfo_line memtotal2 MemTotal)" 60
memtotal2=$(said balloon memtotal2)
check "balloon deflate" "$([ "$deflated" = 0 ] && [ "$memtotal2" = "$memtotal0" ]; echo $?)" \
  "PATCH /balloon 0: actual_mib $(field actual_mib); guest MemTotal $memtotal2 kB (at the start $memtotal0)"
rss0=$(rss_kib "$pid")
[ "$(api balloon.sock PATCH /balloon/hinting/start '')" = 204 ] || fail "balloon: hinting/start ($(cat answer))"
t0=$(date +%s.%N); i=0; status=
while :; do
  [ "$(api balloon.sock GET /balloon/hinting/status)" = 200 ] && status="host_cmd $(field host_cmd) guest_cmd $(field guest_cmd)"
  [ "$status" = "host_cmd 1 guest_cmd 0" ] && break
  i=$((i + 1)); [ "$i" -gt 300 ] && break; sleep 0.2
done
took=$(printf %.1f "$(echo "$(date +%s.%N) - $t0" | bc)")
rss1=$(rss_kib "$pid")
check "free page hinting" "$([ "$status" = "host_cmd 1 guest_cmd 0" ] && [ $((rss0 - rss1)) -ge $((64 * 1024)) ]; echo $?)" \
  "a run started: after $took s $status (the guest's STOP acknowledged with DONE); resident $((rss0 >> 10)) -> $((rss1 >> 10)) MiB (at least 64 given back wanted)"
type_line balloon "poweroff -f"
wait "$pid" || true
fi

# Boot 3: an ext4 image on virtio-pmem, the root device, mounted with DAX.
if wanted pmem; then
say "boot 3 of 4: pmem"
rm -rf pmem-files && mkdir pmem-files && head -c $((8 << 20)) /dev/urandom > pmem-files/data
data_md5=$(md5sum pmem-files/data | cut -d' ' -f1)
rm -f pmem.img && truncate -s 64M pmem.img
mkfs.ext4 -q -b 4096 -d pmem-files pmem.img || fail "pmem: mkfs.ext4"
boot pmem "/pmem/root {\"id\": \"root\", \"path_on_host\": \"$work/pmem.img\", \"root_device\": true, \"read_only\": false}"
run pmem mounted "mkdir -p /mnt; mount -o dax /dev/pmem0 /mnt; echo mount-\$(grep -c 'pmem0 /mnt ext4 .*dax' /proc/mounts); echo root-\$(grep -c 'root=/dev/pmem0 rw' /proc/cmdline)" 120
run pmem read "$(meminfo_line cached0 Cached); echo md5-\$(md5sum /mnt/data); $(meminfo_line cached1 Cached)" 300
run pmem wrote "echo pmem-$$ > /mnt/written; sync" 120
cached_growth=$(( $(said pmem cached1) - $(said pmem cached0) ))
guest_md5=$(grep -ao 'md5-[0-9a-f]*' pmem.out | tail -n 1 | cut -d- -f2)
check "pmem with DAX" "$([ "$(said pmem mount)" = 1 ] && [ "$(said pmem root)" = 1 ] && [ "$guest_md5" = "$data_md5" ] && [ "$cached_growth" -lt 4096 ]; echo $?)" \
  "root=/dev/pmem0 rw on the command line: $(said pmem root); mounted with dax: $(said pmem mount); an 8 MiB file read with md5 $guest_md5 (the host's $data_md5), the guest's page cache grew by $cached_growth kB (DAX: under 4096)"
# The image as it is now, for the flush check below: the file is truncated next.
cp pmem.img pmem-synced.img
# Hostile input: the file truncated to 1 MiB under the running guest, which then reads
# the pages it lost. The guest must go on (the lost pages read as zeros) and the VMM say so.
truncate -s 1M pmem.img
run pmem shrunk "md5sum /mnt/data >/dev/null 2>&1; echo alive" 120
check "pmem file truncated under the guest" "$(kill -0 "$pid" 2>/dev/null && grep -q 'shrank to 1048576 bytes' pmem.err; echo $?)" \
  "the guest read the lost pages and answered; the VMM runs on and said: $(grep -o 'shrank to [0-9]* bytes[^;]*' pmem.err | head -n 1)"
type_line pmem "umount /mnt; poweroff -f"
wait "$pid" || true
written=$(debugfs -R 'cat /written' pmem-synced.img 2>/dev/null || true)
check "pmem flush" "$([ "$written" = "pmem-$$" ]; echo $?)" "the guest's file, written and synced through the device, read from the image on the host: ${written:-nothing}"
fi
# Boot 4: 512 MiB of hotpluggable memory (virtio-mem), onlined movable so that it can
# be unplugged again (Firecracker's advice, docs/memory-hotplug.md).
if wanted hotplug; then
say "boot 4 of 4: memory hotplug"
boot hotplug '/hotplug/memory {"total_size_mib": 512}' memhp_default_state=online_movable
run hotplug before "$(meminfo_line memtotal0 MemTotal)" 60
memtotal0=$(said hotplug memtotal0)
[ "$(api hotplug.sock PATCH /hotplug/memory '{"requested_size_mib": 256}')" = 204 ] || fail "hotplug: PATCH 256 ($(cat answer))"
t0=$(date +%s.%N)
get_until hotplug.sock /hotplug/memory plugged_size_mib 256 300 && plugged=0 || plugged=1
took=$(printf %.1f "$(echo "$(date +%s.%N) - $t0" | bc)")
run hotplug plugged "$(meminfo_line memtotal1 MemTotal)" 120
memtotal1=$(said hotplug memtotal1)
check "memory hotplug" "$([ "$plugged" = 0 ] && [ $((memtotal1 - memtotal0)) = $((256 * 1024)) ]; echo $?)" \
  "PATCH /hotplug/memory 256: plugged_size_mib $(field plugged_size_mib) after $took s; guest MemTotal $memtotal0 -> $memtotal1 kB (256 MiB more wanted)"
# Memory the guest touches lands in the movable zone (the hotplugged memory) first; freed,
# it stays resident (no balloon here) until it is unplugged.
run hotplug fill "fill 128" "$fill_timeout"
rss0=$(rss_kib "$pid")
[ "$(api hotplug.sock PATCH /hotplug/memory '{"requested_size_mib": 0}')" = 204 ] || fail "hotplug: PATCH 0 ($(cat answer))"
t0=$(date +%s.%N)
get_until hotplug.sock /hotplug/memory plugged_size_mib 0 300 && unplugged=0 || unplugged=1
took=$(printf %.1f "$(echo "$(date +%s.%N) - $t0" | bc)")
rss1=$(rss_kib "$pid")
run hotplug unplugged "$(meminfo_line memtotal2 MemTotal)" 120
memtotal2=$(said hotplug memtotal2)
check "memory hot-unplug" "$([ "$unplugged" = 0 ] && [ "$memtotal2" = "$memtotal0" ] && [ $((rss0 - rss1)) -ge $((100 * 1024)) ]; echo $?)" \
  "PATCH /hotplug/memory 0: plugged_size_mib $(field plugged_size_mib) after $took s; guest MemTotal $memtotal2 kB (at the start $memtotal0); resident $((rss0 >> 10)) -> $((rss1 >> 10)) MiB after the guest filled and freed 128 MiB (at least 100 given back wanted)"
type_line hotplug "poweroff -f"
wait "$pid" || true
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
