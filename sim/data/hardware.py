"""Frozen data model of the hardware: ``Gpu`` (one accelerator as its data sheet describes it),
``Link`` (a NIC port, NVLink or PCIe generation) and ``Cluster`` (GPUs packed into nodes and
NVLink domains on a scale-out network).

Every number carries its SI unit in its name.  Values come from ``catalogs/`` (see
``sim.data.catalog``); nothing here hard-codes a device.  Construction validates and raises
``InputError`` naming the field and the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

from sim.base.checks import choice as _choice, positive_float as _positive_float, positive_int as _positive_int
from sim.base.errors import InputError
from sim.base.limits import MAX_CLUSTER_GPUS
from sim.data.hostspecs import HostSpec, Server
from sim.data.specs import PRECISIONS

Topology = Literal["fat-tree", "rail-optimized", "star", "tree", "mesh", "torus"]
TOPOLOGIES: tuple[str, ...] = ("fat-tree", "rail-optimized", "star", "tree", "mesh", "torus")
PLACEMENTS: tuple[str, ...] = ("block", "packed")
FORM_FACTORS: tuple[str, ...] = ("sxm", "pcie")


@dataclass(frozen=True, kw_only=True, slots=True)
class Gpu:
    """One accelerator as its data sheet describes it (dense, per package, per direction)."""

    id: str
    name: str
    dense_flops_per_s: Mapping[str, float]  # precision -> dense peak FLOP/s (no sparsity)
    hbm_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s_per_direction: float  # per GPU, all links summed, one direction
    nvlink_domain_size: int  # GPUs in the usual scale-up domain
    nvlink_generation: str
    pcie_generation: int
    tdp_w: float
    gpus_per_node: int
    nics_per_node: int
    default_nic: str
    # Achievable fractions, calibrated from microbenchmarks (catalogs/efficiency.yaml may refine).
    matmul_efficiency: Mapping[str, float]  # precision -> best-case GEMM fraction of peak
    hbm_efficiency: float  # achievable fraction of hbm_bytes_per_s for streaming kernels
    price_usd: float | None = None
    price_usd_per_hour: float | None = None
    vendor: str = "nvidia"
    architecture: str = ""  # volta | ampere | hopper | blackwell | cdna2 | cdna3 (kernel families)
    num_sms: int | None = None  # streaming multiprocessors / compute units per package
    # PCIe cards (catalogs/README.md): ``form_factor`` pcie puts the GPU in a server whose
    # inside is its PCIe/host topology (sim/net/server.py); ``p2p`` none = the driver gives no peer
    # access (GeForce), transfers are staged through host memory; an NVLink bridge joins
    # ``nvlink_bridge_gpus`` cards with ``nvlink_bridge_bytes_per_s_per_direction`` per GPU.
    form_factor: str = "sxm"  # sxm (SXM/OAM module or superchip on a scale-up baseboard) | pcie
    pcie_lanes: int = 16
    p2p: str = "pcie"
    nvlink_bridge_gpus: int = 0
    nvlink_bridge_bytes_per_s_per_direction: float = 0.0
    fp32_accumulate_halved: bool = False  # GeForce: dense_flops_per_s are the FP32-accumulate rates
    # bf16 tensor cores (False before Ampere: the loader fills the bf16 entries with fp16's and
    # 16-bit mixed precision trains in fp16)
    bf16_tensor_cores: bool = True
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        if "bf16" not in self.dense_flops_per_s:
            raise InputError(f"gpu[{self.id}].dense_flops_per_s", dict(self.dense_flops_per_s), "needs bf16")
        for p, v in self.dense_flops_per_s.items():
            _choice(f"gpu[{self.id}].dense_flops_per_s", p, PRECISIONS)
            _positive_float(f"gpu[{self.id}].dense_flops_per_s.{p}", v)
        _choice(f"gpu[{self.id}].form_factor", self.form_factor, FORM_FACTORS)
        _choice(f"gpu[{self.id}].p2p", self.p2p, ("pcie", "none"))
        _positive_int(f"gpu[{self.id}].pcie_lanes", self.pcie_lanes, limit=32)
        pcie_only = self.form_factor == "pcie"  # a PCIe card may have no NVLink at all
        _positive_float(f"gpu[{self.id}].nvlink_bytes_per_s_per_direction", self.nvlink_bytes_per_s_per_direction,
                        allow_zero=pcie_only)
        if self.nvlink_bridge_gpus:
            if self.nvlink_bridge_gpus < 2 or not pcie_only:
                raise InputError(f"gpu[{self.id}].nvlink_bridge.gpus", self.nvlink_bridge_gpus,
                                 "a bridge joins >= 2 PCIe cards")
            _positive_float(f"gpu[{self.id}].nvlink_bridge.gb_per_s_per_direction",
                            self.nvlink_bridge_bytes_per_s_per_direction)
        for n in ("hbm_bytes", "hbm_bytes_per_s", "tdp_w"):
            _positive_float(f"gpu[{self.id}].{n}", getattr(self, n))
        for n in ("nvlink_domain_size", "gpus_per_node", "nics_per_node"):
            _positive_int(f"gpu[{self.id}].{n}", getattr(self, n))
        for p, v in self.matmul_efficiency.items():
            if not 0 < v <= 1:
                raise InputError(f"gpu[{self.id}].matmul_efficiency.{p}", v, "must be in (0, 1]")
        if "bf16" not in self.matmul_efficiency:
            raise InputError(f"gpu[{self.id}].matmul_efficiency", dict(self.matmul_efficiency),
                             "needs a bf16 entry (the fraction a precision without its own entry uses)")
        if not 0 < self.hbm_efficiency <= 1:
            raise InputError(f"gpu[{self.id}].hbm_efficiency", self.hbm_efficiency, "must be in (0, 1]")

    @property
    def default_precision(self) -> str:
        """The training precision nobody has to ask for: bf16, fp16 where there are no bf16
        tensor cores (fp8 changes numerics and is only used when asked for)."""
        return "bf16" if self.bf16_tensor_cores else "fp16"

    def peak_flops_per_s(self, precision: str) -> float:
        """Dense peak for a training precision; fp16 falls back to bf16 (same tensor cores)."""
        table = self.dense_flops_per_s
        if precision in table:
            return table[precision]
        if precision == "fp16":
            return table["bf16"]
        raise InputError("precision", precision, f"{self.id} has no {precision} tensor-core peak")

    def achievable_matmul_fraction(self, precision: str) -> float:
        """Best-case GEMM fraction of ``precision``'s peak: its own catalog entry, else bf16's
        (fp16 runs on the same tensor cores; a GPU record must measure bf16)."""
        return self.matmul_efficiency.get(precision, self.matmul_efficiency["bf16"])


LinkKind = Literal["nic", "scale-up", "pcie", "switch"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """A link or adapter type: NIC port, NVLink generation, PCIe generation."""

    id: str
    name: str
    kind: str  # nic | scale-up | pcie
    bytes_per_s_per_direction: float
    latency_s: float
    technology: str = ""  # infiniband | roce | ethernet | efa | nvlink | pcie
    switch_radix: int | None = None
    price_usd: float | None = None  # adapter price where public
    switch_price_usd: float | None = None
    power_w: float | None = None
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        _positive_float(f"link[{self.id}].bytes_per_s_per_direction", self.bytes_per_s_per_direction)
        _positive_float(f"link[{self.id}].latency_s", self.latency_s, allow_zero=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """GPUs, how they are packed into nodes and NVLink domains, and the scale-out network."""

    gpu: Gpu
    num_gpus: int
    nic: Link
    gpus_per_node: int
    nvlink_domain: int  # GPUs per scale-up domain (>= gpus_per_node for NVL72-style racks)
    nics_per_node: int
    scale_up: Link | None = None  # NVLink generation; bandwidth taken from the GPU when None
    topology: str = "fat-tree"
    oversubscription: float = 1.0  # downlink:uplink ratio at the leaf (tree/fat-tree)
    tree_levels: int = 2
    # How the job's GPUs are taken from NVLink domains larger than a node (NVL72 racks):
    # ``block`` uses the same number of GPUs in every domain, the largest whole number of
    # nodes that divides the job (Slurm topology/block, ``--segment``), so no domain is split
    # between jobs and equal groups stay inside one; ``packed`` fills each domain in turn.
    placement: str = "block"
    # The inside of one node of PCIe cards (sim.data.hostspecs.Server, built by sim.net.server): its
    # GPUs talk over that PCIe/host topology (and NVLink bridges) instead of an NVLink domain,
    # which is then the node (``nvlink_domain == gpus_per_node``).  None for SXM/OAM parts.
    server: Server | None = None
    # The nodes' host side (offloading and every host-side cost read it through
    # ``sim.cost.offload.host_spec``): set by a node-level override (``--host-dram-gib``) or a
    # calibration profile's measured rates; None = the server's (PCIe cards), else the catalog
    # defaults for the GPU's PCIe generation.
    host: HostSpec | None = None

    def __post_init__(self) -> None:
        _positive_int("num_gpus", self.num_gpus, limit=MAX_CLUSTER_GPUS)
        _choice("placement", self.placement, PLACEMENTS)
        _positive_int("gpus_per_node", self.gpus_per_node, limit=1024)
        _positive_int("nvlink_domain", self.nvlink_domain, limit=1 << 16)
        _positive_int("nics_per_node", self.nics_per_node, limit=1024)
        _positive_int("tree_levels", self.tree_levels, limit=8)
        _choice("topology", self.topology, TOPOLOGIES)
        _positive_float("oversubscription", self.oversubscription)
        if self.oversubscription < 1 or self.oversubscription > 64:
            raise InputError("oversubscription", self.oversubscription, "must be in [1, 64]")
        if self.nvlink_domain % self.gpus_per_node and self.gpus_per_node % self.nvlink_domain:
            raise InputError("nvlink_domain", self.nvlink_domain,
                             f"must be a multiple or divisor of gpus_per_node={self.gpus_per_node}")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise InputError("num_gpus", self.num_gpus,
                             f"must be a multiple of gpus_per_node={self.gpus_per_node}")
        if self.server is not None:
            if self.server.num_gpus != self.gpus_per_node:
                raise InputError("server", self.server.design, f"has {self.server.num_gpus} GPU slots in use, "
                                 f"gpus_per_node={self.gpus_per_node}")
            if self.nvlink_domain != self.gpus_per_node:
                raise InputError("nvlink_domain", self.nvlink_domain,
                                 "a PCIe server's GPUs share the node's PCIe fabric: nvlink_domain must be gpus_per_node")
            if self.server.num_nics != self.nics_per_node:
                raise InputError("nics_per_node", self.nics_per_node,
                                 f"the server places {self.server.num_nics} NIC ports")

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def scale_up_block(self) -> int:
        """GPUs of the job in each NVLink domain (``placement``): the whole domain when the job
        fills domains exactly, fits in one, or is ``packed``; else (``block``) the largest
        multiple of ``gpus_per_node`` up to the domain that divides the job, e.g. 128 or 256
        GB200 GPUs take 64 of each 72-GPU rack."""
        d, n, gpn = self.nvlink_domain, self.num_gpus, self.gpus_per_node
        if self.placement == "packed" or n <= d or n % d == 0 or d <= gpn:
            return d
        for size in range(d - d % gpn, gpn - 1, -gpn):
            if n % size == 0:
                return size
        return d

    @property
    def domain_size(self) -> int:
        """GPUs that actually share one NVLink domain (capped by the cluster size)."""
        return min(self.scale_up_block, self.num_gpus)

    @property
    def nvlink_bytes_per_s_per_direction(self) -> float:
        return self.gpu.nvlink_bytes_per_s_per_direction

    @property
    def nic_bytes_per_s_per_gpu(self) -> float:
        """Scale-out bandwidth one GPU can drive (node NICs shared by its GPUs), per direction."""
        return self.nic.bytes_per_s_per_direction * self.nics_per_node / self.gpus_per_node
