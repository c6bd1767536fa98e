"""``planner validate memory``: the planner's memory per category against PyTorch's tracker.

``compare(plan)`` runs ``validate.memtrack.track`` on the stage the planner says peaks and
puts both sides next to each other: weights, gradients, optimizer states, activations,
temporaries and the allocated total (``sim.cost.memory``'s categories at its predicted peak moment;
the tracker's composition at its measured peak).  ``GRID`` is the standing set of plans
(torchtitan-built: dense Llama and GPT, MoE with expert parallelism and token imbalance;
tp with sequence parallelism, pp stages with their in-flight micro-batches, cp shapes, FSDP2
over dp; ZeRO 0 (autocast), 2 (no reshard after forward) and 3; no, op-level selective, full,
and Megatron-style partial block/uniform recomputation).  Models keep their width and are cut
to a few layers per stage (memory per layer is exact, the run takes seconds).

What cannot run this way is modelled from the framework's source instead (``sim.cost.memory``,
``catalogs/runtime.yaml`` model_states with the lines cited): Megatron-Core's distributed
optimizer and fp32 main-grad buffer, DeepSpeed's engines, Transformer Engine's fp8 saved
inputs.  float8 linears need torchao, which this grid does not install.
"""

from __future__ import annotations

import time

from sim.data.catalog import get_model
from sim.net.clusters import cluster_from_catalog
from sim.cost.framework import apply_framework, get_framework
from sim.cost.memory import plan_memory
from sim.cost.plan import Plan, parse_strategy

from validate.memtrack import CATEGORIES, track
from validate.titan import reduced

TOLERANCE = 0.03  # each category and the total (issue 22)

# (model, layers kept, GPUs, strategy); torchtitan profile; the sequence in the strategy
GRID: tuple[tuple[str, int, int, str], ...] = (
    # dense Llama 3 8B, FSDP2 over dp (zero 3), every recomputation mode, micro-batches
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=3,recompute=none"),
    ("llama3-8b", 2, 8, "dp=8,mbs=2,gbs=16,seq=4096,zero=3,recompute=none"),
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=16,seq=8192,zero=3,recompute=none"),
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=3,recompute=selective"),
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=16,seq=8192,zero=3,recompute=selective"),
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=3,recompute=full"),
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=16,seq=8192,zero=3,recompute=full"),
    ("llama3-8b", 4, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=3,recompute=full,recompute_num_layers=2,recompute_method=block"),
    ("llama3-8b", 4, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=3,recompute=full,recompute_num_layers=2"),
    ("llama3-8b", 4, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=3,recompute=full,recompute_num_layers=1,recompute_method=block"),
    ("llama3-8b", 2, 16, "dp=16,mbs=1,gbs=16,seq=8192,zero=3,recompute=none"),
    ("llama3-8b", 2, 64, "dp=64,mbs=1,gbs=64,seq=8192,zero=3,recompute=selective"),
    # ZeRO-2 class (reshard_after_forward=False) and no sharding (torch.autocast)
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=2,recompute=none"),
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=2,recompute=selective"),
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=0,recompute=none"),
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=16,seq=8192,zero=0,recompute=full"),
    ("llama3-8b", 2, 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=0,recompute=selective"),
    # context parallelism (per-rank shapes), FSDP over dp*cp
    ("llama3-8b", 2, 8, "dp=4,cp=2,mbs=1,gbs=4,seq=16384,zero=3,recompute=none"),
    ("llama3-8b", 2, 8, "dp=2,cp=4,mbs=1,gbs=2,seq=32768,zero=3,recompute=full"),
    ("llama3-8b", 2, 8, "dp=1,cp=8,mbs=1,gbs=1,seq=65536,zero=3,recompute=selective"),
    # tensor + sequence parallelism
    ("llama3-8b", 2, 8, "tp=2,dp=4,mbs=1,gbs=4,seq=8192,zero=3,sp=1,recompute=none"),
    ("llama3-8b", 2, 8, "tp=4,dp=2,mbs=1,gbs=2,seq=8192,zero=3,sp=1,recompute=full"),
    ("llama3-8b", 2, 8, "tp=8,dp=1,mbs=1,gbs=1,seq=8192,zero=0,sp=1,recompute=none"),
    ("llama3-8b", 2, 8, "tp=2,dp=4,mbs=1,gbs=4,seq=8192,zero=3,sp=1,recompute=selective"),
    # pipeline stages (FSDP2 with pp: no reshard, gradients accumulated unsharded in fp32)
    ("llama3-8b", 4, 8, "pp=2,dp=4,mbs=1,gbs=8,seq=8192,zero=3,recompute=none"),
    ("llama3-8b", 4, 8, "pp=2,dp=4,mbs=1,gbs=32,seq=8192,zero=3,recompute=full"),
    ("llama3-8b", 4, 8, "pp=4,dp=2,mbs=1,gbs=16,seq=4096,zero=3,recompute=selective"),
    ("llama3-8b", 4, 8, "pp=2,dp=4,mbs=1,gbs=16,seq=8192,zero=0,recompute=none"),
    ("llama3-8b", 4, 8, "pp=2,dp=4,mbs=1,gbs=4,seq=8192,zero=3,recompute=none,schedule=gpipe"),
    # GPT-style (GeLU, LayerNorm, MHA) and a bigger Llama
    ("gpt3-175b", 1, 64, "dp=64,mbs=1,gbs=64,seq=2048,zero=3,recompute=none"),
    ("gpt3-175b", 1, 64, "dp=64,mbs=1,gbs=64,seq=2048,zero=3,recompute=selective"),
    ("llama3-70b", 1, 64, "dp=64,mbs=1,gbs=64,seq=8192,zero=3,recompute=none"),
    ("llama3-70b", 1, 64, "dp=64,mbs=1,gbs=128,seq=8192,zero=3,recompute=full"),
    ("llama3-70b", 2, 64, "tp=8,dp=8,mbs=1,gbs=8,seq=8192,zero=3,sp=1,recompute=none"),
    # MoE: experts over ep, token imbalance on the busiest rank
    ("mixtral-8x7b", 2, 8, "dp=8,mbs=1,gbs=8,seq=4096,zero=3,recompute=none"),
    ("mixtral-8x7b", 2, 8, "dp=8,ep=2,mbs=1,gbs=8,seq=4096,zero=3,recompute=none"),
    ("mixtral-8x7b", 2, 8, "dp=8,ep=4,mbs=1,gbs=8,seq=4096,zero=3,recompute=none"),
    ("mixtral-8x7b", 2, 8, "dp=8,ep=8,mbs=1,gbs=8,seq=4096,zero=3,recompute=full"),
    ("mixtral-8x7b", 2, 8, "dp=8,ep=2,mbs=1,gbs=8,seq=4096,zero=3,recompute=selective"),
    ("mixtral-8x7b", 2, 8, "dp=8,ep=4,mbs=1,gbs=16,seq=4096,zero=3,recompute=none"),
    ("mixtral-8x7b", 2, 8, "dp=8,mbs=1,gbs=8,seq=4096,zero=0,recompute=none"),
)
IMBALANCED = {"mixtral-8x7b": 1.5}  # a second run of the MoE plans with the busiest rank at 1.5x the mean


def grid_plans(*, imbalance: bool = True) -> list[tuple[str, Plan]]:
    """The grid's plans (name, Plan)."""
    out = []
    for model_id, layers, n, text in GRID:
        out.append((f"{model_id}/{layers}L {text}", build_plan(model_id, layers, n, text)))
        if imbalance and model_id in IMBALANCED and ",ep=" in text and "recompute=none" in text:
            out.append((f"{model_id}/{layers}L {text} moe_imbalance={IMBALANCED[model_id]}",
                        build_plan(model_id, layers, n, text, moe_imbalance=IMBALANCED[model_id])))
    return out


def build_plan(model_id: str, layers: int, num_gpus: int, strategy: str, *, framework: str = "torchtitan",
               gpu: str = "h100-80gb", moe_imbalance: float = 1.0) -> Plan:
    """A plan of ``model_id`` cut to ``layers`` layers (``validate.titan.reduced``)."""
    model = reduced(get_model(model_id), layers)
    cluster = cluster_from_catalog(gpu=gpu, num_gpus=num_gpus)
    s = parse_strategy(strategy, num_gpus=num_gpus)
    kw = apply_framework({"model": model, "cluster": cluster, "strategy": s}, get_framework(framework))
    kw["moe_imbalance"] = moe_imbalance
    return Plan(**kw).checked()


def compare(plan: Plan, *, name: str = "") -> dict[str, object]:
    """Both sides per category (bytes), relative errors, and whether each is within
    ``TOLERANCE``."""
    t0 = time.perf_counter()
    mem = plan_memory(plan)
    measured = track(plan, stage=mem.stage)
    predicted = {"weights": mem.weights_bytes, "gradients": mem.gradients_bytes, "optimizer": mem.optimizer_bytes,
                 "activations": mem.activations_bytes, "temporaries": mem.temporaries_bytes,
                 "total": mem.allocated_bytes}
    rows = {}
    for c in CATEGORIES + ("total",):
        m, p = float(measured[c]), float(predicted[c])
        err = (p / m - 1) if m else (0.0 if abs(p) < 1 else float("inf"))
        # a category under 1% of the total is judged against the total (a few MiB of norms)
        ok = abs(err) <= TOLERANCE or abs(p - m) <= 0.01 * float(measured["total"])
        rows[c] = {"measured_bytes": m, "predicted_bytes": p, "error": err, "within_tolerance": ok}
    return {"name": name or plan.strategy.to_string(), "model": plan.model.name, "layers": plan.model.num_layers,
            "strategy": plan.strategy.to_string(), "moe_imbalance": plan.moe_imbalance, "stage": mem.stage,
            "categories": rows, "within_tolerance": all(r["within_tolerance"] for r in rows.values()),
            "seconds": time.perf_counter() - t0}


def run_grid(*, sample: int | None = None, seed: int = 0) -> dict[str, object]:
    """Compare every grid plan (or ``sample`` of them, drawn with ``seed``)."""
    import random

    plans = grid_plans()
    if sample is not None and sample < len(plans):
        plans = random.Random(seed).sample(plans, sample)
    rows = [compare(p, name=n) for n, p in plans]
    errs = {c: [abs(r["categories"][c]["error"]) for r in rows if r["categories"][c]["measured_bytes"] > 0]
            for c in CATEGORIES + ("total",)}
    summary = {c: {"median_abs_error": _median(v), "max_abs_error": max(v) if v else 0.0} for c, v in errs.items()}
    return {"plans": rows, "num_plans": len(rows), "num_within_tolerance": sum(r["within_tolerance"] for r in rows),
            "tolerance": TOLERANCE, "summary": summary}


def _median(v: list[float]) -> float:
    if not v:
        return 0.0
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def format_table(result: dict[str, object]) -> str:
    lines = [f"{'plan':78s} " + " ".join(f"{c[:6]:>14s}" for c in CATEGORIES + ("total",))]
    for r in result["plans"]:  # type: ignore[union-attr]
        cells = []
        for c in CATEGORIES + ("total",):
            x = r["categories"][c]
            cells.append(f"{x['predicted_bytes'] / 2**30:6.2f}/{x['measured_bytes'] / 2**30:6.2f}"
                         + ("" if x["within_tolerance"] else "*"))
        lines.append(f"{r['name'][:78]:78s} " + " ".join(f"{c:>14s}" for c in cells))
    lines.append(f"GiB predicted/measured per category; * outside {result['tolerance']:.0%}; "
                 f"{result['num_within_tolerance']}/{result['num_plans']} plans within in every category")
    return "\n".join(lines)
