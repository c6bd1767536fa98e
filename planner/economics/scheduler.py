"""A simpy simulation of a shared GPU cluster: gang scheduling, failures, elastic jobs.

Model.  ``num_nodes`` identical nodes; a job asks for ``ceil(num_gpus / gpus_per_node)``
nodes and starts only when all of them are free (gang scheduling).  Work is measured in
seconds at the requested size; a job on ``k`` of its ``n`` nodes progresses at ``k/n`` (linear
scaling, an optimistic assumption for shrunk elastic jobs).  Policies (``POLICIES``):

* ``fifo``: jobs start in submission order; the first job that does not fit blocks the rest.
* ``backfill``: EASY backfilling (Lifka 1995; Mu'alem & Feitelson 2001, IEEE TPDS 12(6)):
  FIFO, but when the head job is blocked it gets a reservation at the *shadow time* (when
  enough running jobs will have ended, by their users' estimates); a later job may start now
  if it fits in the free nodes and either ends by the shadow time (by its estimate) or only
  uses nodes the head job will not need (the *extra* nodes).
* ``priority``: like ``fifo`` but ordered by descending ``priority`` (then submission time);
  non-preemptive.

An elastic job at the head of the queue may start on fewer nodes (at least ``min_gpus``).

Failures.  Each node fails as a Poisson process: at rate ``node_failure_rate_per_s`` it goes
down for ``repair_s`` (GPU, host, NIC failures of ``catalogs/failures.yaml``), and at rate
``job_failure_rate_per_s`` it interrupts the job on it without going down (software, switch
and cable failures).  An interrupted job loses its progress since its last checkpoint (one
every ``checkpoint_interval_s`` of progress) and pays ``restart_s`` before computing again.
A rigid job that lost a node returns to the queue (keeping its submission time, so it goes
first); an elastic job that still has ``min_gpus`` shrinks and continues.  Elastic jobs grow
back to their size when nodes are free and nobody is queued, paying ``reconfigure_s`` (a
planned resize checkpoints first, so no work is lost).

Reported: utilisation (allocated node-time over capacity during the makespan), useful
utilisation (failure-free work over capacity), queue wait and job completion time (JCT) per
job with mean/median/95th percentile, and an event log.  Known error: node-granular, no
topology-aware placement, no preemption, linear elastic scaling.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import simpy

from sim.base import limits
from sim.base.errors import InputError

from planner import progress

from planner.economics.failures import load_failure_model
from planner.economics.traces import JobSpec

POLICIES: tuple[str, ...] = ("fifo", "backfill", "priority")
QUEUE_STEP = 100  # work units of examining one queued job (ClusterSim._spend)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    num_nodes: int
    gpus_per_node: int
    node_failure_rate_per_s: float = 0.0  # per node; the node goes down for repair_s
    job_failure_rate_per_s: float = 0.0  # per node; restarts the job on it, node stays up
    # recovery times: catalogs/failures.yaml ``recovery`` unless given
    repair_s: float = field(default_factory=lambda: load_failure_model().repair_s)
    restart_s: float = field(default_factory=lambda: load_failure_model().restart_s)
    reconfigure_s: float = field(default_factory=lambda: load_failure_model().reconfigure_s)
    checkpoint_interval_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("num_nodes", "gpus_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 20:
                raise InputError(name.replace("_", "-"), v, "must be an integer in [1, 1048576]")
        for name in ("node_failure_rate_per_s", "job_failure_rate_per_s", "repair_s", "restart_s", "reconfigure_s"):
            v = getattr(self, name)
            if not (0 <= v < math.inf):
                raise InputError(name.replace("_", "-"), v, "must be a finite number >= 0")
        if not (0 < self.checkpoint_interval_s < math.inf):
            raise InputError("checkpoint-interval-s", self.checkpoint_interval_s, "must be a positive finite number")


@dataclass(frozen=True, kw_only=True, slots=True)
class JobRecord:
    job_id: str
    nodes: int
    submit_s: float
    start_s: float | None
    end_s: float | None
    restarts: int
    shrinks: int
    grows: int

    @property
    def wait_s(self) -> float | None:
        return None if self.start_s is None else self.start_s - self.submit_s

    @property
    def jct_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.submit_s


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleResult:
    policy: str
    jobs: tuple[JobRecord, ...]
    makespan_s: float
    utilisation: float
    useful_utilisation: float
    node_failures: int
    job_interruptions: int
    log: tuple[tuple[float, str, str], ...]
    unfinished: int = 0

    def summary(self) -> dict[str, object]:
        waits = np.array([j.wait_s for j in self.jobs if j.wait_s is not None])
        jcts = np.array([j.jct_s for j in self.jobs if j.jct_s is not None])

        def stats(x: np.ndarray) -> dict[str, float]:
            if x.size == 0:
                return {"mean": float("nan"), "p50": float("nan"), "p95": float("nan")}
            return {"mean": float(x.mean()), "p50": float(np.percentile(x, 50)), "p95": float(np.percentile(x, 95))}

        return {"policy": self.policy, "num_jobs": len(self.jobs), "unfinished": self.unfinished,
                "makespan_s": self.makespan_s, "utilisation": self.utilisation,
                "useful_utilisation": self.useful_utilisation, "queue_wait_s": stats(waits),
                "jct_s": stats(jcts), "node_failures": self.node_failures,
                "job_interruptions": self.job_interruptions,
                "restarts": sum(j.restarts for j in self.jobs), "shrinks": sum(j.shrinks for j in self.jobs),
                "grows": sum(j.grows for j in self.jobs)}


class _Job:
    """Mutable run-time state of one job (work in seconds at the requested size)."""

    __slots__ = ("spec", "seq", "nodes_req", "min_nodes", "done", "alloc", "state", "first_start", "end",
                 "seg_start", "overhead_left", "proc", "restarts", "shrinks", "grows", "run_start")

    def __init__(self, spec: JobSpec, seq: int, gpn: int) -> None:
        self.spec = spec
        self.seq = seq
        self.nodes_req = -(-spec.num_gpus // gpn)
        self.min_nodes = -(-spec.min_gpus_or_all // gpn)
        self.done = 0.0
        self.alloc: list[int] = []
        self.state = "pending"
        self.first_start: float | None = None
        self.end: float | None = None
        self.seg_start = 0.0
        self.overhead_left = 0.0
        self.proc: simpy.Process | None = None
        self.restarts = self.shrinks = self.grows = 0
        self.run_start = 0.0

    @property
    def rate(self) -> float:
        return len(self.alloc) / self.nodes_req

    @property
    def remaining(self) -> float:
        return max(0.0, self.spec.duration_s - self.done)

    def est_remaining_s(self, now: float) -> float:
        """Time left by the user's estimate (scaled to the remaining work and the rate)."""
        ratio = self.spec.estimate_or_duration_s / self.spec.duration_s
        rate = self.rate if self.alloc else 1.0
        return self.overhead_left + self.remaining * ratio / rate


class ClusterSim:
    """One simulation run (module docstring).  ``failures`` replaces the random failure
    processes by explicit ``(time_s, node, takes_node_down)`` events (for tests)."""

    def __init__(self, cluster: ClusterSpec, jobs: Sequence[JobSpec], *, policy: str = "fifo", seed: int = 0,
                 failures: Sequence[tuple[float, int, bool]] | None = None, max_time_s: float = 10 * 365 * 86400.0):
        if policy not in POLICIES:
            raise InputError("policy", policy, f"must be one of {', '.join(POLICIES)}")
        if not jobs:
            raise InputError("trace", 0, "no jobs to schedule")
        self.c = cluster
        self.policy = policy
        self.env = simpy.Environment()
        self.rng = np.random.default_rng(seed)
        self.jobs = [_Job(s, i, cluster.gpus_per_node) for i, s in enumerate(sorted(jobs, key=lambda j: j.submit_s))]
        for j in self.jobs:
            if j.min_nodes > cluster.num_nodes:
                raise InputError(f"job[{j.spec.job_id}].num_gpus", j.spec.num_gpus,
                                 f"needs {j.min_nodes} nodes; the cluster has {cluster.num_nodes}")
        self.free = set(range(cluster.num_nodes))
        self.down: set[int] = set()
        self.owner: dict[int, _Job] = {}
        self.queue: list[_Job] = []  # kept sorted by the policy's key
        self.running: dict[int, _Job] = {}  # seq -> job
        self.log: list[tuple[float, str, str]] = []
        self.node_failures = self.job_interruptions = 0
        self.completed = 0
        self.all_done = self.env.event()
        self._busy_node_s = 0.0
        self._last_t = 0.0
        self.max_time_s = max_time_s
        for t, node, _down in failures or ():
            if not 0 <= node < cluster.num_nodes:
                raise InputError("failures.node", node, f"must be in [0, {cluster.num_nodes})")
            if not (0 <= t < math.inf):
                raise InputError("failures.time_s", t, "must be a finite number >= 0")
        self.explicit_failures = failures
        self.work = 0  # node and queue entries touched: the simulation's cost (sim.base.limits)

    # ------------------------------------------------------------------ bookkeeping
    def _spend(self, units: int) -> None:
        """Count ``units`` of work (a node moved or sorted: 1; a queued job examined by the
        policy: ``QUEUE_STEP``, a Python-level step that costs about a hundred C-level set operations);
        past ``sim.base.limits.SCHEDULE_MAX_WORK`` the run is refused (failures faster than big jobs
        checkpoint keep a run going until ``max_time_s``)."""
        self.work += units
        if self.work > limits.SCHEDULE_MAX_WORK:
            raise InputError("jobs", len(self.jobs),
                             f"jobs on {self.c.num_nodes:,} nodes need more than {limits.SCHEDULE_MAX_WORK:,} node and "
                             f"queue steps per policy (about a minute on 2 cores; docs/interface.md Limits; "
                             f"{self.completed:,} jobs were done at {self.env.now / 86400:.0f} simulated days): fewer "
                             "jobs or nodes, one --policy, or --no-failures")

    def _tick(self) -> None:
        now = self.env.now
        self._busy_node_s += (self.c.num_nodes - len(self.free) - len(self.down)) * (now - self._last_t)
        self._last_t = now

    def _event(self, kind: str, job: str) -> None:
        self.log.append((round(self.env.now, 6), kind, job))

    def _account(self, job: _Job) -> None:
        """Credit progress (or overhead) since the current segment started."""
        el = self.env.now - job.seg_start
        if job.overhead_left > 0:
            used = min(el, job.overhead_left)
            job.overhead_left -= used
            el -= used
        job.done = min(job.spec.duration_s, job.done + el * job.rate)
        job.seg_start = self.env.now

    def _lose_since_checkpoint(self, job: _Job) -> None:
        iv = self.c.checkpoint_interval_s
        job.done = math.floor(job.done / iv + 1e-9) * iv

    def _key(self, job: _Job) -> tuple:
        if self.policy == "priority":
            return (-job.spec.priority, job.spec.submit_s, job.seq)
        return (job.spec.submit_s, job.seq)

    def _enqueue(self, job: _Job) -> None:
        job.state = "queued"
        bisect.insort(self.queue, job, key=self._key)

    # ------------------------------------------------------------------ processes
    def _arrivals(self):
        for job in self.jobs:
            if job.spec.submit_s > self.env.now:
                yield self.env.timeout(job.spec.submit_s - self.env.now)
            self._enqueue(job)
            self._event("submit", job.spec.job_id)
            self._schedule()

    def _run(self, job: _Job):
        while True:
            job.seg_start = self.env.now
            dur = job.overhead_left + job.remaining / job.rate
            try:
                yield self.env.timeout(dur)
            except simpy.Interrupt as intr:
                if intr.cause == "stop":
                    return
                continue  # resized or restarted in place: the handler updated the state
            self._account(job)
            job.done = job.spec.duration_s
            self._finish(job)
            return

    def _finish(self, job: _Job) -> None:
        self._tick()
        self._spend(len(job.alloc) + 1)
        for n in job.alloc:
            self.free.add(n)
            self.owner.pop(n, None)
        job.alloc = []
        job.state = "done"
        self.running.pop(job.seq, None)
        job.end = self.env.now
        self.completed += 1
        self._event("end", job.spec.job_id)
        if self.completed == len(self.jobs):
            self.all_done.succeed()
        progress.tick(f"scheduling ({self.policy})", self.completed, len(self.jobs), "jobs done")
        self._schedule()

    def _random_failures(self, rate: float, takes_node_down: bool):
        total = rate * self.c.num_nodes
        while True:
            yield self.env.timeout(float(self.rng.exponential(1.0 / total)))
            self._fail(int(self.rng.integers(self.c.num_nodes)), takes_node_down)

    def _explicit_failures(self, events: Sequence[tuple[float, int, bool]]):
        for t, node, down in sorted(events):
            if t > self.env.now:
                yield self.env.timeout(t - self.env.now)
            self._fail(node, down)

    def _repair(self, node: int):
        yield self.env.timeout(self.c.repair_s)
        self._tick()
        self.down.discard(node)
        self.free.add(node)
        self._event("repaired", f"node{node}")
        self._schedule()

    # ------------------------------------------------------------------ failures
    def _fail(self, node: int, takes_node_down: bool) -> None:
        self._spend(1)
        if node in self.down:
            return
        self._tick()
        job = self.owner.get(node)
        if takes_node_down:
            self.node_failures += 1
            self._event("node_down", f"node{node}")
            self.free.discard(node)
            self.down.add(node)
            self.env.process(self._repair(node))
        if job is None:
            return
        self.job_interruptions += 1
        self._account(job)
        self._lose_since_checkpoint(job)
        job.restarts += 1
        if not takes_node_down:
            job.overhead_left = self.c.restart_s
            self._event("restart", job.spec.job_id)
            job.proc.interrupt("resize")  # restart in place
            return
        self._spend(len(job.alloc))
        job.alloc.remove(node)
        self.owner.pop(node, None)
        if job.spec.elastic and len(job.alloc) >= job.min_nodes:
            job.shrinks += 1
            job.overhead_left = self.c.restart_s
            self._event("shrink", job.spec.job_id)
            job.proc.interrupt("resize")
            self._schedule()
            return
        for n in job.alloc:
            self.free.add(n)
            self.owner.pop(n, None)
        job.alloc = []
        self.running.pop(job.seq, None)
        job.overhead_left = self.c.restart_s
        self._enqueue(job)
        self._event("requeue", job.spec.job_id)
        job.proc.interrupt("stop")
        self._schedule()

    # ------------------------------------------------------------------ scheduling
    def _start(self, job: _Job, nodes: int) -> None:
        self._tick()
        self._spend(len(self.free) + len(self.queue))
        chosen = sorted(self.free)[:nodes]
        for n in chosen:
            self.free.discard(n)
            self.owner[n] = job
        job.alloc = chosen
        job.state = "running"
        self.running[job.seq] = job
        self.queue.remove(job)
        if job.first_start is None:
            job.first_start = self.env.now
        self._event("start", job.spec.job_id)
        job.proc = self.env.process(self._run(job))

    def _fits(self, job: _Job, free: int, head: bool) -> int:
        """Nodes to start ``job`` with given ``free`` nodes, or 0 (elastic heads may start small)."""
        if job.nodes_req <= free:
            return job.nodes_req
        if head and job.spec.elastic and job.min_nodes <= free:
            return free
        return 0

    def _schedule(self) -> None:
        blocked: _Job | None = None
        self._spend(1)
        for job in list(self.queue):
            self._spend(QUEUE_STEP)
            if not self.free:
                break
            if blocked is None:
                n = self._fits(job, len(self.free), head=True)
                if n:
                    self._start(job, n)
                    continue
                blocked = job
                if self.policy != "backfill":
                    break
                shadow, extra = self._reservation(job)
                continue
            # EASY backfill behind the blocked head job
            n = self._fits(job, len(self.free), head=False)
            if not n:
                continue
            ends_in_time = self.env.now + job.spec.estimate_or_duration_s * job.remaining / job.spec.duration_s \
                + job.overhead_left <= shadow + 1e-9
            if ends_in_time or n <= extra:
                if not ends_in_time:
                    extra -= n
                self._start(job, n)
        if not self.queue:
            self._grow()

    def _reservation(self, head: _Job) -> tuple[float, int]:
        """EASY shadow time and extra nodes for the blocked ``head`` job."""
        now = self.env.now
        avail = len(self.free)
        running = sorted(self.running.values(), key=lambda j: j.est_remaining_s(now))
        for j in running:
            avail += len(j.alloc)
            if avail >= head.nodes_req:
                return now + j.est_remaining_s(now), avail - head.nodes_req
        return math.inf, 0

    def _grow(self) -> None:
        for job in sorted((j for j in self.running.values() if len(j.alloc) < j.nodes_req), key=lambda j: j.seq):
            if not self.free:
                return
            self._spend(len(self.free) + len(job.alloc))
            add = sorted(self.free)[: job.nodes_req - len(job.alloc)]
            self._tick()
            self._account(job)
            for n in add:
                self.free.discard(n)
                self.owner[n] = job
            job.alloc = sorted(job.alloc + add)
            job.grows += 1
            job.overhead_left += self.c.reconfigure_s
            self._event("grow", job.spec.job_id)
            job.proc.interrupt("resize")

    # ------------------------------------------------------------------ run
    def run(self) -> ScheduleResult:
        env = self.env
        env.process(self._arrivals())
        if self.explicit_failures is not None:
            env.process(self._explicit_failures(self.explicit_failures))
        else:
            if self.c.node_failure_rate_per_s > 0:
                env.process(self._random_failures(self.c.node_failure_rate_per_s, True))
            if self.c.job_failure_rate_per_s > 0:
                env.process(self._random_failures(self.c.job_failure_rate_per_s, False))
        env.run(until=env.any_of([self.all_done, env.timeout(self.max_time_s)]))
        self._tick()
        first = min(j.spec.submit_s for j in self.jobs)
        ends = [j.end for j in self.jobs if j.end is not None]
        makespan = (max(ends) if len(ends) == len(self.jobs) else env.now) - first
        cap = self.c.num_nodes * makespan
        useful = sum(j.spec.duration_s * j.nodes_req for j in self.jobs if j.end is not None)
        records = tuple(JobRecord(job_id=j.spec.job_id, nodes=j.nodes_req, submit_s=j.spec.submit_s,
                                  start_s=j.first_start, end_s=j.end, restarts=j.restarts, shrinks=j.shrinks,
                                  grows=j.grows) for j in self.jobs)
        return ScheduleResult(policy=self.policy, jobs=records, makespan_s=makespan,
                              utilisation=self._busy_node_s / cap if cap > 0 else 0.0,
                              useful_utilisation=useful / cap if cap > 0 else 0.0,
                              node_failures=self.node_failures, job_interruptions=self.job_interruptions,
                              log=tuple(self.log), unfinished=len(self.jobs) - len(ends))


def simulate_schedule(cluster: ClusterSpec, jobs: Sequence[JobSpec], *, policy: str = "fifo", seed: int = 0,
                      failures: Sequence[tuple[float, int, bool]] | None = None) -> ScheduleResult:
    """Run the shared-cluster simulation once (module docstring)."""
    return ClusterSim(cluster, jobs, policy=policy, seed=seed, failures=failures).run()
