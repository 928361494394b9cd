#!/usr/bin/env bash
# Runs container orchestrators that drive Firecracker with exitless in its place, end to
# end, and prints one PASS/FAIL line per step and a summary line.
#   scripts/orchestrator-check.sh [firecracker-containerd|flintlock|kata|all]   (default all)
# Each orchestrator is built from its public source at a pinned commit or tag
# (FIRECRACKER_CONTAINERD_GIT/_REF, FLINTLOCK_GIT/_REF, KATA_GIT/_REF: URLs or local mirrors);
# Go modules come from the module proxy. Nothing of theirs is kept in this repository:
# sources and builds go to $EXITLESS_CACHE/orchestrators (default ~/.cache/exitless), a run's
# state to WORK (default /tmp/exitless-orchestrators), removed at the end with everything
# the run started (VMM processes, sockets, loop devices, mounts); the last step checks that.
# Where this host forces a deviation from an orchestrator's documented use, a DEVIATION
# line says which and why. Not in CI: it builds third-party code and boots Linux guests
# (minutes each on this host). Needs root, Go, gcc, git, umoci, runc, busybox-static,
# e2fsprogs (apt-get installs what is missing).
# Env: EXITLESS (binary, default target/x86_64-unknown-linux-gnu/release/exitless),
# KERNEL (default: scripts/guest-kernel.sh's microVM kernel), FCC_FLEET (VMs at once, 5),
# KEEP (1: keep $WORK's logs), FCC_STEPS (containers fleet bad), FCC_BOOT_TIMEOUT (s, 300), FL_REGISTRY (the local registry's address, localhost:5055),
# KATA_JAILER (1: Kata starts exitless through exitless-jailer, its jailer_path).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
work=${WORK:-/tmp/exitless-orchestrators}
cache=${EXITLESS_CACHE:-$HOME/.cache/exitless}/orchestrators
which=${1:-all}
. "$here/scripts/orchestrator/lib.sh"
. "$here/scripts/orchestrator/firecracker-containerd.sh"
. "$here/scripts/orchestrator/flintlock.sh"
. "$here/scripts/orchestrator/kata.sh"

case "$which" in
  firecracker-containerd | flintlock | kata | all) ;;
  *) echo "usage: $0 [firecracker-containerd|flintlock|kata|all]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { say "needs root (loop devices, mounts, network namespaces)"; exit 2; }
[ -x "$exitless" ] || { say "no exitless binary at $exitless (cargo build --release)"; exit 2; }
command -v go > /dev/null || { say "needs Go"; exit 2; }
need=()
for p in runc busybox-static umoci e2fsprogs gcc git docker-registry openssh-client; do dpkg -s "$p" > /dev/null 2>&1 || need+=("$p"); done
if ((${#need[@]})); then
  say "installing ${need[*]}"
  apt-get install -y -q "${need[@]}" > /dev/null || { say "apt-get install ${need[*]} failed"; exit 2; }
fi
mkdir -p "$work" "$cache"
shim_sockets_before=$(ls /run/containerd/s 2>/dev/null | sort)

# containerd's shims bind sockets under /run/containerd/s named by a hash of (daemon
# socket, namespace, id); one left by a killed shim makes the next run's VM of that id
# "already exist". Those this run made are removed with the rest.
new_shim_sockets() { comm -13 <(echo "$shim_sockets_before") <(ls /run/containerd/s 2>/dev/null | sort) | tr '\n' ' '; }

cleanup() {
  fcc_stop 2> /dev/null
  fl_stop 2> /dev/null
  kata_stop 2> /dev/null
  teardown "$work"
  local s
  for s in $(new_shim_sockets); do rm -f "/run/containerd/s/$s"; done
}
trap 'cleanup; exit 130' INT TERM

kernel=${KERNEL:-$("$here/scripts/guest-kernel.sh")} || { say "no guest kernel"; exit 1; }
say "exitless $exitless; kernel $kernel; go $(go env GOVERSION)"

case "$which" in
  firecracker-containerd | all) fcc_check; fcc_stop ;;
esac
case "$which" in
  flintlock | all) fl_check; fl_stop ;;
esac
case "$which" in
  kata | all) kata_check; kata_stop ;;
esac

left_by_run=$(new_shim_sockets)
[ -n "${left_by_run// /}" ] && say "the orchestrators left shim sockets in /run/containerd/s: $left_by_run(removed)"
cleanup
# Kata keeps its VMs' directories under /run/vc.
left="$(leftovers "$work") $(leftovers /run/vc)"
left=$(echo $left)
new_sockets=$(new_shim_sockets)
if [ -z "$left" ] && [ -z "${new_sockets// /}" ]; then
  pass "nothing left behind (no VMM process, VM socket, tap, loop device or mount under $work; no shim socket in /run/containerd/s)"
else
  fail "left behind: $left ${new_sockets:+shim sockets $new_sockets}"
fi
# KEEP=1 keeps the run's logs and files (its processes and mounts are gone either way).
[ -n "${KEEP:-}" ] || rm -rf "$work"
summary
