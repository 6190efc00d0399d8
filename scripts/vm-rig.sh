#!/usr/bin/env bash
# The VM test rig: a small Linux guest that boots under qemu-system-x86_64 with TCG.
#
#   scripts/vm-rig.sh            make the rig (if missing) and print its files as
#                                KEY=value lines (DROVER_TEST_VM_KERNEL, ..._INITRD, ...)
#   scripts/vm-rig.sh --check    exit 0 if the rig is complete, 1 if not; changes nothing
#
# What it makes, in $DROVER_VM_DIR (default: target/drover-vm):
#   vmlinuz      Debian's linux-image-*-cloud-amd64 kernel, taken from the package with
#                `apt-get download` + `dpkg-deb -x` (nothing is installed into /boot)
#   initrd.img   a busybox initramfs (busybox-static) with the few modules the guest
#                needs (virtio pci/net/blk/fs, fuse, overlay, ACPI button, evdev) and the
#                init below
#   KERNEL_VERSION
#
# The guest's init reads its orders from the kernel command line:
#   (always)            prints "drover-guest: init started" on the serial console (ttyS0)
#                       first thing; mounts proc, sys, devtmpfs; loads the modules
#   drover.acpid=0      no acpid: the guest ignores the power button (default: acpid
#                       runs and powers the guest off on system_powerdown)
#   drover.net=1        brings eth0 up as 10.0.2.15/24 (qemu's user-mode network)
#   drover.serve=PORT   answers "drover-guest says hello" on TCP PORT (needs drover.net=1)
#   drover.disk=DEV     prints the first line of block device DEV ("drover-guest: disk: ...")
#   drover.tick=SECS    prints "drover-guest: tick N" every SECS seconds
#   drover.host=1       mounts the host's / (virtiofs tag "host", read-only) under a
#                       tmpfs overlay, so the guest sees the host's files, with cgroup v2
#                       as its only cgroup hierarchy, then runs drover.run=PATH (a host
#                       path) as root inside it with output on the serial console,
#                       prints "drover-guest: exit CODE" and powers off. The guest's
#                       /tmp, /run, /dev, /proc and /sys are its own; the host's whole
#                       tree, /tmp and /run included, is at /host (through the overlay).
#                       drover.bind=DIR,DIR... binds the host's DIR (/host/DIR) at DIR,
#                       for a run that needs host directories under /tmp, /run or /host
#                       at their own paths (a clone under /tmp: its test binaries and
#                       target dir); the rest of the guest's /tmp stays its own. The
#                       host side (virtiofsd on a read-only recursive bind of /, made in
#                       a mount namespace of its own, the binds, and the qemu command)
#                       is drover_test_support::vm::Rig::run_on_host
#   drover.poweroff=1   powers off after the steps above instead of waiting forever
#
# Installing qemu: on these machines the image carries a backported qemu-utils that
# conflicts with bookworm's qemu-system-x86; the script moves qemu-utils (and
# qemu-block-extra) back to the version qemu-system-x86 needs, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

VM_DIR="${DROVER_VM_DIR:-$PWD/target/drover-vm}"
RIG_VERSION=9   # bump when the initramfs contents change

say() { echo "vm-rig: $*" >&2; }

complete() {
    [ -s "$VM_DIR/vmlinuz" ] && [ -s "$VM_DIR/initrd.img" ] &&
        [ "$(cat "$VM_DIR/RIG_VERSION" 2>/dev/null)" = "$RIG_VERSION" ] &&
        command -v qemu-system-x86_64 >/dev/null
}

if [ "${1:-}" = "--check" ]; then
    complete && exit 0 || exit 1
fi

is_root() { [ "$(id -u)" -eq 0 ]; }

install_pkgs() {
    if ! is_root; then
        say "missing packages: $* (run as root or install them)"
        exit 1
    fi
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
}

# --- qemu-system-x86_64, busybox-static
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx acpid || need+=(busybox-static)
[ -x /usr/lib/qemu/virtiofsd ] || need+=(qemu-system-common)
command -v strings >/dev/null || need+=(binutils)
if ((${#need[@]})); then
    extra=()
    if [[ " ${need[*]} " == *" qemu-system-x86 "* ]] && dpkg-query -W -f='${Version}' qemu-utils >/dev/null 2>&1; then
        is_root || { say "qemu-system-x86 is missing (run as root)"; exit 1; }
        apt-get update -q >&2
        want=$(apt-cache show qemu-system-x86 2>/dev/null | awk '/^Version:/ { print $2; exit }')
        have=$(dpkg-query -W -f='${Version}' qemu-utils)
        if [ -n "$want" ] && [ "$have" != "$want" ]; then
            say "qemu-utils $have conflicts with qemu-system-x86 $want:" \
                "moving qemu-utils and qemu-block-extra to $want (--allow-downgrades)"
            extra=("qemu-utils=$want")
            dpkg-query -W qemu-block-extra >/dev/null 2>&1 && extra+=("qemu-block-extra=$want")
            extra+=(--allow-downgrades)
        fi
    fi
    install_pkgs "${need[@]}" "${extra[@]}"
fi

if complete; then
    echo "DROVER_TEST_VM_KERNEL=$VM_DIR/vmlinuz"
    echo "DROVER_TEST_VM_INITRD=$VM_DIR/initrd.img"
    exit 0
fi

mkdir -p "$VM_DIR"
work=$(mktemp -d "$VM_DIR/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- the kernel: the newest linux-image-*-cloud-amd64-unsigned apt knows
if [ ! -s "$VM_DIR/vmlinuz" ] || [ ! -d "$VM_DIR/modules" ]; then
    pkg=$(apt-cache search --names-only '^linux-image-[0-9.]+-[0-9]+-cloud-amd64-unsigned$' |
        awk '{ print $1 }' | sort -V | tail -1)
    if [ -z "$pkg" ]; then
        apt-get update -q >&2
        pkg=$(apt-cache search --names-only '^linux-image-[0-9.]+-[0-9]+-cloud-amd64-unsigned$' |
            awk '{ print $1 }' | sort -V | tail -1)
    fi
    [ -n "$pkg" ] || { say "no linux-image-*-cloud-amd64-unsigned package in apt's lists"; exit 1; }
    say "kernel from $pkg"
    (cd "$work" && apt-get download "$pkg" >&2 2>/dev/null) ||
        (cd "$work" && apt-get download "$pkg" >&2)
    dpkg-deb -x "$work"/"$pkg"_*.deb "$work/kpkg"
    kver=$(ls "$work/kpkg/lib/modules" | head -1)
    rm -rf "$VM_DIR/modules"
    mkdir -p "$VM_DIR/modules"
    # Each wanted module after its dependencies (the `depends=` of its .modinfo), in
    # the order the guest's init loads them (modules.order).
    order=()
    add_module() {
        local m=$1 f dep
        for have in "${order[@]}"; do [ "$have" = "$m" ] && return 0; done
        f=$(find "$work/kpkg/lib/modules/$kver/kernel" -name "$m.ko" | head -1)
        if [ -z "$f" ]; then
            grep -q "/$m.ko$" "$work/kpkg/lib/modules/$kver/modules.builtin" && return 0
            say "module $m.ko not in $pkg"
            exit 1
        fi
        for dep in $(strings -a "$f" | sed -n 's/^depends=//p' | tr ',' ' '); do
            add_module "$dep"
        done
        cp "$f" "$VM_DIR/modules/"
        order+=("$m")
    }
    for m in virtio_pci virtio_net virtio_blk virtiofs overlay button evdev; do
        add_module "$m"
    done
    printf '%s\n' "${order[@]}" >"$VM_DIR/modules/modules.order"
    cp "$work/kpkg/boot/vmlinuz-$kver" "$VM_DIR/vmlinuz.new"
    mv "$VM_DIR/vmlinuz.new" "$VM_DIR/vmlinuz"
    echo "$kver" >"$VM_DIR/KERNEL_VERSION"
    rm -rf "$work/kpkg" "$work"/*.deb
fi

# --- the initramfs
root="$work/root"
mkdir -p "$root"/{bin,sbin,etc/acpi/PWRF,proc,sys,dev,tmp,run,mnt,lib/modules,newroot,host,overlay}
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
cp "$VM_DIR"/modules/*.ko "$VM_DIR/modules/modules.order" "$root/lib/modules/"
# acpid runs /etc/acpi/<EVENT>/<code> on a power-button press: PWRF/00000080.
# `poweroff -f`: a plain `poweroff` only signals PID 1, and our PID 1 is a shell
# script that ignores the signal (the guest printed this line and kept running).
cat >"$root/etc/acpi/PWRF/00000080" <<'EOF'
#!/bin/sh
echo "drover-guest: power button pressed, powering off" >/dev/console
sync
exec poweroff -f
EOF
chmod 755 "$root/etc/acpi/PWRF/00000080"

cat >"$root/init" <<'EOF'
#!/bin/sh
export PATH=/bin:/sbin
mount -t proc proc /proc
echo "drover-guest: init started"
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
arg() { # the value of drover.$1= on the kernel command line, or $2
    v=$2
    for w in $(cat /proc/cmdline); do
        case "$w" in "drover.$1="*) v=${w#drover.$1=} ;; esac
    done
    echo "$v"
}
for m in $(cat /lib/modules/modules.order); do
    out=$(insmod /lib/modules/$m.ko 2>&1) || echo "drover-guest: insmod $m: $out"
done

if [ "$(arg acpid 1)" = 1 ]; then
    # Daemonized, busybox acpid logs to /var/log/acpid.log and dies at once when it
    # cannot open it.
    mkdir -p /var/log /var/run
    acpid -c /etc/acpi
fi
if [ "$(arg net 0)" = 1 ]; then
    ip link set lo up
    ip link set eth0 up
    ip addr add 10.0.2.15/24 dev eth0
    ip route add default via 10.0.2.2
fi
port=$(arg serve "")
if [ -n "$port" ]; then
    mkdir -p /srv
    echo "drover-guest says hello" >/srv/hello
    # busybox 1.35's small nc has no -k: -ll with -e keeps serving after each client.
    nc -ll -p "$port" -e cat /srv/hello &
    echo "drover-guest: serving on port $port"
fi
disk=$(arg disk "")
if [ -n "$disk" ]; then
    for i in 1 2 3 4 5 6 7 8 9 10; do [ -b "$disk" ] && break; sleep 0.2; done
    echo "drover-guest: disk: $(head -n 1 "$disk")"
fi

if [ "$(arg host 0)" = 1 ]; then
    run=$(arg run "")
    mount -t virtiofs -o ro host /host || { echo "drover-guest: no host share"; poweroff -f; }
    mount -t tmpfs -o size=75% tmpfs /overlay
    mkdir -p /overlay/upper /overlay/work
    mount -t overlay overlay -o lowerdir=/host,upperdir=/overlay/upper,workdir=/overlay/work /newroot ||
        { echo "drover-guest: overlay failed"; poweroff -f; }
    # The host's whole tree at a mount point of its own, /host: the overlay's root bound
    # before the guest's own filesystems cover its /tmp, /run, ... (so the host's are
    # there), writable as the rest of the overlay (what the guest writes stays in it).
    mkdir -p /newroot/host
    mount -o bind /newroot /newroot/host || { echo "drover-guest: /host failed"; poweroff -f; }
    mount -t proc proc /newroot/proc
    mount -t sysfs sysfs /newroot/sys
    mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup
    mount -t devtmpfs devtmpfs /newroot/dev
    mkdir -p /newroot/dev/pts /newroot/dev/shm
    mount -t devpts devpts /newroot/dev/pts
    mount -t tmpfs tmpfs /newroot/dev/shm
    mount -t tmpfs tmpfs /newroot/tmp
    mount -t tmpfs tmpfs /newroot/run
    # Host directories the run needs at their own paths under the guest's own /tmp or
    # /run (or under /host), each from the host's tree.
    for dir in $(arg bind "" | tr ',' ' '); do
        mkdir -p "/newroot$dir" && mount -o bind "/newroot/host$dir" "/newroot$dir" ||
            { echo "drover-guest: cannot bind the host's $dir"; poweroff -f; }
    done
    # The host's own mounts under / (e.g. /work on another device) are not in the
    # share: say which paths the run script may rely on.
    echo "drover-guest: cgroup2 at /sys/fs/cgroup: $(cat /newroot/sys/fs/cgroup/cgroup.controllers)"
    chroot /newroot /bin/sh -c "cd / && exec $run" </dev/null
    echo "drover-guest: exit $?"
    sync
    poweroff -f
fi

tick=$(arg tick "")
n=0
if [ "$(arg poweroff 0)" = 1 ]; then
    poweroff -f
fi
while :; do
    if [ -n "$tick" ]; then
        n=$((n + 1))
        echo "drover-guest: tick $n"
        sleep "$tick"
    else
        sleep 3600
    fi
done
EOF
chmod 755 "$root/init"

(cd "$root" && find . | sort | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$work/initrd.img"
mv "$work/initrd.img" "$VM_DIR/initrd.img"
echo "$RIG_VERSION" >"$VM_DIR/RIG_VERSION"
say "rig ready in $VM_DIR (kernel $(cat "$VM_DIR/KERNEL_VERSION"))"
echo "DROVER_TEST_VM_KERNEL=$VM_DIR/vmlinuz"
echo "DROVER_TEST_VM_INITRD=$VM_DIR/initrd.img"
