"""Shared helpers for the event-engine tests: tiny plans with hand-set (synthetic) costs."""

from __future__ import annotations

from dataclasses import fields

from sim.data.catalog import get_gpu, get_nic
from sim.net.network import Network
from sim.cost.costs import LayerCost, StageCost, StepCosts
from sim.engines.event.engine import Engine
from sim.engines.event.resources import LinkTable
from sim.engines.event.scenario import Scenario
from sim.engines.event.whatif import WhatIf
from sim.cost.plan import Plan
from sim.data.hardware import Cluster
from sim.data.specs import Model, Strategy
from sim.cost.step import StagePieces


def zeros(cls: type, **values: object) -> object:
    """A frozen cost dataclass with every float field 0 unless given (robust to new fields)."""
    out: dict[str, object] = {}
    for f in fields(cls):
        if f.name in values:
            out[f.name] = values[f.name]
        elif f.type in ("float", float, "Num"):
            out[f.name] = 0.0
    return cls(**out)


def tiny_plan(*, p: int, m: int, v: int = 1, schedule: str | None = None, dp: int = 1, tp: int = 1,
              layers_per_chunk: int = 1, zero: int = 0, gpus_per_node: int = 8, **strategy: object) -> Plan:
    layers = p * v * layers_per_chunk
    model = Model(name="synthetic", num_layers=layers, hidden_size=512, num_attention_heads=8,
                  ffn_hidden_size=2048, vocab_size=1024)
    gpu = get_gpu("a100-80gb")
    n = p * dp * tp
    gpn = min(gpus_per_node, n)
    cluster = Cluster(gpu=gpu, num_gpus=n, nic=get_nic(gpu.default_nic), gpus_per_node=gpn,
                      nvlink_domain=gpn, nics_per_node=gpu.nics_per_node)
    sched = schedule or ("interleaved" if v > 1 else "1f1b")
    s = Strategy(tp=tp, pp=p, dp=dp, vp=v, mbs=1, gbs=m * dp, schedule=sched, zero=zero, **strategy)
    return Plan(model=model, cluster=cluster, strategy=s)


def synthetic_costs(plan: Plan, *, fwd_s: float = 1.0, bwd_s: float = 2.0, p2p_s: float = 0.0,
                    dp_s: float = 0.0, optimizer_s: float = 0.0, tp_s: float = 0.0,
                    stage_scale: tuple[float, ...] | None = None) -> StepCosts:
    """Costs with ``fwd_s``/``bwd_s`` per stage and micro-batch, split evenly over its layers."""
    s = plan.strategy
    n = plan.model.num_layers // s.pp
    stages = []
    for i in range(s.pp):
        k = stage_scale[i] if stage_scale else 1.0
        lc = zeros(LayerCost, fwd_s=k * fwd_s / n, bwd_s=k * bwd_s / n, exposed_tp_fwd_s=tp_s / n,
                   exposed_tp_bwd_s=tp_s / n, tp_comm_fwd_s=tp_s / n, tp_comm_bwd_s=tp_s / n, params=1.0)
        pieces = zeros(StagePieces, dp_grad_sync_s=dp_s, optimizer_s=optimizer_s)
        stages.append(zeros(StageCost, stage=i, layers=tuple(range(i * n, (i + 1) * n)), layer_costs=(lc,) * n,
                            p2p_s=p2p_s if s.pp > 1 else 0.0, pieces=pieces, params=float(n)))
    return StepCosts(stages=tuple(stages), p2p_bytes=0.0)


def run_engine(plan: Plan, costs: StepCosts, *, explicit: bool = False, whatif: WhatIf | None = None) -> Engine:
    net = Network(plan.cluster)
    eng = Engine(Scenario(plan, costs, net, explicit=explicit, whatif=whatif), LinkTable(net))
    eng.run()
    return eng


def compute_log(eng: Engine, unit: int | None = None) -> list[tuple[int, str, float, float]]:
    """``[(unit, name, start, end)]`` of the compute passes, in time order."""
    out = [(e.unit, e.name, e.start, e.end) for e in eng.log if e.cat == "compute" and (unit is None or e.unit == unit)]
    return sorted(out, key=lambda x: (x[2], x[0]))
