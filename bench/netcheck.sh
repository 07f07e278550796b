#!/usr/bin/env bash
# Whether this machine can run bench/rho_layouts.py: iproute2 runs (on the device image it
# comes carried in .net/bin, bench/fetch_iproute2.sh), and the kernel has network
# namespaces, veth, bridges and tbf. One line says which part failed.
set -uo pipefail
ip -V && tc -V || { echo "netcheck: FAILED: ip or tc does not run"; exit 1; }
bash examples/netns_ranks.sh teardown 2
rc=0
if bash examples/netns_ranks.sh setup 2; then
    ip netns exec trn0 tc qdisc replace dev veth0 root handle 7a5: tbf rate 10Gbit burst 1250000 latency 100ms \
        && ip netns exec trn0 tc -j qdisc show dev veth0 && echo "netcheck: namespaces, veth, bridge, tbf work" \
        || { echo "netcheck: FAILED: tbf"; rc=1; }
else
    echo "netcheck: FAILED to set up namespaces"; rc=1
fi
bash examples/netns_ranks.sh teardown 2
exit $rc
