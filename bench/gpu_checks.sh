#!/usr/bin/env bash
# What one device call runs on the H200: build the shim there, the GPU tests, and the
# issue's acceptance command (`gpu_checks.sh accept`: without the tests). Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    # TorchTitan's two wheels (0.2.2, 0.3.0) in one install line conflict and fail the whole line
    # (torchao with them, 2026-12-07); these checks need neither
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v '/torchtitan-') \
        && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
# TRANSIT_SKIP_BUILD=1: built already by the caller (rebuilding under running processes is unsafe)
[ -n "${TRANSIT_SKIP_BUILD:-}" ] || \
    python3 -c "from transit_launch.preload import build as s; p, w = s.build('transit_launch/preload/lib'); print('shim:', p, w or '')"
python3 -m transit_launch doctor
if [ "${1:-all}" != "accept" ]; then
    python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log"
fi
peak=$(python3 examples/train_llama.py --steps 6 | python3 -c "import sys,json; print([json.loads(l) for l in sys.stdin if l.startswith('{\"summary')][0]['summary']['max_reserved_gb'])")
[ -n "$peak" ] || { echo "the trainer failed"; exit 1; }
half=$(python3 -c "print(int($peak * 1e9 / 2))")
echo "trainer peak reserved: $peak GB; budget: $half bytes"
python3 -m transit_launch run --policy advise --gpu-budget "${half}B" --stats "$OUT/acceptance" -- \
    python3 examples/train_llama.py --steps 20 2>&1 | tail -8 | tee "$OUT/acceptance.log"
