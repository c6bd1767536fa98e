"""Predicted versus measured: simulate every measured workload with a calibration profile.

A workload record (``validate.workloads.run``) carries the model, the strategy in the
simulator's terms and the number of ranks per host; the prediction is
``sim.engines.simulate.simulate(plan, calibration=profile)`` on a cluster of that many calibrated
devices, nothing else: no per-workload factor.  Errors are ``predicted / measured - 1``.

Memory: the simulator counts activations at 2 bytes per element; on a device that trains in
fp32 they take 4, so the activation part of the predicted peak is scaled by the profile's
element ratio, and the framework workspace comes from the profile's ``memory`` section.  On a
CPU the measurement is the growth of the resident set, allocator slack included.  On a GPU the
predicted total (tensors + workspace + fragmentation) is compared with the peak the caching
allocator reserved, and the predicted tensors alone with the peak allocated
(``validate.memstats``); memory outside the allocator (CUDA context, NCCL buffers) is reported,
not predicted.
"""

from __future__ import annotations

import statistics
from typing import Any

from sim.cost.calibration import Calibration, load_calibration
from sim.data.catalog import get_nic
from sim.cost.memory import memory_breakdown
from sim.cost.plan import Plan
from sim.data.runtime import default_runtime
from sim.engines.simulate import simulate
from sim.data.hardware import Cluster
from sim.data.specs import Strategy


def _strategy(w: dict[str, Any]) -> Strategy:
    from validate.specs import WorkloadSpec

    return WorkloadSpec.from_dict(w["spec"]).strategy()


def plan_for(w: dict[str, Any], cal: Calibration):
    """The simulator's ``Plan`` for a measured workload on ``cal``'s hardware."""
    from validate.specs import ModelConfig

    model = ModelConfig.from_dict(w["spec"]["model"]).to_sim_model()
    strategy = _strategy(w)
    world = int(w["world_size"])
    per_host = int(w.get("env", {}).get("local_world_size", world)) or world
    per_host = min(per_host, world)
    nic = cal.nic or get_nic(cal.gpu.default_nic)
    cluster = Cluster(gpu=cal.gpu, num_gpus=world, nic=nic, gpus_per_node=per_host, nvlink_domain=per_host,
                      nics_per_node=min(cal.gpu.nics_per_node, per_host) if cal.host.device_type == "cuda" else 1,
                      scale_up=cal.scale_up)
    return Plan(model=model, cluster=cluster, strategy=strategy, attention="flash").checked()


def predict(w: dict[str, Any], cal: Calibration, *, engine: str = "analytic") -> dict[str, Any]:

    plan = plan_for(w, cal)
    res = simulate(plan, engine=engine, calibration=cal.path)
    applied = cal.apply_plan(plan)
    mem = memory_breakdown(applied.model, applied.cluster, applied.strategy, attention=applied.attention,
                           runtime=cal.memory_runtime(default_runtime()), allocator=applied.allocator)
    # measured: the reserved peak (GPU) or resident-set growth (CPU): the reserved level
    act_extra = (cal.host.element_ratio - 1.0) * mem.activations_bytes
    mem_bytes = mem.reserved_bytes + act_extra
    return {"predicted_step_time_s": res.step_time_s, "predicted_memory_peak_bytes": mem_bytes,
            "predicted_tensor_bytes": mem.allocated_bytes + act_extra,
            "breakdown": res.breakdown.as_dict(), "warnings": list(res.warnings)}


def _err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or not meas:
        return None
    return pred / meas - 1.0


def compare(workloads: list[dict[str, Any]], calibration: str, *, engine: str = "analytic") -> dict[str, Any]:
    """Per-workload rows and a summary (``median_abs_error`` over step times)."""
    cal = load_calibration(calibration)
    rows = []
    for w in workloads:
        p = predict(w, cal, engine=engine)
        e = _err(p["predicted_step_time_s"], w["measured_step_time_s"])
        # GPU: the allocator's reserved peak is what the predicted total stands for
        measured_mem = w.get("measured_memory_reserved_bytes", w.get("measured_memory_peak_bytes"))
        em = _err(p["predicted_memory_peak_bytes"], measured_mem)
        et = (_err(p["predicted_tensor_bytes"], w.get("measured_memory_peak_bytes"))
              if "measured_memory_reserved_bytes" in w else None)
        rows.append({
            "name": w["name"], "steps_used": w.get("steps_used"), "kind": w.get("kind"), "strategy": w.get("strategy"), "world_size": w["world_size"],
            "model": w["spec"]["model"].get("name"),
            "measured_step_time_s": w["measured_step_time_s"], "predicted_step_time_s": p["predicted_step_time_s"],
            "error": e, "abs_error": abs(e) if e is not None else None,
            "measured_memory_peak_bytes": measured_mem,
            "predicted_memory_peak_bytes": p["predicted_memory_peak_bytes"], "memory_error": em,
            "measured_memory_allocated_bytes": w.get("measured_memory_peak_bytes"),
            "predicted_tensor_bytes": p["predicted_tensor_bytes"], "tensor_memory_error": et,
            "measured_outside_allocator_bytes": w.get("measured_outside_allocator_bytes"),
            "breakdown": p["breakdown"],
        })
    out = {"calibration": cal.id, "engine": engine, "workloads": rows, **summarize(rows)}
    out["warnings"] = contention_warnings(workloads)
    return out


def contention_warnings(workloads: list[dict[str, Any]], microbench: list[dict[str, Any]] | None = None) -> list[str]:
    """Say when other processes competed for the host during a measurement."""
    from validate.specs import CONTENDED_CORES

    out = []
    for r in microbench or []:
        if r.get("kind") == "contention" and r["other_processes_cores"] > CONTENDED_CORES:
            out.append(f"other processes used {r['other_processes_cores']:.2f} cores during the microbenchmarks: "
                       "the profile may be pessimistic")
    for w in workloads:
        c = w.get("other_processes_cores") or []
        if c and w.get("steps_used", len(c)) == len(c) and max(c) > CONTENDED_CORES:
            out.append(f"{w['name']}: other processes used up to {max(c):.2f} cores during its steps "
                       "(too few quiet steps to leave them out)")
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [r["abs_error"] for r in rows if r.get("abs_error") is not None]
    mem = [abs(r["memory_error"]) for r in rows if r.get("memory_error") is not None]
    by_kind: dict[str, list[float]] = {}
    for r in rows:
        if r.get("abs_error") is not None:
            by_kind.setdefault(str(r.get("kind")), []).append(r["abs_error"])
    return {
        "median_abs_error": statistics.median(errs) if errs else None,
        "mean_abs_error": statistics.fmean(errs) if errs else None,
        "max_abs_error": max(errs) if errs else None,
        "within_25pct": sum(e <= 0.25 for e in errs),
        "num_workloads": len(rows),
        "median_abs_error_by_kind": {k: statistics.median(v) for k, v in sorted(by_kind.items())},
        "memory_median_abs_error": statistics.median(mem) if mem else None,
    }


def format_table(result: dict[str, Any]) -> str:
    """The comparison as a fixed-width text table."""
    lines = [f"calibration {result['calibration']}  ({result['engine']} engine)",
             f"{'workload':<24} {'strategy':<22} {'measured':>10} {'predicted':>10} {'error':>8}"
             f" {'mem meas':>9} {'mem pred':>9} {'error':>7}"]
    for r in result["workloads"]:
        strat = ",".join(x for x in str(r["strategy"]).split(",")
                         if x.split("=")[0] in ("tp", "pp", "dp", "vp", "zero", "schedule", "mbs", "gbs")
                         and x not in ("tp=1", "pp=1", "dp=1"))
        me = r["memory_error"]
        lines.append(f"{r['name']:<24} {strat[:22]:<22} {r['measured_step_time_s'] * 1e3:>8.1f}ms"
                     f" {r['predicted_step_time_s'] * 1e3:>8.1f}ms {r['error']:>+8.1%}"
                     f" {(r['measured_memory_peak_bytes'] or 0) / 2**20:>7.0f}MB"
                     f" {r['predicted_memory_peak_bytes'] / 2**20:>7.0f}MB"
                     f" {me:>+7.0%}" if me is not None else "")
    lines.append(f"median |error| {result['median_abs_error']:.1%}  mean {result['mean_abs_error']:.1%}  "
                 f"max {result['max_abs_error']:.1%}  within 25%: {result['within_25pct']}/{result['num_workloads']}"
                 + (f"  memory median |error| {result['memory_median_abs_error']:.0%}"
                    if result.get("memory_median_abs_error") is not None else ""))
    lines += [f"warning: {w}" for w in result.get("warnings", [])]
    return "\n".join(lines)
