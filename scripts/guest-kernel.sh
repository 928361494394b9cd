#!/usr/bin/env bash
# Builds exitless's microVM guest kernel (an ELF vmlinux with a PVH note) from Debian's
# linux-source-6.1 with resources/guest-kernel/microvm-x86_64-6.1.config merged over
# allnoconfig, and prints its path. The kernel is kept in a cache outside the repo
# ($EXITLESS_CACHE, default ~/.cache/exitless) under a key of the config and the source
# version, so a second run with neither changed prints the same path at once.
#   scripts/guest-kernel.sh            # build (or reuse) and print the vmlinux path
#   scripts/guest-kernel.sh --config firecracker
# The second builds Firecracker's own guest config instead, whole (not merged over
# allnoconfig): resources/guest_configs/microvm-kernel-ci-x86_64-6.1.config at
# FIRECRACKER_TAG (v1.16.1) from FIRECRACKER_GIT (its GitHub URL unless given; a local
# mirror works), completed by olddefconfig for Debian's 6.1 source, in a build directory
# of its own.
# Needs root for apt-get the first time (linux-source-6.1, flex, bison, bc, libelf-dev).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fragment=$here/resources/guest-kernel/microvm-x86_64-6.1.config
cache=${EXITLESS_CACHE:-$HOME/.cache/exitless}/guest-kernel
say() { echo "guest-kernel: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
flavour=microvm
if [ "${1:-}" = --config ]; then
  [ "${2:-}" = firecracker ] || fail "--config takes firecracker"
  flavour=firecracker
  FIRECRACKER_TAG=${FIRECRACKER_TAG:-v1.16.1}
  FIRECRACKER_GIT=${FIRECRACKER_GIT:-https://github.com/firecracker-microvm/firecracker}
  mkdir -p "$cache"
  fc_config=$cache/firecracker-$FIRECRACKER_TAG-x86_64-6.1.config
  if [ ! -s "$fc_config" ]; then
    say "fetching Firecracker $FIRECRACKER_TAG's guest config from $FIRECRACKER_GIT"
    path=resources/guest_configs/microvm-kernel-ci-x86_64-6.1.config
    if [ -d "$FIRECRACKER_GIT" ]; then
      # A local repository or mirror: read the one file (a mirror may lack other blobs).
      git -C "$FIRECRACKER_GIT" show "$FIRECRACKER_TAG:$path" > "$fc_config.tmp" \
        || { rm -f "$fc_config.tmp"; fail "cannot read $path at $FIRECRACKER_TAG in $FIRECRACKER_GIT"; }
    else
      tmp=$(mktemp -d)
      git -C "$tmp" init -q && git -C "$tmp" fetch -q --depth 1 "$FIRECRACKER_GIT" "refs/tags/$FIRECRACKER_TAG" \
        && git -C "$tmp" show "FETCH_HEAD:$path" > "$fc_config.tmp" \
        || { rm -rf "$tmp" "$fc_config.tmp"; fail "cannot read $path at $FIRECRACKER_TAG from $FIRECRACKER_GIT"; }
      rm -rf "$tmp"
    fi
    mv "$fc_config.tmp" "$fc_config"
  fi
  fragment=$fc_config
fi

[ -r "$fragment" ] || fail "no config at $fragment"
if ! dpkg-query -W -f '${Status}' linux-source-6.1 2>/dev/null | grep -q 'ok installed'; then
  say "installing linux-source-6.1 and the build tools (apt-get)"
  { apt-get update && apt-get install -y linux-source-6.1 flex bison bc libelf-dev libssl-dev; } >&2 \
    || fail "step 1/4 (install linux-source-6.1): apt-get failed"
fi
version=$(dpkg-query -W -f '${Version}' linux-source-6.1)
tarball=$(ls /usr/src/linux-source-6.1.tar.* 2>/dev/null | head -1)
[ -n "$tarball" ] || fail "step 1/4: linux-source-6.1 is installed but /usr/src has no tarball"
key=$( (echo "$version"; cat "$fragment") | sha256sum | cut -c1-16)
out=$cache/vmlinux-6.1-$key
[ "$flavour" = microvm ] || out=$cache/vmlinux-6.1-$flavour-$key
if [ -s "$out" ]; then
  say "cached: $out (source $version, config unchanged)"
  echo "$out"
  exit 0
fi
mkdir -p "$cache"
src=$cache/src-$version
if [ ! -f "$src/Makefile" ]; then
  say "step 2/4: unpacking $tarball"
  rm -rf "$src.tmp" && mkdir -p "$src.tmp"
  tar -xf "$tarball" -C "$src.tmp" --strip-components=1 || fail "step 2/4 (unpack): tar failed"
  mv "$src.tmp" "$src"
fi
# One build directory per source version: a changed config rebuilds only what it touches.
build=$cache/build-$version
[ "$flavour" = microvm ] || build=$cache/build-$flavour-$version
mkdir -p "$build"
if [ "$flavour" = firecracker ]; then
  say "step 3/4: configuring ($(basename "$fragment") whole, olddefconfig)"
  cp "$fragment" "$build/.config"
  make -s -C "$src" O="$build" ARCH=x86_64 olddefconfig >&2 || fail "step 3/4 (olddefconfig)"
else
  say "step 3/4: configuring (allnoconfig + $(basename "$fragment"))"
  make -s -C "$src" O="$build" ARCH=x86_64 allnoconfig >&2 || fail "step 3/4 (allnoconfig)"
  "$src/scripts/kconfig/merge_config.sh" -m -O "$build" "$build/.config" "$fragment" >/dev/null \
    || fail "step 3/4 (merge_config)"
  make -s -C "$src" O="$build" ARCH=x86_64 olddefconfig >&2 || fail "step 3/4 (olddefconfig)"
fi
# Every option the fragment sets must have survived (a dependency it lacks drops it); a
# whole config of another kernel version may lose options this source does not have.
missing=0
while read -r line; do
  case "$line" in
    CONFIG_*=*) grep -qx "$line" "$build/.config" || { say "not set as asked: $line"; missing=1; } ;;
    "# CONFIG_"*" is not set") name=${line#\# }; name=${name%% *}
      ! grep -q "^$name=y" "$build/.config" || { say "set though the config says not: $name"; missing=1; } ;;
  esac
done < "$fragment"
[ "$missing" = 0 ] || [ "$flavour" = firecracker ] || fail "step 3/4: the config does not hold (see above)"
say "step 4/4: building vmlinux with $(nproc) jobs (about 10 minutes on 2 cores the first time)"
start=$(date +%s)
make -s -C "$src" O="$build" ARCH=x86_64 -j"$(nproc)" vmlinux >&2 || fail "step 4/4 (make vmlinux)"
cp "$build/vmlinux" "$out.tmp" && mv "$out.tmp" "$out"
say "built $out in $(( $(date +%s) - start )) s"
echo "$out"
