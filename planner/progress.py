"""Progress of long work on stderr, with an estimate of the time left.

A command whose work grows with its input and may run past a few seconds (the strategy search
on a cluster of 10^5 GPUs, Monte-Carlo goodput campaigns, a sweep of cluster designs) reports
how far it is: one line on stderr every few seconds once it has run ``after_s``, with the time
left extrapolated from the rate so far.  stdout is untouched, so ``--json`` output stays clean;
a run that ends within ``after_s`` prints nothing.

The command line turns reporting on for the duration of a command (``reporting``); library code
calls ``tick`` / ``start`` unconditionally, which cost nothing when no report is active (tests,
the app, library callers).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from typing import Iterator, TextIO

_ACTIVE: contextvars.ContextVar["Reporter | None"] = contextvars.ContextVar("progress", default=None)


class Reporter:
    """Writes progress lines for one command (module docstring)."""

    def __init__(self, command: str, *, stream: TextIO | None = None, after_s: float = 5.0,
                 every_s: float = 5.0) -> None:
        self.command, self.stream = command, stream
        self.after_s, self.every_s = after_s, every_s
        self.start = time.monotonic()
        self._last = -float("inf")
        self._task_start: dict[str, float] = {}

    def line(self, text: str) -> None:
        print(f"{self.command}: {text}", file=self.stream or sys.stderr, flush=True)

    def tick(self, task: str, done: int, total: int, unit: str) -> None:
        now = time.monotonic()
        if task not in self._task_start:  # no rate yet: the estimate starts here
            self._task_start[task] = now
            return
        t0 = self._task_start[task]
        if now - self.start < self.after_s or now - self._last < self.every_s or done <= 0 or total <= 0 \
                or now <= t0:
            return
        self._last = now
        spent = now - t0
        left = spent * (total - done) / done
        self.line(f"{task} {done / total:.0%} ({done:,}/{total:,} {unit}), {now - self.start:.0f} s so far, "
                  f"about {left:.0f} s left")


@contextlib.contextmanager
def reporting(command: str, *, stream: TextIO | None = None, after_s: float = 5.0,
              every_s: float = 5.0) -> Iterator[Reporter]:
    """Report progress (``tick``) on stderr while the block runs."""
    rep = Reporter(command, stream=stream, after_s=after_s, every_s=every_s)
    token = _ACTIVE.set(rep)
    try:
        yield rep
    finally:
        _ACTIVE.reset(token)


def tick(task: str, done: int, total: int, unit: str) -> None:
    """``done`` of ``total`` ``unit`` of ``task`` are finished (a no-op unless ``reporting``)."""
    rep = _ACTIVE.get()
    if rep is not None:
        rep.tick(task, done, total, unit)


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """No reports inside the block (a forked worker: the parent reports for it)."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def start(task: str) -> None:
    """``task`` begins now: its time-left estimate counts from here (a no-op unless ``reporting``)."""
    rep = _ACTIVE.get()
    if rep is not None:
        rep._task_start[task] = time.monotonic()
