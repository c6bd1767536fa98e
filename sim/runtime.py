"""Framework runtime constants that are not properties of a GPU or a model (``catalogs/runtime.yaml``).

* ``CommRuntime``: bytes per parameter of the data-parallel collectives (fp32 gradient
  reduction, bf16 parameter gathers), of the optimizer step's memory-bound passes, of gradient
  accumulation outside the GEMM per framework mode, and of FSDP2's packing around its
  collectives (each with its source in the catalog);
* ``MemoryRuntime``: workspaces and caching-allocator slack added to every GPU's peak.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping

from sim.catalog import catalog_document
from sim.records import Record


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
    source: str = ""


def _doc() -> Record:
    return Record(catalog_document("runtime.yaml"), where="runtime", file="runtime.yaml")


@functools.cache
def default_comm_runtime() -> CommRuntime:
    doc = _doc()
    c, o = doc.mapping("communication"), doc.mapping("optimizer")
    acc = doc.mapping("grad_accumulation").mapping("bytes_per_param")
    copies = doc.mapping("fsdp_copies")
    return CommRuntime(grad_reduce_bytes_per_param=c.req("grad_reduce_bytes_per_param", positive=True),
                       param_gather_bytes_per_param=c.req("param_gather_bytes_per_param", positive=True),
                       optimizer_bytes_per_param=o.req("bytes_per_param", positive=True),
                       fp16_extra_bytes_per_param=o.req("fp16_extra_bytes_per_param"),
                       grad_accumulation_bytes_per_param={k: acc.req(k) for k in acc.rec},
                       fsdp_gather_copy_bytes_per_param=copies.req("all_gather_copy_out_bytes_per_param"),
                       fsdp_reduce_copy_bytes_per_param=copies.req("reduce_scatter_copy_in_bytes_per_param"))


@functools.cache
def default_runtime() -> MemoryRuntime:
    m = _doc().mapping("memory")
    return MemoryRuntime(workspace_bytes=m.req("workspace_bytes"),
                         fragmentation_fraction=m.fraction("fragmentation_fraction"), source=m.text("source"))
