#!/usr/bin/env bash
# Counts how often a freshly exec'd busybox dies on its first thread-local access in a Linux
# guest on this host (docs/linux.md, "the TLS segfault"): a reproducer for the host's KVM,
# not a check of exitless. The guest's /init runs two loops of short-lived processes (a
# two-process pipeline and one `expr`) for SECS seconds, counts those that died of SIGSEGV
# (status 139) and the kernel's `segfault at` lines, and powers off.
#   scripts/host-exec-crash.sh [KERNEL]
# Env: EXITLESS (binary, default target/x86_64-unknown-linux-gnu/release/exitless), VCPUS (1),
# SECS (180), EXTRA (more kernel arguments), EXITLESS_FLAGS (more `exitless run` flags),
# WORK (default /tmp/exitless-exec-crash). Prints one line: runs, crashed, segfault lines.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
secs=${SECS:-180}
work=${WORK:-/tmp/exitless-exec-crash}
say() { echo "host-exec-crash: $*" >&2; }
fail() { say "FAILED at step $1"; exit 1; }
[ -x "$exitless" ] || fail "setup: no exitless binary at $exitless (cargo build --release)"
kernel=${1:-$("$here/scripts/guest-kernel.sh")} || fail "kernel (scripts/guest-kernel.sh)"
mkdir -p "$work" && cd "$work"
. "$here/scripts/guest-busybox.sh"
fetch_busybox
cat > init <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t devtmpfs dev /dev 2>/dev/null
secs=$(sed -n 's/.*exec_crash_seconds=\([0-9]*\).*/\1/p' /proc/cmdline)
loop() {
  end=$(($(date +%s) + secs)); n=0; c=0
  while [ $(date +%s) -lt $end ]; do
    echo x | cat >/dev/null; [ $? = 139 ] && c=$((c + 1))
    expr 1 + 1 >/dev/null; [ $? = 139 ] && c=$((c + 1))
    n=$((n + 2))
  done
  echo "EXEC-CRASH loop runs $n crashed $c"
}
loop & loop & wait
echo "EXEC-CRASH segfault-lines $(dmesg | grep -c 'segfault at')"
poweroff -f
EOF
python3 "$here/scripts/make-initramfs.py" initrd.cpio pkg/bin/busybox init || fail "initramfs"
"$exitless" run --kernel "$kernel" --initrd initrd.cpio --mem 256M --vcpus "${VCPUS:-1}" \
  --cmdline "console=ttyS0 reboot=k panic=-1 nokaslr exec_crash_seconds=$secs ${EXTRA:-}" \
  --timeout $((secs + 600)) ${EXITLESS_FLAGS:-} </dev/null > guest.log 2> vmm.err || fail "the guest run (see $work/vmm.err)"
tr -d '\r' < guest.log | awk '
  /^EXEC-CRASH loop/ { runs += $4; crashed += $6 }
  /^EXEC-CRASH segfault-lines/ { lines = $3 }
  END { if (runs == 0) exit 1; printf "host-exec-crash: %d processes, %d died of SIGSEGV (%.1f%%), %d segfault lines in the kernel log\n", runs, crashed, 100 * crashed / runs, lines }' \
  || fail "no result on the console (see $work/guest.log)"
