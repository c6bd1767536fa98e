"""Job traces for the shared-cluster scheduler: a CSV format and a synthetic generator.

Trace format (CSV with a header; lines starting with ``#`` are comments; one job per row):

============  ========  =====================================================================
column        required  meaning
============  ========  =====================================================================
job_id        yes       unique name
submit_s      yes       submission time, seconds from the start of the trace (>= 0)
num_gpus      yes       GPUs requested (rounded up to whole nodes; gang-scheduled)
duration_s    yes       run time at the requested size without failures
priority      no        integer, higher runs first under the ``priority`` policy (default 0)
elastic       no        0/1: may run on fewer nodes (default 0)
min_gpus      no        smallest size an elastic job accepts (default num_gpus)
estimate_s    no        the user's run-time estimate backfilling relies on (default duration_s)
============  ========  =====================================================================

``catalogs/traces/example_jobs.csv`` is a small example.  The generator draws Poisson
arrivals, power-of-two node counts with small jobs most frequent (``P(2^k nodes) ~ 1/(k+1)``),
log-normal run times (median ``median_duration_s``, sigma 1, capped at a week) and estimates
1-3x the run time (users over-estimate; Mu'alem & Feitelson 2001, IEEE TPDS 12(6)).  It is a
synthetic stand-in for production traces such as Microsoft's Philly trace (Jeon et al.,
USENIX ATC 2019), where most jobs are small and short and a few large ones hold most GPU-hours.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.base.errors import InputError

REQUIRED = ("job_id", "submit_s", "num_gpus", "duration_s")
OPTIONAL = ("priority", "elastic", "min_gpus", "estimate_s")
MAX_JOBS = 200_000
MAX_TRACE_BYTES = 64 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    job_id: str
    submit_s: float
    num_gpus: int
    duration_s: float
    priority: int = 0
    elastic: bool = False
    min_gpus: int | None = None
    estimate_s: float | None = None

    def __post_init__(self) -> None:
        where = f"job[{self.job_id}]"
        if not isinstance(self.job_id, str) or not self.job_id:
            raise InputError("job_id", self.job_id, "must be a non-empty string")
        for name in ("submit_s", "duration_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InputError(f"{where}.{name}", v, "must be a finite number >= 0")
        if self.duration_s <= 0:
            raise InputError(f"{where}.duration_s", self.duration_s, "must be > 0")
        if isinstance(self.num_gpus, bool) or not isinstance(self.num_gpus, int) or not 1 <= self.num_gpus <= 1 << 22:
            raise InputError(f"{where}.num_gpus", self.num_gpus, "must be an integer in [1, 4194304]")
        if self.min_gpus is not None and not 1 <= self.min_gpus <= self.num_gpus:
            raise InputError(f"{where}.min_gpus", self.min_gpus, f"must be in [1, num_gpus={self.num_gpus}]")
        if self.estimate_s is not None and (not math.isfinite(self.estimate_s) or self.estimate_s <= 0):
            raise InputError(f"{where}.estimate_s", self.estimate_s, "must be a finite number > 0")

    @property
    def min_gpus_or_all(self) -> int:
        return self.min_gpus if (self.elastic and self.min_gpus is not None) else self.num_gpus

    @property
    def estimate_or_duration_s(self) -> float:
        return self.estimate_s if self.estimate_s is not None else self.duration_s


def _num(text: str, field: str, where: str, *, integer: bool = False) -> float:
    try:
        v = int(text, 10) if integer else float(text)
    except ValueError:
        raise InputError(field, f"{where}: {text!r}", "must be " + ("an integer" if integer else "a number")) from None
    if not integer and not math.isfinite(v):
        raise InputError(field, f"{where}: {text!r}", "must be finite")
    return v


def parse_trace(text: str, *, name: str = "trace") -> list[JobSpec]:
    """Parse trace CSV text (module docstring); errors name ``trace`` and ``file:line``."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise InputError("trace", name, "has no header and no jobs")
    reader = csv.reader(io.StringIO("\n".join(lines)))
    header = [h.strip().lower() for h in next(reader)]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError("trace", name, f"header lacks {', '.join(missing)} (needs {', '.join(REQUIRED)})")
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if unknown:
        raise InputError("trace", name, f"unknown column(s) {', '.join(unknown)}; known: {', '.join(REQUIRED + OPTIONAL)}")
    jobs, seen = [], set()
    for lineno, row in enumerate(reader, start=2):
        where = f"{name}:row {lineno - 1}"
        if len(row) != len(header):
            raise InputError("trace", where, f"has {len(row)} fields, header has {len(header)}")
        rec = {h: v.strip() for h, v in zip(header, row)}
        jid = rec["job_id"]
        if not jid or jid in seen:
            raise InputError("trace.job_id", f"{where}: {jid!r}", "must be non-empty and unique")
        seen.add(jid)
        elastic = rec.get("elastic", "") or "0"
        if elastic not in ("0", "1"):
            raise InputError("trace.elastic", f"{where}: {elastic!r}", "must be 0 or 1")
        jobs.append(JobSpec(
            job_id=jid, submit_s=_num(rec["submit_s"], "trace.submit_s", where),
            num_gpus=int(_num(rec["num_gpus"], "trace.num_gpus", where, integer=True)),
            duration_s=_num(rec["duration_s"], "trace.duration_s", where),
            priority=int(_num(rec.get("priority") or "0", "trace.priority", where, integer=True)),
            elastic=elastic == "1",
            min_gpus=int(_num(rec["min_gpus"], "trace.min_gpus", where, integer=True)) if rec.get("min_gpus") else None,
            estimate_s=_num(rec["estimate_s"], "trace.estimate_s", where) if rec.get("estimate_s") else None))
        if len(jobs) > MAX_JOBS:
            raise InputError("trace", name, f"has more than {MAX_JOBS} jobs")
    if not jobs:
        raise InputError("trace", name, "has no jobs")
    return jobs


def read_trace(path: str | Path) -> list[JobSpec]:
    """Read a trace file (module docstring)."""
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError("trace", str(path), "is not a readable file")
        if p.stat().st_size > MAX_TRACE_BYTES:
            raise InputError("trace", str(path), f"is larger than {MAX_TRACE_BYTES} bytes")
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError("trace", str(path), f"cannot be read: {exc.strerror or exc}") from None
    if b"\x00" in raw:
        raise InputError("trace", str(path), "is a binary file, not CSV")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError("trace", str(path), "is not UTF-8 text") from None
    return parse_trace(text, name=p.name)


def format_trace(jobs: list[JobSpec]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(REQUIRED + OPTIONAL)
    for j in jobs:
        w.writerow([j.job_id, f"{j.submit_s:g}", j.num_gpus, f"{j.duration_s:g}", j.priority, int(j.elastic),
                    j.min_gpus if j.min_gpus is not None else "", f"{j.estimate_s:g}" if j.estimate_s else ""])
    return out.getvalue()


def generate_jobs(*, num_jobs: int, num_nodes: int, gpus_per_node: int, seed: int = 0,
                  mean_interarrival_s: float = 1800.0, median_duration_s: float = 7200.0,
                  elastic_fraction: float = 0.3, high_priority_fraction: float = 0.2) -> list[JobSpec]:
    """A synthetic trace (module docstring for the distributions)."""
    if isinstance(num_jobs, bool) or not isinstance(num_jobs, int) or not 1 <= num_jobs <= MAX_JOBS:
        raise InputError("jobs", num_jobs, f"must be an integer in [1, {MAX_JOBS}]")
    for name, v in (("mean-interarrival-s", mean_interarrival_s), ("median-duration-s", median_duration_s)):
        if not (0 < v < 1e12):
            raise InputError(name, v, "must be a positive finite number")
    for name, v in (("elastic-fraction", elastic_fraction), ("high-priority-fraction", high_priority_fraction)):
        if not 0 <= v <= 1:
            raise InputError(name, v, "must be in [0, 1]")
    rng = np.random.default_rng(seed)
    kmax = max(0, int(math.log2(max(1, num_nodes // 2))))
    weights = np.array([1.0 / (k + 1) for k in range(kmax + 1)])
    weights /= weights.sum()
    t = 0.0
    jobs = []
    for i in range(num_jobs):
        t += float(rng.exponential(mean_interarrival_s))
        nodes = 1 << int(rng.choice(kmax + 1, p=weights))
        dur = float(min(7 * 86400.0, median_duration_s * math.exp(rng.normal(0.0, 1.0))))
        elastic = bool(rng.random() < elastic_fraction) and nodes > 1
        gpus = nodes * gpus_per_node
        jobs.append(JobSpec(job_id=f"job{i:05d}", submit_s=round(t, 3), num_gpus=gpus, duration_s=round(dur, 3),
                            priority=1 if rng.random() < high_priority_fraction else 0, elastic=elastic,
                            min_gpus=max(gpus_per_node, gpus // 2) if elastic else None,
                            estimate_s=round(dur * float(rng.uniform(1.0, 3.0)), 3)))
    return jobs
