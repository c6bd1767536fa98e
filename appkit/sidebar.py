"""The sidebar: every input of a design, each bound to the page's address (``appkit.links``).

``sidebar`` draws the widgets and returns what they hold (``raw``), a slot under each widget
for its error message, and the errors found while reading them; ``design_from`` turns ``raw``
into a ``Design``.  Editing an input reruns the page but computes nothing new: the page
compares the sidebar's design with the one it shows and offers **Run** (``appkit.ui``).

Every widget has a key and ``bind="query-params"``: its value lives in the URL, survives a
reload and a hidden widget (the catalog model while a file is uploaded), and a link opens the
same design.  A bound selectbox writes its option's *label* into the URL, so options are plain
ids (``gpu=h100-80gb``) and only the default ``auto`` has a longer label; names go in captions.  An uploaded file is kept in the session (and in the link, ``appkit.links``)
until the user removes it.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from appkit.design import Design, error_text, model_from_upload
from appkit.links import decode_upload, encode_upload
from planner.fitting.uncertainty import memory_headroom
from sim.data.conventions import conventions
from sim.base.errors import InputError
from sim.data.hardware import TOPOLOGIES
from sim.data.specs import DEFAULT_SEQ_LEN
from sim.base.units import GIB

AUTO = "auto"
BIND = "query-params"
DEFAULT_MODEL, DEFAULT_GPU, DEFAULT_NUM_GPUS = "gpt3-175b", "a100-80gb", 1024
UPLOAD = "Upload file"
# Widgets whose value is the design (keys = URL parameters); the file uploader cannot be bound.
BOUND: tuple[str, ...] = ("model_source", "model", "gpu", "num_gpus", "gpus_per_node", "nvlink_domain", "nic",
                          "nics_per_node", "topology", "oversubscription", "server", "p2p", "seq_len", "gbs",
                          "token_budget", "pricing", "framework", "fp8", "memory_headroom", "strategy", "rerank")


@st.cache_data(show_spinner=False, max_entries=16)
def cached_upload(name: str, data: bytes):
    return model_from_upload(name, data)


def _index(options: list[str], value: str) -> int:
    return options.index(value) if value in options else 0


def _model_inputs(sb, cat: dict[str, Any], raw: dict[str, Any], errors: dict[str, str]) -> None:
    ss = st.session_state
    source = sb.radio("Model source", ("Catalog", UPLOAD), horizontal=True, key="model_source", bind=BIND)
    if source == "Catalog":
        ids = list(cat["models"])
        raw["model_ref"] = sb.selectbox("Model", ids, index=_index(ids, DEFAULT_MODEL), key="model", bind=BIND)
        raw["model"] = cat["models"][raw["model_ref"]]
        ss["upload_live"] = False
        for key in ("model_file", "model_data"):
            st.query_params.pop(key, None)
        return
    up = sb.file_uploader("Hugging Face config.json or project model file (YAML/JSON)",
                          type=["json", "yaml", "yml"], key="model_file")
    if up is not None:
        ss["upload"] = (up.name, up.getvalue())
    elif ss.get("upload_live"):
        ss.pop("upload", None)  # the user removed the file
    ss["upload_live"] = up is not None
    if "upload" not in ss and "model_data" in st.query_params and not ss.get("link_upload_read"):
        ss["link_upload_read"] = True  # a link's file, read once per session
        try:
            ss["upload"] = (st.query_params.get("model_file") or "model.json",
                            decode_upload(st.query_params["model_data"]))
        except InputError as exc:
            errors["model"] = error_text(exc)
            return
    if "upload" not in ss:
        errors["model"] = "upload a model file (or pick one from the catalog)"
        for key in ("model_file", "model_data"):
            st.query_params.pop(key, None)
        return
    name, data = ss["upload"]
    if up is None:
        sb.caption(f"using {name} (from the link or an earlier upload; upload a file to replace it)")
    raw["model_ref"] = name
    try:
        raw["model"] = cached_upload(name, data)
    except InputError as exc:
        errors["model"] = error_text(exc)
        return
    link = encode_upload(data)
    st.query_params["model_file"] = name
    if link is not None:
        st.query_params["model_data"] = link
    else:
        st.query_params.pop("model_data", None)
        sb.caption("this file is too large to travel in the page's address: a link names it only")


def sidebar(cat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Draw the inputs; return (raw values, error slot per widget, errors found so far)."""
    sb = st.sidebar
    raw: dict[str, Any] = {}
    slots: dict[str, Any] = {}
    errors: dict[str, str] = {}

    sb.header("Model")
    _model_inputs(sb, cat, raw, errors)
    slots["model"] = sb.empty()
    if "model" in raw:
        m = raw["model"]
        moe = f", MoE {m.moe.num_experts} experts top-{m.moe.top_k}" if m.moe else ""
        sb.caption(f"{m.name}: {m.num_params / 1e9:,.1f} B parameters, {m.num_layers} layers, "
                   f"hidden {m.hidden_size}{moe}")

    sb.header("Cluster")
    gpu_ids = list(cat["gpus"])
    raw["gpu"] = sb.selectbox("GPU", gpu_ids, index=_index(gpu_ids, DEFAULT_GPU), key="gpu", bind=BIND)
    slots["gpu"] = sb.empty()
    gpu = cat["gpus"][raw["gpu"]]
    pcie = gpu.form_factor == "pcie"
    sb.caption(f"{gpu.name}: {gpu.hbm_bytes / GIB:,.0f} GiB, {gpu.dense_flops_per_s['bf16'] / 1e12:,.0f} dense bf16 "
               f"TFLOP/s{', fp8' if 'fp8' in gpu.dense_flops_per_s else ''}; {gpu.form_factor.upper()}")
    raw["num_gpus"] = sb.number_input("Number of GPUs", min_value=1, max_value=1 << 22, value=DEFAULT_NUM_GPUS,
                                      step=8, key="num_gpus", bind=BIND)
    slots["num_gpus"] = sb.empty()
    c1, c2 = sb.columns(2)
    raw["gpus_per_node"] = c1.number_input("GPUs per node", min_value=1, max_value=1024, value=None, step=1,
                                           key="gpus_per_node", bind=BIND,
                                           placeholder="auto (the server's)" if pcie else f"auto ({gpu.gpus_per_node})")
    # A PCIe card's node is its scale-up domain: the server's PCIe fabric, not NVLink.
    domain = c2.number_input("NVLink domain (GPUs)", min_value=1, max_value=1 << 16, value=None, step=1,
                             key="nvlink_domain", bind=BIND, disabled=pcie,
                             placeholder="none: PCIe card" if pcie else
                             f"auto ({max(gpu.nvlink_domain_size, gpu.gpus_per_node)})",
                             help="GPUs joined by NVLink; PCIe cards talk through their server's PCIe fabric "
                                  "(see PCIe server below)")
    raw["nvlink_domain"] = None if pcie else domain
    slots["gpus_per_node"] = sb.empty()
    slots["nvlink_domain"] = sb.empty()
    nic_ids = [AUTO] + list(cat["nics"])
    c1, c2 = sb.columns(2)
    nic = c1.selectbox("NIC", nic_ids, key="nic", bind=BIND,
                       format_func=lambda i: (("auto (the server's)" if pcie else f"auto ({gpu.default_nic})")
                                              if i == AUTO else i))
    raw["nic"] = None if nic == AUTO else nic
    raw["nics_per_node"] = c2.number_input("NICs per node", min_value=1, max_value=1024, value=None, step=1,
                                           key="nics_per_node", bind=BIND,
                                           placeholder="auto (the server's)" if pcie else f"auto ({gpu.nics_per_node})")
    slots["nic"] = sb.empty()
    slots["nics_per_node"] = sb.empty()

    c1, c2 = sb.columns(2)
    raw["topology"] = c1.selectbox("Topology", TOPOLOGIES, key="topology", bind=BIND)
    raw["oversubscription"] = c2.number_input("Oversubscription (x:1)", min_value=1.0, max_value=64.0, value=1.0,
                                              step=0.5, key="oversubscription", bind=BIND,
                                              help="leaf downlink:uplink ratio; 1 = non-blocking")
    slots["topology"] = sb.empty()
    slots["oversubscription"] = sb.empty()
    c1, c2 = sb.columns(2)
    server = c1.selectbox("PCIe server", [AUTO] + list(cat["servers"]), key="server", disabled=not pcie, bind=BIND,
                          format_func=lambda i: "auto (for the node size)" if i == AUTO else i,
                          help="PCIe cards: the server design (catalogs/servers.yaml); docs/pcie.md")
    raw["server"] = None if server == AUTO or not pcie else server
    p2p = c2.selectbox("GPU peer-to-peer", [AUTO, "pcie", "none"], key="p2p", disabled=not pcie, bind=BIND,
                       format_func=lambda i: f"auto ({gpu.p2p})" if i == AUTO else i,
                       help="none: GPU-GPU traffic staged through host memory (GeForce, stock driver)")
    raw["p2p"] = None if p2p == AUTO or not pcie else p2p
    slots["server"] = sb.empty()
    slots["p2p"] = sb.empty()
    slots["cluster"] = sb.empty()  # the cluster as built (appkit.present.cluster_summary)

    sb.header("Training job")
    raw["seq_len"] = sb.number_input("Sequence length (tokens)", min_value=1, max_value=1 << 26,
                                     value=DEFAULT_SEQ_LEN, step=512, key="seq_len", bind=BIND)
    slots["seq_len"] = sb.empty()
    raw["gbs"] = sb.number_input("Global batch (sequences)", min_value=1, max_value=1 << 30, value=None, step=64,
                                 key="gbs", bind=BIND, placeholder="auto (recommender's choice)")
    slots["gbs"] = sb.empty()
    default_b = conventions().tokens_per_parameter * raw["model"].num_params / 1e9 if "model" in raw else None
    raw["token_budget_b"] = sb.number_input(
        "Token budget (billion tokens)", min_value=0.0, value=None, step=100.0, key="token_budget", bind=BIND,
        placeholder=f"auto: {default_b:,.0f} B (20 per parameter)" if default_b else "auto: 20 per parameter")
    slots["token_budget"] = sb.empty()
    raw["pricing"] = sb.selectbox("Pricing", ("owned", "cloud"), key="pricing", bind=BIND,
                                  help="owned: capex depreciation + energy (planner tco); cloud: GPU-hours x "
                                       "the catalog's on-demand price")
    slots["pricing"] = sb.empty()

    sb.header("Plans")
    fw_ids = [AUTO] + [f for f in cat["frameworks"] if f != "default"]
    fw = sb.selectbox("Framework", fw_ids, key="framework", bind=BIND,
                      format_func=lambda i: "auto (recommender's choice)" if i == AUTO else i,
                      help="search only the plans one framework profile runs (catalogs/frameworks.yaml), "
                           "as `planner recommend --framework`")
    raw["framework"] = None if fw == AUTO else fw
    if raw["framework"] is not None:
        sb.caption(cat["frameworks"][fw].name)
    slots["framework"] = sb.empty()
    has_fp8 = "fp8" in gpu.dense_flops_per_s
    fp8 = sb.toggle("Allow fp8 (opt in)", value=False, key="fp8", bind=BIND, disabled=not has_fp8,
                    help=("also search fp8 plans (`planner recommend --precision bf16,fp8`): fp8 changes the "
                          "numerics and the convergence risk, so plans stay bf16 unless you ask"
                          if has_fp8 else f"{gpu.id} has no fp8 tensor cores: plans are bf16"))
    raw["fp8"] = bool(fp8 and has_fp8)
    raw["precisions"] = ("bf16", "fp8") if raw["fp8"] else (gpu.default_precision,)  # what is searched (shown)
    slots["fp8"] = sb.empty()
    headroom, why = memory_headroom()
    raw["memory_headroom"] = sb.number_input(
        "Memory headroom (fraction kept free)", min_value=0.0, max_value=0.99, value=None, step=0.01,
        format="%.2f", key="memory_headroom", bind=BIND, placeholder=f"auto: {headroom:.2f} (measured)",
        help=f"fraction of GPU memory a plan keeps free, at the device level (as nvidia-smi shows it), as "
             f"`planner recommend --memory-headroom F`; auto: the memory model's measured error ({why}); "
             "0 = plans may fill the GPU")
    slots["memory_headroom"] = sb.empty()
    raw["strategy"] = sb.text_input("Fixed strategy (optional)", key="strategy", bind=BIND,
                                    placeholder="e.g. tp=8,pp=16,vp=3,mbs=1,sp=1,recompute=selective",
                                    help="a STRATEGY string as `planner simulate --strategy` takes; it is shown "
                                         "as plan \"yours\" next to the recommendations; empty = recommend only")
    slots["strategy"] = sb.empty()
    raw["rerank"] = sb.toggle("Re-rank top plans with the event engine", value=True, key="rerank", bind=BIND,
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
                  server=raw.get("server"), p2p=raw.get("p2p"),
                  precisions=("bf16", "fp8") if raw.get("fp8") else None, framework=raw.get("framework"),
                  memory_headroom=None if raw.get("memory_headroom") is None else float(raw["memory_headroom"]))


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def widget_values() -> dict[str, Any]:
    """What each bound widget holds now (for ``appkit.links.ignored_values``)."""
    ss = st.session_state
    return {k: ss[k] for k in BOUND if k in ss}
