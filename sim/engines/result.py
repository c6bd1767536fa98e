"""The result of simulating one step, and its JSON form (docs/interface.md ``planner simulate``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from sim.cost.memory import MemoryBreakdown
from sim.layers.ops import model_flops_per_step

if TYPE_CHECKING:  # sim.cost.plan imports the cost modules; only the type is needed here
    from sim.cost.plan import Plan


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
    exposed_offload_s: float = 0.0  # host-link copies of offloading (sim.cost.offload) on the critical path
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
    """One predicted step (``step_result`` builds it for every engine).  ``mfu``/``hfu`` are
    model/hardware FLOPs per second over the dense **bf16** peak (the convention of Megatron,
    NeMo and torchtitan, docs/interface.md); ``precision_peak_flops_per_s`` is the dense peak
    of the precision the plan trains in (fp8: the fp8 peak), for ``mfu_of_precision_peak``."""

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
    precision: str = "bf16"
    precision_peak_flops_per_s: float = 0.0  # 0: the bf16 peak

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
            "precision": self.precision,
            "precision_peak_flops_per_s": self.precision_peak_flops_per_s or self.peak_flops_per_s,
            "mfu_of_precision_peak": self.mfu * self.peak_flops_per_s / (self.precision_peak_flops_per_s
                                                                        or self.peak_flops_per_s),
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


def step_result(plan: "Plan", *, step_time_s: float, breakdown: Breakdown, memory: MemoryBreakdown,
                recompute_flops_per_step: float, engine: str, warnings: tuple[str, ...] | list[str] = (),
                extra: dict[str, object] | None = None) -> StepResult:
    """The ``StepResult`` of a priced step, for every engine (analytic, event, DataParallel):
    throughput, model FLOPs (``sim.layers.ops.model_flops_per_step``, recomputation excluded), MFU and
    HFU over the dense bf16 peak of all GPUs, and the peak of the plan's precision."""
    s, cluster = plan.strategy, plan.cluster
    mf = model_flops_per_step(plan.model, s)
    peak = cluster.gpu.peak_flops_per_s("bf16")
    denom = step_time_s * cluster.num_gpus * peak
    return StepResult(step_time_s=step_time_s, tokens_per_s=s.tokens_per_step / step_time_s, mfu=mf / denom,
                      hfu=(mf + recompute_flops_per_step) / denom, model_flops_per_step=mf,
                      hardware_flops_per_step=mf + recompute_flops_per_step, memory=memory, breakdown=breakdown,
                      strategy=s.to_string(), engine=engine, num_gpus=cluster.num_gpus, peak_flops_per_s=peak,
                      warnings=tuple(warnings), extra=dict(extra or {}), precision=s.precision,
                      precision_peak_flops_per_s=cluster.gpu.peak_flops_per_s(s.precision))
