#!/usr/bin/env bash
# Installs virtiofsd, the virtio-fs project's vhost-user-fs backend, which exitless's
# virtio-fs device talks to (`exitless run --fs` starts it; `PUT /fs` takes its socket).
#
#   scripts/virtiofsd.sh [ROOT]      (default ~/.cache/exitless/virtiofsd)
#
# Prints the binary's path. It needs libcap-ng's and libseccomp's headers (Debian packages);
# `cargo install` compiles it for a few minutes the first time, then it is cached.
set -euo pipefail

VERSION=${VIRTIOFSD_VERSION:-1.14.0}
root=${1:-$HOME/.cache/exitless/virtiofsd}
bin=$root/bin/virtiofsd

if [[ -x $bin ]] && "$bin" --version 2>/dev/null | grep -q "$VERSION"; then
  echo "$bin"
  exit 0
fi

need=()
for pkg in libcap-ng-dev libseccomp-dev pkg-config; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "virtiofsd: installing ${need[*]}" >&2
  apt-get install -y -q "${need[@]}" >/dev/null
fi

# Its own lock file pins what 1.14.0 was released with; build for the host's default target
# (the workspace's musl default does not apply outside it).
cargo install --locked virtiofsd --version "$VERSION" --root "$root" >&2
"$bin" --version >&2
echo "$bin"
