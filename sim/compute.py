"""Time of one op on one GPU: a roofline with achievable (not data-sheet) peaks.

``t = max(flops / (peak * eff_flops), hbm_bytes / (hbm_bytes_per_s * eff_hbm)) + overhead``
(Williams, Waterman & Patterson 2009, "Roofline").  ``eff_flops`` is the GPU's best-case
GEMM fraction (catalog ``matmul_efficiency``, measured with a brute-force shape search) times
the fraction of it a training run's fixed shapes sustain (``gemm_sustained_fraction``) and a
shape factor ``d / (d + gemm_half_dim)``, both fitted (``scripts/fit_efficiency.py``);
attention kernels reach a lower fraction (``catalogs/efficiency.yaml``).  Known error: a single efficiency per kind ignores shape
effects beyond the roofline (tile and wave quantisation), worth up to ~10-20% on small GEMMs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Mapping

from sim.catalog import catalog_document
from sim.errors import InputError
from sim.records import Record
from sim.ops import BF16_GEMMS, Op
from sim.specs import Gpu


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelEfficiency:
    """Device-independent efficiency knobs (see ``catalogs/efficiency.yaml``)."""

    attention_fwd_vs_matmul: float
    attention_bwd_vs_matmul: float
    kernel_overhead_s: float
    # Shape factor: GEMMs whose smallest dimension is below ``gemm_half_dim`` lose
    # efficiency as d / (d + gemm_half_dim) (tile under-fill); 0 disables it.
    gemm_half_dim: float = 0.0
    # Dense bf16 FLOP/s per SM of the GPU the half dimension was fitted on (A100: 312e12/108).
    gemm_reference_flops_per_sm: float = 0.0
    # Fraction of the best-case (brute-force searched, short-burst) GEMM efficiency that a
    # training run's fixed-shape GEMMs sustain even when large; fitted together with
    # ``gemm_half_dim`` (scripts/fit_efficiency.py).  1 = large GEMMs reach the best case.
    gemm_sustained_fraction: float = 1.0
    # HBM traffic of element-wise (memory-bound) ops run eagerly, one kernel per op,
    # relative to the fused kernels sim/ops.py counts.
    eager_elementwise_traffic: float = 1.0
    # Host-side floor of one op (framework dispatch of the op's kernels, Python): an op whose
    # GPU time is shorter cannot finish faster than the host can issue it.  Fitted on the
    # vTrain single-node measurements (scripts/fit_efficiency.py).
    host_op_floor_s: float = 0.0
    # Fixed cost of one collective call (NCCL launch and synchronisation), seconds.
    collective_overhead_s: float = 0.0
    # Relative slowdown of compute that runs while a collective is in flight (the
    # communication kernels take SMs, L2 and HBM bandwidth); charged on the overlapped time.
    overlap_compute_slowdown: float = 0.0
    # architecture -> kernel -> (fwd, bwd) fraction of dense bf16 peak (catalogs/efficiency.yaml)
    attention_fractions: Mapping[str, Mapping[str, tuple[float, float]]] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        for n in ("attention_fwd_vs_matmul", "attention_bwd_vs_matmul"):
            v = getattr(self, n)
            if not 0 < v <= 1.5:
                raise InputError(f"efficiency.{n}", v, "must be in (0, 1.5]")
        if self.kernel_overhead_s < 0 or self.gemm_half_dim < 0:
            raise InputError("efficiency", self, "overheads must be >= 0")
        if not 0 <= self.overlap_compute_slowdown < 1:
            raise InputError("efficiency.overlap_compute_slowdown", self.overlap_compute_slowdown,
                             "must be in [0, 1)")


def _efficiency_yaml() -> Mapping:
    return catalog_document("efficiency.yaml")


@functools.cache
def default_efficiency() -> KernelEfficiency:
    """Kernel efficiency: the documented defaults plus the values ``scripts/fit_efficiency.py``
    fitted from microbenchmarks (the ``fitted`` block)."""
    return efficiency_from_catalog(include_fitted=True)


_DEFAULT_KEYS = ("attention_fwd_vs_matmul", "attention_bwd_vs_matmul", "kernel_overhead_s", "gemm_reference_flops_per_sm",
                 "eager_elementwise_traffic", "overlap_compute_slowdown")


def efficiency_from_catalog(*, include_fitted: bool) -> KernelEfficiency:
    doc = Record(_efficiency_yaml(), where="efficiency", file="efficiency.yaml")
    default = doc.mapping("default", allowed=_DEFAULT_KEYS + ("source",))
    d: dict[str, object] = {k: default.req(k) for k in _DEFAULT_KEYS}
    d["source"] = default.text("source")
    if include_fitted and doc.has("fitted"):
        fitted = doc.mapping("fitted")
        if fitted.has("gemm"):
            gemm = fitted.mapping("gemm")
            d["gemm_half_dim"] = gemm.req("gemm_half_dim")
            d["gemm_sustained_fraction"] = gemm.fraction("gemm_sustained_fraction", optional=True, default=1.0)
        if fitted.has("collective_overhead_s"):
            d["collective_overhead_s"] = fitted.req("collective_overhead_s")
        if fitted.has("host"):
            d["host_op_floor_s"] = fitted.mapping("host").req("host_op_floor_s")
    table = {}
    attention = doc.mapping("attention")
    for arch in attention.rec:
        kernels = attention.mapping(arch)
        table[arch] = {k: (kernels.mapping(k).req("fwd", positive=True), kernels.mapping(k).req("bwd", positive=True))
                       for k in kernels.rec if k not in ("source", "notes")}
    return KernelEfficiency(**d, attention_fractions=table)


def network_efficiency(scale_up_link: str | None = None) -> dict[str, float]:
    """Collective bandwidth efficiency per network tier, fitted from NCCL bus-bandwidth curves.

    ``scale_up_link`` (an NVLink generation id such as ``nvlink4``) picks that generation's own
    fitted NVLink efficiency when the microbenchmarks have one; otherwise the median across
    generations applies.
    """
    fitted = _efficiency_yaml().get("fitted") or {}
    out: dict[str, float] = {}
    if "scale_up" in fitted:
        su = fitted["scale_up"]
        out["scale-up"] = float(su["bandwidth_efficiency"])
        for key, value in (su.get("per_generation") or {}).items():
            if scale_up_link and key.endswith("-" + scale_up_link):
                out["scale-up"] = float(value)
    if "scale_out" in fitted:
        out["scale-out"] = float(fitted["scale_out"]["bandwidth_efficiency"])
    return out


def network_size_curves() -> dict[str, object]:
    """Per tier, the ``sim.network.SizeCurve`` fitted from NCCL bus-bandwidth curves: the
    fraction of the large-message bandwidth a collective reaches at each chunk size."""
    from sim.network import SizeCurve

    fitted = _efficiency_yaml().get("fitted") or {}
    return {tier: SizeCurve(points) for tier, points in (fitted.get("size_curves") or {}).items()}


def network_kwargs(scale_up_link: str | None = None) -> dict[str, object]:
    """Keyword arguments of the calibrated ``sim.network.Network``: large-message efficiency
    per tier (``network_efficiency``) and the size curves (``network_size_curves``)."""
    return {"bandwidth_efficiency": network_efficiency(scale_up_link), "size_curves": network_size_curves()}


@dataclass(frozen=True, slots=True)
class OpTime:
    fwd_s: float
    bwd_s: float


def gemm_half_dim(gpu: Gpu, precision: str, eff: KernelEfficiency) -> float:
    """The GEMM dimension at which the shape factor halves efficiency, on ``gpu``.

    Fitted on A100 (``catalogs/efficiency.yaml``) and scaled by throughput per SM: the fixed
    cycles of a tile (prologue, pipeline fill, epilogue) weigh more on an SM that finishes its
    main loop faster, so a faster SM needs proportionally deeper/larger problems (an
    assumption, not a fit: no layer timings on other GPUs are in the microbenchmarks).
    """
    if eff.gemm_half_dim <= 0 or not gpu.num_sms or not eff.gemm_reference_flops_per_sm:
        return eff.gemm_half_dim
    per_sm = gpu.peak_flops_per_s(precision) / gpu.num_sms
    return eff.gemm_half_dim * per_sm / eff.gemm_reference_flops_per_sm


def matmul_efficiency(gpu: Gpu, precision: str, op: Op, eff: KernelEfficiency) -> float:
    base = gpu.achievable_matmul_fraction(precision)
    if op.kind == "matmul":
        base *= eff.gemm_sustained_fraction
    if eff.gemm_half_dim > 0 and op.kind == "matmul":
        d = min(op.m, op.n, op.k)
        base *= d / (d + gemm_half_dim(gpu, precision, eff))
    return base


def op_time(gpu: Gpu, precision: str, op: Op, eff: KernelEfficiency, *, eager: bool = False) -> OpTime:
    """Forward and backward seconds of ``op`` on ``gpu``.

    ``precision`` is the GEMM precision (fp8 applies to linear layers only; attention and
    memory-bound ops run in bf16, as Transformer Engine and torchao float8 do).
    """
    hbm = gpu.hbm_bytes_per_s * gpu.hbm_efficiency
    over = eff.kernel_overhead_s
    floor = eff.host_op_floor_s
    if op.kind == "memory":
        t = op.hbm_bytes / hbm * (eff.eager_elementwise_traffic if eager else 1.0)
        return OpTime(max(t, floor) + over, max(op.backward_bytes_factor * t, 2 * floor) + 2 * over)
    if op.kind == "attention":
        frac = eff.attention_fractions.get(gpu.architecture, {}).get(op.kernel or "flash")
        if frac is None:
            m = gpu.achievable_matmul_fraction("bf16")
            frac = (m * eff.attention_fwd_vs_matmul, m * eff.attention_bwd_vs_matmul)
        peak = gpu.peak_flops_per_s("bf16")
        fwd = max(op.flops / (peak * frac[0]), op.hbm_bytes / hbm, floor)
        bwd = max(op.flops * op.backward_flop_factor / (peak * frac[1]), 2 * op.hbm_bytes / hbm, 2 * floor)
        return OpTime(fwd + over, bwd + 2 * over)
    # fp8 applies to linear layers; attention batched GEMMs, router and output layer stay bf16
    gemm_precision = "bf16" if op.name in BF16_GEMMS else precision
    if gemm_precision == "fp8" and "fp8" not in gpu.dense_flops_per_s:
        gemm_precision = "bf16"
    peak = gpu.peak_flops_per_s(gemm_precision) * matmul_efficiency(gpu, gemm_precision, op, eff)
    fwd = max(op.flops / peak, op.hbm_bytes / hbm, floor)
    bwd = max(op.flops * op.backward_flop_factor / peak, 2 * op.hbm_bytes / hbm, 2 * floor)
    return OpTime(fwd + over, bwd + 2 * over)


def ops_time(gpu: Gpu, precision: str, ops: tuple[Op, ...], eff: KernelEfficiency, *,
             eager: bool = False) -> tuple[float, float]:
    """Summed (forward, backward) seconds of a sequence of ops executed back to back."""
    f = b = 0.0
    for op in ops:
        t = op_time(gpu, precision, op, eff, eager=eager)
        f += t.fwd_s
        b += t.bwd_s
    assert math.isfinite(f) and math.isfinite(b)
    return f, b
