"""The Streamlit page: sidebar inputs, results tabs, compare and hand-off.

Everything that computes lives in the other ``appkit`` modules; this file lays out widgets
and puts each error next to the widget it is about (``design.widget_for_error``).  Nothing
here lets an exception reach Streamlit's traceback view: ``main`` shows one line instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from typing import Any

import streamlit as st

from appkit import charts, compare, engines
from appkit.design import Design, error_text, model_from_upload, widget_for_error
from appkit.evaluate import (Evaluation, bottleneck, cli_command, economics_of, evaluate, plan_of, plans_table,
                             recommendation, result_document)
from appkit.design import cluster_of
from appkit.topoview import summarize_topology, topology_figure
from sim.catalog import list_gpus, list_links, list_models, list_server_designs
from sim.conventions import conventions
from sim.errors import InputError
from sim.specs import TOPOLOGIES
from sim.topology import build_topology, topology_metrics

_log = logging.getLogger(__name__)
TABS = ("Plans", "Timeline", "Topology", "Compare", "Hand-off")
GIB = float(1 << 30)
AUTO = "auto"


# --------------------------------------------------------------------------- cached pieces


@st.cache_resource(show_spinner=False)
def catalog() -> dict[str, Any]:
    """GPU, NIC and model catalogs (loaded once per server)."""
    return {"gpus": {g.id: g for g in list_gpus()},
            "nics": {n.id: n for n in list_links("nic")},
            "models": dict(list_models()),
            "servers": {d.id: d for d in list_server_designs()}}


@st.cache_data(show_spinner=False, max_entries=64)
def cached_recommendation(key: str, _design: Design) -> tuple[dict | None, str | None]:
    return recommendation(_design, cluster_of(_design))


def cached_evaluate(design: Design) -> Evaluation:
    """The design's plans; the search is cached per ``recommend_key`` (see design.py)."""
    try:
        rec = cached_recommendation(design.recommend_key(), design)
    except InputError as exc:
        if design.strategy is None:
            raise
        rec = (None, f"no recommendation: {error_text(exc)}")
    return evaluate(design, rec=rec)


@st.cache_data(show_spinner=False, max_entries=16)
def cached_upload(name: str, data: bytes):
    return model_from_upload(name, data)


@st.cache_data(show_spinner=False, max_entries=16)
def cached_topology(key: str, _cluster) -> tuple[Any, Any]:

    graph = build_topology(_cluster)
    return summarize_topology(graph), topology_metrics(graph)


@st.cache_data(show_spinner=False, max_entries=16)
def cached_timeline(key: str, _plan) -> tuple[dict[str, Any], list]:
    result, trace = engines.event_trace(_plan)
    return result, charts.merge_bars(charts.gantt_bars(trace))


@st.cache_data(show_spinner=False, max_entries=32)
def cached_economics(key: str, _design: Design, _cluster, _plan: dict) -> tuple[dict, str | None]:
    return economics_of(_design, _cluster, _plan)


@st.cache_data(show_spinner=False, max_entries=16)
def cached_exports(key: str, _plan, steps: int | None, time_limit_s: float | None) -> tuple[dict[str, bytes], list]:
    return engines.export_files(_plan, steps=steps, time_limit_s=time_limit_s)


# --------------------------------------------------------------------------- sidebar


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~$])")


def md(text: object) -> str:
    """Text shown through Streamlit's Markdown (errors, notes, warnings) with Markdown's
    special characters escaped: ``tp*pp*cp`` must not turn into italics, ``$`` into LaTeX."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def _si(x: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (k, M, B, T)."""
    for div, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}{unit}"
    return f"{x:.3g}{' ' + unit if unit else ''}"


def _phys(x: float, unit: str) -> str:
    """SI prefixes for physical units: 911269 W -> '911 kW', 5.3e9 Wh -> '5.3 GWh'."""
    for div, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _days(s: float) -> str:
    if s == float("inf"):
        return "never"
    d = s / 86400
    return f"{d:,.1f} days" if d >= 1 else f"{s / 3600:,.1f} h"


def sidebar(cat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Draw the inputs; return (raw values, error slot per widget, errors found so far)."""
    sb = st.sidebar
    raw: dict[str, Any] = {}
    slots: dict[str, Any] = {}
    errors: dict[str, str] = {}

    sb.header("Model")
    source = sb.radio("Model source", ("Catalog", "Upload file"), horizontal=True, key="model_source")
    if source == "Catalog":
        ids = list(cat["models"])
        raw["model_ref"] = sb.selectbox("Model", ids, index=ids.index("gpt3-175b") if "gpt3-175b" in ids else 0,
                                        key="model", format_func=lambda i: f"{i}  ({cat['models'][i].name})")
        raw["model"] = cat["models"][raw["model_ref"]]
    else:
        up = sb.file_uploader("Hugging Face config.json or project model file (YAML/JSON)",
                              type=["json", "yaml", "yml"], key="model_file")
        if up is None:
            errors["model"] = "upload a model file (or pick one from the catalog)"
        else:
            raw["model_ref"] = up.name
            try:
                raw["model"] = cached_upload(up.name, up.getvalue())
            except InputError as exc:
                errors["model"] = error_text(exc)
    slots["model"] = sb.empty()
    if "model" in raw:
        m = raw["model"]
        moe = f", MoE {m.moe.num_experts} experts top-{m.moe.top_k}" if m.moe else ""
        sb.caption(f"{m.name}: {m.num_params / 1e9:,.1f} B parameters, {m.num_layers} layers, "
                   f"hidden {m.hidden_size}{moe}")

    sb.header("Cluster")
    gpu_ids = list(cat["gpus"])
    raw["gpu"] = sb.selectbox("GPU", gpu_ids, index=gpu_ids.index("a100-80gb") if "a100-80gb" in gpu_ids else 0,
                              key="gpu", format_func=lambda i: f"{i}  ({cat['gpus'][i].name})")
    slots["gpu"] = sb.empty()
    gpu = cat["gpus"][raw["gpu"]]
    raw["num_gpus"] = sb.number_input("Number of GPUs", min_value=1, max_value=1 << 22, value=1024, step=8,
                                      key="num_gpus")
    slots["num_gpus"] = sb.empty()
    c1, c2 = sb.columns(2)
    raw["gpus_per_node"] = c1.number_input("GPUs per node", min_value=1, max_value=1024, value=None, step=1,
                                           key="gpus_per_node", placeholder=f"auto ({gpu.gpus_per_node})")
    raw["nvlink_domain"] = c2.number_input("NVLink domain (GPUs)", min_value=1, max_value=1 << 16, value=None,
                                           step=1, key="nvlink_domain",
                                           placeholder=f"auto ({max(gpu.nvlink_domain_size, gpu.gpus_per_node)})")
    slots["gpus_per_node"] = sb.empty()
    slots["nvlink_domain"] = sb.empty()
    nic_ids = [AUTO] + list(cat["nics"])
    c1, c2 = sb.columns(2)
    nic = c1.selectbox("NIC", nic_ids, key="nic",
                       format_func=lambda i: f"auto ({gpu.default_nic})" if i == AUTO else i)
    raw["nic"] = None if nic == AUTO else nic
    raw["nics_per_node"] = c2.number_input("NICs per node", min_value=1, max_value=1024, value=None, step=1,
                                           key="nics_per_node", placeholder=f"auto ({gpu.nics_per_node})")
    slots["nic"] = sb.empty()
    slots["nics_per_node"] = sb.empty()

    c1, c2 = sb.columns(2)
    raw["topology"] = c1.selectbox("Topology", TOPOLOGIES, key="topology")
    raw["oversubscription"] = c2.number_input("Oversubscription (x:1)", min_value=1.0, max_value=64.0, value=1.0,
                                              step=0.5, key="oversubscription",
                                              help="leaf downlink:uplink ratio; 1 = non-blocking")
    slots["topology"] = sb.empty()
    slots["oversubscription"] = sb.empty()
    pcie = gpu.form_factor == "pcie"
    c1, c2 = sb.columns(2)
    server = c1.selectbox("PCIe server", [AUTO] + list(cat["servers"]), key="server", disabled=not pcie,
                          format_func=lambda i: "auto (for the node size)" if i == AUTO else i,
                          help="PCIe cards: the server design (catalogs/servers.yaml); docs/pcie.md")
    raw["server"] = None if server == AUTO or not pcie else server
    p2p = c2.selectbox("GPU peer-to-peer", [AUTO, "pcie", "none"], key="p2p", disabled=not pcie,
                       format_func=lambda i: f"auto ({gpu.p2p})" if i == AUTO else i,
                       help="none: GPU-GPU traffic staged through host memory (GeForce, stock driver)")
    raw["p2p"] = None if p2p == AUTO or not pcie else p2p
    slots["server"] = sb.empty()
    slots["p2p"] = sb.empty()

    sb.header("Training job")
    raw["seq_len"] = sb.number_input("Sequence length (tokens)", min_value=1, max_value=1 << 26, value=2048, step=512,
                                     key="seq_len")
    slots["seq_len"] = sb.empty()
    raw["gbs"] = sb.number_input("Global batch (sequences)", min_value=1, max_value=1 << 30, value=None, step=64,
                                 key="gbs", placeholder="auto (recommender's choice)")
    slots["gbs"] = sb.empty()
    default_b = conventions().tokens_per_parameter * raw["model"].num_params / 1e9 if "model" in raw else None
    raw["token_budget_b"] = sb.number_input(
        "Token budget (billion tokens)", min_value=0.0, value=None, step=100.0, key="token_budget",
        placeholder=f"auto: {default_b:,.0f} B (20 per parameter)" if default_b else "auto: 20 per parameter")
    slots["token_budget"] = sb.empty()
    raw["pricing"] = sb.selectbox("Pricing", ("owned", "cloud"), key="pricing",
                                  format_func=lambda p: {"owned": "owned cluster (capex + energy)",
                                                         "cloud": "cloud rental (GPU-hours)"}[p])
    slots["pricing"] = sb.empty()
    raw["strategy"] = sb.text_input("Fixed strategy (optional)", key="strategy",
                                    placeholder="e.g. tp=8,pp=16,vp=3,mbs=1,sp=1,recompute=selective",
                                    help="a STRATEGY string as `planner simulate --strategy` takes; "
                                         "empty = recommend one")
    slots["strategy"] = sb.empty()
    raw["rerank"] = sb.toggle("Re-rank top plans with the event engine", value=True, key="rerank",
                              help="as `planner recommend` does; off = analytic ranking only, about twice as fast")
    slots["rerank"] = sb.empty()
    return raw, slots, errors


def design_from(raw: dict[str, Any]) -> Design:
    tb = raw.get("token_budget_b")
    if tb is not None and tb <= 0:
        raise InputError("token_budget", tb, "must be > 0 billion tokens (leave empty for 20 per parameter)")
    strategy = (raw.get("strategy") or "").strip() or None
    return Design(model=raw["model"], model_ref=raw["model_ref"], gpu=raw["gpu"], num_gpus=int(raw["num_gpus"]),
                  gpus_per_node=_opt_int(raw["gpus_per_node"]), nvlink_domain=_opt_int(raw["nvlink_domain"]),
                  nic=raw["nic"], nics_per_node=_opt_int(raw["nics_per_node"]), topology=raw["topology"],
                  oversubscription=float(raw["oversubscription"]), seq_len=int(raw["seq_len"]),
                  gbs=_opt_int(raw["gbs"]), token_budget_tokens=None if tb is None else float(tb) * 1e9,
                  strategy=strategy, pricing=raw["pricing"], rerank=bool(raw["rerank"]),
                  server=raw.get("server"), p2p=raw.get("p2p"))


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def show_errors(errors: dict[str, str], slots: dict[str, Any]) -> None:
    """Each error under its widget, and a summary on the page."""
    for widget, msg in errors.items():
        target = slots.get(widget)
        if target is not None:
            target.error(md(msg))
    lines = "\n".join(f"- **{w.replace('_', ' ')}**: {md(m)}" for w, m in errors.items())
    st.error(f"Please fix the input marked in the sidebar:\n{lines}")


# --------------------------------------------------------------------------- main area


def headline(plan: dict[str, Any], eco: dict[str, Any], eco_note: str | None, tokens: float) -> None:
    cols = st.columns(6)
    band = plan.get("uncertainty")
    cols[0].metric("Step time", charts._fmt_s(plan["step_time_s"]),
                   delta=(f"80% band {charts._fmt_s(plan['step_time_s_low'])} .. "
                          f"{charts._fmt_s(plan['step_time_s_high'])}") if band else None,
                   delta_color="off",
                   help=(f"8 in 10 of the {band['runs']} published runs like this one ({band['class']}: framework "
                         "family / GPU architecture / parallelism mix), predicted without their source's data, "
                         "landed in this band" if band else None))
    cols[1].metric("Throughput", _phys(plan["tokens_per_s"], "tok/s"),
                   help=f"{plan['tokens_per_s']:,.0f} tokens/s for the whole cluster")
    cols[2].metric("MFU", f"{plan['mfu']:.1%}")
    mem = plan["memory"]
    cols[3].metric("Peak memory", _gib(plan["memory_peak_bytes"]),
                   delta=f"of {_gib(mem['capacity_bytes'])}" + ("" if plan["fits_memory"] else " - DOES NOT FIT"),
                   delta_color="off" if plan["fits_memory"] else "inverse")
    how = eco.get("method") or (
        f"planner tco: analytic step {charts._fmt_s(eco.get('step_time_s', 0.0))}, "
        f"goodput {eco.get('goodput', 1.0):.1%} (failures and checkpoints)")
    cols[4].metric("Time to train", _days(float(eco["time_to_train_s"])),
                   help=f"{tokens / 1e9:,.0f} B tokens; {how}")
    cost = eco.get("cost_to_train_usd")
    pricing = eco.get("pricing", "cloud")
    cols[5].metric(f"Cost to train ({pricing})", "$" + _si(cost) if cost is not None else "n/a",
                   help=(f"${cost:,.0f}; " if cost is not None else "no price in the catalog; ") + how)
    if eco_note:
        st.caption(md(eco_note))
    if "capex_usd" in eco:
        with st.expander("Cost, power and energy (planner tco)"):
            c = st.columns(5)
            c[0].metric("Capex", "$" + _si(eco["capex_usd"]))
            c[1].metric("Network capex", "$" + _si(eco["network_capex_usd"]))
            c[2].metric("Facility power", _phys(eco["power_w"], "W"))
            c[3].metric("Energy", _phys(eco["energy_kwh"] * 1e3, "Wh"))
            c[4].metric("Goodput", f"{eco['goodput']:.1%}")
            other = eco.get("cloud_cost_to_train_usd") if pricing == "owned" else eco.get("owned_cost_to_train_usd")
            if other is not None:
                st.caption(md(f"{'cloud' if pricing == 'owned' else 'owned'} alternative: ${other:,.0f}"))
            for w in eco.get("warnings", []):
                st.caption(f"note: {md(w)}")


def plans_tab(ev: Evaluation, chosen: int) -> None:
    rows = plans_table(ev.plans, ev.cluster, ev.design.seq_len)
    st.dataframe(rows, hide_index=True, key="plans_table", column_config={
        "MFU": st.column_config.NumberColumn(format="percent"),
        "tokens/s": st.column_config.NumberColumn(format="localized"),
        "step time (s)": st.column_config.NumberColumn(format="%.3f"),
    })
    search_summary(ev)
    plan = ev.plans[chosen]
    st.markdown(f"**Plan {chosen + 1}** is bound by **{md(bottleneck(plan))}**.")
    for w in plan.get("warnings", []):
        st.warning(md(w))
    labelled = [(f"plan {i + 1}" + (" (chosen)" if i == chosen else ""), p) for i, p in enumerate(ev.plans)]
    c1, c2 = st.columns(2)
    with c1:
        st.subheader("Where the step time goes")
        st.plotly_chart(charts.breakdown_figure(labelled), key="breakdown_chart")
    with c2:
        st.subheader("Memory per GPU vs capacity")
        st.plotly_chart(charts.memory_figure(labelled), key="memory_chart")


def search_summary(ev: Evaluation) -> None:
    """Candidates, rejections per reason and the recommender's explanation."""
    sr = ev.search
    if not sr:
        return
    bits = []
    if "candidates_evaluated" in sr:
        bits.append(f"{sr['candidates_evaluated']:,} candidates timed")
    if sr.get("rejected_total"):
        bits.append(f"{sr['rejected_total']:,} rejected")
    if "search_time_s" in sr:
        bits.append(f"in {sr['search_time_s']:.2f} s")
    ranking = sr.get("ranking") or {}
    if ranking.get("note"):
        bits.append(ranking["note"])
    if bits:
        st.caption("Search: " + md("; ".join(bits)))
    expl = sr.get("explanation") or {}
    lines = expl.get("lines") if isinstance(expl, dict) else None
    if lines:
        with st.expander("Why this plan", expanded=False):
            st.markdown("\n".join(f"- {md(line)}" for line in lines))
            if sr.get("rejected"):
                st.dataframe([{"reason": k, "candidates": v} for k, v in sr["rejected"].items()], hide_index=True,
                             key="rejected_table")
    for w in sr.get("warnings") or []:
        st.warning(md(w))


def timeline_tab(ev: Evaluation, chosen: int) -> None:
    plan = ev.plans[chosen]
    try:
        p = plan_of(ev.design, ev.cluster, plan)
        t = time.perf_counter()
        result, bars = cached_timeline(ev.design.cache_key() + "|" + plan["strategy"], p)
        took = time.perf_counter() - t
    except InputError as exc:
        st.error(md(error_text(exc)))
        return
    st.caption(f"Event engine: step {charts._fmt_s(result['step_time_s'])} "
               f"(analytic {charts._fmt_s(plan['step_time_s'])}); {len(bars):,} bars drawn; {took:.2f} s")
    if not bars:
        st.info("the event engine wrote no timed events for this plan")
        return
    st.plotly_chart(charts.timeline_figure(bars), key="timeline_chart")


def topology_tab(ev: Evaluation) -> None:

    c = ev.cluster
    key = repr((c.gpu.id, c.num_gpus, c.nic.id, c.gpus_per_node, c.nvlink_domain, c.nics_per_node, c.topology,
                c.oversubscription, c.tree_levels, c.server))
    summary, metrics = cached_topology(key, c)
    agg = (f"aggregated: each GPU box is {summary.nodes_per_box} node(s)" if summary.aggregated
           else "one box per GPU")
    st.caption(f"{summary.graph_nodes:,} graph nodes and {summary.graph_edges:,} edges drawn as "
               f"{len(summary.boxes)} boxes ({agg}); line width ~ log bandwidth; hover for details")
    st.plotly_chart(topology_figure(summary), key="topology_chart")
    st.table([
        {"metric": "nodes", "value": f"{metrics.num_nodes:,}"},
        {"metric": "NICs", "value": f"{metrics.num_nics:,}"},
        {"metric": "NVLink domains", "value": f"{metrics.num_scale_up_domains:,}"},
        {"metric": "switch levels", "value": str(metrics.num_levels)},
        {"metric": "switches", "value": ", ".join(f"{k} {v}" for k, v in metrics.switches_by_level.items()) or "-"},
        {"metric": "cables", "value": ", ".join(f"{k} {v}" for k, v in metrics.cables_by_tier.items())},
        {"metric": "bisection (per direction)", "value": f"{metrics.bisection_bytes_per_s / 1e12:,.2f} TB/s"},
        {"metric": "diameter (switch hops)", "value": str(metrics.diameter_hops)},
    ], hide_index=True)
    if metrics.exceeds_radix:
        st.warning("the top switch level needs more ports than one switch of this radix has")


def compare_tab() -> None:
    kept = st.session_state.get("compare", [])
    if not kept:
        st.info("Press **Keep for comparison** (above the tabs) to pin up to three designs here.")
        return
    st.table(compare.compare_frame(kept))
    st.caption("Yellow rows differ between designs; green marks the best value of a metric.")
    if len(kept) > 1:
        st.plotly_chart(compare.compare_figure(kept), key="compare_chart")
    if st.button("Clear comparison", key="clear_compare"):
        st.session_state["compare"] = []
        st.rerun()


def handoff_tab(ev: Evaluation, chosen: int, eco: dict[str, Any]) -> None:
    plan = ev.plans[chosen]
    d = ev.design
    doc = result_document(ev, plan, eco)
    st.download_button("Download result (JSON)", data=json.dumps(doc, indent=2, default=str),
                       file_name="plan.json", mime="application/json", key="download_json")
    st.markdown("Reproduce on the command line:")
    st.code(cli_command(ev, plan, catalog_model=d.model_ref in catalog()["models"]), language="bash")
    p = plan_of(d, ev.cluster, plan)
    steps = math.ceil(d.token_budget / p.strategy.tokens_per_step)
    wall = float(eco["time_to_train_s"])
    files, warnings = cached_exports(d.cache_key() + "|" + plan["strategy"], p, steps,
                                     wall if math.isfinite(wall) else None)
    st.markdown(f"Launch configs for plan #{chosen + 1} ({steps:,} steps for the token budget):")
    st.download_button("Download all launch configs (zip)", data=engines.zip_bytes(files),
                       file_name="launch-configs.zip", mime="application/zip", key="download_zip", type="primary")
    cols = st.columns(3)
    for i, (name, data) in enumerate(files.items()):
        cols[i % 3].download_button(name, data=data, file_name=name.replace("/", "-"), key=f"download_{name}")
    for w in warnings:
        st.caption(f"note: {md(w)}")
    if not files:  # no framework profile runs this plan: nothing to launch (the notes say why)
        st.info("No launch config: no framework profile runs this plan (see the notes above).")
        return
    with st.expander("Preview"):
        pick = st.selectbox("File", list(files), key="preview_file") or next(iter(files))
        lang = {"sh": "bash", "sbatch": "bash", "json": "json", "toml": "toml", "yaml": "yaml"}.get(
            pick.rsplit(".", 1)[-1], None)
        st.code(files[pick].decode("utf-8", "replace"), language=lang)


def results(ev: Evaluation) -> None:
    if not ev.has_plans:
        return
    labels = [f"#{i + 1}  {p['strategy']}  ({p.get('source', '')})" for i, p in enumerate(ev.plans)]
    # A new list of plans is a new widget (its key names the list): the choice starts at #1
    # instead of the browser showing a stale label.
    key = "plan_choice_" + hashlib.sha1("\n".join(labels).encode()).hexdigest()[:12]
    choice = st.selectbox("Plan to inspect and export", labels, key=key)
    st.session_state["plan_choice_key"] = key
    chosen = labels.index(choice)
    plan = ev.plans[chosen]
    eco_key = ev.design.cache_key() + "|" + plan["strategy"]
    eco, eco_note = cached_economics(eco_key, ev.design, ev.cluster, plan)
    headline(plan, eco, eco_note, ev.design.token_budget)
    if st.button("Keep for comparison", key="keep", help=f"pin this design (up to {compare.MAX_DESIGNS})"):
        snap = compare.snapshot(ev.design, ev.cluster, plan, eco)
        st.session_state["compare"] = compare.add_snapshot(st.session_state.get("compare", []), snap)
        st.toast(f"kept {snap['label']} ({len(st.session_state['compare'])}/{compare.MAX_DESIGNS})")
    tabs = st.tabs(TABS, key="tab", on_change="rerun")
    tab = dict(zip(TABS, tabs))
    with tab["Plans"]:
        if tab["Plans"].open is not False:
            plans_tab(ev, chosen)
    with tab["Timeline"]:
        if tab["Timeline"].open:
            timeline_tab(ev, chosen)
    with tab["Topology"]:
        if tab["Topology"].open:
            topology_tab(ev)
    with tab["Compare"]:
        if tab["Compare"].open:
            compare_tab()
    with tab["Hand-off"]:
        if tab["Hand-off"].open:
            handoff_tab(ev, chosen, eco)


def no_plan_view(ev: Evaluation) -> None:
    """Without a plan (nothing fits, or no recommender and no fixed strategy): say why and
    what would fit; the cluster still draws."""
    expl = ev.search.get("explanation") or {}
    if ev.search:
        st.warning("No strategy fits this design.\n\n" + "\n".join(f"- {md(line)}" for line in expl.get("lines", [])))
    sugg = ev.search.get("suggestions") or []
    if sugg:
        st.markdown("**What would fit:**")
        st.dataframe([{"change": x.get("what", x.get("change")), "best strategy": x.get("best_strategy", ""),
                       "step time (s)": x.get("step_time_s"),
                       "peak memory (GiB)": (x.get("memory_peak_bytes") or 0) / GIB} for x in sugg],
                     hide_index=True, key="suggestions_table")
    tabs = st.tabs(("Topology", "Compare"), key="tab_noplan")
    with tabs[0]:
        topology_tab(ev)
    with tabs[1]:
        compare_tab()


def page() -> None:
    st.title("Cluster what-if")
    st.caption("Change the model, GPUs, network or job in the sidebar; every result below follows. "
               "Predictions come from the project's simulator (see docs/accuracy.md for its accuracy).")
    cat = catalog()
    raw, slots, errors = sidebar(cat)
    if errors:
        show_errors(errors, slots)
        return
    design = None
    try:
        design = design_from(raw)
        t = time.perf_counter()
        ev = cached_evaluate(design)
        elapsed = time.perf_counter() - t
    except InputError as exc:
        widget = widget_for_error(exc, design)
        show_errors({widget or "design": error_text(exc)}, slots)
        return
    for note in ev.notes:
        st.info(md(note))
    if ev.has_plans:
        results(ev)
    else:
        no_plan_view(ev)
    st.caption(f"{ev.design.token_budget / 1e9:,.0f} B tokens to train. Computed in {elapsed:.2f} s (server side, cached per design); "
               f"{', '.join(f'{k} {v:.2f} s' for k, v in ev.timings_s.items())}")


_CSS = """<style>
section[data-testid="stSidebar"] { width: 380px !important; min-width: 380px !important; }
div[data-testid="stMetricValue"] { font-size: 1.6rem; }
div[data-testid="stMainBlockContainer"] { padding-top: 2.5rem; }
</style>"""


def main() -> None:
    st.set_page_config(page_title="Cluster what-if", layout="wide")
    st.markdown(_CSS, unsafe_allow_html=True)
    try:
        page()
    except Exception as exc:  # noqa: BLE001  the user never sees a traceback
        _log.exception("what-if app: unexpected error")  # the server log keeps it for us
        st.error(f"Something went wrong inside the planner: {md(error_text(exc))}. "
                 "Please report the inputs that led here.")
