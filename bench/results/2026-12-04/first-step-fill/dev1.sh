#!/bin/bash
# A (this tree's shim: background write + register) against B (background write only)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 BENCH_COMMIT=d95b761
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
python3 -c "import sys; sys.path.insert(0, '.'); from bench.harness.setup import prepare; sys.exit(0 if prepare(True, False) else 1)" > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
rm -rf /tmp/shimB && cp -r shim /tmp/shimB && python3 scratch/patchB.py /tmp/shimB && python3 -c "
from pathlib import Path; from transit_launch.shim import build as s; print(s.build('/tmp/libB', src=Path('/tmp/shimB')))"
export PYTHONPATH=/tmp/site CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONUNBUFFERED=1
B=TRANSIT_SHIM=/tmp/libB/libtransit.so
T="python3 bench/titan_steps.py --model llama3-8b --layers 16 --steps 6 --timeout 140 --budget 0"
$T --accum 2 --runs "ref,advise,advise:$B,advise" --out $OUT/ab_accum2.json 2>&1 | tail -25
$T --accum 1 --runs "ref,advise:STATE_OFF=0.5,advise:$B+STATE_OFF=0.5" --out $OUT/ab_accum1.json 2>&1 | tail -20
