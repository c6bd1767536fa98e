"""A ``Plan`` = model + cluster + strategy, checked for feasibility; STRATEGY string parsing."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.layers.compute import default_efficiency
from sim.base.errors import InfeasibleError, InputError
from sim.data.hardware import Cluster
from sim.data.specs import OFFLOAD_DEVICES, OFFLOADS, Model, Strategy
from sim.data.layout import check_layout, layout_from_counts, megatron_layout, parse_layout
from sim.layers.moe_routing import ROUTINGS
from sim.net.placement import group_shape
from sim.data.psspecs import ParameterServers
from sim.data.runtime import (ALLOCATORS, GRAD_BUCKETS, STATE_LAYOUTS, default_nccl_release, nccl_version,
                              nvls_across_domains)
from sim.layers.stages import stage_layer_counts, stage_layers
from sim.layers.activations import FUSED_ATTENTION

ATTENTION_IMPLS: tuple[str, ...] = (*FUSED_ATTENTION, "unfused")
SELECTIVE_POLICIES: tuple[str, ...] = ("attention", "op", "mla_up_proj", "moe_act", "mlp_up", "mlp")
GRAD_ACCUMULATION: tuple[str, ...] = ("fused", "fp32_main_grad", "autograd", "keras")
# optimizer step implementation (runtime.yaml optimizer.bytes_per_param_by_impl)
OPTIMIZER_IMPLS: tuple[str, ...] = ("fused", "keras")
LOSS_IMPLS: tuple[str, ...] = ("upcast", "inplace", "outofplace", "megatron_fused", "fused", "bf16", "loss_parallel")
FUSED_LOSS_IMPLS: frozenset[str] = frozenset({"megatron_fused", "fused"})  # run as fused kernels, eager or not
# MoE token dispatch (Megatron-Core --moe-token-dispatcher-type alltoall|allgather|flex with DeepEP)
MOE_DISPATCHERS: tuple[str, ...] = ("alltoall", "allgather", "deepep")
# how FSDP2 wraps an expert-parallel MoE block's routed experts (Plan.fsdp_experts_unit)
FSDP_EXPERTS_UNITS: tuple[str, ...] = ("own", "block")
# what runs a float8 linear's activation casts (Plan.fp8_cast_kernels): the recipe's kernels of their
# own (Transformer Engine) or inductor's, fused with the block's other element-wise code (torchao
# under torch.compile)
FP8_CAST_KERNELS: tuple[str, ...] = ("standalone", "inductor")
# what runs the rotary embedding (Plan.rope_kernels): one fused kernel (Transformer Engine, Liger,
# an element-wise rope inductor generates) or torchtitan's complex-fp32 rotary embedding compiled by
# inductor, which falls back to ATen for the complex multiplies and adds dtype conversions, with
# repeat_kv's copies and the three projections' input-gradient sum (catalogs/efficiency.yaml compiled_rope)
ROPE_KERNELS: tuple[str, ...] = ("fused", "inductor")
# What a plan's CUDA graphs capture (Plan.cuda_graph_scope, with Strategy.cuda_graphs): every op of
# the layer (Megatron-Core --enable-cuda-graph / TE graphs of the whole layer; an MoE layer only
# when its experts' inputs are padded to capacity), or the attention block and the MoE router
# (--cuda-graph-scope attn moe_router moe_preprocess: the most a dropless MoE layer can capture,
# Megatron-LM core_v0.17.1 transformer_config.py "moe cuda graph is only supported with
# drop-padding MoE"), the experts, their dispatch and the MLP running eagerly
CUDA_GRAPH_SCOPES: tuple[str, ...] = ("layer", "attention")
# How a ZeRO-3 engine gathers parameters: coalesced buckets with prefetch (FSDP, DeepSpeed >= 0.5.10)
# or one synchronous collective per parameter tensor (DeepSpeed ZeRO-3 of 2021)
ZERO3_GATHERS: tuple[str, ...] = ("bucketed", "per_tensor_sync")
# How tp_overlap hides tensor-parallel communication: Transformer Engine userbuffers (Megatron-Core,
# NeMo: ring-exchange pipelined with the GEMM chunks) or PyTorch's compiler micro-pipelining
# (async TP: symmetric-memory chunks, the reduce-scatter's partials summed by a kernel at the end)
TP_OVERLAP_KINDS: tuple[str, ...] = ("userbuffers", "async_tp")

_INT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "mbs", "gbs", "zero", "seq_len", "dp_shard",
             "recompute_num_layers", "offload_num_layers")
_BOOL_KEYS = ("sp", "tp_overlap", "dp_overlap", "ep_overlap", "pp_overlap", "cuda_graphs", "fp8_params")
_STR_KEYS = ("recompute", "precision", "schedule", "fp8_recipe", "order", "dp_impl", "offload", "offload_device",
             "recompute_method")
_ALIASES = {"seq": "seq_len", "micro_batch": "mbs", "global_batch": "gbs", "zero_stage": "zero",
            "sequence_parallel": "sp", "interleave": "vp", "pipeline_layout": "layout"}


@dataclass(frozen=True, kw_only=True, slots=True)
class HostSyncs:
    """Host synchronisations (``torch.cuda.synchronize`` or a device-to-host copy such as
    ``.item()`` / ``.cpu()``) a framework makes per micro-batch and model chunk in the forward,
    the backward and around each pipeline send or receive, and per optimizer step.  Each drains
    the GPU's queue: the GPU then idles while the host issues the next kernel
    (``sim.cost.step.stage_pieces``).  Counted from each framework's code (``catalogs/frameworks.yaml``
    ``host_syncs``); zero for stacks whose timers do not synchronise by default."""

    forward: int = 0
    backward: int = 0
    p2p: int = 0  # per micro-batch and chunk on a stage that sends and receives
    step: int = 0
    # per gradient bucket, once per step: Megatron-Core's check_for_nan_in_grad reads each bucket's
    # gradient norm on the host before the bucket's reduction (sim.cost.step.stage_pieces)
    per_bucket: int = 0

    def __post_init__(self) -> None:
        for n in ("forward", "backward", "p2p", "step", "per_bucket"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InputError(f"host_syncs.{n}", v, "must be an integer >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What to simulate.

    ``attention`` picks the attention kernel family (``flash``: the best fused kernel for the
    GPU; ``flash2``: FlashAttention-2; ``flex``: FlexAttention, compiled by torch.compile;
    ``unfused``: materialised scores).  ``eager_elementwise``
    says element-wise ops run one kernel each (eager PyTorch) instead of fused.
    ``selective_policy`` is what ``recompute=selective`` recomputes: ``attention`` (Megatron,
    Korthikanti et al. 2022) or ``op`` (torchtitan's op-level policy: element-wise ops and every
    other linear layer).  ``grad_accumulation`` is how each micro-batch's weight gradients are
    added into the step's (``catalogs/runtime.yaml``); ``fsdp_copies`` whether ZeRO-3 pays
    FSDP2's per-parameter packing around its collectives; ``deepspeed_bf16_optimizer`` whether
    the DeepSpeed engine runs bf16 without ZeRO through its BF16_Optimizer.  ``sim.cost.framework`` sets
    these from a framework profile; the defaults are the ``default`` profile's (megatron-core),
    which ``tests/test_run.py`` checks, and every entry point builds its plan through
    ``sim.engines.run.resolve`` rather than these defaults.
    """

    model: Model
    cluster: Cluster
    strategy: Strategy
    attention: str = "flash"
    eager_elementwise: bool = False
    # saved activations counted as eager model code keeps them (torchtitan / Hugging Face modules:
    # sim.layers.activations) rather than as Megatron's layer code does; a profile's saved_activations
    eager_activations: bool = False
    selective_policy: str = "attention"
    grad_accumulation: str = "fused"
    fsdp_copies: bool = False  # FSDP2 per-parameter packing around collectives (runtime.yaml)
    loss: str = "inplace"  # how the loss is computed (LOSS_IMPLS): its memory (runtime.yaml loss) and kernels (head_ops)
    # the loss with tensor parallelism when the framework computes it differently there ("" = loss):
    # torchtitan's loss_parallel (DTensor's decomposed log-softmax over vocabulary shards); loss_impl
    loss_tp: str = ""
    # fp8 weights cast once per step and reused by every micro-batch (Transformer Engine under
    # Megatron-Core: is_first_microbatch) instead of once per micro-batch
    fp8_weight_cache: bool = True
    # model chunks of unequal layer counts (PyTorch pipelining); Megatron-Core needs equal ones
    uneven_vp: bool = False
    # routed tokens of the busiest expert-parallel rank over the mean (1.0: balanced routing)
    moe_imbalance: float = 1.0
    moe_dispatcher: str = "alltoall"  # MOE_DISPATCHERS
    # how tokens pick experts, for a deduplicating dispatcher's bytes (sim.layers.moe_routing.ROUTINGS)
    moe_routing: str = "random"
    optimizer_impl: str = "fused"  # OPTIMIZER_IMPLS: fused multi-tensor Adam | keras (unfused ops)
    # where the PS tasks run with dp_impl=parameter-server (sim.engines.parameter_server)
    parameter_servers: ParameterServers = ParameterServers()
    # how the framework keeps model states (catalogs/runtime.yaml model_states: megatron |
    # torch_amp | deepspeed) and whether fp8 GEMM inputs are saved in their 1-byte form
    # (Transformer Engine) for the weight gradient
    state_layout: str = "megatron"
    # the layout an fp8 plan keeps instead ("" = state_layout): NeMo's performance scripts reduce
    # fp8 runs' gradients in bf16 (model_states_layout)
    fp8_state_layout: str = ""
    fp8_saved_inputs: bool = True
    # DeepSpeed's engine wraps a bf16 run without ZeRO in its BF16_Optimizer (unsharded fp32
    # gradient buffer accumulated every micro-batch, fp32 all-reduce, its own ZeRO-1 sharding of
    # the master weights and Adam states): sim.cost.step.stage_pieces, sim.cost.memory.state_bytes
    deepspeed_bf16_optimizer: bool = False
    zero3_gather: str = "bucketed"  # ZERO3_GATHERS (sim.cost.step.stage_pieces)
    tp_overlap_kind: str = "userbuffers"  # TP_OVERLAP_KINDS (sim.cost.costs.layer_cost)
    # host synchronisations per micro-batch, per step and per gradient bucket (default: the default
    # profile's, megatron-core: Megatron-Core's NaN check reads every bucket twice)
    host_syncs: HostSyncs = HostSyncs(per_bucket=2)
    # pipeline schedules run per step, each over num_microbatches / pipeline_flushes micro-batches
    # with its own fill and drain (NeMo Automodel runs schedule.step once per gradient-accumulation
    # step: sim.cost.step.compose); 1 = one schedule over the step's micro-batches (Megatron, torchtitan)
    pipeline_flushes: int = 1
    # memory-bound ops (sim.layers.ops names) that run as fused kernels where element-wise ops otherwise
    # run eagerly (a framework's TE RMSNorm, fused RoPE, fused token permutation): sim.layers.compute.ops_time
    fused_ops: tuple[str, ...] = ()
    # PYTORCH_CUDA_ALLOC_CONF as the framework's launcher sets it: caching (PyTorch's default)
    # | expandable_segments; with the recomputation mode it sets the allocator's slack
    # (sim.cost.memory.stage_memory, catalogs/runtime.yaml memory.fragmentation)
    allocator: str = "caching"
    # how the data-parallel gradient reduction is bucketed (GRAD_BUCKETS; catalogs/runtime.yaml
    # grad_buckets): the last bucket is never hidden (sim.cost.step.stage_pieces dp_tail_share)
    grad_buckets: str = "megatron"
    # (GPU architecture, largest head dimension) the stack's fused attention kernels take there
    # (a framework's fused_attention_max_head_dim): beyond it the kernel falls back (attention_kernel)
    fused_attention_max_head_dim: tuple[tuple[str, int], ...] = ()
    # the attention-kernel library release the framework's containers ship when it is older than
    # the current one (sim.layers.compute.ATTENTION_LIBRARIES; "" = current): its measured curves
    # price attention (sim.cost.costs.layer_cost)
    attention_library: str = ""
    # NCCL's NVLink SHARP as the framework's launcher leaves it (NCCL_NVLS_ENABLE; a framework's
    # nvls): off, all-reduces run without the in-switch reduction (sim.cost.costs.nvls_algorithm)
    # and no communicator maps NVLS buffers (sim.cost.memory.cluster_extra_bytes)
    nvls: bool = True
    # the NCCL release the run uses ("" = the GPU architecture's, runtime.yaml
    # nccl_release_by_architecture): its NVLS buffers per communicator, and whether it sets NVLS
    # up for a communicator that spans NVLink domains (sim.data.runtime.nvls_buffers; 2.20 does not)
    nccl: str = ""
    # FSDP2's unit for an expert-parallel MoE block's routed experts (a framework's
    # fsdp_experts_unit): "own" (over the expert data-parallel mesh) or "block" (one unit with the
    # block, a per-parameter mesh); decides the block's copy-out and held reduce-scatter input
    # (sim.cost.memory.stage_memory)
    fsdp_experts_unit: str = "own"
    # what runs the fp8 linears' activation casts (a framework's fp8_cast_kernels): "standalone"
    # (the recipe's own kernels, catalogs/efficiency.yaml fp8_recipes) or "inductor" (fused into the
    # compiled block, catalogs/efficiency.yaml compiled_fp8_casts; sim.layers.ops._with_fp8_casts)
    fp8_cast_kernels: str = "standalone"
    # what runs the rotary embedding (a framework's rope_kernels, ROPE_KERNELS): "fused" or
    # "inductor" (torchtitan's complex rope in a compiled block; sim.layers.ops.layer_ops)
    rope_kernels: str = "fused"
    # what the CUDA graphs capture when the strategy has them (CUDA_GRAPH_SCOPES): "layer" or
    # "attention" (the attention block and the MoE router; sim.cost.costs.layer_cost)
    cuda_graph_scope: str = "layer"

    @property
    def nccl_release(self) -> str | None:
        """The NCCL release the plan prices: ``nccl``, else its GPU architecture's (None where
        the catalog states none)."""
        return self.nccl or default_nccl_release(self.cluster.gpu.architecture)

    @property
    def nvls_multinode(self) -> bool:
        """Whether the release sets NVLS up for communicators that span NVLink domains (2.20
        does not; ``sim.data.runtime.nvls_across_domains``); True where no release is known."""
        release = self.nccl_release
        return release is None or nvls_across_domains(release)

    @property
    def attention_kernel(self) -> str:
        """The attention kernel this plan runs: ``attention``, unless the model's head dimension
        exceeds what the stack's fused (cuDNN) kernels take on the GPU's architecture
        (``fused_attention_max_head_dim``).  Transformer Engine then falls back to FlashAttention-2
        (``flash2``) for equal Q/K/V head dimensions up to 256, and to its unfused attention for
        MLA's unequal ones (FlashAttention is off for MLA, FA3 is Hopper-only) or beyond 256
        (TransformerEngine v2.3 pytorch/attention/dot_product_attention/utils.py
        get_attention_backend).  Costs and memory read this; exports and reports the requested
        ``attention`` (the launched stack makes the same fallback).  FlexAttention generates its
        kernel for any head dimension."""
        limit = dict(self.fused_attention_max_head_dim).get(self.cluster.gpu.architecture)
        if limit is None or self.attention in ("unfused", "flex"):
            return self.attention
        m = self.model
        if m.is_mla:
            return "unfused" if max(m.qk_head_dim, m.v_dim_per_head) > limit else self.attention
        d = m.dim_per_head
        return self.attention if d <= limit else "flash2" if d <= 256 else "unfused"

    @property
    def loss_impl(self) -> str:
        """The loss implementation this plan runs (``loss_for`` its tensor-parallel degree)."""
        return self.loss_for(self.strategy.tp)

    def loss_for(self, tp: int) -> str:
        """The loss implementation at tensor-parallel degree ``tp``: ``loss_tp`` with tp > 1
        where the framework sets one, else ``loss`` (the search asks per layout)."""
        return self.loss_tp if tp > 1 and self.loss_tp else self.loss

    @property
    def model_states_layout(self) -> str:
        """The ``catalogs/runtime.yaml`` model-state layout this plan keeps (``states_layout_for``
        its precision)."""
        return self.states_layout_for(self.strategy.precision)

    def states_layout_for(self, precision: str) -> str:
        """The model-state layout of this plan's framework at ``precision``: ``fp8_state_layout``
        for fp8 when the framework sets one, else ``state_layout`` (the search asks per candidate
        precision)."""
        if self.fp8_state_layout and precision == "fp8":
            return self.fp8_state_layout
        return self.state_layout

    @property
    def bf16_optimizer_active(self) -> bool:
        """Whether DeepSpeed's BF16_Optimizer runs this plan (bf16 without ZeRO)."""
        return self.deepspeed_bf16_optimizer and self.strategy.precision == "bf16" and self.strategy.zero == 0

    def __post_init__(self) -> None:
        if self.grad_accumulation not in GRAD_ACCUMULATION:
            raise InputError("grad_accumulation", self.grad_accumulation,
                             f"must be one of {', '.join(GRAD_ACCUMULATION)}")
        if self.loss not in LOSS_IMPLS:
            raise InputError("loss", self.loss, f"must be one of {', '.join(LOSS_IMPLS)}")
        if self.fp8_cast_kernels not in FP8_CAST_KERNELS:
            raise InputError("fp8_cast_kernels", self.fp8_cast_kernels, f"must be one of {', '.join(FP8_CAST_KERNELS)}")
        if self.rope_kernels not in ROPE_KERNELS:
            raise InputError("rope_kernels", self.rope_kernels, f"must be one of {', '.join(ROPE_KERNELS)}")
        if self.cuda_graph_scope not in CUDA_GRAPH_SCOPES:
            raise InputError("cuda_graph_scope", self.cuda_graph_scope, f"must be one of {', '.join(CUDA_GRAPH_SCOPES)}")
        if self.fsdp_experts_unit not in FSDP_EXPERTS_UNITS:
            raise InputError("fsdp_experts_unit", self.fsdp_experts_unit, f"must be one of {', '.join(FSDP_EXPERTS_UNITS)}")
        if self.loss_tp and self.loss_tp not in LOSS_IMPLS:
            raise InputError("loss_tp", self.loss_tp, f"must be one of {', '.join(LOSS_IMPLS)}")
        if self.nccl:
            nccl_version(self.nccl)
        if self.attention not in ATTENTION_IMPLS:
            raise InputError("attention", self.attention, f"must be one of {', '.join(ATTENTION_IMPLS)}")
        if self.selective_policy not in SELECTIVE_POLICIES:
            raise InputError("selective_policy", self.selective_policy,
                             f"must be one of {', '.join(SELECTIVE_POLICIES)}")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise InputError("optimizer_impl", self.optimizer_impl, f"must be one of {', '.join(OPTIMIZER_IMPLS)}")
        if self.state_layout not in STATE_LAYOUTS:
            raise InputError("state_layout", self.state_layout, f"must be one of {', '.join(STATE_LAYOUTS)}")
        if self.fp8_state_layout and self.fp8_state_layout not in STATE_LAYOUTS:
            raise InputError("fp8_state_layout", self.fp8_state_layout, f"must be one of {', '.join(STATE_LAYOUTS)}")
        if self.allocator not in ALLOCATORS:
            raise InputError("allocator", self.allocator, f"must be one of {', '.join(ALLOCATORS)}")
        if self.grad_buckets not in GRAD_BUCKETS:
            raise InputError("grad_buckets", self.grad_buckets, f"must be one of {', '.join(GRAD_BUCKETS)}")
        if self.tp_overlap_kind not in TP_OVERLAP_KINDS:
            raise InputError("tp_overlap_kind", self.tp_overlap_kind, f"must be one of {', '.join(TP_OVERLAP_KINDS)}")
        if self.zero3_gather not in ZERO3_GATHERS:
            raise InputError("zero3_gather", self.zero3_gather, f"must be one of {', '.join(ZERO3_GATHERS)}")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise InputError("moe-dispatcher", self.moe_dispatcher, f"must be one of {', '.join(MOE_DISPATCHERS)}")
        if self.moe_routing not in ROUTINGS:
            raise InputError("moe_routing", self.moe_routing, f"must be one of {', '.join(ROUTINGS)}")
        if isinstance(self.pipeline_flushes, bool) or not isinstance(self.pipeline_flushes, int) \
                or self.pipeline_flushes < 1:
            raise InputError("pipeline_flushes", self.pipeline_flushes, "must be an integer >= 1")
        if isinstance(self.moe_imbalance, bool) or not isinstance(self.moe_imbalance, (int, float)) \
                or not 1.0 <= self.moe_imbalance <= 64.0:
            raise InputError("moe-imbalance", self.moe_imbalance, "must be a number in [1, 64] (busiest rank / mean)")

    def checked(self) -> "Plan":
        """This plan, after ``check_feasible`` (``InfeasibleError`` with a reason when no framework
        could run it).  Construction checks only the fields; the resolution of a run
        (``sim.engines.run.resolve``), the search and the published-run mapping call this."""
        check_feasible(self.model, self.cluster, self.strategy, uneven_vp=self.uneven_vp)
        s, k = self.strategy, self.pipeline_flushes
        if k > 1:
            m = s.num_microbatches
            if m % k or (s.pp > 1 and s.vp > 1 and (m // k) % s.pp):
                raise InfeasibleError("indivisible", "pipeline_flushes", k,
                                      f"{m} micro-batches do not split into {k} pipeline schedules"
                                      + (f" of a multiple of pp={s.pp}" if s.vp > 1 else ""))
        return self


def _parse_int(key: str, text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise InputError(key, text, "must be an integer") from None
    return value


def _parse_bool(key: str, text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise InputError(key, text, "must be 0 or 1")


def normalize_offload(text: str) -> str:
    """The canonical ``offload`` value (``sim.data.specs.OFFLOADS``) of ``text``: parts joined by
    ``+`` in any order; ``params`` implies (and absorbs) ``optimizer``; ``none`` stands alone."""
    parts = [p.strip().lower() for p in str(text).split("+")]
    known = ("none", "optimizer", "params", "activations")
    for p in parts:
        if p not in known:
            raise InputError("offload", text, "must be none, optimizer, params, activations or a + of them "
                                              "(e.g. optimizer+activations)")
    if len(set(parts)) != len(parts) or ("none" in parts and len(parts) > 1):
        raise InputError("offload", text, "each part once; none stands alone")
    states = "params" if "params" in parts else ("optimizer" if "optimizer" in parts else "")
    acts = "activations" if "activations" in parts else ""
    out = "+".join(p for p in (states, acts) if p) or "none"
    assert out in OFFLOADS
    return out


def parse_strategy(text: str, *, num_gpus: int, seq_len: int | None = None) -> Strategy:
    """Parse ``tp=8,pp=16,mbs=1,gbs=1536,...`` (docs/interface.md) into a ``Strategy``.

    ``layout`` is a pipeline layout in Megatron-Core's syntax (``sim.data.layout``; no commas) and
    sets ``vp``.  ``dp`` defaults to ``num_gpus / (tp*pp*cp)``; ``schedule`` to ``interleaved`` when
    ``vp > 1`` else ``1f1b``; ``gbs`` to ``mbs * dp * 4 * pp`` with pipelining (4 micro-batches
    per stage keep the 1F1B bubble near 20%) or ``mbs * dp`` without.  ``fsdp=1`` is
    ``zero=3``.  ``seq_len`` from the CLI flag applies unless the string sets ``seq``.
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError("strategy", text, "must be a comma-separated list of key=value")
    values: dict[str, object] = {}
    layout_text = ""
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise InputError("strategy", text, "has an empty item (two commas in a row or a trailing comma)")
        if "=" not in part:
            raise InputError("strategy", part, "expected key=value")
        key, _, raw = part.partition("=")
        key = _ALIASES.get(key.strip().lower(), key.strip().lower())
        raw = raw.strip()
        if key in values:
            raise InputError(f"strategy.{key}", raw, "given twice")
        if key in _INT_KEYS:
            values[key] = _parse_int(key, raw)
        elif key in _BOOL_KEYS:
            values[key] = _parse_bool(key, raw)
        elif key == "offload":
            values[key] = normalize_offload(raw)
        elif key == "offload_device" and raw.lower() not in OFFLOAD_DEVICES:
            raise InputError("offload_device", raw, f"must be one of {', '.join(OFFLOAD_DEVICES)}")
        elif key in _STR_KEYS:
            values[key] = raw.lower()
        elif key == "layout":
            values["pipeline_layout"] = parse_layout(raw, field="layout")
            layout_text = raw
        elif key == "fsdp":
            if _parse_bool(key, raw):
                values["zero"] = 3
        else:
            known = ", ".join(sorted(_INT_KEYS + _BOOL_KEYS + _STR_KEYS + ("fsdp", "seq", "layout")))
            raise InputError("strategy", key, f"unknown key; known: {known}")
    for k in ("tp", "pp", "cp", "ep", "vp", "mbs"):
        v = values.get(k, 1)
        if not isinstance(v, int) or v < 1:
            raise InputError(k, v, "must be >= 1")
    if "fp8_recipe" in values and values.get("precision", "bf16") != "fp8":
        raise InputError("fp8_recipe", values["fp8_recipe"],
                         f"applies to precision=fp8; the strategy trains in {values.get('precision', 'bf16')} "
                         "(add precision=fp8, or drop fp8_recipe)")
    tp, pp, cp = int(values.get("tp", 1)), int(values.get("pp", 1)), int(values.get("cp", 1))  # type: ignore[arg-type]
    layout = values.get("pipeline_layout")
    if layout is not None:  # the layout fixes vp (Megatron-Core: virtual stages / pp)
        n = len(layout)  # type: ignore[arg-type]
        if n % pp:
            raise InputError("layout", layout_text, f"has {n} virtual stages, not a multiple of pp={pp}")
        if "vp" in values and values["vp"] != n // pp:
            raise InputError("vp", values["vp"], f"the layout has {n} virtual stages = pp*{n // pp}")
        values["vp"] = n // pp
    if "dp" not in values:
        if num_gpus % (tp * pp * cp):
            raise InfeasibleError("gpu_count", "num_gpus", num_gpus,
                                  f"not divisible by tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp}")
        values["dp"] = num_gpus // (tp * pp * cp)
    if "seq_len" not in values and seq_len is not None:
        values["seq_len"] = seq_len
    if "schedule" not in values:
        values["schedule"] = "interleaved" if int(values.get("vp", 1)) > 1 else "1f1b"  # type: ignore[arg-type]
    if "gbs" not in values:
        dp, mbs = int(values["dp"]), int(values.get("mbs", 1))  # type: ignore[arg-type]
        values["gbs"] = mbs * dp * (4 * pp if pp > 1 else 1)
    return Strategy(**values)  # type: ignore[arg-type]


def vp_split(model: Model, s: Strategy, *, vp: int | None = None) -> str | None:
    """How Megatron-Core splits each stage's layers into ``vp`` equal model chunks, or ``None``
    if it cannot: ``"even"`` when every stage's layers divide by ``vp``
    (``num_layers_per_pipeline_rank % virtual_pipeline_size == 0``, TransformerConfig);
    ``"embedding+loss"`` when they do once the embedding (first stage) and the loss (last stage)
    count as one layer each (``--account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split``: 126 layers of Llama 3.1 405B over pp=8, vp=8 is
    8 x 8 chunks of 2).  ``sim.layers.stages.stage_layers`` already gives the first and last stages the
    fewer layers, so both splits cost as the stages do."""
    vp = s.vp if vp is None else vp
    counts = stage_layer_counts(model.num_layers, s.pp)
    if all(c % vp == 0 for c in counts):
        return "even"
    units = [c + (i == 0) + (i == len(counts) - 1) for i, c in enumerate(counts)]
    if len(counts) > 1 and len(set(units)) == 1 and units[0] % vp == 0:
        return "embedding+loss"
    return None


def default_layout(model: Model, s: Strategy) -> tuple[str, ...]:
    """The pipeline layout the planner prices for ``s`` without one: ``stage_layers``' split,
    each stage's layers over its ``vp`` chunks as Megatron-Core splits them (``vp_split``: even,
    or with the embedding and loss counted as a layer each), else as the event engine cuts
    them (the first chunks take one layer more)."""
    base = s.with_(pipeline_layout=None)
    counts = [len(x) for x in stage_layers(model, base)]
    vp = s.vp
    split = vp_split(model, base) if vp > 1 else "even"
    if split == "embedding+loss":
        return megatron_layout(model.num_layers, s.pp, vp, account_embedding=True, account_loss=True)
    rows = []
    for c in counts:
        q, extra = divmod(c, vp)
        rows.append([q + (k < extra) for k in range(vp)])
    return layout_from_counts(rows)


def normalize_layout(model: Model, s: Strategy) -> Strategy:
    """``s`` without its pipeline layout when the layout is the one the planner prices by
    default (``default_layout``), so a recipe that states the default split reads as the plan
    without a layout."""
    if s.pipeline_layout is not None and "m" not in "".join(s.pipeline_layout) \
            and s.pipeline_layout == default_layout(model, s):
        return s.with_(pipeline_layout=None)
    return s


def vp_fits(model: Model, s: Strategy, *, shown: int = 12) -> tuple[list[int], bool]:
    """The ``vp > 1`` that ``vp_split`` accepts for ``s``'s pipeline (at most ``shown``, smallest
    first) and whether there are more.  In O(pp + sqrt(layers)): a split is even when ``vp``
    divides the gcd of the stage counts, or the common count with the embedding and the loss."""
    counts = stage_layer_counts(model.num_layers, s.pp)
    g = math.gcd(*counts)
    units = {c + (i == 0) + (i == len(counts) - 1) for i, c in enumerate(counts)}
    cand = set(_divisors(g))
    if len(counts) > 1 and len(units) == 1:
        cand |= set(_divisors(units.pop()))
    fits = sorted(v for v in cand if v > 1 and s.pp * v <= model.num_layers)  # every chunk holds a layer
    return fits[:shown], len(fits) > shown


def _divisors(n: int) -> list[int]:
    out = set()
    for d in range(1, math.isqrt(max(n, 0)) + 1):
        if n % d == 0:
            out.update((d, n // d))
    return sorted(out)


def check_feasible(model: Model, cluster: Cluster, s: Strategy, *, uneven_vp: bool = False) -> None:
    """Raise ``InfeasibleError`` (with a reason) if no framework could run this plan."""
    if s.num_gpus != cluster.num_gpus:
        raise InfeasibleError("gpu_count", "strategy", s.to_string(),
                              f"tp*pp*dp*cp = {s.tp}*{s.pp}*{s.dp}*{s.cp} = {s.num_gpus} != num_gpus={cluster.num_gpus}")
    if model.num_attention_heads % s.tp:
        raise InfeasibleError("heads", "tp", s.tp, f"must divide num_attention_heads={model.num_attention_heads}")
    kv = model.kv_heads
    if not model.is_mla and kv % s.tp and s.tp % kv:
        raise InfeasibleError("heads", "tp", s.tp, f"must divide num_kv_heads={kv} (or be a multiple of it)")
    if model.ffn_hidden_size % s.tp:
        raise InfeasibleError("indivisible", "tp", s.tp, f"must divide ffn_hidden_size={model.ffn_hidden_size}")
    if model.moe is not None and model.moe.expert_ffn_hidden_size % s.expert_tp:
        raise InfeasibleError("indivisible", "etp" if s.etp is not None else "tp", s.expert_tp,
                              f"must divide expert_ffn_hidden_size={model.moe.expert_ffn_hidden_size}")
    if s.seq_len % s.cp:
        raise InfeasibleError("indivisible", "cp", s.cp, f"must divide seq_len={s.seq_len}")
    if s.cp > 1 and (s.seq_len // s.cp) % 2:
        raise InfeasibleError("indivisible", "cp", s.cp,
                              f"seq_len={s.seq_len} must be divisible by 2*cp (load-balanced causal chunks)")
    if s.pp > model.num_layers and s.pipeline_layout is None:
        raise InfeasibleError("layers", "pp", s.pp, f"exceeds num_layers={model.num_layers}")
    if s.vp > 1 and model.num_layers + 2 < s.pp * s.vp and s.pipeline_layout is None:
        # Uneven chunks are allowed (Megatron's --decoder-first/last-pipeline-num-layers), but
        # every model chunk needs at least one layer (or the embedding or the loss).
        raise InfeasibleError("layers", "vp", s.vp,
                              f"pp*vp = {s.pp * s.vp} exceeds num_layers={model.num_layers} (+ the embedding and "
                              "the loss)")
    if s.pipeline_layout is not None:
        check_layout(s.pipeline_layout, pp=s.pp, num_layers=model.num_layers)
    elif s.vp > 1 and not uneven_vp and vp_split(model, s) is None:
        counts = stage_layer_counts(model.num_layers, s.pp)
        fits, more = vp_fits(model, s)
        raise InfeasibleError("layers", "vp", s.vp,
                              f"must split each pipeline stage's layers evenly ({model.num_layers} layers over "
                              f"pp={s.pp}: {'/'.join(map(str, sorted(set(counts))))} per stage, counting the "
                              "embedding and the loss as a layer each when that evens them)"
                              + (f"; vp in {{{', '.join(map(str, fits))}{', ...' if more else ''}}} does"
                                 if fits else "; no vp > 1 does")
                              + "; or state the chunks with a pipeline layout (layout=..., a framework that runs "
                              "Megatron-Core's --pipeline-model-parallel-layout)")
    if s.vp > 1 and s.num_microbatches % s.pp:
        raise InfeasibleError("indivisible", "gbs", s.gbs,
                              f"{s.schedule} schedule with vp={s.vp} needs micro-batches ({s.num_microbatches}) "
                              f"divisible by pp={s.pp}")
    if s.recompute_num_layers is not None or s.offload_num_layers is not None:
        per_stage = min(len(ls) for ls in stage_layers(model, s))
        per_chunk = max(1, per_stage // s.vp)
        if s.recompute_num_layers is not None and s.recompute_num_layers > per_chunk:
            # Megatron TransformerConfig: 1 <= recompute_num_layers <= layers per pipeline rank (per model chunk)
            raise InfeasibleError("layers", "recompute_num_layers", s.recompute_num_layers,
                                  f"exceeds the {per_chunk} layers of a model chunk")
        if s.offload_num_layers is not None and s.offload_num_layers > per_stage:
            raise InfeasibleError("layers", "offload_num_layers", s.offload_num_layers,
                                  f"exceeds the {per_stage} layers of a pipeline stage")
    if s.ep > 1 or s.etp is not None:
        if model.moe is None:
            key, value = ("ep", s.ep) if s.ep > 1 else ("etp", s.etp)
            raise InfeasibleError("experts", key, value, f"model {model.name} has no experts")
        if model.moe.num_experts % s.ep:
            raise InfeasibleError("experts", "ep", s.ep, f"must divide num_experts={model.moe.num_experts}")
        # Megatron-Core MoE parallel folding (parallel_state.initialize_model_parallel): the
        # expert layers re-partition each stage's tp*cp*dp ranks into etp x ep x expert-dp.
        ranks = s.tp * s.cp * s.dp
        if ranks % (s.expert_tp * s.ep):
            fits = [e for e in range(s.expert_tp, 0, -1) if ranks % (e * s.ep) == 0 and s.tp % e == 0]
            hint = f"; etp={fits[0]} fits" if fits and s.etp is None else ""
            raise InfeasibleError("indivisible", "ep", s.ep,
                                  f"etp*ep = {s.expert_tp}*{s.ep} must divide tp*cp*dp = {ranks} "
                                  f"(Megatron-Core MoE parallel folding; etp defaults to tp){hint}")
        if s.ep > 1 or s.expert_tp != s.tp:
            group_shape(s, "ep")  # the folded groups exist in this rank order (sim.net.placement)
        if s.tp > 1 and not s.sp and s.expert_tp != s.tp:
            raise InfeasibleError("unsupported", "etp", s.expert_tp,
                                  "expert tensor parallelism other than tp needs sequence parallelism (sp=1)")
    if s.dp_impl == "dataparallel" and s.num_gpus > cluster.gpus_per_node:
        raise InfeasibleError("unsupported", "dp_impl", s.dp_impl,
                              f"torch.nn.DataParallel is one process on one node: {s.num_gpus} GPUs exceed "
                              f"gpus_per_node={cluster.gpus_per_node} (use dp_impl=ddp)")
    if s.dp_impl == "parameter-server" and s.dp > cluster.gpus_per_node and s.dp % cluster.gpus_per_node:
        raise InfeasibleError("unsupported", "dp", s.dp,
                              f"parameter-server workers are whole nodes: dp must be a multiple of "
                              f"gpus_per_node={cluster.gpus_per_node}")
    check_offload(s)
    if s.precision == "fp8" and "fp8" not in cluster.gpu.dense_flops_per_s:
        raise InfeasibleError("unsupported", "precision", s.precision, f"{cluster.gpu.id} has no fp8 tensor cores")
    if s.precision == "fp8":
        archs = default_efficiency().fp8_recipe(s.fp8_recipe).architectures
        if archs and cluster.gpu.architecture not in archs:
            raise InfeasibleError("unsupported", "fp8_recipe", s.fp8_recipe,
                                  f"runs on {', '.join(archs)} tensor cores ({cluster.gpu.id} is "
                                  f"{cluster.gpu.architecture}; catalogs/efficiency.yaml fp8_recipes)")


def check_offload(s: Strategy) -> None:
    """The ZeRO stages each offload mode runs with (DeepSpeed config docs, ``offload_optimizer``:
    "CPU offloading is available with ZeRO stage 1, 2, 3. NVMe offloading is available only
    with ZeRO stage 3"; ``offload_param``: "Available only with ZeRO stage 3"; FSDP
    ``CPUOffload(offload_params=True)`` shards parameters, i.e. ZeRO-3)."""
    if s.offload_optimizer and s.zero < 1:
        raise InfeasibleError("unsupported", "offload", s.offload,
                              "needs zero >= 1 (the optimizer states of the shard go to the host; ZeRO-Offload)")
    if s.offload_params and s.zero != 3:
        raise InfeasibleError("unsupported", "offload", s.offload,
                              f"needs zero=3 (parameters are offloaded as FSDP / ZeRO-3 shards), got zero={s.zero}")
    if s.offload_device == "nvme" and s.zero != 3:
        raise InfeasibleError("unsupported", "offload_device", s.offload_device,
                              f"needs zero=3 (DeepSpeed offloads to NVMe with ZeRO stage 3 only), got zero={s.zero}")
