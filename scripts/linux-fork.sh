#!/usr/bin/env bash
# A Linux guest forked into three clones, as a sandbox fleet does it (issue #57): the
# parent runs with its RAM in a file (`--ram-dir` on /dev/shm, the snapshot's files beside
# it: the fast path, no memory written), is paused, snapshotted once and resumed; three
# new VMMs each `PUT /snapshot/load` that snapshot with `network_overrides` to a tap of
# their own (each in a network namespace of its own, where the host end has the address
# the guest pinged before the fork) and their own MMDS contents. Each clone reads 16 bytes
# of /dev/urandom (all three differ: a new VMGenID generation at each load reseeds Linux),
# reads its own MMDS instance id (V2: a token by PUT, then wget from 169.254.169.254) and
# pings the host over its own tap (the host end counts the echo requests it saw); the
# parent, resumed, answers the same on its own tap and MMDS while the clones run.
#   scripts/linux-fork.sh [KERNEL]   (also scripts/linux-check.sh --fork)
# Prints one PASS/FAIL line and exits non-zero on failure. Needs root (namespaces, taps),
# busybox-static (apt-get download), python3 and curl.
# Env: EXITLESS, TIMEOUT (s per boot, 600), WORK (default /tmp/exitless-linux-fork).
# Not in CI: the boot takes a minute or more here.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
timeout=${TIMEOUT:-600}
work=${WORK:-/tmp/exitless-linux-fork}
ram=/dev/shm/exitless-linux-fork-$$
host_ip=192.0.2.1
guest_ip=192.0.2.2
# The host ends share one MAC: the guest's ARP entry from before the fork holds in every clone.
host_mac=02:fc:00:00:00:01
say() { echo "linux-fork: $*" >&2; }
fail() { say "FAILED at step $1"; echo "FAIL fork into three clones: $1"; exit 1; }
pids=()
names=(parent clone1 clone2 clone3)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for n in "${names[@]}"; do ip netns del "exfork-$n-$$" 2>/dev/null || true; done
  rm -rf "$ram"
}
trap cleanup EXIT
[ -x "$exitless" ] || fail "setup: no exitless binary at $exitless (cargo build --release)"
[ "$(id -u)" = 0 ] || fail "setup: root is needed for the namespaces and taps"
mkdir -p "$work" "$ram" && cd "$work"
rm -f ./*.sock ./*.fifo ./*.out ./*.err

kernel=${1:-}
[ -n "$kernel" ] || kernel=$("$here/scripts/guest-kernel.sh") || fail "kernel (scripts/guest-kernel.sh)"
. "$here/scripts/guest-busybox.sh"
fetch_busybox
write_console_shell_init "LINUX-FORK: ready"
python3 "$here/scripts/make-initramfs.py" initrd.cpio pkg/bin/busybox init || fail "initramfs"

. "$here/scripts/linux-lib.sh"
# What the guest echoed as "<tag> <words>", the last one (carriage returns dropped).
said() { grep -a "^$2 " "$1.out" | tr -d '\r' | tail -n 1 | cut -d' ' -f2-; }
tap_of() { echo "exf${1: -1}$(($$ % 10000))"; }
netns() { echo "exfork-$1-$$"; }
# name: a network namespace with a tap whose host end is $host_ip (and $host_mac), a VMM
# in it with its console on a FIFO the script writes
vmm() {
  local name=$1 ns tap
  ns=$(netns "$name"); tap=$(tap_of "$name")
  ip netns add "$ns" || fail "$name: ip netns add"
  ip netns exec "$ns" ip tuntap add dev "$tap" mode tap || fail "$name: tap"
  ip netns exec "$ns" ip link set "$tap" address "$host_mac"
  ip netns exec "$ns" ip addr add "$host_ip/24" dev "$tap"
  ip netns exec "$ns" ip link set "$tap" up
  rm -f "$name.fifo" "$name.sock"
  mkfifo "$name.fifo"
  ip netns exec "$ns" "$exitless" --api-sock "$name.sock" --id "linux-fork-$name" "${@:2}" \
    <"$name.fifo" >"$name.out" 2>"$name.err" &
  pids+=("$!")
  eval "pid_$name=$!"
  exec {fd}>"$name.fifo"
  eval "console_$name=$fd"
  local i=0
  until [ -S "$name.sock" ]; do i=$((i + 1)); [ "$i" -gt 100 ] && fail "$name: no API socket"; sleep 0.05; done
}
run() { # name, tag, command, seconds: runs the command in the guest, then waits for its "<tag>-42"
  local fd_var="console_$1"
  echo "$3; echo $2-\$((6 * 7))" >&"${!fd_var}"
  wait_for "$1.out" "$2-42" "$4" || fail "$1: '$3' did not finish within $4 s ($(tail -c 300 "$1.out"))"
}
mmds() { # name: its own MMDS contents
  [ "$(api "$1.sock" PUT /mmds "{\"latest\": {\"meta-data\": {\"instance-id\": \"i-$1\"}}}")" = 204 ] \
    || fail "$1: PUT /mmds ($(cat answer))"
}
echoes() { # name: the echo requests its tap's host end received
  ip netns exec "$(netns "$1")" cat "/sys/class/net/$(tap_of "$1")/statistics/rx_packets"
}
# In the guest: 16 random bytes, its MMDS instance id (V2; busybox sometimes loses a process
# to a SIGSEGV on its first TLS access on this host, docs/linux.md: each step is retried),
# three pings to the host over its tap.
identity='dd if=/dev/urandom of=/tmp/r bs=16 count=1 2>/dev/null; echo bytes $(od -An -tx1 /tmp/r | tr -d " ");
for i in 1 2 3 4 5; do tok=$(printf "PUT /latest/api/token HTTP/1.0\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n" | nc 169.254.169.254 80 | tail -n 1); [ ${#tok} = 64 ] && break; done;
for i in 1 2 3 4 5; do id=$(wget -q -O - --header "X-metadata-token: $tok" http://169.254.169.254/latest/meta-data/instance-id) && break; done; echo mmds $id;
n=0; for i in 1 2 3 4 5; do ping -c 1 -W 2 '"$host_ip"' >/dev/null 2>&1 && n=$((n + 1)); done; echo ping $n'

say "parent: boot (--ram-dir $ram)"
vmm parent --ram-dir "$ram"
[ "$(api parent.sock PUT /machine-config '{"vcpu_count": 1, "mem_size_mib": 256}')" = 204 ] || fail "parent: machine-config ($(cat answer))"
[ "$(api parent.sock PUT /boot-source "{\"kernel_image_path\": \"$kernel\", \"initrd_path\": \"$work/initrd.cpio\", \"boot_args\": \"console=ttyS0 reboot=k panic=-1 nokaslr\"}")" = 204 ] \
  || fail "parent: boot-source ($(cat answer))"
[ "$(api parent.sock PUT /network-interfaces/eth0 "{\"iface_id\": \"eth0\", \"host_dev_name\": \"$(tap_of parent)\", \"guest_mac\": \"06:00:c0:00:02:02\"}")" = 204 ] \
  || fail "parent: network-interfaces ($(cat answer))"
[ "$(api parent.sock PUT /mmds/config '{"version": "V2", "network_interfaces": ["eth0"]}')" = 204 ] || fail "parent: mmds/config ($(cat answer))"
mmds parent
[ "$(api parent.sock PUT /actions '{"action_type": "InstanceStart"}')" = 204 ] || fail "parent: InstanceStart ($(cat answer))"
wait_for parent.out "LINUX-FORK: ready" "$timeout" || fail "parent: not ready within $timeout s ($(tail -c 300 parent.out))"
run parent net "ip link set lo up; ip link set eth0 up; ip addr add $guest_ip/24 dev eth0; ip route add 169.254.169.254 dev eth0; ping -c 1 -W 5 $host_ip >/dev/null 2>&1; echo net up" 120
run parent before "$identity" 180

say "parent: fork"
[ "$(api parent.sock PATCH /vm '{"state": "Paused"}')" = 204 ] || fail "parent: pause ($(cat answer))"
wchar() { sed -n 's/^wchar: //p' "/proc/$pid_parent/io"; }
wrote=$(wchar)
[ "$(api parent.sock PUT /snapshot/create "{\"snapshot_path\": \"$ram/fork.state\", \"mem_file_path\": \"$ram/fork.mem\"}")" = 204 ] \
  || fail "parent: snapshot/create ($(cat answer))"
[ "$(api parent.sock PATCH /vm '{"state": "Resumed"}')" = 204 ] || fail "parent: resume ($(cat answer))"
wrote=$(($(wchar) - wrote))

for clone in clone1 clone2 clone3; do
  say "$clone: load"
  vmm "$clone"
  overrides="[{\"iface_id\": \"eth0\", \"host_dev_name\": \"$(tap_of "$clone")\"}]"
  [ "$(api "$clone.sock" PUT /snapshot/load "{\"snapshot_path\": \"$ram/fork.state\", \"mem_backend\": {\"backend_type\": \"File\", \"backend_path\": \"$ram/fork.mem\"}, \"network_overrides\": $overrides, \"resume_vm\": true}")" = 204 ] \
    || fail "$clone: snapshot/load ($(cat answer))"
  mmds "$clone"
  [ "$(api "$clone.sock" GET /)" = 200 ] && grep -q "\"linux-fork-$clone\"" answer || fail "$clone: its instance info ($(cat answer))"
done
for clone in clone1 clone2 clone3; do
  run "$clone" after "$identity" 300
done
run parent after "$identity" 300

bad=
evidence=
declare -A seen
for n in "${names[@]}"; do
  bytes=$(said "$n" bytes); id=$(said "$n" mmds); pings=$(said "$n" ping); rx=$(echoes "$n")
  evidence+="$n: urandom ${bytes:0:12}.., mmds ${id:-none}, ${pings:-0}/5 pings, its tap saw $rx frames; "
  [ ${#bytes} = 32 ] || bad+="$n read no bytes; "
  [ -z "${seen[x$bytes]:-}" ] || bad+="$n read the bytes ${seen[x$bytes]} read; "
  seen[x$bytes]=$n
  [ "$id" = "i-$n" ] || bad+="$n read MMDS instance id '$id'; "
  [ "${pings:-0}" -ge 3 ] && [ "$rx" -ge 3 ] || bad+="$n: ${pings:-0} pings answered, $rx frames on its tap; "
done
before=$(grep -a '^bytes ' parent.out | tr -d '\r' | head -n 1 | cut -d' ' -f2)
[ "$before" != "$(said parent bytes)" ] || bad+="the parent read the same bytes before and after the fork; "
forks=$(cat clone1.out clone2.out clone3.out | grep -ac 'crng reseeded due to virtual machine fork' || true)
[ "$forks" = 3 ] || bad+="Linux said it reseeded for a fork in $forks of 3 clones; "
[ "$wrote" -lt $((16 << 20)) ] || bad+="the create wrote $wrote bytes: the RAM file was copied, not taken; "
evidence+="'crng reseeded due to virtual machine fork' in $forks of 3 clones; the parent's create wrote $wrote bytes in all (--ram-dir: its 256 MiB RAM file taken, not copied)"
if [ -z "$bad" ]; then
  echo "PASS fork into three clones: $evidence"
else
  echo "FAIL fork into three clones: $bad($evidence)"
  exit 1
fi
