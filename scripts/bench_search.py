#!/usr/bin/env python3
"""Optuna against the grid on a space the grid still covers (numbers for docs/economics.md).

    .venv/bin/python scripts/bench_search.py [--trials 16,24,32,40] [--seeds 5] [--workers 2] [--full-engine]

Costs every design of the space once (the grid, ``planner sweep``'s evaluation), then runs
``planner sweep --search optuna``'s study with each trial budget and seed, the designs it asks
for answered from the grid's costs (the evaluation is deterministic, so this is the study a real
run makes, without paying each evaluation again per seed).  Reports per budget the multiplicative
epsilon indicator of the found front against the grid's (1.02 = within 2%), the hypervolume
ratio, and how many seeds reach 2%.  Default space: Llama 3 70B; A100/H100/B200; 256-2048 GPUs
(4 counts); the GPU's usual NIC and RoCE 400G; fat-tree and rail-optimized; oversubscription 1
and 2: 96 designs, quick strategy engine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.economics.design_search import (Constraints, DesignSpace, epsilon_indicator, hypervolume_2d,  # noqa: E402
                                             run_optuna)
from planner.economics.sweep import SweepOptions, pareto_front, run_sweep  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", default="16,24,32,40,48")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--sampler", default="tpe")
    ap.add_argument("--full-engine", action="store_true", help="the recommender over the whole space (slow)")
    args = ap.parse_args()
    space = DesignSpace(models=("llama3-70b",), gpus=("a100-80gb", "h100-80gb", "b200-180gb"),
                        counts=(256, 512, 1024, 2048), nics=(None, "roce-400"),
                        topologies=("fat-tree", "rail-optimized"), oversubscriptions=(1.0, 2.0))
    opts = SweepOptions(quick=not args.full_engine)
    points, _ = space.designs(Constraints())
    t0 = time.perf_counter()
    grid = run_sweep(points, opts, executor="local", max_workers=args.workers)
    dt = time.perf_counter() - t0
    rows = {(p.gpu, p.num_gpus, p.nic, p.topology, p.oversubscription): r for p, r in zip(points, grid.rows)}
    ref = pareto_front(list(grid.rows))
    ok = [r for r in grid.rows if r["status"] == "ok"]
    ref_pt = (max(r["time_to_train_s"] for r in ok) * 1.1, max(r["cost_to_train_usd"] for r in ok) * 1.1)
    hv_ref = hypervolume_2d(ref, ref_pt)
    print(f"grid: {len(points)} designs ({len(ok)} feasible) in {dt:.0f} s, {len(ref)} on the front")

    def lookup(p, _options):
        return dict(rows[(p.gpu, p.num_gpus, p.nic, p.topology, p.oversubscription)])

    print(f"{'trials':>7} {'eps (per seed)':<44} {'within 2%':>10} {'HV ratio min':>13} {'study s':>8}")
    for trials in [int(t) for t in args.trials.split(",")]:
        eps, hv, secs = [], [], []
        for seed in range(args.seeds):
            t1 = time.perf_counter()
            res = run_optuna(space, opts, Constraints(), trials=trials, seed=seed, workers=1, evaluate=lookup,
                             sampler=args.sampler)
            secs.append(time.perf_counter() - t1)
            eps.append(epsilon_indicator(res.pareto, ref))
            hv.append(hypervolume_2d(res.pareto, ref_pt) / hv_ref)
        print(f"{trials:>7} {' '.join(f'{e:.4f}' for e in eps):<44} {sum(e <= 1.02 for e in eps):>6}/{len(eps)} "
              f"{min(hv):>13.4f} {sum(secs) / len(secs):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
