#!/usr/bin/env bash
# firecracker-go-sdk's OWN test suite (its main branch, `go test ./...` as its Makefile and
# Buildkite "root tests" step run it) against exitless and, beside it, Firecracker; one line
# per test with each VMM's result, then the verdict issue #55 asks for.
#
#   scripts/gosdk-suite.sh [--no-firecracker] [--run REGEX] [--timeout 40m] [--table]
#   (--table: only the table, from the last run's logs)
#
# Env: GOSDK_DIR (the SDK checkout; cloned from GOSDK_GIT, default GitHub, if missing),
# EXITLESS_BIN / EXITLESS_JAILER (default: this tree's release build),
# FIRECRACKER_BIN / FIRECRACKER_JAILER (default: ~/.cache/exitless/peers/...),
# GUEST_KERNEL (default: scripts/guest-kernel.sh's cached vmlinux).
#
# Testdata: the SDK's Makefile downloads a kernel and root images from Firecracker's S3
# bucket; this host cannot reach it, so the equivalents are made here: the microVM kernel
# exitless's checks use, an ext4 root with Debian's busybox-static (its init applies the
# SDK's `ip=`, which this kernel leaves to user space), and the same with Debian's dropbear
# and a fresh key for root-drive-with-ssh.img/root-drive-ssh-key. CNI plugins are the
# versions the Makefile pins (tc-redirect-tap built from its repository: the proxy refuses
# that pseudo-version). Needs root, /dev/kvm, Go.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${XDG_CACHE_HOME:-$HOME/.cache}/exitless/gosdk
sdk=${GOSDK_DIR:-$cache/sdk}
go=$(command -v go || echo /usr/local/go/bin/go)
run_fc=auto
table_only=
run_re=.
timeout=40m
while [ $# -gt 0 ]; do
  case $1 in
    --no-firecracker) run_fc=no ;;
    --firecracker) run_fc=yes ;;
    --run) run_re=$2; shift ;;
    --timeout) timeout=$2; shift ;;
    --table) table_only=1 ;;
    *) echo "usage: $0 [--no-firecracker|--firecracker] [--run REGEX] [--timeout DUR] [--table]" >&2; exit 2 ;;
  esac
  shift
done
fail() { echo "gosdk-suite: $*" >&2; exit 1; }
if [ -z "$table_only" ]; then
[ "$(id -u)" = 0 ] || fail "needs root (the SDK's root tests, taps)"
[ -w /dev/kvm ] || fail "needs /dev/kvm"
"$go" version >/dev/null 2>&1 || fail "needs Go (go on PATH or /usr/local/go/bin/go)"

rel=$root/target/x86_64-unknown-linux-gnu/release
exitless_bin=${EXITLESS_BIN:-$rel/exitless}
exitless_jailer=${EXITLESS_JAILER:-$rel/exitless-jailer}
peers=${XDG_CACHE_HOME:-$HOME/.cache}/exitless/peers
fc_bin=${FIRECRACKER_BIN:-$peers/firecracker}
fc_jailer=${FIRECRACKER_JAILER:-$peers/src/firecracker/build/cargo_target/x86_64-unknown-linux-musl/release/jailer}
[ -x "$fc_jailer" ] || fc_jailer=$peers/src/firecracker/target/x86_64-unknown-linux-musl/release/jailer
kernel=${GUEST_KERNEL:-$(scripts/guest-kernel.sh)} || fail "no guest kernel (scripts/guest-kernel.sh)"
[ -x "$exitless_bin" ] && [ -x "$exitless_jailer" ] ||
  fail "build exitless first: cargo build --release -p exitless -p exitless-jailer"
[ -f "$kernel" ] || fail "no guest kernel: run scripts/guest-kernel.sh"
if [ $run_fc = auto ]; then [ -x "$fc_bin" ] && run_fc=yes || run_fc=no; fi
[ $run_fc = no ] || [ -x "$fc_bin" ] || fail "no Firecracker at $fc_bin"

mkdir -p "$cache"
if [ ! -d "$sdk/.git" ]; then
  git clone -q "${GOSDK_GIT:-https://github.com/firecracker-microvm/firecracker-go-sdk}" "$sdk" ||
    fail "cloning the SDK"
fi
echo "SDK: $(git -C "$sdk" log -1 --format='%h %cs %s')"

# Shared testdata, made once.
common=$cache/testdata
mkdir -p "$common/bin"
cmp -s "$kernel" "$common/vmlinux" || cp "$kernel" "$common/vmlinux"
# The images' recipe version: a changed recipe remakes them.
image_version=5
if [ "$(cat "$common/root-drive.version" 2>/dev/null)" != $image_version ]; then
  work=$(mktemp -d)
  (
    set -e
    cd "$work"
    apt-get download busybox-static dropbear-bin libtomcrypt1 libtommath1 >/dev/null 2>&1
    for deb in *.deb; do dpkg-deb -x "$deb" pkg; done
    mkdir -p rootfs/{bin,sbin,etc/init.d,proc,sys,dev,tmp,run,var/run,root}
    cp pkg/bin/busybox rootfs/bin/busybox
    # The root is mounted read-only: every applet's link is made here.
    for app in $(pkg/bin/busybox --list); do
      [ "$app" = busybox ] || ln -s /bin/busybox "rootfs/bin/$app"
    done
    ln -sf /bin/busybox rootfs/sbin/init
    # The guest kernel has no CONFIG_IP_PNP: the `ip=` the SDK puts on the command line
    # (client::gateway:netmask:host:device:...) is applied here, as the kernel would.
    cat > rootfs/etc/init.d/rcS <<'RCS'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
for d in /tmp /run /var/run; do mount -t tmpfs tmpfs $d; done
ifconfig lo 127.0.0.1 up
for arg in $(cat /proc/cmdline); do
  case $arg in
    ip=*)
      IFS=: read -r addr _ gw mask _ dev _ <<ARGS
${arg#ip=}
ARGS
      ifconfig "${dev:-eth0}" "$addr" netmask "${mask:-255.255.255.0}" up
      [ -z "$gw" ] || route add default gw "$gw"
      ;;
  esac
done
[ -x /usr/sbin/dropbear ] && /usr/sbin/dropbear -s -r /etc/dropbear/host_key
RCS
    chmod +x rootfs/etc/init.d/rcS
    printf '%s\n' '::sysinit:/etc/init.d/rcS' '::respawn:-/bin/sh' \
      '::ctrlaltdel:/bin/reboot' > rootfs/etc/inittab
    echo 'root:x:0:0:root:/root:/bin/sh' > rootfs/etc/passwd
    echo 'root:*:19000:0:99999:7:::' > rootfs/etc/shadow
    truncate -s 32M root.img
    mkfs.ext4 -q -F -d rootfs root.img
    # root-drive-with-ssh.img: the same with dropbear (Debian's, and the libraries it
    # links) letting in root-drive-ssh-key, as the SDK's Ubuntu image lets its key in.
    libs=$PWD/pkg/usr/lib/x86_64-linux-gnu
    mkdir -p rootfs/usr/sbin rootfs/lib/x86_64-linux-gnu rootfs/lib64 rootfs/etc/dropbear rootfs/root/.ssh
    cp pkg/usr/sbin/dropbear rootfs/usr/sbin/
    LD_LIBRARY_PATH=$libs ldd pkg/usr/sbin/dropbear | awk '/=> \//{print $3}' |
      xargs -I{} cp -L {} rootfs/lib/x86_64-linux-gnu/
    cp -L /lib64/ld-linux-x86-64.so.2 rootfs/lib64/
    LD_LIBRARY_PATH=$libs pkg/usr/bin/dropbearkey -t ed25519 -f rootfs/etc/dropbear/host_key >/dev/null 2>&1
    rm -f key key.pub
    # ed25519: this dropbear refuses the RSA key ssh-keygen makes by default.
    ssh-keygen -q -t ed25519 -N '' -f key
    cp key.pub rootfs/root/.ssh/authorized_keys
    chmod 700 rootfs/root rootfs/root/.ssh && chmod 600 rootfs/root/.ssh/authorized_keys
    truncate -s 64M ssh.img
    mkfs.ext4 -q -F -d rootfs ssh.img
  ) || { rm -rf "$work"; fail "making the root images (apt-get download, mkfs.ext4 -d, ssh-keygen)"; }
  mv "$work/root.img" "$common/root-drive.img"
  mv "$work/ssh.img" "$common/root-drive-with-ssh.img"
  mv "$work/key" "$common/root-drive-ssh-key"
  echo $image_version > "$common/root-drive.version"
  rm -rf "$work"
fi
install_go() { [ -x "$common/bin/$(basename "$1")" ] || GOBIN=$common/bin "$go" install "$1@$2" || fail "go install $1"; }
install_go github.com/containernetworking/plugins/plugins/main/ptp v1.1.1
install_go github.com/containernetworking/plugins/plugins/ipam/host-local v1.1.1
install_go github.com/containernetworking/plugins/plugins/ipam/static v1.1.1
# The proxy refuses this pseudo-version (403): build the same commit from its repository.
if [ ! -x "$common/bin/tc-redirect-tap" ]; then
  tcr=$cache/tc-redirect-tap
  [ -d "$tcr/.git" ] || git clone -q "${TC_REDIRECT_TAP_GIT:-https://github.com/awslabs/tc-redirect-tap}" "$tcr" ||
    fail "cloning tc-redirect-tap"
  git -C "$tcr" checkout -q 496fddc89db691c75de9510781fe5d3e651ce459 &&
    (cd "$tcr" && "$go" build -o "$common/bin/tc-redirect-tap" ./cmd/tc-redirect-tap) ||
    fail "building tc-redirect-tap"
fi

# One run of the suite: $1 = name, $2 = VMM binary, $3 = jailer, $4 = tap.
run_suite() {
  local name=$1 bin=$2 jailer=$3 tap=$4 data=$cache/run-$1
  rm -rf "$data" && mkdir -p "$data"
  cp -a "$sdk"/testdata/. "$data"/
  for f in vmlinux root-drive.img root-drive-with-ssh.img root-drive-ssh-key bin; do
    ln -sfn "$common/$f" "$data/$f"
  done
  # The suite wants its taps to exist: FC_TEST_TAP and the static "tap0".
  local made= t
  for t in "$tap" tap0; do
    ip link show "$t" >/dev/null 2>&1 || { ip tuntap add "$t" mode tap && made="$made $t"; }
  done
  echo "== $name: go test (FC_TEST_BIN=$bin) ..."
  (
    cd "$sdk"
    FC_TEST_BIN=$bin FC_TEST_JAILER_BIN=$jailer FC_TEST_TAP=$tap FC_TEST_DATA_PATH=$data \
      DISABLE_ROOT_TESTS= "$go" test -v -count=1 -timeout "$timeout" -run "$run_re" ./... \
      > "$cache/$name.log" 2>&1
  ) || true
  # Only the taps made here go.
  for t in $made; do ip link del "$t" 2>/dev/null || true; done
  # "--- PASS: TestX (1.2s)"; subtests ("TestX/sub") are indented.
  sed -n 's/^ *--- \(PASS\|FAIL\|SKIP\): \([^ ]*\).*/\2 \1/p' "$cache/$name.log" | sort -u > "$cache/$name.results"
  echo "   log: $cache/$name.log"
}

run_suite exitless "$exitless_bin" "$exitless_jailer" exsdk-tap0
if [ $run_fc = yes ]; then
  [ -x "$fc_jailer" ] || echo "note: no Firecracker jailer built; its jailer tests use $fc_jailer (missing)"
  run_suite firecracker "$fc_bin" "$fc_jailer" fcsdk-tap0
fi
fi # table_only
if [ $run_fc = auto ]; then [ -f "$cache/firecracker.results" ] && run_fc=yes || run_fc=no; fi
sides=exitless
[ $run_fc = no ] || sides="exitless firecracker"

echo
printf '%-64s %-9s %s\n' TEST exitless "$([ $run_fc = yes ] && echo firecracker)"
result() { awk -v t="$1" '$1 == t { print $2 }' "$cache/$2.results"; }
verdict=0
for t in $(for side in $sides; do cat "$cache/$side.results"; done | awk '{print $1}' | sort -u); do
  ex=$(result "$t" exitless); ex=${ex:-NONE}
  fc=; [ $run_fc = yes ] && { fc=$(result "$t" firecracker); fc=${fc:-NONE}; }
  # A subtest gets its line only where its test did not pass on both sides.
  case $t in */*)
    p=${t%%/*}
    [ "$(result "$p" exitless)" = PASS ] && { [ $run_fc = no ] || [ "$(result "$p" firecracker)" = PASS ]; } &&
      continue ;;
  esac
  printf '%-64s %-9s %s\n' "$t" "$ex" "$fc"
  if [ "$fc" = PASS ] && [ "$ex" != PASS ]; then
    echo "   ^ passes under Firecracker, not under exitless"; verdict=1
  fi
done
if [ "$(result TestStartVMMOnce exitless)" = PASS ]; then
  echo "PASS TestStartVMMOnce passes under exitless"
else
  echo "FAIL TestStartVMMOnce does not pass under exitless"; verdict=1
fi
if [ $run_fc = yes ]; then
  [ $verdict = 0 ] && echo "PASS no test that Firecracker passes here fails under exitless" ||
    echo "FAIL see the lines marked above"
fi
for s in $sides; do
  printf '%s: %s tests pass, %s fail, %s skip\n' "$s" "$(grep -v / "$cache/$s.results" | grep -c ' PASS')" \
    "$(grep -v / "$cache/$s.results" | grep -c ' FAIL')" "$(grep -v / "$cache/$s.results" | grep -c ' SKIP')"
done
exit $verdict
