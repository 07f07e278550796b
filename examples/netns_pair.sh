#!/usr/bin/env bash
# Two "nodes" on one machine for bandwidth sweeps without a cluster: network namespaces
# NS_A and NS_B joined by a veth pair, and the example trainer on CPU with gloo, one rank
# in each. As root:
#   bash examples/netns_pair.sh setup
#   transit-launch sweep --cap tc --iface tra/veth-a,trb/veth-b --bandwidths 1000mbit,100mbit \
#       -- bash examples/netns_pair.sh run --steps 6
#   bash examples/netns_pair.sh teardown
# NS_A, NS_B, ADDR_A, ADDR_B override the names and addresses (addresses stay inside
# these namespaces: nothing leaves the machine).
set -euo pipefail
NS_A=${NS_A:-tra} NS_B=${NS_B:-trb}
ADDR_A=${ADDR_A:-10.77.0.1} ADDR_B=${ADDR_B:-10.77.0.2}
HERE=$(cd "$(dirname "$0")" && pwd)

case "${1:-}" in
setup)
    ip netns add "$NS_A"
    ip netns add "$NS_B"
    ip link add veth-a netns "$NS_A" type veth peer name veth-b netns "$NS_B"
    ip -n "$NS_A" addr add "$ADDR_A/24" dev veth-a
    ip -n "$NS_B" addr add "$ADDR_B/24" dev veth-b
    for ns in "$NS_A" "$NS_B"; do
        ip -n "$ns" link set lo up
    done
    ip -n "$NS_A" link set veth-a up
    ip -n "$NS_B" link set veth-b up
    ;;
teardown)
    ip netns del "$NS_A" 2>/dev/null || true
    ip netns del "$NS_B" 2>/dev/null || true
    ;;
run)
    shift
    port=$(( 29000 + RANDOM % 1000 ))
    common=(--device cpu --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 768 --vocab 4096 --seq-len 64 --batch 2 "$@")
    env_common=(MASTER_ADDR="$ADDR_A" MASTER_PORT="$port" WORLD_SIZE=2 OMP_NUM_THREADS=1)
    ip netns exec "$NS_B" env "${env_common[@]}" RANK=1 LOCAL_RANK=0 GLOO_SOCKET_IFNAME=veth-b \
        python3 "$HERE/train_llama.py" "${common[@]}" > /dev/null &
    other=$!
    ip netns exec "$NS_A" env "${env_common[@]}" RANK=0 LOCAL_RANK=0 GLOO_SOCKET_IFNAME=veth-a \
        python3 "$HERE/train_llama.py" "${common[@]}"
    wait "$other"
    ;;
*)
    echo "usage: $0 setup|teardown|run [trainer args]" >&2
    exit 2
    ;;
esac
