# Sourced by the Linux check scripts (linux-check, linux-snapshot, linux-memory): Debian's
# busybox-static unpacked into ./pkg, once, and the /init of a shell on the console; the
# caller's `fail` reports a failure.
fetch_busybox() {
  [ -x pkg/bin/busybox ] && return 0
  rm -rf pkg && mkdir pkg
  apt-get download busybox-static >/dev/null 2>&1 || fail "initramfs: apt-get download busybox-static"
  dpkg-deb -x busybox-static_*.deb pkg || fail "initramfs: unpacking busybox-static"
}

# ./init: says "$1" once the shell is up, then runs each line typed on the console.
write_console_shell_init() {
  cat > init <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t devtmpfs dev /dev
echo "$1"
while read -r line; do eval "\$line"; done
EOF
}
