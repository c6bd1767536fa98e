"""How sure a prediction is: a band from the leave-one-source-out residuals of runs like it.

Every scored row of the development set (``planner check-published --loso``: each row predicted
by the model fitted without its source's data) leaves a residual ``r = published / predicted - 1``.
A new prediction ``t`` is given the band ``[t (1 + q10), t (1 + q90)]`` where ``q10``/``q90`` are
the 10th/90th percentiles of the residuals of its *class*: the framework family (Megatron-class,
FSDP-class, XLA; ``catalogs/frameworks.yaml`` ``family``), the GPU architecture, and the
parallelism mix (``moe`` when the model has experts, ``long-context`` with context parallelism
or sequences of 32k tokens or more, else ``dense``).  A class with fewer than ``MIN_RUNS`` rows
falls back to a coarser one (family + architecture, then family, then every row), so a band is
never read from two or three runs.

This is an empirical prediction interval (the residual-quantile interval of, e.g., Lei et al.
2018, "Distribution-free predictive inference for regression", JASA: split conformal with the
sources as folds), not a physical error bound: it says how far runs *like this one* from sources
the model never saw landed, 8 in 10 of them inside.  Known weakness: the development set has
few FSDP and XLA rows per architecture, so those bands mostly come from the family or overall
level; the level used is reported.

``scripts/fit_uncertainty.py`` computes the table and stores it in ``catalogs/uncertainty.yaml``
(tests check that the stored table is what it computes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from sim.catalog import catalog_document
from sim.framework import get_framework
from sim.plan import Plan
from sim.records import Record

MIN_RUNS = 5
LONG_CONTEXT_TOKENS = 32_768  # sequences this long run attention-bound (FlashAttention-class kernels)
QUANTILES = (0.10, 0.90)


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


def levels(cls: Sequence[str]) -> tuple[str, ...]:
    """The keys of a class from the finest to the coarsest: ``family/arch/mix``, ``family/arch``,
    ``family``, ``all``."""
    family, arch, mix = cls
    return (f"{family}/{arch}/{mix}", f"{family}/{arch}", family, "all")


def _quantile(xs: Sequence[float], q: float) -> float:
    ys = sorted(xs)
    k = (len(ys) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


def fit_table(rows: Iterable[tuple[tuple[str, str, str], float]]) -> dict[str, dict[str, float]]:
    """The band of every class level with at least ``MIN_RUNS`` residuals.

    ``rows``: (class, residual) pairs, residual = published / predicted - 1 of one scored row."""
    groups: dict[str, list[float]] = {}
    for cls, r in rows:
        for key in levels(cls):
            groups.setdefault(key, []).append(r)
    return {key: {"runs": len(rs), "q10": round(_quantile(rs, QUANTILES[0]), 4),
                  "q90": round(_quantile(rs, QUANTILES[1]), 4)}
            for key, rs in sorted(groups.items()) if len(rs) >= MIN_RUNS}


def residual_rows(comparisons: Iterable[object]) -> list[tuple[tuple[str, str, str], float]]:
    """(class, residual) of each leave-one-source-out comparison (``planner.published.Comparison``)."""
    out = []
    for c in comparisons:
        err = c.step_error  # type: ignore[attr-defined]
        if err is None:
            continue
        out.append((class_of(c.plan, c.framework), 1.0 / (1.0 + err) - 1.0))  # type: ignore[attr-defined]
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Band:
    """The band of one prediction: ``step_time_s * (1 + q10) .. step_time_s * (1 + q90)``."""
    cls: str  # the class level the band was read from, e.g. "megatron/hopper/dense" or "fsdp"
    runs: int
    q10: float
    q90: float

    def low(self, step_time_s: float) -> float:
        return step_time_s * (1.0 + self.q10)

    def high(self, step_time_s: float) -> float:
        return step_time_s * (1.0 + self.q90)

    def as_dict(self) -> dict[str, object]:
        return {"class": self.cls, "runs": self.runs, "q10": self.q10, "q90": self.q90}


def stored_table() -> dict[str, Band]:
    """``catalogs/uncertainty.yaml``, validated (the document is cached by ``sim.catalog``)."""
    doc = catalog_document("uncertainty.yaml")
    out: dict[str, Band] = {}
    for raw in doc["classes"]:
        r = Record(raw, where=f"uncertainty class {raw.get('class')!r}", file="uncertainty.yaml",
                   allowed=("class", "runs", "q10", "q90"))
        q10, q90 = r.number("q10", signed=True), r.number("q90", signed=True)
        if not -1.0 < q10 <= q90:  # type: ignore[operator]
            raise r.fail("q10", f"must lie in (-1, q90={q90}]")
        out[r.text("class")] = Band(cls=r.text("class"), runs=r.integer("runs", minimum=MIN_RUNS),
                                    q10=q10, q90=q90)  # type: ignore[arg-type]
    if "all" not in out:
        raise Record({}, where="uncertainty classes", file="uncertainty.yaml").fail("all", "missing")
    return out


def band_for(plan: Plan, framework: str) -> Band:
    """The band of the finest stored class level the plan belongs to."""
    table = stored_table()
    return next(table[key] for key in levels(class_of(plan, framework)) if key in table)
