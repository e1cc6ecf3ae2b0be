#!/usr/bin/env bash
# Builds the Debian package with cargo-deb, installs it, checks what it put on the system
# (binaries, unit, configuration) and that systemd accepts the installed unit, then removes it.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-deb >/dev/null || cargo install cargo-deb --locked --quiet
# The package carries binaries of several crates: build them all, then package.
cargo build --release --workspace --bins --quiet
deb=$(cargo deb -p rtgtd --no-build --strip 2>/dev/null | tail -n1)
[[ -f $deb ]] || { echo "package: cargo deb produced no file" >&2; exit 1; }
echo "package: built $deb ($(du -h "$deb" | cut -f1))"

dpkg -i "$deb" >/dev/null
trap 'dpkg --purge rtgt >/dev/null 2>&1 || true' EXIT
for f in /usr/bin/rtgtd /usr/bin/rtgt-iscsi /usr/bin/rtgt-srp /usr/bin/rtgt-nvme /usr/bin/rtgtctl /usr/bin/rtgt-rdma /usr/lib/systemd/system/rtgtd.service /usr/lib/systemd/system-generators/rtgtd-generator /usr/lib/ocf/resource.d/rtgt/alua-group /etc/rtgt/rtgt.yaml; do
    [[ -e $f ]] || { echo "package: $f not installed" >&2; exit 1; }
done
[[ $(stat -c %a /etc/rtgt/rtgt.yaml) == 600 ]] || { echo "package: /etc/rtgt/rtgt.yaml is not 0600" >&2; exit 1; }
dpkg-query -W -f='${Conffiles}\n' rtgt | grep -q /etc/rtgt/rtgt.yaml ||
    { echo "package: the configuration is not a conffile" >&2; exit 1; }
dpkg-query -W -f='${Recommends}\n' rtgt | grep -q 'libibverbs1, librdmacm1, ibverbs-providers' ||
    { echo "package: does not recommend rdma-core's libraries (the verbs provider)" >&2; exit 1; }
/usr/bin/rtgtd --version
/usr/bin/rtgtctl --help >/dev/null
out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify /usr/lib/systemd/system/rtgtd.service 2>&1 || true)
if grep -q 'rtgtd.service' <<<"$out"; then
    echo "package: systemd-analyze verify complains about the unit:" >&2
    echo "$out" >&2
    exit 1
fi
getent group rtgt >/dev/null || { echo "package: group rtgt not created" >&2; exit 1; }

# The generator turns the configured backstore roots into the unit's writable paths.
gen=$(mktemp -d)
trap 'dpkg --purge rtgt >/dev/null 2>&1 || true; rm -rf "$gen"' EXIT
/usr/lib/systemd/system-generators/rtgtd-generator "$gen" "$gen" "$gen"
grep -qx 'ReadWritePaths=-/var/lib/rtgt/backstores' "$gen/rtgtd.service.d/50-backstore-roots.conf" ||
    { echo "package: the generator did not make /var/lib/rtgt/backstores writable" >&2; exit 1; }
printf 'policy: {backstore_roots: [/srv/luns, /data/rtgt]}\n' >"$gen/other.yaml"
rm -rf "$gen/rtgtd.service.d"
RTGT_CONFIG=$gen/other.yaml /usr/lib/systemd/system-generators/rtgtd-generator "$gen" "$gen" "$gen"
[[ $(grep -c '^ReadWritePaths=' "$gen/rtgtd.service.d/50-backstore-roots.conf") == 2 ]] ||
    { echo "package: the generator does not follow policy.backstore_roots" >&2; exit 1; }
cp /usr/lib/systemd/system/rtgtd.service "$gen/"
out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify "$gen/rtgtd.service" 2>&1 || true)
if grep -q 'rtgtd.service.d\|Unknown key' <<<"$out"; then
    echo "package: the generated drop-in does not verify:" >&2
    echo "$out" >&2
    exit 1
fi

# The packaged daemon as the unit starts it: a LUN in the packaged backstore root works,
# a file outside every root is refused, the socket is root:rtgt 0660 in /run/rtgt and
# rtgtctl finds it with no flags.
mkdir -p /run/rtgt /var/lib/rtgt/backstores
chmod 0700 /var/lib/rtgt
log=$gen/rtgtd.log
(cd / && RUNTIME_DIRECTORY=/run/rtgt exec /usr/bin/rtgtd --config /etc/rtgt/rtgt.yaml --state-dir /var/lib/rtgt) >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; dpkg --purge rtgt >/dev/null 2>&1 || true; rm -rf "$gen" /var/lib/rtgt /run/rtgt' EXIT
for _ in $(seq 100); do [[ -S /run/rtgt/rtgtd.sock ]] && break; sleep 0.1; done
[[ -S /run/rtgt/rtgtd.sock ]] || { echo "package: rtgtd did not start:" >&2; cat "$log" >&2; exit 1; }
[[ $(stat -c '%a %G' /run/rtgt/rtgtd.sock) == "660 rtgt" ]] ||
    { echo "package: socket is $(stat -c '%a %U:%G' /run/rtgt/rtgtd.sock), not 0660 root:rtgt" >&2; exit 1; }
(
    cd /
    rtgtctl -v backstores create pkg1 --type file --path /var/lib/rtgt/backstores/pkg1.img --size 64M
    rtgtctl luns add iqn.2025-01.io.rtgt:disk0 1 pkg1
    if err=$(rtgtctl backstores create outside --type file --path /tmp/rtgt-outside.img --size 64M 2>&1); then
        echo "package: a backstore outside every root was created" >&2
        exit 1
    fi
    grep -q "outside every backstore root" <<<"$err" ||
        { echo "package: unexpected refusal: $err" >&2; exit 1; }
    [[ ! -e /tmp/rtgt-outside.img ]] || { echo "package: /tmp/rtgt-outside.img was created" >&2; exit 1; }
    iscsi-readcapacity16 iscsi://127.0.0.1/iqn.2025-01.io.rtgt:disk0/1 | grep -qi 'logical block length'
) || { echo "package: rtgtd log:" >&2; cat "$log" >&2; exit 1; }
[[ $(stat -c %a /var/lib/rtgt/backstores/pkg1.img) == 600 ]] ||
    { echo "package: backing file is not 0600" >&2; exit 1; }
kill -TERM $pid
wait $pid || { echo "package: rtgtd did not stop cleanly" >&2; cat "$log" >&2; exit 1; }
echo "package: a LUN in /var/lib/rtgt/backstores served, a path outside refused"

echo "package: installed, unit verified, removing"
