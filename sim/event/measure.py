"""From the event log to the INTERFACE result: step time, breakdown, utilisation.

The step time is the latest unit's end of step (its optimizer done and, for ZeRO-1/2, the
parameter all-gather no longer in the way of the next forward).  The breakdown is measured on
that *critical* unit's compute stream over ``[0, step]``: every blocking interval of the log
by category (compute including recomputation, exposed tensor/context/expert-parallel
collectives, pipeline sends, data-parallel waits, optimizer), and the rest, when the stream
waited for another stage, is the bubble.  The parts therefore sum to the step time exactly.
"""

from __future__ import annotations

from typing import Sequence

from sim.event.engine import Engine, Entry
from sim.memory import memory_breakdown
from sim.ops import model_flops_per_step
from sim.result import Breakdown, StepResult

_CATS = ("compute", "tp", "cp", "ep", "pp", "dp", "optimizer")


def critical_unit(unit_end: Sequence[float]) -> int:
    """Index of the unit that ends last (the lowest index among ties)."""
    best = 0
    for i, t in enumerate(unit_end):
        if t > unit_end[best]:
            best = i
    return best


def breakdown_from_log(entries: Sequence[Entry], unit: int, step_s: float) -> Breakdown:
    """Blocking time of ``unit`` per category within ``[0, step_s]``; the rest is bubble."""
    sums = dict.fromkeys(_CATS, 0.0)
    recompute = 0.0
    for e in entries:
        if e.unit != unit or not e.blocking:
            continue
        lo, hi = max(0.0, e.start), min(step_s, e.end)
        if hi > lo:
            sums[e.cat] += hi - lo
            if e.recompute_s and e.end > e.start:
                recompute += e.recompute_s * (hi - lo) / (e.end - e.start)
    exposed = {k: sums[k] for k in ("tp", "cp", "ep", "pp", "dp")}
    total_exposed = sum(exposed.values())
    busy = sums["compute"] + total_exposed + sums["optimizer"]
    bubble = max(0.0, step_s - busy)
    return Breakdown(compute_s=sums["compute"], exposed_comm_s=total_exposed, bubble_s=bubble,
                     optimizer_s=sums["optimizer"], exposed_tp_s=exposed["tp"], exposed_cp_s=exposed["cp"],
                     exposed_ep_s=exposed["ep"], exposed_pp_s=exposed["pp"], exposed_dp_s=exposed["dp"],
                     recompute_s=recompute)


def step_result(eng: Engine, *, extra: dict[str, object]) -> StepResult:
    """The ``StepResult`` of a finished engine run."""
    from sim.analytic import plan_warnings

    sc = eng.sc
    plan = sc.plan
    model, cluster, s = plan.model, plan.cluster, plan.strategy
    crit = critical_unit(eng.unit_end)
    step = eng.unit_end[crit]
    bd = breakdown_from_log(eng.log, crit, step)
    mf = model_flops_per_step(model, s)
    replicas = s.tp * s.dp * s.cp
    recompute_flops = sum(st.recompute_flops_per_microbatch for st in sc.costs.stages) * sc.m * replicas
    peak = cluster.gpu.peak_flops_per_s("bf16")
    denom = step * cluster.num_gpus * peak
    mem = memory_breakdown(model, cluster, s, attention=plan.attention)
    warnings = plan_warnings(plan, mem.fits, bd.bubble_s / step if step else 0.0)
    if not sc.whatif.empty:
        warnings.append("what-if applied: " + _describe(sc.whatif))
    unit = sc.units[crit]
    info = {"mode": "explicit" if sc.explicit else "symmetric", "simulated_units": len(sc.units),
            "critical_rank": unit.rep_rank, "critical_stage": unit.stage,
            "passes": sum(1 for e in eng.log if e.cat == "compute"), "flows": eng.net.num_flows,
            "max_link_utilisation": eng.net.max_utilisation, "stage_end_s": _stage_ends(eng),
            "whatif": sc.whatif.as_dict()}
    info.update(extra)
    return StepResult(
        step_time_s=step, tokens_per_s=s.tokens_per_step / step, mfu=mf / denom,
        hfu=(mf + recompute_flops) / denom, model_flops_per_step=mf,
        hardware_flops_per_step=mf + recompute_flops, memory=mem, breakdown=bd,
        strategy=s.to_string(), engine="event", num_gpus=cluster.num_gpus, peak_flops_per_s=peak,
        warnings=tuple(warnings), extra={"event": info})


def _stage_ends(eng: Engine) -> list[float]:
    out = [0.0] * eng.sc.p
    for u in eng.sc.units:
        out[u.stage] = max(out[u.stage], eng.unit_end[u.index])
    return out


def _describe(w: object) -> str:
    parts = []
    for x in getattr(w, "stragglers", ()):
        parts.append(f"rank {x.rank} computes {x.slowdown_pct:g}% slower")
    for x in getattr(w, "slow_links", ()):
        parts.append(f"{x.target} links {x.slowdown_pct:g}% slower")
    lps = getattr(w, "layers_per_stage", None)
    if lps:
        parts.append("layers per stage " + ",".join(map(str, lps)) + " (memory reported for the even split)")
    return "; ".join(parts)
