#!/bin/bash
# HEAD on TorchTitan 0.2.2 unchanged (Llama3-8B dimensions at 16 layers), one H200, one call:
# 16 and 8 microbatches (no offloading and the default, in one call: the emulated 2 -> 1 pair at
# 16), then 1 microbatch with half the state (0b5be7a's fill rule; the registrar's rest, a bench
# build with -DPREFILL_REGISTER_REST_US=1000, against the default build) and with nothing to move.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import sys; sys.path.insert(0, '.'); from bench.harness.setup import prepare; sys.exit(0 if prepare(True, False) else 1)" > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
python3 -c "
from transit_launch.shim import build as s; print(s.build('/tmp/libR', extra_cflags=['-DPREFILL_REGISTER_REST_US=1000'])[0])"
# the machine's first huge pages (a fresh machine's first advise run was 1.4-3.5 s slower): 40 GiB touched once
python3 -c "
import mmap; n = 40 << 30; m = mmap.mmap(-1, n); m.madvise(mmap.MADV_HUGEPAGE)
for i in range(0, n, 1 << 21): m[i] = 1
m.close(); print('primed 40 GiB')"
export PYTHONPATH=/tmp/site CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONUNBUFFERED=1
R=TRANSIT_SHIM=/tmp/libR/libtransit.so
H=STATE_OFF=0.5
T="python3 bench/titan_steps.py --model llama3-8b --layers 16 --steps 6 --timeout 140 --budget 0"
$T --accum 16 --runs "ref,advise" --out $OUT/hd_accum16.json 2>&1 | grep -v '^{'
$T --accum 8 --runs "ref,advise" --out $OUT/hd_accum8.json 2>&1 | grep -v '^{'
$T --accum 1 --runs "ref,advise:$H,advise:$R+$H,advise:$H,advise:$R+$H,advise:STATE_OFF=0" --out $OUT/hd_accum1.json 2>&1 | grep -v '^{'
for f in 16 8 1; do python3 bench/titan_steps.py --report $OUT/hd_accum$f.json; done
