"""Fit the compute part of a calibration profile from microbenchmark records.

Each parameter is fitted in the form the simulator evaluates it.  ``sim.layers.compute.op_time``
times an op as ``max(work, host_op_floor_s) + kernel_overhead_s`` (backward: ``2 floor``,
``2 overhead``), ``work`` being the larger of the compute time and the memory roofline
``hbm_bytes / W``.  The fits invert that form exactly:

* per-kernel overhead ``o``: GPU seconds of a no-work kernel with the stream full
  (``queued_add``; on a CPU the op itself, ``tiny_add``);
* host floor ``f``: the host's per-op dispatch time (``eager_add``) minus ``o``; 0 on a CPU,
  whose ops run on the host (``kernel_overhead_s`` is the whole per-op cost);
* memory-bound kernels (copy, add, GELU, LayerNorm): ``t = o + bytes / W`` on tensors of at
  least 1 MiB, ``W`` the geometric mean of ``bytes / (t - o)``;
* GEMM: ``t = o + F / (P * d / (d + h))``, ``d = min(M, N, K)`` (``sim.layers.compute``'s shape
  factor); ``(t - o) / F = 1/P + (h/P) / d`` is linear in ``1/d``, solved by least squares on
  relative errors; ``P`` is the achievable FLOP/s, ``h`` the ``gemm_half_dim``;
* attention: ``F / ((t - o) P)`` forward and ``2.5 F / ((t - 2o) P)`` backward (the
  simulator's causal FLOP count and backward factor), geometric means over shapes.

A measurement says something about a parameter only when its time is above the bounds the
other parameters set: a point within ``BOUND_MARGIN`` of the host floor or of the memory
roofline is left out of that fit (and counted as ``bound_points``), never clamped.

No torch here: this runs anywhere the simulator runs.  Links: ``validate.fit_links``;
assembling the profile: ``validate.profile``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from sim.data.conventions import conventions

MIN_POINTS = 2
BOUND_MARGIN = 1.05
"""A point is informative about the work term when ``t - o`` exceeds every other bound by 5%."""
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
MEMORY_MIN_BYTES = 1 << 20
"""Memory-bound kernels on tensors below 1 MiB are launch-bound (and cache-resident on CPUs);
the bandwidth is fitted on the larger ones, where training activations live."""


class FitError(ValueError):
    """Not enough (or inconsistent) data to fit a parameter."""


@dataclass(frozen=True, slots=True)
class LineFit:
    """``y = a + b x`` by weighted least squares; ``rms_rel`` the RMS relative residual."""

    a: float
    b: float
    rms_rel: float
    n: int


def weighted_line(x: Sequence[float], y: Sequence[float], *, nonneg_slope: bool = True,
                  nonneg_intercept: bool = False) -> LineFit:
    """Fit ``y = a + b x`` minimising relative residuals ``(a + b x - y) / y``.

    With ``nonneg_slope`` a negative slope is clamped to 0 and ``a`` refitted (the weighted
    mean), which is the constrained optimum for a two-parameter line; with
    ``nonneg_intercept`` a negative intercept is clamped to 0 and ``b`` refitted through the
    origin (the same argument), as for a latency.
    """
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(xa) < 1 or len(xa) != len(ya) or np.any(ya <= 0):
        raise FitError("weighted_line needs matching, positive y values")
    w = 1.0 / ya
    if len(xa) >= 2 and np.ptp(xa) > 0:
        A = np.stack([np.ones_like(xa), xa], axis=1) * w[:, None]
        (a, b), *_ = np.linalg.lstsq(A, ya * w, rcond=None)
    else:
        a, b = float(np.sum(w * w * ya) / np.sum(w * w)), 0.0
    if nonneg_slope and b < 0:
        a, b = float(np.sum(w * w * ya) / np.sum(w * w)), 0.0
    if nonneg_intercept and a < 0 and np.any(xa != 0):
        a, b = 0.0, float(np.sum(w * w * xa * ya) / np.sum(w * w * xa * xa))
    res = (a + b * xa - ya) / ya
    return LineFit(float(a), float(b), float(np.sqrt(np.mean(res**2))), len(xa))


def _overhead_record(records: Iterable[dict], op: str) -> float | None:
    for r in records:
        if r.get("kind") == "overhead" and r.get("op") == op:
            return float(r["time_s"])
    return None


def fit_overhead(records: Iterable[dict]) -> float:
    """Seconds per kernel (``kernel_overhead_s``): a no-work kernel with the stream full on a
    GPU (``queued_add``), the one-element add itself on a CPU (``tiny_add``); 0 if neither."""
    recs = list(records)
    for op in ("queued_add", "tiny_add"):
        t = _overhead_record(recs, op)
        if t is not None:
            return t
    return 0.0


def fit_host_floor(records: Iterable[dict], overhead_s: float) -> float:
    """Seconds per op the host needs to issue it, beyond the kernel overhead
    (``host_op_floor_s``): the eager per-op time of a no-work op minus ``overhead_s``; 0 where
    it was not measured (a CPU runs ops on the host)."""
    t = _overhead_record(list(records), "eager_add")
    return 0.0 if t is None else max(0.0, t - overhead_s)


@dataclass(frozen=True, slots=True)
class BandwidthFit:
    bytes_per_s: float
    rms_rel: float
    n: int
    bound_points: int = 0


def fit_memory(records: Iterable[dict], overhead_s: float = 0.0, floor_s: float = 0.0) -> BandwidthFit:
    """``W`` of ``t = o + max(bytes / W, floor)`` from the memory-bound kernels."""
    allpts = [r for r in records if r.get("kind") == "memory"]
    if not allpts:
        raise FitError("no memory-bandwidth measurements")
    big = [r for r in allpts if r["bytes"] / 2 >= MEMORY_MIN_BYTES] or allpts
    pts = [r for r in big if r["time_s"] - overhead_s > BOUND_MARGIN * floor_s and r["time_s"] > overhead_s]
    if not pts:
        raise FitError(f"every memory-bound kernel took less than the host floor ({floor_s * 1e6:.1f} us) "
                       "plus the kernel overhead: no bandwidth to fit (use larger tensors)")
    b = np.array([r["bytes"] for r in pts], dtype=float)
    t = np.array([r["time_s"] for r in pts], dtype=float)
    w = float(np.exp(np.mean(np.log(b / (t - overhead_s)))))  # least squares on log errors
    pred = overhead_s + np.maximum(b / w, floor_s)
    return BandwidthFit(w, float(np.sqrt(np.mean(((pred - t) / t) ** 2))), len(pts), len(big) - len(pts))


@dataclass(frozen=True, slots=True)
class MatmulFit:
    flops_per_s: float  # P: large-GEMM asymptote
    gemm_half_dim: float  # h
    rms_rel: float
    n: int
    best_flops_per_s: float  # best single measurement
    bound_points: int = 0  # left out: bound by the host floor or the memory roofline


def _gemm_bytes(r: dict) -> float:
    m, n, k = r["m"], r["n"], r["k"]
    return ELEMENT_BYTES.get(str(r.get("dtype")), 2) * (m * k + k * n + m * n)


def fit_matmul(records: Iterable[dict], dtype: str, overhead_s: float = 0.0, floor_s: float = 0.0,
               memory_bytes_per_s: float | None = None) -> MatmulFit:
    """``P`` and ``h`` of ``t = o + max(F / (P d / (d + h)), bytes / W, floor)`` (module docstring)."""
    pts = [r for r in records if r.get("kind") == "matmul" and r.get("dtype") == dtype]
    if len(pts) < MIN_POINTS:
        raise FitError(f"need >= {MIN_POINTS} {dtype} matmul measurements, got {len(pts)}")

    def bound(r: dict) -> float:
        mem = _gemm_bytes(r) / memory_bytes_per_s if memory_bytes_per_s else 0.0
        return max(floor_s, mem)

    busy = [r for r in pts if r["time_s"] - overhead_s > BOUND_MARGIN * bound(r) and r["time_s"] > overhead_s]
    if len(busy) < MIN_POINTS:
        raise FitError(f"need >= {MIN_POINTS} {dtype} matmul measurements above the host floor and the memory "
                       f"roofline, got {len(busy)} of {len(pts)} (use larger GEMMs)")
    d = np.array([min(r["m"], r["n"], r["k"]) for r in busy], dtype=float)
    flops = np.array([r["flops"] for r in busy], dtype=float)
    t = np.array([r["time_s"] for r in busy], dtype=float)
    line = weighted_line(1.0 / d, (t - overhead_s) / flops)  # seconds per FLOP on 1/d
    if line.a <= 0:  # the shape effect explains everything: no finite asymptote, use the best
        P, h = float(np.max(flops / (t - overhead_s))), 0.0
    else:
        P, h = 1.0 / line.a, line.b / line.a
    pred = overhead_s + flops / (P * d / (d + h))
    rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    best = max(r["flops"] / r["time_s"] for r in pts)
    return MatmulFit(P, h, rms, len(busy), best, len(pts) - len(busy))


def matmul_rate(flops_per_s: float, half_dim: float, m: int, n: int, k: int) -> float:
    d = min(m, n, k)
    return flops_per_s * d / (d + half_dim)


@dataclass(frozen=True, slots=True)
class AttentionFit:
    fwd_vs_matmul: float
    bwd_vs_matmul: float
    rms_rel: float
    n: int
    bound_points: int = 0


def attention_hbm_bytes(r: dict, element_bytes: float = 2.0) -> float:
    """Forward HBM bytes of a fused causal attention as ``sim.layers.ops`` counts them: Q, K, V and
    the output, plus 4 bytes of softmax statistics per query and head."""
    b, a, s, d = r["batch"], r["heads"], r["seq"], r["head_dim"]
    return element_bytes * b * s * 4 * a * d + 4.0 * b * a * s


def fit_attention(records: Iterable[dict], matmul_flops_per_s: float, overhead_s: float = 0.0,
                  floor_s: float = 0.0, memory_bytes_per_s: float | None = None) -> AttentionFit:
    """Forward and backward attention throughput as fractions of the GEMM asymptote."""
    pts = [r for r in records if r.get("kind") == "attention"]
    if not pts:
        raise FitError("no attention measurements")
    P, o = matmul_flops_per_s, overhead_s
    fwd, bwd = [], []
    for r in pts:
        mem = attention_hbm_bytes(r, ELEMENT_BYTES.get(str(r.get("dtype")), 2)) / memory_bytes_per_s \
            if memory_bytes_per_s else 0.0
        if r["fwd_time_s"] - o > BOUND_MARGIN * max(floor_s, mem):
            fwd.append(r["flops"] / ((r["fwd_time_s"] - o) * P))
        if r["bwd_time_s"] - 2 * o > BOUND_MARGIN * 2 * max(floor_s, mem):
            bwd.append(conventions().attention_backward_per_forward * r["flops"] / ((r["bwd_time_s"] - 2 * o) * P))
    if not fwd or not bwd:
        raise FitError("every attention measurement is bound by the host floor or the memory roofline "
                       "(use longer sequences)")
    af = float(np.clip(np.exp(np.mean(np.log(fwd))), 1e-3, 1.5))
    ab = float(np.clip(np.exp(np.mean(np.log(bwd))), 1e-3, 1.5))
    f = np.array([r["flops"] for r in pts], dtype=float)
    tf = np.array([r["fwd_time_s"] for r in pts], dtype=float)
    tb = np.array([r["bwd_time_s"] for r in pts], dtype=float)
    pf = o + np.maximum(f / (P * af), floor_s)
    pb = 2 * o + np.maximum(conventions().attention_backward_per_forward * f / (P * ab), 2 * floor_s)
    res = np.concatenate([(pf - tf) / tf, (pb - tb) / tb])
    return AttentionFit(af, ab, float(np.sqrt(np.mean(res**2))), len(pts), 2 * len(pts) - len(fwd) - len(bwd))
