"""CPU stand-in for pretrain_gpt.py in the device script's dry run (DEVICE_DRY=1): pretrain needs CUDA.

What it keeps real: it runs where the real script runs (orchestrator.job.entry -> megatron_run, runpy as
__main__, the router hook installed), builds Megatron's own TopKRouter (megatron-core on CPU, one gloo rank)
and routes tokens through it every iteration, so the hook counts them into the sidecar; it prints Megatron's
iteration and memory lines (the twin's formatter, orchestrator.job.twin.text), so collect parses them. What it
fakes: the numbers, and it says so: its first line is the [SIMULATED] marker.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from orchestrator.core.result import SIMULATED_MARKER
from orchestrator.job.twin import text

TOKENS, HIDDEN = 64, 32


def main() -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--train-iters", type=int, default=8)
    p.add_argument("--global-batch-size", type=int, default=2)
    p.add_argument("--moe-router-topk", type=int, default=6)
    p.add_argument("--num-experts", type=int, default=6)
    a, _ = p.parse_known_args(sys.argv[1:])
    print(f"{SIMULATED_MARKER} CPU stand-in for pretrain_gpt.py (device.sh dry run): the numbers are not measured")
    from orchestrator.job import megatron_check

    megatron_check.import_megatron()
    import torch
    import torch.distributed as dist
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]  # Megatron asks; the CPU answers
    fd, store = tempfile.mkstemp()
    os.close(fd)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    world = dist.group.WORLD
    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=2,
        num_moe_experts=a.num_experts,
        moe_router_topk=a.moe_router_topk,
        moe_ffn_hidden_size=HIDDEN,
        moe_router_load_balancing_type="none",
        add_bias_linear=False,
        use_cpu_initialization=True,
    )
    router = TopKRouter(cfg, pg_collection=ProcessGroupCollection(tp=world, cp=world, tp_cp=world, tp_dp_cp=world))
    router.set_layer_number(1)
    for it in range(1, a.train_iters + 1):
        router(torch.randn(TOKENS, 1, HIDDEN))
        print(text.iteration_line(it, a.train_iters, it * a.global_batch_size, 100.0, 1.0, 1e-4,
                                  a.global_batch_size, [("lm loss", 10.0 / it)], 1.0))  # fmt: skip
        if it == 1:
            print(text.memory_line(0, it, 100.0, 120.0, 150.0, 160.0))
    dist.destroy_process_group()
    os.unlink(store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
