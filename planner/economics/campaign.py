"""A simpy simulation of one training campaign with random failures, restarts and spares.

The job needs ``work_s`` seconds of failure-free training.  It computes in segments of
``interval_s``, each followed by a blocking checkpoint of ``write_s``.  Failures arrive as a
Poisson process of total rate ``sum_c lambda_c`` (``planner.economics.failures``), each
attributed to a component ``c`` with probability ``lambda_c / sum``.  A failure at any moment
(computing, checkpointing or recovering) loses the work since the last completed checkpoint.
Recovery then:

1. if the component takes the node out (``needs_node``), swap in a hot spare from a
   ``simpy.Container`` of ``num_spares`` nodes -- waiting for one if the pool is empty -- and
   send the failed node to repair, which returns it to the pool after ``repair_s``;
2. restart for ``restart_s`` (detect, relaunch) plus ``restore_s`` (read the checkpoint); a
   failure during recovery starts recovery again.

With spares never exhausted the expected wall time is Daly's (2006) eq. (13) with
``R = restart_s + restore_s`` (``planner.economics.goodput.daly_goodput``); the tests check the
simulation against it.  Goodput = ``work_s / wall``, reported per seed and as a mean with a
95% Student-t confidence interval over seeds.  Failures while the job waits for a spare are not
modelled (the job holds no running nodes then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import simpy

from sim.base import limits
from sim.base.errors import InputError
from sim.base.limits import check_work

from planner import progress

# Two-sided 97.5% Student-t quantiles for 1..30 degrees of freedom (then the normal 1.96).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def mean_ci95(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: Student-t 95% confidence interval of the mean."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise InputError("seeds", 0, "must be >= 1")
    m = float(x.mean())
    if x.size == 1:
        return m, m, m
    t = _T975[x.size - 2] if x.size - 1 <= len(_T975) else 1.96
    half = t * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m, m - half, m + half


@dataclass(frozen=True, kw_only=True, slots=True)
class FailureMode:
    name: str
    rate_per_s: float
    needs_node: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class CampaignSpec:
    work_s: float
    interval_s: float
    write_s: float
    restart_s: float
    restore_s: float
    modes: tuple[FailureMode, ...]
    num_spares: int
    repair_s: float

    def __post_init__(self) -> None:
        for name in ("work_s", "interval_s"):
            v = getattr(self, name)
            if not (0 < v < math.inf):
                raise InputError(name, v, "must be a positive finite number")
        for name in ("write_s", "restart_s", "restore_s", "repair_s"):
            v = getattr(self, name)
            if not (0 <= v < math.inf):
                raise InputError(name, v, "must be a finite number >= 0")
        if isinstance(self.num_spares, bool) or not isinstance(self.num_spares, int) or self.num_spares < 0:
            raise InputError("spares", self.num_spares, "must be an integer >= 0")
        if self.work_s / self.interval_s > 5e6:
            raise InputError("campaign-days", self.work_s / 86400.0,
                             f"is {self.work_s / self.interval_s:.3g} checkpoint intervals of {self.interval_s:g} s "
                             "(more than 5e6 to simulate): fewer days or a longer --checkpoint-interval-s")

    @property
    def total_rate_per_s(self) -> float:
        return sum(m.rate_per_s for m in self.modes)

    @property
    def max_wall_s(self) -> float:
        """Wall time after which a campaign stops as hopeless (1000 x its work)."""
        return 1000.0 * self.work_s + 1e6


@dataclass(frozen=True, kw_only=True, slots=True)
class CampaignRun:
    seed: int
    wall_s: float
    goodput: float
    failures: dict[str, int]
    lost_work_s: float
    checkpoint_s: float
    recovery_s: float
    spare_wait_s: float
    finished: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class CampaignSummary:
    runs: tuple[CampaignRun, ...]
    goodput_mean: float
    goodput_ci95: tuple[float, float]
    wall_s_mean: float
    failures_mean: float
    spare_wait_s_mean: float
    unfinished: int = 0
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, object]:
        return {"seeds": len(self.runs), "goodput_mean": self.goodput_mean,
                "goodput_ci95": list(self.goodput_ci95), "wall_s_mean": self.wall_s_mean,
                "failures_mean": self.failures_mean, "spare_wait_s_mean": self.spare_wait_s_mean,
                "unfinished": self.unfinished,
                "goodput_by_seed": [r.goodput for r in self.runs], "notes": list(self.notes)}


class _Failure(Exception):
    def __init__(self, mode: FailureMode) -> None:
        self.mode = mode


def campaign_events(spec: CampaignSpec) -> float:
    """The simpy events one campaign is expected to schedule (its cost, ``sim.base.limits``): two per
    checkpoint interval it computes (the segment, the write) and four per failure (the failure,
    the spare, the repair, the recovery), over its expected wall time: Daly's eq. (13) with the
    job running only the fraction ``f`` of the time the spares allow (node failures beyond
    ``(spares + 1) / repair_s`` wait for a repaired node), up to ``max_wall_s``.  Within 30%
    of the simulated count from healthy to hopeless campaigns (tests/test_bounds.py)."""
    from planner.economics.goodput import daly_goodput

    rate = spec.total_rate_per_s
    node_rate = sum(m.rate_per_s for m in spec.modes if m.needs_node)
    f = 1.0 if node_rate <= 0 or spec.repair_s <= 0 else min(1.0, (spec.num_spares + 1) / (spec.repair_s * node_rate))
    g = daly_goodput(spec.interval_s, spec.write_s, spec.restart_s + spec.restore_s,
                     1.0 / rate if rate > 0 else math.inf) * f
    wall = spec.max_wall_s if g <= 0 else min(spec.max_wall_s, spec.work_s / g)
    return 2.0 * f * wall / (spec.interval_s + spec.write_s) + 4.0 * rate * f * wall + 2.0


def simulate_campaign(spec: CampaignSpec, *, seed: int = 0, max_wall_s: float | None = None) -> CampaignRun:
    """One campaign (module docstring); ``max_wall_s`` stops a hopeless run (default
    ``spec.max_wall_s``, 1000 x work)."""
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    # A failed node goes to repair before its replacement is taken, so the pool plus the
    # nodes in repair never exceed num_spares + 1.
    spares = simpy.Container(env, capacity=spec.num_spares + 1, init=spec.num_spares)
    total = spec.total_rate_per_s
    probs = np.array([m.rate_per_s for m in spec.modes]) / total if total > 0 else None
    limit = max_wall_s if max_wall_s is not None else spec.max_wall_s
    stats = {"ckpt": 0.0, "recovery": 0.0, "wait": 0.0}
    failures: dict[str, int] = {m.name: 0 for m in spec.modes}
    state = {"done": 0.0, "finished": False}
    next_fail = [rng.exponential(1.0 / total) if total > 0 else math.inf]

    def run_for(duration: float):
        """Run ``duration`` seconds unless the next failure comes first."""
        start = env.now
        if next_fail[0] <= start + duration:
            yield env.timeout(max(0.0, next_fail[0] - start))
            mode = spec.modes[int(rng.choice(len(spec.modes), p=probs))]
            next_fail[0] = env.now + rng.exponential(1.0 / total)
            raise _Failure(mode)
        yield env.timeout(duration)

    def repair():
        yield env.timeout(spec.repair_s)
        yield spares.put(1)

    def job():
        recovering = False
        while state["done"] < spec.work_s - 1e-9 and env.now < limit:
            try:
                if recovering:
                    t0 = env.now
                    yield from run_for(spec.restart_s + spec.restore_s)
                    stats["recovery"] += env.now - t0
                    recovering = False
                seg = min(spec.interval_s, spec.work_s - state["done"])
                yield from run_for(seg)
                t0 = env.now
                yield from run_for(spec.write_s)
                stats["ckpt"] += env.now - t0
                state["done"] += seg
            except _Failure as f:
                failures[f.mode.name] += 1  # the uncommitted segment's progress is lost
                recovering = True
                if f.mode.needs_node:
                    env.process(repair())
                    t0 = env.now
                    yield spares.get(1)
                    stats["wait"] += env.now - t0
                    # failures are memoryless: restart the failure clock after the wait
                    if next_fail[0] < env.now:
                        next_fail[0] = env.now + rng.exponential(1.0 / total)
        state["finished"] = state["done"] >= spec.work_s - 1e-9

    proc = env.process(job())
    env.run(until=proc)
    wall = env.now
    done = state["done"]
    return CampaignRun(seed=seed, wall_s=wall, goodput=done / wall if wall > 0 else 0.0, failures=failures,
                       lost_work_s=max(0.0, wall - done - stats["ckpt"] - stats["recovery"] - stats["wait"]),
                       checkpoint_s=stats["ckpt"], recovery_s=stats["recovery"], spare_wait_s=stats["wait"],
                       finished=state["finished"])


def run_campaigns(spec: CampaignSpec, *, seeds: int = 20, first_seed: int = 0) -> CampaignSummary:
    """``seeds`` independent campaigns and their goodput mean with a 95% CI."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= 10000:
        raise InputError("seeds", seeds, "must be an integer in [1, 10000]")
    check_work("seeds", seeds, seeds * campaign_events(spec), limits.CAMPAIGN_MAX_EVENTS, unit="simulated events",
               hint="fewer --seeds or --campaign-days, or --no-simulation (Daly's closed form alone)")
    progress.start("simulating campaigns")
    runs = []
    for i in range(seeds):
        runs.append(simulate_campaign(spec, seed=first_seed + i))
        progress.tick("simulating campaigns", i + 1, seeds, "seeds")
    mean, lo, hi = mean_ci95([r.goodput for r in runs])
    notes = []
    unfinished = sum(not r.finished for r in runs)
    if unfinished:
        notes.append(f"{unfinished} of {seeds} campaigns hit the wall-time limit (goodput near zero)")
    return CampaignSummary(runs=tuple(runs), goodput_mean=mean, goodput_ci95=(lo, hi),
                           wall_s_mean=float(np.mean([r.wall_s for r in runs])),
                           failures_mean=float(np.mean([sum(r.failures.values()) for r in runs])),
                           spare_wait_s_mean=float(np.mean([r.spare_wait_s for r in runs])),
                           unfinished=unfinished, notes=tuple(notes))
