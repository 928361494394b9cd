#!/usr/bin/env bash
# virtio-fs with virtiofsd, seen from a Linux guest (`scripts/linux-check.sh --fs` runs it):
#  1. over PCI (`exitless run --fs`, which starts virtiofsd itself) and 2. over virtio-mmio
#     (a configuration file's `fs` list, virtiofsd started here): the guest mounts the
#     share, reads a host file with the host's md5 (read() and mmap), creates, renames,
#     hard-links, mmap-writes, fsyncs and deletes files, which the host then finds so, and
#     finds the host's own creations, renames, links and deletions;
#  3. a guest whose root is the share (rootfstype=virtiofs root=TAG, no initramfs) reaches
#     /init;
#  4. virtiofsd killed while the guest reads: the VMM says the device failed, once, and
#     the guest goes on to its end.
# Prints one PASS/FAIL line per check and a summary; exits non-zero on a failure.
#   scripts/linux-fs.sh [KERNEL]
# Env: EXITLESS (binary), TIMEOUT (s per boot, 300), WORK (default /tmp/exitless-linux-fs),
# STEPS (which boots, default "pci mmio root kill").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
timeout=${TIMEOUT:-300}
steps=" ${STEPS:-pci mmio root kill} "
step() { [[ $steps == *" $1 "* ]]; }
work=${WORK:-/tmp/exitless-linux-fs}
marker="LINUX-FS: /init reached"
. "$here/scripts/linux-lib.sh"
harness linux-fs LINUX-FS-RESULT

[ -x "$exitless" ] || fail "setup: no exitless binary at $exitless (cargo build --release)"
virtiofsd=$("$here/scripts/virtiofsd.sh") || fail "setup: scripts/virtiofsd.sh"
export EXITLESS_VIRTIOFSD=$virtiofsd
kernel=${1:-}
[ -n "$kernel" ] || kernel=$("$here/scripts/guest-kernel.sh") || fail "kernel (scripts/guest-kernel.sh)"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
. "$here/scripts/guest-busybox.sh"
fetch_busybox
cc -static -Os -o fs-mmap "$here/scripts/fs-mmap.c" || fail "building fs-mmap"

# The guest's checks: results as LINUX-FS-RESULT lines; the host acts between its two halves.
cat > init <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
echo "$marker"
r() { echo "LINUX-FS-RESULT \$1 \$2"; }
mode=\$(sed 's/.*fscheck=\([a-z]*\).*/\1/' /proc/cmdline)
mkdir -p /mnt
mount -t virtiofs share /mnt && r mount ok
if [ "\$mode" = kill ]; then
  # Reads until the host kills virtiofsd under them; the console goes on regardless.
  (while cat /mnt/host.bin >/dev/null; do :; done) &
  r io started
  for i in \$(seq 40); do echo "LINUX-FS-ALIVE \$i"; sleep 0.25; done
  r end reached
  # No sync first (-n): a sync waits for the dead backend forever.
  poweroff -n -f
fi
r host-md5 \$(md5sum /mnt/host.bin | cut -d' ' -f1)
r host-mmap-md5 \$(/bin/fs-mmap read /mnt/host.bin | md5sum | cut -d' ' -f1)
echo guest-data > /mnt/g-new && mv /mnt/g-new /mnt/g-renamed && ln /mnt/g-renamed /mnt/g-link && r nlink \$(stat -c %h /mnt/g-renamed)
/bin/fs-mmap write /mnt/g-mmap 100000 && r mmap-write ok
dd if=/dev/urandom of=/mnt/g-fsync bs=4096 count=16 conv=fsync 2>/dev/null && r fsync-md5 \$(md5sum /mnt/g-fsync | cut -d' ' -f1)
echo doomed > /mnt/g-deleted && rm /mnt/g-deleted && [ ! -e /mnt/g-deleted ] && r delete ok
sync
r guest-done 1
# The host's turn: it says so by creating host-done.
i=0; while [ ! -e /mnt/host-done ] && [ \$i -lt 1200 ]; do sleep 0.1; i=\$((i + 1)); done
r host-new "\$(cat /mnt/host-new 2>/dev/null)"
[ -e /mnt/host-moved ] && [ ! -e /mnt/host-tomove ] && r host-rename ok
[ ! -e /mnt/host-del ] && r host-delete ok
r host-nlink \$(stat -c %h /mnt/host-moved)
umount /mnt && r umount ok
poweroff -f
EOF
python3 "$here/scripts/make-initramfs.py" initrd.cpio pkg/bin/busybox init bin/fs-mmap=fs-mmap \
  || fail "initramfs: writing the cpio archive"
cmdline="console=ttyS0 reboot=k panic=-1 nokaslr"

share_fill() { # dir: a fresh share with the host's files
  rm -rf "$1" && mkdir -p "$1"
  head -c $((4 << 20)) /dev/urandom > "$1/host.bin"
  echo move-me > "$1/host-tomove"
  echo delete-me > "$1/host-del"
}
host_turn() { # log, share: once the guest is done, checks its files and makes the host's changes
  local log=$1 share=$2 i
  for i in $(seq $((timeout * 10))); do
    grep -aq "^LINUX-FS-RESULT guest-done" "$log" && break
    kill -0 "$vmm" 2>/dev/null || return 0
    sleep 0.1
  done
  host_nlink=$(stat -c %h "$share/g-renamed" 2>/dev/null || echo none)
  host_renamed=$(cat "$share/g-renamed" 2>/dev/null || true)
  host_new_gone=$([ ! -e "$share/g-new" ] && [ ! -e "$share/g-deleted" ] && echo yes || echo no)
  host_mmap_md5=$(md5sum < "$share/g-mmap" | cut -d' ' -f1)
  host_fsync_md5=$(md5sum < "$share/g-fsync" | cut -d' ' -f1)
  echo "made on the host" > "$share/host-new"
  mv "$share/host-tomove" "$share/host-moved"
  ln "$share/host-moved" "$share/host-moved-link"
  rm "$share/host-del"
  touch "$share/host-done"
}
want_mmap=$(python3 -c "
import hashlib; s = b''.join(b'exitless-mmap-%d\n' % n for n in range(20000))[:100000]; print(hashlib.md5(s).hexdigest())")
share_checks() { # transport, log, share
  local t=$1 log=$2 share=$3 host_md5
  host_md5=$(md5sum < "$share/host.bin" | cut -d' ' -f1)
  check "$t: mounted" "$([ "$(result mount "$log")" = ok ]; echo $?)" "mount -t virtiofs share /mnt"
  check "$t: host file read" "$([ "$(result host-md5 "$log")" = "$host_md5" ]; echo $?)" \
    "guest md5 $(result host-md5 "$log"), host $host_md5"
  check "$t: host file mmap-read" "$([ "$(result host-mmap-md5 "$log")" = "$host_md5" ]; echo $?)" \
    "guest md5 through mmap $(result host-mmap-md5 "$log")"
  check "$t: create, rename, hard link" "$([ "$host_renamed" = guest-data ] && [ "$host_nlink" = 2 ] && [ "$(result nlink "$log")" = 2 ]; echo $?)" \
    "host reads '$host_renamed' with $host_nlink links (guest saw $(result nlink "$log"))"
  check "$t: mmap write" "$([ "$(result mmap-write "$log")" = ok ] && [ "$host_mmap_md5" = "$want_mmap" ]; echo $?)" \
    "host md5 $host_mmap_md5, written $want_mmap"
  check "$t: fsync" "$([ -n "$host_fsync_md5" ] && [ "$(result fsync-md5 "$log")" = "$host_fsync_md5" ]; echo $?)" \
    "guest $(result fsync-md5 "$log"), host $host_fsync_md5"
  check "$t: delete" "$([ "$(result delete "$log")" = ok ] && [ "$host_new_gone" = yes ]; echo $?)" "gone on both sides"
  check "$t: host's changes seen" "$([ "$(result host-new "$log")" = "made on the host" ] && [ "$(result host-rename "$log")" = ok ] \
    && [ "$(result host-delete "$log")" = ok ] && [ "$(result host-nlink "$log")" = 2 ]; echo $?)" \
    "new '$(result host-new "$log")', rename $(result host-rename "$log"), delete $(result host-delete "$log"), links $(result host-nlink "$log")"
  check "$t: unmounted, guest ended" "$([ "$(result umount "$log")" = ok ] && [ "$status" = 0 ]; echo $?)" "exit status $status"
}
wait_vmm() { status=0; wait "$vmm" || status=$?; }
virtiofsd_start() { # share, socket: sets vfsd
  rm -f "$2"
  "$virtiofsd" --shared-dir "$1" --socket-path "$2" --log-level error & vfsd=$!
  pids+=("$vfsd")
  for _ in $(seq 100); do [ -S "$2" ] && break; sleep 0.05; done
}
fs_config() { # socket, file, kernel words, initrd or "": a configuration file with one fs device
  local initrd=
  [ -n "$4" ] && initrd="\"initrd_path\": \"$4\","
  cat > "$2" <<JSON
{"boot-source": {"kernel_image_path": "$kernel", $initrd "boot_args": "$cmdline $3"},
 "machine-config": {"vcpu_count": 2, "mem_size_mib": 256},
 "fs": [{"fs_id": "share0", "tag": "share", "socket": "$1"}]}
JSON
}

say "kernel $kernel; virtiofsd $virtiofsd"
# 1. PCI: exitless run --fs starts virtiofsd.
if step pci; then
share_fill "$work/share-pci"
timeout "$timeout" "$exitless" run --kernel "$kernel" --initrd initrd.cpio --mem 256M --vcpus 2 \
  --cmdline "$cmdline fscheck=full" --fs tag=share,dir="$work/share-pci" </dev/null >pci.log 2>pci.err & vmm=$!
pids+=("$vmm")
host_turn pci.log "$work/share-pci"
wait_vmm
share_checks pci pci.log "$work/share-pci"
fi

# 2. virtio-mmio (Firecracker's process, no --enable-pci), from a configuration file,
# virtiofsd started here.
if step mmio; then
share_fill "$work/share-mmio"
virtiofsd_start "$work/share-mmio" "$work/mmio.sock"
fs_config "$work/mmio.sock" mmio.json "fscheck=full" "$work/initrd.cpio"
timeout "$timeout" "$exitless" --no-api --config-file mmio.json </dev/null >mmio.log 2>mmio.err & vmm=$!
pids+=("$vmm")
host_turn mmio.log "$work/share-mmio"
wait_vmm
share_checks mmio mmio.log "$work/share-mmio"
fi

# 3. The root on virtio-fs: the share holds busybox and an /init, no initramfs.
if step root; then
root=$work/rootfs
rm -rf "$root" && mkdir -p "$root"/{bin,dev,proc,sys,tmp}
cp pkg/bin/busybox "$root/bin/busybox"
printf '#!/bin/busybox sh\n/bin/busybox --install -s /bin\nmount -t proc proc /proc\necho "LINUX-FS-ROOT on $(grep " / " /proc/mounts | cut -d" " -f1,3)"\npoweroff -f\n' > "$root/init"
chmod +x "$root/init"
timeout "$timeout" "$exitless" run --kernel "$kernel" --mem 256M --vcpus 2 \
  --cmdline "$cmdline rootfstype=virtiofs root=rootfs init=/init rw" --fs tag=rootfs,dir="$root" </dev/null >root.log 2>root.err & vmm=$!
pids+=("$vmm")
wait_vmm
seen=$(grep -a "^LINUX-FS-ROOT on" root.log | tr -d '\r' | tail -n 1)
check "root on virtio-fs" "$([ "$seen" = "LINUX-FS-ROOT on rootfs virtiofs" ] && [ "$status" = 0 ]; echo $?)" \
  "/init says '${seen:-nothing}', exit status $status"
fi

# 4. virtiofsd killed under the guest's reads (over PCI, from a configuration file).
if step kill; then
share_fill "$work/share-kill"
virtiofsd_start "$work/share-kill" "$work/kill.sock"
fs_config "$work/kill.sock" kill.json "fscheck=kill" "$work/initrd.cpio"
timeout "$timeout" "$exitless" --no-api --enable-pci --config-file kill.json </dev/null >kill.log 2>kill.err & vmm=$!
pids+=("$vmm")
for _ in $(seq $((timeout * 10))); do
  grep -aq "^LINUX-FS-RESULT io started" kill.log && break
  kill -0 "$vmm" 2>/dev/null || break
  sleep 0.1
done
kill -9 "$vfsd" 2>/dev/null || true
alive_at_kill=$(grep -ac "^LINUX-FS-ALIVE" kill.log || true)
wait_vmm
failures=$(cat kill.log kill.err | grep -ac "virtio-fs0: the vhost-user backend failed" || true)
check "backend killed mid-I/O" "$([ "$(result end kill.log)" = reached ] && [ "$alive_at_kill" -lt 40 ] && [ "$failures" = 1 ] && [ "$status" = 0 ]; echo $?)" \
  "killed after $alive_at_kill of 40 console lines; the guest reached its end: $(result end kill.log); failure logged $failures time(s): $(cat kill.log kill.err | grep -a "backend failed" | head -n 1 | cut -c1-160); exit status $status"
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
