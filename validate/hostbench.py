"""Host-side microbenchmarks: host memory bandwidth and host<->device copies.

**Host memory** (every device).  STREAM's copy ``a = b`` and triad ``a = b + s c`` (J. D.
McCalpin, "Sustainable Memory Bandwidth in Current High Performance Computers", 1995,
https://www.cs.virginia.edu/~mccalpin/papers/bandwidth/node2.html) on fp32 host tensors of
``cfg.host_memory_bytes`` per buffer, run by torch's own kernels (``Tensor.copy_``,
``torch.add(b, c, alpha=s, out=a)``) on the rank's threads.  Bytes are counted as STREAM
counts them, explicitly: every element read once and written once, so copy moves 2 and triad
3 buffers per call; the write-allocate reads a cache may add are not counted (G. Hager, "The
McCalpin STREAM benchmark: how to do it right and interpret the results", 2019,
https://blogs.fau.de/hager/archives/8263).  The buffers are written before timing, so no
page fault is timed (one set of buffers of the largest size, viewed at the smaller ones).  All ranks of a host run at once, as offloading ranks share the host's
memory; a record holds the slowest rank's median time and the host's rate: the bytes all the
host's ranks moved over that time (each sample starts at a barrier, so the window from the
barrier to the last rank's end holds every rank's traffic; a lower bound when ranks finish
unevenly, never the sum of rates that did not overlap).

**Host<->device copies** (CUDA).  H2D ``dev.copy_(host)`` and D2H ``host.copy_(dev)`` of
``cfg.host_copy_bytes``, from and to pinned (page-locked, ``torch.empty(pin_memory=True)``)
and pageable host buffers.  Pinned copies are issued ``non_blocking=True``: a
``cudaMemcpyAsync`` from page-locked memory is queued on the stream, so they run back to
back.  Pageable copies are plain ``copy_`` calls: the driver stages them through its own
pinned buffer and the call returns when it is done (CUDA Runtime API, "API synchronization
behavior", https://docs.nvidia.com/cuda/cuda-runtime-api/api-sync-behavior.html), which is
what a pageable copy costs a training step.  Timed like the other GPU benchmarks: CUDA events
around back-to-back copies and one synchronisation per sample (``validate.timing``), every
rank of the host copying at once, the slowest rank's median.  Without CUDA nothing is
copied: one record per path says it was not measured, and the fit writes nothing for it.

Records are plain dicts (JSON); seconds and bytes.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from validate.runtime import Env
from validate.specs import HOST_COPY_PATHS, STREAM_BUFFERS, MicrobenchConfig
from validate.timing import collective_s, max_over_ranks

CPU = torch.device("cpu")
TRIAD_SCALAR = 3.0


def bench_host_memory(env: Env, cfg: MicrobenchConfig, rec) -> None:
    """STREAM copy and triad on host buffers (module docstring)."""
    elt = 4  # fp32
    if not cfg.host_memory_bytes:
        return
    most = max(1, int(max(cfg.host_memory_bytes)) // elt)
    # one set of buffers, written once (first touch), viewed at every size
    big = [torch.full((most,), float(i), dtype=torch.float32) for i in range(3)]
    for size in sorted(cfg.host_memory_bytes):
        numel = max(1, int(size) // elt)
        a, b, c = (t[:numel] for t in big)
        kernels: dict[str, Callable[[], object]] = {
            "copy": lambda: a.copy_(b),
            "triad": lambda: torch.add(b, c, alpha=TRIAD_SCALAR, out=a),
        }
        for op, fn in kernels.items():
            traffic = float(STREAM_BUFFERS[op] * numel * elt)
            dist.barrier()
            t = max_over_ranks(collective_s(fn, env.device, min_time_s=cfg.host_min_time_s, warmup=1, clock=CPU),
                               env.device)
            rec.add(kind="host_memory", op=op, dtype="fp32", buffer_bytes=float(numel * elt), bytes=traffic,
                    time_s=t, host_bytes_per_s=env.local_world_size * traffic / t,
                    ranks_per_host=env.local_world_size, threads_per_rank=env.threads)
    del big


def copy_fn(direction: str, dev: torch.Tensor, host: torch.Tensor, *, pinned: bool) -> Callable[[], object]:
    """One copy of ``host`` to ``dev`` (``h2d``) or back (``d2h``): asynchronous from pinned
    memory, a plain (synchronous) copy from pageable memory (module docstring)."""
    if direction == "h2d":
        return lambda: dev.copy_(host, non_blocking=pinned)
    if direction == "d2h":
        return lambda: host.copy_(dev, non_blocking=pinned)
    raise ValueError(f"direction={direction!r}: must be h2d or d2h")


def bench_host_copy(env: Env, cfg: MicrobenchConfig, rec) -> None:
    """H2D and D2H copies, pinned and pageable, over ``cfg.host_copy_bytes`` (CUDA only)."""
    if env.device.type != "cuda":
        for direction, pinned in HOST_COPY_PATHS:
            rec.add(kind="host_copy", direction=direction, pinned=pinned, measured=False,
                    reason=f"no CUDA device (ranks on {env.device.type})")
        return
    for size in cfg.host_copy_bytes:
        dev = torch.ones(int(size), dtype=torch.uint8, device=env.device)
        for pinned in (True, False):
            host = torch.empty(int(size), dtype=torch.uint8, pin_memory=pinned)
            host.fill_(1)  # pageable pages touched before timing
            for direction in ("h2d", "d2h"):
                dist.barrier()
                t = collective_s(copy_fn(direction, dev, host, pinned=pinned), env.device,
                                 min_time_s=cfg.host_min_time_s, warmup=1, max_calls=1000)
                rec.add(kind="host_copy", direction=direction, pinned=pinned, measured=True, bytes=float(size),
                        time_s=max_over_ranks(t, env.device), concurrent_ranks=env.local_world_size)
            torch.cuda.synchronize(env.device)
            del host
        del dev


def run(env: Env, cfg: MicrobenchConfig, rec) -> None:
    bench_host_memory(env, cfg, rec)
    bench_host_copy(env, cfg, rec)
