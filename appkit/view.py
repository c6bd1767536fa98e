"""Pieces of the page every tab uses: the catalogs, Markdown escaping, number formats, the
cached time and cost to train, and the headline (each figure with its 80% band under it)."""

from __future__ import annotations

import re
from typing import Any

import streamlit as st

from appkit import charts, present
from appkit.design import Design
from appkit.evaluate import economics_of
from planner.report import mfu_text
from sim.data.catalog import list_gpus, list_links, list_models, list_server_designs
from sim.cost.framework import list_frameworks
from sim.base.units import GIB



@st.cache_resource(show_spinner=False)
def catalog() -> dict[str, Any]:
    """GPU, NIC, model, server and framework catalogs (loaded once per server)."""
    return {"gpus": {g.id: g for g in list_gpus()},
            "nics": {n.id: n for n in list_links("nic")},
            "models": dict(list_models()),
            "servers": {d.id: d for d in list_server_designs()},
            "frameworks": {f.id: f for f in list_frameworks()}}


@st.cache_data(show_spinner=False, max_entries=32)
def cached_economics(key: str, _design: Design, _cluster, _plan: dict) -> tuple[dict, str | None]:
    return economics_of(_design, _cluster, _plan)


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~$])")


def md(text: object) -> str:
    """Text shown through Streamlit's Markdown (errors, notes, warnings) with Markdown's
    special characters escaped: ``tp*pp*cp`` must not turn into italics, ``$`` into LaTeX."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def si(x: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (k, M, B, T)."""
    for div, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}{unit}"
    return f"{x:.3g}{' ' + unit if unit else ''}"


def phys(x: float, unit: str) -> str:
    """SI prefixes for physical units: 911269 W -> '911 kW', 5.3e9 Wh -> '5.3 GWh'."""
    for div, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def days(s: float) -> str:
    if s == float("inf"):
        return "never"
    d = s / 86400
    return f"{d:,.1f} days" if d >= 1 else f"{s / 3600:,.1f} h"


def band_caption(col, low: float | None, high: float | None, fmt, value: float | None = None) -> None:
    """``80% band low .. high`` under a figure (not a metric delta: no arrow, no truncation)."""
    if low is None or high is None:
        return
    text = f"80% band {fmt(low)} .. {fmt(high)}"
    if value is not None and not low <= value <= high:
        text += " (the estimate lies outside its band: plan with the band)"
    col.caption(md(text))


def mfu_metric(col, plan: dict[str, Any]) -> None:
    """MFU as ``planner recommend`` says it (``planner.report.mfu_text``): against the bf16 peak,
    fp8 plans against the fp8 peak as well, each labelled; never a figure above 100%."""
    fp8 = present.mfu_of_fp8_peak(plan)
    help_text = ("model FLOPs per step / (step time x GPUs x the GPU's dense bf16 peak), the figure Megatron, NeMo "
                 "and torchtitan print" + ("; fp8 plans also against the dense fp8 peak" if fp8 is not None else "")
                 + ". " + mfu_text(plan))
    if fp8 is None:
        col.metric("MFU", present.mfu_pct(float(plan["mfu"])), help=md(help_text))
        notes = []
    else:
        col.metric("MFU (fp8 peak)", present.mfu_pct(fp8), help=md(help_text))
        notes = [f"{present.mfu_pct(float(plan['mfu']))} of the bf16 peak"]
    if plan.get("model_tflops_per_gpu") is not None:
        notes.append(f"{plan['model_tflops_per_gpu']:,.0f} model TFLOP/s per GPU")
    if max(float(plan["mfu"]), fp8 or 0.0) > 1.0:
        notes.append("above the peak: not an MFU, the model is optimistic here")
    col.caption(md("; ".join(notes)))


def headline(plan: dict[str, Any], eco: dict[str, Any], eco_note: str | None, tokens: float) -> None:
    cols = st.columns(6)
    band = plan.get("uncertainty")
    step = float(plan["step_time_s"])
    cols[0].metric("Step time", charts.fmt_s(step),
                   help=(f"8 in 10 of the {band['runs']} published runs like this one ({band['class']}: framework "
                         "family / GPU architecture / parallelism mix), predicted without their source's data, "
                         "landed in this band" if band else None))
    band_caption(cols[0], plan.get("step_time_s_low"), plan.get("step_time_s_high"), charts.fmt_s, step)
    cols[1].metric("Throughput", phys(plan["tokens_per_s"], "tok/s"),
                   help=f"{plan['tokens_per_s']:,.0f} tokens/s for the whole cluster")
    cols[1].caption(f"{plan['tokens_per_s'] / plan['num_gpus']:,.0f} tok/s per GPU" if plan.get("num_gpus") else "")
    mfu_metric(cols[2], plan)
    mem = plan["memory"]
    device = float(plan["memory_device_bytes"])
    cols[3].metric("Peak memory (device)", gib(device),
                   help="the most loaded GPU at the device level, as nvidia-smi shows it: allocated "
                        f"({gib(plan['memory_peak_bytes'])}, as torch.cuda.max_memory_allocated) + the caching "
                        "allocator's reserve + CUDA context and NCCL buffers; what fits and the memory headroom "
                        "judge")
    frac = device / mem["capacity_bytes"]
    cols[3].caption(f"of {gib(mem['capacity_bytes'])} ({frac:.0%}); allocated {gib(plan['memory_peak_bytes'])}"
                    if plan["fits_memory"] else f":red[of {gib(mem['capacity_bytes'])}: DOES NOT FIT]")
    how = eco.get("method") or (
        f"planner tco: analytic step {charts.fmt_s(eco.get('step_time_s', 0.0))}, "
        f"goodput {eco.get('goodput', 1.0):.1%} (failures and checkpoints)")
    wall = float(eco["time_to_train_s"])
    cols[4].metric("Time to train", days(wall), help=f"{tokens / 1e9:,.0f} B tokens; {how}")
    band_caption(cols[4], *present.scaled_band(wall, plan, eco, "time_to_train_s"), days)
    cost = eco.get("cost_to_train_usd")
    pricing = eco.get("pricing", "cloud")
    cols[5].metric(f"Cost to train ({pricing})", "$" + si(cost) if cost is not None else "n/a",
                   help=(f"${cost:,.0f}; " if cost is not None else "no price in the catalog; ") + how)
    if cost is not None:
        band_caption(cols[5], *present.scaled_band(float(cost), plan, eco, "cost_to_train_usd"),
                     lambda x: "$" + si(x))
    if eco_note:
        st.caption(md(eco_note))
    if "capex_usd" in eco:
        with st.expander("Cost, power and energy (planner tco)"):
            c = st.columns(5)
            c[0].metric("Capex", "$" + si(eco["capex_usd"]))
            c[1].metric("Network capex", "$" + si(eco["network_capex_usd"]))
            c[2].metric("Facility power", phys(eco["power_w"], "W"))
            c[3].metric("Energy", phys(eco["energy_kwh"] * 1e3, "Wh"))
            c[4].metric("Goodput", f"{eco['goodput']:.1%}")
            other = eco.get("cloud_cost_to_train_usd") if pricing == "owned" else eco.get("owned_cost_to_train_usd")
            if other is not None:
                st.caption(md(f"{'cloud' if pricing == 'owned' else 'owned'} alternative: ${other:,.0f}"))
            for w in eco.get("warnings", []):
                st.caption(f"note: {md(w)}")
