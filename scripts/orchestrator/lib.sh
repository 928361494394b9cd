# Sourced by scripts/orchestrator-check.sh: reporting, sources, and the teardown check
# every orchestrator's steps share.

passed=0
failed=0
deviations=0
results=()
step_start=0

say() { echo "orchestrator-check: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
pass() { passed=$((passed + 1)); results+=("PASS $1"); echo "PASS $1"; }
fail() { failed=$((failed + 1)); results+=("FAIL $1"); echo "FAIL $1"; }
# A step this host cannot run as the orchestrator documents it: why, and what runs instead.
deviation() { deviations=$((deviations + 1)); echo "DEVIATION $1"; }

# checkout NAME GIT REF DIR: a clone of GIT at REF (a tag or a commit) in DIR, reused when
# DIR already has it. GIT may be a URL or a local repository or mirror.
checkout() {
  local name=$1 git=$2 ref=$3 dir=$4
  [ -d "$dir/.git" ] && [ "$(cat "$dir/.git/exitless-ref" 2>/dev/null)" = "$ref" ] && return 0
  rm -rf "$dir"
  say "fetching $name $ref from $git"
  git init -q "$dir" || return 1
  if git -C "$dir" fetch -q --depth 1 "$git" "$ref" 2>/dev/null; then
    git -C "$dir" -c advice.detachedHead=false checkout -q FETCH_HEAD
  elif git -C "$dir" fetch -q --tags "$git" '+refs/heads/*:refs/remotes/origin/*' 2>/dev/null; then
    git -C "$dir" -c advice.detachedHead=false checkout -q "$ref" 2>/dev/null || { say "$name has no $ref"; return 1; }
  else
    say "cannot fetch $name from $git"
    return 1
  fi
  echo "$ref" > "$dir/.git/exitless-ref"
}

# oci_image DIR LINE: a local OCI image (no registry is reachable) as DIR/image.tar,
# tagged "check": busybox, and /hello.txt holding LINE, which its default command prints.
oci_image() {
  local layout=$1/image bundle=$1/image-bundle a
  rm -rf "$layout" "$bundle"
  umoci init --layout "$layout" && umoci new --image "$layout:check" && umoci unpack --image "$layout:check" "$bundle" > /dev/null || return 1
  mkdir -p "$bundle/rootfs/bin"
  cp /bin/busybox "$bundle/rootfs/bin/busybox"
  for a in sh cat sleep echo; do ln -sf busybox "$bundle/rootfs/bin/$a"; done
  echo "$2" > "$bundle/rootfs/hello.txt"
  umoci repack --image "$layout:check" "$bundle" \
    && umoci config --image "$layout:check" --config.cmd /bin/cat --config.cmd /hello.txt --config.env PATH=/bin \
    && tar -C "$layout" -cf "$1/image.tar" .
}

# containerd_with_blockfile STATE SNAPSHOTTER_BIN CONTAINERD NAME [TOML]: the blockfile
# proxy snapshotter (a 256 MiB scratch image) and a containerd serving it as snapshotter
# NAME, both under STATE, TOML appended to containerd's config. Sets snapshotter_pid and
# containerd_pid; fails if either socket does not appear.
containerd_with_blockfile() {
  local state=$1 i
  mkdir -p "$state"/{lib,run,blockfile}
  truncate -s 256M "$state/scratch.ext4" && mkfs.ext4 -q -F "$state/scratch.ext4" || return 1
  setsid "$2" -socket "$state/run/blockfile.sock" -root "$state/blockfile" \
    -scratch "$state/scratch.ext4" > "$state/snapshotter.log" 2>&1 &
  snapshotter_pid=$!
  cat > "$state/containerd.toml" <<EOF
version = 2
root = "$state/lib"
state = "$state/run/containerd"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$state/run/containerd.sock"
[proxy_plugins]
  [proxy_plugins.$4]
    type = "snapshot"
    address = "$state/run/blockfile.sock"
${5:-}
EOF
  for i in $(seq 100); do [ -S "$state/run/blockfile.sock" ] && break; sleep 0.1; done
  setsid "$3" --config "$state/containerd.toml" > "$state/containerd.log" 2>&1 &
  containerd_pid=$!
  for i in $(seq 100); do [ -S "$state/run/containerd.sock" ] && return 0; sleep 0.1; done
  return 1
}

# Whether process $1 runs (a zombie does not).
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# The exitless processes whose working directory or command line lies under $1 (named
# firecracker where an orchestrator needs that name: KATA_JAILER).
vmms_under() {
  local pid
  for pid in $(pgrep -x 'exitless|firecracker' 2>/dev/null; pgrep -f '^[^ ]*/exitless ' 2>/dev/null); do
    [ -d "/proc/$pid" ] || continue
    if readlink "/proc/$pid/cwd" 2>/dev/null | grep -q "^$1" || tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q "$1"; then
      # A zombie is already gone as far as the VM is concerned.
      alive "$pid" && echo "$pid"
    fi
  done | sort -u
}

# vmm_cpu SECS PID...: each process's CPU over SECS seconds, in percent of a core.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
vmm_cpu() {
  local secs=$1 pid hz
  shift
  hz=$(getconf CLK_TCK)
  local before=()
  for pid in "$@"; do before+=("$(cpu_ticks "$pid")"); done
  sleep "$secs"
  local i=0
  for pid in "$@"; do
    awk -v a="${before[$i]}" -v b="$(cpu_ticks "$pid")" -v hz="$hz" -v s="$secs" 'BEGIN { printf "%.0f\n", (b - a) * 100 / hz / s }'
    i=$((i + 1))
  done
}

# What a run left behind under $1: VMM processes, sockets, loop devices, mounts.
leftovers() {
  local root=$1 what=()
  [ -n "$(vmms_under "$root")" ] && what+=("VMM processes $(vmms_under "$root" | tr '\n' ' ')")
  local loops
  loops=$(losetup -a 2>/dev/null | grep -F "$root" | cut -d: -f1 | tr '\n' ' ')
  [ -n "$loops" ] && what+=("loop devices $loops")
  local mounts
  mounts=$(awk -v r="$root" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | tr '\n' ' ')
  [ -n "$mounts" ] && what+=("mounts $mounts")
  # The VMs' sockets (API, vsock); the daemons' own (containerd.sock*, blockfile.sock)
  # go with $root.
  local sockets
  sockets=$(find "$root" -type s ! -name 'containerd.sock*' ! -name blockfile.sock 2>/dev/null | tr '\n' ' ')
  [ -n "$sockets" ] && what+=("sockets $sockets")
  local taps
  taps=$(ip -br link 2>/dev/null | grep -o '^fltap[^ @]*' | tr '\n' ' ')
  [ -n "$taps" ] && what+=("taps $taps")
  echo "${what[*]}"
}

# Removes everything under $1 a run may have left: processes first, then mounts and loops.
teardown() {
  local root=$1 pid
  for pid in $(vmms_under "$root"); do kill -9 "$pid" 2>/dev/null || true; done
  awk -v r="$root" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  losetup -a 2>/dev/null | grep -F "$root" | cut -d: -f1 | while read -r l; do losetup -d "$l" 2>/dev/null || true; done
}

summary() {
  echo "orchestrator-check: $passed passed, $failed failed, $deviations deviations forced by this host"
  [ "$failed" = 0 ]
}
