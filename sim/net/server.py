"""The inside of a node of PCIe cards: design -> ``Server`` -> networkx graph -> link and path tables.

A PCIe card has no NVSwitch: its node's GPUs talk through the server's PCIe tree.  Each GPU hangs
off a PCIe switch or a CPU root port; switches have an uplink to their socket's root complex;
two sockets are joined by the socket link (UPI / Infinity Fabric xGMI); every socket has its
host memory; NICs sit on a switch or a root port; NVLink / Infinity Fabric bridges join pairs
(A100 PCIe, H100 PCIe / NVL) or hives of four (MI210) directly.

``resolve_server`` builds the ``sim.data.hostspecs.Server`` of a cluster from a named design
(``catalogs/servers.yaml``) or from a description (sockets, switches, CPU), with the defaults
of ``catalogs/fabric.yaml`` ``pcie``.  ``server_graph`` draws one node as an ``nx.Graph`` with
the vocabulary of ``sim.net.topology`` (every edge: ``tier``, ``link``, ``bytes_per_s`` per
direction, ``latency_s``); ``server_tables`` lays its directed links out as ids and, for every
(GPU, GPU), (GPU, NIC) and (NIC, GPU) pair of the node, the link ids its traffic crosses.
``sim.net.links.Links`` copies those tables per node and routes flows on them with the same
bincount/equal-share machinery as the scale-out fabric, so a collective inside the node finds
its real bottleneck: a GPU's own slot, a switch uplink, the socket link or host memory.

Routing (the PCIe links form a tree, so every path is the tree path):

* bridged GPUs of one group: the bridge link;
* ``p2p: pcie``: GPU -> switch -> [uplink -> root complex -> socket link -> root complex ->
  uplink] -> switch -> GPU (peer DMA; under one switch it never touches the CPU);
* ``p2p: none`` (GeForce with the stock driver): every GPU-GPU transfer is staged through host
  memory, NCCL's SHM path: the sender writes into a buffer in its socket's DRAM and the
  receiver reads it, so the bytes cross the sender's slot and root port up, DRAM twice (one
  write, one read: the DRAM link is one shared id, loaded twice), the socket link when the
  receiver sits on the other socket, and the receiver's root port and slot down.  GPU-NIC
  traffic (no GPUDirect RDMA without P2P) is staged in the GPU's socket's memory likewise.

Capacities: PCIe links (GPU slots, switch uplinks, NIC slots) run at the nominal rate of their
generation and width times ``pcie.collective_efficiency``; the socket link at the CPU record's
derived rate; host memory at its STREAM triad (or ``dram_stream_fraction`` of theoretical).
Latency: a P2P transfer costs the ``pcie<gen>`` record's latency (split over the two GPU
slots) plus each switch traversal; host staging adds ``pcie.host_staged_latency_us``; a bridge
its scale-up link's latency.  Known approximations: the root complex is non-blocking; a NIC
adapter's ports do not share its slot; where the staging buffer lives is an assumption
(the sender's socket); NCCL's ring order is the rank order (``sim.net.network``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import networkx as nx
import numpy as np

from sim.data.catalog import (catalog_document, default_server_design, file_version, get_cpu, get_host_part, get_link,
                         get_server_design)
from sim.base.errors import InputError
from sim.data.hostspecs import P2P_MODES, HostCpu, PcieSwitchPart, Server, ServerDesign
from sim.base.records import Record
from sim.data.hardware import Gpu

HOST, SCALE_UP = 1, 0  # tier indices (sim.net.fabric.TIERS)


@dataclass(frozen=True, kw_only=True, slots=True)
class PcieDefaults:
    """``catalogs/fabric.yaml`` ``pcie``: efficiencies and the parts of described designs."""

    collective_efficiency: float
    dram_stream_fraction: float
    host_staged_latency_s: float
    switch_latency_s: float
    switch_uplink_lanes: int
    default_cpu: dict[int, str]
    default_switch: dict[int, str]


def pcie_defaults() -> PcieDefaults:
    return _pcie_defaults(file_version("fabric.yaml"))


@functools.cache
def _pcie_defaults(_version: tuple[str, int, int]) -> PcieDefaults:
    d = Record(catalog_document("fabric.yaml"), where="fabric", file="fabric.yaml").mapping("pcie")

    def table(key: str) -> dict[int, str]:
        raw = d.rec.get(key)
        if not isinstance(raw, dict) or not all(isinstance(k, int) and isinstance(v, str) for k, v in raw.items()):
            raise d.fail(key, "must map integers to catalog ids")
        return dict(raw)

    eff = d.fraction("collective_efficiency")
    if not eff:
        raise d.fail("collective_efficiency", "must be in (0, 1]")
    return PcieDefaults(collective_efficiency=eff, dram_stream_fraction=d.fraction("dram_stream_fraction"),
                        host_staged_latency_s=d.req("host_staged_latency_us") * 1e-6,
                        switch_latency_s=d.req("switch_latency_ns") * 1e-9,
                        switch_uplink_lanes=d.integer("switch_uplink_lanes"),
                        default_cpu=table("default_cpu"), default_switch=table("default_switch"))


def _x(generation: int, lanes: int) -> float:
    """Nominal per-direction bytes/s of a PCIe link (the ``pcie<gen>`` x16 record scaled)."""
    return get_link(f"pcie{generation}").bytes_per_s_per_direction * lanes / 16


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


# --------------------------------------------------------------------------- resolution


def resolve_server(gpu: Gpu, gpus_per_node: int, *, nics_per_node: int | None = None, server: str | None = None,
                   sockets: int | None = None, pcie_switches: int | None = None, cpu: str | None = None,
                   p2p: str | None = None, nvlink_bridge: int | None = None) -> tuple[Server, str | None]:
    """The ``Server`` of ``gpus_per_node`` ``gpu`` cards and the design's NIC id (None when the
    design names none).  ``server`` names a design; ``sockets`` / ``pcie_switches`` / ``cpu``
    describe one's own (GPUs split evenly over sockets, or over switches split evenly over the
    sockets); with neither, the design ``servers.yaml`` names for ``gpus_per_node``
    (``default_for``), else a described one (1 socket up to 4 GPUs, else 2; no switch).
    ``p2p`` overrides the card's (``pcie`` with a P2P-enabled driver, ``none``);
    ``nvlink_bridge`` the GPUs per bridged group (0: no bridges)."""
    if gpu.form_factor != "pcie":
        given = {"server": server, "sockets": sockets, "pcie-switches": pcie_switches, "cpu": cpu, "p2p": p2p,
                 "nvlink-bridge": nvlink_bridge}
        flag, value = next(((k, v) for k, v in given.items() if v is not None), ("gpu", gpu.id))
        raise InputError(flag, value, f"PCIe server flags describe PCIe cards; {gpu.id} is an SXM/OAM module on an "
                                      "NVLink baseboard (use --gpus-per-node/--nvlink-domain)")
    if server is not None and (sockets is not None or pcie_switches is not None):
        raise InputError("server", server, "name a design or describe one with --sockets/--pcie-switches, not both")
    d = pcie_defaults()
    design = get_server_design(server) if server is not None else None
    if design is None and sockets is None and pcie_switches is None:
        design = default_server_design(gpus_per_node)
    if design is not None and gpus_per_node > design.num_gpus:
        raise InputError("gpus-per-node", gpus_per_node, f"server {design.id} has {design.num_gpus} GPU slots")
    if p2p is not None and p2p not in P2P_MODES:
        raise InputError("p2p", p2p, f"must be one of {', '.join(P2P_MODES)}")
    if design is not None:
        layout = _design_layout(design, gpu, gpus_per_node, cpu, d)
    else:
        layout = _described_layout(gpu, gpus_per_node, sockets, pcie_switches, cpu, d)
    host, n_sockets, gpu_socket, gpu_switch, switches, gpu_gen, gpu_lanes, sites = layout
    nports = nics_per_node if nics_per_node is not None else (
        design.nic_ports if design is not None and design.nic_ports else gpu.nics_per_node)
    if nports < 1:
        raise InputError("nics-per-node", nports, "must be >= 1")
    held = design.nic_ports or design.nic_count if design is not None else None
    if held and nports > held:
        raise InputError("nics-per-node", nports, f"server {design.id} holds {held} scale-out NIC ports "  # type: ignore[union-attr]
                                                  "(servers.yaml nics); name another --server or describe one")
    nic_socket = tuple(sites[k * len(sites) // nports][0] for k in range(nports))
    nic_switch = tuple(sites[k * len(sites) // nports][1] for k in range(nports))
    nic_gen = max([host.pcie_generation] + [part.generation for _, part, _ in switches])
    bridges, bridge_bw, bridge_lat = _bridges(gpu, design, gpus_per_node, nvlink_bridge)
    name = design.name if design is not None else (
        f"{n_sockets}-socket {host.id}, {gpus_per_node} GPUs "
        + (f"behind {len(switches)} PCIe switch(es)" if switches else "on CPU root ports"))
    out = Server(
        design=design.id if design is not None else "custom", name=name, sockets=n_sockets, cpu=host,
        gpu_socket=gpu_socket, gpu_switch=gpu_switch, switch_socket=tuple(s for s, _, _ in switches),
        switch_uplink_bytes_per_s=tuple(_x(part.generation, lanes) for _, part, lanes in switches),
        switch_latency_s=tuple(part.latency_s or d.switch_latency_s for _, part, _ in switches),
        switch_model=tuple(part.id for _, part, _ in switches),
        gpu_link_bytes_per_s=_x(gpu_gen, gpu_lanes), gpu_link_label=f"pcie{gpu_gen} x{gpu_lanes}",
        nic_socket=nic_socket, nic_switch=nic_switch, nic_link_bytes_per_s=_x(nic_gen, 16),
        socket_link_bytes_per_s=(host.socket_link_bytes_per_s_per_direction or 0.0) if n_sockets > 1 else 0.0,
        dram_bytes_per_s=host.sustained_dram_bytes_per_s(d.dram_stream_fraction),
        host_dram_bytes=design.host_dram_bytes if design is not None else None,
        p2p=p2p or gpu.p2p, bridges=bridges, bridge_bytes_per_s=bridge_bw, bridge_latency_s=bridge_lat,
        pcie_latency_s=get_link(f"pcie{gpu_gen}").latency_s, host_staged_latency_s=d.host_staged_latency_s,
        pcie_efficiency=d.collective_efficiency,
        source=design.source if design is not None else "described with --sockets/--pcie-switches (docs/pcie.md)",
        notes=design.notes if design is not None else "")
    return out, (design.nic_link if design is not None else None)


def _host(cpu: str | None, sockets: int, d: PcieDefaults) -> HostCpu:
    if cpu is None:
        if sockets not in d.default_cpu:
            raise InputError("sockets", sockets, f"must be one of {', '.join(map(str, sorted(d.default_cpu)))}")
        cpu = d.default_cpu[sockets]
    host = get_cpu(cpu)
    if sockets > host.sockets_max:
        raise InputError("cpu", host.id, f"supports {host.sockets_max} socket(s), the server has {sockets}")
    return host


def _switch_part(model: str | None, generation: int, d: PcieDefaults) -> PcieSwitchPart:
    if model is None:
        if generation not in d.default_switch:
            raise InputError("pcie-switches", generation, f"no default PCIe switch for generation {generation}")
        model = d.default_switch[generation]
    return get_host_part(model, "pcie-switch")


def _design_layout(design: ServerDesign, gpu: Gpu, n: int, cpu: str | None, d: PcieDefaults):
    host = _host(cpu or design.cpu, design.sockets, d)
    switches, index = [], {}
    for j, sw in enumerate(design.switches):
        if not any(g < n for g in sw.gpus) and not sw.nics:
            continue
        part = _switch_part(sw.model, design.gpu_link_generation, d)
        index[j] = len(switches)
        switches.append((sw.socket, part, sw.uplink_lanes))
    gpu_switch = []
    for g in range(n):
        j = next((j for j, sw in enumerate(design.switches) if g in sw.gpus), None)
        gpu_switch.append(-1 if j is None else index[j])
    gen = min(gpu.pcie_generation, design.gpu_link_generation, host.pcie_generation if -1 in gpu_switch else 99,
              *[switches[k][1].generation for k in set(gpu_switch) if k >= 0])
    lanes = min(gpu.pcie_lanes, design.gpu_link_lanes)
    sites = [(sw.socket, index[j]) for j, sw in enumerate(design.switches) for _ in sw.nics if j in index]
    sites += [(socket, -1) for socket, nics in design.nics_on_root_ports for _ in nics]
    return (host, design.sockets, tuple(design.slot_socket(g) for g in range(n)), tuple(gpu_switch), switches,
            gen, lanes, sites or [(0, -1)])


def _described_layout(gpu: Gpu, n: int, sockets: int | None, pcie_switches: int | None, cpu: str | None,
                      d: PcieDefaults):
    s = sockets if sockets is not None else (1 if n <= 4 else 2)
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise InputError("sockets", s, "must be an integer >= 1")
    if s > n:
        raise InputError("sockets", s, f"more sockets than GPUs ({n})")
    k = pcie_switches if pcie_switches is not None else 0
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise InputError("pcie-switches", k, f"must be an integer in [0, {n}] (GPUs per node)")
    host = _host(cpu, s, d)
    if k:
        part = _switch_part(None, min(host.pcie_generation, max(d.default_switch)), d)
        switches = [(j * s // k if k >= s else j, part, d.switch_uplink_lanes) for j in range(k)]
        gpu_switch = tuple(g * k // n for g in range(n))
        gpu_socket = tuple(switches[j][0] for j in gpu_switch)
        gen = min(gpu.pcie_generation, part.generation)
        lanes = min(gpu.pcie_lanes, 16)
        sites = [(switches[j][0], j) for j in range(k)]
    else:
        switches, gpu_switch = [], (-1,) * n
        gpu_socket = tuple(g * s // n for g in range(n))
        per_socket = max(gpu_socket.count(x) for x in range(s))
        gen = min(gpu.pcie_generation, host.pcie_generation)
        lanes = min(gpu.pcie_lanes, 16, _pow2_floor(host.pcie_lanes // per_socket))
        sites = [(x, -1) for x in range(s)]
    return host, s, gpu_socket, gpu_switch, switches, gen, lanes, sites


def _bridges(gpu: Gpu, design: ServerDesign | None, n: int, size: int | None
             ) -> tuple[tuple[tuple[int, ...], ...], float, float]:
    k = gpu.nvlink_bridge_gpus if size is None else size
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or k == 1:
        raise InputError("nvlink-bridge", k, "must be 0 (no bridges) or the GPUs per bridged group (>= 2)")
    if k == 0:
        return (), 0.0, 0.0
    if not gpu.nvlink_bridge_gpus:
        raise InputError("nvlink-bridge", k, f"{gpu.id} has no NVLink bridge")
    if k > gpu.nvlink_bridge_gpus:
        raise InputError("nvlink-bridge", k, f"{gpu.id} bridges at most {gpu.nvlink_bridge_gpus} GPUs")
    if design is not None and design.nvlink_pairs and all(len(p) == k for p in design.nvlink_pairs):
        groups = [tuple(g for g in p if g < n) for p in design.nvlink_pairs]
    else:
        groups = [tuple(range(i, min(i + k, n))) for i in range(0, n, k)]
    groups = tuple(g for g in groups if len(g) >= 2)
    lat = get_link(gpu.nvlink_generation).latency_s if gpu.nvlink_generation else 0.0
    return groups, gpu.nvlink_bridge_bytes_per_s_per_direction / (k - 1), lat


# --------------------------------------------------------------------------- graph and tables


def server_graph(server: Server) -> nx.Graph:
    """One node as an ``nx.Graph``: ``("gpu", i)``, ``("pcie-switch", j)``, ``("root", s)``
    (a socket's root complex), ``("dram", s)`` (its host memory), ``("nic", k)``; edges carry
    ``tier``, ``link``, ``bytes_per_s`` (nominal, per direction), ``efficiency`` and
    ``latency_s`` (module docstring)."""
    s = server
    g = nx.Graph(server=s)
    eff = s.pcie_efficiency
    for i in range(s.num_gpus):
        g.add_node(("gpu", i), kind="gpu", socket=s.gpu_socket[i])
    for j, socket in enumerate(s.switch_socket):
        g.add_node(("pcie-switch", j), kind="pcie-switch", socket=socket, model=s.switch_model[j])
    for x in range(s.sockets):
        g.add_node(("root", x), kind="root", socket=x, cpu=s.cpu.id)
        g.add_node(("dram", x), kind="dram", socket=x)
        g.add_edge(("root", x), ("dram", x), tier="host", link="host-memory", bytes_per_s=s.dram_bytes_per_s,
                   efficiency=1.0, latency_s=s.host_staged_latency_s / 2, shared=True)
    for x in range(1, s.sockets):  # sockets in a chain (two-socket boards: one link)
        g.add_edge(("root", x - 1), ("root", x), tier="host", link=s.cpu.socket_link or "socket-link",
                   bytes_per_s=s.socket_link_bytes_per_s, efficiency=1.0, latency_s=0.0)

    def site(switch: int, socket: int) -> tuple[tuple, float]:
        if switch >= 0:
            return ("pcie-switch", switch), s.switch_latency_s[switch] / 2
        return ("root", socket), 0.0

    half = s.pcie_latency_s / 2
    for i in range(s.num_gpus):
        node, lat = site(s.gpu_switch[i], s.gpu_socket[i])
        g.add_edge(("gpu", i), node, tier="host", link=s.gpu_link_label, bytes_per_s=s.gpu_link_bytes_per_s,
                   efficiency=eff, latency_s=half + lat)
    for j, socket in enumerate(s.switch_socket):
        g.add_edge(("pcie-switch", j), ("root", socket), tier="host", link="pcie-switch-uplink",
                   bytes_per_s=s.switch_uplink_bytes_per_s[j], efficiency=eff, latency_s=s.switch_latency_s[j] / 2)
    for k in range(s.num_nics):
        g.add_node(("nic", k), kind="nic", socket=s.nic_socket[k])
        node, lat = site(s.nic_switch[k], s.nic_socket[k])
        g.add_edge(("nic", k), node, tier="host", link="nic-slot", bytes_per_s=s.nic_link_bytes_per_s,
                   efficiency=eff, latency_s=half + lat)
    for group in s.bridges:
        for a in group:
            for b in group:
                if a < b:
                    g.add_edge(("gpu", a), ("gpu", b), tier="scale-up", link="nvlink-bridge",
                               bytes_per_s=s.bridge_bytes_per_s, efficiency=1.0, latency_s=s.bridge_latency_s)
    return g


@dataclass(frozen=True, eq=False)
class ServerTables:
    """One node's directed links and the paths of its traffic (ids local to the node).

    ``cap`` (bytes/s after ``pcie.collective_efficiency``; ``sim.net.links`` multiplies the tier's
    collective efficiency), ``lat``, ``tier`` (0 scale-up, 1 host) and ``label`` per link;
    ``gg[i, j]``, ``gn[i, k]`` (GPU i -> NIC k) and ``ng[i, k]`` (NIC k -> GPU i): link ids,
    -1 padded (a host-memory link appears twice on a staged path: one write, one read);
    ``affinity[i]``: the NIC ports GPU i stripes its cross-node traffic over (those on its
    switch, else its socket, else all); ``gpu_links[i]``: its slot's (up, down) ids."""

    server: Server
    cap: np.ndarray
    lat: np.ndarray
    tier: np.ndarray
    label: tuple[str, ...]
    gg: np.ndarray
    gn: np.ndarray
    ng: np.ndarray
    affinity: tuple[tuple[int, ...], ...]
    gpu_links: np.ndarray

    @property
    def num_links(self) -> int:
        return len(self.cap)


def _name(node: tuple) -> str:
    return f"{node[0]}{node[1]}"


@functools.cache
def server_tables(server: Server) -> ServerTables:
    """The link and path tables of ``server`` (cached; see ``ServerTables``)."""
    g = server_graph(server)
    ids: dict[tuple, int] = {}
    cap, lat, tier, label = [], [], [], []
    for u, v, a in g.edges(data=True):
        for x, y in ((u, v), (v, u)):
            if a.get("shared") and (y, x) in ids:
                ids[(x, y)] = ids[(y, x)]
                continue
            ids[(x, y)] = len(cap)
            cap.append(a["bytes_per_s"] * a["efficiency"])
            lat.append(a["latency_s"])
            tier.append(SCALE_UP if a["tier"] == "scale-up" else HOST)
            label.append(f"{_name(x)} <-> {_name(y)} ({a['link']})" if a.get("shared")
                         else f"{_name(x)} -> {_name(y)} ({a['link']})")
    tree = g.edge_subgraph((u, v) for u, v, a in g.edges(data=True)
                           if a["tier"] == "host" and "dram" not in (u[0], v[0])).copy()
    for x in range(server.sockets):
        tree.add_node(("root", x))

    def walk(a: tuple, b: tuple) -> list[int]:
        nodes = nx.shortest_path(tree, a, b)
        return [ids[(x, y)] for x, y in zip(nodes, nodes[1:])]

    def staged(a: tuple, b: tuple, socket: int) -> list[int]:
        root, mem = ("root", socket), ("dram", socket)
        return walk(a, root) + [ids[(root, mem)], ids[(mem, root)]] + walk(root, b)

    n, k = server.num_gpus, server.num_nics
    p2p = server.p2p == "pcie"
    gg_paths = [[[] for _ in range(n)] for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            a, b = ("gpu", i), ("gpu", j)
            if g.has_edge(a, b):
                gg_paths[i][j] = [ids[(a, b)]]
            else:
                gg_paths[i][j] = walk(a, b) if p2p else staged(a, b, server.gpu_socket[i])
    gn_paths = [[walk(("gpu", i), ("nic", q)) if p2p else staged(("gpu", i), ("nic", q), server.gpu_socket[i])
                 for q in range(k)] for i in range(n)]
    ng_paths = [[walk(("nic", q), ("gpu", i)) if p2p else staged(("nic", q), ("gpu", i), server.gpu_socket[i])
                 for q in range(k)] for i in range(n)]

    def pad(rows: list[list[list[int]]], shape: tuple[int, int]) -> np.ndarray:
        width = max([len(p) for r in rows for p in r] + [1])
        out = np.full(shape + (width,), -1, dtype=np.int64)
        for i, r in enumerate(rows):
            for j, p in enumerate(r):
                out[i, j, :len(p)] = p
        return out

    affinity = []
    for i in range(n):
        sw, sock = server.gpu_switch[i], server.gpu_socket[i]
        near = [q for q in range(k) if sw >= 0 and server.nic_switch[q] == sw]
        near = near or [q for q in range(k) if server.nic_socket[q] == sock]
        affinity.append(tuple(near or range(k)))
    slots = np.array([[ids[(("gpu", i), nb)], ids[(nb, ("gpu", i))]] for i in range(n)
                      for nb in [next(x for x in tree[("gpu", i)])]], dtype=np.int64)
    return ServerTables(server=server, cap=np.array(cap), lat=np.array(lat), tier=np.array(tier, dtype=np.int8),
                        label=tuple(label), gg=pad(gg_paths, (n, n)), gn=pad(gn_paths, (n, k)),
                        ng=pad(ng_paths, (n, k)), affinity=tuple(affinity), gpu_links=slots)
