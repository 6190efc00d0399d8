#!/usr/bin/env bash
# Link Drover's standalone plugin binaries static-pie, in place of cargo's usual
# dynamically linked ones (target/release/<plugin>, or target/debug with --debug):
#
#   scripts/build-plugins.sh [--debug]
#
# Why: a plugin is launched, handshaken and asked its first RPC on every agent start
# and after every plugin crash. Without the dynamic loader (no libc, libm, libgcc_s to
# map and bind, no library constructors) that takes ~40 % less: `drover-bench
# handshake` measured 1.11 ms against 1.83-2.07 ms for the same code linked
# dynamically (about 1.8x against 3.1x the cost of spawning /bin/true). Go's plugins,
# Nomad's among them, are static binaries too. Static-pie keeps ASLR.
#
# A release build uses the `plugin` profile (Cargo.toml): release with fat LTO and one
# codegen unit. The plugin's relocated data, which every launch copies page by page
# before main, shrinks by a quarter (rawexec: 292 -> 216 KiB, 19,480 -> 14,144
# relocations), its code by a seventh (8.5 -> 7.3 MiB), and a launch takes 6-10 % less
# (`drover-bench handshake --plugin`, alternated: 1.02-1.07 ms against 1.14 ms). It
# builds its own copy of every dependency (target/plugin/, 3-5 minutes on two cores);
# the binary is then copied to target/release/, where agents and `drover-bench` look.
#
# Relative relocations are packed (DT_RELR, `-z pack-relative-relocs`) where the linker
# and the static glibc support them (binutils 2.38, glibc 2.36): rawexec's relocation
# table shrinks from 341 KB of RELA entries (14,183 of them, all read and applied at
# every start) to 3.7 KB of bitmaps, and a start costs ~15 % less CPU (`perf stat -r 400`
# of the plugin run by hand: 0.85 -> 0.72 and 0.99 -> 0.82 ms task-clock, alternated).
# The relocated pages are the same; only the table that says where they are is smaller.
# Probed on a static-pie C program first: a glibc without RELR support in its static
# start-up would link the packed table and then crash at the first pointer.
#
# Only `cargo rustc` can link one binary of a package statically (crt-static for the
# whole build would reach the proc-macros and the plugins' cdylibs): the libraries
# are the ones `cargo build` (or `--profile plugin`) makes; only the final link
# differs. A later `cargo build --release` of the package links target/release's copy
# dynamically again.
#
# Listed: the plugins that resolve no user or host names. A statically linked glibc
# still loads its NSS modules at run time, and they must match the glibc it was
# linked with; exec and java look users up (`user = ...`) and stay dynamically linked.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=plugin
if [ "${1:-}" = "--debug" ]; then
    profile=dev
elif [ $# -gt 0 ]; then
    echo "usage: $0 [--debug]" >&2
    exit 2
fi
plugins=(drover-driver-rawexec)

target_dir=$(cargo metadata --format-version 1 --no-deps --locked | jq -r .target_directory)
built_dir="$target_dir/$([ "$profile" = dev ] && echo debug || echo "$profile")"
out_dir="$target_dir/$([ "$profile" = dev ] && echo debug || echo release)"
mkdir -p "$out_dir"

# Refuse a binary that is not what this script promises: static-pie, and no name
# lookups. Checked on the file cargo built, before anything is installed from it.
check_static_pie() {
    local binary=$1 header segments
    # Read whole before matching: `grep -q` stops reading at its match, and under
    # pipefail the reader's SIGPIPE would count as a failed match.
    header=$(readelf -h "$binary")
    segments=$(readelf -l "$binary")
    # static-pie: position independent (ELF type DYN) and no program interpreter.
    if ! grep -q 'DYN (Position-Independent Executable' <<<"$header"; then
        echo "build-plugins.sh: $binary is not position independent" >&2
        return 1
    fi
    if grep -q 'INTERP' <<<"$segments"; then
        echo "build-plugins.sh: $binary still asks for a dynamic loader" >&2
        return 1
    fi
    # The list above is kept by hand: a listed plugin that starts looking names up is
    # refused here rather than shipped with a glibc that may not find its NSS modules.
    local lookups
    lookups=$(readelf -sW "$binary" |
        grep -oE ' (getpwnam|getpwuid|getgrnam|getgrgid|getgrouplist|getaddrinfo|gethostbyname)(_r)?$' |
        sort -u | tr -d ' ' | paste -sd, -) || true
    if [ -n "$lookups" ]; then
        echo "build-plugins.sh: $binary looks names up ($lookups): it must stay dynamically linked" >&2
        return 1
    fi
}

# Whether this toolchain packs relative relocations into a static-pie that then runs:
# prints the rustc flags for it, or nothing.
relr_flags() {
    local probe
    probe=$(mktemp -d)
    # A relocated pointer (`p`), which the start-up code must fix up before main.
    printf 'static int x = 42; int *p = &x;\nint main(void) { return *p == 42 ? 0 : 1; }\n' \
        >"$probe/probe.c"
    if cc -static-pie -fPIE -Wl,-z,pack-relative-relocs -o "$probe/probe" "$probe/probe.c" \
        2>/dev/null &&
        readelf -d "$probe/probe" | grep -q '(RELR)' &&
        "$probe/probe"; then
        echo "-C link-arg=-Wl,-z,pack-relative-relocs"
    else
        echo "build-plugins.sh: the linker or static glibc cannot pack relative relocations (DT_RELR); linking without" >&2
    fi
    rm -rf -- "$probe"
}
read -r -a extra_flags <<<"$(relr_flags)"

staged=""
trap 'if [ -n "$staged" ]; then rm -f -- "$staged"; fi' EXIT
for plugin in "${plugins[@]}"; do
    cargo rustc --locked --profile "$profile" -p "$plugin" --bin "$plugin" \
        -- -C target-feature=+crt-static "${extra_flags[@]}"
    check_static_pie "$built_dir/$plugin"
    binary="$out_dir/$plugin"
    if [ "$built_dir" != "$out_dir" ]; then
        # Beside the other release binaries, under a fresh name in the same directory
        # (removed if anything fails), then renamed over the old one: a plugin process
        # still running the old file keeps its bytes, and an agent never sees half a
        # binary.
        staged=$(mktemp "$out_dir/.$plugin.XXXXXX")
        cp "$built_dir/$plugin" "$staged"
        chmod 0755 "$staged"
        check_static_pie "$staged"
        mv -f -- "$staged" "$binary"
        staged=""
    fi
    echo "static-pie: $binary"
done
