"""Co-design sweeps: GPU type x GPU count x NIC x topology x oversubscription (x model).

Every design point is a cluster (``planner.commands.inputs`` rules: the GPU's usual node, NVLink
domain and NIC count) costed with ``planner.economics.tco.compute_tco``; its strategy comes
from ``planner.economics.strategy.choose_plan`` (the recommender).  Points that
cannot run (nothing fits in memory, indivisible counts, no price) are kept with a ``status``
and ``reason``.  The Pareto front (per model: token budgets differ) holds the points no other
point beats on both time to train and cost to train.

Executors: ``local`` runs points in local processes (``concurrent.futures``
``ProcessPoolExecutor``); ``ray`` submits the same function as Ray tasks (``ray.init()``
locally, or ``address=`` an existing cluster).  Both return identical rows.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Sequence

from sim.data.catalog import get_gpu, get_nic
from sim.net.clusters import cluster_from_catalog
from sim.base.errors import InfeasibleError, InputError
from sim.data.models import load_model
from sim.data.hardware import TOPOLOGIES, Cluster

from planner import progress
from planner.economics.strategy import choose_plan
from planner.economics.tco import TcoOptions, compute_tco

EXECUTORS: tuple[str, ...] = ("local", "ray")
MAX_POINTS = 10_000


@dataclass(frozen=True, kw_only=True, slots=True)
class DesignPoint:
    model: str
    gpu: str
    num_gpus: int
    nic: str | None  # None: the GPU's usual NIC
    topology: str = "fat-tree"
    oversubscription: float = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepOptions:
    tco: TcoOptions = field(default_factory=TcoOptions)
    gbs: int | None = None
    seq_len: int | None = None
    quick: bool = False  # search planner.economics.strategy.QUICK_SPACE only (fast sweeps)


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepResult:
    rows: tuple[dict, ...]
    pareto: tuple[dict, ...]
    executor: str
    sweep_time_s: float

    def as_dict(self) -> dict[str, object]:
        ok = sum(r["status"] == "ok" for r in self.rows)
        return {"executor": self.executor, "points_evaluated": len(self.rows), "feasible": ok,
                "sweep_time_s": self.sweep_time_s, "pareto": list(self.pareto), "points": list(self.rows)}


def design_grid(*, models: Sequence[str], gpus: Sequence[str], counts: Sequence[int], nics: Sequence[str | None],
                topologies: Sequence[str], oversubscriptions: Sequence[float]) -> list[DesignPoint]:
    """The cross product, with every id checked up front (unknown ids raise ``InputError``)."""
    for m in models:
        load_model(m)
    for g in gpus:
        get_gpu(g)
    for n in nics:
        if n is not None:
            get_nic(n)
    for t in topologies:
        if t not in TOPOLOGIES:
            raise InputError("topologies", t, f"must be one of {', '.join(TOPOLOGIES)}")
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise InputError("counts", c, "must be positive integers")
    for o in oversubscriptions:
        if not 1 <= o <= 64:
            raise InputError("oversubscription", o, "must be in [1, 64]")
    points = [DesignPoint(model=m, gpu=g, num_gpus=c, nic=n, topology=t, oversubscription=float(o))
              for m in models for g in gpus for c in counts for n in nics for t in topologies for o in oversubscriptions]
    if not points:
        raise InputError("sweep", 0, "the grid is empty")
    if len(points) > MAX_POINTS:
        raise InputError("sweep", len(points), f"more than {MAX_POINTS} design points")
    return points


def _cluster(point: DesignPoint) -> Cluster:
    return cluster_from_catalog(point.gpu, point.num_gpus, nic=point.nic, topology=point.topology,
                                oversubscription=point.oversubscription)


def evaluate_point(point: DesignPoint, options: SweepOptions) -> dict:
    """Cost one design point; never raises for an infeasible or unpriced design."""
    row: dict = asdict(point)
    t0 = time.perf_counter()
    try:
        model = load_model(point.model)
        cluster = _cluster(point)
        row["nic"] = cluster.nic.id
        plan = choose_plan(model, cluster, gbs=options.gbs, seq_len=options.seq_len, quick=options.quick)
        res = compute_tco(model, cluster, options=options.tco, plan=plan)
    except InfeasibleError as exc:
        row.update(status="infeasible", reason=f"{exc.reason}: {exc}")
    except InputError as exc:
        row.update(status="error", reason=str(exc))
    else:
        d = res.as_dict()
        row.update(status="ok", reason="", strategy=d["strategy"], strategy_source=d["strategy_source"],
                   tokens_per_s=d["tokens_per_s"], mfu=d["mfu"], goodput=d["goodput"],
                   time_to_train_s=d["time_to_train_s"], time_to_train_days=d["time_to_train_days"],
                   cost_to_train_usd=d["cost_to_train_usd"], cloud_cost_to_train_usd=d["cloud_cost_to_train_usd"],
                   capex_usd=d["capex_usd"], network_capex_usd=d["network_capex_usd"], power_w=d["power_w"],
                   energy_kwh=d["energy_kwh"], num_switches=d["num_switches"])
    row["eval_time_s"] = time.perf_counter() - t0
    return row


def pareto_front(rows: Sequence[dict]) -> list[dict]:
    """Feasible rows no other row of the same model beats on both time and cost (ties kept once)."""
    out = []
    ok = [r for r in rows if r.get("status") == "ok"]
    for r in ok:
        dominated = any(o is not r and o["model"] == r["model"]
                        and o["time_to_train_s"] <= r["time_to_train_s"] and o["cost_to_train_usd"] <= r["cost_to_train_usd"]
                        and (o["time_to_train_s"] < r["time_to_train_s"] or o["cost_to_train_usd"] < r["cost_to_train_usd"])
                        for o in ok)
        if not dominated:
            out.append(r)
    return sorted(out, key=lambda r: (r["model"], r["time_to_train_s"]))


def _run_local(points: Sequence[DesignPoint], options: SweepOptions, max_workers: int | None) -> list[dict]:
    workers = max_workers or os.cpu_count() or 1
    progress.start("sweeping")
    if workers <= 1 or len(points) == 1:
        rows = []
        for p in points:
            rows.append(evaluate_point(p, options))
            progress.tick("sweeping", len(rows), len(points), "designs")
        return rows
    with ProcessPoolExecutor(max_workers=min(workers, len(points))) as pool:
        futures = [pool.submit(evaluate_point, p, options) for p in points]
        for done, _ in enumerate(as_completed(futures), start=1):
            progress.tick("sweeping", done, len(points), "designs")
        return [f.result() for f in futures]


def ray_available() -> tuple[bool, str]:
    """Whether ``import ray`` works here, and why not."""
    try:
        import ray  # noqa: F401
    except Exception as exc:  # noqa: BLE001  any import failure means "not usable"
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


@contextlib.contextmanager
def _quiet_stderr():
    """Send file descriptor 2 to /dev/null for the block (C-level logs included)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int | None):
    """A Ray instance for the block: the one already initialised, a local one
    (``ray.init(num_cpus=...)``) or ``address``'s cluster; shut down after the block if started
    here.  Yields the ``ray`` module."""
    ok, why = ray_available()
    if not ok:
        raise InputError("executor", "ray", f"Ray is not importable ({why}); install it with "
                                            "pip install 'ray>=2.9' or use --executor local")
    import logging

    import ray

    started = False
    if not ray.is_initialized():
        env = {k: v for k, v in os.environ.items() if k == "PLANNER_CATALOG_DIR"}
        kwargs: dict = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR,
                        "runtime_env": {"env_vars": env} if env else None}
        if address:
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = num_cpus or os.cpu_count() or 1
        try:
            with _quiet_stderr():  # Ray's C++ client logs connection retries on fd 2
                ray.init(**{k: v for k, v in kwargs.items() if v is not None})
        except Exception as exc:  # noqa: BLE001  a cluster that cannot start is bad input here
            raise InputError("ray-address", address or "local", f"cannot start/connect to Ray: {exc}") from None
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def _run_ray(points: Sequence[DesignPoint], options: SweepOptions, address: str | None,
             num_cpus: int | None) -> list[dict]:
    with ray_session(address, num_cpus) as ray:
        task = ray.remote(evaluate_point)
        refs = [task.remote(p, options) for p in points]
        progress.start("sweeping")
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=1)
            progress.tick("sweeping", len(refs) - len(pending), len(refs), "designs")
        return list(ray.get(refs))


def run_sweep(points: Sequence[DesignPoint], options: SweepOptions | None = None, *, executor: str = "local",
              max_workers: int | None = None, ray_address: str | None = None) -> SweepResult:
    """Evaluate every point with ``executor`` and compute the Pareto front (module docstring)."""
    if executor not in EXECUTORS:
        raise InputError("executor", executor, f"must be one of {', '.join(EXECUTORS)}")
    if max_workers is not None and not 1 <= max_workers <= 1024:
        raise InputError("workers", max_workers, "must be in [1, 1024]")
    opts = options or SweepOptions()
    t0 = time.perf_counter()
    if executor == "local":
        rows = _run_local(points, opts, max_workers)
    else:
        rows = _run_ray(points, opts, ray_address, max_workers)
    return SweepResult(rows=tuple(rows), pareto=tuple(pareto_front(rows)), executor=executor,
                       sweep_time_s=time.perf_counter() - t0)
