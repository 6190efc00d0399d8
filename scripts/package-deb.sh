#!/usr/bin/env bash
# Build the `drover` Debian package around an already built `drover` binary, with
# dpkg-deb alone (no cargo-deb: installing it costs minutes of compiling in CI, and
# this packages the binary the test suite already built instead of building another).
#
#   cargo build --release -p drover && scripts/package-deb.sh
#   scripts/package-deb.sh --binary target/debug/drover --out /tmp/deb --compress none
#
# Contents: /usr/bin/drover and /usr/bin/drover-executor (beside it, where the
# drivers find it); the systemd units drover-agent.service and
# drover-server.service in /lib/systemd/system; /etc/drover/{agent,server}.toml
# (conffiles); the maintainer scripts (packaging/deb/). Prints the .deb's path.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/packaging/deb"
binary="$root/target/release/drover"
out="$root/target/debian"
compress=xz

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    echo "options: --binary PATH (default target/release/drover), --out DIR (default" \
        "target/debian), --compress xz|gzip|zstd|none (default xz)" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --compress) compress=${2:?--compress needs xz, gzip, zstd or none}; shift 2 ;;
    -h | --help) usage ;;
    *) echo "package-deb.sh: unknown argument $1" >&2; usage ;;
    esac
done

case "$compress" in
xz | gzip | zstd | none) ;;
*) echo "package-deb.sh: --compress $compress: give xz, gzip, zstd or none" >&2; exit 2 ;;
esac
command -v dpkg-deb >/dev/null || {
    echo "package-deb.sh: dpkg-deb is missing (apt-get install dpkg)" >&2
    exit 1
}
if [ ! -x "$binary" ]; then
    echo "package-deb.sh: no drover binary at $binary (build it: cargo build --release -p drover," \
        "or give --binary PATH)" >&2
    exit 1
fi

# Built with it (cargo build -p drover builds both): the drivers refuse an executor of
# another build, so the package never ships a pair that does not match.
executor="$(dirname "$binary")/drover-executor"
if [ ! -x "$executor" ]; then
    echo "package-deb.sh: no drover-executor beside $binary (cargo build --release -p drover" \
        "builds both)" >&2
    exit 1
fi

# The version is the binary's own (`drover 0.1.0`), so the package never claims
# another.
version=$("$binary" --version | awk 'NR == 1 { print $2 }')
if ! [[ "$version" =~ ^[0-9][A-Za-z0-9.+~-]*$ ]]; then
    echo "package-deb.sh: cannot read a version from \`$binary --version\`: got '$version'" >&2
    exit 1
fi
arch=$(dpkg --print-architecture)

stage=$(mktemp -d "${TMPDIR:-/tmp}/drover-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"

install -D -m 0755 "$binary" "$stage/usr/bin/drover"
# The per-task executor, beside drover, where the drivers look for it.
install -D -m 0755 "$executor" "$stage/usr/bin/drover-executor"
for unit in drover-agent.service drover-server.service; do
    install -D -m 0644 "$src/$unit" "$stage/lib/systemd/system/$unit"
done
# No secret in these (the token is a file of its own, made by the postinst): 0644.
for conf in agent.toml server.toml; do
    install -D -m 0644 "$src/$conf" "$stage/etc/drover/$conf"
done
install -D -m 0644 "$root/README.md" "$stage/usr/share/doc/drover/README.md"
install -D -m 0644 /dev/stdin "$stage/usr/share/doc/drover/copyright" <<'COPYRIGHT'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: drover

Files: *
License: MPL-2.0
 On Debian systems, the full text of the Mozilla Public License 2.0 can be found in
 /usr/share/common-licenses/MPL-2.0.
COPYRIGHT

install -d -m 0755 "$stage/DEBIAN"
for script in postinst prerm postrm; do
    install -m 0755 "$src/$script" "$stage/DEBIAN/$script"
done
printf '/etc/drover/agent.toml\n/etc/drover/server.toml\n' >"$stage/DEBIAN/conffiles"
installed_kib=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: drover
Version: $version
Architecture: $arch
Maintainer: Drover developers <drover@localhost>
Installed-Size: $installed_kib
Depends: adduser, libc6
Suggests: docker.io, qemu-system-x86, default-jre-headless, containernetworking-plugins, iptables
Section: admin
Priority: optional
Description: task runtime with out-of-process driver plugins (agent and server)
 Drover runs tasks on a machine through driver plugins (raw_exec, exec, java,
 docker, qemu) and schedules jobs over a cluster of such machines, speaking
 Nomad's job files and HTTP API.
 .
 This package has the drover binary and the systemd units drover-agent (root:
 it manages cgroups, namespaces and mounts) and drover-server (an unprivileged
 "drover" user), with their configuration in /etc/drover.
CONTROL

mkdir -p "$out"
deb="$out/drover_${version}_${arch}.deb"
dpkg-deb --root-owner-group "-Z$compress" --build "$stage" "$deb" >/dev/null
echo "$deb"
