# Sourced by scripts/orchestrator-check.sh: Kata Containers with its Firecracker hypervisor
# config and exitless as the hypervisor's path. Its Go shim (containerd-shim-kata-v2) and
# its Rust agent are built from KATA_GIT at KATA_REF (4.0.0: the newest release whose agent
# needs no git dependency beyond those below); the agent's git dependencies come from their
# repositories' URL variables (local mirrors work). The container runs with
# `ctr run --runtime io.containerd.kata.v2` on Debian's containerd, its image through the
# blockfile proxy snapshotter (no device-mapper here).

KATA_GIT=${KATA_GIT:-https://github.com/kata-containers/kata-containers}
KATA_REF=${KATA_REF:-4.0.0}
DEVICEMAPPER_RS_GIT=${DEVICEMAPPER_RS_GIT:-https://github.com/stratis-storage/devicemapper-rs}
REGORUS_GIT=${REGORUS_GIT:-https://github.com/microsoft/regorus}
S390_TOOLS_GIT=${S390_TOOLS_GIT:-https://github.com/ibm-s390-linux/s390-tools}
CLOUD_HYPERVISOR_GIT=${CLOUD_HYPERVISOR_GIT:-https://github.com/cloud-hypervisor/cloud-hypervisor}
MICRO_HTTP_GIT=${MICRO_HTTP_GIT:-https://github.com/firecracker-microvm/micro-http}

kata_build() {
  local src=$cache/kata/src log=$cache/kata/build.log
  checkout kata "$KATA_GIT" "$KATA_REF" "$src" || return 1
  kata_bin=$cache/kata/bin-$KATA_REF
  mkdir -p "$kata_bin"
  (
    set -e
    cd "$src"
    if [ ! -x "$kata_bin/containerd-shim-kata-v2" ]; then
      make -C src/runtime containerd-shim-v2 runtime SKIP_GO_VERSION_CHECK=1
      cp src/runtime/containerd-shim-kata-v2 src/runtime/config/configuration-fc.toml "$kata_bin/"
    fi
    if [ ! -x "$kata_bin/kata-agent" ]; then
      # The agent's git dependencies from their URL variables; its toolchain from
      # rust-toolchain.toml (rustup installs it when missing).
      export CARGO_NET_GIT_FETCH_WITH_CLI=true GIT_CONFIG_COUNT=5
      export GIT_CONFIG_KEY_0="url.$DEVICEMAPPER_RS_GIT.insteadOf" GIT_CONFIG_VALUE_0=https://github.com/stratis-storage/devicemapper-rs
      export GIT_CONFIG_KEY_1="url.$REGORUS_GIT.insteadOf" GIT_CONFIG_VALUE_1=https://github.com/microsoft/regorus
      export GIT_CONFIG_KEY_2="url.$S390_TOOLS_GIT.insteadOf" GIT_CONFIG_VALUE_2=https://github.com/ibm-s390-linux/s390-tools
      export GIT_CONFIG_KEY_3="url.$CLOUD_HYPERVISOR_GIT.insteadOf" GIT_CONFIG_VALUE_3=https://github.com/cloud-hypervisor/cloud-hypervisor
      export GIT_CONFIG_KEY_4="url.$MICRO_HTTP_GIT.insteadOf" GIT_CONFIG_VALUE_4=https://github.com/firecracker-microvm/micro-http
      local channel
      channel=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
      rustup run "$channel" true 2>/dev/null || rustup toolchain install "$channel" --profile minimal -t x86_64-unknown-linux-musl
      # SECCOMP=no: libseccomp for musl is not packaged here; the agent's seccomp applies
      # only to containers whose spec asks for it, and ctr's default spec does not.
      make -C src/agent LIBC=musl SECCOMP=no
      cp target/x86_64-unknown-linux-gnu/release/kata-agent "$kata_bin/kata-agent"
    fi
  ) > "$log" 2>&1 || { tail -5 "$log" >&2; return 1; }
}

# Kata's guest image as its osbuilder makes it with AGENT_INIT=yes: an MBR disk whose
# first partition is ext4 (Kata boots with root=/dev/vda1), the agent as /sbin/init.
kata_image() {
  local dir=$state/image-root out=$state/kata.img size=64
  rm -rf "$dir" && mkdir -p "$dir"/{bin,dev,etc,lib,proc,run,sbin,sys,tmp,usr/bin,var}
  install -m 0755 "$kata_bin/kata-agent" "$dir/sbin/init"
  ln -s ../../sbin/init "$dir/usr/bin/kata-agent"
  # The agent keeps its sandbox's persistent namespaces under /var/run (a distro's link
  # to the /run tmpfs it mounts); the root itself is read-only.
  ln -s ../run "$dir/var/run"
  echo kata > "$dir/etc/hostname"
  chmod 1777 "$dir/tmp"
  rm -f "$out" && truncate -s "${size}M" "$out"
  python3 - "$out" <<'EOF'
import os, struct, sys
path = sys.argv[1]; sectors = os.path.getsize(path) // 512; start = 2048
entry = struct.pack('<B3sB3sII', 0, b'\xfe\xff\xff', 0x83, b'\xfe\xff\xff', start, sectors - start)
with open(path, 'r+b') as f:
    f.seek(446); f.write(entry + b'\0' * 48); f.seek(510); f.write(b'\x55\xaa')
EOF
  mkfs.ext4 -q -F -L kata-rootfs -d "$dir" -E offset=$((2048 * 512)) "$out" "$((size * 1024 - 1024))k"
}

# Kata's shipped configuration-fc.toml with this host's paths; the timeouts raised for a
# guest that takes about 45 s to boot here (a deviation, printed).
# KATA_JAILER=1: Kata starts exitless through exitless-jailer (its jailer_path). Kata reads
# the jail's pid file as firecracker.pid whatever the binary is called, and resolves links:
# exitless is copied as a file named firecracker.
kata_config() {
  local vmm=$exitless jailer="" valid_jailers="[]"
  if [ -n "${KATA_JAILER:-}" ]; then
    mkdir -p "$state/bin" && cp "$exitless" "$state/bin/firecracker" && vmm=$state/bin/firecracker
    jailer=$(dirname "$exitless")/exitless-jailer valid_jailers="[\"$(dirname "$exitless")/exitless-jailer\"]"
    [ -x "$jailer" ] || return 1
  fi
  sed -e "s|^path = .*|path = \"$vmm\"|" \
    -e "s|^valid_hypervisor_paths = .*|valid_hypervisor_paths = [\"$vmm\"]|" \
    -e "s|^jailer_path = .*|jailer_path = \"$jailer\"|" -e "s|^valid_jailer_paths = .*|valid_jailer_paths = $valid_jailers|" \
    -e "s|^kernel = .*|kernel = \"$kernel\"|" -e "s|^image = .*|image = \"$state/kata.img\"|" \
    -e 's|^default_memory = .*|default_memory = 512|' -e 's|^enable_debug = .*|enable_debug = true|' \
    -e 's|^dial_timeout = .*|dial_timeout = 300|' -e 's|^create_container_timeout = .*|create_container_timeout = 300|' \
    "$kata_bin/configuration-fc.toml" > "$state/configuration-fc.toml"
}

kata_start() {
  # Kata's shutdown ends the VMM with SIGTERM and waits up to 15 s; containerd's default
  # for a shim's shutdown is 3 s. After a shim died, containerd gives the shim binary's
  # `delete` 5 s, in which Kata asks its agent to stop the container: seconds of emulated
  # CPL0 here (a deviation, printed by the killed-shim check).
  PATH=$kata_bin:$PATH containerd_with_blockfile "$state" "$fcc_bin/blockfile-snapshotter" "$(command -v containerd)" blockfile \
    "$(printf '[debug]\n  level = "debug"\n[timeouts]\n  "io.containerd.timeout.shim.shutdown" = "30s"\n  "io.containerd.timeout.shim.cleanup" = "120s"')"
  local started=$?
  kata_pids+=("$snapshotter_pid" "$containerd_pid")
  return $started
}

kctr() { ctr -a "$state/run/containerd.sock" "$@"; }

kata_check() {
  local state=$work/kata t0 out image=localhost/exitless-check:check
  kata_pids=()
  rm -rf "$state" && mkdir -p "$state"
  command -v containerd > /dev/null || apt-get install -y -q containerd > /dev/null
  t0=$(now)
  kata_build && pass "kata: built $KATA_REF from $KATA_GIT (containerd-shim-kata-v2 $("$kata_bin/containerd-shim-kata-v2" --version 2>/dev/null | sed -n 's/.*version: \([0-9.]*\).*/\1/p' | head -1), kata-agent)" \
    || { fail "kata: build (see $cache/kata/build.log)"; return; }
  [ -n "${fcc_bin:-}" ] || fcc_build || { fail "kata: the blockfile snapshotter (firecracker-containerd's module) did not build"; return; }
  kata_image && kata_config && pass "kata: guest image (kata-agent as init on partition 1) and configuration-fc.toml${KATA_JAILER:+ (jailer_path: exitless-jailer)}" \
    || { fail "kata: guest image or config"; return; }
  deviation "kata: dial_timeout and create_container_timeout raised from 45 and 60 s to 300 s (a guest takes about 45 s to boot on this host); containers come through a blockfile proxy snapshotter (the shim loop-mounts each ext4 file and hot-plugs the loop device) instead of devmapper (no device-mapper here); the agent is built with SECCOMP=no (no musl libseccomp packaged)"
  # Kata's shim logs to syslog and fails a create it cannot log; this host runs no syslog
  # daemon, so the run serves /dev/log itself (and drops what it reads).
  if [ ! -S /dev/log ]; then
    python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind("/dev/log"); print(flush=True)
while True: s.recv(65536)' > /dev/null 2>&1 &
    kata_pids+=($!)
    kata_devlog=1
    deviation "kata: no syslog daemon on this host: /dev/log served (and discarded) for the run"
  fi
  kata_start && pass "kata: containerd $(containerd --version | awk '{print $3}') with the blockfile proxy serving" \
    || { fail "kata: containerd start (see $state/containerd.log)"; return; }
  local image_line="exitless-orchestrator-check kata $(date +%s)"
  oci_image "$state" "$image_line" || { fail "kata: OCI image"; return; }
  kctr images import --base-name localhost/exitless-check --snapshotter blockfile "$state/image.tar" > /dev/null 2>&1 \
    || { fail "kata: image import"; return; }
  t0=$(now)
  out=$(timeout 900 ctr -a "$state/run/containerd.sock" run --rm --snapshotter blockfile --runtime io.containerd.kata.v2 \
    --runtime-config-path "$state/configuration-fc.toml" "$image" k1 2>&1)
  if echo "$out" | grep -qx "$image_line"; then
    pass "kata: ctr run --runtime io.containerd.kata.v2 printed the image's line in $(since "$t0") s"
  else
    fail "kata: ctr run: $(echo "$out" | tail -1) (guest console and shim log: $state/containerd.log)"
    grep -a 'vmconsole\|exitless' "$state/containerd.log" | tail -5 | cut -c1-300 >&2
  fi
  kata_killed_shim
}

# Bad input: Kata's shim killed while its container runs. containerd then runs the shim's
# own cleanup (`containerd-shim-kata-v2 delete`), which stops the sandbox; no VMM may
# outlive that, nor a socket, mount or loop device of the VM's.
kata_killed_shim() {
  local i shim= vmm= pid left
  if ! kctr run -d --snapshotter blockfile --runtime io.containerd.kata.v2 --runtime-config-path "$state/configuration-fc.toml" \
    "$image" k2 sh -c "cat /hello.txt; sleep 3600" > "$state/k2.out" 2>&1; then
    fail "kata: k2 for the killed-shim check did not start: $(tail -1 "$state/k2.out")"
    kctr container rm k2 > /dev/null 2>&1
    return
  fi
  for i in $(seq 300); do
    kctr task ls 2>/dev/null | grep -q '^k2 .*RUNNING' && break
    sleep 1
  done
  shim=$(pgrep -f "containerd-shim-kata-v2 -namespace default -address $state/" | head -1)
  vmm=$( (vmms_under /run/vc; vmms_under "$state") | head -1)
  [ -n "$shim" ] && [ -n "$vmm" ] || { fail "kata: k2 for the killed-shim check: no running task, shim or VMM ($(tail -1 "$state/k2.out"))"; return; }
  deviation "kata: containerd's timeout for a dead shim's cleanup (io.containerd.timeout.shim.cleanup) raised from 5 to 120 s: Kata's cleanup asks the guest's agent to stop the container first, which takes longer than 5 s at this host's emulated CPL0"
  kill -9 "$shim"
  for i in $(seq 1500); do
    ! alive "$vmm" && [ -z "$(leftovers /run/vc)" ] && break
    sleep 0.1
  done
  kctr task delete -f k2 > /dev/null 2>&1
  kctr container rm k2 > /dev/null 2>&1
  left=$(leftovers /run/vc)
  if alive "$vmm"; then
    fail "kata: shim killed: VMM $vmm still runs 150 s later"
  elif [ -n "$left" ]; then
    fail "kata: shim killed: its VMM ended, but left: $left"
  else
    pass "kata: shim killed mid-run: containerd's cleanup ended its VMM, nothing of the VM left under /run/vc"
  fi
}

kata_stop() {
  local state=$work/kata p
  for p in ${kata_pids[@]+"${kata_pids[@]}"}; do kill "$p" 2>/dev/null; done
  pkill -f "containerd-shim-kata-v2 -namespace default -address $state/" 2>/dev/null
  sleep 1
  teardown "$state"
  teardown /run/vc
  [ -n "${kata_devlog:-}" ] && rm -f /dev/log
  true
}
