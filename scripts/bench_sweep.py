#!/usr/bin/env python3
"""Benchmarks of the economics commands (numbers for the report; not a test).

    .venv/bin/python scripts/bench_sweep.py [--ray] [--quick]

1. ``planner sweep``'s default grid (Llama 3 70B; A100/H100/B200; 512/1024/2048 GPUs; fat-tree
   and rail-optimized; oversubscription 1 and 2 = 36 designs) serially and on the local
   process executor (and on a local Ray instance with ``--ray``).
2. ``planner goodput``'s simpy campaigns: 20 seeds of 30 days on 16,384 H100.
3. ``planner schedule``: a synthetic 5,000-job trace on 256 nodes under each policy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.economics.campaign import CampaignSpec, FailureMode, run_campaigns  # noqa: E402
from planner.economics.failures import cluster_rates  # noqa: E402
from planner.economics.goodput import goodput_report  # noqa: E402
from planner.economics.scheduler import POLICIES, ClusterSpec, simulate_schedule  # noqa: E402
from planner.economics.sweep import SweepOptions, design_grid, run_sweep  # noqa: E402
from planner.economics.traces import generate_jobs  # noqa: E402
from sim.data.catalog import get_gpu, get_nic  # noqa: E402
from sim.data.models import load_model  # noqa: E402
from sim.data.hardware import Cluster


def bench_sweep(use_ray: bool, quick: bool) -> None:
    counts = [512, 1024] if quick else [512, 1024, 2048]
    points = design_grid(models=["llama3-70b"], gpus=["a100-80gb", "h100-80gb", "b200-180gb"], counts=counts,
                         nics=[None], topologies=["fat-tree", "rail-optimized"], oversubscriptions=[1.0, 2.0])
    opts = SweepOptions()
    runs = [("serial", "local", 1), (f"local x{os.cpu_count()}", "local", None)]
    if use_ray:
        runs.append((f"ray x{os.cpu_count()}", "ray", None))
    for label, executor, workers in runs:
        t0 = time.perf_counter()
        res = run_sweep(points, opts, executor=executor, max_workers=workers)
        dt = time.perf_counter() - t0
        ok = sum(r["status"] == "ok" for r in res.rows)
        per = sum(r["eval_time_s"] for r in res.rows) / len(res.rows)
        print(f"sweep {len(points)} designs  {label:<12} {dt:6.1f} s  ({ok} feasible, {len(res.pareto)} on the "
              f"Pareto front, {per:.2f} s per design)")


def bench_campaign() -> None:
    c = Cluster(gpu=get_gpu("h100-80gb"), num_gpus=16384, nic=get_nic("roce-400"), gpus_per_node=8, nvlink_domain=8,
                nics_per_node=8)
    rep = goodput_report(load_model("llama3.1-405b"), c)
    rates = cluster_rates(c)
    modes = tuple(FailureMode(name=k, rate_per_s=v, needs_node=rates.needs_node[k]) for k, v in rates.by_component.items())
    spec = CampaignSpec(work_s=30 * 86400.0, interval_s=rep.checkpoint_interval_s, write_s=rep.checkpoint_write_s,
                        restart_s=rep.restart_s, restore_s=rep.checkpoint_restore_s, modes=modes, num_spares=21,
                        repair_s=86400.0)
    t0 = time.perf_counter()
    s = run_campaigns(spec, seeds=20)
    print(f"goodput campaigns  20 x 30 days on 16,384 H100: {time.perf_counter() - t0:5.2f} s "
          f"(goodput {s.goodput_mean:.3f} [{s.goodput_ci95[0]:.3f}, {s.goodput_ci95[1]:.3f}], Daly {rep.goodput:.3f})")


def bench_schedule() -> None:
    jobs = generate_jobs(num_jobs=5000, num_nodes=256, gpus_per_node=8, seed=1, mean_interarrival_s=300.0)
    spec = ClusterSpec(num_nodes=256, gpus_per_node=8, node_failure_rate_per_s=1 / (30 * 86400),
                       job_failure_rate_per_s=1 / (90 * 86400))
    for policy in POLICIES:
        t0 = time.perf_counter()
        r = simulate_schedule(spec, jobs, policy=policy, seed=1).summary()
        print(f"schedule 5000 jobs / 256 nodes {policy:<9} {time.perf_counter() - t0:5.2f} s  "
              f"(util {r['utilisation']:.1%}, mean wait {r['queue_wait_s']['mean'] / 3600:.1f} h)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ray", action="store_true", help="also run the sweep on a local Ray instance")
    ap.add_argument("--quick", action="store_true", help="a 24-design sweep instead of 36")
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    bench_campaign()
    bench_schedule()
    bench_sweep(a.ray, a.quick)


if __name__ == "__main__":
    main()
