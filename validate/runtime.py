"""What every rank does around a measurement: join the job, describe where it runs, leave.

Runs inside the ranks that ``torchrun`` (or ``srun``) starts.  The job says which device it
wants (``cuda`` or ``cpu``); a rank asked for ``cuda`` that sees no GPU fails with
``DeviceError`` instead of quietly measuring its CPU.  The backend follows the device: NCCL
on a GPU, gloo on a CPU (PyTorch docs, "Distributed communication package": backends).
Where the rank is comes from ``validate.rankenv`` (torchrun's variables, or Slurm's).
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import socket
import statistics
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from validate.rankenv import DeviceError, from_environ, pick_device
from validate.timing import sync


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
    rank_source: str = "torchrun"

    @property
    def node(self) -> int:
        return self.rank // self.local_world_size

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)

    def sync(self) -> None:
        """Wait for queued device work (a no-op on CPU)."""
        sync(self.device)


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


def init(*, timeout_s: float = 300.0, threads: int | None = None, device: str | None = None,
         world_size: int | None = None) -> Env:
    """Join the process group.  ``device``: ``cuda``, ``cpu`` or None (a GPU if torch sees
    one); ``world_size``: the ranks the job was launched with (checked)."""
    _die_with_parent()
    where = from_environ()
    where.export()
    if world_size is not None and where.world_size != int(world_size):
        raise DeviceError(f"job expects {world_size} ranks, the launcher started {where.world_size} "
                          f"({where.source} variables)")
    dev = pick_device(device, where.local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        backend = "nccl"
    else:
        backend = "gloo"
    if threads is None:
        threads = max(1, host_cores() // where.local_world_size) if dev.type == "cpu" else 4
    torch.set_num_threads(threads)
    if not dist.is_initialized():
        # device_id binds the NCCL communicator to this rank's GPU (eager init, no guessing)
        kwargs = {"device_id": dev} if backend == "nccl" else {}
        dist.init_process_group(backend, rank=where.rank, world_size=where.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return Env(rank=where.rank, world_size=where.world_size, local_rank=where.local_rank,
               local_world_size=where.local_world_size, backend=backend, device=dev, threads=threads,
               rank_source=where.source)


def shutdown() -> None:
    """Barrier, then destroy the process group (every rank leaves together)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def software_versions() -> dict[str, object]:
    """torch, CUDA, cuDNN and NCCL versions and the TF32 settings of this process."""
    info: dict[str, object] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the allow_tf32 flags are deprecated in favour of fp32_precision
        info["tf32"] = {
            "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }
        prec = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
        if isinstance(prec, str):
            info["tf32"]["matmul_fp32_precision"] = prec  # type: ignore[index]
    if torch.cuda.is_available():
        try:
            info["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError, TypeError):
            info["nccl"] = None
        info["cudnn"] = torch.backends.cudnn.version()
    else:
        info["nccl"] = None
        info["cudnn"] = None
    return info


def describe(env: Env) -> dict[str, object]:
    """The environment a measurement was taken in (recorded with every result)."""
    info: dict[str, object] = {
        "hostname": socket.gethostname(), "backend": env.backend,
        "device_type": env.device.type, "world_size": env.world_size,
        "local_world_size": env.local_world_size, "num_nodes": env.num_nodes,
        "threads_per_rank": env.threads, "host_cores": host_cores(), "rank_source": env.rank_source,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **software_versions(),
    }
    if env.device.type == "cuda":
        props = torch.cuda.get_device_properties(env.device)
        info["device_name"] = torch.cuda.get_device_name(env.device)
        info["device_memory_bytes"] = props.total_memory
        info["device_capability"] = f"{props.major}.{props.minor}"
        info["visible_devices"] = torch.cuda.device_count()
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
