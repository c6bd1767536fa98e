"""The results tabs: Plans, Timeline, Topology, Compare and Hand-off.

Each tab draws one computed design (``appkit.evaluate.Evaluation``) and caches what it adds
(the event-engine trace, the topology graph, the launch configs) per design and plan, so it is
computed only when its tab is open and only once.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Mapping, Sequence

import streamlit as st

from appkit import charts, compare, engines, present
from appkit.design import error_text
from appkit.evaluate import Evaluation, cli_command, plan_of, recommend_command, result_document
from appkit.topoview import summarize_topology, topology_figure
from appkit.view import catalog, md
from planner.exports import FORMAT_FRAMEWORK, FORMATS
from sim.base.errors import InputError
from sim.net.topology import build_topology, topology_metrics


@st.cache_data(show_spinner=False, max_entries=16)
def cached_topology(key: str, _cluster) -> tuple[Any, Any]:
    graph = build_topology(_cluster)
    return summarize_topology(graph), topology_metrics(graph)


@st.cache_data(show_spinner=False, max_entries=16)
def cached_timeline(key: str, _plan) -> tuple[dict[str, Any], list]:
    result, trace = engines.event_trace(_plan)
    return result, charts.merge_bars(charts.gantt_bars(trace))


@st.cache_data(show_spinner=False, max_entries=32)
def cached_exports(key: str, _plan, steps: int | None, time_limit_s: float | None) -> tuple[dict[str, bytes], list]:
    return engines.export_files(_plan, steps=steps, time_limit_s=time_limit_s)


# --------------------------------------------------------------------------- Plans


def plans_tab(ev: Evaluation, plans: Sequence[Mapping[str, Any]], chosen: int) -> None:
    fw = ev.design.framework or ev.search.get("framework") or "default"
    rows = present.plans_table(plans, ev.cluster, ev.design.seq_len, framework=fw)
    st.dataframe(rows, hide_index=True, key="plans_table", column_config={
        "MFU (bf16 peak)": st.column_config.NumberColumn(format="percent", help=(
            "model FLOPs per step / (step time x GPUs x the GPU's dense bf16 peak); blank above 100%")),
        "MFU (fp8 peak)": st.column_config.NumberColumn(format="percent", help=(
            "fp8 plans: the same model FLOPs against the GPU's dense fp8 peak")),
        present.MEMORY_COLUMN: st.column_config.NumberColumn(help=(
            "peak of the most loaded GPU at the device level, as nvidia-smi shows it (allocated + the caching "
            "allocator's reserve + CUDA context and NCCL buffers): what fits and the memory headroom judge")),
        "tokens/s": st.column_config.NumberColumn(format="localized"),
        "step time (s)": st.column_config.NumberColumn(format="%.3f"),
    })
    search_summary(ev)
    plan = plans[chosen]
    st.markdown(f"**Plan {present.rank_label(plan)}** is {md(present.verdict(plan))}.")
    for w in plan.get("warnings", []):
        st.warning(md(w))
    labelled = [(present.rank_label(p) + (" (chosen)" if i == chosen else ""), p) for i, p in enumerate(plans)]
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
    if sr.get("precisions_searched"):
        bits.append("precision " + ", ".join(sr["precisions_searched"]))
    headroom = sr.get("memory_headroom") or {}
    if headroom.get("why"):
        bits.append(f"memory headroom: {headroom['why']}")
    if bits:
        st.caption("Search: " + md("; ".join(bits)))
    fp8_alternative(sr.get("fp8_alternative") or {})
    expl = sr.get("explanation") or {}
    lines = expl.get("lines") if isinstance(expl, dict) else None
    if lines:
        with st.expander("Why #1", expanded=False):
            st.markdown("\n".join(f"- {md(line)}" for line in lines))
            if sr.get("rejected"):
                st.dataframe([{"reason": k, "candidates": v} for k, v in sr["rejected"].items()], hide_index=True,
                             key="rejected_table")
    for w in sr.get("warnings") or []:
        st.warning(md(w))


def _search_fp8() -> None:
    st.session_state["fp8"] = True
    st.session_state["run_requested"] = True


def fp8_alternative(alt: Mapping[str, Any]) -> None:
    """#1 in fp8 when that would be faster (``planner recommend``'s ``fp8_alternative``): its
    gain and the framework's fp8 recipe, never chosen for the user (fp8 changes the numerics);
    a button opts in and searches again."""
    if not alt:
        return
    st.info(md(f"fp8 alternative: {alt['line']}") + f"  \n`{alt['strategy']}`")
    st.button("Allow fp8 and search again", key="search_fp8", on_click=_search_fp8)


# --------------------------------------------------------------------------- Timeline, Topology


def timeline_tab(ev: Evaluation, plan: Mapping[str, Any]) -> None:
    try:
        p = plan_of(ev.design, ev.cluster, plan)
        t = time.perf_counter()
        result, bars = cached_timeline(ev.design.cache_key() + "|" + plan["strategy"], p)
        took = time.perf_counter() - t
    except InputError as exc:
        st.error(md(error_text(exc)))
        return
    st.caption(f"Event engine: step {charts.fmt_s(result['step_time_s'])} "
               f"(plan {present.rank_label(plan)}: {charts.fmt_s(plan['step_time_s'])}); "
               f"{len(bars):,} bars drawn; {took:.2f} s")
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
    st.caption(md(present.cluster_summary(c)))
    st.caption(f"{summary.graph_nodes:,} graph nodes and {summary.graph_edges:,} edges drawn as "
               f"{len(summary.boxes)} boxes ({agg}); line width ~ log bandwidth; hover for details")
    st.plotly_chart(topology_figure(summary), key="topology_chart")
    scale_up = "PCIe nodes (scale-up over the server's PCIe)" if c.server is not None else "NVLink domains"
    st.table([
        {"metric": "nodes", "value": f"{metrics.num_nodes:,}"},
        {"metric": "NICs", "value": f"{metrics.num_nics:,}"},
        {"metric": scale_up, "value": f"{metrics.num_scale_up_domains:,}"},
        {"metric": "switch levels", "value": str(metrics.num_levels)},
        {"metric": "switches", "value": ", ".join(f"{k} {v}" for k, v in metrics.switches_by_level.items()) or "-"},
        {"metric": "cables", "value": ", ".join(f"{k} {v}" for k, v in metrics.cables_by_tier.items())},
        {"metric": "bisection (per direction)", "value": f"{metrics.bisection_bytes_per_s / 1e12:,.2f} TB/s"},
        {"metric": "diameter (switch hops)", "value": str(metrics.diameter_hops)},
    ], hide_index=True)
    if metrics.exceeds_radix:
        st.warning("the top switch level needs more ports than one switch of this radix has")


# --------------------------------------------------------------------------- Compare


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


# --------------------------------------------------------------------------- Hand-off


def _exports(ev: Evaluation, plan: Mapping[str, Any], eco: Mapping[str, Any]) -> tuple[dict[str, bytes], list, int]:
    p = plan_of(ev.design, ev.cluster, plan)
    steps = math.ceil(ev.design.token_budget / p.strategy.tokens_per_step)
    wall = float(eco["time_to_train_s"])
    files, warnings = cached_exports(ev.design.cache_key() + "|" + plan["strategy"], p, steps,
                                     wall if math.isfinite(wall) else None)
    return files, warnings, steps


def _refusals(warnings: Sequence[str]) -> list[dict[str, str]]:
    """One row per format that refused the plan: format, the framework it launches, why."""
    rows = []
    for w in warnings:
        fmt, _, why = w.partition(": not exported: ")
        if why and fmt in FORMAT_FRAMEWORK:
            rows.append({"format": fmt, "framework": FORMAT_FRAMEWORK[fmt], "why not": why.split("; `planner")[0]})
    return rows


def _choose_plan(label: str) -> None:
    st.session_state[st.session_state["plan_choice_key"]] = label


def _search_framework(fw: str) -> None:
    st.session_state["framework"] = fw
    st.session_state["run_requested"] = True


def handoff_tab(ev: Evaluation, plan: Mapping[str, Any], plans: Sequence[Mapping[str, Any]],
                eco: Mapping[str, Any]) -> None:
    d = ev.design
    doc = result_document(ev, plan, eco)
    st.download_button("Download result (JSON)", data=json.dumps(doc, indent=2, default=str),
                       file_name="plan.json", mime="application/json", key="download_json")
    in_catalog = d.model_ref in catalog()["models"]
    st.markdown(f"Reproduce plan {present.rank_label(plan)} on the command line (the same run: framework, "
                f"precision, engine):")
    st.code(cli_command(ev, plan, catalog_model=in_catalog), language="bash")
    if plan.get("source") != "yours":
        st.markdown("The search that found it:")
        st.code(recommend_command(ev, catalog_model=in_catalog), language="bash")
    if not in_catalog:
        st.caption(md(f"MODEL_FILE: the uploaded {d.model_ref}"))
    files, warnings, steps = _exports(ev, plan, eco)
    if not files:
        no_export(ev, plan, plans, eco, warnings)
        return
    st.markdown(f"Launch configs for plan {present.rank_label(plan)} ({steps:,} steps for the token budget):")
    st.download_button("Download all launch configs (zip)", data=engines.zip_bytes(files),
                       file_name="launch-configs.zip", mime="application/zip", key="download_zip", type="primary")
    cols = st.columns(3)
    for i, (name, data) in enumerate(files.items()):
        cols[i % 3].download_button(name, data=data, file_name=name.replace("/", "-"), key=f"download_{name}")
    refused = _refusals(warnings)
    if refused:
        st.caption("Not exported (the format's framework cannot run this plan):")
        st.dataframe(refused, hide_index=True, key="refused_formats")
    for w in warnings:
        if ": not exported: " not in w:
            st.caption(f"note: {md(w)}")
    with st.expander("Preview"):
        names = list(files)
        pick = st.selectbox("File", names, key="preview_file")
        pick = pick if pick in files else names[0]
        lang = {"sh": "bash", "sbatch": "bash", "json": "json", "toml": "toml", "yaml": "yaml"}.get(
            pick.rsplit(".", 1)[-1], None)
        st.code(files[pick].decode("utf-8", "replace"), language=lang)


def no_export(ev: Evaluation, plan: Mapping[str, Any], plans: Sequence[Mapping[str, Any]],
              eco: Mapping[str, Any], warnings: Sequence[str]) -> None:
    """No format runs the plan: say why per format, and offer what does export (another plan
    of this list, or a search restricted to one framework's plans)."""
    st.warning(f"No launch config for plan {present.rank_label(plan)}: none of the {len(FORMATS)} formats' "
               "frameworks runs it.")
    st.dataframe(_refusals(warnings), hide_index=True, key="refused_formats")
    for other in plans:
        if other is plan:
            continue
        files, _, _ = _exports(ev, other, eco)
        if files:
            fmts = sorted({name.split("/", 1)[0] for name in files})
            st.button(f"Show plan {present.rank_label(other)}: it exports to {', '.join(fmts)}", key="handoff_other",
                      on_click=_choose_plan, args=(present.plan_choice_label(other),))
            break
    st.markdown("Or search only the plans one framework runs (its step times included):")
    cols = st.columns(3)
    for i, fw in enumerate(sorted(set(FORMAT_FRAMEWORK.values()))):
        fmts = ", ".join(f for f in FORMATS if FORMAT_FRAMEWORK[f] == fw)
        cols[i % 3].button(f"Search {fw} plans ({fmts})", key=f"handoff_fw_{fw}", on_click=_search_framework,
                           args=(fw,), disabled=ev.design.framework == fw)
