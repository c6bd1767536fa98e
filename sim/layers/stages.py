"""Pipeline stages: which layers each stage holds, its parameters, and stages that cost the same.

``stage_layers`` splits the layers over ``pp`` stages (even; a remainder goes to the middle
stages first, since the first stage also holds the embedding and the last the output layer
and loss), or as the strategy's ``pipeline_layout`` says (``sim.data.layout``: then
``stage_chunks`` gives every model chunk's layers and each ``StageShape`` its chunks).  ``stage_params`` counts the parameters one GPU of a stage holds, split by how
they shard.  ``stage_shapes`` groups stages that cost the same (same number of layers and MoE
layers, same first/last role): the step's composition (``sim.cost.step``) and the memory model
(``sim.cost.memory``) evaluate one representative per shape, weighted by how many stages have it.
The representative is the shape's first stage, which ends its last backward latest and holds
the most in-flight micro-batches, so it bounds the others of its shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.data.layout import chunk_layer_ids
from sim.data.specs import Model, Strategy


@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters held by one GPU of a pipeline stage, split by how they are sharded."""

    dense_params: float  # sharded by TP, replicated over DP (ZeRO shards states over dp*cp)
    expert_params: float  # sharded by etp and ep, replicated over the expert data parallelism
    # of dense_params, the input embedding's on the first stage (stage_embedding_params: the
    # vocabulary shard and a learned position table)
    embedding_params: float = 0.0

    @property
    def total(self) -> float:
        return self.dense_params + self.expert_params


@dataclass(frozen=True, slots=True)
class StageShape:
    """Pipeline stages that cost the same (module docstring)."""

    index: int  # the first stage with this shape
    count: int  # how many stages have it
    layers: tuple[int, ...]  # layer indices of stage ``index``
    num_moe_layers: int
    first: bool
    last: bool
    params: StageParams
    # stages of each shape (in shape order) before stage ``index``: its last backward ends
    # that many backward passes before the pipeline's
    before: tuple[int, ...]
    # with a pipeline layout: (dense, MoE) decoder layers of each model chunk, in chunk order
    # (the embedding sits in the first stage's chunk 0, the loss in the last stage's last chunk);
    # None: the stage's layers split evenly over its chunks
    chunks: tuple[tuple[int, int], ...] | None = None
    stages: tuple[int, ...] = ()  # every stage of this shape

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers


def stage_chunks(strategy: Strategy) -> list[list[list[int]]] | None:
    """``[stage][chunk]`` layer indices of the strategy's pipeline layout, or ``None`` without one."""
    if strategy.pipeline_layout is None:
        return None
    return chunk_layer_ids(strategy.pipeline_layout, strategy.pp)


def model_chunks(model: Model, strategy: Strategy) -> list[list[list[int]]] | None:
    """``stage_chunks`` with the model's multi-token-prediction layers (numbered after the
    decoder layers) in the last stage's last chunk, where Megatron-Core builds them (the
    layout's ``m`` marks are checked by ``sim.data.layout``, the model says how many are priced)."""
    chunks = stage_chunks(strategy)
    if chunks is not None and model.mtp_layers:
        chunks = [[list(c) for c in row] for row in chunks]
        chunks[-1][-1].extend(range(model.num_layers, model.num_layers + model.mtp_layers))
    return chunks


def stage_layer_counts(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage (module docstring), in O(pp): the remainder of
    ``num_layers / pp`` goes to the middle stages first."""
    base, extra = divmod(num_layers, pp)
    order = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    counts = [base] * pp
    for i in order[:extra]:
        counts[i] += 1
    return counts


def stage_layers(model: Model, strategy: Strategy) -> list[list[int]]:
    """Layer indices per pipeline stage (module docstring).  Multi-token-prediction layers
    (``model.mtp_layers``) are numbered after the decoder layers and sit on the last stage with
    the loss (Megatron-Core builds them on the rank of the last decoder layer, in its last model
    chunk: ``mtp_on_this_rank``), each of the decoder's last layer kind (``Model.is_moe_layer``)."""
    chunks = model_chunks(model, strategy)
    if chunks is not None:
        return [[j for chunk in row for j in chunk] for row in chunks]
    counts = stage_layer_counts(model.num_layers, strategy.pp)
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
    out[-1].extend(range(model.num_layers, model.num_layers + model.mtp_layers))
    return out


def layer_params(model: Model, strategy: Strategy, *, moe: bool) -> StageParams:
    """Parameters of one transformer layer on one GPU: attention and norms sharded by TP; a
    dense FFN by TP; an MoE layer's routed experts by etp and ep (``Strategy.expert_tp``), its
    shared experts by TP, its router replicated."""
    tp, ep = strategy.tp, strategy.ep
    dense = model.attention_params / tp + model.norm_params_per_layer
    if not moe:
        return StageParams(dense + model.dense_ffn_params / tp, 0.0)
    spec = model.moe
    assert spec is not None
    dense += spec.num_shared_experts * model.expert_params / tp + model.hidden_size * spec.num_experts
    return StageParams(dense, spec.num_experts * model.expert_params / (strategy.expert_tp * ep))


def position_embedding_params(model: Model, strategy: Strategy) -> float:
    """A learned absolute position table's parameters (``Model.uses_rope`` false): Megatron-LM's
    ``LanguageModelEmbedding`` keeps ``torch.nn.Embedding(max_position_embeddings, hidden)``,
    replicated over tensor parallelism, on the first stage (core_v0.6.0
    megatron/core/models/common/embeddings/language_model_embedding.py); its rows are the
    model's maximum sequence length, at least the trained one.  None with rotary embeddings."""
    if model.uses_rope:
        return 0.0
    return float(max(model.max_seq_len or 0, strategy.seq_len) * model.hidden_size)


def trained_params(model: Model, strategy: Strategy) -> float:
    """Every parameter a run trains: ``Model.num_params`` and a learned position table, whose size
    depends on the trained sequence (``position_embedding_params``)."""
    return model.num_params + position_embedding_params(model, strategy)


def stage_embedding_params(model: Model, strategy: Strategy, first: bool) -> float:
    """The input embedding's parameters on one GPU of a stage: the vocabulary-parallel shard and
    a learned position table on the first stage, none elsewhere (as ``stage_params`` counts them)."""
    return model.embedding_params / strategy.tp + position_embedding_params(model, strategy) if first else 0.0


def stage_params(model: Model, strategy: Strategy, layers: list[int] | tuple[int, ...], *, first: bool,
                 last: bool) -> StageParams:
    """Parameters of one GPU of a stage holding ``layers`` (and the embedding when ``first``,
    the final norm and output layer when ``last``)."""
    tp = strategy.tp
    per = {moe: layer_params(model, strategy, moe=moe) for moe in {model.is_moe_layer(i) for i in layers}}
    dense = 0.0
    expert = 0.0
    for i in layers:
        p = per[model.is_moe_layer(i)]
        dense += p.dense_params
        expert += p.expert_params
    embedding = stage_embedding_params(model, strategy, first)
    dense += embedding
    if last:
        dense += model.hidden_size
        if not model.tied_embeddings or strategy.pp > 1:
            # a tied output layer on another stage keeps its own copy (Megatron)
            dense += model.embedding_params / tp
        if model.mtp_layers:
            # per depth: eh_proj (2h x h, column-parallel) and enorm, hnorm, final norm; the
            # output layer is shared; the embedding is built on the MTP rank too (GPTModel:
            # pre_process or mtp_process)
            h = model.hidden_size
            dense += model.mtp_layers * (2 * h * h / tp + 3 * h)
            if not first:
                dense += model.embedding_params / tp
    return StageParams(dense, expert, embedding)


def stage_shapes(model: Model, strategy: Strategy) -> tuple[StageShape, ...]:
    """The distinct stage shapes of ``strategy``'s pipeline, in order of their first stage."""
    # the sequence length sizes a learned position table (position_embedding_params); none with RoPE
    seq_len = 0 if model.uses_rope else strategy.seq_len
    return _shapes(model, strategy.tp, strategy.ep, strategy.expert_tp, strategy.pp, strategy.pipeline_layout, seq_len)


def chunk_signature(model: Model, chunks: list[list[int]]) -> tuple[tuple[int, int], ...]:
    """(dense, MoE) layer counts of each chunk."""
    return tuple((len(c) - sum(model.is_moe_layer(j) for j in c), sum(model.is_moe_layer(j) for j in c))
                 for c in chunks)


@functools.lru_cache(maxsize=4096)
def _shapes(model: Model, tp: int, ep: int, etp: int, pp: int,
            layout: tuple[str, ...] | None = None, seq_len: int = 0) -> tuple[StageShape, ...]:
    vp = 1 if layout is None else len(layout) // pp
    s = Strategy(tp=tp, ep=ep, etp=etp, pp=pp, dp=ep * etp, gbs=ep * etp, vp=vp,
                 schedule="interleaved" if vp > 1 else "1f1b", pipeline_layout=layout, **({"seq_len": seq_len} if seq_len else {}))
    layers = stage_layers(model, s)
    per_chunk = model_chunks(model, s)
    sigs: list[tuple] = []
    of_stage: list[int] = []
    for i, ls in enumerate(layers):
        chunks = chunk_signature(model, per_chunk[i]) if per_chunk is not None else None
        sig = (len(ls), sum(model.is_moe_layer(j) for j in ls), i == 0, i == pp - 1, chunks)
        if sig not in sigs:
            sigs.append(sig)
        of_stage.append(sigs.index(sig))
    out = []
    for c, (_, n_moe, first, last, chunks) in enumerate(sigs):
        idx = of_stage.index(c)
        out.append(StageShape(index=idx, count=of_stage.count(c), layers=tuple(layers[idx]), num_moe_layers=n_moe,
                              first=first, last=last,
                              params=stage_params(model, s, layers[idx], first=first, last=last),
                              before=tuple(of_stage[:idx].count(k) for k in range(len(sigs))), chunks=chunks,
                              stages=tuple(i for i, k in enumerate(of_stage) if k == c)))
    return tuple(out)


def stage_index_shapes(model: Model, strategy: Strategy) -> tuple[tuple[int, StageShape], ...]:
    """Every pipeline stage with its shape: ``(stage index, StageShape)`` (``stage_shapes``, the
    pipeline layout's chunks included)."""
    return tuple(sorted(((i, sh) for sh in stage_shapes(model, strategy) for i in sh.stages), key=lambda t: t[0]))


def parameter_tensors_per_layer(model: Model, *, moe: bool) -> int:
    """Parameter tensors of one layer as a Hugging Face / Megatron module holds them (what an
    engine that gathers parameter by parameter issues one collective for): GeLU (GPT) layers
    have biased QKV, projection and two MLP linears and two LayerNorms with bias (12 tensors);
    gated (Llama) layers q, k, v, o, gate, up, down and two RMSNorm weights (9); an MoE layer
    adds the router and ``2`` or ``3`` matrices per local expert (upper bound: every expert)."""
    gated = model.ffn_type == "swiglu"
    attn = 4  # q, k, v, o weights (gated) or the QKV and projection weights and biases (GeLU)
    norms = 2 if gated else 4
    mlp = 3 if gated else 4
    if moe and model.moe is not None:
        per_expert = 3 if gated else 2
        mlp = 1 + per_expert * (model.moe.num_experts + model.moe.num_shared_experts)
    return attn + norms + mlp


def stage_parameter_tensors(model: Model, shape: StageShape) -> int:
    """Parameter tensors of one stage (``parameter_tensors_per_layer`` over its layers, plus the
    embedding on the first stage and the final norm and output layer on the last)."""
    n = (shape.num_dense_layers * parameter_tensors_per_layer(model, moe=False)
         + shape.num_moe_layers * parameter_tensors_per_layer(model, moe=True))
    return n + (1 if shape.first else 0) + ((1 if model.tied_embeddings else 2) if shape.last else 0)
