"""Rank placement (Megatron-LM order by default, or the strategy's ``order``), and the process
groups each parallel dimension forms.

Megatron-LM (``megatron/core/parallel_state.py``, ``RankGenerator`` with order ``tp-cp-ep-dp-pp``)
numbers ranks with tensor parallelism fastest-varying, then context parallelism, then data
parallelism, and pipeline parallelism slowest::

    rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))

Expert layers follow Megatron-Core's MoE parallel folding (``RankGenerator`` for experts with
order ``tp-ep-dp-pp``): within a pipeline stage the ``tp * cp * dp`` ranks are renumbered as
``etp_i + etp * (ep_i + ep * (edp_i))``, so an expert-tensor group (``etp``) is ``etp``
consecutive ranks, an expert-parallel group (``ep``) ``ep`` ranks of stride ``etp``, and an
expert-data-parallel group (``edp``, over which expert gradients are reduced) ``expert_dp``
ranks of stride ``etp * ep``.  With ``etp = tp`` and ``cp = 1`` this is Megatron's older rule
(EP carved out of consecutive data-parallel indices).  ``dp_cp`` is the combined data x context
group over which dense gradients are reduced when ``cp > 1``.

``Strategy.order`` (innermost first, a permutation of ``tp-cp-dp-pp``) generalises the rule:
each dimension's stride is the product of the sizes inside it, so ``pp-tp-cp-dp`` puts pipeline
stages on neighbouring GPUs and tensor parallelism across them.  Expert folding needs each
stage's ranks consecutive (pp outermost) and ``dp_cp`` needs cp right inside dp.

GPU index equals rank: ranks fill nodes in order, so ``node = rank // gpus_per_node`` and the
NVLink domain is ``rank // Cluster.scale_up_block`` (the job's GPUs per domain).  Every group of every dimension is therefore an
arithmetic progression ``base, base + stride, ..., base + (size - 1) * stride`` and the groups
of one dimension tile ``range(strategy.num_gpus)``; ``group_shape`` returns ``(stride, size)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sim.base.errors import InfeasibleError, InputError
from sim.data.specs import Strategy

DIMS: tuple[str, ...] = ("tp", "cp", "dp", "ep", "etp", "edp", "pp", "dp_cp", "dp_shard", "dp_replicate")


@dataclass(frozen=True, slots=True)
class RankCoords:
    """Position of one rank along each parallel dimension (0-based)."""

    tp: int
    cp: int
    dp: int
    pp: int


def _check_rank(strategy: Strategy, rank: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < strategy.num_gpus:
        raise InputError("rank", rank, f"must be an integer in [0, {strategy.num_gpus})")


def strides(strategy: Strategy) -> dict[str, int]:
    """Rank stride of each of tp, cp, dp, pp: the product of the sizes of the dimensions inside
    it in ``strategy.order`` (innermost first; default ``tp-cp-dp-pp``)."""
    out, step = {}, 1
    for dim in strategy.order.split("-"):
        out[dim] = step
        step *= getattr(strategy, dim)
    return out


def rank_to_coords(strategy: Strategy, rank: int) -> RankCoords:
    """Coordinates of global ``rank`` (by ``strategy.order``; default TP innermost, PP outermost)."""
    _check_rank(strategy, rank)
    st = strides(strategy)
    return RankCoords(**{d: (rank // st[d]) % getattr(strategy, d) for d in ("tp", "cp", "dp", "pp")})


def coords_to_rank(strategy: Strategy, coords: RankCoords) -> int:
    """Inverse of :func:`rank_to_coords`."""
    s, st = strategy, strides(strategy)
    for name, value, size in (("tp", coords.tp, s.tp), ("cp", coords.cp, s.cp),
                              ("dp", coords.dp, s.dp), ("pp", coords.pp, s.pp)):
        if not 0 <= value < size:
            raise InputError(f"coords.{name}", value, f"must be in [0, {size})")
    return sum(getattr(coords, d) * st[d] for d in ("tp", "cp", "dp", "pp"))


def stage_block(strategy: Strategy, stage: int):
    """The ranks of pipeline stage ``stage`` as an integer array of shape ``(dp, cp, tp)``."""
    import numpy as np

    s, st = strategy, strides(strategy)
    dp, cp, tp = np.ogrid[0:s.dp, 0:s.cp, 0:s.tp]
    return stage * st["pp"] + dp * st["dp"] + cp * st["cp"] + tp * st["tp"]


def group_shape(strategy: Strategy, dim: str) -> tuple[int, int]:
    """``(stride, size)`` of the arithmetic progression every ``dim`` group forms.

    Raises ``InfeasibleError(reason="indivisible")`` for ``etp * ep`` that does not divide the
    stage's ``tp * cp * dp`` ranks.
    """
    s = strategy
    st = strides(s)
    if dim in ("tp", "cp", "dp", "pp"):
        return st[dim], getattr(s, dim)
    if dim in ("ep", "etp", "edp"):
        ranks = s.tp * s.cp * s.dp
        if ranks % (s.expert_tp * s.ep):
            raise InfeasibleError("indivisible", "ep", s.ep,
                                  f"etp*ep = {s.expert_tp}*{s.ep} must divide tp*cp*dp = {ranks}")
        if s.pp > 1 and st["pp"] != ranks:
            raise InfeasibleError("unsupported", "order", s.order, "expert parallel folding renumbers each pipeline "
                                  "stage's consecutive ranks: pp must be outermost")
        if dim == "etp":
            return 1, s.expert_tp
        if dim == "ep":
            return s.expert_tp, s.ep
        return s.expert_tp * s.ep, s.expert_dp
    if dim == "dp_cp":
        return (st["cp"], s.cp * s.dp) if s.cp > 1 else (st["dp"], s.dp)
    if dim == "dp_shard":  # HSDP: consecutive data-parallel indices share one shard of the states
        return st["dp"], s.zero_shard // s.cp
    if dim == "dp_replicate":  # ... and the shard groups replicate over the rest
        return st["dp"] * (s.zero_shard // s.cp), s.dp * s.cp // s.zero_shard
    raise InputError("dim", dim, f"must be one of {', '.join(DIMS)}")


def group_ranks(strategy: Strategy, dim: str, *, rank: int = 0) -> tuple[int, ...]:
    """Ranks of the ``dim`` group that contains ``rank``, in ring order (ascending)."""
    stride, size = group_shape(strategy, dim)
    _check_rank(strategy, rank)
    base = rank - ((rank // stride) % size) * stride
    return tuple(range(base, base + stride * size, stride))


@lru_cache(maxsize=512)
def _all_groups(num_gpus: int, stride: int, size: int) -> tuple[tuple[int, ...], ...]:
    span = stride * size
    return tuple(tuple(range(block + off, block + span, stride))
                 for block in range(0, num_gpus, span) for off in range(stride))


def all_groups(strategy: Strategy, dim: str) -> list[tuple[int, ...]]:
    """Every ``dim`` group of ``strategy`` (they partition the ranks), sorted by first rank."""
    stride, size = group_shape(strategy, dim)
    return list(_all_groups(strategy.num_gpus, stride, size))


def pipeline_pairs(strategy: Strategy) -> list[tuple[int, int]]:
    """``(src, dst)`` of every forward pipeline send: stage ``i`` to stage ``i + 1``."""
    stride, size = group_shape(strategy, "pp")
    return [(r, r + stride) for r in range(stride * (size - 1))]
