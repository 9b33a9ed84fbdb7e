"""A rank probe against Megatron's own run-time code on CPU: dev's P2PCommunicator and alltoall token dispatcher under
torch's `fake` backend, configured from the probe's own argv, with the probe mode on or off.

`python -m tests.job.probe_conformance <megatron tree> <cases.json>` (tests/megatron_env.run_in_tree). Each case is
{"key", "argv", "world", "rank", "mode": "static-balanced/1" | "none", "skew"}. Per case, in this one process:
1. dev's parse_args + validate_args on the argv (as the job gets it: strict) with WORLD_SIZE = world, RANK = rank,
   seeing Transformer Engine 2.13 (a V4 node's: orchestrator/job/megatron_check.NODE_TE), then dev's
   core_transformer_config_from_args: the TransformerConfig the job builds;
2. torch's fake process group at (rank, world), as dev's initialize.py:343-350 makes it for --fake-process-group,
   and dev's parallel_state.initialize_model_parallel with the argv's sizes;
3. the probe mode installed (orchestrator/job/probe_mode.install) when the case asks for it;
4. the pipeline: at the rank's stage, dev's P2PCommunicator.recv_forward (stage > 0) and recv_backward (stage <
   PP-1) with dev's own get_tensor_shapes; the sender's shape is what the neighbouring stage sends in the real
   job: one microbatch of dev's DpBalancedScheduler packing the mock dataset's sequences (every one
   stage.seq_length long), split over CP, through dev's get_tensor_shapes with static shapes (is_recv=False);
5. the experts (EP > 1): dev's MoEAlltoAllTokenDispatcher over the rank's tokens (that microbatch's share) with a
   random top-k routing of the rank's own: dispatch, expert output, combine, backward; each local expert's token
   count against the balanced k x T_group / E (T_group = the rank's tokens x ETP x EP), x skew.
Prints one JSON line: {"megatron": where megatron.core came from, "commit": the tree's .commit, "torch",
"cases": {key: {"pipeline": {...}, "experts": {...}, "error": ...}}}.

CPU stand-ins, none in Megatron's code: torch.cuda's device, stream, event and synchronize queries answer for the CPU
(the code under test asks them; a GPU answers them in a job); --moe-permute-fusion's kernel is TE's, so the CPU run
permutes unfused (the counts do not depend on it).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import math
import os
import sys
import traceback
import types
from pathlib import Path


class _Event:
    def synchronize(self) -> None:
        return None


class _Stream:
    def wait_stream(self, _other) -> None:
        return None

    def record_event(self) -> _Event:
        return _Event()

    def __eq__(self, other) -> bool:
        return isinstance(other, _Stream)

    def __hash__(self) -> int:
        return 0


CPU_UNFUSED = ("moe_permute_fusion", "apply_rope_fusion", "moe_router_fusion")


def _cpu_stand_ins(torch) -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.cuda.Stream = lambda *a, **k: _Stream()
    torch.cuda.current_stream = lambda *a, **k: _Stream()
    torch.cuda.stream = lambda *_a, **_k: contextlib.nullcontext()
    torch.cuda.nvtx.range_push = lambda *a, **k: None
    torch.cuda.nvtx.range_pop = lambda *a, **k: None
    torch.cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()


def _memoize_rank_groups(ps) -> None:
    """dev's rank enumeration (parallel_state.py:250 `generate_masked_orthogonal_rank_groups`) is a pure function
    of (world, sizes, mask) that `initialize_model_parallel` recomputes in Python for every case: with the torch
    version check `create_group` repeats for each of a 16k world's ~53,000 groups (parallel_state.py:230), over half
    of a case's time. Each answer is kept and handed back as a fresh copy (`RankGenerator.get_ranks`,
    parallel_state.py:503-509, offsets the lists in place); every `new_group` call still happens as in dev."""
    enumerate_groups = ps.generate_masked_orthogonal_rank_groups

    @functools.cache
    def groups(world_size: int, parallel_size: tuple, mask: tuple) -> tuple[tuple[int, ...], ...]:
        return tuple(map(tuple, enumerate_groups(world_size, list(parallel_size), list(mask))))

    def generate_masked_orthogonal_rank_groups(world_size, parallel_size, mask):
        return [list(g) for g in groups(world_size, tuple(parallel_size), tuple(mask))]

    ps.generate_masked_orthogonal_rank_groups = generate_masked_orthogonal_rank_groups
    ps.is_torch_min_version = functools.cache(ps.is_torch_min_version)


def _where(exc: BaseException, tree: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if str(tree) in f.filename]
    if not frames:
        return ""
    last = frames[-1]
    return f"{Path(last.filename).relative_to(tree)}:{last.lineno}"


def _error(exc: BaseException, tree: Path) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} [{_where(exc, tree)}]"


def _config(args, megatron_check):
    """The TransformerConfig the job builds from its args (dev's core_transformer_config_from_args)."""
    import importlib

    arguments = importlib.import_module("megatron.training.arguments")
    home = arguments if hasattr(arguments, "core_transformer_config_from_args") else None
    if home is None:
        home = importlib.import_module("megatron.training.argument_utils")
    global_vars = importlib.import_module("megatron.training.global_vars")
    global_vars._GLOBAL_ARGS = None
    global_vars.set_args(args)
    # The DSA kernel backend picks attention kernels (flash_mla nv_dev, cudnn-frontend DSA: the node's packages,
    # checked by preflight); the config refuses it without a GPU (megatron/core/utils.py:528-532). The pipeline's
    # shapes and the dispatcher do not depend on it, so the CPU config takes the reference path's "none".
    args = copy.copy(args)
    args.dsa_kernel_backend = "none"
    # TE's fused kernels: the config refuses them where TE cannot import (transformer_config.py:2764-2771,
    # 3361-3377); each changes a kernel, never a shape or a count.
    for switch in CPU_UNFUSED:
        setattr(args, switch, False)
    if (
        getattr(args, "padded_vocab_size", None) is None
    ):  # what building the NullTokenizer sets (build_tokenizer.py:143)
        vocab = importlib.import_module("megatron.training.vocab_utils")
        args.padded_vocab_size = vocab.calculate_padded_vocab_size(
            args.vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size, logging_enabled=False
        )
    with (
        contextlib.redirect_stdout(io.StringIO()),
        megatron_check.as_arch(),
        megatron_check.as_te(megatron_check.NODE_TE),
    ):
        return home.core_transformer_config_from_args(args)


def _sender_tokens(args, cp: int, dp: int) -> int:
    """Tokens per CP rank of one packed microbatch: dev's DpBalancedScheduler over mock sequences of seq_length."""
    from megatron.core.datasets.data_schedule import DpBalancedScheduler

    sched = DpBalancedScheduler(args.max_seqlen_per_dp_cp_rank, cp, dp, None)
    n = 4 * dp
    groups = sched.get_groups_and_subsamples([(i, args.seq_length) for i in range(n)])
    first = groups[0][0]  # microbatch 0, the first DPxCP rank's packed group (sample ids)
    total = len(first) * args.seq_length
    return math.ceil(total / cp)


def _pipeline(torch, tree, args, config, pp_rank: int, pp: int) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    tp_group, cp_group, pp_group = (
        ps.get_tensor_model_parallel_group(),
        ps.get_context_parallel_group(),
        (ps.get_pipeline_model_parallel_group()),
    )
    cp, dp = cp_group.size(), ps.get_data_parallel_world_size()
    tokens = _sender_tokens(args, cp, dp) if args.sequence_packing_scheduler else args.seq_length // cp
    packed_total = tokens * cp
    mbs = 1 if args.sequence_packing_scheduler else args.micro_batch_size
    static = copy.copy(config)
    static.variable_seq_lengths = False

    def sent_by(rank: int) -> list[int]:
        stub = types.SimpleNamespace(rank=lambda: rank, size=lambda: pp)
        shapes = schedules.get_tensor_shapes(
            seq_length=packed_total,
            micro_batch_size=mbs,
            decoder_seq_length=None,
            config=static,
            tp_group=tp_group,
            cp_group=cp_group,
            pp_group=stub,
            is_recv=False,
        )
        return list(shapes[0])

    asked = schedules.get_tensor_shapes(  # what dev's schedule asks p2p for ([()] with variable_seq_lengths)
        seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size,
        decoder_seq_length=None,
        config=config,
        tp_group=tp_group,
        cp_group=cp_group,
        pp_group=pp_group,
    )
    comm = P2PCommunicator(pp_group, config)
    out: dict = {"variable_seq_lengths": bool(config.variable_seq_lengths), "stage": pp_rank}
    if pp_rank > 0:
        want = sent_by(pp_rank - 1)
        try:
            got = comm.recv_forward(asked, is_first_stage=False)[0]
            out["forward"] = {"want": want, "got": list(got.shape), "finite": bool(torch.isfinite(got).all())}
        except Exception as exc:  # noqa: BLE001 - dev's failure is the finding
            out["forward"] = {"want": want, "error": _error(exc, tree)}
    if pp_rank < pp - 1:
        want = sent_by(pp_rank)  # the gradient of what this stage sent forward
        try:
            got = comm.recv_backward(asked, is_last_stage=False)[0]
            out["backward"] = {"want": want, "got": list(got.shape), "finite": bool(torch.isfinite(got).all())}
        except Exception as exc:  # noqa: BLE001
            out["backward"] = {"want": want, "error": _error(exc, tree)}
    out["tokens_per_cp_rank"] = tokens
    return out


def _experts(torch, tree, args, config, skew: float) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe import token_dispatcher as td
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    ep, etp = ps.get_expert_model_parallel_world_size(), ps.get_expert_tensor_parallel_world_size()
    experts, k = config.num_moe_experts, config.moe_router_topk
    local_n = experts // ep
    first = ps.get_expert_model_parallel_rank() * local_n
    cp = ps.get_context_parallel_world_size()
    tokens = (
        _sender_tokens(args, cp, ps.get_data_parallel_world_size())
        if args.sequence_packing_scheduler
        else (args.seq_length // cp * args.micro_batch_size)
    )
    if config.sequence_parallel:
        tokens //= ps.get_tensor_model_parallel_world_size()
    cfg = config  # built with the TE kernels off (CPU_UNFUSED): the counts do not depend on them
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _Stream()
    moved = td.maybe_move_tensor_to_cpu

    def _to_host(tensor, as_numpy=False, record_stream=False):  # moe_utils.py:1199-1221 as a GPU tensor takes it
        if as_numpy and torch.is_tensor(tensor):
            return tensor.cpu().numpy()
        return moved(tensor, as_numpy=as_numpy, record_stream=record_stream)

    td.maybe_move_tensor_to_cpu = _to_host
    disp = MoEAlltoAllTokenDispatcher(local_n, list(range(first, first + local_n)), cfg, pg_collection=pgs)
    hidden = 64  # the rows' width: the exchange and the counts are per token, whatever the hidden size
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(tokens, hidden, generator=gen, requires_grad=True)
    logits = torch.randn(tokens, experts, generator=gen)
    top = logits.topk(k, dim=1).indices
    routing = torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, top, True)
    probs = torch.softmax(logits, dim=1) * routing
    t_group = tokens * etp * ep
    balanced = k * t_group / experts * skew
    out: dict = {"tokens": tokens, "t_group": t_group, "balanced": balanced, "local_experts": local_n}
    try:
        permuted, pprobs = disp.dispatch_preprocess(x, routing, probs)
        received, pprobs = disp.token_dispatch(permuted, pprobs)
        received, per_expert, pprobs = disp.dispatch_postprocess(received, pprobs)
        per_expert = [int(v) for v in torch.as_tensor(per_expert).tolist()]
        out["per_expert"] = per_expert[:16]
        out["per_expert_all_balanced"] = all(abs(v - balanced) < 1.0 for v in per_expert)
        out["received_rows"] = int(received.shape[0])
        out["received_finite"] = bool(torch.isfinite(received).all())
        y = disp.combine_preprocess(received * 2.0)
        y = disp.token_combine(y)
        y = disp.combine_postprocess(y)
        out["combined_shape_ok"] = list(y.shape) == [tokens, hidden]
        y.float().sum().backward()
        out["grad_finite"] = bool(x.grad is not None and torch.isfinite(x.grad).all())
    except Exception as exc:  # noqa: BLE001
        out["error"] = _error(exc, tree)
    return out


def _case(torch, tree, megatron_check, probe_mode, case: dict) -> dict:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world, rank = int(case["world"]), int(case["rank"])
    args = megatron_check.validated_args(
        case["argv"], world, te_version=megatron_check.NODE_TE, env=case.get("env") or None
    )
    config = _config(args, megatron_check)
    result: dict = {"rank": rank}
    dist.init_process_group(backend="fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ps.initialize_model_parallel(
                tensor_model_parallel_size=args.tensor_model_parallel_size,
                pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
                context_parallel_size=args.context_parallel_size,
                expert_model_parallel_size=args.expert_model_parallel_size,
                expert_tensor_parallel_size=args.expert_tensor_parallel_size,
                order="tp-cp-ep-dp-pp" if not args.use_tp_pp_dp_mapping else "tp-cp-ep-pp-dp",
                create_gloo_process_groups=False,
            )
        if case["mode"] != "none":
            probe_mode.install(case["mode"], skew=float(case.get("skew", 1.0)))
        pp, pp_rank = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
        if pp > 1:
            result["pipeline"] = _pipeline(torch, tree, args, config, pp_rank, pp)
        if ps.get_expert_model_parallel_world_size() > 1 and config.num_moe_experts:
            result["experts"] = _experts(torch, tree, args, config, float(case.get("skew", 1.0)))
        installed = probe_mode.installed()
        result["mode"] = installed.report() if installed is not None else None
    finally:
        probe_mode.uninstall()
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    return result


def main(tree: Path, cases_file: Path) -> dict:
    sys.path.insert(0, str(tree))
    from orchestrator.job import megatron_check, probe_mode

    megatron_check.import_megatron()
    import torch

    _cpu_stand_ins(torch)
    from megatron.core import parallel_state

    _memoize_rank_groups(parallel_state)
    cases = json.loads(cases_file.read_text())
    out: dict = {
        "megatron": sys.modules["megatron.core"].__file__,
        "commit": (tree / ".commit").read_text().strip() if (tree / ".commit").is_file() else None,
        "torch": torch.__version__,
        "cases": {},
    }
    for case in cases:
        try:
            out["cases"][case["key"]] = _case(torch, tree, megatron_check, probe_mode, case)
        except Exception as exc:  # noqa: BLE001 - a case that cannot even be set up is reported, not hidden
            out["cases"][case["key"]] = {"error": _error(exc, tree), "trace": traceback.format_exc()[-1500:]}
    return out


if __name__ == "__main__":
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
