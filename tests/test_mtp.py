"""Multi-token prediction (issue 23, third pass): each depth is one more transformer layer on the
stage with the loss, plus Megatron-Core's MTP projection, norms, output layer and loss; priced by
both engines and the search alike."""

from dataclasses import replace

import numpy as np
import pytest

from planner.plans.recommend import Settings
from planner.plans.search import SearchSpace, search
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_model
from sim.base.errors import InputError
from sim.engines.event import simulate_event
from sim.layers.ops import head_ops
from sim.cost.plan import Plan, parse_strategy
from sim.layers.stages import layer_params, stage_layers, stage_shapes
from tests.conftest import cluster

DSV3 = get_model("deepseek-v3")
MTP = replace(DSV3, mtp_layers=1)


def _plan(model, strategy: str, n: int = 64) -> Plan:
    return Plan(model=model, cluster=cluster("h100-80gb", n),
                strategy=parse_strategy(strategy, num_gpus=n, seq_len=4096)).checked()


def test_mtp_layer_sits_on_the_last_stage_and_is_of_the_last_layers_kind():
    s = parse_strategy("tp=1,pp=8,ep=8,mbs=1,gbs=64", num_gpus=64, seq_len=4096)
    base, mtp = stage_layers(DSV3, s), stage_layers(MTP, s)
    assert mtp[:-1] == base[:-1] and mtp[-1] == base[-1] + [61]
    assert MTP.is_moe_layer(61) == MTP.is_moe_layer(60)
    last = stage_shapes(MTP, s)[-1]
    assert last.num_moe_layers == stage_shapes(DSV3, s)[-1].num_moe_layers + 1
    # one MoE layer, eh_proj (2h x h), three norms and the embedding copy Megatron builds on the MTP rank
    h = DSV3.hidden_size
    extra = last.params.dense_params - stage_shapes(DSV3, s)[-1].params.dense_params
    layer = layer_params(DSV3, s, moe=True).dense_params
    assert extra == pytest.approx(layer + 2 * h * h + 3 * h + DSV3.embedding_params, rel=1e-12)


def test_each_depth_runs_the_output_layer_and_loss_again():
    s = parse_strategy("tp=2,pp=4,ep=8,mbs=1,gbs=64,sp=1", num_gpus=64, seq_len=4096)
    one, two = head_ops(DSV3, s), head_ops(replace(DSV3, mtp_layers=2), s)
    names = [op.name for op in two]
    assert names.count("logits") == 3 and names.count("cross_entropy") == 3 and names.count("mtp_eh_proj") == 2
    proj = next(op for op in two if op.name == "mtp_eh_proj")
    assert proj.flops == pytest.approx(2 * 4096 * (DSV3.hidden_size // 2) * 2 * DSV3.hidden_size)
    assert len(one) == 3


def test_mtp_slows_the_last_stage_in_both_engines():
    strat = "tp=1,pp=4,ep=8,mbs=1,gbs=32,zero=1"
    small = replace(DSV3, num_layers=8, moe=replace(DSV3.moe, first_k_dense_layers=1))
    a0, a1 = simulate_analytic(_plan(small, strat, 32)), simulate_analytic(_plan(replace(small, mtp_layers=1), strat, 32))
    assert a1.step_time_s > a0.step_time_s
    e1 = simulate_event(_plan(replace(small, mtp_layers=1), strat, 32))
    assert e1.step_time_s == pytest.approx(a1.step_time_s, rel=0.03)
    assert a1.memory_device_bytes > a0.memory_device_bytes


def test_the_search_prices_mtp_as_simulate_does():
    cl = cluster("h200-141gb", 128)
    st = Settings.from_framework(None)
    r = search(MTP, cl, gbs=256, seq_len=4096, space=SearchSpace(tp=(1, 8), cp=(1,), ep=(8, 32), mbs=(1,), max_vp=2),
               plan_kwargs=st.kwargs, dp_overlap=st.dp_overlap)
    assert r.evaluated > 20
    rng = np.random.default_rng(7)
    for i in {int(np.argmin(r.candidates.step_time_s)), *rng.choice(r.evaluated, size=8, replace=False).tolist()}:
        s = r.strategy(int(i))
        res = simulate_analytic(r.fastmodel.plan(s), net=r.fastmodel.net)
        assert r.candidates.step_time_s[i] == pytest.approx(res.step_time_s, rel=1e-9), s.to_string()
        assert r.candidates.memory_device_bytes[i] == pytest.approx(res.memory_device_bytes, rel=1e-9), s.to_string()


def test_mtp_layers_are_checked():
    with pytest.raises(InputError, match="mtp_layers"):
        replace(DSV3, mtp_layers=-1)
