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
Offloading (``Strategy.offload``, ``sim.offload``, docs/offload.md) moves bytes to the host:
``optimizer`` takes the shard's fp32 master weights and Adam moments off the GPU (and its
gradients with ZeRO-2/3), ``params`` the weight shard too (only the gathered layers stay),
``activations`` every saved layer activation but two layers' worth (the one being computed
and the one in transfer); the host holds ``catalogs/offload.yaml``'s bytes per offloaded
parameter and the activations, checked against the node's DRAM (``HostSpec``) like HBM.

Known error: allocator fragmentation and framework buffers are a reserve estimate, typically
good to 5-10% against ``torch.cuda.max_memory_allocated``; pinned staging buffers of the
offload are not counted on either side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from sim.offload import OffloadConstants, host_spec, offload_constants
from sim.runtime import MemoryRuntime, default_runtime
from sim.specs import Cluster, Model, Strategy
from sim.stages import StageParams, StageShape, stage_shapes
from sim.step import Num

if TYPE_CHECKING:
    from sim.plan import Plan

BYTES_ACT = 2


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
    # Offloaded (per node: the most loaded stage's GPU times the node's GPUs); see the module docstring.
    host_states_bytes: float = 0.0  # model states in host DRAM
    host_activations_bytes: float = 0.0
    nvme_bytes: float = 0.0  # model states on NVMe (offload_device=nvme)
    host_capacity_bytes: float = float("inf")
    nvme_capacity_bytes: float = float("inf")

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes + self.reserve_bytes)

    @property
    def host_bytes(self) -> float:
        """Offloaded bytes in one node's host DRAM."""
        return self.host_states_bytes + self.host_activations_bytes

    @property
    def fits_gpu(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_bytes <= self.host_capacity_bytes and self.nvme_bytes <= self.nvme_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host

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
            "host_bytes": self.host_bytes,
            "host_states_bytes": self.host_states_bytes,
            "host_activations_bytes": self.host_activations_bytes,
            "host_capacity_bytes": self.host_capacity_bytes,
            "nvme_bytes": self.nvme_bytes,
            "nvme_capacity_bytes": self.nvme_capacity_bytes,
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

    policy = selective_policy if strategy.recompute == "selective" else ""
    # Replicated across TP (without SP): two norm inputs, QKV input, MLP input, dropout masks.
    replicated = BYTES_ACT * 4 * h + (2 if drop else 0) * h
    # Sharded across TP: Q, K, V, attention output (out-proj input), MLP internals.
    # mla_up_proj recomputes per-head Q, K, V from the saved latents.
    sharded = BYTES_ACT * ((0 if policy == "mla_up_proj" and model.is_mla else q_w + k_w + v_w) + o_w)
    if model.is_mla:  # the compressed latents are inputs of the up-projections
        sharded += BYTES_ACT * ((model.q_lora_rank or 0) + (model.kv_lora_rank or 0)) * tp
    if moe:
        spec = model.moe
        assert spec is not None
        f = spec.expert_ffn_hidden_size
        etp = strategy.expert_tp
        # Each routed copy keeps its input and its MLP internals.  An expert's etp ranks gather
        # each other's tokens (sim.ops): the inputs are replicated over etp, the internals split.
        # Per token of this TP rank (sharded by tp below): top_k copies x (internals + etp x input).
        routed = spec.top_k * (_mlp_saved(model.ffn_type, f, policy) + etp * h)
        shared = spec.num_shared_experts * (_mlp_saved(model.ffn_type, f, policy) + h)
        ffn = BYTES_ACT * (routed + shared)
    else:
        ffn = BYTES_ACT * _mlp_saved(model.ffn_type, model.ffn_hidden_size, "" if policy == "moe_act" else policy)
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


def _mlp_saved(ffn_type: str, f: int, policy: str = "") -> float:
    """Elements saved per token inside the MLP (inputs of the activation and of fc2); a
    selective ``policy`` that recomputes the up-projection (``mlp_up``, ``mlp``) keeps none,
    one that recomputes the activation (``moe_act``) keeps only its input."""
    if policy in ("mlp_up", "mlp"):
        return 0.0
    act_in = 2 * f if ffn_type == "swiglu" else f
    return act_in if policy == "moe_act" else act_in + f


def model_has_dropout(model: Model) -> bool:
    """GPT-style (GeLU) models in Megatron train with dropout; Llama-style ones do not."""
    return model.ffn_type == "gelu"


def inflight_microbatches(strategy: Strategy, stage: int) -> float:
    """Micro-batches whose activations a pipeline stage holds at its peak."""
    return float(inflight(strategy.pp, strategy.num_microbatches, strategy.vp, strategy.schedule == "gpipe", stage))


def inflight(pp: int, m: Num, vp: Num, gpipe: Num, stage: int) -> Num:
    """``inflight_microbatches`` over arrays of micro-batch counts ``m``, interleaving depths
    ``vp`` and GPipe flags (module docstring)."""
    if pp == 1:
        return 1.0 + 0.0 * (m + vp)
    one_f1b = np.minimum(pp - stage, m)
    interleaved = np.minimum(one_f1b * (1 + (pp - 1) / (pp * vp)), m)
    return np.where(gpipe, m, np.where(vp > 1, interleaved, one_f1b)) + 0.0


def chunk_inflight(inflight_mb: Num, vp: int, pp: int) -> list[Num]:
    """In-flight passes of each of a stage's ``vp`` model chunks at its peak: ``inflight_mb``
    micro-batches' worth, ``inflight_mb * vp`` chunk passes, taken in the interleaved
    schedule's order (``pp`` micro-batches of chunk 0, then of chunk 1, ...; Megatron-LM's
    ``forward_backward_pipelining_with_interleaving``).  Equal chunks hold ``inflight_mb``
    micro-batches of the stage, as ``inflight`` counts them."""
    if vp == 1:
        return [inflight_mb]
    w = np.asarray(inflight_mb, dtype=float) * vp
    cycle = pp * vp
    q = np.floor(w / cycle)
    r = w - q * cycle
    return [q * pp + np.clip(r - c * pp, 0.0, pp) for c in range(vp)]


def model_state_bytes(params: StageParams, strategy: Strategy) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes under mixed-precision Adam and ZeRO."""
    w, g, o = state_bytes(params, strategy.zero, strategy.dp * strategy.cp, strategy.expert_dp)
    return float(w), float(g), float(o)


def state_bytes(params: StageParams, zero: Num, shard: int, expert_shard: int) -> tuple[Num, Num, Num]:
    """``model_state_bytes`` for a ZeRO stage or an array of them; dense states shard over
    ``shard`` = dp * cp ranks, expert states over ``expert_shard`` (the expert data
    parallelism, ``Strategy.expert_dp``)."""
    z = np.asarray(zero)

    def split(p: float, n: int) -> tuple[Num, Num, Num]:
        return (np.where(z >= 3, 2 * p / n, 2 * p), np.where(z >= 2, 2 * p / n, 2 * p),
                np.where(z >= 1, 12 * p / n, 12 * p))

    a = split(params.dense_params, shard)
    b = split(params.expert_params, expert_shard)
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Bytes on one GPU of a stage (floats or arrays, as the inputs of ``stage_memory``)."""

    weights_bytes: Num
    gradients_bytes: Num
    optimizer_bytes: Num
    activations_bytes: Num
    reserve_bytes: Num
    host_states_bytes: Num = 0.0  # per GPU, offloaded model states in host DRAM
    host_activations_bytes: Num = 0.0
    nvme_bytes: Num = 0.0

    @property
    def total_bytes(self) -> Num:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.reserve_bytes)

    @property
    def host_bytes(self) -> Num:
        return self.host_states_bytes + self.host_activations_bytes


def stage_activation_bytes(shape: StageShape, dense_act_bytes: Num, moe_act_bytes: Num) -> Num:
    """Saved activations of one micro-batch through the stage's layers (what activation
    offload moves each way per micro-batch)."""
    return shape.num_dense_layers * dense_act_bytes + shape.num_moe_layers * moe_act_bytes


def stage_memory(model: Model, shape: StageShape, *, zero: Num, shard: int, expert_shard: int, tp: int, loss: str,
                 dense_act_bytes: Num, moe_act_bytes: Num, full_recompute: Num, recomputed_layer_bytes: Num,
                 inflight_mb: Num, tokens: Num, rt: MemoryRuntime, offload_optimizer: Num = False,
                 offload_params: Num = False, offload_activations: Num = False, on_nvme: Num = False,
                 oc: OffloadConstants | None = None, pp: int = 1) -> StageMemory:
    """Peak bytes of one GPU of a stage of ``shape`` (module docstring), for one plan or over
    arrays: ``zero`` (ZeRO stage), per-layer activations ``dense_act_bytes`` / ``moe_act_bytes``,
    ``full_recompute`` (bool), ``inflight_mb`` (``inflight``), ``tokens`` per micro-batch and
    CP rank; ``offload_*`` (bools) what leaves the GPU, ``on_nvme`` whether offloaded states
    go to NVMe, ``oc`` the host bytes per parameter (``sim.offload``, needed with offload)."""
    z = np.asarray(zero)
    w, g, o = state_bytes(shape.params, zero, shard, expert_shard)
    off_opt, off_par, off_act = np.asarray(offload_optimizer), np.asarray(offload_params), np.asarray(offload_activations)
    host_states = 0.0
    if np.any(off_opt):
        assert oc is not None
        p = shape.params
        local = p.dense_params / np.where(z >= 1, shard, 1) + p.expert_params / np.where(z >= 1, expert_shard, 1)
        host_states = np.where(off_opt, local * oc.host_bytes_per_param, 0.0)
        o = np.where(off_opt, 0.0, o)
        g = np.where(off_opt & (z >= 2), 0.0, g)  # the gradient shard goes to the host (ZeRO-1 keeps it whole)
        w = np.where(off_par, 0.0, w)  # the weight shard lives on the host
    # FSDP gathers one layer ahead: two unsharded layers live
    w = w + np.where(z >= 3, 2 * 2 * shape.params.total / max(1, shape.num_layers), 0.0)
    if shape.chunks is None:
        layers = stage_activation_bytes(shape, dense_act_bytes, moe_act_bytes) * inflight_mb
    else:  # a pipeline layout: the in-flight chunk passes weighted by their chunks' layers
        layers = 0.0
        for n, (d, e) in zip(chunk_inflight(inflight_mb, len(shape.chunks), pp), shape.chunks):
            layers = layers + n * (d * dense_act_bytes + e * moe_act_bytes)
    host_act = 0.0
    if np.any(off_act):  # two layers' activations of one micro-batch stay (computed, in transfer)
        one = np.maximum(dense_act_bytes if shape.num_dense_layers else 0.0,
                         moe_act_bytes if shape.num_moe_layers else 0.0)
        host_act = np.where(off_act, layers, 0.0)
        layers = np.where(off_act, min(2, shape.num_layers) * one, layers)
    act = layers
    if shape.num_layers:  # the layer being recomputed holds its full activations once
        act = act + np.where(full_recompute, recomputed_layer_bytes, 0.0)
    if shape.first and model_has_dropout(model):
        act = act + tokens * model.hidden_size * inflight_mb  # embedding dropout mask
    if shape.last:  # loss peak, one micro-batch at a time (runtime.yaml loss, by implementation)
        act = act + tokens * model.vocab_size / tp * rt.loss_bytes_per_logit[loss]
    reserve = rt.workspace_bytes + rt.fragmentation_fraction * (w + g + o + act)
    nvme = np.where(on_nvme, host_states, 0.0) if np.any(on_nvme) else 0.0
    host_states = np.where(on_nvme, 0.0, host_states) if np.any(on_nvme) else host_states
    return StageMemory(weights_bytes=w, gradients_bytes=g, optimizer_bytes=o, activations_bytes=act,
                       reserve_bytes=reserve, host_states_bytes=host_states, host_activations_bytes=host_act,
                       nvme_bytes=nvme)


def plan_memory(plan: "Plan") -> MemoryBreakdown:
    """``memory_breakdown`` with everything a ``Plan`` says (attention kernel, selective policy);
    both engines report memory through this one call."""
    return memory_breakdown(plan.model, plan.cluster, plan.strategy, attention=plan.attention,
                            selective_policy=plan.selective_policy, loss=plan.loss)


def memory_breakdown(model: Model, cluster: Cluster, strategy: Strategy, *,
                     attention: str = "flash", runtime: MemoryRuntime | None = None,
                     selective_policy: str = "attention", loss: str = "upcast") -> MemoryBreakdown:
    """Memory of the most loaded GPU (the pipeline stage with the largest total)."""
    rt = runtime or default_runtime()
    s = strategy
    kw = {"attention": attention, "selective_policy": selective_policy}
    dense_act = activation_bytes_per_layer(model, s, moe=False, **kw)
    moe_act = activation_bytes_per_layer(model, s, moe=True, **kw) if model.moe is not None else 0.0
    recomputed = (activation_bytes_per_layer(model, s.with_(recompute="none"), attention=attention,
                                             moe=model.moe is not None) if s.recompute == "full" else 0.0)
    best: MemoryBreakdown | None = None
    host = host_spec(cluster)
    per_node = min(cluster.gpus_per_node, cluster.num_gpus)
    oc = offload_constants() if s.offload != "none" else None
    host_states = host_acts = nvme = 0.0
    for shape in stage_shapes(model, s):
        mem = stage_memory(model, shape, zero=s.zero, shard=s.zero_shard, expert_shard=s.expert_dp, tp=s.tp, loss=loss,
                           dense_act_bytes=dense_act,
                           moe_act_bytes=moe_act, full_recompute=s.recompute == "full",
                           recomputed_layer_bytes=recomputed, inflight_mb=inflight_microbatches(s, shape.index),
                           tokens=s.mbs * s.seq_len // s.cp, rt=rt, offload_optimizer=s.offload_optimizer,
                           offload_params=s.offload_params, offload_activations=s.offload_activations,
                           on_nvme=s.offload_device == "nvme", oc=oc, pp=s.pp)
        # the node holds its GPUs' offloaded bytes: the most loaded stage's, per_node times
        if float(mem.host_bytes) + float(mem.nvme_bytes) > host_states + host_acts + nvme:
            host_states, host_acts, nvme = (float(mem.host_states_bytes), float(mem.host_activations_bytes),
                                            float(mem.nvme_bytes))
        cand = MemoryBreakdown(weights_bytes=float(mem.weights_bytes), gradients_bytes=float(mem.gradients_bytes),
                               optimizer_bytes=float(mem.optimizer_bytes),
                               activations_bytes=float(mem.activations_bytes),
                               reserve_bytes=float(mem.reserve_bytes), stage=shape.index,
                               capacity_bytes=cluster.gpu.hbm_bytes)
        if best is None or cand.total_bytes > best.total_bytes:
            best = cand
    assert best is not None
    return replace(best, host_states_bytes=host_states * per_node, host_activations_bytes=host_acts * per_node,
                   nvme_bytes=nvme * per_node, host_capacity_bytes=host.host_dram_bytes,
                   nvme_capacity_bytes=host.nvme_bytes)
