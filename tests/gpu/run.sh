#!/usr/bin/env bash
# The real in-process Megatron path on ONE GPU, end to end, from a clean checkout (install included), in
# under 10 minutes: `run-one +stage=gpu1 workload=megatron cluster=local` on a 4-block V4-shaped model,
# then checks that the iteration lines parse, the sidecar's router token counts are non-zero and add up,
# CUDA peaks are recorded, and prints predicted vs measured memory (tests/gpu/test_megatron_gpu.py).
#
# Needs: an NVIDIA GPU; a Python >= 3.11 whose site-packages already hold a CUDA torch and Transformer
# Engine (an NGC PyTorch image: they are never installed or replaced here); MEGATRON_LM = a Megatron-LM
# dev-branch checkout (it has pretrain_hybrid.py and the V4 modules). CI never runs this (no GPU).
#   MEGATRON_LM=/path/to/Megatron-LM bash tests/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM dev-branch checkout (with pretrain_hybrid.py)}"
if [ ! -f "$MEGATRON_LM/pretrain_hybrid.py" ]; then
    echo "error: no pretrain_hybrid.py in MEGATRON_LM=$MEGATRON_LM: point it at a Megatron-LM dev checkout" >&2
    exit 2
fi
PY=${PYTHON:-python3}
VENV=${GPU_VENV:-.venv-gpu}
# --system-site-packages: the image's torch, TE and CUDA libraries are used as they are.
"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q -e '.[dev]'
"$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "error: torch sees no GPU")'
export MEGATRON_LM PYTHONUNBUFFERED=1
exec timeout 540 "$VENV/bin/python" -m pytest tests/gpu -m gpu -p no:cacheprovider -q -s
