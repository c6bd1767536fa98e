"""How a plan reads on the page: the plans table, the one verdict on what bounds a step, the
80% band next to a time, and a cluster described as what it is.

The app tells the story the CLI tells (``planner recommend``'s text output): plans numbered by
the recommender's rank (the user's fixed strategy is "yours", not #1), the same "bound by"
sentence (``planner.plans.explain.bound_line``), and bands read from the plan
(``step_time_s_low`` / ``_high``, ``planner.fitting.uncertainty``).  Nothing here simulates.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from appkit.charts import fmt_s
from planner.plans.explain import bound_line
from sim.base.errors import InputError
from sim.cost.plan import parse_strategy
from sim.data.hardware import Cluster
from sim.data.specs import Strategy
from sim.base.units import GIB

MEMORY_COLUMN = "peak memory (GiB, device)"


def rank_label(plan: Mapping[str, Any]) -> str:
    """``#1`` .. ``#5`` for the recommender's plans (its own rank), ``yours`` for a fixed strategy."""
    if plan.get("source") == "yours":
        return "yours"
    return f"#{plan['rank']}" if plan.get("rank") is not None else "#?"


def plan_choice_label(plan: Mapping[str, Any]) -> str:
    return f"{rank_label(plan)}  {plan['strategy']}"


def ranked(plans: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The user's plan first, then the recommender's in its rank order (the order it returned
    them when a plan has no ``rank``)."""
    mine = [p for p in plans if p.get("source") == "yours"]
    rec = [p for p in plans if p.get("source") != "yours"]
    order = sorted(range(len(rec)), key=lambda i: (rec[i].get("rank") is None, rec[i].get("rank") or 0, i))
    return mine + [rec[i] for i in order]


def strategy_of(plan: Mapping[str, Any], cluster: Cluster, seq_len: int) -> Strategy | None:
    try:
        return parse_strategy(str(plan["strategy"]), num_gpus=cluster.num_gpus, seq_len=seq_len)
    except InputError:
        return None


def precision_text(s: Strategy | None) -> str:
    """``bf16``, or ``fp8 (delayed)`` with the fp8 scaling recipe the plan assumes."""
    if s is None:
        return ""
    return f"fp8 ({s.fp8_recipe})" if s.precision == "fp8" else s.precision


def mfu_shown(value: float | None) -> float | None:
    """An MFU as a table shows it: ``None`` (blank) above 100%, never a figure above the peak
    (the CLI's table writes ``>100%``; ``planner.report.mfu_text`` says why)."""
    return None if value is None or float(value) > 1.0 else round(float(value), 4)


def mfu_pct(value: float) -> str:
    """``41.3%``, or ``>100%`` (a figure above the peak is no MFU: the model is optimistic there)."""
    return ">100%" if value > 1.0 else f"{value:.1%}"


def mfu_of_fp8_peak(plan: Mapping[str, Any]) -> float | None:
    """MFU against the fp8 peak for an fp8 plan (``mfu_of_precision_peak``), else ``None``."""
    return float(plan["mfu_of_precision_peak"]) if plan.get("precision") == "fp8" else None


def band_text(low: float | None, high: float | None, fmt: Callable[[float], str] = fmt_s) -> str:
    return "" if low is None or high is None else f"{fmt(low)} .. {fmt(high)}"


def scaled_band(value: float, plan: Mapping[str, Any], figures: Mapping[str, Any], key: str
                ) -> tuple[float | None, float | None]:
    """The 80% band of ``figures[key]`` (a time or cost to train): the figures' own
    ``<key>_low`` / ``_high`` when they carry them, else the plan's step-time band applied to
    ``value``: time to train = tokens / throughput / goodput and every cost term of
    ``planner tco`` (depreciation, energy, facility, GPU-hours) is proportional to that wall
    time, so the relative band of the step carries over."""
    low, high = figures.get(f"{key}_low"), figures.get(f"{key}_high")
    if low is not None and high is not None:
        return float(low), float(high)
    step, lo, hi = plan.get("step_time_s"), plan.get("step_time_s_low"), plan.get("step_time_s_high")
    if not step or lo is None or hi is None:
        return None, None
    return value * float(lo) / float(step), value * float(hi) / float(step)


def model_step(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The plan as the model timed it: ``model_step_time_s`` and the breakdown without the
    calibration term (``planner.fitting.uncertainty.headline`` adds the bias of published runs like it
    to ``overhead_s`` and shows it as ``calibration_s``; it is not a mechanism of the step)."""
    bd = dict(plan.get("breakdown") or {})
    if "model_step_time_s" not in plan or "calibration_s" not in bd:
        return dict(plan)
    cal = float(bd.pop("calibration_s"))
    bd["overhead_s"] = float(bd.get("overhead_s", 0.0)) - cal
    return {**plan, "step_time_s": float(plan["model_step_time_s"]), "breakdown": bd}


def verdict(plan: Mapping[str, Any]) -> str:
    """The one sentence on what bounds the plan (``planner.plans.explain.bound_line`` of the model's
    step, as the CLI's "why #1" writes it), with memory first when the plan does not fit."""
    line = bound_line(model_step(plan))
    if not plan.get("fits_memory", True):
        return "does not fit in GPU memory; " + line
    return line


# The plans table, one column per entry: (name, value of a plan row).  ``ctx`` holds the parsed
# strategy, #1 and its throughput, and the search's framework.  A new column is one line here.
Column = tuple[str, Callable[[Mapping[str, Any], dict[str, Any]], Any]]


def _deg(name: str) -> Column:
    return name, lambda p, c: getattr(c["s"], name) if c["s"] is not None else None


COLUMNS: tuple[Column, ...] = (
    ("rank", lambda p, c: rank_label(p)),
    ("step time (s)", lambda p, c: round(float(p["step_time_s"]), 4)),
    ("timed by", lambda p, c: p.get("engine", "")),  # event (re-ranked) or analytic: ranks mix the two
    ("80% band (s)", lambda p, c: band_text(p.get("step_time_s_low"), p.get("step_time_s_high"),
                                            lambda t: f"{t:.3f}")),
    ("vs #1", lambda p, c: (f"{c['best_tps'] / float(p['tokens_per_s']) - 1:+.1%}"
                            if c["best_tps"] and p is not c["first"] else "")),
    ("tokens/s", lambda p, c: round(float(p["tokens_per_s"]))),
    # MFU against the bf16 peak (the convention Megatron, NeMo and torchtitan print) and, for fp8
    # plans, against the fp8 peak, as `planner recommend` labels them; blank above 100%.
    ("MFU (bf16 peak)", lambda p, c: mfu_shown(p["mfu"])),
    ("MFU (fp8 peak)", lambda p, c: mfu_shown(mfu_of_fp8_peak(p))),
    ("model TFLOP/s per GPU", lambda p, c: (round(float(p["model_tflops_per_gpu"]), 1)
                                            if p.get("model_tflops_per_gpu") is not None else None)),
    # the device level (as nvidia-smi): what the recommender's memory headroom and "fits" judge
    (MEMORY_COLUMN, lambda p, c: round(float(p["memory_device_bytes"]) / GIB, 1)),
    ("fits", lambda p, c: bool(p["fits_memory"])),
    ("framework", lambda p, c: p.get("framework") or c["framework"]),
    ("precision", lambda p, c: precision_text(c["s"])),
    _deg("tp"), _deg("pp"), _deg("dp"), _deg("cp"), _deg("ep"), _deg("vp"), _deg("mbs"), _deg("gbs"),
    _deg("zero"), _deg("recompute"), _deg("schedule"),
    ("strategy", lambda p, c: p["strategy"]),
)


def plans_table(plans: Sequence[Mapping[str, Any]], cluster: Cluster, seq_len: int, *,
                framework: str | None = None) -> list[dict[str, Any]]:
    """Rows of the plans table, in ``ranked`` order.  ``framework`` names what the search
    assumed when a plan does not carry its own ``framework``."""
    rows = ranked(plans)
    first = next((p for p in rows if p.get("source") != "yours"), None)
    best_tps = float(first["tokens_per_s"]) if first is not None else None
    out = []
    for p in rows:
        ctx = {"s": strategy_of(p, cluster, seq_len), "best_tps": best_tps, "first": first,
               "framework": framework or ""}
        out.append({name: fn(p, ctx) for name, fn in COLUMNS})
    return out


def cluster_summary(cluster: Cluster) -> str:
    """The cluster as what it is: NVLink domains for SXM parts, the PCIe server for cards
    (``sim.data.hostspecs.Server``: sockets, switches, peer-to-peer mode, bridges)."""
    c = cluster
    nodes = c.num_gpus // c.gpus_per_node
    head = f"{nodes:,} node{'s' if nodes != 1 else ''} x {c.gpus_per_node} {c.gpu.id}"
    if c.server is not None:
        sv = c.server
        switches = len(sv.switch_socket)
        inside = (f"{sv.sockets} socket{'s' if sv.sockets != 1 else ''}, "
                  + (f"{switches} PCIe switch{'es' if switches != 1 else ''}" if switches else "no PCIe switch")
                  + f", {sv.gpu_link_label} per GPU")
        p2p = {"pcie": "GPU peer-to-peer over PCIe",
               "none": "no GPU peer-to-peer (GPU-GPU traffic staged through host memory)"}.get(sv.p2p, f"p2p {sv.p2p}")
        bridges = (f", NVLink bridges join {len(sv.bridges)} group(s) of {len(sv.bridges[0])} GPUs" if sv.bridges
                   else ", no NVLink")
        text = f"{head} on PCIe ({sv.design}: {inside}); {p2p}{bridges}"
    else:
        text = f"{head}, NVLink domain of {c.nvlink_domain} GPUs"
    if nodes > 1:
        over = f" {c.oversubscription:g}:1" if c.oversubscription != 1 else ""
        text += f"; {c.nics_per_node} x {c.nic.id} per node, {c.topology}{over}"
    else:
        text += "; one node: no scale-out network"
    return text
