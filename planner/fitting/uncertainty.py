"""The number to plan with and how sure it is: a calibrated estimate and its 80% band.

Every scored row of the development set (``planner check-published --loso``: each row predicted
by the model fitted without its source's data) leaves a ratio ``published / predicted``; in log
space ``y = log(published / predicted)``.  For a new prediction ``t`` of class ``c``:

* **estimate** ``t * exp(b_c)``: ``b_c`` is the median ``y`` of the runs of its *center class*
  (the GPU architecture and framework family, else the architecture, else every run): the
  model's bias on runs like it, carried into the headline so it is the number to plan with;
* **band** ``[estimate * exp(min(0, q10)), estimate * exp(max(0, q90))]``: ``q10``/``q90`` are
  the 10th/90th percentiles with conformal prediction's finite-sample correction (``band_levels``:
  the ``(n + 1)`` rank convention, wider for small classes), over the runs of its *spread class* (the GPU architecture and
  parallelism mix, else the mix, else every run), of the *out-of-source* deviations ``d_i = y_i - b_c(i)`` where the center
  ``b_c(i)`` is fitted **without row i's source** (cross-validation+, Barber et al. 2021,
  "Predictive inference with the jackknife+", Ann. Statist.; with the sources as folds).  The
  deviations therefore hold the between-source spread a new user's run will show, not only the
  scatter inside the sources the center saw.  The clamps at 0 keep the estimate inside.

A class level is used only with at least ``MIN_RUNS`` runs from ``MIN_SOURCES`` sources (a
between-source spread needs several sources); otherwise the next coarser level.  With the
development set of 110 runs from 11 sources this forms the spread classes Ampere dense, Hopper
dense, Hopper long-context, dense, long-context and MoE, and "all".  The mix level matters
because that is where the model's uncertainty differs (MoE dispatch and long-sequence attention
scatter more than dense runs): classes by architecture alone fell back to the all-runs spread
whenever a left-out source took a class below three sources, and over-covered (Ampere 97%);
framework-family classes did not hold their coverage either (docs/accuracy.md).

**Coverage, measured honestly** (``band_coverage``): each source's rows are scored with the
table fitted *without that source* (centers and deviations both), and the share of published
step times inside their band is reported overall and per spread class; ``tests/test_uncertainty.py``
locks it at 75-85% overall and, per class, within two binomial standard deviations of 80% for
the class's number of runs (20 runs alone scatter by +-9%).  ``scripts/fit_uncertainty.py --write`` regenerates the stored table
(``catalogs/uncertainty.yaml``), together with the memory headroom default (``memory``) and the
best published MFU per GPU architecture and precision (``published_mfu``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from sim.data.catalog import catalog_document
from sim.cost.framework import get_framework
from sim.cost.plan import Plan
from sim.base.records import Record

# 13 keeps the MoE spread class (20 runs, 4 sources) when its largest source (Automodel, 7 runs) is
# left out; at 15 its rows fell back to the all-runs spread, which the fourth pass of issue 23
# narrowed (q90 25% -> 15%) below the MoE rows' scatter (coverage 55%, docs/accuracy.md)
MIN_RUNS = 13
MIN_SOURCES = 3
LONG_CONTEXT_TOKENS = 32_768  # sequences this long run attention-bound (FlashAttention-class kernels)
QUANTILES = (0.10, 0.90)
MEMORY_QUANTILE = 0.5  # the headroom default keeps the median under-prediction free (module ``memory_headroom``)


def mix_of(plan: Plan) -> str:
    """The parallelism mix of a plan: ``moe``, ``long-context`` or ``dense``."""
    if plan.model.moe is not None:
        return "moe"
    if plan.strategy.cp > 1 or plan.strategy.seq_len >= LONG_CONTEXT_TOKENS:
        return "long-context"
    return "dense"


def class_of(plan: Plan, framework: str) -> tuple[str, str, str]:
    """(framework family, GPU architecture, parallelism mix) of a plan run under ``framework``."""
    return (get_framework(framework).family, plan.cluster.gpu.architecture or "unknown", mix_of(plan))


def center_levels(cls: Sequence[str]) -> tuple[str, ...]:
    """Center class keys, finest first: ``arch/family``, ``arch``, ``all``."""
    family, arch, _ = cls
    return (f"{arch}/{family}", arch, "all")


def spread_levels(cls: Sequence[str]) -> tuple[str, ...]:
    """Spread class keys, finest first: ``arch/mix``, ``mix``, ``all``."""
    _, arch, mix = cls
    return (f"{arch}/{mix}", mix, "all")


@dataclass(frozen=True, kw_only=True, slots=True)
class Residual:
    """One scored row: its class, its source and ``published / predicted`` step time."""

    cls: tuple[str, str, str]
    source: str
    ratio: float

    @property
    def y(self) -> float:
        return math.log(self.ratio)


def _quantile(xs: Sequence[float], q: float) -> float:
    ys = sorted(xs)
    k = (len(ys) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


def band_levels(n: int) -> tuple[float, float]:
    """The quantile levels (``_quantile``'s, spaced ``1 / (n - 1)``) of the band's ends over
    ``n`` deviations, with the finite-sample correction of conformal prediction: the upper end is
    the ``ceil((1 - a/2)(n + 1))``-th smallest of the ``n`` scores and the lower the
    ``floor(a/2 (n + 1))``-th, not the plain ``1 - a/2`` and ``a/2`` quantiles (Lei et al. 2018,
    "Distribution-Free Predictive Inference for Regression", JASA, split conformal; Barber et al.
    2021, jackknife+, the same ``n + 1``), clamped to the sample.  With 20 runs the 80% band runs
    from the 2nd to the 19th deviation (levels 0.053-0.947); with 110, the 11th to the 100th."""
    if n <= 1:
        return 0.0, 1.0
    lo, hi = QUANTILES
    upper = min(n, math.ceil(hi * (n + 1) - 1e-9))
    lower = max(1, math.floor(lo * (n + 1) + 1e-9))
    return (lower - 1) / (n - 1), (upper - 1) / (n - 1)


def _groups(rows: Sequence[Residual], levels) -> dict[str, list[Residual]]:
    out: dict[str, list[Residual]] = {}
    for r in rows:
        for key in levels(r.cls):
            out.setdefault(key, []).append(r)
    return {k: v for k, v in out.items()
            if k == "all" or (len(v) >= MIN_RUNS and len({r.source for r in v}) >= MIN_SOURCES)}


def _centers(rows: Sequence[Residual]) -> dict[str, float]:
    return {k: statistics.median(r.y for r in v) for k, v in _groups(rows, center_levels).items()}


def _pick(table: Mapping[str, object], keys: Sequence[str]) -> str:
    return next(k for k in keys if k in table)


def fit_table(rows: Sequence[Residual]) -> dict[str, dict[str, dict[str, float]]]:
    """The stored table (module docstring): ``centers`` (``runs``, ``sources``, ``bias`` =
    ``exp(b) - 1``) and ``spreads`` (``runs``, ``sources``, ``q10``, ``q90`` as ratios - 1 of
    the out-of-source deviations) of every class level kept."""
    rows = list(rows)
    if not rows:
        raise ValueError("no residuals to fit")
    dev: list[tuple[Residual, float]] = []
    for source in sorted({r.source for r in rows}):
        centers = _centers([r for r in rows if r.source != source]) if len({r.source for r in rows}) > 1 else {}
        for r in rows:
            if r.source == source:
                dev.append((r, r.y - centers[_pick(centers, center_levels(r.cls))] if centers else 0.0))
    out_c = {}
    for key, members in sorted(_groups(rows, center_levels).items()):
        out_c[key] = {"runs": len(members), "sources": len({r.source for r in members}),
                      "bias": round(math.expm1(statistics.median(r.y for r in members)), 4)}
    out_s = {}
    for key, members in sorted(_groups(rows, spread_levels).items()):
        ids = {id(r) for r in members}
        ds = [d for r, d in dev if id(r) in ids]
        levels = band_levels(len(ds))
        out_s[key] = {"runs": len(members), "sources": len({r.source for r in members}),
                      "q10": round(math.expm1(_quantile(ds, levels[0])), 4),
                      "q90": round(math.expm1(_quantile(ds, levels[1])), 4)}
    return {"centers": out_c, "spreads": out_s}


@dataclass(frozen=True, kw_only=True, slots=True)
class Band:
    """The calibrated estimate and 80% band of one prediction ``t`` (module docstring):
    ``estimate(t) = t (1 + bias)``, ``low``/``high`` = estimate x ``(1 + min(0, q10))`` /
    ``(1 + max(0, q90))``."""

    cls: str  # the center class level the bias was read from, e.g. "hopper/megatron" or "all"
    spread_class: str  # the spread class level, e.g. "hopper"
    runs: int  # runs of the spread class
    bias: float
    q10: float
    q90: float

    def estimate(self, t: float) -> float:
        return t * (1.0 + self.bias)

    def low(self, t: float) -> float:
        return self.estimate(t) * (1.0 + min(0.0, self.q10))

    def high(self, t: float) -> float:
        return self.estimate(t) * (1.0 + max(0.0, self.q90))

    def covers(self, ratio: float) -> bool:
        """Whether a run that took ``ratio`` times the model's prediction lies in the band."""
        return self.low(1.0) <= ratio <= self.high(1.0)

    def as_dict(self) -> dict[str, object]:
        return {"class": self.cls, "spread_class": self.spread_class, "runs": self.runs, "bias": self.bias,
                "q10": self.q10, "q90": self.q90}


def band_from(table: Mapping[str, Mapping[str, Mapping[str, float]]], cls: Sequence[str]) -> Band:
    """The band of class ``cls`` in a ``fit_table`` table (finest level kept at each)."""
    ck = _pick(table["centers"], center_levels(cls))
    sk = _pick(table["spreads"], spread_levels(cls))
    c, s = table["centers"][ck], table["spreads"][sk]
    return Band(cls=ck, spread_class=sk, runs=int(s["runs"]), bias=float(c["bias"]), q10=float(s["q10"]),
                q90=float(s["q90"]))


def band_coverage(rows: Sequence[Residual], *, loso: bool = True) -> dict[str, object]:
    """Share of rows whose published step time lies inside their band, overall and per spread
    class (the classes ``fit_table`` forms on all rows) and, as diagnostics, per framework
    family and parallelism mix.  ``loso``: each source's rows scored with the table fitted
    without that source (module docstring); else in-sample.  ``estimate`` scores the number a
    user plans with, the calibrated estimate (``Band.estimate``), the same way: its |error|
    median, p90 and worst and its signed median (``estimate / published - 1``)."""
    rows = list(rows)
    inside: list[tuple[Residual, bool]] = []
    est_err: list[float] = []
    full = fit_table(rows)
    for source in sorted({r.source for r in rows}):
        table = fit_table([r for r in rows if r.source != source]) if loso else full
        for r in rows:
            if r.source == source:
                band = band_from(table, r.cls)
                inside.append((r, band.covers(r.ratio)))
                est_err.append(band.estimate(1.0) / r.ratio - 1.0)

    def share(pairs: list[tuple[Residual, bool]]) -> dict[str, float]:
        return {"coverage": round(sum(ok for _, ok in pairs) / len(pairs), 4), "runs": len(pairs)}

    def by(key) -> dict[str, dict[str, float]]:
        groups: dict[str, list[tuple[Residual, bool]]] = {}
        for r, ok in inside:
            groups.setdefault(key(r), []).append((r, ok))
        return {k: share(v) for k, v in sorted(groups.items())}

    classes = {k: share([(r, ok) for r, ok in inside if k in spread_levels(r.cls)]) for k in full["spreads"]}
    abs_err = [abs(e) for e in est_err]
    estimate = {"median_abs_step_error": statistics.median(abs_err), "p90_abs_step_error": _quantile(abs_err, 0.9),
                "max_abs_step_error": max(abs_err), "signed_median_step_error": statistics.median(est_err)}
    return {"loso": loso, **share(inside), "by_class": classes, "by_family": by(lambda r: r.cls[0]),
            "by_mix": by(lambda r: r.cls[2]), "estimate": estimate}


def residual_rows(comparisons: Iterable[object]) -> list[Residual]:
    """The ``Residual`` of each comparison (``planner.fitting.published.Comparison``) with a published
    step time."""
    out = []
    for c in comparisons:
        err = c.step_error  # type: ignore[attr-defined]
        if err is None:
            continue
        out.append(Residual(cls=class_of(c.plan, c.framework), source=c.source,  # type: ignore[attr-defined]
                            ratio=1.0 / (1.0 + err)))
    return out


# ------------------------------------------------------------------ the stored table


def _document() -> Mapping[str, object]:
    return catalog_document("uncertainty.yaml")


def stored_table() -> dict[str, dict[str, dict[str, float]]]:
    """``catalogs/uncertainty.yaml`` ``centers`` and ``spreads``, validated."""
    doc = _document()
    out: dict[str, dict[str, dict[str, float]]] = {"centers": {}, "spreads": {}}
    for section, keys in (("centers", ("bias",)), ("spreads", ("q10", "q90"))):
        for raw in doc.get(section) or ():
            r = Record(raw, where=f"uncertainty {section} {raw.get('class')!r}", file="uncertainty.yaml",
                       allowed=("class", "runs", "sources", *keys))
            entry: dict[str, float] = {"runs": r.integer("runs", minimum=1), "sources": r.integer("sources", minimum=1)}
            for k in keys:
                v = r.number(k, signed=True)
                if not -1.0 < v < 100.0:  # type: ignore[operator]
                    raise r.fail(k, "must be a ratio - 1 in (-1, 100)")
                entry[k] = float(v)  # type: ignore[arg-type]
            if section == "spreads" and entry["q10"] > entry["q90"]:
                raise r.fail("q10", f"must be <= q90={entry['q90']}")
            out[section][r.text("class")] = entry
        if "all" not in out[section]:
            raise Record({}, where=f"uncertainty {section}", file="uncertainty.yaml").fail("all", "missing")
    return out


def band_for(plan: Plan, framework: str, *, calibration: str | None = None) -> Band:
    """The stored band of ``plan`` run under ``framework``.  With a calibration profile (a
    machine measured by ``planner validate``) the published runs' bias does not apply: the
    estimate is the model's step and the band the spread of all published runs around it."""
    table = stored_table()
    if calibration is not None:
        s = table["spreads"]["all"]
        return Band(cls=f"calibration {calibration}", spread_class="all", runs=int(s["runs"]), bias=0.0,
                    q10=float(s["q10"]), q90=float(s["q90"]))
    return band_from(table, class_of(plan, framework))


def memory_headroom() -> tuple[float, str]:
    """(the default ``--memory-headroom``, why): the fraction of GPU memory a recommended plan
    keeps free so that the memory model's measured under-prediction still fits (the median
    ``published / predicted`` peak memory over the leave-one-source-out memory rows,
    ``MEMORY_QUANTILE``: ``1 - 1 / ratio``)."""
    r = Record(_document().get("memory") or {}, where="uncertainty memory", file="uncertainty.yaml",
               allowed=("headroom", "ratio", "quantile", "runs", "source"))
    f = r.fraction("headroom")
    return f, (f"{f:.0%} of GPU memory kept free: the memory model's median under-prediction on "
               f"{r.integer('runs')} published runs (peak {r.number('ratio'):.2f}x predicted)")


def published_mfu_best(architecture: str, precision: str) -> tuple[float, str] | None:
    """(the highest MFU, bf16-peak convention, of a published run on this GPU architecture and
    precision in the reference data, its run id), or None when there is none."""
    for raw in _document().get("published_mfu") or ():
        r = Record(raw, where="uncertainty published_mfu", file="uncertainty.yaml",
                   allowed=("architecture", "precision", "mfu", "run", "runs"))
        if r.text("architecture") == architecture and r.text("precision") == precision:
            return float(r.number("mfu")), r.text("run")  # type: ignore[arg-type]
    return None


def above_published_note(mfu: float, architecture: str, precision: str) -> str | None:
    """One line when ``mfu`` is above every published run on this GPU architecture and precision."""
    best = published_mfu_best(architecture, precision)
    if best is None or mfu <= best[0]:
        return None
    return (f"MFU {mfu:.1%} is above every published {precision} run on {architecture} GPUs in the reference "
            f"data (best {best[0]:.1%}, {best[1]}): treat it as optimistic")


# ------------------------------------------------------------------ the number to plan with

_SCALED = ("tokens_per_s", "tokens_per_s_per_gpu", "mfu", "hfu", "model_tflops_per_gpu", "mfu_of_precision_peak")


def headline(out: Mapping[str, object], band: Band) -> dict[str, object]:
    """A step result's JSON (``StepResult.to_dict``) with the number to plan with:
    ``step_time_s`` the calibrated estimate inside ``step_time_s_low .. step_time_s_high``,
    throughput and utilisation from it, and the model's own figures as ``model_step_time_s``
    and ``model_mfu``.  The ``breakdown`` still sums to ``step_time_s``: the model's parts, and
    the bias (what published runs like it took beyond the model, negative when they ran faster)
    in ``overhead_s``, also shown alone as ``calibration_s``."""
    t = float(out["step_time_s"])  # type: ignore[arg-type]
    est = band.estimate(t)
    res = dict(out)
    bd = dict(out["breakdown"])  # type: ignore[arg-type]
    bd["calibration_s"] = est - t
    bd["overhead_s"] = float(bd.get("overhead_s", 0.0)) + (est - t)
    res.update({"model_step_time_s": t, "model_mfu": out["mfu"], "step_time_s": est, "breakdown": bd,
                "step_time_s_low": band.low(t), "step_time_s_high": band.high(t), "uncertainty": band.as_dict()})
    for key in _SCALED:
        if key in res:
            res[key] = float(res[key]) * t / est  # type: ignore[arg-type]
    return res


# ------------------------------------------------------------------ fitting the stored document


def memory_ratios(comparisons: Iterable[object]) -> list[float]:
    """``published / predicted`` peak memory (as each source measured it) of the comparisons
    that publish memory."""
    out = []
    for c in comparisons:
        err = c.memory_error  # type: ignore[attr-defined]
        if err is not None:
            out.append(1.0 / (1.0 + err))
    return out


def published_mfu(comparisons: Iterable[object]) -> list[dict[str, object]]:
    """Per (GPU architecture, precision): the highest MFU of a published run, in the planner's
    convention (model FLOPs of ``sim.layers.ops.model_flops_per_step`` over the dense bf16 peak, at the
    published step time)."""
    best: dict[tuple[str, str], tuple[float, str, int]] = {}
    for c in comparisons:
        pub = c.published.step_time_s  # type: ignore[attr-defined]
        if pub is None:
            continue
        pred = c.predicted  # type: ignore[attr-defined]
        key = (c.plan.cluster.gpu.architecture or "unknown", c.plan.strategy.precision)  # type: ignore[attr-defined]
        mfu = pred.mfu * pred.step_time_s / pub
        prev = best.get(key)
        n = (prev[2] if prev else 0) + 1
        if prev is None or mfu > prev[0]:
            best[key] = (mfu, c.run_id, n)  # type: ignore[attr-defined]
        else:
            best[key] = (prev[0], prev[1], n)
    return [{"architecture": a, "precision": p, "mfu": round(m, 4), "run": rid, "runs": n}
            for (a, p), (m, rid, n) in sorted(best.items())]


def fit_document(comparisons: Sequence[object]) -> dict[str, object]:
    """``catalogs/uncertainty.yaml`` from the leave-one-source-out comparisons of the development
    set (``planner.fitting.published.compare_all(loso=True)``): the band table, its measured coverage,
    the memory headroom default and the best published MFU per architecture and precision."""
    rows = residual_rows(comparisons)
    table = fit_table(rows)
    cov = band_coverage(rows, loso=True)
    ratios = memory_ratios(comparisons)
    ratio = _quantile(ratios, MEMORY_QUANTILE)
    return {
        "schema_version": 2,
        "source": "leave-one-source-out comparisons of catalogs/reference/ (planner check-published --loso), "
                  "scripts/fit_uncertainty.py",
        "centers": [{"class": k, **v} for k, v in table["centers"].items()],
        "spreads": [{"class": k, **v} for k, v in table["spreads"].items()],
        "coverage": {"loso": cov["coverage"], "runs": cov["runs"],
                     "by_class": {k: v["coverage"] for k, v in cov["by_class"].items()}},  # type: ignore[union-attr]
        "memory": {"headroom": round(max(0.0, 1.0 - 1.0 / ratio), 4), "ratio": round(ratio, 4),
                   "quantile": MEMORY_QUANTILE, "runs": len(ratios),
                   "source": "published / predicted peak memory of the leave-one-source-out memory rows"},
        "published_mfu": published_mfu(comparisons),
    }
