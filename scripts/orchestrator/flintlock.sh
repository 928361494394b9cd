# Sourced by scripts/orchestrator-check.sh: flintlock end to end, with exitless as its
# --firecracker-bin. flintlockd is built unmodified from FLINTLOCK_GIT at FLINTLOCK_REF;
# inside its module we build containerd (the version flintlock's go.mod pins), its ctr,
# our blockfile-snapshotter and flctl (a gRPC client of flintlock's own API package:
# create, get, delete). Images come from a local registry (Debian's docker-registry).

FLINTLOCK_GIT=${FLINTLOCK_GIT:-https://github.com/liquidmetal-dev/flintlock}
FLINTLOCK_REF=${FLINTLOCK_REF:-v0.11.0}
FL_REGISTRY=${FL_REGISTRY:-localhost:5055}

fl_build() {
  local src=$cache/flintlock/src bin
  checkout flintlock "$FLINTLOCK_GIT" "$FLINTLOCK_REF" "$src" || return 1
  bin=$cache/flintlock/bin-$(git -C "$src" rev-parse --short=12 HEAD)
  mkdir -p "$bin" "$src/internal/exitless-flctl" "$src/internal/exitless-blockfile-snapshotter"
  cp "$here/scripts/orchestrator/flctl/main.go" "$src/internal/exitless-flctl/"
  cp "$here/scripts/orchestrator/blockfile-snapshotter/main.go" "$src/internal/exitless-blockfile-snapshotter/"
  local log=$cache/flintlock/build.log
  (
    set -e
    cd "$src"
    export GOFLAGS=-mod=mod
    [ -x "$bin/flintlockd" ] || go build -o "$bin/flintlockd" ./cmd/flintlockd
    # No device-mapper here: containerd without its devmapper plugin, so the blockfile
    # proxy can serve under the snapshotter name flintlock's volumes hard-code.
    [ -x "$bin/containerd" ] || go build -tags no_devmapper,no_btrfs,no_zfs -o "$bin/containerd" github.com/containerd/containerd/cmd/containerd
    [ -x "$bin/ctr" ] || go build -o "$bin/ctr" github.com/containerd/containerd/cmd/ctr
    go build -o "$bin/flctl" ./internal/exitless-flctl
    go build -o "$bin/blockfile-snapshotter" ./internal/exitless-blockfile-snapshotter
  ) > "$log" 2>&1 || { tail -5 "$log" >&2; return 1; }
  fl_bin=$bin
}

# Two images pushed to the local registry: the kernel at boot/vmlinux, and a busybox root
# whose init reads its metadata from MMDS (flintlock's eth0) and prints it.
fl_images() {
  local l=$state/images
  mkdir -p "$l/kernel-files/boot"
  cp "$kernel" "$l/kernel-files/boot/vmlinux"
  umoci init --layout "$l/kernel" && umoci new --image "$l/kernel:check" \
    && umoci insert --image "$l/kernel:check" "$l/kernel-files/boot" /boot > /dev/null || return 1
  umoci init --layout "$l/root" && umoci new --image "$l/root:check" && umoci unpack --image "$l/root:check" "$l/root-bundle" > /dev/null || return 1
  local r=$l/root-bundle/rootfs a
  mkdir -p "$r"/{bin,sbin,proc,sys,dev,tmp,root,etc}
  cp /bin/busybox "$r/bin/busybox"
  for a in sh mount ip wget cat sleep echo; do ln -sf busybox "$r/bin/$a"; done
  cat > "$r/sbin/init" <<'EOF'
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev 2>/dev/null
ip link set lo up; ip link set eth0 up; ip addr add 169.254.0.2/16 dev eth0
for i in 1 2 3; do
  meta=$(wget -q -O- http://169.254.169.254/latest/meta-data) && break
  sleep 1
done
echo "FLINTLOCK-META-DATA-BEGIN"; echo "$meta"; echo "FLINTLOCK-META-DATA-END"
echo "FLINTLOCK-USER-DATA-BEGIN"; wget -q -O- http://169.254.169.254/latest/user-data; echo "FLINTLOCK-USER-DATA-END"
while :; do sleep 3600; done
EOF
  chmod 755 "$r/sbin/init"
  umoci repack --image "$l/root:check" "$l/root-bundle" || return 1
  for a in kernel root; do
    tar -C "$l/$a" -cf "$l/$a.tar" . \
      && flctr -n build images import --no-unpack --base-name "$FL_REGISTRY/exitless/$a" "$l/$a.tar" > /dev/null \
      && flctr -n build images push --plain-http "$FL_REGISTRY/exitless/$a:check" > /dev/null 2>&1 || return 1
  done
}

flctr() { "$fl_bin/ctr" -a "$state/run/containerd.sock" "$@"; }

fl_start() {
  local i
  mkdir -p "$state"/{registry,flintlock}
  cat > "$state/registry.yml" <<EOF
version: 0.1
storage: {filesystem: {rootdirectory: $state/registry}, delete: {enabled: true}}
http: {addr: "${FL_REGISTRY/localhost/127.0.0.1}"}
EOF
  setsid docker-registry serve "$state/registry.yml" > "$state/registry.log" 2>&1 &
  fl_pids+=($!)
  containerd_with_blockfile "$state" "$fl_bin/blockfile-snapshotter" "$fl_bin/containerd" devmapper
  local started=$?
  fl_pids+=("$snapshotter_pid" "$containerd_pid")
  [ "$started" = 0 ] || return 1
  ip link add "$fl_bridge" type bridge && ip addr add 192.168.127.1/24 dev "$fl_bridge" && ip link set "$fl_bridge" up || return 1
  fl_images || return 1
  fl_daemon_start
}

# flintlockd, as its docs start it, with exitless as --firecracker-bin; sets fl_daemon.
fl_daemon_start() {
  local i
  setsid "$fl_bin/flintlockd" run --containerd-socket "$state/run/containerd.sock" --bridge-name "$fl_bridge" --insecure \
    --grpc-endpoint 127.0.0.1:9095 --firecracker-bin "$exitless" --state-dir "$state/flintlock" -v 2 \
    >> "$state/flintlockd.log" 2>&1 &
  fl_daemon=$!
  fl_pids+=($fl_daemon)
  for i in $(seq 100); do "$fl_bin/flctl" -addr 127.0.0.1:9095 list -ns check > /dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

# fl_create NAME: CreateMicroVM with the check's kernel, root and key; sets uid (empty on failure) and out.
fl_create() {
  out=$(flctl create -name "$1" -ns check -kernel "$FL_REGISTRY/exitless/kernel:check" -kernel-file boot/vmlinux \
    -root "$FL_REGISTRY/exitless/root:check" -ssh-key "$state/key.pub" -vcpu 1 -mem 1024 2>&1)
  uid=$(echo "$out" | sed -n 's/.*"uid": *"\([^"]*\)".*/\1/p' | head -1)
}

# fl_gone VMM DIR: the VMM ended, the VM's directory and every flintlock tap removed.
fl_gone() { ! alive "$1" && [ ! -d "$2" ] && [ -z "$(ip -br link | grep fltap)" ]; }

# Bad input: flintlockd killed while its microVM boots, then started again as a supervisor
# would. Its VMMs are not tied to it: the VM runs on, and DeleteMicroVM through the new
# daemon must end the VMM and remove its tap and directory.
fl_killed_daemon() {
  local out uid dir vmm= i
  fl_create vm2
  [ -n "$uid" ] || { fail "flintlock: CreateMicroVM vm2 for the killed-daemon check: $(echo "$out" | tail -1)"; return; }
  dir=$state/flintlock/vm/check/vm2/$uid
  for i in $(seq 600); do
    vmm=$(cat "$dir/firecracker.pid" 2>/dev/null)
    [ -n "$vmm" ] && alive "$vmm" && break
    sleep 0.5
  done
  [ -n "$vmm" ] && alive "$vmm" || { fail "flintlock: vm2's VMM did not start"; return; }
  kill -9 "$fl_daemon"
  wait "$fl_daemon" 2>/dev/null
  fl_daemon_start || { fail "flintlock: flintlockd did not start again (see $state/flintlockd.log)"; return; }
  alive "$vmm" || { fail "flintlock: flintlockd killed: VMM $vmm died with it"; return; }
  flctl delete -uid "$uid" > /dev/null 2>&1
  for i in $(seq 120); do fl_gone "$vmm" "$dir" && break; sleep 0.5; done
  if fl_gone "$vmm" "$dir"; then
    pass "flintlock: flintlockd killed mid-boot and restarted: its VM ran on, and DeleteMicroVM through the new daemon ended the VMM and removed its tap and directory"
  else
    fail "flintlock: after flintlockd was killed and restarted, DeleteMicroVM left: $(alive "$vmm" && echo "VMM $vmm") $(ip -br link | grep -o 'fltap[^ ]*' | tr '\n' ' ') $([ -d "$dir" ] && echo "$dir")"
  fi
}

flctl() { "$fl_bin/flctl" -addr 127.0.0.1:9095 "$@"; }

fl_check() {
  local state=$work/flintlock t0 out uid dir i vmm
  fl_pids=()
  fl_bridge=flexl$$
  rm -rf "$state" && mkdir -p "$state"
  fl_build && pass "flintlock: built $FLINTLOCK_REF from $FLINTLOCK_GIT (flintlockd unmodified; containerd and ctr at its go.mod's version)" \
    || { fail "flintlock: build (see $cache/flintlock/build.log)"; return; }
  deviation "flintlock: its volumes need containerd's devmapper snapshotter, which this host cannot run (no device-mapper); containerd is built without that plugin (tag no_devmapper) and the name devmapper is served by a blockfile proxy snapshotter: each root volume is an ext4 image file, given to the VMM as its drive's path_on_host"
  fl_start && pass "flintlock: registry, snapshotter, containerd and flintlockd serving; kernel and root images pushed to $FL_REGISTRY" \
    || { fail "flintlock: start (see $state/*.log)"; return; }
  ssh-keygen -q -t ed25519 -N "" -C exitless-check -f "$state/key" > /dev/null
  t0=$(now)
  fl_create vm1
  if [ -z "$uid" ]; then
    fail "flintlock: CreateMicroVM: $(echo "$out" | tail -1)"
    return
  fi
  pass "flintlock: CreateMicroVM accepted (uid $uid)"
  dir=$state/flintlock/vm/check/vm1/$uid
  for i in $(seq 1200); do
    grep -q FLINTLOCK-USER-DATA-END "$dir/firecracker.stdout" 2>/dev/null && break
    sleep 0.5
  done
  vmm=$(cat "$dir/firecracker.pid" 2>/dev/null)
  if grep -q -- "--boot-timer" "/proc/$vmm/cmdline" 2>/dev/null && grep -q -- "--metadata" "/proc/$vmm/cmdline" 2>/dev/null; then
    pass "flintlock: exitless runs as it launches Firecracker ($(tr '\0' ' ' < "/proc/$vmm/cmdline" | sed "s|$state|\$WORK|g" | cut -c1-200))"
  else
    fail "flintlock: no VMM with --boot-timer and --metadata (pid '${vmm}')"
  fi
  local meta
  meta=$(sed -n '/FLINTLOCK-META-DATA-BEGIN/,/FLINTLOCK-META-DATA-END/p' "$dir/firecracker.stdout" 2>/dev/null)
  if echo "$meta" | grep -q "instance-id: check-vm1" && grep -q "$(cut -d' ' -f2 "$state/key.pub")" "$dir/firecracker.stdout"; then
    pass "flintlock: the guest read its instance id and SSH key from MMDS ($(since "$t0") s after the create)"
  else
    fail "flintlock: the guest's metadata: $(echo "$meta" | head -3 | tr '\n' ' ') (console: $(tail -2 "$dir/firecracker.stdout" 2>/dev/null | tr '\n' ' '))"
  fi
  t0=$(now)
  flctl delete -uid "$uid" > /dev/null 2>&1
  for i in $(seq 120); do fl_gone "$vmm" "$dir" && break; sleep 0.5; done
  if fl_gone "$vmm" "$dir"; then
    pass "flintlock: DeleteMicroVM: VMM, taps and the VM's directory gone ($(since "$t0") s)"
  else
    fail "flintlock: DeleteMicroVM left: $(alive "$vmm" && echo "VMM $vmm") $(ip -br link | grep -o 'fltap[^ ]*' | tr '\n' ' ') $([ -d "$dir" ] && echo "$dir")"
  fi
  fl_killed_daemon
}

fl_stop() {
  local state=$work/flintlock p
  for p in ${fl_pids[@]+"${fl_pids[@]}"}; do kill "$p" 2>/dev/null; done
  sleep 1
  teardown "$state"
  ip -br link | grep -o 'fltap[^ @]*' | while read -r t; do ip link del "$t" 2>/dev/null; done
  [ -n "${fl_bridge:-}" ] && ip link del "$fl_bridge" 2>/dev/null
  true
}
