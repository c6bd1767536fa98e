"""Framework runtime constants that are not properties of a GPU or a model (``catalogs/runtime.yaml``).

* ``CommRuntime``: bytes per parameter of the data-parallel collectives (fp32 gradient
  reduction, bf16 parameter gathers), of the optimizer step's memory-bound passes, of gradient
  accumulation outside the GEMM per framework mode, and of FSDP2's packing around its
  collectives (each with its source in the catalog);
* ``MemoryRuntime``: workspaces and caching-allocator slack added to every GPU's peak;
* ``DataParallelRuntime``: what single-process ``torch.nn.DataParallel`` moves and how much of
  its threads' dispatch the GIL serialises;
* ``ParameterServerRuntime``: what TensorFlow's ``ParameterServerStrategy`` moves per update
  (``sim.engines.parameter_server``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

import numpy as np

from sim.data.catalog import catalog_document
from sim.data.specs import RECOMPUTES
from sim.base.errors import InputError
from sim.base.records import Record

if TYPE_CHECKING:
    from sim.data.specs import Model, Strategy


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
    # optimizer implementation (frameworks.yaml ``optimizer``) -> HBM bytes per local parameter
    optimizer_bytes_per_param_by_impl: Mapping[str, float] = field(default_factory=dict)
    # DeepSpeed BF16_Optimizer: per step over its unsharded fp32 gradient buffer (norm + zeroing)
    bf16_optimizer_full_buffer_bytes_per_param: float = 0.0
    # 2021 DeepSpeed ZeRO-3: host time per rank of the group for every parameter tensor gathered
    zero3_host_per_rank_s: float = 0.0
    # bucketed gradient reduction (runtime.yaml grad_buckets): kind -> (min_params,
    # params_per_dp_rank, bytes); a bucket holds max(min_params, params_per_dp_rank x dp, bytes /
    # grad_reduce_bytes_per_param) parameters
    grad_buckets: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)

    def grad_bucket_params(self, kind: str, dp_size: int) -> float:
        """Parameters of one gradient bucket of a ``kind`` reducer (``GRAD_BUCKETS``) over ``dp_size``
        ranks (dp x cp); 0 for a kind without an entry."""
        got = self.grad_buckets.get(kind)
        if got is None:
            return 0.0
        min_params, per_rank, nbytes = got
        return max(min_params, per_rank * dp_size, nbytes / self.grad_reduce_bytes_per_param)

    def grad_accumulation_bytes(self, mode: str, microbatches):
        """Bytes per parameter per micro-batch, averaged over the step's micro-batches
        (``autograd`` has nothing to add into on the first one; ``keras`` accumulates only
        with more than one micro-batch); ``microbatches`` a number (a float back) or an array
        (the search's micro-batch axis)."""
        b = self.grad_accumulation_bytes_per_param.get(mode, 0.0)
        m = np.asarray(microbatches, dtype=float)
        if mode == "keras":
            out = np.where(m > 1, b, 0.0)
        else:
            out = b * (m - 1) / m if mode == "autograd" else b + 0.0 * m
        return float(out) if out.ndim == 0 else out

    def optimizer_bytes(self, impl: str, fp16: bool) -> float:
        """HBM bytes per local parameter of one optimizer step by implementation (``fused``:
        ``optimizer_bytes_per_param``), plus the fp16 loss-scale passes."""
        base = self.optimizer_bytes_per_param_by_impl.get(impl, self.optimizer_bytes_per_param)
        return base + (self.fp16_extra_bytes_per_param if fp16 else 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryRuntime:
    """Framework-level memory not tied to the model."""

    workspace_bytes: float  # cuBLAS/cuBLASLt workspaces held by the caching allocator
    # caching-allocator slack (peak reserved / peak allocated - 1) by allocator mode (ALLOCATORS)
    # and recomputation mode: the median over the replayed plans of runtime.yaml
    # memory.fragmentation (validate.fragmentation)
    fragmentation: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # one measured value for every mode (a calibration profile's memory.fragmentation_fraction)
    fragmentation_fraction: float | None = None
    fp8_weight_cache_bytes_per_param: float = 0.0  # fp8 weight + transpose cached for the step
    fp8_param_bytes_per_param: float = 1.0  # a linear weight kept in fp8 as the parameter (Strategy.fp8_params)
    loss_bytes_per_logit: Mapping[str, float] = field(default_factory=dict)  # by loss implementation
    loss_saved_bytes_per_logit: Mapping[str, float] = field(default_factory=dict)  # of which saved
    source: str = ""

    def fragmentation_of(self, allocator: str, full_recompute, selective):  # (str, Num, Num) -> Num
        """The allocator's slack as a fraction of the allocated peak, for ``allocator``
        (ALLOCATORS) and the recomputation mode (flags or arrays of the search)."""
        if self.fragmentation_fraction is not None:
            return self.fragmentation_fraction + 0.0 * np.asarray(full_recompute, dtype=float)
        t = self.fragmentation[allocator]
        return np.where(full_recompute, t["full"], np.where(selective, t["selective"], t["none"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class StateLayout:
    """How a framework keeps its model states (``catalogs/runtime.yaml`` ``model_states``)."""

    name: str
    weights_bytes_per_param: float
    gradient_bytes_per_param: float
    optimizer_bytes_per_param: float
    gathered_bytes_per_param: float
    persistent_gradients: bool
    # the optimizer step's flattened 16-bit gradient partition and its fp32 copy (DeepSpeed's ZeRO
    # engine), per sub-group of at most step_sub_group_params under ZeRO-3; 0: none
    step_flat_bytes_per_param: float = 0.0
    step_fp32_grad_bytes_per_param: float = 0.0
    step_sub_group_params: float = math.inf
    # bytes per parameter of the data-parallel gradient reduction when the layout fixes them
    # (its gradient buffer's dtype); 0: communication.grad_reduce_bytes_per_param
    grad_reduce_bytes_per_param: float = 0.0

    @property
    def fsdp2(self) -> bool:
        """PyTorch FSDP2 keeps these states (``FSDP2_LAYOUTS``): its gather, reshard and
        reduce-scatter rules apply (``sim.cost.memory.stage_memory``)."""
        return self.name in FSDP2_LAYOUTS

    @property
    def reduce_bytes_per_param(self) -> float:
        """Bytes per parameter of a gradient on its way to the reduction (the reduce-scatter
        input, FSDP2's unsharded accumulator): ``grad_reduce_bytes_per_param`` where the layout
        fixes it, else the gradient's own."""
        return self.grad_reduce_bytes_per_param or self.gradient_bytes_per_param


STATE_LAYOUTS: tuple[str, ...] = ("megatron", "megatron_bf16_grads", "megatron_remainders", "megatron_remainders_fp32_grads",
                                  "torch_amp", "torch_bf16", "deepspeed")
# PyTorch-native layouts (FSDP2 under ZeRO-2/3, DDP otherwise): mixed precision with fp32 master
# parameters (torch_amp) or bf16 parameters throughout (torch_bf16)
FSDP2_LAYOUTS: tuple[str, ...] = ("torch_amp", "torch_bf16")


@functools.cache
def state_layout(name: str) -> StateLayout:
    layouts = _doc().mapping("model_states").mapping("layouts")
    r = layouts.mapping(name)
    return StateLayout(name=name, weights_bytes_per_param=r.req("weights_bytes_per_param", positive=True),
                       gradient_bytes_per_param=r.req("gradient_bytes_per_param", positive=True),
                       optimizer_bytes_per_param=r.req("optimizer_bytes_per_param", positive=True),
                       gathered_bytes_per_param=r.req("gathered_bytes_per_param", positive=True),
                       persistent_gradients=r.flag("persistent_gradients"),
                       step_flat_bytes_per_param=r.number("step_flat_bytes_per_param", optional=True, default=0.0),
                       step_fp32_grad_bytes_per_param=r.number("step_fp32_grad_bytes_per_param", optional=True,
                                                               default=0.0),
                       step_sub_group_params=r.number("step_sub_group_params", optional=True, default=math.inf),
                       grad_reduce_bytes_per_param=r.number("grad_reduce_bytes_per_param", optional=True,
                                                            default=0.0))


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceMemory:
    """What device-level memory (nvidia-smi) holds beyond PyTorch's reserved pool."""

    cuda_context_bytes: float
    nccl_ring_bytes_per_communicator: float
    nccl_p2p_bytes_per_peer: float
    alltoall: "AllToAllBuffers"  # with runtime.yaml's nccl_bytes_per_alltoall_peer
    deepep: "DeepEPBuffers"


@dataclass(frozen=True, kw_only=True, slots=True)
class AllToAllBuffers:
    """NCCL's buffers for an all-to-all over a group (``catalogs/runtime.yaml``
    device_memory.alltoall): NVLink peers at ``bytes_per_peer`` (measured with
    ``nvlink_channels_per_peer`` channels each) while the whole group is NVLink-connected; once
    a peer is across the network (or the local peers have no NVLink) every peer gets
    ``net_channels_per_peer`` channels (``ncclTopoComputeP2pChannels`` takes the minimum over
    the group) and the network peers share one pool of ``net_shared_bytes``."""

    bytes_per_peer: float
    nvlink_channels_per_peer: int
    net_channels_per_peer: int
    net_shared_bytes: float

    def group_bytes(self, group: int, local: int, *, nvlink: bool) -> float:
        """Bytes per GPU for an all-to-all over ``group`` ranks, ``local`` of them (itself
        included) in its NVLink domain; ``nvlink``: those are NVLink-connected."""
        if group <= 1:
            return 0.0
        if nvlink and local >= group:
            return (group - 1) * self.bytes_per_peer
        per_channel = self.bytes_per_peer / self.nvlink_channels_per_peer
        return (local - 1) * self.net_channels_per_peer * per_channel + (self.net_shared_bytes if local < group else 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeepEPBuffers:
    """DeepEP's dispatch/combine buffers (``catalogs/runtime.yaml`` device_memory.deepep):
    ``deep_ep.Config.get_nvl_buffer_size_hint`` + ``get_rdma_buffer_size_hint`` for a group."""

    num_sms: int
    nvl_peers: int
    nvl_bytes_per_token_extra: float
    rdma_bytes_per_token_extra: float
    recv_tokens: Mapping[int, tuple[int, int]]  # group size -> (NVLink, RDMA) receive tokens per channel

    def group_bytes(self, group: int, hidden_bytes: float) -> float:
        """Bytes per GPU for a DeepEP buffer over ``group`` ranks with tokens of ``hidden_bytes``
        (DeepEP supports the tabled group sizes; another size is priced as the next tabled one)."""
        if group <= 1:
            return 0.0
        sizes = sorted(self.recv_tokens)
        group = next((n for n in sizes if n >= group), sizes[-1])
        nvl_tok, rdma_tok = self.recv_tokens[group]
        channels = self.num_sms // 2
        nvl_ranks = min(group, self.nvl_peers)
        out = channels * nvl_ranks * nvl_tok * (hidden_bytes + self.nvl_bytes_per_token_extra)
        if group > self.nvl_peers:
            rdma_ranks = group // self.nvl_peers
            out += channels * rdma_ranks * rdma_tok * 2 * (hidden_bytes + self.rdma_bytes_per_token_extra)
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class NvlsBuffers:
    """NCCL's NVLink SHARP buffers of one communicator under one NCCL release on one GPU
    architecture (``catalogs/runtime.yaml`` device_memory.nvls_by_release): ``channels x
    bytes_per_channel_per_head`` per NVLS head, one head per GPU of the group in the NVLink
    domain, at most ``max_heads`` (``NCCL_MAX_NVLS_ARITY``); ``channels_one_domain`` for a group
    that stays inside one domain; none for a group across domains unless ``across_domains``."""

    channels: int
    channels_one_domain: int
    bytes_per_channel_per_head: float
    max_heads: int
    across_domains: bool
    nccl: str  # the release whose rule this is

    def group_bytes(self, local_gpus: int, group_gpus: int | None = None) -> float:
        """Bytes per GPU for a group of ``group_gpus`` GPUs (default: all inside the domain)
        with ``local_gpus`` of them in one NVLink domain (none for two or fewer:
        ``ncclNvlsInit``)."""
        spans = group_gpus is not None and group_gpus > local_gpus
        if local_gpus <= 2 or (spans and not self.across_domains):
            return 0.0
        channels = self.channels if spans else self.channels_one_domain
        return channels * self.bytes_per_channel_per_head * min(local_gpus, self.max_heads)


_NCCL_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:-\d+)?$")


def nccl_version(release: str) -> tuple[int, int]:
    """(major, minor) of an NCCL release written ``2.20``, ``2.20.3`` or ``2.20.3-1``;
    ``InputError`` (field ``nccl``) for anything else."""
    m = _NCCL_RELEASE.match(str(release).strip())
    if m is None:
        raise InputError("nccl", release, "must be an NCCL release such as 2.21 or 2.21.5")
    return int(m.group(1)), int(m.group(2))


def default_nccl_release(architecture: str | None) -> str | None:
    """The NCCL release a plan on this GPU architecture assumes when none is given
    (``catalogs/runtime.yaml`` device_memory.nccl_release_by_architecture); None where the
    catalog states none (no NVLS there)."""
    table = _doc().mapping("device_memory").mapping("nccl_release_by_architecture")
    return str(table.rec[architecture]) if architecture in table.rec else None


def _doc() -> Record:
    return Record(catalog_document("runtime.yaml"), where="runtime", file="runtime.yaml")


@functools.cache
def default_comm_runtime() -> CommRuntime:
    doc = _doc()
    c, o = doc.mapping("communication"), doc.mapping("optimizer")
    acc = doc.mapping("grad_accumulation").mapping("bytes_per_param")
    copies = doc.mapping("fsdp_copies")
    impl = o.mapping("bytes_per_param_by_impl")
    bf16 = doc.mapping("deepspeed_bf16_optimizer")
    return CommRuntime(grad_reduce_bytes_per_param=c.req("grad_reduce_bytes_per_param", positive=True),
                       param_gather_bytes_per_param=c.req("param_gather_bytes_per_param", positive=True),
                       optimizer_bytes_per_param=o.req("bytes_per_param", positive=True),
                       fp16_extra_bytes_per_param=o.req("fp16_extra_bytes_per_param"),
                       grad_accumulation_bytes_per_param={k: acc.req(k) for k in acc.rec},
                       fsdp_gather_copy_bytes_per_param=copies.req("all_gather_copy_out_bytes_per_param"),
                       fsdp_reduce_copy_bytes_per_param=copies.req("reduce_scatter_copy_in_bytes_per_param"),
                       optimizer_bytes_per_param_by_impl={k: impl.req(k, positive=True) for k in impl.rec},
                       bf16_optimizer_full_buffer_bytes_per_param=bf16.req("full_buffer_bytes_per_param"),
                       zero3_host_per_rank_s=doc.mapping("zero3_per_tensor_gather").req("host_per_rank_s"),
                       grad_buckets=_grad_buckets(doc.mapping("grad_buckets")))


def _grad_buckets(b: Record) -> dict[str, tuple[float, float, float]]:
    out = {}
    for kind in GRAD_BUCKETS:
        r = b.mapping(kind)
        out[kind] = tuple(float(r.number(k, optional=True, default=0.0))  # type: ignore[arg-type]
                          for k in ("min_params", "params_per_dp_rank", "bytes"))
        if max(out[kind]) <= 0:
            raise r.fail("min_params", "a bucket needs min_params, params_per_dp_rank or bytes > 0")
    return out


@functools.cache
def device_memory() -> DeviceMemory:
    d = _doc().mapping("device_memory")
    a = d.mapping("alltoall")
    return DeviceMemory(cuda_context_bytes=d.req("cuda_context_bytes"),
                        nccl_ring_bytes_per_communicator=d.req("nccl_ring_bytes_per_communicator"),
                        nccl_p2p_bytes_per_peer=d.req("nccl_p2p_bytes_per_peer"),
                        alltoall=AllToAllBuffers(bytes_per_peer=d.req("nccl_bytes_per_alltoall_peer"),
                                                 nvlink_channels_per_peer=int(a.req("nvlink_channels_per_peer",
                                                                                    positive=True)),
                                                 net_channels_per_peer=int(a.req("net_channels_per_peer",
                                                                                 positive=True)),
                                                 net_shared_bytes=a.req("net_shared_bytes")),
                        deepep=_deepep(d.mapping("deepep")))


def _deepep(e: Record) -> DeepEPBuffers:
    table = e.mapping("recv_tokens")
    recv: dict[int, tuple[int, int]] = {}
    for k in table.rec:
        v = table.rec[k]
        if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) and x > 0 for x in v)):
            raise table.fail(str(k), "must be [nvl_recv_tokens, rdma_recv_tokens], two positive integers")
        recv[int(k)] = (int(v[0]), int(v[1]))
    return DeepEPBuffers(num_sms=int(e.req("num_sms", positive=True)), nvl_peers=int(e.req("nvl_peers", positive=True)),
                         nvl_bytes_per_token_extra=e.req("nvl_bytes_per_token_extra"),
                         rdma_bytes_per_token_extra=e.req("rdma_bytes_per_token_extra"), recv_tokens=recv)


@functools.cache
def _nvls_rules() -> tuple[tuple[tuple[int, int], str, Record], ...]:
    """runtime.yaml device_memory.nvls_by_release, oldest first: (version, release, rule)."""
    n = _doc().mapping("device_memory").mapping("nvls_by_release")
    return tuple(sorted((nccl_version(k), str(k), n.mapping(k)) for k in n.rec))


def _rule_for(release: str) -> tuple[str, Record] | None:
    """(the release it holds from, the rule) in force for ``release``; None before the first."""
    version = nccl_version(release)
    rules = [(since, rule) for v, since, rule in _nvls_rules() if v <= version]
    return rules[-1] if rules else None


def nvls_across_domains(release: str) -> bool:
    """Whether NCCL ``release`` sets NVLS up for a communicator spanning NVLink domains (2.20
    does not); a release older than the catalog's rules restricts nothing here (on an NVLS GPU
    ``nvls_buffers`` refuses it)."""
    found = _rule_for(release)
    return found is None or found[1].flag("across_domains", default=True)


def _by_architecture(rule: Record, key: str, architecture: str) -> int | None:
    v = rule.rec.get(key)
    if isinstance(v, Mapping):
        v = v.get(architecture)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise rule.fail(key, f"must be a positive integer or one per GPU architecture, not {v!r}")
    return v


@functools.cache
def nvls_buffers(architecture: str | None, *, multicast: bool, nccl: str = "") -> NvlsBuffers | None:
    """The NVLS buffers under NCCL release ``nccl`` ("" = the architecture's
    ``default_nccl_release``) on a GPU generation (``device_extra_bytes``' ``nvls``): None
    without multicast NVSwitch (``sim.net.netefficiency.nvls_gain`` empty).  A multicast GPU
    with no release given and none in the catalog, or a release older than the catalog's
    first rule, is an error naming what is known."""
    if not multicast:
        return None
    release = nccl or default_nccl_release(architecture)
    if release is None:
        known = ", ".join(sorted(_doc().mapping("device_memory").mapping("nccl_release_by_architecture").rec))
        raise InputError("nccl", "", f"runtime.yaml nccl_release_by_architecture has no NCCL release for GPU "
                                     f"architecture {architecture!r} (known: {known}); give one with --nccl")
    found = _rule_for(release)
    if found is None:
        raise InputError("nccl", release, f"the catalog's NVLS rules start at NCCL {_nvls_rules()[0][1]} "
                                          "(runtime.yaml nvls_by_release)")
    since, rule = found
    channels = _by_architecture(rule, "channels", str(architecture))
    if channels is None:
        raise rule.fail("channels", f"has no channel count for GPU architecture {architecture!r}")
    one_domain = _by_architecture(rule, "channels_one_domain", str(architecture)) or channels
    return NvlsBuffers(channels=channels, channels_one_domain=one_domain,
                       bytes_per_channel_per_head=rule.req("bytes_per_channel_per_head", positive=True),
                       max_heads=int(rule.req("max_heads", positive=True)),
                       across_domains=nvls_across_domains(release), nccl=since)


def group_local_ranks(dims: "tuple[tuple[int, int], ...]", domain_gpus: int) -> int:
    """GPUs of rank 0's process group inside its NVLink domain of ``domain_gpus`` consecutive
    ranks, the group spanning ``dims`` = ((size, stride), ...) of the rank grid (Megatron's
    order: tp fastest, then cp, dp, pp)."""
    ranks = [0]
    for size, stride in dims:
        if size > 1:
            ranks = [r + i * stride for r in ranks for i in range(size) if r + i * stride < domain_gpus]
    return len(ranks)


def device_extra_bytes(strategy: "Strategy", model: "Model", *, megatron_groups: bool = False,
                       nvls: NvlsBuffers | None = None, domain_gpus: int = 1, nvlink: bool = True,
                       dispatcher: str = "alltoall") -> float:
    """What ``nvidia-smi`` shows beyond PyTorch's reserved pool: the CUDA context and the NCCL
    buffers of every communicator the rank uses (``catalogs/runtime.yaml``): ring
    communicators for tp, cp, the data-parallel gradient group and (MoE) the expert
    data-parallel group, every peer of the expert all-to-all, and the pipeline neighbours.

    ``megatron_groups``: Megatron's ``parallel_state`` also runs collectives, each on its own
    communicator (NCCL buffers are per communicator, NVIDIA/nccl issue #986), on the
    data-parallel group without context parallelism (the loss reported per step,
    ``average_losses_across_data_parallel_group``, core_v0.6.0 megatron/training/utils.py line
    100, a ``new_group`` apart from the dp-cp group that reduces gradients, parallel_state.py
    lines 289-300), on the model-parallel group tp x pp (the gradient norm of
    ``clip_grad_norm_fp32``, core/optimizer/clip_grads.py line 98) and on the default group
    (training.py line 208); groups of one rank are not counted.

    ``nvls``: the NVLS buffers of the GPUs' NCCL release where their NVSwitch supports NVLink
    SHARP (``nvls_buffers``; None without multicast, ``sim.net.netefficiency.nvls_gain``): every
    communicator with more than two GPUs in one NVLink domain of ``domain_gpus`` also holds
    them, per GPU of the group in the domain up to NCCL's head limit, a group across domains
    only where the release sets NVLS up there (``NvlsBuffers.group_bytes``;
    ``catalogs/runtime.yaml`` nvls_by_release).  Expert-parallel groups are not counted
    (MoE rows are priced by their ring and all-to-all buffers only).

    The expert-parallel group (ranks ``expert_tp`` apart, Megatron's expert grid) holds the
    buffers of its MoE ``dispatcher``: a ring communicator (``allgather``), NCCL's all-to-all
    connections (``AllToAllBuffers``: every NVLink peer at the measured per-peer bytes inside one
    domain, 2 channels per peer and a shared network pool once the group leaves it; ``nvlink``:
    the domain's GPUs are NVLink-connected, not a PCIe node), or DeepEP's own buffers
    (``DeepEPBuffers``, bf16 tokens of the hidden size)."""
    s, d = strategy, device_memory()
    groups = [((s.tp, 1),), ((s.cp, s.tp),), ((s.cp, s.tp), (s.dp, s.tp * s.cp))]
    if megatron_groups:
        groups += [((s.dp, s.tp * s.cp),), ((s.tp, 1), (s.pp, s.tp * s.cp * s.dp)),
                   ((s.tp, 1), (s.cp, s.tp), (s.dp, s.tp * s.cp), (s.pp, s.tp * s.cp * s.dp))]
    groups = [g for g in groups if math.prod(n for n, _ in g) > 1]
    rings = len(groups)
    nvls_bytes = 0.0
    if nvls is not None:
        for g in groups:
            nvls_bytes += nvls.group_bytes(group_local_ranks(g, domain_gpus), math.prod(n for n, _ in g))
    if model.moe is not None:
        rings += s.expert_dp > 1 and s.expert_dp != s.dp * s.cp
        if s.expert_tp != s.tp:
            rings += s.expert_tp > 1
    nccl = rings * d.nccl_ring_bytes_per_communicator
    if s.ep > 1 and dispatcher == "deepep":  # bf16 tokens: fused_a2a.get_hidden_bytes = hidden x max(itemsize, 2)
        nccl += d.deepep.group_bytes(s.ep, 2 * model.hidden_size)
    elif s.ep > 1 and dispatcher == "allgather":  # all-gather and reduce-scatter on a ring communicator
        nccl += d.nccl_ring_bytes_per_communicator
    elif s.ep > 1:
        local = group_local_ranks(((s.ep, s.expert_tp),), domain_gpus)
        nccl += d.alltoall.group_bytes(s.ep, local, nvlink=nvlink)
    if s.pp > 1:
        nccl += 2 * d.nccl_p2p_bytes_per_peer
    return d.cuda_context_bytes + nccl + nvls_bytes


# bucketed gradient reducers (runtime.yaml grad_buckets; a framework's grad_buckets, Plan.grad_buckets)
GRAD_BUCKETS: tuple[str, ...] = ("megatron", "megatron_per_tensor", "ddp", "deepspeed")
ALLOCATORS: tuple[str, ...] = ("caching", "expandable_segments")  # PYTORCH_CUDA_ALLOC_CONF modes


def _fragmentation(f: Record) -> dict[str, dict[str, float]]:
    """Median fragmentation per allocator and recomputation mode over the replayed plans."""
    table: dict[str, dict[str, list[float]]] = {a: {r: [] for r in RECOMPUTES} for a in ALLOCATORS}
    plans = f.rec.get("plans")
    if not isinstance(plans, (list, tuple)) or not plans:
        raise f.fail("plans", "must be a non-empty list of replayed plans")
    for i, raw in enumerate(plans):
        row = Record(raw, where=f"memory.fragmentation.plans[{i}]", file="runtime.yaml",
                     allowed=("strategy", "recompute") + ALLOCATORS)
        mode = row.text("recompute", choices=RECOMPUTES)
        for a in ALLOCATORS:
            table[a][mode].append(row.fraction(a))
    for a in ALLOCATORS:
        for r in RECOMPUTES:
            if not table[a][r]:
                raise f.fail("plans", f"no replayed plan with recompute={r}")
    return {a: {r: float(np.median(v)) for r, v in modes.items()} for a, modes in table.items()}


@functools.cache
def default_runtime() -> MemoryRuntime:
    doc = _doc()
    m, loss = doc.mapping("memory"), doc.mapping("loss").mapping("bytes_per_logit")
    saved = doc.mapping("loss").mapping("saved_bytes_per_logit")
    return MemoryRuntime(workspace_bytes=m.req("workspace_bytes"),
                         fragmentation=_fragmentation(m.mapping("fragmentation")),
                         fp8_weight_cache_bytes_per_param=m.req("fp8_weight_cache_bytes_per_param"),
                         fp8_param_bytes_per_param=m.req("fp8_param_bytes_per_param", positive=True),
                         loss_bytes_per_logit={k: loss.req(k, positive=True) for k in loss.rec},
                         loss_saved_bytes_per_logit={k: saved.req(k) for k in saved.rec},
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


@dataclass(frozen=True, kw_only=True, slots=True)
class ParameterServerRuntime:
    """TensorFlow ``ParameterServerStrategy`` (``catalogs/runtime.yaml`` ``parameter_server``):
    bytes per parameter pulled and pushed per update, the PS CPU's Adam traffic, a multi-GPU
    worker's host copies, the fraction of a NIC's line rate gRPC/TCP delivers (an assumption,
    stated in the catalog) and ``MinSizePartitioner``'s minimum shard."""

    pull_bytes_per_param: float
    push_bytes_per_param: float
    adam_bytes_per_param: float
    host_copy_bytes_per_param: float
    grpc_link_fraction: float
    min_shard_bytes: float
    ps_host_bytes_per_param: float
    source: str = ""


@functools.cache
def parameter_server_runtime() -> ParameterServerRuntime:
    d = _doc().mapping("parameter_server")
    return ParameterServerRuntime(pull_bytes_per_param=d.req("pull_bytes_per_param", positive=True),
                                  push_bytes_per_param=d.req("push_bytes_per_param", positive=True),
                                  adam_bytes_per_param=d.req("adam_bytes_per_param", positive=True),
                                  host_copy_bytes_per_param=d.req("host_copy_bytes_per_param", positive=True),
                                  grpc_link_fraction=d.fraction("grpc_link_fraction"),
                                  min_shard_bytes=d.req("min_shard_bytes", positive=True),
                                  ps_host_bytes_per_param=d.req("ps_host_bytes_per_param", positive=True),
                                  source=d.text("source"))
