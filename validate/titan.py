"""One rank of a plan, built the way torchtitan builds it, for PyTorch's memory tracker.

The decoder is torchtitan's Llama 3 (``torchtitan/models/llama/model.py`` at 9dec370, the
commit of its Dec 2024 H100 benchmarks): eager ``RMSNorm`` in fp32 (``x.float()`` normalised,
cast back, scaled), grouped-query attention with complex fp32 rotary embeddings,
``repeat_kv``, ``scaled_dot_product_attention``, a SwiGLU (or GeLU) MLP; MoE layers follow
torchtitan's token-choice MoE (a router ``Linear``, top-k, token dispatch by all-to-all over
the expert-parallel group, grouped experts as ``[E, h, f]`` weights, optional shared
experts).  ``build_rank`` applies, in torchtitan's order (``parallelize_llama``):

* the pipeline split of ``sim.layers.stages.stage_layers`` (embedding on the first stage, final norm
  and output on the last);
* tensor + sequence parallelism with ``parallelize_module`` (torchtitan's plan, loss parallel);
* activation checkpointing: ``full`` wraps each block; ``selective`` with the ``op`` policy
  keeps torchtitan's ``_save_list`` (every other ``mm`` output, the attention output, the
  ``abs``/``max`` of fp8 scaling); Megatron's partial ``block``/``uniform`` recomputation wraps
  the first ``N`` blocks or groups of ``N`` blocks;
* FSDP2 ``fully_shard`` over ``dp * cp`` with ``MixedPrecisionPolicy(bf16, fp32)`` (per block,
  the routed experts over the expert data-parallel group, then the root), resharding after
  forward except with pipelining and except the last block (torchtitan's policy); without
  FSDP the step runs under ``torch.autocast(bf16)`` with fp32 parameters (torchtitan's
  ``maybe_enable_amp``).

Context parallelism is represented by its per-rank shapes (``s / cp`` tokens of Q, K and V,
which is what torch's ring attention saves for backward; the all-gathered K/V chunks it
rotates are transient and left out).  Everything runs under ``FakeTensorMode`` on a fake
process group (``torch.testing._internal.distributed.fake_pg``): no memory is allocated, no
collective runs, shapes and lifetimes are exact.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

from sim.data.specs import Model, Strategy
from sim.layers.stages import stage_layers


class RMSNorm(nn.Module):
    """torchtitan's eager RMSNorm (fp32 statistics, output in the input's dtype)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return out * self.weight


def _rope(xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs[: xq_.shape[1]].view(1, xq_.shape[1], 1, xq_.shape[-1])
    return (torch.view_as_real(xq_ * f).flatten(3).type_as(xq), torch.view_as_real(xk_ * f).flatten(3).type_as(xk))


class Attention(nn.Module):
    def __init__(self, m: Model) -> None:
        super().__init__()
        h, d = m.hidden_size, m.dim_per_head
        self.head_dim, self.n_rep = d, m.num_attention_heads // m.kv_heads
        self.rope = m.uses_rope
        self.wq = nn.Linear(h, m.q_size, bias=False)
        self.wk = nn.Linear(h, m.kv_size, bias=False)
        self.wv = nn.Linear(h, m.kv_size, bias=False)
        self.wo = nn.Linear(m.q_size, h, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        xq = self.wq(x).view(b, s, -1, self.head_dim)
        xk = self.wk(x).view(b, s, -1, self.head_dim)
        xv = self.wv(x).view(b, s, -1, self.head_dim)
        if self.rope:
            xq, xk = _rope(xq, xk, freqs)
        if self.n_rep > 1:  # torchtitan's repeat_kv
            xk = xk.unsqueeze(3).expand(b, s, xk.shape[2], self.n_rep, self.head_dim).reshape(b, s, -1, self.head_dim)
            xv = xv.unsqueeze(3).expand(b, s, xv.shape[2], self.n_rep, self.head_dim).reshape(b, s, -1, self.head_dim)
        o = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, h: int, f: int, swiglu: bool) -> None:
        super().__init__()
        self.swiglu = swiglu
        self.w1 = nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)
        self.w3 = nn.Linear(h, f, bias=False) if swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class GroupedExperts(nn.Module):
    """``E`` local experts as ``[E, h, f]`` weights applied to equal token groups (torchtitan's
    grouped experts with the busiest rank's rows, padding-free)."""

    def __init__(self, num_local: int, h: int, f: int, swiglu: bool) -> None:
        super().__init__()
        self.swiglu = swiglu
        self.w1 = nn.Parameter(torch.empty(num_local, h, f))
        self.w2 = nn.Parameter(torch.empty(num_local, f, h))
        self.w3 = nn.Parameter(torch.empty(num_local, h, f)) if swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [E, rows, h]
        w1, w2 = self.w1, self.w2
        if self.w3 is not None:
            return torch.bmm(F.silu(torch.bmm(x, w1.to(x.dtype))) * torch.bmm(x, self.w3.to(x.dtype)), w2.to(x.dtype))
        return torch.bmm(F.gelu(torch.bmm(x, w1.to(x.dtype))), w2.to(x.dtype))


class MoE(nn.Module):
    """Token-choice MoE: router, top-k, dispatch (all-to-all over ``ep``), grouped experts,
    combine; ``imbalance``: the busiest rank's routed rows over the mean."""

    def __init__(self, m: Model, ep: int, ep_group, imbalance: float) -> None:
        super().__init__()
        spec = m.moe
        assert spec is not None
        h, f = m.hidden_size, spec.expert_ffn_hidden_size
        self.top_k, self.num_experts, self.ep, self.group = spec.top_k, spec.num_experts, ep, ep_group
        self.imbalance = imbalance
        self.router = nn.Linear(h, spec.num_experts, bias=False)
        self.experts = GroupedExperts(spec.num_experts // ep, h, f, m.ffn_type == "swiglu")
        self.shared = (FeedForward(h, f * spec.num_shared_experts, m.ffn_type == "swiglu")
                       if spec.num_shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        b, s, h = x.shape
        flat = x.reshape(-1, h)
        scores = F.softmax(self.router(flat).float(), dim=-1)
        weights, idx = torch.topk(scores, self.top_k, dim=-1)
        routed = flat.index_select(0, idx.reshape(-1))  # [tokens * k, h] (sorted by expert)
        rows = routed.shape[0]
        local = self.num_experts // self.ep
        busiest = int(round(rows * self.imbalance / local)) * local  # rows this rank's experts get
        if self.ep > 1:
            splits_in = [rows // self.ep] * self.ep
            splits_in[-1] += rows - sum(splits_in)
            splits_out = [busiest // self.ep] * self.ep
            splits_out[-1] += busiest - sum(splits_out)
            recv = all_to_all_single_autograd(routed, splits_out, splits_in, self.group)
        else:
            recv = routed if busiest == rows else routed.new_empty(busiest, h).copy_(
                routed.repeat(-(-busiest // rows), 1)[:busiest])
        out = self.experts(recv.view(local, -1, h)).reshape(-1, h)
        if self.ep > 1:
            back = all_to_all_single_autograd(out, splits_in, splits_out, self.group)
        else:
            back = out[:rows]
        combined = (back.view(-1, self.top_k, h) * weights.unsqueeze(-1).to(back.dtype)).sum(1)
        y = combined.view(b, s, h)
        return y + self.shared(x) if self.shared is not None else y


class Block(nn.Module):
    def __init__(self, m: Model, layer: int, ep: int, ep_group, imbalance: float) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(m.hidden_size)
        self.attention = Attention(m)
        self.ffn_norm = RMSNorm(m.hidden_size)
        self.moe_enabled = m.is_moe_layer(layer)
        self.feed_forward = (MoE(m, ep, ep_group, imbalance) if self.moe_enabled
                             else FeedForward(m.hidden_size, m.ffn_hidden_size, m.ffn_type == "swiglu"))

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))


class Stage(nn.Module):
    """One pipeline stage of the decoder (all of it without pipelining)."""

    def __init__(self, m: Model, layers: list[int], *, first: bool, last: bool, seq_len: int, ep: int = 1,
                 ep_group=None, imbalance: float = 1.0) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(m.vocab_size, m.hidden_size) if first else None
        self.layers = nn.ModuleDict({str(i): Block(m, i, ep, ep_group, imbalance) for i in layers})
        self.norm = RMSNorm(m.hidden_size) if last else None
        self.output = nn.Linear(m.hidden_size, m.vocab_size, bias=False) if last else None
        if self.output is not None and self.tok_embeddings is not None and m.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight  # tied (one matrix, sim.layers.stages)
        half = m.dim_per_head // 2
        self.register_buffer("freqs_cis", torch.empty(seq_len, half, dtype=torch.complex64), persistent=False)
        self.autocast = False  # bf16 autocast (no FSDP): torchtitan's maybe_enable_amp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
            for layer in self.layers.values():
                h = layer(h, self.freqs_cis)
            if self.norm is not None:
                h = self.norm(h)
            return self.output(h) if self.output is not None else h


# ------------------------------------------------------------------------ parallelisms

SAVE_LIST_NAMES = ("mm", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                   "_scaled_dot_product_flash_attention_for_cpu", "abs", "max")


def op_sac_save_list() -> set:
    """torchtitan's ``_save_list`` (parallelize_llama.py at 9dec370, lines 214-223) plus the
    CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``), the stand-in on this
    machine for the GPU's flash/efficient kernels torchtitan lists."""
    ops = torch.ops.aten
    out = {getattr(ops, n).default for n in SAVE_LIST_NAMES}
    out.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    return out


def _op_sac_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = op_sac_save_list()
    meta: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute_mm" if ctx.is_recompute else "forward_mm"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class _Group(nn.Module):
    """Consecutive blocks checkpointed as one unit (Megatron's uniform method)."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, freqs)
        return x


def apply_ac(stage: Stage, recompute: str, *, num_layers: int | None = None, method: str = "uniform") -> None:
    """Activation checkpointing as torchtitan's ``apply_ac`` (full: every block; selective:
    the op-level policy), and Megatron's partial recomputation (``block``: the first
    ``num_layers`` blocks; ``uniform``: groups of ``num_layers`` blocks checkpointed whole)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if recompute == "none":
        return
    names = list(stage.layers.keys())
    if recompute == "selective":
        for n in names:
            stage.layers[n] = checkpoint_wrapper(stage.layers[n], context_fn=_op_sac_context, preserve_rng_state=False)
        return
    n_rc = num_layers or 1
    if method == "block":
        for n in names[:n_rc]:
            stage.layers[n] = checkpoint_wrapper(stage.layers[n], preserve_rng_state=False)
        return
    groups = [names[i:i + n_rc] for i in range(0, len(names), n_rc)]
    new = nn.ModuleDict()
    for g in groups:
        new[g[0]] = checkpoint_wrapper(_Group([stage.layers[n] for n in g]), preserve_rng_state=False)
    stage.layers = new


def apply_tp(stage: Stage, tp_mesh) -> None:
    """torchtitan's ``apply_tp`` (tensor + sequence parallelism, loss parallel)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    top: dict[str, object] = {}
    if stage.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if stage.norm is not None:
        top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    if top:
        parallelize_module(stage, tp_mesh, top)
    for block in stage.layers.values():
        plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        }
        if not getattr(block, "moe_enabled", False):
            plan.update({"feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))})
            if block.feed_forward.w3 is not None:
                plan["feed_forward.w3"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)


def apply_fsdp(stage: Stage, dp_mesh, *, pipelined: bool, expert_mesh=None, experts_own_unit: bool = False) -> None:
    """torchtitan's FSDP2 wrapping (``apply_fsdp``; torchtitan/distributed/fsdp.py at HEAD): the
    embedding, the final norm with the output layer (never resharded after forward: FSDP would
    prefetch them again at once), each block as one unit (the last not resharded either), then
    the root; nothing is resharded after forward with pipelining.  An MoE block without expert
    parallelism is one unit like any other (every torchtitan version).  With expert parallelism
    (``expert_mesh``, the expert data-parallel mesh) the block is still one unit and its routed
    experts are sharded over that mesh by a per-parameter placement (``ShardPlacementResult``;
    torchtitan 18a46d4, 2026-03-26, "enable per-param mesh FSDP2 for MoE"); with
    ``experts_own_unit`` they are a unit of their own over it instead, as torchtitan wrapped them
    before that commit and Automodel does (``Plan.fsdp_experts_unit``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_common import ShardPlacementResult
    from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info
    from torch.distributed.tensor import Shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reshard = not pipelined
    tied = stage.tok_embeddings is not None and stage.output is not None \
        and stage.output.weight is stage.tok_embeddings.weight
    if tied:  # one unit for the tied matrix (torchtitan: fully_shard([tok_embeddings, norm, lm_head]))
        fully_shard([stage.tok_embeddings, stage.norm, stage.output], mesh=dp_mesh, mp_policy=mp,
                    reshard_after_forward=False)
    else:
        if stage.tok_embeddings is not None:
            fully_shard(stage.tok_embeddings, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
        if stage.norm is not None and stage.output is not None:
            fully_shard([stage.norm, stage.output], mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False)
    blocks = []
    for unit in stage.layers.values():  # blocks, also inside a checkpointed group (one FSDP unit each)
        inner = getattr(unit, "_checkpoint_wrapped_module", unit)
        blocks.extend(inner.blocks if isinstance(inner, _Group) else [unit])
    for i, block in enumerate(blocks):
        keep = reshard and i < len(blocks) - 1
        inner = getattr(block, "_checkpoint_wrapped_module", block)
        placement = None
        if getattr(inner, "moe_enabled", False) and expert_mesh is not None:
            if experts_own_unit:
                fully_shard(inner.feed_forward.experts, mesh=expert_mesh, mp_policy=mp, reshard_after_forward=keep)
            else:
                experts = set(inner.feed_forward.experts.parameters())
                on_edp, on_dp = _get_mesh_info(expert_mesh), _get_mesh_info(dp_mesh)

                def placement(param, experts=experts, on_edp=on_edp, on_dp=on_dp):  # noqa: ANN001, ANN202
                    return ShardPlacementResult(placement=Shard(0), mesh_info=on_edp if param in experts else on_dp)
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=keep, shard_placement_fn=placement)
    fully_shard(stage, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)


def reduced(model: Model, num_layers: int) -> Model:
    """``model`` with ``num_layers`` layers (memory per layer is exact; fewer layers run faster)."""
    moe = model.moe
    if moe is not None and moe.first_k_dense_layers > num_layers:
        moe = dataclasses.replace(moe, first_k_dense_layers=0)
    return dataclasses.replace(model, num_layers=num_layers, moe=moe)


def stage_of(model: Model, strategy: Strategy, stage: int) -> tuple[list[int], bool, bool]:
    layers = stage_layers(model, strategy)[stage]
    return layers, stage == 0, stage == strategy.pp - 1
