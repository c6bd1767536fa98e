"""Up to three designs side by side, with the rows that differ and the best values marked.

A *snapshot* is a plain dict (so it lives in Streamlit's session state and pickles):
``label``, ``inputs`` (what the user chose) and ``metrics`` (what the chosen plan gives), plus
the step-time ``breakdown`` for the chart.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from appkit.charts import BREAKDOWN_PARTS, breakdown_parts
from appkit.present import mfu_pct, precision_text, strategy_of
from sim.base.units import GIB

MAX_DESIGNS = 3

# metric -> "min" or "max": which direction is better
BETTER: dict[str, str] = {
    "step time (s)": "min", "tokens/s": "max", "MFU (bf16 peak)": "max", "peak memory (GiB, device)": "min",
    "time to train (days)": "min", "cost to train (USD)": "min",
}


def snapshot(design, cluster, plan: Mapping[str, Any], economics: Mapping[str, Any]) -> dict[str, Any]:
    """What the compare view keeps of one design and its chosen plan."""
    cost = economics.get("cost_to_train_usd")
    s = strategy_of(plan, cluster, design.seq_len)
    scale_up = (f"PCIe ({cluster.server.design}, p2p {cluster.server.p2p})" if cluster.server is not None
                else f"NVLink domain of {cluster.nvlink_domain}")
    inputs = {
        "model": design.model.name,
        "GPU": cluster.gpu.id,
        "GPUs": cluster.num_gpus,
        "scale-up": scale_up,
        "NIC": f"{cluster.nics_per_node} x {cluster.nic.id} per node",
        "topology": cluster.topology + (f" {cluster.oversubscription:g}:1" if cluster.oversubscription != 1 else ""),
        "sequence length": design.seq_len,
        "framework": plan.get("framework") or design.framework or "default",
        "precision": precision_text(s),
        "strategy": plan["strategy"],
    }
    metrics = {
        "step time (s)": float(plan["step_time_s"]),
        "tokens/s": float(plan["tokens_per_s"]),
        "MFU (bf16 peak)": float(plan["mfu"]),  # one peak for every design, so they compare
        "peak memory (GiB, device)": float(plan["memory_device_bytes"]) / GIB,  # as nvidia-smi
        "fits memory": bool(plan["fits_memory"]),
        "time to train (days)": float(economics["time_to_train_s"]) / 86400.0,
        "cost to train (USD)": float(cost) if cost is not None else None,
    }
    label = f"{cluster.num_gpus} x {cluster.gpu.id} / {cluster.nic.id}"
    return {"label": label, "inputs": inputs, "metrics": metrics, "breakdown": breakdown_parts(plan),
            "step_time_s": float(plan["step_time_s"])}


def add_snapshot(kept: Sequence[Mapping[str, Any]], snap: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``kept`` plus ``snap``: an identical design replaces its old copy; beyond
    ``MAX_DESIGNS`` the oldest is dropped.  Labels are made unique (``#2``)."""
    out = [dict(s) for s in kept if s["inputs"] != snap["inputs"]]
    out.append(dict(snap))
    out = out[-MAX_DESIGNS:]
    seen: dict[str, int] = {}
    for s in out:
        base = s["label"].split(" #", 1)[0]
        seen[base] = seen.get(base, 0) + 1
        s["label"] = base if seen[base] == 1 else f"{base} #{seen[base]}"
    return out


def compare_rows(kept: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]], set[str], dict[str, int]]:
    """(row names, values[row][design], rows that differ, best design index per metric row)."""
    names: list[str] = []
    values: list[list[Any]] = []
    for section in ("inputs", "metrics"):
        for key in kept[0][section] if kept else ():
            names.append(key)
            values.append([s[section].get(key) for s in kept])
    differ = {n for n, row in zip(names, values) if len({repr(v) for v in row}) > 1}
    best: dict[str, int] = {}
    for n, row in zip(names, values):
        how = BETTER.get(n)
        nums = [(v, i) for i, v in enumerate(row) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if how and len(nums) > 1 and n in differ:
            best[n] = (min(nums) if how == "min" else max(nums))[1]
    return names, values, differ, best


def _fmt(name: str, v: Any) -> str:
    if v is None:
        return "n/a (no price)"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if name.startswith("MFU"):
        return mfu_pct(v)
    if name == "tokens/s":
        return f"{v:,.0f}"
    if name == "cost to train (USD)":
        return f"${v:,.0f}"
    if isinstance(v, float):
        return f"{v:,.3f}" if v < 100 else f"{v:,.1f}"
    return str(v)


def compare_frame(kept: Sequence[Mapping[str, Any]]):
    """A pandas Styler: designs as columns, differing rows tinted, best values bold green."""
    import pandas as pd

    names, values, differ, best = compare_rows(kept)
    cols = [s["label"] for s in kept]
    df = pd.DataFrame([[_fmt(n, v) for v in row] for n, row in zip(names, values)], index=names, columns=cols)

    def style(frame):
        css = pd.DataFrame("", index=frame.index, columns=frame.columns)
        for n in frame.index:
            if n in differ:
                css.loc[n, :] = "background-color: #fff3cd"
            if n in best:
                css.loc[n, frame.columns[best[n]]] = "background-color: #d4edda; font-weight: bold; color: #155724"
        return css

    return df.style.apply(style, axis=None)


def compare_figure(kept: Sequence[Mapping[str, Any]]):
    """Step-time breakdown of each kept design as stacked bars."""
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = [s["label"] for s in kept]
    for key, name, color in BREAKDOWN_PARTS:
        xs = [s["breakdown"].get(key, 0.0) for s in kept]
        if any(x > 0 for x in xs):
            fig.add_trace(go.Bar(y=labels, x=xs, name=name, orientation="h", marker_color=color,
                                 hovertemplate=f"{name}: %{{x:.3f}} s<extra>%{{y}}</extra>"))
    fig.update_layout(barmode="stack", height=140 + 40 * len(labels), margin=dict(l=10, r=10, t=30, b=10),
                      xaxis_title="seconds per optimizer step", yaxis=dict(autorange="reversed", type="category"),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, traceorder="normal"),
                      plot_bgcolor="white")
    return fig
