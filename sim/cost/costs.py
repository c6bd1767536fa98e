"""Costs of the pieces of one training step, shared by the analytic and the event engines.

``step_costs(plan)`` times, per pipeline stage and per micro-batch, the forward and backward
compute of each layer (``sim.layers.compute``), its tensor/context/expert-parallel collectives on the
actual rank placement (``sim.net.network.Network``), the pipeline point-to-point transfers,
the data-parallel gradient and parameter collectives and the optimizer step.  The analytic
engine (``sim.engines.analytic``) composes them with closed-form schedules; the event engine
schedules the same pieces as events, so the two agree where both apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sim.data.conventions import conventions
from sim.layers.compute import (KernelEfficiency, default_efficiency, fp8_weight_cast_bytes_per_param, op_times, ops_time,
                          sum_op_times)
from sim.cost.memory import layer_activations, offloaded_activation_bytes, recompute_time_fraction
from sim.layers.moe_routing import remote_destinations
from sim.net.netefficiency import network_kwargs
from sim.net.network import Network
from sim.net.placement import group_shape
from sim.cost.offload import offload_bytes, strategy_rates
from sim.layers.ops import LayerOps, embedding_ops, head_ops, layer_ops
from sim.cost.plan import FUSED_LOSS_IMPLS, HostSyncs, Plan
from sim.data.runtime import FSDP2_LAYOUTS, CommRuntime, default_comm_runtime, default_runtime, state_layout
from sim.data.hardware import Cluster
from sim.data.specs import Model, Strategy
from sim.layers.stages import (StageParams, chunk_signature, layer_params, model_chunks, stage_layers,
                        stage_embedding_params, stage_parameter_tensors, stage_shapes)
from sim.cost.step import (ChunkSums, DpCollectives, Num, PieceSettings, StagePieces, StageTimes, layout_chunk_sums,
                      local_params, stage_pieces, stage_times)


def default_network(cluster: Cluster) -> Network:
    """The cluster's network with collective efficiency (large-message level and size curve)
    calibrated from NCCL measurements."""
    return Network(cluster, **network_kwargs(cluster.gpu.nvlink_generation))  # type: ignore[arg-type]


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
    # with ep_overlap: the all-to-all the paired pass hides, net of its slowdown; a pass without a
    # partner exposes it (sim.cost.step.a2a_unpaired_passes)
    a2a_hidden_fwd_s: float = 0.0
    a2a_hidden_bwd_s: float = 0.0
    flops_fwd: float  # executed
    model_flops_fwd: float
    recompute_flops: float
    params: float  # parameters of this layer on this GPU


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCost:
    """One pipeline stage (all its chunks), per micro-batch, plus per-step DP/optimizer: its
    layers' costs and its ``sim.cost.step.StagePieces``."""

    stage: int
    layers: tuple[int, ...]
    layer_costs: tuple[LayerCost, ...]
    extra_fwd_s: float  # embedding / head compute on the pipeline ends
    extra_bwd_s: float
    extra_model_flops: float
    p2p_s: float  # one activation (or gradient) transfer between adjacent stages
    params: float
    pieces: StagePieces  # the per-stage pieces of ``sim.cost.step.stage_pieces`` (floats)
    # with a pipeline layout: the decoder layers of each model chunk, in order (``layers`` is
    # their concatenation); None: the layers split evenly over the chunks
    chunk_sizes: tuple[int, ...] | None = None

    def chunk_sums(self, pp: int) -> tuple[ChunkSums, ...] | None:
        """Each model chunk's sums (``sim.cost.step.ChunkSums``) under a pipeline layout: its layers,
        the embedding in the first stage's first chunk and the head in the last stage's last
        chunk, and its parameter share (the embedding/head share rides with them), as the
        event engine cuts the stage into chunks (``sim.engines.event.scenario``)."""
        if self.chunk_sizes is None:
            return None
        lc = self.layer_costs
        sums, params, start = [], [], 0
        for n in self.chunk_sizes:
            part = lc[start:start + n]
            start += n
            sums.append((sum(x.fwd_s for x in part), sum(x.bwd_s for x in part), sum(x.recompute_s for x in part),
                         sum(x.exposed_tp_fwd_s + x.exposed_cp_fwd_s + x.exposed_ep_fwd_s for x in part),
                         sum(x.exposed_tp_bwd_s + x.exposed_cp_bwd_s + x.exposed_ep_bwd_s for x in part)))
            params.append(sum(x.params for x in part))
        return layout_chunk_sums(sums, params, stage_params=self.params, layer_params=sum(c.params for c in lc),
                                 extras_first=self.stage == 0 and pp > 1, extra_fwd_s=self.extra_fwd_s,
                                 extra_bwd_s=self.extra_bwd_s)

    def times(self, pp: int) -> StageTimes:
        """This stage as ``sim.cost.step.compose`` takes it (one entry per stage)."""
        lc = self.layer_costs
        return stage_times(
            layer_fwd_s=sum(c.fwd_s for c in lc), layer_bwd_s=sum(c.bwd_s for c in lc),
            recompute_s=sum(c.recompute_s for c in lc),
            layer_exposed_fwd_s=sum(c.exposed_tp_fwd_s + c.exposed_cp_fwd_s + c.exposed_ep_fwd_s for c in lc),
            layer_exposed_bwd_s=sum(c.exposed_tp_bwd_s + c.exposed_cp_bwd_s + c.exposed_ep_bwd_s for c in lc),
            extra_fwd_s=self.extra_fwd_s, extra_bwd_s=self.extra_bwd_s, pieces=self.pieces, p2p_s=self.p2p_s,
            num_layers=len(lc), first=self.stage == 0, last=self.stage == pp - 1,
            before=(1,) * self.stage + (0,) * (pp - self.stage), chunks=self.chunk_sums(pp),
            stage_ids=(self.stage,), layer_a2a_hidden_s=sum(c.a2a_hidden_fwd_s + c.a2a_hidden_bwd_s for c in lc))

    @property
    def compute_fwd_s(self) -> float:
        """Forward compute of one micro-batch (layers, embedding/head, per-parameter work)."""
        return self.times(self.stage + 1).compute_fwd_s  # compute does not depend on the sends

    @property
    def compute_bwd_s(self) -> float:
        return self.times(self.stage + 1).compute_bwd_s

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
    def model_flops_per_microbatch(self) -> float:
        return 3 * (sum(c.model_flops_fwd for c in self.layer_costs) + self.extra_model_flops)

    @property
    def recompute_flops_per_microbatch(self) -> float:
        return sum(c.recompute_flops for c in self.layer_costs)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepCosts:
    stages: tuple[StageCost, ...]
    p2p_bytes: float


# Selective recomputation policies other than Megatron's core attention and torchtitan's op
# level: the forward ops each recomputes in the backward (Megatron-Core --recompute-modules
# mlp / moe_act / mla_up_proj; MaxText remat policy save_dot_except_mlpwi = mlp_up).
# the ops Megatron-Core's attention-block and router CUDA graphs capture (Plan.cuda_graph_scope
# "attention": --cuda-graph-scope attn moe_router moe_preprocess): the input norm through the
# attention residual, the pre-MLP norm and the router (and their fp8 casts); the token permutation,
# experts, MLP and MLP residual stay eager
ATTENTION_BLOCK_OPS: frozenset[str] = frozenset({
    "norm_attn", "qkv_proj", "q_proj", "q_down", "q_up", "kv_down", "kv_up", "rope", "attention", "attention_local",
    "scores_qk", "softmax_dropout", "attn_v", "out_proj", "residual_dropout_attn", "norm_mlp", "router"})

SELECTIVE_OPS: dict[str, frozenset[str]] = {
    "mlp_up": frozenset({"ffn_up", "activation", "expert_up", "expert_activation", "shared_up", "shared_activation"}),
    "mlp": frozenset({"ffn_up", "activation", "ffn_down", "expert_up", "expert_activation", "expert_down",
                      "shared_up", "shared_activation", "shared_down"}),
    "moe_act": frozenset({"expert_activation", "shared_activation"}),
    "mla_up_proj": frozenset({"q_up", "kv_up"}),
}


# derived efficiency objects, one per (source object, variant), so that sim.layers.compute.op_times
# (memoised per efficiency object) reuses its ops: (id(eff), variant) -> (eff, derived)
_DERIVED: dict[tuple[int, str], tuple[KernelEfficiency, KernelEfficiency]] = {}


def _derived(eff: KernelEfficiency, variant: str, make) -> KernelEfficiency:
    got = _DERIVED.get((id(eff), variant))
    if got is None or got[0] is not eff:
        if len(_DERIVED) >= 32:
            _DERIVED.clear()
        got = _DERIVED[(id(eff), variant)] = (eff, make(eff))
    return got[1]


def _graphed(eff: KernelEfficiency) -> KernelEfficiency:
    """``eff`` without the host-side floor of an op (CUDA graphs)."""
    return _derived(eff, "graphed", lambda e: replace(e, host_op_floor_s=0.0))


def _with_library(eff: KernelEfficiency, library: str) -> KernelEfficiency:
    """``eff`` with ``library``'s attention curves (``KernelEfficiency.with_attention_library``)."""
    return _derived(eff, f"library:{library}", lambda e: e.with_attention_library(library)) if library else eff


def layer_cost(plan: Plan, net: Network, lops: LayerOps, eff: KernelEfficiency, layer_params: float) -> LayerCost:
    s, gpu = plan.strategy, plan.cluster.gpu
    eff = _with_library(eff, plan.attention_library)  # the framework's attention-kernel release
    eager = plan.eager_elementwise
    # GPU work runs at the pace of the job's slowest GPU (sim.layers.variability)
    slowest = eff.slowest_rank_factor(plan.cluster.num_gpus)

    # every op timed once (memoised across plans: sim.layers.compute.op_times), subsets summed in order
    def run_times(e: KernelEfficiency) -> tuple[tuple, tuple]:
        as_run = op_times(gpu, s.precision, lops.ops, e, eager=eager, fused=plan.fused_ops)
        return as_run, as_run if not eager else op_times(gpu, s.precision, lops.ops, e)

    as_run, plain = run_times(eff)
    if s.cuda_graphs:
        # the captured ops replay from a CUDA graph (Megatron-Core / TE make_graphed_callables): no
        # per-op host dispatch, only the GPU-side launch cost; the others are dispatched as before
        g_run, g_plain = run_times(_graphed(eff))
        captured = [plan.cuda_graph_scope == "layer" or op.name.removeprefix("fp8_cast_") in ATTENTION_BLOCK_OPS
                    for op in lops.ops]
        as_run = tuple(g if c else t for g, t, c in zip(g_run, as_run, captured))
        plain = tuple(g if c else t for g, t, c in zip(g_plain, plain, captured))
    by_op = {id(op): (t, u) for op, t, u in zip(lops.ops, as_run, plain)}

    def timed(ops: tuple, eager: bool = False) -> tuple[float, float]:
        f, b = sum_op_times(by_op[id(op)][0 if eager else 1] for op in ops)
        return slowest * f, slowest * b

    fwd, bwd = timed(lops.ops, eager)
    attn_ops = tuple(op for op in lops.ops if op.recompute_selective)
    attn_f, _ = timed(attn_ops, eager)
    mm_ops = tuple(op for op in lops.ops if op.kind == "matmul" and not op.recompute_selective)
    mm_f, mm_b = timed(mm_ops)
    if s.recompute == "full":
        recompute_s = fwd
        recompute_flops = sum(op.counted_flops for op in lops.ops)
    elif s.recompute == "selective" and plan.selective_policy == "op":
        # element-wise ops and every other linear layer are recomputed; attention is kept
        mem_ops = tuple(op for op in lops.ops if op.kind == "memory")
        recompute_s = timed(mem_ops, eager)[0] + mm_f / 2
        recompute_flops = sum(op.counted_flops for op in mm_ops) / 2
    elif s.recompute == "selective" and plan.selective_policy in SELECTIVE_OPS:
        names = SELECTIVE_OPS[plan.selective_policy]
        re_ops = tuple(op for op in lops.ops if op.name in names or op.name.removeprefix("fp8_cast_") in names)
        recompute_s = timed(re_ops, eager)[0]
        recompute_flops = sum(op.counted_flops for op in re_ops)
    elif s.recompute == "selective":
        recompute_s = attn_f
        recompute_flops = sum(op.counted_flops for op in attn_ops)
    else:
        recompute_s = recompute_flops = 0.0

    tp_f = tp_b = 0.0
    if s.tp > 1 and lops.tp_comm_bytes and s.sp:  # sequence parallelism: reduce-scatter + all-gather
        one = (net.dim_collective_time_s("reduce_scatter", s, "tp", lops.tp_comm_bytes)
               + net.dim_collective_time_s("all_gather", s, "tp", lops.tp_comm_bytes) + 2 * eff.collective_overhead_s)
        tp_f = lops.tp_collectives_per_pass * one
        tp_b = lops.tp_collectives_per_pass * one * (2 if s.recompute == "full" else 1)
    elif s.tp > 1 and lops.tp_comm_bytes:
        one = (net.dim_collective_time_s("all_reduce", s, "tp", lops.tp_comm_bytes, algorithm=nvls_algorithm(plan.nvls))
               + eff.collective_overhead_s)
        tp_f = lops.tp_collectives_per_pass * one
        tp_b = lops.tp_collectives_per_pass * one * (2 if s.recompute == "full" else 1)
    if lops.etp_comm_bytes:  # experts' own tensor parallelism (etp != tp): gather + reduce-scatter
        one = (net.dim_collective_time_s("reduce_scatter", s, "etp", lops.etp_comm_bytes)
               + net.dim_collective_time_s("all_gather", s, "etp", lops.etp_comm_bytes) + 2 * eff.collective_overhead_s)
        tp_f += one
        tp_b += one * (2 if s.recompute == "full" else 1)
    tp_reduce_f = tp_reduce_b = 0.0
    if s.tp_overlap and plan.tp_overlap_kind == "async_tp" and s.tp > 1:
        # PyTorch micro-pipelined TP (torch/distributed/_symmetric_memory: fused all-gather-matmul
        # and matmul-reduce-scatter in tp chunks): the last chunk's transfer cannot overlap, and
        # the reduce-scatter's stacked partials (tp chunks of the output) are summed by one more
        # kernel after the last chunk: read the unreduced output, write the shard
        n = s.tp
        ex_tp_f = tp_f / n + max(0.0, tp_f * (n - 1) / n - mm_f)
        ex_tp_b = tp_b / n + max(0.0, tp_b * (n - 1) / n - mm_b)
        reduce_one = slowest * lops.tp_comm_bytes * (1 + 1 / n) / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency)
        tp_reduce_f = lops.tp_collectives_per_pass * reduce_one
        tp_reduce_b = tp_reduce_f * (2 if s.recompute == "full" else 1)
    elif s.tp_overlap:  # userbuffers (Transformer Engine): pipelined ring exchange hidden behind the GEMMs
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
        attn_bwd = attn_f * conventions().attention_backward_per_forward
        ex_cp_f = max(0.0, cp_f - attn_f * (s.cp - 1) / s.cp)
        ex_cp_b = max(0.0, cp_b - attn_bwd * (s.cp - 1) / s.cp)

    ep_f = ep_b = 0.0
    if s.ep > 1 and lops.ep_a2a_bytes:
        ep_f = moe_dispatch_s(plan, net, eff, lops.ep_a2a_bytes) * lops.ep_a2a_per_pass
        ep_b = ep_f * (2 if s.recompute == "full" else 1)
    if s.ep_overlap:  # hidden behind another micro-batch's compute of the same layer
        ex_ep_f, ex_ep_b = max(0.0, ep_f - fwd), max(0.0, ep_b - bwd - recompute_s)
    else:
        ex_ep_f, ex_ep_b = ep_f, ep_b

    # Compute under a hidden collective runs slower (efficiency.overlap_compute_slowdown).
    sigma = eff.overlap_compute_slowdown
    slow_f = sigma * ((tp_f - ex_tp_f) + (cp_f - ex_cp_f) + (ep_f - ex_ep_f))
    slow_b = sigma * ((tp_b - ex_tp_b) + (cp_b - ex_cp_b) + (ep_b - ex_ep_b))
    fwd, bwd = fwd + slow_f + tp_reduce_f, bwd + slow_b + tp_reduce_b

    return LayerCost(
        fwd_s=fwd, bwd_s=bwd, recompute_s=recompute_s, attention_fwd_s=attn_f, matmul_fwd_s=mm_f,
        tp_comm_fwd_s=tp_f, tp_comm_bwd_s=tp_b, cp_comm_fwd_s=cp_f, cp_comm_bwd_s=cp_b,
        ep_comm_fwd_s=ep_f, ep_comm_bwd_s=ep_b, exposed_tp_fwd_s=ex_tp_f, exposed_tp_bwd_s=ex_tp_b,
        exposed_cp_fwd_s=ex_cp_f, exposed_cp_bwd_s=ex_cp_b, exposed_ep_fwd_s=ex_ep_f, exposed_ep_bwd_s=ex_ep_b,
        overlap_slowdown_fwd_s=slow_f, overlap_slowdown_bwd_s=slow_b,
        a2a_hidden_fwd_s=(1 - sigma) * (ep_f - ex_ep_f), a2a_hidden_bwd_s=(1 - sigma) * (ep_b - ex_ep_b),
        flops_fwd=lops.flops,
        model_flops_fwd=lops.model_flops, recompute_flops=recompute_flops, params=layer_params)


def nvls_algorithm(nvls: bool) -> str:
    """The collective algorithm a plan's all-reduces take (``sim.net.network.AUTOS``): the
    cheapest candidate, without NVLS when the launcher turns it off (``Plan.nvls``)."""
    return "auto" if nvls else "auto_no_nvls"


def dp_collectives(net: Network, s: Strategy, params: StageParams, rt: CommRuntime,
                   eff: KernelEfficiency, *, nvls: bool = True) -> DpCollectives:
    """The data-parallel collectives of a stage holding ``params``: dense gradients reduced (and
    ZeRO-1/2/3 parameters gathered) over the ``dp x cp`` ranks, expert gradients over the
    expert-data-parallel group (``Strategy.expert_dp`` ranks, ``sim.net.placement`` ``edp``), one
    after the other (Megatron-Core keeps separate buckets for expert parameters).  Zero where
    nothing is reduced."""
    def coll(op: str, dim: str, ranks: int, nparams: float, bytes_per: float) -> float:
        if ranks <= 1 or nparams <= 0:
            return 0.0
        return (net.dim_collective_time_s(op, s, dim, nparams * bytes_per, algorithm=nvls_algorithm(nvls))
                + eff.collective_overhead_s)

    g, pg = rt.grad_reduce_bytes_per_param, rt.param_gather_bytes_per_param
    hsdp = s.zero_shard < s.dp * s.cp
    dense_dim, dense_ranks = ("dp_shard", s.zero_shard) if hsdp else ("dp_cp", s.dp * s.cp)
    groups = (("dp_cp", s.dp * s.cp, params.dense_params), ("edp", s.expert_dp, params.expert_params))
    sharded = ((dense_dim, dense_ranks, params.dense_params), ("edp", s.expert_dp, params.expert_params))
    # HSDP: the reduce-scattered shard of the dense gradients is all-reduced over the replicas
    replica = coll("all_reduce", "dp_replicate", s.dp * s.cp // s.zero_shard, params.dense_params / s.zero_shard,
                   g) if hsdp else 0.0
    return DpCollectives(all_reduce_s=sum(coll("all_reduce", d, n, p, g) for d, n, p in groups),
                         reduce_scatter_s=sum(coll("reduce_scatter", d, n, p, g) for d, n, p in sharded),
                         all_gather_s=sum(coll("all_gather", d, n, p, pg) for d, n, p in sharded),
                         replica_all_reduce_s=replica,
                         all_gather_latency_s=coll("all_gather", dense_dim, dense_ranks, 1.0, 1.0))


def p2p_time_s(net: Network, s: Strategy, eff: KernelEfficiency, nbytes: float) -> float:
    """One pipeline send of a micro-batch's activations, every stage boundary sending at once,
    scattered across the TP ranks (Narayanan et al. 2021, Sec. 4.1 scatter/gather): each TP rank
    sends 1/tp and, without SP, the receiver all-gathers it over NVLink; with SP the
    activation stays sharded.  0 without pipelining."""
    if s.pp == 1:
        return 0.0
    t = net.dim_collective_time_s("p2p", s, "pp", nbytes) + eff.collective_overhead_s
    if s.tp > 1 and not s.sp:
        t += net.dim_collective_time_s("all_gather", s, "tp", nbytes * s.tp) + eff.collective_overhead_s
    return t


def p2p_bytes(model: Model, s: Strategy) -> float:
    """Bytes one TP rank sends per pipeline boundary per micro-batch: bf16 activations of the
    local sequence chunk, 1/tp of the hidden width."""
    return 2.0 * s.mbs * (s.seq_len // s.cp) * model.hidden_size / s.tp


def host_sync_counts(h: HostSyncs, pp: int) -> tuple[float, float, float, float]:
    """(forward, backward, per-step, per-gradient-bucket) host synchronisations of a framework
    (``Plan.host_syncs``) with ``pp`` pipeline stages; a pipelined stage's p2p syncs split between
    its forward and backward."""
    p2p = h.p2p / 2 if pp > 1 else 0.0
    return h.forward + p2p, h.backward + p2p, float(h.step), float(h.per_bucket)


def pieces_hbm_bytes_per_s(cluster: Cluster, eff: KernelEfficiency) -> float:
    """HBM rate of the memory-bound per-parameter passes (optimizer, gradient accumulation,
    FSDP copies, fp8 weight casts): the GPU's achievable rate on the job's slowest GPU
    (``sim.layers.variability``)."""
    g = cluster.gpu
    return g.hbm_bytes_per_s * g.hbm_efficiency / eff.slowest_rank_factor(cluster.num_gpus)


def plan_comm_runtime(plan: Plan, precision: str | None = None, fp8_params: bool | None = None) -> CommRuntime:
    """The data-parallel byte counts of ``plan`` (of a candidate of its search at ``precision``
    with ``fp8_params``): the gradients reduced in its model-state layout's gradient dtype where
    the layout fixes one (``megatron_bf16_grads``: bf16), the parameters gathered in fp8 under
    ``Strategy.fp8_params`` (Megatron-Core fp8_param_gather), else ``catalogs/runtime.yaml``
    ``communication``."""
    precision = plan.strategy.precision if precision is None else precision
    fp8_params = plan.strategy.fp8_params if fp8_params is None else fp8_params
    rt = default_comm_runtime()
    lay = state_layout(plan.states_layout_for(precision))
    g = lay.grad_reduce_bytes_per_param or rt.grad_reduce_bytes_per_param
    pg = default_runtime().fp8_param_bytes_per_param if fp8_params else rt.param_gather_bytes_per_param
    if (g, pg) == (rt.grad_reduce_bytes_per_param, rt.param_gather_bytes_per_param):
        return rt
    return replace(rt, grad_reduce_bytes_per_param=g, param_gather_bytes_per_param=pg)


def piece_settings(plan: Plan, eff: KernelEfficiency, *, precision: str, pp: int, num_microbatches: Num,
                   dp_overlap: bool, fp8_recipe: str, dp_size: int, model_chunks: Num = 1) -> PieceSettings:
    """The plan's inputs of ``sim.cost.step.stage_pieces`` (``PieceSettings``): ``simulate`` passes
    its strategy's values (floats), the search a layout's and arrays of micro-batch counts and
    model chunks (vp); ``dp_size``: the data(-and-context)-parallel group the gradients are
    reduced over."""
    rt = plan_comm_runtime(plan, precision)
    return PieceSettings(
        grad_bucket_params=rt.grad_bucket_params(plan.grad_buckets, dp_size),
        dp_overlap=dp_overlap, hbm_bytes_per_s=pieces_hbm_bytes_per_s(plan.cluster, eff), rt=rt, eff=eff,
        accum_bytes_per_param=rt.grad_accumulation_bytes(plan.grad_accumulation, num_microbatches),
        fp16=precision == "fp16", fsdp_copies=plan.fsdp_copies, optimizer_impl=plan.optimizer_impl,
        weight_cast_bytes_per_param=fp8_weight_cast_bytes_per_param(eff, precision, fp8_recipe,
                                                                    plan.fp8_weight_cache, num_microbatches,
                                                                    compiled=plan.fp8_cast_kernels == "inductor"),
        pipelined_fsdp=pp > 1 and plan.state_layout in FSDP2_LAYOUTS,
        bf16_optimizer=plan.deepspeed_bf16_optimizer and precision == "bf16",
        per_tensor_gather=plan.zero3_gather == "per_tensor_sync", host_syncs=host_sync_counts(plan.host_syncs, pp),
        model_chunks=model_chunks)


def stage_pieces_for(plan: Plan, net: Network, eff: KernelEfficiency, params: StageParams, num_layers: int,
                     layer_fwd_s: float, layer_bwd_s: float, act_bytes: float = 0.0, tensors: int = 0,
                     embedding_params: float = 0.0) -> StagePieces:
    """``stage_pieces`` of one stage of ``plan`` (floats); ``act_bytes``: the stage's saved
    activations of one micro-batch (what activation offload moves); ``tensors``: its parameter
    tensors (``sim.layers.stages.stage_parameter_tensors``), gathered one by one under
    ``Plan.zero3_gather`` ``per_tensor_sync``."""
    s = plan.strategy
    settings = piece_settings(plan, eff, precision=s.precision, pp=s.pp, num_microbatches=s.num_microbatches,
                              dp_overlap=s.dp_overlap, fp8_recipe=s.fp8_recipe, dp_size=s.dp * s.cp,
                              model_chunks=s.vp)
    return stage_pieces(coll=dp_collectives(net, s, params, settings.rt, eff, nvls=plan.nvls), zero=s.zero,
                        dp_size=s.zero_shard,
                        expert_dp=s.expert_dp, params=params, num_layers=num_layers, layer_fwd_s=layer_fwd_s,
                        layer_bwd_s=layer_bwd_s, settings=settings, tensors=tensors,
                        offload_optimizer=s.offload_optimizer, offload_params=s.offload_params,
                        offload_activations=s.offload_activations, act_bytes=act_bytes,
                        rates=strategy_rates(plan.cluster, s), embedding_params=embedding_params)


def moe_dispatch_s(plan: Plan, net: Network, eff: KernelEfficiency, nbytes: float) -> float:
    """One token dispatch (or combine) of an MoE layer: ``nbytes`` is what one rank sends
    (routed copies, ``sim.layers.ops``).  ``alltoall``: NCCL all-to-all on the fabric (size curves of
    its per-peer chunks); ``allgather``: Megatron's all-gather dispatcher gathers every rank's
    unique tokens (``nbytes / top_k`` each) over the ep group, and reduce-scatters them back
    on combine (the mean of the two per pass); ``deepep``: fused kernels at DeepEP's achieved
    fraction of the nominal link rate of the tier the group crosses
    (``KernelEfficiency.deepep_dispatch``, the README's rates less the bytes that stay on the
    source's own node or rank), no per-chunk size penalty, sending each token once
    per remote destination rank (NVLink) or node (RDMA) rather than once per routed copy
    (``sim.layers.moe_routing.remote_destinations`` under the plan's ``moe_routing``)."""
    s = plan.strategy
    if plan.moe_dispatcher == "allgather":
        assert plan.model.moe is not None
        gathered = nbytes / plan.model.moe.top_k * s.ep
        return 0.5 * (net.dim_collective_time_s("all_gather", s, "ep", gathered)
                      + net.dim_collective_time_s("reduce_scatter", s, "ep", gathered)) + eff.collective_overhead_s
    if plan.moe_dispatcher == "deepep":
        link = net.dim_link(s, "ep", pattern="all_to_all")
        if link.tier == "local" or not math.isfinite(link.bytes_per_s):
            return 0.0
        # one copy per destination rank (NVLink) or node (RDMA), not per expert (sim.layers.moe_routing)
        stride, size = group_shape(s, "ep")
        domain = net.fabric.nvlink_domain
        per_domain = max(1, min(size, domain // stride)) if link.tier != "scale-up" and stride < domain else 1
        units = s.ep if link.tier == "scale-up" else -(-size // per_domain)
        # the all-to-all link is the rank's send rate over all size - 1 peers; the remote bytes
        # below cross the tier at the share of it the size - per_domain remote peers get
        crossing = (size - per_domain) / max(1, size - 1)
        rate = (link.bytes_per_s * crossing / net.bandwidth_efficiency[link.tier]
                * eff.deepep_dispatch.get(link.tier, 1.0))
        moe = plan.model.moe
        assert moe is not None
        sent = nbytes / moe.top_k * remote_destinations(moe.num_experts, moe.top_k, units, plan.moe_routing)
        return link.latency_s + sent / rate + eff.collective_overhead_s
    return net.dim_collective_time_s("all_to_all", s, "ep", nbytes) + eff.collective_overhead_s


def plan_layer_ops(plan: Plan, strategy: Strategy, eff: KernelEfficiency, *, moe: bool) -> LayerOps:
    """``sim.layers.ops.layer_ops`` with the plan's framework settings and the fp8 recipe's fitted
    quantization cost."""
    q = eff.fp8_recipe(strategy.fp8_recipe).quantize_bytes_per_element if strategy.precision == "fp8" else 0.0
    # torchao's casts under torch.compile, where inductor's traffic for the recipe was measured
    # (the others, e.g. MX casts with kernels of their own, keep the recipe's standalone cost)
    compiled = eff.compiled_fp8_casts.get(strategy.fp8_recipe) if plan.fp8_cast_kernels == "inductor" else None
    rope = eff.compiled_rope if plan.rope_kernels == "inductor" and eff.compiled_rope else None
    return layer_ops(plan.model, strategy, moe=moe, attention=plan.attention_kernel, fp8_quantize_bytes_per_element=q,
                     moe_imbalance=plan.moe_imbalance, fp8_compiled_casts=compiled, compiled_rope=rope)


def step_costs(plan: Plan, net: Network | None = None, eff: KernelEfficiency | None = None) -> StepCosts:
    """Cost every piece of one step of ``plan`` (see module docstring)."""
    model, cluster, s = plan.model, plan.cluster, plan.strategy
    net = net or default_network(cluster)
    eff = eff or default_efficiency()

    dense_cost = layer_cost(plan, net, plan_layer_ops(plan, s, eff, moe=False), eff,
                            layer_params(model, s, moe=False).total)
    moe_cost = None
    if model.moe is not None:
        moe_cost = layer_cost(plan, net, plan_layer_ops(plan, s, eff, moe=True), eff,
                              layer_params(model, s, moe=True).total)
    ends = end_costs(plan, eff)
    nbytes = p2p_bytes(model, s)
    p2p_s = p2p_time_s(net, s, eff, nbytes)

    # Stages of one shape (sim.layers.stages) have the same parameters and layer sums: their pieces
    # are computed once.
    layers_of = stage_layers(model, s)
    chunks_of = model_chunks(model, s)
    by_signature = {(sh.num_layers, sh.num_moe_layers, sh.first, sh.last, sh.chunks): sh for sh in stage_shapes(model, s)}
    moe_layers = [sum(model.is_moe_layer(j) for j in ls) for ls in layers_of] if model.moe is not None \
        else [0] * len(layers_of)
    shape_of = [by_signature[(len(ls), moe_layers[i], i == 0, i == s.pp - 1,
                              chunk_signature(model, chunks_of[i]) if chunks_of is not None else None)]
                for i, ls in enumerate(layers_of)]
    pieces_of: dict[int, StagePieces] = {}
    act = _layer_act_bytes(plan) if s.offload_activations else (0.0, 0.0)
    stages = []
    for i, layers in enumerate(layers_of):
        first, last = i == 0, i == s.pp - 1
        sh = shape_of[i]
        costs = (tuple(moe_cost if model.is_moe_layer(j) else dense_cost for j in layers) if moe_layers[i]
                 else (dense_cost,) * len(layers))
        frac = recompute_time_fraction(s.recompute, s.recompute_num_layers, s.recompute_method, s.vp, len(layers))
        if frac < 1.0:  # partial (block) recomputation: that share of the stage's recompute work
            costs = tuple(replace(c, recompute_s=c.recompute_s * frac, recompute_flops=c.recompute_flops * frac)
                          for c in costs)
        extra_f = (ends.embedding_fwd_s if first else 0.0) + (ends.head_fwd_s if last else 0.0)
        extra_b = (ends.embedding_bwd_s if first else 0.0) + (ends.head_bwd_s if last else 0.0)
        pieces = pieces_of.get(sh.index)
        if pieces is None:
            pieces = stage_pieces_for(plan, net, eff, sh.params, len(layers), sum(c.fwd_s for c in costs) + extra_f,
                                      sum(c.bwd_s + c.recompute_s for c in costs) + extra_b,
                                      act_bytes=float(offloaded_activation_bytes(sh, *act, s.offload_num_layers)),
                                      tensors=stage_parameter_tensors(model, sh),
                                      embedding_params=stage_embedding_params(model, s, sh.first)).as_floats()
            pieces_of[sh.index] = pieces
        stages.append(StageCost(
            stage=i, layers=tuple(layers), layer_costs=costs, extra_fwd_s=extra_f, extra_bwd_s=extra_b,
            extra_model_flops=ends.head_flops if last else 0.0, p2p_s=p2p_s, params=sh.params.total,
            chunk_sizes=tuple(len(c) for c in chunks_of[i]) if chunks_of is not None else None,
            pieces=pieces))
    return StepCosts(stages=tuple(stages), p2p_bytes=nbytes)


def _layer_act_bytes(plan: Plan) -> tuple[float, float]:
    """Saved activations of a dense and of an MoE layer per micro-batch, as ``sim.cost.memory``
    counts them."""
    dense, moe, *_ = layer_activations(plan.model, plan.strategy, attention=plan.attention_kernel,
                                       selective_policy=plan.selective_policy, eager=plan.eager_activations,
                                       fp8_saved_inputs=plan.fp8_saved_inputs, moe_imbalance=plan.moe_imbalance)
    return dense, moe


def offload_report(plan: Plan) -> dict[str, object]:
    """What ``plan``'s offload moves in one step on one GPU of its most loaded stage: bytes
    host-to-device and device-to-host (``sim.cost.offload.OffloadBytes``) and how long each
    direction keeps the host link busy (full durations, not the exposed part)."""
    s, cl = plan.strategy, plan.cluster
    rates = strategy_rates(cl, s)
    if rates is None:
        return {"mode": "none"}
    act = _layer_act_bytes(plan) if s.offload_activations else (0.0, 0.0)
    best: tuple[float, float, float] | None = None
    for sh in stage_shapes(plan.model, s):
        vol = offload_bytes(local_params(sh.params, s.zero, s.zero_shard, s.expert_dp),
                            offloaded_activation_bytes(sh, *act, s.offload_num_layers), zero=s.zero,
                            offload_optimizer=s.offload_optimizer,
                            offload_params=s.offload_params, offload_activations=s.offload_activations, rates=rates)
        h2d, d2h = (float(x) for x in vol.per_step(s.num_microbatches))
        weights = float(s.num_microbatches * 2 * vol.weights_in_per_pass + vol.weights_back_per_step)
        if best is None or h2d + d2h > best[0] + best[1]:
            best = (h2d, d2h, weights)
    assert best is not None
    h2d, d2h, weights = best
    link = rates.link_bytes_per_s
    # weights may stream from NVMe (slower than the link): their share of the H2D time
    h2d_s = (h2d - weights) / link + weights / rates.state_bytes_per_s
    return {"mode": s.offload, "device": s.offload_device, "h2d_bytes_per_step": h2d, "d2h_bytes_per_step": d2h,
            "h2d_s": h2d_s, "d2h_s": d2h / link, "host_link_bytes_per_s": link}


@dataclass(frozen=True, slots=True)
class EndCosts:
    """Embedding (first stage) and output layer + loss (last stage), per micro-batch."""

    embedding_fwd_s: float
    embedding_bwd_s: float
    head_fwd_s: float
    head_bwd_s: float
    head_flops: float


def end_costs(plan: Plan, eff: KernelEfficiency) -> EndCosts:
    s, gpu, model = plan.strategy, plan.cluster.gpu, plan.model
    k = eff.slowest_rank_factor(plan.cluster.num_gpus)  # the slowest GPU sets the pace (sim.layers.variability)
    head = head_ops(model, s, plan.loss_impl)
    fused = plan.fused_ops + (("cross_entropy",) if plan.loss_impl in FUSED_LOSS_IMPLS else ())
    head_f, head_b = ops_time(gpu, s.precision, head, eff, eager=plan.eager_elementwise, fused=fused)
    emb_f, emb_b = ops_time(gpu, s.precision, embedding_ops(model, s), eff)
    return EndCosts(embedding_fwd_s=k * emb_f, embedding_bwd_s=k * emb_b, head_fwd_s=k * head_f, head_bwd_s=k * head_b,
                    head_flops=sum(op.counted_flops for op in head))
