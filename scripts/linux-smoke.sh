#!/usr/bin/env bash
# Boots a stock Debian kernel with a tiny busybox initramfs under exitless (2 vCPUs) and, if
# installed, under QEMU with the same kernel and initrd; prints how far each got and the time.
#   scripts/linux-smoke.sh [KERNEL [INITRD]]
# With no arguments it fetches Debian's linux-image-cloud-amd64 and busybox-static packages
# (apt-get download) into $WORK (default: /tmp/exitless-linux). Takes minutes on a nested host,
# where KVM emulates every guest CPL0 instruction. Env: TIMEOUT (s, default 1800), VCPUS (2),
# EXITLESS (the binary, default target/x86_64-unknown-linux-gnu/release/exitless), EXTRA (more kernel arguments).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/exitless-linux}
timeout=${TIMEOUT:-1800}
vcpus=${VCPUS:-2}
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
marker="EXITLESS-SMOKE: /init reached"
mkdir -p "$work"
cd "$work"

kernel=${1:-}
initrd=${2:-}
if [ -z "$kernel" ]; then
  if ! ls linux-image-*-cloud-amd64_*.deb >/dev/null 2>&1; then
    echo "fetching Debian's cloud kernel and busybox-static..." >&2
    apt-get download linux-image-cloud-amd64 busybox-static >/dev/null
    dep=$(dpkg-deb -f linux-image-cloud-amd64_*.deb Depends | sed 's/ .*//; s/,.*//')
    apt-get download "$dep" >/dev/null
  fi
  rm -rf pkg && mkdir pkg
  for deb in linux-image-[0-9]*-cloud-amd64_*.deb busybox-static_*.deb; do dpkg-deb -x "$deb" pkg; done
  kernel=$(ls "$work"/pkg/boot/vmlinuz-*)
fi
if [ -z "$initrd" ]; then
  initrd=$work/initrd.cpio
  [ -x pkg/bin/busybox ] || { rm -rf pkg && mkdir pkg && apt-get download busybox-static >/dev/null && dpkg-deb -x busybox-static_*.deb pkg; }
  # An uncompressed newc cpio (no decompression at emulated CPL0): /init prints the marker
  # and powers off.
  printf '#!/bin/busybox sh\n/bin/busybox echo %s\n/bin/busybox poweroff -f\n' "'$marker'" > init.sh
  python3 "$here/scripts/make-initramfs.py" "$initrd" pkg/bin/busybox init.sh
fi

# noxsave: this host's KVM shows XSAVE to guests whatever CPUID says, and cannot emulate
# xrstor at CPL0. clearcpuid: SSSE3, SSE4.1/4.2, AES-NI, PCLMULQDQ (feature numbers 137,
# 147, 148, 153, 129), for the same reason: the kernel's BLAKE2s self-test in SSSE3 is
# hundreds of thousands of instructions KVM cannot emulate, each completed by the VMM at
# the cost of an exit (minutes), where the plain C code takes seconds.
# rodata=off: marking the kernel read-only runs the W+X page-table walk and the rodata
# self-test, which take tens of minutes where every CPL0 instruction is emulated.
# initcall_blacklist=ftrace_check_for_weak_functions: a workqueue that looks up each of
# ~38,000 ftrace records in kallsyms, which the boot then waits for (found with
# --sample-guest; docs/linux.md); it only prunes weak-function records.
cmdline="console=ttyS0 reboot=k panic=-1 noxsave clearcpuid=137,147,148,153,129 rodata=off nokaslr initcall_blacklist=ftrace_check_for_weak_functions ${EXTRA:-}"
verdict() { # log, seconds
  if grep -q "$marker" "$1"; then echo "reached /init ($marker) in $2 s"
  else echo "did not reach /init in $2 s; last kernel line: $(grep -a -v '^\s*$' "$1" | grep -av 'exit profile' | tail -n 1)"; fi
}

echo "kernel: $kernel"; echo "initrd: $initrd ($(stat -c %s "$initrd") bytes)"; echo "cmdline: $cmdline"
start=$(date +%s.%N)
set +e
# exitless's own --timeout, so the exit profile (exitless.json) is written even then.
timeout $((timeout + 60)) "$exitless" run --kernel "$kernel" --initrd "$initrd" --mem 512M --vcpus "$vcpus" \
  --cmdline "$cmdline" --timeout "$timeout" --json exitless.json </dev/null >exitless.log 2>exitless.err
status=$?
set -e
t=$(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)")
echo "exitless (status $status): $(verdict exitless.log "$t")"
grep -a "emulate\|KVM could not" exitless.err | head -n 3 || true

if command -v qemu-system-x86_64 >/dev/null; then
  start=$(date +%s.%N)
  # QEMU pauses a VM on a KVM internal error rather than exiting: watch for it.
  timeout "$timeout" qemu-system-x86_64 -machine q35,accel=kvm -cpu qemu64,-cx16 -m 512M -smp "$vcpus" \
    -bios /usr/share/qemu/qboot.rom -nodefaults -no-reboot -display none -serial stdio \
    -kernel "$kernel" -initrd "$initrd" -append "$cmdline" </dev/null >qemu.log 2>qemu.err &
  qemu=$!
  while kill -0 "$qemu" 2>/dev/null; do
    if grep -q "KVM internal error" qemu.err; then kill "$qemu"; fi
    sleep 1
  done
  set +e
  wait "$qemu"
  status=$?
  set -e
  t=$(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)")
  echo "qemu (status $status): $(verdict qemu.log "$t")"
  grep -a "emulation failure\|KVM internal error" qemu.err | head -n 1 || true
else
  echo "qemu: not installed (apt-get install qemu-system-x86 to compare)"
fi
