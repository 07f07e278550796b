#!/bin/bash
# C (this tree: writer + registrar pipeline) against A (HEAD's: write then register, one thread)
# and B (A's fill writing only); alternated to spread the order's effect
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c "import sys; sys.path.insert(0, '.'); from bench.harness.setup import prepare; sys.exit(0 if prepare(True, False) else 1)" > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
for v in A B; do rm -rf /tmp/shim$v && cp -r shim /tmp/shim$v && cp scratch/shimA/* /tmp/shim$v/; done
python3 scratch/patchB.py /tmp/shimB
for v in A B; do python3 -c "
from pathlib import Path; from transit_launch.shim import build as s; p, w = s.build('/tmp/lib$v', src=Path('/tmp/shim$v')); print(p)"; done
export PYTHONPATH=/tmp/site CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONUNBUFFERED=1
A=TRANSIT_SHIM=/tmp/libA/libtransit.so B=TRANSIT_SHIM=/tmp/libB/libtransit.so
T="python3 bench/titan_steps.py --model llama3-8b --layers 16 --steps 6 --timeout 140 --budget 0"
$T --accum 2 --runs "ref,advise,advise:$A,advise:$B,advise,advise:$A,advise:$B" --out $OUT/abc_accum2.json 2>&1 | grep -v '^{'
$T --accum 1 --runs "ref,advise:STATE_OFF=0.5,advise:$A+STATE_OFF=0.5,advise:$B+STATE_OFF=0.5,advise:STATE_OFF=0.5" --out $OUT/abc_accum1.json 2>&1 | grep -v '^{'
