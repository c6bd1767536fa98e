"""Benchmark `planner recommend`: candidates per second and wall time of the search.

Targets (issue 5): GPT-3 175B on 1024 A100 with a full space of 10^4+ candidates in about 2 s or
less on a 2-core machine; 16k-GPU clusters under 10 s.  Issue 20 part 4: GPT-3 175B / 1024 A100
search phase <= 0.4 s and <= 1.5 s wall; DeepSeek-V3 on 256 GB200 <= 10 s wall; Llama 3.1 405B on
16,384 H100 <= 6 s wall (docs/recommend.md, Speed, has the measured figures).  Since issue 21 ``recommend`` searches
each default framework profile (megatron-core, torchtitan, megatron-deepspeed) at bf16.  Wall
times follow the machine's load; CPU times (``total_cpu_s``, this process and its workers) less so.  Also measures the fast model against
``simulate_analytic`` per plan.

    .venv/bin/python scripts/bench_recommend.py [--quick] [--case SUBSTRING] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time

import numpy as np

from planner.plans.recommend import recommend
from planner.plans.search import SearchSpace, search
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_model
from sim.net.clusters import cluster_from_catalog
from sim.data.hardware import Cluster

CASES = [
    # name, model, gpu, num_gpus, gbs, seq_len[, cluster_from_catalog keywords]
    ("gpt3-175b / 1024 A100-80GB / gbs 1536", "gpt3-175b", "a100-80gb", 1024, 1536, 2048),
    ("gpt3-175b / 16384 A100-80GB / gbs 16384", "gpt3-175b", "a100-80gb", 16384, 16384, 2048),
    ("llama3.1-405b / 16384 H100 / gbs 2048 x 8192", "llama3.1-405b", "h100-80gb", 16384, 2048, 8192),
    ("mixtral-8x7b / 512 H100 / gbs 1024 x 4096", "mixtral-8x7b", "h100-80gb", 512, 1024, 4096),
    # issue 20 part 4: planner recommend --model deepseek-v3 --gpu gb200 --num-gpus 256 --gpus-per-node 4
    # --nvlink-domain 72 --gbs 1024 (the CLI's default sequence length, 2048)
    ("deepseek-v3 / 256 GB200 (4 per node, NVL72) / gbs 1024", "deepseek-v3", "gb200", 256, 1024, 2048,
     {"gpus_per_node": 4, "nvlink_domain": 72}),
]


def cluster(gpu: str, n: int, **kw: object) -> Cluster:
    return cluster_from_catalog(gpu, n, **kw)  # type: ignore[arg-type]


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the search may fork workers)."""
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def bench_case(name: str, model_id: str, gpu: str, n: int, gbs: int, seq: int,
               cluster_kw: dict[str, object] | None = None) -> dict[str, object]:
    model, cl = get_model(model_id), cluster(gpu, n, **(cluster_kw or {}))
    # recommend first: the process-wide memos (sim.layers.compute.op_times) start cold, as in a command
    t0, c0 = time.perf_counter(), _cpu_s()
    rec = recommend(model, cl, gbs=gbs, seq_len=seq, space=SearchSpace())
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    serial_wall = time.perf_counter()
    serial_cpu = _cpu_s()
    r = search(model, cl, gbs=gbs, seq_len=seq, workers=1)
    serial_wall, serial_cpu = time.perf_counter() - serial_wall, _cpu_s() - serial_cpu
    best = rec.best
    return {
        "search_serial_wall_s": serial_wall, "search_serial_cpu_s": serial_cpu, "serial_evaluated": r.evaluated,
        "case": name, "candidates_considered": rec.considered, "candidates_evaluated": rec.evaluated,
        "search_s": rec.timings_s.get("search_s"), "rerank_s": rec.timings_s.get("rerank_s"),
        "explain_s": rec.timings_s.get("explain_s"), "total_s": wall, "total_cpu_s": cpu,
        "frameworks": [r.framework for r in rec.searches],
        "evaluated_per_s": rec.evaluated / rec.timings_s["search_s"] if rec.timings_s.get("search_s") else None,
        "ranking": rec.ranking_engine,
        "best": best.strategy.to_string() if best else None,
        "best_step_time_s": best.result.step_time_s if best else None,
        "best_mfu": best.result.mfu if best else None,
    }


def bench_per_plan(samples: int = 200) -> dict[str, object]:
    """Seconds per plan: simulate_analytic vs the fast model (amortised over a search)."""
    model, cl = get_model("gpt3-175b"), cluster("a100-80gb", 1024)
    r = search(model, cl, gbs=1536, seq_len=2048)
    rng = np.random.default_rng(0)
    idx = rng.choice(r.evaluated, size=min(samples, r.evaluated), replace=False)
    plans = [r.fastmodel.plan(r.strategy(int(i))) for i in idx]
    t0 = time.perf_counter()
    worst = 0.0
    for i, p in zip(idx, plans):
        res = simulate_analytic(p, net=r.fastmodel.net)
        worst = max(worst, abs(r.candidates.step_time_s[i] / res.step_time_s - 1))
    exact = (time.perf_counter() - t0) / len(plans)
    return {"simulate_analytic_s_per_plan": exact, "fast_s_per_plan": r.search_time_s / max(1, r.considered),
            "fast_s_per_timed_plan": r.search_time_s / max(1, r.evaluated), "worst_relative_difference": worst,
            "sampled": len(plans)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the 1024-GPU case")
    ap.add_argument("--case", help="only the cases whose name contains this")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cases = CASES[:1] if args.quick else [c for c in CASES if args.case is None or args.case in c[0]]
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
           "cases": [bench_case(*c) for c in cases], "per_plan": bench_per_plan()}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"machine: {out['machine']['cpus']} CPUs, Python {out['machine']['python']}, "
          f"load average {os.getloadavg()[0]:.1f} (wall times grow with other work; CPU times do not)")
    for c in out["cases"]:
        print(f"{c['case']}: {c['candidates_considered']:,} candidates, {c['candidates_evaluated']:,} timed; "
              f"search {c['search_s']:.2f} s, total {c['total_s']:.2f} s ({c['total_cpu_s']:.2f} s CPU; rerank "
              f"{c['rerank_s']:.2f} s, "
              f"explain {c['explain_s']:.2f} s, ranking: {c['ranking']})")
        print(f"    one process, one profile, after the recommendation: search {c['search_serial_wall_s']:.2f} s wall, "
              f"{c['search_serial_cpu_s']:.2f} s CPU")
        print(f"    best: {c['best']}  step {c['best_step_time_s']:.3f} s  MFU {c['best_mfu']:.1%}")
    pp = out["per_plan"]
    print(f"per plan: simulate_analytic {pp['simulate_analytic_s_per_plan'] * 1e3:.2f} ms, fast model "
          f"{pp['fast_s_per_plan'] * 1e6:.1f} us per candidate ({pp['fast_s_per_timed_plan'] * 1e6:.1f} us per timed "
          f"plan); worst relative difference {pp['worst_relative_difference']:.1e} over {pp['sampled']} plans")


if __name__ == "__main__":
    main()
