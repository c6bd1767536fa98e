"""Framework mechanisms priced from first principles: gradient accumulation outside the GEMM,
FSDP2's packing around its collectives, and how published runs pick their profile."""

from __future__ import annotations

import pytest

from planner.fitting.published import compare_run, load_runs
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_gpu, get_model, get_nic
from sim.layers.compute import default_efficiency
from sim.cost.costs import step_costs
from sim.data.runtime import default_comm_runtime
from sim.base.errors import InputError
from sim.cost.framework import apply_framework, get_framework
from sim.cost.plan import Plan, parse_strategy
from sim.data.hardware import Cluster


def _plan(framework: str, strategy: str, *, model: str = "gpt3-175b", gpu: str = "a100-80gb", n: int = 64) -> Plan:
    g = get_gpu(gpu)
    cl = Cluster(gpu=g, num_gpus=n, nic=get_nic(g.default_nic), gpus_per_node=8, nvlink_domain=8,
                 nics_per_node=g.nics_per_node)
    fw = get_framework(framework)
    s = parse_strategy(strategy, num_gpus=n).with_(dp_overlap=fw.dp_overlap)
    return Plan(**apply_framework({"model": get_model(model), "cluster": cl, "strategy": s}, fw))


def _hbm(plan: Plan) -> float:
    """The per-parameter passes' HBM rate: the GPU's achievable rate on the job's slowest GPU."""
    g = plan.cluster.gpu
    return g.hbm_bytes_per_s * g.hbm_efficiency / default_efficiency().slowest_rank_factor(plan.cluster.num_gpus)


def test_grad_accumulation_bytes_per_mode() -> None:
    rt = default_comm_runtime()
    assert rt.grad_accumulation_bytes("fused", 8) == 0
    assert rt.grad_accumulation_bytes("fp32_main_grad", 8) == 10  # read 2 + read 4 + write 4
    assert rt.grad_accumulation_bytes("autograd", 8) == pytest.approx(6 * 7 / 8)  # nothing to add on the first
    assert rt.grad_accumulation_bytes("autograd", 1) == 0


def test_grad_accumulation_pass_per_micro_batch() -> None:
    strategy = "tp=8,pp=8,mbs=1,gbs=64,recompute=full"
    p21, p22 = _plan("megatron-lm-2021", strategy), _plan("megatron-lm-2022", strategy)
    st21, st22 = step_costs(p21).stages[3], step_costs(p22).stages[3]
    assert st22.pieces.grad_accum_s == 0
    assert st21.pieces.grad_accum_s == pytest.approx(st21.params * 10 / _hbm(p21))
    assert st21.compute_bwd_s == pytest.approx(st22.compute_bwd_s + st21.pieces.grad_accum_s)
    t21, t22 = simulate_analytic(p21).step_time_s, simulate_analytic(p22).step_time_s
    m, p = p21.strategy.num_microbatches, p21.strategy.pp
    acc = [st.pieces.grad_accum_s for st in step_costs(p21).stages]
    # every micro-batch pays it on the bottleneck stage, and the pipeline fill and drain too
    assert m * min(acc) < t21 - t22 <= (m + p - 1) * max(acc) + 1e-9


def test_fsdp2_packing_only_under_zero3_with_sharding() -> None:
    z3 = _plan("torchtitan", "tp=1,pp=1,mbs=1,gbs=64,zero=3,seq=8192", model="llama3-8b", gpu="h100-80gb")
    st = step_costs(z3).stages[0]
    assert st.pieces.fsdp_copy_fwd_s == pytest.approx(st.params * 4 / _hbm(z3))
    assert st.pieces.fsdp_copy_bwd_s == pytest.approx(st.params * 10 / _hbm(z3))
    z1 = _plan("torchtitan", "tp=1,pp=1,mbs=1,gbs=64,zero=1,seq=8192", model="llama3-8b", gpu="h100-80gb")
    assert step_costs(z1).stages[0].pieces.fsdp_copy_fwd_s == 0
    mcore = _plan("megatron-core", "tp=1,pp=1,mbs=1,gbs=64,zero=3,seq=8192", model="llama3-8b", gpu="h100-80gb")
    assert step_costs(mcore).stages[0].pieces.fsdp_copy_bwd_s == 0  # contiguous buffers, no packing


def test_unknown_grad_accumulation_is_a_clear_error() -> None:
    p = _plan("default", "tp=8,pp=1,mbs=1,gbs=8")
    with pytest.raises(InputError, match="grad_accumulation"):
        Plan(model=p.model, cluster=p.cluster, strategy=p.strategy, grad_accumulation="magic")


def test_published_runs_use_the_code_of_their_year() -> None:
    runs = {r["id"]: r for r in load_runs()}
    sc21 = compare_run(runs["megatron-sc21-t1-gpt1008.0b-3072gpu"])
    k22 = compare_run(runs["korthikanti22-1t-fullrecompute-512gpu"])
    assert sc21.framework == "megatron-lm-2021" and sc21.plan.grad_accumulation == "fp32_main_grad"
    assert k22.framework == "megatron-lm-2022" and k22.plan.grad_accumulation == "fused"
    # Korthikanti et al. interleave only the 175B and 530B runs
    assert k22.plan.strategy.vp == 1
    assert compare_run(runs["korthikanti22-175b-fullrecompute-64gpu"]).plan.strategy.vp == 3


def test_event_engine_spreads_per_parameter_work_over_the_layers() -> None:
    """The accumulation pass happens layer by layer: lumped into one virtual stage it would
    unbalance an interleaved pipeline (the event engine's bubble doubled before this was
    spread by parameter share)."""
    from sim.engines.event.engine import simulate_event

    spec = "tp=8,pp=8,vp=2,mbs=1,gbs=64,recompute=full"
    p21, p22 = _plan("megatron-lm-2021", spec, n=64), _plan("megatron-lm-2022", spec, n=64)
    assert step_costs(p21).stages[1].pieces.grad_accum_s > 0
    a21, a22 = simulate_analytic(p21), simulate_analytic(p22)
    e21, e22 = simulate_event(p21), simulate_event(p22)
    # the pass costs the same in both engines, and adds no bubble
    assert e21.step_time_s - e22.step_time_s == pytest.approx(a21.step_time_s - a22.step_time_s, rel=0.05)
    assert e21.breakdown.bubble_s == pytest.approx(e22.breakdown.bubble_s, rel=0.1)


def test_nemo_launcher_2024_runs_flash_attention_2_and_is_nemo_otherwise():
    """NeMo Framework Launcher set NVTE_FUSED_ATTN=0 from 2024-02-13 to 2024-08-29: NeMo 24.03-24.07
    containers ran Transformer Engine's FlashAttention (flash-attn 2) backend on Hopper."""
    from dataclasses import fields

    from planner.fitting.reference import framework_of
    from sim.cost.framework import get_framework
    era, now = get_framework("nemo-launcher-2024"), get_framework("nemo")
    assert era.attention == "flash2" and now.attention == "flash"
    same = {f.name for f in fields(era)} - {"id", "name", "aliases", "attention", "source", "notes",
                                            "eager_elementwise", "eager_activations", "fused_ops", "host_syncs"}
    assert all(getattr(era, k) == getattr(now, k) for k in same)
    # NeMo 1 builds Megatron-Core's DDP with check_for_nan_in_grad off unless its config sets it;
    # NeMo 2's recipes turn it on (two host reads per gradient bucket from Megatron-Core 0.12)
    assert era.host_syncs.per_bucket == 0 and now.host_syncs.per_bucket == 2
    row = {"source": "x", "strategy": {}}
    assert framework_of({**row, "framework": "NeMo 24.03.01 framework container"}).id == "nemo-launcher-2024"
    assert framework_of({**row, "framework": "NeMo 24.05 container (launch.sh FW_VERSION=24.05)"}).id == "nemo-launcher-2024"
    assert framework_of({**row, "framework": "NeMo 24.09 container (NeMo Launcher)"}).id == "nemo-launcher-2024h2"
    assert framework_of({**row, "framework": "NVIDIA NeMo Framework 24.09"}).id == "nemo"  # not said to be NeMo 1
    assert framework_of({**row, "framework": "NeMo 2 (25.10)"}).id == "nemo"
    # NeMo 1 (the launcher's scripts): the loss and MoE permutation eager, the rest fused
    h2 = get_framework("nemo-launcher-2024h2")
    assert h2.attention == "flash" and h2.eager_elementwise and not h2.eager_activations
    assert "cross_entropy" not in h2.fused_ops and "router_topk_permute" not in h2.fused_ops
    assert era.fused_ops == h2.fused_ops


def test_te_2025h1_has_no_fused_attention_beyond_head_dim_128_on_blackwell():
    """Transformer Engine 2.0-2.5 (NeMo 25.02-25.07): cuDNN fused attention takes head dims <= 128 on
    sm100; MLA falls back to unfused attention there, equal head dims up to 256 to flash-attn 2;
    Hopper and head dim 128 keep the fused kernel.  Every path builds its Plan from the profile, and
    costs read Plan.attention_kernel."""
    from planner.fitting.reference import framework_of
    from sim.cost.framework import apply_framework, get_framework
    from sim.cost.plan import Plan, parse_strategy
    from sim.data.models import load_model
    from sim.data.specs import Model
    from tests.conftest import cluster

    def kernel(fw: str, model, gpu: str) -> str:
        kw = {"model": model, "cluster": cluster(gpu, 8), "strategy": parse_strategy("tp=1,mbs=1,gbs=8", num_gpus=8)}
        return Plan(**apply_framework(kw, get_framework(fw))).attention_kernel

    dsv3, llama = load_model("deepseek-v3"), load_model("llama3-70b")
    nemotron = Model(name="nemotron4-340b-like", num_layers=96, hidden_size=18432, num_attention_heads=96,
                     ffn_hidden_size=73728, vocab_size=256000, num_kv_heads=8)  # head dim 192
    assert dsv3.is_mla and max(dsv3.qk_head_dim, dsv3.v_dim_per_head) > 128
    assert kernel("nemo-2025h1", dsv3, "b200-180gb") == "unfused"
    assert kernel("nemo-2025h1", dsv3, "h100-80gb") == "flash"
    assert nemotron.dim_per_head == 192 and kernel("nemo-2025h1", nemotron, "b200-180gb") == "flash2"
    assert kernel("nemo-2025h1", llama, "b200-180gb") == "flash"
    assert kernel("nemo", dsv3, "b200-180gb") == "flash"  # TE 2.6+: lifted
    row = {"source": "x", "strategy": {}}
    assert framework_of({**row, "framework": "NeMo 25.04.01 container, NeMo 2.0 scripts"}).id == "nemo-2025h1"
    assert framework_of({**row, "framework": "NeMo 25.09 container"}).id == "nemo"


@pytest.mark.parametrize("framework", ["megatron-core-fa2", "megatron-lm-2021"])
def test_megatron_of_its_year_runs_the_loss_eagerly_and_the_rest_fused(framework):
    """Megatron-LM before core_v0.8 has no fused cross entropy: _VocabParallelCrossEntropy's eager ops
    on fp32 logits; its norms, activation, bias-dropout-add (and TE's fp8 casts) are fused kernels.
    Its saved activations are Megatron's."""
    from dataclasses import replace

    from sim.engines.analytic import simulate_analytic
    from sim.cost.memory import plan_memory
    fw = get_framework(framework)
    assert fw.eager_elementwise and not fw.eager_activations
    assert "cross_entropy" not in fw.fused_ops and {"norm_attn", "activation", "residual_dropout_mlp"} <= set(fw.fused_ops)
    prec = "fp8" if framework == "megatron-core-fa2" else "fp16"
    p = _plan(framework, f"tp=1,pp=1,mbs=1,gbs=8,precision={prec}", model="llama3-8b", gpu="h100-80gb", n=8).checked()
    fused_loss = replace(p, fused_ops=p.fused_ops + ("cross_entropy",))
    assert simulate_analytic(p).step_time_s > simulate_analytic(fused_loss).step_time_s
    assert plan_memory(p).activations_bytes == plan_memory(fused_loss).activations_bytes
    if prec == "fp8":  # TE's fp8 casts stay fused kernels
        assert "fp8_cast" in fw.fused_ops
        eager_casts = replace(p, fused_ops=tuple(o for o in p.fused_ops if o != "fp8_cast"))
        assert simulate_analytic(eager_casts).step_time_s > simulate_analytic(p).step_time_s


def test_torchtitan_compile_fuses_the_blocks_and_runs_norm_head_and_loss_eagerly():
    """torchtitan (9dec370) compiles each TransformerBlock; the final norm and the loss on fp32 logits
    stay eager; the blocks' saved activations are counted fused."""
    from dataclasses import replace

    from sim.engines.analytic import simulate_analytic
    fw = get_framework("torchtitan-compile")
    assert fw.eager_elementwise and not fw.eager_activations
    assert {"final_norm", "cross_entropy"}.isdisjoint(fw.fused_ops)
    assert {"norm_attn", "norm_mlp", "rope", "activation", "fp8_cast"} <= set(fw.fused_ops)
    p = _plan("torchtitan-compile", "tp=1,pp=1,mbs=1,gbs=8,zero=3", model="llama3-8b", gpu="h100-80gb", n=8).checked()
    fused_head = replace(p, fused_ops=p.fused_ops + ("final_norm", "cross_entropy"))
    assert simulate_analytic(p).step_time_s > simulate_analytic(fused_head).step_time_s


def test_reference_rows_read_biased_linears_for_gpt_rows_only():
    """Development rows: a GPT row (plain GeLU MLP) has biased linears, Llama-, Nemotron- and MoE
    rows do not, and a row's own ``linear_bias`` wins (FlagPerf's Megatron-DeepSpeed Llama 2 runs
    as launched, whose '--disable-bias-linear' never reached the command, and its Megatron-Core
    Llama 3 runs, whose script never passes it); with it the row's ``dropout`` and
    ``position_embedding`` (those Llama 3 runs keep Megatron-LM's defaults)."""
    from planner.fitting.reference import load_reference, model_of

    rows = {r.id: r for r in load_reference()}
    assert model_of(rows["megatron-sc21-t1-gpt1.7b-32gpu"].raw).linear_bias
    assert model_of(rows["korthikanti22-22b-sp-selective-8gpu"].raw).linear_bias
    assert model_of(rows["flagperf-llama2-7b-bf16-a100-8-megatron-ds-gbs1024"].raw).linear_bias
    flagperf = model_of(rows["flagperf-llama3-8b-bf16-h100-8"].raw)
    assert flagperf.linear_bias and flagperf.has_dropout and not flagperf.uses_rope
    llama = model_of(rows["flagperf-llama2-70b-bf16-h800-32-tp8pp4-gbs44"].raw)
    assert not llama.linear_bias and not llama.has_dropout and llama.uses_rope
    assert not model_of(rows["dgxc2505-nemotron4-15b-bf16-h100-16"].raw).linear_bias
    assert not model_of(rows["dgxc2505-deepseek-v3-bf16-h100-512"].raw).linear_bias
