"""Fit the host side of a calibration profile from ``validate.hostbench`` records.

* Host memory: ``host_mem_bytes_per_s`` is the sustained rate of STREAM's triad (its copy
  where no triad was measured) on buffers of at least ``HOST_MEMORY_MIN_BYTES``: the
  geometric mean over those sizes of the host's rate (the sum over the host's ranks, which ran
  at once).  Smaller buffers may sit in a last-level cache; when no buffer was that large the
  rate is not written.
* Host<->device copies: per direction (``h2d``, ``d2h``) and host memory (pinned, pageable),
  ``t = latency_s + bytes / bytes_per_s`` by ``validate.fit.weighted_line`` (least squares on
  relative errors, so 1 MiB and 1 GiB copies weigh alike; latency clamped at 0) over the
  measured sizes.  A path with fewer than ``MIN_POINTS`` sizes, or whose time does not grow
  with the size, is not written.

A path that was not measured (no CUDA, or not in the sweep) is *absent* from the profile,
never zero or a stand-in: ``fit_host`` returns only measured keys, and the ``fit`` section
says why each missing one is missing.  No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from validate.fit import MIN_POINTS, weighted_line
from validate.specs import HOST_COPY_PATHS

HOST_MEMORY_MIN_BYTES = 1 << 28
"""Buffers of 256 MiB and more (per buffer and rank) measure DRAM, not a cache."""


@dataclass(frozen=True, slots=True)
class HostMemoryFit:
    bytes_per_s: float  # the host's sustained rate (all its ranks)
    per_rank_bytes_per_s: float  # the slowest rank's, same sizes
    op: str  # triad | copy
    rms_rel: float
    n: int
    buffer_bytes: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class HostCopyFit:
    bytes_per_s: float
    latency_s: float
    rms_rel: float
    n: int
    concurrent_ranks: int


def fit_host_memory(records: Iterable[dict]) -> HostMemoryFit | str:
    """The sustained host memory rate (module docstring), or why there is none."""
    pts = [r for r in records if r.get("kind") == "host_memory" and float(r.get("time_s", 0)) > 0]
    if not pts:
        return "not measured"
    big = [r for r in pts if float(r["buffer_bytes"]) >= HOST_MEMORY_MIN_BYTES]
    if not big:
        return (f"no buffer of at least {HOST_MEMORY_MIN_BYTES >> 20} MiB (largest "
                f"{max(float(r['buffer_bytes']) for r in pts) / 2**20:.0f} MiB, may be a cache's rate, not DRAM's)")
    op = "triad" if any(r["op"] == "triad" for r in big) else "copy"
    use = [r for r in big if r["op"] == op]
    host = np.array([float(r["host_bytes_per_s"]) for r in use])
    rank = np.array([float(r["bytes"]) / float(r["time_s"]) for r in use])
    w = float(np.exp(np.mean(np.log(host))))
    return HostMemoryFit(w, float(np.exp(np.mean(np.log(rank)))), op,
                         float(np.sqrt(np.mean((host / w - 1.0) ** 2))), len(use),
                         tuple(sorted({float(r["buffer_bytes"]) for r in use})))


def fit_host_copy(records: Iterable[dict], direction: str, *, pinned: bool) -> HostCopyFit | str:
    """Alpha-beta fit of one copy path (module docstring), or why there is none."""
    mine = [r for r in records if r.get("kind") == "host_copy" and r.get("direction") == direction
            and bool(r.get("pinned")) == pinned]
    pts = [r for r in mine if r.get("measured") and float(r.get("time_s", 0)) > 0 and float(r.get("bytes", 0)) > 0]
    if not pts:
        reasons = sorted({str(r["reason"]) for r in mine if r.get("reason")})
        return "not measured" + (f": {'; '.join(reasons)}" if reasons else "")
    sizes = sorted({float(r["bytes"]) for r in pts})
    if len(sizes) < MIN_POINTS:
        return f"needs >= {MIN_POINTS} copy sizes, got {len(sizes)}"
    line = weighted_line([float(r["bytes"]) for r in pts], [float(r["time_s"]) for r in pts], nonneg_intercept=True)
    if not line.b > 0:
        return "copy time does not grow with size (no bandwidth to fit)"
    return HostCopyFit(1.0 / line.b, line.a, line.rms_rel, line.n,
                       int(max(int(r.get("concurrent_ranks", 1)) for r in pts)))


def fit_host(records: list[dict]) -> tuple[dict[str, float], dict[str, Any]]:
    """(the profile's ``host`` keys that were measured, the ``fit.host`` section)."""
    keys: dict[str, float] = {}
    section: dict[str, Any] = {}
    mem = fit_host_memory(records)
    if isinstance(mem, str):
        section["memory"] = {"measured": False, "reason": mem}
    else:
        keys["host_mem_bytes_per_s"] = mem.bytes_per_s
        section["memory"] = {"bytes_per_s": mem.bytes_per_s, "per_rank_bytes_per_s": mem.per_rank_bytes_per_s,
                             "op": mem.op, "rms_rel_error": mem.rms_rel, "points": mem.n,
                             "buffer_bytes": list(mem.buffer_bytes),
                             "bytes_counted": "STREAM: each element read once and written once "
                                              "(copy 2, triad 3 buffers per call), no write-allocate"}
    for direction, pinned in HOST_COPY_PATHS:
        name = f"{direction}_{'pinned' if pinned else 'pageable'}"
        f = fit_host_copy(records, direction, pinned=pinned)
        if isinstance(f, str):
            section[name] = {"measured": False, "reason": f}
            continue
        keys[f"{name}_bytes_per_s"] = f.bytes_per_s
        keys[f"{name}_latency_s"] = f.latency_s
        section[name] = {"bytes_per_s": f.bytes_per_s, "latency_s": f.latency_s, "rms_rel_error": f.rms_rel,
                         "points": f.n, "concurrent_ranks": f.concurrent_ranks}
    return keys, section
