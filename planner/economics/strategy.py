"""Which parallel strategy to cost: the user's, or the recommender's best.

Without ``--strategy`` the plan is ``planner.plans.recommend.recommend``'s best under the throughput
objective, ranked by the analytic model (``rerank=0``: no event-engine re-ranking, for speed).
``quick=True`` searches ``QUICK_SPACE``, a small documented part of the space, so that a sweep
over many designs stays fast: ``tp`` in {1, 2, 4, 8}, ``pp`` in {1, 2, 4, 8, 16}, no context
parallelism, ``mbs = 1``, ZeRO-1 or ZeRO-3, sequence parallelism with ``tp > 1``, selective or
full recomputation, 1F1B, bf16.  If nothing fits, the plan is infeasible.

Global batch when not given: ``sim.data.conventions.default_global_batch`` (the catalog's default
tokens per step, 2^22 ~ 4M as Llama 2's, over the sequence length).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sim.data.conventions import default_global_batch
from sim.base.errors import InfeasibleError
from sim.cost.framework import get_framework
from sim.engines.result import StepResult
from sim.engines.run import RunChoices, resolve
from sim.engines.simulate import simulate_run
from sim.data.hardware import Cluster
from sim.data.specs import DEFAULT_SEQ_LEN, Model, Strategy

from planner.plans.recommend import Settings, recommend
from planner.report import priced
from planner.plans.search import SearchSpace

QUICK_SPACE = SearchSpace(tp=(1, 2, 4, 8), pp=(1, 2, 4, 8, 16), cp=(1,), mbs=(1,), zero=(1, 3), sp=(True,),
                          recompute=("selective", "full"), schedule=("1f1b",))


@dataclass(frozen=True, kw_only=True, slots=True)
class ChosenPlan:
    """The plan to cost: its strategy, the model's step (``result``) and the priced JSON
    (``planner.report.priced``: the number to plan with, ``step_time_s``, inside its band)."""

    strategy: Strategy
    result: StepResult
    source: str  # "given" | "planner.plans.recommend" | "planner.plans.recommend (quick space)"
    candidates_evaluated: int
    out: dict[str, object] = field(default_factory=dict)

    @property
    def step_time_s(self) -> float:
        return float(self.out["step_time_s"])  # type: ignore[arg-type]

    @property
    def tokens_per_s(self) -> float:
        return float(self.out["tokens_per_s"])  # type: ignore[arg-type]

    def band_factors(self) -> tuple[float, float]:
        """(low, high) of the band over the estimate: time and cost to train scale with them."""
        return (float(self.out["step_time_s_low"]) / self.step_time_s,  # type: ignore[arg-type]
                float(self.out["step_time_s_high"]) / self.step_time_s)  # type: ignore[arg-type]


def choose_plan(model: Model, cluster: Cluster, *, strategy: str | Strategy | None = None, gbs: int | None = None,
                seq_len: int | None = None, quick: bool = False, choices: RunChoices | None = None) -> ChosenPlan:
    """The plan to cost (module docstring); ``strategy`` (a STRATEGY string, resolved as
    ``planner simulate`` resolves it: ``sim.engines.run.resolve``) wins when given.  Raises
    ``InfeasibleError`` when the recommender finds nothing that fits."""
    if strategy is not None:
        run = resolve(model, cluster, strategy, choices, seq_len=seq_len)
        result = simulate_run(run, engine="analytic")
        return ChosenPlan(strategy=run.plan.strategy, result=result, source="given", candidates_evaluated=1,
                          out=priced(run, result))
    seq = seq_len or DEFAULT_SEQ_LEN
    b = gbs if gbs is not None else default_global_batch(seq)
    c = choices or RunChoices()
    settings = Settings(framework=get_framework(c.framework).id if c.framework else None,
                        choices=replace(c, framework=None))
    rec = recommend(model, cluster, gbs=b, seq_len=seq, space=QUICK_SPACE if quick else None, top=1, rerank=0,
                    explain=False, suggest=False, settings=settings)
    if not rec.plans:
        raise InfeasibleError("oom", "num_gpus", cluster.num_gpus,
                              f"the recommender found no plan of {model.name} that fits {cluster.num_gpus} x "
                              f"{cluster.gpu.id} (gbs={b}, seq_len={seq}); see planner recommend")
    best = rec.plans[0]
    return ChosenPlan(strategy=best.strategy, result=best.result,
                      source="planner.plans.recommend" + (" (quick space)" if quick else ""),
                      candidates_evaluated=rec.considered, out=best.to_dict(rec.objective))
