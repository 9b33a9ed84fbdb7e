"""V4's family as Megatron and NVIDIA define it: the model groups dsv4_pro and dsv4_flash against Megatron dev's own
V4 recipes (examples/moe_recipes/deepseek_v4_*/), V4-Flash's counts against its model card and against the model
FLOPs Megatron-Bridge publishes for its measured 26.08 rows, and dev's parser on the V4-Flash argv."""

from __future__ import annotations

import ast
import json
from dataclasses import replace

import pytest
import yaml

from orchestrator.commands import validate as V
from orchestrator.config import compose
from orchestrator.core.schema import StageConfig
from orchestrator.job import megatron_check as MC
from orchestrator.plan import argv as A
from orchestrator.plan import flops, params
from orchestrator.plan.layout import Layout
from orchestrator.plan.planner import Planned, evaluate, plan
from tests.megatron_env import DEV, megatron_tree, run_in_tree

RECIPES = {  # Megatron dev's recipe of each V4 model (d48bd6be0a85), the shape the model group must match
    "dsv4_pro": "examples/moe_recipes/deepseek_v4_pro/gb300/mxfp8_SL4K_256GPU_TP1PP4EP64.yaml",
    "dsv4_flash": "examples/moe_recipes/deepseek_v4_flash/gb200/mxfp8_SL4K_128GPU_TP1PP1EP64.yaml",
}
# the recipe ARGS that fix the model's shape and routing, emitted by the planner under the same flag
SHAPE_ARGS = (
    "hidden_size",
    "num_attention_heads",
    "kv_channels",
    "q_lora_rank",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "o_groups",
    "o_lora_rank",
    "csa_window_size",
    "csa_compress_ratios",
    "dsa_indexer_n_heads",
    "dsa_indexer_head_dim",
    "dsa_indexer_topk",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_router_topk_scaling_factor",
    "moe_router_score_function",
    "mtp_num_layers",
    "num_residual_streams",
)


def model(name: str):
    return compose([f"model={name}"]).cfg.model


def _list_expr(text: str) -> list[int]:
    """A recipe's list expression such as ([0,0,4]+[128,4]*20+[0]): lists of integers, + and * only."""

    def ev(node: ast.AST):
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = ev(node.left), ev(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(f"not a list expression: {ast.dump(node)}")

    return ev(ast.parse(text.strip(), mode="eval").body)


def test_v4_flash_parameter_counts_match_the_model_card():
    """284B total (MTP excluded, as the card counts) within 0.5%, 13B active within 12% (the embedding row)."""
    m = model("dsv4_flash")
    pc = params.param_counts(m)
    assert params.is_v4(m) and pc.mhc > 0
    main = pc.total - pc.mtp_layers * pc.mtp
    assert main / 1e9 == pytest.approx(m.total_params_b, rel=0.005)
    assert pc.active / 1e9 == pytest.approx(m.active_params_b, rel=0.12)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_v4_model_groups_are_megatron_devs_own_v4_recipes(name):
    """Every shape and routing argument of dev's recipe comes out of the planner's argv with the recipe's value
    (V4-Flash's router scaling 1.5 from its model group, V4-Pro's 2.5 from the recipe), and its num_layers is the
    model's block count."""
    tree = megatron_tree(DEV, paths=(RECIPES[name],))
    recipe = yaml.safe_load((tree / RECIPES[name]).read_text())["ARGS"]
    m = model(name)
    stage = StageConfig(name="t", gpus=256, global_batch=1024, seq_length=4096, packed_sequences=False)
    lay = Layout(ep=64, mbs=1)
    planned = evaluate(m, compose(["hardware=gb200"]).cfg.hardware, stage, lay, check_memory=False)
    assert isinstance(planned, Planned), getattr(planned, "rule_ids", None)
    ours = A.parse_flags(A.megatron_argv(m, stage, lay, layer_pattern=planned.prediction.layer_pattern, train_iters=2))
    assert recipe["num_layers"] == m.num_layers == params.effective_layers(m)
    for key in SHAPE_ARGS:
        if key == "csa_compress_ratios":
            assert json.loads(str(ours[key])) == _list_expr(recipe[key]), key
        else:
            assert ours[key] == recipe[key], key


@pytest.mark.long
def test_v4_flash_flops_are_megatron_bridges_published_count():
    """NVIDIA's measured V4-Flash rows (26.08) publish model TFLOP/s beside tokens/s: their ratio is Megatron-Bridge's
    own V4 FLOP count per token (src/megatron/bridge/training/utils/flop_utils.py:1067-1157 @ 4ab94dfad: CSA, HCA,
    compressor, indexer). The planner's count (flops.step_flops) is that within 0.5%; the table's integer TFLOP/s
    round to 0.07%."""
    rows = [r for r in V.load_rows() if r.model == "dsv4_flash"]
    assert {r.system for r in rows} == {"gb200", "gb300"}
    m = model("dsv4_flash")
    for r in rows:
        stage = V.row_stage(r, m, compose([f"hardware={r.system}"]).cfg.hardware)
        ours = flops.step_flops(m, stage, r.layout())
        assert ours.model_flops / ours.tokens == pytest.approx(r.tflops * 1e12 / r.tokens, rel=0.005)


@pytest.mark.long
def test_dev_accepts_the_v4_flash_argv_of_nvidias_layout_and_of_the_planners_best(tmp_path):
    """Megatron dev's parse_args + validate_args + optimizer/scheduler setup (dev's tree first on sys.path, a
    Blackwell part for MXFP8, the node's TE) accept the V4-Flash argv of NVIDIA's measured layout (TP1 PP1 EP64,
    HybridEP, mla_up_proj recompute) and of the planner's own best layout for that row. With the row's BF16
    moments Megatron builds the optimizer from Transformer Engine's FusedAdam only, so without TE (this machine)
    those two stop there, past validate_args; the same layout with FP32 state goes through the whole setup."""
    row = next(r for r in V.load_rows() if r.model == "dsv4_flash" and r.system == "gb200")
    m, hw = model("dsv4_flash"), compose(["hardware=gb200"]).cfg.hardware
    stage, recipe = V.row_stage(row, m, hw), V.row_recipe(row)
    best = plan(m, hw, stage, recipe=recipe).candidates[0]
    own = evaluate(m, hw, stage, row.layout(), check_memory=False, recipe=recipe)
    assert isinstance(own, Planned)
    cases = []
    assert own.layout.optim == best.layout.optim == "bf16_moments"  # the row's declared optimizer precision
    fp32_state = replace(own.layout, optim="fp32")
    runs = (("nvidia", own, own.layout), ("best", best, best.layout), ("nvidia-fp32-state", own, fp32_state))
    for key, p, lay in runs:
        argv = A.megatron_argv(m, stage, lay, layer_pattern=p.prediction.layer_pattern, train_iters=2, recipe=recipe)
        cases.append({"key": key, "argv": argv, "world": row.gpus, "env": {}, "te": MC.NODE_TE, "arch": 10})
    assert "--exp-avg-dtype" in cases[0]["argv"] and "--moe-flex-dispatcher-backend" in cases[0]["argv"]
    assert "--exp-avg-dtype" not in cases[2]["argv"]
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    out = run_in_tree(megatron_tree(DEV), "tests.job.megatron_probe", str(path), "--no-preflight")
    assert "orch-megatron-trees" in out["megatron"]
    verdicts = out["verdicts"]
    assert verdicts.pop("nvidia-fp32-state") is None
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        fused_adam = "--use-precision-aware-optimizer requires FusedAdam from TransformerEngine, but not found."
        assert verdicts == {"nvidia": f"RuntimeError: {fused_adam}", "best": f"RuntimeError: {fused_adam}"}
    else:
        assert verdicts == {"nvidia": None, "best": None}
