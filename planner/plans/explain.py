"""Why the recommended plan wins: what bounds it, what its neighbours trade, what was rejected.

* **Bound**: the largest share of the winner's step among compute, exposed communication (with
  its largest part: TP, CP, EP, PP or DP), pipeline bubble and optimizer (``Breakdown`` of
  ``sim.engines.result``).  The plan is also **memory-bound** when a one-step change that would be
  faster (less recomputation, a lower ZeRO stage, a bigger micro-batch, ...) does not fit.
* **Neighbours**: the winner with one setting changed, each re-simulated exactly
  (``simulate_analytic``): faster-but-does-not-fit, or slower, and by how much.
* **Alternatives**: the next plans of the ranking and the component of the step that makes each
  slower (the largest increase in the breakdown), and what it saves.
* **Rejections**: candidates rejected per reason (``planner.plans.search``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.base.errors import InputError
from sim.data.specs import SCHEDULES, Strategy
from sim.base.units import GIB, fmt_s

if TYPE_CHECKING:
    from planner.plans.recommend import Recommendation

PARTS = ("compute_s", "exposed_tp_s", "exposed_cp_s", "exposed_ep_s", "exposed_pp_s", "exposed_dp_s",
         "exposed_offload_s", "bubble_s", "optimizer_s", "overhead_s")
LABELS = {"compute_s": "compute", "exposed_tp_s": "exposed TP comm", "exposed_cp_s": "exposed CP comm",
          "exposed_ep_s": "exposed EP comm", "exposed_pp_s": "exposed PP comm", "exposed_dp_s": "exposed DP comm",
          "exposed_offload_s": "exposed offload copies", "bubble_s": "pipeline bubble", "optimizer_s": "optimizer step", "overhead_s": "overhead"}
REASONS = {"oom": "does not fit in GPU memory less the headroom kept free", "batch": "global batch not divisible by mbs*dp",
           "heads": "tp does not divide the attention heads", "layers": "too many pipeline stages/chunks for the layers",
           "indivisible": "degrees or micro-batches do not divide", "experts": "ep does not divide the experts",
           "unsupported": "precision not supported by the GPU", "gpu_count": "degrees do not multiply to the GPU count",
           "host_oom": "offloaded bytes exceed the node's host memory",
           "offload_unneeded": "offload where the plan fits without it"}


def _pct(x: float) -> str:
    return f"{x:+.3%}" if abs(x) < 0.001 else f"{x:+.1%}"


def bound(result: dict) -> tuple[str, dict[str, float]]:
    """(what bounds the step, share of the step per breakdown part): shares of the model's own
    step (``model_step_time_s`` where a calibrated estimate carries a bias), so a result and its
    headline (``planner.fitting.uncertainty.headline``) get the same verdict."""
    b, step = result["breakdown"], result.get("model_step_time_s", result["step_time_s"])
    shares = {k: b.get(k, 0.0) / step for k in PARTS}
    comm = sum(shares[k] for k in PARTS if k.startswith("exposed_"))
    groups = {"compute": shares["compute_s"], "exposed_comm": comm, "bubble": shares["bubble_s"],
              "optimizer": shares["optimizer_s"]}
    return max(groups, key=groups.__getitem__), shares


BOUND_WORDS = {"compute": "compute", "exposed_comm": "exposed communication", "bubble": "the pipeline bubble",
               "optimizer": "the optimizer step"}


def bound_line(result: dict) -> str:
    """The one verdict on what bounds a step, as every view prints it: ``bound by compute:
    compute 93%, exposed comm 6% (mostly TP comm), bubble 2% of the step``."""
    label, shares = bound(result)
    comm_parts = {k: v for k, v in shares.items() if k.startswith("exposed_") and v > 0}
    parts = [f"compute {shares['compute_s']:.0%}"]
    if comm_parts:
        top_comm = max(comm_parts, key=comm_parts.__getitem__)
        parts.append(f"exposed comm {sum(comm_parts.values()):.0%} (mostly {LABELS[top_comm].replace('exposed ', '')})")
    parts.append(f"bubble {shares['bubble_s']:.0%}")
    if shares["optimizer_s"] >= 0.005:
        parts.append(f"optimizer {shares['optimizer_s']:.0%}")
    return f"bound by {BOUND_WORDS[label]}: " + ", ".join(parts) + " of the step"


def diff_reason(base: dict, other: dict) -> str:
    """Why ``other`` is slower (or faster) than ``base``: the largest changes of the breakdown."""
    db = {k: other["breakdown"].get(k, 0.0) - base["breakdown"].get(k, 0.0) for k in PARTS}
    worse = sorted((k for k in PARTS if db[k] > 0), key=lambda k: -db[k])[:2]
    better = sorted((k for k in PARTS if db[k] < 0), key=lambda k: db[k])[:1]
    parts = [f"{LABELS[k]} +{fmt_s(db[k], ms_digits=1)}" for k in worse]
    if better and abs(db[better[0]]) > 1e-3 * base["step_time_s"]:
        parts.append(f"saves {fmt_s(-db[better[0]], ms_digits=1)} of {LABELS[better[0]]}")
    return ", ".join(parts) if parts else "same breakdown"


def neighbours(s: Strategy, num_layers: int, num_gpus: int, precisions: tuple[str, ...]) -> list[tuple[str, Strategy]]:
    """The winner with one setting changed (only those a ``Strategy`` accepts)."""
    out: list[tuple[str, dict]] = []
    for rc in ("none", "selective", "full"):
        if rc != s.recompute:
            out.append((f"recompute={rc}", {"recompute": rc}))
    if s.dp * s.cp > 1:
        for z in range(4):
            if z != s.zero:
                out.append((f"zero={z}", {"zero": z}))
    out.append((f"mbs={s.mbs * 2}", {"mbs": s.mbs * 2}))
    if s.mbs > 1:
        out.append((f"mbs={s.mbs // 2}", {"mbs": s.mbs // 2}))
    if s.tp > 1:
        out.append((f"sp={int(not s.sp)}", {"sp": not s.sp}))
    if s.pp > 1:
        for sched in SCHEDULES:
            if sched == s.schedule:
                continue
            vp = s.vp if sched in ("interleaved", "zero-bubble") else 1
            if sched == "interleaved" and vp == 1:
                vp = 2
            out.append((f"schedule={sched}" + (f",vp={vp}" if vp != s.vp else ""), {"schedule": sched, "vp": vp}))
        if s.vp > 1:
            out.append((f"vp={s.vp - 1}", {"vp": s.vp - 1} if s.vp > 2 or s.schedule == "zero-bubble"
                        else {"vp": 1, "schedule": "1f1b"}))
        if s.pp * (s.vp + 1) <= num_layers:
            out.append((f"vp={s.vp + 1}", {"vp": s.vp + 1, "schedule": s.schedule if s.vp > 1 else "interleaved"}))
    for prec in precisions:
        if prec != s.precision:
            out.append((f"precision={prec}", {"precision": prec}))
    if s.offload != "none":  # what offloading buys: the same plan keeping everything on the GPU
        out.append(("offload=none", {"offload": "none", "offload_device": "cpu"}))
    for dim in ("tp", "pp"):
        v = getattr(s, dim)
        if s.dp % 2 == 0:
            out.append((f"{dim}={v * 2}", {dim: v * 2, "dp": s.dp // 2}))
        if v % 2 == 0:
            out.append((f"{dim}={v // 2}", {dim: v // 2, "dp": s.dp * 2}))
    result = []
    for label, change in out:
        try:
            cand = s.with_(**change)
            if cand.sp and cand.tp == 1:
                cand = cand.with_(sp=False)
            if cand.pp == 1 and (cand.vp > 1 or cand.schedule != "1f1b"):
                cand = cand.with_(vp=1, schedule="1f1b")
        except (InputError, ValueError):
            continue
        if cand.num_gpus != num_gpus:
            continue
        result.append((label, cand))
    return result


def explain_recommendation(rec: "Recommendation") -> dict[str, object]:
    from sim.engines.analytic import simulate_analytic

    win = rec.plans[0]
    wd = win.result.to_dict()
    label, shares = bound(wd)
    mem_frac = wd["memory_device_bytes"] / wd["memory_capacity_bytes"]
    fm = win.search.fastmodel if win.search is not None else \
        next(r.fastmodel for r in rec.searches if r.cluster.num_gpus == win.num_gpus)
    precisions = rec.space.precisions(win.cluster)

    base = wd if win.engine == "analytic" else _analytic_dict(rec, win)
    near = []
    for change, cand in neighbours(win.strategy, rec.model.num_layers, win.num_gpus, precisions):
        try:
            res = simulate_analytic(fm.plan(cand), net=fm.net, eff=fm.eff)
        except InputError:
            continue
        rd = res.to_dict()
        delta = res.step_time_s / win.analytic_step_time_s - 1
        near.append({"change": change, "strategy": cand.to_string(), "step_time_s": res.step_time_s,
                     "delta": delta, "fits_memory": res.fits_memory, "memory_peak_bytes": res.memory_device_bytes,
                     "why": diff_reason(base, rd)})
    near.sort(key=lambda n: n["delta"])
    faster_oom = [n for n in near if n["delta"] < -rec.tie_tolerance and not n["fits_memory"]]
    memory_bound = bool(faster_oom)

    alts = []
    for p in rec.plans[1:4]:
        pd = p.result.to_dict()
        alts.append({"rank": p.rank, "strategy": p.strategy.to_string(), "step_time_s": p.result.step_time_s,
                     "delta": p.objective_value / win.objective_value - 1, "why": diff_reason(wd, pd)})

    lines = [bound_line(wd)]
    mem_line = f"memory {wd['memory_device_bytes'] / GIB:.1f} of {wd['memory_capacity_bytes'] / GIB:.0f} GiB ({mem_frac:.0%})"
    if memory_bound:
        f = faster_oom[0]
        mem_line += (f"; memory-bound: {f['change']} would be {-f['delta']:.1%} faster but needs "
                     f"{f['memory_peak_bytes'] / GIB:.1f} GiB")
    lines.append(mem_line)
    for a in alts:
        lines.append(f"#{a['rank']} loses by {_pct(a['delta'])}: {a['why']}")
    slower = [n for n in near if n["delta"] >= 0 and n["fits_memory"]][:3]
    for n in slower:
        lines.append(f"{n['change']}: {_pct(n['delta'])} ({n['why']})")
    rej = rec.rejected
    if rej:
        lines.append("rejected: " + ", ".join(f"{v:,} {k} ({REASONS.get(k, k)})" for k, v in rej.items()))
    return {"bound_by": label, "memory_bound": memory_bound, "shares": shares,
            "memory_fraction": mem_frac, "neighbours": near, "faster_but_out_of_memory": faster_oom,
            "alternatives": alts, "rejected": rej, "lines": lines}


def _analytic_dict(rec: "Recommendation", plan) -> dict:
    from sim.engines.analytic import simulate_analytic

    fm = plan.search.fastmodel if plan.search is not None else \
        next(r.fastmodel for r in rec.searches if r.cluster.num_gpus == plan.num_gpus)
    return simulate_analytic(fm.plan(plan.strategy), net=fm.net, eff=fm.eff).to_dict()


def explain_infeasible(rec: "Recommendation") -> dict[str, object]:
    """Why nothing fits, naming the real blocker: host memory when plans that offload fit the
    GPU but not the node's host memory, else GPU memory (with the headroom kept free), else the
    divisibility and feasibility rules."""
    from sim.cost.offload import host_spec

    rej = rec.rejected
    lines = [f"no plan fits: {sum(rej.values()):,} candidates rejected"]
    if rej:
        lines.append("rejected: " + ", ".join(f"{v:,} {k} ({REASONS.get(k, k)})" for k, v in rej.items()))
    closest = [r.closest_oom for r in rec.searches if r.closest_oom is not None]
    hosts = [r.closest_host_oom for r in rec.searches if r.closest_host_oom is not None]
    blocker = "host memory" if hosts else ("memory" if rej.get("oom") else "feasibility")
    out: dict[str, object] = {"bound_by": blocker, "rejected": rej}
    cap = rec.cluster.gpu.hbm_bytes
    limit = cap * (1.0 - rec.memory_headroom)
    if hosts:
        need, s = min(hosts, key=lambda c: c[0])
        have = host_spec(rec.cluster).host_dram_bytes
        lines.append(f"blocked by host memory: offloading makes {s.to_string()} fit the GPU, but the node would hold "
                     f"{need / GIB:,.0f} GiB of offloaded states, more than its {have / GIB:,.0f} GiB of host memory "
                     "(--host-dram-gib, more GPUs to shard over, or offload_device=nvme)")
        out["host_memory"] = {"strategy": s.to_string(), "host_bytes_per_node": need, "host_capacity_bytes": have}
    if closest:
        peak, s = min(closest, key=lambda c: c[0])
        lines.append(f"closest to fitting the GPU: {s.to_string()} needs {peak / GIB:.1f} GiB of the {limit / GIB:.1f} "
                     f"GiB a plan may use ({cap / GIB:.0f} GiB less the {rec.memory_headroom:.0%} headroom)")
        out["closest"] = {"strategy": s.to_string(), "memory_peak_bytes": peak, "capacity_bytes": cap,
                          "limit_bytes": limit}
    out["lines"] = lines
    return out
