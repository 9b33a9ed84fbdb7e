#!/bin/bash

# Parameters
#SBATCH --account=llm
#SBATCH --cpus-per-task=8
#SBATCH --error=<runs>/megatron_1k_container/cand0/attempt-1/.submitit/%j_0_log.err
#SBATCH --exclusive
#SBATCH --gpus-per-node=8
#SBATCH --job-name=megatron_1k_container:cand0:1
#SBATCH --mem=0
#SBATCH --no-requeue
#SBATCH --nodes=128
#SBATCH --ntasks-per-node=8
#SBATCH --open-mode=append
#SBATCH --output=<runs>/megatron_1k_container/cand0/attempt-1/.submitit/%j_0_log.out
#SBATCH --partition=batch
#SBATCH --qos=normal
#SBATCH --signal=USR2@30
#SBATCH --time=120
#SBATCH --wckey=submitit

# setup
export PYTHONPATH=<project>${PYTHONPATH:+:$PYTHONPATH}
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export NCCL_IB_TIMEOUT=19
export TORCH_NCCL_AVOID_RECORD_STREAMS=1

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <runs>/megatron_1k_container/cand0/attempt-1/.submitit/%j_%t_log.out --error <runs>/megatron_1k_container/cand0/attempt-1/.submitit/%j_%t_log.err '--container-image=nvcr.io#nvidia/pytorch:25.09-py3' --container-mounts=/lustre/data:/data:ro,<project>:<project>,<runs>:<runs> --container-workdir=/workspace --label --output <runs>/megatron_1k_container/cand0/attempt-1/.submitit/%j_%N_log.out --error <runs>/megatron_1k_container/cand0/attempt-1/.submitit/%j_%N_log.err /usr/bin/python -u -m submitit.core._submit <runs>/megatron_1k_container/cand0/attempt-1/.submitit
