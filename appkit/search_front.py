"""The front of a design search in the app: the figure ``planner sweep --out DIR`` writes as
``pareto.html`` (``planner.economics.search_report.front_figure``, one builder for both), read
from that run's ``trials.csv`` (a directory or file on the server: ``PLANNER_SWEEP_DIR`` or typed
in).  The section stands apart from the sidebar's design: ``render()`` is its only
entry point."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import streamlit as st

from planner.economics.search_report import best_designs, front_figure, read_trials_csv
from sim.base.errors import InputError


def load_front(source: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(costed designs, front) of a sweep's ``trials.csv`` (or the directory holding it)."""
    p = Path(source)
    rows = read_trials_csv(p / "trials.csv" if p.is_dir() else p)
    return rows, [r for r in rows if r["on_front"]]


def render() -> None:
    """An expander with the front of a ``planner sweep --out`` run and its best designs."""
    with st.expander("Design search front (planner sweep --search optuna --out DIR)", expanded=False):
        default = os.environ.get("PLANNER_SWEEP_DIR", "")
        where = st.text_input("Sweep output directory or its trials.csv", value=default, key="sweep_dir")
        if not where:
            st.caption("Run e.g. `planner sweep --search optuna --trials 64 --out sweep-out` and point here to "
                       "sweep-out: the same front as its pareto.html, each design with its plan.")
            return
        try:
            rows, front = load_front(where)
        except (InputError, ValueError, KeyError) as exc:
            st.error(f"Cannot read the sweep: {exc}")
            return
        st.plotly_chart(front_figure(rows, front), key="sweep_front_chart")
        st.dataframe([{"model": b["model"], "design": f"{b['num_gpus']} x {b['gpu']}, {b['nic']}, {b['topology']} "
                       f"1:{float(b['oversubscription']):g}", "days": round(float(b["time_to_train_days"]), 2),
                       "cost (USD)": round(float(b["cost_to_train_usd"])), "plan": b["plan"]["strategy"]}
                      for b in best_designs(front)], hide_index=True, key="sweep_front_table")
