"""Which parallel strategy to cost: the user's, the recommender's best, or a small search.

Order of preference when no ``--strategy`` is given:

1. ``planner.recommend.recommend`` (the project's recommender) when that module exists: its
   best plan under the throughput objective, ranked by the analytic model (``rerank=0``: no
   event-engine re-ranking, for speed).  If it finds nothing that fits, the plan is
   infeasible (no further search).
2. ``planner.search.search`` (the recommender's search engine) when it exists: the fastest
   plan that fits in memory.
3. ``fallback_search`` here: a deliberately small documented grid -- ``tp`` in {1, 2, 4, 8}
   (within the NVLink domain, dividing the heads), ``pp`` in {1, 2, 4, 8, 16} (at most the
   layers), ``dp`` what is left, ``ep`` = the largest power of two dividing experts and
   ``dp`` (MoE only, capped at 8), ``mbs = 1``, ``zero = 1``, ``sp`` on with ``tp > 1``,
   ``recompute = selective``; if nothing fits, the same grid with ``recompute = full`` and
   ``zero = 3``.  Each candidate is timed with ``sim.analytic``; the highest throughput wins.

Global batch when not given: ``2**22`` tokens per step (~4M, the Llama 2 batch; Touvron et al.
2023, Sec. 2.2) divided by the sequence length, at least one sequence per data-parallel rank.
"""

from __future__ import annotations

from sim.costs import default_network

import importlib
import inspect
from dataclasses import dataclass

from sim.analytic import simulate_analytic
from sim.collectives import Network
from sim.errors import InfeasibleError, InputError
from sim.plan import Plan, parse_strategy
from sim.result import StepResult
from sim.specs import Cluster, Model, Strategy

DEFAULT_TOKENS_PER_STEP = 1 << 22
DEFAULT_SEQ_LEN = 2048


@dataclass(frozen=True, kw_only=True, slots=True)
class ChosenPlan:
    strategy: Strategy
    result: StepResult
    source: str  # "given" | "planner.recommend" | "planner.search" | "economics fallback search"
    candidates_evaluated: int


def default_gbs(seq_len: int) -> int:
    return max(1, DEFAULT_TOKENS_PER_STEP // seq_len)


def evaluate(model: Model, cluster: Cluster, strategy: Strategy, net: Network | None = None) -> StepResult:
    """Simulate one step of ``strategy`` with the analytic engine."""
    plan = Plan(model=model, cluster=cluster, strategy=strategy)
    return simulate_analytic(plan, net=net or default_network(cluster))


def _strategy_of(obj: object, num_gpus: int) -> Strategy | None:
    if isinstance(obj, Strategy):
        return obj
    if isinstance(obj, str):
        return parse_strategy(obj, num_gpus=num_gpus)
    if isinstance(obj, dict):
        return _strategy_of(obj.get("strategy"), num_gpus)
    inner = getattr(obj, "strategy", None)
    return _strategy_of(inner, num_gpus) if inner is not None else None


def _from_recommend(model: Model, cluster: Cluster, gbs: int, seq_len: int) -> ChosenPlan | None:
    """The recommender's best plan; ``None`` when ``planner.recommend`` is not there.

    Called with ``top=1`` and no event-engine re-ranking, explanation or fix suggestions
    (speed: a sweep calls it per design point).  Raises ``InfeasibleError`` when the
    recommender finds nothing that fits.
    """
    try:
        mod = importlib.import_module("planner.recommend")
    except ModuleNotFoundError as exc:
        if exc.name == "planner.recommend":
            return None
        raise
    fn = getattr(mod, "recommend", None)
    if not callable(fn):
        return None
    params = inspect.signature(fn).parameters
    offered = {"gbs": gbs, "seq_len": seq_len, "top": 1, "rerank": 0, "explain": False, "suggest": False}
    rec = fn(model, cluster, **{k: v for k, v in offered.items() if k in params})
    plans = getattr(rec, "plans", None) or []
    if not plans:
        raise InfeasibleError("oom", "num_gpus", cluster.num_gpus,
                              f"the recommender found no plan of {model.name} that fits {cluster.num_gpus} x "
                              f"{cluster.gpu.id} (gbs={gbs}, seq_len={seq_len}); see planner recommend")
    best = plans[0]
    strategy = _strategy_of(best, cluster.num_gpus)
    if strategy is None:
        return None
    result = getattr(best, "result", None)
    if not isinstance(result, StepResult):
        result = evaluate(model, cluster, strategy)
    considered = getattr(rec, "considered", 0)
    return ChosenPlan(strategy=strategy, result=result, source="planner.recommend",
                      candidates_evaluated=int(considered) if isinstance(considered, int) else 0)


def _from_search(model: Model, cluster: Cluster, gbs: int, seq_len: int) -> tuple[Strategy | None, int]:
    try:
        mod = importlib.import_module("planner.search")
    except ModuleNotFoundError as exc:
        if exc.name == "planner.search":
            return None, 0
        raise
    res = mod.search(model, cluster, gbs=gbs, seq_len=seq_len)
    if res.evaluated == 0:
        return None, res.considered
    best = int(res.candidates.step_time_s.argmin())
    return res.strategy(best), res.considered


def _pow2_divisor(n: int, cap: int) -> int:
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def fallback_search(model: Model, cluster: Cluster, *, gbs: int | None = None,
                    seq_len: int = DEFAULT_SEQ_LEN) -> ChosenPlan:
    """The small documented grid of the module docstring; raises if nothing fits."""
    net = default_network(cluster)
    n = cluster.num_gpus
    best: tuple[float, Strategy, StepResult] | None = None
    evaluated = 0
    for recompute, zero in (("selective", 1), ("full", 3)):
        for tp in (1, 2, 4, 8):
            if tp > cluster.domain_size or n % tp or model.num_attention_heads % tp:
                continue
            for pp in (1, 2, 4, 8, 16):
                if pp > model.num_layers or n % (tp * pp):
                    continue
                dp = n // (tp * pp)
                ep = 1
                if model.moe is not None:
                    ep = _pow2_divisor(model.moe.num_experts, min(8, dp)) if dp > 1 else 1
                    while ep > 1 and dp % ep:
                        ep //= 2
                b = gbs if gbs is not None else max(default_gbs(seq_len), dp * (4 * pp if pp > 1 else 1))
                b = -(-b // dp) * dp  # round up to a multiple of dp (mbs = 1)
                try:
                    s = Strategy(tp=tp, pp=pp, dp=dp, ep=ep, mbs=1, gbs=b, seq_len=seq_len,
                                 zero=zero if dp > 1 else 0, sp=tp > 1, recompute=recompute)
                    r = evaluate(model, cluster, s, net)
                except (InfeasibleError, InputError):
                    continue
                evaluated += 1
                if not r.fits_memory:
                    continue
                if best is None or r.tokens_per_s > best[0]:
                    best = (r.tokens_per_s, s, r)
        if best is not None:
            break
    if best is None:
        raise InfeasibleError("oom", "num_gpus", cluster.num_gpus,
                              f"no plan of the fallback grid fits {model.name} on {n} x {cluster.gpu.id}; "
                              "give --strategy or more GPUs")
    return ChosenPlan(strategy=best[1], result=best[2], source="economics fallback search",
                      candidates_evaluated=evaluated)


def choose_plan(model: Model, cluster: Cluster, *, strategy: Strategy | None = None, gbs: int | None = None,
                seq_len: int | None = None, engines: tuple[str, ...] = ("recommend", "search", "fallback")
                ) -> ChosenPlan:
    """The plan to cost (module docstring for the order); ``strategy`` wins when given."""
    if strategy is not None:
        return ChosenPlan(strategy=strategy, result=evaluate(model, cluster, strategy), source="given",
                          candidates_evaluated=1)
    seq = seq_len or DEFAULT_SEQ_LEN
    b = gbs if gbs is not None else default_gbs(seq)
    for engine in engines:
        if engine == "recommend":
            chosen = _from_recommend(model, cluster, b, seq)
            if chosen is not None:
                return chosen
        elif engine == "search":
            s, considered = _from_search(model, cluster, b, seq)
            if s is not None:
                return ChosenPlan(strategy=s, result=evaluate(model, cluster, s), source="planner.search",
                                  candidates_evaluated=considered)
        elif engine == "fallback":
            return fallback_search(model, cluster, gbs=gbs, seq_len=seq)
        else:
            raise InputError("engine", engine, "must be recommend, search or fallback")
    raise InfeasibleError("oom", "num_gpus", cluster.num_gpus,
                          f"no plan found for {model.name} on {cluster.num_gpus} x {cluster.gpu.id}")
