"""Calibration profiles: a measured machine that stands in for catalog hardware.

A profile (``catalogs/calibration/<id>.yaml``, written by ``planner validate fit``) holds,
in the catalog schema (``catalogs/gpus.yaml``, ``links.yaml``, ``efficiency.yaml``):

* ``device``: a GPU record for the device one rank drives, with its *achieved* peaks
  (best GEMM throughput as ``dense_tflops`` x ``matmul_efficiency``, memory-bound op
  bandwidth as ``hbm_tb_per_s`` x ``hbm_efficiency``);
* ``links``: the fitted alpha-beta parameters of each link tier that was measured
  (``kind: scale-up`` inside a node, ``kind: nic`` between nodes): per-rank bus bandwidth
  as ``gb_per_s_per_direction`` and per-step latency as ``latency_us``;
* ``efficiency``: the kernel-efficiency knobs of ``sim.layers.compute.KernelEfficiency``
  (attention vs GEMM, GEMM shape factor, per-kernel overhead);
* ``host``: how the device was measured: ``device_type``, ``compute_dtype`` (the dtype the
  workloads train in), ranks per host, cores per host, threads per rank, ``base_gpu`` (the
  catalog GPU whose data-sheet record the device keeps, on GPU hosts) and the software it
  was measured with (torch, CUDA, cuDNN, NCCL versions, TF32 settings); and the host-side
  rates it measured, each key present only when measured (``HOST_BANDWIDTH_KEYS``):
  ``host_mem_bytes_per_s`` and ``{h2d,d2h}_{pinned,pageable}_{bytes_per_s,latency_s}``.
  They load into ``Calibration.host_bandwidth`` (``sim.data.hostspecs.HostCalibration``), and
  ``apply_plan`` puts them on the plan's host (``Cluster.host``, ``sim.cost.offload.measured_host``):
  the host memory bandwidth and the host link the offload model prices.

A link tier the profile did not measure has no record: the simulator keeps the catalog's
link for it (the base GPU's NVLink generation, with its fitted efficiency and size curve; the
plan's NIC).  A profile without a base GPU and without a scale-up link (one rank per host)
cannot price traffic inside a host, so ``apply_plan`` refuses plans with several ranks per
node on it.  The profile's device is the GPU of the plan: ``apply_plan`` refuses a plan on
another GPU (``--gpu`` must be the profile id, its device id or its base GPU).

``sim.engines.simulate.simulate(plan, calibration=...)`` calls, in order, ``apply_efficiency``,
``apply_plan`` (the profile's device and links replace the plan's ``--gpu``, scale-up and,
when measured, NIC records) and ``network_kwargs``.  Two physical corrections apply to CPU
hosts, both documented in docs/validate.md:

* element size: the cost model counts activations at 2 bytes per element (bf16); a device
  that trains in fp32 moves 4, so its memory-bound bandwidth is divided by
  ``bytes(compute_dtype) / 2`` when standing in for the bf16 recipe;
* core sharing: ranks time-share a host's cores, so with more ranks per host than were
  measured, each rank gets ``measured_ranks / ranks`` of the measured throughput and
  bandwidth (and of the memory);
* no overlap: a CPU has no separate engine for communication (gloo reduces and copies on
  the cores that compute), so gradient reduction is not hidden behind the backward pass
  (``dp_overlap=False``).

This module imports neither torch nor ``validate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from sim.data.catalog import catalog_dir, get_gpu, gpu_from_record, link_from_record, list_links
from sim.net.netefficiency import network_efficiency, network_size_curves, nvls_gain
from sim.base.errors import InputError
from sim.base.outpaths import make_folder, write_text
from sim.base.records import MAX_MAGNITUDE, Record
from sim.data.hostspecs import HOST_COPY_DIRECTIONS, HostCalibration, HostCopy
from sim.cost.offload import host_spec, measured_host
from sim.data.hardware import Gpu, Link

SCHEMA_VERSION = 1
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
MODEL_ACTIVATION_BYTES = 2  # sim.layers.ops.BYTES_BF16: what the cost model counts per element
_EFF_KEYS = ("attention_fwd_vs_matmul", "attention_bwd_vs_matmul", "kernel_overhead_s", "gemm_half_dim",
             "collective_overhead_s", "host_op_floor_s", "eager_elementwise_traffic")
HOST_BANDWIDTH_KEYS: tuple[str, ...] = ("host_mem_bytes_per_s",) + tuple(
    f"{d}_{kind}_{q}" for d in HOST_COPY_DIRECTIONS for kind in ("pinned", "pageable")
    for q in ("bytes_per_s", "latency_s"))
_HOST_BANDWIDTH_PREFIXES = ("host_mem_", "h2d_", "d2h_")
_BANDWIDTH_RANGE = (1e6, 1e14)  # bytes/s: catches unit slips (GB/s written as bytes/s), not hardware
_TOP_KEYS = frozenset({"schema_version", "id", "name", "source", "notes", "host", "device", "links",
                       "efficiency", "memory", "fit", "measured", "validation"})
# host: what was measured, with what (software versions are free text), and HOST_BANDWIDTH_KEYS
_HOST_KEYS = frozenset({"device_type", "compute_dtype", "ranks_per_host", "host_cores", "threads_per_rank",
                        "num_nodes", "base_gpu", "backend", "device_name", "torch", "cuda", "cudnn", "nccl", "tf32",
                        "device_capability"}) | frozenset(HOST_BANDWIDTH_KEYS)
# memory: the framework's memory constants on this host (validate.profile._memory_section)
MEMORY_KEYS: tuple[str, ...] = ("workspace_bytes", "outside_allocator_bytes", "nccl_bytes", "fragmentation_fraction")


def calibration_dir() -> Path:
    return catalog_dir() / "calibration"


def list_calibrations() -> list[str]:
    """Ids of the profiles in ``catalogs/calibration/``."""
    out = []
    for p in sorted(calibration_dir().glob("*.yaml")):
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, Mapping) and isinstance(data.get("id"), str):
            out.append(data["id"])
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    device_type: str  # cpu | cuda
    compute_dtype: str  # dtype the workloads train in on this device
    ranks_per_host: int  # ranks that ran at once while measuring
    host_cores: int
    threads_per_rank: int
    num_nodes: int = 1
    base_gpu: str | None = None  # catalog GPU id the device record derives from (GPU hosts)
    software: Mapping[str, object] = field(default_factory=dict)  # torch, cuda, cudnn, nccl, tf32

    @property
    def element_ratio(self) -> float:
        """Bytes per activation element on the device over the cost model's 2."""
        return DTYPE_BYTES[self.compute_dtype] / MODEL_ACTIVATION_BYTES


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """A loaded profile (see module docstring)."""

    id: str
    name: str
    gpu: Gpu
    scale_up: Link | None
    nic: Link | None
    efficiency: Mapping[str, float]
    host: Host
    memory: Mapping[str, float] = field(default_factory=dict)
    source: str = ""
    path: str = ""
    scale_up_known: bool = True  # False: no measured scale-up link and no catalog record to fall back on
    host_bandwidth: HostCalibration = field(default_factory=HostCalibration)  # measured host rates

    def gpu_ids(self) -> tuple[str, ...]:
        """The ``--gpu`` values that name this profile's device: the profile id, the device
        id and, on GPU hosts, the base GPU's id and aliases (lower case)."""
        ids = [self.id, self.gpu.id]
        if self.host.base_gpu:
            try:
                base = get_gpu(self.host.base_gpu)
                ids += [base.id, *base.aliases]
            except InputError:
                ids.append(self.host.base_gpu)
        return tuple(dict.fromkeys(i.lower() for i in ids))

    def check_gpu(self, gpu_id: str, *, field_name: str = "gpu") -> None:
        """``InputError`` unless ``gpu_id`` names this profile's device (``gpu_ids``)."""
        if str(gpu_id).strip().lower() not in self.gpu_ids():
            measured = self.host.base_gpu or self.gpu.name
            raise InputError(field_name, gpu_id, f"does not match calibration profile {self.id} (measured on "
                                                 f"{measured}); use --gpu {self.id}")

    # ------------------------------------------------------------------ hooks used by simulate

    def apply_efficiency(self, eff):  # (KernelEfficiency) -> KernelEfficiency
        """The kernel-efficiency knobs with the profile's fitted values.  A GEMM half
        dimension measured on this device is not rescaled by SM throughput (that rescaling
        carries A100 fits to other GPUs)."""
        changes: dict[str, object] = {k: float(v) for k, v in self.efficiency.items()
                                      if k in _EFF_KEYS and hasattr(eff, k)}
        if "gemm_half_dim" in changes and hasattr(eff, "gemm_reference_flops_per_sm"):
            changes["gemm_reference_flops_per_sm"] = 0.0
            # the device's own GEMM curve replaces the fitted sustained fractions too
            changes.setdefault("gemm_sustained_fraction", 1.0)
            changes["gemm_sustained_by_arch"] = {a: v for a, v in eff.gemm_sustained_by_arch.items()
                                                 if a != self.gpu.architecture}
            # ... and the sustained-over-burst clock factor (the rate measured on the device stands)
            changes["sustained_clock_by_arch"] = {a: v for a, v in eff.sustained_clock_by_arch.items()
                                                  if a != self.gpu.architecture}
        fa, fb = self.efficiency.get("attention_fwd_vs_matmul"), self.efficiency.get("attention_bwd_vs_matmul")
        table = getattr(eff, "attention_fractions", None)
        if fa and fb and table is not None and self.gpu.architecture:
            # measured attention replaces the catalog's per-architecture kernel fractions
            m = self.gpu.achievable_matmul_fraction("bf16")
            frac = (m * fa, m * fb)
            changes["attention_fractions"] = {**table, self.gpu.architecture: {"flash": frac, "flash2": frac}}
            changes["attention_curves"] = {a: c for a, c in eff.attention_curves.items()
                                           if a != self.gpu.architecture}
        return replace(eff, **changes, source=f"calibration {self.id}")

    def device_for(self, ranks_per_host: int) -> Gpu:
        """The device one rank sees with ``ranks_per_host`` ranks per host (module docstring)."""
        g = self.gpu
        share = 1.0
        if self.host.device_type == "cpu" and ranks_per_host > self.host.ranks_per_host:
            share = self.host.ranks_per_host / ranks_per_host
        ratio = self.host.element_ratio
        if share == 1.0 and ratio == 1.0:
            return g
        flops = type(g.dense_flops_per_s)({p: v * share for p, v in g.dense_flops_per_s.items()})
        return replace(g, dense_flops_per_s=flops, hbm_bytes_per_s=g.hbm_bytes_per_s * share / ratio,
                       hbm_bytes=g.hbm_bytes * share)

    def apply_plan(self, plan):  # (Plan) -> Plan
        """``plan`` on the calibrated device and links (module docstring).  Raises
        ``InputError`` for a plan on another GPU, and for several ranks per node on a profile
        that knows no scale-up link."""
        c = plan.cluster
        self.check_gpu(c.gpu.id)
        if not self.scale_up_known and c.gpus_per_node > 1:
            raise InputError("calibration", self.id, f"measured {self.host.ranks_per_host} rank per host and has "
                                                     f"no scale-up link for {c.gpus_per_node} ranks per node; "
                                                     "measure with more ranks per node or plan one per node")
        gpu = self.device_for(c.gpus_per_node)
        changes: dict[str, object] = {"gpu": gpu}
        if self.scale_up is not None:
            changes["scale_up"] = self.scale_up
        if self.nic is not None:
            changes["nic"] = self.nic
        if not self.host_bandwidth.empty:  # the one host of the node, with the measured rates
            changes["host"] = measured_host(host_spec(c), self.host_bandwidth)
        strategy = plan.strategy
        if self.host.device_type == "cpu" and strategy.dp_overlap:
            strategy = strategy.with_(dp_overlap=False)
        return replace(plan, cluster=replace(c, **changes), strategy=strategy)

    def network_kwargs(self, cluster) -> dict[str, object]:  # (Cluster) -> dict
        """Keyword arguments for ``sim.net.network.Network``.  The measured link records carry
        achieved (bus) bandwidths, so a measured tier runs at efficiency 1 without a size
        curve; a tier the profile did not measure keeps the catalog's fitted efficiency and
        size curve."""
        # an unmeasured NVLink keeps its own generation's fitted efficiency, as without a profile
        eff: dict[str, float] = dict(network_efficiency(None if self.scale_up is not None
                                                        else self.gpu.nvlink_generation))
        curves: dict[str, object] = dict(network_size_curves())
        if self.scale_up is not None:
            eff["scale-up"] = 1.0
            curves.pop("scale-up", None)  # the measured bandwidth replaces the curve too
        if self.nic is not None:
            eff["scale-out"] = 1.0
            curves.pop("scale-out", None)
        # NVLS: the catalog's gain for an unmeasured NVSwitch generation; a measured scale-up
        # tier is what the device's all-reduce achieved
        nvls = {} if self.scale_up is not None else nvls_gain(self.gpu.nvlink_generation)
        return {"bandwidth_efficiency": eff, "size_curves": curves, "nvls_gain": nvls}

    def memory_runtime(self, default):  # (MemoryRuntime) -> MemoryRuntime
        """Framework memory constants of this host (``memory`` section), else ``default``."""
        changes = {k: float(v) for k, v in self.memory.items() if k in ("workspace_bytes", "fragmentation_fraction")}
        return replace(default, **changes) if changes else default

    def describe(self) -> dict[str, object]:
        g = self.gpu
        return {
            "id": self.id, "name": self.name, "device": g.id, "compute_dtype": self.host.compute_dtype,
            "matmul_flops_per_s": g.peak_flops_per_s("bf16") * g.achievable_matmul_fraction("bf16"),
            "memory_bytes_per_s": g.hbm_bytes_per_s * g.hbm_efficiency,
            "scale_up": None if self.scale_up is None else {
                "bytes_per_s": self.scale_up.bytes_per_s_per_direction, "latency_s": self.scale_up.latency_s},
            "nic": None if self.nic is None else {
                "bytes_per_s": self.nic.bytes_per_s_per_direction, "latency_s": self.nic.latency_s},
            "efficiency": dict(self.efficiency),
            "base_gpu": self.host.base_gpu, "software": dict(self.host.software),
            "host_bandwidth": self.host_bandwidth.as_dict(),
        }


# ---------------------------------------------------------------------- loading


def _fail(where: str, value: object, message: str) -> InputError:
    return InputError(f"calibration.{where}", value, message)


def host_bandwidth_from_record(host: Mapping[str, Any], *, file: str = "") -> HostCalibration:
    """The measured host rates of a profile's ``host`` section (module docstring); a key
    that is absent was not measured.  Bandwidths must lie in [1 MB/s, 100 TB/s] (bytes per
    second), latencies in [0, 1) s; a copy path needs both its keys."""
    rec = Record(host, where="calibration.host", file=file)
    for key in host:
        if str(key).startswith(_HOST_BANDWIDTH_PREFIXES) and key not in HOST_BANDWIDTH_KEYS:
            raise rec.fail(str(key), f"unknown key; known: {', '.join(HOST_BANDWIDTH_KEYS)}")

    def rate(key: str) -> float | None:
        v = rec.number(key, optional=True, positive=True)
        if v is not None and not _BANDWIDTH_RANGE[0] <= v <= _BANDWIDTH_RANGE[1]:
            raise rec.fail(key, "must be in [1e6, 1e14] bytes per second")
        return v

    copies: dict[str, HostCopy] = {}
    for d in HOST_COPY_DIRECTIONS:
        for kind in ("pinned", "pageable"):
            bw_key, lat_key = f"{d}_{kind}_bytes_per_s", f"{d}_{kind}_latency_s"
            bw, lat = rate(bw_key), rec.number(lat_key, optional=True)
            if (bw is None) != (lat is None):
                missing = lat_key if lat is None else bw_key
                raise rec.fail(missing, f"missing: {bw_key} and {lat_key} are measured together")
            if lat is not None and lat >= 1.0:
                raise rec.fail(lat_key, "must be in [0, 1) seconds")
            if bw is not None:
                copies[f"{d}_{kind}"] = HostCopy(bytes_per_s=bw, latency_s=float(lat or 0.0))
    return HostCalibration(host_mem_bytes_per_s=rate("host_mem_bytes_per_s"), **copies)


def _check_finite(rec: Record, key: str) -> None:
    """Every number under ``key`` (nested mappings and lists, e.g. the ``fit`` report) finite
    and of a sane magnitude (``sim.base.records.MAX_MAGNITUDE``); text, flags and nulls pass."""
    def walk(value: Any, where: str) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, f"{where}.{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
                raise InputError(f"{rec.where}.{where}", value, f"{rec.file}: must be a finite number")
    if key in rec.rec:
        walk(rec.rec[key], key)


def calibration_from_dict(data: Mapping[str, Any], *, path: str = "<dict>") -> Calibration:
    """Build and validate a ``Calibration`` from a parsed profile, as strictly as a catalog
    (``sim.base.records.Record``: integers stay integers, booleans are not numbers, every section is
    checked, no number is NaN or infinite)."""
    if not isinstance(data, Mapping):
        raise _fail("file", path, "must be a mapping")
    p = Path(path)
    top = Record(data, where="calibration", file=p.name, allowed=_TOP_KEYS)
    if data.get("schema_version") != SCHEMA_VERSION or isinstance(data.get("schema_version"), bool):
        raise _fail("schema_version", data.get("schema_version"), f"must be {SCHEMA_VERSION}")
    for key in ("id", "device", "host", "efficiency"):
        if key not in data:
            raise _fail(key, None, f"{Path(path).name}: missing required key")
    for key in ("fit", "measured", "validation"):  # reports: free form, but no NaN or infinity
        _check_finite(top, key)
    raw_links = data.get("links") or []
    if not isinstance(raw_links, list):
        raise _fail("links", raw_links, "must be a list of link records")
    for i, r in enumerate(raw_links):
        if not isinstance(r, Mapping) or not isinstance(r.get("id"), str) or not r["id"].strip():
            raise _fail(f"links[{i}]", r, f"{p.name}: must be a links.yaml record with an id")
    own = [link_from_record(r, file=str(p)) for r in raw_links]
    if not isinstance(data["device"], Mapping) or not isinstance(data["device"].get("id"), str) \
            or not data["device"]["id"].strip():
        raise _fail("device", data["device"], f"{p.name}: must be a gpus.yaml record with an id")
    scale_up = next((l for l in own if l.kind == "scale-up"), None)
    device = dict(data["device"])
    scale_up_known = True
    if scale_up is None and "nvlink_generation" not in device:
        # one rank per host, no catalog record: no scale-up link is known.  The GPU record
        # needs one structurally; apply_plan refuses every plan that would use it.
        stand_in = list_links("scale-up")[0]
        device.update(nvlink_generation=stand_in.id,
                      nvlink_gb_per_s_per_direction=stand_in.bytes_per_s_per_direction / 1e9)
        scale_up_known = False
    gpu = gpu_from_record(device, file=str(p), extra_links=own)
    if scale_up is not None and scale_up.id != gpu.nvlink_generation:
        raise _fail("device.nvlink_generation", gpu.nvlink_generation, f"must name the measured link {scale_up.id}")
    nic = next((l for l in own if l.kind == "nic"), None)

    h = top.mapping("host", allowed=_HOST_KEYS)
    _check_finite(h, "tf32")
    software = {k: h.rec[k] for k in ("torch", "cuda", "cudnn", "nccl", "tf32", "device_capability") if k in h.rec}
    base_gpu = h.rec.get("base_gpu")
    host = Host(device_type=h.text("device_type", choices=("cpu", "cuda")),
                compute_dtype=h.text("compute_dtype", choices=tuple(DTYPE_BYTES)),
                ranks_per_host=h.integer("ranks_per_host"), host_cores=h.integer("host_cores"),
                threads_per_rank=h.integer("threads_per_rank", optional=True, default=1),
                num_nodes=h.integer("num_nodes", optional=True, default=1),
                base_gpu=h.text("base_gpu") if base_gpu else None, software=software)
    host_bw = host_bandwidth_from_record(h.rec, file=p.name)

    e = top.mapping("efficiency", allowed=_EFF_KEYS + ("source", "notes"))
    out_eff = {k: e.req(k) for k in _EFF_KEYS if e.has(k)}
    for k in ("attention_fwd_vs_matmul", "attention_bwd_vs_matmul"):
        if k in out_eff and not 0 < out_eff[k] <= 1.5:
            raise e.fail(k, "must be in (0, 1.5]")
    memory: dict[str, float] = {}
    if data.get("memory") is not None:
        m = top.mapping("memory", allowed=MEMORY_KEYS + ("source", "notes"))
        memory = {k: m.req(k) for k in MEMORY_KEYS if m.has(k)}
        if "fragmentation_fraction" in memory:
            m.fraction("fragmentation_fraction")
    return Calibration(id=top.text("id"), name=top.text("name", default=top.text("id")), gpu=gpu,
                       scale_up=scale_up, nic=nic, efficiency=out_eff, host=host, memory=memory,
                       source=top.text("source", default=""), path=str(path), scale_up_known=scale_up_known,
                       host_bandwidth=host_bw)


def load_calibration(name_or_path: str | Path) -> Calibration:
    """A profile from a YAML/JSON file, or by id from ``catalogs/calibration/``.

    Raises ``InputError`` (field ``calibration``) naming the known profiles when neither a
    file nor a known id matches.
    """
    text = str(name_or_path).strip()
    p = Path(text).expanduser()
    if not p.is_file():
        want = text.lower().removesuffix(".yaml")
        match = None
        for cand in sorted(calibration_dir().glob("*.yaml")):
            if cand.stem.lower() == want:
                match = cand
                break
            try:
                d = yaml.safe_load(cand.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(d, Mapping) and str(d.get("id", "")).lower() == want:
                match = cand
                break
        if match is None:
            known = ", ".join(list_calibrations()) or "none"
            raise InputError("calibration", text, f"is neither a file nor a known profile; known: {known}")
        p = match
    try:
        raw = p.read_text(encoding="utf-8")
        data = yaml.safe_load(raw)  # JSON is YAML
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("calibration", text, f"cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise InputError("calibration", text, f"malformed YAML/JSON: {str(exc).splitlines()[0]}") from None
    return calibration_from_dict(data, path=str(p))


def dump_profile(data: Mapping[str, Any], path: str | Path, *, header: str = "") -> Path:
    """Write a profile as YAML (validated first, so a written file always loads)."""
    calibration_from_dict(data, path=str(path))
    make_folder("out", Path(path).parent)
    text = yaml.safe_dump(_plain(data), sort_keys=False, width=100)
    lines = "".join(f"# {ln}\n" if ln else "#\n" for ln in header.splitlines())
    return write_text("out", path, lines + text)


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, float):
        return float(f"{obj:.6g}")
    return obj
