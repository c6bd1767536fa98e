"""Offloading to the host: the node's host side, the rates and the volumes (docs/offload.md).

Three mechanisms (``Strategy.offload``), each priced per stage by ``sim.cost.step.stage_pieces`` and
held in memory by ``sim.cost.memory.stage_memory`` from the numbers here:

* **optimizer** (ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840, Sec. 4): the fp32 master
  weights, Adam moments and gradients of the GPU's shard live on the host; the shard's fp16
  gradients go to the host during the backward (``2 B`` per parameter), the Adam step runs on
  the CPU (memory-bound, ``cpu_optimizer_s_per_param``) and the updated fp16 weights come back
  (``2 B``) before the next forward: ``2M + 2M`` bytes per step for ``M`` parameters.  The
  one-step delayed parameter update (DPU, Sec. 4.2) is not modelled: the step waits for the
  CPU and the copy back, as DeepSpeed does by default.
* **params** (ZeRO-Infinity, Rajbhandari et al. 2021, arXiv:2104.07857, Sec. 4-5; FSDP
  ``CPUOffload(offload_params=True)``): the weights live on the host as well; every forward and
  every backward loads the shard of each layer over the host link before its all-gather
  (``2 B`` each), the gradient shard goes back after its reduce-scatter (``2 B``), per
  micro-batch: ``3 x 2M`` bytes per micro-batch over the data-parallel group (Sec. 4's
  "parameters loaded twice, gradients written once").
* **activations**: each layer's saved activations go to host memory in the forward and come
  back in the backward (ZeRO-Infinity's activation-checkpoint offload, Megatron-Core's
  fine-grained activation offloading), hidden behind the layers' compute where the link allows.

The host link of a GPU is its PCIe x16 slot (``catalogs/links.yaml`` ``pcie<gen>``, the GPU's
``pcie_generation``) at the achievable copy-engine fraction, full duplex, its own unless
``HostSpec.gpus_per_host_link`` says GPUs share one; copies run on copy engines and do not slow
the compute under them.  With ``offload_device=nvme`` the model states stream through the
node's NVMe drives, shared by its GPUs.  Host-side numbers: ``catalogs/offload.yaml``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from sim.data.catalog import catalog_document, file_version
from sim.net.fabric import pcie_x16_bytes_per_s
from sim.base.records import Record
from sim.data.hostspecs import HostCalibration, HostSpec
from sim.data.hardware import Cluster
from sim.data.specs import Strategy

_GIGA, _TERA = 1e9, 1e12


@dataclass(frozen=True, kw_only=True, slots=True)
class OffloadConstants:
    """``catalogs/offload.yaml``: bytes moved and held per parameter, CPU Adam's traffic."""

    grad_bytes_per_param: float  # over the host link, gradient shard to the host
    param_bytes_per_param: float  # over the host link, weights to the GPU
    host_optimizer_bytes_per_param: float  # fp32 master, momentum, variance
    host_gradient_bytes_per_param: float  # fp32 gradient for CPU Adam
    host_weight_bytes_per_param: float  # 16-bit weight copy
    cpu_adam_bytes_per_param: float
    cpu_adam_flops_per_param: float
    nvme_optimizer_bytes_per_param: float

    @property
    def host_bytes_per_param(self) -> float:
        return self.host_optimizer_bytes_per_param + self.host_gradient_bytes_per_param + self.host_weight_bytes_per_param


@dataclass(frozen=True, kw_only=True, slots=True)
class _Defaults:
    constants: OffloadConstants
    dram_bytes: float
    mem_bytes_per_s: float
    adam_params_per_s: float
    adam_efficiency: float  # achieved fraction of the CPU's vector FP32 peak in CPU Adam
    pcie_copy_efficiency: float
    gpus_per_host_link: int
    nvme_bytes: float
    nvme_bytes_per_s: float
    source: str


def offload_constants() -> OffloadConstants:
    return _defaults().constants


def _defaults() -> _Defaults:
    return _load(file_version("offload.yaml"))


@functools.cache
def _load(_version: tuple[str, int, int]) -> _Defaults:
    doc = Record(catalog_document("offload.yaml"), where="offload", file="offload.yaml")
    h = doc.mapping("host")
    t, m, a = doc.mapping("transfers"), doc.mapping("host_memory"), doc.mapping("cpu_adam")
    c = OffloadConstants(grad_bytes_per_param=t.req("grad_bytes_per_param", positive=True),
                         param_bytes_per_param=t.req("param_bytes_per_param", positive=True),
                         host_optimizer_bytes_per_param=m.req("optimizer_bytes_per_param", positive=True),
                         host_gradient_bytes_per_param=m.req("gradient_bytes_per_param"),
                         host_weight_bytes_per_param=m.req("weight_bytes_per_param"),
                         cpu_adam_bytes_per_param=a.req("bytes_per_param", positive=True),
                         cpu_adam_flops_per_param=a.req("flops_per_param", positive=True),
                         nvme_optimizer_bytes_per_param=a.req("nvme_bytes_per_param", positive=True))
    flops = h.req("cpu_fp32_tflops", positive=True) * _TERA * h.fraction("cpu_adam_efficiency")
    return _Defaults(constants=c, dram_bytes=h.req("dram_gb", positive=True) * _GIGA,
                     mem_bytes_per_s=h.req("mem_gb_per_s", positive=True) * _GIGA * h.fraction("mem_efficiency"),
                     adam_params_per_s=flops / c.cpu_adam_flops_per_param,
                     adam_efficiency=h.fraction("cpu_adam_efficiency"),
                     pcie_copy_efficiency=h.fraction("pcie_copy_efficiency"),
                     gpus_per_host_link=h.integer("gpus_per_host_link"),
                     nvme_bytes=h.req("nvme_tb", positive=True) * _TERA,
                     nvme_bytes_per_s=h.req("nvme_gb_per_s", positive=True) * _GIGA, source=h.text("source"))


def default_host(cluster: Cluster) -> HostSpec:
    """The catalog's host defaults for ``cluster``'s nodes: the host link is the GPU's PCIe
    generation at the achievable copy fraction."""
    d = _defaults()
    link = pcie_x16_bytes_per_s(cluster.gpu.pcie_generation) * d.pcie_copy_efficiency
    return HostSpec(host_dram_bytes=d.dram_bytes, host_mem_bytes_per_s=d.mem_bytes_per_s,
                    host_adam_params_per_s=d.adam_params_per_s, host_link_bytes_per_s=link,
                    nvme_bytes=d.nvme_bytes, nvme_bytes_per_s=d.nvme_bytes_per_s,
                    gpus_per_host_link=d.gpus_per_host_link, source=d.source)


def server_host(cluster: Cluster) -> HostSpec:
    """The host of a node of PCIe cards, read off its server (``Cluster.server``): its DRAM
    (the design's, else the catalog default), its sockets' sustained memory bandwidth and
    vector FP32 peak (``catalogs/hosts.yaml``; the catalog default where a CPU record has no
    peak), and each GPU's host link: its slot at the achievable copy fraction, shared with the
    other GPUs of its PCIe switch where the switch's uplink is the narrower (the worst GPU
    sets the rate: every GPU copies at once).  NVMe stays the catalog default (designs do not
    name their drives)."""
    srv = cluster.server
    assert srv is not None
    d = _defaults()
    per_gpu, shared, link = srv.gpu_link_bytes_per_s, 1, srv.gpu_link_bytes_per_s
    for k, uplink in enumerate(srv.switch_uplink_bytes_per_s):
        n = srv.gpu_switch.count(k)
        if n and uplink / n < per_gpu:
            per_gpu, shared, link = uplink / n, n, uplink
    flops = srv.cpu.fp32_flops_per_s * srv.sockets * d.adam_efficiency
    return HostSpec(host_dram_bytes=srv.host_dram_bytes or d.dram_bytes,
                    host_mem_bytes_per_s=srv.dram_bytes_per_s * srv.sockets,
                    host_adam_params_per_s=(flops / d.constants.cpu_adam_flops_per_param if flops > 0
                                            else d.adam_params_per_s),
                    host_link_bytes_per_s=link * d.pcie_copy_efficiency, gpus_per_host_link=shared,
                    nvme_bytes=d.nvme_bytes, nvme_bytes_per_s=d.nvme_bytes_per_s,
                    source=f"server {srv.design} ({srv.sockets} x {srv.cpu.id}); NVMe: {d.source}")


def host_spec(cluster: Cluster) -> HostSpec:
    """The one host of ``cluster``'s nodes that offloading and every host-side cost read:
    ``cluster.host`` when set (a node-level override such as ``--host-dram-gib``, or a
    calibration profile's measured rates, ``measured_host``), else the server's for PCIe cards
    (``server_host``), else the catalog defaults (``default_host``)."""
    if cluster.host is not None:
        return cluster.host
    return server_host(cluster) if cluster.server is not None else default_host(cluster)


def measured_host(host: HostSpec, measured: HostCalibration) -> HostSpec:
    """``host`` with a calibration profile's measured rates (``sim.cost.calibration``): the host
    memory bandwidth (STREAM triad) and the host link at the slower of the measured pinned
    (else pageable) host-to-device and device-to-host copy rates, per GPU (each rank copied
    over its own link while measuring)."""
    changes: dict[str, object] = {}
    if measured.host_mem_bytes_per_s is not None:
        changes["host_mem_bytes_per_s"] = measured.host_mem_bytes_per_s
    rates = [r for r in (measured.h2d_bytes_per_s, measured.d2h_bytes_per_s) if r is not None]
    if rates:
        changes.update(host_link_bytes_per_s=min(rates), gpus_per_host_link=1)
    if not changes:
        return host
    return replace(host, **changes, source=f"measured ({', '.join(sorted(changes))}); else {host.source}")


def with_host(cluster: Cluster, **changes: float) -> Cluster:
    """``cluster`` with its host's fields changed (a node-level override, e.g. the CLI's
    ``--host-dram-gib``)."""
    return replace(cluster, host=replace(host_spec(cluster), **changes))


@dataclass(frozen=True, kw_only=True, slots=True)
class OffloadRates:
    """What one GPU's offload moves and at which rates (seconds per byte or per parameter).

    ``link_bytes_per_s``: its host link, per direction; ``state_bytes_per_s``: where offloaded
    weights stream from (the host link, or its share of the node's NVMe when it is slower);
    ``cpu_optimizer_s_per_param``: CPU Adam seconds per parameter of the GPU's shard, with every
    GPU of the node stepping at once on the node's memory bandwidth and cores (and, on NVMe,
    its drives)."""

    link_bytes_per_s: float
    state_bytes_per_s: float
    cpu_optimizer_s_per_param: float
    grad_bytes_per_param: float
    param_bytes_per_param: float


def offload_rates(cluster: Cluster, device: str = "cpu") -> OffloadRates:
    host, c = host_spec(cluster), offload_constants()
    gpn = min(cluster.gpus_per_node, cluster.num_gpus)
    link = host.link_bytes_per_s_per_gpu
    cpu = max(c.cpu_adam_bytes_per_param / host.host_mem_bytes_per_s, 1.0 / host.host_adam_params_per_s)
    state = link
    if device == "nvme":
        state = min(link, host.nvme_bytes_per_s / gpn)
        cpu = max(cpu, c.nvme_optimizer_bytes_per_param / host.nvme_bytes_per_s)
    return OffloadRates(link_bytes_per_s=link, state_bytes_per_s=state, cpu_optimizer_s_per_param=cpu * gpn,
                        grad_bytes_per_param=c.grad_bytes_per_param, param_bytes_per_param=c.param_bytes_per_param)


@dataclass(frozen=True, slots=True)
class OffloadBytes:
    """Bytes one GPU moves over its host link (floats or arrays): the weight shard in before each
    forward and each backward pass (``params``), the gradient shard out per micro-batch
    (``params``; ZeRO-3 ``optimizer``) or per step (ZeRO-1/2 ``optimizer``), the updated weight
    shard back per step (``optimizer`` with the weights on the GPU), the saved activations out
    in the forward and back in the backward of every micro-batch."""

    weights_in_per_pass: object
    grads_out_per_microbatch: object
    grads_out_per_step: object
    weights_back_per_step: object
    activations_per_microbatch: object

    def per_step(self, microbatches: object) -> tuple[object, object]:
        """(host-to-device, device-to-host) bytes of one step of ``microbatches``."""
        m = microbatches
        h2d = m * (2 * self.weights_in_per_pass + self.activations_per_microbatch) + self.weights_back_per_step
        d2h = m * (self.grads_out_per_microbatch + self.activations_per_microbatch) + self.grads_out_per_step
        return h2d, d2h


def offload_bytes(local_params: object, act_bytes: object, *, zero: object, offload_optimizer: object,
                  offload_params: object, offload_activations: object, rates: OffloadRates) -> OffloadBytes:
    """``OffloadBytes`` of a GPU holding a shard of ``local_params`` parameters whose stage saves
    ``act_bytes`` of activations per micro-batch (module docstring; arrays broadcast)."""
    z3 = np.asarray(zero) >= 3
    oo, op, oa = np.asarray(offload_optimizer), np.asarray(offload_params), np.asarray(offload_activations)
    g = local_params * rates.grad_bytes_per_param
    w = local_params * rates.param_bytes_per_param
    return OffloadBytes(weights_in_per_pass=np.where(op, w, 0.0), grads_out_per_microbatch=np.where(op | (oo & z3), g, 0.0),
                        grads_out_per_step=np.where(oo & ~z3, g, 0.0), weights_back_per_step=np.where(oo & ~op, w, 0.0),
                        activations_per_microbatch=np.where(oa, act_bytes, 0.0))


def strategy_rates(cluster: Cluster, s: Strategy) -> OffloadRates | None:
    """``offload_rates`` of ``s``'s device, or None when ``s`` offloads nothing."""
    return None if s.offload == "none" else offload_rates(cluster, s.offload_device)
