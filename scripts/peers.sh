#!/usr/bin/env bash
# Builds the peers exitless is measured beside, from their public sources at release tags:
# Firecracker (musl, as its releases ship) and Cloud Hypervisor. Not part of CI.
#
#   scripts/peers.sh [OUT_DIR]      (default ~/.cache/exitless/peers)
#
# Sources come from git URLs (FIRECRACKER_GIT, CLOUD_HYPERVISOR_GIT, MICRO_HTTP_GIT; local
# mirrors work). PEERS (default "firecracker cloud-hypervisor") names which to build.
# Prints each binary's path and version; `exitless bench peers` takes them with
# --firecracker and --cloud-hypervisor.
set -euo pipefail

FIRECRACKER_TAG=${FIRECRACKER_TAG:-v1.16.1}
CLOUD_HYPERVISOR_TAG=${CLOUD_HYPERVISOR_TAG:-v53.0}
FIRECRACKER_GIT=${FIRECRACKER_GIT:-https://github.com/firecracker-microvm/firecracker}
CLOUD_HYPERVISOR_GIT=${CLOUD_HYPERVISOR_GIT:-https://github.com/cloud-hypervisor/cloud-hypervisor}
MICRO_HTTP_GIT=${MICRO_HTTP_GIT:-https://github.com/firecracker-microvm/micro-http}
RUST_VMM_CI_GIT=${RUST_VMM_CI_GIT:-https://github.com/rust-vmm/rust-vmm-ci}
PEERS=${PEERS:-firecracker cloud-hypervisor}
out=${1:-$HOME/.cache/exitless/peers}
mkdir -p "$out"
src=$out/src
mkdir -p "$src"

need=()
for pkg in libseccomp-dev libclang-dev musl-tools; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "peers: installing ${need[*]}" >&2
  apt-get install -y -q "${need[@]}" >/dev/null
fi
rustup target list --installed | grep -qx x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl

# Both peers take micro-http (and its rust-vmm-ci submodule) from GitHub by git URL:
# point cargo at MICRO_HTTP_GIT and RUST_VMM_CI_GIT.
export GIT_CONFIG_COUNT=2
export GIT_CONFIG_KEY_0="url.$MICRO_HTTP_GIT.insteadOf"
export GIT_CONFIG_VALUE_0=https://github.com/firecracker-microvm/micro-http
export GIT_CONFIG_KEY_1="url.$RUST_VMM_CI_GIT.insteadOf"
export GIT_CONFIG_VALUE_1=https://github.com/rust-vmm/rust-vmm-ci.git
export CARGO_NET_GIT_FETCH_WITH_CLI=true

checkout() { # URL TAG DIR
  if [[ ! -d $3/.git ]]; then
    git clone -q --no-checkout "$1" "$3"
  fi
  git -C "$3" fetch -q --tags "$1" || true
  # A mirror may lack its largest blobs (test fixtures): leave those files out.
  local missing
  missing=$(git -C "$3" ls-tree -r "$2" | while read -r _ type sha path; do
    [[ $type == blob ]] && ! git -C "$3" cat-file -e "$sha" 2>/dev/null && echo "!/$path"
  done || true)
  if [[ -n $missing ]]; then
    echo "peers: $(wc -l <<<"$missing") files absent from the source, left out" >&2
    git -C "$3" sparse-checkout set --no-cone '/*' $missing 2>/dev/null
  fi
  git -C "$3" checkout -q -f "$2"
}

if [[ " $PEERS " == *" firecracker "* ]]; then
  checkout "$FIRECRACKER_GIT" "$FIRECRACKER_TAG" "$src/firecracker"
  echo "peers: building Firecracker $FIRECRACKER_TAG (musl)" >&2
  # musl-gcc carries no kernel headers; Debian's (linux-libc-dev) serve for the few C files.
  export CFLAGS_x86_64_unknown_linux_musl="-idirafter /usr/include -idirafter /usr/include/x86_64-linux-gnu"
  (cd "$src/firecracker" && CARGO_TARGET_DIR=target cargo build -q --release --target x86_64-unknown-linux-musl -p firecracker)
  cp "$src/firecracker/target/x86_64-unknown-linux-musl/release/firecracker" "$out/firecracker"
  echo "$out/firecracker: $("$out/firecracker" --version | head -1)"
fi

if [[ " $PEERS " == *" cloud-hypervisor "* ]]; then
  checkout "$CLOUD_HYPERVISOR_GIT" "$CLOUD_HYPERVISOR_TAG" "$src/cloud-hypervisor"
  echo "peers: building Cloud Hypervisor $CLOUD_HYPERVISOR_TAG" >&2
  (cd "$src/cloud-hypervisor" && CARGO_TARGET_DIR=target cargo build -q --release --bin cloud-hypervisor)
  cp "$src/cloud-hypervisor/target/release/cloud-hypervisor" "$out/cloud-hypervisor"
  echo "$out/cloud-hypervisor: $("$out/cloud-hypervisor" --version | head -1)"
fi
