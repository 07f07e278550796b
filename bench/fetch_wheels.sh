#!/usr/bin/env bash
# The Python packages the device machine lacks, fetched here into .whl/ (ignored by git,
# carried to the device with `carry: [".whl"]`; `python3 -m bench` installs them there).
# Exact versions: the device image has Python 3.12 and torch 2.11; one version of each.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
get() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$@"
}
# the shim's control API (cffi bindings); torchao for its CPUOffloadOptimizer (a peer in bench/offload.py)
get torchao==0.17.0
get cffi==2.0.0 pycparser==3.12
# DeepSpeed publishes only an sdist: build a pure-Python wheel (its ops JIT-compile there)
if ! ls .whl/deepspeed-0.18.2-*.whl >/dev/null 2>&1; then
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" deepspeed==0.18.2
    DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl "$tmp"/deepspeed-0.18.2.tar.gz \
        || echo "fetch_wheels: no DeepSpeed wheel (its build imports torch, which this machine lacks): bench/offload.py's DeepSpeed peer cannot run" >&2
fi
get hjson==3.1.0 pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.8.0 typing-inspection==0.4.5
# TorchTitan 0.3.0 and what it imports that the image lacks; 0.2.2 for torch 2.11, whose
# torch.distributed.fsdp lacks names 0.3.0 imports (`python3 -m bench` installs the one that imports)
get torchtitan==0.2.2
get torchtitan==0.3.0 torchdata==0.11.0 torch_checkpointing==0.1.1 spmd_types==0.2.3 tyro==1.0.17 \
    docstring-parser==0.18.0 typeguard==4.6.1 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18
ls .whl
