"""Time of one op on one GPU: a roofline with achievable (not data-sheet) peaks.

``t = max(flops / (peak * eff_flops), hbm_bytes / (hbm_bytes_per_s * eff_hbm)) + overhead``
(Williams, Waterman & Patterson 2009, "Roofline").  ``eff_flops`` is the GPU's best-case
GEMM fraction (catalog ``matmul_efficiency``, measured with a brute-force shape search) times
a shape factor that is 1 for large GEMMs; attention kernels reach a lower fraction
(``catalogs/efficiency.yaml``).  Known error: a single efficiency per kind ignores shape
effects beyond the roofline (tile and wave quantisation), worth up to ~10-20% on small GEMMs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import yaml

from sim.errors import InputError
from sim.ops import Op
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
    source: str = ""

    def __post_init__(self) -> None:
        for n in ("attention_fwd_vs_matmul", "attention_bwd_vs_matmul"):
            v = getattr(self, n)
            if not 0 < v <= 1.5:
                raise InputError(f"efficiency.{n}", v, "must be in (0, 1.5]")
        if self.kernel_overhead_s < 0 or self.gemm_half_dim < 0:
            raise InputError("efficiency", self, "overheads must be >= 0")


@functools.cache
def default_efficiency() -> KernelEfficiency:
    from sim.catalog import catalog_dir

    with open(catalog_dir() / "efficiency.yaml", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    d = dict(data["default"])
    return KernelEfficiency(**{k: (v if k == "source" else float(v)) for k, v in d.items()})


@dataclass(frozen=True, slots=True)
class OpTime:
    fwd_s: float
    bwd_s: float


def matmul_efficiency(gpu: Gpu, precision: str, op: Op, eff: KernelEfficiency) -> float:
    base = gpu.achievable_matmul_fraction(precision)
    if eff.gemm_half_dim > 0 and op.kind == "matmul":
        d = min(op.m, op.n, op.k)
        base *= d / (d + eff.gemm_half_dim)
    return base


def op_time(gpu: Gpu, precision: str, op: Op, eff: KernelEfficiency) -> OpTime:
    """Forward and backward seconds of ``op`` on ``gpu``.

    ``precision`` is the GEMM precision (fp8 applies to linear layers only; attention and
    memory-bound ops run in bf16, as Transformer Engine and torchao float8 do).
    """
    hbm = gpu.hbm_bytes_per_s * gpu.hbm_efficiency
    over = eff.kernel_overhead_s
    if op.kind == "memory":
        t = op.hbm_bytes / hbm
        return OpTime(t + over, 2.0 * t + 2 * over)
    if op.kind == "attention":
        peak = gpu.peak_flops_per_s("bf16") * gpu.achievable_matmul_fraction("bf16")
        fwd = max(op.flops / (peak * eff.attention_fwd_vs_matmul), op.hbm_bytes / hbm)
        bwd = max(op.flops * op.backward_flop_factor / (peak * eff.attention_bwd_vs_matmul),
                  2 * op.hbm_bytes / hbm)
        return OpTime(fwd + over, bwd + 2 * over)
    gemm_precision = precision if op.name not in ("scores_qk", "attn_v") else "bf16"
    if gemm_precision == "fp8" and "fp8" not in gpu.dense_flops_per_s:
        gemm_precision = "bf16"
    peak = gpu.peak_flops_per_s(gemm_precision) * matmul_efficiency(gpu, gemm_precision, op, eff)
    fwd = max(op.flops / peak, op.hbm_bytes / hbm)
    bwd = max(op.flops * op.backward_flop_factor / peak, 2 * op.hbm_bytes / hbm)
    return OpTime(fwd + over, bwd + 2 * over)


def ops_time(gpu: Gpu, precision: str, ops: tuple[Op, ...], eff: KernelEfficiency) -> tuple[float, float]:
    """Summed (forward, backward) seconds of a sequence of ops executed back to back."""
    f = b = 0.0
    for op in ops:
        t = op_time(gpu, precision, op, eff)
        f += t.fwd_s
        b += t.bwd_s
    assert math.isfinite(f) and math.isfinite(b)
    return f, b
