"""Checkpoint interval and analytic goodput under random failures.

* Young (1974), "A first order approximation to the optimum checkpoint interval", CACM 17(9):
  ``tau_opt = sqrt(2 * delta * M)`` for checkpoint cost ``delta`` and mean time between
  failures ``M``; accurate when ``delta << M``.
* Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart
  dumps", FGCS 22(3), eq. (37): ``tau_opt = sqrt(2 delta M) [1 + sqrt(delta/(2M))/3 +
  (delta/(2M))/9] - delta`` for ``delta < 2M``, else ``M``; and eq. (13), the expected wall
  time of ``T_s`` of work with Poisson failures, checkpoints every ``tau`` of work and a
  restart cost ``R`` (which can itself be interrupted):
  ``T_w = M e^{R/M} (e^{(tau + delta)/M} - 1) T_s / tau``.  Goodput = ``T_s / T_w``.

Here ``R`` = restart (detect, relaunch) + checkpoint restore.  ``planner.economics.campaign``
simulates the same process (plus spare nodes and repairs) and agrees with eq. (13) when
spares never run out; tests check it.  Known error: exponential failures (real fleets show
infant mortality and correlated failures), checkpoints that block training (asynchronous
checkpointing hides most of ``delta``; ``async_checkpoint`` models only its GPU-to-host copy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.base.errors import InputError
from sim.data.hardware import Cluster
from sim.data.specs import Model
from sim.net.fabric import pcie_x16_bytes_per_s

from planner.economics.failures import FailureModel, cluster_rates, load_failure_model
from planner.economics.storage import DEFAULT_STORAGE, checkpoint_bytes, load_storage


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young's optimum compute time between checkpoints, ``sqrt(2 delta M)``."""
    return math.sqrt(2.0 * write_s * mtbf_s)


def daly_interval_s(write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (2006, eq. 37); ``M`` when ``delta >= 2M``."""
    if write_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = write_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * write_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - write_s


def daly_goodput(interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> float:
    """Useful fraction of wall time, ``tau / (M e^{R/M} (e^{(tau+delta)/M} - 1))`` (Daly eq. 13)."""
    if interval_s <= 0:
        raise InputError("checkpoint-interval-s", interval_s, "must be > 0")
    if math.isinf(mtbf_s):
        return interval_s / (interval_s + write_s)
    m = mtbf_s
    expo = (interval_s + write_s) / m
    if expo > 700 or restart_s / m > 700:
        return 0.0
    return interval_s / (m * math.exp(restart_s / m) * math.expm1(expo))


@dataclass(frozen=True, kw_only=True, slots=True)
class GoodputReport:
    storage: str
    checkpoint_bytes: float
    checkpoint_write_s: float  # blocking time per checkpoint (delta)
    checkpoint_restore_s: float
    restart_s: float  # detect + relaunch, without the restore
    mtbf_s: float
    expected_failures_per_day: float
    failures_per_day_by_component: dict[str, float]
    optimal_checkpoint_interval_s: float  # Young
    daly_checkpoint_interval_s: float
    checkpoint_interval_s: float  # the one used for `goodput`
    goodput: float
    node_loss_fraction: float
    num_nodes: int
    async_checkpoint: bool
    warnings: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, object]:
        return {
            "storage": self.storage, "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_write_s": self.checkpoint_write_s, "checkpoint_restore_s": self.checkpoint_restore_s,
            "restart_s": self.restart_s, "mtbf_s": self.mtbf_s,
            "expected_failures_per_day": self.expected_failures_per_day,
            "failures_per_day_by_component": dict(self.failures_per_day_by_component),
            "optimal_checkpoint_interval_s": self.optimal_checkpoint_interval_s,
            "daly_checkpoint_interval_s": self.daly_checkpoint_interval_s,
            "checkpoint_interval_s": self.checkpoint_interval_s, "goodput": self.goodput,
            "node_loss_fraction": self.node_loss_fraction, "async_checkpoint": self.async_checkpoint,
            "warnings": list(self.warnings),
        }


def goodput_report(model: Model, cluster: Cluster, *, storage: str = DEFAULT_STORAGE,
                   restart_s: float | None = None, interval_s: float | None = None,
                   async_checkpoint: bool = False, failures: FailureModel | None = None) -> GoodputReport:
    """Checkpoint cost, cluster MTBF, Young/Daly interval and Daly's goodput for ``cluster``.

    ``interval_s`` (compute seconds between checkpoints) defaults to Young's optimum.
    ``async_checkpoint`` makes the blocking part of a checkpoint the GPU-to-host copy of each
    GPU's shard over PCIe (the storage write continues in the background).
    """
    fm = failures or load_failure_model()
    cat = load_storage()
    tier = cat.get(storage)
    rates = cluster_rates(cluster, fm)
    mtbf = rates.mtbf_s
    nbytes = checkpoint_bytes(model, cat)
    nodes = cluster.num_nodes
    write_s = tier.transfer_s(nbytes, nodes, write=True)
    warnings = []
    if async_checkpoint:
        shard = nbytes / cluster.num_gpus
        blocking = shard / pcie_x16_bytes_per_s(cluster.gpu.pcie_generation)
        if write_s > 0:
            warnings.append(f"asynchronous checkpoint: {blocking:.1f} s blocking copy; the {write_s:.0f} s write to "
                            f"{tier.id} runs in the background (a failure during it falls back to the previous checkpoint)")
        write_s = blocking
    restore_s = tier.transfer_s(nbytes, nodes, write=False)
    restart = fm.restart_s if restart_s is None else restart_s
    if restart < 0:
        raise InputError("restart-s", restart, "must be >= 0")
    young = young_interval_s(write_s, mtbf) if math.isfinite(mtbf) else math.inf
    daly = daly_interval_s(write_s, mtbf) if math.isfinite(mtbf) else math.inf
    tau = young if interval_s is None else interval_s
    if interval_s is not None and (not math.isfinite(interval_s) or interval_s <= 0):
        raise InputError("checkpoint-interval-s", interval_s, "must be a finite number > 0")
    gp = daly_goodput(tau, write_s, restart + restore_s, mtbf) if math.isfinite(tau) else 1.0
    if not tier.durable:
        warnings.append(f"{tier.id} is not durable: a failed node's checkpoint shard is lost; "
                        "replicate to peers or a durable tier (not modelled)")
    if write_s > 0.5 * mtbf:
        warnings.append(f"checkpoint write ({write_s:.0f} s) is a large share of the MTBF ({mtbf:.0f} s): "
                        "goodput collapses; use faster storage or asynchronous checkpoints")
    per_day = {c: r * 86400.0 for c, r in rates.by_component.items()}
    return GoodputReport(storage=tier.id, checkpoint_bytes=nbytes, checkpoint_write_s=write_s,
                         checkpoint_restore_s=restore_s, restart_s=restart, mtbf_s=mtbf,
                         expected_failures_per_day=rates.failures_per_day, failures_per_day_by_component=per_day,
                         optimal_checkpoint_interval_s=young, daly_checkpoint_interval_s=daly,
                         checkpoint_interval_s=tau, goodput=gp, node_loss_fraction=rates.node_loss_fraction,
                         num_nodes=nodes, async_checkpoint=async_checkpoint, warnings=tuple(warnings))
