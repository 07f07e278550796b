#!/bin/bash
# What slows the first forward beside the fill (bench/probes/fill_stall_probe.py), then HEAD
# again at 1 microbatch with half the state and at 2 (TorchTitan 0.2.2 unchanged).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
python3 -c "import sys; sys.path.insert(0, '.'); from bench.harness.setup import prepare; sys.exit(0 if prepare(True, False) else 1)" > $OUT/setup.log 2>&1 || { tail -20 $OUT/setup.log; exit 1; }
export PYTHONPATH=/tmp/site CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONUNBUFFERED=1
timeout 200 python3 bench/probes/fill_stall_probe.py --out $OUT/fill_stall.json 2>&1 | tail -12
T="python3 bench/titan_steps.py --model llama3-8b --layers 16 --steps 6 --timeout 140 --budget 0"
$T --accum 1 --runs "ref,advise:STATE_OFF=0.5,advise:STATE_OFF=0.5,advise:STATE_OFF=0.5" --out $OUT/h_accum1.json 2>&1 | grep -v '^{'
$T --accum 2 --runs "ref,advise,advise" --out $OUT/h_accum2.json 2>&1 | grep -v '^{'
