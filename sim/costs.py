"""Costs of the pieces of one training step, shared by the analytic and the event engines.

``step_costs(plan)`` times, per pipeline stage and per micro-batch, the forward and backward
compute of each layer (``sim.compute``), its tensor/context/expert-parallel collectives on the
actual rank placement (``sim.collectives.Network``), the pipeline point-to-point transfers,
the data-parallel gradient and parameter collectives and the optimizer step.  The analytic
engine (``sim.analytic``) composes them with closed-form schedules; the event engine
schedules the same pieces as events, so the two agree where both apply.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping

import yaml

from sim.collectives import Network
from sim.compute import KernelEfficiency, default_efficiency, network_kwargs, ops_time
from sim.memory import stage_layers, stage_params
from sim.ops import LayerOps, embedding_ops, head_ops, layer_ops
from sim.plan import Plan
from sim.specs import Cluster


def default_network(cluster: Cluster) -> Network:
    """The cluster's network with collective efficiency (large-message level and size curve)
    calibrated from NCCL measurements."""
    return Network(cluster, **network_kwargs(cluster.gpu.nvlink_generation))  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True, slots=True)
class CommRuntime:
    grad_reduce_bytes_per_param: float
    param_gather_bytes_per_param: float
    optimizer_bytes_per_param: float
    fp16_extra_bytes_per_param: float = 0.0
    # framework grad_accumulation mode -> HBM bytes per local parameter per micro-batch
    grad_accumulation_bytes_per_param: Mapping[str, float] = field(default_factory=dict)
    # FSDP2 pack/unpack around each all-gather (fwd, and again in bwd) and reduce-scatter
    fsdp_gather_copy_bytes_per_param: float = 0.0
    fsdp_reduce_copy_bytes_per_param: float = 0.0

    def grad_accumulation_bytes(self, mode: str, microbatches: int) -> float:
        """Bytes per parameter per micro-batch, averaged over the step's micro-batches
        (``autograd`` has nothing to add into on the first one)."""
        b = self.grad_accumulation_bytes_per_param.get(mode, 0.0)
        return b * (microbatches - 1) / microbatches if mode == "autograd" else b


@functools.cache
def default_comm_runtime() -> CommRuntime:
    from sim.catalog import catalog_dir

    with open(catalog_dir() / "runtime.yaml", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    c, o = data["communication"], data["optimizer"]
    return CommRuntime(grad_reduce_bytes_per_param=c["grad_reduce_bytes_per_param"],
                       param_gather_bytes_per_param=c["param_gather_bytes_per_param"],
                       optimizer_bytes_per_param=o["bytes_per_param"],
                       fp16_extra_bytes_per_param=o.get("fp16_extra_bytes_per_param", 0.0),
                       grad_accumulation_bytes_per_param={
                           k: float(v) for k, v in (data.get("grad_accumulation") or {}).get("bytes_per_param", {}).items()},
                       fsdp_gather_copy_bytes_per_param=float(
                           (data.get("fsdp_copies") or {}).get("all_gather_copy_out_bytes_per_param", 0.0)),
                       fsdp_reduce_copy_bytes_per_param=float(
                           (data.get("fsdp_copies") or {}).get("reduce_scatter_copy_in_bytes_per_param", 0.0)))


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerCost:
    """One layer, one micro-batch, on one GPU (seconds).  ``*_comm_*`` are full durations;
    ``exposed_*`` what remains on the critical path after overlap."""

    fwd_s: float
    bwd_s: float
    recompute_s: float  # extra forward work during backward (selective or full)
    attention_fwd_s: float
    matmul_fwd_s: float
    tp_comm_fwd_s: float
    tp_comm_bwd_s: float
    cp_comm_fwd_s: float
    cp_comm_bwd_s: float
    ep_comm_fwd_s: float
    ep_comm_bwd_s: float
    exposed_tp_fwd_s: float
    exposed_tp_bwd_s: float
    exposed_cp_fwd_s: float
    exposed_cp_bwd_s: float
    exposed_ep_fwd_s: float
    exposed_ep_bwd_s: float
    # part of fwd_s / bwd_s: compute slowed by the hidden TP/CP/EP collectives
    overlap_slowdown_fwd_s: float = 0.0
    overlap_slowdown_bwd_s: float = 0.0
    flops_fwd: float  # executed
    model_flops_fwd: float
    recompute_flops: float
    params: float  # parameters of this layer on this GPU


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCost:
    """One pipeline stage (all its chunks), per micro-batch, plus per-step DP/optimizer."""

    stage: int
    layers: tuple[int, ...]
    layer_costs: tuple[LayerCost, ...]
    extra_fwd_s: float  # embedding / head compute on the pipeline ends
    extra_bwd_s: float
    extra_model_flops: float
    p2p_s: float  # one activation (or gradient) transfer between adjacent stages
    zero3_exposed_fwd_s: float
    zero3_exposed_bwd_s: float
    dp_grad_sync_s: float  # full duration per step (zero 0-2) or per micro-batch (zero 3)
    dp_param_gather_s: float  # per step, after the optimizer (zero 1-2)
    optimizer_s: float
    params: float
    # Per micro-batch: compute slowed by the hidden FSDP all-gathers / reduce-scatters
    # (efficiency.overlap_compute_slowdown); part of compute_fwd_s / compute_bwd_s.
    overlap_slowdown_fwd_s: float = 0.0
    overlap_slowdown_bwd_s: float = 0.0
    # Per micro-batch: adding the weight gradients into the step's gradient buffer when the
    # framework does not fuse it into the GEMM (runtime.yaml grad_accumulation); in compute_bwd_s.
    grad_accum_s: float = 0.0
    # Per micro-batch: FSDP2 packing around its collectives (runtime.yaml fsdp_copies); in
    # compute_fwd_s / compute_bwd_s.
    fsdp_copy_fwd_s: float = 0.0
    fsdp_copy_bwd_s: float = 0.0

    @property
    def param_work_fwd_s(self) -> float:
        """Per micro-batch forward work proportional to the stage's parameters (hidden-FSDP
        slowdown, FSDP2 packing): it happens layer by layer, by parameter share."""
        return self.overlap_slowdown_fwd_s + self.fsdp_copy_fwd_s

    @property
    def param_work_bwd_s(self) -> float:
        """As ``param_work_fwd_s`` for the backward, plus the gradient accumulation pass."""
        return self.overlap_slowdown_bwd_s + self.grad_accum_s + self.fsdp_copy_bwd_s

    @property
    def compute_fwd_s(self) -> float:
        return sum(c.fwd_s for c in self.layer_costs) + self.extra_fwd_s + self.param_work_fwd_s

    @property
    def compute_bwd_s(self) -> float:
        return (sum(c.bwd_s + c.recompute_s for c in self.layer_costs) + self.extra_bwd_s
                + self.param_work_bwd_s)

    @property
    def exposed_tp_s(self) -> float:
        return sum(c.exposed_tp_fwd_s + c.exposed_tp_bwd_s for c in self.layer_costs)

    @property
    def exposed_cp_s(self) -> float:
        return sum(c.exposed_cp_fwd_s + c.exposed_cp_bwd_s for c in self.layer_costs)

    @property
    def exposed_ep_s(self) -> float:
        return sum(c.exposed_ep_fwd_s + c.exposed_ep_bwd_s for c in self.layer_costs)

    @property
    def exposed_zero3_s(self) -> float:
        return self.zero3_exposed_fwd_s + self.zero3_exposed_bwd_s

    @property
    def fwd_s(self) -> float:
        """Critical-path forward time of one micro-batch through this stage."""
        return (self.compute_fwd_s + sum(c.exposed_tp_fwd_s + c.exposed_cp_fwd_s + c.exposed_ep_fwd_s
                                         for c in self.layer_costs) + self.zero3_exposed_fwd_s)

    @property
    def bwd_s(self) -> float:
        return (self.compute_bwd_s + sum(c.exposed_tp_bwd_s + c.exposed_cp_bwd_s + c.exposed_ep_bwd_s
                                         for c in self.layer_costs) + self.zero3_exposed_bwd_s)

    @property
    def model_flops_per_microbatch(self) -> float:
        return 3 * (sum(c.model_flops_fwd for c in self.layer_costs) + self.extra_model_flops)

    @property
    def recompute_flops_per_microbatch(self) -> float:
        return sum(c.recompute_flops for c in self.layer_costs)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCosts:
    stages: tuple[StageCost, ...]
    p2p_bytes: float


def _layer_cost(plan: Plan, net: Network, lops: LayerOps, eff: KernelEfficiency, layer_params: float) -> LayerCost:
    s, gpu = plan.strategy, plan.cluster.gpu
    eager = plan.eager_elementwise
    fwd, bwd = ops_time(gpu, s.precision, lops.ops, eff, eager=eager)
    attn_ops = tuple(op for op in lops.ops if op.recompute_selective)
    attn_f, _ = ops_time(gpu, s.precision, attn_ops, eff, eager=eager)
    mm_ops = tuple(op for op in lops.ops if op.kind == "matmul" and not op.recompute_selective)
    mm_f, mm_b = ops_time(gpu, s.precision, mm_ops, eff)
    if s.recompute == "full":
        recompute_s = fwd
        recompute_flops = sum(op.counted_flops for op in lops.ops)
    elif s.recompute == "selective" and plan.selective_policy == "op":
        # element-wise ops and every other linear layer are recomputed; attention is kept
        mem_ops = tuple(op for op in lops.ops if op.kind == "memory")
        recompute_s = ops_time(gpu, s.precision, mem_ops, eff, eager=eager)[0] + mm_f / 2
        recompute_flops = sum(op.counted_flops for op in mm_ops) / 2
    elif s.recompute == "selective":
        recompute_s = attn_f
        recompute_flops = sum(op.counted_flops for op in attn_ops)
    else:
        recompute_s = recompute_flops = 0.0

    tp_f = tp_b = 0.0
    if s.tp > 1 and lops.tp_comm_bytes:
        one = net.dim_collective_time_s("all_reduce", s, "tp", lops.tp_comm_bytes) + eff.collective_overhead_s
        tp_f = lops.tp_collectives_per_pass * one
        tp_b = lops.tp_collectives_per_pass * one * (2 if s.recompute == "full" else 1)
    if s.tp_overlap:  # async TP / userbuffers: hidden behind the GEMMs it feeds
        ex_tp_f, ex_tp_b = max(0.0, tp_f - mm_f), max(0.0, tp_b - mm_b)
    else:
        ex_tp_f, ex_tp_b = tp_f, tp_b

    cp_f = cp_b = 0.0
    ex_cp_f = ex_cp_b = 0.0
    if s.cp > 1 and lops.cp_kv_bytes:
        ring = net.dim_link(s, "cp")  # every rank sends to its ring neighbour at once
        step = ring.latency_s + lops.cp_kv_bytes / ring.bytes_per_s + eff.collective_overhead_s
        cp_f = (s.cp - 1) * step
        cp_b = 2 * cp_f  # K,V forward again plus dK,dV back around the ring
        # Ring attention overlaps each exchange with the attention block of the previous chunk.
        attn_bwd = attn_f * 2.5
        ex_cp_f = max(0.0, cp_f - attn_f * (s.cp - 1) / s.cp)
        ex_cp_b = max(0.0, cp_b - attn_bwd * (s.cp - 1) / s.cp)

    ep_f = ep_b = 0.0
    if s.ep > 1 and lops.ep_a2a_bytes:
        one = net.dim_collective_time_s("all_to_all", s, "ep", lops.ep_a2a_bytes) + eff.collective_overhead_s
        ep_f = lops.ep_a2a_per_pass * one
        ep_b = ep_f * (2 if s.recompute == "full" else 1)
    if s.ep_overlap:  # hidden behind another micro-batch's compute of the same layer
        ex_ep_f, ex_ep_b = max(0.0, ep_f - fwd), max(0.0, ep_b - bwd - recompute_s)
    else:
        ex_ep_f, ex_ep_b = ep_f, ep_b

    # Compute under a hidden collective runs slower (efficiency.overlap_compute_slowdown).
    sigma = eff.overlap_compute_slowdown
    slow_f = sigma * ((tp_f - ex_tp_f) + (cp_f - ex_cp_f) + (ep_f - ex_ep_f))
    slow_b = sigma * ((tp_b - ex_tp_b) + (cp_b - ex_cp_b) + (ep_b - ex_ep_b))
    fwd, bwd = fwd + slow_f, bwd + slow_b

    return LayerCost(
        fwd_s=fwd, bwd_s=bwd, recompute_s=recompute_s, attention_fwd_s=attn_f, matmul_fwd_s=mm_f,
        tp_comm_fwd_s=tp_f, tp_comm_bwd_s=tp_b, cp_comm_fwd_s=cp_f, cp_comm_bwd_s=cp_b,
        ep_comm_fwd_s=ep_f, ep_comm_bwd_s=ep_b, exposed_tp_fwd_s=ex_tp_f, exposed_tp_bwd_s=ex_tp_b,
        exposed_cp_fwd_s=ex_cp_f, exposed_cp_bwd_s=ex_cp_b, exposed_ep_fwd_s=ex_ep_f, exposed_ep_bwd_s=ex_ep_b,
        overlap_slowdown_fwd_s=slow_f, overlap_slowdown_bwd_s=slow_b, flops_fwd=lops.flops,
        model_flops_fwd=lops.model_flops, recompute_flops=recompute_flops, params=layer_params)


def step_costs(plan: Plan, net: Network | None = None, eff: KernelEfficiency | None = None) -> StepCosts:
    """Cost every piece of one step of ``plan`` (see module docstring)."""
    model, cluster, s = plan.model, plan.cluster, plan.strategy
    net = net or default_network(cluster)
    eff = eff or default_efficiency()
    rt = default_comm_runtime()
    gpu = cluster.gpu

    dense_ops = layer_ops(model, s, moe=False, attention=plan.attention)
    moe_ops = layer_ops(model, s, moe=True, attention=plan.attention) if model.moe is not None else None
    dense_params = model.attention_params / s.tp + model.norm_params_per_layer + model.dense_ffn_params / s.tp
    dense_cost = _layer_cost(plan, net, dense_ops, eff, dense_params)
    moe_cost = None
    if moe_ops is not None:
        spec = model.moe
        assert spec is not None
        moe_params = (model.attention_params / s.tp + model.norm_params_per_layer
                      + spec.num_experts * model.expert_params / (s.tp * s.ep)
                      + spec.num_shared_experts * model.expert_params / s.tp)
        moe_cost = _layer_cost(plan, net, moe_ops, eff, moe_params)

    head_f, head_b = ops_time(gpu, s.precision, head_ops(model, s), eff, eager=plan.eager_elementwise)
    head_flops = sum(op.counted_flops for op in head_ops(model, s))
    emb_f, emb_b = ops_time(gpu, s.precision, embedding_ops(model, s), eff)

    # Pipeline p2p: activations of one micro-batch, scattered across the TP ranks
    # (Narayanan et al. 2021, Sec. 4.1 scatter/gather), between adjacent stages.
    p2p_bytes = 2.0 * s.mbs * (s.seq_len // s.cp) * model.hidden_size / s.tp
    p2p_s = 0.0
    if s.pp > 1:  # every stage boundary sends at once
        p2p_s = net.dim_collective_time_s("p2p", s, "pp", p2p_bytes) + eff.collective_overhead_s
        if s.tp > 1 and not s.sp:
            # scatter/gather: each TP rank sends 1/tp of the activation, the receiver
            # all-gathers it over NVLink (Narayanan et al. 2021, Sec. 4.1); with SP the
            # activation stays sharded and no gather is needed.
            p2p_s += net.dim_collective_time_s("all_gather", s, "tp", p2p_bytes * s.tp) + eff.collective_overhead_s

    dp_size = s.dp * s.cp
    ep_dp = max(1, (s.dp * s.cp) // s.ep)
    hbm = gpu.hbm_bytes_per_s * gpu.hbm_efficiency  # memory-bound passes (optimizer, accumulation, packing)
    accum_bytes = rt.grad_accumulation_bytes(plan.grad_accumulation, s.num_microbatches)

    stages = []
    for i, layers in enumerate(stage_layers(model, s)):
        first, last = i == 0, i == s.pp - 1
        costs = tuple(moe_cost if (moe_cost is not None and model.is_moe_layer(j)) else dense_cost for j in layers)
        params = stage_params(model, s, layers, first=first, last=last)
        extra_f = (emb_f if first else 0.0) + (head_f if last else 0.0)
        extra_b = (emb_b if first else 0.0) + (head_b if last else 0.0)
        extra_flops = head_flops if last else 0.0

        grad_sync = param_gather = 0.0
        z3_f = z3_b = 0.0
        slow_f = slow_b = 0.0
        if dp_size > 1:
            def coll(op: str, nparams: float, bytes_per: float) -> float:
                if nparams <= 0:
                    return 0.0
                return net.dim_collective_time_s(op, s, "dp_cp", nparams * bytes_per) + eff.collective_overhead_s

            g = rt.grad_reduce_bytes_per_param
            pg = rt.param_gather_bytes_per_param
            dense_p, exp_p = params.dense_params, params.expert_params
            # Expert gradients reduce over the expert-data-parallel group (dp*cp/ep ranks);
            # approximated as riding the same ring as the dense gradients (slightly pessimistic).
            synced = dense_p + (exp_p if ep_dp > 1 else 0.0)
            if s.zero == 0:
                grad_sync = coll("all_reduce", synced, g)
            elif s.zero in (1, 2):
                grad_sync = coll("reduce_scatter", synced, g)
                param_gather = coll("all_gather", synced, pg)
            else:
                # FSDP: per layer all-gather before forward and backward (prefetched one
                # layer ahead), reduce-scatter of gradients after backward, per micro-batch.
                ag_stage = coll("all_gather", synced, pg)
                rs_stage = coll("reduce_scatter", synced, g)
                if s.dp_overlap:
                    z3_f = max(0.0, ag_stage - sum(c.fwd_s for c in costs) - extra_f) + ag_stage / max(1, len(costs))
                    z3_b = max(0.0, ag_stage + rs_stage - sum(c.bwd_s + c.recompute_s for c in costs) - extra_b) \
                        + rs_stage / max(1, len(costs))
                else:  # no prefetch: every gather and reduce-scatter is on the critical path
                    z3_f, z3_b = ag_stage, ag_stage + rs_stage
                grad_sync = rs_stage
                slow_f = eff.overlap_compute_slowdown * max(0.0, ag_stage - z3_f)
                slow_b = eff.overlap_compute_slowdown * max(0.0, ag_stage + rs_stage - z3_b)

        shard = s.dp * s.cp if s.zero >= 1 else 1
        local_params = params.dense_params / shard + params.expert_params / (max(1, shard // s.ep) if s.zero >= 1 else 1)
        opt_bytes = rt.optimizer_bytes_per_param + (rt.fp16_extra_bytes_per_param if s.precision == "fp16" else 0.0)
        opt_s = local_params * opt_bytes / hbm
        # weight gradients of this micro-batch added into the step's buffer (FSDP: the shard)
        acc_params = local_params if s.zero >= 3 else params.total
        accum_s = acc_params * accum_bytes / hbm
        copy_f = copy_b = 0.0
        if s.zero >= 3 and dp_size > 1 and plan.fsdp_copies:
            copy_f = params.total * rt.fsdp_gather_copy_bytes_per_param / hbm
            copy_b = params.total * (rt.fsdp_gather_copy_bytes_per_param + rt.fsdp_reduce_copy_bytes_per_param) / hbm

        stages.append(StageCost(
            stage=i, layers=tuple(layers), layer_costs=costs, extra_fwd_s=extra_f, extra_bwd_s=extra_b,
            extra_model_flops=extra_flops, p2p_s=p2p_s,
            zero3_exposed_fwd_s=z3_f, zero3_exposed_bwd_s=z3_b, dp_grad_sync_s=grad_sync,
            dp_param_gather_s=param_gather, optimizer_s=opt_s, params=params.total,
            overlap_slowdown_fwd_s=slow_f, overlap_slowdown_bwd_s=slow_b, grad_accum_s=accum_s,
            fsdp_copy_fwd_s=copy_f, fsdp_copy_bwd_s=copy_b))
    return StepCosts(stages=tuple(stages), p2p_bytes=p2p_bytes)
