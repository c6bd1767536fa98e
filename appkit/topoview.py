"""A readable picture of a cluster fabric, from the networkx graph of ``sim.net.topology``.

A 1024-GPU fat-tree is ~2,200 graph nodes; nobody reads that.  ``summarize_topology`` folds
the graph into at most ``max_boxes`` boxes per tier (GPUs, NVLink switches, NICs, grid
routers, each switch level): small clusters keep one box per GPU, larger ones one box per
group of whole nodes, and switch levels are chunked the same way.  Edges between two boxes
are merged with their link count and summed bandwidth, so the drawing still says where the
capacity is.  ``topology_figure`` draws the summary as a layered plotly chart (NVLink below
the GPUs, the scale-out tiers above).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx

from sim.net.fabric import level_name

TIER_COLORS = {"scale-up": "#2ca02c", "host": "#8c8c8c", "scale-out": "#1f77b4"}
KIND_COLORS = {"gpu": "#76b900", "nvswitch": "#2ca02c", "nic": "#9467bd", "router": "#ff7f0e",
               "switch": "#1f77b4", "host": "#8c8c8c"}
HOST_KINDS = ("pcie-switch", "root", "dram")  # the inside of a PCIe server (sim.net.server)


@dataclass(frozen=True, kw_only=True, slots=True)
class Box:
    """One drawn box: ``members`` graph nodes of one kind (and switch level)."""

    key: tuple
    kind: str  # gpu | nvswitch | host (a PCIe server's switches, CPUs, memory) | nic | router | switch
    level: int  # 0 below the GPUs (NVLink or PCIe/host), 1 GPUs, 2 NICs, 3 routers, 2 + k switch level k
    index: int  # position within its level
    label: str
    members: int  # graph nodes folded in
    physical: int  # physical devices (switch nodes of an aggregated layer count several)
    detail: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class BoxEdge:
    a: tuple
    b: tuple
    tier: str  # scale-up | host | scale-out
    link: str
    num_links: int
    bytes_per_s: float  # summed per direction


@dataclass(frozen=True, kw_only=True)
class TopoSummary:
    boxes: tuple[Box, ...]
    edges: tuple[BoxEdge, ...]
    aggregated: bool
    nodes_per_box: int  # cluster nodes per GPU box (0 when each box is one GPU)
    graph_nodes: int
    graph_edges: int
    internal_links: dict[tuple, int] = field(default_factory=dict)  # box -> links folded inside

    def levels(self) -> dict[int, list[Box]]:
        out: dict[int, list[Box]] = {}
        for b in self.boxes:
            out.setdefault(b.level, []).append(b)
        for lst in out.values():
            lst.sort(key=lambda b: b.index)
        return out


def _range(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def summarize_topology(graph: nx.Graph, *, max_boxes: int = 12) -> TopoSummary:
    """Fold ``graph`` (from ``sim.net.topology.build_topology``) into at most ``max_boxes`` boxes
    per tier (see the module docstring)."""
    if max_boxes < 1:
        raise ValueError("max_boxes must be >= 1")
    cluster = graph.graph["cluster"]
    gpn = cluster.gpus_per_node
    num_gpus = cluster.num_gpus
    num_nodes = cluster.num_nodes
    nics = cluster.nics_per_node
    per_gpu = num_gpus <= max_boxes
    if per_gpu:
        node_chunk = 0
    else:
        node_chunk = 1 << max(0, math.ceil(num_nodes / max_boxes) - 1).bit_length()  # a power of two
        if cluster.scale_up_block > gpn:  # a multi-node NVLink domain (NVL72) stays in one box
            span = cluster.scale_up_block // gpn
            node_chunk = span * math.ceil(node_chunk / span)
    switch_counts: dict[int, int] = {}
    for n, a in graph.nodes(data=True):
        if a.get("kind") == "switch":
            switch_counts[a["level"]] = switch_counts.get(a["level"], 0) + 1
    switch_chunk = {lvl: max(1, math.ceil(c / max_boxes)) for lvl, c in switch_counts.items()}
    domains = {a.get("domain") for n, a in graph.nodes(data=True) if a.get("kind") == "gpu"}
    domain_chunk = max(1, math.ceil(len(domains) / max_boxes)) if per_gpu else 0

    def box_key(n: tuple, a: dict) -> tuple:
        kind = a.get("kind", n[0])
        if kind == "gpu":
            return ("gpu", n[1]) if per_gpu else ("gpu", a["node"] // node_chunk)
        if kind == "nic":
            node = n[1]
            return ("nic", node * nics + n[2]) if per_gpu else ("nic", node // node_chunk)
        if kind == "nvswitch":
            if per_gpu:
                return ("nvswitch", n[1] // domain_chunk)
            first_node = n[1] * cluster.scale_up_block // gpn
            return ("nvswitch", first_node // node_chunk)
        if kind == "router":
            return ("router", n[1]) if per_gpu else ("router", n[1] // node_chunk)
        if kind in HOST_KINDS:  # a PCIe server's switches, root complexes, memory: one box per node (group)
            return ("host", n[1]) if per_gpu else ("host", n[1] // node_chunk)
        if kind == "switch":
            lvl = a["level"]
            return ("switch", lvl, n[2] // switch_chunk[lvl])
        return ("other", str(n))

    members: dict[tuple, list[tuple]] = {}
    node_box: dict[tuple, tuple] = {}
    for n, a in graph.nodes(data=True):
        k = box_key(n, a)
        node_box[n] = k
        members.setdefault(k, []).append((n, a))

    boxes = [_make_box(k, ms, cluster, per_gpu, node_chunk) for k, ms in members.items()]

    merged: dict[tuple, dict] = {}
    internal: dict[tuple, int] = {}
    for u, v, a in graph.edges(data=True):
        bu, bv = node_box[u], node_box[v]
        links = int(a.get("num_links", 1))
        if bu == bv:
            internal[bu] = internal.get(bu, 0) + links
            continue
        key = (bu, bv) if bu <= bv else (bv, bu)
        m = merged.setdefault(key, {"tier": a.get("tier", ""), "link": a.get("link", ""), "num_links": 0,
                                    "bytes_per_s": 0.0})
        m["num_links"] += links
        m["bytes_per_s"] += float(a.get("bytes_per_s", 0.0))
    edges = tuple(BoxEdge(a=k[0], b=k[1], **m) for k, m in merged.items())
    return TopoSummary(boxes=tuple(boxes), edges=edges, aggregated=not per_gpu, nodes_per_box=node_chunk,
                       graph_nodes=graph.number_of_nodes(), graph_edges=graph.number_of_edges(),
                       internal_links=internal)


def _make_box(key: tuple, ms: list[tuple], cluster, per_gpu: bool, node_chunk: int) -> Box:
    kind = key[0]
    count = len(ms)
    if kind == "gpu":
        ids = sorted(n[1] for n, _ in ms)
        nodes = sorted({a["node"] for _, a in ms})
        if per_gpu:
            label = f"GPU {ids[0]}"
        elif len(nodes) == 1:
            label = f"node {nodes[0]}"
        else:
            label = f"nodes {_range(nodes[0], nodes[-1])}"
        detail = f"{count} x {cluster.gpu.id}, GPUs {_range(ids[0], ids[-1])}"
        return Box(key=key, kind=kind, level=1, index=key[1], label=label, members=count, physical=count,
                   detail=detail)
    if kind == "nvswitch":
        ds = sorted(n[1] for n, _ in ms)
        label = f"domain {ds[0]}" if count == 1 else f"{count} domains"
        detail = (f"{count} NVLink domain(s) of {cluster.domain_size} GPUs "
                  f"({_range(ds[0], ds[-1])})")
        return Box(key=key, kind=kind, level=0, index=key[1], label=label, members=count, physical=count,
                   detail=detail)
    if kind == "nic":
        label = f"NIC {key[1]}" if per_gpu else f"{count} NICs"
        detail = f"{count} x {cluster.nic.id}"
        return Box(key=key, kind=kind, level=2, index=key[1], label=label, members=count, physical=count,
                   detail=detail)
    if kind == "host":
        srv = cluster.server
        nodes = sorted({n[1] for n, _ in ms})
        label = f"node {nodes[0]} PCIe" if len(nodes) == 1 else f"nodes {_range(nodes[0], nodes[-1])} PCIe"
        detail = (f"{srv.sockets} x {srv.cpu.id}, {len(srv.switch_socket)} PCIe switch(es) per node, "
                  f"p2p {srv.p2p} ({srv.design})") if srv is not None else ""
        return Box(key=key, kind=kind, level=0, index=key[1], label=label, members=count, physical=count,
                   detail=detail)
    if kind == "router":
        label = f"router {key[1]}" if per_gpu else f"{count} routers"
        return Box(key=key, kind=kind, level=3, index=key[1], label=label, members=count, physical=count,
                   detail=f"{count} node router(s) of the {cluster.topology}")
    if kind == "switch":
        lvl = key[1]
        phys = sum(int(a.get("count", 1)) for _, a in ms)
        js = sorted(n[2] for n, _ in ms)
        name = level_name(lvl)
        label = f"{name} x{phys}" if phys > 1 else f"{name} {js[0]}"
        detail = f"{phys} physical {name} switch(es) in {count} block(s)"
        return Box(key=key, kind=kind, level=2 + lvl + (1 if cluster.topology in ("mesh", "torus") else 0),
                   index=key[2], label=label, members=count, physical=phys, detail=detail)
    return Box(key=key, kind=kind, level=9, index=0, label=str(key[1]), members=count, physical=count)


def _fmt_bw(b: float) -> str:
    if b >= 1e12:
        return f"{b / 1e12:.1f} TB/s"
    if b >= 1e9:
        return f"{b / 1e9:.0f} GB/s"
    return f"{b / 1e6:.0f} MB/s"


def _text_position(boxes_in_level: int, i: int) -> str:
    """Labels above the boxes; alternate above/below when a row is crowded."""
    if boxes_in_level <= 8:
        return "top center"
    return "top center" if i % 2 == 0 else "bottom center"


def positions(summary: TopoSummary) -> dict[tuple, tuple[float, float]]:
    """Layered layout: each level a row, boxes evenly spread in [0, 1]."""
    pos = {}
    for level, boxes in summary.levels().items():
        n = len(boxes)
        for i, b in enumerate(boxes):
            pos[b.key] = ((i + 0.5) / n, float(level))
    return pos


def topology_figure(summary: TopoSummary, *, title: str = ""):
    """A plotly figure of the summary: colored tiers, line width ~ log bandwidth."""
    import plotly.graph_objects as go

    pos = positions(summary)
    fig = go.Figure()
    bws = [e.bytes_per_s for e in summary.edges if e.bytes_per_s > 0]
    lo, hi = (min(bws), max(bws)) if bws else (1.0, 1.0)

    def width(b: float) -> float:
        if hi <= lo or b <= 0:
            return 2.0
        return 1.0 + 5.0 * math.log(b / lo) / math.log(hi / lo)

    groups: dict[tuple[str, float], list[BoxEdge]] = {}
    for e in summary.edges:
        groups.setdefault((e.tier, round(width(e.bytes_per_s))), []).append(e)
    shown: set[str] = set()
    mid_x, mid_y, mid_text = [], [], []
    for (tier, w), es in sorted(groups.items()):
        xs, ys = [], []
        for e in es:
            (x0, y0), (x1, y1) = pos[e.a], pos[e.b]
            xs += [x0, x1, None]
            ys += [y0, y1, None]
            mid_x.append((x0 + x1) / 2)
            mid_y.append((y0 + y1) / 2)
            mid_text.append(f"{tier}: {e.num_links} x {e.link} link(s)<br>{_fmt_bw(e.bytes_per_s)} per direction")
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=TIER_COLORS.get(tier, "#aaa"), width=w),
                                 name=tier, legendgroup=tier, showlegend=tier not in shown, hoverinfo="skip",
                                 opacity=0.7))
        shown.add(tier)
    fig.add_trace(go.Scatter(x=mid_x, y=mid_y, mode="markers", marker=dict(size=6, opacity=0),
                             hovertext=mid_text, hoverinfo="text", showlegend=False))
    levels_count = {lvl: len(bs) for lvl, bs in summary.levels().items()}
    for kind in ("nvswitch", "host", "gpu", "nic", "router", "switch"):
        bs = sorted((b for b in summary.boxes if b.kind == kind), key=lambda b: (b.level, b.index))
        if not bs:
            continue
        hover = []
        for b in bs:
            inside = summary.internal_links.get(b.key)
            extra = f"<br>{inside} link(s) inside this box" if inside else ""
            hover.append(f"{b.label.replace('<br>', ', ')}<br>{b.detail}{extra}")
        fig.add_trace(go.Scatter(
            x=[pos[b.key][0] for b in bs], y=[pos[b.key][1] for b in bs], mode="markers+text",
            marker=dict(symbol="square", size=30, color=KIND_COLORS[kind], line=dict(width=1, color="#333")),
            text=[b.label for b in bs], textfont=dict(size=10),
            textposition=[_text_position(levels_count[b.level], b.index) for b in bs],
            hovertext=hover, hoverinfo="text", name=kind, showlegend=False))
    levels = summary.levels()
    names = {0: "NVLink" if summary.boxes and all(b.kind != "host" for b in summary.boxes) else "PCIe/host",
             1: "GPUs", 2: "NICs"}
    tickvals = sorted(levels)
    ticktext = []
    for lvl in tickvals:
        b = levels[lvl][0]
        if b.kind == "switch":

            ticktext.append(level_name(b.key[1]))
        elif b.kind == "router":
            ticktext.append("routers")
        else:
            ticktext.append(names.get(lvl, b.kind))
    fig.update_layout(
        title=title or None, height=140 + 110 * len(levels), margin=dict(l=10, r=10, t=40 if title else 10, b=10),
        xaxis=dict(visible=False, range=[-0.02, 1.02]),
        yaxis=dict(tickvals=tickvals, ticktext=ticktext, range=[min(tickvals) - 0.5, max(tickvals) + 0.7],
                   showgrid=False, zeroline=False),
        plot_bgcolor="white", legend=dict(orientation="h", y=-0.05))
    return fig
