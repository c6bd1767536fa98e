"""Frozen data model of what is trained and how: ``Model`` (with ``MoeSpec``) and ``Strategy``
(the hardware, ``Gpu``, ``Link`` and ``Cluster``, is ``sim.data.hardware``).

Every number carries its SI unit in its name.  Hardware values come from ``catalogs/`` (see
``sim.data.catalog``); nothing here hard-codes a device.  Construction validates and raises
``InputError`` naming the field and the value.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from typing import Literal

from sim.base.errors import InputError
from sim.base.checks import MAX_DIM, choice as _choice, positive_int as _positive_int
from sim.data.layout import format_layout
from sim.base.limits import MAX_LAYERS

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
FfnType = Literal["gelu", "swiglu"]
Recompute = Literal["none", "selective", "full"]
Schedule = Literal["gpipe", "1f1b", "interleaved", "zero-bubble"]

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")
TRAIN_PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8")
FFN_TYPES: tuple[str, ...] = ("gelu", "swiglu")
RECOMPUTES: tuple[str, ...] = ("none", "selective", "full")
# Megatron's --recompute-method with --recompute-granularity full (partial recomputation)
RECOMPUTE_METHODS: tuple[str, ...] = ("uniform", "block")
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zero-bubble")
FP8_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "blockwise", "mxfp8")
ORDER_DIMS: tuple[str, ...] = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = "tp-cp-dp-pp"
# every order of the four dimensions, the default first
ORDERS: tuple[str, ...] = (DEFAULT_ORDER,) + tuple(
    "-".join(p) for p in itertools.permutations(ORDER_DIMS) if "-".join(p) != DEFAULT_ORDER)
DP_IMPLS: tuple[str, ...] = ("ddp", "dataparallel", "parameter-server")
# What leaves GPU memory (docs/offload.md): ``params`` implies the optimizer (ZeRO-Infinity /
# FSDP CPUOffload); ``activations`` combines with either, written after it with ``+``.
OFFLOADS: tuple[str, ...] = ("none", "optimizer", "params", "activations", "optimizer+activations",
                             "params+activations")
OFFLOAD_DEVICES: tuple[str, ...] = ("cpu", "nvme")

# Limits that catch typos and overflow, not hardware: far above anything built today.
MAX_GPUS = 1 << 22


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeSpec:
    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    num_shared_experts: int = 0
    layer_frequency: int = 1
    first_k_dense_layers: int = 0

    def __post_init__(self) -> None:
        _positive_int("moe.num_experts", self.num_experts)
        _positive_int("moe.top_k", self.top_k)
        _positive_int("moe.expert_ffn_hidden_size", self.expert_ffn_hidden_size)
        _positive_int("moe.layer_frequency", self.layer_frequency)
        for n in ("num_shared_experts", "first_k_dense_layers"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InputError(f"moe.{n}", v, "must be an integer >= 0")
        if self.top_k > self.num_experts:
            raise InputError("moe.top_k", self.top_k, f"exceeds num_experts={self.num_experts}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Model:
    """A decoder-only transformer (GPT/Llama family), dense or MoE FFN.

    ``head_dim`` and ``num_kv_heads`` default (``None``) to ``hidden/heads`` and ``heads``.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    ffn_type: str = "gelu"
    tied_embeddings: bool = False
    moe: MoeSpec | None = None
    max_seq_len: int | None = None
    # "rope" or "learned"; None = rope for SwiGLU (Llama-family) models, learned for GeLU (GPT).
    position_embedding: str | None = None
    # Multi-head latent attention (DeepSeek-V2/V3).  Active when ``kv_lora_rank`` is set:
    # Q is down-projected to ``q_lora_rank`` (None = full-rank Q), K/V share a
    # ``kv_lora_rank`` latent; QK heads are ``head_dim + qk_rope_head_dim`` wide, V heads
    # ``v_head_dim`` wide.
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    v_head_dim: int | None = None
    # multi-token prediction depth trained with the model (DeepSeek-V3: 1; Megatron-Core
    # --mtp-num-layers): each depth is one more transformer layer of the decoder's last layer
    # kind on the stage holding the loss, with its own projection, norms, output layer and loss
    # (sim.layers.stages.stage_layers, sim.layers.ops.head_ops)
    mtp_layers: int = 0
    # Biased linear layers (QKV, attention projection and both MLP linears carry a bias vector):
    # GPT-2/GPT-3 and Megatron-LM's GPT (``--add-bias-linear`` is its default; Llama-family
    # recipes pass ``--disable-bias-linear``).  Read from model files, Hugging Face configs and
    # recipes and written back by the exports; not priced (biases are < 0.1% of the parameters,
    # and their kernels' time is not separable in the layer timings the GEMM model is fitted on:
    # docs/accuracy.md).
    linear_bias: bool = False
    # Dropout (Megatron-LM's --hidden-dropout / --attention-dropout, 0.1 unless set): the masks a
    # layer saves, 1 byte per element of each residual branch and of the embedding output, and the
    # eager dropout-add kernel.  None: the family's default (``has_dropout``).
    dropout: bool | None = None
    # Sliding-window attention: ``local_attention_layers`` of the layers attend only the last
    # ``local_attention_window`` keys (gpt-oss: 128 on half; Gemma 3: 1024 on five of six), priced
    # at the keys they attend (sim.layers.ops.windowed_keys; fused kernels skip the other tiles).
    local_attention_window: int | None = None
    local_attention_layers: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.mtp_layers, bool) or not isinstance(self.mtp_layers, int) or not 0 <= self.mtp_layers <= 8:
            raise InputError("model.mtp_layers", self.mtp_layers, "must be an integer in [0, 8]")
        for n in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size"):
            _positive_int(f"model.{n}", getattr(self, n), limit=MAX_LAYERS if n == "num_layers" else MAX_DIM)
        if self.num_kv_heads is not None:
            _positive_int("model.num_kv_heads", self.num_kv_heads)
            if self.num_attention_heads % self.num_kv_heads:
                raise InputError("model.num_kv_heads", self.num_kv_heads,
                                 f"must divide num_attention_heads={self.num_attention_heads}")
        if self.head_dim is not None:
            _positive_int("model.head_dim", self.head_dim)
        elif self.hidden_size % self.num_attention_heads:
            raise InputError("model.num_attention_heads", self.num_attention_heads,
                             f"must divide hidden_size={self.hidden_size} (or give head_dim)")
        for n in ("q_lora_rank", "kv_lora_rank", "v_head_dim"):
            if getattr(self, n) is not None:
                _positive_int(f"model.{n}", getattr(self, n))
        if isinstance(self.qk_rope_head_dim, bool) or not isinstance(self.qk_rope_head_dim, int) \
                or self.qk_rope_head_dim < 0:
            raise InputError("model.qk_rope_head_dim", self.qk_rope_head_dim, "must be an integer >= 0")
        _choice("model.ffn_type", self.ffn_type, FFN_TYPES)
        if self.position_embedding is not None:
            _choice("model.position_embedding", self.position_embedding, ("rope", "learned"))
        if not isinstance(self.tied_embeddings, bool):
            raise InputError("model.tied_embeddings", self.tied_embeddings, "must be true or false")
        if not isinstance(self.linear_bias, bool):
            raise InputError("model.linear_bias", self.linear_bias, "must be true or false")
        if self.dropout is not None and not isinstance(self.dropout, bool):
            raise InputError("model.dropout", self.dropout, "must be true or false")
        if self.local_attention_window is not None:
            _positive_int("model.local_attention_window", self.local_attention_window, limit=1 << 30)
        if self.local_attention_layers != 0:  # 0: every layer attends the full prefix
            _positive_int("model.local_attention_layers", self.local_attention_layers, limit=self.num_layers)
            if self.local_attention_window is None:
                raise InputError("model.local_attention_layers", self.local_attention_layers, "needs local_attention_window")
        if self.moe is not None and self.moe.first_k_dense_layers > self.num_layers:
            raise InputError("moe.first_k_dense_layers", self.moe.first_k_dense_layers,
                             f"exceeds num_layers={self.num_layers}")

    # Derived shapes ------------------------------------------------------------------
    @property
    def uses_rope(self) -> bool:
        if self.position_embedding is not None:
            return self.position_embedding == "rope"
        return self.is_llama_family

    @property
    def has_dropout(self) -> bool:
        """``dropout``, else GPT-style (GeLU) models train with it and the Llama family without."""
        return self.dropout if self.dropout is not None else self.ffn_type == "gelu"

    @property
    def is_llama_family(self) -> bool:
        """SwiGLU models are the Llama family (RMSNorm, no dropout, RoPE unless stated), GeLU
        models the GPT family (LayerNorm, dropout 0.1 on the residual branches): what their
        reference code runs when element-wise ops are eager (``sim.layers.ops`` kernel names,
        catalogs/efficiency.yaml eager_traffic)."""
        return self.ffn_type == "swiglu"

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_size(self) -> int:
        """Width of the query projection (heads * head_dim)."""
        return self.num_attention_heads * self.dim_per_head

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.dim_per_head

    @property
    def num_ffn_matrices(self) -> int:
        return 3 if self.ffn_type == "swiglu" else 2

    def is_moe_layer(self, layer: int) -> bool:
        """Whether 0-based ``layer`` uses the MoE FFN (a multi-token-prediction layer, numbered
        from ``num_layers``, is of the last decoder layer's kind)."""
        layer = min(layer, self.num_layers - 1)
        if self.moe is None or layer < self.moe.first_k_dense_layers:
            return False
        return (layer - self.moe.first_k_dense_layers) % self.moe.layer_frequency == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # Parameter counts (weights only, biases and norms included) ------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        return self.dim_per_head + self.qk_rope_head_dim

    @property
    def v_dim_per_head(self) -> int:
        return self.v_head_dim or self.dim_per_head

    @property
    def attention_params(self) -> int:
        h = self.hidden_size
        if not self.is_mla:
            return h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        a, r = self.num_attention_heads, self.kv_lora_rank
        q_out = a * self.qk_head_dim
        q = h * q_out if self.q_lora_rank is None else h * self.q_lora_rank + self.q_lora_rank * q_out
        kv = h * (r + self.qk_rope_head_dim) + r * a * (self.dim_per_head + self.v_dim_per_head)
        return q + kv + a * self.v_dim_per_head * h

    @property
    def dense_ffn_params(self) -> int:
        return self.num_ffn_matrices * self.hidden_size * self.ffn_hidden_size

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        assert self.moe is not None
        return self.num_ffn_matrices * self.hidden_size * self.moe.expert_ffn_hidden_size

    @property
    def moe_ffn_params(self) -> int:
        """All experts (routed + shared) and the router of one MoE layer."""
        assert self.moe is not None
        m = self.moe
        return (m.num_experts + m.num_shared_experts) * self.expert_params + self.hidden_size * m.num_experts

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        layers = self.num_layers * (self.attention_params + self.norm_params_per_layer)
        layers += self.num_dense_layers * self.dense_ffn_params
        if self.moe is not None:
            layers += self.num_moe_layers * self.moe_ffn_params
        out = 0 if self.tied_embeddings else self.embedding_params
        return layers + self.embedding_params + out + self.hidden_size  # final norm

    @property
    def num_active_params(self) -> int:
        """Parameters touched per token (top-k routed + shared experts)."""
        if self.moe is None:
            return self.num_params
        m = self.moe
        inactive = (m.num_experts - m.top_k) * self.expert_params * self.num_moe_layers
        return self.num_params - inactive


# --------------------------------------------------------------------------- strategy


DEFAULT_SEQ_LEN = 2048
"""Tokens per sequence when the user gives none (every entry point: Strategy, the CLI, tco, the
app): GPT-3's context (Brown et al. 2020, arXiv:2005.14165, Sec. 2.1, n_ctx = 2048), the
sequence of the Megatron-LM runs the reference set is built on (Narayanan et al. 2021).  A
convention, not a property of a device; kept here rather than in catalogs/conventions.yaml
because ``Strategy``'s own default needs it and ``sim.data.specs`` reads no catalog."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Strategy:
    """How one training step is parallelised.  Degrees multiply to the GPU count.

    ``dp`` is the data-parallel degree (FSDP/ZeRO shards over it).  ``vp`` > 1 means
    interleaved 1F1B with ``vp`` model chunks per pipeline rank.  ``seq_len`` is tokens per
    sequence.  ``tp_overlap`` hides tensor-parallel collectives behind GEMMs (async TP /
    userbuffers); ``dp_overlap`` overlaps gradient reduction with backward (default on, as in
    DDP, Megatron and FSDP); ``ep_overlap`` hides expert all-to-alls behind the compute of another
    micro-batch (DeepSeek-V3's DualPipe, Megatron's --moe-a2a-overlap); ``pp_overlap`` overlaps
    pipeline sends and receives with compute (Megatron's ``--overlap-p2p-comm``);
    ``cuda_graphs`` captures the step's kernels in CUDA graphs (the host no longer dispatches
    them one by one).  ``fp8_recipe`` is the fp8 scaling recipe with ``precision=fp8``
    (Megatron-Core ``--fp8-recipe``: ``delayed`` per-tensor amax history, ``tensorwise``
    current per-tensor scaling, ``blockwise`` 1x128 / 128x128 block scales, ``mxfp8`` 1x32
    microscaling on Blackwell).  ``fp8_params`` keeps the layers' linear weights in fp8 as the
    parameters themselves (Megatron-Core ``--fp8-param-gather``, Transformer Engine
    ``fp8_model_init``, NeMo ``fp8_params``): no 16-bit copy of them, the fp32 master copy in the
    distributed optimizer, the parameter all-gather in fp8.  ``dp_shard`` (HSDP) shards ZeRO/FSDP states over groups of
    ``dp_shard`` data-parallel ranks and replicates them over the ``dp / dp_shard`` groups
    (torchtitan ``data_parallel_shard_degree``, MaxText ``ici_fsdp``); ``None`` shards over all.
    ``offload`` moves model states or activations out of GPU memory (``OFFLOADS``; docs/offload.md):
    ``optimizer`` (ZeRO-Offload: optimizer states and the Adam step on the host, ZeRO 1-3),
    ``params`` (ZeRO-Infinity / FSDP CPU offload: parameters and gradients too, ZeRO-3),
    ``activations`` (saved activations to host memory), alone or after either with ``+``;
    ``offload_device`` is where offloaded model states live (``cpu`` memory or ``nvme``).

    ``pipeline_layout`` (``None``: the default split, ``sim.layers.stages.stage_layers``) is which layers
    every model chunk of every pipeline rank holds, one string per virtual stage in Megatron-Core's
    order (``sim.data.layout``: ``--pipeline-model-parallel-layout``); it fixes ``vp = len / pp``.
    ``recompute_method`` (``uniform|block``), ``recompute_num_layers`` (Megatron
    ``--recompute-method``, ``--recompute-num-layers``) and ``offload_num_layers`` (Megatron-Core
    ``--cpu-offloading-num-layers``) are carried as stated by a recipe (validated, passed to
    exports).

    Experts follow Megatron-Core's MoE parallel folding: the expert layers of a pipeline stage
    re-partition the stage's ``tp * cp * dp`` ranks into ``etp`` (expert tensor parallelism;
    ``None`` = ``tp``, Megatron's default) x ``ep`` (expert parallelism) x the expert data
    parallelism ``expert_dp`` that is left, independently of the attention layout
    (``--expert-tensor-parallel-size``, ``--expert-model-parallel-size``).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    vp: int = 1
    mbs: int = 1
    gbs: int = 1
    seq_len: int = DEFAULT_SEQ_LEN
    zero: int = 0
    sp: bool = False
    recompute: str = "none"
    precision: str = "bf16"
    schedule: str = "1f1b"
    tp_overlap: bool = False
    dp_overlap: bool = True
    ep_overlap: bool = False
    pp_overlap: bool = False
    cuda_graphs: bool = False
    fp8_recipe: str = "delayed"
    fp8_params: bool = False
    dp_shard: int | None = None
    # rank order, innermost first (Megatron-Core RankGenerator order; torchtitan's device mesh is
    # tp-cp-dp-pp): which dimension's groups are consecutive ranks and so share a node
    order: str = DEFAULT_ORDER
    # How data parallelism runs: ``ddp`` one process per GPU (DistributedDataParallel, FSDP,
    # Megatron: everything above); ``dataparallel`` single-process torch.nn.DataParallel
    # (sim/engines/dataparallel.py: replicate every forward, outputs gathered to and gradients reduced
    # onto GPU 0, one GIL-bound Python thread per GPU); ``parameter-server`` asynchronous
    # TensorFlow ParameterServerStrategy (sim/engines/parameter_server.py: workers pull the variables
    # from PS tasks and push gradients, nobody waits for the slowest).
    dp_impl: str = "ddp"
    offload: str = "none"
    offload_device: str = "cpu"
    pipeline_layout: tuple[str, ...] | None = None  # Megatron-Core --pipeline-model-parallel-layout (sim/data/layout.py)
    # Partial recomputation (Megatron --recompute-num-layers / --recompute-method, with
    # recompute=full): ``block`` recomputes the first N layers of each model chunk and keeps
    # every activation of the rest; ``uniform`` checkpoints the input of each group of N
    # layers.  None: every layer recomputed (uniform groups of 1).
    recompute_num_layers: int | None = None
    recompute_method: str = "uniform"
    # Partial activation offload (Megatron-Core --cpu-offloading-num-layers, with
    # offload=...activations): the activations of N layers of each stage go to the host.
    # None: every layer's (all but the two in compute and in transfer stay).
    offload_num_layers: int | None = None

    def __post_init__(self) -> None:
        for n in ("tp", "pp", "dp", "cp", "ep", "vp"):
            _positive_int(n, getattr(self, n), limit=MAX_GPUS)
        if self.etp is not None:
            _positive_int("etp", self.etp, limit=MAX_GPUS)
        _positive_int("mbs", self.mbs, limit=1 << 20)
        _positive_int("gbs", self.gbs, limit=1 << 30)
        _positive_int("seq_len", self.seq_len, limit=1 << 26)
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise InputError("zero", self.zero, "must be 0, 1, 2 or 3")
        _choice("recompute", self.recompute, RECOMPUTES)
        _choice("precision", self.precision, TRAIN_PRECISIONS)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        if self.fp8_params and self.precision != "fp8":
            raise InputError("fp8_params", 1, f"keeps fp8 weights: applies to precision=fp8, not {self.precision}")
        _choice("dp_impl", self.dp_impl, DP_IMPLS)
        if self.dp_impl == "dataparallel":
            other = [f"{k}={getattr(self, k)}" for k in ("tp", "pp", "cp", "ep") if getattr(self, k) > 1]
            if self.zero:
                other.append(f"zero={self.zero}")
            if self.dp_shard is not None and self.dp_shard != self.dp:
                other.append(f"dp_shard={self.dp_shard}")
            if other:
                raise InputError("dp_impl", self.dp_impl, "torch.nn.DataParallel replicates the whole module on "
                                 f"every GPU: needs tp=pp=cp=ep=1 and zero=0 (got {', '.join(other)})")
        if self.dp_impl == "parameter-server":
            other = [f"{k}={getattr(self, k)}" for k in ("tp", "pp", "cp", "ep") if getattr(self, k) > 1]
            other += [f"{k}={getattr(self, k)}" for k in ("zero", "offload") if getattr(self, k) not in (0, "none")]
            if other:
                raise InputError("dp_impl", self.dp_impl, "parameter-server training keeps the variables on the PS "
                                 f"tasks and a full replica on every GPU: needs tp=pp=cp=ep=1, zero=0, no offload "
                                 f"(got {', '.join(other)})")
            if self.gbs != self.mbs * self.dp:
                raise InputError("gbs", self.gbs, f"parameter-server training applies each worker's batch as "
                                 f"its own update: gbs must be mbs*dp = {self.mbs * self.dp} (no accumulation)")
        _choice("offload", self.offload, OFFLOADS)
        _choice("offload_device", self.offload_device, OFFLOAD_DEVICES)
        _choice("recompute_method", self.recompute_method, RECOMPUTE_METHODS)
        if self.recompute_num_layers is not None:
            _positive_int("recompute_num_layers", self.recompute_num_layers, limit=1 << 20)
            if self.recompute != "full":
                raise InputError("recompute_num_layers", self.recompute_num_layers,
                                 f"needs recompute=full (Megatron: None with selective; got recompute={self.recompute})")
        elif self.recompute_method != "uniform":
            raise InputError("recompute_method", self.recompute_method, "needs recompute_num_layers")
        if self.offload_num_layers is not None:
            _positive_int("offload_num_layers", self.offload_num_layers, limit=1 << 20)
            if not self.offload_activations:
                raise InputError("offload_num_layers", self.offload_num_layers,
                                 f"offloads activations: needs offload=activations (or +activations; got {self.offload})")
        if self.offload_device == "nvme" and not (self.offload_optimizer or self.offload_params):
            raise InputError("offload_device", self.offload_device,
                             f"holds offloaded model states: needs offload=optimizer or params (got {self.offload})")
        if self.dp_shard is not None:
            _positive_int("dp_shard", self.dp_shard, limit=MAX_GPUS)
            if self.dp % self.dp_shard:
                raise InputError("dp_shard", self.dp_shard, f"must divide dp={self.dp}")
            if self.dp_shard < self.dp and self.cp > 1:
                raise InputError("dp_shard", self.dp_shard, "HSDP with cp > 1 is not modelled (shard over all of dp)")
            if self.dp_shard < self.dp and self.zero == 0:
                raise InputError("dp_shard", self.dp_shard, "shards ZeRO/FSDP states: needs zero >= 1")
        if not isinstance(self.order, str) or sorted(self.order.split("-")) != sorted(ORDER_DIMS):
            raise InputError("order", self.order, "must order tp, cp, dp, pp innermost first, e.g. tp-cp-dp-pp")
        if self.order != DEFAULT_ORDER and self.cp > 1 and self.dp > 1 and "cp-dp" not in self.order:
            raise InputError("order", self.order, "with cp > 1 context parallelism must sit right inside data "
                             "parallelism (cp-dp): gradients are reduced over the combined group")
        if self.pipeline_layout is not None:
            lay = self.pipeline_layout
            if not isinstance(lay, tuple) or not all(isinstance(x, str) and set(x) <= set("EtmL") for x in lay):
                raise InputError("pipeline_layout", lay, "must be a tuple of layer strings (E, t, m, L) per virtual stage")
            if len(lay) != self.pp * self.vp:
                raise InputError("pipeline_layout", "|".join(lay), f"has {len(lay)} virtual stages, "
                                 f"pp*vp = {self.pp}*{self.vp} = {self.pp * self.vp}")
        if self.vp > 1 and self.schedule not in ("interleaved", "zero-bubble"):
            raise InputError("vp", self.vp, f"needs schedule=interleaved (got {self.schedule})")
        if self.schedule == "interleaved" and self.pp == 1:
            raise InputError("schedule", self.schedule, "needs pp > 1")
        if self.sp and self.tp == 1:
            raise InputError("sp", 1, "sequence parallelism needs tp > 1")
        if self.gbs % (self.mbs * self.dp):
            raise InputError("gbs", self.gbs, f"must be divisible by mbs*dp = {self.mbs}*{self.dp}")

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def zero_shard(self) -> int:
        """Data-parallel ranks (times ``cp``) ZeRO/FSDP shards its states over: ``dp_shard * cp``
        with HSDP, else ``dp * cp``."""
        return (self.dp if self.dp_shard is None else self.dp_shard) * self.cp

    @property
    def offload_optimizer(self) -> bool:
        """Optimizer states and step on the host (``offload=optimizer`` or ``params``)."""
        return offload_flags(self.offload)[0]

    @property
    def offload_params(self) -> bool:
        """Parameters and gradients on the host too (``offload=params``)."""
        return offload_flags(self.offload)[1]

    @property
    def offload_activations(self) -> bool:
        return offload_flags(self.offload)[2]

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallelism: ``etp``, or ``tp`` when not given."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Expert data parallelism: the stage's ``tp * cp * dp`` ranks over ``etp * ep``
        (at least 1; ``sim.cost.plan.check_feasible`` requires it to divide)."""
        return expert_dp_size(tp=self.tp, cp=self.cp, dp=self.dp, etp=self.etp, ep=self.ep)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step (gradient-accumulation steps when pp == 1)."""
        return self.gbs // (self.mbs * self.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.gbs * self.seq_len

    def to_string(self) -> str:
        """The STRATEGY string ``planner simulate --strategy`` accepts (round-trips)."""
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}"]
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"etp={self.etp}")
        if self.vp > 1:
            parts.append(f"vp={self.vp}")
        parts += [f"mbs={self.mbs}", f"gbs={self.gbs}", f"seq={self.seq_len}", f"zero={self.zero}",
                  f"sp={int(self.sp)}", f"recompute={self.recompute}", f"precision={self.precision}",
                  f"schedule={self.schedule}"]
        if self.tp_overlap:
            parts.append("tp_overlap=1")
        if not self.dp_overlap:
            parts.append("dp_overlap=0")
        if self.ep_overlap:
            parts.append("ep_overlap=1")
        if self.pp_overlap:
            parts.append("pp_overlap=1")
        if self.cuda_graphs:
            parts.append("cuda_graphs=1")
        if self.precision == "fp8" and self.fp8_recipe != "delayed":
            parts.append(f"fp8_recipe={self.fp8_recipe}")
        if self.fp8_params:
            parts.append("fp8_params=1")
        if self.order != DEFAULT_ORDER:
            parts.append(f"order={self.order}")
        if self.dp_shard is not None and self.dp_shard != self.dp:
            parts.append(f"dp_shard={self.dp_shard}")
        if self.dp_impl != "ddp":
            parts.append(f"dp_impl={self.dp_impl}")
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        if self.offload_device != "cpu":
            parts.append(f"offload_device={self.offload_device}")
        if self.recompute_num_layers is not None:
            parts.append(f"recompute_num_layers={self.recompute_num_layers}")
            if self.recompute_method != "uniform":
                parts.append(f"recompute_method={self.recompute_method}")
        if self.offload_num_layers is not None:
            parts.append(f"offload_num_layers={self.offload_num_layers}")
        if self.pipeline_layout is not None:
            parts.append(f"layout={format_layout(self.pipeline_layout)}")
        return ",".join(parts)

    def with_(self, **changes: object) -> "Strategy":
        """A copy with ``changes``; a pipeline layout (made for this pp and vp) is dropped when
        pp or vp changes and no new one is given."""
        if self.pipeline_layout is not None and "pipeline_layout" not in changes and \
                (changes.get("pp", self.pp) != self.pp or changes.get("vp", self.vp) != self.vp):
            changes["pipeline_layout"] = None
        return replace(self, **changes)


STRATEGY_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Strategy))


def offload_flags(mode: str) -> tuple[bool, bool, bool]:
    """(optimizer, parameters, activations) on the host for an offload mode (``OFFLOADS``:
    ``optimizer`` and ``params`` put the optimizer states and step on the host, ``params`` the
    parameters and gradients too, a ``+activations`` suffix or ``activations`` alone the saved
    activations); ``Strategy.offload_*`` and the search's offload axis read it."""
    head = mode.split("+")[0]
    return head in ("optimizer", "params"), head == "params", mode.endswith("activations")


def expert_dp_size(*, tp: int, cp: int, dp: int, etp: int | None, ep: int) -> int:
    """Expert data parallelism: a stage's ``tp * cp * dp`` ranks over ``etp * ep`` (``etp``
    None: ``tp``; at least 1; ``sim.cost.plan.check_feasible`` requires it to divide; Megatron-Core
    MoE parallel folding)."""
    return max(1, (tp * cp * dp) // ((tp if etp is None else etp) * ep))
