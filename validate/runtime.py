"""What every rank does around a measurement: join the job, time things, leave cleanly.

Runs inside the ranks that ``torchrun`` (or ``srun``) starts.  The backend is NCCL when a
GPU is present and gloo otherwise, so the same code runs on a laptop and on a GPU node.
"""

from __future__ import annotations

import ctypes
import datetime
import math
import os
import signal
import socket
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class Env:
    """Where this rank runs."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device
    threads: int

    @property
    def node(self) -> int:
        return self.rank // self.local_world_size

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)

    def sync(self) -> None:
        """Wait for queued device work (a no-op on CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when its launcher dies, so no rank outlives the job."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def host_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def init(*, timeout_s: float = 300.0, threads: int | None = None) -> Env:
    """Join the process group from the ``torchrun``/``srun`` environment variables."""
    _die_with_parent()
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", str(world))))
    if torch.cuda.is_available():
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    if threads is None:
        threads = max(1, host_cores() // local_world) if device.type == "cpu" else 4
    torch.set_num_threads(threads)
    if not dist.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return Env(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
               backend=backend, device=device, threads=threads)


def shutdown() -> None:
    """Barrier, then destroy the process group (every rank leaves together)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def describe(env: Env) -> dict[str, object]:
    """The environment a measurement was taken in (recorded with every result)."""
    info: dict[str, object] = {
        "hostname": socket.gethostname(), "torch": torch.__version__, "backend": env.backend,
        "device_type": env.device.type, "world_size": env.world_size,
        "local_world_size": env.local_world_size, "num_nodes": env.num_nodes,
        "threads_per_rank": env.threads, "host_cores": host_cores(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if env.device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(env.device)
        info["device_memory_bytes"] = torch.cuda.get_device_properties(env.device).total_memory
    else:
        info["device_name"] = cpu_model_name()
        info["host_memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return info


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def time_call(fn: Callable[[], object], env: Env, *, min_reps: int = 3, min_time_s: float = 0.05,
              max_reps: int = 1000, warmup: int = 1) -> float:
    """Median seconds of one call of ``fn`` (device-synchronised)."""
    for _ in range(warmup):
        fn()
    env.sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < min_time_s):
        t0 = time.perf_counter()
        fn()
        env.sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_collective(fn: Callable[[], object] | None, env: Env, *, min_time_s: float = 0.05,
                    max_reps: int = 200, warmup: int = 2) -> float:
    """Median seconds of one call of collective ``fn``; every rank of the job must call this.

    All ranks must issue the same number of collectives, so the repetition count is agreed
    (the largest any rank wants) before timing.  Ranks outside the measured groups pass
    ``fn=None`` and only take part in the agreement.
    """
    if fn is not None:
        for _ in range(warmup):
            fn()
        env.sync()
        t0 = time.perf_counter()
        fn()
        env.sync()
        one = max(time.perf_counter() - t0, 1e-7)
        want = float(min(max_reps, max(3, math.ceil(min_time_s / one))))
    else:
        want = 0.0
    reps = int(max_over_ranks(want, env))
    if fn is None:
        return 0.0
    times: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        env.sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def max_over_ranks(value: float, env: Env, group: dist.ProcessGroup | None = None) -> float:
    """The largest ``value`` over the ranks (the slowest rank sets the pace)."""
    t = torch.tensor([value], dtype=torch.float64, device=env.device if env.backend == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


# ------------------------------------------------------------------------ memory


class PeakMemory:
    """Peak memory of this rank during a block, in bytes.

    GPU: ``torch.cuda.max_memory_allocated`` (tensors only, as the simulator counts).  CPU:
    the growth of the resident set, peak (``VmHWM``, reset through ``/proc/self/clear_refs``)
    minus the resident set at the start: tensors plus allocator slack.
    """

    def __init__(self, env: Env) -> None:
        self.env = env
        self.base = 0.0

    def start(self) -> None:
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)
            torch.cuda.reset_peak_memory_stats(self.env.device)
            self.base = float(torch.cuda.memory_allocated(self.env.device))
        else:
            try:
                with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                    fh.write("5")
            except OSError:
                pass
            self.base = _proc_status_bytes("VmRSS")

    def peak_bytes(self) -> float:
        if self.env.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.env.device)) - self.base
        return max(0.0, _proc_status_bytes("VmHWM") - self.base)


def _proc_status_bytes(key: str) -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    return 0.0


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_snapshot() -> tuple[float, float]:
    """(CPU seconds the whole host has been busy, incl. hypervisor steal; CPU seconds of this
    process, all threads).  Differences over an interval tell how much of the host other
    processes took (``validate.workloads`` uses it to discard contended steps)."""
    busy = 0.0
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            parts = fh.readline().split()
        # cpu user nice system idle iowait irq softirq steal guest guest_nice
        vals = [float(x) for x in parts[1:9]]
        busy = (vals[0] + vals[1] + vals[2] + vals[5] + vals[6] + vals[7]) / _CLK_TCK
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    return busy, t.user + t.system


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
