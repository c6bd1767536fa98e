"""The composition of one training step, written once, over arrays of any broadcast shape.

Every caller composes a step here: ``sim.engines.analytic.simulate_analytic`` with one plan (floats),
the planner's search with a grid of plans that share a layout (numpy arrays over micro-batch,
sequence parallelism, recomputation, ZeRO stage and pipeline schedule), and the event engine
takes the per-stage pieces from ``sim.cost.costs.stage_pieces``, the same place these do.

For ``p`` stages, ``m`` micro-batches and ``v`` model chunks per stage, with ``F_i, B_i`` the
critical-path forward and backward time of one micro-batch on stage ``i`` (compute plus
exposed TP/CP/EP/ZeRO-3 communication plus the point-to-point sends):

* 1F1B and GPipe (Narayanan et al. 2021, Sec. 2.2):
  ``T = sum_i (F_i + B_i) + (m - 1) * max_i (F_i + B_i)``, i.e. ``(m + p - 1)(F + B)`` for
  equal stages, a bubble fraction ``(p - 1)/(m + p - 1)``;
* interleaved 1F1B: ``T = sum_i (F_i + B_i)/v + (m - 1/v) max_i (F_i + B_i)``, a bubble of
  ``(p - 1)/v`` stage-times (Narayanan et al. 2021, Sec. 2.2.2), with ``v`` times more sends;
  with a pipeline layout (``sim.data.layout``) the chunks differ and no closed form holds: the
  schedule itself is evaluated chunk by chunk (``sim.cost.interleave``);
* zero-bubble ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 3): the weight
  gradient ``W`` fills the drain, ``T = m max_i(F_i + B_i) + (p - 1) max_i(F_i + B_i - W_i)/v``
  with ``W`` taken as half the GEMM backward.

End of step, per stage: data-parallel gradient reduction runs after the stage's last
backward; with overlap it starts under that backward (bucketed, as DDP/Megatron do, so all
but the last layer's share can hide; under interleaving each model chunk's reduction starts
when that chunk is done, ``overlap_window``) and a stage that finishes early (stage ``i > 0``
ends its last backward ``sum_{j<i} B_j`` before the pipeline) hides the rest in the drain.  The backward
that hides a reduction runs slower by ``overlap_compute_slowdown`` of the hidden time
(arXiv:2507.03114), as does the first forward that hides a ZeRO-1/2 parameter gather.  Then the
memory-bound optimizer step, then (ZeRO-1/2) the parameter all-gather, overlapped with the next
step's first forward when ``dp_overlap``.  The step ends when the last stage is ready.

Offloading (``sim.cost.offload``, docs/offload.md) adds host-link copies: per micro-batch, the
weight shard's load before each forward and backward, the gradient shard back after each
backward (ZeRO-3) and the saved activations out and in, hidden behind the stage's compute as
far as the link allows (on the same prefetch as FSDP's gathers, so the exposure is the
excess of the slower of network and link); per step, the gradient shard back (ZeRO-1/2,
bucket by bucket behind the gradient reduction), the Adam step on the CPU instead of the
GPU, and the updated weights back to the GPU before the next forward (exposed: no delayed
update).

Expert-parallel all-to-all overlap (``Strategy.ep_overlap``; Megatron-Core
``--overlap-moe-expert-parallel-comm``) pairs one micro-batch's forward with another's backward,
so that each hides the other's dispatch and combine (``sim.cost.costs.layer_cost`` prices the
paired pass).  The passes without a partner run alone, their all-to-alls exposed: the first
forward and the last backward without pipelining, and with interleaved pipelining a rank's
warm-up forwards and its cool-down backwards, ``2 (p - r - 1) + (v - 1) p + 1`` chunk passes each
on rank ``r`` (``a2a_unpaired_passes``).  Each stage's last backward ends later by that many
chunk passes' hidden all-to-all (``StageTimes.a2a_hidden_s``, net of the slowdown the overlap
charged).

Stages are given as ``StageTimes`` with the number of stages each stands for (``count``) and
how many stages of each entry precede it (``before``): one entry per stage (``count=1``) for
a costed plan, one per ``sim.layers.stages.StageShape`` for the search.  Known error: ignores the
warm-up ramp of bucket sizes and assumes balanced experts; see docs/accuracy.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Sequence, Union

import numpy as np

from sim.cost.interleave import interleaved_time_s
from sim.cost.offload import offload_bytes
from sim.data.runtime import CommRuntime
from sim.layers.stages import StageParams

if TYPE_CHECKING:
    from sim.layers.compute import KernelEfficiency
    from sim.cost.offload import OffloadRates

Num = Union[float, np.ndarray]  # a float, or an array of the caller's broadcast shape


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One pipeline stage, one micro-batch, one chunk pass summed over its chunks (seconds).

    ``compute_*`` include recomputation and per-parameter passes; ``exposed_*`` the exposed
    TP/CP/EP and ZeRO-3 communication; ``p2p_s`` one activation send.  ``dp_grad_sync_s``
    (full duration, per step), ``dp_param_gather_s`` (ZeRO-1/2, per step) and ``optimizer_s``
    close the step.  ``weight_grad_s`` is the ``W`` of zero-bubble.  ``fwd_sends`` /
    ``bwd_sends`` are 1 when the stage sends activations forward / gradients backward.
    """

    compute_fwd_s: Num
    compute_bwd_s: Num
    exposed_fwd_s: Num
    exposed_bwd_s: Num
    p2p_s: Num
    weight_grad_s: Num
    dp_grad_sync_s: Num
    dp_param_gather_s: Num
    optimizer_s: Num
    num_layers: int
    fwd_sends: int
    bwd_sends: int
    dp_replica_sync_s: Num = 0.0
    # share of the per-step gradient reduction and parameter gather in the last-reduced bucket (the
    # first gathered): never hidden (StagePieces.dp_tail_share)
    dp_tail_share: Num = 0.0
    offload_grad_s: Num = 0.0  # per step: gradient shard to the host behind the reduction (ZeRO-1/2)
    offload_param_s: Num = 0.0  # per step: updated weights back from the host, after the optimizer
    fsdp_step_sync_s: Num = 0.0  # per pipeline schedule, exposed: FSDP with pipelining gathers and reduces once
    host_sync_fwd_s: Num = 0.0  # per micro-batch and chunk pass: host synchronisations (Plan.host_syncs)
    host_sync_bwd_s: Num = 0.0
    # per micro-batch, all chunks, forward and backward: the expert-parallel all-to-all the layers'
    # A2A overlap hides, net of the slowdown it charges (exposed in the passes without a partner)
    a2a_hidden_s: Num = 0.0
    count: int = 1
    before: tuple[int, ...] = ()
    # with a pipeline layout: each model chunk's forward and backward (compute and exposed
    # communication, no sends) and the stages this entry stands for; None = equal chunks
    chunk_fwd_s: tuple[Num, ...] | None = None
    chunk_bwd_s: tuple[Num, ...] | None = None
    stage_ids: tuple[int, ...] = ()

    def critical_path(self, vp: Num, pp_overlap: Num = False) -> tuple[Num, Num]:
        """(F, B): one micro-batch's forward and backward through the stage, with its sends
        (``vp`` of each per micro-batch under interleaving, as Megatron's 1F1B issues them):
        blocking, or with ``pp_overlap`` (Megatron-Core ``overlap_p2p_comm``: sends on their own
        stream) hidden behind the next chunk's compute, only the excess exposed."""
        f = self.compute_fwd_s + self.exposed_fwd_s + vp * self.host_sync_fwd_s
        b = self.compute_bwd_s + self.exposed_bwd_s + vp * self.host_sync_bwd_s
        send_f = np.where(pp_overlap, np.maximum(0.0, self.p2p_s - f / vp), self.p2p_s)
        send_b = np.where(pp_overlap, np.maximum(0.0, self.p2p_s - b / vp), self.p2p_s)
        return f + self.fwd_sends * vp * send_f, b + self.bwd_sends * vp * send_b

    def chunk_paths(self, vp: Num, pp_overlap: Num, stage: int, pp: int) -> tuple[list[Num], list[Num]]:
        """Per model chunk of stage ``stage``: one micro-batch's forward and backward with its
        send (every virtual stage but the last sends forward, every one but the first sends
        back; overlapped as in ``critical_path``)."""
        assert self.chunk_fwd_s is not None and self.chunk_bwd_s is not None
        f = self.compute_fwd_s + self.exposed_fwd_s
        b = self.compute_bwd_s + self.exposed_bwd_s
        send_f = np.where(pp_overlap, np.maximum(0.0, self.p2p_s - f / vp), self.p2p_s)
        send_b = np.where(pp_overlap, np.maximum(0.0, self.p2p_s - b / vp), self.p2p_s)
        v = len(self.chunk_fwd_s)
        fwd = [cf + (send_f if c * pp + stage < pp * v - 1 and pp > 1 else 0.0) for c, cf in enumerate(self.chunk_fwd_s)]
        bwd = [cb + (send_b if c * pp + stage > 0 else 0.0) for c, cb in enumerate(self.chunk_bwd_s)]
        return fwd, bwd


@dataclass(frozen=True, slots=True)
class ChunkSums:
    """One model chunk of a stage under a pipeline layout, per micro-batch: its layers' sums
    (compute, recomputation, exposed TP/CP/EP), its embedding/head compute (``extra_*``) and its
    share of the stage's parameters (``param_frac``), which carries that share of the
    per-parameter work and the exposed ZeRO-3 and offload copies (as the event engine spreads
    them, ``sim.engines.event.scenario``)."""

    layer_fwd_s: Num
    layer_bwd_s: Num
    recompute_s: Num
    exposed_fwd_s: Num
    exposed_bwd_s: Num
    extra_fwd_s: Num
    extra_bwd_s: Num
    param_frac: float


def layout_chunk_sums(sums: Sequence[tuple[Num, Num, Num, Num, Num]], chunk_params: Sequence[Num], *,
                      stage_params: float, layer_params: float, extras_first: bool, extra_fwd_s: Num,
                      extra_bwd_s: Num) -> tuple[ChunkSums, ...]:
    """A stage's chunks under a pipeline layout, from each chunk's layer sums ``(fwd, bwd,
    recompute, exposed fwd, exposed bwd)`` and parameters (``chunk_params``) out of the stage's
    ``stage_params``, ``layer_params`` of them in its layers: the embedding/head compute
    (``extra_*``) and the parameters outside the layers ride in the first chunk when
    ``extras_first`` (the first stage of a pipeline: the embedding), else in the last (the
    head), as the event engine cuts the stage (``sim.engines.event.scenario``).  Called with floats by
    ``sim.cost.costs.StageCost.chunk_sums`` and with arrays by ``planner.plans.fastmodel``."""
    extra_chunk = 0 if extras_first else len(sums) - 1
    extra_frac = max(0.0, 1.0 - layer_params / stage_params) if stage_params > 0 and layer_params > 0 else 1.0
    out = []
    for c, ((fwd, bwd, rc, exp_fwd, exp_bwd), params) in enumerate(zip(sums, chunk_params)):
        mine = c == extra_chunk
        frac = params / stage_params if stage_params > 0 else 0.0
        out.append(ChunkSums(layer_fwd_s=fwd, layer_bwd_s=bwd, recompute_s=rc, exposed_fwd_s=exp_fwd,
                             exposed_bwd_s=exp_bwd, extra_fwd_s=extra_fwd_s if mine else 0.0,
                             extra_bwd_s=extra_bwd_s if mine else 0.0, param_frac=frac + (extra_frac if mine else 0.0)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class StepTimes:
    """The composed step: ``step_time_s`` and, per stage entry, the terms a breakdown needs."""

    step_time_s: Num
    pipeline_s: Num  # first forward to last backward
    fwd_s: tuple[Num, ...]  # F per stage entry
    bwd_s: tuple[Num, ...]
    end_s: tuple[Num, ...]  # when each entry's stage is ready for the next step
    dp_exposed_s: tuple[Num, ...]  # its exposed data-parallel time after the last backward
    slowdown_s: tuple[Num, ...]  # compute slowed by the reductions/gathers it hides
    optimizer_s: tuple[Num, ...]
    offload_exposed_s: tuple[Num, ...] = ()  # its exposed host-link copies after the last backward
    a2a_exposed_s: tuple[Num, ...] = ()  # its all-to-alls exposed in the passes without a partner


# How a piece scales when a stage gains or loses parameters (``StagePieces.rescaled``): every
# field names one.  ``params``: its bytes (or tensors) are the stage's parameters (collectives,
# optimizer, accumulation, copies, casts, offload; the latency terms, microseconds, ride along);
# ``fixed``: per micro-batch and chunk pass, whatever the stage holds (host synchronisations).
SCALES = ("params", "fixed")


def _piece(scales: str, *, required: bool = False) -> Any:
    assert scales in SCALES
    if required:
        return field(metadata={"scales": scales})
    return field(default=0.0, metadata={"scales": scales})


@dataclass(frozen=True, slots=True)
class StagePieces:
    """Per-stage pieces of one step that depend on the stage's parameters and the ZeRO stage
    (seconds; floats or arrays, as their inputs): see ``stage_pieces``.  Every field states how
    it scales with the stage's parameters (``SCALES``, used by ``rescaled``)."""

    dp_grad_sync_s: Num = _piece("params", required=True)  # full duration: per step (ZeRO 0-2) or per micro-batch (ZeRO-3)
    dp_param_gather_s: Num = _piece("params", required=True)  # per step, after the optimizer (ZeRO-1/2)
    zero3_exposed_fwd_s: Num = _piece("params", required=True)  # per micro-batch
    zero3_exposed_bwd_s: Num = _piece("params", required=True)
    # compute slowed by the hidden FSDP all-gathers / reduce-scatters
    overlap_slowdown_fwd_s: Num = _piece("params", required=True)
    overlap_slowdown_bwd_s: Num = _piece("params", required=True)
    optimizer_s: Num = _piece("params", required=True)
    grad_accum_s: Num = _piece("params", required=True)  # per micro-batch
    fsdp_copy_fwd_s: Num = _piece("params", required=True)  # per micro-batch
    fsdp_copy_bwd_s: Num = _piece("params", required=True)
    fp8_weight_cast_s: Num = _piece("params")  # per micro-batch (averaged when cast once per step)
    dp_replica_sync_s: Num = _piece("params")  # HSDP: all-reduce of the gradient shard over the replicas, per step
    # share of the stage's per-step gradient reduction (and ZeRO-1/2 parameter gather) in its last
    # bucket: the embedding and the rest of the first layer, reduced after the last backward and
    # gathered before the first forward, never hidden (bucketed reducers, runtime.yaml grad_buckets)
    dp_tail_share: Num = _piece("fixed")
    offload_fwd_s: Num = _piece("params")  # per micro-batch: exposed host-link copies (weights in, activations out)
    offload_bwd_s: Num = _piece("params")  # (weights and activations in, gradients out)
    offload_grad_s: Num = _piece("params")  # per step, full duration: gradient shard to the host (ZeRO-1/2)
    offload_param_s: Num = _piece("params")  # per step, exposed: updated weight shard back to the GPU
    # FSDP with pipelining (no reshard until the last backward): the stage's all-gather and
    # reduce-scatter once per step, exposed
    fsdp_step_sync_s: Num = _piece("params")
    # part of zero3_exposed_fwd_s and of zero3_exposed_bwd_s: the fixed costs of gathering tensor by
    # tensor, synchronously (Plan.zero3_gather per_tensor_sync), per micro-batch and pass; the
    # stage's tensors taken as proportional to its parameters (as zero3_exposed_*, which holds it)
    zero3_sync_s: Num = _piece("params")
    # host synchronisations (Plan.host_syncs): per micro-batch and model chunk, the GPU idles
    # one host dispatch per sync; the per-step ones are in optimizer_s
    host_sync_fwd_s: Num = _piece("fixed")
    host_sync_bwd_s: Num = _piece("fixed")

    @property
    def param_work_fwd_s(self) -> Num:
        """Per micro-batch forward work proportional to the stage's parameters (compute slowed
        by hidden FSDP gathers, FSDP2 packing, fp8 weight casts); it happens layer by layer, by
        parameter share."""
        return self.overlap_slowdown_fwd_s + self.fsdp_copy_fwd_s + self.fp8_weight_cast_s

    @property
    def param_work_bwd_s(self) -> Num:
        """As ``param_work_fwd_s`` for the backward, plus the gradient accumulation pass."""
        return self.overlap_slowdown_bwd_s + self.grad_accum_s + self.fsdp_copy_bwd_s

    @property
    def exposed_zero3_s(self) -> Num:
        return self.zero3_exposed_fwd_s + self.zero3_exposed_bwd_s

    @property
    def exposed_offload_s(self) -> Num:
        """Exposed host-link copies of one micro-batch's forward and backward."""
        return self.offload_fwd_s + self.offload_bwd_s

    def rescaled(self, params_ratio: float) -> "StagePieces":
        """These pieces for a stage with ``params_ratio`` times the parameters (layers moved
        between stages, ``sim.engines.event.whatif``): each field as its ``SCALES`` entry says."""
        ratio = {"params": params_ratio, "fixed": 1.0}
        return StagePieces(**{f.name: getattr(self, f.name) * ratio[f.metadata["scales"]] for f in fields(self)})

    def as_floats(self) -> "StagePieces":
        """The same pieces as Python floats (one plan's stage, from 0-d arrays)."""
        return StagePieces(**{f.name: float(getattr(self, f.name)) for f in fields(self)})


@dataclass(frozen=True, slots=True)
class DpCollectives:
    """Seconds of one stage's data-parallel collectives (all groups at once; dense parameters
    over ``dp x cp``, experts over the expert data parallelism): gradient all-reduce (ZeRO-0),
    reduce-scatter (ZeRO 1-3) and parameter all-gather."""

    all_reduce_s: float
    reduce_scatter_s: float
    all_gather_s: float
    replica_all_reduce_s: float = 0.0  # HSDP: the sharded gradients over the replicas
    # fixed part of one parameter all-gather over the sharded group (latency steps + launch): what
    # each extra collective costs when an engine gathers tensor by tensor
    all_gather_latency_s: float = 0.0


def local_params(params: StageParams, zero: Num, dp_size: int, expert_dp: int) -> Num:
    """Parameters of a GPU's optimizer shard: ZeRO (stage >= 1) shards dense states over
    ``dp_size`` (dp x cp, or HSDP's shard group) and expert states over the expert data
    parallelism."""
    z = np.asarray(zero)
    return params.dense_params / np.where(z >= 1, dp_size, 1) + params.expert_params / np.where(z >= 1, expert_dp, 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class PieceSettings:
    """The inputs of ``stage_pieces`` that come from the plan rather than from the stage: its
    framework's settings, the cluster's HBM rate, the precision and the micro-batch count.
    ``sim.cost.costs.piece_settings`` builds them for one plan (floats) and for a search layout
    (arrays over the micro-batch axis): a new framework setting is one field here, one line
    there, and its use in ``stage_pieces``."""

    dp_overlap: bool
    hbm_bytes_per_s: float
    rt: CommRuntime
    eff: KernelEfficiency
    accum_bytes_per_param: Num  # gradient accumulation outside the GEMM, per micro-batch
    fp16: bool
    fsdp_copies: bool
    weight_cast_bytes_per_param: Num = 0.0  # fp8 weight casts, per micro-batch
    optimizer_impl: str = "fused"
    pipelined_fsdp: bool = False
    bf16_optimizer: bool = False
    per_tensor_gather: bool = False  # ZeRO-3 gathers tensor by tensor (Plan.zero3_gather per_tensor_sync)
    host_syncs: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # sim.cost.costs.host_sync_counts
    grad_bucket_params: Num = 0.0  # parameters per gradient bucket (0: one reduction, not bucketed)
    model_chunks: Num = 1.0  # the stage's model chunks (vp); Megatron-Core buckets the first one only


def stage_pieces(*, coll: DpCollectives, zero: Num, dp_size: int, expert_dp: int, params: StageParams,
                 num_layers: int, layer_fwd_s: Num, layer_bwd_s: Num, settings: PieceSettings, tensors: int = 0,
                 offload_optimizer: Num = False, offload_params: Num = False, offload_activations: Num = False,
                 act_bytes: Num = 0.0, rates: OffloadRates | None = None, embedding_params: float = 0.0) -> StagePieces:
    """The per-stage pieces (``StagePieces``) of a stage, for one ZeRO stage or an array of them.

    ``layer_fwd_s`` / ``layer_bwd_s``: the stage's compute per micro-batch (layers incl.
    recomputation, plus the embedding/head), which hides FSDP's prefetched gathers.
    ``settings``: the plan's (``PieceSettings``, whose fields the items below name);
    ``tensors``: the stage's parameter tensors (``sim.layers.stages.stage_parameter_tensors``);
    ``embedding_params``: the input embedding's parameters on this GPU (0 off the first stage).

    * ZeRO-0: gradient all-reduce; ZeRO-1/2: reduce-scatter, then the parameter all-gather
      (Rajbhandari et al. 2020, Sec. 5); both per step, composed in ``sim.cost.step``.
    * Bucketed reduction (``grad_bucket_params`` > 0; Megatron-Core, PyTorch DDP, DeepSpeed ZeRO-1/2):
      buckets are filled in reverse parameter order and a bucket is reduced when all its
      gradients are final, so the last bucket, the input embedding plus what is left of the first
      layer (on average half a bucket; half a bucket of experts too when the stage has experts,
      whose buffer is bucketed apart), is reduced after the last backward, and gathered first
      before the next forward (Megatron-Core ``overlap_param_gather``): ``dp_tail_share``, the
      share of the stage's parameters in it, is never hidden (``compose``).  Li et al. 2020,
      PyTorch Distributed (VLDB), Sec. 3.2.3: the last bucket's all-reduce cannot overlap.
    * ZeRO-3 (FSDP): per layer, an all-gather before forward and backward (prefetched one layer
      ahead), a reduce-scatter after backward, every micro-batch; what the stage's compute
      cannot hide is exposed, plus one layer's share that no prefetch hides.  Without prefetch
      (``dp_overlap`` off) every gather and reduce-scatter is exposed.  Hidden traffic slows
      the compute under it by ``overlap_compute_slowdown`` (arXiv:2507.03114).
    * The optimizer step is memory-bound: the bytes per local (sharded) parameter of its
      implementation (``optimizer_impl``: ``fused`` multi-tensor Adam, or ``keras``' unfused
      ops plus tf.distribute's gradient pack; ``catalogs/runtime.yaml``) at the GPU's achievable HBM rate; gradient accumulation outside the GEMM and
      FSDP2's packing around its collectives likewise (``catalogs/runtime.yaml``), and the fp8
      cast of the weights (``weight_cast_bytes_per_param``, ``sim.layers.compute``).
    * ZeRO-3 gathered tensor by tensor, synchronously (``per_tensor_gather``, each of the
      stage's ``tensors``, DeepSpeed ZeRO-3 of 2021, ``Plan.zero3_gather``): each tensor's gather
      waits for the GPU (``torch.cuda.synchronize``: a host dispatch floor ``host_op_floor_s``),
      pays its own collective latency and ``zero3_host_per_rank_s`` of host work per rank of the
      group (``catalogs/runtime.yaml``), before the forward and again before the backward of
      every micro-batch; nothing prefetches.
    * Host synchronisations (``host_syncs``: forward and backward per micro-batch and chunk,
      per step; counts from ``Plan.host_syncs``): each drains the GPU's queue, which then waits
      one host dispatch (``host_op_floor_s``) for the next kernel; the per-step ones join the
      optimizer step.  Megatron-Core's NaN check of the gradients (``check_for_nan_in_grad``, on by
      default; ``host_syncs`` ``per_bucket``) takes each gradient bucket's norm before the bucket is
      reduced and reads it on the host: once per step, a pass over the gradient buffer and that
      many synchronisations per bucket, joining the optimizer step too.  A stage's buckets: its
      first model chunk's ``ceil(P / vp / grad_bucket_params)``, at most one per parameter tensor
      (``tensors``; a bucket closes once it holds ``bucket_size`` parameters), and one for each
      other chunk (Megatron-LM training.py / NeMo megatron_parallel.py ``disable_bucketing`` for
      model chunks after the first), one more for the expert buffer; one per buffer without
      ``dp_overlap`` (no ``bucket_size``); none under ZeRO-3.
    * DeepSpeed's BF16_Optimizer (``bf16_optimizer``, a bf16 plan of a DeepSpeed profile; it
      runs where the ZeRO stage is 0): the gradients are all-reduced in fp32 as without ZeRO,
      but the master weights and Adam states are sharded over the data-parallel group (its own
      ZeRO-1) and the updated bf16 weights all-gathered after the step; every micro-batch adds
      its bf16 gradients into the unsharded fp32 buffer (``grad_accumulation`` ``deepspeed_bf16``),
      and the step reads and zeroes that buffer (``catalogs/runtime.yaml``).
    * Offload (``offload_*`` bools, ``rates`` from ``sim.cost.offload``, ``act_bytes`` the stage's
      saved activations of one micro-batch; module docstring): with ``M`` the shard's
      parameters, the weights in (``2M``) before the forward and again before the backward and
      the gradients out (``2M``) after it (ZeRO-Infinity, ``params``; the gradients alone under
      ZeRO-3 ``optimizer``), each per micro-batch, the activations out and back; with prefetch
      (``dp_overlap``) the exposure is ``max(0, max(network, link) - compute)`` minus FSDP's
      own plus one layer's share of the link, without it every weight and gradient copy is
      exposed.  ZeRO-1/2 send the gradients once per step (``offload_grad_s``, ZeRO-Offload's
      ``2M``); every optimizer offload steps Adam on the CPU (``cpu_optimizer_s_per_param``) and,
      unless the weights live on the host, copies the updated ``2M`` back (``offload_param_s``).
    * FSDP with pipelining (``pipelined_fsdp``: torchtitan / FSDP2 with pp, ZeRO-3): parameters
      are not resharded after forward and gradients are reduced after the last micro-batch
      (torch.distributed.pipelining stage.py set_requires_gradient_sync / set_reshard_after_backward),
      so the stage gathers once and reduce-scatters once per pipeline schedule, exposed
      (``fsdp_step_sync_s``; ``compose`` charges it once per schedule, ``Plan.pipeline_flushes``),
      and nothing per micro-batch.
    """
    st = settings
    dp_overlap, hbm_bytes_per_s, rt, eff = st.dp_overlap, st.hbm_bytes_per_s, st.rt, st.eff
    accum_bytes_per_param, weight_cast_bytes_per_param, host_syncs = (st.accum_bytes_per_param,
                                                                      st.weight_cast_bytes_per_param, st.host_syncs)
    zero3_tensors = tensors if st.per_tensor_gather else 0
    z = np.asarray(zero)
    z3 = z >= 3
    bf16opt = np.asarray(st.bf16_optimizer) & (z == 0)  # DeepSpeed BF16_Optimizer: fp32 all-reduce, own ZeRO-1
    grad_sync = np.where(z == 0, coll.all_reduce_s, coll.reduce_scatter_s)
    param_gather = np.where((z == 1) | (z == 2) | bf16opt, coll.all_gather_s, 0.0)
    ag, rs = coll.all_gather_s, coll.reduce_scatter_s
    n1 = max(1, num_layers)
    if dp_overlap:
        z3f = np.maximum(0.0, ag - layer_fwd_s) + ag / n1
        z3b = np.maximum(0.0, ag + rs - layer_bwd_s) + rs / n1
    else:  # no prefetch: every gather and reduce-scatter is on the critical path
        z3f, z3b = ag + 0.0 * layer_fwd_s, ag + rs + 0.0 * layer_bwd_s
    pf = z3 & np.asarray(st.pipelined_fsdp)
    sync = 0.0
    if zero3_tensors:  # one synchronous gather per tensor: latency, a drained queue, O(dp) host work
        per_tensor = coll.all_gather_latency_s + eff.host_op_floor_s + rt.zero3_host_per_rank_s * dp_size
        sync = np.where(z3, zero3_tensors * per_tensor, 0.0)
        z3f, z3b = z3f + sync, z3b + sync
    z3f, z3b = np.where(z3 & ~pf, z3f, 0.0), np.where(z3 & ~pf, z3b, 0.0)
    step_sync = np.where(pf, ag + rs, 0.0)
    sigma = eff.overlap_compute_slowdown
    slow_f = np.where(z3 & ~pf, sigma * np.maximum(0.0, ag - z3f), 0.0)
    slow_b = np.where(z3 & ~pf, sigma * np.maximum(0.0, ag + rs - z3b), 0.0)

    local = local_params(params, np.where(bf16opt, 1, z), dp_size, expert_dp)
    opt_bytes = rt.optimizer_bytes(st.optimizer_impl, st.fp16)
    opt_s = (local * opt_bytes
             + np.where(bf16opt, params.total * rt.bf16_optimizer_full_buffer_bytes_per_param, 0.0)) / hbm_bytes_per_s \
        + host_syncs[2] * eff.host_op_floor_s
    # weight gradients of each micro-batch added into the step's buffer (FSDP: into the shard)
    accum = np.where(bf16opt, rt.grad_accumulation_bytes_per_param.get("deepspeed_bf16", 0.0), accum_bytes_per_param)
    accum_s = np.where(z3, local, params.total) * accum / hbm_bytes_per_s
    copies = z3 & (dp_size > 1) & st.fsdp_copies
    copy_f = np.where(copies, params.total * rt.fsdp_gather_copy_bytes_per_param / hbm_bytes_per_s, 0.0)
    copy_b = np.where(copies, params.total * (rt.fsdp_gather_copy_bytes_per_param
                                              + rt.fsdp_reduce_copy_bytes_per_param) / hbm_bytes_per_s, 0.0)
    cast_s = params.total * weight_cast_bytes_per_param / hbm_bytes_per_s
    off_f = off_b = off_g = off_p = 0.0
    if rates is not None:
        vol = offload_bytes(local, act_bytes, zero=z, offload_optimizer=offload_optimizer,
                            offload_params=offload_params, offload_activations=offload_activations, rates=rates)
        link = rates.link_bytes_per_s
        w_in = vol.weights_in_per_pass / rates.state_bytes_per_s  # each pass, from host or NVMe
        g_mb = vol.grads_out_per_microbatch / link
        a_io = vol.activations_per_microbatch / link
        link_f = np.maximum(w_in, a_io)  # full duplex: weights in while activations go out
        link_b = np.maximum(w_in + a_io, g_mb)  # weights and activations in, gradients out
        net_f, net_b = np.where(z3, ag, 0.0), np.where(z3, ag + rs, 0.0)
        if dp_overlap:
            off_f = (np.maximum(0.0, np.maximum(net_f, link_f) - layer_fwd_s) - np.maximum(0.0, net_f - layer_fwd_s)
                     + w_in / n1)
            off_b = (np.maximum(0.0, np.maximum(net_b, link_b) - layer_bwd_s) - np.maximum(0.0, net_b - layer_bwd_s)
                     + g_mb / n1)
        else:
            off_f = w_in + np.maximum(0.0, a_io - layer_fwd_s)
            off_b = w_in + g_mb + np.maximum(0.0, a_io - layer_bwd_s)
        off_g = vol.grads_out_per_step / link
        off_p = vol.weights_back_per_step / rates.state_bytes_per_s
        opt_s = np.where(np.asarray(offload_optimizer), local * rates.cpu_optimizer_s_per_param, opt_s)
    bucket = np.asarray(st.grad_bucket_params, dtype=float)
    if host_syncs[3]:  # Megatron-Core's per-bucket NaN check (docstring): norms and host reads, per step
        buffers = 1.0 + (params.expert_params > 0)
        if dp_overlap and np.any(bucket > 0):
            chunks = np.asarray(st.model_chunks, dtype=float)
            first = np.minimum(max(tensors, 1) / chunks, np.ceil(params.total / chunks / np.maximum(bucket, 1.0)))
            buckets = first + (chunks - 1) + buffers - 1
        else:
            buckets = buffers + 0.0 * bucket
        check_s = (host_syncs[3] * buckets * eff.host_op_floor_s
                   + params.total * rt.grad_reduce_bytes_per_param / hbm_bytes_per_s)
        opt_s = opt_s + np.where(z >= 3, 0.0, check_s)
    tail = embedding_params + 0.5 * bucket + np.where(params.expert_params > 0, 0.5 * bucket, 0.0)
    tail_share = np.where(bucket > 0, np.minimum(1.0, tail / max(params.total, 1.0)), 0.0) + 0.0 * z
    return StagePieces(dp_grad_sync_s=grad_sync, dp_param_gather_s=param_gather, zero3_exposed_fwd_s=z3f,
                       zero3_exposed_bwd_s=z3b, overlap_slowdown_fwd_s=slow_f, overlap_slowdown_bwd_s=slow_b,
                       optimizer_s=opt_s, grad_accum_s=accum_s, fsdp_copy_fwd_s=copy_f, fsdp_copy_bwd_s=copy_b,
                       fp8_weight_cast_s=cast_s, dp_replica_sync_s=coll.replica_all_reduce_s + 0.0 * z,
                       offload_fwd_s=off_f, offload_bwd_s=off_b, offload_grad_s=off_g, offload_param_s=off_p,
                       fsdp_step_sync_s=step_sync, zero3_sync_s=sync + 0.0 * z, dp_tail_share=tail_share,
                       host_sync_fwd_s=host_syncs[0] * eff.host_op_floor_s, host_sync_bwd_s=host_syncs[1] * eff.host_op_floor_s)


def stage_times(*, layer_fwd_s: Num, layer_bwd_s: Num, recompute_s: Num, layer_exposed_fwd_s: Num,
                layer_exposed_bwd_s: Num, extra_fwd_s: Num, extra_bwd_s: Num, pieces: StagePieces, p2p_s: Num,
                num_layers: int, first: bool, last: bool, count: int = 1,
                before: tuple[int, ...] = (), chunks: Sequence[ChunkSums] | None = None,
                stage_ids: tuple[int, ...] = (), layer_a2a_hidden_s: Num = 0.0) -> StageTimes:
    """A stage's ``StageTimes`` from its layers' sums per micro-batch (``layer_*``: compute,
    recomputation, exposed TP/CP/EP communication, the all-to-all an A2A overlap hides), its
    embedding/head compute (``extra_*``)
    and its ``StagePieces``.  ``W`` (zero-bubble) is half the layers' backward: the weight
    gradient GEMMs, which the layer cost does not separate from the input gradient.
    ``chunks`` (a pipeline layout's model chunks of the stages ``stage_ids``) give each chunk's
    forward and backward for ``sim.cost.interleave``."""
    cf = cb = None
    if chunks is not None:
        cf = tuple(c.layer_fwd_s + c.extra_fwd_s + c.exposed_fwd_s
                   + c.param_frac * (pieces.param_work_fwd_s + pieces.zero3_exposed_fwd_s + pieces.offload_fwd_s)
                   for c in chunks)
        cb = tuple(c.layer_bwd_s + c.recompute_s + c.extra_bwd_s + c.exposed_bwd_s
                   + c.param_frac * (pieces.param_work_bwd_s + pieces.zero3_exposed_bwd_s + pieces.offload_bwd_s)
                   for c in chunks)
    return StageTimes(
        compute_fwd_s=layer_fwd_s + extra_fwd_s + pieces.param_work_fwd_s,
        compute_bwd_s=layer_bwd_s + recompute_s + extra_bwd_s + pieces.param_work_bwd_s,
        exposed_fwd_s=layer_exposed_fwd_s + pieces.zero3_exposed_fwd_s + pieces.offload_fwd_s,
        exposed_bwd_s=layer_exposed_bwd_s + pieces.zero3_exposed_bwd_s + pieces.offload_bwd_s,
        p2p_s=p2p_s, weight_grad_s=0.5 * layer_bwd_s, dp_grad_sync_s=pieces.dp_grad_sync_s,
        dp_param_gather_s=pieces.dp_param_gather_s, optimizer_s=pieces.optimizer_s, num_layers=num_layers,
        dp_replica_sync_s=pieces.dp_replica_sync_s, dp_tail_share=pieces.dp_tail_share,
        offload_grad_s=pieces.offload_grad_s,
        offload_param_s=pieces.offload_param_s, fsdp_step_sync_s=pieces.fsdp_step_sync_s,
        host_sync_fwd_s=pieces.host_sync_fwd_s, host_sync_bwd_s=pieces.host_sync_bwd_s,
        fwd_sends=0 if last else 1, bwd_sends=0 if first else 1, count=count, before=before,
        chunk_fwd_s=cf, chunk_bwd_s=cb, stage_ids=stage_ids, a2a_hidden_s=layer_a2a_hidden_s)


def a2a_unpaired_passes(pp: int, vp: Num, m: Num, rank: int) -> Num:
    """Chunk passes of each direction that rank ``rank`` runs without a partner under
    expert-parallel A2A overlap (Megatron-Core ``--overlap-moe-expert-parallel-comm``), of the
    ``m * vp`` it runs per pipeline schedule.

    Without pipelining the first micro-batch's forward and the last one's backward run alone
    (core_v0.14.0 ``pipeline_parallel/combined_1f1b.py``
    ``combined_1f1b_schedule_for_no_pipelining``: "The forward step for the first microbatch is
    executed alone, no a2a overlapping").  With (interleaved) pipelining only the steady 1F1B
    phase is combined: the warm-up forwards, ``2 (pp - r - 1) + (vp - 1) * pp`` plus the one
    extra forward A2A overlap schedules (``schedules.py`` ``get_pp_rank_microbatches``, with
    ``microbatch_group_size_per_vp_stage`` = ``pp``, its default), and as many cool-down
    backwards.  Megatron-Core requires interleaving when ``pp > 1``; ``vp = 1`` takes the same
    count."""
    vp = np.asarray(vp, dtype=float)
    total = np.asarray(m, dtype=float) * vp
    if pp <= 1:
        return np.minimum(total, 1.0)
    return np.minimum(total, 2.0 * (pp - rank - 1) + (vp - 1.0) * pp + 1.0)


def pipeline_time_s(stages: Sequence[StageTimes], fb: Sequence[tuple[Num, Num]], m: Num, vp: Num,
                    zero_bubble: Num, pp: int) -> Num:
    """Closed-form time from the first forward to the last backward (module docstring).
    ``zero_bubble`` is a bool (or bool array) per schedule; ``fb`` the stages' (F, B)."""
    tot = [f + b for f, b in fb]
    slowest = tot[0]
    for t in tot[1:]:
        slowest = np.maximum(slowest, t)
    summed = sum(st.count * t for st, t in zip(stages, tot))
    t_pipe = summed / vp + (m - 1.0 / vp) * slowest
    if pp > 1 and np.any(zero_bubble):
        drain = tot[0] - stages[0].weight_grad_s
        for st, t in zip(stages[1:], tot[1:]):
            drain = np.maximum(drain, t - st.weight_grad_s)
        t_pipe = np.where(zero_bubble, m * slowest + (pp - 1) * drain / vp, t_pipe)
    return t_pipe


def chunked_pipeline(stages: Sequence[StageTimes], m: Num, vp: Num, pp: int,
                     pp_overlap: Num = False) -> tuple[Num, list[Num]]:
    """Under a pipeline layout with interleaving: (time from the first forward to the last
    backward, when each stage ends its last backward), from the interleaved schedule evaluated
    chunk by chunk (``sim.cost.interleave``); ``m`` may be an array of micro-batch counts (each
    distinct count is evaluated; counts the schedule cannot run, not a multiple of ``pp``, give
    NaN)."""
    fwd: list[list[Num]] = [[] for _ in range(pp)]
    bwd: list[list[Num]] = [[] for _ in range(pp)]
    for st in stages:
        for i in st.stage_ids:
            fwd[i], bwd[i] = st.chunk_paths(vp, pp_overlap, i, pp)
    assert all(fwd), "every stage needs its chunks"
    ms = np.unique(np.asarray(m, dtype=float))
    t_pipe: Num = np.nan
    ends: list[Num] = [np.nan] * pp
    for mv in ms:
        k = int(mv)
        if k != mv or k < 1 or k % pp:
            continue
        t, e = interleaved_time_s(fwd, bwd, m=k)
        if ms.size == 1:
            return t, e
        sel = np.asarray(m) == mv
        t_pipe = np.where(sel, t, t_pipe)
        ends = [np.where(sel, x, y) for x, y in zip(e, ends)]
    return t_pipe, ends


def overlap_window(t: Num, num_layers: int, vp: Num, pp: int) -> Num:
    """Compute that can hide a stage's per-step data-parallel collective, given ``t``, one
    micro-batch's backward (or forward) through the stage: bucketed reduction starts under the
    last micro-batch's backward of the stage's last model chunk, all but its last layer's
    share; under interleaving (``vp`` chunks) each chunk's gradients are final ``pp``
    chunk-passes before the next chunk's, so the first chunk's reduction starts
    ``(vp - 1) * pp`` chunk-passes before the end (Megatron-Core's ``overlap_grad_reduce`` per
    model chunk; the parameter all-gather of ``overlap_param_gather`` mirrors it in the next
    step's warm-up forwards)."""
    layers_per_chunk = np.maximum(1.0, max(1, num_layers) / vp)
    chunk = t / vp
    return chunk * (layers_per_chunk - 1) / layers_per_chunk + (vp - 1) * pp * chunk


def compose(stages: Sequence[StageTimes], *, m: Num, vp: Num, zero_bubble: Num, pp: int, zero: Num,
            dp_overlap: bool, overlap_slowdown: float, pp_overlap: Num = False, flushes: int = 1) -> StepTimes:
    """Step time of ``stages`` (module docstring).  ``zero`` may be an array (ZeRO-3 traffic is
    per micro-batch, inside ``F``/``B``; stages 0-2 reduce after the last backward).

    ``flushes``: pipeline schedules run back to back per step, each over ``m / flushes``
    micro-batches with its own fill and drain (``Plan.pipeline_flushes``; NeMo Automodel's
    benchmark and training loops call ``schedule.step`` once per gradient-accumulation step).
    The next schedule's first forward on stage 0 waits for stage 0's last backward of the one
    before, which ends the schedule, so the pipeline takes ``flushes`` times one schedule's
    time, plus, under FSDP with pipelining, stage 0's exposed gather and reduce-scatter
    (``fsdp_step_sync_s``) between consecutive schedules (torch.distributed.pipelining
    ``PipelineStage.perform_reduce_grad``, called at the end of every ``schedule.step``: FSDP's
    post-backward, reduce-scatter and reshard, for every parameter group, in torch 2.4-2.13); with
    ``pp == 1`` there is no fill or drain and nothing changes."""
    fb = [st.critical_path(vp, pp_overlap) for st in stages]
    chunked = pp > 1 and stages[0].chunk_fwd_s is not None and len(stages[0].chunk_fwd_s) > 1 \
        and not np.any(zero_bubble)
    k = flushes if pp > 1 else 1
    m_one = np.asarray(m) / k if k > 1 else m
    # FSDP with pipelining reduce-scatters and reshards at the end of every schedule; the next one
    # starts on stage 0 once stage 0's sync is done (the other stages' syncs run while stage 0
    # drains, and while the new schedule fills up to them)
    between = (k - 1) * stages[0].fsdp_step_sync_s
    if chunked:  # a pipeline layout with interleaving: the schedule evaluated chunk by chunk
        t_pipe, stage_end = chunked_pipeline(stages, m_one, vp, pp, pp_overlap)
        if k > 1:
            stage_end = [e + (k - 1) * t_pipe + between for e in stage_end]
            t_pipe = k * t_pipe + between
    else:
        t_pipe = k * pipeline_time_s(stages, fb, m_one, vp, zero_bubble, pp) + between
    sigma = overlap_slowdown
    z3 = np.asarray(zero) >= 3
    ends, exposed, slows, opts, offs, a2as = [], [], [], [], [], []
    for st, (f, b) in zip(stages, fb):
        if chunked:
            last_end = stage_end[st.stage_ids[0]]
            for i in st.stage_ids[1:]:
                last_end = np.maximum(last_end, stage_end[i])
        else:
            tail = sum(k * fb[j][1] for j, k in enumerate(st.before) if k)
            last_end = t_pipe - tail
        # A2A overlap: the passes without a partner expose their all-to-alls (a2a_unpaired_passes),
        # every schedule; a stage entry standing for several stages takes its first one's count
        a2a = k * a2a_unpaired_passes(pp, vp, m_one, min(st.stage_ids, default=0)) / np.asarray(vp, dtype=float) \
            * st.a2a_hidden_s
        last_end = last_end + a2a
        a2as.append(a2a)
        window = overlap_window(b, st.num_layers, vp, pp) if dp_overlap else 0.0
        # per step after the last backward: the gradient reduction (ZeRO-3 reduces inside each
        # backward) and HSDP's all-reduce over the replicas
        sync = np.where(z3, 0.0, st.dp_grad_sync_s) + st.dp_replica_sync_s
        tail = st.dp_tail_share * sync  # the last bucket: reduced after the last backward
        slow = sigma * np.minimum(sync - tail, window)
        ready = np.maximum(last_end + slow + tail, last_end - window + sync)
        dp_exposed = ready - last_end - slow
        # offloaded gradient shard: copied bucket by bucket as the reduction delivers it
        off_ready = np.maximum(ready, last_end - window + np.maximum(sync, st.offload_grad_s))
        off_exposed = off_ready - ready + st.offload_param_s
        ready = off_ready
        gather = st.dp_param_gather_s
        if dp_overlap:  # overlapped with the next step's first forwards (overlap_param_gather)
            # the first bucket the forward needs (the embedding's) is waited for
            hidden_gather = np.minimum(gather * (1.0 - st.dp_tail_share), overlap_window(f, st.num_layers, vp, pp))
            gather = gather - hidden_gather
            slow = slow + sigma * hidden_gather
            ready = ready + sigma * hidden_gather
        ends.append(ready + st.optimizer_s + st.offload_param_s + gather + st.fsdp_step_sync_s)
        exposed.append(dp_exposed + gather + st.fsdp_step_sync_s)
        slows.append(slow)
        opts.append(st.optimizer_s)
        offs.append(off_exposed)
    step = ends[0]
    for e in ends[1:]:
        step = np.maximum(step, e)
    return StepTimes(step_time_s=step, pipeline_s=t_pipe, fwd_s=tuple(f for f, _ in fb),
                     bwd_s=tuple(b for _, b in fb), end_s=tuple(ends), dp_exposed_s=tuple(exposed),
                     slowdown_s=tuple(slows), optimizer_s=tuple(opts), offload_exposed_s=tuple(offs),
                     a2a_exposed_s=tuple(a2as))
