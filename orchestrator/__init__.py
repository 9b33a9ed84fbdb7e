"""Slurm-native experiment orchestrator for tuning Megatron-LM DeepSeek-V4 parallel layouts."""

__version__ = "0.1.0"
