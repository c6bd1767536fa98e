"""Synthetic GPU measurements with known answers, generated through the simulator's own formulas.

``Truth`` holds the constants a profile should recover (GEMM efficiency and half dimension,
attention fractions, HBM bandwidth, kernel overhead, host floor, the intra- and inter-node
links and the per-collective overhead, the host memory rate and the host<->device copies).  ``records`` turns them into microbenchmark records
exactly as the simulator would time those benchmarks: compute through
``sim.layers.compute.op_time`` on the truth's device and efficiency knobs, collectives through
``sim.net.network.Network`` on a cluster shaped like the measured job (each rank with its own NIC)
plus the per-call overhead.  ``validate.profile.fit_profile`` on these records must give the
constants back (``tests/test_validate_synthetic.py``), and the profile must predict what the
truth predicts (``planner simulate --calibration``).

No torch here.  Units: seconds, bytes, FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from validate.fit import ELEMENT_BYTES, attention_hbm_bytes
from validate.layouts import group_layouts, pp_pairs, tier
from validate.specs import HOST_COPY_PATHS, STREAM_BUFFERS, MicrobenchConfig


@dataclass(frozen=True, slots=True)
class Truth:
    """Known constants of a synthetic H200-class node."""

    base_gpu: str = "h200-141gb"
    matmul_fraction: float = 0.72  # achieved large-GEMM FLOP/s over the data-sheet bf16 peak
    gemm_half_dim: float = 256.0
    attention_fwd_vs_matmul: float = 0.60
    attention_bwd_vs_matmul: float = 0.47
    hbm_bytes_per_s: float = 4.0e12
    kernel_overhead_s: float = 2.0e-6
    host_op_floor_s: float = 6.0e-6
    intra_bytes_per_s: float = 3.6e11
    intra_latency_s: float = 3.0e-6
    inter_bytes_per_s: float = 4.6e10
    inter_latency_s: float = 9.0e-6
    collective_overhead_s: float = 1.2e-5
    # Host side (arbitrary known answers of PCIe Gen5-like size, not a hardware claim):
    # the host's sustained memory rate over all its ranks, and per-rank copies (bytes/s, s).
    host_mem_bytes_per_s: float = 3.2e11
    h2d_pinned: tuple[float, float] = (5.5e10, 7.0e-6)
    d2h_pinned: tuple[float, float] = (5.2e10, 8.0e-6)
    h2d_pageable: tuple[float, float] = (1.8e10, 2.5e-5)
    d2h_pageable: tuple[float, float] = (1.4e10, 3.0e-5)

    def gpu(self):  # -> sim.data.hardware.Gpu
        """The base GPU with the truth's efficiencies (what the profile's device must equal)."""
        from sim.data.catalog import get_gpu

        g = get_gpu(self.base_gpu)
        # the scale-up bandwidth of a cluster is its GPU's NVLink figure (sim.net.topology)
        return replace(g, matmul_efficiency=type(g.matmul_efficiency)({**g.matmul_efficiency,
                                                                       "bf16": self.matmul_fraction}),
                       hbm_efficiency=self.hbm_bytes_per_s / g.hbm_bytes_per_s,
                       nvlink_bytes_per_s_per_direction=self.intra_bytes_per_s)

    def efficiency(self):  # -> sim.layers.compute.KernelEfficiency
        """The catalog's knobs with the truth's, as ``Calibration.apply_efficiency`` sets them."""
        from sim.layers.compute import default_efficiency

        g = self.gpu()
        eff = default_efficiency()
        frac = (self.matmul_fraction * self.attention_fwd_vs_matmul, self.matmul_fraction * self.attention_bwd_vs_matmul)
        return replace(eff, kernel_overhead_s=self.kernel_overhead_s, host_op_floor_s=self.host_op_floor_s,
                       gemm_half_dim=self.gemm_half_dim, gemm_reference_flops_per_sm=0.0, gemm_sustained_fraction=1.0,
                       attention_fwd_vs_matmul=self.attention_fwd_vs_matmul,
                       attention_bwd_vs_matmul=self.attention_bwd_vs_matmul,
                       collective_overhead_s=self.collective_overhead_s,
                       attention_fractions={**eff.attention_fractions,
                                            g.architecture: {"flash": frac, "flash2": frac}},
                       gemm_sustained_by_arch={a: v for a, v in eff.gemm_sustained_by_arch.items()
                                               if a != g.architecture},
                       sustained_clock_by_arch={a: v for a, v in eff.sustained_clock_by_arch.items()
                                                if a != g.architecture},
                       attention_curves={a: c for a, c in eff.attention_curves.items() if a != g.architecture})

    def links(self):  # -> (scale-up Link, NIC Link)
        from sim.data.hardware import Link

        return (Link(id="truth-su", name="truth", kind="scale-up", bytes_per_s_per_direction=self.intra_bytes_per_s,
                     latency_s=self.intra_latency_s),
                Link(id="truth-nic", name="truth", kind="nic", bytes_per_s_per_direction=self.inter_bytes_per_s,
                     latency_s=self.inter_latency_s))

    def cluster(self, num_gpus: int, gpus_per_node: int):  # -> sim.data.hardware.Cluster
        """The truth's machine: every GPU of a node on the scale-up link, one NIC per GPU."""
        from sim.data.hardware import Cluster

        su, nic = self.links()
        return Cluster(gpu=self.gpu(), num_gpus=num_gpus, nic=nic, gpus_per_node=gpus_per_node,
                       nvlink_domain=gpus_per_node, nics_per_node=gpus_per_node, scale_up=su)


def compute_records(truth: Truth, cfg: MicrobenchConfig | None = None) -> list[dict]:
    """Overhead, GEMM, attention and memory-bound records as ``sim.layers.compute.op_time`` times them."""
    from sim.layers.compute import op_time
    from sim.layers.ops import Op, _gemm, _mem

    cfg = cfg or MicrobenchConfig.gpu(quick=False)
    gpu, eff = truth.gpu(), truth.efficiency()
    o, f = truth.kernel_overhead_s, truth.host_op_floor_s
    recs: list[dict] = [
        {"kind": "overhead", "op": "queued_add", "time_s": o},  # a no-work kernel, stream full
        {"kind": "overhead", "op": "eager_add", "time_s": op_time(gpu, "bf16", _mem("add", 0.0), eff).fwd_s},
    ]
    for m, n, k in cfg.matmul_shapes:
        t = op_time(gpu, "bf16", _gemm("mm", m, n, k), eff).fwd_s
        recs.append({"kind": "matmul", "dtype": "bf16", "m": m, "n": n, "k": k, "flops": 2.0 * m * n * k, "time_s": t})
    for b, a, s, d in cfg.attention_shapes:
        r = {"kind": "attention", "dtype": "bf16", "batch": b, "heads": a, "seq": s, "head_dim": d,
             "flops": 2.0 * b * a * s * s * d}
        ot = op_time(gpu, "bf16", Op("attention", "attention", r["flops"], attention_hbm_bytes(r), m=s, n=s, k=d,
                                        batch=b * a, kernel="flash"), eff)
        recs.append({**r, "fwd_time_s": ot.fwd_s, "bwd_time_s": ot.bwd_s})
    elt = ELEMENT_BYTES["bf16"]
    for numel in cfg.memory_numel:
        nbytes = 2.0 * numel * elt
        recs.append({"kind": "memory", "op": "copy", "dtype": "bf16", "numel": numel, "bytes": nbytes,
                     "time_s": op_time(gpu, "bf16", _mem("copy", nbytes), eff).fwd_s})
    assert f >= 0
    return recs


def collective_records(truth: Truth, world: int, ranks_per_node: int, cfg: MicrobenchConfig | None = None) -> list[dict]:
    """Every layout of ``validate.layouts`` at every size: ``Network.collective_time_s`` on
    the truth's cluster (measured links: efficiency 1, no size curve) plus the per-call overhead."""
    from sim.net.network import Network

    from validate.fit_links import predict_collective

    cfg = cfg or MicrobenchConfig.gpu(quick=False)
    net = Network(truth.cluster(world, ranks_per_node))
    c = truth.collective_overhead_s
    out: list[dict] = []
    for name, groups in group_layouts(world, ranks_per_node):
        n = len(groups[0])
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            for size in cfg.message_bytes:
                rec = {"kind": "collective", "op": op, "layout": name, "group_size": n, "num_groups": len(groups),
                       "ranks": groups[0], "groups": groups, "tier": tier(groups[0], ranks_per_node),
                       "message_bytes": float(max(n, size // 4 // n * n) * 4)}
                rec["time_s"] = predict_collective(net, rec) + c
                out.append(rec)
    for name, pairs in pp_pairs(world, ranks_per_node):
        for size in cfg.message_bytes:
            rec = {"kind": "collective", "op": "send_recv", "layout": name, "group_size": 2, "num_groups": len(pairs),
                   "ranks": list(pairs[0]), "groups": [list(p) for p in pairs], "tier": tier(pairs[0], ranks_per_node),
                   "message_bytes": float(size)}
            rec["time_s"] = predict_collective(net, rec) + c
            out.append(rec)
    return out


def host_records(truth: Truth, ranks_per_node: int, cfg: MicrobenchConfig | None = None, *,
                 copies: bool = True) -> list[dict]:
    """``validate.hostbench`` records of the truth's host: STREAM copy and triad with every rank
    at an equal share of the host's rate, and (``copies``) every copy path as
    ``latency + bytes / bandwidth``; without ``copies`` the paths are recorded as not measured,
    as on a host without CUDA."""
    cfg = cfg or MicrobenchConfig.gpu(quick=False)
    out: list[dict] = []
    for size in cfg.host_memory_bytes:
        for op, buffers in STREAM_BUFFERS.items():
            nbytes = float(buffers * size)
            out.append({"kind": "host_memory", "op": op, "dtype": "fp32", "buffer_bytes": float(size), "bytes": nbytes,
                        "time_s": nbytes * ranks_per_node / truth.host_mem_bytes_per_s,
                        "host_bytes_per_s": truth.host_mem_bytes_per_s, "ranks_per_host": ranks_per_node,
                        "threads_per_rank": 4})
    for direction, pinned in HOST_COPY_PATHS:
        if not copies:
            out.append({"kind": "host_copy", "direction": direction, "pinned": pinned, "measured": False,
                        "reason": "no CUDA device (synthetic)"})
            continue
        bw, lat = getattr(truth, f"{direction}_{'pinned' if pinned else 'pageable'}")
        out += [{"kind": "host_copy", "direction": direction, "pinned": pinned, "measured": True, "bytes": float(n),
                 "time_s": lat + n / bw, "concurrent_ranks": ranks_per_node} for n in cfg.host_copy_bytes]
    return out


def environment(world: int, ranks_per_node: int, *, device_name: str = "NVIDIA H200",
                memory_bytes: float = 150_000_000_000.0) -> dict:
    """A measurement environment as ``validate.runtime.describe`` records it on a GPU node."""
    return {"device_type": "cuda", "device_name": device_name, "device_memory_bytes": memory_bytes,
            "world_size": world, "local_world_size": ranks_per_node, "num_nodes": max(1, world // ranks_per_node),
            "host_cores": 64, "threads_per_rank": 4, "backend": "nccl", "hostname": "synthetic",
            "torch": "2.13.0+cu128", "cuda": "12.8", "cudnn": 91002, "nccl": "2.27.3",
            "tf32": {"matmul_allow_tf32": False, "cudnn_allow_tf32": True, "float32_matmul_precision": "highest"},
            "device_capability": "9.0", "date": "2026-01-01T00:00:00+00:00"}


def records(truth: Truth, world: int, ranks_per_node: int, cfg: MicrobenchConfig | None = None, *,
            host: bool = True) -> list[dict]:
    """Compute, host (``host``) and collective records of one synthetic microbenchmark job."""
    return (compute_records(truth, cfg) + (host_records(truth, ranks_per_node, cfg) if host else [])
            + (collective_records(truth, world, ranks_per_node, cfg) if world > 1 else []))
