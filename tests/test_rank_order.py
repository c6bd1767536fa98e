"""Rank order as a strategy key (``order``, innermost first): closed-form strides, coordinates
round-trip, groups priced on the real placement in both engines, refusals, and the property that
keeping tensor parallelism inside the node is never slower than spreading it across nodes."""

from __future__ import annotations

import random

import pytest

from planner.cli import main
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_model
from sim.base.errors import InputError
from sim.engines.event import simulate_event
from sim.net.placement import all_groups, coords_to_rank, group_shape, rank_to_coords, strides
from sim.cost.plan import Plan, parse_strategy
from sim.data.specs import ORDERS
from tests.conftest import cluster


def test_strides_are_the_products_of_the_inner_sizes():
    s = parse_strategy("tp=4,pp=2,cp=2,order=pp-tp-cp-dp", num_gpus=64)  # dp = 4
    assert strides(s) == {"pp": 1, "tp": 2, "cp": 8, "dp": 16}
    assert group_shape(s, "tp") == (2, 4) and group_shape(s, "pp") == (1, 2)
    assert group_shape(s, "dp_cp") == (8, 8)  # cp right inside dp: one combined group
    assert all_groups(s, "tp")[0] == (0, 2, 4, 6)
    default = parse_strategy("tp=4,pp=2,cp=2", num_gpus=64)
    assert strides(default) == {"tp": 1, "cp": 4, "dp": 8, "pp": 32}


@pytest.mark.parametrize("order", ORDERS)
def test_coordinates_round_trip_and_groups_tile_the_ranks(order):
    s = parse_strategy(f"tp=2,pp=2,dp=2,order={order}", num_gpus=8)
    seen = set()
    for r in range(8):
        c = rank_to_coords(s, r)
        assert coords_to_rank(s, c) == r
        seen.add((c.tp, c.cp, c.dp, c.pp))
    assert len(seen) == 8
    for dim in ("tp", "dp", "pp"):
        groups = all_groups(s, dim)
        assert sorted(x for g in groups for x in g) == list(range(8))
        for g in groups:  # a group varies only its own coordinate
            coords = [rank_to_coords(s, x) for x in g]
            for other in {"tp", "cp", "dp", "pp"} - {dim}:
                assert len({getattr(c, other) for c in coords}) == 1


def test_bad_orders_are_one_line_errors(capsys):
    for text, field in (("tp=2,order=tp-dp", "order"), ("tp=2,cp=2,order=cp-tp-pp-dp", "order")):
        with pytest.raises(InputError, match=field):
            parse_strategy(text, num_gpus=16)
    model = get_model("mixtral-8x7b")
    s = parse_strategy("tp=2,pp=2,ep=4,order=pp-tp-cp-dp,mbs=1,gbs=64", num_gpus=32)
    with pytest.raises(InputError, match="pp must be outermost"):
        Plan(model=model, cluster=cluster("h100-80gb", 32), strategy=s).checked()
    assert main(["simulate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "64",
                 "--strategy", "tp=8,pp=8,order=tp-pp", "--engine", "analytic"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_tensor_parallelism_inside_the_node_is_never_slower():
    rng = random.Random(7)
    model = get_model("gpt3-175b")
    for _ in range(4):
        tp = rng.choice([2, 4, 8])
        pp = rng.choice([2, 4, 8])
        n = 256
        dp = n // (tp * pp)
        base = f"tp={tp},pp={pp},mbs=1,gbs={dp * 8 * pp},sp=1,recompute=selective,zero=1"
        inside = simulate_analytic(Plan(model=model, cluster=cluster("a100-80gb", n),
                                        strategy=parse_strategy(base, num_gpus=n))).step_time_s
        for order in ("dp-tp-cp-pp", "pp-dp-tp-cp", "pp-tp-cp-dp"):
            s = parse_strategy(base + f",order={order}", num_gpus=n)
            spread = simulate_analytic(Plan(model=model, cluster=cluster("a100-80gb", n), strategy=s)).step_time_s
            assert spread >= inside * (1 - 1e-9), (base, order)


def test_both_engines_price_the_order():
    model = get_model("llama3-8b")
    s_in = parse_strategy("tp=8,pp=2,mbs=1,gbs=32", num_gpus=32)
    s_out = parse_strategy("tp=8,pp=2,mbs=1,gbs=32,order=dp-pp-tp-cp", num_gpus=32)
    cl = cluster("h100-80gb", 32)
    for sim in (simulate_analytic, simulate_event):
        t_in = sim(Plan(model=model, cluster=cl, strategy=s_in)).step_time_s
        t_out = sim(Plan(model=model, cluster=cl, strategy=s_out)).step_time_s
        assert t_out > t_in * 1.05  # tp=8 across nodes: its all-reduces leave NVLink


def test_orders_a_framework_cannot_build_are_refused(capsys):
    args = ["simulate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "64", "--engine", "analytic",
            "--strategy", "tp=8,pp=8,mbs=1,gbs=64,order=pp-tp-cp-dp"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args + ["--framework", "megatron-core"]) == 2
    assert "order" in capsys.readouterr().err
