"""A cluster of catalog parts with the defaults every entry point uses (``cluster_from_catalog``):
the GPU's usual server, its NVLink domain and NICs, and for PCIe cards the inside of their server
(``sim.net.server``).  Built on the lookups of ``sim.data.catalog``; the catalog loader itself builds no
cluster."""

from __future__ import annotations

from typing import Any

from sim.data.catalog import get_gpu, get_nic, get_server_design
from sim.base.errors import InputError
from sim.net.server import resolve_server
from sim.data.hardware import TOPOLOGIES, Cluster, Gpu, Link


def cluster_from_catalog(gpu: str | Gpu, num_gpus: int, *, gpus_per_node: int | None = None,
                         nvlink_domain: int | None = None, nic: str | Link | None = None,
                         nics_per_node: int | None = None, topology: str = "fat-tree",
                         oversubscription: float = 1.0, tree_levels: int = 2, placement: str = "block",
                         server: str | None = None, sockets: int | None = None, pcie_switches: int | None = None,
                         cpu: str | None = None, p2p: str | None = None,
                         nvlink_bridge: int | None = None) -> Cluster:
    """A ``Cluster`` of catalog parts, with the defaults every entry point (CLI, app, published
    runs, tests) uses:

    * ``gpus_per_node``, ``nics_per_node``, ``nic``: the GPU's usual server (``gpus.yaml``); with
      ``gpus_per_node`` given, its NICs per GPU (8 A100s with 8 NICs: 4 GPUs get 4);
    * ``nvlink_domain``: ``gpus_per_node`` when that is given, else the larger of the GPU's
      usual domain and its node (a GB200 rack: 72);
    * fewer GPUs than a node: the node (and, unless given, the domain) shrinks to them.

    PCIe cards (``form_factor: pcie``) get the inside of their server (``sim.net.server``): the
    design ``server`` names (``servers.yaml``; its slots set the node size), one described by
    ``sockets`` / ``pcie_switches`` / ``cpu``, or the default design for the node size;
    ``p2p`` and ``nvlink_bridge`` override the card's; the NIC defaults to the design's.  The
    node is then the scale-up domain (``nvlink_domain`` is refused).  Server flags with an
    SXM/OAM part are bad input.
    """
    g = gpu if isinstance(gpu, Gpu) else get_gpu(gpu)
    server_flags = dict(server=server, sockets=sockets, pcie_switches=pcie_switches, cpu=cpu, p2p=p2p,
                        nvlink_bridge=nvlink_bridge)
    if g.form_factor == "pcie" or any(v is not None for v in server_flags.values()):
        return _pcie_cluster(g, num_gpus, gpus_per_node=gpus_per_node, nvlink_domain=nvlink_domain, nic=nic,
                             nics_per_node=nics_per_node, topology=topology, oversubscription=oversubscription,
                             tree_levels=tree_levels, placement=placement, **server_flags)
    gpn = gpus_per_node if gpus_per_node is not None else g.gpus_per_node
    if nvlink_domain is not None:
        domain = nvlink_domain
    elif gpus_per_node is not None:
        domain = gpn
    else:
        domain = max(g.nvlink_domain_size, gpn)
    if isinstance(num_gpus, int) and not isinstance(num_gpus, bool) and 1 <= num_gpus < gpn:
        gpn = num_gpus  # a partial node
        domain = min(domain, gpn) if nvlink_domain is None else domain
    link = nic if isinstance(nic, Link) else get_nic(nic if nic is not None else g.default_nic)
    topo = str(topology).lower()
    if topo not in TOPOLOGIES:
        raise InputError("topology", topology, f"must be one of {', '.join(TOPOLOGIES)}")
    if nics_per_node is None:  # the usual server's NICs per GPU, for the node size asked
        sized = isinstance(gpus_per_node, int) and not isinstance(gpus_per_node, bool) and 1 <= gpus_per_node <= 1024
        nics_per_node = max(1, -(-g.nics_per_node * gpus_per_node // g.gpus_per_node)) if sized else g.nics_per_node
    return Cluster(gpu=g, num_gpus=num_gpus, nic=link, gpus_per_node=gpn, nvlink_domain=domain,
                   nics_per_node=nics_per_node,
                   topology=topo, oversubscription=oversubscription, tree_levels=tree_levels,
                   placement=str(placement).lower())


def _pcie_cluster(g: Gpu, num_gpus: int, *, gpus_per_node: int | None, nvlink_domain: int | None,
                  nic: str | Link | None, nics_per_node: int | None, topology: str, oversubscription: float,
                  tree_levels: int, placement: str, **server_flags: Any) -> Cluster:
    if g.form_factor != "pcie":
        resolve_server(g, 1, **server_flags)  # raises: server flags describe PCIe cards
    if nvlink_domain is not None:
        raise InputError("nvlink-domain", nvlink_domain, f"{g.id} is a PCIe card: its node's fabric is the server's "
                         "PCIe topology (--server, --sockets, --pcie-switches, --nvlink-bridge)")
    design = server_flags.get("server")
    gpn = gpus_per_node if gpus_per_node is not None else (
        get_server_design(design).num_gpus if design is not None else g.gpus_per_node)
    if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 1:
        raise InputError("gpus_per_node", gpn, "must be an integer >= 1")
    if isinstance(num_gpus, int) and not isinstance(num_gpus, bool) and 1 <= num_gpus < gpn:
        gpn = num_gpus  # a partial node: the first slots of the design
    srv, design_nic = resolve_server(g, gpn, nics_per_node=nics_per_node, **server_flags)
    link = nic if isinstance(nic, Link) else get_nic(nic if nic is not None else design_nic or g.default_nic)
    topo = str(topology).lower()
    if topo not in TOPOLOGIES:
        raise InputError("topology", topology, f"must be one of {', '.join(TOPOLOGIES)}")
    return Cluster(gpu=g, num_gpus=num_gpus, nic=link, gpus_per_node=gpn, nvlink_domain=gpn,
                   nics_per_node=srv.num_nics, topology=topo, oversubscription=oversubscription,
                   tree_levels=tree_levels, placement=str(placement).lower(), server=srv)
