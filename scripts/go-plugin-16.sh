#!/usr/bin/env bash
# Build tests/goplugin16 (a go-plugin 1.6.3 host and plugin for the interoperability
# tests in host/drover/tests/compat/goplugin16*.rs) offline, in GOPATH mode, against the
# go-plugin 1.6.3 source tarball and Debian's Go packages (recipe:
# ../shared/go-plugin/README.md). Everything it makes is under target/go-plugin-16/.
#
# On success it prints one line for the caller to export:
#     DROVER_TEST_GOPLUGIN16=<path of the built program>
# Without the tarball it skips loudly (exit 0, nothing printed); under CI=true that,
# like any other failure, is an error.
#
# The tarball is looked for at $DROVER_GO_PLUGIN_16_TAR, then
# <repo>/../shared/go-plugin/go-plugin-v1.6.3.tar, then
# /work/shared/go-plugin/go-plugin-v1.6.3.tar. The protobuf packages go-plugin 1.6
# needs are downloaded with `apt-get download` (once) and unpacked, not installed:
# they conflict with the ones Debian's go-plugin 1.0.1 (tests/goplugin-compat) uses.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out_dir="$repo/target/go-plugin-16"
commit_expected=5b05b3e78c6c3e4e0b8f21a9921cbd739ba72f2a

skip() {
    if [ "${CI:-}" = "true" ]; then
        echo "go-plugin 1.6.3 tests cannot run: $1 (CI=true: this is a failure)" >&2
        exit 1
    fi
    echo "########################################################################" >&2
    echo "# SKIPPING the go-plugin 1.6.3 interoperability tests: $1" >&2
    echo "########################################################################" >&2
    exit 0
}

tar_path=""
for candidate in "${DROVER_GO_PLUGIN_16_TAR:-}" \
    "$repo/../shared/go-plugin/go-plugin-v1.6.3.tar" \
    /work/shared/go-plugin/go-plugin-v1.6.3.tar; do
    if [ -n "$candidate" ] && [ -f "$candidate" ]; then
        tar_path=$(realpath "$candidate")
        break
    fi
done
[ -n "$tar_path" ] || skip "no go-plugin-v1.6.3.tar (set DROVER_GO_PLUGIN_16_TAR or put it in ../shared/go-plugin/)"
command -v go >/dev/null || skip "no go toolchain (golang-go)"

# The very bytes: `git archive` of v1.6.3 (the commit id in its header alone would not
# tell a tampered tarball).
sha256_expected=90dac4e23484e097b55ae101f6ca45d6ac345f5d814ed1f17e58c4e98b7738aa
sha256=$(sha256sum "$tar_path" | cut -d' ' -f1)
if [ "$sha256" != "$sha256_expected" ]; then
    echo "$tar_path is not the go-plugin v1.6.3 tarball: sha256 $sha256, expected $sha256_expected" >&2
    exit 1
fi
# `git archive` records the commit in the tar's header: it must be v1.6.3's.
commit=$(git get-tar-commit-id <"$tar_path" || true)
if [ "$commit" != "$commit_expected" ]; then
    echo "$tar_path is not go-plugin v1.6.3: git archive commit '${commit:-none}', expected $commit_expected" >&2
    exit 1
fi
# The .commit file shipped beside it, when there, must say the same.
commit_file="${tar_path%.tar}.commit"
if [ -f "$commit_file" ] && [ "$(tr -d '[:space:]' <"$commit_file")" != "$commit" ]; then
    echo "$tar_path holds commit $commit but $commit_file says $(cat "$commit_file")" >&2
    exit 1
fi
listing=$(tar -tf "$tar_path")
grep -qx 'server.go' <<<"$listing" && grep -qx 'mtls.go' <<<"$listing" || {
    echo "$tar_path does not hold go-plugin's sources (no server.go / mtls.go at its top)" >&2
    exit 1
}

gopath="$out_dir/gopath"
mkdir -p "$out_dir"

# go-plugin's source, extracted once per tarball.
gp_src="$gopath/src/github.com/hashicorp/go-plugin"
if [ "$(cat "$out_dir/go-plugin.commit" 2>/dev/null || true)" != "$commit" ]; then
    rm -rf "$gp_src"
    mkdir -p "$gp_src"
    tar -xf "$tar_path" -C "$gp_src"
    echo "$commit" >"$out_dir/go-plugin.commit"
fi

# golang/protobuf 1.5 and google.golang.org/protobuf, unpacked from their Debian packages.
if [ ! -d "$gopath/src/google.golang.org/protobuf" ] || [ ! -d "$gopath/src/github.com/golang/protobuf" ]; then
    debs="$out_dir/debs"
    rm -rf "$debs"
    mkdir -p "$debs"
    download() { (cd "$debs" && apt-get download golang-github-golang-protobuf-1-5-dev golang-google-protobuf-dev) >&2; }
    # A machine that had every package installed may never have fetched the lists.
    download || { [ "$(id -u)" -eq 0 ] && apt-get update -q >&2 && download; } ||
        skip "apt-get download of golang-github-golang-protobuf-1-5-dev golang-google-protobuf-dev failed"
    unpacked="$out_dir/unpacked"
    rm -rf "$unpacked"
    for deb in "$debs"/*.deb; do
        dpkg-deb -x "$deb" "$unpacked"
    done
    for pkg in github.com/golang/protobuf google.golang.org/protobuf; do
        rm -rf "${gopath:?}/src/$pkg"
        mkdir -p "$(dirname "$gopath/src/$pkg")"
        # Debian's packages are symlink farms in places: copy what the links point to.
        cp -rL "$unpacked/usr/share/gocode/src/$pkg" "$gopath/src/$pkg"
    done
    rm -rf "$unpacked" "$debs"
fi

# Our program, linked into the private GOPATH (GOPATH mode builds only from there).
prog_pkg="$gopath/src/drover.test/goplugin16"
mkdir -p "$(dirname "$prog_pkg")"
ln -sfn "$repo/tests/goplugin16" "$prog_pkg"

bin="$out_dir/goplugin16"
if [ -x "$bin" ] && [ -z "$(find "$repo/tests/goplugin16" "$out_dir/go-plugin.commit" -newer "$bin" -print -quit)" ]; then
    echo "DROVER_TEST_GOPLUGIN16=$bin"
    exit 0
fi
mkdir -p "$out_dir/tmp"
(
    cd "$prog_pkg"
    GO111MODULE=off GOPROXY=off GOFLAGS= CGO_ENABLED=0 \
        GOPATH="$gopath:/usr/share/gocode" \
        GOCACHE="$out_dir/gocache" \
        GOTMPDIR="$out_dir/tmp" \
        go build -o "$bin.tmp" .
)
mv -f "$bin.tmp" "$bin"
echo "DROVER_TEST_GOPLUGIN16=$bin"
