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


def test_fused_moe_accounting_keeps_the_combine_rows_the_router_weights():
    """Megatron-Core multiplies each returned expert copy by its router probability on the
    token's own rank and keeps the copy for the probability's gradient (core_v0.6.0
    token_unpermutation; moe_utils.unpermute; TE's fused moe_unpermute saves ``inp``): k x h
    16-bit per token (x etp where the etp ranks hold every token), as the eager accounting
    counts.  Mixtral at ep 2: 2 x 4096 x 2 B per token more than without them."""
    model = load_model("mixtral-8x7b")
    s = parse_strategy("tp=1,pp=1,ep=2,mbs=1,gbs=8,zero=1", num_gpus=8, seq_len=4096)
    moe, dense = activation_bytes_per_layer(model, s, moe=True), activation_bytes_per_layer(model, s, moe=False)
    f, h, k, tok = model.moe.expert_ffn_hidden_size, model.hidden_size, model.moe.top_k, 4096
    routed = k * (2 * 2 * f + 2 * f + 2 * h + 2 * h)  # internals (fc1 out, swiglu out), input, combine row
    assert moe - dense == pytest.approx(tok * (routed - 6 * model.ffn_hidden_size), rel=1e-3)  # less the dense MLP's
    mlp = replace(s, recompute="selective")
    assert activation_bytes_per_layer(model, mlp, moe=True, selective_policy="mlp") \
        < activation_bytes_per_layer(model, mlp, moe=True, selective_policy="mlp_up")


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


# ------------------------------------------------------------------ the last gradient bucket (issue 23)

def test_grad_bucket_sizes_follow_each_reducer():
    from sim.data.runtime import default_comm_runtime
    rt = default_comm_runtime()
    # Megatron-Core: max(40M, 1M x dp x cp) parameters
    assert rt.grad_bucket_params("megatron", 8) == 4.0e7
    assert rt.grad_bucket_params("megatron", 64) == 6.4e7
    # PyTorch DDP: 25 MiB of fp32 gradients; DeepSpeed: reduce_bucket_size 5e8
    assert rt.grad_bucket_params("ddp", 64) == pytest.approx(25 * 2**20 / 4)
    assert rt.grad_bucket_params("deepspeed", 64) == 5.0e8


def test_last_bucket_is_never_hidden_closed_form():
    """Reduction well inside the backward: the old window hid all of it; now the last bucket
    (embedding + half a bucket) is exposed after the backward, and its parameter gather before the
    first forward: exposed = share x (reduce-scatter + all-gather)."""
    from sim.cost.step import DpCollectives, compose, stage_pieces, stage_times
    from sim.cost.costs import piece_settings
    from sim.layers.stages import StageParams
    plan = _plan("llama3-8b", "h100-80gb", 64, "tp=1,pp=1,mbs=1,gbs=64,zero=1")
    eff = default_efficiency()
    coll = DpCollectives(all_reduce_s=0.2, reduce_scatter_s=0.1, all_gather_s=0.05)
    params = StageParams(8.0e9, 0.0)
    emb = 0.5e9
    out = {}
    for bucketed in (False, True):
        settings = replace(piece_settings(plan, eff, precision="bf16", pp=1, num_microbatches=1, dp_overlap=True,
                                          fp8_recipe="delayed", dp_size=64),
                           **({} if bucketed else {"grad_bucket_params": 0.0}))
        pieces = stage_pieces(coll=coll, zero=1, dp_size=64, expert_dp=1, params=params, num_layers=32,
                              layer_fwd_s=0.2, layer_bwd_s=0.4, settings=settings, embedding_params=emb)
        st = stage_times(layer_fwd_s=0.2, layer_bwd_s=0.4, recompute_s=0.0, layer_exposed_fwd_s=0.0,
                         layer_exposed_bwd_s=0.0, extra_fwd_s=0.0, extra_bwd_s=0.0, pieces=pieces, p2p_s=0.0,
                         num_layers=32, first=True, last=True)
        out[bucketed] = (float(pieces.dp_tail_share), compose([st], m=1, vp=1, zero_bubble=False, pp=1, zero=1,
                                                             dp_overlap=True, overlap_slowdown=0.0))
    share = (emb + 0.5 * 6.4e7) / 8.0e9
    assert out[False][0] == 0.0 and out[True][0] == pytest.approx(share)
    assert float(out[False][1].dp_exposed_s[0]) == pytest.approx(0.0, abs=1e-12)
    assert float(out[True][1].dp_exposed_s[0]) == pytest.approx(share * (0.1 + 0.05), rel=1e-9)
    assert float(out[True][1].step_time_s) - float(out[False][1].step_time_s) == pytest.approx(share * 0.15, rel=1e-9)
    # without overlap everything is exposed either way
    plain = compose([replace(st, dp_tail_share=0.0)], m=1, vp=1, zero_bubble=False, pp=1, zero=1,
                    dp_overlap=False, overlap_slowdown=0.0)
    tailed = compose([st], m=1, vp=1, zero_bubble=False, pp=1, zero=1, dp_overlap=False, overlap_slowdown=0.0)
    assert float(plain.step_time_s) == pytest.approx(float(tailed.step_time_s), rel=1e-12)


def test_megatron_deepspeed_runs_eager_ops_but_keeps_megatron_activations():
    """Megatron-DeepSpeed's SwiGLU, RoPE and biases run as eager PyTorch ops (slower than the fused
    profile) while its saved activations are Megatron's layer code's (same memory)."""
    from sim.cost.framework import apply_framework, get_framework
    fw = get_framework("megatron-deepspeed-fa2")
    assert fw.eager_elementwise and not fw.eager_activations
    base = _plan("llama2-7b", "a100-80gb", 8, "tp=1,pp=1,mbs=1,gbs=64,zero=1")
    kw = {f: getattr(base, f) for f in ("model", "cluster", "strategy")}
    as_run = Plan(**apply_framework(kw, fw)).checked()
    fused = replace(as_run, eager_elementwise=False, fused_ops=())
    assert simulate_analytic(as_run).step_time_s > simulate_analytic(fused).step_time_s
    assert plan_memory(as_run).activations_bytes == pytest.approx(plan_memory(fused).activations_bytes, rel=1e-12)
    # a profile whose model code is eager (torchtitan) counts eager activations
    tt = get_framework("torchtitan")
    assert tt.eager_elementwise and tt.eager_activations
