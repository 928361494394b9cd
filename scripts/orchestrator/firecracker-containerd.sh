# Sourced by scripts/orchestrator-check.sh: firecracker-containerd end to end, with exitless
# as its firecracker_binary_path. Its daemon, firecracker-ctr, the aws.firecracker shim and
# the in-guest agent are built from FIRECRACKER_CONTAINERD_GIT at FIRECRACKER_CONTAINERD_REF.
# Two small programs of ours are built inside its module (so they speak exactly its API):
# blockfile-snapshotter (containerd's blockfile snapshotter as a proxy plugin: this host
# has no device-mapper for the devmapper snapshotter its docs use) and fcc-vm (its control
# API's CreateVM/PauseVM/ResumeVM/StopVM, which firecracker-ctr cannot call).

FIRECRACKER_CONTAINERD_GIT=${FIRECRACKER_CONTAINERD_GIT:-https://github.com/firecracker-microvm/firecracker-containerd}
FIRECRACKER_CONTAINERD_REF=${FIRECRACKER_CONTAINERD_REF:-be68640a5d2237f5b427c37c1f5809ec154126c5}
# A VM's boot to its agent's first answer; the shim's own default is 60 s.
FCC_BOOT_TIMEOUT=${FCC_BOOT_TIMEOUT:-300}
FCC_FLEET=${FCC_FLEET:-5}
# FCC_FLEET_START=together starts each fleet VM's container as soon as that VM answers,
# instead of one after another once all have (see fcc_fleet).
# Which groups of steps run: containers (one VM), fleet (FCC_FLEET VMs), bad (killed shim
# and daemon).
FCC_STEPS=${FCC_STEPS:-containers fleet bad}

fcc_build() {
  local src=$cache/firecracker-containerd/src bin=$cache/firecracker-containerd/bin-$FIRECRACKER_CONTAINERD_REF
  checkout firecracker-containerd "$FIRECRACKER_CONTAINERD_GIT" "$FIRECRACKER_CONTAINERD_REF" "$src" || return 1
  mkdir -p "$bin" "$src/internal/exitless-fcc-vm" "$src/internal/exitless-blockfile-snapshotter"
  cp "$here/scripts/orchestrator/fcc-vm/main.go" "$src/internal/exitless-fcc-vm/"
  cp "$here/scripts/orchestrator/blockfile-snapshotter/main.go" "$src/internal/exitless-blockfile-snapshotter/"
  local log=$cache/firecracker-containerd/build.log
  (
    set -e
    cd "$src"
    [ -x "$bin/agent" ] || (cd agent && CGO_ENABLED=0 go build -ldflags -s -o "$bin/agent" .)
    [ -x "$bin/containerd-shim-aws-firecracker" ] || (cd runtime && go build -o "$bin/containerd-shim-aws-firecracker" .)
    [ -x "$bin/firecracker-containerd" ] || (cd firecracker-control/cmd/containerd && go build -o "$bin/firecracker-containerd" .)
    [ -x "$bin/firecracker-ctr" ] || go build -o "$bin/firecracker-ctr" github.com/containerd/containerd/cmd/ctr
    go build -o "$bin/fcc-vm" ./internal/exitless-fcc-vm
    go build -o "$bin/blockfile-snapshotter" ./internal/exitless-blockfile-snapshotter
  ) > "$log" 2>&1 || { tail -5 "$log" >&2; return 1; }
  fcc_bin=$bin
}

# The guest's root drive: the agent, Debian's runc (with its libraries) and busybox, and
# our init at the path firecracker-containerd's image documents (init=/sbin/overlay-init).
fcc_rootfs() {
  local dir=$state/rootfs img=$state/rootfs.img lib
  rm -rf "$dir" && mkdir -p "$dir"/{bin,sbin,usr/local/bin,lib/x86_64-linux-gnu,lib64,etc,proc,sys,dev,run,tmp,mnt,overlay,container,rom,volumes}
  gcc -static -O2 -o "$dir/sbin/overlay-init" "$here/scripts/orchestrator/guest-init.c" || return 1
  cp /bin/busybox "$dir/bin/busybox" && ln -s busybox "$dir/bin/sh"
  cp "$fcc_bin/agent" "$dir/usr/local/bin/agent"
  cp "$(command -v runc)" "$dir/usr/local/bin/runc"
  for lib in $(ldd "$(command -v runc)" | awk '/=>/ { print $3 }'); do cp -L "$lib" "$dir/lib/x86_64-linux-gnu/"; done
  cp -L /lib64/ld-linux-x86-64.so.2 "$dir/lib64/"
  echo "127.0.0.1 localhost" > "$dir/etc/hosts"
  : > "$dir/etc/resolv.conf"
  echo "root:x:0:0:root:/root:/bin/sh" > "$dir/etc/passwd"
  echo "root:x:0:" > "$dir/etc/group"
  rm -f "$img" && truncate -s 128M "$img" && mkfs.ext4 -q -F -d "$dir" "$img"
}

fcc_start_daemon() {
  mkdir -p "$state"/{etc,shim-base}
  # Its default kernel_args with init= for the root drive's init, as its image's README
  # gives them; firecracker-containerd sends no root=, exitless adds root=/dev/vda ro as
  # Firecracker does for the root device.
  cat > "$state/etc/runtime.json" <<EOF
{
  "firecracker_binary_path": "$exitless",
  "kernel_image_path": "$kernel",
  "kernel_args": "ro console=ttyS0 noapic reboot=k panic=1 pci=off nomodules init=/sbin/overlay-init",
  "root_drive": "$state/rootfs.img",
  "cpu_template": "",
  "log_levels": ["debug"],
  "shim_base_dir": "$state/shim-base"
}
EOF
  # The daemon is containerd with firecracker-containerd's plugins; it finds the shim on
  # PATH and, like the shim, the runtime config by this variable.
  PATH=$fcc_bin:$PATH FIRECRACKER_CONTAINERD_RUNTIME_CONFIG_PATH=$state/etc/runtime.json \
    containerd_with_blockfile "$state" "$fcc_bin/blockfile-snapshotter" "$fcc_bin/firecracker-containerd" blockfile \
    "$(printf '[debug]\n  level = "debug"')"
  local started=$?
  fcc_snapshotter_pid=$snapshotter_pid
  daemon_pid=$containerd_pid
  return $started
}

ctr() { "$fcc_bin/firecracker-ctr" -a "$state/run/containerd.sock" "$@"; }
fccvm() { "$fcc_bin/fcc-vm" -address "$state/run/containerd.sock.ttrpc" "$@"; }

# io_deadline TASK: whether the shim gave up on TASK's stdio (it gives the agent a fixed
# 5 s to listen on each stdio port: defaultVSockConnectTimeout in its runtime/service.go).
io_deadline() { grep -aqF "TaskID=$1 error=\"error initializing io" "$state/containerd.log"; }

# wait_line FILE SECONDS [PID [TASK]]: until FILE holds the image's line (or PID, the client
# writing FILE, ended without it). Returns 2 when the shim gave up on TASK's stdio.
wait_line() {
  local i
  for i in $(seq $(($2 * 10))); do
    grep -qx "$image_line" "$1" 2>/dev/null && return 0
    [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null && { grep -qx "$image_line" "$1" 2>/dev/null; return; }
    [ -n "${4:-}" ] && [ $((i % 10)) = 0 ] && io_deadline "$4" && return 2
    sleep 0.1
  done
  return 1
}

# run_line NAME VM [COMMAND...]: runs container NAME in VM in the background, its output
# in $state/NAME.out, and waits for the image's line. Two of this host's faults are
# reported (HOST lines) and the container run again under another name, up to four times:
# runc dying in the guest now and then (a Go runtime fault or a zeroed page, docs/linux.md),
# and the shim's fixed 5 s for the agent to open a container's stdio ports passing in a
# guest slowed by emulated CPL0 and by other guests on the same two cores (the client is
# then killed: the agent would wait for the shim's connection, and the client with it,
# forever). $tries (default 4) says how many times; each try takes one of the VM's stub
# drives for good.
run_line() {
  local name=$1 vm=$2 attempt base=$1 status why last=${tries:-4}
  shift 2
  for attempt in $(seq "$last"); do
    # The client itself in the background (not a function's subshell), so that $run_pid
    # is what a kill must reach.
    "$fcc_bin/firecracker-ctr" -a "$state/run/containerd.sock" run --snapshotter blockfile --runtime aws.firecracker \
      --net-host --annotation "aws.firecracker.vm.id=$vm" "$image" "$name" "$@" > "$state/$name.out" 2>&1 &
    run_pid=$!
    wait_line "$state/$name.out" $((FCC_BOOT_TIMEOUT * 2)) "$run_pid" "$name"
    status=$?
    [ "$status" = 0 ] && { run_name=$name; return 0; }
    why=
    if [ "$status" = 2 ]; then
      kill "$run_pid" 2>/dev/null
      wait "$run_pid" 2>/dev/null
      why="the shim's fixed 5 s for the agent to open its stdio ports passed"
    elif grep -q "runc did not terminate successfully\|invalid character" "$state/$name.out"; then
      why="runc died in the guest ($(grep -o 'runc did not terminate successfully: [^:]*\|invalid character[^:]*' "$state/$name.out" | head -1))"
    fi
    if [ "$attempt" != "$last" ] && [ -n "$why" ]; then
      echo "HOST $name: $why; again as $base-$((attempt + 1))"
      ctr container rm "$name" > /dev/null 2>&1
      name=$base-$((attempt + 1))
      continue
    fi
    [ "$status" = 2 ] && echo "ctr: $why" >> "$state/$name.out"
    run_name=$name
    return 1
  done
  return 1
}

# The VMM process of VM $1 (started in its shim directory).
vmm_of() { vmms_under "$state/shim-base/default#$1"; }

fcc_check() {
  local state=$work/firecracker-containerd image=localhost/exitless-check:check
  local image_line="exitless-orchestrator-check $(date +%s)"
  local t0 t out
  rm -rf "$state" && mkdir -p "$state"
  fcc_build && pass "firecracker-containerd: built from $FIRECRACKER_CONTAINERD_GIT at ${FIRECRACKER_CONTAINERD_REF:0:12} (daemon, firecracker-ctr, aws.firecracker shim, agent)" \
    || { fail "firecracker-containerd: build (see $cache/firecracker-containerd/build.log)"; return; }
  fcc_rootfs && pass "firecracker-containerd: guest root drive (agent, runc $(runc --version | head -1 | cut -d' ' -f3), busybox, init)" \
    || { fail "firecracker-containerd: guest root drive"; return; }
  oci_image "$state" "$image_line" && pass "firecracker-containerd: OCI image built locally" || { fail "firecracker-containerd: OCI image"; return; }
  fcc_start_daemon && pass "firecracker-containerd: daemon and blockfile proxy snapshotter serving" \
    || { fail "firecracker-containerd: daemon start (see $state/containerd.log)"; return; }
  ctr images import --base-name localhost/exitless-check --snapshotter blockfile "$state/image.tar" > /dev/null 2>&1 \
    && ctr images ls -q | grep -qx "$image" && pass "firecracker-containerd: image imported and unpacked into ext4 image files" \
    || { fail "firecracker-containerd: image import"; return; }

  case " $FCC_STEPS " in *" containers "*) fcc_containers ;; esac
  case " $FCC_STEPS " in *" fleet "*) fcc_fleet ;; esac
  case " $FCC_STEPS " in *" bad "*) fcc_killed_shim; fcc_killed_daemon ;; esac
}

# The documented use: firecracker-ctr run, then a VM with two containers, exec, pause and
# resume, stop and delete, StopVM.
fcc_containers() {
  local t0 out
  # 1. As its getting-started guide: firecracker-ctr run, the shim making the VM. The shim
  # gives a VM 60 s from the VMM's start to its agent's answer.
  t0=$(now)
  out=$(timeout 200 "$fcc_bin/firecracker-ctr" -a "$state/run/containerd.sock" run --snapshotter blockfile \
    --runtime aws.firecracker --rm --net-host "$image" plain 2>&1) || true
  if echo "$out" | grep -qx "$image_line"; then
    pass "firecracker-containerd: firecracker-ctr run printed the image's line in $(since "$t0") s"
  elif echo "$out" | grep -q "didn't start within"; then
    deviation "firecracker-containerd: firecracker-ctr run: the shim's fixed 60 s boot deadline passed ($(echo "$out" | grep -o "didn't start within [^:]*")); this host emulates every guest CPL0 instruction and the kernel alone takes about 45 s to reach init; the steps below create the VM first through firecracker-containerd's control API with TimeoutSeconds $FCC_BOOT_TIMEOUT"
  else
    fail "firecracker-containerd: firecracker-ctr run: $(echo "$out" | tail -1)"
  fi

  # 2. A VM made through the control API (room for two containers), then its containers.
  local vm=one-$$
  t0=$(now)
  # Seven slots for two containers: a create that fails keeps its stub drive
  # (firecracker-containerd does not give it back), and run_line tries up to four times.
  # No more: its kernel arguments have noapic, and the PIC's lines (5-7, 10-15) reach the
  # root drive, seven stubs and vsock; a tenth device's line (16) would leave it without.
  if out=$(fccvm create "$vm" 7 "$FCC_BOOT_TIMEOUT" 2>&1); then
    pass "firecracker-containerd: CreateVM $vm (its agent answered after $(since "$t0") s; VMM pid $(vmm_of "$vm"))"
  else
    fail "firecracker-containerd: CreateVM $vm: $out"
    return
  fi
  t0=$(now)
  local c1
  if run_line c1 "$vm" /bin/sh -c 'cat /hello.txt; exec sleep 3600'; then
    pass "firecracker-containerd: container $run_name in $vm printed its image's line $(since "$t0") s after run (its drive PATCHed to the snapshot's file)"
  else
    fail "firecracker-containerd: container c1 printed no line: $(tail -1 "$state/$run_name.out")"
  fi
  c1=$run_name
  local c1_pid=$run_pid
  t0=$(now)
  out=$(timeout 300 "$fcc_bin/firecracker-ctr" -a "$state/run/containerd.sock" task exec --exec-id e1 "$c1" /bin/cat /hello.txt 2>&1) || true
  [ "$out" = "$image_line" ] && pass "firecracker-containerd: exec into $c1 ($(since "$t0") s)" || fail "firecracker-containerd: exec into $c1: $out"
  t0=$(now)
  if run_line c2 "$vm"; then
    pass "firecracker-containerd: a second container $run_name in $vm beside $c1 ($(since "$t0") s)"
    wait "$run_pid" 2>/dev/null
    ctr container rm "$run_name" > /dev/null 2>&1
  else
    fail "firecracker-containerd: second container c2: $(tail -1 "$state/$run_name.out")"
  fi
  # PATCH /vm through the control API; the exec after the resume shows the VM runs on.
  if fccvm pause "$vm" && fccvm resume "$vm"; then
    out=$(timeout 300 "$fcc_bin/firecracker-ctr" -a "$state/run/containerd.sock" task exec --exec-id e2 "$c1" /bin/cat /hello.txt 2>&1) || true
    [ "$out" = "$image_line" ] && pass "firecracker-containerd: PauseVM, ResumeVM, then exec into $c1" \
      || fail "firecracker-containerd: exec after PauseVM/ResumeVM: $out"
  else
    fail "firecracker-containerd: PauseVM/ResumeVM"
  fi
  ctr task kill -s SIGKILL "$c1" > /dev/null 2>&1
  wait "$c1_pid" 2>/dev/null
  if ctr container rm "$c1" > /dev/null 2>&1 && ! ctr container ls -q | grep -qx "$c1"; then
    pass "firecracker-containerd: $c1 stopped and deleted"
  else
    fail "firecracker-containerd: stop and delete $c1"
  fi
  t0=$(now)
  fccvm stop "$vm" > /dev/null 2>&1
  local i
  for i in $(seq 100); do [ -z "$(vmm_of "$vm")" ] && break; sleep 0.1; done
  [ -z "$(vmm_of "$vm")" ] && pass "firecracker-containerd: StopVM $vm: the VMM is gone ($(since "$t0") s)" \
    || fail "firecracker-containerd: StopVM $vm left VMM $(vmm_of "$vm")"

}

# FCC_FLEET VMs at once, a container each: the time from the first CreateVM to each
# container's line, and containers per minute over the whole. The VMs are made together;
# their containers start one after another once every VM has answered (FCC_FLEET_START=
# together starts each as soon as its own VM answers): the shim gives the agent a fixed 5 s
# to open a container's stdio ports, which five guests of emulated CPL0 starting containers
# on two cores did not meet in any run (docs/orchestrators.md), and a start that missed it
# leaves its runc create running in the guest. Each container stays up (sleeping) until
# all have printed, so the five live at once.
fcc_fleet() {
  local n=$FCC_FLEET t0 i pids=() ok=0 firsts=() t idle=() run_pids=()
  # Seven stubs, the most noapic leaves lines for (see fcc_containers), so seven tries.
  local tries=7
  [ "$n" -gt 0 ] || return 0
  local together=0
  [ "${FCC_FLEET_START:-}" = together ] && together=1
  t0=$(now)
  for i in $(seq "$n"); do
    (
      fccvm create "fleet$i-$$" "$tries" $((FCC_BOOT_TIMEOUT * 2)) > "$state/fleet$i.create" 2>&1 || exit 1
      [ "$together" = 1 ] || exit 0
      run_line "f$i" "fleet$i-$$" > "$state/fleet$i.note" || exit 1
      since "$t0" > "$state/fleet$i.time"
      wait "$run_pid" 2>/dev/null
    ) &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" 2>/dev/null; done
  if [ "$together" = 0 ]; then
    deviation "firecracker-containerd: $n VMs made at once, their containers started one after another once all had answered: started together, no agent opened its stdio ports within the shim's fixed 5 s (defaultVSockConnectTimeout) in five guests of emulated CPL0 on two cores"
    # What the idle VMs cost the host before their containers start (CPU of each VMM
    # process over 10 s, in percent of a core).
    idle=($(vmm_cpu 10 $(for i in $(seq "$n"); do vmm_of "fleet$i-$$"; done)))
    for i in $(seq "$n"); do
      grep -q "^created" "$state/fleet$i.create" 2>/dev/null || continue
      run_line "f$i" "fleet$i-$$" /bin/sh -c 'cat /hello.txt; exec sleep 3600' > "$state/fleet$i.note" || continue
      since "$t0" > "$state/fleet$i.time"
      run_pids+=("$run_pid")
    done
  fi
  t=$(since "$t0")
  cat "$state"/fleet*.note 2>/dev/null
  for i in $(seq "$n"); do
    [ -s "$state/fleet$i.time" ] && { ok=$((ok + 1)); firsts+=("$(cat "$state/fleet$i.time")"); }
  done
  local vms
  vms=$(cat "$state"/fleet*.create 2>/dev/null | sed 's/^created \(fleet[0-9]*\)-[0-9]* in /\1 /' | tr '\n' ',' | sed 's/,$//')
  if [ "$ok" = "$n" ]; then
    pass "firecracker-containerd: $n VMs at once, a container each: first lines at ${firsts[*]} s after the first CreateVM (VMs answered: $vms${idle:+; idle VMMs at ${idle[*]}% of a core}); $(awk -v n="$n" -v t="$t" 'BEGIN { printf "%.2f", n * 60 / t }') containers per minute"
  else
    # Why: the client's own words, or else the shim's last error for a fleet VM.
    local why
    why=$(cat "$state"/fleet*.create "$state"/f*.out 2>/dev/null | grep -v "created\|$image_line" | head -1)
    [ -n "$why" ] || why=$(grep -a 'level=error' "$state/containerd.log" | grep -a "vmID=fleet" | tail -1 | grep -o 'error="[^"]*"')
    fail "firecracker-containerd: $n VMs at once: $ok of $n containers printed their line (VMs: $vms${idle:+; idle VMMs at ${idle[*]}% of a core}; $why)"
  fi
  # Only these stops: a bare wait would wait for the daemons too.
  pids=()
  for i in $(seq "$n"); do
    fccvm stop "fleet$i-$$" > /dev/null 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}" "${run_pids[@]}"; do wait "$i" 2>/dev/null; done
}

# Bad input: the shim killed while its VM runs. containerd then cleans up after the shim
# (its directory, with the API socket, removed); the VMM must not outlive that.
fcc_killed_shim() {
  local vm=killed-$$ shim i
  if ! fccvm create "$vm" 1 "$FCC_BOOT_TIMEOUT" > /dev/null 2>&1; then
    fail "firecracker-containerd: CreateVM $vm for the killed-shim check"
    return
  fi
  local vmm
  vmm=$(vmm_of "$vm")
  shim=$(pgrep -f "containerd-shim-aws-firecracker" | while read -r p; do
    [ "$(readlink "/proc/$p/cwd")" = "$state/shim-base/default#$vm" ] && echo "$p"; done | head -1)
  [ -n "$shim" ] && [ -n "$vmm" ] || { fail "firecracker-containerd: no shim or VMM for $vm"; return; }
  kill -9 "$shim"
  for i in $(seq 200); do alive "$vmm" || break; sleep 0.1; done
  if alive "$vmm"; then
    fail "firecracker-containerd: shim killed: VMM $vmm still runs 20 s later"
  else
    pass "firecracker-containerd: shim killed mid-run: its VMM ended with the VM's teardown"
  fi
}

# Bad input: the daemon killed while its VM runs, then started again, as a supervisor
# would; StopVM through the new daemon must end the VMM.
fcc_killed_daemon() {
  local vm=daemon-$$ vmm i
  if ! fccvm create "$vm" 1 "$FCC_BOOT_TIMEOUT" > /dev/null 2>&1; then
    fail "firecracker-containerd: CreateVM $vm for the killed-daemon check"
    return
  fi
  vmm=$(vmm_of "$vm")
  kill -9 "$daemon_pid"
  wait "$daemon_pid" 2>/dev/null
  rm -f "$state/run/containerd.sock" "$state/run/containerd.sock.ttrpc"
  PATH=$fcc_bin:$PATH FIRECRACKER_CONTAINERD_RUNTIME_CONFIG_PATH=$state/etc/runtime.json \
    setsid "$fcc_bin/firecracker-containerd" --config "$state/containerd.toml" >> "$state/containerd.log" 2>&1 &
  daemon_pid=$!
  for i in $(seq 100); do [ -S "$state/run/containerd.sock.ttrpc" ] && break; sleep 0.1; done
  alive "$vmm" || { fail "firecracker-containerd: daemon killed: VMM $vmm died with it"; return; }
  fccvm stop "$vm" > "$state/daemon-stop.out" 2>&1
  for i in $(seq 200); do alive "$vmm" || break; sleep 0.1; done
  if alive "$vmm"; then
    fail "firecracker-containerd: daemon killed and restarted: VMM $vmm still runs after StopVM ($(tail -1 "$state/daemon-stop.out"))"
  else
    pass "firecracker-containerd: daemon killed mid-run and restarted: its VM ran on, and StopVM through the new daemon ended its VMM"
  fi
}

fcc_stop() {
  local state=$work/firecracker-containerd
  [ -n "${daemon_pid:-}" ] && kill "$daemon_pid" 2>/dev/null
  [ -n "${fcc_snapshotter_pid:-}" ] && kill "$fcc_snapshotter_pid" 2>/dev/null
  pkill -f "containerd-shim-aws-firecracker -namespace default -address $state/" 2>/dev/null
  sleep 1
  teardown "$state"
}
