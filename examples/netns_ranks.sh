#!/usr/bin/env bash
# N "nodes" on one machine: N network namespaces (PREFIX0..PREFIX{N-1}), each joined to a
# bridge in a hub namespace (PREFIXhub) by a veth pair (vethI inside rank I's namespace),
# and the example trainer with one rank in each. Every byte between ranks crosses the veths,
# so `transit-launch sweep --cap tc` on them caps the "network". As root:
#
#   bash examples/netns_ranks.sh setup 4
#   transit-launch sweep --cap tc --iface $(bash examples/netns_ranks.sh ifaces 4) \
#       --bandwidths 1000mbit,100mbit -- bash examples/netns_ranks.sh run 4 --steps 6
#   bash examples/netns_ranks.sh teardown 4
#
# DEVICE=cpu (default): gloo over the veths. DEVICE=cuda: rank I uses GPU I, and NCCL is
# forced onto TCP sockets over the veths (NCCL_NET=Socket, no IB, no P2P, no SHM); NVLink
# multicast stays off. POLICY/BUDGET: run each rank under `transit-launch run`.
# Addresses stay inside these namespaces (10.78.0.0/24 unless SUBNET says otherwise).
set -euo pipefail
PREFIX=${PREFIX:-trn} SUBNET=${SUBNET:-10.78.0} DEVICE=${DEVICE:-cpu}
HERE=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-} n=${2:-}
[[ "$n" =~ ^[1-9][0-9]?$ ]] || { echo "usage: $0 setup|teardown|ifaces|run N [trainer args]" >&2; exit 2; }
shift 2
hub="${PREFIX}hub"

case "$cmd" in
setup)
    ip netns add "$hub"
    ip -n "$hub" link add br0 type bridge
    ip -n "$hub" link set br0 up
    ip -n "$hub" link set lo up
    for ((i = 0; i < n; i++)); do
        ip netns add "$PREFIX$i"
        ip link add "veth$i" netns "$PREFIX$i" type veth peer name "port$i" netns "$hub"
        ip -n "$hub" link set "port$i" master br0 up
        ip -n "$PREFIX$i" addr add "$SUBNET.$((i + 1))/24" dev "veth$i"
        ip -n "$PREFIX$i" link set lo up
        ip -n "$PREFIX$i" link set "veth$i" up
    done
    ;;
teardown)
    for ((i = 0; i < n; i++)); do ip netns del "$PREFIX$i" 2>/dev/null || true; done
    ip netns del "$hub" 2>/dev/null || true
    ;;
ifaces)  # the --iface argument of transit-launch sweep
    out=()
    for ((i = 0; i < n; i++)); do out+=("$PREFIX$i/veth$i"); done
    (IFS=,; echo "${out[*]}")
    ;;
run)
    port=$(( 29000 + RANDOM % 1000 ))
    common=(--device "$DEVICE" "$@")
    env_common=(MASTER_ADDR="$SUBNET.1" MASTER_PORT="$port" WORLD_SIZE="$n" LOCAL_RANK=0 OMP_NUM_THREADS=1
                NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1)
    wrap=()
    if [ -n "${POLICY:-}" ]; then
        wrap=(python3 -m transit_launch run --policy "$POLICY" ${BUDGET:+--gpu-budget "$BUDGET"} --)
    fi
    pids=()
    for ((i = n - 1; i >= 0; i--)); do
        env_i=("${env_common[@]}" RANK="$i" GLOO_SOCKET_IFNAME="veth$i")
        if [ "$DEVICE" = cuda ]; then
            env_i+=(CUDA_VISIBLE_DEVICES="$i" NCCL_NET=Socket NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1
                    NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME="veth$i")
        fi
        if ((i == 0)); then  # rank 0 prints the steps the sweep reads
            (cd "$HERE/.." && ip netns exec "$PREFIX$i" env "${env_i[@]}" "${wrap[@]}" python3 "$HERE/train_llama.py" "${common[@]}")
        else
            (cd "$HERE/.." && ip netns exec "$PREFIX$i" env "${env_i[@]}" "${wrap[@]}" python3 "$HERE/train_llama.py" "${common[@]}" > /dev/null) &
            pids+=($!)
        fi
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    exit $rc
    ;;
*)
    echo "usage: $0 setup|teardown|ifaces|run N [trainer args]" >&2
    exit 2
    ;;
esac
