"""The Streamlit page: the sidebar's design, computed on request, and the results tabs.

Editing an input computes nothing new: the page shows the design it computed last and, while
the sidebar differs, says what changed and offers **Run**.  A design is computed on **Run**,
when the page opens (from a link or a bookmark: ``appkit.links``), and at once whenever its
search is already known (a design seen before, or a change of token budget, pricing or fixed
strategy, which the search does not depend on).  The search runs in the background
(``appkit.jobs``) and the page shows its stages as they pass.

Everything that computes lives in the other ``appkit`` modules; this file lays out the page
and puts each error next to the widget it is about (``design.widget_for_error``).  Nothing
here lets an exception reach Streamlit's traceback view: ``main`` shows one line instead.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

import streamlit as st

from appkit import compare, present
from appkit.design import Design, cluster_of, error_text, widget_for_error
from appkit.evaluate import Evaluation, evaluate, fixed_strategy_text, recommendation, run_of
from appkit.jobs import Cancelled, Job, JobStore
from appkit.links import ignored_values
from appkit.sidebar import BOUND, design_from, sidebar, widget_values
from appkit.tabs import compare_tab, handoff_tab, plans_tab, timeline_tab, topology_tab
from appkit.view import cached_economics, catalog, headline, md
from sim.base.errors import InputError
from sim.data.hardware import Cluster

_log = logging.getLogger(__name__)
TABS = ("Plans", "Timeline", "Topology", "Compare", "Hand-off")
POLL_S = 0.25  # how often the page redraws a running search's stages


@st.cache_resource(show_spinner=False)
def job_store() -> JobStore:
    """The server's searches, running and finished (shared by every session)."""
    return JobStore(max_done=32)


def search_key(design: Design) -> str:
    return hashlib.sha1(design.recommend_key().encode()).hexdigest()


# --------------------------------------------------------------------------- errors


def show_errors(errors: dict[str, str], slots: dict[str, Any]) -> None:
    """Each error under its widget, and a summary on the page."""
    for widget, msg in errors.items():
        target = slots.get(widget)
        if target is not None:
            target.error(md(msg))
    lines = "\n".join(f"- **{w.replace('_', ' ')}**: {md(m)}" for w, m in errors.items())
    st.error(f"Please fix the input marked in the sidebar:\n{lines}")


def check(design: Design) -> Cluster:
    """What can be checked without searching (milliseconds): the cluster builds, a fixed
    strategy parses and fits the model and the GPU count.  Raises ``InputError``."""
    cluster = cluster_of(design)
    if design.strategy is not None:  # resolved as evaluate prices it: with the sidebar's framework
        run_of(design, cluster, fixed_strategy_text(design), design.framework)
    return cluster


# --------------------------------------------------------------------------- computing on request


DIFF_LABELS = {"model_ref": "model", "gpu": "GPU", "num_gpus": "GPUs", "gpus_per_node": "GPUs per node",
               "nvlink_domain": "NVLink domain", "nic": "NIC", "nics_per_node": "NICs per node",
               "topology": "topology", "oversubscription": "oversubscription", "server": "PCIe server",
               "p2p": "peer-to-peer", "seq_len": "sequence length", "gbs": "global batch",
               "token_budget_b": "token budget", "pricing": "pricing", "framework": "framework",
               "precisions": "precisions", "memory_headroom": "memory headroom", "strategy": "strategy",
               "rerank": "event re-ranking"}


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``GPUs 1024 -> 512`` for each input that differs (``auto`` for an empty one)."""
    def show(v: Any) -> str:
        if v is None or v == "":
            return "auto"
        if isinstance(v, tuple):
            return "+".join(v)
        return f"{v:g}" if isinstance(v, float) else str(v)

    return [f"{label} {show(before.get(k))} → {show(after.get(k))}" for k, label in DIFF_LABELS.items()
            if before.get(k) != after.get(k)]


def _stage_lines(job: Job) -> str:
    now = time.monotonic()
    out = []
    for s in job.snapshot():
        mark = "done" if s.ended is not None else "running"
        out.append(f"- {md(s.name)}: {s.seconds(now):.2f} s ({mark})")
    return "\n".join(out)


def _summary(job: Job) -> str:
    parts = ", ".join(f"{s.name.split(' ')[0]} {s.seconds():.2f} s" for s in job.snapshot())
    return f"Computed in {job.seconds():.1f} s ({parts})" if parts else f"Computed in {job.seconds():.1f} s"


def wait_for(job: Job, *, fresh: bool) -> None:
    """Draw the job's stages until it is done: a live list while it runs (``fresh``: this
    run started or joined it), a collapsed summary afterwards."""
    if job.done and not fresh:
        with st.status(_summary(job), state="complete", expanded=False):
            st.markdown(_stage_lines(job))
        return
    with st.status("Starting the search", expanded=True) as status:
        lines = st.empty()
        shown = None
        while not job.wait(POLL_S):
            stages = job.snapshot()
            label = (stages[-1].name[:1].upper() + stages[-1].name[1:]) if stages else "Starting the search"
            label += f" ... {job.seconds():.0f} s"
            if label != shown:
                status.update(label=label)
                lines.markdown(_stage_lines(job))
                shown = label
        lines.markdown(_stage_lines(job))
        status.update(label=_summary(job), state="error" if job.error else "complete", expanded=False)


def compute(design: Design, *, fresh: bool) -> Evaluation:
    """The design's plans: its search from the job store (started if needed, drawn while it
    runs), then the fixed strategy and the plans' details (milliseconds)."""
    store = job_store()
    key = search_key(design)
    job = store.get(key)
    started = job is None or job.cancelled
    for _ in range(2):  # a job another session cancelled is started again
        job = store.start(key, lambda progress: recommendation(design, cluster_of(design), progress=progress))
        wait_for(job, fresh=fresh or started or not job.done)
        if not isinstance(job.error, Cancelled):
            break
    assert job is not None
    if isinstance(job.error, InputError):
        if design.strategy is None:
            raise job.error
        rec: tuple[dict | None, str | None] = (None, f"no recommendation: {error_text(job.error)}")
    elif job.error is not None:
        raise job.error
    else:
        rec = job.result
    return evaluate(design, rec=rec)


def run_controls(pending: list[str], top) -> bool:
    """The Run button (top of the sidebar) and, while inputs changed, the banner saying what
    changed.  True when the user asked to run."""
    clicked = top.button("Run", key="run", type="primary" if pending else "secondary", width="stretch",
                         help="compute the design in the sidebar (the search of a new design takes seconds; "
                              "designs seen before come back at once)")
    if pending and not clicked:
        banner = st.empty()
        c1, c2 = banner.container().columns([6, 1], vertical_alignment="center")
        c1.info("The sidebar has changes not computed yet: " + md("; ".join(pending)) +
                ". The results below are for the previous design.", icon=":material/pending:")
        clicked = c2.button("Run", key="run_main", type="primary", width="stretch")
        if clicked:
            banner.empty()
    return clicked


# --------------------------------------------------------------------------- results


def results(ev: Evaluation) -> None:
    plans = present.ranked(ev.plans)
    labels = [present.plan_choice_label(p) for p in plans]
    # A new list of plans is a new widget (its key names the list): the choice starts at the
    # link's plan the first time, at the first plan after that.
    key = "plan_choice_" + hashlib.sha1("\n".join(labels).encode()).hexdigest()[:12]
    index = 0
    if not st.session_state.get("plan_link_used"):
        want = st.query_params.get("plan")
        ranks = [present.rank_label(p).lstrip("#") for p in plans]
        index = ranks.index(want) if want in ranks else 0
    st.session_state["plan_link_used"] = True
    choice = st.selectbox("Plan to inspect and export", labels, index=index, key=key)
    st.session_state["plan_choice_key"] = key
    chosen = labels.index(choice)
    plan = plans[chosen]
    if chosen:
        st.query_params["plan"] = present.rank_label(plan).lstrip("#")
    else:
        st.query_params.pop("plan", None)
    eco_key = ev.design.cache_key() + "|" + plan["strategy"]
    eco, eco_note = cached_economics(eco_key, ev.design, ev.cluster, plan)
    headline(plan, eco, eco_note, ev.design.token_budget)
    if st.button("Keep for comparison", key="keep", help=f"pin this design (up to {compare.MAX_DESIGNS})"):
        snap = compare.snapshot(ev.design, ev.cluster, plan, eco)
        st.session_state["compare"] = compare.add_snapshot(st.session_state.get("compare", []), snap)
        st.toast(f"kept {snap['label']} ({len(st.session_state['compare'])}/{compare.MAX_DESIGNS})")
    tabs = st.tabs(TABS, key="tab", on_change="rerun", bind="query-params")
    tab = dict(zip(TABS, tabs))
    with tab["Plans"]:
        if tab["Plans"].open is not False:
            plans_tab(ev, plans, chosen)
    with tab["Timeline"]:
        if tab["Timeline"].open:
            timeline_tab(ev, plan)
    with tab["Topology"]:
        if tab["Topology"].open:
            topology_tab(ev)
    with tab["Compare"]:
        if tab["Compare"].open:
            compare_tab()
    with tab["Hand-off"]:
        if tab["Hand-off"].open:
            handoff_tab(ev, plan, plans, eco)


def no_plan_view(ev: Evaluation) -> None:
    """Without a plan (nothing fits): say why and what would fit; the cluster still draws."""
    expl = ev.search.get("explanation") or {}
    if ev.search:
        st.warning("No strategy fits this design.\n\n" + "\n".join(f"- {md(line)}" for line in expl.get("lines", [])))
    sugg = ev.search.get("suggestions") or []
    if sugg:
        st.markdown("**What would fit:**")
        st.dataframe([{"change": x.get("what", x.get("change")), "best strategy": x.get("best_strategy", ""),
                       "step time (s)": x.get("step_time_s"),
                       "peak memory (GiB, device)": (x.get("memory_device_bytes") or 0) / present.GIB} for x in sugg],
                     hide_index=True, key="suggestions_table")
    tabs = st.tabs(("Topology", "Compare"), key="tab_noplan")
    with tabs[0]:
        topology_tab(ev)
    with tabs[1]:
        compare_tab()


# --------------------------------------------------------------------------- the page


def sidebar_design(raw: dict[str, Any], slots: dict[str, Any], errors: dict[str, str]) -> Design | None:
    """The sidebar's design, checked (``check``), with the cluster it builds described under
    the cluster inputs; ``None`` with the error added to ``errors``."""
    if errors:
        return None
    design = None
    try:
        design = design_from(raw)
        cluster = check(design)
    except InputError as exc:
        errors[widget_for_error(exc, design) or "design"] = error_text(exc)
        return None
    slots["cluster"].caption(md("As built: " + present.cluster_summary(cluster)))
    return design


def requested(design: Design | None, raw: dict[str, Any], top) -> tuple[Design | None, bool]:
    """(the design to show, whether its search's progress is to be drawn live).  The
    sidebar's design when the user runs it, when the page opens, or when its search is known
    (seen before, or only the token budget, pricing or fixed strategy changed); otherwise the
    design shown before, with the Run controls saying what changed."""
    ss = st.session_state
    shown: Design | None = ss.get("shown")
    store = job_store()
    auto = design is not None and (shown is None or design.recommend_key() == shown.recommend_key()
                                   or store.finished(search_key(design)))
    pending: list[str] = []
    if design is not None and shown is not None and design != shown and not auto:
        pending = changes(ss.get("shown_raw", {}), raw) or ["the model file"]
    clicked = run_controls(pending, top) or bool(ss.pop("run_requested", False))
    if design is None or not (clicked or auto):
        return shown, False
    if shown is not None and search_key(shown) != search_key(design):
        old = store.get(search_key(shown))
        if old is not None and not old.done:
            store.cancel(search_key(shown))  # superseded: free the CPU for the new search
    fresh = clicked or shown is None
    ss["shown"], ss["shown_raw"] = design, dict(raw)
    return design, fresh


def page() -> None:
    st.title("Cluster what-if")
    st.caption("Set the model, GPUs, network and job in the sidebar and press **Run**; every result below "
               "follows. Predictions come from the project's simulator (see docs/accuracy.md for its accuracy). "
               "The page's address holds the design: bookmark it or send it to a colleague.")
    ss = st.session_state
    first = "link_checked" not in ss
    link = dict(st.query_params) if first else {}
    top = st.sidebar.container()  # the Run button, drawn once the page knows what changed
    raw, slots, errors = sidebar(catalog())
    if first:
        ss["link_checked"] = True
        dropped = ignored_values({k: v for k, v in link.items() if k in BOUND}, widget_values())
        if dropped:
            st.warning("This link has values the app cannot use, so the defaults stand in for them: "
                       + md(", ".join(dropped)))
    design = sidebar_design(raw, slots, errors)
    shown, fresh = requested(design, raw, top)
    if errors:
        show_errors(errors, slots)
        return
    if shown is None:
        return
    t = time.perf_counter()
    try:
        ev = compute(shown, fresh=fresh)
    except InputError as exc:
        show_errors({widget_for_error(exc, shown) or "design": error_text(exc)}, slots)
        return
    elapsed = time.perf_counter() - t
    for note in ev.notes:
        st.info(md(note))
    if ev.has_plans:
        results(ev)
    else:
        no_plan_view(ev)
    st.caption(f"{ev.design.token_budget / 1e9:,.0f} B tokens to train. Page computed in {elapsed:.2f} s "
               "(the search is cached per design)")


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
        from appkit import search_front  # the front of a planner sweep run: its own section

        search_front.render()
    except Exception as exc:  # noqa: BLE001  the user never sees a traceback
        _log.exception("what-if app: unexpected error")  # the server log keeps it for us
        st.error(f"Something went wrong inside the planner: {md(error_text(exc))}. "
                 "Please report the inputs that led here.")
