"""Timing kernels and collectives: back-to-back calls, one synchronisation per sample.

GPU: two CUDA events recorded on the current stream around ``n`` back-to-back calls, then
one ``Event.synchronize()``; ``start.elapsed_time(end)`` is the GPU time between them in
milliseconds (PyTorch docs, ``torch.cuda.Event``: ``enable_timing=True``, ``record``,
``elapsed_time``; "CUDA semantics: asynchronous execution" on timing with events).  The host
never waits between calls, so the GPU queue stays full and a call costs what it costs inside
a training step: its kernels plus the gap between launches, not a host round trip.  NCCL
collectives called synchronously make the current stream wait for the communication stream,
so the end event follows their completion.  CPU: ``time.perf_counter`` around the same batch
(CPU ops are synchronous).

Three per-op costs the simulator separates (``sim.layers.compute.op_time``: an op takes
``max(work, host_op_floor_s) + kernel_overhead_s``):

* ``queued_s``: GPU seconds per call with the host ahead of the GPU (a spin kernel,
  ``torch.cuda._sleep``, holds the stream while the host enqueues the batch; PyTorch's own
  stream tests use it the same way), i.e. ``kernel_overhead_s`` for a no-work kernel;
* ``host_s``: wall seconds per call when the host issues a batch and waits once at the end,
  i.e. the dispatch rate that bounds ops shorter than it (``host_op_floor_s`` + overhead);
* ``collective_s``: seconds per call of real work (GEMM, attention, copies, collectives), run
  by all ranks at once with an agreed number of calls, as training runs them.

Units: seconds.  Every function here takes ``device`` (a ``torch.device``) and returns the
median over ``samples`` batches.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

Fn = Callable[[], object]


def sync(device: torch.device) -> None:
    """Wait for queued device work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch_s(fn: Fn, n: int, device: torch.device) -> float:
    """Seconds for ``n`` back-to-back calls of ``fn``, synchronised once at the end."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - t0


def calls_for(one_s: float, budget_s: float, *, samples: int, max_calls: int) -> int:
    """Calls per batch so that ``samples`` batches take about ``budget_s`` (at least one)."""
    return int(min(max_calls, max(1, math.ceil(budget_s / samples / max(one_s, 1e-7)))))


def host_s(fn: Fn, device: torch.device, *, n: int = 2000, samples: int = 3) -> float:
    """Wall seconds per call when the host issues ``n`` calls back to back and waits once:
    for ops shorter than their dispatch, the host's issue rate."""
    for _ in range(min(n, 50)):
        fn()
    sync(device)
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync(device)
        out.append((time.perf_counter() - t0) / n)
    return statistics.median(out)


def queued_s(fn: Fn, device: torch.device, *, n: int = 2000, samples: int = 3) -> float:
    """GPU seconds per call with the stream already full (module docstring).

    A spin kernel long enough to cover the host's enqueueing of ``n`` calls runs first; the
    start event is recorded after it, so the calls run back to back on the GPU.  A sample
    whose enqueueing outlasted the spin is repeated with a longer one.  On a CPU (no queue)
    this is ``host_s``.
    """
    if device.type != "cuda":
        return host_s(fn, device, n=n, samples=samples)
    host = host_s(fn, device, n=min(n, 500), samples=1)
    per_cycle = _spin_seconds_per_cycle(device)
    out = []
    for _ in range(samples):
        need = 2.0 * n * host + 1e-3
        for _attempt in range(4):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            spun = torch.cuda.Event(enable_timing=True)
            before = torch.cuda.Event(enable_timing=True)
            before.record()
            torch.cuda._sleep(int(need / per_cycle))
            spun.record()
            start.record()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            enqueue = time.perf_counter() - t0
            end.record()
            end.synchronize()
            if enqueue < before.elapsed_time(spun) / 1e3:
                break
            need *= 2.0
        out.append(float(start.elapsed_time(end)) / 1e3 / n)
    return statistics.median(out)


def _spin_seconds_per_cycle(device: torch.device) -> float:
    """Seconds per ``torch.cuda._sleep`` cycle on this GPU (timed with events)."""
    cycles = 10_000_000
    torch.cuda._sleep(1000)
    sync(device)
    return max(batch_s(lambda: torch.cuda._sleep(cycles), 1, device) / cycles, 1e-12)


def collective_s(fn: Fn | None, device: torch.device, *, min_time_s: float = 0.05, samples: int = 3,
                 warmup: int = 2, max_calls: int = 200, clock: torch.device | None = None) -> float:
    """Median seconds per call of ``fn`` run by every rank at once (a collective, or a compute
    kernel that all ranks run together as in training); every rank of the job calls this.

    All ranks issue the same number of collectives: the calls per batch are agreed (the most
    any rank wants) before timing, and a barrier starts every batch.  Ranks outside the
    measured groups pass ``fn=None``; they take part in the agreement and the barriers only
    and return 0.  ``clock`` is the device whose clock times the calls (default ``device``):
    ``cpu`` for host-side work on a GPU rank, whose agreement still runs on ``device``.
    """
    clock = device if clock is None else clock
    if fn is not None:
        for _ in range(warmup):
            fn()
        sync(device)
        want = float(calls_for(batch_s(fn, 1, clock), min_time_s, samples=samples, max_calls=max_calls))
    else:
        want = 0.0
    n = int(max_over_ranks(want, device))
    times = []
    for _ in range(samples):
        dist.barrier()
        if fn is not None:
            times.append(batch_s(fn, n, clock) / n)
    return statistics.median(times) if times else 0.0


def max_over_ranks(value: float, device: torch.device, group: dist.ProcessGroup | None = None) -> float:
    """The largest ``value`` over the ranks (the slowest rank sets the pace)."""
    t = torch.tensor([value], dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())
