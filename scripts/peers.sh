#!/usr/bin/env bash
# Builds the peers exitless is measured beside, from their public sources at release tags:
# Firecracker (musl, as its releases ship) and Cloud Hypervisor. Not part of CI.
#
#   scripts/peers.sh [OUT_DIR]      (default ~/.cache/exitless/peers)
#
# Sources come from git URLs (FIRECRACKER_GIT, CLOUD_HYPERVISOR_GIT, MICRO_HTTP_GIT; local
# mirrors work). Prints each binary's path and version; `exitless bench peers` takes them
# with --firecracker and --cloud-hypervisor.
set -euo pipefail

FIRECRACKER_TAG=${FIRECRACKER_TAG:-v1.16.1}
CLOUD_HYPERVISOR_TAG=${CLOUD_HYPERVISOR_TAG:-v53.0}
FIRECRACKER_GIT=${FIRECRACKER_GIT:-https://github.com/firecracker-microvm/firecracker}
CLOUD_HYPERVISOR_GIT=${CLOUD_HYPERVISOR_GIT:-https://github.com/cloud-hypervisor/cloud-hypervisor}
MICRO_HTTP_GIT=${MICRO_HTTP_GIT:-https://github.com/firecracker-microvm/micro-http}
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

# Both peers take micro-http from GitHub by git URL: point cargo at MICRO_HTTP_GIT.
export GIT_CONFIG_COUNT=1
export GIT_CONFIG_KEY_0="url.$MICRO_HTTP_GIT.insteadOf"
export GIT_CONFIG_VALUE_0=https://github.com/firecracker-microvm/micro-http
export CARGO_NET_GIT_FETCH_WITH_CLI=true

checkout() { # URL TAG DIR
  if [[ ! -d $3/.git ]]; then
    git clone -q "$1" "$3"
  fi
  git -C "$3" fetch -q --tags "$1" || true
  git -C "$3" checkout -q "$2"
}

checkout "$FIRECRACKER_GIT" "$FIRECRACKER_TAG" "$src/firecracker"
echo "peers: building Firecracker $FIRECRACKER_TAG (musl)" >&2
(cd "$src/firecracker" && cargo build -q --release --target x86_64-unknown-linux-musl -p firecracker)
cp "$src/firecracker/target/x86_64-unknown-linux-musl/release/firecracker" "$out/firecracker"

checkout "$CLOUD_HYPERVISOR_GIT" "$CLOUD_HYPERVISOR_TAG" "$src/cloud-hypervisor"
echo "peers: building Cloud Hypervisor $CLOUD_HYPERVISOR_TAG" >&2
(cd "$src/cloud-hypervisor" && cargo build -q --release --bin cloud-hypervisor)
cp "$src/cloud-hypervisor/target/release/cloud-hypervisor" "$out/cloud-hypervisor"

echo "$out/firecracker: $("$out/firecracker" --version | head -1)"
echo "$out/cloud-hypervisor: $("$out/cloud-hypervisor" --version | head -1)"
