#!/usr/bin/env bash
# What each device call runs, on the nvidia-h200-x2 machine (two H200s, used as two
# independent single-GPU benches unless the phase says otherwise). Results go to $OUT.
#
#   bash bench/device_runs.sh shim      # GPU0: GPU tests + acceptance + UVM probe + calibration
#                                       # GPU1: shim_policies (overhead, policies under a budget) + peer smoke
#   bash bench/device_runs.sh offload   # GPU0: reference + transit policies; GPU1: the offloading peers
#   bash bench/device_runs.sh offload-transit; bash bench/device_runs.sh offload-peers   # the same on one GPU
#   bash bench/device_runs.sh verify | offload-fsdp | offload-peers-rest | finish   # what the 2026-11-29 runs left
#   bash bench/device_runs.sh next | next-peers | next-stage | peers-rerun   # the next GPU session: ranked advise, memory
#                                        # timeline, lifetime probe, ZeRO-Infinity at 3, peers cut below 10 steps
#   bash bench/device_runs.sh multigpu   # issue 8, on nvidia-h200-x2 or larger
#   bash bench/device_runs.sh netcheck titan-memory scale-in-matrix rho-sockets   # issues 19 and 18 on x2;
#                                        # several phases run in one call, after one setup
# The wheels they need: bash bench/fetch_wheels.sh (then carry .whl). iproute2 (ip, tc), which the
# device image lacks, comes as Debian's binaries in .net/bin (wrappers that set LD_LIBRARY_PATH to
# .net/lib): see bench/fetch_iproute2.sh.
# The wheels they need: bash bench/fetch_wheels.sh (then carry .whl).
#
# Single-GPU runs pin their host threads to separate halves of the cores so that the
# CPU-side optimizers of the peers do not steal the transit runs' launch threads.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID TORCH_EXTENSIONS_DIR=/tmp/torch_ext
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        $(ls .whl/*.whl | grep -v /torchtitan-) && export PYTHONPATH=/tmp/site || exit 1
    # TorchTitan 0.3.0 needs a newer torch.distributed.fsdp than torch 2.11 has; 0.2.2 runs there
    titan=0.3.0; python3 -c "from torch.distributed.fsdp import DataParallelMeshDims" 2>/dev/null || titan=0.2.2
    ls .whl/torchtitan-$titan-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/site .whl/torchtitan-$titan-*.whl && echo "torchtitan $titan"
fi
[ -d .net/bin ] && export PATH="$PWD/.net/bin:$PATH"
[ -f .ext/torch_ext.tar ] && mkdir -p $TORCH_EXTENSIONS_DIR && tar xf .ext/torch_ext.tar -C $TORCH_EXTENSIONS_DIR
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader
nproc; free -g | head -2
python3 -c "from transit_launch.shim import build as s; p, w = s.build('transit_launch/shim/lib'); print('shim:', p, w or '')"
half=$(( $(nproc) / 2 ))
g0() { CUDA_VISIBLE_DEVICES=0 taskset -c 0-$((half - 1)) "$@"; }
g1() { CUDA_VISIBLE_DEVICES=1 taskset -c $half-$(( $(nproc) - 1 )) "$@"; }

peer_smoke() {  # peers on a small model (default: ZeRO-2/3 offload, FSDP2 offload; or the trainer flags
                # given, one argument each); DeepSpeed's CPU Adam is JIT-built on the way and kept in $OUT
    local m="--dim 512 --layers 2 --heads 8 --kv-heads 4 --ffn 1536 --vocab 8192 --seq-len 1024 --steps 3"
    [ $# -gt 0 ] || set -- "--engine deepspeed --zero offload" "--engine deepspeed --zero infinity" "--cpu-offload"
    for p in "$@"; do
        echo "== $p"; g1 timeout ${SMOKE_TIMEOUT:-240} python3 examples/train_llama.py $m $p 2>&1 | grep -v '^\[' | tail -4
    done
    tar cf "$OUT/torch_ext.tar" -C $TORCH_EXTENSIONS_DIR . 2>/dev/null
}

lifetime_probes() {  # bench/lifetime_probe.py's discard (managed memory, no budget) and empty-cache, one
                     # microbatch without recomputation; the command's prefix (e.g. g1) comes first
    local p="--seq-len 8192 --batch 2 --accum 1 --no-recompute"
    "$@" timeout 90 python3 -m transit_launch run --policy base -- python3 bench/lifetime_probe.py --mode discard \
        --out "$OUT/probe_discard.json" -- $p > "$OUT/probe_discard.log" 2>&1
    "$@" timeout 80 python3 bench/lifetime_probe.py --mode empty-cache --out "$OUT/probe_empty_cache.json" -- $p \
        > "$OUT/probe_empty_cache.log" 2>&1
}

[ $# -gt 0 ] || set -- usage
for phase in "$@"; do
case "$phase" in
shim)
    ( export TRANSIT_SKIP_BUILD=1
      g0 timeout 300 bash bench/gpu_checks.sh > "$OUT/checks.log" 2>&1
      g0 timeout 100 python3 bench/uvm_residency_probe.py --out "$OUT/uvm_probe.json" > "$OUT/probe.log" 2>&1
      g0 timeout 120 python3 bench/calibrate.py --measure --out "$OUT/calibration.json" > "$OUT/calibrate.log" 2>&1
    ) &
    ( g1 timeout 380 python3 bench/shim_policies.py --out "$OUT/shim_policies.json" --timeout 150 > "$OUT/policies.log" 2>&1
      peer_smoke > "$OUT/peers_smoke.log" 2>&1
    ) &
    wait
    tail -n 4 "$OUT"/*.log
    ;;
offload)
    g0 python3 bench/offload.py --set transit --gpu 0 --out "$OUT/offload_transit.json" --deadline 400 --timeout 200 > "$OUT/transit.log" 2>&1 &
    ( g1 timeout 120 python3 -m pytest -q -rs tests/test_gpu.py -k prefetch > "$OUT/gpu_tests_prefetch.log" 2>&1
      g1 python3 bench/offload.py --set peers --gpu 1 --out "$OUT/offload_peers.json" --deadline 330 --timeout 200 \
          > "$OUT/peers.log" 2>&1 ) &
    wait
    tail -n 3 "$OUT/gpu_tests_prefetch.log"
    python3 bench/offload.py --report "$OUT"/offload_*.json
    ;;
offload-transit)  # one GPU: the reference and the transit policies (about 9 minutes)
    timeout 120 python3 -m pytest -q -rs tests/test_gpu.py -k prefetch > "$OUT/gpu_tests_prefetch.log" 2>&1
    tail -n 3 "$OUT/gpu_tests_prefetch.log"
    python3 bench/offload.py --set transit --gpu 0 --out "$OUT/offload_transit.json" --deadline 390 --timeout 150 \
        2>&1 | tee "$OUT/transit.log" | cut -c1-400
    ;;
offload-peers)    # one GPU: the offloading peers (about 9 minutes)
    python3 bench/offload.py --set peers --gpu 0 --out "$OUT/offload_peers.json" --deadline 340 --timeout 150 \
        2>&1 | tee "$OUT/peers.log" | cut -c1-400
    ;;
verify)           # one GPU, about 9 minutes: the GPU tests, planner calibration, base under a budget
    timeout 220 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 4
    timeout 100 python3 bench/calibrate.py --measure --out "$OUT/calibration.json" > "$OUT/calibrate.log" 2>&1
    python3 bench/calibrate.py --compare "$OUT/calibration.json"
    timeout 190 python3 bench/shim_policies.py --only reference,base-budget --timeout 140 \
        --out "$OUT/base_budget.json" 2>&1 | tail -n 4
    ;;
offload-fsdp)     # one GPU, about 8 minutes: FSDP2 CPU offload at the paper's ratio (35-40 s a step)
    python3 bench/offload.py --set fsdp-cpu-offload --gpu 0 --accum 12 --steps 11 --warmup 1 --timeout ${FSDP_TIMEOUT:-540} \
        --out "$OUT/offload_fsdp.json" 2>&1 | tee "$OUT/fsdp.log" | cut -c1-400
    ;;
offload-peers-rest)  # one GPU, about 9 minutes: the peers at 1 and 3 microbatches, TorchTitan under
                     # the shim, the gate's losses with deterministic kernels (math attention)
    python3 bench/offload.py --set peers --gpu 0 --accum 1,3 --out "$OUT/offload_peers_rest.json" --deadline 200 \
        --timeout 120 2>&1 | tee "$OUT/peers.log" | cut -c1-400
    timeout 220 python3 bench/torchtitan_check.py --steps 10 --out "$OUT/torchtitan.json" 2>&1 | tail -n 6
    timeout 60 python3 bench/offload.py --set reference,off,advise --model=--deterministic --seq-len 2048 \
        --accum 4 --steps 8 --warmup 3 --out "$OUT/offload_losses.json" > "$OUT/losses.log" 2>&1
    python3 bench/offload.py --report "$OUT/offload_losses.json" | tail -n 8
    ;;
finish)           # one GPU, about 8 minutes: what offload-peers-rest left (its loss check's 60 s
                  # timeout was shorter than three runs; TorchTitan 0.3.0 does not import on torch 2.11)
    timeout 240 python3 bench/offload.py --set reference,off,advise --model=--deterministic --seq-len 2048 \
        --accum 4 --steps 8 --warmup 3 --timeout 100 --out "$OUT/offload_losses.json" > "$OUT/losses.log" 2>&1
    python3 bench/offload.py --report "$OUT/offload_losses.json" | tail -n 8
    timeout 240 python3 bench/torchtitan_check.py --steps 10 --timeout 110 --out "$OUT/torchtitan.json" 2>&1 | tail -n 6
    python3 bench/offload.py --set peers --gpu 0 --accum 3 --out "$OUT/offload_peers_accum3.json" --deadline 200 \
        --timeout 110 2>&1 | tee "$OUT/peers3.log" | cut -c1-300
    ;;
next)             # one GPU, about 8 minutes: advise with ranked placement (cold data leaves only
                  # when the budget needs its room) along the curve, its GPU tests, and the step's
                  # memory timeline (what a lifetime-aware policy could reach: bench/memory_timeline.py)
    timeout 150 python3 -m pytest -q -rs tests/test_gpu.py -k advise 2>&1 | tee "$OUT/gpu_tests_advise.log" | tail -n 3
    for n in 1 3 12; do
        timeout 90 python3 bench/memory_timeline.py --step 4 --out "$OUT/timeline_accum$n.json" -- \
            --seq-len 8192 --batch 2 --accum $n > "$OUT/timeline_accum$n.log" 2>&1
    done
    python3 bench/memory_timeline.py --analyze "$OUT"/timeline_accum*.json 2>&1 | tail -n 6
    python3 bench/offload.py --set reference,advise --gpu 0 --out "$OUT/offload_advise_ranked.json" --deadline 230 \
        --steps 12 --warmup 2 --timeout 120 2>&1 | tee "$OUT/advise.log" | cut -c1-300
    ;;
next-peers)       # one GPU, about 5 minutes: ZeRO-Infinity at 3 microbatches (the curve's missing peer
                  # point), then docs/lifetime-policy.md's two mechanisms (bench/lifetime_probe.py)
    python3 bench/offload.py --set zero-infinity --gpu 0 --accum 3 --out "$OUT/offload_zinf_accum3.json" \
        --timeout 150 2>&1 | tee "$OUT/zinf.log" | cut -c1-300
    m="--seq-len 8192 --batch 2 --accum 1"
    timeout 90 python3 -m transit_launch run --policy base -- python3 bench/lifetime_probe.py --mode discard \
        --out "$OUT/probe_discard.json" -- $m > "$OUT/probe_discard.log" 2>&1
    timeout 90 python3 bench/lifetime_probe.py --mode empty-cache --out "$OUT/probe_empty_cache.json" -- $m \
        > "$OUT/probe_empty_cache.log" 2>&1
    # the same under the shim: segments cudaMalloc'd again each step are new managed memory
    timeout 90 python3 -m transit_launch run --policy base -- python3 bench/lifetime_probe.py --mode empty-cache \
        --out "$OUT/probe_empty_cache_managed.json" -- $m > "$OUT/probe_empty_cache_managed.log" 2>&1
    grep -h '^{"step"' "$OUT"/probe_*.log | grep -v '"loss"' | cut -c1-400
    ;;
next-stage)       # one GPU, about 9 minutes: the experimental staging (advise + TRANSIT_STAGE=1,
                  # docs/lifetime-policy.md) and ranked advise against the reference along the curve
    python3 bench/offload.py --set reference,advise,advise-stage --gpu 0 --accum 12,1,3 --out "$OUT/offload_stage.json" \
        --deadline 450 --steps 13 --warmup 3 --timeout 150 2>&1 | tee "$OUT/stage.log" | cut -c1-300
    ;;
stage-fixed)      # one GPU, about 8 minutes: staging after the adapter fix (8a: depth counted in forward only),
                  # ZeRO-Infinity at 3 microbatches with its reference, then the staging GPU test
    python3 bench/offload.py --set reference,advise-stage --gpu 0 --accum 1,12 --out "$OUT/offload_stage_fixed.json" \
        --deadline 230 --steps 13 --warmup 3 --timeout 130 2>&1 | tee "$OUT/stage.log" | cut -c1-300
    python3 bench/offload.py --set reference,zero-infinity --gpu 0 --accum 3 --out "$OUT/offload_zinf_accum3.json" \
        --deadline 60 --timeout 170 2>&1 | tee "$OUT/zinf.log" | cut -c1-300
    timeout 100 python3 -m pytest -q -rs tests/test_gpu.py -k staging 2>&1 | tee "$OUT/gpu_tests_stage.log" | tail -n 4
    ;;
gpu-tests)        # one GPU, about 3 minutes: the advise and staging GPU tests
    timeout 280 python3 -m pytest -q -rs tests/test_gpu.py -k "advise or staging" 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 4
    ;;
peers-rerun)      # one GPU, about 5 minutes: the peer runs that timeouts cut below 10 measured steps
                  # (ZeRO-Offload at 12: 9; FSDP2 CPU offload at 3: 8). FSDP2 at 12 (38 s a step) is
                  # `FSDP_TIMEOUT=480 bash bench/device_runs.sh offload-fsdp` on its own.
    python3 bench/offload.py --set zero-offload --gpu 0 --accum 12 --budget 19003850752 --timeout 170 \
        --out "$OUT/offload_zoff_accum12.json" 2>&1 | tee "$OUT/zoff.log" | cut -c1-300
    python3 bench/offload.py --set fsdp-cpu-offload --gpu 0 --accum 3 --steps 12 --warmup 2 --budget 19003850752 \
        --timeout 130 --out "$OUT/offload_fsdp_accum3.json" 2>&1 | tee "$OUT/fsdp3.log" | cut -c1-300
    ;;
multigpu)         # issue 8 on an x2/x4/x8 machine: scale-in N -> N/2, then rho over NCCL sockets; the
                  # emulated GPU comes from the planner (fits N GPUs' layout, not N/2's)
    n=$(nvidia-smi -L | wc -l)
    timeout 300 python3 bench/scale_in.py --gpus "$n" --out "$OUT/scale_in.json" 2>&1 | tail -n 8
    b=$(python3 bench/scale_in.py --gpus "$n" --seq-len 4096 --print-budget) || exit 1
    timeout 260 python3 bench/rho_layouts.py --device cuda --layouts "$n,$((n / 2)):advise:$b" \
        --bandwidths 10gbit,2gbit --model "--seq-len 4096" --global-batch "$n" --steps 6 --repeat 1 \
        --timeout 120 --out "$OUT/rho_gpu.json" 2>&1 | tail -n 6
    ;;
netcheck)         # issue 19: iproute2 runs here, and the kernel has network namespaces, veth, bridges and tbf
    ip -V && tc -V || echo "netcheck: FAILED: ip or tc does not run"
    bash examples/netns_ranks.sh teardown 2
    if bash examples/netns_ranks.sh setup 2; then
        ip netns exec trn0 tc qdisc replace dev veth0 root handle 7a5: tbf rate 10Gbit burst 1250000 latency 100ms \
            && ip netns exec trn0 tc -j qdisc show dev veth0 && echo "netcheck: namespaces, veth, bridge, tbf work"
    else
        echo "netcheck: FAILED to set up namespaces"
    fi
    bash examples/netns_ranks.sh teardown 2
    ;;
scale-in-matrix)  # issue 19: N -> N/2 with and without recomputation at two global batches, repeated
                  # (SCALE_ARGS adds or overrides flags, e.g. --repeats 1 --layouts full,half-advise)
    n=$(nvidia-smi -L | wc -l)
    timeout ${SCALE_TIMEOUT:-560} python3 bench/scale_in_matrix.py --gpus "$n" --configs ac:1,ac:2,noac:1,noac:2 \
        --repeats 2 --steps 10 --timeout 150 --out "$OUT/scale_in_matrix${SCALE_TAG:-}.json" ${SCALE_ARGS:-} 2>&1 \
        | cut -c1-600
    ;;
rho-sockets)      # issue 19: rho over NCCL sockets between network namespaces, N-GPU no-offload layout and
                  # N/2-GPU advise layout under the scale-in's emulated GPU, same global batch and microbatch
    n=$(nvidia-smi -L | wc -l)
    b=$(python3 bench/scale_in.py --gpus "$n" --print-budget) || continue
    # several sockets and threads per NCCL connection, so that NCCL itself is not the bottleneck of a veth
    NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 timeout ${RHO_TIMEOUT:-400} python3 bench/rho_layouts.py \
        --device cuda --layouts "$n,$((n / 2)):advise:$b" --bandwidths ${RHO_BW:-40gbit,10gbit} \
        --global-batch $((2 * n)) --micro-batch 2 --model "--seq-len 8192" --steps 5 --repeat 2 \
        --single-rank-repeat 1 --timeout 120 --out "$OUT/rho_sockets.json" 2>&1 | tail -n 8
    ;;
titan-steps)      # one GPU, about 7 minutes, CARRY .whl: TorchTitan unchanged at Llama3-8B dimensions, 16 layers,
                  # TITAN_ACCUM microbatches: every step's time without offloading and under advise, with and
                  # without the optimizer state's own pool (the steps before steady state); the pool's GPU test
    python3 -m pytest -q -rs tests/test_gpu.py -k state_pool 2>&1 | tail -5 | tee "$OUT/gpu_state_pool.log"
    # a build that does not populate new device-placed allocations at once, as before 2026-12-01
    # (TITAN_RUNS can name it as advise:TRANSIT_SHIM=/tmp/nopopulate/libtransit.so)
    python3 -c "from transit_launch.shim import build as s; print(s.build('/tmp/nopopulate', extra_cflags=['-DTRANSIT_NO_POPULATE']))"
    # (STATE_OFF=f in a run's name: the reference's peak reserved less f of the AdamW state as its budget)
    timeout 520 python3 bench/titan_steps.py --model llama3-8b --layers 16 --accum ${TITAN_ACCUM:-8} --steps 6 \
        --timeout 200 --runs ${TITAN_RUNS:-ref,advise,advise:TRANSIT_STATE_POOL=0} --budget ${TITAN_BUDGET:-0} \
        --out "$OUT/titan_steps${TITAN_TAG:-}.json" 2>&1 \
        | grep -v '^\[' | cut -c1-600 | tail -40
    ;;
host-state)       # issue 27, one GPU, about 9 minutes, CARRY .whl: TorchTitan unchanged (titan-steps' model) at 16
                  # and 1 microbatches: advise with the optimizer state over the budget made in pinned host
                  # memory (the default) against TRANSIT_HOST_STATE=0 (managed, as before)
    for acc in 16 1; do
        timeout 290 python3 bench/titan_steps.py --model llama3-8b --layers 16 --accum $acc --steps 6 --timeout 140 \
            --runs ref,advise,advise:TRANSIT_HOST_STATE=0 --budget 0 --out "$OUT/titan_steps_accum${acc}_hoststate.json" \
            2>&1 | grep -v '^\[' | cut -c1-600 | tail -20
    done
    ;;
stream)           # issue 27, one GPU, about 8 minutes, CARRY .whl: TorchTitan unchanged (titan-steps' model) at 16
                  # and 1 microbatches: advise against advise with the step streamed through the copy engines
    for acc in 16 1; do
        timeout $([ $acc = 16 ] && echo 345 || echo 160) python3 bench/titan_steps.py --model llama3-8b --layers 16 \
            --accum $acc --steps 6 --timeout 140 --runs ref,advise,advise:TRANSIT_OVERLAP_STEP=stream --budget 0 --out "$OUT/titan_steps_accum${acc}_stream.json" \
            2>&1 | grep -v '^\[' | cut -c1-600 | tail -20
    done
    ;;
stream-2)         # issue 27, one GPU, about 8 minutes, CARRY .whl: the ways to get pinned host memory (the
                  # warm-up's cost), the GPU tests of the pinned state and the streamed step, and TorchTitan
                  # at 16 microbatches with the streamed step (its state pinned whole)
    timeout 70 python3 bench/host_populate_probe.py --gb 8 --threads 16 --cases fault,hostalloc,hostallocN,register \
        --out "$OUT/pin_probe.json" 2>&1 | tail -5
    timeout 200 python3 -m pytest -q -rs tests/test_gpu.py -k "stream or wide or state_pool" 2>&1 | tail -8
    timeout 230 python3 bench/titan_steps.py --model llama3-8b --layers 16 --accum 16 --steps 6 --timeout 140 \
        --runs ref,advise:TRANSIT_OVERLAP_STEP=stream --budget 0 --out "$OUT/titan_steps_accum16_stream2.json" \
        2>&1 | grep -v '^\[' | cut -c1-600 | tail -8
    ;;
stream-3)         # issue 27, one GPU, about 2 minutes, CARRY .whl: TorchTitan at one microbatch with the streamed
                  # step, its state made pinned by cudaHostRegister of memory 16 threads populated (the warm-up)
    timeout 120 python3 bench/titan_steps.py --model llama3-8b --layers 16 --accum 1 --steps 6 --timeout 70 \
        --runs ref,advise:TRANSIT_OVERLAP_STEP=stream --budget 0 --out "$OUT/titan_steps_accum1_stream3.json" \
        2>&1 | grep -v '^\[' | cut -c1-600 | tail -8
    ;;
titan-memory)     # issue 18: TorchTitan's memory on the catalog models at truncated depth (TITAN_MATRIX,
                  # TITAN_DEADLINE seconds; 1-GPU runs two at a time, one per GPU)
    timeout ${TITAN_TIMEOUT:-560} python3 bench/titan_memory.py --matrix "$TITAN_MATRIX" --lanes 2 --timeout ${TITAN_RUN_TIMEOUT:-200} \
        --deadline ${TITAN_DEADLINE:-0} --out "$OUT/titan_memory${TITAN_TAG:-}.json" 2>&1 | grep -v '^\[titan\]\|^\[rank' \
        | cut -c1-600
    ;;
overlap)          # issue 20 on x2, about 9 minutes. GPU0: the losses of the overlapped step with
                  # deterministic kernels, then the curve at 1 and 3 microbatches with recomputation;
                  # GPU1: the same curve without recomputation, then the newer peers' smoke test
    c="--set reference,advise,advise-overlap,torchao-offload --accum 1,3 --steps 13 --warmup 3 --timeout 110"
    ( g0 timeout 130 python3 bench/offload.py --set reference,advise,advise-overlap --model=--deterministic \
          --seq-len 2048 --accum 4 --steps 8 --warmup 3 --timeout 40 --gpu 0 --out "$OUT/overlap_losses.json" \
          > "$OUT/losses.log" 2>&1
      g0 timeout 430 python3 bench/offload.py $c --gpu 0 --deadline 320 --out "$OUT/overlap_ac.json" > "$OUT/ac.log" 2>&1
    ) &
    ( g1 timeout 360 python3 bench/offload.py $c --model=--no-recompute --gpu 1 --deadline 270 \
          --out "$OUT/overlap_noac.json" > "$OUT/noac.log" 2>&1
      SMOKE_TIMEOUT=150 peer_smoke "--engine deepspeed --zero twinflow" "--engine deepspeed --zero zenflow" \
          "--engine torchao-offload" > "$OUT/peer_smoke.log" 2>&1
    ) &
    wait
    for f in losses ac noac; do echo "== $f"; cut -c1-330 "$OUT/$f.log"; done
    cat "$OUT/peer_smoke.log"
    ;;
overlap-2)        # issue 20 on x2, about 9 minutes: the paper's ratio (12 microbatches) for both shapes,
                  # ZeRO-Offload++ Twin-Flow at 1, ZenFlow's smoke test with its errors kept, and the
                  # lifetime probe (docs/lifetime-policy.md) on the shape without recomputation
    c="--set reference,advise,advise-overlap,torchao-offload --accum 12 --steps 11 --warmup 3 --timeout 120"
    m="--dim 512 --layers 2 --heads 8 --kv-heads 4 --ffn 1536 --vocab 8192 --seq-len 1024 --steps 6"
    ( g0 timeout 380 python3 bench/offload.py $c --gpu 0 --deadline 260 --out "$OUT/overlap_ac12.json" > "$OUT/ac12.log" 2>&1
      g0 timeout 40 python3 examples/train_llama.py $m --engine deepspeed --zero zenflow > "$OUT/zenflow_smoke.log" 2>&1
      g0 timeout 150 python3 bench/offload.py --set reference,zero-twinflow,zenflow --accum 1 --steps 13 --warmup 3 \
          --timeout 110 --gpu 0 --deadline 120 --out "$OUT/peers_ac1.json" > "$OUT/peers_ac1.log" 2>&1
    ) &
    ( g1 timeout 330 python3 bench/offload.py $c --model=--no-recompute --gpu 1 --deadline 220 \
          --out "$OUT/overlap_noac12.json" > "$OUT/noac12.log" 2>&1
      lifetime_probes g1
    ) &
    wait
    for f in ac12 noac12 peers_ac1; do echo "== $f"; cut -c1-330 "$OUT/$f.log"; done
    echo "== zenflow smoke"; grep -v '^\[rank\|^ *$' "$OUT/zenflow_smoke.log" | tail -n 12 | cut -c1-300
    echo "== probes"; tail -n 3 "$OUT"/probe_*.log | cut -c1-400
    ;;
overlap-3)        # issue 20 on x2, about 8 minutes. GPU0: why the overlapped step is slower (its early
                  # updates on the compute stream: the same order and bytes without concurrency), then
                  # the peers without recomputation; GPU1: Twin-Flow and ZenFlow with recomputation
    q="--accum 1 --steps 13 --warmup 3"
    ( g0 timeout 150 python3 bench/offload.py --set reference,advise,advise-overlap,advise-serial $q --timeout 60 \
          --gpu 0 --out "$OUT/overlap_serial.json" 2>&1 | cut -c1-300
      g0 timeout 300 python3 bench/offload.py --set reference,zero-offload,fsdp-cpu-offload,zero-twinflow,zenflow $q \
          --model=--no-recompute --timeout 180 --deadline 150 --gpu 0 --out "$OUT/peers_noac1.json" 2>&1 | cut -c1-300
    ) > "$OUT/lane0.txt" &
    ( g1 timeout 450 python3 bench/offload.py --set reference,zero-twinflow,zenflow $q --timeout 200 --deadline 260 \
          --gpu 1 --out "$OUT/peers_ac1.json" 2>&1 | cut -c1-300 ) > "$OUT/lane1.txt" &
    wait
    cat "$OUT/lane0.txt" "$OUT/lane1.txt"
    ;;
zenflow)          # issue 20 on x2, about 2 minutes: ZenFlow at one microbatch, both shapes
    q="--set reference,zenflow --accum 1 --steps 13 --warmup 3 --timeout 90"
    g0 timeout 200 python3 bench/offload.py $q --gpu 0 --out "$OUT/zenflow_ac1.json" 2>&1 | cut -c1-300 &
    g1 timeout 200 python3 bench/offload.py $q --model=--no-recompute --gpu 1 --out "$OUT/zenflow_noac1.json" 2>&1 \
        | cut -c1-300 &
    wait
    ;;
peers-next)       # issue 20, what the 2026-11-30 runs left, on x2 (about 9 minutes): ZenFlow with room for
                  # DeepSpeed's CPU Adam JIT build (it timed out at 90 s on a fresh machine), Twin-Flow at 3
                  # and 12 microbatches; GPU0 with recomputation, GPU1 without
    for g in 0 1; do
        m=$([ $g = 1 ] && echo --model=--no-recompute)
        ( export CUDA_VISIBLE_DEVICES=$g
          taskset -c $((g * half))-$((g * half + half - 1)) timeout 250 python3 bench/offload.py \
              --set reference,zenflow --accum 1 --steps 13 --warmup 3 --timeout 220 --gpu $g $m \
              --out "$OUT/zenflow_$g.json" 2>&1 | cut -c1-300
          taskset -c $((g * half))-$((g * half + half - 1)) timeout 280 python3 bench/offload.py \
              --set reference,zero-twinflow --accum 3,12 --steps 11 --warmup 3 --timeout 130 --deadline 120 --gpu $g $m \
              --out "$OUT/twinflow_$g.json" 2>&1 | cut -c1-300 ) > "$OUT/lane$g.txt" &
    done
    wait
    cat "$OUT"/lane*.txt
    ;;
probe-next)       # one GPU, about 3 minutes: the lifetime probe's discard on a stream the batch API takes
                  # (the 2026-11-30 run passed PyTorch's legacy NULL stream and got cudaErrorInvalidValue)
    lifetime_probes
    grep -h '"probed": true' "$OUT"/probe_*.log | cut -c1-400
    ;;
paths)            # one GPU, about 4 minutes (issue 20): how the AdamW state can cross PCIe beside compute
                  # (bench/state_paths.py), and where advise-overlap's extra reserved memory comes from
                  # (bench/memory_streams.py, advise against advise-overlap, one microbatch, no budget)
    timeout 150 python3 bench/state_paths.py --params 1024 --out "$OUT/state_paths.json" 2>&1 | tail -8
    for v in advise overlap; do
        TRANSIT_OVERLAP_STEP=$([ $v = overlap ] && echo 1) timeout 120 python3 -m transit_launch run --policy advise \
            -- python3 bench/memory_streams.py --out "$OUT/streams_$v.json" -- --seq-len 8192 --batch 2 --accum 1 \
            --steps 6 2>&1 | grep -E "memory_streams|overlapping|Error|error" | cut -c1-300
    done
    ;;
paths-2)          # x2, about 7 minutes (issue 20): the state's copy paths beside compute (staged through
                  # torch's copy_, cudaMemcpyBatchAsync asking for copy engines, and pinned host memory), alone
                  # on GPU0; then the overlapped step without its 0.53 GB checksum temporaries, under each
                  # point's own budget, at 3 and 1 microbatches: GPU0 with recomputation, GPU1 without
    g0 timeout 150 python3 bench/state_paths.py --params 1024 --reps 3 --out "$OUT/state_paths_2.json" 2>&1 | tail -9
    for g in 0 1; do
        m=$([ $g = 1 ] && echo --model=--no-recompute)
        ( export CUDA_VISIBLE_DEVICES=$g
          taskset -c $((g * half))-$((g * half + half - 1)) timeout 400 python3 bench/offload.py \
              --set reference,advise,advise-overlap --accum 3,1 --steps 11 --warmup 3 --timeout 120 --deadline 330 \
              --gpu $g $m --out "$OUT/overlap_fixed_$g.json" 2>&1 | cut -c1-300 ) > "$OUT/lane$g.txt" &
    done
    wait
    cat "$OUT"/lane*.txt
    ;;
staged)           # x2, about 9 minutes (issue 20): the overlapped step with its state staged through the
                  # copy engines (TRANSIT_OVERLAP_STEP=staged) against advise and the early updates reading the state in place. GPU0: the
                  # losses with deterministic kernels, then the curve at 3 and 1 microbatches with recomputation;
                  # GPU1: the curve without recomputation, then 12 microbatches with recomputation
    c="--set reference,advise,advise-staged,advise-overlap --steps 11 --warmup 3 --timeout 120"
    ( g0 timeout 200 python3 bench/offload.py --set reference,advise,advise-staged --model=--deterministic \
          --seq-len 2048 --accum 4 --steps 8 --warmup 3 --timeout 60 --gpu 0 --out "$OUT/staged_losses.json" \
          > "$OUT/losses.log" 2>&1
      g0 timeout 330 python3 bench/offload.py $c --accum 3,1 --gpu 0 --deadline 280 --out "$OUT/staged_ac.json" \
          > "$OUT/ac.log" 2>&1 ) &
    ( g1 timeout 290 python3 bench/offload.py $c --accum 3,1 --model=--no-recompute --gpu 1 --deadline 240 \
          --out "$OUT/staged_noac.json" > "$OUT/noac.log" 2>&1
      g1 timeout 250 python3 bench/offload.py --set reference,advise,advise-staged --accum 12 --steps 9 --warmup 3 \
          --timeout 90 --deadline 180 --gpu 1 --out "$OUT/staged_ac12.json" > "$OUT/ac12.log" 2>&1 ) &
    wait
    for f in losses ac noac ac12; do echo "== $f"; cut -c1-420 "$OUT/$f.log"; done
    ;;
staged-2)         # x2, about 7 minutes (issue 20; its GPU1 lane failed on 2026-11-30: .whl was not carried). GPU0: why the staged step is slower: its CPU time and its
                  # waits for copies (printed at exit), and the same with 16 GiB in flight (the CPU never waits),
                  # without recomputation (no hot data on the host) at 1 and 3 microbatches, then with it at 1;
                  # GPU1: ZenFlow at 1 (room for DeepSpeed's JIT build), then Twin-Flow at 3, with recomputation
    ( g0 timeout 260 python3 bench/offload.py --set reference,advise-overlap,advise-staged,advise-stagedwide \
          --accum 1,3 --model=--no-recompute --steps 11 --warmup 3 --timeout 90 --deadline 220 --gpu 0 \
          --out "$OUT/staged2_noac.json" > "$OUT/noac.log" 2>&1
      g0 timeout 120 python3 bench/offload.py --set reference,advise-stagedwide --accum 1 --steps 11 --warmup 3 \
          --timeout 55 --gpu 0 --out "$OUT/staged2_ac.json" > "$OUT/ac.log" 2>&1 ) &
    ( g1 timeout 260 python3 bench/offload.py --set reference,zenflow --accum 1 --steps 13 --warmup 3 --timeout 220 \
          --gpu 1 --out "$OUT/zenflow_ac.json" > "$OUT/zenflow.log" 2>&1
      g1 timeout 150 python3 bench/offload.py --set reference,zero-twinflow --accum 3 --steps 10 --warmup 3 \
          --timeout 110 --gpu 1 --out "$OUT/twinflow_ac3.json" > "$OUT/twinflow.log" 2>&1 ) &
    wait
    for f in noac ac zenflow twinflow; do echo "== $f"; cut -c1-300 "$OUT/$f.log"; done
    python3 -c "
import json, sys
for f in sys.argv[1:]:
    for r in json.load(open(f))['runs']:
        print(f.split('/')[-1], r['name'], r['accum'], r.get('median_step_s'), r.get('max_reserved_gb'), r.get('adapter_log')[-1:],
              (r.get('stderr_tail') or '')[-300:])" "$OUT"/staged2_*.json "$OUT"/zenflow_ac.json "$OUT"/twinflow_ac3.json
    ;;
staged-3)         # x2, about 5 minutes (issue 20): the staged step in batches (one staged step for several
                  # parameters) against the zero-copy early updates. GPU0 without recomputation, then the GPU tests
                  # of both overlap modes (bit-identical losses); GPU1 with recomputation; 3 and 1 microbatches
    c="--set reference,advise-overlap,advise-staged --accum 3,1 --steps 10 --warmup 3 --timeout 70"
    ( g0 timeout 170 python3 bench/offload.py $c --model=--no-recompute --deadline 140 --gpu 0 \
          --out "$OUT/staged3_noac.json" > "$OUT/noac.log" 2>&1
      g0 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k overlapped > "$OUT/gpu_tests.log" 2>&1 ) &
    g1 timeout 270 python3 bench/offload.py $c --deadline 220 --gpu 1 --out "$OUT/staged3_ac.json" > "$OUT/ac.log" 2>&1 &
    wait
    tail -5 "$OUT/gpu_tests.log"
    python3 -c "
import json, sys
for f in sys.argv[1:]:
    for r in json.load(open(f))['runs']:
        print(f.split('/')[-1], r['name'], r['accum'], r.get('median_step_s'), r.get('max_reserved_gb'), r.get('adapter_log')[-1:],
              (r.get('stderr_tail') or '')[-300:])" "$OUT"/staged3_*.json
    ;;
next-20)          # x2, about 10 minutes (close to the limit: GPU0's lane), CARRY .whl (the peers need DeepSpeed): what issue 20 left on
                  # 2026-11-30. GPU0: one step's GPU timeline (bench/step_timeline.py) of advise, the overlap and
                  # the staged overlap, without recomputation, one microbatch, under that point's budget (38.90 GB,
                  # offload_overlap_fixed_noac_2026-11-30.json): when the staged copies run and what the compute
                  # stream waits for. GPU1: ZenFlow at 1 microbatch (room for DeepSpeed's JIT build), Twin-Flow at 3
    python3 -c "import deepspeed" 2>/dev/null || { echo "deepspeed missing: carry .whl (bench/fetch_wheels.sh)"; exit 2; }
    # first, the state's paths again with host memory from the driver's VMM (the design in docs/lifetime-policy.md)
    ( g0 timeout 170 python3 bench/state_paths.py --params 1024 --reps 3 --out "$OUT/state_paths_3.json" \
          > "$OUT/state_paths_3.log" 2>&1
      for v in advise overlap staged; do
          ov=$(case $v in overlap) echo 1;; staged) echo staged;; esac)
          TRANSIT_OVERLAP_STEP=$ov g0 timeout 100 python3 -m transit_launch run --policy advise --gpu-budget 38903726080B \
              -- python3 bench/step_timeline.py --step 6 --out "$OUT/timeline_$v.json" -- --seq-len 8192 --batch 2 \
              --accum 1 --steps 7 --no-recompute > "$OUT/timeline_$v.log" 2>&1
      done
      # the early updates on a green context of 16 SMs (TRANSIT_OVERLAP_SMS), one microbatch with recomputation
      g0 timeout 150 python3 bench/offload.py --set reference,advise-overlap,advise-green16 --accum 1 --steps 10 \
          --warmup 3 --timeout 45 --gpu 0 --out "$OUT/green16_ac.json" > "$OUT/green16.log" 2>&1
      # the overlap's GPU test again: its code changed after the 2026-11-30 runs (a review's fixes)
      g0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k overlapped > "$OUT/gpu_tests.log" 2>&1
    ) &
    ( g1 timeout 260 python3 bench/offload.py --set reference,zenflow --accum 1 --steps 13 --warmup 3 --timeout 220 \
          --gpu 1 --out "$OUT/zenflow_ac.json" > "$OUT/zenflow.log" 2>&1
      g1 timeout 200 python3 bench/offload.py --set reference,zero-twinflow --accum 3 --steps 10 --warmup 3 \
          --timeout 150 --gpu 1 --out "$OUT/twinflow_ac3.json" > "$OUT/twinflow.log" 2>&1 ) &
    wait
    for f in "$OUT"/timeline_*.log; do echo "== $f"; grep -v '^{' "$f" | tail -8; done
    tail -10 "$OUT/state_paths_3.log"
    cut -c1-300 "$OUT/green16.log"
    tail -3 "$OUT/gpu_tests.log"
    for f in zenflow twinflow; do echo "== $f"; cut -c1-300 "$OUT/$f.log"; done
    ;;
ring)             # x2, about 7 minutes (issue 20): the staged step through a ring of plain device memory
                  # (transit_device_alloc) against the zero-copy early updates. GPU0: the GPU tests of the
                  # overlap (bit-identical), no recomputation at 3 and 1 microbatches, one staged step's
                  # timeline; GPU1: recomputation at 3 and 1, then 12 microbatches
    c="--set reference,advise-overlap,advise-staged,advise-staged512 --accum 3,1 --steps 10 --warmup 3 --timeout 70"
    ( g0 timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k overlapped > "$OUT/gpu_tests.log" 2>&1
      g0 timeout 330 python3 bench/offload.py $c --model=--no-recompute --deadline 300 --gpu 0 \
          --out "$OUT/ring_noac.json" > "$OUT/noac.log" 2>&1
      TRANSIT_OVERLAP_STEP=staged g0 timeout 90 python3 -m transit_launch run --policy advise --gpu-budget 38903726080B \
          -- python3 bench/step_timeline.py --step 6 --out "$OUT/timeline_ring.json" -- --seq-len 8192 --batch 2 \
          --accum 1 --steps 7 --no-recompute > "$OUT/timeline_ring.log" 2>&1 ) &
    ( g1 timeout 330 python3 bench/offload.py $c --deadline 300 --gpu 1 --out "$OUT/ring_ac.json" > "$OUT/ac.log" 2>&1
      g1 timeout 200 python3 bench/offload.py --set reference,advise-staged --accum 12 --steps 8 --warmup 3 \
          --timeout 90 --deadline 190 --gpu 1 --out "$OUT/ring_ac12.json" > "$OUT/ac12.log" 2>&1 ) &
    wait
    tail -3 "$OUT/gpu_tests.log"
    grep -v '^{' "$OUT/timeline_ring.log" | tail -12
    for f in "$OUT"/ring_*.json; do python3 bench/offload.py --report "$f" --markdown 2>&1 | grep -E '^\| [0-9]' | cut -d'|' -f2,5,8,9,12,13,14,16; done
    ;;
ring-2)           # x2, about 7 minutes (issue 20): the ring's size (512 and 256 MiB; it comes out of the GPU
                  # budget, which every microbatch pays for) at the paper's ratio (12 microbatches) and the
                  # points ring left open. GPU0 with recomputation, GPU1 without
    c12="--accum 12 --steps 8 --warmup 3 --timeout 100"
    ( g0 timeout 330 python3 bench/offload.py --set reference,advise-overlap,advise-staged256,advise-staged512 $c12 \
          --deadline 250 --gpu 0 --out "$OUT/ring2_ac12.json" > "$OUT/ac12.log" 2>&1
      g0 timeout 120 python3 bench/offload.py --set reference,advise-staged256,advise-staged512 --accum 1 --steps 10 \
          --warmup 3 --timeout 45 --deadline 90 --gpu 0 --out "$OUT/ring2_ac.json" > "$OUT/ac.log" 2>&1 ) &
    ( g1 timeout 250 python3 bench/offload.py --set reference,advise-staged256,advise-staged512 $c12 \
          --model=--no-recompute --deadline 170 --gpu 1 --out "$OUT/ring2_noac12.json" > "$OUT/noac12.log" 2>&1
      g1 timeout 180 python3 bench/offload.py --set reference,advise-staged256 --accum 3,1 --steps 10 --warmup 3 \
          --timeout 60 --deadline 140 --model=--no-recompute --gpu 1 --out "$OUT/ring2_noac.json" > "$OUT/noac.log" 2>&1 ) &
    wait
    grep -h deadline "$OUT"/*.log
    for f in "$OUT"/ring2_*.json; do python3 bench/offload.py --report "$f" --markdown 2>&1 | grep -E '^\| [0-9]' | cut -d'|' -f2,5,8,9; done
    ;;
ring-3)           # x2, about 5 minutes (issue 20): the 256 MiB ring at the paper's ratio again with more steps
                  # (ring-2's slowest steps were its first; warm-up 5 instead of 3), and with recomputation at 3
    c12="--set reference,advise-staged256 --accum 12 --steps 12 --warmup 5 --timeout 110"
    ( g0 timeout 190 python3 bench/offload.py $c12 --deadline 120 --gpu 0 --out "$OUT/ring3_ac12.json" > "$OUT/ac12.log" 2>&1
      g0 timeout 100 python3 bench/offload.py --set reference,advise-staged256 --accum 3 --steps 10 --warmup 3 \
          --timeout 60 --deadline 60 --gpu 0 --out "$OUT/ring3_ac.json" > "$OUT/ac.log" 2>&1 ) &
    g1 timeout 200 python3 bench/offload.py $c12 --model=--no-recompute --deadline 120 --gpu 1 \
        --out "$OUT/ring3_noac12.json" > "$OUT/noac12.log" 2>&1 &
    wait
    grep -h deadline "$OUT"/*.log
    for f in "$OUT"/ring3_*.json; do python3 bench/offload.py --report "$f" --markdown 2>&1 | grep -E '^\| [0-9]' | cut -d'|' -f2,5,8,9; done
    ;;
next-21)          # x2, about 7 minutes, CARRY .whl (issue 20, not yet run): what the 2026-11-30 sessions left. GPU0: the
                  # staged step's GPU tests (bit-identical; the in-copies wait for the last step), then the peers
                  # without recomputation at 3 microbatches; GPU1: ZenFlow at 3 and Twin-Flow at 12, recomputation
    python3 -c "import deepspeed" 2>/dev/null || { echo "deepspeed missing: carry .whl (bench/fetch_wheels.sh)"; exit 2; }
    ( g0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "overlapped or staged_in_copies" \
          > "$OUT/gpu_tests.log" 2>&1
      g0 timeout 330 python3 bench/offload.py --set reference,fsdp-cpu-offload,zero-offload,zero-twinflow,zero-infinity \
          --accum 3 --steps 10 --warmup 3 --timeout 150 --deadline 280 --model=--no-recompute --gpu 0 \
          --out "$OUT/peers_noac3.json" > "$OUT/peers_noac3.log" 2>&1 ) &
    ( g1 timeout 260 python3 bench/offload.py --set reference,zenflow --accum 3 --steps 10 --warmup 3 --timeout 220 \
          --gpu 1 --out "$OUT/zenflow_ac3.json" > "$OUT/zenflow.log" 2>&1
      g1 timeout 200 python3 bench/offload.py --set reference,zero-twinflow --accum 12 --steps 8 --warmup 3 \
          --timeout 170 --gpu 1 --out "$OUT/twinflow_ac12.json" > "$OUT/twinflow.log" 2>&1 ) &
    wait
    tail -3 "$OUT/gpu_tests.log"
    for f in "$OUT"/*.json; do python3 bench/offload.py --report "$f" --markdown 2>&1 | grep -E '^\| [0-9]' | cut -d'|' -f2,5,8,9,16; done
    ;;
scale-in-staged)  # issue 20, not yet run: N -> N/2 (x2: 2 -> 1) with the staged step (half-staged) against
                  # half-advise, one global batch, both shapes, about 8 minutes
    n=$(nvidia-smi -L | wc -l)
    timeout 560 python3 bench/scale_in_matrix.py --gpus "$n" --configs ac:1,noac:1 --layouts full,half-advise,half-staged \
        --repeats 1 --steps 10 --timeout 150 --deadline 430 --out "$OUT/scale_in_staged.json" 2>&1 | cut -c1-600
    ;;
next-22)          # x2, about 8 minutes (issue 20): N -> N/2 with recomputation again at issue 19's emulated GPU
                  # (19.60 GB, which the full layout fits; the planner's auto size of the first half-staged
                  # run, 16.91 GB, did not), both global batches; then one step's GPU timeline at 12
                  # microbatches without recomputation, the reference (GPU0) and the staged step under that
                  # point's budget (GPU1): where the 0.14 s between them goes
    n=$(nvidia-smi -L | wc -l)
    timeout 400 python3 bench/scale_in_matrix.py --gpus "$n" --configs ac:1,ac:2 --layouts full,half-advise,half-staged \
        --emulated-gpu 19595788288 --repeats 1 --steps 10 --timeout 110 --deadline 300 \
        --out "$OUT/scale_in_staged_ac.json" 2>&1 | grep -v '^{' | cut -c1-300
    t="--seq-len 8192 --batch 2 --accum 12 --steps 8 --no-recompute"
    ( g0 timeout 150 python3 bench/step_timeline.py --step 7 --out "$OUT/timeline_ref_noac12.json" -- $t \
          > "$OUT/timeline_ref_noac12.log" 2>&1 ) &
    ( TRANSIT_OVERLAP_STEP=staged g1 timeout 170 python3 -m transit_launch run --policy advise --gpu-budget 39652409344B \
          -- python3 bench/step_timeline.py --step 7 --out "$OUT/timeline_staged_noac12.json" -- $t \
          > "$OUT/timeline_staged_noac12.log" 2>&1 ) &
    wait
    for f in "$OUT"/timeline_*noac12.log; do echo "== $f"; grep -v '^{' "$f" | tail -9 | cut -c1-300; done
    ;;
next-23)          # x2, about 2 minutes (issue 20): the staged step's timeline at 12 microbatches without
                  # recomputation, which next-22 lost (torch.profiler: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED).
                  # GPU0: the same run with the shim's info log (did its warm-up recorder hold CUPTI?); GPU1:
                  # a shim built without CUPTI (-DTRANSIT_NO_CUPTI), so the profiler gets the subscriber slot
    python3 -c "from transit_launch.shim import build as s; print(s.build('/tmp/nocupti', extra_cflags=['-DTRANSIT_NO_CUPTI']))"
    t="--seq-len 8192 --batch 2 --accum 12 --steps 8 --no-recompute"
    r="python3 -m transit_launch run --policy advise --gpu-budget 39652409344B -- python3 bench/step_timeline.py --step 7"
    ( TRANSIT_LOG=info TRANSIT_OVERLAP_STEP=staged g0 timeout 170 $r --out "$OUT/timeline_staged_noac12_log.json" \
          -- $t > "$OUT/timeline_staged_noac12_log.log" 2>&1 ) &
    ( TRANSIT_SHIM=/tmp/nocupti/libtransit.so TRANSIT_OVERLAP_STEP=staged g1 timeout 170 $r \
          --out "$OUT/timeline_staged_noac12.json" -- $t > "$OUT/timeline_staged_noac12.log" 2>&1 ) &
    wait
    grep -v '^{' "$OUT/timeline_staged_noac12_log.log" | grep -i "cupti\|warm-up\|boundar\|adapter\|window\|error" | cut -c1-300 | head -30
    echo "== no CUPTI"; grep -v '^{' "$OUT/timeline_staged_noac12.log" | tail -12 | cut -c1-300
    ;;
peers-noac12)     # x2, about 5 minutes, CARRY .whl (issue 20): the peers at the paper's ratio (12 microbatches)
                  # without recomputation, where none had run; each GPU with its own reference
    python3 -c "import deepspeed" 2>/dev/null || { echo "deepspeed missing: carry .whl (bench/fetch_wheels.sh)"; exit 2; }
    c="--accum 12 --steps 8 --warmup 3 --timeout 150 --deadline 200 --model=--no-recompute"
    ( g0 timeout 320 python3 bench/offload.py --set reference,torchao-offload,zero-infinity $c --gpu 0 \
          --out "$OUT/peers_noac12_a.json" > "$OUT/peers_noac12_a.log" 2>&1 ) &
    ( g1 timeout 320 python3 bench/offload.py --set reference,zero-offload,zero-twinflow $c --gpu 1 \
          --out "$OUT/peers_noac12_b.json" > "$OUT/peers_noac12_b.log" 2>&1 ) &
    wait
    for f in "$OUT"/peers_noac12_*.json; do python3 bench/offload.py --report "$f" --markdown 2>&1 | grep -E '^\| [0-9]' | cut -d'|' -f2,5,8,9,16; done
    ;;
*)
    echo "usage: $0 PHASE...; phases: shim|offload|offload-transit|offload-peers|verify|offload-fsdp|offload-peers-rest|finish|next|next-peers|next-stage|stage-fixed|gpu-tests|peers-rerun|multigpu|netcheck|scale-in-matrix|rho-sockets|titan-memory|overlap|overlap-2|overlap-3|zenflow|peers-next|probe-next|paths|paths-2|staged|staged-2|staged-3|next-20|ring|ring-2|ring-3|next-21|scale-in-staged|next-22|next-23|peers-noac12" >&2
    exit 2 ;;
esac
done
