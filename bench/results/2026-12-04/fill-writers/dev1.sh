#!/bin/bash
# The fill's writers (8, this tree's default; 4; 2: -DPREFILL_THREADS) at 1 microbatch with half
# the state, HEAD's nothing-to-move case, and HEAD at 2 microbatches. TorchTitan 0.2.2 unchanged.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
python3 -c "import sys; sys.path.insert(0, '.'); from bench.harness.setup import prepare; sys.exit(0 if prepare(True, False) else 1)" > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
for w in 4 2; do python3 -c "
from transit_launch.shim import build as s; print(s.build('/tmp/libW$w', extra_cflags=['-DPREFILL_THREADS=$w'])[0])"; done
# the machine's first huge pages (a fresh machine's first advise run was 1.4-3.5 s slower): 40 GiB touched once
python3 -c "
import mmap; n = 40 << 30; m = mmap.mmap(-1, n); m.madvise(mmap.MADV_HUGEPAGE)
for i in range(0, n, 1 << 21): m[i] = 1
m.close(); print('primed 40 GiB')"
export PYTHONPATH=/tmp/site CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONUNBUFFERED=1
W4=TRANSIT_SHIM=/tmp/libW4/libtransit.so
W2=TRANSIT_SHIM=/tmp/libW2/libtransit.so
H=STATE_OFF=0.5
T="python3 bench/titan_steps.py --model llama3-8b --layers 16 --steps 6 --timeout 140 --budget 0"
$T --accum 1 --runs "ref,advise:$H,advise:$W4+$H,advise:$W2+$H,advise:$H,advise:$W4+$H,advise:$W2+$H,advise:STATE_OFF=0" --out $OUT/w_accum1.json 2>&1 | grep -v '^{'
$T --accum 2 --runs "ref,advise,advise:$W4" --out $OUT/w_accum2.json 2>&1 | grep -v '^{'
