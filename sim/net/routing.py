"""Reference routing on the networkx graph of ``sim.net.topology``: slow, exists to check
``sim.net.network`` on small clusters (``tests/test_collectives.py``) and for bisection checks.

Routing policy: inside one NVLink domain via its NVSwitch; otherwise the flow is striped
evenly over the NICs of the sender's node that its NVLink domain reaches (NCCL channels and
PXN), stripe ``j`` leaving on pool NIC ``j`` and arriving on the receiver's pool NIC ``j``
(rail-aligned), with an NVLink hop to or from the GPU that owns a NIC that is not the
sender's or receiver's own.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import networkx as nx

from sim.base.errors import InputError
from sim.net.fabric import TIERS, Fabric


def _pool(graph: nx.Graph, gpu: int) -> list[tuple]:
    """NICs of ``gpu``'s node reachable inside its NVLink domain, in NIC order."""
    cache = graph.graph.setdefault("_pools", {})
    a = graph.nodes[("gpu", gpu)]
    key = (a["node"], a["domain"])
    if key not in cache:
        nics = set()
        for other, attrs in graph.nodes(data=True):
            if attrs.get("kind") == "gpu" and (attrs["node"], attrs["domain"]) == key:
                nics.update(n for n in graph[other] if n[0] == "nic")
        cache[key] = sorted(nics)
    return cache[key]


def _owner(graph: nx.Graph, nic: tuple) -> tuple:
    return min(n for n in graph[nic] if n[0] == "gpu")


def _grid_path(graph: nx.Graph, src_node: int, dst_node: int) -> list[tuple]:
    """Dimension-order (columns, then rows) route between routers; shortest on mesh/torus."""
    f: Fabric = graph.graph["fabric"]
    rows, cols = f.grid_rows, f.grid_cols
    x, y = src_node % cols, src_node // cols
    xb, yb = dst_node % cols, dst_node // cols
    path = [("router", src_node)]
    for size, axis in ((cols, 0), (rows, 1)):
        cur, goal = (x, xb) if axis == 0 else (y, yb)
        if f.torus:
            fwd = (goal - cur) % size
            step, count = (1, fwd) if fwd <= size - fwd else (-1, size - fwd)
        else:
            step, count = (1 if goal >= cur else -1), abs(goal - cur)
        for _ in range(count):
            cur = (cur + step) % size
            x, y = (cur, y) if axis == 0 else (x, cur)
            path.append(("router", y * cols + x))
    return path


def route_stripes(graph: nx.Graph, src: int, dst: int) -> list[list[tuple]]:
    """Paths (node lists) of the equal stripes of one ``src -> dst`` flow on a detailed graph."""
    if graph.graph.get("aggregated"):
        raise InputError("graph", "aggregated", "reference routing needs build_topology(..., aggregate=False)")
    u, v = ("gpu", src), ("gpu", dst)
    du, dv = graph.nodes[u]["domain"], graph.nodes[v]["domain"]
    f: Fabric = graph.graph["fabric"]
    if du == dv and f.has_scale_up:
        return [[u, ("nvswitch", du), v]]
    pu, pv = _pool(graph, src), _pool(graph, dst)
    if "_scale_out" not in graph.graph:
        graph.graph["_scale_out"] = graph.subgraph([n for n in graph if n[0] in ("nic", "switch")])
    scale_out = graph.graph["_scale_out"]
    paths = []
    for j in range(max(len(pu), len(pv))):
        a, b = pu[j % len(pu)], pv[j % len(pv)]
        path = [u] if graph.has_edge(u, a) else [u, ("nvswitch", du), _owner(graph, a)]
        if a != b:
            if f.switched:
                path += nx.shortest_path(scale_out, a, b)
            else:
                path += [a] + _grid_path(graph, a[1], b[1]) + [b]
        else:
            path.append(a)
        path += [v] if graph.has_edge(b, v) else [_owner(graph, b), ("nvswitch", dv), v]
        paths.append(path)
    return paths


def graph_group_link(graph: nx.Graph, groups: Sequence[Sequence[int]], *, index: int = 0,
                     pattern: str = "ring", bandwidth_efficiency: Mapping[str, float] | None = None,
                     ) -> tuple[float, float, str]:
    """Reference for ``sim.net.network``: ``(bytes_per_s, latency_s, tier)`` of ``groups[index]``.

    All ``groups`` run at once.  ``pattern`` ``ring`` routes ``g[i] -> g[i+1]`` (closing the
    ring), ``p2p`` only ``g[0] -> g[1]``, ``all_to_all`` every ordered pair.  Each directed edge's
    load is the number of flows (stripes weighted ``1/stripes``) on it; the group's bandwidth is
    the minimum over its edges of ``capacity * efficiency / load`` (times ``n - 1`` for
    all-to-all: per-rank send rate).  Slow; for checks on small clusters.
    """
    eff = dict(bandwidth_efficiency or {})

    def flows_of(g: Sequence[int]) -> list[tuple[int, int]]:
        n = len(g)
        if n < 2:
            return []
        if pattern == "ring":
            return [(g[i], g[(i + 1) % n]) for i in range(n)]
        if pattern == "p2p":
            return [(g[0], g[1])]
        return [(a, b) for a in g for b in g if a != b]

    load: dict[tuple, float] = {}
    routed: list[list[list[tuple]]] = []
    for gi, grp in enumerate(groups):
        per_flow = []
        for s, d in flows_of(grp):
            stripes = route_stripes(graph, s, d)
            w = 1.0 / len(stripes)
            for p in stripes:
                for e in zip(p, p[1:]):
                    load[e] = load.get(e, 0.0) + w
            per_flow.append(stripes)
        routed.append(per_flow)
    mine = routed[index]
    if not mine:
        return math.inf, 0.0, "local"
    bw, lat, tier = math.inf, 0.0, -1
    for stripes in mine:
        for p in stripes:
            path_lat = 0.0
            for e in zip(p, p[1:]):
                attrs = graph.edges[e]
                bw = min(bw, attrs["bytes_per_s"] * eff.get(attrs["tier"], 1.0) / load[e])
                path_lat += attrs["latency_s"]
                tier = max(tier, TIERS.index(attrs["tier"]))
            lat = max(lat, path_lat)
    if pattern == "all_to_all":
        bw *= len(groups[index]) - 1
    return bw, lat, TIERS[tier]


def graph_bisection_bytes_per_s(graph: nx.Graph, first_half: Sequence[int] | None = None) -> float:
    """Max-flow min-cut between two halves of the scale-out endpoints (NICs, or routers).

    ``first_half`` lists node ids (default: the first half of the nodes); both directions of
    every scale-out edge get its ``bytes_per_s``.  For verifying the closed form on small graphs.
    """
    f: Fabric = graph.graph["fabric"]
    kind = "nic" if f.switched else "router"
    ends = sorted(n for n in graph if n[0] == kind)
    half = set(first_half if first_half is not None else range(f.num_nodes // 2))
    d = nx.DiGraph()
    for a, b, attrs in graph.edges(data=True):
        if attrs["tier"] == "scale-out":
            d.add_edge(a, b, capacity=attrs["bytes_per_s"])
            d.add_edge(b, a, capacity=attrs["bytes_per_s"])
    for n in ends:
        if n[1] in half:
            d.add_edge("source", n)
        else:
            d.add_edge(n, "sink")
    return float(nx.maximum_flow_value(d, "source", "sink"))
