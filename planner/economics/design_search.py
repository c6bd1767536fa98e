"""Search over cluster designs: the grid, or an Optuna multi-objective study (docs/economics.md).

A design is a ``planner.economics.sweep.DesignPoint`` (model, GPU type, GPU count, NIC, topology,
oversubscription), costed by ``sweep.evaluate_point`` (the recommender's plan, ``planner tco``'s
time and cost to train).  Both searches minimise time to train and cost to train; the Pareto front
(``sweep.pareto_front``) is per model.

* **Constraints as users state them** (``Constraints``): GPUs available to buy (type -> most you can
  get) and a maximum GPU count shape the space (designs beyond them are never proposed); a budget
  in dollars (capital cost for owned pricing, the bill to train for cloud pricing) and a power cap
  (facility power, PUE included) are checked on the costed design, a violating design kept with
  ``status = "constrained"`` and off the front.
* **Optuna** (Akiba et al. 2019, KDD): one study per model minimising ``(time_to_train_s,
  cost_to_train_usd)``.  Samplers: ``tpe`` (default; multi-objective TPE, Ozaki et al. 2020 /
  2022, multivariate with grouped conditional parameters, so the count index is conditioned on
  the GPU type) or ``nsga2`` (Deb et al. 2002; its first generation of ``population_size``
  designs is random, so it needs more trials than TPE for a small budget).  The budget and power
  constraints go to the sampler's ``constraints_func`` (Optuna's constrained TPE/NSGA-II).  The
  space is discrete, so a sampler may propose a design already costed: such trials are answered
  from the cache and do not count against ``trials`` (designs evaluated); the search stops at
  ``trials`` new evaluations, when every design has been costed, or after
  ``MAX_PROPOSALS_PER_TRIAL x trials`` proposals.  ``storage`` (an Optuna RDB URL, e.g.
  ``sqlite:///study.db``) with ``study_name`` resumes a study: its costed designs are reused, not
  re-evaluated.
* **Executors**: trials are asked in batches of ``workers`` (the TPE's constant liar keeps a batch
  apart) and costed on local processes or on Ray tasks; the driver alone talks to the storage.  We
  chose Optuna's ask-and-tell with its own storage over Ray Tune's ``OptunaSearch``: one study, one
  storage and one resume path whichever executor runs the trials; the storage stays a local SQLite
  file even when the trials run on a remote Ray cluster (SQLite does not take concurrent writers
  from many machines, and only the driver writes); and the trial function is the grid's
  ``evaluate_point``, so both executors and both searches return identical rows for a design.

``epsilon_indicator`` and ``hypervolume_2d`` compare a found front with a reference front
(Zitzler et al. 2003, "Performance assessment of multiobjective optimizers", IEEE TEC 7(2)).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

from sim.data.catalog import get_gpu
from sim.base.errors import InputError

from planner.economics.sweep import (EXECUTORS, DesignPoint, SweepOptions, design_grid, evaluate_point,
                                     pareto_front, ray_session)

SEARCHES: tuple[str, ...] = ("auto", "grid", "optuna")
SAMPLERS: tuple[str, ...] = ("tpe", "nsga2")
OBJECTIVES: tuple[str, str] = ("time_to_train_s", "cost_to_train_usd")
MAX_PROPOSALS_PER_TRIAL = 20
DEFAULT_TRIALS = 64


# ------------------------------------------------------------------ constraints


def parse_available(text: str) -> dict[str, int]:
    """``h100-80gb:512,a100-80gb:1024`` -> {catalog GPU id: count} (aliases resolved)."""
    out: dict[str, int] = {}
    for item in [t.strip() for t in str(text).split(",") if t.strip()]:
        gpu, sep, count = item.partition(":")
        if not sep:
            raise InputError("available", item, "expected GPU:COUNT, e.g. h100-80gb:512")
        try:
            n = int(count)
        except ValueError:
            raise InputError("available", item, "the count after ':' must be an integer") from None
        if n < 1:
            raise InputError("available", item, "the count must be >= 1")
        gid = get_gpu(gpu.strip()).id
        if gid in out:
            raise InputError("available", item, f"{gid} given twice")
        out[gid] = n
    if not out:
        raise InputError("available", text, "expected GPU:COUNT[,GPU:COUNT...]")
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Constraints:
    """What the buyer can spend and get (module docstring); ``None`` / empty = no limit."""

    budget_usd: float | None = None
    power_cap_w: float | None = None
    max_gpus: int | None = None
    available: tuple[tuple[str, int], ...] = ()  # (GPU id, most GPUs of it to buy)

    def __post_init__(self) -> None:
        for name, v in (("budget-usd", self.budget_usd), ("power-cap-kw", self.power_cap_w)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v <= 0):
                raise InputError(name, v, "must be a finite number > 0")
        if self.max_gpus is not None and (isinstance(self.max_gpus, bool) or not isinstance(self.max_gpus, int)
                                          or self.max_gpus < 1):
            raise InputError("max-gpus", self.max_gpus, "must be an integer >= 1")

    @property
    def available_map(self) -> dict[str, int]:
        return dict(self.available)

    def excluded(self, point: DesignPoint) -> str | None:
        """Why ``point`` cannot be bought (never evaluated), or ``None``."""
        avail = self.available_map
        gid = get_gpu(point.gpu).id
        if avail and gid not in avail:
            return f"{gid} is not available to buy (--available)"
        if avail and point.num_gpus > avail[gid]:
            return f"{point.num_gpus} x {gid} exceed the {avail[gid]} available"
        if self.max_gpus is not None and point.num_gpus > self.max_gpus:
            return f"{point.num_gpus} GPUs exceed --max-gpus {self.max_gpus}"
        return None

    @property
    def has_costed_limits(self) -> bool:
        return self.budget_usd is not None or self.power_cap_w is not None

    def violations(self, row: Mapping[str, object], pricing: str) -> tuple[float, ...]:
        """Relative excess of a costed design over each limit given (``<= 0``: within):
        spend / budget - 1 (capex when owned, the cloud bill when rented), power / cap - 1."""
        out = []
        if self.budget_usd is not None:
            spend = row.get("capex_usd") if pricing == "owned" else row.get("cost_to_train_usd")
            out.append(math.inf if spend is None else float(spend) / self.budget_usd - 1.0)  # type: ignore[arg-type]
        if self.power_cap_w is not None:
            out.append(float(row["power_w"]) / self.power_cap_w - 1.0)  # type: ignore[arg-type]
        return tuple(out)


def apply_constraints(row: dict, constraints: Constraints, pricing: str) -> dict:
    """``row`` with ``status = "constrained"`` (and why) when a costed design breaks a limit."""
    if row.get("status") != "ok" or not constraints.has_costed_limits:
        return row
    v = constraints.violations(row, pricing)
    row["constraint_violation"] = max(v)
    if max(v) <= 0:
        return row
    why = []
    if constraints.budget_usd is not None and v[0] > 0:
        what = "capex" if pricing == "owned" else "cost to train"
        why.append(f"{what} exceeds the ${constraints.budget_usd:,.0f} budget by {v[0]:.1%}")
    if constraints.power_cap_w is not None and v[-1] > 0:
        why.append(f"power exceeds the {constraints.power_cap_w / 1e3:,.0f} kW cap by {v[-1]:.1%}")
    row.update(status="constrained", reason="; ".join(why))
    return row


# ------------------------------------------------------------------ the space


@dataclass(frozen=True, kw_only=True, slots=True)
class DesignSpace:
    """The axes of ``planner sweep`` (``nics`` ``None`` = the GPU's usual NIC)."""

    models: tuple[str, ...]
    gpus: tuple[str, ...]
    counts: tuple[int, ...]
    nics: tuple[str | None, ...]
    topologies: tuple[str, ...]
    oversubscriptions: tuple[float, ...]

    def designs(self, constraints: Constraints) -> tuple[list[DesignPoint], int]:
        """Every design the constraints allow (ids checked by ``sweep.design_grid``) and how many
        were excluded."""
        pts = design_grid(models=self.models, gpus=self.gpus, counts=self.counts, nics=self.nics,
                          topologies=self.topologies, oversubscriptions=self.oversubscriptions)
        kept = [p for p in pts if constraints.excluded(p) is None]
        if not kept:
            raise InputError("available" if constraints.available else "max-gpus",
                             ",".join(f"{g}:{n}" for g, n in constraints.available) or constraints.max_gpus,
                             "leaves no design of the space to evaluate")
        return kept, len(pts) - len(kept)

    def counts_for(self, gpu: str, constraints: Constraints) -> tuple[int, ...]:
        """The counts of ``gpu`` the constraints allow, ascending (the index Optuna suggests)."""
        probe = DesignPoint(model=self.models[0], gpu=gpu, num_gpus=1, nic=None)
        return tuple(sorted(c for c in set(self.counts)
                            if constraints.excluded(DesignPoint(**{**asdict(probe), "num_gpus": c})) is None))


def choose_search(search: str, space: DesignSpace, constraints: Constraints, trials: int) -> tuple[str, str]:
    """(method, why): ``auto`` is the grid when it costs no more evaluations than the trial budget
    (exact and as cheap), else Optuna when it is installed, else the grid."""
    if search not in SEARCHES:
        raise InputError("search", search, f"must be one of {', '.join(SEARCHES)}")
    if search != "auto":
        return search, f"--search {search}"
    n = len(space.designs(constraints)[0])
    if n <= trials:
        return "grid", f"the grid ({n} designs) costs no more than --trials {trials}"
    ok, why = optuna_available()
    if not ok:
        return "grid", f"{n} designs exceed --trials {trials} but Optuna is not importable ({why}): the grid"
    return "optuna", f"{n} designs exceed --trials {trials}: an Optuna study"


def optuna_available() -> tuple[bool, str]:
    try:
        import optuna  # noqa: F401
    except Exception as exc:  # noqa: BLE001  any import failure means "not usable"
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


# ------------------------------------------------------------------ fronts compared


def _front_points(rows: Sequence[Mapping[str, object]]) -> list[tuple[float, float]]:
    return [(float(r[OBJECTIVES[0]]), float(r[OBJECTIVES[1]])) for r in rows]  # type: ignore[arg-type]


def epsilon_indicator(found: Sequence[Mapping[str, object]], reference: Sequence[Mapping[str, object]]) -> float:
    """Multiplicative epsilon indicator I_eps(found, reference) (Zitzler et al. 2003): the
    smallest ``e`` such that every reference point is weakly dominated by some found point
    scaled by ``1/e`` in every objective.  1.0: the found front is as good; 1.02: within 2%."""
    a, r = _front_points(found), _front_points(reference)
    if not r:
        return 1.0
    if not a:
        return math.inf
    return max(min(max(x / rx, y / ry) for x, y in a) for rx, ry in r)


def hypervolume_2d(rows: Sequence[Mapping[str, object]], ref: tuple[float, float]) -> float:
    """Area dominated by the points of ``rows`` and bounded by ``ref`` (both objectives minimised)."""
    pts = sorted(p for p in _front_points(rows) if p[0] < ref[0] and p[1] < ref[1])
    area, best_y = 0.0, ref[1]
    for i, (x, y) in enumerate(pts):
        if y >= best_y:
            continue
        nxt = next((px for px, py in pts[i + 1:] if py < y), ref[0])
        area += (nxt - x) * (ref[1] - y)
        best_y = y
    return area


# ------------------------------------------------------------------ results


@dataclass(slots=True)
class SearchResult:
    """Rows of every design costed (unique), every trial (Optuna; one per design for the
    grid), the front, and how the search went."""

    rows: list[dict]
    trials: list[dict]
    pareto: list[dict]
    executor: str
    sweep_time_s: float
    method: str
    why: str
    sampler: str | None = None
    evaluations: int = 0  # designs costed by this run
    reused: int = 0  # designs a resumed study had costed before
    space_size: int = 0
    excluded: int = 0
    studies: dict[str, str] = field(default_factory=dict)  # model -> study name
    storage: str | None = None

    def as_dict(self) -> dict[str, object]:
        ok = sum(r["status"] == "ok" for r in self.rows)
        return {"executor": self.executor, "points_evaluated": len(self.rows), "feasible": ok,
                "sweep_time_s": self.sweep_time_s, "pareto": list(self.pareto), "points": list(self.rows),
                "search": {"method": self.method, "why": self.why, "sampler": self.sampler,
                           "evaluations": self.evaluations, "reused": self.reused, "trials": len(self.trials),
                           "space_size": self.space_size, "excluded_by_constraints": self.excluded,
                           "studies": dict(self.studies), "storage": self.storage}}


def grid_result(rows: list[dict], *, executor: str, seconds: float, why: str, space_size: int, excluded: int,
                constraints: Constraints, pricing: str) -> SearchResult:
    rows = [apply_constraints(r, constraints, pricing) for r in rows]
    trials = [{"trial": i, "state": "COMPLETE" if r["status"] in ("ok", "constrained") else "FAIL",
               "duplicate": False, **r} for i, r in enumerate(rows)]
    return SearchResult(rows=rows, trials=trials, pareto=pareto_front(rows), executor=executor, sweep_time_s=seconds,
                        method="grid", why=why, evaluations=len(rows), space_size=space_size, excluded=excluded)


# ------------------------------------------------------------------ Optuna


def _point_key(p: DesignPoint) -> tuple:
    return (p.model, get_gpu(p.gpu).id, p.num_gpus, p.nic, p.topology, float(p.oversubscription))


@contextlib.contextmanager
def _batch_runner(executor: str, workers: int, address: str | None, options: SweepOptions,
                  evaluate: Callable[[DesignPoint, SweepOptions], dict]) -> Iterator[Callable[[list], list]]:
    """A function costing a batch of designs on ``executor``, open for the whole study."""
    if executor not in EXECUTORS:
        raise InputError("executor", executor, f"must be one of {', '.join(EXECUTORS)}")
    if executor == "ray":
        with ray_session(address, workers) as ray:
            task = ray.remote(evaluate)
            yield lambda pts: list(ray.get([task.remote(p, options) for p in pts]))
        return
    if workers <= 1:
        yield lambda pts: [evaluate(p, options) for p in pts]
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield lambda pts: list(pool.map(evaluate, pts, [options] * len(pts)))


def _sampler(name: str, seed: int | None, constraints_func, trials: int, parallel: bool):
    import optuna

    with warnings.catch_warnings():  # multivariate/group TPE are marked experimental by Optuna
        warnings.simplefilter("ignore")
        if name == "tpe":
            # multivariate + group: the GPU count is a conditional parameter of the GPU type
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=parallel,
                                              n_startup_trials=max(4, min(10, trials // 4)),
                                              constraints_func=constraints_func)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 4)),
                                                 constraints_func=constraints_func)
    raise InputError("sampler", name, f"must be one of {', '.join(SAMPLERS)}")


def run_optuna(space: DesignSpace, options: SweepOptions, constraints: Constraints, *, trials: int,
               sampler: str = "tpe", seed: int | None = 0, storage: str | None = None,
               study_name: str | None = None, executor: str = "local", workers: int | None = None,
               ray_address: str | None = None, why: str = "--search optuna",
               evaluate: Callable[[DesignPoint, SweepOptions], dict] = evaluate_point) -> SearchResult:
    """One Optuna study per model over ``space`` (module docstring); ``trials`` new designs
    costed per model at most.  ``evaluate`` is ``sweep.evaluate_point`` (tests pass a memoised
    one)."""
    ok, why_not = optuna_available()
    if not ok:
        raise InputError("search", "optuna", f"Optuna is not importable ({why_not}); install it with "
                                             "pip install 'cluster-planner[search]' or use --search grid")
    import optuna

    if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= 100_000:
        raise InputError("trials", trials, "must be an integer in [1, 100000]")
    if workers is not None and not 1 <= workers <= 1024:
        raise InputError("workers", workers, "must be in [1, 1024]")
    if storage is not None and "://" not in storage:
        raise InputError("storage", storage, "must be an Optuna storage URL, e.g. sqlite:///study.db")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    designs, excluded = space.designs(constraints)
    n_workers = workers or os.cpu_count() or 1
    pricing = options.tco.pricing
    t0 = time.perf_counter()
    rows: list[dict] = []
    trial_rows: list[dict] = []
    studies: dict[str, str] = {}
    evaluations = reused = 0

    n_limits = (constraints.budget_usd is not None) + (constraints.power_cap_w is not None)

    def cons(ft) -> Sequence[float]:  # Optuna's constrained samplers: <= 0 is within every limit
        return ft.user_attrs.get("constraint", [0.0] * n_limits)

    with _batch_runner(executor, n_workers, ray_address, options, evaluate) as run_batch:
        for model in space.models:
            name = (study_name or "planner-sweep") + (f":{model}" if len(space.models) > 1 or study_name is None
                                                      else "")
            studies[model] = name
            mine = [p for p in designs if p.model == model]
            gpus = [g for g in dict.fromkeys(get_gpu(g).id for g in space.gpus)
                    if space.counts_for(g, constraints)]
            counts = {g: space.counts_for(g, constraints) for g in gpus}
            nics = ["default" if n is None else n for n in dict.fromkeys(space.nics)]
            topologies = list(dict.fromkeys(space.topologies))
            overs = sorted(set(float(o) for o in space.oversubscriptions))
            try:
                study = optuna.create_study(
                    study_name=name, storage=storage, load_if_exists=storage is not None,
                    directions=["minimize", "minimize"],
                    sampler=_sampler(sampler, seed, cons if constraints.has_costed_limits else None, trials,
                                     n_workers > 1))
            except Exception as exc:  # noqa: BLE001  an unusable storage URL or database is bad input
                raise InputError("storage", storage, f"cannot open the Optuna study {name!r}: "
                                                     f"{type(exc).__name__}: {exc}") from None
            cache: dict[tuple, dict] = {}
            for t in study.trials:  # a resumed study: its costed designs are reused
                r = t.user_attrs.get("row")
                if r is not None:
                    cache.setdefault(_point_key(_point_of(r)), r)
            reused += len(cache)

            def suggest(trial) -> DesignPoint:
                g = trial.suggest_categorical("gpu", gpus) if len(gpus) > 1 else gpus[0]
                cs = counts[g]
                c = cs[trial.suggest_int(f"count_index@{g}", 0, len(cs) - 1)] if len(cs) > 1 else cs[0]
                nic = trial.suggest_categorical("nic", nics) if len(nics) > 1 else nics[0]
                topo = trial.suggest_categorical("topology", topologies) if len(topologies) > 1 else topologies[0]
                ovs = overs[trial.suggest_int("oversubscription_index", 0, len(overs) - 1)] if len(overs) > 1 \
                    else overs[0]
                return DesignPoint(model=model, gpu=g, num_gpus=c, nic=None if nic == "default" else nic,
                                   topology=topo, oversubscription=ovs)

            def tell(trial, row: dict, duplicate: bool) -> None:
                trial.set_user_attr("row", row)
                costed = row["status"] in ("ok", "constrained")
                if costed:
                    trial.set_user_attr("constraint", list(constraints.violations(row, pricing)))
                    study.tell(trial, [float(row[OBJECTIVES[0]]), float(row[OBJECTIVES[1]])])
                else:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                trial_rows.append({"study": name, "trial": trial.number, "state": "COMPLETE" if costed else "FAIL",
                                   "duplicate": duplicate, **row})

            new, proposals = 0, 0
            while new < trials and proposals < MAX_PROPOSALS_PER_TRIAL * trials and len(cache) < len(mine):
                batch: list[tuple[object, DesignPoint]] = []
                repeats: list[tuple[object, DesignPoint]] = []
                while len(batch) < min(n_workers, trials - new) and proposals < MAX_PROPOSALS_PER_TRIAL * trials \
                        and len(cache) + len(batch) < len(mine):
                    trial = study.ask()
                    proposals += 1
                    p = suggest(trial)
                    key = _point_key(p)
                    if key in cache:
                        tell(trial, cache[key], duplicate=True)
                    elif any(_point_key(q) == key for _, q in batch):
                        repeats.append((trial, p))
                    else:
                        batch.append((trial, p))
                if batch:
                    for (trial, p), row in zip(batch, run_batch([p for _, p in batch])):
                        row["requested_nic"] = p.nic
                        cache[_point_key(p)] = apply_constraints(row, constraints, pricing)
                        tell(trial, cache[_point_key(p)], duplicate=False)
                        rows.append(cache[_point_key(p)])
                        new += 1
                        evaluations += 1
                for trial, p in repeats:
                    tell(trial, cache[_point_key(p)], duplicate=True)
            seen = {id(r) for r in rows}
            rows += [r for r in cache.values() if id(r) not in seen]  # costed by the study before this run
    return SearchResult(rows=rows, trials=trial_rows, pareto=pareto_front(rows), executor=executor,
                        sweep_time_s=time.perf_counter() - t0, method="optuna", why=why, sampler=sampler,
                        evaluations=evaluations, reused=reused, space_size=len(designs), excluded=excluded,
                        studies=studies, storage=storage)


def _point_of(row: Mapping[str, object]) -> DesignPoint:
    return DesignPoint(model=str(row["model"]), gpu=str(row["gpu"]), num_gpus=int(row["num_gpus"]),  # type: ignore[arg-type]
                       nic=row.get("requested_nic"), topology=str(row["topology"]),  # type: ignore[arg-type]
                       oversubscription=float(row["oversubscription"]))  # type: ignore[arg-type]
