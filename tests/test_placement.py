"""Rank placement in Megatron order: TP innermost, then CP, DP (EP inside DP), PP outermost."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from sim.base.errors import InfeasibleError, InputError
from sim.net.placement import (DIMS, RankCoords, all_groups, coords_to_rank, group_ranks, group_shape,
                           pipeline_pairs, rank_to_coords)
from tests.topo_fixtures import make_strategy


def test_tp_is_innermost_and_pp_outermost() -> None:
    s = make_strategy(tp=4, cp=2, dp=3, pp=2)
    assert group_ranks(s, "tp") == (0, 1, 2, 3)
    assert group_ranks(s, "cp") == (0, 4)
    assert group_ranks(s, "dp") == (0, 8, 16)          # stride tp*cp
    assert group_ranks(s, "pp") == (0, 24)             # stride tp*cp*dp
    assert group_ranks(s, "dp_cp") == (0, 4, 8, 12, 16, 20)
    assert group_ranks(s, "dp", rank=13) == (5, 13, 21)
    assert rank_to_coords(s, 13) == RankCoords(tp=1, cp=1, dp=1, pp=0)


def test_ep_groups_are_consecutive_dp_indices() -> None:
    s = make_strategy(tp=2, dp=8, ep=4)
    assert group_ranks(s, "ep") == (0, 2, 4, 6)
    assert group_ranks(s, "ep", rank=9) == (9, 11, 13, 15)
    for g in all_groups(s, "ep"):
        coords = [rank_to_coords(s, r) for r in g]
        assert len({c.tp for c in coords}) == 1 and len({c.pp for c in coords}) == 1
        dps = sorted(c.dp for c in coords)
        assert dps == list(range(dps[0], dps[0] + 4)) and dps[0] % 4 == 0


def test_ep_must_divide_dp() -> None:
    with pytest.raises(InfeasibleError) as e:
        group_ranks(make_strategy(dp=6, ep=4), "ep")
    assert e.value.reason == "indivisible"


def test_bad_dim_and_rank() -> None:
    s = make_strategy(tp=2, dp=2)
    with pytest.raises(InputError):
        group_ranks(s, "xp")
    with pytest.raises(InputError):
        group_ranks(s, "tp", rank=4)


def test_pipeline_pairs() -> None:
    s = make_strategy(tp=2, pp=3)
    assert pipeline_pairs(s) == [(0, 2), (1, 3), (2, 4), (3, 5)]


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 4, 6]),
       pp=st.sampled_from([1, 2, 3]), ep=st.sampled_from([1, 2]))
def test_groups_partition_ranks_and_coords_round_trip(tp: int, cp: int, dp: int, pp: int, ep: int) -> None:
    if dp % ep:
        ep = 1
    s = make_strategy(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep)
    for r in range(s.num_gpus):
        assert coords_to_rank(s, rank_to_coords(s, r)) == r
    sizes = {"tp": tp, "cp": cp, "dp": dp, "ep": ep, "pp": pp, "dp_cp": dp * cp, "etp": tp, "edp": dp * cp // ep,
             "dp_shard": dp, "dp_replicate": 1}  # no HSDP: the shard group is all of dp
    # MoE parallel folding (etp = tp): expert groups span the stage's cp x dp ranks, never tp or pp
    varying = {"tp": {"tp"}, "cp": {"cp"}, "dp": {"dp"}, "ep": {"cp", "dp"}, "pp": {"pp"}, "dp_cp": {"dp", "cp"},
               "etp": {"tp"}, "edp": {"cp", "dp"}, "dp_shard": {"dp"}, "dp_replicate": set()}
    for dim in DIMS:
        groups = all_groups(s, dim)
        flat = sorted(itertools.chain.from_iterable(groups))
        assert flat == list(range(s.num_gpus))
        stride, size = group_shape(s, dim)
        assert size == sizes[dim]
        for g in groups:
            assert len(g) == size and all(b - a == stride for a, b in zip(g, g[1:]))
            assert group_ranks(s, dim, rank=g[-1]) == g
            coords = [rank_to_coords(s, r) for r in g]
            for name in ("tp", "cp", "dp", "pp"):
                if name not in varying[dim]:
                    assert len({getattr(c, name) for c in coords}) == 1
