# Sourced by the Linux check scripts (linux-check, linux-snapshot, linux-memory): Debian's
# busybox-static unpacked into ./pkg, once; the caller's `fail` reports a failure.
fetch_busybox() {
  [ -x pkg/bin/busybox ] && return 0
  rm -rf pkg && mkdir pkg
  apt-get download busybox-static >/dev/null 2>&1 || fail "initramfs: apt-get download busybox-static"
  dpkg-deb -x busybox-static_*.deb pkg || fail "initramfs: unpacking busybox-static"
}
