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
# The boot number: after a power cut (lab_power_cut) the guest boots again and runs
# guest-reboot.sh instead of guest.sh.
LAB_BOOT=$(cat /lab/boot 2>/dev/null || echo 1)
export LAB_BOOT
script=guest.sh suffix=""
if [[ $LAB_BOOT != 1 ]]; then
    script=guest-reboot.sh suffix=-boot$LAB_BOOT
fi
echo "lab: guest $(uname -r), scenario $LAB_SCENARIO ($script), eth0 $LAB_GUEST_IP mtu $LAB_MTU"
bash "/lab/scenario/$script" 2>&1 | tee "$LAB_OUT/guest$suffix.log"
rc=${PIPESTATUS[0]}
# Leave a copy of the kernel log with the results.
dmesg >"$LAB_OUT/dmesg$suffix.txt" 2>/dev/null || true
exit "$rc"
