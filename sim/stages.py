"""Pipeline stages: which layers each stage holds, its parameters, and stages that cost the same.

``stage_layers`` splits the layers over ``pp`` stages (even; a remainder goes to the middle
stages first, since the first stage also holds the embedding and the last the output layer
and loss).  ``stage_params`` counts the parameters one GPU of a stage holds, split by how
they shard.  ``stage_shapes`` groups stages that cost the same (same number of layers and MoE
layers, same first/last role): the step's composition (``sim.step``) and the memory model
(``sim.memory``) evaluate one representative per shape, weighted by how many stages have it.
The representative is the shape's first stage, which ends its last backward latest and holds
the most in-flight micro-batches, so it bounds the others of its shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.specs import Model, Strategy


@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters held by one GPU of a pipeline stage, split by how they are sharded."""

    dense_params: float  # sharded by TP, replicated over DP (ZeRO shards states over dp*cp)
    expert_params: float  # sharded by etp and ep, replicated over the expert data parallelism

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

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers


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
    """Layer indices per pipeline stage (module docstring)."""
    counts = stage_layer_counts(model.num_layers, strategy.pp)
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
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
    if first:
        dense += model.embedding_params / tp
    if last:
        dense += model.hidden_size
        if not model.tied_embeddings or strategy.pp > 1:
            # a tied output layer on another stage keeps its own copy (Megatron)
            dense += model.embedding_params / tp
    return StageParams(dense, expert)


def stage_shapes(model: Model, strategy: Strategy) -> tuple[StageShape, ...]:
    """The distinct stage shapes of ``strategy``'s pipeline, in order of their first stage."""
    return _shapes(model, strategy.tp, strategy.ep, strategy.expert_tp, strategy.pp)


@functools.lru_cache(maxsize=4096)
def _shapes(model: Model, tp: int, ep: int, etp: int, pp: int) -> tuple[StageShape, ...]:
    s = Strategy(tp=tp, ep=ep, etp=etp, pp=pp, dp=ep * etp, gbs=ep * etp)
    layers = stage_layers(model, s)
    sigs: list[tuple[int, int, bool, bool]] = []
    of_stage: list[int] = []
    for i, ls in enumerate(layers):
        sig = (len(ls), sum(model.is_moe_layer(j) for j in ls), i == 0, i == pp - 1)
        if sig not in sigs:
            sigs.append(sig)
        of_stage.append(sigs.index(sig))
    out = []
    for c, (_, n_moe, first, last) in enumerate(sigs):
        idx = of_stage.index(c)
        out.append(StageShape(index=idx, count=of_stage.count(c), layers=tuple(layers[idx]), num_moe_layers=n_moe,
                              first=first, last=last,
                              params=stage_params(model, s, layers[idx], first=first, last=last),
                              before=tuple(of_stage[:idx].count(k) for k in range(len(sigs)))))
    return tuple(out)
