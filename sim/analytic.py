"""Analytic step-time model: closed-form pipeline schedules over the costed pieces.

For ``p`` stages, ``m`` micro-batches and ``v`` model chunks per stage, with ``F_i, B_i`` the
critical-path forward and backward time of one micro-batch on stage ``i`` (compute plus
exposed TP/CP/EP communication plus the point-to-point send):

* 1F1B and GPipe (Narayanan et al. 2021, Sec. 2.2):
  ``T = sum_i (F_i + B_i) + (m - 1) * max_i (F_i + B_i)``, i.e. ``(m + p - 1)(F + B)`` for
  equal stages, a bubble fraction ``(p - 1)/(m + p - 1)``;
* interleaved 1F1B: ``T = sum_i (F_i + B_i)/v + (m - 1/v) max_i (F_i + B_i)``, i.e. a bubble
  ``(p - 1)/v`` stage-times (Narayanan et al. 2021, eq. in Sec. 2.2.2), with ``v`` times more
  point-to-point transfers;
* zero-bubble ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 3): the weight
  gradient ``W`` fills the drain, bubble ``(p - 1)(F + B - W)`` with ``W`` taken as half the
  GEMM backward.

Data-parallel gradient reduction runs after a stage's last backward; with overlap it starts
under that backward (bucketed, as DDP/Megatron do), and a stage that finishes early (``i >
0`` finishes ``sum_{j<i} B_j`` before the pipeline's end) hides the rest in the drain.  The
backward that hides a reduction runs slower by ``efficiency.overlap_compute_slowdown`` of the
hidden time (communication kernels take SMs and HBM bandwidth; arXiv:2507.03114), as does the
first forward that hides a ZeRO-1/2 parameter gather.  The optimizer step is memory-bound
(``sim.costs``).  Known error: ignores the warm-up ramp of bucket sizes and assumes balanced
experts; see docs/accuracy.md.
"""

from __future__ import annotations

from dataclasses import replace

from sim.collectives import Network
from sim.compute import KernelEfficiency, default_efficiency
from sim.costs import StageCost, StepCosts, default_network, step_costs
from sim.memory import plan_memory
from sim.ops import model_flops_per_step
from sim.plan import Plan
from sim.result import Breakdown, StepResult


def _p2p_directions(i: int, p: int) -> tuple[int, int]:
    """(sends in forward, sends in backward) of stage ``i``: activations go to ``i+1``,
    gradients to ``i-1``."""
    return (1 if i < p - 1 else 0), (1 if i > 0 else 0)


def _stage_fb(stage: StageCost, v: int, i: int, p: int) -> tuple[float, float]:
    """Critical-path (F, B) of one micro-batch on a stage, including its p2p transfers
    (blocking sends, as Megatron's 1F1B issues them)."""
    nf, nb = _p2p_directions(i, p)
    return stage.fwd_s + nf * v * stage.p2p_s, stage.bwd_s + nb * v * stage.p2p_s


def pipeline_time_s(stages: tuple[StageCost, ...], m: int, v: int, schedule: str,
                    fb: list[tuple[float, float]] | None = None) -> float:
    """Closed-form time from the first forward to the last backward (module docstring).
    ``fb`` are the stages' critical-path (F, B), computed here when not given."""
    if fb is None:
        fb = [_stage_fb(st, v, i, len(stages)) for i, st in enumerate(stages)]
    tot = [f + b for f, b in fb]
    slowest = max(tot)
    if schedule == "zero-bubble" and len(stages) > 1:
        w = [0.5 * sum(c.bwd_s for c in st.layer_costs) for st in stages]
        drain = max(t - wi for t, wi in zip(tot, w))
        return m * slowest + (len(stages) - 1) * drain / v
    return sum(tot) / v + (m - 1.0 / v) * slowest


def simulate_analytic(plan: Plan, *, net: Network | None = None, eff: KernelEfficiency | None = None,
                      costs: StepCosts | None = None) -> StepResult:
    """Predict one optimizer step of ``plan`` with the closed-form model."""
    model, cluster, s = plan.model, plan.cluster, plan.strategy
    net = net or default_network(cluster)
    eff = eff or default_efficiency()
    costs = costs or step_costs(plan, net, eff)
    stages = costs.stages
    m, v, p = s.num_microbatches, s.vp, s.pp

    fb = [_stage_fb(st, v, i, len(stages)) for i, st in enumerate(stages)]
    t_pipe = pipeline_time_s(stages, m, v, s.schedule, fb)
    b_idx = max(range(p), key=lambda i: fb[i][0] + fb[i][1])
    bott = stages[b_idx]
    busy = m * (fb[b_idx][0] + fb[b_idx][1])
    bubble = max(0.0, t_pipe - busy)

    # Per-stage end of step: last backward (slowed while it hides the gradient reduction), the
    # reduction's remainder, the optimizer, then (ZeRO-1/2) the parameter gather.
    sigma = eff.overlap_compute_slowdown
    ends = []
    tail = 0.0  # time after stage i's last backward until the pipeline's last backward
    for i, st in enumerate(stages):
        last_bwd_end = t_pipe - tail
        slow = 0.0
        if s.zero >= 3:
            ready = last_bwd_end  # per-micro-batch FSDP traffic is inside F/B already
        else:
            n = max(1, len(st.layer_costs))
            window = fb[i][1] * (n - 1) / n if s.dp_overlap else 0.0
            slow = sigma * min(st.dp_grad_sync_s, window)
            ready = max(last_bwd_end + slow, last_bwd_end - window + st.dp_grad_sync_s)
        dp_exposed = ready - last_bwd_end - slow
        gather = st.dp_param_gather_s
        if s.dp_overlap:  # overlapped with the next step's first forward (overlap_param_gather)
            gather = max(0.0, gather - fb[i][0])
            slow_g = sigma * (st.dp_param_gather_s - gather)
            slow += slow_g
            ready += slow_g
        ends.append((ready + st.optimizer_s + gather, dp_exposed + gather, st.optimizer_s, slow))
        tail += fb[i][1]
    step, dp_exposed, opt, slow = max(ends)

    comp = m * (bott.compute_fwd_s + bott.compute_bwd_s) + slow
    recompute = m * sum(c.recompute_s for c in bott.layer_costs)
    ex_tp = m * bott.exposed_tp_s
    ex_cp = m * bott.exposed_cp_s
    ex_ep = m * bott.exposed_ep_s
    ex_pp = m * v * bott.p2p_s * sum(_p2p_directions(b_idx, p))
    ex_dp = dp_exposed + m * bott.exposed_zero3_s
    exposed = ex_tp + ex_cp + ex_ep + ex_pp + ex_dp
    breakdown = Breakdown(compute_s=comp, exposed_comm_s=exposed, bubble_s=bubble, optimizer_s=opt,
                          exposed_tp_s=ex_tp, exposed_cp_s=ex_cp, exposed_ep_s=ex_ep,
                          exposed_pp_s=ex_pp, exposed_dp_s=ex_dp, recompute_s=recompute)
    # Reconcile: the parts must sum to the step (bubble absorbs rounding of the pipeline terms).
    gap = step - breakdown.total_s
    if abs(gap) > 1e-12:
        breakdown = replace(breakdown, bubble_s=max(0.0, bubble + gap))
        if breakdown.total_s < step - 1e-9 * step:
            breakdown = replace(breakdown, overhead_s=step - breakdown.total_s)

    mf = model_flops_per_step(model, s)
    replicas = s.tp * s.dp * s.cp
    recompute_flops = sum(st.recompute_flops_per_microbatch for st in stages) * m * replicas
    peak = cluster.gpu.peak_flops_per_s("bf16")
    denom = step * cluster.num_gpus * peak
    mem = plan_memory(plan)
    return StepResult(
        step_time_s=step, tokens_per_s=s.tokens_per_step / step, mfu=mf / denom,
        hfu=(mf + recompute_flops) / denom, model_flops_per_step=mf,
        hardware_flops_per_step=mf + recompute_flops, memory=mem, breakdown=breakdown,
        strategy=s.to_string(), engine="analytic", num_gpus=cluster.num_gpus, peak_flops_per_s=peak,
        warnings=tuple(plan_warnings(plan, mem.fits, bubble / step if step else 0.0)))


def plan_warnings(plan: Plan, fits: bool, bubble_fraction: float) -> list[str]:
    s, c = plan.strategy, plan.cluster
    out = []
    if not fits:
        out.append("does not fit in GPU memory: try recompute=selective/full, zero=1-3, a larger tp/pp or a smaller mbs")
    if s.tp > c.domain_size:
        out.append(f"tp={s.tp} spans beyond one NVLink domain ({c.domain_size} GPUs): TP collectives cross the scale-out network")
    if s.pp > 1 and s.num_microbatches < s.pp:
        out.append(f"only {s.num_microbatches} micro-batches for pp={s.pp}: the pipeline never fills")
    if bubble_fraction > 0.25:
        out.append(f"pipeline bubble is {bubble_fraction:.0%} of the step: more micro-batches or interleaving (vp) help")
    if s.precision == "fp16":
        out.append("fp16 uses the bf16 tensor-core peak and assumes loss scaling costs nothing")
    return out
