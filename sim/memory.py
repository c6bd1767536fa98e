"""Per-GPU memory: weights, gradients, optimizer states, activations, reserve.

Model states follow ZeRO (Rajbhandari et al. 2020, Sec. 3 and Fig. 1): mixed-precision Adam
keeps 2 bytes of fp16/bf16 weights, 2 bytes of gradients and K = 12 bytes of fp32 master
weights, momentum and variance per parameter; ZeRO-1 shards the 12, ZeRO-2 also the
gradients, ZeRO-3 (FSDP) also the weights over the data-parallel group.

Activations follow Korthikanti et al. (2022), Sec. 4, eq. (1)-(2) and Table 2, generalised
from GPT (4h MLP, MHA, GeLU, dropout) to GQA, SwiGLU, FlashAttention and MoE by counting the
same saved tensors:  per layer and token, with ``sbh`` bytes units,

* no parallelism: ``34 sbh + 5 a s^2 b`` (GPT; dropout masks are 1 byte per element);
* TP t without SP: ``sbh (10 + 24/t) + 5 a s^2 b / t``;  with SP: ``(34 sbh + 5 a s^2 b)/t``;
* selective recomputation drops the ``5 a s^2 b`` term; full recomputation keeps only each
  layer's input, ``2 sbh`` (``/t`` with SP).

Pipeline in-flight micro-batches: 1F1B keeps ``min(pp - stage, m)`` on stage ``stage``
(Narayanan et al. 2021, Sec. 2.2.1); interleaving multiplies the first stage by
``1 + (p - 1)/(p v)`` (Korthikanti et al. 2022, Sec. 4.2.3); GPipe keeps all ``m``.
Known error: allocator fragmentation and framework buffers are a reserve estimate, typically
good to 5-10% against ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from sim.specs import Cluster, Model, Strategy

if TYPE_CHECKING:
    from sim.plan import Plan

BYTES_ACT = 2
LOSS_BYTES_PER_LOGIT = 2 + 4 + 4 + 4


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryRuntime:
    """Framework-level memory not tied to the model (``catalogs/runtime.yaml``)."""

    workspace_bytes: float  # cuBLAS/cuDNN/NCCL workspaces
    fragmentation_fraction: float  # caching-allocator slack on top of live tensors
    source: str = ""


@functools.cache
def default_runtime() -> MemoryRuntime:
    from sim.catalog import catalog_dir

    with open(catalog_dir() / "runtime.yaml", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    m = data["memory"]
    return MemoryRuntime(workspace_bytes=float(m["workspace_bytes"]),
                         fragmentation_fraction=float(m["fragmentation_fraction"]), source=m.get("source", ""))


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """Bytes on one GPU (the most loaded one unless stated)."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    reserve_bytes: float
    stage: int
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes + self.reserve_bytes)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def as_dict(self) -> dict[str, float]:
        return {
            "weights_bytes": self.weights_bytes,
            "gradients_bytes": self.gradients_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activations_bytes": self.activations_bytes,
            "reserve_bytes": self.reserve_bytes,
            "total_bytes": self.total_bytes,
            "capacity_bytes": self.capacity_bytes,
            "stage": self.stage,
        }


def activation_bytes_per_layer(model: Model, strategy: Strategy, *, moe: bool = False,
                               attention: str = "flash", dropout: bool | None = None,
                               selective_policy: str = "attention") -> float:
    """Saved activations of one layer for one micro-batch on one GPU (bytes).

    With ``attention="unfused"``, ``dropout=True`` and a GPT layer this equals Korthikanti et
    al. eq. (1)/(2) and Table 2 exactly (tested).
    """
    tp, cp = strategy.tp, strategy.cp
    b, s = strategy.mbs, strategy.seq_len
    s_loc = s // cp
    tok = b * s_loc
    h = model.hidden_size
    drop = model_has_dropout(model) if dropout is None else dropout
    rep = tok if not strategy.sp else tok / tp  # tensors replicated across TP without SP
    if strategy.recompute == "full":
        return BYTES_ACT * rep * h  # only the layer input (Korthikanti eq. in Sec. 5)
    if strategy.recompute == "selective" and selective_policy == "op":
        return _op_sac_bytes(model, strategy, moe=moe, tokens=tok, rep=rep)

    q_w, kv_w = model.q_size, model.kv_size
    v_w = model.num_attention_heads * model.v_dim_per_head if model.is_mla else kv_w
    k_w = model.num_attention_heads * model.qk_head_dim if model.is_mla else kv_w
    q_w = model.num_attention_heads * model.qk_head_dim if model.is_mla else q_w
    o_w = model.num_attention_heads * model.v_dim_per_head if model.is_mla else model.q_size

    # Replicated across TP (without SP): two norm inputs, QKV input, MLP input, dropout masks.
    replicated = BYTES_ACT * 4 * h + (2 if drop else 0) * h
    # Sharded across TP: Q, K, V, attention output (out-proj input), MLP internals.
    sharded = BYTES_ACT * (q_w + k_w + v_w + o_w)
    if model.is_mla:  # the compressed latents are inputs of the up-projections
        sharded += BYTES_ACT * ((model.q_lora_rank or 0) + (model.kv_lora_rank or 0)) * tp
    if moe:
        spec = model.moe
        assert spec is not None
        f = spec.expert_ffn_hidden_size
        mlp_tokens = spec.top_k  # per token: top_k expert copies
        shared = spec.num_shared_experts
        # each routed copy (and each shared expert) keeps its input and its MLP internals
        ffn = BYTES_ACT * (mlp_tokens + shared) * (_mlp_saved(model.ffn_type, f) + h)
    else:
        ffn = BYTES_ACT * _mlp_saved(model.ffn_type, model.ffn_hidden_size)
    sharded += ffn
    per_token = replicated * (rep / tok) + sharded / tp
    total = per_token * tok

    if attention in ("flash", "flash2"):
        total += 4 * b * (model.num_attention_heads / tp) * s_loc  # fp32 logsumexp
    elif strategy.recompute != "selective":
        a = model.num_attention_heads
        # softmax output (2) + dropout mask (1) + dropout output (2) per score element
        per_elem = 2 + ((1 + 2) if drop else 0)
        total += per_elem * a * s_loc * s * b / tp
    return total


def _op_sac_bytes(model: Model, strategy: Strategy, *, moe: bool, tokens: float, rep: float) -> float:
    """torchtitan's op-level selective checkpointing (Liang et al. 2024, Sec. 3.2.3): keep the
    layer input, the attention output and every other matmul output; recompute the rest."""
    tp, h = strategy.tp, model.hidden_size
    if moe and model.moe is not None:
        f = model.moe.expert_ffn_hidden_size * (model.moe.top_k + model.moe.num_shared_experts)
    else:
        f = model.ffn_hidden_size
    mm_out = model.q_size + 2 * model.kv_size + h + (model.num_ffn_matrices - 1) * f + h
    sharded = model.q_size + mm_out / 2
    return BYTES_ACT * (rep * h + tokens * sharded / tp) + 4 * strategy.mbs * model.num_attention_heads / tp * (
        strategy.seq_len // strategy.cp)


def _mlp_saved(ffn_type: str, f: int) -> float:
    """Elements saved per token inside the MLP (inputs of the activation and of fc2)."""
    return 3 * f if ffn_type == "swiglu" else 2 * f


def model_has_dropout(model: Model) -> bool:
    """GPT-style (GeLU) models in Megatron train with dropout; Llama-style ones do not."""
    return model.ffn_type == "gelu"


def inflight_microbatches(strategy: Strategy, stage: int) -> float:
    """Micro-batches whose activations a pipeline stage holds at its peak."""
    p, m, v = strategy.pp, strategy.num_microbatches, strategy.vp
    if p == 1:
        return 1.0
    if strategy.schedule == "gpipe":
        return float(m)
    inflight = float(min(p - stage, m))
    if v > 1:
        inflight = min(inflight * (1 + (p - 1) / (p * v)), float(m))
    return inflight


@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters held by one GPU of a pipeline stage, split by how they are sharded."""

    dense_params: float  # sharded by TP, replicated over DP (ZeRO shards states over dp*cp)
    expert_params: float  # sharded by TP and EP, replicated over dp*cp/ep

    @property
    def total(self) -> float:
        return self.dense_params + self.expert_params


def stage_layers(model: Model, strategy: Strategy) -> list[list[int]]:
    """Layer indices per pipeline stage.

    Even split; a remainder goes to the middle stages first, since the first stage also
    holds the embedding and the last the output layer and loss.
    """
    p, n = strategy.pp, model.num_layers
    base, extra = divmod(n, p)
    order = list(range(1, p - 1)) + [0, p - 1] if p > 2 else list(range(p))
    counts = [base] * p
    for i in order[:extra]:
        counts[i] += 1
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
    return out


def stage_params(model: Model, strategy: Strategy, layers: list[int], *, first: bool, last: bool) -> StageParams:
    tp, ep = strategy.tp, strategy.ep
    dense = 0.0
    expert = 0.0
    for i in layers:
        dense += model.attention_params / tp + model.norm_params_per_layer
        if model.is_moe_layer(i):
            spec = model.moe
            assert spec is not None
            expert += spec.num_experts * model.expert_params / (tp * ep)
            dense += spec.num_shared_experts * model.expert_params / tp + model.hidden_size * spec.num_experts
        else:
            dense += model.dense_ffn_params / tp
    if first:
        dense += model.embedding_params / tp
    if last:
        dense += model.hidden_size
        if not model.tied_embeddings or strategy.pp > 1:
            # a tied output layer on another stage keeps its own copy (Megatron)
            dense += model.embedding_params / tp
    return StageParams(dense, expert)


def model_state_bytes(params: StageParams, strategy: Strategy) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes under mixed-precision Adam and ZeRO."""
    shard = strategy.dp * strategy.cp
    expert_shard = max(1, shard // strategy.ep)
    z = strategy.zero

    def split(p: float, n: int) -> tuple[float, float, float]:
        w = 2 * p / (n if z >= 3 else 1)
        g = 2 * p / (n if z >= 2 else 1)
        o = 12 * p / (n if z >= 1 else 1)
        return w, g, o

    a = split(params.dense_params, shard)
    b = split(params.expert_params, expert_shard)
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def plan_memory(plan: "Plan") -> MemoryBreakdown:
    """``memory_breakdown`` with everything a ``Plan`` says (attention kernel, selective policy);
    both engines report memory through this one call."""
    return memory_breakdown(plan.model, plan.cluster, plan.strategy, attention=plan.attention,
                            selective_policy=plan.selective_policy)


def memory_breakdown(model: Model, cluster: Cluster, strategy: Strategy, *,
                     attention: str = "flash", runtime: MemoryRuntime | None = None,
                     selective_policy: str = "attention") -> MemoryBreakdown:
    """Memory of the most loaded GPU (the pipeline stage with the largest total)."""
    rt = runtime or default_runtime()
    layers_per_stage = stage_layers(model, strategy)
    best: MemoryBreakdown | None = None
    dense_act = activation_bytes_per_layer(model, strategy, moe=False, attention=attention,
                                           selective_policy=selective_policy)
    moe_act = (activation_bytes_per_layer(model, strategy, moe=True, attention=attention,
                                          selective_policy=selective_policy)
               if model.moe is not None else 0.0)
    tok = strategy.mbs * strategy.seq_len // strategy.cp
    recomputed_layer = (activation_bytes_per_layer(model, strategy.with_(recompute="none"), attention=attention,
                                                   moe=model.moe is not None)
                        if strategy.recompute == "full" else 0.0)
    for stage, layers in enumerate(layers_per_stage):
        first, last = stage == 0, stage == strategy.pp - 1
        params = stage_params(model, strategy, layers, first=first, last=last)
        w, g, o = model_state_bytes(params, strategy)
        if strategy.zero >= 3:  # FSDP gathers one layer ahead: two unsharded layers live
            per_layer = params.total / max(1, len(layers))
            w += 2 * 2 * per_layer
        act_layer = sum(moe_act if model.is_moe_layer(i) else dense_act for i in layers)
        act = act_layer * inflight_microbatches(strategy, stage)
        if strategy.recompute == "full" and layers:
            act += recomputed_layer  # the layer being recomputed holds its full activations once
        if first and model_has_dropout(model):
            act += tok * model.hidden_size * inflight_microbatches(strategy, stage)  # embedding dropout mask
        if last:
            # Loss peak, one micro-batch at a time: bf16 logits, their fp32 up-cast, the fp32
            # softmax kept for backward and the fp32 gradient (PyTorch cross_entropy on
            # .float() logits; Megatron's vocab-parallel cross-entropy keeps the same set).
            act += tok * model.vocab_size / strategy.tp * LOSS_BYTES_PER_LOGIT
        reserve = rt.workspace_bytes + rt.fragmentation_fraction * (w + g + o + act)
        cand = MemoryBreakdown(weights_bytes=w, gradients_bytes=g, optimizer_bytes=o, activations_bytes=act,
                               reserve_bytes=reserve, stage=stage, capacity_bytes=cluster.gpu.hbm_bytes)
        if best is None or cand.total_bytes > best.total_bytes:
            best = cand
    assert best is not None
    return best
