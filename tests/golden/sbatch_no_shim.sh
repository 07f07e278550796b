#!/bin/bash
# Rendered by transit-launch 0.1.0: 3 node(s), policy prefetch
#SBATCH --job-name=transit
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --account=proj1
#SBATCH --output=%x-%j.out

set -euo pipefail

# The first node of the allocation hosts torchrun's c10d rendezvous, at the address
# slurmd uses for it (NodeAddr; the node name when none is set).
nodes=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )
head_node=$(scontrol show node "${nodes[0]}" -o | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
head_node=${head_node:-${nodes[0]}}
rdzv_port=$(( 29500 + SLURM_JOB_ID % 1000 ))

# libtransit.so is not installed here (see `transit-launch doctor`): the job runs without the shim.
export TRANSIT_POLICY=prefetch
export TRANSIT_GPU_BUDGET=40GB
export TRANSIT_STATS=/scratch/stats
export TRANSIT_LOG=info
export PYTORCH_ALLOC_CONF=backend:native,expandable_segments:False
export PYTORCH_CUDA_ALLOC_CONF=backend:native,expandable_segments:False

srun --export=ALL torchrun \
    --nnodes 3 \
    --nproc-per-node 8 \
    --rdzv-id "$SLURM_JOB_ID" \
    --rdzv-backend c10d \
    --rdzv-endpoint "$head_node:$rdzv_port" \
    --no-python ./train.sh --steps 10
