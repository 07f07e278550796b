#!/bin/bash
# Rendered by transit-launch 0.1.0: llama3-70b on 3 node(s), policy advise
#SBATCH --job-name=transit-llama3-70b
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --partition=gpu
#SBATCH --time=04:00:00
#SBATCH --mem=231209M
#SBATCH --output=%x-%j.out
# Plan: llama3-70b, fsdp, h100-80gb; no-offload minimum 6 nodes (24 GPUs).
# This job: 3 nodes, dp12, 126.6 GB per GPU, offload 47.7 GB per GPU, predicted efficiency 99%.

set -euo pipefail

# The first node of the allocation hosts torchrun's c10d rendezvous, at the address
# slurmd uses for it (NodeAddr; the node name when none is set).
nodes=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )
head_node=$(scontrol show node "${nodes[0]}" -o | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
head_node=${head_node:-${nodes[0]}}
rdzv_port=$(( 29500 + SLURM_JOB_ID % 1000 ))

export LD_PRELOAD=/opt/transit/lib/libtransit.so${LD_PRELOAD:+:$LD_PRELOAD}
export PYTHONPATH=/opt/transit/adapter${PYTHONPATH:+:$PYTHONPATH}
export TRANSIT_POLICY=advise
export PYTORCH_ALLOC_CONF=backend:native,expandable_segments:False
export PYTORCH_CUDA_ALLOC_CONF=backend:native,expandable_segments:False
export NCCL_NVLS_ENABLE=0
export TRANSIT_PLAN='{"gpu": "h100-80gb", "gpus": 12, "model": "llama3-70b", "nodes": 3, "offload_gb_per_gpu": 47.72, "per_gpu_total_gb": 126.64, "policy": "advise", "predicted_efficiency": 0.9924, "predicted_warm_up_s": 3.1, "version": 1}'

srun --export=ALL torchrun \
    --nnodes 3 \
    --nproc-per-node 4 \
    --rdzv-id "$SLURM_JOB_ID" \
    --rdzv-backend c10d \
    --rdzv-endpoint "$head_node:$rdzv_port" \
    -m torchtitan.train --job.config_file llama3_70b.toml
