#!/usr/bin/env bash
# Builds (or reuses) the rtgt lab guest image: a Debian kernel (vmlinuz) and an initramfs holding a
# Debian userland made by mmdebstrap, the kernel modules the lab needs and the lab's /init.
#
# The image is cached under ${RTGT_LAB_CACHE:-$HOME/.cache/rtgt-lab}/images/<key>/, where <key> is a
# hash of the resolved package versions (kernel + userland closure, resolved against the Debian
# mirror configured in /etc/apt/sources.list*) and of the lab's image-building files. It is rebuilt
# only when one of them changes. Prints the image directory on stdout.
#
# Options: --force (rebuild even if cached), --offline (do not refresh the package index; reuse the
# newest cached image).
set -euo pipefail

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib/common.sh
source "$LAB_DIR/lib/common.sh"

force=0 offline=0
for arg in "$@"; do
    case $arg in
    --force) force=1 ;;
    --offline) offline=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) lab_die "unknown option $arg" ;;
    esac
done

[[ $(id -u) -eq 0 ]] || lab_die "build-image.sh needs root (mmdebstrap, chroot, device nodes)"
command -v mmdebstrap >/dev/null || lab_die "mmdebstrap is not installed"

# Userland packages of the guest (closure resolved by apt, without Recommends).
GUEST_PACKAGES=(
    open-iscsi iproute2 rdma-core ibverbs-providers rdmacm-utils ibverbs-utils perftest
    e2fsprogs fio kmod sg3-utils busybox-static procps util-linux mount udev iputils-ping
    multipath-tools nvme-cli tcpdump
)
KERNEL_META=linux-image-amd64
# Module directories (relative to lib/modules/VER/kernel) copied into the guest; the dependencies
# of every copied module (modules.dep of the full kernel) are added on top.
MODULE_DIRS=(
    drivers/virtio drivers/infiniband drivers/scsi drivers/target drivers/block drivers/net drivers/md
    drivers/nvme/host drivers/nvme/common drivers/nvme/target
    net lib crypto block arch fs/ext4 fs/jbd2 fs/configfs fs/mbcache.ko fs/9p fs/netfs fs/fscache
)
# Parts of those directories that no guest of the lab can use (hardware NICs, wireless, CAN...).
MODULE_EXCLUDES=(
    drivers/net/wireless drivers/net/ethernet drivers/net/usb drivers/net/can drivers/net/wwan
    drivers/net/ieee802154 drivers/net/hamradio drivers/net/wan drivers/net/fddi drivers/net/arcnet
    drivers/net/plip drivers/net/ppp drivers/net/slip drivers/net/dsa drivers/net/phy
    net/wireless net/mac80211 net/bluetooth net/ieee802154 net/mac802154 net/nfc net/can
    net/netfilter net/bridge/netfilter net/ipv4/netfilter net/ipv6/netfilter
)

mkdir -p "$LAB_CACHE/images"
exec 9>"$LAB_CACHE/build.lock"
flock 9

APT_DIR=$LAB_CACHE/apt
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/etc"
touch "$APT_DIR/status"
lab_debian_sources >"$APT_DIR/etc/sources.list.new"
mv "$APT_DIR/etc/sources.list.new" "$APT_DIR/etc/sources.list"
APT_OPTS=(
    -o "Dir::Etc::SourceList=$APT_DIR/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
    -o "Dir::State=$APT_DIR" -o "Dir::State::status=$APT_DIR/status"
    -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
    -o APT::Sandbox::User=root -o Debug::NoLocking=1 -o APT::Install-Recommends=false
    -o Acquire::Languages=none
)

newest_image() {
    local d
    d=$(find "$LAB_CACHE/images" -mindepth 2 -maxdepth 2 -name initrd.img -printf '%T@ %h\n' 2>/dev/null |
        sort -rn | awk 'NR == 1 { print $2 }')
    [[ -n $d ]] && printf '%s\n' "$d"
}

if [[ $offline == 0 ]]; then
    if ! apt-get "${APT_OPTS[@]}" -qq update >"$APT_DIR/update.log" 2>&1; then
        cat "$APT_DIR/update.log" >&2
        if img=$(newest_image); then
            lab_log "package index refresh failed; reusing $img"
            printf '%s\n' "$img"
            exit 0
        fi
        lab_die "cannot refresh the package index from the Debian mirror"
    fi
elif img=$(newest_image) && [[ $force == 0 ]]; then
    printf '%s\n' "$img"
    exit 0
fi

resolved=$(apt-get "${APT_OPTS[@]}" -s install "$KERNEL_META" "${GUEST_PACKAGES[@]}" 2>&1) ||
    {
        printf '%s\n' "$resolved" >&2
        lab_die "cannot resolve the guest packages"
    }
versions=$(printf '%s\n' "$resolved" | awk '$1 == "Inst" { v = $3; sub(/^\(/, "", v); print $2 " " v }' | sort)
kernel_pkg=$(printf '%s\n' "$versions" | awk '$1 ~ /^linux-image-[0-9].*-amd64$/ { print $1; exit }')
[[ -n $kernel_pkg ]] || lab_die "cannot resolve the kernel package behind $KERNEL_META"

key=$(
    {
        printf '%s\n' "$versions"
        printf 'packages: %s\n' "${GUEST_PACKAGES[*]}"
        cat "$LAB_DIR/build-image.sh" "$LAB_DIR/guest/init"
    } | sha256sum | cut -c1-16
)
IMAGE=$LAB_CACHE/images/$key
if [[ $force == 0 && -f $IMAGE/initrd.img && -f $IMAGE/vmlinuz ]]; then
    lab_log "image $key is up to date ($(du -h "$IMAGE/initrd.img" | cut -f1) initramfs)"
    printf '%s\n' "$IMAGE"
    exit 0
fi

lab_log "building image $key (kernel package $kernel_pkg)"
t0=$(date +%s)
WORK=$(mktemp -d "$LAB_CACHE/build.XXXXXX")
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# Kernel: download the image package and unpack it.
(cd "$WORK" && apt-get "${APT_OPTS[@]}" -qq download "$kernel_pkg") >&2
dpkg-deb -x "$WORK"/"${kernel_pkg}"_*.deb "$WORK/kernel"
KVER=$(basename "$(find "$WORK/kernel/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)")
[[ -n $KVER ]] || lab_die "no modules in $kernel_pkg"
lab_log "kernel $KVER unpacked"

# Userland.
ROOT=$WORK/rootfs
include=$(
    IFS=,
    echo "${GUEST_PACKAGES[*]}"
)
mmdebstrap --variant=apt --mode=root --quiet \
    --include="$include" \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --dpkgopt='path-exclude=/usr/share/linda/*' \
    "$LAB_SUITE" "$ROOT" "$APT_DIR/etc/sources.list" >&2
lab_log "userland ready ($(du -sh "$ROOT" | cut -f1))"

# Modules: the selected directories plus the dependencies of everything selected.
FULL=$WORK/kernel/lib/modules/$KVER
MODS=$ROOT/lib/modules/$KVER
mkdir -p "$MODS/kernel"
cp -a "$FULL"/modules.order "$FULL"/modules.builtin "$FULL"/modules.builtin.modinfo "$MODS/"
# depmod of the full tree (with the guest's kmod) to learn the dependencies.
mkdir -p "$ROOT/tmp/kfull/lib/modules"
mv "$FULL" "$ROOT/tmp/kfull/lib/modules/$KVER"
FULL=$ROOT/tmp/kfull/lib/modules/$KVER
chroot "$ROOT" depmod -b /tmp/kfull "$KVER"
: >"$WORK/modlist"
for d in "${MODULE_DIRS[@]}"; do
    [[ -e $FULL/kernel/$d ]] || continue
    (cd "$FULL" && find "kernel/$d" -name '*.ko*') >>"$WORK/modlist"
done
for d in "${MODULE_EXCLUDES[@]}"; do
    grep -v "^kernel/$d/" "$WORK/modlist" >"$WORK/modlist.tmp" || true
    mv "$WORK/modlist.tmp" "$WORK/modlist"
done
sort -u "$WORK/modlist" -o "$WORK/modlist"
# modules.dep lists the full (transitive) dependencies of every module.
awk -F': *' 'NR == FNR { want[$1] = 1; next }
    ($1 in want) { print $1; n = split($2, d, " "); for (i = 1; i <= n; i++) print d[i] }' \
    "$WORK/modlist" "$FULL/modules.dep" | sort -u >"$WORK/modlist.closure"
(cd "$FULL" && cpio -pdm --quiet "$MODS") <"$WORK/modlist.closure"
rm -rf "$ROOT/tmp/kfull"
chroot "$ROOT" depmod -a "$KVER"
lab_log "$(wc -l <"$WORK/modlist.closure") modules ($(du -sh "$MODS" | cut -f1))"

# Trim the userland.
rm -rf "$ROOT"/var/cache/apt/* "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* \
    "$ROOT"/usr/share/man "$ROOT"/usr/share/locale "$ROOT"/usr/share/info "$ROOT"/var/log/*.log \
    "$ROOT"/usr/share/bash-completion "$ROOT"/usr/share/zsh "$ROOT"/usr/share/i18n \
    "$ROOT"/usr/share/common-licenses "$ROOT"/usr/lib/x86_64-linux-gnu/gconv
mkdir -p "$ROOT"/var/cache/apt/archives/partial "$ROOT"/var/lib/apt/lists/partial
# Guest configuration.
install -m 0755 "$LAB_DIR/guest/init" "$ROOT/init"
echo rtgt-lab >"$ROOT/etc/hostname"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$ROOT/etc/hosts"
: >"$ROOT/etc/fstab"
sed -i 's/^root:[^:]*:/root::/' "$ROOT/etc/shadow"
mkdir -p "$ROOT/etc/iscsi" "$ROOT/var/target/pr" "$ROOT/lab"
echo "InitiatorName=iqn.2024-01.org.rtgt.lab:guest" >"$ROOT/etc/iscsi/initiatorname.iscsi"
# Log in faster (the lab networks are local): shorter noop/replacement timers.
if [[ -f $ROOT/etc/iscsi/iscsid.conf ]]; then
    sed -i -e 's/^node.session.timeo.replacement_timeout = .*/node.session.timeo.replacement_timeout = 15/' \
        -e 's/^node.startup = .*/node.startup = manual/' "$ROOT/etc/iscsi/iscsid.conf"
fi
# shellcheck disable=SC2016  # dpkg-query's format, not shell expansions
chroot "$ROOT" dpkg-query -W -f '${Package} ${Version}\n' >"$WORK/manifest.txt"

# Pack.
mkdir -p "$WORK/out"
(cd "$ROOT" && find . -xdev -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) |
    zstd -q -T0 -10 >"$WORK/out/initrd.img"
cp "$WORK/kernel/boot/vmlinuz-$KVER" "$WORK/out/vmlinuz"
echo "$KVER" >"$WORK/out/kernel-version"
cp "$WORK/manifest.txt" "$WORK/out/manifest.txt"
printf '%s\n' "$versions" >"$WORK/out/resolved.txt"
rm -rf "$IMAGE"
mv "$WORK/out" "$IMAGE"
touch "$IMAGE/initrd.img"

# Keep the two newest images.
find "$LAB_CACHE/images" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' | sort -rn |
    awk 'NR > 2 { print $2 }' | while read -r old; do rm -rf "$old"; done

lab_log "image $key built in $(($(date +%s) - t0)) s ($(du -h "$IMAGE/initrd.img" | cut -f1) initramfs)"
printf '%s\n' "$IMAGE"
