#!/bin/bash
# Rendered by transit-launch 0.1.0: llama3-70b on 2 node(s), policy advise
#SBATCH --job-name=transit-llama3-70b
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --partition=debug
#SBATCH --cpus-per-task=2
#SBATCH --mem=373286M
#SBATCH --output=%x-%j.out
# Plan: llama3-70b, fsdp, h100-80gb; no-offload minimum 5 nodes (20 GPUs).
# This job: 2 nodes, dp8, 160.4 GB per GPU, offload 83.2 GB per GPU, predicted efficiency 81%.

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
export TRANSIT_PLAN='{"gpu": "h100-80gb", "gpus": 8, "model": "llama3-70b", "nodes": 2, "offload_gb_per_gpu": 83.19, "per_gpu_total_gb": 160.43, "policy": "advise", "predicted_efficiency": 0.8143, "predicted_warm_up_s": 10.4, "version": 1}'

srun --export=ALL torchrun \
    --nnodes 2 \
    --nproc-per-node 4 \
    --rdzv-id "$SLURM_JOB_ID" \
    --rdzv-backend c10d \
    --rdzv-endpoint "$head_node:$rdzv_port" \
    train.py
