#!/usr/bin/env bash
# iproute2 (ip, tc) for the device machine, whose Ubuntu 24.04 image has none: Debian's
# binaries and the libraries they link that the image may lack, fetched here with apt-get
# download and unpacked with dpkg -x into .net/ (ignored by git; carry it with `carry: [".net"]`).
# .net/bin/ip and .net/bin/tc are wrappers that put .net/lib on LD_LIBRARY_PATH for the binary
# only; `ip netns exec NS CMD` gives CMD the caller's LD_LIBRARY_PATH back. `python3 -m bench`
# puts .net/bin first on PATH. Nothing is unpacked into /.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.net/' .git/info/exclude 2>/dev/null || echo '/.net/' >> .git/info/exclude
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download iproute2 libbpf1 libelf1 libmnl0 libbsd0 libmd0 libcap2 libxtables12)
rm -rf .net && mkdir -p .net/bin .net/lib "$tmp/x"
for f in "$tmp"/*.deb; do dpkg -x "$f" "$tmp/x"; done
cp "$tmp/x/sbin/ip" .net/bin/ip.real
cp "$tmp/x/sbin/tc" .net/bin/tc.real
for l in libbpf.so.1 libelf.so.1 libmnl.so.0 libbsd.so.0 libmd.so.0 libxtables.so.12 libcap.so.2; do
    cp -L "$(find "$tmp/x" -name "$l" | head -1)" .net/lib/
done
cat > .net/bin/ip <<'WRAP'
#!/bin/bash
H=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
orig="${LD_LIBRARY_PATH-}"
if [ "${1-}" = netns ] && [ "${2-}" = exec ] && [ $# -ge 4 ]; then
    ns=$3; shift 3
    LD_LIBRARY_PATH="$H/lib" exec "$H/bin/ip.real" netns exec "$ns" env LD_LIBRARY_PATH="$orig" "$@"
fi
LD_LIBRARY_PATH="$H/lib${orig:+:$orig}" exec "$H/bin/ip.real" "$@"
WRAP
cat > .net/bin/tc <<'WRAP'
#!/bin/bash
H=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LD_LIBRARY_PATH="$H/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$H/bin/tc.real" "$@"
WRAP
chmod +x .net/bin/*
rm -rf "$tmp"
.net/bin/ip -V && .net/bin/tc -V
