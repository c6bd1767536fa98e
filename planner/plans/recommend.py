"""``recommend``: search the strategy space, rank by an objective, verify, explain.

1. ``planner.plans.search.search`` enumerates and prunes the space and times every candidate that
   fits with the fast analytic model, once per framework profile the plans may assume (with no
   ``--framework``: the profiles ``searched_by_default``, megatron-core, torchtitan and
   megatron-deepspeed, each over what it runs, ``framework_space``) and per GPU count when
   ``min_gpus`` allows fewer.  Precision is the user's: bf16 (fp16 where the GPU has no bf16)
   unless the space lists others.  A plan fits when its predicted peak leaves
   ``memory_headroom`` of the GPU free (default: the memory model's measured error,
   ``planner.fitting.uncertainty.memory_headroom``).
2. Candidates are ranked by the objective of the **calibrated estimate** (the model's step x the
   bias of published runs like it, ``planner.fitting.uncertainty``): ``throughput`` (tokens/s, the
   default), ``time`` (time to train ``tokens``) or ``cost`` (GPU-hours x
   ``price_usd_per_hour``).  Plans within ``tie_tolerance`` (relative) of the best count as
   tied, and the simplest of them wins (``complexity``; then the framework listed first).
3. The top plans are re-simulated with ``sim.engines.analytic.simulate_analytic`` for their full
   results (the search evaluated the same model over arrays, so the step times are equal) and
   the first ``rerank`` are re-ranked with the discrete-event engine within a budget of
   scheduled passes (a cost model, not seconds: the ranking does not depend on the machine's
   load).  Without fp8 in the space, the winner is priced in fp8 too and reported as an
   alternative when it would be faster.
4. ``planner.plans.explain`` says what bounds the winner and why the alternatives lose; when nothing
   fits, ``suggest`` re-runs the search with one change at a time (ZeRO-3, recomputation, more
   GPUs, a smaller batch, a GPU with more memory, more host memory) and reports the changes
   that make it fit (``planner.plans.suggest``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Literal

import numpy as np

from sim.engines.analytic import simulate_analytic
from sim.layers.compute import default_efficiency
from sim.cost.costs import default_network
from sim.cost.framework import Framework, check_attention, default_frameworks_for, fp8_recipe_for, get_framework
from sim.base.errors import InputError
from sim.cost.plan import Plan
from sim.engines.result import StepResult
from sim.engines.run import RunChoices, plan_kwargs
from sim.data.runtime import nccl_version
from sim.data.hardware import Cluster
from sim.data.specs import Model, Strategy
from sim.base.units import fmt_s

from planner.plans.explain import bound
from planner.exports import launchable
from planner.plans.rerank import DEFAULT_RERANK_PASSES, rerank_event, with_rank_orders
from planner.plans.search import SearchResult, SearchSpace, search
from planner.fitting.uncertainty import (Band, above_published_note, band_for, band_from, headline, memory_headroom,
                                         stored_table)

Objective = Literal["throughput", "time", "cost"]
OBJECTIVES: tuple[str, ...] = ("throughput", "time", "cost")


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """The framework profiles the plans may assume and the user's overrides of their mechanisms
    (``sim.engines.run.RunChoices``: attention kernel, MoE dispatch and imbalance, NCCL release).  ``framework`` None:
    every profile ``searched_by_default``, each plan carrying the one that runs it."""

    framework: str | None = None
    choices: RunChoices = RunChoices()

    @classmethod
    def from_framework(cls, name: str | None, *, attention: str | None = None,
                       moe_imbalance: float | None = None, moe_dispatcher: str | None = None,
                       nccl: str | None = None) -> "Settings":
        fw = get_framework(name) if name is not None else None
        if fw is not None and fw.dp_impl != "ddp":  # asynchronous training has no step the search can rank
            raise InputError("framework", fw.id, "trains asynchronously (parameter servers): recommend searches "
                             "synchronous plans; price one with planner simulate --framework tf-parameter-server or "
                             "planner comm-reduce --mode parameter-server")
        if fw is not None:
            check_attention(fw, attention)
        else:
            default_frameworks_for(attention)
        fw_id = fw.id if fw is not None else None
        if nccl is not None:
            nccl_version(nccl)
        return cls(framework=fw_id, choices=RunChoices(attention=attention, moe_imbalance=moe_imbalance,
                                                       moe_dispatcher=moe_dispatcher, nccl=nccl))

    @property
    def profiles(self) -> tuple[Framework, ...]:
        """The profile named, else the default ones that launch the attention kernel asked for."""
        if self.framework is not None:
            return (get_framework(self.framework),)
        return default_frameworks_for(self.choices.attention)

    def plan_kwargs(self, fw: Framework) -> dict[str, object]:
        """The ``Plan`` fields of ``fw`` with the overrides (``sim.engines.run.plan_kwargs``)."""
        return plan_kwargs(fw, self.choices)

    @property
    def kwargs(self) -> dict[str, object]:
        """The first profile's ``Plan`` fields (the only one with ``framework``)."""
        return self.plan_kwargs(self.profiles[0])

    @property
    def dp_overlap(self) -> bool:
        return self.profiles[0].dp_overlap


@dataclass(slots=True)
class RankedPlan:
    rank: int
    plan: Plan
    result: StepResult  # the model's step (analytic, or event after re-ranking)
    objective_value: float  # of the calibrated estimate
    complexity: float
    fast_step_time_s: float
    analytic_step_time_s: float
    engine: str = "analytic"
    band: Band | None = None  # planner.fitting.uncertainty: the calibrated estimate and its band
    framework: str = ""  # the profile that runs it
    search: SearchResult | None = None  # the search that found it (its fast model and network)

    @property
    def strategy(self) -> Strategy:
        return self.plan.strategy

    @property
    def cluster(self) -> Cluster:
        return self.plan.cluster

    @property
    def num_gpus(self) -> int:
        return self.plan.cluster.num_gpus

    @property
    def step_time_s(self) -> float:
        """The calibrated estimate (the number to plan with)."""
        return self.band.estimate(self.result.step_time_s) if self.band is not None else self.result.step_time_s

    def to_dict(self, objective: "ObjectiveSpec") -> dict[str, object]:
        out = self.result.to_dict()
        if self.band is not None:
            out = headline(out, self.band)
        out["strategy"] = self.strategy.to_string()
        out.update({"rank": self.rank, "framework": self.framework, "num_gpus": self.num_gpus, "engine": self.engine,
                    "analytic_step_time_s": self.analytic_step_time_s, "complexity": self.complexity,
                    "objective_value": self.objective_value, "attention": self.plan.attention,
                    "fp8_recipe": self.strategy.fp8_recipe if self.strategy.precision == "fp8" else None})
        out.update(objective.extras(self.step_time_s, self.strategy, self.num_gpus))
        out["bound_by"] = bound(out)[0]  # the one verdict (planner.plans.explain), as planner simulate reports it
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
    memory_headroom: float = 0.0  # fraction of GPU memory a plan keeps free
    memory_headroom_why: str = ""
    fp8_alternative: dict[str, object] = field(default_factory=dict)
    frameworks_skipped: dict[str, str] = field(default_factory=dict)  # profile -> why it was not searched

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
            "framework": self.settings.framework,
            "frameworks_searched": [fw.id for fw in self.settings.profiles if fw.id not in self.frameworks_skipped],
            "frameworks_skipped": self.frameworks_skipped,
            "precisions_searched": list(self.space.precisions(self.cluster)),
            "memory_headroom": {"fraction": self.memory_headroom, "why": self.memory_headroom_why},
            "plans": [p.to_dict(self.objective) for p in self.plans],
            "fp8_alternative": self.fp8_alternative,
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
    """``space`` cut down to what framework ``fw_id`` can run (``sim.cost.framework.Capabilities``):
    its parallel dimensions, ZeRO/FSDP stages, schedules, precisions, and its own fp8 recipe on
    the GPU (``sim.cost.framework.fp8_recipe_for``; fp8 is not searched when none runs there).  A
    restriction the user gave that the framework cannot meet is an ``InputError`` naming the
    flag."""
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
    if not caps.partial_recompute:
        ch["recompute_layers"] = ()
    if not caps.partial_offload:
        ch["offload_layers"] = ()
    if caps.pp and caps.schedules:
        ch["schedule"] = cut("schedule", space.schedule, caps.schedules)
    else:
        ch["pp"], ch["schedule"] = cut("pp", space.pp or (1,), (1,)), ("1f1b",)
    recipe = fp8_recipe_for(fw, cluster.gpu.architecture)
    allowed = tuple(p for p in caps.precisions if p != "fp8" or recipe is not None)
    ch["precision"] = cut("precision", space.precisions(cluster), allowed)
    if recipe is not None:
        ch["fp8_recipe"] = recipe
    return space.replace(**ch)


def estimate_band(framework: str, cluster: Cluster) -> Band:
    """The calibrated-estimate band of plans on ``cluster`` under ``framework``, for ranking: its
    bias (the class center reads the GPU architecture and framework family,
    ``planner.fitting.uncertainty``) is every such plan's; the spread a shown plan reports is its
    own (``band_for``: the parallelism mix, MoE or long context, picks it)."""
    fw = get_framework(framework)
    return band_from(stored_table(), (fw.family, cluster.gpu.architecture or "unknown", "dense"))


LAYOUT_REFINE = 3  # best distinct pipelined layouts whose pipeline layouts recommend searches


def layout_searches(searches: list[SearchResult], model: Model, *, gbs: int, seq_len: int, space: SearchSpace,
                    plan_kwargs: dict[str, object], dp_overlap: bool, objective: "ObjectiveSpec",
                    tokens_per_step: int, eff: object, memory_limit_bytes: float) -> list[SearchResult]:
    """Pipeline layouts (``SearchSpace.layouts``) for the ``LAYOUT_REFINE`` best distinct
    pipelined layouts of ``searches``: each layout's degrees with the balanced layouts of every
    ``vp`` the default split cannot interleave (``planner.plans.search``).  Pricing a layout runs the
    interleaved schedule pass by pass (``sim.cost.interleave``), too slow for every layout of the
    space; the best layouts are where a better split pays.  ``searches`` are one framework
    profile's (``plan_kwargs``, ``dp_overlap``), priced with the same memory limit."""
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
            out.append(search(model, r.cluster, gbs=gbs, seq_len=seq_len, space=sub, plan_kwargs=plan_kwargs,
                              dp_overlap=dp_overlap, eff=eff, workers=1,  # type: ignore[arg-type]
                              memory_limit_bytes=memory_limit_bytes, share=r.fastmodel))
        except InputError:
            pass
        if len(seen) >= LAYOUT_REFINE:
            break
    return out


def _priced_objective(objective: ObjectiveSpec, cluster: Cluster) -> ObjectiveSpec:
    """``objective`` with the GPU's catalog price where it names none (required for ``cost``)."""
    if objective.kind == "cost" and objective.price_usd_per_hour is None:
        price = cluster.gpu.price_usd_per_hour
        if price is None:
            raise InputError("objective", "cost", f"{cluster.gpu.id} has no price_usd_per_hour in the GPU catalog")
        return replace(objective, price_usd_per_hour=price)
    if objective.price_usd_per_hour is None and cluster.gpu.price_usd_per_hour is not None:
        return replace(objective, price_usd_per_hour=cluster.gpu.price_usd_per_hour)
    return objective


def _check_ranking_args(top: object, tie_tolerance: object) -> None:
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 100:
        raise InputError("top", top, "must be an integer in [1, 100]")
    if not (isinstance(tie_tolerance, (int, float)) and 0 <= tie_tolerance < 1):
        raise InputError("tie-tolerance", tie_tolerance, "must be in [0, 1)")


def _search_profiles(model: Model, cluster: Cluster, *, gbs: int, seq_len: int, space: SearchSpace,
                     objective: ObjectiveSpec, settings: Settings, min_gpus: int | None, workers: int | None,
                     eff: object, memory_limit_bytes: float, stage: Callable[[str], None]
                     ) -> tuple[list[SearchResult], list[Band], dict[str, str]]:
    """One search per framework profile (over what it runs, ``framework_space``) and GPU count,
    with its pipeline-layout searches: (searches, the band of each, profiles skipped and why)."""
    searches: list[SearchResult] = []
    bands: list[Band] = []
    skipped: dict[str, str] = {}
    profiles = settings.profiles
    clusters = [cluster if n == cluster.num_gpus else cluster_with_gpus(cluster, n) for n in gpu_counts(cluster, min_gpus)]
    # One network per cluster, shared by the profiles' searches: its routing memo (the cost of a
    # big cluster) is computed once.  Forked workers would each route again and lose it, so
    # several profiles search in this process unless --workers says otherwise.
    nets = [default_network(cl) for cl in clusters]
    if workers is None and len(profiles) > 1:
        workers = 1
    for fw in profiles:
        try:
            fspace = framework_space(space, fw.id, cluster)
        except InputError as exc:
            if len(profiles) == 1:
                raise
            skipped[fw.id] = exc.message
            continue
        band = estimate_band(fw.id, cluster)
        fsearches = []
        for cl, net in zip(clusters, nets):
            stage(f"searching the strategy space on {cl.num_gpus:,} GPUs" + (f" ({fw.id})" if len(profiles) > 1 else ""))
            fsearches.append(search(model, cl, gbs=gbs, seq_len=seq_len, space=fspace.replace(layouts=False),
                                    plan_kwargs=settings.plan_kwargs(fw), dp_overlap=fw.dp_overlap, net=net, eff=eff,
                                    workers=workers, memory_limit_bytes=memory_limit_bytes))
        if fspace.layouts:  # pipeline layouts, around the best pipelined layouts found
            stage("pricing pipeline layouts around the best plans" + (f" ({fw.id})" if len(profiles) > 1 else ""))
            fsearches += layout_searches(fsearches, model, gbs=gbs, seq_len=seq_len, space=fspace,
                                         plan_kwargs=settings.plan_kwargs(fw), dp_overlap=fw.dp_overlap,
                                         objective=objective, tokens_per_step=gbs * seq_len, eff=eff,
                                         memory_limit_bytes=memory_limit_bytes)
        for r in fsearches:
            r.framework = fw.id
        searches += fsearches
        bands += [band] * len(fsearches)
    if not searches:
        raise InputError("framework", ",".join(skipped), "no framework profile runs the space asked for: "
                         + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    return searches, bands, skipped


def _objective_table(searches: list[SearchResult], bands: list[Band], objective: ObjectiveSpec,
                     tokens_per_step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The objective (of the calibrated estimate) over every timed candidate of every search,
    with each one's search and index in it; None when no candidate fits."""
    objs, src, idx = [], [], []
    for k, (r, band) in enumerate(zip(searches, bands)):
        if r.evaluated:
            objs.append(objective.values(band.estimate(r.candidates.step_time_s), tokens_per_step, r.cluster.num_gpus))
            src.append(np.full(r.evaluated, k, dtype=np.int32))
            idx.append(np.arange(r.evaluated))
    if not objs:
        return None
    return np.concatenate(objs), np.concatenate(src), np.concatenate(idx)


def _nothing_fits(rec: Recommendation, model: Model, cluster: Cluster, *, space: SearchSpace, memory_limit_bytes: float,
                  explain: bool, suggest: bool, stage: Callable[[str], None]) -> None:
    """Say why no candidate fits and which one change would make one fit."""
    rec.ranking_note = "no candidate fits"
    if explain:
        from planner.plans.explain import explain_infeasible

        rec.explanation = explain_infeasible(rec)
    if suggest:
        stage("looking for one change that makes a plan fit")
        from planner.plans.suggest import suggest_fixes

        rec.suggestions = suggest_fixes(model, cluster, gbs=rec.gbs, seq_len=rec.seq_len, space=space,
                                        settings=rec.settings, rejected_batch=rec.rejected.get("batch", 0) > 0,
                                        memory_limit_bytes=memory_limit_bytes,
                                        host_need_bytes=min((r.closest_host_oom[0] for r in rec.searches
                                                             if r.closest_host_oom is not None), default=0.0))


def _shortlist(obj: np.ndarray, top: int, tie_tolerance: float) -> np.ndarray:
    """The best few hundred by objective, plus every plan tied with the best (at most 5000)."""
    n_short = min(obj.size, max(top * 20, 200))
    short = np.argpartition(obj, n_short - 1)[:n_short] if n_short < obj.size else np.arange(obj.size)
    best = float(obj.min())
    tied = np.flatnonzero(obj <= best * (1 + tie_tolerance))
    if tied.size > 5000:
        tied = tied[np.argsort(obj[tied], kind="stable")[:5000]]
    return np.unique(np.concatenate([short, tied]))


def _runnable_ordered(table: tuple[np.ndarray, np.ndarray, np.ndarray], short: np.ndarray,
                      searches: list[SearchResult], model: Model, settings: Settings,
                      tie_tolerance: float) -> list[tuple]:
    """The shortlist's plans their framework runs, ordered by objective with the winner first
    (the simplest plan tied with the best, then the framework listed first).  What a framework
    cannot run and its search space could not exclude (``framework_space``: tensor parallelism
    without SP where TP implies SP, a zero-bubble schedule it runs only interleaved) leaves here.
    Each entry: (objective, tie key, strategy, search index, candidate index)."""
    obj, src_a, idx_a = table
    order = {fw.id: i for i, fw in enumerate(settings.profiles)}

    def runnable(rows: np.ndarray) -> list[tuple]:
        out = []
        for j in rows:
            k = int(src_a[j])
            r = searches[k]
            s = r.strategy(int(idx_a[j]))
            if get_framework(r.framework).capabilities.refusal(s) is None:
                out.append((float(obj[j]), _tie_key(s, model.num_layers) + (order[r.framework],), s, k, int(idx_a[j])))
        return out

    entries = runnable(short)
    if not entries:
        # every shortlisted plan is one its framework refuses (a combination its search space
        # cannot exclude, e.g. Megatron-Core's offload with ZeRO 2-3): walk on down the ranking
        rest = np.setdiff1d(np.arange(obj.size), short)
        rest = rest[np.argsort(obj[rest], kind="stable")]
        block = max(1, short.size)
        for start in range(0, rest.size, block):
            entries = runnable(rest[start:start + block])
            if entries:
                break
    if not entries:
        raise InputError("framework", settings.framework or ",".join(order), "none of the best plans the search "
                         "found is one it runs; restrict the search (--tp, --sp, --schedule, ...) to what it supports")
    entries.sort(key=lambda e: (e[0], e[1]))
    best = entries[0][0]
    winner_pool = [e for e in entries if e[0] <= best * (1 + tie_tolerance)]
    winner = min(winner_pool, key=lambda e: (e[1], e[0]))
    return [winner] + [e for e in entries if e is not winner]


def _shown_plans(ordered: list[tuple], searches: list[SearchResult], bands: list[Band], objective: ObjectiveSpec,
                 tokens_per_step: int, top: int) -> list[RankedPlan]:
    """The first ``top`` plans their framework's launch format can state, with their full
    results (breakdown, memory, warnings): the same model the search evaluated, called for one plan."""
    ranked: list[RankedPlan] = []
    for o, key, s, k, i in ordered:
        if len(ranked) == top:
            break
        r = searches[k]
        fm = r.fastmodel
        plan = fm.plan(s)
        if not launchable(plan, r.framework):
            continue  # a plan its framework's launch format cannot state is not shown
        res = simulate_analytic(plan, net=fm.net, eff=fm.eff)
        band = band_for(plan, r.framework)  # the band `simulate` reports for this plan
        assert band.bias == bands[k].bias  # the ranking's estimate is the same
        value = float(objective.values(np.array([band.estimate(res.step_time_s)]), tokens_per_step,
                                       r.cluster.num_gpus)[0])
        ranked.append(RankedPlan(rank=0, plan=plan, result=res, objective_value=value, complexity=key[0],
                                 fast_step_time_s=float(r.candidates.step_time_s[i]),
                                 analytic_step_time_s=res.step_time_s, band=band, framework=r.framework,
                                 search=r))
    return with_rank_orders(ranked, objective, tokens_per_step, top)


def _rerank(rec: Recommendation, ranked: list[RankedPlan], *, top: int, rerank: int | None, rerank_budget: int,
            tokens_per_step: int, stage: Callable[[str], None]) -> None:
    """Event-engine re-ranking of the first ``rerank`` plans, budgeted by a cost model (never
    by the clock); sets the recommendation's plans, their ranks and its ranking note."""
    t1 = time.perf_counter()
    k_rerank = min(top, len(ranked)) if rerank is None else max(0, min(int(rerank), len(ranked)))
    if k_rerank:
        stage(f"re-ranking the top {k_rerank} with the event engine")
        ranked, note, used = rerank_event(ranked, k_rerank, rec.tie_tolerance, rec.objective, tokens_per_step,
                                           rerank_budget)
        rec.ranking_engine = "event" if used else "analytic"
    else:
        note = "event re-ranking disabled; ranked with the analytic model"
    rec.ranking_note = note + "; by the calibrated estimate (the model's step x the bias of published runs like it)"
    for n, p in enumerate(ranked, 1):
        p.rank = n
    rec.plans = ranked
    rec.timings_s["rerank_s"] = time.perf_counter() - t1


def _price_framework_limits(rec: Recommendation, model: Model, cluster: Cluster, full_space: SearchSpace,
                            min_gpus: int | None, workers: int | None, stage: Callable[[str], None]) -> None:
    """With ``--framework``: what its limits cost against the best plan of any profile (a
    warning past the tie tolerance)."""
    framework = rec.settings.framework
    t3 = time.perf_counter()
    stage(f"pricing what {framework}'s limits cost")
    rec.framework_gap = _framework_gap(rec, model, cluster, full_space, min_gpus, workers)
    rec.timings_s["framework_gap_s"] = time.perf_counter() - t3
    if rec.framework_gap.get("gap", 0.0) > rec.tie_tolerance:
        g = rec.framework_gap
        rec.warnings.append(f"{framework} cannot run the overall best plan ({g['best_overall_strategy']} "
                            f"in {g['best_overall_framework']}: {g['why']}); its best is {g['gap']:.1%} slower")


def recommend(model: Model, cluster: Cluster, *, gbs: int, seq_len: int, space: SearchSpace | None = None,
              objective: ObjectiveSpec | None = None, settings: Settings | None = None, top: int = 5,
              rerank: int | None = None, rerank_budget: int = DEFAULT_RERANK_PASSES, min_gpus: int | None = None,
              tie_tolerance: float = 1e-3, explain: bool = True, suggest: bool = True,
              workers: int | None = None, memory_headroom: float | None = None,
              progress: Callable[[str], None] | None = None) -> Recommendation:
    """Search, rank, verify and explain (module docstring).  ``rerank``: how many of the top
    plans the event engine re-ranks (default ``top``; 0 disables it), as many as
    ``rerank_budget`` scheduled passes allow (``planner.plans.rerank.event_passes``).  ``memory_headroom``: fraction
    of GPU memory a plan keeps free (default ``planner.fitting.uncertainty.memory_headroom``).
    ``progress`` is called with the name of each phase as it starts (the app draws them; an
    exception it raises stops the recommendation)."""
    t0 = time.perf_counter()
    stage = progress or (lambda name: None)
    space = space or SearchSpace()
    settings = settings or Settings()
    _check_ranking_args(top, tie_tolerance)
    headroom, headroom_why = memory_headroom_of(memory_headroom)
    objective = _priced_objective(objective or ObjectiveSpec(), cluster)
    eff = default_efficiency()
    tokens_per_step = gbs * seq_len
    limit = (1.0 - headroom) * cluster.gpu.hbm_bytes

    searches, bands, skipped = _search_profiles(model, cluster, gbs=gbs, seq_len=seq_len, space=space,
                                                objective=objective, settings=settings, min_gpus=min_gpus,
                                                workers=workers, eff=eff, memory_limit_bytes=limit, stage=stage)
    profiles = settings.profiles
    rank_space = framework_space(space, profiles[0].id, cluster) if len(profiles) == 1 else space
    table = _objective_table(searches, bands, objective, tokens_per_step)
    rec = Recommendation(model=model, cluster=cluster, gbs=gbs, seq_len=seq_len, objective=objective,
                         settings=settings, space=rank_space, searches=searches, plans=[], search_time_s=0.0,
                         ranking_engine="analytic", ranking_note="", tie_tolerance=float(tie_tolerance),
                         memory_headroom=headroom, memory_headroom_why=headroom_why, frameworks_skipped=skipped)
    if table is None:
        rec.search_time_s = time.perf_counter() - t0
        _nothing_fits(rec, model, cluster, space=space, memory_limit_bytes=limit, explain=explain, suggest=suggest,
                      stage=stage)
        return rec
    stage("ranking and verifying the best plans")
    ordered = _runnable_ordered(table, _shortlist(table[0], top, tie_tolerance), searches, model, settings,
                                tie_tolerance)
    ranked = _shown_plans(ordered, searches, bands, objective, tokens_per_step, top)
    rec.search_time_s = time.perf_counter() - t0
    rec.timings_s["search_s"] = sum(r.search_time_s for r in searches)
    rec.timings_s["rank_and_verify_s"] = rec.search_time_s - rec.timings_s["search_s"]

    _rerank(rec, ranked, top=top, rerank=rerank, rerank_budget=rerank_budget, tokens_per_step=tokens_per_step,
            stage=stage)
    _flag_winner(rec)
    if "fp8" not in rec.space.precisions(cluster):
        rec.fp8_alternative = fp8_alternative(rec, limit)
    if settings.framework is not None and rec.plans:
        _price_framework_limits(rec, model, cluster, space, min_gpus, workers, stage)
    if explain:
        t2 = time.perf_counter()
        stage("explaining the winner")
        from planner.plans.explain import explain_recommendation

        rec.explanation = explain_recommendation(rec)
        rec.timings_s["explain_s"] = time.perf_counter() - t2
    rec.timings_s["total_s"] = time.perf_counter() - t0
    return rec


def memory_headroom_of(fraction: float | None) -> tuple[float, str]:
    """(the headroom to keep, why): ``fraction`` as given, else the measured default."""
    if fraction is None:
        return memory_headroom()
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise InputError("memory-headroom", fraction, "must be a fraction in [0, 1)")
    return float(fraction), f"{fraction:.0%} of GPU memory kept free (--memory-headroom)"


def _flag_winner(rec: Recommendation) -> None:
    """Warnings about #1: a lead over #2 inside the band, an MFU above every published run."""
    ranked = rec.plans
    if len(ranked) >= 2 and ranked[0].band is not None:
        b, margin = ranked[0].band, ranked[1].objective_value / ranked[0].objective_value - 1
        half = (b.high(1.0) - b.low(1.0)) / 2 / b.estimate(1.0)
        rec.winner_margin = {"margin": margin, "band_half_width": half, "within_band": margin < half}
        if margin < half:
            rec.warnings.append(f"#1 leads #2 by {margin:.1%}, inside the +-{half:.0%} 80% band of the {b.runs} "
                                f"published runs like it ({b.spread_class}): the two are not told apart by this "
                                "model; measure both before committing")
    if ranked:
        top = ranked[0]
        mfu = top.result.mfu * top.result.step_time_s / top.step_time_s
        precision = "bf16" if top.strategy.precision == "fp16" else top.strategy.precision
        note = above_published_note(mfu, top.cluster.gpu.architecture or "unknown", precision)
        if note:
            rec.warnings.append(f"#1: {note}")


def fp8_alternative(rec: Recommendation, memory_limit_bytes: float) -> dict[str, object]:
    """#1 in fp8 with its framework's own recipe (``sim.cost.framework.fp8_recipe_for``), when the GPU
    has fp8 tensor cores, the framework runs fp8 there, the plan still fits and it would be
    faster: the predicted gain, said as an alternative (fp8 changes numerics and convergence
    risk, so it is never chosen silently).  Empty otherwise."""
    win = rec.plans[0]
    fw = get_framework(win.framework)
    recipe = fp8_recipe_for(fw, win.cluster.gpu.architecture)
    if "fp8" not in win.cluster.gpu.dense_flops_per_s or recipe is None or "fp8" not in fw.capabilities.precisions:
        return {}
    s8 = win.strategy.with_(precision="fp8", fp8_recipe=recipe)
    if fw.capabilities.refusal(s8) is not None or win.search is None:
        return {}
    fm = win.search.fastmodel
    try:
        res = simulate_analytic(fm.plan(s8), net=fm.net, eff=fm.eff)
    except InputError:
        return {}
    est = win.band.estimate(res.step_time_s) if win.band is not None else res.step_time_s
    gain = win.step_time_s / est - 1
    if res.memory_peak_bytes > memory_limit_bytes or gain <= 0:
        return {}
    return {"strategy": s8.to_string(), "framework": fw.id, "fp8_recipe": recipe, "step_time_s": est,
            "model_step_time_s": res.step_time_s, "speedup": gain, "memory_peak_bytes": res.memory_peak_bytes,
            "line": (f"fp8 would be {gain:.0%} faster ({fmt_s(est)} per step with {fw.id}'s {recipe} recipe: "
                     f"--precision fp8 or bf16,fp8 to search it); it changes numerics, so it is not chosen "
                     "unless asked for")}


def _framework_gap(rec: "Recommendation", model: Model, cluster: Cluster, space: SearchSpace,
                   min_gpus: int | None, workers: int | None) -> dict[str, object]:
    """The best plan of the default framework profiles (the same overrides) against the named
    framework's best, both by the calibrated analytic estimate: what choosing it costs."""
    fw_id = rec.settings.framework
    assert fw_id is not None and rec.plans
    overall = recommend(model, cluster, gbs=rec.gbs, seq_len=rec.seq_len, space=space, objective=rec.objective,
                        settings=replace(rec.settings, framework=None), top=1, rerank=0, min_gpus=min_gpus,
                        explain=False, suggest=False, workers=workers, memory_headroom=rec.memory_headroom)
    mine, best = rec.plans[0], overall.best
    if best is None or best.framework == fw_id:
        return {"framework": fw_id, "gap": 0.0, "why": "it runs the best plan"} if best is not None else {}
    tokens = rec.gbs * rec.seq_len
    est = [p.band.estimate(p.analytic_step_time_s) if p.band is not None else p.analytic_step_time_s
           for p in (mine, best)]
    obj = [float(rec.objective.values(np.array([e]), tokens, p.num_gpus)[0]) for e, p in zip(est, (mine, best))]
    why = get_framework(fw_id).capabilities.refusal(best.strategy)
    return {"framework": fw_id, "best_overall_strategy": best.strategy.to_string(),
            "best_overall_framework": best.framework,
            "best_overall_step_time_s": est[1], "framework_step_time_s": est[0],
            "gap": max(0.0, obj[0] / obj[1] - 1),
            "why": f"{why[0]}={why[1]} {why[2]}" if why is not None else "its mechanisms are slower on this plan"}
