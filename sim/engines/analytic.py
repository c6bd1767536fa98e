"""Analytic step-time model: the closed-form composition of ``sim.cost.step`` over costed pieces.

``simulate_analytic`` costs the plan's pieces (``sim.cost.costs.step_costs``), composes them with
``sim.cost.step.compose`` (the same formulation the planner's search evaluates over whole grids of
plans) and reads the breakdown of the step off the bottleneck stage: compute, exposed
communication by dimension, pipeline bubble, optimizer.  Formulas, references and known
errors: ``sim.cost.step`` and docs/accuracy.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from sim.layers.compute import KernelEfficiency, default_efficiency
from sim.cost.costs import StepCosts, default_network, offload_report, step_costs
from sim.base.errors import InputError
from sim.net.fabric import check_nics
from sim.cost.memory import MemoryBreakdown, plan_memory
from sim.net.network import Network
from sim.net.placement import all_groups
from sim.cost.plan import Plan
from sim.engines.result import Breakdown, StepResult, step_result
from sim.cost.step import StageTimes, compose
from sim.base.units import GIB


class AnalyticStep(NamedTuple):
    """The closed form's step without its memory: the step time, its breakdown (parts summing
    to the step), the pipeline bubble before that reconciliation, and the recomputed FLOPs."""

    step_time_s: float
    breakdown: Breakdown
    bubble_s: float
    recompute_flops_per_step: float


def simulate_analytic(plan: Plan, *, net: Network | None = None, eff: KernelEfficiency | None = None,
                      costs: StepCosts | None = None) -> StepResult:
    """Predict one optimizer step of ``plan`` with the closed-form model (module docstring):
    ``analytic_step`` and the plan's memory (``sim.cost.memory.plan_memory``).  ``costs``:
    precomputed (possibly perturbed) ``step_costs(plan, net, eff)``."""
    a = analytic_step(plan, net=net, eff=eff, costs=costs)
    s = plan.strategy
    mem = plan_memory(plan)
    return step_result(plan, step_time_s=a.step_time_s, breakdown=a.breakdown, memory=mem,
                       recompute_flops_per_step=a.recompute_flops_per_step, engine="analytic",
                       warnings=plan_warnings(plan, mem, a.bubble_s / a.step_time_s if a.step_time_s else 0.0),
                       extra={"offload": offload_report(plan)} if s.offload != "none" else {})


def analytic_step(plan: Plan, *, net: Network | None = None, eff: KernelEfficiency | None = None,
                  costs: StepCosts | None = None) -> AnalyticStep:
    """One optimizer step of ``plan`` by the closed form, without its memory: what
    ``simulate_analytic`` reports, for callers that need only the time (the fits price
    thousands of plans per grid point)."""
    cluster, s = plan.cluster, plan.strategy
    if s.dp_impl == "parameter-server":
        raise InputError("dp_impl", s.dp_impl, "asynchronous parameter-server plans are priced by sim.engines.simulate "
                         "(sim.engines.parameter_server), not the synchronous closed form")
    net = net or default_network(cluster)
    eff = eff or default_efficiency()
    costs = costs or step_costs(plan, net, eff)
    stages = costs.stages
    m, v, p = s.num_microbatches, s.vp, s.pp
    times = [st.times(p) for st in stages]
    # Identical stages compose once, weighted by how many there are (sim.cost.step: count, before).
    entries, entry_of = _distinct(times)
    out = compose(entries, m=m, vp=v, zero_bubble=s.schedule == "zero-bubble", pp=p, zero=s.zero,
                  dp_overlap=s.dp_overlap, overlap_slowdown=eff.overlap_compute_slowdown, pp_overlap=s.pp_overlap,
                  flushes=plan.pipeline_flushes)
    t_pipe = float(out.pipeline_s)
    tot = [float(out.fwd_s[k] + out.bwd_s[k]) for k in entry_of]
    b_idx = max(range(p), key=lambda i: tot[i])
    bott = stages[b_idx]
    bubble = max(0.0, t_pipe - m * tot[b_idx])
    # the stage that ends the step (ties broken as a tuple comparison would)
    k_end = max(range(len(entries)), key=lambda k: (float(out.end_s[k]), float(out.dp_exposed_s[k]),
                                                    float(out.optimizer_s[k]), float(out.slowdown_s[k])))
    step = float(out.step_time_s)
    dp_exposed, opt, slow = (float(out.dp_exposed_s[k_end]), float(out.optimizer_s[k_end]),
                             float(out.slowdown_s[k_end]))

    comp = m * (times[b_idx].compute_fwd_s + times[b_idx].compute_bwd_s) + slow
    recompute = m * sum(c.recompute_s for c in bott.layer_costs)
    ex_tp = m * bott.exposed_tp_s
    ex_cp = m * bott.exposed_cp_s
    ex_ep = m * bott.exposed_ep_s + float(out.a2a_exposed_s[k_end])  # + the A2A-overlap passes without a partner
    ex_pp = m * v * bott.p2p_s * (times[b_idx].fwd_sends + times[b_idx].bwd_sends)
    ex_dp = dp_exposed + m * bott.pieces.exposed_zero3_s
    ex_off = float(out.offload_exposed_s[k_end]) + m * bott.pieces.exposed_offload_s
    exposed = ex_tp + ex_cp + ex_ep + ex_pp + ex_dp + ex_off
    breakdown = Breakdown(compute_s=comp, exposed_comm_s=exposed, bubble_s=bubble, optimizer_s=opt,
                          exposed_tp_s=ex_tp, exposed_cp_s=ex_cp, exposed_ep_s=ex_ep,
                          exposed_pp_s=ex_pp, exposed_dp_s=ex_dp, exposed_offload_s=ex_off, recompute_s=recompute)
    # Reconcile: the parts must sum to the step (bubble absorbs rounding of the pipeline terms).
    gap = step - breakdown.total_s
    if abs(gap) > 1e-12:
        breakdown = replace(breakdown, bubble_s=max(0.0, bubble + gap))
        if breakdown.total_s < step - 1e-9 * step:
            breakdown = replace(breakdown, overhead_s=step - breakdown.total_s)

    replicas = s.tp * s.dp * s.cp
    recompute_flops = sum(st.recompute_flops_per_microbatch for st in stages) * m * replicas
    return AnalyticStep(step_time_s=step, breakdown=breakdown, bubble_s=bubble, recompute_flops_per_step=recompute_flops)


def _distinct(times: list[StageTimes]) -> tuple[list[StageTimes], list[int]]:
    """The distinct stages of ``times`` in order of first occurrence, each with how many stages
    it stands for and how many of each precede its first (``StageTimes.count``, ``before``), and
    for every stage the index of its entry.  Of equal stages the first ends its last backward
    latest, so it stands for the others in ``sim.cost.step.compose``."""
    fields = [f for f in StageTimes.__slots__ if f not in ("count", "before")]
    firsts: list[StageTimes] = []
    entry_of: list[int] = []
    index: dict[tuple, int] = {}
    for t in times:
        k = index.setdefault(tuple(getattr(t, f) for f in fields), len(firsts))
        if k == len(firsts):
            firsts.append(t)
        entry_of.append(k)
    entries = []
    for k, t in enumerate(firsts):
        first = entry_of.index(k)
        before = tuple(entry_of[:first].count(j) for j in range(len(firsts)))
        entries.append(replace(t, count=entry_of.count(k), before=before))
    return entries, entry_of


def plan_warnings(plan: Plan, mem: MemoryBreakdown, bubble_fraction: float) -> list[str]:
    s, c = plan.strategy, plan.cluster
    out = check_nics(c)
    if not mem.fits_gpu:
        out.append("does not fit in GPU memory: try recompute=selective/full, zero=1-3, offload=optimizer|params "
                   "(host memory), a larger tp/pp or a smaller mbs")
    if not mem.fits_host:
        gib = GIB
        if mem.host_bytes > mem.host_capacity_bytes:
            out.append(f"offloaded bytes need {mem.host_bytes / gib:.1f} GiB of host memory per node, more than its "
                       f"{mem.host_capacity_bytes / gib:.1f} GiB: offload less, shard over more GPUs, or nvme")
        if mem.nvme_bytes > mem.nvme_capacity_bytes:
            out.append(f"offloaded states need {mem.nvme_bytes / gib:.1f} GiB of NVMe per node, more than its "
                       f"{mem.nvme_capacity_bytes / gib:.1f} GiB")
    block = c.scale_up_block
    if c.num_gpus > block and c.domain_size > 1:
        for dim, size in (("tp", s.tp), ("cp", s.cp), ("ep", s.ep), ("etp", s.expert_tp)):
            if size <= 1 or (dim == "etp" and s.expert_tp == s.tp):
                continue
            spans = max(len({r // block for r in g}) for g in all_groups(s, dim))
            if spans > 1:
                why = (f"{size} > {block} GPUs per domain" if size > block else
                       f"with placement={c.placement}, {block} GPUs per domain")
                out.append(f"{dim}={size} groups span {spans} NVLink domains ({why}): their collectives cross "
                           f"the scale-out network")
    elif s.tp > c.domain_size:
        out.append(f"tp={s.tp} spans beyond one NVLink domain ({c.domain_size} GPUs): TP collectives cross the scale-out network")
    if s.pp > 1 and s.num_microbatches < s.pp:
        out.append(f"only {s.num_microbatches} micro-batches for pp={s.pp}: the pipeline never fills")
    if bubble_fraction > 0.25:
        out.append(f"pipeline bubble is {bubble_fraction:.0%} of the step: more micro-batches or interleaving (vp) help")
    if s.precision == "fp16":
        out.append("fp16 uses the bf16 tensor-core peak and assumes loss scaling costs nothing")
    return out
