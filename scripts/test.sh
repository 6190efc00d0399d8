#!/usr/bin/env bash
# The whole Drover test suite, on a fresh machine: installs what the tests need if it
# is missing, builds every workspace binary (the end-to-end tests launch the real
# plugin binaries), then runs every test. Under CI=true a missing component fails.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v cc >/dev/null || need_pkgs+=(gcc)
# go-plugin wire compatibility is tested against real go-plugin code (GOPATH build).
command -v go >/dev/null || need_pkgs+=(golang-go)
[ -d /usr/share/gocode/src/github.com/hashicorp/go-plugin ] || need_pkgs+=(golang-github-hashicorp-go-plugin-dev)
[ -d /usr/share/gocode/src/google.golang.org/grpc ] || need_pkgs+=(golang-google-grpc-dev)
# The java driver's tests build a jar with javac and jar.
command -v javac >/dev/null || need_pkgs+=(default-jdk-headless)
if ((${#need_pkgs[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "missing packages: ${need_pkgs[*]} (run as root or install them)" >&2
        exit 1
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_pkgs[@]}"
fi

# The exec and java drivers' tests contain tasks for real: root, cgroups, namespaces.
# They skip loudly without them on a laptop; under CI=true that is a failure.
if [ "${CI:-}" = "true" ]; then
    missing=()
    [ "$(id -u)" -eq 0 ] || missing+=("root (the exec/java tests create namespaces, cgroups, chroots)")
    if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != "cgroup2fs" ]; then
        for c in memory cpu cpuacct pids freezer; do
            [ -f "/sys/fs/cgroup/$c/cgroup.procs" ] || missing+=("cgroup v1 controller $c at /sys/fs/cgroup/$c")
        done
    fi
    command -v javac >/dev/null && command -v jar >/dev/null || missing+=("javac and jar (default-jdk-headless)")
    if ((${#missing[@]})); then
        printf 'CI=true and the isolation tests cannot run: missing %s\n' "${missing[@]}" >&2
        exit 1
    fi
fi

cargo build --workspace --bins --locked
cargo test --workspace --locked "$@"
