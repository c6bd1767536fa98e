"""Benchmark of the event engine (docs/event_engine.md, "Performance").

    .venv/bin/python scripts/bench_event.py [--repeat 3] [--json]

Cases: one step of GPT-3 175B on 4096 A100s with pp=16 and 128 micro-batches, interleaved
(vp=3 and vp=6 bracket the issue's vp=4, which 96 layers do not allow: pp*vp must divide
them), symmetric mode; and explicit-rank runs on 1024 GPUs (every data-parallel replica
simulated).  Prints wall seconds (best of ``--repeat``) for the whole ``simulate()`` call
(costing included) and for the engine alone, with the numbers of passes and flows simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sim.data.catalog import get_gpu, get_nic  # noqa: E402
from sim.net.network import Network  # noqa: E402
from sim.cost.costs import step_costs  # noqa: E402
from sim.engines.event.engine import simulate_event  # noqa: E402
from sim.data.models import load_model  # noqa: E402
from sim.cost.plan import Plan, parse_strategy  # noqa: E402
from sim.data.hardware import Cluster

CASES = [
    ("gpt3-175b 4096 GPUs pp=16 vp=3 m=128 (symmetric)", "gpt3-175b", "a100-80gb", 4096,
     "tp=8,pp=16,vp=3,mbs=1,gbs=4096,sp=1,recompute=selective", False),
    ("gpt3-175b 4096 GPUs pp=16 vp=6 m=128 (symmetric)", "gpt3-175b", "a100-80gb", 4096,
     "tp=8,pp=16,vp=6,mbs=1,gbs=4096,sp=1,recompute=selective", False),
    ("gpt3-175b 1024 GPUs pp=16 m=192 (explicit: 128 lock-step TP groups)", "gpt3-175b", "a100-80gb", 1024,
     "tp=8,pp=16,mbs=1,gbs=1536,sp=1,recompute=selective", True),
    ("llama3-8b 1024 GPUs tp=1 pp=8 dp=128 m=16 (explicit: 1024 ranks)", "llama3-8b", "h100-80gb", 1024,
     "tp=1,pp=8,mbs=1,gbs=2048", True),
    ("llama3-8b 1024 GPUs tp=1 pp=8 dp=128 m=64 (explicit: 1024 ranks)", "llama3-8b", "h100-80gb", 1024,
     "tp=1,pp=8,mbs=1,gbs=8192", True),
]


def plan_of(model: str, gpu: str, n: int, strategy: str) -> Plan:
    g = get_gpu(gpu)
    c = Cluster(gpu=g, num_gpus=n, nic=get_nic(g.default_nic), gpus_per_node=g.gpus_per_node,
                nvlink_domain=max(g.nvlink_domain_size, g.gpus_per_node), nics_per_node=g.nics_per_node)
    return Plan(model=load_model(model), cluster=c, strategy=parse_strategy(strategy, num_gpus=n)).checked()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for label, model, gpu, n, strategy, explicit in CASES:
        plan = plan_of(model, gpu, n, strategy)
        total, engine_only = float("inf"), float("inf")
        for _ in range(args.repeat if not explicit else 1):
            t0 = time.perf_counter()
            net = Network(plan.cluster)
            costs = step_costs(plan, net)
            t1 = time.perf_counter()
            r = simulate_event(plan, net=net, costs=costs, explicit_ranks=explicit)
            t2 = time.perf_counter()
            total, engine_only = min(total, t2 - t0), min(engine_only, t2 - t1)
        ev = r.extra["event"]
        rows.append({"case": label, "wall_s": total, "engine_wall_s": engine_only, "step_time_s": r.step_time_s,
                     "simulated_units": ev["simulated_units"], "passes": ev["passes"], "flows": ev["flows"]})
    info = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            "load_average": os.getloadavg()[0], "python": platform.python_version(), "rows": rows}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(f"# {info['machine']}, load {info['load_average']:.1f}, Python {info['python']}")
        for row in rows:
            print(f"{row['case']:<70} {row['wall_s']:7.2f} s  (engine {row['engine_wall_s']:6.2f} s; "
                  f"{row['simulated_units']} units, {row['passes']} passes, {row['flows']} flows; "
                  f"step {row['step_time_s']:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
