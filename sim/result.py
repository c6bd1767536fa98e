"""The result of simulating one step, and its JSON form (docs/interface.md ``planner simulate``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.memory import MemoryBreakdown


@dataclass(frozen=True, kw_only=True, slots=True)
class Breakdown:
    """Seconds of one step on the critical path; the parts sum to the step time."""

    compute_s: float  # forward + backward + recompute on the bottleneck stage
    exposed_comm_s: float  # sum of the exposed_* parts below
    bubble_s: float  # pipeline fill/drain idle time
    optimizer_s: float
    overhead_s: float = 0.0  # framework overheads (launch gaps, data loading, ...)
    exposed_tp_s: float = 0.0
    exposed_cp_s: float = 0.0
    exposed_ep_s: float = 0.0
    exposed_pp_s: float = 0.0
    exposed_dp_s: float = 0.0
    exposed_offload_s: float = 0.0  # host-link copies of offloading (sim.offload) on the critical path
    recompute_s: float = 0.0  # part of compute_s spent recomputing activations

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_comm_s + self.bubble_s + self.optimizer_s + self.overhead_s

    def as_dict(self) -> dict[str, float]:
        return {
            "compute_s": self.compute_s,
            "exposed_comm_s": self.exposed_comm_s,
            "bubble_s": self.bubble_s,
            "optimizer_s": self.optimizer_s,
            "overhead_s": self.overhead_s,
            "exposed_tp_s": self.exposed_tp_s,
            "exposed_cp_s": self.exposed_cp_s,
            "exposed_ep_s": self.exposed_ep_s,
            "exposed_pp_s": self.exposed_pp_s,
            "exposed_dp_s": self.exposed_dp_s,
            "exposed_offload_s": self.exposed_offload_s,
            "recompute_s": self.recompute_s,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class StepResult:
    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    memory: MemoryBreakdown
    breakdown: Breakdown
    strategy: str
    engine: str
    num_gpus: int
    peak_flops_per_s: float
    warnings: tuple[str, ...] = ()
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def memory_peak_bytes(self) -> float:
        """Allocated peak of the most loaded GPU (as ``torch.cuda.max_memory_allocated``)."""
        return self.memory.allocated_bytes

    @property
    def memory_device_bytes(self) -> float:
        """Device-level peak (as ``nvidia-smi``): what feasibility and headroom use."""
        return self.memory.device_bytes

    @property
    def fits_memory(self) -> bool:
        return self.memory.fits

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s / self.num_gpus,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "model_tflops_per_gpu": self.model_flops_per_step / self.step_time_s / self.num_gpus / 1e12,
            "peak_flops_per_s": self.peak_flops_per_s,
            "memory_peak_bytes": self.memory_peak_bytes,
            "memory_reserved_bytes": self.memory.reserved_bytes,
            "memory_device_bytes": self.memory.device_bytes,
            "memory_by_stage": [dict(x) for x in self.memory.by_stage],
            "memory_capacity_bytes": self.memory.capacity_bytes,
            "fits_memory": self.fits_memory,
            "host_memory_bytes": self.memory.host_bytes,
            "host_memory_capacity_bytes": self.memory.host_capacity_bytes,
            "memory": self.memory.as_dict(),
            "breakdown": self.breakdown.as_dict(),
            "strategy": self.strategy,
            "engine": self.engine,
            "num_gpus": self.num_gpus,
            "warnings": list(self.warnings),
        }
        out.update(self.extra)
        return out
