"""The mechanisms of issue 23 (step time without the optimism), each against a closed form or
the source it is built from: the slowest of N GPUs, DeepSpeed's BF16_Optimizer, the 2021
ZeRO-3 engine, ring attention's per-step overhead, async TP and NVLS, host synchronisations by
framework era, sustained clocks, and the signed error in the published-run summary."""

from __future__ import annotations

import statistics
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from planner.fitting.fit_kernels import fit_ring_attention, fit_sustained_clock
from planner.fitting.published import summary
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_gpu, get_nic
from sim.net.clusters import cluster_from_catalog
from sim.layers.compute import default_efficiency, matmul_efficiency
from sim.net.netefficiency import network_kwargs
from sim.cost.costs import layer_cost, plan_layer_ops, step_costs
from sim.engines.event import simulate_event
from sim.cost.framework import apply_framework, get_framework
from sim.net.network import Network
from sim.layers.ops import Op
from sim.cost.plan import HostSyncs, Plan
from sim.data.specs import Model, Strategy
from sim.layers.stages import layer_params
from sim.layers.variability import expected_max_standard_normal, slowest_rank_factor

GPT = Model(name="gpt-10b", num_layers=24, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=16384,
            vocab_size=50304)
LLAMA = Model(name="llama-8b", num_layers=8, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
              ffn_hidden_size=14336, ffn_type="swiglu", vocab_size=128256)


def _plan(fw: str, model: Model, gpu: str, n: int, **strategy: object) -> Plan:
    framework = get_framework(fw)
    cl = cluster_from_catalog(get_gpu(gpu), n, gpus_per_node=min(8, n), nic=get_nic("ib-hdr-200"))
    s = Strategy(**{"dp": n, "dp_overlap": framework.dp_overlap, **strategy})  # type: ignore[arg-type]
    return Plan(**apply_framework({"model": model, "cluster": cl, "strategy": s}, framework))


# ----------------------------------------------------------------- slowest of N (sim.layers.variability)


@pytest.mark.parametrize("n", [2, 8, 64, 512, 8192])
def test_expected_max_of_normals_against_numerical_integration(n: int) -> None:
    x = np.linspace(-10, 10, 200001)
    pdf = np.exp(-x * x / 2) / np.sqrt(2 * np.pi)
    cdf = np.cumsum(pdf) * (x[1] - x[0])
    exact = float(np.sum(x * n * cdf ** (n - 1) * pdf) * (x[1] - x[0]))
    assert expected_max_standard_normal(n) == pytest.approx(exact, abs=0.03)


def test_slowest_rank_factor_is_one_for_one_gpu_and_grows_with_n() -> None:
    assert slowest_rank_factor(1, 0.05) == 1.0
    f = [slowest_rank_factor(n, 0.0148) for n in (2, 8, 64, 512, 4096)]
    assert f == sorted(f) and f[-1] < 1.06


def test_layer_compute_is_the_slowest_gpus() -> None:
    plan = _plan("megatron-core", LLAMA, "h100-80gb", 512, tp=8, dp=64, mbs=1, gbs=64, seq_len=4096, sp=True)
    eff = default_efficiency()
    s = plan.strategy
    ops = plan_layer_ops(plan, s, eff, moe=False)
    slow = layer_cost(plan, Network(plan.cluster), ops, eff, layer_params(LLAMA, s, moe=False).total)
    even = layer_cost(plan, Network(plan.cluster), ops, replace(eff, gpu_speed_sigma=0.0),
                      layer_params(LLAMA, s, moe=False).total)
    assert slow.matmul_fwd_s == pytest.approx(even.matmul_fwd_s * eff.slowest_rank_factor(512), rel=1e-12)


# ----------------------------------------------------------------- DeepSpeed BF16_Optimizer


def test_bf16_optimizer_memory_and_pieces() -> None:
    n, params = 16, None
    on = _plan("megatron-deepspeed-fa2", LLAMA, "a100-80gb", n, mbs=1, gbs=64, seq_len=2048, zero=0, precision="bf16")
    off = replace(on, deepspeed_bf16_optimizer=False)
    assert on.bf16_optimizer_active and not off.bf16_optimizer_active
    st_on, st_off = step_costs(on).stages[0], step_costs(off).stages[0]
    params = st_on.params
    m_on, m_off = simulate_analytic(on).memory, simulate_analytic(off).memory
    # the unsharded fp32 gradient buffer next to the bf16 gradients; fp32 master + Adam sharded over dp
    assert m_on.gradients_bytes - m_off.gradients_bytes == pytest.approx(4 * params, rel=1e-9)
    assert m_on.optimizer_bytes == pytest.approx(m_off.optimizer_bytes / n, rel=1e-9)
    # the bf16 weights all-gathered after the step; every micro-batch accumulates 10 B/param
    assert st_off.pieces.dp_param_gather_s == 0 and st_on.pieces.dp_param_gather_s > 0
    assert st_on.pieces.grad_accum_s > st_off.pieces.grad_accum_s
    ev, an = simulate_event(on), simulate_analytic(on)
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.02)


def test_bf16_optimizer_only_without_zero_in_bf16() -> None:
    z1 = _plan("megatron-deepspeed-fa2", LLAMA, "a100-80gb", 8, mbs=1, gbs=32, seq_len=2048, zero=1, precision="bf16")
    fp16 = _plan("megatron-deepspeed-fa2", LLAMA, "a100-80gb", 8, mbs=1, gbs=32, seq_len=2048, zero=0,
                 precision="fp16")
    assert not z1.bf16_optimizer_active and not fp16.bf16_optimizer_active


# ----------------------------------------------------------------- 2021 ZeRO-3 (per-tensor, synchronous)


def test_early_zero3_slows_with_data_parallel_size_bucketed_does_not() -> None:
    def mfu(fw: str, n: int) -> float:
        return simulate_analytic(_plan(fw, GPT, "a100-40gb", n, mbs=4, gbs=4 * n, seq_len=1024, zero=3,
                                       precision="fp16")).mfu
    old = [mfu("deepspeed-zero3-2021", n) for n in (16, 128, 512)]
    new = [mfu("deepspeed-hf", n) for n in (16, 128, 512)]
    assert old[0] > old[1] > old[2] and old[2] < 0.6 * old[0]  # per-GPU throughput falls with dp
    assert max(new) - min(new) < 0.02 * max(new)
    assert all(o < w for o, w in zip(old, new))


def test_early_zero3_engines_agree() -> None:
    plan = _plan("deepspeed-zero3-2021", GPT, "a100-40gb", 32, mbs=4, gbs=128, seq_len=1024, zero=3, precision="fp16")
    assert step_costs(plan).stages[0].pieces.zero3_sync_s > 0
    assert simulate_event(plan).step_time_s == pytest.approx(simulate_analytic(plan).step_time_s, rel=0.05)


# ----------------------------------------------------------------- ring attention per step


def test_ring_fit_reproduces_the_benchmark() -> None:
    """At the benchmark's own ring degree and chunk the model returns its measured ratios
    (ring-flash-attention README: zigzag fwd 85.2% / fwd+bwd 90.2% of flash on 8xH800)."""
    fit = fit_ring_attention()
    eff = default_efficiency()
    f, b = eff.ring_slowdown("hopper", 8, 8192)
    assert fit["hopper"]["fwd"] == pytest.approx(eff.ring_step_overhead["hopper"][0])
    assert 1 / f == pytest.approx(63.0 * 8 / 591.5, rel=2e-3)
    t_f0, t_fb0 = 1 / 591.5, 1 / 154.7
    assert (t_f0 * f + (t_fb0 - t_f0) * b) == pytest.approx(1 / (8 * 17.4), rel=2e-3)
    assert eff.ring_slowdown("hopper", 1, 8192) == (1.0, 1.0)
    assert eff.ring_slowdown("hopper", 8, 32768)[0] - 1 == pytest.approx((f - 1) / 4)


# ----------------------------------------------------------------- TP overlap kinds and NVLS


def test_async_tp_hides_less_than_userbuffers() -> None:
    plan = _plan("megatron-core", LLAMA, "h100-80gb", 8, tp=8, dp=1, mbs=1, gbs=8, seq_len=8192, sp=True,
                 tp_overlap=True)
    eff, s = default_efficiency(), plan.strategy
    ops = plan_layer_ops(plan, s, eff, moe=False)
    p = layer_params(LLAMA, s, moe=False).total
    ub = layer_cost(plan, Network(plan.cluster), ops, eff, p)
    atp = layer_cost(replace(plan, tp_overlap_kind="async_tp"), Network(plan.cluster), ops, eff, p)
    assert atp.exposed_tp_fwd_s >= ub.exposed_tp_fwd_s + ub.tp_comm_fwd_s / 8 - 1e-12
    assert atp.fwd_s > ub.fwd_s  # the reduction of the stacked partials
    assert get_framework("torchtitan-compile").tp_overlap_kind == "async_tp"
    assert get_framework("nemo").tp_overlap_kind == "userbuffers"


def test_nvls_all_reduce_on_nvswitch_generations_only() -> None:
    size = 1 << 30
    for gpu, gen, faster in (("h100-80gb", "nvlink4", True), ("a100-80gb", "nvlink3", False)):
        cl = cluster_from_catalog(get_gpu(gpu), 8, gpus_per_node=8)
        kw = network_kwargs(gen)
        with_nvls = Network(cl, **kw).collective_time_s("all_reduce", tuple(range(8)), size)
        ring = Network(cl, **{**kw, "nvls_gain": {}}).collective_time_s("all_reduce", tuple(range(8)), size)
        if faster:
            assert ring / with_nvls == pytest.approx(kw["nvls_gain"][8], rel=0.05)
        else:
            assert with_nvls == ring
    cl = cluster_from_catalog(get_gpu("h100-80gb"), 8, gpus_per_node=8)
    kw = network_kwargs("nvlink4")
    assert (Network(cl, **kw).collective_time_s("all_reduce", tuple(range(4)), size)
            == Network(cl, **{**kw, "nvls_gain": {}}).collective_time_s("all_reduce", tuple(range(4)), size))


# ----------------------------------------------------------------- host synchronisations, DP overlap defaults


def test_host_syncs_per_micro_batch_and_step() -> None:
    eff = default_efficiency()
    plan = _plan("megatron-lm-2021", GPT, "a100-80gb", 16, tp=8, pp=2, dp=1, mbs=1, gbs=8, seq_len=2048)
    st = step_costs(plan).stages[0]
    assert get_framework("megatron-lm-2021").host_syncs == HostSyncs(forward=5, backward=2, p2p=6, step=8)
    assert st.pieces.host_sync_fwd_s == pytest.approx((5 + 3) * eff.host_op_floor_s)
    assert st.pieces.host_sync_bwd_s == pytest.approx((2 + 3) * eff.host_op_floor_s)
    quiet = replace(plan, host_syncs=HostSyncs())
    gap = simulate_analytic(plan).step_time_s - simulate_analytic(quiet).step_time_s
    m, p = plan.strategy.num_microbatches, plan.strategy.pp
    assert gap == pytest.approx((m + p - 1) * 13 * eff.host_op_floor_s + 8 * eff.host_op_floor_s, rel=0.05)
    with pytest.raises(Exception):
        HostSyncs(forward=-1)


def test_dp_overlap_defaults_by_era() -> None:
    """Megatron-LM's --overlap-grad-reduce defaults to False (core_v0.6 arguments.py); stacks
    that do not pass it reduce after the last backward."""
    for fw, overlap in (("megatron-lm-2021", False), ("megatron-lm-2022", False), ("megatron-deepspeed", False),
                        ("megatron-core-fa2", False), ("megatron-core", True), ("nemo", True)):
        assert get_framework(fw).dp_overlap is overlap, fw


# ----------------------------------------------------------------- sustained clocks


def test_sustained_clock_from_same_era_pairs() -> None:
    """Each pair is the best rate of Azure's 10,000-warm-up cuBLASLt sweep over mamf-finder's burst
    on the same GPU and tensor-core rate: A100 16-bit (256.5 / 271.2 TFLOPS), H100 and H200 fp8;
    GB200's sweep ran another CUDA major and pairs with nothing."""
    fit = fit_sustained_clock()
    assert set(fit["pairs"]) == {"a100-80gb", "h100-80gb", "h200-141gb"}
    assert fit["pairs"]["a100-80gb"] == pytest.approx(256.5 / 271.2, abs=1e-4)
    assert fit["per_architecture"]["ampere"] == fit["pairs"]["a100-80gb"]
    assert fit["per_architecture"]["hopper"] == pytest.approx(
        statistics.fmean((fit["pairs"]["h100-80gb"], fit["pairs"]["h200-141gb"])), abs=1e-4)
    eff = default_efficiency()
    op = Op("x", "matmul", 1e12, 0.0, m=8192, n=8192, k=8192)
    bare = replace(eff, sustained_clock_by_arch={})
    for gpu, arch in (("h100-80gb", "hopper"), ("a100-80gb", "ampere")):
        assert matmul_efficiency(get_gpu(gpu), "bf16", op, eff) == pytest.approx(
            matmul_efficiency(get_gpu(gpu), "bf16", op, bare) * fit["per_architecture"][arch])
    b200 = get_gpu("b200-180gb")
    assert matmul_efficiency(b200, "bf16", op, eff) == matmul_efficiency(b200, "bf16", op, bare)


# ----------------------------------------------------------------- the signed error in the summary


def test_summary_reports_the_signed_median() -> None:
    fits = (True, False, True, False, True)
    oom = (False, False, False, True, False)  # the fourth ran out of memory as published, as predicted
    rows = [SimpleNamespace(step_error=e, memory_error=None, published=SimpleNamespace(out_of_memory=o),
                            predicted=SimpleNamespace(fits_memory=f))
            for e, f, o in zip((-0.2, -0.1, -0.05, 0.02, 0.3), fits, oom)]
    s = summary(rows)  # type: ignore[arg-type]
    assert s["signed_median_step_error"] == pytest.approx(-0.05)
    assert s["median_abs_step_error"] == pytest.approx(0.1)
    assert s["num_ran_predicted_out_of_memory"] == 1  # only the second: it ran, the model says it does not fit


def test_megatron_core_nan_check_per_gradient_bucket() -> None:
    """Megatron-Core's check_for_nan_in_grad (on by default; core_v0.13.1 param_and_grad_buffer.py
    check_grads, rerun_state_machine.validate_result): once per step every gradient bucket's norm
    is taken and read on the host twice (isnan, isinf).  The step pays the buckets' host reads
    plus one pass over the gradient buffer; ceil(P / bucket) buckets with overlapped reduction,
    at most one per parameter tensor, one without it (no bucket_size), none under ZeRO-3."""
    from sim.data.runtime import default_comm_runtime
    from sim.layers.stages import stage_parameter_tensors, stage_shapes

    eff = default_efficiency()
    plan = _plan("megatron-core", LLAMA, "h100-80gb", 8, mbs=1, gbs=8, seq_len=4096, zero=1)
    assert plan.host_syncs.per_bucket == 2 and plan.strategy.dp_overlap
    quiet = replace(plan, host_syncs=HostSyncs())
    st, st0 = step_costs(plan).stages[0], step_costs(quiet).stages[0]
    params = st.params
    rt = default_comm_runtime()
    hbm = plan.cluster.gpu.hbm_bytes_per_s * plan.cluster.gpu.hbm_efficiency / eff.slowest_rank_factor(8)
    tensors = stage_parameter_tensors(LLAMA, stage_shapes(LLAMA, plan.strategy)[0])

    def check(buckets: float) -> float:
        return 2 * buckets * eff.host_op_floor_s + params * rt.grad_reduce_bytes_per_param / hbm

    bucket = rt.grad_bucket_params("megatron", 8)  # max(40M, 1M x dp)
    assert st.pieces.optimizer_s - st0.pieces.optimizer_s == pytest.approx(
        check(min(tensors, np.ceil(params / bucket))), rel=1e-9)
    # every tensor a bucket of its own (bucket_size 64: NVIDIA's MLPerf NeMo implementation)
    per_tensor = replace(plan, grad_buckets="megatron_per_tensor")
    assert step_costs(per_tensor).stages[0].pieces.optimizer_s - st0.pieces.optimizer_s == pytest.approx(
        check(tensors), rel=1e-9)
    # no overlapped reduction: no bucket_size, one bucket
    serial = replace(plan, strategy=replace(plan.strategy, dp_overlap=False))
    serial0 = replace(serial, host_syncs=HostSyncs())
    assert (step_costs(serial).stages[0].pieces.optimizer_s - step_costs(serial0).stages[0].pieces.optimizer_s
            == pytest.approx(check(1), rel=1e-9))
    # interleaved: only the first model chunk is bucketed, every later chunk is one bucket
    # (Megatron-LM training.py / NeMo megatron_parallel.py disable_bucketing for model_chunk_idx > 0)
    inter = _plan("megatron-core", LLAMA, "h100-80gb", 8, pp=2, vp=2, dp=4, mbs=1, gbs=8, seq_len=4096, zero=1,
                  schedule="interleaved")
    sti, sti0 = step_costs(inter).stages[0], step_costs(replace(inter, host_syncs=HostSyncs())).stages[0]
    p_i = sti.params
    t_i = stage_parameter_tensors(LLAMA, stage_shapes(LLAMA, inter.strategy)[0])
    b_i = rt.grad_bucket_params("megatron", 4)
    expect = 2 * (min(t_i / 2, np.ceil(p_i / 2 / b_i)) + 1) * eff.host_op_floor_s + p_i * rt.grad_reduce_bytes_per_param / hbm
    assert sti.pieces.optimizer_s - sti0.pieces.optimizer_s == pytest.approx(expect, rel=1e-9)
    # Megatron-Core 0.6 asserted once per bucket (core_v0.6.0 Bucket.start_grad_sync); NeMo 1 left it off
    assert get_framework("megatron-core-fa2").host_syncs.per_bucket == 1
    assert get_framework("nemo-launcher-2024h2").host_syncs.per_bucket == 0
    # the analytic and the event engines charge it alike (both read StagePieces.optimizer_s)
    gap_a = simulate_analytic(plan).step_time_s - simulate_analytic(quiet).step_time_s
    gap_e = simulate_event(plan).step_time_s - simulate_event(quiet).step_time_s
    assert gap_a == pytest.approx(gap_e, rel=0.05) and gap_a > 0


def test_mlperf_llama31_8b_nemo_implementation_as_cisco_ran_it() -> None:
    """The Cisco MLPerf v5.1 llama31_8b rows run NVIDIA's MLPerf NeMo 2 code (pretrain.py): bf16
    gradients, one gradient bucket per parameter tensor (bucket_size 64), and no comm-overlap
    callback, so the 128-GPU row's TP communication is not overlapped."""
    from planner.fitting.published import compare_run, load_runs

    runs = {r["id"]: r for r in load_runs()}
    c64 = compare_run(runs["mlperf51-cisco-llama31-8b-fp8-h100-64"])
    c128 = compare_run(runs["mlperf51-cisco-llama31-8b-fp8-h100-128"])
    for c in (c64, c128):
        assert c.framework == "nemo-mlperf-2025"
        assert c.plan.grad_buckets == "megatron_per_tensor" and c.plan.state_layout == "megatron_bf16_grads"
        assert c.predicted.fits_memory  # the 64-GPU row ran; fp32 gradients had put it over 80 GB
    assert c128.plan.strategy.tp == 2 and c128.plan.strategy.sp and not c128.plan.strategy.tp_overlap
    dell = compare_run(runs["mlperf51-dell-llama31-8b-fp8-b300-8"])
    assert dell.framework == "nemo"  # NVIDIA's own ngc25.09 code base: its pretrain.py is not at hand


# ----------------------------------------------------------------- A2A overlap: passes without a partner


def test_a2a_overlap_unpaired_passes_follow_megatron_core_schedules() -> None:
    """Megatron-Core core_v0.14.0: without pipelining the first forward and the last backward run
    alone (combined_1f1b.py); with interleaving the warm-up forwards, 2 (pp - r - 1) + (vp - 1) pp,
    plus the one extra A2A overlap schedules (schedules.py get_pp_rank_microbatches), and as many
    cool-down backwards; never more than the m * vp passes there are."""
    from sim.cost.step import a2a_unpaired_passes
    assert a2a_unpaired_passes(1, 1, 128, 0) == 1
    assert a2a_unpaired_passes(4, 6, 16, 0) == 2 * 3 + 5 * 4 + 1
    assert a2a_unpaired_passes(4, 6, 16, 3) == 5 * 4 + 1
    assert a2a_unpaired_passes(8, 2, 2, 0) == 4  # capped: every pass runs alone


def test_a2a_overlap_exposes_the_all_to_alls_of_unpaired_passes() -> None:
    """A plan with ep_overlap pays, per step, the all-to-all its paired passes hide (net of the
    overlap slowdown) once for each pass without a partner: closed form against the layers'
    sums, the event engine within 2% (as without the overlap), and nothing without the overlap."""
    from sim.data.specs import MoeSpec
    from sim.cost.step import a2a_unpaired_passes
    moe = Model(name="moe-16e", num_layers=8, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                ffn_hidden_size=14336, ffn_type="swiglu", vocab_size=128256,
                moe=MoeSpec(num_experts=16, top_k=4, expert_ffn_hidden_size=2048))
    for pp, vp in ((1, 1), (2, 2)):
        kw = dict(tp=1, pp=pp, vp=vp, dp=16 // pp, ep=16 // pp, mbs=1, gbs=8 * 16 // pp, seq_len=4096, sp=False,
                  schedule="interleaved" if vp > 1 else "1f1b")
        on = _plan("megatron-core", moe, "h100-80gb", 16, ep_overlap=True, **kw)
        off = replace(on, strategy=replace(on.strategy, ep_overlap=False))
        costs = step_costs(on)
        hidden = [sum(c.a2a_hidden_fwd_s + c.a2a_hidden_bwd_s for c in st.layer_costs) for st in costs.stages]
        assert all(h > 0 for h in hidden)
        assert all(sum(c.a2a_hidden_fwd_s for c in st.layer_costs) == 0 for st in step_costs(off).stages)
        a = simulate_analytic(on)
        m = on.strategy.num_microbatches
        paired = m * sum(c.exposed_ep_fwd_s + c.exposed_ep_bwd_s for c in costs.stages[0].layer_costs)
        alone = a2a_unpaired_passes(pp, vp, m, 0) / vp * hidden[0]
        if pp == 1:  # one stage: the breakdown's exposed EP is the paired passes' plus the lone ones'
            assert a.breakdown.exposed_ep_s == pytest.approx(paired + alone, rel=1e-9)
        assert simulate_event(on).step_time_s == pytest.approx(a.step_time_s, rel=0.02)
