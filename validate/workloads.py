"""Train the GPT of ``validate.model`` for a few steps with PyTorch's own parallelism.

One ``WorkloadSpec`` describes a run as the simulator's ``Strategy`` does: degrees
``pp x dp x tp`` laid out on a ``DeviceMesh`` with TP innermost (``sim.net.placement``'s order),
``dp_mode`` (``ddp`` = ``DistributedDataParallel``, ``fsdp`` = FSDP2 ``fully_shard``), tensor
parallelism with sequence parallelism through ``parallelize_module`` (torchtitan's Llama
plan), and pipeline parallelism through ``torch.distributed.pipelining`` (GPipe, 1F1B,
interleaved 1F1B with ``vp`` chunks per rank).  Any combination of the three dimensions
runs (1-D, 2-D and 3-D meshes).

Precision on a GPU: bf16 autocast with fp32 master weights (DDP, TP, pipelines), and for FSDP2
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (PyTorch docs, FSDP2
``fully_shard`` ``mp_policy``; torchtitan's default): parameters are all-gathered in bf16 and
gradients reduce-scattered in fp32, the volumes the simulator counts
(``catalogs/runtime.yaml``: 2 bytes per gathered parameter, 4 per reduced gradient).

Measured: wall time of each optimizer step (slowest rank), median after warm-up; peak memory
of the most loaded rank after the model is built (``validate.memstats.PeakMemory``); tokens
per second.  Losses stay on the device until the last step (reading one per micro-batch
would stall the GPU queue).
"""

from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from validate.memstats import PeakMemory, release_memory
from validate.model import GPT, loss_fn
from validate.runtime import Env, cpu_snapshot, describe, median
from validate.specs import CONTENDED_CORES, WorkloadSpec


# ------------------------------------------------------------------------ building


def _mesh(spec: WorkloadSpec, env: Env):  # -> DeviceMesh | None
    from torch.distributed.device_mesh import init_device_mesh

    dims = [(d, getattr(spec, d)) for d in ("pp", "dp", "tp") if getattr(spec, d) > 1]
    if not dims:
        return None
    return init_device_mesh(env.device.type, tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims))


def _split_stage(model: GPT, stage: int, num_stages: int) -> GPT:
    """Keep the layers of pipeline stage ``stage`` (torchtitan's manual split)."""
    part = copy.deepcopy(model)
    per = model.cfg.num_layers // num_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    for key in list(part.layers.keys()):
        if key not in keep:
            del part.layers[key]
    if stage > 0:
        part.tok_embeddings = None
    if stage < num_stages - 1:
        part.norm = None
        part.output = None
    return part


def _apply_tp(module: GPT, tp_mesh) -> None:
    """Tensor + sequence parallelism (torchtitan's Llama plan, loss computed on vocab shards)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    top: dict[str, object] = {}
    if module.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if module.norm is not None:
        top["norm"] = SequenceParallel()
    if module.output is not None:
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    if top:
        parallelize_module(module, tp_mesh, top)
    for block in module.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })


def fsdp_mixed_precision(device: torch.device):  # -> MixedPrecisionPolicy | None
    """FSDP2's policy on a GPU: bf16 parameters for compute and all-gathers, fp32 gradient
    reduction (module docstring); None on a CPU (fp32 throughout)."""
    if device.type != "cuda":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _apply_fsdp(module: GPT, dp_mesh, *, pipelined: bool, device: torch.device) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    # With a pipeline every micro-batch would re-gather; keep parameters gathered (torchtitan).
    reshard = not pipelined
    mp = fsdp_mixed_precision(device)
    kw = {"mp_policy": mp} if mp is not None else {}
    for block in module.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, **kw)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard, **kw)
    return module


@dataclass
class Built:
    modules: list[nn.Module]
    optimizer: torch.optim.Optimizer
    schedule: Any = None  # pipelining schedule
    first_stage: bool = True
    last_stage: bool = True
    loss_parallel: bool = False
    dp_rank: int = 0
    ddp: bool = False
    params_local: int = 0


def build(spec: WorkloadSpec, env: Env) -> Built:
    if spec.world_size != env.world_size:
        raise ValueError(f"workload[{spec.name}] needs {spec.world_size} ranks (pp*dp*tp), the job has {env.world_size}")
    torch.manual_seed(spec.seed)
    mesh = _mesh(spec, env)
    with torch.device(env.device):  # initialise on the device (a 2B model on the host takes seconds)
        full = GPT(spec.model)
    if env.device.type == "cuda":
        full.autocast_dtype = torch.bfloat16
    pp_rank = mesh["pp"].get_local_rank() if spec.pp > 1 else 0
    dp_rank = mesh["dp"].get_local_rank() if spec.dp > 1 else 0
    if spec.pp > 1:
        num_stages = spec.pp * spec.vp
        stage_ids = [pp_rank + i * spec.pp for i in range(spec.vp)]
        modules: list[nn.Module] = [_split_stage(full, s, num_stages) for s in stage_ids]
        del full
    else:
        num_stages, stage_ids = 1, [0]
        modules = [full]
    if spec.tp > 1:
        for m in modules:
            _apply_tp(m, mesh["tp"])  # type: ignore[arg-type]
    is_ddp = False
    if spec.dp > 1:
        if spec.dp_mode == "fsdp":
            modules = [_apply_fsdp(m, mesh["dp"], pipelined=spec.pp > 1, device=env.device)  # type: ignore[arg-type]
                       for m in modules]
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP

            modules = [DDP(m, process_group=mesh["dp"].get_group()) for m in modules]
            is_ddp = True
    params = [p for m in modules for p in m.parameters()]
    # foreach: one multi-tensor kernel per Adam step op, as torchtitan and Megatron run it
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, foreach=True)
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    built = Built(modules=modules, optimizer=opt, dp_rank=dp_rank, ddp=is_ddp, loss_parallel=spec.tp > 1,
                  first_stage=0 in stage_ids, last_stage=(num_stages - 1) in stage_ids, params_local=local)
    if spec.pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        group = mesh["pp"].get_group()
        stages = [PipelineStage(m, s, num_stages, env.device, group=group) for m, s in zip(modules, stage_ids)]
        m = spec.num_microbatches
        if spec.schedule == "interleaved":
            built.schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
        else:
            cls = ScheduleGPipe if spec.schedule == "gpipe" else Schedule1F1B
            built.schedule = cls(stages[0], n_microbatches=m, loss_fn=loss_fn)
    return built


# ------------------------------------------------------------------------ training


def _batch(spec: WorkloadSpec, env: Env, dp_rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(spec.seed * 1_000_003 + dp_rank * 7919 + step)
    shape = (spec.mbs * spec.num_microbatches, spec.model.seq_len)
    x = torch.randint(0, spec.model.vocab_size, shape, generator=g)
    y = torch.randint(0, spec.model.vocab_size, shape, generator=g)
    return x.to(env.device), y.to(env.device)


def _loss_ctx(built: Built):
    if built.loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return nullcontext()


def train_step(spec: WorkloadSpec, env: Env, built: Built, step: int) -> torch.Tensor | None:
    """One optimizer step; returns the loss (a detached device tensor, read after the last
    step) on ranks that compute it."""
    x, y = _batch(spec, env, built.dp_rank, step)
    loss_value: torch.Tensor | None = None
    if built.schedule is not None:
        losses: list[torch.Tensor] = []
        with _loss_ctx(built):
            if built.first_stage and built.last_stage:
                built.schedule.step(x, target=y, losses=losses)
            elif built.first_stage:
                built.schedule.step(x)
            elif built.last_stage:
                built.schedule.step(target=y, losses=losses)
            else:
                built.schedule.step()
        if losses:
            loss_value = torch.stack([_to_local(v.detach()).float() for v in losses]).mean()
    else:
        model = built.modules[0]
        m = spec.num_microbatches
        total: torch.Tensor | None = None
        for i in range(m):
            xs, ys = x[i * spec.mbs:(i + 1) * spec.mbs], y[i * spec.mbs:(i + 1) * spec.mbs]
            sync = nullcontext() if (not built.ddp or i == m - 1) else model.no_sync()  # type: ignore[operator]
            with sync, _loss_ctx(built):
                loss = loss_fn(model(xs), ys) / m
                loss.backward()
            part = _to_local(loss.detach()).float()
            total = part if total is None else total + part
        loss_value = total
    built.optimizer.step()
    built.optimizer.zero_grad(set_to_none=True)
    return loss_value


def _contention(per_rank: list[dict], steps: int) -> list[float]:
    """Cores' worth of CPU that processes outside the job used during each step (first node)."""
    node0 = [r for r in per_rank if r.get("node", 0) == 0]
    out = []
    for i in range(steps):
        dt = max(float(r["durations"][i]) for r in node0)
        host = float(node0[0]["busy"][i])
        ours = sum(float(r["own"][i]) for r in node0)
        out.append(max(0.0, host - ours) / dt if dt > 0 else 0.0)
    return out


def _to_local(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def run(spec: WorkloadSpec, env: Env) -> dict[str, object]:
    """Build, train ``warmup_steps + steps`` steps, measure.  Every rank must call this."""
    mem = PeakMemory(env.device)
    mem.before_build()
    dist.barrier()
    built = build(spec, env)
    mem.after_build()  # the unsharded model every rank built first is gone: not part of the peak
    dist.barrier()
    durations: list[float] = []
    busy: list[float] = []  # host CPU seconds used during each measured step
    own: list[float] = []  # this rank's CPU seconds during each measured step
    losses: list[torch.Tensor] = []
    for step in range(spec.warmup_steps + spec.steps):
        env.sync()
        b0, o0 = cpu_snapshot()
        t0 = time.perf_counter()
        loss = train_step(spec, env, built, step)
        env.sync()
        dt = time.perf_counter() - t0
        b1, o1 = cpu_snapshot()
        if step >= spec.warmup_steps:
            durations.append(dt)
            busy.append(b1 - b0)
            own.append(o1 - o0)
        if loss is not None:
            losses.append(loss)
    memory = mem.result()
    loss_values = [float(v) for v in losses]  # one device read, after the last step
    per_rank: list[dict[str, object]] = [None] * env.world_size  # type: ignore[list-item]
    dist.all_gather_object(per_rank, {"durations": durations, "memory": memory, "losses": loss_values, "busy": busy,
                                      "own": own, "node": env.node, "params_local": built.params_local})
    steps = [max(float(r["durations"][i]) for r in per_rank) for i in range(spec.steps)]  # type: ignore[index]
    others = _contention(per_rank, spec.steps)
    quiet = [t for t, c in zip(steps, others) if c < CONTENDED_CORES]
    used = quiet if len(quiet) >= max(3, (spec.steps + 1) // 2) else steps
    reporting = [r["losses"] for r in per_rank if r["losses"]]  # type: ignore[index]
    step_time = median(used)
    del built
    release_memory(env.device)
    peak = {k: max(float(r["memory"].get(k, 0.0)) for r in per_rank) for k in memory}  # type: ignore[union-attr]
    return {
        "name": spec.name, "kind": spec.kind, "spec": spec.as_dict(), "strategy": spec.strategy().to_string(),
        "world_size": env.world_size, "step_times_s": steps, "measured_step_time_s": step_time,
        "other_processes_cores": others, "steps_used": len(used),
        "tokens_per_step": spec.tokens_per_step, "tokens_per_s": spec.tokens_per_step / step_time,
        "measured_memory_peak_bytes": peak["peak_bytes"],
        **({"measured_memory_reserved_bytes": peak["peak_reserved_bytes"],
            "measured_device_used_bytes": peak["device_used_bytes"],
            "measured_outside_allocator_bytes": peak["outside_allocator_bytes"]} if "peak_reserved_bytes" in peak else {}),
        "model_params": spec.model.to_sim_model().num_params,
        "loss_first": reporting[0][0] if reporting else None,
        "loss_last": reporting[0][-1] if reporting else None,
        "env": describe(env),
    }
