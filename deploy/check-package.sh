#!/usr/bin/env bash
# Builds the Debian package with cargo-deb, installs it, checks what it put on the system
# (binaries, unit, configuration) and that systemd accepts the installed unit, then removes it.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-deb >/dev/null || cargo install cargo-deb --locked --quiet
# The package carries binaries of several crates: build them all, then package.
cargo build --release --workspace --bins --quiet
deb=$(cargo deb -p rtgt-target --no-build --strip 2>/dev/null | tail -n1)
[[ -f $deb ]] || { echo "package: cargo deb produced no file" >&2; exit 1; }
echo "package: built $deb ($(du -h "$deb" | cut -f1))"

dpkg -i "$deb" >/dev/null
trap 'dpkg --purge rtgt >/dev/null 2>&1 || true' EXIT
for f in /usr/bin/rtgtd /usr/bin/rtgt-iscsi /usr/bin/rtgt-srp /usr/bin/rtgtctl /usr/bin/rtgt-rdma /usr/lib/systemd/system/rtgtd.service /etc/rtgt/rtgt.yaml; do
    [[ -e $f ]] || { echo "package: $f not installed" >&2; exit 1; }
done
[[ $(stat -c %a /etc/rtgt/rtgt.yaml) == 600 ]] || { echo "package: /etc/rtgt/rtgt.yaml is not 0600" >&2; exit 1; }
dpkg-query -W -f='${Conffiles}\n' rtgt | grep -q /etc/rtgt/rtgt.yaml ||
    { echo "package: the configuration is not a conffile" >&2; exit 1; }
/usr/bin/rtgtd --version
/usr/bin/rtgtctl --help >/dev/null
out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify /usr/lib/systemd/system/rtgtd.service 2>&1 || true)
if grep -q 'rtgtd.service' <<<"$out"; then
    echo "package: systemd-analyze verify complains about the unit:" >&2
    echo "$out" >&2
    exit 1
fi
echo "package: installed, unit verified, removing"
