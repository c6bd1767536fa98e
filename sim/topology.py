"""Cluster fabrics: their arithmetic layout, networkx graphs, metrics and reference routing.

One description, three uses:

* :func:`layout_fabric` turns a ``Cluster`` into a :class:`Fabric`: which GPU sits in which
  node and NVLink domain, which NICs serve it, which leaf/spine block each NIC hangs under,
  and every capacity.  ``sim.network`` prices collectives from these arrays without a graph.
* :func:`build_topology` draws the same fabric as an ``nx.Graph`` (for plots, checks and the
  reference router below).
* :func:`topology_metrics` gives the closed-form bisection, diameter and the physical switch
  and cable counts a bill of materials needs.

Graph vocabulary.  Nodes: ``("gpu", i)``; ``("nvswitch", d)``, one per NVLink domain (a GB200
NVL72 domain of 72 GPUs spans 18 nodes of 4); ``("nic", node, k)``; ``("switch", level, j)``
(level 1 = leaf); ``("router", node)`` for the switchless mesh/torus.  Every edge carries
``tier`` (``"scale-up" | "host" | "scale-out"``), ``link`` (catalog id), ``bytes_per_s`` (per
direction) and ``latency_s``; switch-to-switch edges also carry ``num_links``.

Modelling choices (each is an approximation; ``sim.network`` follows the same ones):

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
* **Latency.**  NIC-leaf edges take half the NIC's latency (so one switch hop costs the NIC's
  quoted host-to-host latency), every further switch traversal ``catalogs/fabric.yaml`` ``switch_hop_latency_us``, a
  grid hop the NIC's latency, NVLink edges half the scale-up latency.

Reference routing (:func:`route_stripes`, :func:`graph_group_link`) walks the graph; it is
slow and exists to check ``sim.network`` on small clusters.  Routing policy: inside one NVLink
domain via its NVSwitch; otherwise the flow is striped evenly over the NICs of the sender's
node that its NVLink domain reaches (NCCL channels and PXN), stripe ``j`` leaving on pool NIC
``j`` and arriving on the receiver's pool NIC ``j`` (rail-aligned), with an NVLink hop to or
from the GPU that owns a NIC that is not the sender's or receiver's own.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import networkx as nx
import numpy as np

from sim.catalog import catalog_document, file_version, get_link
from sim.errors import InputError
from sim.records import Record
from sim.specs import Cluster

@dataclass(frozen=True, kw_only=True, slots=True)
class FabricDefaults:
    """What the fabric model assumes when a link record leaves it out (``catalogs/fabric.yaml``)."""

    switch_radix: int  # ports per switch when the NIC record has no switch_radix
    switch_hop_latency_s: float  # one switch traversal beyond the first hop
    scale_up_latency_s: float  # GPU-to-GPU through an NVSwitch when no scale-up link is named


def fabric_defaults() -> FabricDefaults:
    return _fabric_defaults(file_version("fabric.yaml"))


@functools.cache
def _fabric_defaults(_version: tuple[str, int, int]) -> FabricDefaults:
    d = Record(catalog_document("fabric.yaml"), where="fabric", file="fabric.yaml").mapping("defaults")
    return FabricDefaults(switch_radix=d.integer("switch_radix", minimum=2),
                          switch_hop_latency_s=d.req("switch_hop_latency_us") * 1e-6,
                          scale_up_latency_s=d.req("scale_up_latency_us") * 1e-6)


TIERS: tuple[str, ...] = ("scale-up", "host", "scale-out")

_LEVEL_NAMES = ("leaf", "spine", "core")


def pcie_x16_bytes_per_s(generation: int) -> float:
    """Per-direction bandwidth of a PCIe x16 slot of ``generation`` (the ``pcie<N>`` records of
    ``catalogs/links.yaml``)."""
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise InputError("gpu.pcie_generation", generation, "must be an integer")
    return get_link(f"pcie{generation}").bytes_per_s_per_direction


def level_name(level: int) -> str:
    """``leaf``, ``spine``, ``core``, then ``level4``... for switch level ``level`` (1-based)."""
    return _LEVEL_NAMES[level - 1] if level <= len(_LEVEL_NAMES) else f"level{level}"


def grid_shape(num_nodes: int) -> tuple[int, int]:
    """Near-square ``(rows, cols)`` with ``rows * cols == num_nodes`` and ``rows <= cols``."""
    rows = int(math.isqrt(num_nodes))
    while num_nodes % rows:
        rows -= 1
    return rows, num_nodes // rows


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True, eq=False)
class Fabric:
    """Arithmetic description of a cluster's fabric; arrays are indexed by GPU or NIC id.

    NIC ids are ``node * nics_per_node + k``.  A *pool* is the set of GPUs that share one node
    and one NVLink domain; cross-domain traffic of a GPU is striped over its pool's NICs
    (``pool_nics``, one row per pool, ``stripes`` columns, cycled when a pool has fewer).
    Switch levels are 1-based; ``block_of[k-1]`` maps a NIC to its level-``k`` block for
    ``k < levels`` (level-1 blocks are physical leaves, higher ones aggregated layers) and
    ``block_up_bytes_per_s[k-1]`` is each block's uplink capacity.  The top level is one block.
    """

    topology: str
    num_gpus: int
    gpus_per_node: int
    num_nodes: int
    nvlink_domain: int
    has_scale_up: bool
    nics_per_node: int
    num_nics: int
    radix: int
    oversubscription: float
    levels: int
    scale_up_link: str
    scale_up_bytes_per_s: float
    scale_up_latency_s: float
    host_link: str
    host_bytes_per_s: float
    nic_link: str
    nic_bytes_per_s: float
    nic_latency_s: float
    switch_latency_s: float
    # GPU / NIC arrays
    gpu_domain: np.ndarray
    gpu_pool: np.ndarray
    pool_nics: np.ndarray
    nic_present: np.ndarray
    nic_owner: np.ndarray  # NIC -> the GPU that reaches it over its own host edge (lowest id)
    gpu_nics: tuple[tuple[int, ...], ...]  # per local GPU index: local NIC indices attached
    # switched fabrics
    nic_pos: np.ndarray
    level_down_ports: tuple[int, ...]
    block_of: tuple[np.ndarray, ...]
    block_parent: tuple[np.ndarray, ...]
    block_up_bytes_per_s: tuple[np.ndarray, ...]
    block_up_ports: tuple[np.ndarray, ...]
    block_switches: tuple[np.ndarray, ...]
    top_switches: int
    top_radix: int
    exceeds_radix: bool
    # mesh / torus
    grid_rows: int = 1
    grid_cols: int = 1
    grid_link_bytes_per_s: tuple[float, float] = (0.0, 0.0)  # (along cols/x, along rows/y)

    @property
    def switched(self) -> bool:
        return self.topology not in ("mesh", "torus")

    @property
    def torus(self) -> bool:
        return self.topology == "torus"

    @property
    def stripes(self) -> int:
        return int(self.pool_nics.shape[1])

    @property
    def num_pools(self) -> int:
        return int(self.pool_nics.shape[0])

    @property
    def gpu_per_nic_host_edge(self) -> bool:
        """True when host edges are indexed by GPU (each GPU has one NIC), else by NIC."""
        return self.nics_per_node <= self.gpus_per_node


def _attachments(gpn: int, nics: int) -> tuple[tuple[int, ...], ...]:
    """Local NIC indices of each local GPU: GPUs ``k*gpn/nics ...`` share NIC ``k``."""
    if nics <= gpn:
        return tuple((l * nics // gpn,) for l in range(gpn))
    return tuple(tuple(k for k in range(nics) if k * gpn // nics == l) for l in range(gpn))


def layout_fabric(cluster: Cluster) -> Fabric:
    """Lay out ``cluster``'s fabric (see the module docstring for the sizing rules)."""
    c = cluster
    G, gpn, nics = c.num_gpus, c.gpus_per_node, c.nics_per_node
    num_nodes = c.num_nodes
    defaults = fabric_defaults()
    radix = c.nic.switch_radix or defaults.switch_radix
    if radix < 2:
        raise InputError(f"nic[{c.nic.id}].switch_radix", radix, "must be >= 2")
    o = float(c.oversubscription)
    has_su = c.domain_size > 1

    gpus = np.arange(G)
    gpu_domain = gpus // c.nvlink_domain
    attach = _attachments(gpn, nics)
    span = min(gpn, c.nvlink_domain)
    gpu_pool = gpus // span
    num_pools = (G + span - 1) // span
    pools: list[list[int]] = []
    for p in range(num_pools):
        first = p * span
        node = first // gpn
        locs = sorted({k for g in range(first, min(first + span, G)) for k in attach[g % gpn]})
        pools.append([node * nics + k for k in locs])
    stripes = max(len(p) for p in pools)
    pool_nics = np.array([[p[j % len(p)] for j in range(stripes)] for p in pools], dtype=np.int64)

    total_nics = num_nodes * nics
    nic_present = np.zeros(total_nics, dtype=bool)
    nic_owner = np.full(total_nics, -1, dtype=np.int64)
    for g in range(G - 1, -1, -1):
        for k in attach[g % gpn]:
            n = (g // gpn) * nics + k
            nic_present[n] = True
            nic_owner[n] = g
    num_nics = int(nic_present.sum())

    scale_up_bw = c.nvlink_bytes_per_s_per_direction
    if c.scale_up is not None:
        su_link, su_lat = c.scale_up.id, c.scale_up.latency_s
    else:
        su_link, su_lat = f"nvlink-{c.gpu.nvlink_generation}" if c.gpu.nvlink_generation else "scale-up", \
            defaults.scale_up_latency_s

    kw: dict[str, object] = dict(
        topology=c.topology, num_gpus=G, gpus_per_node=gpn, num_nodes=num_nodes,
        nvlink_domain=c.nvlink_domain, has_scale_up=has_su, nics_per_node=nics, num_nics=num_nics,
        radix=radix, oversubscription=o,
        scale_up_link=su_link, scale_up_bytes_per_s=scale_up_bw, scale_up_latency_s=su_lat,
        host_link=f"pcie-gen{c.gpu.pcie_generation}",
        host_bytes_per_s=pcie_x16_bytes_per_s(c.gpu.pcie_generation),
        nic_link=c.nic.id, nic_bytes_per_s=c.nic.bytes_per_s_per_direction,
        nic_latency_s=c.nic.latency_s, switch_latency_s=defaults.switch_hop_latency_s,
        gpu_domain=gpu_domain, gpu_pool=gpu_pool, pool_nics=pool_nics, nic_present=nic_present,
        nic_owner=nic_owner, gpu_nics=attach)

    if c.topology in ("mesh", "torus"):
        rows, cols = grid_shape(num_nodes)
        dims = (rows > 1) + (cols > 1)
        node_bw = nics * c.nic.bytes_per_s_per_direction
        link_bw = node_bw / (2 * dims) if dims else 0.0
        torus = c.topology == "torus"
        x_bw = link_bw * (2 if torus and cols == 2 else 1)
        y_bw = link_bw * (2 if torus and rows == 2 else 1)
        empty: tuple[np.ndarray, ...] = ()
        return Fabric(**kw, nic_pos=np.arange(total_nics), levels=0, level_down_ports=(), block_of=empty,
                      block_parent=empty, block_up_bytes_per_s=empty, block_up_ports=empty,
                      block_switches=empty, top_switches=0, top_radix=radix, exceeds_radix=False,
                      grid_rows=rows, grid_cols=cols, grid_link_bytes_per_s=(x_bw, y_bw))  # type: ignore[arg-type]

    half = max(1, radix // 2)
    tapered_down = max(1, int(radix * o / (1 + o))) if o > 1 else half
    present_ids = np.nonzero(nic_present)[0]
    if c.topology == "rail-optimized":
        groups = (num_nodes + tapered_down - 1) // tapered_down
        nic_pos = (np.arange(total_nics) % nics) * (groups * tapered_down) + np.arange(total_nics) // nics
    else:
        nic_pos = np.arange(total_nics)
    num_pos = int(nic_pos[present_ids].max()) + 1

    def down_ports(level: int) -> int:  # down ports of a non-top switch at ``level``
        return tapered_down if (level == 1 or c.topology == "tree") else half

    if c.topology == "star":
        levels = 1
    elif c.topology == "tree":
        levels = c.tree_levels
    else:
        levels = 2 if c.topology == "rail-optimized" else 1
        while True:
            capacity = radix * math.prod(down_ports(k) for k in range(1, levels))
            if num_pos <= capacity or levels >= 8:
                break
            levels += 1
    level_down = tuple(down_ports(k) for k in range(1, levels))
    spans = tuple(math.prod(level_down[:k]) for k in range(1, levels))

    nic_bw = c.nic.bytes_per_s_per_direction
    block_of: list[np.ndarray] = []
    block_parent: list[np.ndarray] = []
    up_bw: list[np.ndarray] = []
    up_ports: list[np.ndarray] = []
    switches: list[np.ndarray] = []
    for k in range(1, levels):
        raw = nic_pos // spans[k - 1]
        uniq, inv = np.unique(raw[present_ids], return_inverse=True)
        ids = np.full(total_nics, -1, dtype=np.int64)
        ids[present_ids] = inv
        block_of.append(ids)
        taper = o if (k == 1 or c.topology == "tree") else 1.0
        if k == 1:
            attached = np.bincount(inv, minlength=len(uniq)).astype(float)
            down_bw = attached * nic_bw
            down_ports_used = attached
            switches.append(np.ones(len(uniq), dtype=np.int64))
        else:
            child = block_of[-2][present_ids]
            child_to_parent = np.zeros(len(up_bw[-1]), dtype=np.int64)
            child_to_parent[child] = inv
            block_parent[-1] = child_to_parent
            down_bw = np.bincount(child_to_parent, weights=up_bw[-1], minlength=len(uniq))
            down_ports_used = np.bincount(child_to_parent, weights=up_ports[-1], minlength=len(uniq))
            switches.append(np.ceil(down_ports_used / level_down[k - 1]).astype(np.int64))
        up_bw.append(down_bw / taper)
        up_ports.append(np.ceil(down_ports_used / taper - 1e-9))
        block_parent.append(np.zeros(len(uniq), dtype=np.int64))  # parent in level k+1 (fixed next loop)
    if levels == 1:
        top_switches, top_radix = 1, (max(radix, num_nics) if c.topology in ("star", "tree") else radix)
        exceeds = num_nics > radix and c.topology != "star"
    else:
        top_down = float(up_ports[-1].sum())
        top_switches = int(math.ceil(top_down / radix - 1e-9))
        top_radix = radix
        exceeds = len(up_bw[-1]) > radix
    return Fabric(**kw, nic_pos=nic_pos, levels=levels, level_down_ports=level_down,  # type: ignore[arg-type]
                  block_of=tuple(block_of), block_parent=tuple(block_parent),
                  block_up_bytes_per_s=tuple(up_bw), block_up_ports=tuple(a.astype(np.int64) for a in up_ports),
                  block_switches=tuple(switches), top_switches=top_switches, top_radix=top_radix,
                  exceeds_radix=bool(exceeds))


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
    fat-tree is ~2.6k vertices.  Metrics and ``sim.network`` never need the graph; the
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


def _add_gpus_and_nics(g: nx.Graph, f: Fabric) -> None:
    G, gpn, nics = f.num_gpus, f.gpus_per_node, f.nics_per_node
    g.add_nodes_from((("gpu", i), {"kind": "gpu", "node": i // gpn, "domain": int(f.gpu_domain[i])})
                     for i in range(G))
    if f.has_scale_up:
        su = {"tier": "scale-up", "link": f.scale_up_link, "bytes_per_s": f.scale_up_bytes_per_s,
              "latency_s": f.scale_up_latency_s / 2}
        for d in range(int(f.gpu_domain[-1]) + 1):
            g.add_node(("nvswitch", d), kind="nvswitch")
        g.add_edges_from(((("gpu", i), ("nvswitch", int(f.gpu_domain[i])), dict(su)) for i in range(G)))
    host = {"tier": "host", "link": f.host_link, "bytes_per_s": f.host_bytes_per_s, "latency_s": 0.0}
    for n in np.nonzero(f.nic_present)[0]:
        g.add_node(("nic", int(n) // nics, int(n) % nics), kind="nic")
    g.add_edges_from((("gpu", i), ("nic", i // gpn, k), dict(host)) for i in range(G) for k in f.gpu_nics[i % gpn])
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


# --------------------------------------------------------------------------- reference routing


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
    """Reference for ``sim.network``: ``(bytes_per_s, latency_s, tier)`` of ``groups[index]``.

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
