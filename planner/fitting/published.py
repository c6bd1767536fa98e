"""Simulate the reference runs and compare with what their sources report.

Every row of ``catalogs/reference/`` (``planner.fitting.reference``: 30 published runs and the 81-run
development set) becomes a plan by rules, is simulated, and is compared in its source's own
terms: step time (as published, or converted from tokens/s or TFLOP/s with the source's own FLOP
count), MFU or HFU as the source defines it, and memory where published, as the source measured
it (PyTorch peak reserved, or device-level as ``nvidia-smi`` shows it: reserved plus the CUDA
context and the communication library's buffers, ``catalogs/runtime.yaml``).

Unstated settings are filled by a rule, never per run: a micro-batch size or interleaving
depth the source omits is the one our own model finds fastest among plans that fit memory
(the authors tuned theirs).  Recomputation a source omits is none, unless the saved activations
alone (Korthikanti et al. 2022's accounting, the memory model's best-tested part) exceed the
GPU: the run ran, so it recomputed, and the framework's activation checkpointing (``full``) is
read.
Rows that cannot be simulated are returned with the reason.

Leave one source out (``compare_loso``): each source's rows are predicted by the model fitted
without that source's data (``planner.fitting.fit``: only Korthikanti et al. 2022's Table 4 and the
vTrain rows are training-run data the fit reads; every other source is predicted by the
catalog's fit, which never saw it).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field
from typing import Mapping

from sim.engines.analytic import simulate_analytic
from sim.layers.compute import catalog_fitted, kernel_efficiency
from sim.net.netefficiency import network_kwargs
from sim.base.errors import InputError
from sim.engines.event import simulate_event
from sim.cost.framework import apply_framework
from sim.net.network import Network
from sim.cost.plan import Plan
from sim.engines.result import StepResult
from sim.data.specs import Strategy

from planner.fitting.fit import FIT_SOURCES, fit_all
from planner.fitting.reference import (NotSimulable, Published, RefRun, cluster_of, framework_of, load_reference, model_of,
                               published_of, recompute_unstated, strategy_of)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    run_id: str
    source: str
    plan: Plan
    framework: str
    published: Published
    predicted: StepResult
    assumptions: tuple[str, ...] = field(default=())

    @property
    def step_error(self) -> float | None:
        if self.published.step_time_s is None:
            return None
        return self.predicted.step_time_s / self.published.step_time_s - 1

    @property
    def predicted_memory_bytes(self) -> float:
        """Peak memory at the level the source measured (``Published.memory_kind``: allocated,
        reserved or device)."""
        mem = self.predicted.memory
        return {"device": mem.device_bytes, "reserved": mem.reserved_bytes}.get(self.published.memory_kind,
                                                                               mem.allocated_bytes)

    @property
    def memory_error(self) -> float | None:
        if self.published.memory_bytes is None:
            return None
        return self.predicted_memory_bytes / self.published.memory_bytes - 1

    def predicted_utilisation(self, which: str) -> float:
        return self.predicted.mfu if which == "mfu" else self.predicted.hfu

    def as_dict(self) -> dict[str, object]:
        p, r = self.published, self.predicted
        return {
            "id": self.run_id,
            "source": self.source,
            "strategy": r.strategy,
            "framework": self.framework,
            "published_step_time_s": p.step_time_s,
            "predicted_step_time_s": r.step_time_s,
            "step_time_error": self.step_error,
            "published_mfu": p.mfu,
            "predicted_mfu": r.mfu,
            "published_hfu": p.hfu,
            "predicted_hfu": r.hfu,
            "published_memory_bytes": p.memory_bytes,
            "predicted_memory_bytes": self.predicted_memory_bytes if p.memory_bytes is not None else
            r.memory_peak_bytes,
            "memory_kind": p.memory_kind,
            "memory_error": self.memory_error,
            "fits_memory": r.fits_memory,
            "published_out_of_memory": p.out_of_memory,
            "how": p.how,
            "assumptions": list(self.assumptions),
        }


@dataclass(frozen=True, kw_only=True)
class Skipped:
    run_id: str
    source: str
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"id": self.run_id, "source": self.source, "reason": self.reason}


def load_runs(file: str | None = None) -> tuple[dict, ...]:
    """The raw reference rows (``file``: ``published``, ``dev`` or both)."""
    return tuple(r.raw for r in load_reference(file))


def _candidates(run: dict, values: dict, interleaved_unstated: bool) -> list[dict]:
    """Fill unstated micro-batch / interleaving with every value a framework would accept."""
    out = []
    layers = run["model"]["layers"]
    replicas = values["gbs"] // values["dp"]
    mbs_opts = [values["mbs"]] if "mbs" in values else [m for m in (1, 2, 4, 8, 16) if replicas % m == 0]
    pp = values["pp"]
    if not interleaved_unstated or pp == 1:
        vp_opts = [values.get("vp", 1)]
    else:
        vp_opts = [v for v in range(1, layers // pp + 1) if layers % (pp * v) == 0][:8]
    for mbs in mbs_opts:
        for vp in vp_opts:
            c = dict(values, mbs=mbs, vp=vp)
            c["schedule"] = values.get("schedule", "interleaved" if vp > 1 else "1f1b") if vp > 1 else "1f1b"
            out.append(c)
    return out


@functools.cache
def fitted_without(source: str | None) -> Mapping:
    """The fitted constants used to predict ``source``'s rows: refitted without its data when
    the fit reads any (``planner.fitting.fit.FIT_SOURCES``), else the catalog's; ``None``: the catalog's."""
    if source is None or source not in FIT_SOURCES:
        return catalog_fitted()
    return fit_all(frozenset({source}))


def compare_run(ref: RefRun | dict, *, engine: str = "analytic", fitted: Mapping | None = None) -> Comparison:
    """Simulate one reference row (a ``RefRun`` or a raw row of ``load_runs``) with the
    ``fitted`` constants (default: the catalog's); raises ``NotSimulable`` (an ``InputError``)
    with the reason when it cannot be."""
    if isinstance(ref, dict):
        ref = next(r for r in load_reference() if r.id == ref["id"])
    if engine not in ("analytic", "event"):
        raise InputError("engine", engine, "must be analytic or event")
    fitted = catalog_fitted() if fitted is None else fitted
    eff = kernel_efficiency(fitted)
    run = ref.raw
    fw = framework_of(run)
    model = model_of(run)
    cluster = cluster_of(run)
    net = Network(cluster, **network_kwargs(cluster.gpu.nvlink_generation, fitted))  # type: ignore[arg-type]
    mapped = strategy_of(run, fw, unstated_vp_searched=ref.file == "published")
    notes = list(mapped.assumptions)

    def best_of(values: dict) -> tuple[tuple[float, Plan, StepResult] | None, int, InputError | None]:
        best: tuple[float, Plan, StepResult] | None = None
        tried = 0
        last_error: InputError | None = None
        for cand in _candidates(run, values, mapped.interleaved_unstated):
            try:
                kw = apply_framework({"model": model, "cluster": cluster, "strategy": Strategy(**cand)}, fw)
                kw.update(mapped.plan)
                plan = Plan(**kw).checked()
            except InputError as exc:
                last_error = exc
                continue
            res = (simulate_analytic(plan, net=net, eff=eff) if engine == "analytic"
                   else simulate_event(plan, net=net, eff=eff))
            tried += 1
            # the fastest plan that fits; when none fits (the run ran, so our memory is over), the one
            # closest to fitting: the least memory, as the practitioner would have chosen
            key = res.step_time_s if res.fits_memory else math.inf
            if best is None or key < best[0] or (best[0] == math.inf and key == math.inf
                                                 and res.memory_device_bytes < best[2].memory_device_bytes):
                best = (key, plan, res)
        return best, tried, last_error

    best, tried, last_error = best_of(mapped.strategy)
    if best is None:
        raise NotSimulable(ref.id, f"no feasible plan: {last_error}" if last_error else "no feasible plan")
    _, plan, res = best
    acts = res.memory.activations_bytes
    if recompute_unstated(run) and mapped.strategy.get("recompute", "none") == "none" and acts > cluster.gpu.hbm_bytes:
        # the run ran: when the saved activations alone exceed the GPU, it recomputed, as the
        # framework's activation checkpointing does
        full, tried_full, _ = best_of({**mapped.strategy, "recompute": "full"})
        if full is not None and full[0] < math.inf:
            notes.append(f"unstated recomputation read as full: without it the saved activations alone "
                         f"need {acts / 2**30:.0f} GiB, over the GPU's {cluster.gpu.hbm_bytes / 2**30:.0f} GiB")
            best, tried = full, tried_full
            _, plan, res = best
    if tried > 1:
        notes.append(f"unstated mbs/vp chosen as our model's fastest fitting plan of {tried}" if best[0] < math.inf
                     else f"unstated mbs/vp chosen as the least memory of {tried} (none fits our model)")
    published = published_of(run, model, plan.strategy)
    return Comparison(run_id=ref.id, source=ref.source, plan=plan, framework=fw.id, published=published,
                      predicted=res, assumptions=tuple(notes))


def compare_all(*, engine: str = "analytic", ids: list[str] | None = None, file: str | None = None,
                with_skipped: bool = False, loso: bool = False
                ) -> list[Comparison] | tuple[list[Comparison], list[Skipped]]:
    """Every reference row that can be simulated (``file``: ``published``, ``dev`` or both);
    with ``with_skipped`` also the rows that cannot, with their reasons.  ``loso``: each row
    predicted by the fit that left its source out (``fitted_without``)."""
    rows, skipped = [], []
    for ref in load_reference(file):
        if ids is not None and ref.id not in ids:
            continue
        try:
            rows.append(compare_run(ref, engine=engine, fitted=fitted_without(ref.source if loso else None)))
        except NotSimulable as exc:
            skipped.append(Skipped(run_id=ref.id, source=ref.source, reason=exc.reason))
    return (rows, skipped) if with_skipped else rows


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    ys = sorted(xs)
    k = (len(ys) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


def summary_by_source(rows: list[Comparison]) -> dict[str, dict[str, float]]:
    """``summary`` of each source's rows, in the order the sources first appear."""
    groups: dict[str, list[Comparison]] = {}
    for r in rows:
        groups.setdefault(r.source, []).append(r)
    return {src: summary(rs) for src, rs in groups.items()}


def summary(rows: list[Comparison]) -> dict[str, float]:
    """Step-time and memory error figures of ``rows``: medians, p90 and worst of |error|, and
    the median of the signed step-time error (``predicted / published - 1``: negative when the
    model is faster than the run), which shows a one-sided lean the absolute figures hide; and
    ``num_ran_predicted_out_of_memory``: runs that ran as published but that the memory model
    says do not fit at the device level (a one-sided check of "will it fit?" on the rows that
    publish no memory figure)."""
    signed = [r.step_error for r in rows if r.step_error is not None]
    errs = [abs(e) for e in signed]
    mem = [abs(r.memory_error) for r in rows if r.memory_error is not None]
    return {
        "num_runs": len(errs),
        "signed_median_step_error": statistics.median(signed) if signed else float("nan"),
        "median_abs_step_error": statistics.median(errs) if errs else float("nan"),
        "mean_abs_step_error": statistics.fmean(errs) if errs else float("nan"),
        "p90_abs_step_error": _quantile(errs, 0.9),
        "max_abs_step_error": max(errs) if errs else float("nan"),
        "median_abs_memory_error": statistics.median(mem) if mem else float("nan"),
        "max_abs_memory_error": max(mem) if mem else float("nan"),
        "num_memory_rows": len(mem),
        "num_ran_predicted_out_of_memory": sum(1 for r in rows if not r.published.out_of_memory
                                               and not r.predicted.fits_memory),
    }
