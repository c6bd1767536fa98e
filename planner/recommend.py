"""``recommend``: search the strategy space, rank by an objective, verify, explain.

1. ``planner.search.search`` enumerates and prunes the space and times every candidate that
   fits with the fast analytic model (one search per GPU count when ``min_gpus`` allows fewer).
2. Candidates are ranked by the objective: ``throughput`` (tokens/s, the default), ``time``
   (time to train ``tokens``) or ``cost`` (GPU-hours x ``price_usd_per_hour`` from the GPU
   catalog).  With a fixed GPU count all three order plans the same way; they differ when
   ``min_gpus`` lets the search use fewer GPUs.  Plans within ``tie_tolerance`` (relative) of
   the best count as tied, and the simplest of them wins (``complexity``).
3. The top plans are re-simulated with ``sim.analytic.simulate_analytic`` for their full
   results (the search evaluated the same model over arrays, so the step times are equal) and
   re-ranked with the discrete-event engine (``sim.simulate.simulate(engine="event")``).
4. ``planner.explain`` says what bounds the winner and why the alternatives lose; when nothing
   fits, ``suggest`` re-runs the search with one change at a time (ZeRO-3, recomputation, more
   GPUs, a smaller batch, a GPU with more memory) and reports the changes that make it fit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from sim.analytic import simulate_analytic
from sim.simulate import simulate
from sim.compute import default_efficiency
from sim.framework import apply_framework, get_framework
from sim.errors import InputError
from sim.plan import Plan
from sim.result import StepResult
from sim.placement import strides
from sim.specs import ORDERS, Cluster, Model, Strategy

from planner.search import SearchResult, SearchSpace, search
from planner.uncertainty import Band, band_for

Objective = Literal["throughput", "time", "cost"]
OBJECTIVES: tuple[str, ...] = ("throughput", "time", "cost")


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """Framework behaviour the plans assume: extra ``Plan`` fields (attention kernel, ...) and
    whether gradient reduction overlaps backward.  ``from_framework`` reads a ``sim.framework``
    profile; the default is what ``planner simulate`` assumes without one."""

    plan_kwargs: tuple[tuple[str, object], ...] = ()
    dp_overlap: bool = True
    framework: str | None = None

    @property
    def kwargs(self) -> dict[str, object]:
        return dict(self.plan_kwargs)

    @property
    def attention(self) -> str:
        return str(self.kwargs.get("attention", "flash"))

    @classmethod
    def from_framework(cls, name: str | None, *, attention: str | None = None,
                       moe_imbalance: float | None = None, moe_dispatcher: str | None = None) -> "Settings":
        # no framework: the profile ``planner simulate`` assumes without one (``default``)
        fw = get_framework(name or "default")
        kw, overlap, fw_id = apply_framework({}, fw), fw.dp_overlap, (fw.id if name is not None else None)
        if attention is not None:
            kw["attention"] = attention
        if moe_imbalance is not None:
            kw["moe_imbalance"] = moe_imbalance
        if moe_dispatcher is not None:
            kw["moe_dispatcher"] = moe_dispatcher
        return cls(plan_kwargs=tuple(sorted(kw.items())), dp_overlap=overlap, framework=fw_id)


@dataclass(slots=True)
class RankedPlan:
    rank: int
    plan: Plan
    result: StepResult
    objective_value: float
    complexity: float
    fast_step_time_s: float
    analytic_step_time_s: float
    engine: str = "analytic"
    band: Band | None = None  # planner.uncertainty: where runs like it landed

    @property
    def strategy(self) -> Strategy:
        return self.plan.strategy

    @property
    def cluster(self) -> Cluster:
        return self.plan.cluster

    @property
    def num_gpus(self) -> int:
        return self.plan.cluster.num_gpus

    def to_dict(self, objective: "ObjectiveSpec") -> dict[str, object]:
        out = self.result.to_dict()
        out["strategy"] = self.strategy.to_string()
        out.update({"rank": self.rank, "num_gpus": self.num_gpus, "engine": self.engine,
                    "analytic_step_time_s": self.analytic_step_time_s, "complexity": self.complexity,
                    "objective_value": self.objective_value})
        out.update(objective.extras(self.result.step_time_s, self.strategy, self.num_gpus))
        if self.band is not None:
            out.update({"step_time_s_low": self.band.low(self.result.step_time_s),
                        "step_time_s_high": self.band.high(self.result.step_time_s),
                        "uncertainty": self.band.as_dict()})
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectiveSpec:
    kind: str = "throughput"
    tokens: float | None = None
    price_usd_per_hour: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise InputError("objective", self.kind, f"must be one of {', '.join(OBJECTIVES)}")
        if self.tokens is not None and (not math.isfinite(self.tokens) or self.tokens <= 0):
            raise InputError("tokens", self.tokens, "must be a positive number of tokens")
        if self.kind == "time" and self.tokens is None:
            raise InputError("tokens", None, "objective=time needs a token budget (--tokens)")

    @property
    def unit(self) -> str:
        return {"throughput": "s per token", "time": "s", "cost": "USD"}[self.kind]

    def values(self, step_time_s: np.ndarray, tokens_per_step: int, num_gpus: int) -> np.ndarray:
        """Objective (lower is better) for an array of step times."""
        per_token = step_time_s / tokens_per_step
        if self.kind == "throughput":
            return per_token
        steps = math.ceil(self.tokens / tokens_per_step) if self.tokens else 1.0 / tokens_per_step
        seconds = step_time_s * steps
        if self.kind == "time":
            return seconds
        assert self.price_usd_per_hour is not None
        return seconds / 3600.0 * num_gpus * self.price_usd_per_hour

    def extras(self, step_time_s: float, s: Strategy, num_gpus: int) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.tokens:
            steps = math.ceil(self.tokens / s.tokens_per_step)
            out["steps_to_train"] = steps
            out["time_to_train_s"] = steps * step_time_s
            if self.price_usd_per_hour is not None:
                out["cost_to_train_usd"] = steps * step_time_s / 3600.0 * num_gpus * self.price_usd_per_hour
        if self.price_usd_per_hour is not None:
            out["usd_per_million_tokens"] = step_time_s / s.tokens_per_step * 1e6 / 3600.0 * num_gpus \
                * self.price_usd_per_hour
        return out


@dataclass(slots=True)
class Recommendation:
    model: Model
    cluster: Cluster
    gbs: int
    seq_len: int
    objective: ObjectiveSpec
    settings: Settings
    space: SearchSpace
    searches: list[SearchResult]
    plans: list[RankedPlan]
    search_time_s: float
    ranking_engine: str
    ranking_note: str
    tie_tolerance: float
    warnings: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    explanation: dict[str, object] = field(default_factory=dict)
    suggestions: list[dict[str, object]] = field(default_factory=list)
    winner_margin: dict[str, object] = field(default_factory=dict)
    framework_gap: dict[str, object] = field(default_factory=dict)

    @property
    def considered(self) -> int:
        return sum(r.considered for r in self.searches)

    @property
    def evaluated(self) -> int:
        return sum(r.evaluated for r in self.searches)

    @property
    def rejected(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for r in self.searches:
            for k, v in r.rejected.items():
                total[k] = total.get(k, 0) + int(v)
        return dict(sorted(total.items(), key=lambda kv: -kv[1]))

    @property
    def best(self) -> RankedPlan | None:
        return self.plans[0] if self.plans else None

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model.name,
            "gpu": self.cluster.gpu.id,
            "num_gpus": self.cluster.num_gpus,
            "nic": self.cluster.nic.id,
            "topology": self.cluster.topology,
            "gpus_per_node": self.cluster.gpus_per_node,
            "nvlink_domain": self.cluster.nvlink_domain,
            "gbs": self.gbs,
            "seq_len": self.seq_len,
            "objective": {"kind": self.objective.kind, "tokens": self.objective.tokens,
                          "price_usd_per_hour": self.objective.price_usd_per_hour, "unit": self.objective.unit},
            "framework": self.settings.framework, "attention": self.settings.attention,
            "plans": [p.to_dict(self.objective) for p in self.plans],
            "candidates_considered": self.considered,
            "candidates_evaluated": self.evaluated,
            "rejected": self.rejected,
            "rejected_total": sum(self.rejected.values()),
            "gpu_counts_searched": list(dict.fromkeys(r.cluster.num_gpus for r in self.searches)),
            "search_time_s": self.search_time_s,
            "timings_s": self.timings_s,
            "ranking": {"engine": self.ranking_engine, "note": self.ranking_note,
                        "tie_tolerance": self.tie_tolerance},
            "explanation": self.explanation,
            "suggestions": self.suggestions,
            "winner_margin": self.winner_margin,
            "framework_gap": self.framework_gap,
            "warnings": self.warnings,
        }


# --------------------------------------------------------------------------- helpers

SCHEDULE_COMPLEXITY = {"1f1b": 0.0, "gpipe": 0.5, "interleaved": 1.0, "zero-bubble": 1.5}
RECOMPUTE_COMPLEXITY = {"none": 0.0, "selective": 0.5, "full": 1.0}


def complexity(s: Strategy, num_layers: int) -> float:
    """How many moving parts a plan has (lower is simpler): one per parallel dimension in use,
    interleaving, ZeRO stage, recomputation, schedule, fp8, offload (each offloaded kind, the
    NVMe device), and uneven layer splits."""
    c = float((s.tp > 1) + (s.pp > 1) + (s.cp > 1) + (s.ep > 1) + (s.vp > 1))
    c += 0.25 * s.zero + 0.5 * s.sp + RECOMPUTE_COMPLEXITY[s.recompute] + SCHEDULE_COMPLEXITY[s.schedule]
    c += 1.0 * (s.precision == "fp8")
    c += 1.0 * s.offload_optimizer + 0.5 * s.offload_params + 1.0 * s.offload_activations
    c += 0.5 * (s.offload_device == "nvme")
    c += 0.5 * bool(num_layers % (s.pp * s.vp) or s.pipeline_layout is not None)
    return c


def _tie_key(s: Strategy, num_layers: int) -> tuple:
    return (complexity(s, num_layers), s.tp * s.pp * s.cp * s.ep, s.vp, -s.mbs)


def cluster_with_gpus(cluster: Cluster, num_gpus: int) -> Cluster:
    """``cluster`` resized to ``num_gpus`` (a partial node shrinks the node and NVLink domain)."""
    gpn, domain = cluster.gpus_per_node, cluster.nvlink_domain
    if num_gpus < gpn:
        gpn = num_gpus
        domain = min(domain, num_gpus)
    server = cluster.server.with_slots(gpn) if cluster.server is not None else None  # PCIe: the first slots
    return replace(cluster, num_gpus=num_gpus, gpus_per_node=gpn, nvlink_domain=domain, server=server)


def gpu_counts(cluster: Cluster, min_gpus: int | None) -> list[int]:
    """``num_gpus`` and its halvings down to ``min_gpus`` that still fill whole nodes."""
    n = cluster.num_gpus
    if min_gpus is None:
        return [n]
    if isinstance(min_gpus, bool) or not isinstance(min_gpus, int) or min_gpus < 1 or min_gpus > n:
        raise InputError("min-gpus", min_gpus, f"must be an integer in [1, {n}]")
    out = [n]
    k = n
    while k % 2 == 0 and k // 2 >= min_gpus:
        k //= 2
        if k >= cluster.gpus_per_node and k % cluster.gpus_per_node:
            break
        out.append(k)
    return out


# --------------------------------------------------------------------------- recommend


def framework_space(space: SearchSpace, fw_id: str, cluster: Cluster) -> SearchSpace:
    """``space`` cut down to what framework ``fw_id`` can run (``sim.framework.Capabilities``):
    its parallel dimensions, ZeRO/FSDP stages, schedules, precisions, and the first of its fp8
    recipes that runs on the GPU (fp8 is not searched when none does).  A restriction the user
    gave that the framework cannot meet is an ``InputError`` naming the flag."""
    fw = get_framework(fw_id)
    caps = fw.capabilities
    ch: dict[str, object] = {}

    def cut(name: str, values: tuple, allowed: tuple) -> tuple:
        kept = tuple(v for v in values if v in allowed)
        if not kept:
            raise InputError(name, ",".join(map(str, values)), f"the {fw.id} framework profile runs only "
                             f"{', '.join(map(str, allowed)) or 'none'} (catalogs/frameworks.yaml capabilities)")
        return kept

    for dim in ("tp", "pp", "cp", "ep"):
        if not getattr(caps, dim):
            ch[dim] = cut(dim, getattr(space, dim) or (1,), (1,))
    if not caps.sp:
        ch["sp"] = cut("sp", space.sp, (False,))
    if not caps.etp:
        ch["etp"] = ()  # experts split as the attention's tp only
    ch["zero"] = cut("zero", space.zero, caps.zero)
    ch["layouts"] = caps.pipeline_layout  # refined around the best layouts (layout_searches)
    ch["offload"] = cut("offload", space.offload, caps.offloads)
    ch["offload_device"] = cut("offload-device", space.offload_device, caps.offload_devices)
    if caps.pp and caps.schedules:
        ch["schedule"] = cut("schedule", space.schedule, caps.schedules)
    else:
        ch["pp"], ch["schedule"] = cut("pp", space.pp or (1,), (1,)), ("1f1b",)
    eff = default_efficiency()
    recipes = [r for r in caps.fp8_recipes
               if not eff.fp8_recipe(r).architectures or cluster.gpu.architecture in eff.fp8_recipe(r).architectures]
    allowed = tuple(p for p in caps.precisions if p != "fp8" or recipes)
    ch["precision"] = cut("precision", space.precisions(cluster), allowed)
    if recipes:
        ch["fp8_recipe"] = recipes[0]
    return space.replace(**ch)


LAYOUT_REFINE = 3  # best distinct pipelined layouts whose pipeline layouts recommend searches


def layout_searches(searches: list[SearchResult], model: Model, *, gbs: int, seq_len: int, space: SearchSpace,
                    settings: Settings, objective: "ObjectiveSpec", tokens_per_step: int,
                    eff: object) -> list[SearchResult]:
    """Pipeline layouts (``SearchSpace.layouts``) for the ``LAYOUT_REFINE`` best distinct
    pipelined layouts of ``searches``: each layout's degrees with the balanced layouts of every
    ``vp`` the default split cannot interleave (``planner.search``).  Pricing a layout runs the
    interleaved schedule pass by pass (``sim.interleave``), too slow for every layout of the
    space; the best layouts are where a better split pays."""
    ranked: list[tuple[float, int, object]] = []
    for k, r in enumerate(searches):
        if not r.evaluated:
            continue
        obj = objective.values(r.candidates.step_time_s, tokens_per_step, r.cluster.num_gpus)
        for i in np.argsort(obj, kind="stable")[:2000]:
            lay = r.candidates.layouts[int(r.candidates.layout_id[int(i)])]
            if lay.pp > 1:
                ranked.append((float(obj[int(i)]), k, lay))
    ranked.sort(key=lambda t: t[0])
    seen: list[tuple] = []
    out = []
    for _, k, lay in ranked:
        key = (k, lay.tp, lay.cp, lay.pp, lay.ep, lay.etp, lay.precision)
        if key in seen:
            continue
        seen.append(key)
        r = searches[k]
        sub = space.replace(tp=(lay.tp,), cp=(lay.cp,), pp=(lay.pp,), ep=(lay.ep,),
                            etp=(lay.etp,) if lay.etp is not None else (), precision=(lay.precision,),
                            layouts=True, layouts_only=True)
        try:
            out.append(search(model, r.cluster, gbs=gbs, seq_len=seq_len, space=sub, plan_kwargs=settings.kwargs,
                              dp_overlap=settings.dp_overlap, eff=eff, workers=1))  # type: ignore[arg-type]
        except InputError:
            pass
        if len(seen) >= LAYOUT_REFINE:
            break
    return out


def recommend(model: Model, cluster: Cluster, *, gbs: int, seq_len: int, space: SearchSpace | None = None,
              objective: ObjectiveSpec | None = None, settings: Settings | None = None, top: int = 5,
              rerank: int | None = None, rerank_budget_s: float = 3.0, min_gpus: int | None = None,
              tie_tolerance: float = 1e-3, explain: bool = True, suggest: bool = True,
              workers: int | None = None) -> Recommendation:
    """Search, rank, verify and explain (module docstring).  ``rerank``: how many of the top
    plans the event engine re-ranks (default ``top``; 0 disables it), within ``rerank_budget_s``
    seconds of event simulation."""
    t0 = time.perf_counter()
    space = space or SearchSpace()
    objective = objective or ObjectiveSpec()
    settings = settings or Settings()
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 100:
        raise InputError("top", top, "must be an integer in [1, 100]")
    if not (isinstance(tie_tolerance, (int, float)) and 0 <= tie_tolerance < 1):
        raise InputError("tie-tolerance", tie_tolerance, "must be in [0, 1)")
    if objective.kind == "cost" and objective.price_usd_per_hour is None:
        price = cluster.gpu.price_usd_per_hour
        if price is None:
            raise InputError("objective", "cost", f"{cluster.gpu.id} has no price_usd_per_hour in the GPU catalog")
        objective = replace(objective, price_usd_per_hour=price)
    elif objective.price_usd_per_hour is None and cluster.gpu.price_usd_per_hour is not None:
        objective = replace(objective, price_usd_per_hour=cluster.gpu.price_usd_per_hour)
    eff = default_efficiency()
    tokens_per_step = gbs * seq_len
    full_space = space
    if settings.framework is not None:
        space = framework_space(space, settings.framework, cluster)

    searches = []
    for n in gpu_counts(cluster, min_gpus):
        cl = cluster if n == cluster.num_gpus else cluster_with_gpus(cluster, n)
        searches.append(search(model, cl, gbs=gbs, seq_len=seq_len, space=space.replace(layouts=False),
                               plan_kwargs=settings.kwargs, dp_overlap=settings.dp_overlap, eff=eff, workers=workers))
    if space.layouts:  # pipeline layouts, around the best pipelined layouts found
        searches += layout_searches(searches, model, gbs=gbs, seq_len=seq_len, space=space, settings=settings,
                                    objective=objective, tokens_per_step=gbs * seq_len, eff=eff)

    # Objective over every timed candidate of every search.
    objs, src, idx = [], [], []
    for k, r in enumerate(searches):
        if r.evaluated:
            objs.append(objective.values(r.candidates.step_time_s, tokens_per_step, r.cluster.num_gpus))
            src.append(np.full(r.evaluated, k, dtype=np.int32))
            idx.append(np.arange(r.evaluated))
    rec = Recommendation(model=model, cluster=cluster, gbs=gbs, seq_len=seq_len, objective=objective,
                         settings=settings, space=space, searches=searches, plans=[], search_time_s=0.0,
                         ranking_engine="analytic", ranking_note="", tie_tolerance=float(tie_tolerance))
    if not objs:
        rec.search_time_s = time.perf_counter() - t0
        rec.ranking_note = "no candidate fits"
        if explain:
            from planner.explain import explain_infeasible

            rec.explanation = explain_infeasible(rec)
        if suggest:
            rec.suggestions = suggest_fixes(model, cluster, gbs=gbs, seq_len=seq_len, space=space, settings=settings,
                                            rejected_batch=rec.rejected.get("batch", 0) > 0)
        return rec
    obj = np.concatenate(objs)
    src_a, idx_a = np.concatenate(src), np.concatenate(idx)

    # Shortlist: the best few hundred by objective, plus every plan tied with the best.
    n_short = min(obj.size, max(top * 20, 200))
    short = np.argpartition(obj, n_short - 1)[:n_short] if n_short < obj.size else np.arange(obj.size)
    best = float(obj.min())
    tied = np.flatnonzero(obj <= best * (1 + tie_tolerance))
    if tied.size > 5000:
        tied = tied[np.argsort(obj[tied], kind="stable")[:5000]]
    short = np.unique(np.concatenate([short, tied]))

    def decode(j: int) -> tuple[Strategy, SearchResult, int]:
        r = searches[int(src_a[j])]
        return r.strategy(int(idx_a[j])), r, int(idx_a[j])

    # What the framework cannot run and its search space could not exclude (``framework_space``:
    # tensor parallelism without SP where TP implies SP, a zero-bubble schedule it runs only
    # interleaved) leaves the shortlist here.
    caps = get_framework(settings.framework).capabilities if settings.framework is not None else None
    entries = []
    for j in short:
        s, r, i = decode(int(j))
        if caps is not None and caps.refusal(s) is not None:
            continue
        entries.append((float(obj[j]), _tie_key(s, model.num_layers), s, r, i))
    if not entries:
        raise InputError("framework", settings.framework, "none of the best plans the search found is one it runs; "
                         "restrict the search (--tp, --sp, --schedule, ...) to what it supports")
    entries.sort(key=lambda e: (e[0], e[1]))
    best = entries[0][0]
    winner_pool = [e for e in entries if e[0] <= best * (1 + tie_tolerance)]
    winner = min(winner_pool, key=lambda e: (e[1], e[0]))
    ordered = [winner] + [e for e in entries if e is not winner]

    # The shown plans with their full results (breakdown, memory, warnings): the same model the
    # search evaluated, called for one plan.
    ranked: list[RankedPlan] = []
    for e in ordered[:top]:
        o, key, s, r, i = e
        fm = r.fastmodel
        plan = fm.plan(s)
        res = simulate_analytic(plan, net=fm.net, eff=fm.eff)
        value = float(objective.values(np.array([res.step_time_s]), tokens_per_step, r.cluster.num_gpus)[0])
        ranked.append(RankedPlan(rank=0, plan=plan, result=res, objective_value=value, complexity=key[0],
                                 fast_step_time_s=float(r.candidates.step_time_s[i]),
                                 analytic_step_time_s=res.step_time_s))
    ranked = _with_rank_orders(ranked, caps, objective, tokens_per_step, top)

    rec.search_time_s = time.perf_counter() - t0
    rec.timings_s["search_s"] = sum(r.search_time_s for r in searches)
    rec.timings_s["rank_and_verify_s"] = rec.search_time_s - rec.timings_s["search_s"]

    # Event-engine re-ranking.
    t1 = time.perf_counter()
    k_rerank = top if rerank is None else max(0, min(int(rerank), len(ranked)))
    if k_rerank:
        ranked, note, used = _rerank_event(ranked, k_rerank, tie_tolerance, objective, tokens_per_step, rerank_budget_s)
        rec.ranking_engine = "event" if used else "analytic"
    else:
        note = "event re-ranking disabled; ranked with the analytic model"
    rec.ranking_note = note
    for n, p in enumerate(ranked, 1):
        p.rank = n
        p.band = band_for(p.plan, settings.framework or "default")
    rec.plans = ranked
    if len(ranked) >= 2:
        b, margin = ranked[0].band, ranked[1].objective_value / ranked[0].objective_value - 1
        half = (b.q90 - b.q10) / 2
        rec.winner_margin = {"margin": margin, "band_half_width": half, "within_band": margin < half}
        if margin < half:
            rec.warnings.append(f"#1 leads #2 by {margin:.1%}, inside the +-{half:.0%} 80% band of the {b.runs} "
                                f"published runs like it ({b.cls}): the two are not told apart by this model; "
                                "measure both before committing")
    rec.timings_s["rerank_s"] = time.perf_counter() - t1
    if settings.framework is not None and ranked:
        t3 = time.perf_counter()
        rec.framework_gap = _framework_gap(rec, model, cluster, full_space, min_gpus, workers)
        rec.timings_s["framework_gap_s"] = time.perf_counter() - t3
        if rec.framework_gap.get("gap", 0.0) > tie_tolerance:
            g = rec.framework_gap
            rec.warnings.append(f"{settings.framework} cannot run the overall best plan ({g['best_overall_strategy']}: "
                                f"{g['why']}); its best is {g['gap']:.1%} slower")
    if explain:
        t2 = time.perf_counter()
        from planner.explain import explain_recommendation

        rec.explanation = explain_recommendation(rec)
        rec.timings_s["explain_s"] = time.perf_counter() - t2
    rec.timings_s["total_s"] = time.perf_counter() - t0
    return rec


def _with_rank_orders(ranked: list[RankedPlan], caps, objective: ObjectiveSpec, tokens_per_step: int,
                      top: int) -> list[RankedPlan]:
    """The winning plan in the other rank orders the framework allows (``Strategy.order``: which
    dimension's groups are consecutive ranks and share the scale-up fabric), each priced by
    ``simulate_analytic`` on its real placement; an order that beats it joins the ranking.
    The vectorised search prices the default order (tp innermost) only."""
    orders = caps.orders if caps is not None else ORDERS
    extra: list[RankedPlan] = []
    for p in ranked[:1]:  # the winner: each order re-routes the network (seconds on 10^4 GPUs)
        s = p.plan.strategy
        seen = {tuple(sorted(strides(s).items()))}
        for order in orders:
            try:
                alt = replace(s, order=order)
                key = tuple(sorted(strides(alt).items()))
                if key in seen:
                    continue  # the same placement (dimensions of size 1 do not move ranks)
                seen.add(key)
                plan = replace(p.plan, strategy=alt)
                res = simulate_analytic(plan)
            except InputError:
                continue
            value = float(objective.values(np.array([res.step_time_s]), tokens_per_step, p.num_gpus)[0])
            if res.fits_memory and value < p.objective_value:
                extra.append(RankedPlan(rank=0, plan=plan, result=res, objective_value=value, complexity=p.complexity,
                                        fast_step_time_s=p.fast_step_time_s, analytic_step_time_s=res.step_time_s))
    if not extra:
        return ranked
    return sorted(ranked + extra, key=lambda q: q.objective_value)[:top]


def _framework_gap(rec: "Recommendation", model: Model, cluster: Cluster, space: SearchSpace,
                   min_gpus: int | None, workers: int | None) -> dict[str, object]:
    """The overall best plan (the same framework mechanisms, every capability) against the
    framework's best, both by the analytic model: what the framework's limits cost."""
    fw_id = rec.settings.framework
    assert fw_id is not None and rec.plans
    overall = recommend(model, cluster, gbs=rec.gbs, seq_len=rec.seq_len, space=space, objective=rec.objective,
                        settings=replace(rec.settings, framework=None), top=1, rerank=0, min_gpus=min_gpus,
                        explain=False, suggest=False, workers=workers)
    mine, best = rec.plans[0], overall.best
    if best is None:
        return {}
    tokens = rec.gbs * rec.seq_len
    obj = [float(rec.objective.values(np.array([p.analytic_step_time_s]), tokens, p.num_gpus)[0]) for p in (mine, best)]
    why = get_framework(fw_id).capabilities.refusal(best.strategy)
    return {"framework": fw_id, "best_overall_strategy": best.strategy.to_string(),
            "best_overall_step_time_s": best.analytic_step_time_s, "framework_step_time_s": mine.analytic_step_time_s,
            "gap": max(0.0, obj[0] / obj[1] - 1) if why is not None else 0.0,
            "why": f"{why[0]}={why[1]} {why[2]}" if why is not None else "it can"}


def _reorder(plans: list[RankedPlan], tol: float) -> list[RankedPlan]:
    plans = sorted(plans, key=lambda p: p.objective_value)
    best = plans[0].objective_value
    pool = [p for p in plans if p.objective_value <= best * (1 + tol)]
    win = min(pool, key=lambda p: (p.complexity, p.objective_value))
    return [win] + [p for p in plans if p is not win]


def _rerank_event(plans: list[RankedPlan], k: int, tol: float, objective: ObjectiveSpec, tokens_per_step: int,
                  budget_s: float) -> tuple[list[RankedPlan], str, bool]:
    """Re-simulate the top ``k`` with the event engine (as many as fit in ``budget_s``) and
    re-order them; returns (plans, note, whether the event engine ranked them)."""

    head = plans[:k]
    out = []
    t0 = time.perf_counter()
    for p in head:
        elapsed = time.perf_counter() - t0
        if out and elapsed + elapsed / len(out) > budget_s:
            break
        try:
            res = simulate(p.plan, engine="event")
        except InputError as exc:  # a plan the event engine cannot schedule (docs/recommend.md)
            return plans, (f"event engine cannot schedule {p.strategy.to_string()} ({exc}); "
                           "ranked with the analytic model"), False
        value = float(objective.values(np.array([res.step_time_s]), tokens_per_step, p.num_gpus)[0])
        out.append(replace(p, result=res, objective_value=value, engine="event"))
    if len(out) < 2 and k >= 2:
        return plans, (f"event engine too slow here ({time.perf_counter() - t0:.1f} s for one plan, budget "
                       f"{budget_s:g} s): ranked with the analytic model"), False
    done = len(out)
    note = f"top {done} re-ranked with the event engine"
    if done < k:
        note += f" ({k - done} more did not fit the {budget_s:g} s budget and keep their analytic rank)"
    return _reorder(out, tol) + plans[done:], note, True


# --------------------------------------------------------------------------- nothing fits


def simplest_best(r: SearchResult, num_layers: int, tie_tolerance: float = 1e-3) -> int:
    """The candidate of ``r`` that ``recommend`` would pick by throughput: the simplest of those
    within ``tie_tolerance`` of the fastest."""
    t = r.candidates.step_time_s
    tied = np.flatnonzero(t <= float(t.min()) * (1 + tie_tolerance))
    tied = tied[np.argsort(t[tied], kind="stable")[:5000]]
    return int(min(tied, key=lambda i: (_tie_key(r.strategy(int(i)), num_layers), float(t[i]))))


def suggest_fixes(model: Model, cluster: Cluster, *, gbs: int, seq_len: int, space: SearchSpace,
                  settings: Settings, max_factor: int = 8, rejected_batch: bool = False) -> list[dict[str, object]]:
    """Changes that make some plan fit, each verified by re-running the search.  With
    ``rejected_batch`` (the batch did not divide) a larger batch and fewer GPUs are tried too."""
    from sim.catalog import list_gpus

    tries: list[tuple[str, str, dict]] = []
    if 3 not in space.zero:
        tries.append(("zero", "allow ZeRO-3 / FSDP (shard weights, gradients and optimizer states)",
                      {"space": space.replace(zero=(0, 1, 2, 3))}))
    if not {"optimizer", "params"} <= set(space.offload):
        tries.append(("offload", "allow offloading optimizer states (and parameters) to host memory",
                      {"space": space.replace(offload=tuple(dict.fromkeys(space.offload + ("none", "optimizer",
                                                                                            "params"))))}))
    if "full" not in space.recompute:
        tries.append(("recompute", "allow full activation recomputation",
                      {"space": space.replace(recompute=tuple(space.recompute) + ("full",))}))
    if any(getattr(space, d) is not None for d in ("tp", "pp", "cp")):
        tries.append(("model_parallel", "let the search choose tp, pp and cp",
                      {"space": space.replace(tp=None, pp=None, cp=None)}))
    if space.mbs is not None and 1 not in space.mbs:
        tries.append(("mbs", "allow micro-batch 1", {"space": space.replace(mbs=tuple(space.mbs) + (1,))}))
    smaller = sorted({b for b in (1 << (gbs.bit_length() - 1), gbs // 2) if 0 < b < gbs}, reverse=True)
    for b in smaller:
        tries.append(("gbs", f"a smaller global batch: gbs={b}", {"gbs": b}))
    if rejected_batch:
        for k in (2, 4, 8):
            tries.append(("gbs_larger", f"a larger global batch: gbs={gbs * k}", {"gbs": gbs * k}))
        for k in (2, 4, 8):
            n = cluster.num_gpus // k
            if n >= 1 and cluster.num_gpus % k == 0:
                tries.append(("fewer_gpus", f"fewer GPUs: {n}", {"cluster": lambda n=n: cluster_with_gpus(cluster, n)}))
    k = 2
    while k <= max_factor:
        n = cluster.num_gpus * k
        tries.append(("num_gpus", f"more GPUs: {n}", {"cluster": lambda n=n: cluster_with_gpus(cluster, n)}))
        k *= 2
    bigger = sorted((g for g in list_gpus() if g.hbm_bytes > cluster.gpu.hbm_bytes
                     and g.form_factor == cluster.gpu.form_factor), key=lambda g: g.hbm_bytes)
    for g in bigger[:2]:
        tries.append(("gpu", f"a GPU with more memory: {g.id} ({g.hbm_bytes / 2**30:.0f} GiB)",
                      {"cluster": lambda g=g: replace(cluster, gpu=g)}))

    out: list[dict[str, object]] = []
    done: set[str] = set()
    for kind, text, change in tries:
        if kind in done:
            continue
        try:
            cl = change["cluster"]() if "cluster" in change else cluster
            r = search(model, cl, gbs=change.get("gbs", gbs), seq_len=seq_len, space=change.get("space", space),
                       plan_kwargs=settings.kwargs, dp_overlap=settings.dp_overlap)
        except InputError:
            continue  # e.g. more GPUs than a cluster may have: not a suggestion
        if not r.evaluated:
            continue
        done.add(kind)
        j = simplest_best(r, model.num_layers)
        out.append({"change": kind, "what": text, "verified": True,
                    "num_gpus": r.cluster.num_gpus, "gpu": r.cluster.gpu.id, "gbs": r.gbs,
                    "best_strategy": r.strategy(j).to_string(),
                    "step_time_s": float(r.candidates.step_time_s[j]),
                    "memory_peak_bytes": float(r.candidates.memory_peak_bytes[j]),
                    "candidates_evaluated": r.evaluated})
    return out
