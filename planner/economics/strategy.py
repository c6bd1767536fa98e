"""Which parallel strategy to cost: the user's, or the recommender's best.

Without ``--strategy`` the plan is ``planner.recommend.recommend``'s best under the throughput
objective, ranked by the analytic model (``rerank=0``: no event-engine re-ranking, for speed).
``quick=True`` searches ``QUICK_SPACE``, a small documented part of the space, so that a sweep
over many designs stays fast: ``tp`` in {1, 2, 4, 8}, ``pp`` in {1, 2, 4, 8, 16}, no context
parallelism, ``mbs = 1``, ZeRO-1 or ZeRO-3, sequence parallelism with ``tp > 1``, selective or
full recomputation, 1F1B, bf16.  If nothing fits, the plan is infeasible.

Global batch when not given: ``sim.conventions.default_global_batch`` (the catalog's default
tokens per step, 2^22 ~ 4M as Llama 2's, over the sequence length).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.analytic import simulate_analytic
from sim.conventions import default_global_batch
from sim.costs import default_network
from sim.errors import InfeasibleError
from sim.network import Network
from sim.plan import Plan
from sim.result import StepResult
from sim.specs import Cluster, Model, Strategy

from planner.recommend import recommend
from planner.search import SearchSpace

DEFAULT_SEQ_LEN = 2048
QUICK_SPACE = SearchSpace(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8, 16), cp=(1,), mbs=(1,), zero=(1, 3), sp=(True,),
                          recompute=("selective", "full"), schedule=("1f1b",), precision=("bf16",))


@dataclass(frozen=True, kw_only=True, slots=True)
class ChosenPlan:
    strategy: Strategy
    result: StepResult
    source: str  # "given" | "planner.recommend" | "planner.recommend (quick space)"
    candidates_evaluated: int


def evaluate(model: Model, cluster: Cluster, strategy: Strategy, net: Network | None = None) -> StepResult:
    """Simulate one step of ``strategy`` with the analytic engine."""
    plan = Plan(model=model, cluster=cluster, strategy=strategy)
    return simulate_analytic(plan, net=net or default_network(cluster))


def choose_plan(model: Model, cluster: Cluster, *, strategy: Strategy | None = None, gbs: int | None = None,
                seq_len: int | None = None, quick: bool = False) -> ChosenPlan:
    """The plan to cost (module docstring); ``strategy`` wins when given.  Raises
    ``InfeasibleError`` when the recommender finds nothing that fits."""
    if strategy is not None:
        return ChosenPlan(strategy=strategy, result=evaluate(model, cluster, strategy), source="given",
                          candidates_evaluated=1)
    seq = seq_len or DEFAULT_SEQ_LEN
    b = gbs if gbs is not None else default_global_batch(seq)
    rec = recommend(model, cluster, gbs=b, seq_len=seq, space=QUICK_SPACE if quick else None, top=1, rerank=0,
                    explain=False, suggest=False)
    if not rec.plans:
        raise InfeasibleError("oom", "num_gpus", cluster.num_gpus,
                              f"the recommender found no plan of {model.name} that fits {cluster.num_gpus} x "
                              f"{cluster.gpu.id} (gbs={b}, seq_len={seq}); see planner recommend")
    best = rec.plans[0]
    return ChosenPlan(strategy=best.strategy, result=best.result,
                      source="planner.recommend" + (" (quick space)" if quick else ""),
                      candidates_evaluated=rec.considered)
