"""Cluster fabrics as networkx graphs, and their metrics.

One description (``sim.net.fabric.layout_fabric``: the arithmetic layout ``sim.net.network`` prices
collectives on), three uses:

* :func:`build_topology` draws that fabric as an ``nx.Graph`` (for plots, checks and the
  reference router of ``sim.net.routing``);
* :func:`topology_metrics` gives the closed-form bisection, diameter and the physical switch
  and cable counts a bill of materials needs;
* ``sim.net.routing`` routes flows on the graph to check ``sim.net.network``.

Graph vocabulary.  Nodes: ``("gpu", i)``; ``("nvswitch", d)``, one per NVLink domain (a GB200
NVL72 domain of 72 GPUs spans 18 nodes of 4); ``("nic", node, k)``; ``("switch", level, j)``
(level 1 = leaf); ``("router", node)`` for the switchless mesh/torus.  Every edge carries
``tier`` (``"scale-up" | "host" | "scale-out"``), ``link`` (catalog id), ``bytes_per_s`` (per
direction) and ``latency_s``; switch-to-switch edges also carry ``num_links``.

Modelling choices (each is an approximation; ``sim.net.network`` follows the same ones):

* **Aggregated switch layers.**  Above the leaves, the switches of one block (a pod's
  aggregation layer, the spine or core layer) are one graph node, and a child's parallel
  uplinks one edge with their summed bandwidth.  This assumes ideal ECMP/adaptive routing (no
  hash collisions) and keeps a 16k-GPU graph to ~35k nodes.  Physical counts come from the
  radix, not from the graph.
* **Sizing.**  Radix ``R`` = ``nic.switch_radix`` (``catalogs/fabric.yaml`` when unknown: 64).  A leaf with
  oversubscription ``o`` has ``floor(R*o/(1+o))`` down ports (``R/2`` when non-blocking) and
  uplink capacity ``attached NIC bandwidth / o``.  ``fat-tree`` (folded Clos, Al-Fares et al.
  2008) uses the fewest levels that fit: 1 if NICs <= R, 2 if <= R*R/2, 3 if <= R^3/4, ...,
  non-blocking above the leaf.  ``tree`` uses ``cluster.tree_levels`` levels and tapers by
  ``o`` at *every* level (the classic thinning tree Leiserson's fat-tree fixed).
  ``rail-optimized`` is a fat-tree of at least 2 levels whose leaves are rails: NIC ``k`` of
  up to ``R/2`` nodes share rail leaf ``k`` (one switch hop), spines join the rails.
  ``star`` is one switch of any port count.
* **Mesh/torus.**  Nodes on a near-square ``rows x cols`` grid; each node's NICs feed a
  ``("router", node)`` and the node's NIC bandwidth is split evenly over its ``2*D`` grid ports
  (``D`` = dimensions longer than 1), so a link carries ``nics*nic_bw/(2D)``; a torus
  dimension of length 2 has both ports on the same neighbour (one edge, double bandwidth);
  mesh boundary ports are unused.  Routing is dimension-order (columns first).
* **Host edges** (GPU-NIC) carry the GPU generation's PCIe x16 bandwidth, which binds only
  where a NIC is faster than the slot (e.g. NDR-400 behind an A100's PCIe 4).
* **PCIe cards** (``Cluster.server``): no NVSwitch; each node is drawn as its server
  (``sim.net.server.server_graph``: GPUs on PCIe switches or CPU root ports, root complexes
  joined by the socket link, host memory, NICs on switches or root ports, NVLink bridges),
  node-qualified: ``("pcie-switch", node, j)``, ``("root", node, s)``, ``("dram", node, s)``.
* **Latency.**  NIC-leaf edges take half the NIC's latency (so one switch hop costs the NIC's
  quoted host-to-host latency), every further switch traversal ``catalogs/fabric.yaml`` ``switch_hop_latency_us``, a
  grid hop the NIC's latency, NVLink edges half the scale-up latency.

Reference routing (``sim.net.routing``: ``route_stripes``, ``graph_group_link``) walks the graph;
it is slow and exists to check ``sim.net.network`` on small clusters.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from sim.net.fabric import Fabric, layout_fabric, level_name
from sim.net.server import server_graph
from sim.data.hardware import Cluster


# --------------------------------------------------------------------------- graph


AGGREGATE_ABOVE_GPUS = 4096
"""``build_topology`` draws one vertex per node instead of per GPU and NIC above this size."""


def build_topology(cluster: Cluster, *, aggregate: bool | None = None) -> nx.Graph:
    """The cluster as an ``nx.Graph`` (vocabulary and modelling choices: module docstring).

    ``graph.graph`` holds ``cluster``, ``fabric`` and ``aggregated``.  Switch layers above the
    leaves are always one vertex per block.  With ``aggregate`` (default: above
    ``AGGREGATE_ABOVE_GPUS`` GPUs) each node's GPUs and NICs become one ``("node", n)`` vertex
    (NVLink inside it; one edge per leaf it reaches, carrying the summed NIC bandwidth and
    ``num_links``; an ``("nvswitch", d)`` only for domains spanning nodes), so a 16k-GPU
    fat-tree is ~2.6k vertices.  Metrics and ``sim.net.network`` never need the graph; the
    reference router needs the detailed one.
    """
    f = layout_fabric(cluster)
    if aggregate is None:
        aggregate = f.num_gpus > AGGREGATE_ABOVE_GPUS
    g = nx.Graph(cluster=cluster, fabric=f, topology=f.topology, aggregated=bool(aggregate))
    if aggregate:
        _add_aggregated_nodes(g, f)
    else:
        _add_gpus_and_nics(g, f)
    if f.switched:
        _add_switch_levels(g, f)
    return g


def _add_servers(g: nx.Graph, f: Fabric) -> None:
    """PCIe cards: each node's inside (``sim.net.server.server_graph``) with node-qualified names
    (``("gpu", i)`` global; ``("pcie-switch", node, j)``, ``("root", node, s)``,
    ``("dram", node, s)``, ``("nic", node, k)``)."""
    gpn, one = f.gpus_per_node, server_graph(f.server.server)

    def name(node: int, v: tuple) -> tuple:
        return ("gpu", node * gpn + v[1]) if v[0] == "gpu" else (v[0], node, v[1])

    for node in range(f.num_nodes):
        for v, attrs in one.nodes(data=True):
            extra = {"node": node, "domain": node} if v[0] == "gpu" else {}
            g.add_node(name(node, v), **attrs, **extra)
        g.add_edges_from((name(node, u), name(node, v), dict(a)) for u, v, a in one.edges(data=True))


def _add_gpus_and_nics(g: nx.Graph, f: Fabric) -> None:
    G, gpn, nics = f.num_gpus, f.gpus_per_node, f.nics_per_node
    if f.server is not None:
        _add_servers(g, f)
        g.remove_nodes_from([("nic", n // nics, n % nics) for n in np.nonzero(~f.nic_present)[0]])
    g.add_nodes_from((("gpu", i), {"kind": "gpu", "node": i // gpn, "domain": int(f.gpu_domain[i])})
                     for i in range(G))
    if f.has_scale_up and f.server is None:
        su = {"tier": "scale-up", "link": f.scale_up_link, "bytes_per_s": f.scale_up_bytes_per_s,
              "latency_s": f.scale_up_latency_s / 2}
        for d in range(int(f.gpu_domain[-1]) + 1):
            g.add_node(("nvswitch", d), kind="nvswitch")
        g.add_edges_from(((("gpu", i), ("nvswitch", int(f.gpu_domain[i])), dict(su)) for i in range(G)))
    host = {"tier": "host", "link": f.host_link, "bytes_per_s": f.host_bytes_per_s, "latency_s": 0.0}
    for n in np.nonzero(f.nic_present)[0]:
        g.add_node(("nic", int(n) // nics, int(n) % nics), kind="nic")
    if f.server is None:
        g.add_edges_from((("gpu", i), ("nic", i // gpn, k), dict(host)) for i in range(G)
                         for k in f.gpu_nics[i % gpn])
    present = [int(n) for n in np.nonzero(f.nic_present)[0]]
    if f.switched:
        leaf_of = _leaf_of(f)
        out = {"tier": "scale-out", "link": f.nic_link, "bytes_per_s": f.nic_bytes_per_s,
               "latency_s": f.nic_latency_s / 2}
        g.add_edges_from((("nic", n // nics, n % nics), ("switch", 1, int(leaf_of[n])), dict(out)) for n in present)
    else:
        for node in range(f.num_nodes):
            g.add_node(("router", node), kind="router", x=node % f.grid_cols, y=node // f.grid_cols)
        out = {"tier": "scale-out", "link": f.nic_link, "bytes_per_s": f.nic_bytes_per_s, "latency_s": 0.0}
        g.add_edges_from((("nic", n // nics, n % nics), ("router", n // nics), dict(out)) for n in present)
        _add_grid_links(g, f, "router")


def _add_aggregated_nodes(g: nx.Graph, f: Fabric) -> None:
    gpn, nics = f.gpus_per_node, f.nics_per_node
    per_node_nics = f.nic_present.reshape(f.num_nodes, nics).sum(axis=1)
    for node in range(f.num_nodes):
        g.add_node(("node", node), kind="node", num_gpus=min(gpn, f.num_gpus), num_nics=int(per_node_nics[node]),
                   x=node % f.grid_cols, y=node // f.grid_cols)
    if f.has_scale_up and f.nvlink_domain > gpn:
        for d in range(int(f.gpu_domain[-1]) + 1):
            g.add_node(("nvswitch", d), kind="nvswitch")
        for node in range(f.num_nodes):
            g.add_edge(("node", node), ("nvswitch", int(f.gpu_domain[node * gpn])), tier="scale-up",
                       link=f.scale_up_link, bytes_per_s=gpn * f.scale_up_bytes_per_s,
                       latency_s=f.scale_up_latency_s / 2, num_links=gpn)
    if not f.switched:
        _add_grid_links(g, f, "node")
        return
    leaf_of = _leaf_of(f)
    present = np.nonzero(f.nic_present)[0]
    pairs, counts = np.unique(np.stack([present // nics, leaf_of[present]], axis=1), axis=0, return_counts=True)
    for (node, leaf), cnt in zip(pairs.tolist(), counts.tolist()):
        g.add_edge(("node", node), ("switch", 1, leaf), tier="scale-out", link=f.nic_link,
                   bytes_per_s=cnt * f.nic_bytes_per_s, latency_s=f.nic_latency_s / 2, num_links=cnt)


def _leaf_of(f: Fabric) -> np.ndarray:
    return f.block_of[0] if f.levels > 1 else np.zeros(len(f.nic_present), dtype=np.int64)


def _add_grid_links(g: nx.Graph, f: Fabric, kind: str) -> None:
    rows, cols = f.grid_rows, f.grid_cols
    for node in range(f.num_nodes):
        x, y = node % cols, node // cols
        for dx, dy, bw, size in ((1, 0, f.grid_link_bytes_per_s[0], cols), (0, 1, f.grid_link_bytes_per_s[1], rows)):
            if size == 1:
                continue
            nx_, ny_ = x + dx, y + dy
            if (nx_ >= cols or ny_ >= rows) and not f.torus:
                continue
            nb = (ny_ % rows) * cols + (nx_ % cols)
            g.add_edge((kind, node), (kind, nb), tier="scale-out", link=f.nic_link, bytes_per_s=bw,
                       latency_s=f.nic_latency_s)


def _add_switch_levels(g: nx.Graph, f: Fabric) -> None:
    leaf_of = _leaf_of(f)
    num_leaves = int(leaf_of[f.nic_present].max()) + 1
    for j in range(num_leaves):
        g.add_node(("switch", 1, j), kind="switch", level=1,
                   count=int(f.block_switches[0][j]) if f.levels > 1 else f.top_switches)
    for k in range(1, f.levels):
        parent_level = k + 1
        parents = f.block_parent[k - 1]
        if parent_level == f.levels:
            g.add_node(("switch", parent_level, 0), kind="switch", level=parent_level, count=f.top_switches)
        else:
            for j, cnt in enumerate(f.block_switches[k]):
                g.add_node(("switch", parent_level, j), kind="switch", level=parent_level, count=int(cnt))
        for j in range(len(parents)):
            p = 0 if parent_level == f.levels else int(parents[j])
            g.add_edge(("switch", k, j), ("switch", parent_level, p), tier="scale-out", link=f.nic_link,
                       bytes_per_s=float(f.block_up_bytes_per_s[k - 1][j]), latency_s=f.switch_latency_s,
                       num_links=int(f.block_up_ports[k - 1][j]))


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True, kw_only=True, slots=True)
class TopologyMetrics:
    """Closed-form properties of a fabric (scale-out unless named otherwise).

    ``bisection_bytes_per_s``: per direction, NVLink excluded; half the capacity of the
    narrowest level (NIC links, or the uplinks of a level with at least two blocks), exact for
    balanced trees, an upper estimate for ragged ones; for a grid the links a cut across the
    longer dimension severs.  ``diameter_hops``: switches traversed on the worst GPU-to-GPU
    route (1 when everything shares one NVLink domain); for mesh/torus the node-grid link hops.
    Switch and cable counts are physical, derived from the radix (``switches_by_level`` keys:
    ``leaf``, ``spine``, ``core``; ``cables_by_tier`` keys: ``nic-leaf``, ``leaf-spine``,
    ``spine-core`` or ``node-node`` for a grid).
    """

    topology: str
    num_gpus: int
    num_nodes: int
    num_nics: int
    num_scale_up_domains: int
    num_levels: int
    bisection_bytes_per_s: float
    diameter_hops: int
    num_switches: int
    switches_by_level: dict[str, int]
    switches_by_radix: dict[int, int]
    num_cables: int
    cables_by_tier: dict[str, int]
    exceeds_radix: bool


def topology_metrics(graph_or_cluster: nx.Graph | Cluster) -> TopologyMetrics:
    """Metrics of a cluster (or of a graph from :func:`build_topology`), from its layout."""
    if isinstance(graph_or_cluster, nx.Graph):
        f = graph_or_cluster.graph["fabric"]
    else:
        f = layout_fabric(graph_or_cluster)
    nic_bw = f.nic_bytes_per_s
    single_domain = f.num_gpus <= f.nvlink_domain
    if f.switched:
        totals = [f.num_nics * nic_bw]
        for k in range(1, f.levels):
            if len(f.block_up_bytes_per_s[k - 1]) >= 2:
                totals.append(float(f.block_up_bytes_per_s[k - 1].sum()))
        bisection = 0.5 * min(totals)
        reach = 1 + sum(len(f.block_up_bytes_per_s[k - 1]) >= 2 for k in range(1, f.levels))
        diameter = 2 * reach - 1
        by_level: dict[str, int] = {}
        for k in range(1, f.levels):
            by_level[level_name(k)] = int(f.block_switches[k - 1].sum())
        by_level[level_name(f.levels)] = f.top_switches
        by_radix: dict[int, int] = {}
        for k in range(1, f.levels + 1):
            r = f.top_radix if k == f.levels else f.radix
            by_radix[r] = by_radix.get(r, 0) + by_level[level_name(k)]
        cables = {"nic-leaf": f.num_nics}
        names = ("leaf-spine", "spine-core")
        for k in range(1, f.levels):
            name = names[k - 1] if k <= len(names) else f"{level_name(k)}-{level_name(k + 1)}"
            cables[name] = int(f.block_up_ports[k - 1].sum())
    else:
        rows, cols = f.grid_rows, f.grid_cols
        dims = (rows > 1) + (cols > 1)
        if cols > 1:
            per = f.grid_link_bytes_per_s[0] if (cols == 2 or not f.torus) else 2 * f.grid_link_bytes_per_s[0]
            bisection = rows * per  # a cut across the longer dimension severs one (mesh) or two links per row
        else:
            bisection = 0.0
        diameter = (rows // 2 + cols // 2) if f.torus else (rows - 1) + (cols - 1)
        if f.torus:
            links = f.num_nodes * dims
        else:
            links = rows * (cols - 1) + cols * (rows - 1)
        per_link = max(1, f.nics_per_node // (2 * dims)) if dims else 0
        by_level, by_radix = {}, {}
        cables = {"node-node": links * per_link}
    if f.num_gpus <= 1:
        diameter = 0
    elif single_domain and f.has_scale_up:
        diameter = 1
    return TopologyMetrics(
        topology=f.topology, num_gpus=f.num_gpus, num_nodes=f.num_nodes, num_nics=f.num_nics,
        num_scale_up_domains=int(f.gpu_domain[-1]) + 1 if f.has_scale_up else 0,
        num_levels=f.levels, bisection_bytes_per_s=float(bisection), diameter_hops=int(diameter),
        num_switches=sum(by_level.values()), switches_by_level=by_level, switches_by_radix=by_radix,
        num_cables=sum(cables.values()), cables_by_tier=cables, exceeds_radix=f.exceeds_radix)
