"""Framework runtime constants that are not properties of a GPU or a model (``catalogs/runtime.yaml``).

* ``CommRuntime``: bytes per parameter of the data-parallel collectives (fp32 gradient
  reduction, bf16 parameter gathers), of the optimizer step's memory-bound passes, of gradient
  accumulation outside the GEMM per framework mode, and of FSDP2's packing around its
  collectives (each with its source in the catalog);
* ``MemoryRuntime``: workspaces and caching-allocator slack added to every GPU's peak;
* ``DataParallelRuntime``: what single-process ``torch.nn.DataParallel`` moves and how much of
  its threads' dispatch the GIL serialises.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from sim.catalog import catalog_document
from sim.records import Record

if TYPE_CHECKING:
    from sim.plan import Plan


@dataclass(frozen=True, kw_only=True, slots=True)
class CommRuntime:
    grad_reduce_bytes_per_param: float
    param_gather_bytes_per_param: float
    optimizer_bytes_per_param: float
    fp16_extra_bytes_per_param: float = 0.0
    # framework grad_accumulation mode -> HBM bytes per local parameter per micro-batch
    grad_accumulation_bytes_per_param: Mapping[str, float] = field(default_factory=dict)
    # FSDP2 pack/unpack around each all-gather (fwd, and again in bwd) and reduce-scatter
    fsdp_gather_copy_bytes_per_param: float = 0.0
    fsdp_reduce_copy_bytes_per_param: float = 0.0
    # DeepSpeed BF16_Optimizer: per step over its unsharded fp32 gradient buffer (norm + zeroing)
    bf16_optimizer_full_buffer_bytes_per_param: float = 0.0
    # 2021 DeepSpeed ZeRO-3: host time per rank of the group for every parameter tensor gathered
    zero3_host_per_rank_s: float = 0.0

    def grad_accumulation_bytes(self, mode: str, microbatches: int) -> float:
        """Bytes per parameter per micro-batch, averaged over the step's micro-batches
        (``autograd`` has nothing to add into on the first one)."""
        b = self.grad_accumulation_bytes_per_param.get(mode, 0.0)
        return b * (microbatches - 1) / microbatches if mode == "autograd" else b


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryRuntime:
    """Framework-level memory not tied to the model."""

    workspace_bytes: float  # cuBLAS/cuDNN/NCCL workspaces
    fragmentation_fraction: float  # caching-allocator slack on top of live tensors
    loss_bytes_per_logit: Mapping[str, float] = field(default_factory=dict)  # by loss implementation
    source: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceMemory:
    """What device-level memory (nvidia-smi) holds beyond PyTorch's reserved pool."""

    cuda_context_bytes: float
    nccl_ring_bytes_per_communicator: float
    nccl_bytes_per_alltoall_peer: float
    nccl_p2p_bytes_per_peer: float


def _doc() -> Record:
    return Record(catalog_document("runtime.yaml"), where="runtime", file="runtime.yaml")


@functools.cache
def default_comm_runtime() -> CommRuntime:
    doc = _doc()
    c, o = doc.mapping("communication"), doc.mapping("optimizer")
    acc = doc.mapping("grad_accumulation").mapping("bytes_per_param")
    copies = doc.mapping("fsdp_copies")
    bf16 = doc.mapping("deepspeed_bf16_optimizer")
    return CommRuntime(grad_reduce_bytes_per_param=c.req("grad_reduce_bytes_per_param", positive=True),
                       param_gather_bytes_per_param=c.req("param_gather_bytes_per_param", positive=True),
                       optimizer_bytes_per_param=o.req("bytes_per_param", positive=True),
                       fp16_extra_bytes_per_param=o.req("fp16_extra_bytes_per_param"),
                       grad_accumulation_bytes_per_param={k: acc.req(k) for k in acc.rec},
                       fsdp_gather_copy_bytes_per_param=copies.req("all_gather_copy_out_bytes_per_param"),
                       fsdp_reduce_copy_bytes_per_param=copies.req("reduce_scatter_copy_in_bytes_per_param"),
                       bf16_optimizer_full_buffer_bytes_per_param=bf16.req("full_buffer_bytes_per_param"),
                       zero3_host_per_rank_s=doc.mapping("zero3_per_tensor_gather").req("host_per_rank_s"))


@functools.cache
def device_memory() -> DeviceMemory:
    d = _doc().mapping("device_memory")
    return DeviceMemory(cuda_context_bytes=d.req("cuda_context_bytes"),
                        nccl_ring_bytes_per_communicator=d.req("nccl_ring_bytes_per_communicator"),
                        nccl_bytes_per_alltoall_peer=d.req("nccl_bytes_per_alltoall_peer"),
                        nccl_p2p_bytes_per_peer=d.req("nccl_p2p_bytes_per_peer"))


def device_memory_bytes(reserved_bytes: float, plan: "Plan") -> float:
    """Peak memory as ``nvidia-smi`` shows it: PyTorch's reserved peak plus the CUDA context
    and the NCCL buffers of every communicator the rank uses (``catalogs/runtime.yaml``):
    ring communicators for tp, cp, the data-parallel gradient group and (MoE) the expert
    data-parallel group, every peer of the expert all-to-all, and the pipeline neighbours."""
    s, d = plan.strategy, device_memory()
    rings = sum(n > 1 for n in (s.tp, s.cp, s.dp * s.cp))
    if plan.model.moe is not None:
        rings += s.expert_dp > 1 and s.expert_dp != s.dp * s.cp
        if s.expert_tp != s.tp:
            rings += s.expert_tp > 1
    nccl = rings * d.nccl_ring_bytes_per_communicator
    if s.ep > 1:
        nccl += (s.ep - 1) * d.nccl_bytes_per_alltoall_peer
    if s.pp > 1:
        nccl += 2 * d.nccl_p2p_bytes_per_peer
    return reserved_bytes + d.cuda_context_bytes + nccl


@functools.cache
def default_runtime() -> MemoryRuntime:
    doc = _doc()
    m, loss = doc.mapping("memory"), doc.mapping("loss").mapping("bytes_per_logit")
    return MemoryRuntime(workspace_bytes=m.req("workspace_bytes"),
                         fragmentation_fraction=m.fraction("fragmentation_fraction"),
                         loss_bytes_per_logit={k: loss.req(k, positive=True) for k in loss.rec},
                         source=m.text("source"))


@dataclass(frozen=True, kw_only=True, slots=True)
class DataParallelRuntime:
    """Single-process ``torch.nn.DataParallel`` (``catalogs/runtime.yaml`` ``dataparallel``):
    bytes per parameter it broadcasts every forward and reduces onto GPU 0 every backward,
    bytes per logit of the outputs it gathers, and the fraction of an op's host dispatch that
    holds the GIL (an assumption, stated in the catalog)."""

    broadcast_bytes_per_param: float
    reduce_bytes_per_param: float
    output_bytes_per_logit: float
    gil_held_fraction: float
    source: str = ""


@functools.cache
def dataparallel_runtime() -> DataParallelRuntime:
    d = _doc().mapping("dataparallel")
    return DataParallelRuntime(broadcast_bytes_per_param=d.req("broadcast_bytes_per_param", positive=True),
                               reduce_bytes_per_param=d.req("reduce_bytes_per_param", positive=True),
                               output_bytes_per_logit=d.req("output_bytes_per_logit", positive=True),
                               gil_held_fraction=d.fraction("gil_held_fraction"), source=d.text("source"))
