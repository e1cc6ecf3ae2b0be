#!/usr/bin/env bash
# Runs libiscsi's conformance suite (iscsi-test-cu, Debian package libiscsi-bin) against an iSCSI
# target, one top-level suite per iscsi-test-cu process with a timeout per suite, so that a suite
# that hangs the target costs at most that timeout. Prints one line per suite and the totals:
#
#   LABEL: N passed, N failed, N skipped
#
# Independent of the lab: works against any reachable target, e.g.
#   tests/lab/lib/iscsi-conformance.sh iscsi://127.0.0.1/iqn.2024-01.org.rtgt:disk0/0
#
# Usage: iscsi-conformance.sh [OPTIONS] URL [MULTIPATH_URL]
#   MULTIPATH_URL      a second path to the same LU, given to the MultipathIO suite only
#   --multipath        give the MultipathIO suite URL twice (two sessions to one LU)
#   --timeout S        timeout of one suite in seconds (default 120)
#   --initiator IQN    initiator name (iscsi-test-cu -i); the target's ACL must allow it
#   --initiator2 IQN   second initiator name (-I), used by the reservation/multipath tests
#   --family NAME      test family: ALL (default), SCSI, iSCSI or LINUX
#   --suites "A B"     run only these suites (names as in `iscsi-test-cu -l`, e.g. Inquiry)
#   --skip "A B"       do not run these suites
#   --results DIR      keep each suite's output in DIR/SUITE.log (default: not kept)
#   --label WORD       first word of the totals line (default iscsi-conformance)
#   --strict           exit 1 when a test failed (default: exit 0 once the suites ran)
# A test is "skipped" when iscsi-test-cu reports it as [SKIPPED] (the target lacks the feature or
# the test needs an option); the tests of a suite that timed out or crashed and have no result are
# counted as failed. A suite that cannot even start (iscsi-test-cu exits 255 before its first
# test, e.g. on a reservation conflict left by the previous suite) is retried once after 3 s.
# Exit status 2: iscsi-test-cu missing or bad usage.
set -euo pipefail

timeout_s=120 ini1="" ini2="" family=ALL only="" skip="" results="" label=iscsi-conformance strict=0
multipath=0
urls=()
while (($#)); do
    case $1 in
    --timeout) timeout_s=$2; shift ;;
    --initiator) ini1=$2; shift ;;
    --initiator2) ini2=$2; shift ;;
    --family) family=$2; shift ;;
    --suites) only=$2; shift ;;
    --skip) skip=$2; shift ;;
    --results) results=$2; shift ;;
    --label) label=$2; shift ;;
    --strict) strict=1 ;;
    --multipath) multipath=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    -*) echo "iscsi-conformance: unknown option $1" >&2; exit 2 ;;
    *) urls+=("$1") ;;
    esac
    shift
done
((${#urls[@]} >= 1 && ${#urls[@]} <= 2)) || { echo "usage: $0 [OPTIONS] URL [MULTIPATH_URL]" >&2; exit 2; }
command -v iscsi-test-cu >/dev/null || { echo "iscsi-conformance: iscsi-test-cu not found (libiscsi-bin)" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/iscsi-conformance.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
logdir=${results:-$tmp}
mkdir -p "$logdir"

iscsi-test-cu -l >"$tmp/list"
mapfile -t suites < <(awk -F. -v f="$family" 'NF == 2 && $1 == f { print $2 }' "$tmp/list")
((${#suites[@]})) || { echo "iscsi-conformance: no suites in family $family" >&2; exit 2; }

in_list() {
    local w
    for w in $2; do [[ $w == "$1" || $w == "$family.$1" ]] && return 0; done
    return 1
}

args=(--dataloss --allow-sanitize)
[[ -n $ini1 ]] && args+=(-i "$ini1")
[[ -n $ini2 ]] && args+=(-I "$ini2")

tp=0 tf=0 ts=0
t_all=$(date +%s)
for s in "${suites[@]}"; do
    [[ -n $only ]] && ! in_list "$s" "$only" && continue
    if [[ -n $skip ]] && in_list "$s" "$skip"; then
        printf '  %-28s skipped by request\n' "$s"
        continue
    fi
    ntests=$(awk -F. -v p="$family.$s." 'NF == 3 && index($0, p) == 1' "$tmp/list" | wc -l)
    log=$logdir/$s.log
    suite_urls=("${urls[0]}")
    if [[ $s == MultipathIO ]]; then
        if ((${#urls[@]} == 2)); then
            suite_urls+=("${urls[1]}")
        elif ((multipath)); then
            suite_urls+=("${urls[0]}")
        fi
    fi
    t0=$(date +%s)
    rc=0
    # Unbuffered stdout keeps CUnit's per-test lines in order with the messages on stderr.
    timeout -k 5 "$timeout_s" stdbuf -o0 -e0 iscsi-test-cu "${args[@]}" -t "$family.$s" "${suite_urls[@]}" \
        >"$log" 2>&1 </dev/null || rc=$?
    retried=""
    if ((rc == 255)) && ! grep -q '^Suite: ' "$log"; then
        # The suite could not start (e.g. a reservation or unit attention left by the previous
        # suite while the target tears down its sessions): try once more after a pause.
        mv "$log" "$log.first"
        sleep 3
        rc=0
        timeout -k 5 "$timeout_s" stdbuf -o0 -e0 iscsi-test-cu "${args[@]}" -t "$family.$s" "${suite_urls[@]}" \
            >"$log" 2>&1 </dev/null || rc=$?
        retried=" (setup failed once, retried)"
    fi
    dt=$(($(date +%s) - t0))
    # CUnit's "Run Summary" gives the tests run, passed and failed; libiscsi reports a test it cannot
    # run (feature not implemented by the target, option not given) as passed with a "[SKIPPED]"
    # message, so the tests whose output has [SKIPPED] and that did not fail are moved from passed
    # to skipped. Without a summary (timeout, crash) the per-test lines are counted.
    read -r p f k < <(awk '
        function close_test() {
            if (cur == "") return
            if (state == "failed") bf++
            else if (skipped) bk++
            else if (state == "passed") bp++
            cur = ""
        }
        /^  Test: / { close_test(); cur = $0; state = ""; skipped = 0 }
        /\[SKIPPED\]/ && cur != "" { skipped = 1 }
        cur != "" && /(\.\.\.|^)passed$/ { state = "passed" }
        cur != "" && /(\.\.\.|^)FAILED$/ { state = "failed" }
        /^Run Summary:/ { close_test(); summary = 1 }
        summary && $1 == "tests" { sp = $4; sf = $5; have = 1 }
        END {
            close_test()
            if (have) { p = sp - bk; if (p < 0) p = 0; printf "%d %d %d\n", p, sf, bk }
            else printf "%d %d %d\n", bp, bf, bk
        }' "$log")
    note=$retried
    if ((rc == 124 || rc == 137)); then
        note=" TIMEOUT"
    elif ((rc == 255)); then
        note=" SETUP FAILED"
    elif ((rc > 128)); then
        note=" CRASHED (signal $((rc - 128)))"
    fi
    missing=$((ntests - p - f - k))
    if ((missing > 0)); then
        f=$((f + missing))
        note+=" ($missing without result)"
    fi
    printf '  %-28s %3d passed, %3d failed, %3d skipped (%d s)%s\n' "$s" "$p" "$f" "$k" "$dt" "$note"
    tp=$((tp + p)) tf=$((tf + f)) ts=$((ts + k))
done
printf '  (%d s in all)\n' "$(($(date +%s) - t_all))"
printf '%s: %d passed, %d failed, %d skipped\n' "$label" "$tp" "$tf" "$ts"
if ((strict && tf > 0)); then exit 1; fi
exit 0
