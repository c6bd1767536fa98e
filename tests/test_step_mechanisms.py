"""Mechanisms of issue 13, each against a closed form or a property: HSDP (dp_shard), CUDA
graphs, overlapped pipeline sends, distributed-optimizer overlap per model chunk, fp8 recipes,
selective recomputation policies."""

from dataclasses import replace

import pytest

from sim.engines.analytic import simulate_analytic
from sim.layers.compute import default_efficiency
from sim.base.errors import InputError
from sim.engines.event import simulate_event
from sim.cost.memory import activation_bytes_per_layer, plan_memory
from sim.data.models import load_model
from sim.cost.plan import Plan, parse_strategy
from sim.cost.step import overlap_window
from tests.conftest import cluster


def _plan(model: str, gpu: str, n: int, strategy: str, seq: int = 4096, **kw) -> Plan:
    return Plan(model=load_model(model), cluster=cluster(gpu, n), strategy=parse_strategy(strategy, num_gpus=n,
                                                                                          seq_len=seq), **kw).checked()


# ------------------------------------------------------------------ HSDP

def test_hsdp_shards_states_over_the_shard_group_and_all_reduces_across_replicas():
    full = _plan("llama3-8b", "h100-80gb", 64, "tp=1,pp=1,mbs=1,gbs=64,zero=3")
    hsdp = _plan("llama3-8b", "h100-80gb", 64, "tp=1,pp=1,mbs=1,gbs=64,zero=3,dp_shard=8")
    mf, mh = plan_memory(full), plan_memory(hsdp)
    # states sharded 8 ways instead of 64: 8x the optimizer bytes per GPU
    assert mh.optimizer_bytes == pytest.approx(8 * mf.optimizer_bytes, rel=1e-9)
    rf, rh = simulate_analytic(full), simulate_analytic(hsdp)
    assert rh.breakdown.exposed_dp_s > 0
    assert hsdp.strategy.zero_shard == 8 and "dp_shard=8" in hsdp.strategy.to_string()
    # dp_shard = dp is plain FSDP
    same = _plan("llama3-8b", "h100-80gb", 64, "tp=1,pp=1,mbs=1,gbs=64,zero=3,dp_shard=64")
    assert simulate_analytic(same).step_time_s == pytest.approx(rf.step_time_s, rel=1e-12)


def test_hsdp_bad_input_is_one_line_errors():
    with pytest.raises(InputError, match="dp_shard"):
        parse_strategy("tp=1,mbs=1,gbs=64,zero=3,dp_shard=7", num_gpus=64)
    with pytest.raises(InputError, match="zero"):
        parse_strategy("tp=1,mbs=1,gbs=64,zero=0,dp_shard=8", num_gpus=64)
    with pytest.raises(InputError, match="analytic"):
        simulate_event(_plan("llama3-8b", "h100-80gb", 64, "tp=1,pp=1,mbs=1,gbs=64,zero=3,dp_shard=8"))


# ------------------------------------------------------------------ CUDA graphs, pipeline sends

def test_cuda_graphs_remove_the_host_floor_only():
    base = "tp=1,pp=1,mbs=1,gbs=8,zero=1"
    eager = simulate_analytic(_plan("llama3-8b", "h100-80gb", 8, base, seq=1024))
    graphs = simulate_analytic(_plan("llama3-8b", "h100-80gb", 8, base + ",cuda_graphs=1", seq=1024))
    assert graphs.step_time_s < eager.step_time_s
    # the layers replay from a graph; embedding, head and optimizer are still dispatched
    no_floor = replace(default_efficiency(), host_op_floor_s=0.0)
    floorless = simulate_analytic(_plan("llama3-8b", "h100-80gb", 8, base, seq=1024), eff=no_floor).step_time_s
    assert floorless <= graphs.step_time_s < eager.step_time_s


@pytest.mark.parametrize("engine", ["analytic", "event"])
def test_overlapped_pipeline_sends_are_never_slower(engine):
    run = simulate_analytic if engine == "analytic" else simulate_event
    s = "tp=2,pp=4,vp=2,mbs=1,gbs=32,zero=1,sp=1,schedule=interleaved"
    a = run(_plan("llama3-8b", "h100-80gb", 16, s, seq=2048)).step_time_s
    b = run(_plan("llama3-8b", "h100-80gb", 16, s + ",pp_overlap=1", seq=2048)).step_time_s
    assert b <= a * (1 + 1e-9)
    assert b < a  # the sends are a visible part of this plan


def test_overlap_window_closed_form():
    # vp = 1: all but the last layer of the last micro-batch's backward
    assert overlap_window(8.0, 8, 1, 4) == pytest.approx(7.0)
    # interleaved: each chunk's reduction starts pp chunk-passes before the next one's
    t, layers, vp, pp = 12.0, 12, 3, 4
    chunk = t / vp
    assert overlap_window(t, layers, vp, pp) == pytest.approx(chunk * 3 / 4 + (vp - 1) * pp * chunk)


def test_interleaving_hides_more_distributed_optimizer_traffic():
    one = simulate_analytic(_plan("llama3-70b", "h100-80gb", 64, "tp=8,pp=4,mbs=1,gbs=32,zero=1,sp=1"))
    inter = simulate_analytic(_plan("llama3-70b", "h100-80gb", 64,
                                    "tp=8,pp=4,vp=5,mbs=1,gbs=32,zero=1,sp=1,schedule=interleaved"))
    assert inter.breakdown.exposed_dp_s <= one.breakdown.exposed_dp_s


# ------------------------------------------------------------------ fp8 recipes

def test_fp8_recipes_price_their_quantization():
    times = {r: simulate_analytic(_plan("llama3-70b", "h100-80gb", 8,
                                        f"tp=8,pp=1,mbs=1,gbs=8,zero=1,sp=1,precision=fp8,fp8_recipe={r}")).step_time_s
             for r in ("delayed", "tensorwise", "blockwise")}
    assert times["delayed"] < times["tensorwise"] < times["blockwise"]
    bf16 = simulate_analytic(_plan("llama3-70b", "h100-80gb", 8, "tp=8,pp=1,mbs=1,gbs=8,zero=1,sp=1")).step_time_s
    assert times["delayed"] < bf16
    with pytest.raises(InputError, match="fp8_recipe"):
        _plan("llama3-8b", "h100-80gb", 8, "tp=1,mbs=1,gbs=8,precision=fp8,fp8_recipe=mxfp8")
    _plan("llama3-8b", "b200-180gb", 8, "tp=1,mbs=1,gbs=8,precision=fp8,fp8_recipe=mxfp8")


def test_fp8_weight_cache_casts_weights_once_per_step():
    s = "tp=8,pp=1,mbs=1,gbs=64,zero=1,sp=1,precision=fp8"
    per_mb = simulate_analytic(_plan("llama3-70b", "h100-80gb", 8, s, fp8_weight_cache=False)).step_time_s
    cached = simulate_analytic(_plan("llama3-70b", "h100-80gb", 8, s, fp8_weight_cache=True)).step_time_s
    assert cached < per_mb


# ------------------------------------------------------------------ selective policies

def test_selective_policies_trade_memory_for_recompute():
    model = load_model("deepseek-v3")
    base = parse_strategy("tp=1,pp=1,ep=8,mbs=1,gbs=8,zero=1", num_gpus=8, seq_len=4096)
    sel = replace(base, recompute="selective")
    none = activation_bytes_per_layer(model, base, moe=True)
    for policy in ("moe_act", "mla_up_proj", "mlp_up", "mlp"):
        assert activation_bytes_per_layer(model, sel, moe=True, selective_policy=policy) < none, policy
    # mlp keeps no MLP internals; moe_act keeps the activation inputs
    assert activation_bytes_per_layer(model, sel, moe=True, selective_policy="mlp") < \
        activation_bytes_per_layer(model, sel, moe=True, selective_policy="moe_act")
    times = {}
    for policy in ("moe_act", "mlp_up", "mlp"):
        p = Plan(model=model, cluster=cluster("h100-80gb", 8), strategy=sel, selective_policy=policy)
        times[policy] = simulate_analytic(p).breakdown.recompute_s
    assert 0 < times["moe_act"] < times["mlp_up"] < times["mlp"]
