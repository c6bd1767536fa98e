"""What to measure, as plain data (no torch): model shape, workload, microbenchmark sweep.

``validate.model``, ``validate.workloads`` and ``validate.microbench`` run these; the
launcher, the fit and the comparison only read them, so ``planner validate fit``,
``compare``, ``slurm-script`` and ``k8s`` work without torch installed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sim.data.specs import Model, Strategy

PARALLEL_KINDS = ("single", "ddp", "fsdp", "tp", "pp", "mesh")
SCHEDULES = ("gpipe", "1f1b", "interleaved")

STREAM_BUFFERS: dict[str, int] = {"copy": 2, "triad": 3}
"""Buffers a STREAM kernel reads or writes once per call (McCalpin's byte count: copy ``a = b``
moves 2, triad ``a = b + s c`` 3; validate.hostbench)."""
HOST_COPY_PATHS: tuple[tuple[str, bool], ...] = (("h2d", True), ("d2h", True), ("h2d", False), ("d2h", False))
"""(direction, pinned) of the host<->device copies validate.hostbench measures."""

CONTENDED_CORES = 0.15
"""A step during which other processes kept more than this many cores busy (on the first
node) is left out of the median when enough quiet steps remain."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """Shape of the GPT workload; ``seq_len`` is tokens per sequence."""

    name: str = "gpt-tiny"
    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 4
    ffn_hidden_size: int = 1024
    vocab_size: int = 4096
    seq_len: int = 256

    def __post_init__(self) -> None:
        for n in ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model.{n}={v!r}: must be a positive integer")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model.num_heads={self.num_heads}: must divide hidden_size={self.hidden_size}")

    def to_sim_model(self) -> Model:
        """The same network in the simulator's schema."""
        return Model(name=self.name, num_layers=self.num_layers, hidden_size=self.hidden_size,
                     num_attention_heads=self.num_heads, ffn_hidden_size=self.ffn_hidden_size,
                     vocab_size=self.vocab_size, ffn_type="gelu", tied_embeddings=False,
                     max_seq_len=self.seq_len, source="validate.model.GPT")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> "ModelConfig":
        return cls(**data)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class MicrobenchConfig:
    """Which shapes and sizes to sweep.  ``quick()`` fits a two-core CI budget."""

    matmul_shapes: tuple[tuple[int, int, int], ...] = (
        (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
        (2048, 8192, 2048), (2048, 2048, 8192), (64, 4096, 4096), (128, 4096, 4096), (32, 1024, 1024),
        (512, 128, 512), (1024, 64, 1024), (8192, 1024, 1024), (8192, 4096, 1024),
    )
    matmul_dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")
    # Shapes of other precisions: the first few of matmul_shapes (slow dtypes on CPU).
    other_dtype_shapes: int = 4
    attention_shapes: tuple[tuple[int, int, int, int], ...] = (  # (batch, heads, seq, head_dim)
        (1, 8, 512, 64), (2, 8, 1024, 64), (1, 16, 2048, 128), (1, 32, 4096, 128),
    )
    memory_numel: tuple[int, ...] = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26)
    message_bytes: tuple[int, ...] = tuple(1 << k for k in range(12, 29, 2))
    collective_ops: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
    dtype: str = "fp32"  # training dtype on this device (the workloads' dtype)
    min_time_s: float = 0.2  # seconds of timed calls per compute benchmark (all samples)
    comm_min_time_s: float = 0.1  # the same per collective and size
    overhead_calls: int = 2000  # back-to-back no-work ops per sample of the overhead probes
    # Host side (validate.hostbench): STREAM-like copy and triad on host buffers of these sizes
    # (bytes per buffer and rank; the fit uses those of at least validate.fit_host.HOST_MEMORY_MIN_BYTES),
    # and host<->device copies of these sizes (CUDA only; not measured elsewhere).
    host_memory_bytes: tuple[int, ...] = (1 << 28, 1 << 29, 1 << 30)
    host_copy_bytes: tuple[int, ...] = tuple(1 << k for k in range(20, 31, 2))  # 1 MiB .. 1 GiB
    host_min_time_s: float = 0.1  # seconds of timed calls per host benchmark and size (all samples)

    @classmethod
    def quick(cls, *, device_type: str = "cpu") -> "MicrobenchConfig":
        if device_type == "cuda":
            return cls.gpu(quick=True)
        return cls(
            matmul_shapes=((64, 256, 256), (128, 128, 512), (256, 256, 256), (512, 512, 512),
                           (1024, 256, 1024), (512, 1024, 256), (1024, 1024, 512), (96, 1024, 1024),
                           (32, 512, 512), (1024, 32, 512)),
            matmul_dtypes=("fp32", "bf16"), other_dtype_shapes=2,
            attention_shapes=((2, 4, 256, 64), (2, 8, 256, 64), (1, 4, 512, 64)),
            memory_numel=(1 << 15, 1 << 17, 1 << 19, 1 << 21, 1 << 23),
            message_bytes=(1 << 12, 1 << 15, 1 << 18, 1 << 20, 1 << 22, 1 << 24),
            min_time_s=0.08, comm_min_time_s=0.08,
            host_memory_bytes=(1 << 26, 1 << 28), host_min_time_s=0.02)

    @classmethod
    def gpu(cls, *, quick: bool) -> "MicrobenchConfig":
        """GPU-sized sweeps: GEMMs whose smallest dimension spans 256..8192 (the shape factor)
        and that run 10 us to 2 ms on an H100-class GPU, so none is bound by the host's
        dispatch; attention at training lengths; memory-bound kernels on tensors of 128 MiB
        and more (beyond the 50-60 MiB L2 of Hopper); messages from 64 KiB to 1 GiB."""
        if quick:
            return cls(
                matmul_shapes=((4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (256, 8192, 8192),
                               (512, 8192, 8192), (1024, 8192, 8192), (8192, 8192, 1024)),
                matmul_dtypes=("bf16", "fp32"), other_dtype_shapes=2,
                attention_shapes=((8, 16, 1024, 128), (4, 32, 2048, 128), (1, 32, 8192, 128)),
                memory_numel=(1 << 26, 1 << 27, 1 << 28),
                message_bytes=(1 << 16, 1 << 20, 1 << 23, 1 << 26, 1 << 29),
                dtype="bf16", min_time_s=0.03, comm_min_time_s=0.02, overhead_calls=1000,
                host_memory_bytes=(1 << 28, 1 << 29), host_copy_bytes=tuple(1 << k for k in range(20, 29, 2)),
                host_min_time_s=0.03)
        return cls(
            matmul_shapes=((4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (1024, 1024, 1024),
                           (128, 8192, 8192), (256, 8192, 8192), (512, 8192, 8192), (1024, 8192, 8192),
                           (8192, 8192, 1024), (8192, 1024, 8192), (16384, 8192, 2048), (4096, 16384, 4096)),
            matmul_dtypes=("bf16", "fp32", "fp16"), other_dtype_shapes=3,
            attention_shapes=((8, 16, 1024, 128), (4, 32, 2048, 128), (2, 32, 4096, 128), (1, 32, 8192, 128),
                              (4, 16, 2048, 64)),
            memory_numel=(1 << 25, 1 << 26, 1 << 27, 1 << 28),
            message_bytes=tuple(1 << k for k in range(16, 31, 2)),
            dtype="bf16", min_time_s=0.1, comm_min_time_s=0.05, host_min_time_s=0.05)

    @classmethod
    def for_device(cls, device_type: str, *, quick: bool) -> "MicrobenchConfig":
        """The sweep for ``cpu`` or ``cuda``, quick or full."""
        if device_type == "cuda":
            return cls.gpu(quick=quick)
        return cls.quick() if quick else cls()

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> "MicrobenchConfig":
        conv = {}
        for k, v in data.items():
            if isinstance(v, list):
                v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
            conv[k] = v
        return cls(**conv)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """One training run.  ``num_microbatches`` is gradient accumulation without pipelining
    and the pipeline's micro-batches with it; the global batch is ``mbs * dp * m``."""

    name: str
    model: ModelConfig = field(default_factory=ModelConfig)
    dp: int = 1
    tp: int = 1
    pp: int = 1
    vp: int = 1
    dp_mode: str = "ddp"  # ddp | fsdp
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved (pp > 1)
    mbs: int = 1
    num_microbatches: int = 1
    warmup_steps: int = 2
    steps: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        for n in ("dp", "tp", "pp", "vp", "mbs", "num_microbatches", "steps"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"workload[{self.name}].{n}={v!r}: must be a positive integer")
        if self.warmup_steps < 0:
            raise ValueError(f"workload[{self.name}].warmup_steps={self.warmup_steps}: must be >= 0")
        if self.dp_mode not in ("ddp", "fsdp"):
            raise ValueError(f"workload[{self.name}].dp_mode={self.dp_mode!r}: must be ddp or fsdp")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"workload[{self.name}].schedule={self.schedule!r}: must be one of {', '.join(SCHEDULES)}")
        if (self.vp > 1) != (self.schedule == "interleaved"):
            raise ValueError(f"workload[{self.name}].vp={self.vp}: vp > 1 exactly when schedule=interleaved")
        if self.model.num_layers % (self.pp * self.vp):
            raise ValueError(f"workload[{self.name}].pp={self.pp}: pp*vp must divide num_layers={self.model.num_layers}")
        if self.model.num_heads % self.tp or self.model.ffn_hidden_size % self.tp:
            raise ValueError(f"workload[{self.name}].tp={self.tp}: must divide heads and ffn_hidden_size")
        if self.model.seq_len % self.tp:
            raise ValueError(f"workload[{self.name}].tp={self.tp}: must divide seq_len (sequence parallelism)")
        if self.dp_mode == "ddp" and self.dp > 1 and (self.tp > 1 or self.pp > 1):
            raise ValueError(f"workload[{self.name}].dp_mode=ddp: with tp or pp use dp_mode=fsdp")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def kind(self) -> str:
        dims = [d for d in ("pp", "dp", "tp") if getattr(self, d) > 1]
        if not dims:
            return "single"
        if len(dims) > 1:
            return "mesh"
        return self.dp_mode if dims == ["dp"] else dims[0]

    @property
    def global_batch(self) -> int:
        return self.mbs * self.dp * self.num_microbatches

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.model.seq_len

    def strategy(self) -> Strategy:
        """The simulator's view of this run."""
        return Strategy(tp=self.tp, pp=self.pp, dp=self.dp, vp=self.vp, mbs=self.mbs, gbs=self.global_batch,
                        seq_len=self.model.seq_len, zero=3 if (self.dp_mode == "fsdp" and self.dp > 1) else 0,
                        sp=self.tp > 1, recompute="none", precision="bf16",
                        schedule=self.schedule if self.pp > 1 else "1f1b")

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["model"] = self.model.as_dict()
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WorkloadSpec":
        data = dict(data)
        data["model"] = ModelConfig.from_dict(data.get("model", {}))
        return cls(**data)
