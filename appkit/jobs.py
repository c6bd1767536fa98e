"""Long computations (the recommender's search) run in a background thread, stage by stage.

The page asks for a design's recommendation with ``JobStore.start``; the search runs in a
daemon thread and reports its stages through the ``progress`` callback ``planner.plans.recommend``
calls at each phase (search, rank and verify, event re-ranking, explanation).  The page polls
``Job.stages`` to draw progress and takes ``Job.result`` when it is done.  A Streamlit rerun (the
user edits an input while the search runs) interrupts the page, not the search: the next run
finds the same job by its key and keeps waiting.  Finished jobs stay in the store (least
recently used first out), so a design seen before comes back at once, for every session of the
server.  A job that nobody waits for any more is cancelled at its next stage boundary.

Nothing here imports Streamlit; ``appkit.ui`` draws the stages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from sim.base.errors import InputError

_log = logging.getLogger(__name__)

Progress = Callable[[str], None]


class Cancelled(Exception):
    """Raised inside a job's ``progress`` callback once the job was cancelled."""


@dataclass(slots=True)
class Stage:
    """One phase of a job: what it does and when it started and ended (``time.monotonic``)."""

    name: str
    started: float
    ended: float | None = None

    def seconds(self, now: float | None = None) -> float:
        end = self.ended if self.ended is not None else (time.monotonic() if now is None else now)
        return end - self.started


@dataclass(slots=True)
class Job:
    """A computation and what it has done so far.  ``result`` or ``error`` is set once ``done``."""

    key: str
    started: float = field(default_factory=time.monotonic)
    stages: list[Stage] = field(default_factory=list)
    result: Any = None
    error: BaseException | None = None
    ended: float | None = None
    _done: threading.Event = field(default_factory=threading.Event)
    _cancel: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def progress(self, stage: str) -> None:
        """Start stage ``stage`` (ends the previous one); raises ``Cancelled`` after ``cancel``."""
        if self._cancel.is_set():
            raise Cancelled(self.key)
        now = time.monotonic()
        with self._lock:
            if self.stages and self.stages[-1].ended is None:
                self.stages[-1].ended = now
            self.stages.append(Stage(stage, now))

    def snapshot(self) -> list[Stage]:
        """A copy of the stages, safe to read while the job runs."""
        with self._lock:
            return [Stage(s.name, s.started, s.ended) for s in self.stages]

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)

    def seconds(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            if self.stages and self.stages[-1].ended is None:
                self.stages[-1].ended = now
            self.result, self.error, self.ended = result, error, now
        self._done.set()


class JobStore:
    """Jobs by key: at most one running per key; the last ``max_done`` finished ones kept."""

    def __init__(self, *, max_done: int = 32) -> None:
        self.max_done = max_done
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Job | None:
        """The job for ``key`` (running or done), or ``None``; a hit counts as a use."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None:
                self._jobs.move_to_end(key)
            return job

    def finished(self, key: str) -> bool:
        """Whether ``key``'s result (or error) is ready, without waiting."""
        job = self.get(key)
        return job is not None and job.done

    def start(self, key: str, fn: Callable[[Progress], Any]) -> Job:
        """The job for ``key``: the existing one (running or done), else ``fn(progress)``
        started in a daemon thread.  A cancelled job is replaced by a fresh one."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and not job.cancelled:
                self._jobs.move_to_end(key)
                return job
            job = Job(key=key)
            self._jobs[key] = job
            self._trim()
        threading.Thread(target=self._run, args=(job, fn), name=f"appkit-job-{id(job):x}", daemon=True).start()
        return job

    def cancel(self, key: str) -> None:
        """Ask a running job to stop at its next stage (its partial result is dropped)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and not job.done:
                job._cancel.set()
                del self._jobs[key]

    def _run(self, job: Job, fn: Callable[[Progress], Any]) -> None:
        try:
            result = fn(job.progress)
        except Cancelled:
            job._finish(error=Cancelled(job.key))
        except BaseException as exc:  # noqa: BLE001  handed to the page, which shows one line
            if not isinstance(exc, InputError):  # the server log keeps the traceback
                _log.exception("what-if app: background job failed")
            job._finish(error=exc)
        else:
            job._finish(result=result)

    def _trim(self) -> None:
        done = [k for k, j in self._jobs.items() if j.done]
        for k in done[:max(0, len(done) - self.max_done)]:
            del self._jobs[k]
