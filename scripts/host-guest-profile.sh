#!/usr/bin/env bash
# Where a running guest's emulated CPL0 time goes, on a host whose KVM emulates guest
# CPL0 (kvm_pvm, docs/linux.md): the host's kvm_emulate_insn tracepoint records every
# instruction KVM emulates for the VMM's vCPU threads, with the guest's RIP; the guest
# kernel's System.map names them.
#   scripts/host-guest-profile.sh PID [SECONDS] [SYSTEM_MAP]
# PID: an exitless process; SECONDS: how long to record (5); SYSTEM_MAP: the guest
# kernel's (default: scripts/guest-kernel.sh's build). Prints how many instructions were
# emulated in that time and the busiest guest functions. Needs root (tracefs). The tracing itself slows
# the guest: the shares are what to read, not the rate.
set -euo pipefail
pid=${1:?usage: $0 PID [SECONDS] [SYSTEM_MAP]}
secs=${2:-5}
map=${3:-$(ls -d "${EXITLESS_CACHE:-$HOME/.cache/exitless}"/guest-kernel/build-*/System.map 2>/dev/null | grep -v firecracker | tail -1)}
[ -r "$map" ] || { echo "host-guest-profile: no System.map (give one)" >&2; exit 2; }
[ -d "/proc/$pid" ] || { echo "host-guest-profile: no process $pid" >&2; exit 2; }
t=/sys/kernel/tracing
[ -d "$t/events/kvm" ] || mount -t tracefs nodev "$t" 2> /dev/null || true
[ -r "$t/events/kvm/kvm_emulate_insn/enable" ] || { echo "host-guest-profile: this kernel has no kvm_emulate_insn tracepoint" >&2; exit 2; }
vcpus=$(for task in /proc/"$pid"/task/*; do case $(cat "$task/comm") in vcpu*) basename "$task" ;; esac; done)
[ -n "$vcpus" ] || { echo "host-guest-profile: process $pid has no vcpu threads" >&2; exit 2; }
rips=$(mktemp)
stop() {
  echo 0 > "$t/tracing_on"
  echo 0 > "$t/events/kvm/kvm_emulate_insn/enable"
  echo > "$t/set_event_pid"
}
trap 'stop; rm -f "$rips"' EXIT
echo 0 > "$t/tracing_on"
echo 131072 > "$t/buffer_size_kb"
echo > "$t/trace"
echo "$vcpus" > "$t/set_event_pid"
echo 1 > "$t/events/kvm/kvm_emulate_insn/enable"
echo 1 > "$t/tracing_on"
sleep "$secs"
stop
grep -ao 'kvm_emulate_insn: [0-9]*:[0-9a-f]*' "$t/trace" | awk -F: '{ print $3 }' > "$rips"
python3 - "$map" "$rips" "$secs" <<'EOF'
import bisect, collections, sys
names, addrs = [], []
for line in open(sys.argv[1]):
    fields = line.split()
    if len(fields) >= 3 and fields[1] in "tTwW":
        addrs.append(int(fields[0], 16))
        names.append(fields[2])
order = sorted(range(len(addrs)), key=addrs.__getitem__)
addrs = [addrs[i] for i in order]
names = [names[i] for i in order]
counts = collections.Counter()
for line in open(sys.argv[2]):
    i = bisect.bisect_right(addrs, int(line, 16)) - 1
    counts[names[i] if i >= 0 else "?"] += 1
total = sum(counts.values())
print(f"{total} instructions emulated in {sys.argv[3]} s (traced: slower than untraced)")
for name, n in counts.most_common(25):
    print(f"  {100 * n / max(total, 1):5.1f}%  {n:9}  {name}")
EOF
