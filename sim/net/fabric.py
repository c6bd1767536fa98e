"""Cluster fabrics as arithmetic: which GPU sits in which node and NVLink domain, which NICs
serve it, which leaf/spine block each NIC hangs under, and every capacity.

:func:`layout_fabric` turns a ``Cluster`` into a :class:`Fabric`; ``sim.net.network`` prices
collectives from its arrays without a graph, ``sim.net.topology`` draws the same fabric as a
networkx graph and counts its parts, ``sim.net.routing`` routes flows on that graph for checks.
The modelling choices (aggregated switch layers, sizing from the radix, mesh/torus grids,
host edges at PCIe x16, latencies) are listed in ``sim.net.topology``'s docstring; numbers the
records leave out come from ``catalogs/fabric.yaml``.  For PCIe cards (``Cluster.server``) the
node is the scale-up domain, its inside comes from ``sim.net.server`` and each GPU stripes its
cross-node traffic over the NIC ports nearest it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
import numpy as np

from sim.data.catalog import catalog_document, file_version, get_link
from sim.base.errors import InputError
from sim.base.records import Record
from sim.net.server import ServerTables, server_tables
from sim.data.hardware import Cluster

@dataclass(frozen=True, kw_only=True, slots=True)
class FabricDefaults:
    """What the fabric model assumes when a link record leaves it out (``catalogs/fabric.yaml``)."""

    switch_radix: int  # ports per switch when the NIC record has no switch_radix
    switch_hop_latency_s: float  # one switch traversal beyond the first hop
    scale_up_latency_s: float  # GPU-to-GPU through an NVSwitch when no scale-up link is named
    max_nics_per_gpu: int = 4  # scale-out adapters a server gives one GPU, at most


def fabric_defaults() -> FabricDefaults:
    return _fabric_defaults(file_version("fabric.yaml"))


@functools.cache
def _fabric_defaults(_version: tuple[str, int, int]) -> FabricDefaults:
    d = Record(catalog_document("fabric.yaml"), where="fabric", file="fabric.yaml").mapping("defaults")
    return FabricDefaults(switch_radix=d.integer("switch_radix", minimum=2),
                          switch_hop_latency_s=d.req("switch_hop_latency_us") * 1e-6,
                          scale_up_latency_s=d.req("scale_up_latency_us") * 1e-6,
                          max_nics_per_gpu=d.integer("max_nics_per_gpu"))


def check_nics(c: Cluster) -> list[str]:
    """Scale-out NICs per node that a server can hold and a GPU can drive: an ``InputError`` on
    ``nics_per_node`` beyond ``max_nics_per_gpu`` per GPU (``catalogs/fabric.yaml``), or when
    the NICs each GPU stripes over carry more than its own PCIe x16 link (GPUDirect RDMA moves
    a GPU's traffic through that link, ``catalogs/links.yaml`` pcie records); a warning (the
    returned list) for more NICs than GPUs within both bounds (AWS p5: 4 x 100G EFA per GPU).
    A single node has no scale-out traffic and is not checked."""
    gpn, nics = c.gpus_per_node, c.nics_per_node
    if c.num_nodes <= 1 or nics <= gpn:
        return []
    d = fabric_defaults()
    if nics > gpn * d.max_nics_per_gpu:
        raise InputError("nics_per_node", nics, f"{nics / gpn:g} scale-out NICs per GPU for {gpn} GPUs per node; "
                         f"servers hold at most {d.max_nics_per_gpu} per GPU (fabric.yaml max_nics_per_gpu)")
    per_gpu = c.nic.bytes_per_s_per_direction * nics / gpn
    host = pcie_x16_bytes_per_s(c.gpu.pcie_generation)
    if per_gpu > host * (1 + 1e-9):
        raise InputError("nics_per_node", nics, f"{nics} x {c.nic.id} for {gpn} GPUs is {per_gpu / 1e9:.1f} GB/s per "
                         f"GPU, more than its PCIe gen{c.gpu.pcie_generation} x16 link carries "
                         f"({host / 1e9:.1f} GB/s, links.yaml pcie{c.gpu.pcie_generation})")
    return [f"{nics} scale-out NICs for {gpn} GPUs per node: each GPU's traffic is striped over {nics / gpn:g} "
            f"NICs ({per_gpu / 1e9:.1f} GB/s per GPU, within its PCIe x16 link), as on AWS p5"]


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
    # PCIe cards: the links and paths inside each node (sim.net.server); the node is the domain
    server: ServerTables | None = None

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


def _nic_pools(c: Cluster, srv: ServerTables | None) -> tuple[tuple[tuple[int, ...], ...], np.ndarray, np.ndarray]:
    """(local NICs of each local GPU, each GPU's pool, each pool's NICs striped to one width).

    A pool is the GPUs that share one set of NICs: on a PCIe server the GPUs of a node whose
    nearest NIC ports (``sim.net.server`` affinity) are the same; otherwise the GPUs of one node
    inside one NVLink domain."""
    G, gpn, nics = c.num_gpus, c.gpus_per_node, c.nics_per_node
    pools: list[list[int]] = []
    if srv is not None:
        attach = srv.affinity
        gpu_pool = np.empty(G, dtype=np.int64)
        for node in range(c.num_nodes):
            first: dict[tuple[int, ...], int] = {}
            for g in range(node * gpn, min((node + 1) * gpn, G)):
                aff = attach[g % gpn]
                if aff not in first:
                    first[aff] = len(pools)
                    pools.append([node * nics + k for k in aff])
                gpu_pool[g] = first[aff]
    else:
        attach = _attachments(gpn, nics)
        span = min(gpn, c.scale_up_block)
        gpu_pool = np.arange(G) // span
        for p in range((G + span - 1) // span):
            first_gpu = p * span
            node = first_gpu // gpn
            locs = sorted({k for g in range(first_gpu, min(first_gpu + span, G)) for k in attach[g % gpn]})
            pools.append([node * nics + k for k in locs])
    stripes = max(len(p) for p in pools)
    pool_nics = np.array([[p[j % len(p)] for j in range(stripes)] for p in pools], dtype=np.int64)
    return attach, gpu_pool, pool_nics


def _nic_owners(c: Cluster, attach: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    """(NIC present: some GPU of the job attaches to it, the lowest GPU that does)."""
    gpn, nics = c.gpus_per_node, c.nics_per_node
    total_nics = c.num_nodes * nics
    nic_present = np.zeros(total_nics, dtype=bool)
    nic_owner = np.full(total_nics, -1, dtype=np.int64)
    for g in range(c.num_gpus - 1, -1, -1):
        for k in attach[g % gpn]:
            n = (g // gpn) * nics + k
            nic_present[n] = True
            nic_owner[n] = g
    return nic_present, nic_owner


def _scale_up(c: Cluster, defaults: FabricDefaults) -> tuple[str, float]:
    """(scale-up link id, its latency): the named scale-up link's, else the GPU's NVLink
    generation through an NVSwitch at the fabric default latency."""
    if c.scale_up is not None:
        return c.scale_up.id, c.scale_up.latency_s
    return (f"nvlink-{c.gpu.nvlink_generation}" if c.gpu.nvlink_generation else "scale-up",
            defaults.scale_up_latency_s)


def _grid_fabric(c: Cluster, kw: dict[str, object], radix: int) -> Fabric:
    """A mesh or torus of nodes: each node's NIC bandwidth split over its grid links (a
    2-wide torus dimension has two links between the same pair)."""
    rows, cols = grid_shape(c.num_nodes)
    dims = (rows > 1) + (cols > 1)
    node_bw = c.nics_per_node * c.nic.bytes_per_s_per_direction
    link_bw = node_bw / (2 * dims) if dims else 0.0
    torus = c.topology == "torus"
    x_bw = link_bw * (2 if torus and cols == 2 else 1)
    y_bw = link_bw * (2 if torus and rows == 2 else 1)
    empty: tuple[np.ndarray, ...] = ()
    return Fabric(**kw, nic_pos=np.arange(c.num_nodes * c.nics_per_node), levels=0, level_down_ports=(),  # type: ignore[arg-type]
                  block_of=empty, block_parent=empty, block_up_bytes_per_s=empty, block_up_ports=empty,
                  block_switches=empty, top_switches=0, top_radix=radix, exceeds_radix=False,
                  grid_rows=rows, grid_cols=cols, grid_link_bytes_per_s=(x_bw, y_bw))


def _switch_levels(c: Cluster, radix: int, tapered_down: int, num_pos: int) -> tuple[int, tuple[int, ...]]:
    """(switch levels, down ports of a non-top switch per level below the top): the fewest
    levels whose capacity holds ``num_pos`` NIC positions (at most 8)."""
    half = max(1, radix // 2)

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
    return levels, tuple(down_ports(k) for k in range(1, levels))


@dataclass(frozen=True, kw_only=True, slots=True)
class _Blocks:
    """Switch blocks of the levels below the top (one array per level, one entry per block)."""
    block_of: tuple[np.ndarray, ...]  # NIC -> its block at this level (-1: absent)
    block_parent: tuple[np.ndarray, ...]  # block -> its parent block one level up
    up_bytes_per_s: tuple[np.ndarray, ...]
    up_ports: tuple[np.ndarray, ...]
    switches: tuple[np.ndarray, ...]


def _switch_blocks(c: Cluster, nic_pos: np.ndarray, nic_present: np.ndarray, levels: int,
                   level_down: tuple[int, ...]) -> _Blocks:
    """Group the present NICs into switch blocks level by level: a level-k block is the NIC
    positions under one span of ``level_down[:k]`` ports; its uplink bandwidth and ports are
    what its children bring, divided by the taper (first level, or every level of a tree)."""
    o = float(c.oversubscription)
    nic_bw = c.nic.bytes_per_s_per_direction
    present_ids = np.nonzero(nic_present)[0]
    spans = tuple(math.prod(level_down[:k]) for k in range(1, levels))
    block_of: list[np.ndarray] = []
    block_parent: list[np.ndarray] = []
    up_bw: list[np.ndarray] = []
    up_ports: list[np.ndarray] = []
    switches: list[np.ndarray] = []
    for k in range(1, levels):
        raw = nic_pos // spans[k - 1]
        uniq, inv = np.unique(raw[present_ids], return_inverse=True)
        ids = np.full(len(nic_pos), -1, dtype=np.int64)
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
    return _Blocks(block_of=tuple(block_of), block_parent=tuple(block_parent), up_bytes_per_s=tuple(up_bw),
                   up_ports=tuple(up_ports), switches=tuple(switches))


def _switch_fabric(c: Cluster, kw: dict[str, object], radix: int, nic_present: np.ndarray, num_nics: int) -> Fabric:
    """A switched fabric (star, tree, fat-tree, rail-optimized): NIC positions (rails first
    on a rail-optimized fabric), the levels, the blocks below the top and the top switches."""
    o = float(c.oversubscription)
    nics, total_nics = c.nics_per_node, c.num_nodes * c.nics_per_node
    tapered_down = max(1, int(radix * o / (1 + o))) if o > 1 else max(1, radix // 2)
    if c.topology == "rail-optimized":
        groups = (c.num_nodes + tapered_down - 1) // tapered_down
        nic_pos = (np.arange(total_nics) % nics) * (groups * tapered_down) + np.arange(total_nics) // nics
    else:
        nic_pos = np.arange(total_nics)
    num_pos = int(nic_pos[np.nonzero(nic_present)[0]].max()) + 1
    levels, level_down = _switch_levels(c, radix, tapered_down, num_pos)
    b = _switch_blocks(c, nic_pos, nic_present, levels, level_down)
    if levels == 1:
        top_switches, top_radix = 1, (max(radix, num_nics) if c.topology in ("star", "tree") else radix)
        exceeds = num_nics > radix and c.topology != "star"
    else:
        top_down = float(b.up_ports[-1].sum())
        top_switches = int(math.ceil(top_down / radix - 1e-9))
        top_radix = radix
        exceeds = len(b.up_bytes_per_s[-1]) > radix
    return Fabric(**kw, nic_pos=nic_pos, levels=levels, level_down_ports=level_down,  # type: ignore[arg-type]
                  block_of=b.block_of, block_parent=b.block_parent,
                  block_up_bytes_per_s=b.up_bytes_per_s, block_up_ports=tuple(a.astype(np.int64) for a in b.up_ports),
                  block_switches=b.switches, top_switches=top_switches, top_radix=top_radix,
                  exceeds_radix=bool(exceeds))


def layout_fabric(cluster: Cluster) -> Fabric:
    """Lay out ``cluster``'s fabric (see the module docstring for the sizing rules)."""
    c = cluster
    check_nics(c)
    defaults = fabric_defaults()
    radix = c.nic.switch_radix or defaults.switch_radix
    if radix < 2:
        raise InputError(f"nic[{c.nic.id}].switch_radix", radix, "must be >= 2")
    srv = server_tables(c.server) if c.server is not None else None
    attach, gpu_pool, pool_nics = _nic_pools(c, srv)
    nic_present, nic_owner = _nic_owners(c, attach)
    num_nics = int(nic_present.sum())
    su_link, su_lat = _scale_up(c, defaults)
    kw: dict[str, object] = dict(
        topology=c.topology, num_gpus=c.num_gpus, gpus_per_node=c.gpus_per_node, num_nodes=c.num_nodes,
        nvlink_domain=c.scale_up_block, has_scale_up=c.domain_size > 1, nics_per_node=c.nics_per_node,
        num_nics=num_nics, radix=radix, oversubscription=float(c.oversubscription),
        scale_up_link=su_link, scale_up_bytes_per_s=c.nvlink_bytes_per_s_per_direction, scale_up_latency_s=su_lat,
        host_link=f"pcie-gen{c.gpu.pcie_generation}",
        host_bytes_per_s=pcie_x16_bytes_per_s(c.gpu.pcie_generation),
        nic_link=c.nic.id, nic_bytes_per_s=c.nic.bytes_per_s_per_direction,
        nic_latency_s=c.nic.latency_s, switch_latency_s=defaults.switch_hop_latency_s,
        gpu_domain=np.arange(c.num_gpus) // c.scale_up_block, gpu_pool=gpu_pool, pool_nics=pool_nics,
        nic_present=nic_present, nic_owner=nic_owner, gpu_nics=attach, server=srv)
    if c.topology in ("mesh", "torus"):
        return _grid_fabric(c, kw, radix)
    return _switch_fabric(c, kw, radix, nic_present, num_nics)
