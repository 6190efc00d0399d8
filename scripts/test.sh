#!/usr/bin/env bash
# The whole Drover test suite, on a fresh machine: installs what the tests need if it
# is missing, builds every workspace binary (the end-to-end tests launch the real
# plugin binaries), starts a private Docker daemon for the docker driver's tests, then
# starts a private etcd for the etcd store's tests, then runs every test. Under
# CI=true a missing component fails.
set -euo pipefail
cd "$(dirname "$0")/.."

is_root() { [ "$(id -u)" -eq 0 ]; }

need_pkgs=()
command -v cc >/dev/null || need_pkgs+=(gcc)
# go-plugin wire compatibility is tested against real go-plugin code (GOPATH build).
command -v go >/dev/null || need_pkgs+=(golang-go)
[ -d /usr/share/gocode/src/github.com/hashicorp/go-plugin ] || need_pkgs+=(golang-github-hashicorp-go-plugin-dev)
[ -d /usr/share/gocode/src/google.golang.org/grpc ] || need_pkgs+=(golang-google-grpc-dev)
# go-plugin 1.6.3 (scripts/go-plugin-16.sh builds a host and plugin from its source) needs
# these too; its newer protobuf packages are downloaded by that script, not installed.
gocode=/usr/share/gocode/src
[ -d $gocode/github.com/hashicorp/go-hclog ] || need_pkgs+=(golang-github-hashicorp-go-hclog-dev)
[ -d $gocode/github.com/hashicorp/yamux ] || need_pkgs+=(golang-github-hashicorp-yamux-dev)
[ -d $gocode/github.com/oklog/run ] || need_pkgs+=(golang-github-oklog-run-dev)
[ -d $gocode/golang.org/x/net ] || need_pkgs+=(golang-golang-x-net-dev)
[ -d $gocode/golang.org/x/text ] || need_pkgs+=(golang-golang-x-text-dev)
# The java driver's tests build a jar with javac and jar.
command -v javac >/dev/null || need_pkgs+=(default-jdk-headless)
# scripts/test.sh reads cargo's JSON messages (the test binaries of the cgroup v2 guest).
command -v jq >/dev/null || need_pkgs+=(jq)
# The package tests (host/drover/tests/service): `systemd-analyze verify` of the units.
command -v systemd-analyze >/dev/null || need_pkgs+=(systemd)
command -v dpkg-deb >/dev/null || need_pkgs+=(dpkg)
# The etcd store's tests (and the HA tests) run a real etcd: Debian's etcd-server.
command -v etcd >/dev/null || [ -x /usr/bin/etcd ] || need_pkgs+=(etcd-server)
# The real Nomad 1.0.18 programs (Nomad driver compatibility tests) come as a .tar.xz.
command -v xz >/dev/null || need_pkgs+=(xz-utils)
# Nomad's HTTP API is tested with a real client of it: python-nomad (PyPI), in a venv.
command -v python3 >/dev/null || need_pkgs+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
# Bridge networking (groups in network { mode = "bridge" }) runs the real CNI plugins,
# which run iptables; its tests' tasks serve and fetch with busybox's httpd and wget.
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || need_pkgs+=(containernetworking-plugins)
command -v iptables >/dev/null || need_pkgs+=(iptables)
command -v nsenter >/dev/null || need_pkgs+=(util-linux)
command -v ip >/dev/null || need_pkgs+=(iproute2)
[ -x /bin/busybox ] || need_pkgs+=(busybox-static)
# The web UI is tested in headless Chromium, driven through chromedriver (the same
# Debian source package as chromium: the two always match).
[ -x /usr/bin/chromium ] || need_pkgs+=(chromium)
[ -x /usr/bin/chromedriver ] || need_pkgs+=(chromium-driver)
if ((${#need_pkgs[@]})); then
    if ! is_root; then
        echo "missing packages: ${need_pkgs[*]} (run as root or install them)" >&2
        exit 1
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_pkgs[@]}"
fi

# --- Docker: the docker driver's tests need a real dockerd. They get a private one
# (own socket, data and exec dirs under target/, no bridge and no iptables: the tests
# send no traffic to container addresses) and a test image imported from a busybox
# rootfs, since no registry is reachable. It is stopped by pid when this script exits.
DOCKER_DIR="$PWD/target/drover-test-docker"
DOCKER_IMAGE="drover-test/busybox:latest"
DOCKERD_PID=""

# --- etcd: one private etcd (own data dir under target/, free 127.0.0.1 ports) for
# the tests that share one (`drover_test_support::etcd::shared`, each under a key
# prefix of its own), announced in DROVER_TEST_ETCD_ENDPOINT; tests that kill or
# compact etcd start their own. It is stopped by pid when this script exits.
ETCD_DIR="$PWD/target/drover-test-etcd"
ETCD_PID=""

# --- The temp dir: the tests get a private one under the machine's, so that what they
# leave there is seen, and none of it outlives the run. A plugin removes its socket dir
# when it exits and a host removes a killed plugin's: a drover-plugin-* dir left in it
# after the tests is a leak, and under CI=true a failure.
TEST_TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/drover-test.XXXXXX")
export TMPDIR="$TEST_TMPDIR"

cleanup() {
    stop_dockerd
    stop_etcd
    rm -rf "$TEST_TMPDIR"
}
trap cleanup EXIT

# dockerd can leave mounts under its dirs (its default netns bind mount, its data
# root): unmount them, deepest first, so that the dirs can be removed.
unmount_docker_dir() {
    [ -d "$DOCKER_DIR" ] || return 0
    local m
    awk -v dir="$DOCKER_DIR/" 'index($2, dir) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

stop_dockerd() {
    [ -n "$DOCKERD_PID" ] || return 0
    kill -TERM "$DOCKERD_PID" 2>/dev/null || true
    for _ in $(seq 1 150); do
        kill -0 "$DOCKERD_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$DOCKERD_PID" 2>/dev/null || true
    wait "$DOCKERD_PID" 2>/dev/null || true
    DOCKERD_PID=""
    unmount_docker_dir
}

skip_docker() {
    if [ "${CI:-}" = "true" ]; then
        echo "docker tests cannot run: $1 (CI=true: this is a failure)" >&2
        exit 1
    fi
    echo "########################################################################" >&2
    echo "# SKIPPING the docker driver's tests: $1" >&2
    echo "########################################################################" >&2
}

start_dockerd() {
    local docker_pkgs=()
    command -v dockerd >/dev/null || docker_pkgs+=(docker.io)
    [ -x /bin/busybox ] || docker_pkgs+=(busybox-static)
    if ((${#docker_pkgs[@]})); then
        if ! is_root; then
            skip_docker "missing packages ${docker_pkgs[*]} and not root to install them"
            return 0
        fi
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${docker_pkgs[@]}"
    fi
    if ! is_root; then
        skip_docker "dockerd needs root"
        return 0
    fi
    unmount_docker_dir
    rm -rf "$DOCKER_DIR"
    mkdir -p "$DOCKER_DIR"
    local sock="$DOCKER_DIR/docker.sock"
    dockerd \
        --host "unix://$sock" \
        --data-root "$DOCKER_DIR/data" \
        --exec-root "$DOCKER_DIR/exec" \
        --pidfile "$DOCKER_DIR/dockerd.pid" \
        --bridge none --iptables=false --ip6tables=false --ip-masq=false \
        --userland-proxy=false \
        >"$DOCKER_DIR/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    local docker=(docker -H "unix://$sock")
    for _ in $(seq 1 300); do
        if [ -S "$sock" ] && "${docker[@]}" version >/dev/null 2>&1; then
            break
        fi
        if ! kill -0 "$DOCKERD_PID" 2>/dev/null; then
            tail -n 30 "$DOCKER_DIR/dockerd.log" >&2
            skip_docker "the private dockerd exited at start (log above)"
            DOCKERD_PID=""
            return 0
        fi
        sleep 0.1
    done
    if ! "${docker[@]}" version >/dev/null 2>&1; then
        tail -n 30 "$DOCKER_DIR/dockerd.log" >&2
        skip_docker "the private dockerd did not answer within 30 s (log above)"
        return 0
    fi
    # The test image: busybox (static) and its applets, plus the passwd/group files
    # that `user` needs.
    local rootfs="$DOCKER_DIR/rootfs"
    mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp"
    cp /bin/busybox "$rootfs/bin/busybox"
    local applet
    for applet in $("$rootfs/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
    tar -C "$rootfs" -cf "$DOCKER_DIR/rootfs.tar" .
    "${docker[@]}" import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' \
        "$DOCKER_DIR/rootfs.tar" "$DOCKER_IMAGE" >/dev/null
    export DROVER_TEST_DOCKER_HOST="unix://$sock"
    export DROVER_TEST_DOCKER_IMAGE="$DOCKER_IMAGE"
    echo "private dockerd (pid $DOCKERD_PID) at $DROVER_TEST_DOCKER_HOST with image $DOCKER_IMAGE" >&2
}

stop_etcd() {
    [ -n "$ETCD_PID" ] || return 0
    kill -TERM "$ETCD_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$ETCD_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$ETCD_PID" 2>/dev/null || true
    wait "$ETCD_PID" 2>/dev/null || true
    ETCD_PID=""
}

# Something listens on 127.0.0.1:$1.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
    local p
    for _ in $(seq 1 100); do
        p=$((20000 + RANDOM % 40000))
        port_in_use "$p" || { echo "$p"; return 0; }
    done
    return 1
}

# etcd at 127.0.0.1:$1 says it is healthy.
etcd_healthy() {
    local reply
    reply=$( (exec 3<>"/dev/tcp/127.0.0.1/$1" &&
        printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 &&
        timeout 2 cat <&3) 2>/dev/null) || return 1
    [[ "$reply" == *'"health":"true"'* ]]
}

start_etcd() {
    local etcd_bin
    etcd_bin=$(command -v etcd || echo /usr/bin/etcd)
    if [ ! -x "$etcd_bin" ]; then
        if [ "${CI:-}" = "true" ]; then
            echo "etcd tests cannot run: no etcd binary (CI=true: this is a failure)" >&2
            exit 1
        fi
        echo "# SKIPPING the shared etcd: no etcd binary (tests start their own or skip loudly)" >&2
        return 0
    fi
    rm -rf "$ETCD_DIR"
    # Its data and logs are the tests' alone.
    mkdir -p -m 700 "$ETCD_DIR"
    chmod 700 "$ETCD_DIR"
    local attempt client peer
    # A port picked free can be taken before etcd binds it: try again on others.
    for attempt in 1 2 3 4 5; do
        client=$(free_port) && peer=$(free_port) || break
        [ "$client" != "$peer" ] || continue
        "$etcd_bin" \
            --name drover-test \
            --data-dir "$ETCD_DIR/data" \
            --listen-client-urls "http://127.0.0.1:$client" \
            --advertise-client-urls "http://127.0.0.1:$client" \
            --listen-peer-urls "http://127.0.0.1:$peer" \
            --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
            --initial-cluster "drover-test=http://127.0.0.1:$peer" \
            --initial-cluster-state new \
            --logger zap --log-level info \
            >"$ETCD_DIR/etcd.$attempt.log" 2>&1 &
        ETCD_PID=$!
        for _ in $(seq 1 300); do
            etcd_healthy "$client" &&
                grep -q "serving client traffic" "$ETCD_DIR/etcd.$attempt.log" && break
            kill -0 "$ETCD_PID" 2>/dev/null || break
            sleep 0.1
        done
        # Ours, not another etcd on a port taken between free_port and the start:
        # our child still runs and logged that it serves clients on this port.
        if etcd_healthy "$client" && kill -0 "$ETCD_PID" 2>/dev/null &&
            grep -q "serving client traffic.*\"address\":\"127.0.0.1:$client\"" \
                "$ETCD_DIR/etcd.$attempt.log"; then
            export DROVER_TEST_ETCD_ENDPOINT="http://127.0.0.1:$client"
            echo "private etcd (pid $ETCD_PID) at $DROVER_TEST_ETCD_ENDPOINT" >&2
            return 0
        fi
        tail -n 20 "$ETCD_DIR/etcd.$attempt.log" >&2
        stop_etcd
        rm -rf "$ETCD_DIR/data"
    done
    if [ "${CI:-}" = "true" ]; then
        echo "the private etcd did not start (log above; CI=true: this is a failure)" >&2
        exit 1
    fi
    echo "# SKIPPING the shared etcd: it did not start (log above); tests start their own" >&2
}

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

# The VM rig: qemu-system-x86_64 (installed if missing), a Debian cloud kernel and a
# busybox initramfs, for the qemu driver's tests and the exec driver's cgroup v2 tests
# inside a guest. Under CI=true a rig that cannot be made fails the suite.
if rig_env=$(scripts/vm-rig.sh); then
    while IFS= read -r line; do
        [ -n "$line" ] && export "${line?}"
    done <<<"$rig_env"
elif [ "${CI:-}" = "true" ]; then
    echo "the VM rig could not be made (above; CI=true: this is a failure)" >&2
    exit 1
else
    echo "# SKIPPING the VM tests: the VM rig could not be made (above)" >&2
fi

# A CI build is built once from a clean clone: incremental artefacts would only double
# target/ (they were ~16 of 31 GB here) and the checker's disk has filled up before.
if [ "${CI:-}" = "true" ]; then
    export CARGO_INCREMENTAL=0
fi

# python-nomad, the Python client of Nomad's HTTP API (host/drover/tests/compat/nomad_api.rs
# drives a dev agent with it), pinned, in a venv of its own under target/; the tests find
# its interpreter in DROVER_TEST_PYTHON_NOMAD. The same venv has the Prometheus Python
# client, whose text parser reads /v1/metrics (host/drover/tests/cluster/metrics.rs).
PY_NOMAD_VENV="$PWD/target/python-nomad"
PY_NOMAD_VERSION=2.1.0
PY_PROMETHEUS_VERSION=0.26.0
if ! "$PY_NOMAD_VENV/bin/python" -c "import nomad, prometheus_client, importlib.metadata as m; assert m.version('python-nomad') == '$PY_NOMAD_VERSION'; assert m.version('prometheus-client') == '$PY_PROMETHEUS_VERSION'" 2>/dev/null; then
    rm -rf "$PY_NOMAD_VENV"
    if python3 -m venv "$PY_NOMAD_VENV" &&
        "$PY_NOMAD_VENV/bin/pip" install -q "python-nomad==$PY_NOMAD_VERSION" \
            "prometheus-client==$PY_PROMETHEUS_VERSION"; then
        :
    elif [ "${CI:-}" = "true" ]; then
        echo "python-nomad could not be installed (above; CI=true: this is a failure)" >&2
        exit 1
    else
        echo "# SKIPPING the python-nomad tests: python-nomad could not be installed (above)" >&2
    fi
fi
[ -x "$PY_NOMAD_VENV/bin/python" ] && export DROVER_TEST_PYTHON_NOMAD="$PY_NOMAD_VENV/bin/python"

# Selenium, which drives chromium for the web UI's test (host/drover/tests/cluster/ui.rs),
# pinned, in a venv of its own under target/ (it needs no Node.js, and Playwright's own
# browser builds cannot be downloaded here); the test finds it in DROVER_TEST_PYTHON_UI.
PY_UI_VENV="$PWD/target/python-ui"
PY_SELENIUM_VERSION=4.51.0
if ! "$PY_UI_VENV/bin/python" -c "import selenium, importlib.metadata as m; assert m.version('selenium') == '$PY_SELENIUM_VERSION'" 2>/dev/null; then
    rm -rf "$PY_UI_VENV"
    if python3 -m venv "$PY_UI_VENV" &&
        "$PY_UI_VENV/bin/pip" install -q "selenium==$PY_SELENIUM_VERSION"; then
        :
    elif [ "${CI:-}" = "true" ]; then
        echo "selenium could not be installed (above; CI=true: this is a failure)" >&2
        exit 1
    else
        echo "# SKIPPING the web UI's browser test: selenium could not be installed (above)" >&2
    fi
fi
[ -x "$PY_UI_VENV/bin/python" ] && export DROVER_TEST_PYTHON_UI="$PY_UI_VENV/bin/python"

# rawexec linked static-pie, as scripts/build-plugins.sh links the standalone plugins
# (plugins/rawexec/tests/conformance.rs runs the harness against it). Copied aside: the
# build below links the binary in target/debug dynamically again.
scripts/build-plugins.sh --debug
target_dir=$(cargo metadata --format-version 1 --no-deps --locked | jq -r .target_directory)
mkdir -p "$target_dir/debug/static-pie"
cp "$target_dir/debug/drover-driver-rawexec" "$target_dir/debug/static-pie/"
export DROVER_TEST_STATIC_RAWEXEC="$target_dir/debug/static-pie/drover-driver-rawexec"
cargo build --workspace --bins --locked
# The go-plugin 1.6.3 host and plugin of host/drover/tests/compat/goplugin16*.rs, built offline
# from ../shared/go-plugin/ (it skips loudly without the tarball; under CI=true it fails).
gp16_env=$(scripts/go-plugin-16.sh)
if [ -n "$gp16_env" ]; then
    export "${gp16_env?}"
fi
# The exec driver's tests run a second time inside a cgroup v2 guest of the VM rig
# (plugins/exec/tests/cgroup_v2_guest.rs), as the very test binaries cargo builds: built
# here exactly as `cargo test --workspace` below builds them (nothing is built twice),
# and listed in DROVER_TEST_EXEC_GUEST_TESTS for that test to find.
guest_tests=$(cargo test --workspace --locked --no-run --message-format=json |
    jq -r --arg exec "$PWD/plugins/exec/Cargo.toml" \
        --arg executor "$PWD/plugins/shared/executor/Cargo.toml" \
        'select(.reason == "compiler-artifact" and .profile.test and .executable != null
                and (.manifest_path == $exec or .manifest_path == $executor))
         | .executable' | paste -sd: -)
if [ -z "$guest_tests" ]; then
    echo "cargo listed no test binaries for the cgroup v2 guest run" >&2
    exit 1
fi
export DROVER_TEST_EXEC_GUEST_TESTS="$guest_tests"
# The API docs are part of the product: a broken intra-doc link or a stray HTML tag in a
# doc comment fails the suite.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
start_dockerd
start_etcd
cargo test --workspace --locked "$@"
# The task manager's tests again with a fake driver that finds its tasks by id (as
# Drover's drivers do, whose starts overlap the record's fsync): every test that does
# not pin the driver's kind runs on both start paths.
DROVER_TEST_FAKE_BY_ID=1 cargo test -p drover-host --lib --locked tasks::tests "$@"

left=$(find "$TEST_TMPDIR" -mindepth 1 -maxdepth 1 -name 'drover-plugin-*')
if [ -n "$left" ]; then
    echo "the tests left $(wc -l <<<"$left") plugin socket dir(s) in the temp dir:" >&2
    echo "$left" >&2
    if [ "${CI:-}" = "true" ]; then
        exit 1
    fi
fi
