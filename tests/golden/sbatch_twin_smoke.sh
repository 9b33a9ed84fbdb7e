#!/bin/bash

# Parameters
#SBATCH --array=0-1%2
#SBATCH --error=<runs>/twin_smoke/.submitit/%A_%a_0_log.err
#SBATCH --gpus-per-node=8
#SBATCH --job-name='orch[2]'
#SBATCH --no-requeue
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --open-mode=append
#SBATCH --output=<runs>/twin_smoke/.submitit/%A_%a_0_log.out
#SBATCH --signal=USR2@30
#SBATCH --time=5
#SBATCH --wckey=submitit

# setup
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export NCCL_IB_TIMEOUT=19
export TORCH_NCCL_AVOID_RECORD_STREAMS=1

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <runs>/twin_smoke/.submitit/%A_%a_%t_log.out --error <runs>/twin_smoke/.submitit/%A_%a_%t_log.err --label --output <runs>/twin_smoke/.submitit/%A_%a_%N_log.out --error <runs>/twin_smoke/.submitit/%A_%a_%N_log.err <python> -u -m submitit.core._submit <runs>/twin_smoke/.submitit
