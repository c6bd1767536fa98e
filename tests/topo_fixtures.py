"""Hand-built hardware for topology, placement and collective tests (no catalog needed).

Values are plausible public numbers (per direction): A100 SXM NVLink 3 300 GB/s in an
8-GPU NVSwitch domain, PCIe 4; H100 SXM NVLink 4 450 GB/s, PCIe 5; GB200 NVL72 (72-GPU domain
over 18 nodes of 4), NVLink 5 900 GB/s; HDR InfiniBand 25 GB/s, NDR 50 GB/s, 1.5 us.
"""

from __future__ import annotations

from sim.data.hardware import Cluster, Gpu, Link
from sim.data.specs import Strategy


def make_gpu(*, id: str = "a100-test", nvlink_bytes_per_s: float = 300e9, domain: int = 8,
             gpus_per_node: int = 8, nics_per_node: int = 8, pcie_generation: int = 4,
             nvlink_generation: str = "3") -> Gpu:
    return Gpu(id=id, name=id, dense_flops_per_s={"bf16": 312e12}, hbm_bytes=80e9, hbm_bytes_per_s=2.0e12,
               nvlink_bytes_per_s_per_direction=nvlink_bytes_per_s, nvlink_domain_size=domain,
               nvlink_generation=nvlink_generation, pcie_generation=pcie_generation, tdp_w=400.0,
               gpus_per_node=gpus_per_node, nics_per_node=nics_per_node, default_nic="hdr-test",
               matmul_efficiency={"bf16": 0.8}, hbm_efficiency=0.9)


def make_nic(*, bytes_per_s: float = 25e9, latency_s: float = 1.5e-6, radix: int | None = 40,
             id: str = "hdr-test") -> Link:
    return Link(id=id, name=id, kind="nic", bytes_per_s_per_direction=bytes_per_s, latency_s=latency_s,
                technology="infiniband", switch_radix=radix)


A100 = make_gpu()
H100 = make_gpu(id="h100-test", nvlink_bytes_per_s=450e9, pcie_generation=5, nvlink_generation="4")
GB200 = make_gpu(id="gb200-test", nvlink_bytes_per_s=900e9, domain=72, gpus_per_node=4, nics_per_node=4,
                 pcie_generation=6, nvlink_generation="5")
HDR = make_nic()
NDR = make_nic(bytes_per_s=50e9, id="ndr-test", radix=64)


def make_cluster(num_gpus: int = 16, *, gpu: Gpu = A100, nic: Link = HDR, gpus_per_node: int | None = None,
                 nvlink_domain: int | None = None, nics_per_node: int | None = None,
                 topology: str = "fat-tree", oversubscription: float = 1.0, tree_levels: int = 2) -> Cluster:
    gpn = gpus_per_node or gpu.gpus_per_node
    return Cluster(gpu=gpu, num_gpus=num_gpus, nic=nic, gpus_per_node=gpn,
                   nvlink_domain=nvlink_domain or gpu.nvlink_domain_size,
                   nics_per_node=nics_per_node if nics_per_node is not None else gpu.nics_per_node,
                   topology=topology, oversubscription=oversubscription, tree_levels=tree_levels)


def make_strategy(*, tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, ep: int = 1) -> Strategy:
    return Strategy(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, gbs=dp)
