"""Asynchronous parameter-server training (``dp_impl=parameter-server``; TensorFlow's
``ParameterServerStrategy`` with a ``ClusterCoordinator``), priced next to the synchronous
all-reduce step of the same strategy on the same cluster.

What TensorFlow does (tensorflow/python/distribute/parameter_server_strategy_v2.py,
coordinator/cluster_coordinator.py, ps_values.py): the variables live on the PS tasks, whole
(round-robin in creation order: ``'/job:ps/task:%d' % (count % num_ps)``) or split along their
first axis by a ``variable_partitioner`` (``MinSizePartitioner(min_shard_bytes, max_shards=num_ps)``,
each shard placed round-robin in turn).  The coordinator schedules step functions on workers; a
worker (one node: its GPUs are the strategy's in-sync replicas) reads every variable into its
host once per step (``CachingVariable``), copies it to its GPUs, runs forward and backward,
reduces its replicas' gradients on its CPU (``ReductionToOneDevice(reduce_to_device=CPU:0)``)
and pushes them to the PS tasks, whose CPUs apply the optimizer.  Nobody waits for anybody:
each push is one update (one worker's batch), computed on variables that other workers have
updated since they were read.

The model, per update (``W`` workers of ``g`` GPUs, ``k`` PS tasks, ``P`` parameters,
``P_s`` on PS ``s``; bytes per parameter from ``catalogs/runtime.yaml`` ``parameter_server``;
gRPC over TCP uses one interface of a host at ``grpc_link_fraction`` of its line rate):

* Service demands at the shared resources of the most loaded PS (seconds per update):
  egress ``D_out`` (pulls), ingress ``D_in`` (pushes), CPU ``D_cpu = P_s x`` Adam seconds per
  parameter (``adam_bytes_per_param`` at the host's memory bandwidth, or its compute rate).
  Dedicated PS hosts: ``D_out = 4 P_s / B_ps``.  Colocated (PS ``i`` on worker node ``i``): the
  node's NIC also carries its own worker's traffic and none of the local shard, so
  ``D_out = (4 P_i (W-1)/W + 4 (P - P_i)/W) / B_node`` (and ``D_in`` alike), which with
  ``k = W`` even shards is ``8 P (W-1) / (W^2 B)``: per round of ``W`` updates the ring
  all-reduce's ``2 (W-1)/W x 4P / B`` (Jiang et al. 2020, "A Unified Architecture for
  Accelerating Distributed DNN Training in Heterogeneous GPU/CPU Clusters" (BytePS), OSDI,
  Sec. 3.1).
* One worker alone (``T_w``): forward ``F`` and backward ``B`` of its replicas (``sim.cost.costs``,
  the pieces the synchronous step is priced with), the pull (``4P`` over its NIC, each shard at
  its PS's rate, in parallel) and the host-to-GPU copy, overlapped with the forward as
  TensorFlow's dataflow executor issues every remote read at the start of the step; the
  device-to-host copies, the CPU reduction of ``g`` replicas, the push and the PS's Adam,
  overlapped with the backward: each chain exposes ``max(0, chain - F or B) + chain / L`` for
  ``L`` layers (the exposure form ``sim.cost.step`` gives FSDP's prefetched gathers).
* Throughput ``X`` (updates/s) of ``W`` workers: exact Mean Value Analysis (Reiser & Lavenberg
  1980, J. ACM 27(2)) of a closed network: the three PS stations as processor-sharing
  queues (TCP shares a link fairly; BCMP product form holds for any service distribution) and a
  delay ``Z = max(0, T_w - D_out - D_in - D_cpu)``, so one worker runs at ``1/T_w`` and many
  saturate at ``1 / max D``.  Shards are symmetric (a fork-join of identical queues behaves as
  one); with uneven shards the most loaded PS is taken for all (pessimistic by its excess).
* Staleness: between a worker's pull and its push the others apply ``X (W-1)/W`` updates per
  second for ``W/X`` seconds (Little's law): ``W - 1`` updates on average whatever the timing,
  i.e. ``(W - 1)/W`` of a global batch.
* Synchronous all-reduce on the same cluster: ``sim.engines.analytic`` of the same strategy with
  ``dp_impl=ddp`` (the plan's own mechanisms), whose step waits for the slowest worker: with a
  worker step-time coefficient of variation ``c`` (``ParameterServers.step_time_cv``) its step
  is ``T_sync (1 + c e_W)``, ``e_W`` the expected maximum of ``W`` standard normals (Blom 1958:
  ``Phi^-1((W - 0.375)/(W + 0.25))``); asynchronous workers do not wait, so their mean rate
  is unchanged at first order.

Known error: the gRPC fraction is an assumption (+-50%); the MVA's product form ignores the
burstiness of one worker's pull and push; the PS CPU's other work (gRPC serialisation) and a
colocated PS's load on its node's host are not counted; the statistical efficiency of stale
gradients is NOT modelled (more steps may be needed for the same loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from sim.engines.analytic import simulate_analytic
from sim.layers.compute import KernelEfficiency
from sim.cost.costs import StepCosts, step_costs
from sim.base.errors import InputError
from sim.cost.memory import plan_memory
from sim.net.network import Network
from sim.cost.offload import host_spec
from sim.cost.plan import Plan
from sim.engines.result import Breakdown, StepResult, step_result
from sim.data.runtime import ParameterServerRuntime, parameter_server_runtime
from sim.data.specs import Model


@dataclass(frozen=True, slots=True)
class Variable:
    """One Keras variable (fp32), as the exported script creates it: ``rows`` is the axis a
    partitioner splits."""

    name: str
    rows: int
    cols: int

    @property
    def params(self) -> int:
        return self.rows * self.cols


def _ffn_matrices(model: Model, f: int) -> list[tuple[str, int, int]]:
    """(name, rows, cols) of an FFN's kernels in call order: SwiGLU's gate, up, down; GeLU's up, down."""
    h = model.hidden_size
    return ([("gate", h, f)] if model.ffn_type == "swiglu" else []) + [("up", h, f), ("down", f, h)]


def keras_variables(model: Model) -> tuple[Variable, ...]:
    """The variables of ``model`` in the order the Keras skeleton (``planner.exports.tensorflow``)
    creates them: embedding, per layer the attention norm, Q, K, V, O (MLA: one block of its
    projections), the FFN norm and the FFN kernels in call order (MoE: the router and every
    expert's), the final norm and the output head unless tied (``scripts/tf_export_smoke.py``
    checks the order against TensorFlow's).  Their sizes sum to ``model.num_params``."""
    h, out = model.hidden_size, []
    out.append(Variable("embedding", model.vocab_size, h))
    for i in range(model.num_layers):
        out.append(Variable(f"layer{i}.attn_norm", 1, h))
        if model.is_mla:  # its projections as one block (and the rows that do not fill h columns)
            rows, rest = divmod(model.attention_params, h)
            out += [Variable(f"layer{i}.attn", rows, h)] + ([Variable(f"layer{i}.attn_rest", 1, rest)] if rest else [])
        else:
            out += [Variable(f"layer{i}.q", h, model.q_size), Variable(f"layer{i}.k", h, model.kv_size),
                    Variable(f"layer{i}.v", h, model.kv_size), Variable(f"layer{i}.o", model.q_size, h)]
        out.append(Variable(f"layer{i}.ffn_norm", 1, h))
        if model.is_moe_layer(i):
            m = model.moe
            assert m is not None
            out.append(Variable(f"layer{i}.router", h, m.num_experts))
            for e in range(m.num_experts + m.num_shared_experts):
                f = m.expert_ffn_hidden_size
                out += [Variable(f"layer{i}.expert{e}.{n}", r, c) for n, r, c in _ffn_matrices(model, f)]
        else:
            out += [Variable(f"layer{i}.{n}", r, c) for n, r, c in _ffn_matrices(model, model.ffn_hidden_size)]
    out.append(Variable("final_norm", 1, h))
    if not model.tied_embeddings:
        out.append(Variable("lm_head", h, model.vocab_size))
    return tuple(out)


def ps_params(variables: tuple[Variable, ...], num_ps: int, partition: str, min_shard_bytes: float,
              bytes_per_param: float = 4.0) -> tuple[float, ...]:
    """Parameters held by each PS task (module docstring): ``round-robin`` places whole
    variables on ``count % num_ps``; ``even`` splits each variable into
    ``max(1, min(num_ps, bytes // min_shard_bytes, rows))`` shards along its rows (the first
    ``rows % shards`` one row larger), every shard placed round-robin in turn, as
    ``ParameterServerStrategyV2Extended._create_variable`` does."""
    load = [0.0] * num_ps
    count = 0
    for v in variables:
        shards = 1
        if partition == "even":
            shards = max(1, min(num_ps, int(v.params * bytes_per_param // min_shard_bytes), v.rows))
        base, extra = divmod(v.rows, shards)
        for j in range(shards):
            load[count % num_ps] += (base + (1 if j < extra else 0)) * v.cols
            count += 1
    return tuple(load)


def mva_throughput(demands_s: tuple[float, ...], think_s: float, customers: int) -> tuple[float, tuple[float, ...]]:
    """Exact Mean Value Analysis (Reiser & Lavenberg 1980) of a closed network of
    processor-sharing queues with service demands ``demands_s`` (seconds per visit cycle) and
    a delay ``think_s``, with ``customers`` jobs: (throughput in cycles/s, queue lengths)."""
    q = [0.0] * len(demands_s)
    x = 0.0
    for n in range(1, customers + 1):
        r = [d * (1.0 + qk) for d, qk in zip(demands_s, q)]
        x = n / (think_s + sum(r))
        q = [x * rk for rk in r]
    return x, tuple(q)


def expected_max_normal(n: int) -> float:
    """Expected maximum of ``n`` independent standard normals,
    ``E = integral x n phi(x) Phi(x)^(n-1) dx`` (David & Nagaraja 2003, Order Statistics, Sec. 3.1),
    by the trapezoid rule on [-10, 10] (0.5642 for 2, 1.5388 for 10, 2.5076 for 100; to 1e-6)."""
    if n <= 1:
        return 0.0
    x = np.linspace(-10.0, 10.0, 8001)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return float(np.trapezoid(x * n * pdf * cdf ** (n - 1), x))


@dataclass(frozen=True, kw_only=True, slots=True)
class PsReport:
    """One asynchronous configuration: sizes, per-update demands and times (seconds), the
    throughput and staleness, and the synchronous all-reduce step it is compared with."""

    workers: int
    gpus_per_worker: int
    num_ps: int
    placement: str
    partition: str
    params: float
    ps_params_max: float
    ps_params_mean: float
    worker_bytes_per_s: float  # gRPC rate of one worker's interface, per direction
    ps_bytes_per_s: float
    compute_s: float  # forward + backward of one update
    pull_s: float  # alone: PS -> worker host
    push_s: float
    host_copy_in_s: float  # host -> each GPU
    host_copy_out_s: float  # each GPU -> host, plus the CPU reduction of the replicas
    apply_s: float  # Adam on the most loaded PS
    exposed_pull_s: float
    exposed_push_s: float
    worker_alone_s: float  # T_w: one update with nobody else
    demands_s: dict[str, float]  # per update at the most loaded PS: egress, ingress, cpu
    think_s: float
    updates_per_s: float
    cycle_s: float  # one worker's update under load (W / X)
    utilisation: dict[str, float]
    bottleneck: str
    tokens_per_update: float
    tokens_per_s: float
    staleness_updates: float
    staleness_global_steps: float
    ps_host_bytes_max: float  # fp32 variables and Adam moments on the most loaded PS (host DRAM)
    sync_step_time_s: float
    sync_tokens_per_s: float
    sync_straggler_factor: float
    step_time_cv: float
    sync_result: StepResult  # the synchronous all-reduce step (without the straggler factor)

    @property
    def speedup_vs_sync(self) -> float:
        return self.tokens_per_s / self.sync_tokens_per_s

    def as_dict(self) -> dict[str, object]:
        out = {f: getattr(self, f) for f in self.__slots__ if f != "sync_result"}
        out["speedup_vs_sync"] = self.speedup_vs_sync
        out["sync_strategy"] = self.sync_result.strategy
        return out


def _exposed(chain_s: float, hide_s: float, layers: int) -> float:
    return max(0.0, chain_s - hide_s) + chain_s / max(1, layers)


def parameter_server_report(plan: Plan, *, net: Network, eff: KernelEfficiency,
                            rt: ParameterServerRuntime | None = None, costs: StepCosts | None = None) -> PsReport:
    """Price ``plan`` (``dp_impl=parameter-server``) as the module docstring says; ``costs``:
    its ``step_costs`` when already computed."""
    s, cluster, model, ps = plan.strategy, plan.cluster, plan.model, plan.parameter_servers
    if s.dp_impl != "parameter-server":
        raise InputError("dp_impl", s.dp_impl, "the parameter-server model prices dp_impl=parameter-server plans")
    rt = rt or parameter_server_runtime()
    g = min(cluster.gpus_per_node, s.dp)
    workers = s.dp // g
    k = ps.num_ps if ps.num_ps is not None else workers
    colocated = ps.placement == "colocated"
    if colocated and k > workers:
        raise InputError("num-ps", k, f"colocated PS tasks run one per worker node ({workers}); use "
                                      "--ps-placement dedicated for more")
    variables = keras_variables(model)
    params = float(sum(v.params for v in variables))
    loads = ps_params(variables, k, ps.partition, rt.min_shard_bytes)
    p_max = max(loads)

    f = rt.grpc_link_fraction
    b_worker = cluster.nic.bytes_per_s_per_direction * f  # one interface carries the task's gRPC
    b_ps = b_worker if colocated else (ps.nic or cluster.nic).bytes_per_s_per_direction * ps.nics_per_host * f
    host = host_spec(cluster)
    adam_s_per_param = max(rt.adam_bytes_per_param / host.host_mem_bytes_per_s, 1.0 / host.host_adam_params_per_s)

    pull_b, push_b = rt.pull_bytes_per_param, rt.push_bytes_per_param
    if colocated:
        # every worker node holds PS i = its own index for i < k: the local shard stays on the host
        local = sum(loads) / workers  # mean local share of one worker's traffic
        d_out = (pull_b * p_max * (workers - 1) / workers + push_b * (params - p_max) / workers) / b_ps
        d_in = (push_b * p_max * (workers - 1) / workers + pull_b * (params - p_max) / workers) / b_ps
    else:
        local = 0.0
        d_out, d_in = pull_b * p_max / b_ps, push_b * p_max / b_ps
    d_cpu = p_max * adam_s_per_param
    # alone, the busiest PS serves this worker's shard at its own rate (nothing when it is all local)
    alone_out = p_max * pull_b / b_ps if not colocated or workers > 1 else 0.0
    pull_s = max(pull_b * (params - local) / b_worker, alone_out)
    push_s = max(push_b * (params - local) / b_worker, alone_out * push_b / pull_b)

    link = host.link_bytes_per_s_per_gpu
    copy_in = rt.host_copy_bytes_per_param * params / link
    copy_out = rt.host_copy_bytes_per_param * params / link
    if g > 1:  # add_n of the replicas' gradients on the worker CPU: read g, write 1
        copy_out += (g + 1) * rt.host_copy_bytes_per_param * params / host.host_mem_bytes_per_s

    stage = (costs or step_costs(plan, net, eff)).stages[0]
    fwd, bwd = stage.compute_fwd_s, stage.compute_bwd_s
    layers = len(stage.layer_costs)
    exposed_pull = _exposed(pull_s + copy_in, fwd, layers)
    exposed_push = _exposed(copy_out + push_s + d_cpu, bwd, layers)
    alone = fwd + bwd + exposed_pull + exposed_push
    demands = {"egress": d_out, "ingress": d_in, "cpu": d_cpu}
    think = max(0.0, alone - sum(demands.values()))
    x, _ = mva_throughput(tuple(demands.values()), think, workers)
    util = {name: x * d for name, d in demands.items()}
    # asymptotic bounds (Lazowska et al. 1984, Quantitative System Performance, Ch. 5): the
    # workers bound while W / T_w < 1 / D_max, a PS resource beyond
    d_max = max(demands.values())
    bottleneck = "workers" if workers * d_max < alone else max(demands, key=demands.get)

    tokens_per_update = g * s.mbs * s.seq_len
    sync_plan = replace(plan, strategy=s.with_(dp_impl="ddp", dp_overlap=False))
    sync = simulate_analytic(sync_plan, net=net, eff=eff)
    straggle = 1.0 + ps.step_time_cv * expected_max_normal(workers)
    sync_step = sync.step_time_s * straggle
    return PsReport(workers=workers, gpus_per_worker=g, num_ps=k, placement=ps.placement, partition=ps.partition,
                    params=params, ps_params_max=p_max, ps_params_mean=params / k, worker_bytes_per_s=b_worker,
                    ps_bytes_per_s=b_ps, compute_s=fwd + bwd, pull_s=pull_s, push_s=push_s,
                    host_copy_in_s=copy_in, host_copy_out_s=copy_out, apply_s=d_cpu, exposed_pull_s=exposed_pull,
                    exposed_push_s=exposed_push, worker_alone_s=alone, demands_s=demands, think_s=think,
                    updates_per_s=x, cycle_s=workers / x, utilisation=util, bottleneck=bottleneck,
                    tokens_per_update=tokens_per_update, tokens_per_s=x * tokens_per_update,
                    staleness_updates=workers - 1.0, staleness_global_steps=(workers - 1.0) / workers,
                    ps_host_bytes_max=p_max * rt.ps_host_bytes_per_param, sync_step_time_s=sync_step,
                    sync_tokens_per_s=s.tokens_per_step / sync_step, sync_straggler_factor=straggle,
                    step_time_cv=ps.step_time_cv, sync_result=sync)


def simulate_parameter_server(plan: Plan, *, net: Network, eff: KernelEfficiency) -> StepResult:
    """One global batch (``gbs`` sequences = one update from every worker) of ``plan`` under
    asynchronous parameter servers, with ``parameter_server`` in the result (``PsReport``).
    ``step_time_s`` is the time to train a global batch at the asynchronous throughput."""
    costs = step_costs(plan, net, eff)
    rep = parameter_server_report(plan, net=net, eff=eff, costs=costs)
    s = plan.strategy
    step = s.tokens_per_step / rep.tokens_per_s
    mem = plan_memory(plan)
    # the GPU holds the pulled fp32 variables and the fp32 gradients; the optimizer lives on the PS
    mem = replace(mem, weights_bytes=4.0 * rep.params, gradients_bytes=4.0 * rep.params, optimizer_bytes=0.0)
    stage = costs.stages[0]
    recompute = sum(c.recompute_s for c in stage.layer_costs)
    recompute_flops = stage.recompute_flops_per_microbatch * s.dp
    breakdown = Breakdown(compute_s=rep.compute_s, exposed_comm_s=step - rep.compute_s, bubble_s=0.0,
                          optimizer_s=0.0, exposed_dp_s=step - rep.compute_s, recompute_s=recompute)
    warnings = [
        f"asynchronous parameter servers: {rep.workers} workers x {rep.gpus_per_worker} GPUs, {rep.num_ps} PS "
        f"({rep.placement}, {rep.partition} shards); {rep.tokens_per_s:,.0f} tokens/s against "
        f"{rep.sync_tokens_per_s:,.0f} for synchronous all-reduce on this cluster ({rep.speedup_vs_sync:.2f}x); "
        f"bound by {rep.bottleneck}",
        f"gradients are stale by {rep.staleness_updates:.0f} updates on average ({rep.staleness_global_steps:.2f} "
        "global batches): the statistical efficiency of stale updates is NOT modelled (time to a loss can grow "
        "even when tokens per second improve)",
        "TensorFlow moves tensors between tasks over gRPC/TCP; its achievable fraction of the NIC is an assumption "
        "(catalogs/runtime.yaml parameter_server.grpc_link_fraction): treat the result as +-50% when PS-bound",
    ]
    if not mem.fits:
        warnings.append("does not fit in GPU memory (a full fp32 replica of the variables and gradients per GPU)")
    return step_result(plan, step_time_s=step, breakdown=breakdown, memory=mem, recompute_flops_per_step=recompute_flops,
                       engine="analytic", warnings=warnings, extra={"parameter_server": rep.as_dict()})
