"""Framework profiles (``catalogs/frameworks.yaml``): mechanisms a training stack switches on.

A profile fixes the attention kernel family (FlashAttention or a materialised score
matrix), whether data-parallel gradient reduction overlaps backward, and whether element-wise
kernels are fused by a compiler.  ``apply_framework`` gives the ``Plan`` fields the cost model reads;
the strategy's ``dp_overlap`` comes from the profile too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.data.catalog import catalog_document
from sim.layers.compute import ATTENTION_LIBRARIES, default_efficiency
from sim.base.errors import InfeasibleError, InputError
from sim.cost.plan import (ATTENTION_IMPLS, FP8_CAST_KERNELS, FSDP_EXPERTS_UNITS, GRAD_ACCUMULATION, LOSS_IMPLS, MOE_DISPATCHERS,
                           OPTIMIZER_IMPLS, ROPE_KERNELS,
                      SELECTIVE_POLICIES, TP_OVERLAP_KINDS, ZERO3_GATHERS, HostSyncs)
from sim.data.specs import (DEFAULT_ORDER, DP_IMPLS, FP8_RECIPES, OFFLOAD_DEVICES, OFFLOADS, ORDERS, SCHEDULES,
                       TRAIN_PRECISIONS, Strategy)
from sim.layers.ops import FUSIBLE_OPS
from sim.base.records import Record
from sim.data.runtime import ALLOCATORS, FSDP2_LAYOUTS, GRAD_BUCKETS, STATE_LAYOUTS


FAMILIES: tuple[str, ...] = ("megatron", "fsdp", "xla", "tensorflow")
_DIMS = ("tp", "pp", "sp", "cp", "ep", "etp", "dp_shard")
_SWITCHES = ("tp_overlap", "pp_overlap", "ep_overlap", "cuda_graphs", "dp_overlap")


@dataclass(frozen=True, kw_only=True, slots=True)
class Capabilities:
    """What a training stack can run (``catalogs/frameworks.yaml`` ``capabilities``, with its
    ``source``): pipeline schedules, ZeRO/FSDP stages, precisions and fp8 recipes, which
    parallel dimensions exist (``tp``, ``pp``, ``sp``, ``cp``, ``ep``, ``etp`` = expert tensor
    parallelism other than tp / MoE parallel folding, ``dp_shard`` = HSDP), which overlap options
    and CUDA graphs it has, and ``uneven_vp``: model chunks of unequal layer counts (PyTorch
    pipelining splits any way; Megatron-Core needs equal chunks, ``sim.cost.plan.vp_split``).
    A profile without the block can run everything the model prices."""
    schedules: tuple[str, ...] = SCHEDULES
    zero: tuple[int, ...] = (0, 1, 2, 3)
    precisions: tuple[str, ...] = TRAIN_PRECISIONS
    fp8_recipes: tuple[str, ...] = FP8_RECIPES
    tp: bool = True
    pp: bool = True
    sp: bool = True
    cp: bool = True
    ep: bool = True
    etp: bool = True
    dp_shard: bool = True
    tp_overlap: bool = True
    pp_overlap: bool = True
    ep_overlap: bool = True
    cuda_graphs: bool = True
    dp_overlap: bool = True  # gradient reduction overlapped with backward (tf.distribute's one pack cannot)
    uneven_vp: bool = False
    # Megatron-Core's --pipeline-model-parallel-layout (or first/last-stage layer counts):
    # model chunks of any layer counts, as a Strategy.pipeline_layout states them
    pipeline_layout: bool = True
    sp_with_tp: bool = False  # tensor parallelism always shards the sequence too (torchtitan's TP plan)
    zero_bubble_min_vp: int = 1  # zero-bubble only interleaved (torchtitan InterleavedZeroBubble: 2)
    orders: tuple[str, ...] = ORDERS  # rank orders (Strategy.order) it can build
    zero_with_pp: tuple[int, ...] = (0, 1, 2, 3)  # ZeRO stages it combines with pipelining
    offloads: tuple[str, ...] = OFFLOADS  # Strategy.offload modes it can run
    offload_devices: tuple[str, ...] = OFFLOAD_DEVICES
    dp_impls: tuple[str, ...] = ("ddp", "dataparallel")  # how data parallelism runs (Strategy.dp_impl)
    # Megatron's partial recomputation (--recompute-method block|uniform --recompute-num-layers N)
    partial_recompute: bool = True
    # Megatron-Core's partial activation offload (--cpu-offloading-num-layers N, Strategy.offload_num_layers):
    # TransformerConfig.__post_init__ refuses it with pipelining and with recomputation
    partial_offload: bool = False
    offload_zero: tuple[int, ...] = (0, 1, 2, 3)  # ZeRO stages it offloads states with (Megatron: its distributed optimizer)
    offload_needs_sharding: bool = False  # offload only with states sharded over dp*cp > 1 (FSDP2 CPUOffloadPolicy)
    # fp8 weights as the parameters (Strategy.fp8_params: Megatron-Core --fp8-param-gather, NeMo fp8_params),
    # with the distributed optimizer ("--fp8-param-gather only supported with distributed optimizer",
    # Megatron-LM 033d8b0) or Megatron FSDP (--use-megatron-fsdp, examples/megatron_fsdp)
    fp8_params: bool = True
    source: str = ""

    def refusal(self, s: Strategy) -> tuple[str, object, str] | None:
        """(strategy key, value, what is missing) of the first thing ``s`` needs that this
        stack cannot run, or ``None``."""
        used = {"tp": s.tp > 1, "pp": s.pp > 1, "sp": s.sp, "cp": s.cp > 1, "ep": s.ep > 1,
                "etp": s.etp is not None and s.etp != s.tp, "dp_shard": s.dp_shard is not None}
        for dim in _DIMS:
            if used[dim] and not getattr(self, dim):
                return dim, getattr(s, dim), "not supported"
        if s.pipeline_layout is not None and not self.pipeline_layout:
            return "pipeline_layout", s.to_string().rsplit("layout=", 1)[-1], \
                "not supported (no per-chunk pipeline layouts)"
        if s.pp > 1 and s.schedule not in self.schedules:
            return "schedule", s.schedule, f"not supported (schedules: {', '.join(self.schedules)})"
        if s.pp > 1 and s.schedule == "zero-bubble" and s.vp < self.zero_bubble_min_vp:
            return "vp", s.vp, f"zero-bubble needs vp >= {self.zero_bubble_min_vp}"
        if s.order not in self.orders:
            return "order", s.order, f"not supported (rank orders: {', '.join(self.orders)})"
        if self.sp_with_tp and s.tp > 1 and not s.sp:
            return "sp", 0, "tensor parallelism always shards the sequence (sp=1)"
        if s.zero not in self.zero:
            return "zero", s.zero, f"not supported (ZeRO/FSDP stages: {', '.join(map(str, self.zero))})"
        if s.pp > 1 and s.zero not in self.zero_with_pp:
            return "zero", s.zero, f"not supported with pipelining (stages: {', '.join(map(str, self.zero_with_pp))})"
        if s.offload not in self.offloads:
            return "offload", s.offload, f"not supported (offload: {', '.join(self.offloads)})"
        if s.offload != "none" and s.offload_device not in self.offload_devices:
            return "offload_device", s.offload_device, f"not supported (devices: {', '.join(self.offload_devices)})"
        if s.dp_impl not in self.dp_impls:
            return "dp_impl", s.dp_impl, f"not supported (data parallelism: {', '.join(self.dp_impls)})"
        if s.recompute_num_layers is not None and not self.partial_recompute:
            return "recompute_num_layers", s.recompute_num_layers, "not supported (no partial recomputation)"
        if s.offload_num_layers is not None and not self.partial_offload:
            return "offload_num_layers", s.offload_num_layers, "not supported (no partial activation offload)"
        if s.offload_activations and self.partial_offload:  # Megatron-Core's activation offload: N layers
            if s.offload_num_layers is None:  # 'CPU offloading can be done only for layers less than num_layers'
                return "offload", s.offload, "offloads the activations of N < num_layers layers: state offload_num_layers"
            if s.pp > 1:  # Megatron-Core: 'no support for Pipeline parallelism with CPU offloading'
                return "offload_num_layers", s.offload_num_layers, "not supported with pipelining (pp > 1)"
            if s.recompute != "none":  # 'CPU offloading does not work when activation recomputation is enabled'
                return "offload_num_layers", s.offload_num_layers, f"not supported with recompute={s.recompute}"
        if (s.offload_optimizer or s.offload_params) and s.zero not in self.offload_zero:  # offloaded states
            return "zero", s.zero, f"not supported with offload (ZeRO stages: {', '.join(map(str, self.offload_zero))})"
        if s.offload != "none" and self.offload_needs_sharding and s.dp * s.cp == 1:
            return "offload", s.offload, "needs states sharded over dp*cp > 1"
        if s.precision not in self.precisions:
            return "precision", s.precision, f"not supported (precisions: {', '.join(self.precisions)})"
        if s.precision == "fp8" and s.fp8_recipe not in self.fp8_recipes:
            return "fp8_recipe", s.fp8_recipe, f"not supported (fp8 recipes: {', '.join(self.fp8_recipes) or 'none'})"
        if s.fp8_params and not self.fp8_params:
            return "fp8_params", 1, "not supported (no fp8 parameters)"
        if s.fp8_params and s.zero not in (1, 3):
            return "fp8_params", 1, f"needs the distributed optimizer (zero=1) or Megatron FSDP (zero=3), not zero={s.zero}"
        for switch in _SWITCHES:
            if getattr(s, switch) and not getattr(self, switch):
                return switch, 1, "not supported"
        return None


# the attention kernels every stack launches (Framework.attention_kernels without the profile key)
DEFAULT_ATTENTION_KERNELS: tuple[str, ...] = ("flash", "flash2", "unfused")


def check_attention(fw: "Framework", kernel: str | None) -> None:
    """Raise ``InputError`` (field ``attention``) if ``fw`` cannot launch the attention ``kernel``
    the user asked for (``Framework.attention_kernels``)."""
    if kernel is not None and kernel not in fw.attention_kernels:
        raise InputError("attention", kernel, f"the {fw.id} framework profile launches "
                         f"{', '.join(fw.attention_kernels)} (catalogs/frameworks.yaml attention_kernels)")


def check_supported(fw: "Framework", s: Strategy) -> None:
    """Raise ``InfeasibleError`` (reason ``framework``) if ``fw`` cannot run ``s``."""
    why = fw.capabilities.refusal(s)
    if why is not None:
        key, value, message = why
        raise InfeasibleError("framework", key, value, f"{message} by the {fw.id} framework profile "
                              "(its capabilities and their sources: catalogs/frameworks.yaml)")


def _capabilities(r: Record) -> Capabilities:
    if not r.has("capabilities"):
        return Capabilities(source="runs everything the model prices")
    c = r.mapping("capabilities", allowed=("schedules", "zero", "precisions", "fp8_recipes", *_DIMS, *_SWITCHES,
                                           "uneven_vp", "pipeline_layout", "sp_with_tp", "zero_bubble_min_vp", "orders",
                                           "zero_with_pp", "offloads", "offload_devices", "dp_impls", "partial_recompute",
                                           "partial_offload", "offload_zero", "offload_needs_sharding", "fp8_params", "source"))
    def choices(key: str, allowed: tuple, default: tuple) -> tuple:
        if not c.has(key):
            return default
        values = tuple(c.rec[key])
        for v in values:
            if v not in allowed or isinstance(v, bool):
                raise c.fail(key, f"{v!r} is not one of {', '.join(map(str, allowed))}")
        return values
    return Capabilities(schedules=choices("schedules", SCHEDULES, SCHEDULES), zero=choices("zero", (0, 1, 2, 3), (0, 1, 2, 3)),
                        precisions=choices("precisions", TRAIN_PRECISIONS, TRAIN_PRECISIONS),
                        fp8_recipes=choices("fp8_recipes", FP8_RECIPES, FP8_RECIPES),
                        **{k: c.flag(k, default=True) for k in (*_DIMS, *_SWITCHES)},
                        uneven_vp=c.flag("uneven_vp"), pipeline_layout=c.flag("pipeline_layout"),
                        sp_with_tp=c.flag("sp_with_tp"),
                        zero_bubble_min_vp=c.integer("zero_bubble_min_vp", optional=True, default=1),
                        orders=choices("orders", ORDERS, (DEFAULT_ORDER,)),
                        zero_with_pp=choices("zero_with_pp", (0, 1, 2, 3), choices("zero", (0, 1, 2, 3), (0, 1, 2, 3))),
                        offloads=choices("offloads", OFFLOADS, ("none",)),
                        offload_devices=choices("offload_devices", OFFLOAD_DEVICES, ("cpu",)),
                        dp_impls=choices("dp_impls", DP_IMPLS, ("ddp", "dataparallel")),
                        partial_recompute=c.flag("partial_recompute"), partial_offload=c.flag("partial_offload"),
                        offload_zero=choices("offload_zero", (0, 1, 2, 3), (0, 1, 2, 3)),
                        offload_needs_sharding=c.flag("offload_needs_sharding"),
                        fp8_params=c.flag("fp8_params", default=True), source=c.text("source"))


def _host_syncs(r: Record) -> HostSyncs:
    if not r.has("host_syncs"):
        return HostSyncs()
    h = r.mapping("host_syncs", allowed=("forward", "backward", "p2p", "step", "per_bucket", "source"))
    h.text("source")
    return HostSyncs(**{k: h.integer(k, minimum=0, optional=True, default=0)
                        for k in ("forward", "backward", "p2p", "step", "per_bucket")})


PIPELINE_SCHEDULE_PER = ("step", "local_batch")


def _attention_head_dim_limits(r: Record) -> tuple[tuple[str, int], ...]:
    if not r.has("fused_attention_max_head_dim"):
        return ()
    m = r.mapping("fused_attention_max_head_dim")
    return tuple((arch, int(m.integer(arch))) for arch in m.rec if arch != "source")


def _names_in(r: Record, key: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    """The list of names ``key`` holds, each one of ``known`` (else the record's error)."""
    names = r.strings(key)
    for name in names:
        if name not in known:
            raise r.fail(key, f"{name!r} is not {what}; known: {', '.join(known)}")
    return names


def _fused_ops(r: Record) -> tuple[str, ...]:
    return _names_in(r, "fused_ops", FUSIBLE_OPS, "a memory-bound op")


@dataclass(frozen=True, kw_only=True, slots=True)
class Framework:
    id: str
    name: str
    attention: str  # flash | flash2 | unfused
    dp_overlap: bool
    eager_elementwise: bool
    # which model code's saved activations (sim.layers.activations): eager (torchtitan / Hugging Face
    # modules) or Megatron's layer code; default: as elementwise
    eager_activations: bool = False
    selective_recompute: str  # attention | op
    grad_accumulation: str = "fused"  # fused | fp32_main_grad | autograd (runtime.yaml)
    fsdp_copies: bool = False  # FSDP2 packing around ZeRO-3 collectives (runtime.yaml)
    loss: str = "upcast"  # LOSS_IMPLS: upcast | inplace | outofplace | megatron_fused | fused | bf16 | loss_parallel (runtime.yaml loss)
    loss_tp: str = ""  # the loss with tensor parallelism when it differs ("" = loss), Plan.loss_tp
    # What the framework's recipes switch on when a run does not say (the profile's source):
    sequence_parallel_default: bool = False  # SP with tp > 1
    tp_overlap_default: bool = False  # pipelined TP communication overlap with tp > 1 and SP
    zero_default: int = 0  # ZeRO stage without a stated one (1: a distributed optimizer by default)
    fp8_weight_cache: bool = False  # fp8 weights cast once per step, not per micro-batch
    family: str = "megatron"  # megatron | fsdp | xla: the class uncertainty bands are kept by
    capabilities: Capabilities = Capabilities()
    moe_dispatcher: str = "alltoall"  # how MoE tokens are dispatched (sim.cost.costs.moe_dispatch_s)
    optimizer: str = "fused"  # fused (multi-tensor Adam) | keras (unfused ops; runtime.yaml)
    dp_impl: str = "ddp"  # how it runs data parallelism: ddp (all-reduce) | parameter-server (async)
    model_states: str = "deepspeed"  # runtime.yaml model_states layout (Plan.state_layout)
    # the layout of its fp8 runs when they differ ("": model_states), Plan.fp8_state_layout
    fp8_model_states: str = ""
    # its fp8 recipes that keep fp8 parameters unless told otherwise (NeMo's bf16_with_fp8_mixed:
    # fp8_param_gather=True); read by planner.fitting.reference for rows that do not say
    fp8_params_recipes: tuple[str, ...] = ()
    fp8_saved_inputs: bool = False  # fp8 GEMM inputs saved in 1-byte form (Transformer Engine)
    deepspeed_bf16_optimizer: bool = False  # DeepSpeed engine: BF16_Optimizer for bf16 without ZeRO
    zero3_gather: str = "bucketed"  # bucketed | per_tensor_sync (DeepSpeed ZeRO-3 of 2021)
    tp_overlap_kind: str = "userbuffers"  # userbuffers (TE) | async_tp (torch.compile micro-pipelining)
    host_syncs: HostSyncs = HostSyncs()  # per micro-batch (forward, backward, p2p) and per step
    # memory-bound ops run as fused kernels although element-wise ops are eager (sim.layers.ops.FUSIBLE_OPS)
    fused_ops: tuple[str, ...] = ()
    # step: one pipeline schedule per step; local_batch: one per local batch (gradient-accumulation
    # step), Plan.pipeline_flushes = gbs / (local batch x dp) (planner.fitting.reference)
    pipeline_schedule_per: str = "step"
    # PYTORCH_CUDA_ALLOC_CONF the framework's launcher sets (sim.data.runtime.ALLOCATORS)
    allocator: str = "caching"
    # how its data-parallel gradient reduction is bucketed (sim.data.runtime.GRAD_BUCKETS); default by
    # model_states: megatron -> megatron, deepspeed -> deepspeed, torch_amp / torch_bf16 -> ddp
    grad_buckets: str = "megatron"
    # the largest head dimension its fused attention kernels take, per GPU architecture (beyond it
    # Transformer Engine falls back: sim.cost.plan.Plan.attention_kernel); none: no limit
    fused_attention_max_head_dim: tuple[tuple[str, int], ...] = ()
    # the attention-kernel library release its containers ship when older than the current one
    # (sim.layers.compute.ATTENTION_LIBRARIES; "" = current), Plan.attention_library
    attention_library: str = ""
    # NCCL's NVLink SHARP left on (NCCL's default) or switched off by the launcher (NCCL_NVLS_ENABLE=0), Plan.nvls
    nvls: bool = True
    # how FSDP2 wraps an expert-parallel MoE block's routed experts (Plan.fsdp_experts_unit):
    # "own" a unit of their own over the expert data-parallel mesh (Automodel; torchtitan before
    # 18a46d4), "block" with the block, placed by a per-parameter mesh (torchtitan since)
    fsdp_experts_unit: str = "own"
    # what runs the fp8 linears' activation casts (Plan.fp8_cast_kernels): "standalone" kernels
    # (Transformer Engine) or "inductor" (torchao's casts fused into the compiled block)
    fp8_cast_kernels: str = "standalone"
    # what runs the rotary embedding (Plan.rope_kernels): "fused" or "inductor" (torchtitan's
    # complex rope compiled by inductor)
    rope_kernels: str = "fused"
    # the attention kernels the stack can launch (Plan.attention): FlashAttention-3 / cuDNN,
    # FlashAttention-2 and unfused everywhere; FlexAttention where its model code calls
    # torch.nn.attention.flex_attention (profile key attention_kernels)
    attention_kernels: tuple[str, ...] = DEFAULT_ATTENTION_KERNELS
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""


_KEYS = ("id", "name", "aliases", "attention", "dp_overlap", "elementwise", "selective_recompute",
         "grad_accumulation", "fsdp_copies", "loss", "sequence_parallel_default", "tp_overlap_default", "zero_default",
         "fp8_weight_cache", "family", "capabilities", "moe_dispatcher", "optimizer", "dp_impl", "model_states",
         "fp8_saved_inputs", "deepspeed_bf16_optimizer", "zero3_gather", "tp_overlap_kind", "host_syncs", "source",
         "notes", "fused_ops", "pipeline_schedule_per", "allocator", "grad_buckets",
         "saved_activations", "fused_attention_max_head_dim", "fp8_model_states", "fp8_params_recipes",
         "attention_library", "nvls", "loss_tp", "fsdp_experts_unit", "fp8_cast_kernels",
         "rope_kernels", "attention_kernels")
_BUCKETS_BY_STATES = {"megatron": "megatron", "deepspeed": "deepspeed", **{name: "ddp" for name in FSDP2_LAYOUTS}}


@functools.cache
def _frameworks() -> dict[str, Framework]:
    doc = catalog_document("frameworks.yaml")
    out: dict[str, Framework] = {}
    for raw in doc["frameworks"]:
        r = Record(raw, where=f"framework[{raw.get('id')}]", file="frameworks.yaml", allowed=_KEYS)
        fw = Framework(id=r.text("id"), name=r.text("name"), attention=r.text("attention", choices=ATTENTION_IMPLS),
                       dp_overlap=r.flag("dp_overlap"),
                       eager_elementwise=r.text("elementwise", choices=("fused", "eager")) == "eager",
                       eager_activations=r.text("saved_activations", choices=("fused", "eager"),
                                                default=r.text("elementwise", choices=("fused", "eager"))) == "eager",
                       selective_recompute=r.text("selective_recompute", default="attention", choices=SELECTIVE_POLICIES),
                       grad_accumulation=r.text("grad_accumulation", default="fused", choices=GRAD_ACCUMULATION),
                       fsdp_copies=r.flag("fsdp_copies"), loss=r.text("loss", default="upcast", choices=LOSS_IMPLS),
                       loss_tp=r.text("loss_tp", default="", choices=LOSS_IMPLS + ("",)),
                       sequence_parallel_default=r.flag("sequence_parallel_default"),
                       tp_overlap_default=r.flag("tp_overlap_default"),
                       zero_default=r.integer("zero_default", minimum=0, optional=True, default=0),
                       fp8_weight_cache=r.flag("fp8_weight_cache"),
                       family=r.text("family", choices=FAMILIES), capabilities=_capabilities(r),
                       moe_dispatcher=r.text("moe_dispatcher", default="alltoall", choices=MOE_DISPATCHERS),
                       optimizer=r.text("optimizer", default="fused", choices=OPTIMIZER_IMPLS),
                       dp_impl=r.text("dp_impl", default="ddp", choices=DP_IMPLS),
                       model_states=r.text("model_states", choices=STATE_LAYOUTS),
                       fp8_model_states=r.text("fp8_model_states", default="", choices=STATE_LAYOUTS + ("",)),
                       fp8_params_recipes=_names_in(r, "fp8_params_recipes", FP8_RECIPES, "an fp8 recipe"),
                       attention_library=r.text("attention_library", default="", choices=ATTENTION_LIBRARIES + ("",)),
                       fp8_saved_inputs=r.flag("fp8_saved_inputs"),
                       deepspeed_bf16_optimizer=r.flag("deepspeed_bf16_optimizer"),
                       zero3_gather=r.text("zero3_gather", default="bucketed", choices=ZERO3_GATHERS),
                       tp_overlap_kind=r.text("tp_overlap_kind", default="userbuffers", choices=TP_OVERLAP_KINDS),
                       host_syncs=_host_syncs(r), fused_ops=_fused_ops(r),
                       pipeline_schedule_per=r.text("pipeline_schedule_per", default="step",
                                                    choices=PIPELINE_SCHEDULE_PER),
                       allocator=r.text("allocator", default="caching", choices=ALLOCATORS),
                       fused_attention_max_head_dim=_attention_head_dim_limits(r),
                       grad_buckets=r.text("grad_buckets", choices=GRAD_BUCKETS,
                                           default=_BUCKETS_BY_STATES.get(r.text("model_states"), "megatron")),
                       nvls=r.flag("nvls", default=True),
                       fsdp_experts_unit=r.text("fsdp_experts_unit", default="own", choices=FSDP_EXPERTS_UNITS),
                       fp8_cast_kernels=r.text("fp8_cast_kernels", default="standalone", choices=FP8_CAST_KERNELS),
                       rope_kernels=r.text("rope_kernels", default="fused", choices=ROPE_KERNELS),
                       attention_kernels=(_names_in(r, "attention_kernels", ATTENTION_IMPLS, "an attention kernel")
                                          or DEFAULT_ATTENTION_KERNELS),
                       aliases=r.strings("aliases", lower=False),
                       source=r.text("source"), notes=r.text("notes", default=""))
        if fw.attention not in fw.attention_kernels:
            raise r.fail("attention", f"{fw.attention} is not one of its attention_kernels "
                                      f"({', '.join(fw.attention_kernels)})")
        for key in (fw.id, *fw.aliases):
            out[key.lower()] = fw
    return out


def get_framework(name: str) -> Framework:
    table = _frameworks()
    fw = table.get(str(name).lower())
    if fw is None:
        known = sorted({f.id for f in table.values()})
        raise InputError("framework", name, f"unknown framework; known: {', '.join(known)}")
    return fw


def apply_framework(plan_kwargs: dict, fw: Framework) -> dict:
    """Plan keyword arguments for ``fw`` (attention kernel, element-wise fusion, policy,
    optimizer implementation, model-state layout).  What the profile does to a strategy the
    user left silent (``dp_overlap``, the fp8 recipe, ``dp_impl``) is ``sim.engines.run.complete_strategy``."""
    return {**plan_kwargs, "attention": fw.attention, "eager_elementwise": fw.eager_elementwise,
            "eager_activations": fw.eager_activations,
            "selective_policy": fw.selective_recompute, "grad_accumulation": fw.grad_accumulation,
            "fsdp_copies": fw.fsdp_copies, "loss": fw.loss, "loss_tp": fw.loss_tp, "fp8_weight_cache": fw.fp8_weight_cache,
            "uneven_vp": fw.capabilities.uneven_vp, "moe_dispatcher": fw.moe_dispatcher,
            "optimizer_impl": fw.optimizer, "state_layout": fw.model_states, "fp8_state_layout": fw.fp8_model_states,
            "fp8_saved_inputs": fw.fp8_saved_inputs,
            "deepspeed_bf16_optimizer": fw.deepspeed_bf16_optimizer, "zero3_gather": fw.zero3_gather,
            "tp_overlap_kind": fw.tp_overlap_kind, "host_syncs": fw.host_syncs, "fused_ops": fw.fused_ops,
            "allocator": fw.allocator, "grad_buckets": fw.grad_buckets,
            "fused_attention_max_head_dim": fw.fused_attention_max_head_dim, "attention_library": fw.attention_library,
            "nvls": fw.nvls, "fsdp_experts_unit": fw.fsdp_experts_unit,
            "fp8_cast_kernels": fw.fp8_cast_kernels, "rope_kernels": fw.rope_kernels}


def list_frameworks() -> list[Framework]:
    seen: dict[str, Framework] = {}
    for fw in _frameworks().values():
        seen.setdefault(fw.id, fw)
    return list(seen.values())


def default_frameworks_for(attention: str | None) -> tuple[Framework, ...]:
    """The default profiles (``default_frameworks``) that launch the attention kernel asked for
    (all of them without one); ``InputError`` when none does."""
    profiles = default_frameworks()
    if attention is None:
        return profiles
    out = tuple(fw for fw in profiles if attention in fw.attention_kernels)
    if not out:
        raise InputError("attention", attention, "no default framework profile launches it; name one with "
                         "--framework (catalogs/frameworks.yaml attention_kernels)")
    return out


@functools.cache
def default_frameworks() -> tuple[Framework, ...]:
    """The profiles ``searched_by_default`` (``catalogs/frameworks.yaml``), in order: what
    ``planner recommend`` searches and ``planner simulate`` picks from without ``--framework``."""
    doc = catalog_document("frameworks.yaml")
    ids = doc.get("searched_by_default")
    if not isinstance(ids, (list, tuple)) or not ids:
        raise InputError("frameworks.yaml.searched_by_default", ids, "must list at least one profile id")
    return tuple(dict.fromkeys(get_framework(i) for i in ids))


def fp8_recipe_for(fw: Framework, architecture: str | None) -> str | None:
    """The framework's own fp8 recipe on a GPU architecture: the first of its ``fp8_recipes``
    that runs there (``catalogs/efficiency.yaml`` ``fp8_recipes`` architectures), else None."""
    eff = default_efficiency()
    for r in fw.capabilities.fp8_recipes:
        archs = eff.fp8_recipe(r).architectures
        if not archs or architecture in archs:
            return r
    return None
