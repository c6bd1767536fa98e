"""Communication-reducing training: throughput effect on the analytic step model.

All three modes re-run ``sim.engines.analytic.simulate_analytic`` on modified step costs
(``sim.cost.costs.step_costs``), so overlap of the data-parallel (DP) gradient traffic with the
backward pass is modelled exactly as for a normal step:

* ``local-sgd`` (local SGD, Lin et al. 2020, "Don't use large mini-batches, use local SGD";
  DiLoCo, Douillard et al. 2023, arXiv:2311.08105): inner steps do no DP communication; every
  ``H`` steps the replicas all-reduce their parameters (outer step; same bytes as one gradient
  all-reduce, not overlapped).  Average step: ``T_inner + T_allreduce / H``.  Needs
  ``zero = 0`` (each replica keeps its own optimizer state); the outer optimizer adds 8 B per
  parameter (a global copy and an outer momentum in fp32, usually offloaded to the CPU).
* ``compress`` (gradient compression to ``1/ratio`` of the bytes: PowerSGD, Vogels et al.
  2019; 1-bit Adam, Tang et al. 2021): the DP gradient collective takes ``1/ratio`` of its
  time; encode/decode compute is not counted (optimistic).  ``zero`` 0-2.
* ``async-pipeline`` (asynchronous pipelines without flushes, PipeDream; Narayanan et al.
  2019 and PipeDream-2BW 2021): the pipeline bubble disappears; one extra weight version is
  stashed per stage.  Needs ``pp > 1``.
* ``parameter-server`` (asynchronous data parallelism through parameter servers, TensorFlow's
  ``ParameterServerStrategy``): the same function ``planner simulate --framework
  tf-parameter-server`` prices (``sim.engines.parameter_server.parameter_server_report``: push/pull to
  the PS hosts, their CPUs' optimizer, Mean Value Analysis of the workers sharing them,
  staleness ``W - 1`` updates), against the synchronous all-reduce step of the same strategy
  and mechanisms on the same cluster (its baseline here).  The plan is priced with the
  ``tf-parameter-server`` profile (the mechanism is TensorFlow's); needs ``tp=pp=cp=ep=1``,
  ``zero=0`` and ``gbs = mbs * dp``.

The statistical efficiency (how many more tokens these methods need for the same loss) is NOT
modelled: ``CAVEATS`` is printed with every result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sim.engines.analytic import simulate_analytic
from sim.layers.compute import default_efficiency
from sim.cost.costs import StepCosts, default_network, step_costs
from sim.base.errors import InputError
from sim.net.network import Network
from sim.engines.parameter_server import parameter_server_report
from sim.cost.plan import Plan
from sim.data.psspecs import ParameterServers
from sim.engines.run import RunChoices, resolve
from sim.engines.result import StepResult
from sim.base.units import GIB

MODES: tuple[str, ...] = ("local-sgd", "compress", "async-pipeline", "parameter-server")
PS_FRAMEWORK = "tf-parameter-server"

CAVEAT = ("Throughput only. The statistical efficiency of {what} is NOT modelled: it changes the optimisation, "
          "and the tokens (steps) needed to reach the same loss can grow, so time-to-quality may get worse even "
          "when tokens per second improve. {detail} Validate on your model before relying on it.")
CAVEATS = {
    "local-sgd": CAVEAT.format(what="local SGD / DiLoCo", detail=(
        "Replicas drift apart between synchronisations; DiLoCo (Douillard et al. 2023) reports little loss "
        "penalty for some sync intervals with an outer Nesterov optimizer, but the penalty grows with the interval "
        "and the number of replicas.")),
    "compress": CAVEAT.format(what="gradient compression", detail=(
        "Lossy gradients need error feedback (PowerSGD, 1-bit Adam) and can converge slower; encode/decode time "
        "is not counted.")),
    "async-pipeline": CAVEAT.format(what="asynchronous pipelining", detail=(
        "Gradients are computed on stale weights (PipeDream, PipeDream-2BW); the stashed weight versions cost "
        "memory.")),
    "parameter-server": CAVEAT.format(what="asynchronous parameter-server training", detail=(
        "Each update is one worker's batch computed on weights W - 1 updates old on average (Little's law); "
        "stale gradients can slow convergence and usually need a smaller learning rate (Dutta et al. 2018, "
        "'Slow and Stale Gradients Can Win the Race').")),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class CommReductionReport:
    mode: str
    baseline: StepResult
    step_time_s: float
    tokens_per_s: float
    dp_bytes_factor: float  # DP traffic per step relative to the baseline
    parameters: dict[str, float]
    caveat: str
    warnings: tuple[str, ...] = field(default=())

    @property
    def speedup(self) -> float:
        return self.baseline.step_time_s / self.step_time_s

    def as_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "parameters": dict(self.parameters),
                "baseline_step_time_s": self.baseline.step_time_s,
                "baseline_tokens_per_s": self.baseline.tokens_per_s, "step_time_s": self.step_time_s,
                "tokens_per_s": self.tokens_per_s, "speedup": self.speedup, "dp_bytes_factor": self.dp_bytes_factor,
                "baseline_exposed_dp_s": self.baseline.breakdown.exposed_dp_s,
                "baseline_bubble_s": self.baseline.breakdown.bubble_s,
                "statistical_efficiency_modelled": False, "caveat": self.caveat, "warnings": list(self.warnings)}


def _with_dp(costs: StepCosts, scale: float) -> StepCosts:
    stages = tuple(replace(st, pieces=replace(st.pieces, dp_grad_sync_s=st.pieces.dp_grad_sync_s * scale))
                   for st in costs.stages)
    return replace(costs, stages=stages)


def parameter_server_mode(plan: Plan, ps: ParameterServers, net: Network) -> CommReductionReport:
    """``mode="parameter-server"`` (module docstring): ``plan`` under the tf-parameter-server
    profile, priced by ``sim.engines.parameter_server`` as ``planner simulate`` prices it."""
    s = plan.strategy
    if s.dp * s.cp < 2:
        raise InputError("strategy.dp", s.dp, "parameter-server training needs data parallelism (dp > 1)")
    # the same strategy as tf-parameter-server runs it (sim.engines.run.resolve; asynchronous, one gradient pack)
    ps_plan = resolve(plan.model, plan.cluster, s.with_(dp_impl="parameter-server", dp_overlap=False),
                      RunChoices(framework=PS_FRAMEWORK, parameter_servers=ps)).plan
    rep = parameter_server_report(ps_plan, net=net, eff=default_efficiency())
    sync = rep.sync_result
    base = replace(sync, step_time_s=rep.sync_step_time_s, tokens_per_s=rep.sync_tokens_per_s)
    step = s.tokens_per_step / rep.tokens_per_s
    params = {"workers": float(rep.workers), "num_ps": float(rep.num_ps), "updates_per_s": rep.updates_per_s,
              "staleness_updates": rep.staleness_updates, "step_time_cv": rep.step_time_cv}
    # bytes through a worker node's NIC per global batch: pull + push of one update against the
    # ring all-reduce's 2 (W - 1)/W of the gradient bytes
    ring = 2.0 * (rep.workers - 1) / rep.workers * 4.0 * rep.params
    moved = (rep.pull_s + rep.push_s) * rep.worker_bytes_per_s
    warnings = [f"{rep.placement} PS tasks ({rep.partition} shards), bound by {rep.bottleneck}; the sync baseline "
                f"includes a straggler factor x{rep.sync_straggler_factor:.3f} (step-time CV {rep.step_time_cv:g})",
                "priced with the tf-parameter-server profile (Keras on TensorFlow), baseline with the same mechanisms "
                "synchronously (tf-multiworker)"]
    return CommReductionReport(mode="parameter-server", baseline=base, step_time_s=step,
                               tokens_per_s=rep.tokens_per_s, dp_bytes_factor=moved / ring if ring else float("nan"),
                               parameters=params, caveat=CAVEATS["parameter-server"], warnings=tuple(warnings))


def comm_reduction(plan: Plan, *, mode: str, sync_every: int | None = None, ratio: float | None = None,
                   net: Network | None = None, parameter_servers: ParameterServers | None = None
                   ) -> CommReductionReport:
    """Throughput of ``plan`` under a communication-reducing ``mode`` (module docstring)."""
    if mode not in MODES:
        raise InputError("mode", mode, f"must be one of {', '.join(MODES)}")
    s = plan.strategy
    net = net or default_network(plan.cluster)
    if mode == "parameter-server":
        return parameter_server_mode(plan, parameter_servers or plan.parameter_servers, net)
    costs = step_costs(plan, net)
    base = simulate_analytic(plan, net=net, costs=costs)
    warnings: list[str] = []
    if mode == "local-sgd":
        if sync_every is None or isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise InputError("sync-every", sync_every, "must be an integer >= 1 (steps between synchronisations)")
        if s.zero != 0:
            raise InputError("strategy.zero", s.zero, "local SGD / DiLoCo needs zero=0 (each replica keeps its optimizer)")
        if s.dp * s.cp < 2:
            raise InputError("strategy.dp", s.dp, "local SGD needs data parallelism (dp > 1)")
        inner = simulate_analytic(plan, net=net, costs=_with_dp(costs, 0.0))
        outer = max(st.pieces.dp_grad_sync_s for st in costs.stages)
        step = inner.step_time_s + outer / sync_every
        params = {"sync_every": float(sync_every), "outer_sync_s": outer, "inner_step_time_s": inner.step_time_s}
        factor = 1.0 / sync_every
        warnings.append("the outer optimizer keeps 8 bytes per parameter more (global copy + momentum), "
                        "usually offloaded to host memory")
    elif mode == "compress":
        if ratio is None or not (1.0 <= ratio < 1e6):
            raise InputError("ratio", ratio, "must be a compression ratio in [1, 1e6)")
        if s.zero == 3:
            raise InputError("strategy.zero", 3, "gradient compression is modelled for zero 0-2")
        if s.dp * s.cp < 2:
            raise InputError("strategy.dp", s.dp, "gradient compression needs data parallelism (dp > 1)")
        res = simulate_analytic(plan, net=net, costs=_with_dp(costs, 1.0 / ratio))
        step = res.step_time_s
        params = {"ratio": ratio}
        factor = 1.0 / ratio
    else:
        if s.pp < 2:
            raise InputError("strategy.pp", s.pp, "an asynchronous pipeline needs pp > 1")
        step = base.step_time_s - base.breakdown.bubble_s
        params = {"removed_bubble_s": base.breakdown.bubble_s}
        factor = 1.0
        warnings.append("one stashed weight version per stage adds the stage's weight bytes to its memory "
                        f"(+{base.memory.weights_bytes / GIB:.1f} GiB on the most loaded GPU, not in the peak)")
    return CommReductionReport(mode=mode, baseline=base, step_time_s=step, tokens_per_s=s.tokens_per_step / step,
                               dp_bytes_factor=factor, parameters=params, caveat=CAVEATS[mode],
                               warnings=tuple(warnings))
