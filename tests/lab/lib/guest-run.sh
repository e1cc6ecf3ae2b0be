#!/bin/bash
# Runs the scenario's guest.sh inside the lab guest (started by the guest's /init from the share).
# Its exit status is the guest's result.
set -u
# shellcheck disable=SC1091
source /lab/env
export LAB_SHARE=/lab LAB_EVENTS=/lab/events LAB_OUT=/lab/out
export BASH_ENV=/lab/lib/guest-lib.sh
mkdir -p "$LAB_OUT"
cd /lab/scenario || exit 1
echo "lab: guest $(uname -r), scenario $LAB_SCENARIO, eth0 $LAB_GUEST_IP mtu $LAB_MTU"
bash /lab/scenario/guest.sh 2>&1 | tee "$LAB_OUT/guest.log"
rc=${PIPESTATUS[0]}
# Leave a copy of the kernel log with the results.
dmesg >"$LAB_OUT/dmesg.txt" 2>/dev/null || true
exit "$rc"
