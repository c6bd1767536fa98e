"""Fitting hardware efficiency from microbenchmarks (run once by ``scripts/fit_efficiency.py``).

Two fits, both least squares in *relative* error so small and large messages weigh alike:

* Collective bandwidth and per-step latency of a tier from an NCCL ``all_reduce`` bus-bandwidth
  curve (nccl-tests convention ``busbw = algbw * 2(n-1)/n``).  Ring all-reduce time is
  ``t = 2(n-1) * alpha + 2(n-1)/n * S / B`` (Patarasuk & Yuan 2009), so with
  ``t = S * 2(n-1)/n / busbw`` the fit is linear in ``(alpha, 1/B)``.  The bandwidth
  efficiency is ``B`` over the tier's nominal per-direction bandwidth.  Known error: NCCL
  switches protocol (LL, LL128, Simple) and channel count with size, which a single
  alpha-beta line cannot follow; over 1 MiB-16 GiB the fitted line is within ~20% of every
  point and within ~5% above 64 MiB.
* Anything else is fitted by the caller by evaluating the project's own cost model (so the
  fitted parameter means exactly what the model uses it for) over a 1-D grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from sim.base.errors import InputError

_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "B": 1}


def parse_size(text: str | int) -> float:
    """``"32KiB"`` -> 32768; plain integers are bytes."""
    if isinstance(text, int):
        return float(text)
    t = str(text).strip()
    for unit in ("KiB", "MiB", "GiB"):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * _UNITS[unit]
    try:
        return float(t)
    except ValueError:
        raise InputError("message size", text, "expected bytes or a KiB/MiB/GiB size") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class AlphaBeta:
    bytes_per_s: float  # achieved per-rank bandwidth (bus bandwidth at large sizes)
    step_latency_s: float  # per ring step
    max_rel_error: float  # of the fitted line over the points used

    def efficiency(self, nominal_bytes_per_s: float) -> float:
        return self.bytes_per_s / nominal_bytes_per_s


def fit_ring_all_reduce(sizes_bytes: Sequence[float], busbw_bytes_per_s: Sequence[float], num_ranks: int, *,
                        min_bytes: float = 2**20) -> AlphaBeta:
    """Fit ``(B, alpha)`` of ring all-reduce to a bus-bandwidth curve (module docstring)."""
    s = np.asarray(sizes_bytes, dtype=float)
    bus = np.asarray(busbw_bytes_per_s, dtype=float)
    if s.shape != bus.shape or s.size < 2:
        raise InputError("busbw curve", s.size, "needs matching sizes and at least two points")
    if num_ranks < 2:
        raise InputError("num_ranks", num_ranks, "must be >= 2")
    keep = s >= min_bytes
    s, bus = s[keep], bus[keep]
    if s.size < 2:
        raise InputError("min_bytes", min_bytes, "leaves fewer than two points")
    n = num_ranks
    factor = 2 * (n - 1) / n
    t = s * factor / bus
    a = np.vstack([np.full(s.size, 2 * (n - 1)), s * factor]).T
    w = 1.0 / t
    (alpha, inv_b), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    alpha = max(float(alpha), 0.0)
    inv_b = float(inv_b)
    if inv_b <= 0:
        raise InputError("busbw curve", list(bus), "does not grow with size; cannot fit a bandwidth")
    pred = 2 * (n - 1) * alpha + s * factor * inv_b
    return AlphaBeta(bytes_per_s=1.0 / inv_b, step_latency_s=alpha, max_rel_error=float(np.max(np.abs(pred / t - 1))))


def fit_scalar(loss: Callable[[float], float], grid: Sequence[float]) -> tuple[float, float]:
    """The grid value minimising ``loss`` (and the loss there); deterministic, no optimiser."""
    best = min(grid, key=loss)
    return float(best), float(loss(best))


def fit_saturating(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Fit ``y = y_max * x / (x + x_half)`` (``sim.layers.compute.SaturatingCurve``) to measured
    efficiencies, in relative *time* error (time ~ 1/y, so a slow point weighs as much as a
    fast one).  ``1/y = (1 + x_half/x) / y_max`` is linear in ``(1/y_max, x_half/y_max)``:
    weighted least squares, then ``x_half`` clamped at 0 (a curve that does not rise with
    ``x`` is flat at the points' harmonic mean).  Returns ``(y_max, x_half, rms_rel_error)``."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if x.shape != y.shape or x.size < 1 or np.any(x <= 0) or np.any(y <= 0):
        raise InputError("curve", x.size, "needs matching positive points")
    a = np.vstack([np.ones_like(x), 1.0 / x]).T * y[:, None]  # (a0 + a1/x) * y ~ 1
    (a0, a1), *_ = np.linalg.lstsq(a, np.ones_like(x), rcond=None)
    if a1 < 0 or a0 <= 0:
        a0, a1 = float(np.sum(y) / np.sum(y * y)), 0.0
    y_max, x_half = 1.0 / a0, a1 / a0
    pred = y_max * x / (x + x_half)
    return float(y_max), float(x_half), float(np.sqrt(np.mean((y / pred - 1) ** 2)))
