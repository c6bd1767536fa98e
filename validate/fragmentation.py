"""``planner validate fragmentation``: the caching allocator's slack, measured by replay.

For each plan of ``PLANS`` (full-depth Llama 3 8B on 8 H100s as torchtitan builds it: FSDP2,
tensor/sequence, pipeline and context parallelism, each recomputation mode), ``validate.memtrack``
records the allocation trace of two training steps under ``FakeTensorMode`` and
``validate.allocator`` replays it through PyTorch's caching-allocator rules, with and without
``expandable_segments``.  The peak reserved over the peak allocated, minus one, is the
fragmentation of that plan; ``catalogs/runtime.yaml`` (``memory.fragmentation.plans``) keeps each
plan's two values and ``sim.data.runtime`` takes the median per allocator mode and
recomputation mode.  Rerun this after changing the tracker's model or the allocator replay and
copy the printed block into the catalog.
"""

from __future__ import annotations

import time

from sim.data.runtime import ALLOCATORS

from validate.allocator import replay
from validate.memgrid import build_plan
from validate.memtrack import track

MODEL, LAYERS, GPUS = "llama3-8b", 32, 8
PLANS: tuple[str, ...] = (
    "dp=8,mbs=2,gbs=16,seq=8192,zero=3,recompute=none",
    "dp=8,mbs=1,gbs=8,seq=4096,zero=0,recompute=none",
    "tp=2,dp=4,mbs=1,gbs=4,seq=8192,zero=3,sp=1,recompute=none",
    "tp=8,mbs=1,gbs=1,seq=8192,zero=0,sp=1,recompute=none",
    "tp=2,pp=2,dp=2,mbs=1,gbs=16,seq=8192,zero=0,sp=1,recompute=none",
    "dp=8,mbs=2,gbs=16,seq=8192,zero=3,recompute=selective",
    "dp=8,mbs=1,gbs=8,seq=8192,zero=3,recompute=selective",
    "tp=2,dp=4,mbs=1,gbs=4,seq=8192,zero=3,sp=1,recompute=selective",
    "dp=8,mbs=1,gbs=8,seq=8192,zero=3,recompute=full",
    "tp=4,dp=2,mbs=1,gbs=2,seq=8192,zero=0,sp=1,recompute=full",
    "pp=2,dp=4,mbs=1,gbs=16,seq=8192,zero=3,recompute=full",
    "dp=4,cp=2,mbs=1,gbs=4,seq=16384,zero=3,recompute=full",
)


def measure(strategy: str, *, steps: int = 2) -> dict[str, object]:
    """One plan's replayed peaks and fragmentation under both allocator modes."""
    t0 = time.perf_counter()
    plan = build_plan(MODEL, LAYERS, GPUS, strategy)
    events: list = []
    track(plan, events=events, steps=steps)
    out: dict[str, object] = {"strategy": strategy, "recompute": plan.strategy.recompute}
    for mode in ALLOCATORS:
        r = replay(events, expandable_segments=mode == "expandable_segments")
        out[mode] = round(r["fragmentation"], 4)
        out[f"{mode}_reserved_bytes"] = r["reserved_bytes"]
        out["allocated_bytes"] = r["allocated_bytes"]  # the same in both modes: the trace's peak
    out["seconds"] = time.perf_counter() - t0
    return out


def run(plans: tuple[str, ...] = PLANS, *, workers: int = 2) -> dict[str, object]:
    """Every plan, each in a fresh process (one fake process group and device mesh per
    process: torch.distributed keeps group names across a destroy and re-init)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, max_tasks_per_child=1) as pool:
        rows = list(pool.map(measure, plans))
    return {"model": MODEL, "layers": LAYERS, "num_gpus": GPUS, "plans": rows}


def format_yaml(result: dict[str, object]) -> str:
    """The ``memory.fragmentation.plans`` block of ``catalogs/runtime.yaml``."""
    lines = ["    plans:"]
    for r in result["plans"]:  # type: ignore[union-attr]
        lines.append(f'      - {{strategy: "{r["strategy"]}", recompute: {r["recompute"]}, '
                     f'caching: {r["caching"]}, expandable_segments: {r["expandable_segments"]}}}')
    return "\n".join(lines)
