# shellcheck shell=bash
# What the benchmark scripts share: running in a network namespace of their own, an
# initiator's report line parsed, a run measured with the target's and the machine's CPU
# time, ratios. Sourced; `measure` needs `rtgtd_pid` (the target's pid), `work` (a scratch
# directory) and may use `on_initiator` (a command prefix, e.g. taskset).

# in_own_netns SCRIPT ARGS... -> runs SCRIPT ARGS in a new network namespace (loopback up,
# MTU 9000, so UDP 4791 on 127.0.0.1 is free even where rdma_rxe holds it) and exits with its
# status; returns at once when already inside one (RTGT_BENCH_NETNS is set). Needs root.
in_own_netns() {
    [[ -z ${RTGT_BENCH_NETNS:-} ]] || return 0
    ((EUID == 0)) || { echo "bench: needs root (a network namespace of its own)" >&2; exit 2; }
    local ns=rtgt-bench-$$ rc=0
    ip netns add "$ns"
    # shellcheck disable=SC2064
    trap "ip netns del $ns 2>/dev/null || true" EXIT
    ip -n "$ns" link set lo up
    ip -n "$ns" link set lo mtu 9000
    RTGT_BENCH_NETNS=$ns ip netns exec "$ns" "$@" || rc=$?
    exit "$rc"
}

hz=$(getconf CLK_TCK)
# CPU time the target has used so far, in clock ticks (user + system, all threads).
target_ticks() { awk '{ print $14 + $15 }' "/proc/$rtgtd_pid/stat"; }
# CPU time every CPU of the machine has spent busy so far (user, nice, system, irq, softirq,
# steal), in clock ticks: the initiator, the target and the kernel's network work together.
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
# An initiator's report line -> "IOS IOPS MB/s MEAN_US P99_US"
parse() {
    sed -n 's/.*ios=\([0-9]*\) IOPS=\([0-9]*\) MB\/s=\([0-9.]*\) avg_lat=\([0-9]*\)us p99_lat=\([0-9]*\)us.*/\1 \2 \3 \4 \5/p'
}
# measure CMD... -> "IOPS MB/s TARGET_CPU_US_PER_IO MEAN_US P99_US MACHINE_CPU_US_PER_IO" of an
# initiator's bench run
measure() {
    local t0 t1 m0 m1 out ios iops mbs avg p99
    t0=$(target_ticks) m0=$(machine_ticks)
    out=$("${on_initiator[@]}" "$@" 2>>"$work/bench.err" | parse | tail -1)
    t1=$(target_ticks) m1=$(machine_ticks)
    # The target's CPU over the whole run (login and logout included) per I/O done.
    read -r ios iops mbs avg p99 <<<"$out"
    awk -v t="$((t1 - t0))" -v mt="$((m1 - m0))" -v hz="$hz" -v n="${ios:-0}" -v i="${iops:-0}" \
        -v m="${mbs:-0}" -v a="${avg:-0}" -v p="${p99:-0}" \
        'BEGIN { printf "%s %s %.1f %s %s %.1f\n", i, m, (n > 0 ? t * 1e6 / hz / n : 0), a, p,
                 (n > 0 ? mt * 1e6 / hz / n : 0) }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }'; }
