"""What a design search leaves behind for people (``planner sweep --out DIR``).

* ``trials.csv``: every trial (Optuna) or design (grid), one row each: the design, its status,
  time and cost to train, capex, power, throughput, the plan's strategy, whether it is on the
  front (``on_front``) and, for Optuna, whether the sampler repeated a costed design;
* ``pareto.png`` (matplotlib) and ``pareto.html`` (plotly, interactive): cost to train against
  time to train of every costed design, the front joined per model.  One figure builder
  (``front_figure``) serves the HTML and the app (``appkit/search_front.py``);
* ``best_designs.json``: the front, each design with the plan it uses and the ``planner tco``
  command that reproduces it.

matplotlib and plotly are the optional ``search`` extra; without them the plots are skipped with
a warning and the CSV and JSON are still written.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Mapping, Sequence

from sim.base.errors import InputError
from sim.base.jsonout import dumps
from sim.base.outpaths import make_folder, write_text

COLUMNS: tuple[str, ...] = (
    "study", "trial", "state", "duplicate", "model", "gpu", "num_gpus", "nic", "topology", "oversubscription",
    "status", "reason", "on_front", "time_to_train_days", "time_to_train_s", "cost_to_train_usd", "capex_usd",
    "network_capex_usd", "cloud_cost_to_train_usd", "power_w", "energy_kwh", "tokens_per_s", "mfu", "goodput",
    "strategy", "strategy_source", "constraint_violation", "eval_time_s")
_NUMERIC = {"trial", "num_gpus", "oversubscription", "time_to_train_days", "time_to_train_s", "cost_to_train_usd",
            "capex_usd", "network_capex_usd", "cloud_cost_to_train_usd", "power_w", "energy_kwh", "tokens_per_s",
            "mfu", "goodput", "constraint_violation", "eval_time_s"}


def design_key(row: Mapping[str, object]) -> tuple:
    return (row.get("model"), row.get("gpu"), row.get("num_gpus"), row.get("nic"), row.get("topology"),
            row.get("oversubscription"))


def tco_command(row: Mapping[str, object]) -> str:
    """The ``planner tco`` command that costs the design with its plan."""
    return (f"planner tco --model {row['model']} --gpu {row['gpu']} --num-gpus {row['num_gpus']} --nic {row['nic']} "
            f"--topology {row['topology']} --oversubscription {row['oversubscription']:g} "
            f"--strategy '{row['strategy']}'")


def best_designs(pareto: Sequence[Mapping[str, object]]) -> list[dict]:
    """The front, fastest first per model, each with its plan."""
    return [{"model": r["model"], "gpu": r["gpu"], "num_gpus": r["num_gpus"], "nic": r["nic"],
             "topology": r["topology"], "oversubscription": r["oversubscription"],
             "time_to_train_days": r["time_to_train_days"], "time_to_train_s": r["time_to_train_s"],
             "cost_to_train_usd": r["cost_to_train_usd"], "capex_usd": r.get("capex_usd"), "power_w": r["power_w"],
             "plan": {"strategy": r["strategy"], "source": r.get("strategy_source"), "tokens_per_s": r["tokens_per_s"],
                      "mfu": r["mfu"], "goodput": r.get("goodput")},
             "command": tco_command(r)} for r in pareto]


def write_trials_csv(path: Path, trials: Sequence[Mapping[str, object]], pareto: Sequence[Mapping[str, object]]) -> None:
    front = {design_key(r) for r in pareto}
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for t in trials:
            row = {k: t.get(k, "") for k in COLUMNS}
            row["on_front"] = int(design_key(t) in front and t.get("status") == "ok")
            row["duplicate"] = int(bool(t.get("duplicate")))
            w.writerow({k: ("" if v is None else v) for k, v in row.items()})


def read_trials_csv(path: str | Path) -> list[dict]:
    """``trials.csv`` back as rows (numbers as floats, ``on_front`` as bool), one per design (the
    first trial of each)."""
    p = Path(path)
    if not p.is_file():
        raise InputError("trials", str(path), "no such file (planner sweep --out DIR writes DIR/trials.csv)")
    out, seen = [], set()
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("model", "gpu", "num_gpus", "status", "time_to_train_s", "cost_to_train_usd")
                   if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError("trials", str(path), f"not a planner sweep trials.csv (missing {', '.join(missing)})")
        for raw in reader:
            row: dict[str, object] = {}
            for k, v in raw.items():
                if k in _NUMERIC:
                    row[k] = float(v) if v not in ("", None) else None
                else:
                    row[k] = v
            row["num_gpus"] = int(row["num_gpus"]) if row.get("num_gpus") is not None else None  # type: ignore[arg-type]
            row["on_front"] = raw.get("on_front") == "1"
            key = design_key(row)
            if key not in seen:
                seen.add(key)
                out.append(row)
    return out


def _label(r: Mapping[str, object]) -> str:
    return (f"{r['num_gpus']} x {r['gpu']}, {r['nic']}, {r['topology']} 1:{float(r['oversubscription']):g}")  # type: ignore[arg-type]


def _costed(rows: Sequence[Mapping[str, object]]) -> list[Mapping[str, object]]:
    return [r for r in rows if r.get("status") in ("ok", "constrained") and r.get("time_to_train_s") is not None
            and r.get("cost_to_train_usd") is not None and math.isfinite(float(r["cost_to_train_usd"]))]  # type: ignore[arg-type]


def front_figure(rows: Sequence[Mapping[str, object]], pareto: Sequence[Mapping[str, object]], *, title: str = ""):
    """A plotly figure: every costed design (by GPU type; designs over a budget or power cap as
    crosses) and each model's front, time to train (days) against cost to train, log axes; hover
    shows the design and its plan."""
    import plotly.graph_objects as go

    fig = go.Figure()
    costed = _costed(rows)
    for gpu in dict.fromkeys(str(r["gpu"]) for r in costed):
        for status, symbol in (("ok", "circle"), ("constrained", "x")):
            pts = [r for r in costed if r["gpu"] == gpu and r["status"] == status]
            if not pts:
                continue
            fig.add_trace(go.Scatter(
                x=[float(r["time_to_train_s"]) / 86400 for r in pts], y=[r["cost_to_train_usd"] for r in pts],  # type: ignore[arg-type]
                mode="markers", name=gpu + ("" if status == "ok" else " (over a limit)"),
                marker={"symbol": symbol, "size": 9, "opacity": 0.75},
                text=[f"{r['model']}: {_label(r)}<br>{r.get('strategy', '')}<br>{r.get('reason') or ''}" for r in pts],
                hovertemplate="%{text}<br>%{x:.1f} days, $%{y:,.0f}<extra></extra>"))
    for model in dict.fromkeys(str(r["model"]) for r in pareto):
        front = sorted((r for r in pareto if r["model"] == model), key=lambda r: float(r["time_to_train_s"]))  # type: ignore[arg-type]
        fig.add_trace(go.Scatter(
            x=[float(r["time_to_train_s"]) / 86400 for r in front], y=[r["cost_to_train_usd"] for r in front],  # type: ignore[arg-type]
            mode="lines+markers", name=f"Pareto front ({model})", line={"width": 2},
            marker={"size": 12, "symbol": "star"},
            text=[f"{_label(r)}<br>{r.get('strategy', '')}" for r in front],
            hovertemplate="%{text}<br>%{x:.1f} days, $%{y:,.0f}<extra>front</extra>"))
    fig.update_layout(title=title or "Cluster designs: time to train vs cost to train",
                      xaxis_title="time to train (days)", yaxis_title="cost to train (USD)",
                      xaxis_type="log", yaxis_type="log", template="plotly_white", legend={"orientation": "v"})
    return fig


def write_png(path: Path, rows: Sequence[Mapping[str, object]], pareto: Sequence[Mapping[str, object]],
              title: str = "") -> None:
    """The same picture as ``front_figure`` with matplotlib (no browser needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    costed = _costed(rows)
    for gpu in dict.fromkeys(str(r["gpu"]) for r in costed):
        for status, marker in (("ok", "o"), ("constrained", "x")):
            pts = [r for r in costed if r["gpu"] == gpu and r["status"] == status]
            if pts:
                ax.scatter([float(r["time_to_train_s"]) / 86400 for r in pts],  # type: ignore[arg-type]
                           [float(r["cost_to_train_usd"]) for r in pts], marker=marker, alpha=0.7,  # type: ignore[arg-type]
                           label=gpu + ("" if status == "ok" else " (over a limit)"))
    for model in dict.fromkeys(str(r["model"]) for r in pareto):
        front = sorted((r for r in pareto if r["model"] == model), key=lambda r: float(r["time_to_train_s"]))  # type: ignore[arg-type]
        xs = [float(r["time_to_train_s"]) / 86400 for r in front]  # type: ignore[arg-type]
        ys = [float(r["cost_to_train_usd"]) for r in front]  # type: ignore[arg-type]
        ax.plot(xs, ys, "-*", color="black", markersize=11, linewidth=1.5, label=f"Pareto front ({model})")
        for r, x, y in zip(front, xs, ys):
            ax.annotate(f"{r['num_gpus']}x{r['gpu']}", (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time to train (days)")
    ax.set_ylabel("cost to train (USD)")
    ax.set_title(title or "Cluster designs: time to train vs cost to train")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(out_dir: str | Path, *, rows: Sequence[Mapping[str, object]], trials: Sequence[Mapping[str, object]],
                  pareto: Sequence[Mapping[str, object]], summary: Mapping[str, object]) -> tuple[list[Path], list[str]]:
    """Write the files of the module docstring into ``out_dir`` (created); returns (paths, warnings)."""
    out = make_folder("out", out_dir)  # a file or an unwritable place is refused (sim.base.outpaths)
    paths, warnings = [out / "trials.csv", out / "best_designs.json"], []
    write_trials_csv(paths[0], trials, pareto)
    doc = {"summary": dict(summary), "best_designs": best_designs(pareto)}
    write_text("out", paths[1], dumps(doc) + "\n")  # strict JSON: inf/nan as null (sim.base.jsonout)
    title = str(summary.get("title", ""))
    try:
        write_png(out / "pareto.png", rows, pareto, title)
        paths.append(out / "pareto.png")
    except ImportError as exc:
        warnings.append(f"pareto.png not written: {exc} (pip install 'cluster-planner[search]')")
    try:
        front_figure(rows, pareto, title=title).write_html(out / "pareto.html", include_plotlyjs=True)
        paths.append(out / "pareto.html")
    except ImportError as exc:
        warnings.append(f"pareto.html not written: {exc} (pip install 'cluster-planner[search]')")
    return paths, warnings
