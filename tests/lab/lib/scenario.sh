#!/usr/bin/env bash
# Runs one lab scenario inside its network namespace (started by run.sh through `ip netns exec`).
# Prepares the share, starts tcpdump on the tap device, runs the scenario's host hooks, boots the
# guest and collects the verdict. Exit status 0 = PASS.
#
# Hooks of scenarios/NAME/host.sh (all optional; each runs in this shell, inside the namespace):
#   host_setup     before the guest boots (start the target, lab_guest_export variables);
#                  lab_skip REASON skips the scenario (e.g. RTGTD not set)
#   host_run       while the guest runs, in the background (wait for a guest event with lab_wait;
#                  its exit status is raised to the guest as the event host-done)
#   host_check     after the guest powered off (inspect logs); non-zero fails the scenario
#   host_teardown  always, last (the daemons of lab_start_daemon are stopped after it)
# LAB_DISK_MB="N [N...]" (conf or host_setup) gives the guest virtio disks of these sizes (/dev/vda,
# /dev/vdb...) on the host files $LAB_WORK/diskI.img ($LAB_DISK is the first), opened by QEMU with
# cache=directsync. lab_power_cut (a host hook) kills
# QEMU with SIGKILL; the runner then boots the guest again on the same disk and share if the
# scenario has guest-reboot.sh (run instead of guest.sh), else the guest's end counts as expected.
set -euo pipefail

: "${LAB_DIR:?}" "${LAB_SCENARIO:?}" "${LAB_RESULTS:?}" "${LAB_WORK:?}" "${LAB_IMAGE:?}"
: "${LAB_HOST_IP:?}" "${LAB_GUEST_IP:?}" "${LAB_MTU:?}" "${LAB_TAP:?}" "${LAB_NETNS:?}"
LAB_PREFIXLEN=${LAB_PREFIXLEN:-24}
LAB_INTERACTIVE=${LAB_INTERACTIVE:-0}
LAB_SHARE=$LAB_WORK/share
LAB_EVENTS=$LAB_SHARE/events
export LAB_SHARE LAB_EVENTS LAB_PREFIXLEN

SCEN_DIR=$LAB_DIR/scenarios/$LAB_SCENARIO
LAB_DISK=$LAB_WORK/disk0.img
LAB_BOOT=1
# shellcheck disable=SC1090,SC1091
LAB_DISK_MB=$([[ -f $SCEN_DIR/conf ]] && source "$SCEN_DIR/conf"; echo "${LAB_DISK_MB:-}")
# A scenario that moves much data may keep only the headers of each packet (LAB_SNAPLEN).
LAB_SNAPLEN=$([[ -f $SCEN_DIR/conf ]] && source "$SCEN_DIR/conf"; echo "${LAB_SNAPLEN:-0}")
export LAB_DISK LAB_BOOT
# shellcheck source=host-lib.sh
source "$LAB_DIR/lib/host-lib.sh"

say() { printf '%s [host] %s\n' "$(date +%H:%M:%S)" "$*"; }
have() { declare -F "$1" >/dev/null; }

mkdir -p "$LAB_SHARE/lib" "$LAB_SHARE/scenario" "$LAB_EVENTS" "$LAB_SHARE/out"
cp "$LAB_DIR/lib/events.sh" "$LAB_DIR/lib/guest-lib.sh" "$LAB_DIR/lib/guest-run.sh" \
    "$LAB_DIR/lib/lio.sh" "$LAB_SHARE/lib/"
# -L: a scenario may share its scripts with another through symbolic links.
cp -aL "$SCEN_DIR/." "$LAB_SHARE/scenario/"
{
    printf 'export %s=%q\n' LAB_SCENARIO "$LAB_SCENARIO" LAB_HOST_IP "$LAB_HOST_IP" \
        LAB_GUEST_IP "$LAB_GUEST_IP" LAB_MTU "$LAB_MTU" LAB_PREFIXLEN "$LAB_PREFIXLEN"
} >"$LAB_SHARE/env"

qemu_pid="" tcpdump_pid="" run_pid=""
exec 3<&0
host_ok=1

finish() {
    local rc=$?
    set +eu
    trap - EXIT INT TERM
    [[ -n $run_pid ]] && kill -TERM "$run_pid" 2>/dev/null
    [[ -n $qemu_pid ]] && kill -TERM "$qemu_pid" 2>/dev/null
    if have host_teardown; then
        say "host_teardown"
        host_teardown
    fi
    lab_stop_daemons
    if [[ -n $tcpdump_pid ]]; then
        sleep 0.5
        kill -INT "$tcpdump_pid" 2>/dev/null
        wait "$tcpdump_pid" 2>/dev/null
    fi
    # Keep what the guest left in the share.
    cp -a "$LAB_SHARE/out" "$LAB_RESULTS/guest" 2>/dev/null
    cp -a "$LAB_EVENTS" "$LAB_RESULTS/events" 2>/dev/null
    exit "$rc"
}
trap finish EXIT
trap 'say "interrupted"; exit 143' INT TERM

if [[ -f $SCEN_DIR/host.sh ]]; then
    # shellcheck disable=SC1090,SC1091
    source "$SCEN_DIR/host.sh"
fi

say "scenario $LAB_SCENARIO in netns $LAB_NETNS (host $LAB_HOST_IP, guest $LAB_GUEST_IP, mtu $LAB_MTU)"
tcpdump -i "$LAB_TAP" -Z root -n -U -s "${RTGT_LAB_SNAPLEN:-$LAB_SNAPLEN}" -w "$LAB_RESULTS/tap.pcap" \
    >"$LAB_RESULTS/tcpdump.log" 2>&1 &
tcpdump_pid=$!
for ((i = 0; i < 100; i++)); do
    grep -q 'listening on' "$LAB_RESULTS/tcpdump.log" 2>/dev/null && break
    kill -0 "$tcpdump_pid" 2>/dev/null || { say "tcpdump failed"; cat "$LAB_RESULTS/tcpdump.log"; exit 1; }
    sleep 0.1
done

if have host_setup; then
    say "host_setup"
    host_setup
fi

kver=$(cat "$LAB_IMAGE/kernel-version" 2>/dev/null || echo "?")
append="console=ttyS0,115200 panic=-1 net.ifnames=0 mitigations=off nokaslr lab.ip=$LAB_GUEST_IP/$LAB_PREFIXLEN"
append+=" lab.mtu=$LAB_MTU lab.name=$LAB_SCENARIO lab.keep=$LAB_INTERACTIVE ${RTGT_LAB_APPEND:-}"
# shellcheck disable=SC2054  # commas separate QEMU sub-options
if [[ $LAB_INTERACTIVE == 1 ]]; then
    console=(-chardev "stdio,id=ser0,mux=on,signal=off,logfile=$LAB_RESULTS/console.log,logappend=on"
        -serial chardev:ser0 -mon chardev=ser0,mode=readline)
else
    console=(-chardev "file,id=ser0,path=$LAB_RESULTS/console.log,append=on" -serial chardev:ser0)
fi
# shellcheck disable=SC2054
qemu=(
    qemu-system-x86_64 -name "rtgt-lab-$LAB_SCENARIO" -nodefaults -no-user-config -display none
    -accel tcg,thread=multi -cpu max -smp "${RTGT_LAB_SMP:-2}" -m "${RTGT_LAB_MEM:-2048}" -no-reboot
    -kernel "$LAB_IMAGE/vmlinuz" -initrd "$LAB_IMAGE/initrd.img" -append "$append"
    "${console[@]}"
    -netdev "tap,id=net0,ifname=$LAB_TAP,script=no,downscript=no"
    -device "virtio-net-pci,netdev=net0,mac=52:54:00:7a:00:02,romfile="
    -fsdev "local,id=fs0,path=$LAB_SHARE,security_model=none"
    -device virtio-9p-pci,fsdev=fs0,mount_tag=lab
)
# LAB_DISK_MB="N [N...]": one virtio disk per size (MiB), /dev/vda, /dev/vdb...
disk_i=0
for mb in $LAB_DISK_MB; do
    [[ $mb =~ ^[1-9][0-9]*$ ]] || { say "LAB_DISK_MB: '$mb' is not a number of MiB"; exit 1; }
    f=$LAB_WORK/disk$disk_i.img
    [[ -e $f ]] || truncate -s "${mb}M" "$f"
    # Every write the guest saw completed is on the host file (O_DIRECT|O_DSYNC): what the
    # guest kept in its memory is all a power cut loses.
    # shellcheck disable=SC2054
    qemu+=(-drive "file=$f,if=none,id=disk$disk_i,format=raw,cache=directsync,aio=threads"
        -device "virtio-blk-pci,drive=disk$disk_i,serial=lab-disk$disk_i")
    say "guest disk $((disk_i + 1)): $f ($mb MiB, cache=directsync)"
    disk_i=$((disk_i + 1))
done

# boot_guest: start QEMU in the background (qemu_pid; also in $LAB_WORK/qemu.pid for
# lab_power_cut), boot number LAB_BOOT (in the share for guest-run.sh).
boot_guest() {
    rm -f "$LAB_SHARE/guest-status"
    echo "$LAB_BOOT" >"$LAB_SHARE/boot"
    if [[ $LAB_BOOT == 1 ]]; then
        say "booting guest (kernel $kver)"
    else
        say "booting guest again on the same disk (boot $LAB_BOOT)"
    fi
    if [[ $LAB_INTERACTIVE == 1 ]]; then
        if [[ $LAB_BOOT == 1 ]]; then
            say "interactive: the scenario runs, then a shell opens on this console (exit it or type"
            say "'poweroff -f' to stop; Ctrl-a x quits QEMU). Host side: ip netns exec $LAB_NETNS bash"
        fi
        "${qemu[@]}" <&3 &
    else
        "${qemu[@]}" </dev/null >>"$LAB_RESULTS/qemu.log" 2>&1 &
    fi
    qemu_pid=$!
    echo "$qemu_pid" >"$LAB_WORK/qemu.pid"
}
boot_guest

if have host_run; then
    (
        set +e
        trap - EXIT
        host_run
        rc=$?
        say "host_run finished with status $rc"
        lab_signal host-done "$rc"
        exit "$rc"
    ) &
    run_pid=$!
fi

power_cut=0
while :; do
    set +e
    wait "$qemu_pid"
    qemu_rc=$?
    set -e
    qemu_pid=""
    if [[ $(cat "$LAB_WORK/power-cut" 2>/dev/null) != "$LAB_BOOT" ]]; then
        power_cut=0
        say "guest powered off (qemu status $qemu_rc)"
        break
    fi
    power_cut=1
    say "power cut: QEMU killed by the scenario (boot $LAB_BOOT)"
    [[ -f $SCEN_DIR/guest-reboot.sh ]] || break
    LAB_BOOT=$((LAB_BOOT + 1))
    boot_guest
done
lab_signal guest-exited

if [[ -n $run_pid ]]; then
    for ((i = 0; i < 100; i++)); do
        kill -0 "$run_pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$run_pid" 2>/dev/null; then
        say "host_run still running after the guest exited: stopping it"
        kill -TERM "$run_pid" 2>/dev/null || true
    fi
    set +e
    wait "$run_pid"
    run_rc=$?
    set -e
    run_pid=""
    if [[ $run_rc -ne 0 ]]; then
        say "host_run failed (status $run_rc)"
        host_ok=0
    fi
fi

guest_rc=$(cat "$LAB_SHARE/guest-status" 2>/dev/null || true)
if [[ -z $guest_rc && $power_cut == 1 ]]; then
    guest_rc=0
    say "the guest ended with the power cut, as the scenario asked"
elif [[ -z $guest_rc ]]; then
    if grep -q '^RESULT: PASS' "$LAB_RESULTS/console.log" 2>/dev/null; then
        guest_rc=0
    else
        guest_rc=255
        say "no guest verdict (the guest crashed or was stopped)"
    fi
fi
say "guest result: status $guest_rc"

if have host_check; then
    say "host_check"
    if ! host_check; then
        say "host_check failed"
        host_ok=0
    fi
fi

[[ $guest_rc == 0 && $host_ok == 1 ]]
