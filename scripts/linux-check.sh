#!/usr/bin/env bash
# Boots a Linux guest under exitless with a busybox initramfs whose /init exercises every
# device the way a user's guest does, and prints one PASS/FAIL line per check and a summary.
#   scripts/linux-check.sh [KERNEL]
#   scripts/linux-check.sh --pci-timing N [KERNEL]
#   scripts/linux-check.sh --as-firecracker [KERNEL]
#   scripts/linux-check.sh --stress SECONDS [KERNEL]
#   scripts/linux-check.sh --cpu-templates [KERNEL]
#   scripts/linux-check.sh --snapshots [KERNEL]
#   scripts/linux-check.sh --fs [KERNEL]
# --fs runs only the virtio-fs checks (scripts/linux-fs.sh: virtiofsd on both transports,
# a root on virtio-fs, the backend killed mid-I/O), about six minutes.
#   scripts/linux-check.sh --vublk [KERNEL]
# --vublk runs only the vhost-user-blk checks (scripts/linux-vublk.sh: qemu-storage-daemon
# on both transports, md5 of what the guest reads and writes against the host image);
# --vublk --mem only virtio-mem's plugged memory used beside such a drive; --vublk --reconnect
# only a backend killed and started again under the guest's reads.
#   scripts/linux-check.sh --hotplug [KERNEL]
# --hotplug runs only the device hotplug checks (scripts/linux-hotplug.sh): a drive, a pmem
# device and a NIC plugged into a running guest, found without a rescan, used, unplugged.
#   scripts/linux-check.sh --fork [KERNEL]
# --fork runs only the fork check (scripts/linux-fork.sh): a guest with --ram-dir forked into
# three clones, each with its own tap, MMDS contents and random bytes, the parent running on.
# The third runs the same checks on a VMM started as Firecracker is (its process flags, no
# --enable-pci) and configured through the API as Firecracker's getting-started guide does
# (boot_args "console=ttyS0 reboot=k panic=1" and what the checks and this host need):
# the devices are then virtio-mmio and `pci=off` comes from exitless, as from Firecracker.
# --stress keeps one guest busy for SECONDS with interrupts racing their acknowledgements:
# rounds of direct 4 KiB reads and writes on both disks beside MMDS requests over the NIC
# (each answered by the VMM), every round's requests checked; it fails if a round stalls
# (a lost interrupt leaves a request unanswered) or any request went unanswered or wrong.
# --cpu-templates runs only the CPU template checks of the full run: three short boots (no
# template, T2 on Intel or T2A on AMD, a custom template hiding lahf_lm), each reading
# /proc/cpuinfo's flags: the template's hidden flag must be there without it and gone with it.
# --snapshots runs only the snapshot checks of the full run (scripts/linux-snapshots.sh: a
# huge-page guest restored through UFFD and from a file, a virtio-mem guest's plugged
# memory, two guests restored from one snapshot reading different random bytes).
# The second form instead boots N times with each PCI config mechanism (0xCF8/0xCFC,
# trapped ECAM, ECAM mapped read-only) and reports Linux's own time in its PCI initcalls
# (initcall_debug), as the VMware patch's boot-time table did.
# KERNEL defaults to the microVM kernel (scripts/guest-kernel.sh builds or reuses it); give
# the stock kernel's path to check that instead (it takes far longer here). Needs root (a
# network namespace and a tap), busybox-static (apt-get download) and python3.
# Env: EXITLESS (binary, default target/x86_64-unknown-linux-gnu/release/exitless), TIMEOUT (s per boot, 600),
# VCPUS (2), WORK (default /tmp/exitless-linux-check), EXTRA (more kernel arguments),
# EXITLESS_FLAGS (more `exitless run` flags, e.g. --sample-guest 20 --guest-symbols MAP),
# NET_MIB (the TCP transfer's size, 16).
# Its memory checks (balloon, free page reporting and hinting) are scripts/linux-memory.sh's,
# about ten minutes more: the guest touches its memory at emulated CPL0.
# Not in CI: it needs minutes and a kernel build.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --fs ]; then
  shift
  exec "$here/scripts/linux-fs.sh" "$@"
fi
if [ "${1:-}" = --vublk ]; then
  shift
  exec "$here/scripts/linux-vublk.sh" "$@"
fi
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
timeout=${TIMEOUT:-600}
net_mib=${NET_MIB:-16}
net_bytes=$((net_mib << 20))
vcpus=${VCPUS:-2}
work=${WORK:-/tmp/exitless-linux-check}
ns=exitless-check-$$
tap=exchk$$
host_ip=192.0.2.1
guest_ip=192.0.2.2
# A second NIC on a second tap and subnet: traffic on both at once, nothing crossed.
tap2=exchk2$$
host_ip2=198.51.100.1
guest_ip2=198.51.100.2
nic2_bytes=$((1 << 20))
marker="LINUX-CHECK: /init reached"
pattern="exitless-linux-check-$$-$(date +%s)"
say() { echo "linux-check: $*" >&2; }
fail() { say "FAILED at step $1"; exit 1; }
vmm=
cleanup() {
  [ -n "$vmm" ] && kill "$vmm" 2>/dev/null || true
  [ -n "${listener:-}" ] && kill "$listener" 2>/dev/null || true
  [ -n "${listener2:-}" ] && kill "$listener2" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || fail "setup: root is needed for the network namespace and the tap"
[ -x "$exitless" ] || fail "setup: no exitless binary at $exitless (cargo build --release)"
mkdir -p "$work"
cd "$work"

pci_runs=
as_firecracker=
stress=
cpu_templates_only=
snapshots_only=
if [ "${1:-}" = --hotplug ]; then
  shift
  exec "$here/scripts/linux-hotplug.sh" "$@"
fi
if [ "${1:-}" = --fork ]; then
  shift
  exec "$here/scripts/linux-fork.sh" "$@"
fi
if [ "${1:-}" = --as-firecracker ]; then
  as_firecracker=1
  shift
fi
if [ "${1:-}" = --stress ]; then
  stress=${2:?--stress needs a number of seconds}
  shift 2
  timeout=$((stress + timeout))
fi
if [ "${1:-}" = --cpu-templates ]; then
  cpu_templates_only=1
  shift
fi
if [ "${1:-}" = --snapshots ]; then
  snapshots_only=1
  shift
fi
if [ "${1:-}" = --pci-timing ]; then
  pci_runs=${2:?--pci-timing needs a number of boots}
  shift 2
fi
# 1. The kernel: the microVM kernel unless one is given; a bzImage or an ELF image.
kernel=${1:-}
if [ -z "$kernel" ]; then
  kernel=$("$here/scripts/guest-kernel.sh") || fail "kernel (scripts/guest-kernel.sh)"
fi
[ -r "$kernel" ] || fail "kernel: $kernel cannot be read"
magic=$(head -c 4 "$kernel" | od -An -c | tr -d ' ')
hdrs=$(dd if="$kernel" bs=1 skip=514 count=4 2>/dev/null | tr -d '\0')
[ "$magic" = '177ELF' ] || [ "$hdrs" = HdrS ] || fail "kernel: $kernel is neither a bzImage nor an ELF image"

# 2. The initramfs: busybox and an /init that checks each device and prints its results.
. "$here/scripts/guest-busybox.sh"
fetch_busybox
cat > init <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
echo "$marker"
r() { echo "LINUX-CHECK-RESULT \$1 \$2"; }
r cpu-flags " \$(grep -m 1 '^flags' /proc/cpuinfo | cut -d: -f2) "
if grep -q check=reboot /proc/cmdline; then r mode reboot; reboot -f; fi
if grep -q check=stress /proc/cmdline; then
  secs=\$(sed -n 's/.*stress_seconds=\([0-9]*\).*/\1/p' /proc/cmdline)
  ip link set lo up; ip link set eth0 up; ip addr add $guest_ip/24 dev eth0
  ip route add 169.254.169.254 dev eth0
  for i in 1 2 3 4 5 6 7 8 9 10; do
    tok=\$(printf 'PUT /latest/api/token HTTP/1.0\r\nX-metadata-token-ttl-seconds: 21600\r\n\r\n' | nc 169.254.169.254 80 | tail -n 1)
    [ \${#tok} = 64 ] && break
    sleep 1
  done
  # A busybox process here now and then dies of SIGSEGV on its first TLS access (docs/linux.md):
  # such a request is counted as crashed, not as unanswered.
  end=\$((\$(date +%s) + secs)); round=0; bad=0; crashed=0; requests=0
  tally() { # exit status, what
    case \$1 in
      0) ;;
      139) crashed=\$((crashed + 1)); echo "LINUX-CHECK-STRESS crashed: \$2" ;;
      *) bad=\$((bad + 1)); echo "LINUX-CHECK-STRESS unanswered: \$2 (status \$1)" ;;
    esac
  }
  while [ \$(date +%s) -lt \$end ]; do
    round=\$((round + 1)); rm -f /tmp/blk-r /tmp/blk-w
    (dd if=/dev/vda of=/dev/null bs=4k count=512 iflag=direct 2>/dev/null; echo \$? > /tmp/blk-r) &
    (dd if=/dev/zero of=/dev/vdb bs=4k count=128 oflag=direct 2>/dev/null; echo \$? > /tmp/blk-w) &
    for i in 1 2 3 4 5 6 7 8 9 10; do
      v=\$(wget -q -O - --header "X-metadata-token: \$tok" http://169.254.169.254/latest/meta-data/instance-id)
      st=\$?
      [ \$st = 0 ] && [ "\$v" != i-linux-check ] && st=1
      tally \$st "an MMDS GET (it said [\$v])"
    done
    wait
    # No status at all: the subshell itself died before writing it (a lost request would
    # hang the round instead, which the host side sees as a stall).
    tally "\$(cat /tmp/blk-r 2>/dev/null || echo 139)" "512 direct reads"
    tally "\$(cat /tmp/blk-w 2>/dev/null || echo 139)" "128 direct writes"
    requests=\$((requests + 640 + 10))
    echo "LINUX-CHECK-STRESS round \$round requests \$requests bad \$bad crashed \$crashed"
  done
  r stress-rounds \$round; r stress-requests \$requests; r stress-bad \$bad; r stress-crashed \$crashed
  r mode poweroff
  poweroff -f
fi
r cpus "\$(grep -c ^processor /proc/cpuinfo)"
r vda-md5 "\$(md5sum /dev/vda | cut -d' ' -f1)"
echo -n "$pattern" | dd of=/dev/vdb bs=512 seek=8 conv=fsync 2>/dev/null && r vdb-write done
r vsock-bound "\$(ls /sys/bus/virtio/drivers/vmw_vsock_virtio_transport 2>/dev/null | grep -c '^virtio')"
r vsock-echo "\$(/bin/vsockcheck 2>&1 | tr ' ' _)"
for d in /sys/bus/virtio/devices/*; do [ "\$(cat \$d/device)" = 0x0001 ] && r net-features "\$(cat \$d/features)"; done
r rng-current "\$(cat /sys/class/misc/hw_random/rng_current 2>/dev/null)"
r rng-bytes "\$(dd if=/dev/hwrng bs=32 count=2 2>/dev/null | od -An -tx1 | tr -d ' \\n')"
ip link set lo up
ip link set eth0 up
ip addr add $guest_ip/24 dev eth0
ip link set eth1 up
ip addr add $guest_ip2/24 dev eth1
# MMDS V2 as an agent reads it: a token by PUT (nc: busybox wget has no PUT), then GETs.
ip route add 169.254.169.254 dev eth0
tok=\$(printf 'PUT /latest/api/token HTTP/1.0\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n' | nc 169.254.169.254 80 | tail -n 1)
r mmds-token-length "\${#tok}"
r mmds-value "\$(wget -q -O - --header "X-metadata-token: \$tok" http://169.254.169.254/latest/meta-data/instance-id)"
# Tried up to three times, without a pipeline: a busybox process now and then dies on its
# first TLS access on this host (docs/linux.md), which must not read as a missing 401.
r mmds-no-token "\$(for i in 1 2 3; do wget -q -O - http://169.254.169.254/latest/meta-data/instance-id >/tmp/no-token 2>&1; grep -q 401 /tmp/no-token && break; done; grep -m 1 -o 401 /tmp/no-token)"
i=0
until ping -c 1 -W 1 $host_ip >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -ge 120 ] && break; done
if ping -c 3 -W 2 $host_ip >/dev/null 2>&1; then r ping ok; else r ping failed; fi
# $net_mib MiB: the read disk over and over (/dev/urandom would take minutes of emulated
# CPL0 here).
t0=\$(date +%s)
# The second NIC's transfer runs beside the first.
(head -c $nic2_bytes /dev/vda | nc $host_ip2 5001 && r tx2 done) &
while cat /dev/vda; do :; done | head -c $net_bytes | nc $host_ip 5000 && r tx done
wait
r tx-seconds \$((\$(date +%s) - t0))
# Without ACPI there is no way to power off (Linux only halts); Firecracker's guests
# without ACPI stop by reboot (reboot=k: the i8042's reset), and so does this one.
if grep -qw acpi=off /proc/cmdline; then r mode reboot-without-acpi; reboot -f; fi
r mode poweroff
poweroff -f
EOF
cc -static -Os -o vsockcheck "$here/scripts/vsock-check.c" || fail "initramfs: building the vsock client"
python3 "$here/scripts/make-initramfs.py" initrd.cpio pkg/bin/busybox init bin/vsockcheck=vsockcheck \
  || fail "initramfs: writing the cpio archive"

# 3. The disks: one the guest reads whole (its md5 is compared), one it writes.
head -c $((8 << 20)) /dev/urandom > read.img
truncate -s 0 write.img && truncate -s 1M write.img
read_md5=$(md5sum read.img | cut -d' ' -f1)

# 4. The namespace: exitless makes its tap there; the host end gets $host_ip once it appears.
ip netns add "$ns" || fail "network: ip netns add"
# What this nested host's KVM needs of a Linux guest (noxsave, clearcpuid, rodata=off) is
# not here: exitless's nested host profile adds it (docs/linux.md).
cmdline="console=ttyS0 reboot=k panic=-1 nokaslr ${EXTRA:-}"
listen_md5() { # ip, port, bytes: in the namespace, reads that many bytes from one connection, prints "n md5"
  ip netns exec "$ns" python3 -c '
import hashlib, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(float(sys.argv[3]))
c, _ = s.accept(); c.settimeout(120); h = hashlib.md5(); n = 0
while n < int(sys.argv[4]):
    b = c.recv(1 << 16)
    if not b: break
    h.update(b); n += len(b)
    if n % (1 << 20) < len(b): print(n >> 20, "MiB", flush=True, file=sys.stderr)
c.close(); print(n, h.hexdigest())' "$1" "$2" "$timeout" "$3"
}
api() { # socket, method, path, body: a request that must succeed (2xx)
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$1" -X "$2" "http://localhost$3" \
    -H 'Content-Type: application/json' -d "$4") || code=000
  case "$code" in 2*) ;; *) say "API $2 $3 answered $code"; return 1 ;; esac
}
start_as_firecracker() { # mode, log prefix: sets vmm
  local mode=$1 log=$2 sock="$work/$2.sock" i
  rm -f "$sock"
  # Firecracker's process flags as its clients pass them; no --enable-pci.
  ip netns exec "$ns" "$exitless" --api-sock "$sock" --id linux-check --metadata "$work/metadata.json" \
    ${EXITLESS_FLAGS:-} </dev/null >"$log.log" 2>"$log.err" &
  vmm=$!
  for i in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  # The guide's boot_args, then the checks' own words (nokaslr, EXTRA, the mode).
  local more=${cmdline#console=ttyS0 reboot=k panic=-1 }
  local template=
  case "${cpu_template:-}" in
    "") ;;
    *.json) api "$sock" PUT /cpu-config "$(cat "$cpu_template")" || fail "PUT /cpu-config" ;;
    *) template=", \"cpu_template\": \"$cpu_template\"" ;;
  esac
  api "$sock" PUT /machine-config "{\"vcpu_count\": $vcpus, \"mem_size_mib\": 256$template}" &&
  api "$sock" PUT /boot-source "{\"kernel_image_path\": \"$kernel\", \"initrd_path\": \"$work/initrd.cpio\",
    \"boot_args\": \"console=ttyS0 reboot=k panic=1 $more check=$mode\"}" &&
  api "$sock" PUT /drives/read "{\"drive_id\": \"read\", \"path_on_host\": \"$work/read.img\", \"is_root_device\": false, \"is_read_only\": true}" &&
  api "$sock" PUT /drives/write "{\"drive_id\": \"write\", \"path_on_host\": \"$work/write.img\", \"is_root_device\": false, \"is_read_only\": false}" &&
  api "$sock" PUT /network-interfaces/eth0 "{\"iface_id\": \"eth0\", \"host_dev_name\": \"$tap\"}" &&
  api "$sock" PUT /network-interfaces/eth1 "{\"iface_id\": \"eth1\", \"host_dev_name\": \"$tap2\"}" &&
  api "$sock" PUT /mmds/config '{"version": "V2", "network_interfaces": ["eth0"]}' &&
  api "$sock" PUT /entropy '{}' &&
  api "$sock" PUT /vsock "{\"guest_cid\": 3, \"uds_path\": \"$work/$log.vsock\"}" &&
  api "$sock" PUT /actions '{"action_type": "InstanceStart"}' || fail "configuring the VMM through the API"
  # No --timeout in Firecracker's interface: the script ends a guest that outlives its own
  # (the watch ends within a second of the VMM, so it never outlives the script).
  ( for _ in $(seq "$timeout"); do sleep 1; kill -0 "$vmm" 2>/dev/null || exit 0; done; kill "$vmm" 2>/dev/null ) &
}
boot() { # mode, log prefix, extra exitless flags...: runs one guest to its end; sets boot_s, init_s, status
  local mode=$1 log=$2 start now
  shift 2
  start=$(date +%s.%N)
  rm -f "$work/$log.vsock"
  if [ -n "$as_firecracker" ]; then
    start_as_firecracker "$mode" "$log"
  else
    # shellcheck disable=SC2086
    ip netns exec "$ns" "$exitless" run ${cpu_template:+--cpu-template "$cpu_template"} --kernel "$kernel" --initrd initrd.cpio --mem 256M --vcpus "$vcpus" \
      --cmdline "$cmdline check=$mode" --drive path=read.img,readonly=on --drive path=write.img \
      --net tap="$tap" --net tap="$tap2" --mmds "$work/metadata.json" --entropy --vsock cid=3,uds="$work/$log.vsock" --timeout "$timeout" --json "$log.json" ${EXITLESS_FLAGS:-} "$@" </dev/null >"$log.log" 2>"$log.err" &
    vmm=$!
  fi
  init_s=
  if [ "$mode" = full ]; then
    until ip netns exec "$ns" ip link show "$tap2" >/dev/null 2>&1; do
      kill -0 "$vmm" 2>/dev/null || break
      sleep 0.1
    done
    ip netns exec "$ns" ip addr add "$host_ip/24" dev "$tap" 2>/dev/null || true
    ip netns exec "$ns" ip link set "$tap" up 2>/dev/null || true
    ip netns exec "$ns" ip addr add "$host_ip2/24" dev "$tap2" 2>/dev/null || true
    ip netns exec "$ns" ip link set "$tap2" up 2>/dev/null || true
    ip netns exec "$ns" ip link set lo up
    listen_md5 "$host_ip2" 5001 "$nic2_bytes" > rx2.txt 2>/dev/null &
    listener2=$!
    # Reads exactly $net_bytes, then closes (the guest's nc ends with it) and says their md5.
    listen_md5 "$host_ip" 5000 "$net_bytes" > rx.txt 2>rx.err &
    listener=$!
  fi

  local rounds=0 progress_at=$SECONDS
  stalled=
  while kill -0 "$vmm" 2>/dev/null; do
    if [ -z "$init_s" ] && grep -aq "$marker" "$log.log"; then
      now=$(date +%s.%N); init_s=$(printf '%.1f' "$(echo "$now - $start" | bc)")
      progress_at=$SECONDS
    fi
    if [ "$mode" = stress ] && [ -n "$init_s" ]; then
      # A round takes seconds; one that takes minutes has a request nobody answers.
      now=$(grep -ac '^LINUX-CHECK-STRESS round' "$log.log" || true)
      if [ "$now" != "$rounds" ]; then
        rounds=$now; progress_at=$SECONDS
        ((rounds % 50 == 0)) && say "stress: $(grep -a '^LINUX-CHECK-STRESS round' "$log.log" | tail -n 1 | tr -d '\r')"
      elif ((SECONDS - progress_at > 300)); then
        stalled="no round ended for 300 s after round $rounds"
        kill "$vmm" 2>/dev/null || true
      fi
    fi
    sleep 0.2
  done
  set +e; wait "$vmm"; status=$?; set -e
  vmm=
  if [ -z "$init_s" ] && grep -aq "$marker" "$log.log"; then init_s="?"; fi
  boot_s=$(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)")
}

if [ -n "$pci_runs" ]; then
  # Linux's PCI initcalls, timed by the kernel itself: the scan (pci_arch_init: type 1 or
  # MMCONFIG; acpi_init / pci_subsys_init: the bus scan) and the devices' initialisation
  # (the virtio-pci probe and the drivers on it).
  # initcall_debug prints at KERN_DEBUG: loglevel=8 lets it reach the console.
  cmdline="$cmdline initcall_debug loglevel=8"
  printf '%-28s %6s %14s %14s %14s\n' "config access" boots "scan ms" "device init ms" "total ms"
  for mode in "io:--pci-config-io on --ecam trap" "ecam-trap:--pci-config-io off --ecam trap" \
              "ecam-mapped:--pci-config-io off --ecam mapped"; do
    name=${mode%%:*}; flags=${mode#*:}
    for i in $(seq "$pci_runs"); do
      say "pci timing: $name boot $i/$pci_runs"
      # shellcheck disable=SC2086
      boot reboot "pci-$name-$i" $flags
      [ -n "$init_s" ] || fail "boot ($name): /init not reached within $timeout s"
    done
    python3 - "$name" "$pci_runs" pci-"$name"-*.log <<'PY'
import re, statistics, sys
name, runs, logs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
scan = ("pci_arch_init", "acpi_init", "pci_subsys_init", "pcibios_assign_resources", "pci_apply_final_quirks")
init = ("virtio_pci_driver_init", "virtio_blk_init", "virtio_net_driver_init")
def usecs(log, names):
    # From the kernel's own timestamps on "calling X" and "initcall X ... returned" (the
    # "after N usecs" figure has only jiffy resolution this early in the boot).
    text = open(log, errors="replace").read()
    start, total = {}, 0.0
    for m in re.finditer(r"\[\s*([\d.]+)\] (calling|initcall)\s+(\w+)\+", text):
        t, what, name = float(m.group(1)), m.group(2), m.group(3)
        if name not in names:
            continue
        if what == "calling":
            start[name] = t
        elif name in start:
            total += (t - start.pop(name)) * 1e6
    return total
s = [usecs(l, scan) / 1e3 for l in logs]; d = [usecs(l, init) / 1e3 for l in logs]
t = [a + b for a, b in zip(s, d)]
med = statistics.median
label = {"io": "0xCF8/0xCFC", "ecam-trap": "ECAM, trapped", "ecam-mapped": "ECAM, mapped read-only"}[name]
print(f"{label:<28} {runs:>6} {med(s):>14.1f} {med(d):>14.1f} {med(t):>14.1f}")
PY
  done
  exit 0
fi

passed=0; failed=0
if [ -n "$stress" ]; then
  say "kernel $kernel; $stress s of stress (timeout $timeout s)"
  echo '{"latest": {"meta-data": {"instance-id": "i-linux-check"}}}' > "$work/metadata.json"
  cmdline="$cmdline stress_seconds=$stress"
  boot stress stress
  last=$(grep -a '^LINUX-CHECK-STRESS round' stress.log | tail -n 1 | tr -d '\r')
  result() { grep -a "^LINUX-CHECK-RESULT $1 " "$2" | tr -d '\r' | tail -n 1 | cut -d' ' -f3- || true; }
  echo "stress: ${stalled:-no stall}; last: ${last:-no round}; status $status"
  python3 - stress.json <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print("exits", r.get("exits"))
for k, v in (r.get("devices") or {}).items():
    if k.startswith("virtio"):
        print(" ", k, v)
PY
  if [ -z "$stalled" ] && [ "$status" = 0 ] && [ "$(result stress-bad stress.log)" = 0 ] && [ -n "$(result stress-rounds stress.log)" ]; then
    echo "PASS stress: $(result stress-rounds stress.log) rounds, $(result stress-requests stress.log) requests, every one answered ($(result stress-crashed stress.log) busybox crashes on this host)"
    exit 0
  fi
  echo "FAIL stress: rounds $(result stress-rounds stress.log), unanswered $(result stress-bad stress.log), crashed $(result stress-crashed stress.log)"
  exit 1
fi
check() { # name, condition (0/1), detail
  if [ "$2" = 0 ]; then echo "PASS $1: $3"; passed=$((passed + 1)); else echo "FAIL $1: $3"; failed=$((failed + 1)); fi
}
result() { grep -a "^LINUX-CHECK-RESULT $1 " "$2" | tr -d '\r' | tail -n 1 | cut -d' ' -f3- || true; }
# CPU templates seen from inside Linux: the flag a template hides is in /proc/cpuinfo without
# it (a boot of its own) and gone with it: 3dnowprefetch (PREFETCHW) for T2 (T2A on AMD),
# lahf_lm for a custom template that hides only that (0x8000_0001 ECX bit 0).
cpu_template_checks() {
  local static=T2 custom="$work/hide-lahf_lm.json" plain t c
  grep -q AuthenticAMD /proc/cpuinfo && static=T2A
  echo '{"cpuid_modifiers": [{"leaf": "0x80000001", "subleaf": "0x0", "flags": 0,
    "modifiers": [{"register": "ecx", "bitmap": "0bxxxx_xxxx_xxxx_xxxx_xxxx_xxxx_xxxx_xxx0"}]}]}' > "$custom"
  cpu_template= boot reboot template-none
  plain=$(result cpu-flags template-none.log)
  cpu_template=$static boot reboot template-static
  t=$(result cpu-flags template-static.log)
  cpu_template=$custom boot reboot template-custom
  c=$(result cpu-flags template-custom.log)
  cpu_template=
  has() { case "$1" in *" $2 "*) echo yes ;; *) echo no ;; esac; }
  check "CPU template $static" "$([ "$(has "$plain" 3dnowprefetch)" = yes ] && [ -n "$t" ] && [ "$(has "$t" 3dnowprefetch)" = no ]; echo $?)" \
    "3dnowprefetch in /proc/cpuinfo without a template: $(has "$plain" 3dnowprefetch); under $static: $(has "$t" 3dnowprefetch) (boot status $status)"
  check "custom CPU template" "$([ "$(has "$plain" lahf_lm)" = yes ] && [ -n "$c" ] && [ "$(has "$c" lahf_lm)" = no ]; echo $?)" \
    "lahf_lm without a template: $(has "$plain" lahf_lm); under one hiding it: $(has "$c" lahf_lm)"
}
# The checks of a script of their own (VMMs of its own through the API; each of its checks
# is one here): script, its work subdirectory.
script_checks() {
  local out verdict rest name
  out=$(EXITLESS="$exitless" TIMEOUT="$timeout" WORK="$work/$2" bash "$here/scripts/$1" "$kernel" 2>&1) || true
  while read -r verdict rest; do
    name=${rest%%: *}
    check "$name" "$([ "$verdict" = PASS ]; echo $?)" "${rest#*: }"
  done < <(echo "$out" | grep -E '^(PASS|FAIL) ')
  echo "$out" | grep -q '^PASS \|^FAIL ' || check "$2 (scripts/$1)" 1 "$(echo "$out" | grep FAILED | tail -n 1)"
}
# Huge pages, virtio-mem and VMGenID across snapshots: scripts/linux-snapshots.sh.
snapshot_checks() { script_checks linux-snapshots.sh snapshots; }
if [ -n "$snapshots_only" ]; then
  say "kernel $kernel; snapshots (timeout $timeout s per boot)"
  snapshot_checks
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit
fi
if [ -n "$cpu_templates_only" ]; then
  say "kernel $kernel; CPU templates (timeout $timeout s)"
  echo '{"latest": {"meta-data": {"instance-id": "i-linux-check"}}}' > "$work/metadata.json"
  cpu_template_checks
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit
fi

say "kernel $kernel; booting (timeout $timeout s)"
echo '{"latest": {"meta-data": {"instance-id": "i-linux-check"}}}' > "$work/metadata.json"
# The host's side of the guest's vsock connection to port 5000: echoes what it reads.
rm -f "$work/full.vsock_5000"
python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); s.settimeout(float(sys.argv[2]))
c, _ = s.accept()
while d := c.recv(65536): c.sendall(d)' "$work/full.vsock_5000" "$timeout" &
vsock_echo=$!
boot full full
kill "$vsock_echo" 2>/dev/null || true; rm -f "$work/full.vsock_5000"
[ -n "$init_s" ] || { tail -n 5 full.log >&2; tail -n 5 full.err >&2; fail "boot: /init not reached within $timeout s (status $status)"; }
check "boot to /init" 0 "$init_s s with $vcpus vCPUs (whole run $boot_s s)"
check "SMP" "$([ "$(result cpus full.log)" = "$vcpus" ]; echo $?)" "$(result cpus full.log) of $vcpus vCPUs online"
check "virtio-blk read" "$([ "$(result vda-md5 full.log)" = "$read_md5" ]; echo $?)" \
  "md5 of /dev/vda $(result vda-md5 full.log), host $read_md5"
check "virtio-blk write" "$(grep -aq "$pattern" write.img; echo $?)" "conv=fsync pattern $([ "$(result vdb-write full.log)" = done ] && echo written || echo 'not written'), found in the file: $(grep -aq "$pattern" write.img && echo yes || echo no)"
check "virtio-net ping" "$([ "$(result ping full.log)" = ok ]; echo $?)" "$guest_ip -> $host_ip: $(result ping full.log)"
wait "$listener" 2>/dev/null || true
listener=
wait "$listener2" 2>/dev/null || true
listener2=
rx=$(cat rx.txt 2>/dev/null || true)
tx_s=$(result tx-seconds full.log)
sent_md5=$(while cat read.img; do :; done | head -c "$net_bytes" | md5sum | cut -d' ' -f1)
check "virtio-net TCP $net_mib MiB" "$([ "$rx" = "$net_bytes $sent_md5" ]; echo $?)" \
  "sent /dev/vda over and over (md5 $sent_md5) in ${tx_s:-?} s, the host received ${rx:-nothing}"
rx2=$(cat rx2.txt 2>/dev/null || true)
nic2_md5=$(head -c "$nic2_bytes" read.img | md5sum | cut -d' ' -f1)
check "a second NIC at once" "$([ "$rx2" = "$nic2_bytes $nic2_md5" ] && [ "$(result tx2 full.log)" = done ]; echo $?)" \
  "1 MiB over eth1 ($guest_ip2 -> $host_ip2, its own tap) beside the transfer on eth0: the host received ${rx2:-nothing} (md5 $nic2_md5 sent)"
if [ "$(result mode full.log)" = reboot-without-acpi ]; then
  check "reboot (no ACPI: no poweroff) ends the VMM with 0" "$([ "$status" = 0 ]; echo $?)" "status $status"
else
  check "poweroff ends the VMM with 0" "$([ "$status" = 0 ] && [ "$(result mode full.log)" = poweroff ]; echo $?)" "status $status"
fi
# The feature bits Linux negotiated, as its sysfs prints them (bit 0 first): CSUM (0),
# GUEST_CSUM (1), GUEST_TSO4 (7), HOST_TSO4 (11), MRG_RXBUF (15). The TCP transfer above
# ran with them.
nf=$(result net-features full.log)
check "virtio-net offloads" "$([ "${nf:0:1}${nf:1:1}${nf:7:1}${nf:11:1}${nf:15:1}" = 11111 ]; echo $?)" \
  "negotiated CSUM ${nf:0:1} GUEST_CSUM ${nf:1:1} GUEST_TSO4 ${nf:7:1} HOST_TSO4 ${nf:11:1} MRG_RXBUF ${nf:15:1}"
rng=$(result rng-bytes full.log)
check "virtio-rng" "$([ "$(result rng-current full.log)" = virtio_rng.0 ] && [ ${#rng} = 128 ] && [ "${rng:0:64}" != "${rng:64:64}" ]; echo $?)" \
  "current $(result rng-current full.log), 64 bytes from /dev/hwrng: ${rng:-none}"
check "virtio-vsock" "$([ "$(result vsock-bound full.log)" = 1 ] && [ "$(result vsock-echo full.log)" = ok ]; echo $?)" \
  "Linux's transport bound: $(result vsock-bound full.log); 64 KiB to the host's port 5000 and back: $(result vsock-echo full.log)"
check "MMDS V2" "$([ "$(result mmds-token-length full.log)" = 64 ] && [ "$(result mmds-value full.log)" = i-linux-check ] && [ "$(result mmds-no-token full.log)" = 401 ]; echo $?)" \
  "token of $(result mmds-token-length full.log) characters by PUT; instance-id with it: $(result mmds-value full.log); without: $(result mmds-no-token full.log)"
# Snapshot and restore, with a drive, a NIC and virtio-rng in use: scripts/linux-snapshot.sh
# (a VMM of its own through the API; its last lines say what the restored guest did).
snap=$(EXITLESS="$exitless" TIMEOUT="$timeout" WORK="$work/snapshot" bash "$here/scripts/linux-snapshot.sh" "$kernel" 2>&1) \
  && snap_status=0 || snap_status=$?
check "snapshot/restore" "$([ "$snap_status" = 0 ]; echo $?)" \
  "$(echo "$snap" | grep -E 'snapshot/load|restored devices|FAILED' | tr -s ' ' | paste -sd ';' -)"
# The balloon, free page reporting and hinting: scripts/linux-memory.sh (VMMs of its own
# through the API, two boots; each of its checks is one here).
memory=$(EXITLESS="$exitless" TIMEOUT="$timeout" WORK="$work/memory" bash "$here/scripts/linux-memory.sh" "$kernel" 2>&1) || true
while read -r verdict rest; do
  name=${rest%%: *}
  check "$name" "$([ "$verdict" = PASS ]; echo $?)" "${rest#*: }"
done < <(echo "$memory" | grep -E '^(PASS|FAIL) ')
echo "$memory" | grep -q '^PASS \|^FAIL ' || check "memory (scripts/linux-memory.sh)" 1 "$(echo "$memory" | grep FAILED | tail -n 1)"
[ -f full.json ] && python3 - full.json <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
dev = r.get("devices", {})
cfg = {k: dev[k] for k in ("pci-cf8", "pci-ecam") if k in dev}
blk = r.get("drives", {}); net = r.get("net") or {}
print("exit profile: exits", r.get("exits"))
print("  config exits by mechanism:", cfg)
print("  ioeventfd kicks: net", net.get("kicks"), "blk", {k: v.get("kicks") for k, v in blk.items()},
      "; interrupts (MSI-X via irqfd): net", net.get("irqs"), "blk", {k: v.get("irqs") for k, v in blk.items()})
PY

snapshot_checks
# A guest forked into three clones (--ram-dir): scripts/linux-fork.sh.
script_checks linux-fork.sh fork
cpu_template_checks
boot reboot reboot
check "reboot ends the VMM with 0" "$([ "$status" = 0 ] && [ "$(result mode reboot.log)" = reboot ]; echo $?)" \
  "status $status, /init in ${init_s:-never} s"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
