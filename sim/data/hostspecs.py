"""Frozen data model of the host side of a GPU server: CPUs, PCIe switches, NVMe drives, measured
PCIe links (``catalogs/hosts.yaml``), server designs (``catalogs/servers.yaml``) and the
resolved ``Server`` a ``sim.data.hardware.Cluster`` of PCIe cards carries.

Every number is SI with its unit in its name (bytes, bytes/s, seconds, FLOP/s, watts);
``sim.data.catalog`` converts the data-sheet units of the YAML once.  Construction validates and
raises ``InputError`` naming the field and the value.  ``sim.net.server`` turns a ``Server`` into
the networkx graph of one node and the link/path tables ``sim.net.links`` routes flows on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from sim.base.checks import choice as _choice, positive_float as _positive_float, positive_int as _positive_int
from sim.base.errors import InputError

P2P_MODES: tuple[str, ...] = ("pcie", "none")
"""``pcie``: GPUs DMA into each other over PCIe (CUDA/HIP peer access); ``none``: the driver
refuses peer access and every GPU-GPU (and GPU-NIC) transfer is staged through host memory."""

HOST_PART_KINDS: tuple[str, ...] = ("cpu", "pcie-switch", "nvme", "pcie-link")


def _positive(name: str, value: object, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InputError(name, value, "must be a number")
    if value < 0 or (value == 0 and not allow_zero):
        raise InputError(name, value, "must be >= 0" if allow_zero else "must be > 0")


def _count(name: str, value: object, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(name, value, f"must be an integer >= {minimum}")


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCpu:
    """One CPU socket: PCIe lanes, memory and the link to the other socket."""

    id: str
    name: str
    cores: int
    sockets_max: int
    pcie_generation: int
    pcie_lanes: int
    dram_bytes_per_s: float  # theoretical, per socket (channels x MT/s x 8 B)
    stream_bytes_per_s: float | None = None  # measured STREAM triad per socket
    fp32_flops_per_s: float = 0.0  # vector FMA peak per socket at base clock
    socket_link: str = ""  # upi | xgmi | "" (single-socket part)
    socket_links: int = 0
    socket_link_bytes_per_s_per_direction: float | None = None  # all links summed, one direction
    tdp_w: float | None = None
    price_usd: float | None = None
    source: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        for n in ("cores", "sockets_max", "pcie_generation", "pcie_lanes"):
            _count(f"cpu[{self.id}].{n}", getattr(self, n))
        _positive(f"cpu[{self.id}].dram_bytes_per_s", self.dram_bytes_per_s)
        if self.sockets_max > 1 and not self.socket_link_bytes_per_s_per_direction:
            raise InputError(f"cpu[{self.id}].socket_link_gb_per_s_per_direction",
                             self.socket_link_bytes_per_s_per_direction, "a multi-socket part needs its socket link")

    def sustained_dram_bytes_per_s(self, stream_fraction: float) -> float:
        """Sustained memory bandwidth of one socket: the measured STREAM triad, else the
        theoretical rate times ``stream_fraction`` (``catalogs/fabric.yaml`` pcie)."""
        if self.stream_bytes_per_s:
            return self.stream_bytes_per_s
        return self.dram_bytes_per_s * stream_fraction


@dataclass(frozen=True, kw_only=True, slots=True)
class PcieSwitchPart:
    id: str
    name: str
    generation: int
    lanes: int
    ports: int | None = None
    latency_s: float | None = None  # port-to-port cut-through
    power_w: float | None = None
    source: str = ""
    notes: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class NvmeDrive:
    id: str
    name: str
    pcie_generation: int
    pcie_lanes: int
    read_bytes_per_s: float
    write_bytes_per_s: float
    source: str = ""
    notes: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class PcieMeasurement:
    """One published PCIe / P2P / NCCL measurement on one public system (``kind: pcie-link``):
    ``values`` maps the record's keys to SI (``*_gb_per_s`` -> ``*_bytes_per_s``, ``*_us`` ->
    ``*_s``; counts and byte sizes as they are)."""

    id: str
    name: str
    pcie_generation: int
    lanes: int
    values: Mapping[str, float]
    p2p_enabled: bool | None = None
    system: str = ""
    tool: str = ""
    source: str = ""
    notes: str = ""

    def value(self, key: str) -> float:
        if key not in self.values:
            raise InputError(f"pcie-link[{self.id}]", key, f"not measured; has {', '.join(sorted(self.values))}")
        return self.values[key]


@dataclass(frozen=True, kw_only=True, slots=True)
class SwitchSlot:
    """One PCIe switch of a design: its socket, the GPUs and NIC sites below it, its uplink."""

    id: str
    model: str | None  # a pcie-switch id in hosts.yaml, or None
    socket: int
    gpus: tuple[int, ...]
    nics: tuple[int, ...]
    uplink_lanes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerDesign:
    """A named chassis (``catalogs/servers.yaml``): sockets, CPU, where each GPU slot and NIC
    site hangs, NVLink-bridged pairs; GPU and NIC indices are 0-based within the node."""

    id: str
    name: str
    sockets: int
    cpu: str
    num_gpus: int
    gpu: str  # the usual card (a gpus.yaml id)
    switches: tuple[SwitchSlot, ...]
    gpus_on_root_ports: tuple[tuple[int, tuple[int, ...]], ...]  # (socket, gpu slots)
    gpu_link_generation: int
    gpu_link_lanes: int
    nic_count: int | None  # adapters
    nic_link: str | None
    nic_ports: int | None = None  # scale-out ports training uses (default: nic_count)
    nics_on_root_ports: tuple[tuple[int, tuple[int, ...]], ...] = ()
    nvlink_pairs: tuple[tuple[int, ...], ...] = ()
    host_dram_bytes: float | None = None
    nvme_count: int | None = None
    power_w: float | None = None
    default_for: tuple[int, ...] = ()
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""

    def slot_socket(self, slot: int) -> int:
        for sw in self.switches:
            if slot in sw.gpus:
                return sw.socket
        for socket, gpus in self.gpus_on_root_ports:
            if slot in gpus:
                return socket
        raise InputError(f"server[{self.id}]", slot, "GPU slot not wired")


@dataclass(frozen=True, kw_only=True, slots=True)
class Server:
    """The resolved inside of one node of PCIe cards (``sim.net.server.resolve_server``): per GPU
    slot its socket and switch (-1: a CPU root port), per switch its socket and uplink, per
    NIC port its socket and switch, the socket link, each socket's sustained memory bandwidth,
    the P2P mode, NVLink-bridged groups, and every rate already in bytes/s (nominal; the
    collective efficiency is applied by ``sim.net.server.server_tables``)."""

    design: str  # a servers.yaml id, or "custom"
    name: str
    sockets: int
    cpu: HostCpu
    gpu_socket: tuple[int, ...]
    gpu_switch: tuple[int, ...]
    switch_socket: tuple[int, ...]
    switch_uplink_bytes_per_s: tuple[float, ...]
    switch_latency_s: tuple[float, ...]
    switch_model: tuple[str, ...]
    gpu_link_bytes_per_s: float  # card <-> slot, per direction (min of card and slot generation/lanes)
    gpu_link_label: str
    nic_socket: tuple[int, ...]
    nic_switch: tuple[int, ...]
    nic_link_bytes_per_s: float  # NIC adapter <-> its slot, per direction
    socket_link_bytes_per_s: float  # per direction, all links; 0 with one socket
    dram_bytes_per_s: float  # sustained, per socket
    host_dram_bytes: float | None
    p2p: str
    bridges: tuple[tuple[int, ...], ...]  # NVLink/Infinity Fabric bridged GPU groups
    bridge_bytes_per_s: float  # per bridged pair, per direction
    bridge_latency_s: float
    pcie_latency_s: float  # one GPU-to-GPU P2P transfer through the PCIe fabric
    host_staged_latency_s: float  # extra for a transfer staged through host memory
    pcie_efficiency: float  # collective fraction of nominal PCIe/socket-link bandwidth
    source: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        n = len(self.gpu_socket)
        _count("server.sockets", self.sockets)
        if self.p2p not in P2P_MODES:
            raise InputError("p2p", self.p2p, f"must be one of {', '.join(P2P_MODES)}")
        if len(self.gpu_switch) != n or n < 1:
            raise InputError("server.gpu_switch", self.gpu_switch, f"needs one entry per GPU slot ({n})")
        for s in self.gpu_socket + self.nic_socket + self.switch_socket:
            if not 0 <= s < self.sockets:
                raise InputError("server.socket", s, f"must be in [0, {self.sockets})")
        for k in self.gpu_switch + self.nic_switch:
            if not -1 <= k < len(self.switch_socket):
                raise InputError("server.switch", k, f"must be -1 or in [0, {len(self.switch_socket)})")
        for name in ("gpu_link_bytes_per_s", "nic_link_bytes_per_s", "dram_bytes_per_s"):
            _positive(f"server.{name}", getattr(self, name))
        if self.sockets > 1:
            _positive("server.socket_link_bytes_per_s", self.socket_link_bytes_per_s)
        if not 0 < self.pcie_efficiency <= 1:
            raise InputError("server.pcie_efficiency", self.pcie_efficiency, "must be in (0, 1]")
        for group in self.bridges:
            if len(group) < 2 or any(not 0 <= g < n for g in group):
                raise InputError("server.bridges", group, f"a bridged group needs >= 2 GPU slots in [0, {n})")

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_socket)

    @property
    def num_nics(self) -> int:
        return len(self.nic_socket)

    def with_slots(self, num_gpus: int) -> "Server":
        """The same server with only its first ``num_gpus`` GPU slots in use (a partial node)."""
        from dataclasses import replace

        if not 1 <= num_gpus <= self.num_gpus:
            raise InputError("num_gpus", num_gpus, f"the server has {self.num_gpus} GPU slots in use")
        bridges = tuple(b for b in (tuple(g for g in grp if g < num_gpus) for grp in self.bridges) if len(b) >= 2)
        return replace(self, gpu_socket=self.gpu_socket[:num_gpus], gpu_switch=self.gpu_switch[:num_gpus],
                       bridges=bridges)

    def bridge_of(self, slot: int) -> tuple[int, ...] | None:
        for group in self.bridges:
            if slot in group:
                return group
        return None

    def describe(self) -> dict[str, object]:
        """The design as ``planner simulate --json`` reports it (``server``)."""
        return {"design": self.design, "name": self.name, "sockets": self.sockets, "cpu": self.cpu.id,
                "p2p": self.p2p, "pcie_switches": len(self.switch_socket),
                "gpu_link": self.gpu_link_label, "gpu_switch": list(self.gpu_switch),
                "gpu_socket": list(self.gpu_socket), "nvlink_bridges": [list(b) for b in self.bridges],
                "host_memory_bytes_per_s_per_socket": self.dram_bytes_per_s,
                "socket_link_bytes_per_s": self.socket_link_bytes_per_s}


HOST_COPY_DIRECTIONS: tuple[str, ...] = ("h2d", "d2h")


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCopy:
    """One measured host<->device copy path of one rank: a copy of ``n`` bytes takes
    ``latency_s + n / bytes_per_s`` (an alpha-beta fit, ``validate.fit_host``)."""

    bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        _positive_float("host_copy.bytes_per_s", self.bytes_per_s)
        _positive_float("host_copy.latency_s", self.latency_s, allow_zero=True)

    def time_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCalibration:
    """Host-side rates a calibration profile measured (``planner validate``; docs/validate.md),
    each None when it was not measured -- never a stand-in value.

    ``host_mem_bytes_per_s`` is the host's sustained memory bandwidth (STREAM triad over
    buffers far beyond the caches, all ranks of the host at once, summed over them); the
    copies are per rank with every rank of the host copying at once (``Host.ranks_per_host``
    of the profile), pinned (page-locked) and pageable host memory separately.  The
    ``h2d_*`` / ``d2h_*`` properties give the pinned path when it was measured (what
    offloading frameworks use: FSDP2 ``CPUOffloadPolicy(pin_memory=True)`` by default,
    DeepSpeed ``offload_optimizer.pin_memory``), else the pageable one.
    """

    host_mem_bytes_per_s: float | None = None
    h2d_pinned: HostCopy | None = None
    h2d_pageable: HostCopy | None = None
    d2h_pinned: HostCopy | None = None
    d2h_pageable: HostCopy | None = None

    def __post_init__(self) -> None:
        if self.host_mem_bytes_per_s is not None:
            _positive_float("host_mem_bytes_per_s", self.host_mem_bytes_per_s)

    def copy(self, direction: str, *, pinned: bool = True) -> HostCopy | None:
        """The measured ``h2d`` or ``d2h`` path, pinned or pageable; None if not measured."""
        _choice("host_copy.direction", direction, HOST_COPY_DIRECTIONS)
        return getattr(self, f"{direction}_{'pinned' if pinned else 'pageable'}")

    def preferred(self, direction: str) -> HostCopy | None:
        """The pinned path if measured, else the pageable one (class docstring)."""
        return self.copy(direction, pinned=True) or self.copy(direction, pinned=False)

    @property
    def h2d_bytes_per_s(self) -> float | None:
        c = self.preferred("h2d")
        return None if c is None else c.bytes_per_s

    @property
    def d2h_bytes_per_s(self) -> float | None:
        c = self.preferred("d2h")
        return None if c is None else c.bytes_per_s

    @property
    def h2d_latency_s(self) -> float | None:
        c = self.preferred("h2d")
        return None if c is None else c.latency_s

    @property
    def d2h_latency_s(self) -> float | None:
        c = self.preferred("d2h")
        return None if c is None else c.latency_s

    @property
    def h2d_pinned_measured(self) -> bool:
        return self.h2d_pinned is not None

    @property
    def d2h_pinned_measured(self) -> bool:
        return self.d2h_pinned is not None

    @property
    def empty(self) -> bool:
        return self.host_mem_bytes_per_s is None and not any(
            self.copy(d, pinned=p) for d in HOST_COPY_DIRECTIONS for p in (True, False))

    def as_dict(self) -> dict[str, float]:
        """The measured values under the profile's ``host`` keys (absent when not measured)."""
        out: dict[str, float] = {}
        if self.host_mem_bytes_per_s is not None:
            out["host_mem_bytes_per_s"] = self.host_mem_bytes_per_s
        for d in HOST_COPY_DIRECTIONS:
            for kind in ("pinned", "pageable"):
                c = self.copy(d, pinned=kind == "pinned")
                if c is not None:
                    out[f"{d}_{kind}_bytes_per_s"] = c.bytes_per_s
                    out[f"{d}_{kind}_latency_s"] = c.latency_s
        return out


# --------------------------------------------------------------------------- model


@dataclass(frozen=True, kw_only=True, slots=True)
class HostSpec:
    """The host side of a node that offloading uses (``catalogs/offload.yaml`` defaults,
    ``sim.cost.offload.host_spec``): DRAM capacity and bandwidth, CPU Adam throughput, NVMe, and the
    achievable host-device copy rate of one GPU's link.  Per node unless the name says GPU.

    ``host_link_bytes_per_s`` is one host link (a PCIe x16 slot, achievable copy rate, one
    direction, full duplex); ``gpus_per_host_link`` GPUs share it (1: every GPU its own x16).
    """

    host_dram_bytes: float
    host_mem_bytes_per_s: float  # achievable (STREAM-class) DRAM bandwidth of the node
    host_adam_params_per_s: float  # CPU Adam's compute-bound rate, all cores of the node
    host_link_bytes_per_s: float  # per host link, per direction, achievable copies
    nvme_bytes: float
    nvme_bytes_per_s: float  # achievable, the node's drives together
    gpus_per_host_link: int = 1
    source: str = ""

    def __post_init__(self) -> None:
        for n in ("host_dram_bytes", "host_mem_bytes_per_s", "host_adam_params_per_s", "host_link_bytes_per_s",
                  "nvme_bytes", "nvme_bytes_per_s"):
            _positive_float(f"host.{n}", getattr(self, n))
        _positive_int("host.gpus_per_host_link", self.gpus_per_host_link, limit=64)

    @property
    def link_bytes_per_s_per_gpu(self) -> float:
        """Host-device copy rate one GPU gets, per direction, with its link's GPUs all copying."""
        return self.host_link_bytes_per_s / self.gpus_per_host_link


# --------------------------------------------------------------------------- cluster
