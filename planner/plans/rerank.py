"""Re-ranking the shown plans: the event engine on the top plans within a budget of scheduled
passes (a cost model, never a clock: the same answer on a busy machine), ties going to the
simpler plan, and the winner in the other rank orders its framework builds.  Called by
``planner.plans.recommend``."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from planner.exports import launchable
from sim.base.errors import InputError
from sim.cost.framework import get_framework
from sim.data.specs import Strategy
from sim.engines.analytic import simulate_analytic
from sim.engines.simulate import simulate
from sim.net.placement import strides

if TYPE_CHECKING:
    from planner.plans.recommend import ObjectiveSpec, RankedPlan


DEFAULT_RERANK_PASSES = 40_000  # scheduled passes of event-engine re-ranking: ~2-8 s here at 0.05-0.2 ms a pass


def event_passes(s: Strategy) -> int:
    """The cost model of one event-engine simulation: the forward and backward passes it
    schedules (one unit per pipeline stage, ``vp`` chunks, every micro-batch)."""
    return 2 * s.pp * s.vp * s.num_microbatches


def with_rank_orders(ranked: list[RankedPlan], objective: ObjectiveSpec, tokens_per_step: int,
                      top: int) -> list[RankedPlan]:
    """The winning plan in the other rank orders its framework allows (``Strategy.order``:
    which dimension's groups are consecutive ranks and share the scale-up fabric), each priced
    by ``simulate_analytic`` on its real placement; an order that beats it joins the ranking.
    The vectorised search prices the default order (tp innermost) only."""
    extra: list[RankedPlan] = []
    for p in ranked[:1]:  # the winner: each order re-routes the network (seconds on 10^4 GPUs)
        s = p.plan.strategy
        seen = {tuple(sorted(strides(s).items()))}
        for order in get_framework(p.framework).capabilities.orders:
            try:
                alt = replace(s, order=order)
                key = tuple(sorted(strides(alt).items()))
                if key in seen:
                    continue  # the same placement (dimensions of size 1 do not move ranks)
                seen.add(key)
                plan = replace(p.plan, strategy=alt).checked()
                res = simulate_analytic(plan)
            except InputError:
                continue
            est = p.band.estimate(res.step_time_s) if p.band is not None else res.step_time_s
            value = float(objective.values(np.array([est]), tokens_per_step, p.num_gpus)[0])
            if res.fits_memory and value < p.objective_value and launchable(plan, p.framework):
                extra.append(replace(p, rank=0, plan=plan, result=res, objective_value=value, engine="analytic",
                                     analytic_step_time_s=res.step_time_s))
    if not extra:
        return ranked
    return sorted(ranked + extra, key=lambda q: q.objective_value)[:top]


def reorder_ties(plans: list[RankedPlan], tol: float) -> list[RankedPlan]:
    plans = sorted(plans, key=lambda p: p.objective_value)
    best = plans[0].objective_value
    pool = [p for p in plans if p.objective_value <= best * (1 + tol)]
    win = min(pool, key=lambda p: (p.complexity, p.objective_value))
    return [win] + [p for p in plans if p is not win]


def rerank_event(plans: list[RankedPlan], k: int, tol: float, objective: ObjectiveSpec, tokens_per_step: int,
                  budget_passes: int) -> tuple[list[RankedPlan], str, bool]:
    """Re-simulate the top ``k`` with the event engine, in order, while their scheduled passes
    (``event_passes``, a cost model) fit in ``budget_passes``, and re-order them; returns
    (plans, note, whether the event engine ranked them).  Deterministic: nothing reads a clock."""
    head = plans[:k]
    out = []
    spent = 0
    for p in head:
        cost = event_passes(p.strategy)
        if out and spent + cost > budget_passes:
            break
        try:
            res = simulate(p.plan, engine="event")
        except InputError as exc:  # a plan the event engine cannot schedule (docs/recommend.md)
            return plans, (f"event engine cannot schedule {p.strategy.to_string()} ({exc}); "
                           "ranked with the analytic model"), False
        spent += cost
        est = p.band.estimate(res.step_time_s) if p.band is not None else res.step_time_s
        value = float(objective.values(np.array([est]), tokens_per_step, p.num_gpus)[0])
        out.append(replace(p, result=res, objective_value=value, engine="event"))
    done = len(out)
    note = f"top {done} re-ranked with the event engine ({spent:,} scheduled passes)"
    if done < k:
        note += (f"; {k - done} more would exceed the budget of {budget_passes:,} passes (--rerank-budget) and "
                 "keep their analytic rank")
    return reorder_ties(out, tol) + plans[done:], note, True
