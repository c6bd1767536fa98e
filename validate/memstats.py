"""Peak memory of one rank over a workload's training steps, in bytes.

The peak is reset *after* the model is built and sharded, so the unsharded fp32 copy that
every rank builds before ``fully_shard``/``parallelize_module``/the pipeline split does not
count (a training job that loads a checkpoint never holds it); the baseline subtracted is
what was allocated before the build (what earlier workloads left, normally nothing).

GPU (PyTorch docs, "CUDA semantics: memory management", ``torch.cuda.max_memory_allocated``,
``max_memory_reserved``, ``reset_peak_memory_stats``, ``mem_get_info``):

* ``allocated``: peak bytes of live tensors (what the simulator's weights + gradients +
  optimizer + activations count);
* ``reserved``: peak bytes the caching allocator held (tensors plus its rounding, splitting
  and cache; what the simulator's total with ``fragmentation_fraction`` and
  ``workspace_bytes`` stands for: cuBLAS workspaces are allocated through it);
* ``device_used``: ``total - free`` from ``cudaMemGetInfo`` at the end;
  ``outside_allocator`` = ``device_used - reserved``: the CUDA context, NCCL's communicator
  buffers (allocated by NCCL itself, not through the caching allocator) and library handles.

CPU: growth of the resident set, peak (``VmHWM``, reset by writing 5 to
``/proc/self/clear_refs``, Linux ``proc(5)``) minus the resident set before the build:
tensors plus allocator slack.
"""

from __future__ import annotations

import ctypes
import gc

import torch


def release_memory(device: torch.device) -> None:
    """Return freed memory (to the OS on CPU, to the driver on GPU), so the next
    measurement's growth is its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """``before_build()``, build the model, ``after_build()``, train, ``result()``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.base_allocated = 0.0
        self.base_reserved = 0.0

    def before_build(self) -> None:
        release_memory(self.device)
        if self.device.type == "cuda":
            self.base_allocated = float(torch.cuda.memory_allocated(self.device))
            self.base_reserved = float(torch.cuda.memory_reserved(self.device))
        else:
            self.base_allocated = _proc_status_bytes("VmRSS")

    def after_build(self) -> None:
        """Drop what the build freed (the unsharded model) and start the peak here."""
        release_memory(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")  # reset VmHWM to the current resident set
        except OSError:
            pass

    def result(self) -> dict[str, float]:
        """Bytes: ``peak_bytes`` (GPU: allocated; CPU: resident-set growth) and, on a GPU,
        ``peak_reserved_bytes``, ``device_used_bytes``, ``outside_allocator_bytes``."""
        if self.device.type != "cuda":
            return {"peak_bytes": max(0.0, _proc_status_bytes("VmHWM") - self.base_allocated)}
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        used = float(total - free)
        return {
            "peak_bytes": max(0.0, float(torch.cuda.max_memory_allocated(self.device)) - self.base_allocated),
            "peak_reserved_bytes": max(0.0, float(torch.cuda.max_memory_reserved(self.device)) - self.base_reserved),
            "device_used_bytes": used,
            "outside_allocator_bytes": max(0.0, used - float(torch.cuda.memory_reserved(self.device))),
        }


def _proc_status_bytes(key: str) -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    return 0.0
