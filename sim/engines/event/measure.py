"""From the event log to the INTERFACE result: step time, breakdown, utilisation.

The step time is the latest unit's end of step (its optimizer done and, for ZeRO-1/2, the
parameter all-gather no longer in the way of the next forward).  The breakdown is measured on
the log, the way one would read a profile: the passes of the *busiest* unit (the pipeline
bottleneck: most time inside its passes, i.e. compute including recomputation and the
tensor/context/expert-parallel collectives, sends and ZeRO-3 gathers it waited for), then the
end of step of the *critical* unit, the one that finishes last (waiting for its gradient
reduction, optimizer, parameter all-gather).  What is left of the step is the bubble: the
bottleneck idle for lack of input.  The parts sum to the step time exactly.  (When the two
units' parts would exceed the step, which needs a very lopsided pipeline, the critical unit's
own timeline is used.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from sim.engines.analytic import plan_warnings
from sim.cost.costs import offload_report
from sim.cost.memory import plan_memory
from sim.engines.result import Breakdown, StepResult, step_result

if TYPE_CHECKING:  # the engine imports this module
    from sim.engines.event.engine import Engine, Entry

_CATS = ("compute", "tp", "cp", "ep", "pp", "dp", "offload", "optimizer")


def critical_unit(unit_end: Sequence[float]) -> int:
    """Index of the unit that ends last (the lowest index among ties)."""
    best = 0
    for i, t in enumerate(unit_end):
        if t > unit_end[best]:
            best = i
    return best


def _sums(entries: Sequence[Entry], step_s: float) -> dict[int, tuple[dict[str, float], dict[str, float], float]]:
    """Per unit: (blocking seconds per category inside passes, after the passes, recompute)."""
    out: dict[int, tuple[dict[str, float], dict[str, float], float]] = {}
    for e in entries:
        if not e.blocking:
            continue
        lo, hi = max(0.0, e.start), min(step_s, e.end)
        if hi <= lo:
            continue
        rec = out.get(e.unit)
        if rec is None:
            rec = out[e.unit] = (dict.fromkeys(_CATS, 0.0), dict.fromkeys(_CATS, 0.0), 0.0)
        (rec[0] if e.op else rec[1])[e.cat] += hi - lo
        if e.recompute_s:
            out[e.unit] = (rec[0], rec[1], rec[2] + e.recompute_s * (hi - lo) / (e.end - e.start))
    return out


def breakdown_from_log(entries: Sequence[Entry], unit_end: Sequence[float]) -> tuple[Breakdown, int, int]:
    """``(breakdown, critical unit, busiest unit)`` of a run (module docstring)."""
    crit = critical_unit(unit_end)
    step = unit_end[crit]
    sums = _sums(entries, step)
    empty = (dict.fromkeys(_CATS, 0.0), dict.fromkeys(_CATS, 0.0), 0.0)
    busiest = crit
    best = -1.0
    for u in range(len(unit_end)):
        busy = sum(sums.get(u, empty)[0].values())
        if busy > best * (1 + 1e-12):
            best, busiest = busy, u
    passes, recompute = sums.get(busiest, empty)[0], sums.get(busiest, empty)[2]
    tail = sums.get(crit, empty)[1]
    parts = {k: passes[k] + tail[k] for k in _CATS}
    if sum(parts.values()) > step * (1 + 1e-9):
        busiest = crit
        c = sums.get(crit, empty)
        parts = {k: c[0][k] + c[1][k] for k in _CATS}
        recompute = c[2]
    exposed = {k: parts[k] for k in ("tp", "cp", "ep", "pp", "dp", "offload")}
    total_exposed = sum(exposed.values())
    bubble = max(0.0, step - parts["compute"] - total_exposed - parts["optimizer"])
    bd = Breakdown(compute_s=parts["compute"], exposed_comm_s=total_exposed, bubble_s=bubble,
                   optimizer_s=parts["optimizer"], exposed_tp_s=exposed["tp"], exposed_cp_s=exposed["cp"],
                   exposed_ep_s=exposed["ep"], exposed_pp_s=exposed["pp"], exposed_dp_s=exposed["dp"],
                   exposed_offload_s=exposed["offload"], recompute_s=recompute)
    return bd, crit, busiest


def engine_result(eng: Engine, *, extra: dict[str, object]) -> StepResult:
    """The ``StepResult`` of a finished engine run."""

    sc = eng.sc
    plan = sc.plan
    s = plan.strategy
    bd, crit, busiest = breakdown_from_log(eng.log, eng.unit_end)
    step = eng.unit_end[crit]
    replicas = s.tp * s.dp * s.cp
    recompute_flops = sum(st.recompute_flops_per_microbatch for st in sc.costs.stages) * sc.m * replicas
    mem = plan_memory(plan)
    warnings = plan_warnings(plan, mem, bd.bubble_s / step if step else 0.0)
    if not sc.whatif.empty:
        warnings.append("what-if applied: " + _describe(sc.whatif))
    unit = sc.units[crit]
    info = {"mode": "explicit" if sc.explicit else "symmetric", "simulated_units": len(sc.units),
            "critical_rank": unit.rep_rank, "critical_stage": unit.stage,
            "bottleneck_rank": sc.units[busiest].rep_rank, "bottleneck_stage": sc.units[busiest].stage,
            "passes": len({(e.unit, e.op) for e in eng.log if e.cat == "compute" and e.op}),
            "flows": eng.net.num_flows,
            "stage_end_s": _stage_ends(eng),
            "whatif": sc.whatif.as_dict()}
    info.update(extra)
    return step_result(plan, step_time_s=step, breakdown=bd, memory=mem, recompute_flops_per_step=recompute_flops,
                       engine="event", warnings=warnings,
                       extra={"event": info, **({"offload": offload_report(plan)} if s.offload != "none" else {})})


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
