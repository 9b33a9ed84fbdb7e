"""Run Megatron's own full-recompute path over one hash-routed MoE layer wrapped for mHC, on CPU.

`python -m tests.job.recompute_probe <megatron tree>` (tests/megatron_env.run_in_tree): with the tree first on
sys.path, build a real TransformerConfig (hyper-connections on, --moe-n-hash-layers 1, full uniform recompute,
sqrtsoftplus), a real TransformerLayer whose MLP is a real MoELayer with a hash TopKRouter (local spec, allgather
dispatcher), wrap it in the tree's own HyperConnectionHybridLayer, as HybridStack does with
--enable-hyper-connections (megatron/core/models/hybrid/hybrid_block.py:70 at dev d48bd6be0a85), and call the
tree's `checkpointed_forward` (megatron/core/recompute.py:21) with input_ids, as HybridStack.forward does under
--recompute-granularity full (hybrid_block.py:947-959). Then backward (the recompute itself).

Control: the same layer called directly with input_ids (the path without recompute) must route.

CPU stand-ins, none of them in Megatron's code: torch.cuda.current_device answers "cpu" (the router's tid2eid
buffer is allocated there), the CUDA RNG state is the CPU one (CheckpointFunction saves it), NVTX ranges are
no-ops. Prints one JSON line: crashed, message, where (file:line of the failing assertion), control_ok, backward.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
import types
from pathlib import Path


def _cpu_stand_ins(torch) -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.random.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()


def _where(exc: BaseException, tree: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if str(tree) in f.filename]
    if not frames:
        return ""
    last = frames[-1]
    return f"{Path(last.filename).relative_to(tree)}:{last.lineno}"


def main(tree: Path) -> dict:
    sys.path.insert(0, str(tree))
    from orchestrator.job import megatron_check

    megatron_check.import_megatron()
    import torch
    import torch.distributed as dist

    _cpu_stand_ins(torch)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.models.hybrid.hybrid_block import HyperConnectionHybridLayer
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.recompute import checkpointed_forward
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    hidden, streams, experts, vocab = 16, 2, 4, 32
    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=1,
        ffn_hidden_size=8,
        moe_ffn_hidden_size=8,
        num_moe_experts=experts,
        moe_router_topk=2,
        moe_n_hash_layers=1,  # layer 1 is hash-routed (router.py:200-206)
        actual_vocab_size=vocab,
        moe_router_score_function="sqrtsoftplus",
        moe_token_dispatcher_type="allgather",
        enable_hyper_connections=True,
        num_residual_streams=streams,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
        add_bias_linear=False,
        use_cpu_initialization=True,
    )
    spec = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=WrappedTorchNorm, mlp=get_moe_module_spec(use_te=False, num_experts=experts)
        ),
    )
    layer = build_module(spec, config=cfg, layer_number=1)
    wrapped = HyperConnectionHybridLayer(cfg, layer)
    out: dict = {"hash_layer": bool(layer.mlp.router.is_hash_layer), "wrapper": type(wrapped).__name__}
    s, b = 4, 1
    ids = torch.randint(0, vocab, (b, s))

    x = torch.randn(s, b, streams * hidden, requires_grad=True)
    try:
        wrapped(hidden_states=x, attention_mask=None, input_ids=ids)
        out["control_ok"] = True
    except Exception as exc:  # noqa: BLE001 - the verdict
        out["control_ok"], out["control_error"] = False, f"{type(exc).__name__}: {exc}"

    stack = types.SimpleNamespace(
        layers=torch.nn.ModuleList([wrapped]),
        config=cfg,
        num_layers_per_pipeline_rank=1,
        pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
    )
    x = torch.randn(s, b, streams * hidden, requires_grad=True)
    try:
        y = checkpointed_forward(
            stack,
            hidden_states=x,
            attention_mask=None,
            context=None,
            context_mask=None,
            rotary_pos_emb=None,
            attention_bias=None,
            packed_seq_params=None,
            use_inner_quantization_context=False,
            input_ids=ids,
        )
        out.update(crashed=False, message="", where="")
        y.sum().backward()
        out["backward"] = x.grad is not None and tuple(x.grad.shape) == tuple(x.shape)
    except Exception as exc:  # noqa: BLE001 - the verdict
        out.update(crashed=True, message=f"{type(exc).__name__}: {exc}", where=_where(exc, tree), backward=False)
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]).resolve())))
