"""Time of one op on one GPU: a roofline with achievable (not data-sheet) peaks.

``t = max(flops / (peak * eff_flops), hbm_bytes / (hbm_bytes_per_s * eff_hbm)) + overhead``
(Williams, Waterman & Patterson 2009, "Roofline").  ``eff_flops`` is the GPU's best-case
GEMM fraction (catalog ``matmul_efficiency``, measured with a brute-force shape search) times
the fraction of it a training run's fixed shapes sustain (``gemm_sustained_fraction``) and a
shape factor ``d / (d + gemm_half_dim)``, both fitted (``scripts/fit_efficiency.py``);
attention kernels reach a lower fraction (``catalogs/efficiency.yaml``).  Known error: a single efficiency per kind ignores shape
effects beyond the roofline (tile and wave quantisation), worth up to ~10-20% on small GEMMs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from sim.data.catalog import catalog_document
from sim.base.errors import InputError
from sim.base.records import Record
from sim.layers.ops import BF16_GEMMS, Op, fusible_name
from sim.data.hardware import Gpu
from sim.layers.variability import slowest_rank_factor


# Older attention-kernel libraries a framework profile may name (frameworks.yaml attention_library):
# cudnn-9.13: cuDNN up to 9.13 (NGC containers through 25.09), before 9.14-9.17's Blackwell speed-ups.
ATTENTION_LIBRARIES: tuple[str, ...] = ("cudnn-9.13",)


# bytes per element of a compiled float8 cast (KernelEfficiency.compiled_fp8_casts), in this order
COMPILED_FP8_CAST_TERMS: tuple[str, ...] = ("input_fwd", "input_bwd", "grad_bwd")
# bytes per token per element of each width of torchtitan's compiled rotary embedding
# (KernelEfficiency.compiled_rope, sim.layers.ops.compiled_rope_bytes): the query and key widths,
# the block input's width, the head dimension (the rotary table), and with grouped-query attention
# (repeat_kv) the query and key widths again
COMPILED_ROPE_TERMS: tuple[str, ...] = ("q", "kv", "hidden", "head_dim", "repeat_q", "repeat_kv")


@dataclass(frozen=True, kw_only=True, slots=True)
class Fp8Recipe:
    """One fp8 scaling recipe (``Strategy.fp8_recipe``): the HBM bytes its quantization moves per
    element of a GEMM's operands and output gradient (x, W and dy with their transposed copies,
    amax and scale passes included), and its GEMM rate relative to the per-tensor-scaled kernel.
    Both fitted from Transformer Engine's GEMM profile (``planner/fitting/fit_kernels.py``)."""

    quantize_bytes_per_element: float
    gemm_rate: float = 1.0
    architectures: tuple[str, ...] = ()  # empty: every fp8-capable architecture


@dataclass(frozen=True, slots=True)
class SaturatingCurve:
    """``f(x) = f_max * x / (x + x_half)``: a kernel's efficiency vs its problem size (the
    fixed prologue/epilogue and tile-fill costs amortise as ``x`` grows).  ``x_half = 0``: flat."""

    f_max: float
    x_half: float = 0.0

    def at(self, x: float) -> float:
        """The efficiency at size ``x`` (``x <= 0``: size not known, the large-problem value)."""
        return self.f_max if self.x_half <= 0 or x <= 0 else self.f_max * x / (x + self.x_half)


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelEfficiency:
    """Device-independent efficiency knobs (see ``catalogs/efficiency.yaml``)."""

    attention_fwd_vs_matmul: float
    attention_bwd_vs_matmul: float
    kernel_overhead_s: float
    # Shape factor: GEMMs whose smallest dimension is below ``gemm_half_dim`` lose
    # efficiency as d / (d + gemm_half_dim) (tile under-fill); 0 disables it.
    gemm_half_dim: float = 0.0
    # Dense bf16 FLOP/s per SM of the GPU the half dimension was fitted on (A100: 312e12/108).
    gemm_reference_flops_per_sm: float = 0.0
    # Fraction of the best-case (brute-force searched, short-burst) GEMM efficiency that a
    # training run's fixed-shape GEMMs sustain even when large; fitted together with
    # ``gemm_half_dim`` (scripts/fit_efficiency.py).  1 = large GEMMs reach the best case.
    gemm_sustained_fraction: float = 1.0
    # The same fraction per architecture and precision where a training-shape GEMM benchmark
    # of that generation exists (Transformer Engine's per-layer GEMM profile); others use
    # ``gemm_sustained_fraction``.
    gemm_sustained_by_arch: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # HBM traffic of element-wise (memory-bound) ops run eagerly, one kernel per op,
    # relative to the fused kernels sim/layers/ops.py counts: measured per code variant (the
    # op's ``kernel``; catalogs/efficiency.yaml eager_traffic, validate/eager_traffic.py) as
    # (forward, backward) bytes over the fused forward's; ops without a measured variant use
    # the layer-level ``eager_elementwise_traffic`` (backward by ``Op.backward_bytes_factor``).
    eager_traffic: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    eager_elementwise_traffic: float = 1.0
    # Achieved fraction of the GPU's STREAM-like rate (hbm_bytes_per_s * hbm_efficiency) of
    # memory-bound kernels, (forward, backward) per class: "eager" (eager aten kernels) and the
    # classes of FUSED_KERNEL_CLASSES; fitted on kernel microbenchmarks
    # (planner.fitting.fit_kernels.fit_memory_kernels).  Absent: 1 (the STREAM rate).
    memory_kernel_fraction: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # Host-side floor of one op (framework dispatch of the op's kernels, Python): an op whose
    # GPU time is shorter cannot finish faster than the host can issue it.  Fitted on the
    # vTrain single-node measurements (scripts/fit_efficiency.py).
    host_op_floor_s: float = 0.0
    # Fixed cost of one collective call (NCCL launch and synchronisation), seconds.
    collective_overhead_s: float = 0.0
    # Relative slowdown of compute that runs while a collective is in flight (the
    # communication kernels take SMs, L2 and HBM bandwidth); charged on the overlapped time.
    overlap_compute_slowdown: float = 0.0
    # Fused MoE dispatch/combine kernels (DeepEP normal kernels): achieved fraction of the
    # nominal per-direction link rate per tier (planner.fitting.fit_kernels.fit_deepep_dispatch).
    deepep_dispatch: Mapping[str, float] = field(default_factory=dict)
    # architecture -> kernel -> (fwd, bwd) fraction of dense bf16 peak (catalogs/efficiency.yaml)
    attention_fractions: Mapping[str, Mapping[str, tuple[float, float]]] = field(default_factory=dict)
    # architecture -> kernel -> (fwd, bwd) fraction vs per-kernel sequence length, fitted from
    # attention microbenchmarks; preferred over ``attention_fractions`` where present.
    attention_curves: Mapping[str, Mapping[str, tuple[SaturatingCurve, SaturatingCurve]]] = field(
        default_factory=dict)
    # an older kernel library's curves (ATTENTION_LIBRARIES) -> architecture -> kernel -> curves,
    # fitted from the measurements taken with it (planner.fitting.fit_kernels.ATTENTION_LIBRARY_DATA)
    attention_curves_by_library: Mapping[str, Mapping[str, Mapping[str, tuple[SaturatingCurve, SaturatingCurve]]]] = \
        field(default_factory=dict)
    # FlexAttention's speed relative to another kernel of the same GPU: architecture (or
    # "default") -> (that kernel, fwd ratio, bwd ratio) (catalogs/efficiency.yaml flex_attention)
    flex_attention: Mapping[str, tuple[str, float, float]] = field(default_factory=dict)
    fp8_recipes: Mapping[str, Fp8Recipe] = field(default_factory=dict)
    # torchao's float8 activation casts fused into a compiled block by inductor (catalogs/efficiency.yaml
    # compiled_fp8_casts, validate/compiled_traffic.py): recipe -> the input's producer ("elementwise"
    # or "extern") -> bytes per element (input forward, input backward, output gradient backward)
    compiled_fp8_casts: Mapping[str, Mapping[str, tuple[float, float, float]]] = field(default_factory=dict)
    # the weights' casts in the same compiled blocks: recipe -> bytes per weight element per
    # micro-batch, forward and backward (amax, cast, transposed cast; measured in the element-wise block)
    compiled_fp8_weight_casts: Mapping[str, float] = field(default_factory=dict)
    # torchtitan's complex rotary embedding compiled by inductor (catalogs/efficiency.yaml
    # compiled_rope): "fwd" / "bwd" -> COMPILED_ROPE_TERMS -> bytes per token per width element
    compiled_rope: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # Ring (context-parallel) attention: architecture -> (fwd, bwd) relative overhead of each
    # ring step after the first, at ``ring_reference_tokens`` local tokens, scaling as 1/tokens
    # (planner.fitting.fit_kernels.fit_ring_attention); architectures without a benchmark use the mean.
    ring_step_overhead: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # Compute rate a GPU sustains under continuous load over the short-burst rate the kernel
    # benchmarks measured, per architecture (planner.fitting.fit_kernels.fit_sustained_clock); 1 where no
    # same-era sustained sweep exists.
    sustained_clock_by_arch: Mapping[str, float] = field(default_factory=dict)
    ring_reference_tokens: float = 0.0
    # Relative standard deviation of sustained speed between GPUs of one SKU in a cluster
    # (catalogs/efficiency.yaml rank_variability, sim/layers/variability.py): a step of N GPUs runs
    # at the slowest one's pace.  0: every GPU equally fast.
    gpu_speed_sigma: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        for n in ("attention_fwd_vs_matmul", "attention_bwd_vs_matmul"):
            v = getattr(self, n)
            if not 0 < v <= 1.5:
                raise InputError(f"efficiency.{n}", v, "must be in (0, 1.5]")
        if self.kernel_overhead_s < 0 or self.gemm_half_dim < 0:
            raise InputError("efficiency", self, "overheads must be >= 0")
        if not 0 <= self.overlap_compute_slowdown < 1:
            raise InputError("efficiency.overlap_compute_slowdown", self.overlap_compute_slowdown,
                             "must be in [0, 1)")
        if not 0 <= self.gpu_speed_sigma < 0.5:
            raise InputError("efficiency.gpu_speed_sigma", self.gpu_speed_sigma, "must be in [0, 0.5)")

    def slowest_rank_factor(self, num_ranks: int) -> float:
        """Compute time of the slowest of ``num_ranks`` GPUs over the median GPU's
        (``sim.layers.variability``); 1 for one GPU or ``gpu_speed_sigma = 0``."""
        return slowest_rank_factor(num_ranks, self.gpu_speed_sigma)

    def ring_slowdown(self, architecture: str, ring_steps: float, local_tokens: float) -> tuple[float, float]:
        """(fwd, bwd) time of ring attention over ``ring_steps`` chunks of ``local_tokens``
        queries relative to the same work in one kernel:
        ``1 + (c - 1)/c * delta * t_ref / t`` (``planner.fitting.fit_kernels.fit_ring_attention``)."""
        if ring_steps <= 1 or not self.ring_step_overhead or local_tokens <= 0:
            return 1.0, 1.0
        d = self.ring_step_overhead.get(architecture)
        if d is None:  # no ring benchmark on this architecture: the mean of those that have one
            vals = list(self.ring_step_overhead.values())
            d = (sum(v[0] for v in vals) / len(vals), sum(v[1] for v in vals) / len(vals))
        k = (ring_steps - 1) / ring_steps * self.ring_reference_tokens / local_tokens
        return 1.0 + d[0] * k, 1.0 + d[1] * k

    def sustained_fraction(self, architecture: str, precision: str) -> float:
        return self.gemm_sustained_by_arch.get(architecture, {}).get(precision, self.gemm_sustained_fraction)

    def fp8_recipe(self, name: str) -> Fp8Recipe:
        r = self.fp8_recipes.get(name)
        if r is None:
            raise InputError("fp8_recipe", name, f"no such recipe in efficiency.yaml fp8_recipes "
                             f"({', '.join(self.fp8_recipes) or 'none'})")
        return r

    def with_attention_library(self, library: str) -> "KernelEfficiency":
        """These efficiencies with the attention curves of an older kernel ``library``
        (``ATTENTION_LIBRARIES``) where it was measured; ``""``: the current ones (unchanged)."""
        if not library:
            return self
        if library not in ATTENTION_LIBRARIES:
            raise InputError("attention_library", library, f"must be one of {', '.join(ATTENTION_LIBRARIES)} or empty")
        older = self.attention_curves_by_library.get(library, {})
        curves = {arch: {**self.attention_curves.get(arch, {}), **older.get(arch, {})}
                  for arch in {*self.attention_curves, *older}}
        return replace(self, attention_curves=curves)

    def attention_fraction(self, architecture: str, kernel: str, seq_len: float,
                           matmul_fraction: float) -> tuple[float, float]:
        """(fwd, bwd) fraction of the dense bf16 peak of ``kernel`` on ``architecture`` at a
        per-kernel sequence length ``seq_len``: the fitted curve, else the catalog constant,
        else relative to the GPU's best-case GEMM fraction.  ``flex`` (FlexAttention) is its
        measured ratio to another kernel of the architecture (``flex_attention``)."""
        if kernel == "flex":
            base, fwd, bwd = self.flex_attention.get(architecture) or self.flex_attention["default"]
            f, b = self.attention_fraction(architecture, base, seq_len, matmul_fraction)
            return f * fwd, b * bwd
        curve = self.attention_curves.get(architecture, {}).get(kernel)
        if curve is not None:
            return curve[0].at(seq_len), curve[1].at(seq_len)
        frac = self.attention_fractions.get(architecture, {}).get(kernel)
        if frac is not None:
            return frac
        return matmul_fraction * self.attention_fwd_vs_matmul, matmul_fraction * self.attention_bwd_vs_matmul


def _efficiency_yaml() -> Mapping:
    return catalog_document("efficiency.yaml")


def catalog_fitted() -> Mapping:
    """The ``fitted`` block of ``catalogs/efficiency.yaml`` (what ``scripts/fit_efficiency.py`` stored)."""
    return _efficiency_yaml().get("fitted") or {}


@functools.cache
def default_efficiency() -> KernelEfficiency:
    """Kernel efficiency: the documented defaults plus the values ``scripts/fit_efficiency.py``
    fitted from microbenchmarks (the ``fitted`` block)."""
    return kernel_efficiency(catalog_fitted())


_DEFAULT_KEYS = ("attention_fwd_vs_matmul", "attention_bwd_vs_matmul", "kernel_overhead_s", "gemm_reference_flops_per_sm",
                 "eager_elementwise_traffic", "overlap_compute_slowdown")


def kernel_efficiency(fitted: Mapping | None) -> KernelEfficiency:
    """The catalog's documented defaults with the values of a ``fitted`` block (the catalog's,
    or one a leave-one-source-out fit produced; ``None``: defaults only, as fitting starts)."""
    doc = Record(_efficiency_yaml(), where="efficiency", file="efficiency.yaml")
    default = doc.mapping("default", allowed=_DEFAULT_KEYS + ("source",))
    d: dict[str, object] = {k: default.req(k) for k in _DEFAULT_KEYS}
    d["source"] = default.text("source")
    d["gpu_speed_sigma"] = doc.mapping("rank_variability", allowed=("gpu_speed_sigma", "source", "notes")).fraction(
        "gpu_speed_sigma")
    recipes = doc.mapping("fp8_recipes")
    fitted_recipes: Mapping = {}
    if fitted:
        f = Record(fitted, where="efficiency.fitted", file="efficiency.yaml")
        if f.has("gemm"):
            gemm = f.mapping("gemm")
            d["gemm_half_dim"] = gemm.req("gemm_half_dim")
            d["gemm_sustained_fraction"] = gemm.fraction("gemm_sustained_fraction", optional=True, default=1.0)
            if gemm.has("per_architecture"):
                per = gemm.mapping("per_architecture")
                d["gemm_sustained_by_arch"] = {
                    arch: {prec: per.mapping(arch).req(prec, positive=True) for prec in per.rec[arch]}
                    for arch in per.rec}
        if f.has("collective_overhead_s"):
            d["collective_overhead_s"] = f.req("collective_overhead_s")
        if f.has("host"):
            d["host_op_floor_s"] = f.mapping("host").req("host_op_floor_s")
        if f.has("attention_curves"):
            ac = f.mapping("attention_curves")
            d["attention_curves"] = {
                arch: {k: tuple(SaturatingCurve(*ac.mapping(arch).mapping(k).rec[p]) for p in ("fwd", "bwd"))
                       for k in ac.rec[arch]}
                for arch in ac.rec}
        if f.has("attention_curves_by_library"):
            lib = f.mapping("attention_curves_by_library")
            d["attention_curves_by_library"] = {
                name: {arch: {k: tuple(SaturatingCurve(*lib.mapping(name).mapping(arch).mapping(k).rec[p])
                                       for p in ("fwd", "bwd"))
                              for k in lib.mapping(name).rec[arch]}
                       for arch in lib.mapping(name).rec}
                for name in lib.rec}
        if f.has("fp8_recipes"):
            fitted_recipes = f.rec["fp8_recipes"]
        if f.has("sustained_clock"):
            sc = f.mapping("sustained_clock")
            per = sc.mapping("per_architecture") if sc.has("per_architecture") else None
            d["sustained_clock_by_arch"] = {a: per.fraction(a) for a in per.rec} if per is not None else {}
        if f.has("memory_kernels"):
            mk = f.mapping("memory_kernels")
            d["memory_kernel_fraction"] = {c: (mk.mapping(c).fraction("fwd"), mk.mapping(c).fraction("bwd"))
                                           for c in mk.rec}
        if f.has("ring_attention"):
            ra = f.mapping("ring_attention")
            d["ring_reference_tokens"] = ra.req("reference_local_tokens", positive=True)
            d["ring_step_overhead"] = {arch: (ra.mapping(arch).req("fwd"), ra.mapping(arch).req("bwd"))
                                       for arch in ra.rec if arch != "reference_local_tokens"}
        if f.has("deepep_dispatch"):
            dd = f.mapping("deepep_dispatch")
            d["deepep_dispatch"] = {tier: dd.fraction(tier) for tier in dd.rec}
    out = {}
    for name in recipes.rec:
        r = recipes.mapping(name, allowed=("architectures", "source", "notes"))
        got = Record(fitted_recipes.get(name) or {"quantize_bytes_per_element": 0.0}, where=f"fitted.fp8_recipes.{name}",
                     file="efficiency.yaml")
        out[name] = Fp8Recipe(quantize_bytes_per_element=got.req("quantize_bytes_per_element"),
                              gemm_rate=got.number("gemm_rate", optional=True, default=1.0),
                              architectures=r.strings("architectures"))
    d["fp8_recipes"] = out
    if doc.has("compiled_fp8_casts"):
        cc = doc.mapping("compiled_fp8_casts", allowed=("recipes", "source", "notes")).mapping("recipes")
        d["compiled_fp8_casts"] = {
            recipe: {producer: tuple(cc.mapping(recipe).mapping(producer).req(k) for k in COMPILED_FP8_CAST_TERMS)
                     for producer in cc.mapping(recipe).rec}
            for recipe in cc.rec}
        d["compiled_fp8_weight_casts"] = {recipe: cc.mapping(recipe).mapping("elementwise").req("weight", positive=True)
                                          for recipe in cc.rec if cc.mapping(recipe).has("elementwise")}
    if doc.has("compiled_rope"):
        cr = doc.mapping("compiled_rope", allowed=("fwd", "bwd", "source", "notes"))
        d["compiled_rope"] = {p: {k: cr.mapping(p, allowed=COMPILED_ROPE_TERMS).number(k, optional=True, default=0.0)
                                  for k in COMPILED_ROPE_TERMS} for p in ("fwd", "bwd")}
    if doc.has("eager_traffic"):
        kernels = doc.mapping("eager_traffic", allowed=("kernels", "source", "notes")).mapping("kernels")
        d["eager_traffic"] = {k: (kernels.mapping(k).req("fwd", positive=True), kernels.mapping(k).req("bwd", positive=True))
                              for k in kernels.rec}
    flex = doc.mapping("flex_attention")
    d["flex_attention"] = {arch: (flex.mapping(arch).text("relative_to", choices=("flash", "flash2")),
                                  flex.mapping(arch).req("fwd", positive=True), flex.mapping(arch).req("bwd", positive=True))
                           for arch in flex.rec if arch not in ("source", "notes")}
    if "default" not in d["flex_attention"]:
        raise flex.fail("default", "is required (architectures without a measurement)")
    table = {}
    attention = doc.mapping("attention")
    for arch in attention.rec:
        kernels = attention.mapping(arch)
        table[arch] = {k: (kernels.mapping(k).req("fwd", positive=True), kernels.mapping(k).req("bwd", positive=True))
                       for k in kernels.rec if k not in ("source", "notes")}
    return KernelEfficiency(**d, attention_fractions=table)


def fp8_weight_cast_bytes_per_param(eff: KernelEfficiency, precision: str, recipe: str, cached: bool,
                                    microbatches, *, compiled: bool = False):
    """HBM bytes per local weight per micro-batch of casting the weights to fp8 (and their
    transposes) with ``recipe``: every micro-batch, or once per step when the framework caches
    them (``Plan.fp8_weight_cache``), averaged over the step's ``microbatches`` (a number or
    an array).  ``compiled``: the casts run inside a compiled block (torchao under torch.compile,
    ``Plan.fp8_cast_kernels``), at the bytes inductor's kernels move where they were measured
    (``catalogs/efficiency.yaml`` ``compiled_fp8_casts`` ``weight``), else the recipe's kernels'."""
    if precision != "fp8":
        return 0.0
    measured = eff.compiled_fp8_weight_casts.get(recipe) if compiled else None
    q = measured if measured is not None else eff.fp8_recipe(recipe).quantize_bytes_per_element
    return q / microbatches if cached else q + 0.0 * microbatches


@dataclass(frozen=True, slots=True)
class OpTime:
    fwd_s: float
    bwd_s: float


def shape_factor(d: float, half_dim: float) -> float:
    """``d / (d + half_dim)``: the share of its large-GEMM efficiency a GEMM whose narrowest side
    is ``d`` keeps (tile under-fill)."""
    return d / (d + half_dim)


def scaled_half_dim(half_dim: float, flops_per_s: float, num_sms: int, reference_flops_per_sm: float) -> float:
    """``half_dim`` (reference units, A100) on a device of ``flops_per_s`` dense FLOP/s over
    ``num_sms`` SMs: scaled by FLOP/s per SM.  The fixed cycles of a tile (prologue, pipeline
    fill, epilogue) weigh more on an SM that finishes its main loop faster, so a faster SM needs
    proportionally larger problems.  Checked on GEMM sweeps
    (``planner.fitting.fit_kernels.fit_gemm_half_dim``): H100 162 and B200 333 (62.4 and 63.3 in
    A100 units), and B200 fp8 2.07x its bf16."""
    if half_dim <= 0 or not num_sms or not reference_flops_per_sm:
        return half_dim
    return half_dim * flops_per_s / num_sms / reference_flops_per_sm


def gemm_half_dim(gpu: Gpu, precision: str, eff: KernelEfficiency) -> float:
    """The GEMM dimension at which the shape factor halves efficiency, on ``gpu``
    (``scaled_half_dim`` of the fitted reference value)."""
    return scaled_half_dim(eff.gemm_half_dim, gpu.peak_flops_per_s(precision), gpu.num_sms,
                           eff.gemm_reference_flops_per_sm)


def matmul_efficiency(gpu: Gpu, precision: str, op: Op, eff: KernelEfficiency) -> float:
    base = gpu.achievable_matmul_fraction(precision)
    if op.kind == "matmul":
        base *= eff.sustained_fraction(gpu.architecture, precision) * eff.sustained_clock_by_arch.get(gpu.architecture, 1.0)
    if eff.gemm_half_dim > 0 and op.kind == "matmul":
        base *= shape_factor(min(op.m, op.n, op.k), gemm_half_dim(gpu, precision, eff))
    return base


# fused memory-bound kernels whose own benchmark sets their speed (KernelEfficiency.memory_kernel_fraction):
# Op.kernel -> class.  Other fused ops run at the STREAM rate.
FUSED_KERNEL_CLASSES: Mapping[str, str] = {"cross_entropy_megatron_fused": "fused_loss"}


def op_time(gpu: Gpu, precision: str, op: Op, eff: KernelEfficiency, *, eager: bool = False) -> OpTime:
    """Forward and backward seconds of ``op`` on ``gpu``.

    ``precision`` is the GEMM precision (fp8 applies to linear layers only; attention and
    memory-bound ops run in bf16, as Transformer Engine and torchao float8 do).
    """
    hbm = gpu.hbm_bytes_per_s * gpu.hbm_efficiency
    over = eff.kernel_overhead_s
    floor = eff.host_op_floor_s
    if op.kind == "memory":
        t = op.hbm_bytes / hbm
        measured = eff.eager_traffic.get(op.kernel) if eager else None
        if measured is not None:  # this code's own eager kernels, forward and backward (validate/eager_traffic.py)
            f, b = measured[0] * t, measured[1] * t
        else:
            f = t * (eff.eager_elementwise_traffic if eager else 1.0)
            b = op.backward_bytes_factor * f
        # the kernels' achieved share of the STREAM rate (planner.fitting.fit_kernels.fit_memory_kernels):
        # eager aten kernels, or a fused kernel with a benchmark of its own
        cls = "eager" if eager else FUSED_KERNEL_CLASSES.get(op.kernel)
        if cls is not None:
            frac = eff.memory_kernel_fraction.get(cls, (1.0, 1.0))
            f, b = f / frac[0], b / frac[1]
        return OpTime(max(f, floor) + over, max(b, 2 * floor) + 2 * over)
    if op.kind == "attention":
        frac = eff.attention_fraction(gpu.architecture, op.kernel or "flash", op.m,
                                      gpu.achievable_matmul_fraction("bf16"))
        peak = gpu.peak_flops_per_s("bf16") * eff.sustained_clock_by_arch.get(gpu.architecture, 1.0)
        fwd = max(op.flops / (peak * frac[0]), op.hbm_bytes / hbm, floor)
        bwd = max(op.flops * op.backward_flop_factor / (peak * frac[1]), 2 * op.hbm_bytes / hbm, 2 * floor)
        # context parallelism: the local queries (m) attend the global keys (n) in n/m ring steps
        ring_f, ring_b = eff.ring_slowdown(gpu.architecture, op.n / op.m if op.m else 1.0, op.m)
        return OpTime(fwd * ring_f + over, bwd * ring_b + 2 * over)
    # fp8 applies to linear layers; attention batched GEMMs, router and output layer stay bf16
    gemm_precision = "bf16" if op.name in BF16_GEMMS else precision
    if gemm_precision == "fp8" and "fp8" not in gpu.dense_flops_per_s:
        gemm_precision = "bf16"
    peak = gpu.peak_flops_per_s(gemm_precision) * matmul_efficiency(gpu, gemm_precision, op, eff)
    if gemm_precision == "fp8" and op.kernel:
        peak *= eff.fp8_recipe(op.kernel).gemm_rate
    fwd = max(op.flops / peak, op.hbm_bytes / hbm, floor)
    bwd = max(op.flops * op.backward_flop_factor / peak, 2 * op.hbm_bytes / hbm, 2 * floor)
    return OpTime(fwd + over, bwd + 2 * over)


def ops_time(gpu: Gpu, precision: str, ops: tuple[Op, ...], eff: KernelEfficiency, *,
             eager: bool = False, fused: tuple[str, ...] = ()) -> tuple[float, float]:
    """Summed (forward, backward) seconds of a sequence of ops executed back to back; under
    ``eager`` the memory-bound ops named in ``fused`` still run as one fused kernel each
    (``Plan.fused_ops``)."""
    return sum_op_times(op_times(gpu, precision, tuple(ops), eff, eager=eager, fused=fused))


def sum_op_times(times: Iterable[OpTime]) -> tuple[float, float]:
    """(forward, backward) seconds of ``times`` summed in order (``ops_time``)."""
    f = b = 0.0
    for t in times:
        f += t.fwd_s
        b += t.bwd_s
    assert math.isfinite(f) and math.isfinite(b)
    return f, b


# op_times memo: {(id(eff), id(gpu)): (eff, gpu, {(ops, precision, eager): times})}.  The entry
# holds eff and gpu so their ids cannot be reused by other objects while it exists; the table
# is keyed by everything else op_time reads (every field of every op, precision, eager).
# KernelEfficiency holds dicts (not hashable) and is frozen, so its identity stands for its
# contents.  Bounded: a table is cleared past _MEMO_MAX entries, the whole memo past 64 tables.
_MEMO: dict[tuple[int, int], tuple[KernelEfficiency, Gpu, dict[tuple, tuple[OpTime, ...]]]] = {}
_MEMO_MAX = 50_000


def op_times(gpu: Gpu, precision: str, ops: tuple[Op, ...], eff: KernelEfficiency, *,
             eager: bool = False, fused: tuple[str, ...] = ()) -> tuple[OpTime, ...]:
    """``op_time`` of every op of ``ops`` (under ``eager``, the ops named in ``fused`` run fused),
    memoised per (gpu, eff) object and (ops, precision, eager, fused): a search prices the same
    layer's ops for every recompute setting.  Ops with an
    attention backward factor read from ``catalogs/conventions.yaml`` (not stated on the op)
    are not memoised: the catalog may change between calls."""
    entry = _MEMO.get((id(eff), id(gpu)))
    if entry is None or entry[0] is not eff or entry[1] is not gpu:
        if len(_MEMO) >= 64:
            _MEMO.clear()
        entry = _MEMO[(id(eff), id(gpu))] = (eff, gpu, {})
    table = entry[2]
    key = (ops, precision, eager, tuple(fused))
    got = table.get(key)
    if got is None:
        got = tuple(op_time(gpu, precision, op, eff, eager=eager and fusible_name(op.name) not in fused) for op in ops)
        if all(op.kind != "attention" or op.backward_flops_per_forward is not None for op in ops):
            if len(table) >= _MEMO_MAX:
                table.clear()
            table[key] = got
    return got
