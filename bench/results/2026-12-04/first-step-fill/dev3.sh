#!/bin/bash
# D (this tree: writer + registrar, holding at regions the budget keeps) against A (HEAD's)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c "import sys; sys.path.insert(0, '.'); from bench.harness.setup import prepare; sys.exit(0 if prepare(True, False) else 1)" > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
rm -rf /tmp/shimA && cp -r shim /tmp/shimA && cp scratch/shimA/* /tmp/shimA/
python3 -c "
from pathlib import Path; from transit_launch.shim import build as s; p, w = s.build('/tmp/libA', src=Path('/tmp/shimA')); print(p)"
export PYTHONPATH=/tmp/site CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONUNBUFFERED=1
A=TRANSIT_SHIM=/tmp/libA/libtransit.so
T="python3 bench/titan_steps.py --model llama3-8b --layers 16 --steps 6 --timeout 140 --budget 0"
$T --accum 1 --runs "ref,advise:STATE_OFF=0.5,advise:$A+STATE_OFF=0.5,advise:STATE_OFF=0.5,advise:STATE_OFF=0" --out $OUT/ad_accum1.json 2>&1 | grep -v '^{'
$T --accum 2 --runs "ref,advise,advise:$A,advise" --out $OUT/ad_accum2.json 2>&1 | grep -v '^{'
