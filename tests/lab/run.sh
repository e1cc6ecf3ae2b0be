#!/usr/bin/env bash
# rtgt Linux initiator lab: boots a Debian guest in QEMU (TCG) on a tap device inside a network
# namespace made for the run, and runs scenarios (tests/lab/scenarios/NAME/) against targets on the
# host side of the namespace or inside the guest.
#
# Usage: run.sh [OPTIONS] --list | --all | NAME...
#   --list              list the scenarios
#   --all               run every scenario
#   --interactive, --keep
#                       run one scenario with the guest console on this terminal; after guest.sh
#                       the guest opens a shell (no timeout; the namespace lives until QEMU exits)
#   --mtu N             MTU of the tap device and eth0 (default: the scenario's, else 1500)
#   --timeout S         hard timeout per scenario (default: the scenario's, else 600)
#   --results DIR       results root (default ${RTGT_LAB_RESULTS:-/tmp/rtgt-lab-results})
#   --keep-results      keep the results of passing scenarios too
#   --verbose           follow the guest console and the host log on this terminal
#   --offline           do not refresh the package index (reuse the cached image)
# Environment: RTGT_LAB_CACHE (image cache), RTGT_LAB_RESULTS, RTGTD (rtgtd binary for scenarios
# that run it), RTGT_LAB_SNAPLEN (tcpdump snap length, default 0 = whole packets).
set -euo pipefail

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LAB_DIR
# shellcheck source=lib/common.sh
source "$LAB_DIR/lib/common.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

mode="" interactive=0 opt_mtu="" opt_timeout="" keep_results=0 verbose=0 offline=0
results_root=${RTGT_LAB_RESULTS:-/tmp/rtgt-lab-results}
names=()
while (($#)); do
    case $1 in
    --list) mode=list ;;
    --all) mode=all ;;
    --interactive | --keep) interactive=1 ;;
    --mtu) opt_mtu=${2:?--mtu needs a value}; shift ;;
    --mtu=*) opt_mtu=${1#*=} ;;
    --timeout) opt_timeout=${2:?--timeout needs a value}; shift ;;
    --timeout=*) opt_timeout=${1#*=} ;;
    --results) results_root=${2:?--results needs a value}; shift ;;
    --results=*) results_root=${1#*=} ;;
    --keep-results) keep_results=1 ;;
    --verbose | -v) verbose=1 ;;
    --offline) offline=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) lab_die "unknown option $1 (see --help)" ;;
    *) names+=("$1") ;;
    esac
    shift
done

all_scenarios() {
    local d
    for d in "$LAB_DIR"/scenarios/*/; do
        [[ -f $d/guest.sh ]] && basename "$d"
    done
}

# scenario_conf NAME: print the scenario's conf variables (LAB_DESCRIPTION, LAB_TIMEOUT, LAB_MTU).
# shellcheck disable=SC2030,SC2031  # the conf is read in a subshell on purpose
scenario_conf() {
    (
        LAB_DESCRIPTION="" LAB_TIMEOUT=600 LAB_MTU=1500
        # shellcheck disable=SC1090,SC1091
        [[ -f $LAB_DIR/scenarios/$1/conf ]] && source "$LAB_DIR/scenarios/$1/conf"
        printf '%s\n%s\n%s\n' "$LAB_TIMEOUT" "$LAB_MTU" "$LAB_DESCRIPTION"
    )
}

if [[ $mode == list ]]; then
    while read -r n; do
        { read -r _; read -r _; read -r desc; } < <(scenario_conf "$n")
        printf '%-20s %s\n' "$n" "$desc"
    done < <(all_scenarios)
    exit 0
fi
if [[ $mode == all ]]; then
    mapfile -t names < <(all_scenarios)
fi
((${#names[@]})) || {
    usage >&2
    exit 2
}
for n in "${names[@]}"; do
    [[ -f $LAB_DIR/scenarios/$n/guest.sh ]] || lab_die "no scenario '$n' (see --list)"
done
if [[ $interactive == 1 && ${#names[@]} -ne 1 ]]; then
    lab_die "--interactive runs exactly one scenario"
fi

[[ $(id -u) -eq 0 ]] || lab_die "the lab needs root (network namespaces, tap devices)"
for tool in qemu-system-x86_64 mmdebstrap ip tcpdump setsid; do
    command -v "$tool" >/dev/null || lab_die "$tool is not installed (see tests/lab/host-packages.txt)"
done

# --- image ---------------------------------------------------------------------------------------
t0=$(date +%s)
build_opts=()
[[ $offline == 1 ]] && build_opts+=(--offline)
LAB_IMAGE=$("$LAB_DIR/build-image.sh" "${build_opts[@]}")
export LAB_IMAGE
printf 'lab: image %s ready (%d s)\n' "$(basename "$LAB_IMAGE")" "$(($(date +%s) - t0))"

# --- per-scenario namespace and cleanup ----------------------------------------------------------
run_ts=$(date +%Y%m%d-%H%M%S)
RUN_RESULTS=$results_root/$run_ts
mkdir -p "$RUN_RESULTS"
cur_ns="" cur_pid="" cur_work="" follow_pid=""

cleanup_scenario() {
    local i pids
    if [[ -n $follow_pid ]]; then
        kill "$follow_pid" 2>/dev/null || true
        wait "$follow_pid" 2>/dev/null || true
        follow_pid=""
    fi
    if [[ -n $cur_pid ]]; then
        if kill -0 "$cur_pid" 2>/dev/null; then
            # The scenario runner leads its own process group: stop it and all it started.
            kill -TERM -- "-$cur_pid" 2>/dev/null || true
            for ((i = 0; i < 150; i++)); do
                kill -0 "$cur_pid" 2>/dev/null || break
                sleep 0.1
            done
        fi
        kill -KILL -- "-$cur_pid" 2>/dev/null || true
        wait "$cur_pid" 2>/dev/null || true
        cur_pid=""
    fi
    if [[ -n $cur_ns ]]; then
        # Anything left in the namespace (daemons that detached) was started by this run.
        for ((i = 0; i < 3; i++)); do
            pids=$(ip netns pids "$cur_ns" 2>/dev/null || true)
            [[ -z $pids ]] && break
            # shellcheck disable=SC2086
            kill -KILL $pids 2>/dev/null || true
            sleep 0.2
        done
        ip netns del "$cur_ns" 2>/dev/null || true
        cur_ns=""
    fi
    if [[ -n $cur_work ]]; then
        rm -rf "$cur_work"
        cur_work=""
    fi
}
on_signal() {
    trap - INT TERM
    printf '\nlab: interrupted, cleaning up\n' >&2
    cleanup_scenario
    exit 130
}
trap on_signal INT TERM
trap cleanup_scenario EXIT

passed=0 failed=0 skipped=0 failed_names=()
idx=0
for name in "${names[@]}"; do
    idx=$((idx + 1))
    { read -r conf_timeout; read -r conf_mtu; read -r _; } < <(scenario_conf "$name")
    timeout_s=${opt_timeout:-$conf_timeout}
    mtu=${opt_mtu:-$conf_mtu}
    res=$RUN_RESULTS/$name
    mkdir -p "$res"
    cur_work=$(mktemp -d "${TMPDIR:-/tmp}/rtgt-lab-work.XXXXXX")
    cur_ns=rtgt-lab-$$-$idx-$RANDOM
    net=10.77.$((idx % 250)).
    ip netns add "$cur_ns"
    ip -n "$cur_ns" link set lo up
    ip -n "$cur_ns" tuntap add dev tap0 mode tap
    ip -n "$cur_ns" link set tap0 mtu "$mtu" up
    ip -n "$cur_ns" addr add "${net}1/24" dev tap0

    export LAB_SCENARIO=$name LAB_NETNS=$cur_ns LAB_TAP=tap0 LAB_HOST_IP=${net}1 LAB_GUEST_IP=${net}2
    # shellcheck disable=SC2031
    export LAB_PREFIXLEN=24 LAB_MTU=$mtu LAB_RESULTS=$res LAB_WORK=$cur_work LAB_TIMEOUT=$timeout_s
    export LAB_INTERACTIVE=$interactive
    printf 'lab: %s: running (timeout %d s, mtu %d)\n' "$name" "$timeout_s" "$mtu"
    s0=$(date +%s)
    rc=0
    if [[ $interactive == 1 ]]; then
        ip netns exec "$cur_ns" bash "$LAB_DIR/lib/scenario.sh" || rc=$?
    else
        setsid ip netns exec "$cur_ns" bash "$LAB_DIR/lib/scenario.sh" >"$res/host.log" 2>&1 </dev/null &
        cur_pid=$!
        if [[ $verbose == 1 ]]; then
            : >>"$res/console.log"
            tail -n +1 -F "$res/host.log" "$res/console.log" 2>/dev/null &
            follow_pid=$!
        fi
        timed_out=0
        while kill -0 "$cur_pid" 2>/dev/null; do
            if (($(date +%s) - s0 >= timeout_s)); then
                timed_out=1
                printf 'lab: %s: timeout after %d s, stopping it\n' "$name" "$timeout_s"
                break
            fi
            sleep 0.5
        done
        if [[ $timed_out == 1 ]]; then
            rc=124
            cleanup_scenario
        else
            wait "$cur_pid" || rc=$?
            cur_pid=""
        fi
    fi
    cleanup_scenario
    elapsed=$(($(date +%s) - s0))
    if [[ $rc -eq 0 ]]; then
        passed=$((passed + 1))
        printf 'lab: %s: PASS (%d s)\n' "$name" "$elapsed"
    elif [[ $rc -eq 77 && -f $res/skip-reason ]]; then
        skipped=$((skipped + 1))
        printf 'lab: %s: SKIP (%d s): %s\n' "$name" "$elapsed" "$(cat "$res/skip-reason" 2>/dev/null)"
        rc=0
    else
        failed=$((failed + 1))
        failed_names+=("$name")
        printf 'lab: %s: FAIL (%d s, status %d)\n' "$name" "$elapsed" "$rc"
    fi
    [[ -f $res/report ]] && sed 's/^/    /' "$res/report"
    if [[ $rc -ne 0 ]]; then
        if [[ $verbose == 0 ]]; then
            echo "    --- last lines of the guest console ---"
            tail -n 25 "$res/console.log" 2>/dev/null | sed 's/^/    /' || true
            echo "    --- last lines of the host log ---"
            tail -n 15 "$res/host.log" 2>/dev/null | sed 's/^/    /' || true
        fi
        printf '    results: %s\n' "$res"
    elif [[ $keep_results == 0 ]]; then
        rm -rf "$res"
    fi
done

rmdir "$RUN_RESULTS" 2>/dev/null || true
echo "lab: ${passed} passed, ${failed} failed, ${skipped} skipped"
((failed == 0))
