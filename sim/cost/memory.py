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
Offloading (``Strategy.offload``, ``sim.cost.offload``, docs/offload.md) moves bytes to the host:
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

from sim.layers.activations import BYTES_ACT, activation_bytes_per_layer, eager_attention_block_bytes, model_has_dropout
from sim.cost.offload import OffloadConstants, host_spec, offload_constants
from sim.net.netefficiency import nvls_gain
from sim.data.runtime import MemoryRuntime, StateLayout, default_runtime, device_extra_bytes, nvls_buffers, state_layout
from sim.data.hardware import Cluster
from sim.data.specs import Model, Strategy
from sim.layers.stages import StageParams, StageShape, stage_index_shapes
from sim.cost.step import Num, local_params

BYTES_FP32 = 4

if TYPE_CHECKING:
    from sim.cost.plan import Plan

__all__ = ["BYTES_ACT", "activation_bytes_per_layer", "eager_attention_block_bytes", "model_has_dropout",
           "MemoryBreakdown", "StageMemory", "stage_memory", "plan_memory", "fp8_weight_cache_of", "memory_breakdown", "inflight", "inflight_microbatches"]


def gpus_sharing_a_host(cluster: Cluster) -> int:
    """GPUs whose offloaded bytes one node's host holds."""
    return min(cluster.gpus_per_node, cluster.num_gpus)


def within_host(host_bytes: Num, nvme_bytes: Num, host_capacity_bytes: float, nvme_capacity_bytes: float) -> Num:
    """Whether a node's offloaded bytes fit its host DRAM and NVMe (bools or a bool array):
    ``MemoryBreakdown.fits_host`` and the search's host check."""
    return (np.asarray(host_bytes) <= host_capacity_bytes) & (np.asarray(nvme_bytes) <= nvme_capacity_bytes)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """Bytes on one GPU of the stage that peaks (``stage``), at its peak: the categories sum to
    the allocated peak (``allocated_bytes``, as ``torch.cuda.max_memory_allocated``);
    ``reserved_bytes`` adds the caching allocator's slack and workspaces
    (``torch.cuda.max_memory_reserved``), ``device_bytes`` the CUDA context and communication
    buffers (``nvidia-smi``); ``reserve_bytes`` is device minus allocated, so the categories and
    it sum to the device level that feasibility uses.  ``by_stage``: the three levels of every
    pipeline stage."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    reserve_bytes: float
    stage: int
    capacity_bytes: float
    temporaries_bytes: float = 0.0
    reserved_bytes: float = 0.0
    # Offloaded (per node: the most loaded stage's GPU times the node's GPUs); see the module docstring.
    host_states_bytes: float = 0.0  # model states in host DRAM
    host_activations_bytes: float = 0.0
    nvme_bytes: float = 0.0  # model states on NVMe (offload_device=nvme)
    host_capacity_bytes: float = float("inf")
    nvme_capacity_bytes: float = float("inf")
    by_stage: tuple[dict[str, float], ...] = ()

    @property
    def allocated_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.temporaries_bytes)

    @property
    def device_bytes(self) -> float:
        return self.allocated_bytes + self.reserve_bytes

    @property
    def total_bytes(self) -> float:
        """The device level (what must fit in the GPU's memory)."""
        return self.device_bytes

    @property
    def host_bytes(self) -> float:
        """Offloaded bytes in one node's host DRAM."""
        return self.host_states_bytes + self.host_activations_bytes

    @property
    def fits_gpu(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def fits_host(self) -> bool:
        return bool(within_host(self.host_bytes, self.nvme_bytes, self.host_capacity_bytes, self.nvme_capacity_bytes))

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host

    def as_dict(self) -> dict[str, object]:
        return {
            "weights_bytes": self.weights_bytes,
            "gradients_bytes": self.gradients_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activations_bytes": self.activations_bytes,
            "temporaries_bytes": self.temporaries_bytes,
            "reserve_bytes": self.reserve_bytes,
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "device_bytes": self.device_bytes,
            "total_bytes": self.total_bytes,
            "capacity_bytes": self.capacity_bytes,
            "stage": self.stage,
            "host_bytes": self.host_bytes,
            "host_states_bytes": self.host_states_bytes,
            "host_activations_bytes": self.host_activations_bytes,
            "host_capacity_bytes": self.host_capacity_bytes,
            "nvme_bytes": self.nvme_bytes,
            "nvme_capacity_bytes": self.nvme_capacity_bytes,
            "by_stage": [dict(x) for x in self.by_stage],
        }


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


def recompute_split(strategy: Strategy, num_layers: int) -> tuple[float, float, float]:
    """How a stage of ``num_layers`` layers keeps its activations under ``strategy``'s
    recomputation: (fraction of layers that keep only their checkpointed input, fraction that
    keep everything, layers whose full activations are rebuilt at once in backward).

    ``recompute=full`` alone recomputes every layer (Megatron ``uniform`` with groups of 1);
    ``block`` with N (Megatron ``--recompute-method block``) recomputes the first N layers of
    each model chunk and keeps everything of the rest; ``uniform`` with N checkpoints the input
    of each group of N layers and rebuilds a whole group at once (megatron/core/transformer/
    transformer_block.py ``_checkpointed_forward``)."""
    s = strategy
    return split_of(s.recompute, s.recompute_num_layers, s.recompute_method, s.vp, num_layers)


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



def split_of(recompute: str, num_layers_key: int | None, method: str, vp: int, num_layers: int
             ) -> tuple[float, float, float]:
    """``recompute_split`` from the strategy's fields (the search calls it per grid entry)."""
    n = max(1, num_layers)
    if recompute != "full":
        return 1.0, 0.0, 0.0
    if num_layers_key is None:
        return 1.0, 0.0, 1.0
    per_chunk = max(1, -(-n // vp))
    k = min(num_layers_key, per_chunk)
    if method == "block":
        rc = min(n, k * vp)
        return rc / n, (n - rc) / n, 1.0
    groups = -(-per_chunk // k) * vp
    return min(1.0, groups / n), 0.0, float(k)


def recompute_time_fraction(recompute: str, num_layers_key: int | None, method: str, vp: int,
                            num_layers: int) -> float:
    """Share of a stage's layers whose forward is recomputed in backward: the ``block``
    method's first N layers of each chunk, else all of them (``uniform`` groups are each
    recomputed once)."""
    if recompute != "full" or num_layers_key is None or method != "block":
        return 1.0
    return split_of(recompute, num_layers_key, method, vp, num_layers)[0]


def state_bytes(params: StageParams, zero: Num, shard: int, expert_shard: int,
                layout: StateLayout | None = None, bf16_optimizer: bool = False) -> tuple[Num, Num, Num]:
    """(weights, gradients, optimizer) bytes of a stage's model states at rest under a ZeRO
    stage or an array of them (``layout``: ``catalogs/runtime.yaml`` ``model_states``; default
    ZeRO's 2 + 2 + 12); dense states shard over ``shard`` = dp * cp ranks, expert states over
    ``expert_shard`` (the expert data parallelism, ``Strategy.expert_dp``).  ``bf16_optimizer``
    (a bf16 plan of a DeepSpeed profile): where the ZeRO stage is 0, DeepSpeed's BF16_Optimizer
    keeps an unsharded fp32 gradient buffer (4 B/param) next to the bf16 gradients and shards
    the fp32 master weights and Adam states over the data-parallel group
    (``sim.cost.step.stage_pieces``; deepspeed/runtime/bf16_optimizer.py ``fp32_groups_gradients_flat``,
    ``fp32_groups_flat_partition``)."""
    z = np.asarray(zero)
    lay = layout or state_layout("deepspeed")
    bf16opt = np.asarray(bf16_optimizer) & (z == 0)

    def split(p: float, n: int) -> tuple[Num, Num, Num]:
        return (np.where(z >= 3, lay.weights_bytes_per_param * p / n, lay.weights_bytes_per_param * p),
                np.where(z >= 2, lay.gradient_bytes_per_param * p / n,
                         lay.gradient_bytes_per_param * p + np.where(bf16opt, 4 * p, 0.0)),
                np.where((z >= 1) | bf16opt, lay.optimizer_bytes_per_param * p / n, lay.optimizer_bytes_per_param * p))

    a = split(params.dense_params, shard)
    b = split(params.expert_params, expert_shard)
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def model_state_bytes(params: StageParams, strategy: Strategy, layout: StateLayout | None = None
                      ) -> tuple[float, float, float]:
    """``state_bytes`` of one strategy, as floats."""
    w, g, o = state_bytes(params, strategy.zero, strategy.zero_shard, strategy.expert_dp, layout)
    return float(w), float(g), float(o)


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Bytes on one GPU of a stage at its peak (floats or arrays, as the inputs of
    ``stage_memory``); ``total_bytes`` is the device level."""

    weights_bytes: Num
    gradients_bytes: Num
    optimizer_bytes: Num
    activations_bytes: Num
    reserve_bytes: Num  # device level minus allocated
    temporaries_bytes: Num = 0.0
    reserved_bytes: Num = 0.0
    host_states_bytes: Num = 0.0  # per GPU, offloaded model states in host DRAM
    host_activations_bytes: Num = 0.0
    nvme_bytes: Num = 0.0

    @property
    def allocated_bytes(self) -> Num:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.temporaries_bytes)

    @property
    def total_bytes(self) -> Num:
        return self.allocated_bytes + self.reserve_bytes

    @property
    def host_bytes(self) -> Num:
        return self.host_states_bytes + self.host_activations_bytes


def stage_activation_bytes(shape: StageShape, dense_act_bytes: Num, moe_act_bytes: Num) -> Num:
    """Saved activations of one micro-batch through the stage's layers (what activation
    offload moves each way per micro-batch)."""
    return shape.num_dense_layers * dense_act_bytes + shape.num_moe_layers * moe_act_bytes


def offloaded_activation_bytes(shape: StageShape, dense_act_bytes: Num, moe_act_bytes: Num,
                               offload_layers: Num | None = None) -> Num:
    """Saved activations of one micro-batch that activation offload moves each way: the
    stage's, or with ``offload_layers`` (``Strategy.offload_num_layers``, Megatron-Core's
    ``--cpu-offloading-num-layers``; ``inf`` stands for every layer in arrays) that share of its
    layers, the share ``stage_memory`` moves to the host."""
    moved = stage_activation_bytes(shape, dense_act_bytes, moe_act_bytes)
    if offload_layers is None or not shape.num_layers:
        return moved
    return moved * np.minimum(offload_layers, shape.num_layers) / shape.num_layers


def layer_backward_bytes(model: Model, strategy: Strategy, *, moe: bool, moe_imbalance: float = 1.0) -> float:
    """Temporaries of one layer's backward on one GPU (bytes): the gradients of the widest
    intermediate (the MLP's up-projection outputs, two of them live with SwiGLU), and for an
    MoE layer the all-to-all buffers of the routed rows in both directions."""
    tp, h = strategy.tp, model.hidden_size
    tok = strategy.mbs * strategy.seq_len // strategy.cp
    if moe and model.moe is not None:
        spec = model.moe
        rows = tok * spec.top_k * moe_imbalance
        f = spec.expert_ffn_hidden_size / strategy.expert_tp
        return BYTES_ACT * rows * (2 * f + 2 * h)
    return BYTES_ACT * tok * 2 * model.ffn_hidden_size / tp


def head_activation_bytes(model: Model, strategy: Strategy, *, eager: bool = False) -> float:
    """Saved activations of the final norm and the output layer for one micro-batch: the
    output GEMM's input (all-gathered over the sequence with SP), and an eager RMSNorm's fp32
    upcast and bf16 normalised output (``sim.layers.activations``); a fused norm keeps its input."""
    s, h = strategy, model.hidden_size
    tok = s.mbs * s.seq_len // s.cp
    shard = tok / s.tp if s.sp else tok
    norm = (6 * h if model.ffn_type == "swiglu" else 0.0) if eager else BYTES_ACT * h
    return BYTES_ACT * h * tok + norm * shard


def stage_memory(model: Model, shape: StageShape, *, zero: Num, shard: int, expert_shard: int, tp: int, loss: str,
                 dense_act_bytes: Num, moe_act_bytes: Num, full_recompute: Num, recomputed_layer_bytes: Num,
                 inflight_mb: Num, tokens: Num, rt: MemoryRuntime, offload_optimizer: Num = False,
                 offload_params: Num = False, offload_activations: Num = False, on_nvme: Num = False,
                 oc: OffloadConstants | None = None, layout: StateLayout | None = None, microbatches: Num = 1.0,
                 pp: int = 1, dense_full_bytes: Num = 0.0, moe_full_bytes: Num = 0.0,
                 recompute_inputs: Num = 1.0, recompute_full: Num = 0.0, recompute_transient: Num = 1.0,
                 offload_layers: Num | None = None, backward_bytes: Num = 0.0, head_act_bytes: Num = 0.0,
                 device_extra_bytes: Num = 0.0, eager: bool = False, norm_tokens: Num = 0.0,
                 selective_op: Num = False, fp8_cached_weights: Num = False,
                 bf16_optimizer: bool = False, allocator: str = "caching", fp8_params: Num = False,
                 experts_own_unit: bool = True, attention_block_bytes: Num = 0.0) -> StageMemory:
    """Peak bytes of one GPU of a stage of ``shape`` for one plan or over arrays (module
    docstring): the larger of two moments, the start of the stage's first backward with
    ``inflight_mb`` micro-batches' activations held (the loss of the last stage, or a layer's
    backward, in flight) and the optimizer step.

    ``zero`` (ZeRO stage), per-layer activations ``dense_act_bytes`` / ``moe_act_bytes`` as the
    recomputation keeps them and ``dense_full_bytes`` / ``moe_full_bytes`` without it;
    ``recompute_inputs`` / ``recompute_full`` / ``recompute_transient`` from
    ``recompute_split``; ``recomputed_layer_bytes`` what the largest layer rebuilds in its backward
    (``layer_activations``);
    ``microbatches`` per step (gradients accumulated from earlier micro-batches exist at the
    peak when there are more than are in flight); ``layout`` the framework's model states
    (``sim.data.runtime.StateLayout``); ``offload_*`` (bools) what leaves the GPU, ``offload_layers``
    how many of the stage's layers offload their activations (None: all), ``on_nvme`` whether
    offloaded states go to NVMe, ``oc`` the host bytes per parameter; ``backward_bytes`` one
    layer's backward temporaries (``layer_backward_bytes``); ``head_act_bytes`` what the final
    norm and the output layer save per micro-batch (``head_activation_bytes``); ``device_extra_bytes`` the CUDA
    context and communication buffers (``sim.data.runtime.device_extra_bytes``); ``fp8_cached_weights``
    whether fp8 copies of the layers' linear weights (and their transposes) are cached for the
    step (``fp8_weight_cache_of``), counted with the weights; ``bf16_optimizer`` DeepSpeed's
    BF16_Optimizer (``state_bytes``); ``allocator`` the caching allocator's mode
    (``sim.data.runtime.ALLOCATORS``), which with the recomputation mode sets its slack
    (``MemoryRuntime.fragmentation_of``); ``fp8_params`` the layers' linear weights kept in fp8
    as the parameters (``Strategy.fp8_params``); ``experts_own_unit`` whether FSDP2 wraps an
    expert-parallel block's routed experts as a unit of their own (``Plan.fsdp_experts_unit``);
    ``attention_block_bytes`` what a layer's norms and attention save (eager accounting,
    ``sim.layers.activations.eager_attention_block_bytes``)."""
    lay = layout or state_layout("deepspeed")
    z = np.asarray(zero)
    p = shape.params
    w, g, o = state_bytes(p, zero, shard, expert_shard, lay, bf16_optimizer)
    if lay.fsdp2:  # FSDP2 shards the parameters at rest for ZeRO-2 too (no reshard after forward)
        w = np.where(z == 2, state_bytes(p, 3, shard, expert_shard, lay)[0], w)
    off_opt, off_par, off_act = np.asarray(offload_optimizer), np.asarray(offload_params), np.asarray(offload_activations)
    host_states = 0.0
    if np.any(off_opt):
        assert oc is not None
        local = local_params(p, z, shard, expert_shard)
        host_states = np.where(off_opt, local * oc.host_bytes_per_param, 0.0)
        o = np.where(off_opt, 0.0, o)
        g = np.where(off_opt & (z >= 2), 0.0, g)  # the gradient shard goes to the host (ZeRO-1 keeps it whole)
        w = np.where(off_par, 0.0, w)  # the weight shard lives on the host
    n_layers = max(1, shape.num_layers)
    gb = lay.gathered_bytes_per_param
    fsdp2 = lay.fsdp2
    head = (model.embedding_params / tp + model.hidden_size) if shape.last else 0.0
    embedding = p.embedding_params
    if shape.first and shape.last and model.tied_embeddings and pp == 1:
        embedding -= model.embedding_params / tp  # one tied matrix, the head's (sim.layers.stages.stage_params)
    layer_params = max(0.0, p.total - head - embedding) / n_layers if shape.num_layers else 0.0
    # the largest FFN weight matrix of a layer (its experts' on an MoE layer), on this GPU
    ffn_matrix_params = max(model.dense_ffn_params / tp if shape.num_dense_layers else 0.0,
                            p.expert_params / shape.num_moe_layers if shape.num_moe_layers else 0.0
                            ) / model.num_ffn_matrices
    # Transformer Engine's fp8 weight cache: the layers' linear weights (not norms, embedding or
    # the output layer, which Megatron-Core keeps in 16 bits), gathered if ZeRO-3 gathers them
    linear = max(0.0, layer_params - model.norm_params_per_layer) * shape.num_layers
    cache = np.where(np.asarray(fp8_cached_weights), rt.fp8_weight_cache_bytes_per_param * linear, 0.0)
    # fp8 parameters (Megatron-Core --fp8-param-gather: "Keep the compute param in fp8 (do not use
    # any other intermediate dtype)", Megatron-LM 033d8b0 arguments.py; TE fp8_model_init): the
    # linear weights are stored in fp8 (runtime.yaml fp8_param_bytes_per_param) instead of the
    # layout's 16 bits (sharded under ZeRO-3 / Megatron FSDP), and the cache's fp8 copy is the
    # parameter itself (its transpose stays)
    fp8_p = np.asarray(fp8_params)
    own = (lay.weights_bytes_per_param - rt.fp8_param_bytes_per_param) * linear / np.where(z >= 3, shard, 1)
    w = w + cache - np.where(fp8_p, own + np.where(np.asarray(fp8_cached_weights), rt.fp8_param_bytes_per_param
                                                   * linear, 0.0), 0.0)
    accumulated = np.asarray(microbatches) > np.asarray(inflight_mb)  # earlier micro-batches' gradients exist

    # ---- the start of the first backward: weights, gradients, activations, temporaries
    if fsdp2:
        # FSDP2 (torchtitan apply_fsdp): with pipelining nothing is resharded until the last
        # backward (unsharded bf16 weights + unsharded gradient accumulators in the reduce dtype,
        # fp32: torch/distributed/fsdp/_fully_shard/_fsdp_param.py to_accumulated_grad_if_needed);
        # ZeRO-2 class = reshard_after_forward=False keeps every gathered weight; otherwise the
        # last block and the output layer stay gathered; ZeRO 0-1: torch.autocast's casts
        # (counted with the activations, below).
        gathered = np.where(z >= 3, np.where(pp > 1, gb * p.total, gb * (layer_params + head)),
                            np.where(z == 2, gb * p.total, 0.0))
        unsharded_grads = np.where((z >= 3) & (pp > 1), lay.reduce_bytes_per_param * p.total, 0.0)
        g_act = np.where(accumulated, np.where((z >= 3) & (pp > 1), unsharded_grads, g), 0.0)
    else:
        # FSDP gathers one layer ahead; fp8 parameters are gathered in fp8
        layer_linear = linear / max(1, shape.num_layers)
        gathered = np.where(z >= 3, 2 * (gb * layer_params - np.where(fp8_p, (gb - rt.fp8_param_bytes_per_param)
                                                                        * layer_linear, 0.0)), 0.0)
        g_act = g if lay.persistent_gradients else np.where(accumulated, g, 0.0)
    w_act = w + gathered

    per_mb_keep = (recompute_inputs * stage_activation_bytes(shape, dense_act_bytes, moe_act_bytes)
                   + recompute_full * stage_activation_bytes(shape, dense_full_bytes, moe_full_bytes))
    if shape.chunks is None:
        layers = per_mb_keep * inflight_mb
    else:  # a pipeline layout: the in-flight chunk passes weighted by their chunks' layers
        layers = 0.0
        for n, (d, e) in zip(chunk_inflight(inflight_mb, len(shape.chunks), pp), shape.chunks):
            layers = layers + n * (recompute_inputs * (d * dense_act_bytes + e * moe_act_bytes)
                                   + recompute_full * (d * dense_full_bytes + e * moe_full_bytes))
    host_act = 0.0
    if np.any(off_act):  # offloaded layers leave; two layers of one micro-batch stay (computed, in transfer)
        n_off = n_layers if offload_layers is None else np.minimum(offload_layers, n_layers)
        one = np.maximum(dense_act_bytes if shape.num_dense_layers else 0.0,
                         moe_act_bytes if shape.num_moe_layers else 0.0)
        frac = n_off / n_layers
        host_act = np.where(off_act, layers * frac, 0.0)
        layers = np.where(off_act, layers * (1 - frac) + np.minimum(2, n_off) * one, layers)
    act = layers
    # A layer's backward rebuilds what its recomputation dropped (``layer_activations``): under
    # full recomputation the whole layer (``recompute_transient`` layers at once with uniform
    # groups), counted with the activations; under selective recomputation what the save list
    # does not keep (op-level: the element-wise and routing ops, the unsaved matmuls), counted with
    # the temporaries, as PyTorch's MemTracker splits them (planner validate memory: a Mixtral
    # block under torchtitan's op-level policy, FSDP2, ep 2).
    rebuilt = recomputed_layer_bytes if shape.num_layers else 0.0
    transient = np.where(full_recompute, recompute_transient * rebuilt, 0.0)
    rebuilt_temps = np.where(full_recompute, 0.0, rebuilt)
    # eager wq, wk, wv each cast the (gathered) input they share under torch.autocast: two 16-bit
    # copies more than the one a layer's accounting counts (torch_amp moments below)
    attention_casts = BYTES_ACT * model.hidden_size * tokens * 2 if eager and not model.is_mla else 0.0
    if lay.name == "torch_amp":  # torch.autocast caches a 16-bit copy of every linear weight per forward, saved for backward;
        # the residual stream stays fp32 (the embedding is not autocast), so each eager norm keeps
        # its scaled output in fp32 (2 more bytes per element)
        linear = p.total - embedding - shape.num_layers * model.norm_params_per_layer \
            - (model.hidden_size if shape.last else 0.0)
        norms = 2 * shape.num_layers + (1 if shape.last else 0)
        fp32_norms = BYTES_ACT * model.hidden_size * norm_tokens * norms if eager else 0.0
        # and each linear casts its fp32 input itself (autocast's cache keeps only the casts of
        # leaf tensors, the weights): eager code's separate wq, wk, wv and w1, w3 save 3 and 2
        # 16-bit copies of the (gathered) input they share, where a layer counts one of each
        # (planner validate memory: 3 x 64 MiB per Llama 3 8B layer at 8192 tokens, at any tp)
        mlp_copies = (model.ffn_type == "swiglu") * shape.num_dense_layers if eager and not model.is_mla else 0
        input_casts = attention_casts * shape.num_layers + BYTES_ACT * model.hidden_size * tokens * mlp_copies
        # checkpointed layers keep only their inputs (not the casts); the output layer is never checkpointed
        head_linear = model.embedding_params / tp if shape.last else 0.0
        kept = np.where(full_recompute, recompute_full, np.where(selective_op, 0.0, 1.0))
        act = act + np.where(z < 2, (gb * ((linear - head_linear) * kept + head_linear)
                                     + (fp32_norms + input_casts) * kept) * inflight_mb, 0.0)
    if shape.first and model_has_dropout(model) and not fsdp2:
        act = act + tokens * model.hidden_size * inflight_mb  # embedding dropout mask
    # a layer's backward: the layer being recomputed holds its full activations once, with the
    # layer's backward temporaries (FSDP2 without pipelining: its reduce-scatter, below)
    layer_temps = backward_bytes + rebuilt_temps + 0.0 * z
    layer_act = act + transient
    w_layer, g_layer = w_act, g_act
    if fsdp2:
        # FSDP2 without pipelining, at a block's post-backward (the reduce-scatter): the block's
        # activations are freed and its unsharded weights resharded, its bf16 unsharded gradients
        # (2 B) and the reduce-scatter input in the reduce dtype (fp32, 4 B) live (measured:
        # planner validate memory); the block's backward temporaries are gone by then.  A tied
        # output layer shares the embedding's unit: gathered for the output layer's backward, it
        # stays unsharded, with the 16-bit gradient the output layer gave it, until the
        # embedding's own backward at the end (measured).
        rs = (z >= 3) & (pp == 1)
        one_layer = per_mb_keep / n_layers
        tied = 2 * gb * model.embedding_params / tp if model.tied_embeddings else 0.0
        rs_temps = lay.reduce_bytes_per_param * layer_params + tied
        layer_act = np.where(rs, np.maximum(0.0, act - one_layer), layer_act)
        layer_temps = np.where(rs, rs_temps + 0.0 * z, layer_temps)
        g_layer = g_act + np.where(rs, gb * layer_params, 0.0)
        w_layer = np.where(rs, w, w_act)
        # The other moments of the backward.  FSDP2 keeps a unit's reduce-scatter input until the
        # next unit's post-backward (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
        # post_backward: ``comm_ctx.reduce_scatter_states``, reclaimed down to
        # ``reduce_scatter_max_input_buffers`` = 1 before the next reduce), so through a block's
        # backward the input of the unit reduced before it is live: the block above it, or for the
        # top block the final norm and output layer.  And a block's all-gather output is freed
        # only after its copy-out into the unsharded parameters (``wait_for_unshard``: "we free the
        # all-gather result immediately after the current copy-out"), so at the copy-out both are
        # live.  Measured (planner validate memory): a Mixtral block's copy-out, with the block
        # above's fp32 reduce-scatter input still held, is its plan's peak.  Evaluated at both ends
        # of the backward: at the top (all activations; only the units above reduced) and at the
        # bottom block (in the step's first micro-batch the sharded gradients of every unit
        # reduced so far have appeared one by one while the other blocks' activations went, so
        # that end is the higher one where a block's sharded gradients outweigh its saved
        # activations: full recomputation; experts that FSDP does not shard, ep = dp).
        # The held inputs and copy-outs are counted where a block is one unit: dense blocks, MoE
        # blocks without expert parallelism, and expert-parallel ones whose framework wraps the
        # experts with the block (torchtitan since 18a46d4, 2026-03-26: a per-parameter mesh);
        # where the experts are a unit of their own (Automodel; torchtitan before) the block's
        # moments are those above.
        if np.any(rs):  # (the search evaluates many plans that have no such moment)
            one_unit = shape.num_moe_layers == 0 or expert_shard == shard or not experts_own_unit
            red = lay.reduce_bytes_per_param if one_unit else 0.0
            gl = gb * layer_params
            above_top = red * head  # the final norm and output layer's reduce-scatter input (last stage)
            above = red * layer_params if n_layers > 1 else above_top
            def reduced(params: float) -> float:  # the share of the stage's parameters reduced so far
                return min(1.0, params / p.total) if p.total else 0.0

            g_top = np.where(accumulated, g_act, g * reduced(head))
            g_second = np.where(accumulated, g_act, g * reduced(head + layer_params))
            done = max(0.0, 1.0 - (layer_params + embedding) / p.total) if p.total else 0.0
            g_done = np.where(accumulated, g_act, g * done)
            # the 16-bit gradient of the FFN weight whose backward is running, unsharded until the
            # block's post-backward reduce-scatter (FSDP2 computes gradients into the unsharded
            # parameters, _fsdp_param_group.py post_backward; measured: a Mixtral block's local
            # experts' w1 gradient, 448 MiB at ep 2, live in its expert backward)
            wgrad = gb * ffn_matrix_params
            rest = np.maximum(0.0, act - layers)
            # The bottom block's backward peaks at its FFN's weight gradients (eager SwiGLU, the
            # block's whole activations held: no recomputation, or full recomputation's rebuilt
            # block).  By then the backward has consumed what the ops after the first FFN GEMMs
            # saved: the product that fed w2 and, for MoE, the routed rows the combine weighted;
            # three f-wide gradients are live (of the product and of the w1 and w3 outputs), not
            # the two widest-intermediate gradients and all-to-all buffers of ``backward_bytes``
            # (the mean routed rows per rank; the busiest rank's share is not applied here).  And
            # FSDP2 has already prefetched the next unit in backward order, the embedding
            # (``_fsdp_param_group.py`` pre_backward -> ``_backward_prefetch``): its all-gathered
            # weights are live.  Measured (planner validate memory, a 2-layer Mixtral, ep 8, full
            # recomputation): three 224 MiB expert intermediates saved, three such gradients,
            # the 250 MiB gathered embedding.
            ffn_consumed, ffn_backward, prefetch = 0.0, backward_bytes, 0.0
            if eager and model.ffn_type == "swiglu":
                if shape.num_moe_layers:
                    rows = tokens * model.moe.top_k
                    f_rows = BYTES_ACT * rows * model.moe.expert_ffn_hidden_size
                    consumed = f_rows + BYTES_ACT * rows * model.hidden_size
                else:
                    f_rows = BYTES_ACT * tokens * model.ffn_hidden_size / tp
                    consumed = f_rows
                whole = ~np.asarray(selective_op, dtype=bool)
                ffn_consumed = np.where(whole, consumed, 0.0)
                ffn_backward = np.where(whole, 3 * f_rows, backward_bytes)
            if shape.first and not model.tied_embeddings:
                prefetch = gb * embedding
            below_top = np.maximum(0.0, act - one_layer)
            # (weights, gradients, activations, temporaries) of each moment
            moments = [
                (w_layer, g_layer, layer_act, layer_temps),  # the top block's reduce-scatter (above)
                (w + gl, g_done, rest + one_layer + transient - ffn_consumed,
                 ffn_backward + wgrad + rebuilt_temps + tied + prefetch + above),  # the bottom block's backward
                (w, g_done + gl, rest, rs_temps),  # the bottom block's reduce-scatter
            ]
            if one_unit:
                moments += [(w + gl, g_top, act + transient, backward_bytes + wgrad + rebuilt_temps + above_top + tied),  # the top block's backward
                            (w + gl, g_top, act, gl + above_top)]  # the top block's copy-out
            if one_unit and n_layers > 1:
                moments += [(w + gl, g_second, below_top, gl + above),  # the second block's copy-out
                            (w + gl, g_done, rest + one_layer, gl + above)]  # the bottom block's copy-out
            totals = [sum(m) for m in moments]
            best = totals[0]
            cats = list(moments[0])
            for m, t in zip(moments[1:], totals[1:]):
                take = rs & (t > best)
                best = np.where(take, t, best)
                cats = [np.where(take, new_c + 0.0 * z, old_c) for new_c, old_c in zip(m, cats)]
            w_layer, g_layer, layer_act, layer_temps = cats
    if lay.name == "torch_amp" and shape.num_layers and eager and np.any(z < 2):
        # Unsharded fp32 parameters under torch.autocast (ZeRO 0-1): autograd makes each weight's
        # gradient in 16 bits, autocast's cast backward turns it into a new fp32 tensor, and only
        # then does AccumulateGrad file it as ``.grad``; the optimizer states exist from the first
        # step on.  So the bottom layer's FFN backward, once its other FFN weights' gradients are
        # filed, holds the last one twice (2 + 4 bytes per parameter) with every gradient of the
        # stage except that one, the bottom layer's attention and the embedding (each micro-batch
        # after the first adds into existing ones); what its attention block saved is still held,
        # with the other in-flight micro-batches' activations.  Measured (planner validate
        # memory: a 2-layer Mixtral without FSDP): the peak, the third expert weight's fp32
        # gradient in flight, 1 GiB above the optimizer step the other moments reach.
        attention_params = max(0.0, layer_params - ffn_matrix_params * model.num_ffn_matrices)
        later = (ffn_matrix_params + attention_params + embedding) / p.total if p.total else 0.0
        g_bottom = np.where(accumulated, g, g * max(0.0, 1.0 - later))
        attention_block = attention_block_bytes + gb * attention_params + attention_casts
        others = np.maximum(0.0, inflight_mb - 1) / np.maximum(1.0, inflight_mb) * act
        bottom = (w, g_bottom, others + attention_block, (BYTES_ACT + lay.gradient_bytes_per_param) * ffn_matrix_params + 0.0 * z)
        take = (z < 2) & (sum(bottom) > w_layer + g_layer + layer_act + layer_temps)
        w_layer, g_layer, layer_act, layer_temps = [np.where(take, new_c + 0.0 * z, old_c)
                                                    for new_c, old_c in zip(bottom, (w_layer, g_layer, layer_act, layer_temps))]
    if shape.last:  # final norm and output-layer input, and the loss peak (runtime.yaml loss)
        act = act + head_act_bytes * inflight_mb
        logits = tokens * model.vocab_size / tp
        saved = rt.loss_saved_bytes_per_logit.get(loss, 0.0)
        loss_act = act + logits * saved
        loss_temps = logits * (rt.loss_bytes_per_logit[loss] - saved) + 0.0 * z
        at_loss = w_act + g_act + loss_act + loss_temps >= w_layer + g_layer + layer_act + layer_temps
        act = np.where(at_loss, loss_act, layer_act)
        temps = np.where(at_loss, loss_temps, layer_temps)
        w_act, g_act = np.where(at_loss, w_act, w_layer), np.where(at_loss, g_act, g_layer)
    else:
        act, temps, w_act, g_act = layer_act, layer_temps, w_layer, g_layer
    peak_act = w_act + g_act + o + act + temps
    # ---- the optimizer step: states at rest (fused optimizers allocate nothing more), and the
    # ZeRO engine's flattened gradient partition and its fp32 copy (runtime.yaml model_states
    # step_*: DeepSpeed stage3.py _prepare_fp32_grad_for_sub_group, per sub-group under ZeRO-3;
    # on the host when the optimizer is offloaded)
    part = local_params(p, z, shard, expert_shard)
    sub_group = np.where(z >= 3, np.minimum(part, lay.step_sub_group_params), part)
    zero_engine = (z >= 1) & ~off_opt.astype(bool)
    step_tmp = np.where(zero_engine, (lay.step_flat_bytes_per_param + lay.step_fp32_grad_bytes_per_param) * sub_group,
                        0.0)
    # The fp32 copy is one request.  Requests of 10 MiB and more get segments of their own size
    # (CUDACachingAllocator get_allocation_size), so the largest block the step's earlier tensors
    # leave cached is about its largest tensor: the loss's logits (fp32 with an upcasting loss) or
    # the MLP's widest activation.  A copy larger than that maps a segment of its own, reserved
    # from then on (replayed: validate.allocator, tests/test_allocator.py).
    fp32_copy = lay.step_fp32_grad_bytes_per_param * sub_group
    largest = BYTES_ACT * tokens * max(model.ffn_hidden_size, model.hidden_size) / tp
    if shape.last:
        logit_bytes = BYTES_FP32 if loss == "upcast" else BYTES_ACT  # an upcasting loss holds fp32 logits
        largest = np.maximum(largest, tokens * model.vocab_size / tp * logit_bytes)
    step_segment = np.where(zero_engine & (fp32_copy > largest), fp32_copy, 0.0)
    peak_opt = w + g + o + step_tmp
    at_opt = peak_opt > peak_act
    zero_ = 0.0 * peak_act
    weights = np.where(at_opt, w + zero_, w_act)
    grads = np.where(at_opt, g + zero_, g_act + zero_)
    optim = o + zero_
    acts = np.where(at_opt, zero_, act)
    temps = np.where(at_opt, step_tmp + zero_, temps + zero_)
    allocated = np.maximum(peak_opt, peak_act)
    # The caching allocator keeps a free list per CUDA stream (a freed block is reused only by
    # allocations on the stream it was allocated on: c10/cuda/CUDACachingAllocator.cpp, BlockPool
    # lookups compare block->stream).  FSDP2 allocates the reduce-scatter output, which the
    # sharded gradients are views of, in its reduce-scatter stream and keeps it to the optimizer
    # step (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce: "the GPU
    # sharded gradient is allocated in the RS stream"): those bytes cannot reuse the default
    # stream's cached activation blocks, so the reserved peak is the default stream's peak plus
    # the sharded gradients.
    rs_pool = np.where(fsdp2 & (z >= 2), g + 0.0 * allocated, 0.0)
    in_rs = np.where(pp == 1, np.minimum(grads, rs_pool), 0.0)  # with pipelining the peak's grads are unsharded
    # Likewise the all-gather output, the flat 16-bit buffer each FSDP unit is gathered into before
    # its copy-out into the parameters, is allocated in FSDP2's all-gather copy-in stream
    # (_fsdp_collectives.py foreach_all_gather: all_gather_comm.allocate under
    # all_gather_copy_in_stream): that stream's pool holds two units at once (the one being copied
    # out and the next one prefetched), the largest pair a layer and the embedding or output layer.
    units = max(layer_params, embedding, head)
    ag_pool = np.where(fsdp2 & (z >= 2), gb * (layer_params + units) + 0.0 * allocated, 0.0)
    # The allocator's slack: peak reserved over peak allocated as replaying PyTorch's
    # caching-allocator rules over the step's allocation trace measures it (validate.allocator,
    # validate.fragmentation; catalogs/runtime.yaml memory.fragmentation), by allocator mode
    # and recomputation mode.
    frag = rt.fragmentation_of(allocator, full_recompute, selective_op)
    reserved = ((allocated - in_rs) * (1 + frag) + rs_pool + ag_pool + rt.workspace_bytes
                + np.where(at_opt, 0.0, step_segment))
    device = reserved + device_extra_bytes
    nvme = np.where(on_nvme, host_states, 0.0) if np.any(on_nvme) else 0.0
    host_states = np.where(on_nvme, 0.0, host_states) if np.any(on_nvme) else host_states
    return StageMemory(weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=optim, activations_bytes=acts,
                       temporaries_bytes=temps, reserve_bytes=device - allocated, reserved_bytes=reserved,
                       host_states_bytes=host_states, host_activations_bytes=host_act, nvme_bytes=nvme)


def fp8_weight_cache_of(precision: str, fp8_weight_cache: bool) -> bool:
    """Whether a plan holds fp8 weight copies for the whole step (fp8 training in a framework
    that caches them across micro-batches, ``Plan.fp8_weight_cache``)."""
    return precision == "fp8" and fp8_weight_cache


def plan_memory(plan: "Plan") -> MemoryBreakdown:
    """``memory_breakdown`` with everything a ``Plan`` says (attention kernel, selective policy,
    saved-activation accounting, model-state layout, MoE imbalance); both engines report memory
    through this one call."""
    return memory_breakdown(plan.model, plan.cluster, plan.strategy, attention=plan.attention_kernel,
                            selective_policy=plan.selective_policy, loss=plan.loss_impl, eager=plan.eager_activations,
                            fp8_saved_inputs=plan.fp8_saved_inputs, layout=state_layout(plan.model_states_layout),
                            moe_imbalance=plan.moe_imbalance, bf16_optimizer=plan.deepspeed_bf16_optimizer,
                            fp8_weight_cache=fp8_weight_cache_of(plan.strategy.precision, plan.fp8_weight_cache),
                            allocator=plan.allocator, dispatcher=plan.moe_dispatcher, nvls=plan.nvls,
                            nccl=plan.nccl, experts_own_unit=plan.fsdp_experts_unit == "own")


def layer_activations(model: Model, s: Strategy, *, attention: str = "flash", selective_policy: str = "attention",
                      eager: bool = False, fp8_saved_inputs: bool = False, moe_imbalance: float = 1.0
                      ) -> tuple[float, float, float, float, float]:
    """(dense, MoE) saved bytes per layer as ``s`` recomputes, (dense, MoE) without
    recomputation (with ``recompute=full``; otherwise the saved bytes again), and what the
    largest layer rebuilds in its backward: its full activations under full recomputation, what
    the save list dropped (full less kept) under selective recomputation, nothing without."""
    kw = {"attention": attention, "selective_policy": selective_policy, "eager": eager,
          "fp8_saved_inputs": fp8_saved_inputs, "moe_imbalance": moe_imbalance}
    is_moe = model.moe is not None
    dense = activation_bytes_per_layer(model, s, moe=False, **kw)
    moe = activation_bytes_per_layer(model, s, moe=True, **kw) if is_moe else 0.0
    if s.recompute == "none":
        return dense, moe, dense, moe, 0.0
    plain = s.with_(recompute="none", recompute_num_layers=None, recompute_method="uniform")
    dense_full = activation_bytes_per_layer(model, plain, moe=False, **kw)
    moe_full = activation_bytes_per_layer(model, plain, moe=True, **kw) if is_moe else 0.0
    if s.recompute == "selective":
        return dense, moe, dense, moe, max(dense_full - dense, moe_full - moe)
    return dense, moe, dense_full, moe_full, max(dense_full, moe_full)


def cluster_extra_bytes(strategy: Strategy, model: Model, cluster: Cluster, *, layout: StateLayout,
                        dispatcher: str = "alltoall", nvls: bool = True, nccl: str = "") -> float:
    """``device_extra_bytes`` on ``cluster``: its NVLink SHARP buffers under NCCL release ``nccl``
    ("" = the GPU architecture's; none with ``nvls`` off, ``Plan.nvls``), NVLink domain and whether that domain is NVLink (a node of PCIe cards is
    not), for the search and ``plan_memory`` alike."""
    multicast = nvls and bool(nvls_gain(cluster.gpu.nvlink_generation))
    return device_extra_bytes(strategy, model, megatron_groups=layout.name.startswith("megatron"),
                              nvls=nvls_buffers(cluster.gpu.architecture, multicast=multicast, nccl=nccl),
                              domain_gpus=cluster.nvlink_domain, nvlink=cluster.server is None,
                              dispatcher=dispatcher)


def memory_breakdown(model: Model, cluster: Cluster, strategy: Strategy, *,
                     attention: str = "flash", runtime: MemoryRuntime | None = None,
                     selective_policy: str = "attention", loss: str = "upcast", eager: bool = False,
                     fp8_saved_inputs: bool = False, layout: StateLayout | None = None,
                     moe_imbalance: float = 1.0, fp8_weight_cache: bool = False,
                     bf16_optimizer: bool = False, allocator: str = "caching",
                     dispatcher: str = "alltoall", nvls: bool = True, experts_own_unit: bool = True,
                     nccl: str = "") -> MemoryBreakdown:
    """Memory of the most loaded GPU (the pipeline stage with the largest device-level peak),
    with the three levels of every stage in ``by_stage``; ``fp8_weight_cache``: fp8 weight
    copies held for the step (``fp8_weight_cache_of``); ``bf16_optimizer``: a bf16 plan of a
    DeepSpeed profile (``state_bytes``); ``allocator``: the caching allocator's mode;
    ``dispatcher``: the MoE dispatcher, whose buffers the device level holds; ``nvls``: NCCL's
    NVLink SHARP on (``Plan.nvls``), its buffers those of NCCL release ``nccl`` (``Plan.nccl``);
    ``experts_own_unit``: FSDP2 wraps an expert-parallel
    block's routed experts as a unit of their own (``Plan.fsdp_experts_unit``)."""
    rt = runtime or default_runtime()
    s = strategy
    lay = layout or state_layout("deepspeed")
    dense_act, moe_act, dense_full, moe_full, recomputed = layer_activations(
        model, s, attention=attention, selective_policy=selective_policy, eager=eager,
        fp8_saved_inputs=fp8_saved_inputs, moe_imbalance=moe_imbalance)
    back = max(layer_backward_bytes(model, s, moe=False),
               layer_backward_bytes(model, s, moe=True, moe_imbalance=moe_imbalance) if model.moe is not None else 0.0)
    extra = cluster_extra_bytes(s, model, cluster, layout=lay, dispatcher=dispatcher, nvls=nvls, nccl=nccl)
    head_act = head_activation_bytes(model, s, eager=eager)
    host = host_spec(cluster)
    per_node = gpus_sharing_a_host(cluster)
    oc = offload_constants() if s.offload != "none" else None
    best: MemoryBreakdown | None = None
    host_states = host_acts = nvme = 0.0
    by_stage = []
    for i, shape in stage_index_shapes(model, s):
        fi, ff, tl = recompute_split(s, shape.num_layers)
        mem = stage_memory(model, shape, zero=s.zero, shard=s.zero_shard, expert_shard=s.expert_dp, tp=s.tp, loss=loss,
                           dense_act_bytes=dense_act, moe_act_bytes=moe_act, full_recompute=s.recompute == "full",
                           recomputed_layer_bytes=recomputed, inflight_mb=inflight_microbatches(s, i),
                           tokens=s.mbs * s.seq_len // s.cp, rt=rt, offload_optimizer=s.offload_optimizer,
                           offload_params=s.offload_params, offload_activations=s.offload_activations,
                           on_nvme=s.offload_device == "nvme", oc=oc, layout=lay, microbatches=s.num_microbatches,
                           pp=s.pp, dense_full_bytes=dense_full, moe_full_bytes=moe_full, recompute_inputs=fi,
                           recompute_full=ff, recompute_transient=tl, offload_layers=s.offload_num_layers,
                           backward_bytes=back, head_act_bytes=head_act, device_extra_bytes=extra, eager=eager,
                           norm_tokens=s.mbs * s.seq_len // s.cp / (s.tp if s.sp else 1),
                           selective_op=s.recompute == "selective", fp8_cached_weights=fp8_weight_cache,
                           bf16_optimizer=bf16_optimizer and s.precision == "bf16", allocator=allocator,
                           fp8_params=s.fp8_params, experts_own_unit=experts_own_unit,
                           attention_block_bytes=eager_attention_block_bytes(model, s) if eager else 0.0)
        by_stage.append({"stage": i, "memory_peak_bytes": float(mem.allocated_bytes),
                         "memory_reserved_bytes": float(mem.reserved_bytes),
                         "memory_device_bytes": float(mem.total_bytes)})
        # the node holds its GPUs' offloaded bytes: the most loaded stage's, per_node times
        if float(mem.host_bytes) + float(mem.nvme_bytes) > host_states + host_acts + nvme:
            host_states, host_acts, nvme = (float(mem.host_states_bytes), float(mem.host_activations_bytes),
                                            float(mem.nvme_bytes))
        cand = MemoryBreakdown(weights_bytes=float(mem.weights_bytes), gradients_bytes=float(mem.gradients_bytes),
                               optimizer_bytes=float(mem.optimizer_bytes),
                               activations_bytes=float(mem.activations_bytes),
                               temporaries_bytes=float(mem.temporaries_bytes),
                               reserve_bytes=float(mem.reserve_bytes), reserved_bytes=float(mem.reserved_bytes),
                               stage=i, capacity_bytes=cluster.gpu.hbm_bytes)
        if best is None or cand.total_bytes > best.total_bytes:
            best = cand
    assert best is not None
    return replace(best, host_states_bytes=host_states * per_node, host_activations_bytes=host_acts * per_node,
                   nvme_bytes=nvme * per_node, host_capacity_bytes=host.host_dram_bytes,
                   nvme_capacity_bytes=host.nvme_bytes, by_stage=tuple(by_stage))
