"""The search states MoE layouts as Megatron-Core folds them: expert tensor parallelism (etp)
searched next to tp, folded ep beyond dp*cp, and each candidate equal to simulate."""

from __future__ import annotations

import pytest

from planner.plans.recommend import Settings, framework_space
from planner.plans.search import SearchSpace, _layouts, search
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_model
from sim.base.errors import InputError
from tests.conftest import cluster


def test_layouts_try_etp_1_next_to_tp_for_moe():
    model, cl = get_model("mixtral-8x7b"), cluster("h100-80gb", 64)
    lays = _layouts(model, cl, SearchSpace(tp=(2,), pp=(1,), cp=(1,), ep=(8,), precision=("bf16",)))
    assert {lay.etp for lay in lays} == {None, 1}
    dense = _layouts(get_model("llama3-8b"), cl, SearchSpace(tp=(2,), pp=(1,), cp=(1,), precision=("bf16",)))
    assert {lay.etp for lay in dense} == {None}
    only_tp = _layouts(model, cl, SearchSpace(tp=(2,), pp=(1,), cp=(1,), ep=(8,), etp=(), precision=("bf16",)))
    assert {lay.etp for lay in only_tp} == {None}


def test_folded_candidates_are_timed_as_simulate_times_them():
    model, cl = get_model("mixtral-8x7b"), cluster("h100-80gb", 64)
    # tp=4, dp=16: ep=32 with etp=1 folds the tp ranks into expert parallelism (4*... : 1*32 | 4*16)
    r = search(model, cl, gbs=256, seq_len=4096,
               space=SearchSpace(tp=(4,), pp=(1,), cp=(1,), ep=(8,), etp=(1,), precision=("bf16",), zero=(1,),
                                 recompute=("full",)))
    assert r.evaluated > 0
    folded = [i for i in range(r.evaluated) if r.strategy(i).etp == 1]
    assert folded
    for i in folded[:5]:
        s = r.strategy(i)
        assert s.sp  # expert TP other than tp needs SP
        res = simulate_analytic(r.fastmodel.plan(s))
        assert r.candidates.step_time_s[i] == pytest.approx(res.step_time_s, rel=1e-9)


def test_framework_without_expert_tp_searches_tp_only():
    space = framework_space(SearchSpace(), "megatron-deepspeed", cluster("a100-80gb", 64))
    assert space.etp == () and space.zero == (0, 1, 2, 3) and space.schedule == ("1f1b",) and space.sp == (False,)
    assert space.precision == ("bf16", "fp16") or set(space.precision) <= {"bf16", "fp16"}
    with pytest.raises(InputError, match="zero"):
        framework_space(SearchSpace(zero=(3,)), "megatron-lm-2021", cluster("a100-80gb", 64))
    tt = framework_space(SearchSpace(), "torchtitan", cluster("h100-80gb", 64))
    assert tt.fp8_recipe == "tensorwise" and tt.zero == (0, 3)
    assert Settings.from_framework("torchtitan").kwargs["uneven_vp"] is True


def test_token_imbalance_slows_the_busiest_rank_not_the_model_flops():
    from sim.layers.ops import layer_ops, model_flops_per_step
    from sim.cost.plan import Plan, parse_strategy

    model, cl = get_model("mixtral-8x7b"), cluster("h100-80gb", 64)
    s = parse_strategy("tp=1,pp=1,ep=8,mbs=1,gbs=64,zero=1", num_gpus=64)
    flat, skew = layer_ops(model, s, moe=True), layer_ops(model, s, moe=True, moe_imbalance=1.5)
    gemm = {op.name: op.flops for op in flat.ops}
    assert {op.name: op.flops for op in skew.ops}["expert_up"] == pytest.approx(1.5 * gemm["expert_up"], rel=0.02)
    assert skew.ep_a2a_bytes == pytest.approx(1.5 * flat.ep_a2a_bytes)
    a = simulate_analytic(Plan(model=model, cluster=cl, strategy=s))
    b = simulate_analytic(Plan(model=model, cluster=cl, strategy=s, moe_imbalance=1.5))
    assert b.step_time_s > a.step_time_s and b.model_flops_per_step == a.model_flops_per_step
    with pytest.raises(InputError, match="moe-imbalance"):
        Plan(model=model, cluster=cl, strategy=s, moe_imbalance=0.9)
    # the search prices it as simulate does
    r = search(model, cl, gbs=64, seq_len=2048, plan_kwargs={"moe_imbalance": 1.5},
               space=SearchSpace(tp=(1,), pp=(1,), cp=(1,), ep=(8,), precision=("bf16",), zero=(1,)))
    i = 0
    assert r.candidates.step_time_s[i] == pytest.approx(simulate_analytic(r.fastmodel.plan(r.strategy(i))).step_time_s,
                                                        rel=1e-9)
    assert model_flops_per_step  # imported: model FLOPs count routed experts without imbalance


def test_dispatchers_known_answers():
    """DeepEP fitted from its README (H800: 153-158 GB/s of 200 intranode, NIC-bound internode),
    less the counted bytes that stayed on the source's own rank or node (its tests count them:
    7/8 of EP 8's NVLink bytes crossed, half of EP 16's RDMA bytes, 3/4 of EP 32's, 7/8 of EP
    64's); the all-gather dispatcher moves every rank's unique tokens; all three priced alike by
    both callers."""
    from planner.fitting.fit_kernels import fit_deepep_dispatch
    from sim.layers.compute import default_efficiency
    from sim.cost.plan import Plan, parse_strategy

    fit = fit_deepep_dispatch()
    assert fit == default_efficiency().deepep_dispatch
    # median of 153 and 158 GB/s x 7/8 over 200; of 43, 43 (x 1/2), 58, 57 (x 3/4), 51, 50 (x 7/8) over 50
    assert fit["scale-up"] == pytest.approx(155.5 * 7 / 8 / 200, abs=1e-4)
    assert fit["scale-out"] == pytest.approx((57 * 0.75 + 58 * 0.75) / 2 / 50, abs=1e-4)
    model, cl = get_model("mixtral-8x7b"), cluster("h100-80gb", 64, gpn=4)
    s = parse_strategy("ep=8,mbs=1,gbs=64,recompute=full,zero=1", num_gpus=64)  # ep over two 4-GPU nodes
    t = {d: simulate_analytic(Plan(model=model, cluster=cl, strategy=s, moe_dispatcher=d)) for d in
         ("alltoall", "allgather", "deepep")}
    assert len({round(r.step_time_s, 9) for r in t.values()}) == 3
    with pytest.raises(InputError, match="moe-dispatcher"):
        Plan(model=model, cluster=cl, strategy=s, moe_dispatcher="nccl")
    r = search(model, cl, gbs=64, seq_len=2048, plan_kwargs={"moe_dispatcher": "deepep"},
               space=SearchSpace(tp=(1,), pp=(1,), cp=(1,), ep=(8,), precision=("bf16",), zero=(1,),
                                 recompute=("full",)))
    assert r.evaluated
    i = 0
    assert r.candidates.step_time_s[i] == pytest.approx(simulate_analytic(r.fastmodel.plan(r.strategy(i))).step_time_s,
                                                        rel=1e-9)
