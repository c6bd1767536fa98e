"""Plotly figures of one step: where the time goes, memory against capacity, the pipeline Gantt.

Inputs are the INTERFACE JSON of ``planner simulate`` (``StepResult.to_dict()``) and Chrome
trace events (``traceEvents``) as the event engine writes them; nothing here simulates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from sim.base.units import GIB, fmt_s


# Step-time parts in the order a reader expects them (compute first, idle last).
BREAKDOWN_PARTS: tuple[tuple[str, str, str], ...] = (
    ("compute", "compute", "#4c78a8"),
    ("recompute", "recompute", "#9ecae9"),
    ("exposed_tp_s", "exposed TP comm", "#f58518"),
    ("exposed_cp_s", "exposed CP comm", "#ffbf79"),
    ("exposed_ep_s", "exposed EP comm", "#e45756"),
    ("exposed_pp_s", "exposed PP comm", "#ff9d98"),
    ("exposed_dp_s", "exposed DP comm", "#b279a2"),
    ("exposed_offload_s", "exposed offload copies", "#d6616b"),
    ("bubble_s", "pipeline bubble", "#bab0ac"),
    ("optimizer_s", "optimizer", "#54a24b"),
    ("overhead_s", "overhead", "#72b7b2"),
)

MEMORY_PARTS: tuple[tuple[str, str, str], ...] = (
    ("weights_bytes", "weights", "#4c78a8"),
    ("gradients_bytes", "gradients", "#72b7b2"),
    ("optimizer_bytes", "optimizer states", "#54a24b"),
    ("activations_bytes", "activations", "#f58518"),
    ("temporaries_bytes", "backward temporaries", "#e45756"),
    ("reserve_bytes", "allocator, CUDA context, NCCL", "#bab0ac"),
)


def breakdown_parts(result: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per part of ``BREAKDOWN_PARTS`` (compute without recompute, recompute apart).

    The parts sum to ``breakdown`` total = ``step_time_s`` (INTERFACE invariant).
    """
    b = result["breakdown"]
    recompute = float(b.get("recompute_s", 0.0))
    out = {"compute": float(b["compute_s"]) - recompute, "recompute": recompute}
    for key, _, _ in BREAKDOWN_PARTS[2:]:
        out[key] = float(b.get(key, 0.0))
    # exposed_comm_s may hold parts the engine does not split: keep them visible
    split = sum(out[k] for k in ("exposed_tp_s", "exposed_cp_s", "exposed_ep_s", "exposed_pp_s", "exposed_dp_s",
                                 "exposed_offload_s"))
    rest = float(b.get("exposed_comm_s", split)) - split
    if rest > 1e-12:
        out["exposed_dp_s"] += rest
    return out


def breakdown_figure(results: Sequence[tuple[str, Mapping[str, Any]]]):
    """Stacked horizontal bars of step time, one row per ``(label, result)`` (first on top)."""
    import plotly.graph_objects as go

    labels = [lab for lab, _ in results]
    parts = [breakdown_parts(r) for _, r in results]
    fig = go.Figure()
    for key, name, color in BREAKDOWN_PARTS:
        xs = [p[key] for p in parts]
        if not any(x > 0 for x in xs):
            continue
        totals = [r["step_time_s"] for _, r in results]
        fig.add_trace(go.Bar(
            y=labels, x=xs, name=name, orientation="h", marker_color=color,
            customdata=[[fmt_s(x), x / t if t else 0.0] for x, t in zip(xs, totals)],
            hovertemplate=f"{name}: %{{customdata[0]}} (%{{customdata[1]:.1%}})<extra>%{{y}}</extra>"))
    fig.update_layout(barmode="stack", height=120 + 38 * len(labels), margin=dict(l=10, r=10, t=30, b=10),
                      xaxis_title="seconds per optimizer step", yaxis=dict(autorange="reversed", type="category"),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, traceorder="normal"),
                      plot_bgcolor="white")
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    return fig


def memory_parts_gib(result: Mapping[str, Any]) -> dict[str, float]:
    mem = result["memory"]
    return {key: float(mem.get(key, 0.0)) / GIB for key, _, _ in MEMORY_PARTS}


def memory_figure(results: Sequence[tuple[str, Mapping[str, Any]]]):
    """Per-GPU memory (most loaded stage) stacked against the GPU's capacity (dashed line)."""
    import plotly.graph_objects as go

    labels = [lab for lab, _ in results]
    parts = [memory_parts_gib(r) for _, r in results]
    fig = go.Figure()
    for key, name, color in MEMORY_PARTS:
        fig.add_trace(go.Bar(y=labels, x=[p[key] for p in parts], name=name, orientation="h", marker_color=color,
                             hovertemplate=f"{name}: %{{x:.1f}} GiB<extra>%{{y}}</extra>"))
    caps = {float(r["memory"]["capacity_bytes"]) / GIB for _, r in results}
    for cap in sorted(caps):
        fig.add_vline(x=cap, line_dash="dash", line_color="#d62728",
                      annotation_text=f"HBM {cap:.0f} GiB", annotation_position="bottom right")
    totals = [sum(p.values()) for p in parts]
    top = max(totals + list(caps)) * 1.08
    fig.update_layout(barmode="stack", height=150 + 38 * len(labels), margin=dict(l=10, r=10, t=30, b=10),
                      xaxis=dict(title="GiB on the most loaded GPU (device level, as nvidia-smi)", range=[0, top]),
                      yaxis=dict(autorange="reversed", type="category"),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, traceorder="normal"),
                      plot_bgcolor="white")
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    return fig


# --------------------------------------------------------------------------- timeline


@dataclass(frozen=True, slots=True)
class GanttBar:
    track: str
    start_s: float
    dur_s: float
    name: str
    category: str


CATEGORY_COLORS = {
    "forward": "#4c78a8", "backward": "#f58518", "weight-grad": "#eeca3b", "recompute": "#9ecae9",
    "tp": "#e45756", "cp": "#ffbf79", "ep": "#d67195", "pp": "#ff9d98", "dp": "#b279a2", "dp-ag": "#d4a6c8",
    "optimizer": "#54a24b", "wait": "#dddddd", "other": "#bab0ac",
}

# Compute passes as the event engine names them: F<mb>[.<chunk>], B..., W... (zero-bubble
# weight gradients), R... (recomputation).
_PASS = re.compile(r"^(?P<p>[FBWR])\d+(\.\d+)?\b")
_PASS_CATEGORY = {"F": "forward", "B": "backward", "W": "weight-grad", "R": "recompute"}


def classify(name: str, cat: str = "") -> str:
    """Color category of a trace event: its stream category (``tp``, ``pp``, ``dp`` ...) for
    communication, the pass (forward, backward, weight-grad, recompute) for compute."""
    c = (cat or "").strip().lower()
    n = (name or "").strip()
    if n.lower().startswith("wait"):
        return "wait"
    if c in CATEGORY_COLORS and c not in ("other",):
        return c
    m = _PASS.match(n)
    if m:
        return _PASS_CATEGORY[m.group("p")]
    low = n.lower()
    if "optim" in low:
        return "optimizer"
    if "recomput" in low:
        return "recompute"
    for key in ("forward", "backward"):
        if key in low:
            return key
    return "other"


_STAGE = re.compile(r"\(stage (\d+)")


def _short_process(name: str) -> str:
    """``rank 256 (stage 1, stands for its 256 ranks)`` -> ``stage 1 (rank 256)``."""
    m = _STAGE.search(name)
    if not m:
        return name
    rank = name.split("(", 1)[0].strip()
    return f"stage {m.group(1)} ({rank})" if rank else f"stage {m.group(1)}"


def gantt_bars(trace: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[GanttBar]:
    """Complete (``ph: X``) events of a Chrome trace as bars; tracks named from the
    ``process_name`` / ``thread_name`` metadata events.  Times are microseconds in the
    trace format and seconds here."""
    events = trace.get("traceEvents", []) if isinstance(trace, Mapping) else trace
    pname: dict[Any, str] = {}
    tname: dict[tuple[Any, Any], str] = {}
    for ev in events:
        if ev.get("ph") == "M":
            args = ev.get("args") or {}
            if ev.get("name") == "process_name":
                pname[ev.get("pid")] = str(args.get("name", ev.get("pid")))
            elif ev.get("name") == "thread_name":
                tname[(ev.get("pid"), ev.get("tid"))] = str(args.get("name", ev.get("tid")))
    bars = []
    for ev in events:
        if ev.get("ph") != "X":
            continue
        try:
            ts, dur = float(ev.get("ts", 0.0)), float(ev.get("dur", 0.0))
        except (TypeError, ValueError):
            continue
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
            continue
        pid, tid = ev.get("pid"), ev.get("tid")
        proc = _short_process(pname.get(pid, f"pid {pid}"))
        thread = tname.get((pid, tid), f"tid {tid}")
        name = str(ev.get("name", ""))
        bars.append(GanttBar(track=f"{proc} / {thread}", start_s=ts * 1e-6, dur_s=dur * 1e-6, name=name,
                             category=classify(name, str(ev.get("cat", "")))))
    return bars


def merge_bars(bars: Iterable[GanttBar], *, max_bars: int = 12000, resolution: float = 1.0 / 2000) -> list[GanttBar]:
    """Merge bars of the same track and category that touch at screen resolution (gap at most
    ``resolution`` of the step, about a pixel), so a 1024-GPU step (10^4 events) stays light.

    Only gaps below a pixel are closed: a stream busy 5% of the step must not be drawn as
    busy throughout.  If more than ``max_bars`` remain, the shortest bars are dropped (the app
    prints both counts)."""
    ordered = sorted(bars, key=lambda b: (b.track, b.start_s))
    if not ordered:
        return []
    t0 = min(b.start_s for b in ordered)
    span = max(b.start_s + b.dur_s for b in ordered) - t0
    gap = span * resolution
    out: list[GanttBar] = []
    for b in ordered:
        last = out[-1] if out else None
        if (last is not None and last.track == b.track and last.category == b.category
                and b.start_s <= last.start_s + last.dur_s + gap):
            end = max(last.start_s + last.dur_s, b.start_s + b.dur_s)
            name = last.name if last.name == b.name else f"{last.category} (merged)"
            out[-1] = GanttBar(last.track, last.start_s, end - last.start_s, name, last.category)
        else:
            out.append(b)
    if len(out) > max_bars:
        keep = sorted(out, key=lambda b: -b.dur_s)[:max_bars]
        out = sorted(keep, key=lambda b: (b.track, b.start_s))
    return out


def _track_order(track: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", track))


def timeline_figure(bars: Sequence[GanttBar], *, title: str = ""):
    """Gantt chart: one row per simulated rank and stream, bars colored by category."""
    import plotly.graph_objects as go

    tracks = sorted({b.track for b in bars}, key=_track_order)
    fig = go.Figure()
    by_cat: dict[str, list[GanttBar]] = {}
    for b in bars:
        by_cat.setdefault(b.category, []).append(b)
    for cat in CATEGORY_COLORS:
        bs = by_cat.get(cat)
        if not bs:
            continue
        fig.add_trace(go.Bar(
            y=[b.track for b in bs], x=[b.dur_s for b in bs], base=[b.start_s for b in bs], orientation="h",
            name=cat, marker_color=CATEGORY_COLORS[cat], marker_line_width=0,
            customdata=[[b.name, fmt_s(b.dur_s)] for b in bs],
            hovertemplate="%{customdata[0]}<br>start %{base:.4f} s, %{customdata[1]}<extra>%{y}</extra>"))
    fig.update_layout(barmode="overlay", height=120 + 26 * max(1, len(tracks)),
                      margin=dict(l=10, r=10, t=40 if title else 10, b=10), title=title or None,
                      xaxis_title="seconds into the step", bargap=0.25,
                      yaxis=dict(categoryorder="array", categoryarray=tracks, autorange="reversed"),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0), plot_bgcolor="white")
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    return fig
