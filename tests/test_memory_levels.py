"""Memory per rank (issue 22): framework model-state layouts, peak moment, partial
recomputation and offload keys, the three levels, per-stage report, and PyTorch's own tracker
on a sample of ``validate.memgrid.GRID`` (the whole grid: ``planner validate memory``)."""

from __future__ import annotations

import json

import pytest

from sim.data.catalog import get_model
from sim.net.clusters import cluster_from_catalog
from sim.base.errors import InputError
from sim.cost.framework import apply_framework, get_framework
from sim.cost.memory import plan_memory, recompute_split
from sim.cost.plan import Plan, parse_strategy
from sim.data.runtime import state_layout
from sim.layers.stages import StageParams


def _plan(model: str, n: int, strategy: str, framework: str = "megatron-core", gpu: str = "h100-80gb") -> Plan:
    cl = cluster_from_catalog(gpu=gpu, num_gpus=n)
    s = parse_strategy(strategy, num_gpus=n)
    return Plan(**apply_framework({"model": get_model(model), "cluster": cl, "strategy": s}, get_framework(framework)))


def test_megatron_distributed_optimizer_bytes_per_param():
    """Megatron-LM docs/source/distrib_optimizer.md: bf16 params with fp32 grads = 6 + 12/d bytes."""
    from sim.cost.memory import model_state_bytes
    from sim.data.specs import Strategy

    p = StageParams(1e9, 0.0)
    for d in (1, 4, 64):
        s = Strategy(dp=d, gbs=d, zero=1 if d > 1 else 0)
        w, g, o = model_state_bytes(p, s, state_layout("megatron"))
        assert w + g + o == pytest.approx((6 + 12 / d) * 1e9 if d > 1 else 18e9)
    w, g, o = model_state_bytes(p, Strategy(dp=8, gbs=8, zero=3), state_layout("torch_amp"))
    assert (w, g, o) == pytest.approx((4e9 / 8, 4e9 / 8, 8e9 / 8))  # FSDP2: fp32 master shards


def test_fsdp_with_pipelining_keeps_unsharded_weights_and_fp32_grad_accumulators():
    """torchtitan: no reshard after forward with pp, gradients accumulated unsharded in fp32 until
    the last micro-batch (torch.distributed.pipelining stage.py, FSDP2 to_accumulated_grad_if_needed)."""
    plain = plan_memory(_plan("llama3-8b", 16, "pp=2,dp=8,mbs=1,gbs=16,seq=8192,zero=3,recompute=full",
                              "torchtitan"))
    nopp = plan_memory(_plan("llama3-8b", 8, "dp=8,mbs=1,gbs=16,seq=8192,zero=3,recompute=full", "torchtitan"))
    params = get_model("llama3-8b").num_params / 2
    assert plain.weights_bytes > 2 * params * 0.9  # a stage's bf16 weights, unsharded
    assert plain.gradients_bytes == pytest.approx(4 * params, rel=0.15)  # fp32, the stage unsharded
    assert nopp.gradients_bytes == pytest.approx(4 * 2 * params / 8, rel=0.01)  # fp32 shards of the whole model


def test_fsdp_with_pipelining_gathers_and_reduces_once_per_step():
    """torchtitan FSDP2 with pp: no per-micro-batch all-gathers/reduce-scatters; both once per
    step, exposed (sim.cost.step.stage_pieces pipelined_fsdp)."""
    from sim.cost.costs import step_costs

    pp = step_costs(_plan("llama3-8b", 16, "pp=2,dp=8,mbs=1,gbs=64,seq=8192,zero=3,recompute=full", "torchtitan"))
    flat = step_costs(_plan("llama3-8b", 8, "dp=8,mbs=1,gbs=64,seq=8192,zero=3,recompute=full", "torchtitan"))
    for st in pp.stages:
        assert st.pieces.zero3_exposed_fwd_s == 0 and st.pieces.zero3_exposed_bwd_s == 0 and st.pieces.fsdp_step_sync_s > 0
    assert all(st.pieces.fsdp_step_sync_s == 0 for st in flat.stages)
    mega = step_costs(_plan("llama3-8b", 16, "pp=2,dp=8,mbs=1,gbs=64,seq=8192,zero=3,recompute=full"))
    assert all(st.pieces.fsdp_step_sync_s == 0 for st in mega.stages)  # Megatron-FSDP keeps its per-micro-batch traffic


def test_fp8_saved_inputs_lower_transformer_engine_activations():
    bf16 = plan_memory(_plan("llama3-8b", 8, "tp=2,dp=4,mbs=1,gbs=64,seq=8192,sp=1,recompute=none,zero=1"))
    fp8 = plan_memory(_plan("llama3-8b", 8, "tp=2,dp=4,mbs=1,gbs=64,seq=8192,sp=1,recompute=none,zero=1,"
                                           "precision=fp8"))
    assert fp8.activations_bytes < bf16.activations_bytes


def test_partial_recomputation_between_none_and_full():
    base = "pp=1,dp=8,mbs=1,gbs=64,seq=8192,zero=1,sp=0"
    acts = {}
    for rc in ("recompute=none", "recompute=full,recompute_num_layers=8,recompute_method=block",
               "recompute=full,recompute_num_layers=24,recompute_method=block", "recompute=full",
               "recompute=full,recompute_num_layers=4"):
        acts[rc] = plan_memory(_plan("llama3-8b", 8, f"{base},{rc}")).activations_bytes
    v = list(acts.values())
    assert v[0] > v[1] > v[2] > v[3]
    assert v[4] != v[3]  # uniform groups of 4: fewer inputs kept, four layers rebuilt at once


def test_recompute_split_megatron_methods():
    from sim.data.specs import Strategy

    s = Strategy(recompute="full", recompute_num_layers=2, recompute_method="block")
    assert recompute_split(s, 8) == (0.25, 0.75, 1.0)
    assert recompute_split(s.with_(recompute_method="uniform"), 8) == (0.5, 0.0, 2.0)
    assert recompute_split(Strategy(recompute="full"), 8) == (1.0, 0.0, 1.0)


@pytest.mark.parametrize("text,field", [("recompute=selective,recompute_num_layers=2", "recompute_num_layers"),
                                        ("recompute=full,recompute_method=block", "recompute_method"),
                                        ("recompute=full,recompute_num_layers=0", "recompute_num_layers"),
                                        ("offload_num_layers=2", "offload_num_layers")])
def test_partial_keys_bad_input(text, field):
    with pytest.raises(InputError) as e:
        parse_strategy("tp=1,pp=1,dp=8,mbs=1,gbs=8," + text, num_gpus=8)
    assert field in str(e.value)


def test_strategy_string_round_trips_partial_keys():
    text = "tp=1,pp=1,dp=8,mbs=1,gbs=8,recompute=full,recompute_num_layers=3,recompute_method=block"
    s = parse_strategy(text, num_gpus=8)
    assert parse_strategy(s.to_string(), num_gpus=8) == s
    off = parse_strategy("dp=8,mbs=1,gbs=8,zero=1,offload=activations,offload_num_layers=4", num_gpus=8)
    assert parse_strategy(off.to_string(), num_gpus=8) == off


def test_three_levels_and_per_stage_report():
    mem = plan_memory(_plan("llama3-70b", 32, "tp=8,pp=4,mbs=1,gbs=64,seq=4096,sp=1,zero=1,recompute=selective"))
    assert mem.allocated_bytes < mem.reserved_bytes < mem.device_bytes == mem.total_bytes
    assert len(mem.by_stage) == 4
    peak = max(mem.by_stage, key=lambda x: x["memory_device_bytes"])
    assert peak["stage"] == mem.stage and peak["memory_device_bytes"] == pytest.approx(mem.device_bytes)
    assert len({round(x["memory_device_bytes"]) for x in mem.by_stage}) > 1  # stages differ


def test_simulate_json_has_three_levels(capsys):
    from planner.cli import main

    code = main(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--strategy",
                 "tp=2,pp=2,dp=4,mbs=1,gbs=64,sp=1,zero=1,recompute=full,recompute_num_layers=4,"
                 "recompute_method=block", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["memory_peak_bytes"] < out["memory_reserved_bytes"] < out["memory_device_bytes"]
    assert [x["stage"] for x in out["memory_by_stage"]] == [0, 1]
    assert out["fits_memory"] == (out["memory_device_bytes"] <= out["memory_capacity_bytes"])
    assert out["nvls"] is True  # megatron-core leaves NCCL's NVLS on
    main(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--strategy",
          "tp=2,pp=2,dp=4,mbs=1,gbs=64,sp=1,zero=1", "--framework", "nemo", "--json"])
    assert json.loads(capsys.readouterr().out)["nvls"] is False  # NeMo's launchers: NCCL_NVLS_ENABLE=0
    main(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--strategy",
          "tp=2,pp=2,dp=4,mbs=1,gbs=64,sp=1,zero=1"])
    text = capsys.readouterr().out
    assert "allocated" in text and "reserved" in text and "device" in text


def test_megatron_export_writes_and_reads_back_partial_keys(tmp_path):
    from planner.exports import LaunchSpec, render
    from planner.exports.megatron import megatron_args
    from planner.exports.readback import read_back

    def strategy_from_megatron(spec: LaunchSpec):  # the files as written, read as `planner import` reads them
        return read_back("megatron", render("megatron", spec).files, model=spec.model, num_gpus=spec.num_gpus)

    plan = _plan("llama3-8b", 8, "tp=2,pp=1,dp=4,mbs=1,gbs=32,sp=1,zero=1,recompute=full,recompute_num_layers=4,"
                               "recompute_method=block")
    spec = LaunchSpec(model=plan.model, strategy=plan.strategy, num_gpus=8, gpus_per_node=8)
    args, _ = megatron_args(spec)
    assert "--recompute-method" in args and args[args.index("--recompute-method") + 1] == "block"
    back = strategy_from_megatron(spec)
    assert back.recompute_num_layers == 4 and back.recompute_method == "block"
    off = _plan("llama3-8b", 8, "tp=2,pp=1,dp=4,mbs=1,gbs=32,sp=1,zero=1,offload=activations,offload_num_layers=8")
    spec = LaunchSpec(model=off.model, strategy=off.strategy, num_gpus=8, gpus_per_node=8)
    args, _ = megatron_args(spec)
    assert args[args.index("--cpu-offloading-num-layers") + 1] == "8"
    back = strategy_from_megatron(spec)
    assert back.offload == "activations" and back.offload_num_layers == 8


def test_torchtitan_export_refuses_partial_recompute():
    from planner.exports import LaunchSpec
    from planner.exports.torchtitan import torchtitan_config

    plan = _plan("llama3-8b", 8, "dp=8,mbs=1,gbs=8,zero=3,recompute=full,recompute_num_layers=4,"
                               "recompute_method=block", "torchtitan")
    with pytest.raises(InputError):
        torchtitan_config(LaunchSpec(model=plan.model, strategy=plan.strategy, num_gpus=8, gpus_per_node=8))


def test_search_offers_partial_recomputation_priced_as_simulate():
    from planner.plans.search import SearchSpace, search
    from sim.engines.analytic import simulate_analytic

    model, cl = get_model("llama3-8b"), cluster_from_catalog(gpu="h100-80gb", num_gpus=8)
    kw = {k: v for k, v in apply_framework({}, get_framework("megatron-core")).items()}
    space = SearchSpace(tp=(2,), pp=(2,), cp=(1,), mbs=(1,), zero=(1,), sp=(True,), recompute=("none", "full"),
                        offload=("none",), vp=(1,), schedule=("1f1b",))
    r = search(model, cl, gbs=64, seq_len=8192, space=space, plan_kwargs=kw, dp_overlap=True)
    partial = [i for i in range(r.evaluated) if r.strategy(i).recompute_num_layers is not None]
    assert partial
    for i in partial:
        s = r.strategy(i)
        res = simulate_analytic(r.fastmodel.plan(s), net=r.fastmodel.net)
        assert r.candidates.step_time_s[i] == pytest.approx(res.step_time_s, rel=1e-9)
        assert r.candidates.memory_device_bytes[i] == pytest.approx(res.memory_device_bytes, rel=1e-9)


def test_every_reference_row_with_memory_states_its_level():
    from planner.fitting.reference import load_reference

    for ref in load_reference():
        me = ref.raw["measured"]
        if me.get("memory_gib_per_gpu") is not None:
            kind = str(me.get("memory_kind") or "")
            assert any(k in kind for k in ("allocated", "reserved", "device")), ref.id


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("index", [0, 5, 8, 13, 14, 16, 18, 21, 25, 28, 29, 34, 35, 36, 37, 38, 40])
def test_tracker_agrees_with_the_planner_per_category(index):
    """A fixed sample of the grid (the rest: ``planner validate memory``): each category and the
    total within 3% of PyTorch's MemTracker/FSDPMemTracker (tolerance: issue 22)."""
    from validate.memgrid import build_plan, compare, GRID

    model_id, layers, n, text = GRID[index]
    row = compare(build_plan(model_id, layers, n, text))
    bad = {c: r for c, r in row["categories"].items() if not r["within_tolerance"]}
    assert not bad, (text, bad)


def test_transformer_engine_fp8_weight_cache_counts_two_bytes_per_linear_weight():
    """Megatron-Core passes is_first_microbatch, so TE caches each linear weight's fp8 copy and
    its transpose for the step (runtime.yaml fp8_weight_cache_bytes_per_param): with fp8, the
    weights grow by 2 B per local linear weight (the layers' parameters less their norms)."""
    from sim.data.runtime import default_runtime

    base = "tp=2,dp=4,mbs=1,gbs=64,seq=8192,sp=1,recompute=none,zero=1"
    bf16 = plan_memory(_plan("llama3-8b", 8, base))
    fp8 = plan_memory(_plan("llama3-8b", 8, base + ",precision=fp8"))
    m = get_model("llama3-8b")
    h, kv = m.hidden_size, m.num_kv_heads * m.hidden_size // m.num_attention_heads
    linear = m.num_layers * (h * (2 * h + 2 * kv) + 3 * h * m.ffn_hidden_size) / 2  # QKV, out, SwiGLU; tp=2
    assert default_runtime().fp8_weight_cache_bytes_per_param == 2.0
    assert fp8.weights_bytes - bf16.weights_bytes == pytest.approx(2.0 * linear, rel=1e-9)


def test_fsdp2_sharded_gradients_reserved_in_the_reduce_scatter_stream_pool():
    """FSDP2 allocates the reduce-scatter output (the sharded gradients) in its own stream, and
    the all-gather outputs in its all-gather copy-in stream; the caching allocator cannot reuse
    the default stream's blocks for either, so the reserved level is the default stream's peak
    (with its slack) plus the sharded fp32 gradients (4 B x N / dp) plus two gathered units in
    bf16 (the largest pair: a layer and the embedding / output layer)."""
    from sim.data.runtime import default_runtime

    rt = default_runtime()
    p = _plan("llama3-8b", 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=3,recompute=full", "torchtitan")
    mem = plan_memory(p)
    assert mem.gradients_bytes == 0.0  # peak before any backward: the shards do not exist yet
    m = get_model("llama3-8b")
    sharded_grads = 4.0 * m.num_params / 8
    head = m.embedding_params + m.hidden_size  # the output layer and the final norm: one FSDP unit
    layer = (m.num_params - head - m.embedding_params) / m.num_layers
    gather_pool = 2.0 * (layer + head)
    frag = rt.fragmentation["expandable_segments"]["full"]  # torchtitan's launcher, full recomputation
    expect = mem.allocated_bytes * (1 + frag) + rt.workspace_bytes + sharded_grads + gather_pool
    assert mem.reserved_bytes == pytest.approx(expect, rel=1e-9)
    ddp = plan_memory(_plan("llama3-8b", 8, "dp=8,mbs=1,gbs=8,seq=8192,zero=0,recompute=full", "torchtitan"))
    assert ddp.reserved_bytes == pytest.approx(ddp.allocated_bytes * (1 + frag)
                                               + rt.workspace_bytes, rel=1e-9)


def test_nvls_buffers_per_communicator_on_nvswitch_with_multicast():
    """NCCL 2.18-2.20 ncclNvlsSetup (Hopper runs' default release, 2.19): 16 channels x 2 x (4 MiB + 2 MiB) per NVLS
    head, one head per GPU of the group in the NVLink domain, groups of more than two GPUs only:
    1.5 GiB for an 8-GPU group (NVIDIA/nccl #864: ~1.6 GB for one all-reduce communicator on
    H100); none on A100 (no multicast) and none for a 2-GPU tensor-parallel group."""
    from sim.data.runtime import device_extra_bytes, group_local_ranks, nvls_buffers
    from sim.data.specs import Strategy

    model = get_model("llama3-8b")
    hopper = nvls_buffers("hopper", multicast=True)
    tp8 = Strategy(tp=8, gbs=1)
    off = device_extra_bytes(tp8, model)
    on = device_extra_bytes(tp8, model, nvls=hopper, domain_gpus=8)
    assert on - off == pytest.approx(16 * 2 * 6 * 2**20 * 8)
    tp2 = Strategy(tp=2, dp=4, gbs=4, zero=1)  # tp: 2 GPUs (none); dp: 4 GPUs at stride 2 (4 heads)
    assert (device_extra_bytes(tp2, model, nvls=hopper, domain_gpus=8) - device_extra_bytes(tp2, model)
            == pytest.approx(16 * 2 * 6 * 2**20 * 4))
    assert group_local_ranks(((8, 1), (4, 8)), 8) == 8 and group_local_ranks(((2, 8),), 8) == 1
    h100 = plan_memory(_plan("llama3-8b", 8, "tp=8,mbs=1,gbs=8,seq=4096,sp=1", gpu="h100-80gb"))
    a100 = plan_memory(_plan("llama3-8b", 8, "tp=8,mbs=1,gbs=8,seq=4096,sp=1", gpu="a100-80gb"))
    assert h100.device_bytes - h100.reserved_bytes > a100.device_bytes - a100.reserved_bytes + 1.5 * 2**30
    assert nvls_buffers("ampere", multicast=False) is None
    with pytest.raises(ValueError, match="hopper"):  # a multicast GPU without a stated NCCL release
        nvls_buffers("volta", multicast=True)


def test_nvls_buffers_follow_each_generation_nccl_and_stop_at_its_head_limit():
    """The term is bounded by NCCL's NVLS arity (src/include/device.h NCCL_MAX_NVLS_ARITY: 8
    through 2.20, 32 after), not linear in the NVLink domain.  Blackwell runs use NCCL 2.27 by
    default (PyTorch 2.9-2.10 wheels pin 2.27.5), whose ncclNvlsBufferSetup sizes a head by
    NCCL_NVLS_CHUNKSIZE x NCCL_STEPS (128 KiB x 8) on NVLS_NCHANNELS_SM100_NVL = 24 channels
    inside one node or NVL72 rack: 24 x 2 x 1 MiB = 48 MiB per head, 1.5 GiB at most for a dp
    group inside an NVL72 rack."""
    from sim.data.runtime import device_extra_bytes, nvls_buffers
    from sim.data.specs import Strategy

    model = get_model("llama3-8b")
    blackwell, hopper = nvls_buffers("blackwell", multicast=True), nvls_buffers("hopper", multicast=True)
    assert blackwell.nccl == "2.27" and hopper.nccl == "2.18"  # the rules the default releases fall under
    dp72 = Strategy(dp=72, gbs=72, zero=1)
    base = device_extra_bytes(dp72, model)
    nvl72 = device_extra_bytes(dp72, model, nvls=blackwell, domain_gpus=72) - base
    assert nvl72 == pytest.approx(24 * 2 * 2**20 * 32)  # 32 heads, not 72
    assert blackwell.group_bytes(8) == pytest.approx(384 * 2**20)  # 4x below the 2.18-2.20 buffers
    assert blackwell.group_bytes(8, 16) == pytest.approx(512 * 2**20)  # across two domains: 32 channels
    assert hopper.group_bytes(32) == hopper.group_bytes(8) == pytest.approx(1.5 * 2**30)
    gb200 = plan_memory(_plan("llama3-8b", 72, "tp=1,dp=72,mbs=1,gbs=72,seq=4096,zero=1", gpu="gb200-186gb"))
    b200 = plan_memory(_plan("llama3-8b", 72, "tp=1,dp=72,mbs=1,gbs=72,seq=4096,zero=1", gpu="b200-180gb"))
    # Megatron's dp, dp-without-cp and default groups: inside the rack, 32 heads of 24 channels
    # each; on 8-GPU nodes, 8 heads of a group spanning nodes, on 32 channels
    assert gb200.device_bytes - b200.device_bytes == pytest.approx(3 * 2 * 2**20 * (24 * 32 - 32 * 8))


def test_nvls_buffers_follow_the_nccl_release():
    """Each NCCL release's NVLS layout (src/transport/nvls.cc at each tag): 2.18-2.20 16 channels
    x 2 x (4 MiB NCCL_BUFFSIZE + 2 MiB alignment) per head, arity 8; 2.21 the 1 MiB chunked
    buffer still with the 2 MiB alignment, arity 32; 2.22 on 1 MiB only.  NCCL 2.20's
    ncclNvlsInit returns without NVLS for a communicator across nodes (v2.20.3 line 240,
    ``comm->nNodes > 1``); 2.18-2.19 and 2.21 on build NVLSTree there.  On two 8-GPU H100 nodes
    with tp 2 x dp 8, Megatron's dp, dp-without-cp and default groups span both nodes: with 2.20
    they map none, the tp group (2 GPUs) none either; with tp 8 x dp 2 the tp group (one node)
    keeps its buffers.  A reference row's ``nccl`` release and ``--nccl`` set ``Plan.nccl``."""
    from dataclasses import replace

    from planner.fitting.published import compare_run, load_runs
    from sim.base.errors import InputError
    from sim.data.runtime import nvls_buffers

    def head(release: str, arch: str = "hopper") -> float:
        return nvls_buffers(arch, multicast=True, nccl=release).group_bytes(8)

    assert head("2.18.3") == head("2.19") == head("2.20.5") == pytest.approx(16 * 2 * 6 * 2**20 * 8)
    assert head("2.21.5") == pytest.approx(16 * 2 * 3 * 2**20 * 8)
    assert head("2.22.3") == head("2.30.7") == pytest.approx(16 * 2 * 2**20 * 8)
    assert head("2.26.2", "blackwell") == pytest.approx(32 * 2 * 2**20 * 8)  # NVLS_NCHANNELS_SM100
    assert nvls_buffers("hopper", multicast=True, nccl="2.20.3").group_bytes(4, 16) == 0.0
    assert nvls_buffers("hopper", multicast=True, nccl="2.21.5").group_bytes(4, 16) > 0.0
    for bad in ("2.17.1", "two", "2"):
        with pytest.raises(InputError, match="nccl"):
            nvls_buffers("hopper", multicast=True, nccl=bad)
    hopper_group = 16 * 12582912 * 4  # 4 heads: the group's GPUs inside one node
    for text, lost in (("tp=2,dp=8,mbs=1,gbs=16,seq=4096,zero=1", 2 * hopper_group + 16 * 12582912 * 8),
                       ("tp=8,dp=2,mbs=1,gbs=16,seq=4096,zero=1", 16 * 12582912 * 8)):
        plan = _plan("llama3-8b", 16, text)
        across = plan_memory(plan).device_bytes
        inside = plan_memory(replace(plan, nccl="2.20.3")).device_bytes
        assert across - inside == pytest.approx(lost), text
        assert plan.nvls_multinode and not replace(plan, nccl="2.20.3").nvls_multinode
    with pytest.raises(InputError, match="nccl"):
        replace(_plan("llama3-8b", 16, "tp=8,dp=2,mbs=1,gbs=16,seq=4096,zero=1"), nccl="2.x")
    rows = {r["id"]: r for r in load_runs()}
    assert compare_run(rows["flagperf-llama3-70b-bf16-h100-64"]).plan.nccl == "2.20.3"
    assert compare_run(rows["flagperf-llama2-70b-bf16-h800-32-tp8pp4-gbs44"]).plan.nvls_multinode


def test_event_engine_prices_fsdp_with_pipelining_once_per_step_like_the_analytic_engine():
    """torchtitan FSDP2 with pp: both engines charge one exposed gather + reduce-scatter per step
    (fsdp_step_sync_s) and no per-micro-batch ZeRO-3 traffic."""
    from sim.layers.compute import default_efficiency
    from sim.cost.costs import default_network, step_costs
    from sim.engines.event.engine import Engine
    from sim.engines.event.resources import LinkTable
    from sim.engines.event.scenario import Scenario
    from sim.engines.simulate import simulate

    plan = _plan("llama3-8b", 16, "pp=2,dp=8,mbs=1,gbs=64,seq=8192,zero=3,recompute=full", "torchtitan")
    an, ev = simulate(plan, engine="analytic"), simulate(plan, engine="event")
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.03)
    net, eff = default_network(plan.cluster), default_efficiency()
    eng = Engine(Scenario(plan, step_costs(plan, net, eff), net), LinkTable(net),
                 overlap_slowdown=eff.overlap_compute_slowdown)
    eng.run()
    log = eng.log + eng.comm_log()
    assert not [e for e in log if "all-gather" in e.name or "reduce-scatter F" in e.name]
    assert sum("after the last schedule" in e.name for e in log) == len(eng.sc.units)
    assert not [e for e in log if "between schedules" in e.name]


def test_fsdp_with_pipelining_syncs_once_per_schedule_in_both_engines():
    """NeMo Automodel runs one pipeline schedule per local batch (Plan.pipeline_flushes); each
    schedule.step ends with PipelineStage.perform_reduce_grad (FSDP post-backward: reduce-scatter
    and reshard), so a step of k schedules pays k exposed syncs: the analytic engine adds stage
    0's (k - 1) between schedules, the event engine logs one per stage between schedules."""
    from dataclasses import replace

    from sim.layers.compute import default_efficiency
    from sim.cost.costs import default_network, step_costs
    from sim.engines.event.engine import Engine
    from sim.engines.event.resources import LinkTable
    from sim.engines.event.scenario import Scenario
    from sim.engines.simulate import simulate

    one = _plan("llama3-8b", 16, "pp=2,dp=8,mbs=1,gbs=64,seq=8192,zero=3,recompute=full", "automodel")
    two = replace(one, pipeline_flushes=2)
    net, eff = default_network(one.cluster), default_efficiency()
    costs = step_costs(two, net, eff)
    sync0 = costs.stages[0].pieces.fsdp_step_sync_s
    assert sync0 > 0
    # two schedules: each adds its fill and drain, and the first ends with stage 0's sync
    assert simulate(two, engine="analytic").step_time_s > simulate(one, engine="analytic").step_time_s + sync0
    eng = Engine(Scenario(two, costs, net), LinkTable(net), overlap_slowdown=eff.overlap_compute_slowdown)
    eng.run()
    between = [e for e in eng.log if "between schedules" in e.name]
    assert len(between) == len(eng.sc.units)  # k - 1 = 1 per stage
    assert all(e.end - e.start == pytest.approx(costs.stages[eng.sc.units[e.unit].stage].pieces.fsdp_step_sync_s)
               for e in between)
    an, ev = simulate(two, engine="analytic"), simulate(two, engine="event")
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.03)


def test_reserved_slack_follows_the_allocator_and_the_recomputation_mode():
    """Megatron-Core runs PyTorch's default caching allocator; the reserved level is the
    allocated peak plus the replayed slack of its recomputation mode (runtime.yaml
    memory.fragmentation), plus the cuBLAS workspaces; the same plan under
    expandable_segments keeps less."""
    from dataclasses import replace

    from sim.data.runtime import default_runtime

    rt = default_runtime()
    for rc in ("none", "selective", "full"):
        p = _plan("llama3-8b", 8, f"tp=2,dp=4,mbs=1,gbs=8,seq=8192,zero=1,recompute={rc}")
        assert p.allocator == "caching"
        mem = plan_memory(p)
        frag = rt.fragmentation["caching"][rc]
        assert mem.reserved_bytes == pytest.approx(mem.allocated_bytes * (1 + frag) + rt.workspace_bytes, rel=1e-9)
        grown = plan_memory(replace(p, allocator="expandable_segments"))
        assert grown.allocated_bytes == mem.allocated_bytes
        assert grown.reserved_bytes < mem.reserved_bytes


def test_fp8_parameters_save_two_bytes_per_linear_weight():
    """Megatron-Core --fp8-param-gather (Strategy.fp8_params): the linear weights are 1-byte
    parameters instead of bf16 (-1 B) and the fp8 weight cache's copy is the parameter itself
    (-1 B; the transpose stays): 2 B per local linear weight less than fp8 without it.  Under
    Megatron FSDP (zero=3) the parameter saving is sharded and the gathered layers shrink."""
    from sim.data.runtime import default_runtime

    base = "tp=2,dp=4,mbs=1,gbs=64,seq=8192,sp=1,recompute=none,precision=fp8"
    m = get_model("llama3-8b")
    h, kv = m.hidden_size, m.num_kv_heads * m.hidden_size // m.num_attention_heads
    linear = m.num_layers * (h * (2 * h + 2 * kv) + 3 * h * m.ffn_hidden_size) / 2  # QKV, out, SwiGLU; tp=2
    assert default_runtime().fp8_param_bytes_per_param == 1.0
    fp8 = plan_memory(_plan("llama3-8b", 8, base + ",zero=1"))
    params = plan_memory(_plan("llama3-8b", 8, base + ",zero=1,fp8_params=1"))
    assert fp8.weights_bytes - params.weights_bytes == pytest.approx(2.0 * linear, rel=1e-9)
    assert params.activations_bytes == fp8.activations_bytes
    fsdp = plan_memory(_plan("llama3-8b", 8, base + ",zero=3"))
    fsdp_params = plan_memory(_plan("llama3-8b", 8, base + ",zero=3,fp8_params=1"))
    # sharded parameters 1 B / dp, the cache's fp8 copy 1 B, two gathered layers 1 B each
    saved = linear / 4 + linear + 2 * linear / m.num_layers
    assert fsdp.weights_bytes - fsdp_params.weights_bytes == pytest.approx(saved, rel=1e-9)


def test_fp8_parameters_need_fp8_and_a_profile_that_keeps_them():
    from sim.base.errors import InfeasibleError, InputError
    from sim.cost.framework import check_supported

    with pytest.raises(InputError) as e:
        parse_strategy("tp=2,dp=4,zero=1,fp8_params=1", num_gpus=8)
    assert e.value.field == "fp8_params"
    s = parse_strategy("tp=2,dp=4,zero=1,sp=1,precision=fp8,fp8_params=1", num_gpus=8)
    assert parse_strategy(s.to_string(), num_gpus=8) == s and "fp8_params=1" in s.to_string()
    check_supported(get_framework("megatron-core"), s)
    for fw, changes in (("torchtitan", {"zero": 3, "fp8_recipe": "tensorwise"}), ("megatron-core-fa2", {}),
                        ("megatron-core", {"zero": 0})):
        with pytest.raises(InfeasibleError) as e:
            check_supported(get_framework(fw), s.with_(**changes))
        assert "fp8_params" in str(e.value)


def test_reference_rows_that_name_fp8_parameters_run_with_them():
    from planner.fitting.published import compare_all

    row = compare_all(ids=["mlperf50-nvidia-llama31-405b-fp8-h100-512"])[0]
    assert row.plan.strategy.fp8_params  # "FP8_PARAMS/fp8 param gather" in the row's precision


def test_zero_engine_step_keeps_a_segment_for_the_fp32_gradient_copy():
    """DeepSpeed's ZeRO engine flattens the 16-bit gradient partition and copies it to fp32 at the
    optimizer step (stage3.py _prepare_fp32_grad_for_sub_group; per sub-group of at most 1e9
    parameters under ZeRO-3): 2 + 4 B per partition parameter at the step, and the fp32 copy's
    own segment stays reserved (no cached activation block holds GBs).  Offloaded optimizers copy
    to the host instead; Megatron's optimizer adds nothing."""
    from sim.data.runtime import default_runtime

    rt = default_runtime()
    frag = rt.fragmentation["caching"]["none"]
    part = get_model("llama3-8b").num_params / 8  # 1.004e9: ZeRO-3 caps the sub-group at 1e9, ZeRO-1 does not
    for strategy, sub in (("dp=8,mbs=1,gbs=8,seq=4096,zero=3,recompute=none", 1e9),
                          ("dp=8,mbs=1,gbs=8,seq=4096,zero=1,recompute=none", part)):
        mem = plan_memory(_plan("llama3-8b", 8, strategy, "deepspeed-hf"))
        assert mem.reserved_bytes == pytest.approx(mem.allocated_bytes * (1 + frag) + rt.workspace_bytes
                                                   + 4.0 * sub, rel=1e-9)
    big = plan_memory(_plan("llama3-70b", 8, "dp=8,mbs=1,gbs=8,seq=4096,zero=3,recompute=full", "deepspeed-hf"))
    frag_full = rt.fragmentation["caching"]["full"]
    assert big.reserved_bytes == pytest.approx(big.allocated_bytes * (1 + frag_full) + rt.workspace_bytes
                                               + 4.0 * 1e9, rel=1e-9)  # capped at sub_group_size
    meg = plan_memory(_plan("llama3-8b", 8, "tp=2,dp=4,mbs=1,gbs=8,seq=4096,zero=1,recompute=none"))
    assert meg.reserved_bytes == pytest.approx(meg.allocated_bytes * (1 + frag) + rt.workspace_bytes, rel=1e-9)


def test_nemo_performance_scripts_keep_bf16_gradients():
    """NeMo's scripts/performance (nemo-2025h1) set grad_reduce_in_fp32=False: for fp8 runs in
    set_primary_perf_configs, for every run through the performance_mode recipes' optimizations:
    a bf16 main_grad buffer, reduced in half the bytes.  fp8 runs keep the distributed optimizer's
    fp32 copy of the gradient shard, Megatron-LM's 'float16 parameters, float16 gradients: 4 +
    16/d' bytes per parameter; bf16 runs get the precision-aware optimizer (set_primary_perf_configs
    line 423): master weights as 16-bit remainders beside the bf16 parameters, the bf16 gradient
    shard read as it is, Adam m, v in fp32: 4 + 10/d.  The nemo profile keeps fp32 gradients
    (6 + 12/d).  fp8 parameters gather 1 byte per parameter."""
    from dataclasses import replace

    from sim.cost.costs import plan_comm_runtime
    from sim.cost.memory import model_state_bytes
    from sim.data.runtime import state_layout
    from sim.data.specs import Strategy

    fp8 = _plan("llama3-8b", 16, "tp=2,dp=8,mbs=1,gbs=64,seq=8192,zero=1,sp=1,precision=fp8", "nemo-2025h1")
    bf16_perf = _plan("llama3-8b", 16, "tp=2,dp=8,mbs=1,gbs=64,seq=8192,zero=1,sp=1", "nemo-2025h1")
    bf16 = _plan("llama3-8b", 16, "tp=2,dp=8,mbs=1,gbs=64,seq=8192,zero=1,sp=1", "nemo")
    assert fp8.model_states_layout == "megatron_bf16_grads"
    assert bf16_perf.model_states_layout == "megatron_remainders"
    assert bf16.model_states_layout == "megatron"
    assert _plan("llama3-8b", 16, "tp=2,dp=8,mbs=1,gbs=64,seq=8192,zero=1,sp=1,precision=fp8",
                 "nemo").model_states_layout == "megatron"
    p = StageParams(1e9, 0.0)
    for d in (1, 8):
        s = Strategy(dp=d, gbs=d, zero=1 if d > 1 else 0)
        w, g, o = model_state_bytes(p, s, state_layout("megatron_bf16_grads"))
        assert w + g + o == pytest.approx((4 + 16 / d) * 1e9 if d > 1 else 20e9)
        w, g, o = model_state_bytes(p, s, state_layout("megatron_remainders"))
        assert (w, g) == (2e9, 2e9) and o == pytest.approx(10e9 / d)
        w, g, o = model_state_bytes(p, s, state_layout("megatron_remainders_fp32_grads"))
        assert (w, g) == (2e9, 4e9) and o == pytest.approx(10e9 / d)
    assert plan_comm_runtime(bf16_perf).grad_reduce_bytes_per_param == 2
    assert plan_comm_runtime(fp8).grad_reduce_bytes_per_param == 2
    assert plan_comm_runtime(bf16).grad_reduce_bytes_per_param == 4
    assert plan_comm_runtime(fp8).param_gather_bytes_per_param == 2
    with_params = replace(fp8, strategy=replace(fp8.strategy, fp8_params=True))
    assert plan_comm_runtime(with_params).param_gather_bytes_per_param == 1
    assert plan_memory(fp8).gradients_bytes == pytest.approx(plan_memory(bf16).gradients_bytes / 2)


def test_alltoall_buffers_drop_to_two_channels_and_a_shared_pool_once_the_group_leaves_nvlink():
    """NCCL v2.21.5: a p2p communicator uses the minimum channel count over its peers
    (graph/paths.cc ncclTopoComputeP2pChannels), 2 for a peer across the network; network peers
    share one pool per direction (transport/net.cc sharedNetBuffersInit: 32 x 16 x 128 KiB).
    Inside one NVLink domain every peer keeps #1685's ~0.47 GB (32 channels)."""
    from sim.data.runtime import device_extra_bytes, device_memory
    from sim.data.specs import Strategy

    a2a = device_memory().alltoall
    per_peer = 4.7e8
    assert a2a.group_bytes(8, 8, nvlink=True) == pytest.approx(7 * per_peer)
    assert a2a.group_bytes(64, 8, nvlink=True) == pytest.approx(7 * 2 * per_peer / 32 + 2 * 32 * 16 * 2**17)
    assert a2a.group_bytes(8, 8, nvlink=False) == pytest.approx(7 * 2 * per_peer / 32)  # a PCIe node
    assert a2a.group_bytes(1, 1, nvlink=True) == 0.0
    model = get_model("deepseek-v3")
    ep64 = Strategy(dp=64, ep=64, gbs=64, zero=1)
    inside = device_extra_bytes(ep64, model, domain_gpus=72)  # an NVL72 rack holds the group
    across = device_extra_bytes(ep64, model, domain_gpus=8)
    assert inside - across == pytest.approx(63 * per_peer - a2a.group_bytes(64, 8, nvlink=True))


def test_deepep_buffers_follow_its_size_hints():
    """deep_ep Config.get_nvl_buffer_size_hint / get_rdma_buffer_size_hint (csrc/config.hpp @
    de3a15d) with buffer.py's configs for 64 ranks (NVLink 288, RDMA 128 receive tokens), 20 SMs
    (10 channels), hidden 7168 in bf16: 10 x 8 x 288 x (14336 + 8 + 128 x (8 + 4 + 4)) and
    10 x 8 x 128 x 2 x (14336 + 8 + 128 x (8 + 4 + 4) + 16); no RDMA buffer within 8 ranks."""
    from sim.data.runtime import device_extra_bytes, device_memory
    from sim.data.specs import Strategy

    ep = device_memory().deepep
    nvl = 10 * 8 * 288 * (14336 + 8 + 128 * 16)
    rdma = 10 * 8 * 128 * 2 * (14336 + 8 + 128 * 16 + 16)
    assert ep.group_bytes(64, 2 * 7168) == pytest.approx(nvl + rdma)
    assert ep.group_bytes(8, 2 * 7168) == pytest.approx(10 * 8 * 256 * (14336 + 8 + 128 * 16))
    assert ep.group_bytes(12, 2 * 7168) == ep.group_bytes(16, 2 * 7168)  # priced as the next tabled size
    model = get_model("deepseek-v3")
    ep64 = Strategy(dp=64, ep=64, gbs=64, zero=1)
    base = device_extra_bytes(Strategy(dp=64, gbs=64, zero=1), model, domain_gpus=8)
    assert device_extra_bytes(ep64, model, domain_gpus=8, dispatcher="deepep") - base == pytest.approx(nvl + rdma)
    assert (device_extra_bytes(ep64, model, domain_gpus=8, dispatcher="allgather") - base
            == pytest.approx(device_memory().nccl_ring_bytes_per_communicator))


def test_launchers_that_turn_nvls_off_map_no_nvls_buffers_and_reduce_without_it():
    """NeMo Framework Launcher (config.yaml env_vars NCCL_NVLS_ENABLE: 0), dgxc-benchmarking 24.11,
    NeMo 2's performance scripts (utils.py slurm_executor) and NVIDIA's MLPerf NeMo configs turn
    NVLink SHARP off "to save memory": no NVLS buffers, and all-reduces priced without the
    in-switch reduction."""
    from sim.cost.costs import nvls_algorithm
    from sim.net.netefficiency import network_kwargs
    from sim.net.network import Network

    assert not any(get_framework(f).nvls for f in ("nemo", "nemo-2025h1", "nemo-launcher-2024h2"))
    assert get_framework("megatron-core").nvls and get_framework("torchtitan").nvls
    strategy = "tp=8,dp=2,mbs=1,gbs=16,seq=4096,sp=1,zero=1"
    on = plan_memory(_plan("llama3-8b", 16, strategy, "megatron-core"))
    off = plan_memory(_plan("llama3-8b", 16, strategy, "nemo"))  # the same model-state layout, NVLS off
    assert on.device_bytes - off.device_bytes >= 1.5 * 2**30  # at least the tp group's 8 heads
    assert on.allocated_bytes == off.allocated_bytes
    cl = cluster_from_catalog(gpu="h100-80gb", num_gpus=8)
    net = Network(cl, **network_kwargs(cl.gpu.nvlink_generation))
    ranks, size = tuple(range(8)), 256 * 2**20
    with_nvls = net.collective_time_s("all_reduce", ranks, size, algorithm=nvls_algorithm(True))
    without = net.collective_time_s("all_reduce", ranks, size, algorithm=nvls_algorithm(False))
    assert without > with_nvls
    assert without == pytest.approx(min(net.collective_time_s("all_reduce", ranks, size, algorithm=a)
                                         for a in ("ring", "tree", "hierarchical")))


def test_bf16_parameters_throughout_keep_eight_bytes_and_reduce_in_fp32():
    """NeMo Automodel's benchmark recipes: bf16 parameters (initialize_weights dtype bf16), bf16
    gradients and Adam states, FSDP2 reduce_dtype fp32: 8/d bytes per parameter at rest, and the
    reduce-scatter input and the pipelined unsharded accumulators in fp32; the loss on bf16 logits."""
    from sim.cost.memory import model_state_bytes
    from sim.data.specs import Strategy

    w, g, o = model_state_bytes(StageParams(1e9, 0.0), Strategy(dp=8, gbs=8, zero=3), state_layout("torch_bf16"))
    assert (w, g, o) == pytest.approx((2e9 / 8, 2e9 / 8, 4e9 / 8))
    lay = state_layout("torch_bf16")
    assert lay.fsdp2 and lay.reduce_bytes_per_param == 4 and state_layout("torch_amp").reduce_bytes_per_param == 4
    fw = get_framework("automodel")
    assert fw.model_states == "torch_bf16" and fw.loss == "bf16"
    strategy = "pp=2,dp=4,mbs=1,gbs=32,seq=4096,zero=3,recompute=full"
    bf16 = plan_memory(_plan("llama3-8b", 8, strategy, "automodel"))
    params = get_model("llama3-8b").num_params / 2
    assert bf16.gradients_bytes == pytest.approx(4 * params, rel=0.15)  # fp32 unsharded accumulators
    amp = plan_memory(_plan("llama3-8b", 8, strategy, "torchtitan"))
    assert bf16.optimizer_bytes == pytest.approx(amp.optimizer_bytes / 2, rel=0.01)


def test_loss_parallel_memory_is_tracked_at_the_shard_and_priced_as_torchtitan_runs_it():
    """torchtitan with tp > 1 computes the loss under ``loss_parallel()``.  DTensor's sharding
    propagation runs each loss op once more on fake global-shape tensors (free on a GPU); the
    harness keeps them off the books, and what remains per local logit at the peak is 4 bytes
    saved + 12 temporary (DTensor's decomposed log-softmax and combined backward): the planner's
    ``loss_parallel`` (16 / 4), whatever the tensor-parallel degree."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from sim.data.runtime import default_runtime
    from validate.memtrack import _sharding_propagation_off_the_books

    rt = default_runtime()
    assert (rt.loss_bytes_per_logit["loss_parallel"], rt.loss_saved_bytes_per_logit["loss_parallel"]) == (16, 4)
    assert get_framework("torchtitan").loss_tp == "loss_parallel"
    plan = _plan("llama3-8b", 8, "tp=2,dp=4,mbs=1,gbs=4,seq=8192,sp=1,zero=3", "torchtitan")
    assert plan.loss_impl == "loss_parallel" and plan.loss_for(1) == "upcast"
    tokens, vocab, tp = 1024, 32768, 4
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        mesh = init_device_mesh("cpu", (tp,))
        with FakeTensorMode():
            local = torch.randn(tokens, vocab // tp, dtype=torch.bfloat16, requires_grad=True)
            logits = DTensor.from_local(local, mesh, [Shard(-1)], run_check=False)
            labels = torch.randint(0, vocab, (tokens,))
            tracker = MemTracker()
            tracker.track_external(local)
            with tracker, _sharding_propagation_off_the_books(), loss_parallel():
                torch.nn.functional.cross_entropy(logits.float(), labels).backward()
            peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    finally:
        if owned:
            dist.barrier()
            dist.destroy_process_group()
    per_logit = {getattr(k, "name", k): v / (tokens * vocab / tp) for k, v in peak.items()}
    assert per_logit["ACT"] == pytest.approx(4, rel=0.01) and per_logit["TEMP"] == pytest.approx(12, rel=0.01)


def test_megatron_loss_holds_what_its_version_allocates():
    """Megatron's ``_VocabParallelCrossEntropy`` on ``logits.float()``: core_v0.6.0-v0.7.0 (and
    Megatron-DeepSpeed) subtract the maximum into a new fp32 tensor while the caller still holds
    the fp32 copy, so the forward peaks at bf16 2 + fp32 4 + fp32 4 = 10 bytes per logit; in place
    (core_v0.8.0 on, commit 9634c0e) at 2 + 4 = 6; both keep the fp32 softmax (4) for backward,
    whose gradient is computed in it.  PyTorch's tracker on the same code
    (validate.eager_traffic._megatron_cross_entropy, the bf16 logits tracked as external)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from sim.data.runtime import default_runtime
    from validate.eager_traffic import _megatron_cross_entropy

    rt = default_runtime()
    assert get_framework("megatron-core-fa2").loss == "outofplace" and get_framework("megatron-core").loss == "inplace"
    tokens, vocab = 512, 32768
    for impl, inplace in (("inplace", True), ("outofplace", False)):
        with FakeTensorMode():
            logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
            target = torch.randint(0, vocab, (tokens,))
            tracker = MemTracker()
            tracker.track_external(logits)
            with tracker:
                loss = _megatron_cross_entropy(logits, target, inplace=inplace).sum()
                peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
                held = next(iter(tracker.get_tracker_snapshot("current").values()))
                loss.backward()
        per_logit = {getattr(k, "name", k): v / (tokens * vocab) for k, v in peak.items()}
        saved = {getattr(k, "name", k): v / (tokens * vocab) for k, v in held.items()}
        assert per_logit["Total"] == pytest.approx(rt.loss_bytes_per_logit[impl], rel=0.01), (impl, per_logit)
        assert saved["ACT"] == pytest.approx(rt.loss_saved_bytes_per_logit[impl], rel=0.01), (impl, saved)


def test_fsdp_first_micro_batch_peaks_at_the_last_block_when_its_gradients_outweigh_activations():
    """FSDP2, one micro-batch, experts FSDP does not shard (ep = dp) and full recomputation:
    the sharded gradients of every block already reduced outweigh the activations freed, so the
    peak is the first block's backward (its weights gathered, the other blocks' gradients,
    its recomputed activations).  PyTorch's tracker: weights and gradients match."""
    from validate.memgrid import GRID, build_plan, compare

    index = next(i for i, g in enumerate(GRID) if g[0] == "mixtral-8x7b" and "ep=8" in g[3] and "recompute=full" in g[3])
    model_id, layers, n, text = GRID[index]
    row = compare(build_plan(model_id, layers, n, text))
    cats = row["categories"]
    assert cats["weights"]["within_tolerance"] and cats["gradients"]["within_tolerance"], cats
    assert abs(cats["total"]["error"]) < 0.06, cats["total"]  # the recomputed layer's split: activations/temporaries


def test_fsdp2_holds_the_block_above_s_reduce_scatter_input_through_a_block_s_copy_out():
    """FSDP2 keeps a unit's reduce-scatter input until the next unit's post-backward, and frees a
    block's all-gather output only after its copy-out: at a Mixtral block's copy-out (one FSDP
    unit without expert parallelism) the block is gathered twice (the unsharded parameters and
    the all-gather buffer, bf16) and the block above's fp32 reduce-scatter input is live, with
    the sharded fp32 gradients of the block above and the output layer.  Closed form from
    Mixtral 8x7B's dimensions (the tracker agrees: the grid sample above, index 34)."""
    from validate.memgrid import build_plan
    from sim.cost.memory import plan_memory

    plan = build_plan("mixtral-8x7b", 2, 8, "dp=8,mbs=1,gbs=8,seq=4096,zero=3,recompute=none")
    m = plan_memory(plan)
    h, f, e, vocab = 4096, 14336, 8, 32000
    block = h * (h + 2 * 1024 + h) + h * e + e * 3 * h * f + 2 * h  # attention, router, experts, norms
    head = vocab * h + h  # output layer and final norm
    total = 2 * block + head + vocab * h  # two blocks, the head, the embedding
    assert m.weights_bytes == pytest.approx(4 * total / 8 + 2 * block, rel=1e-3)  # fp32 shards + the gathered block
    assert m.temporaries_bytes == pytest.approx(2 * block + 4 * block, rel=1e-3)  # all-gather buffer + held RS input
    assert m.gradients_bytes == pytest.approx(4 * (block + head) / 8, rel=1e-3)


def test_fsdp2_expert_parallel_block_as_one_unit_gathers_its_local_experts_at_the_copy_out(capsys):
    """torchtitan (since 18a46d4) keeps an expert-parallel MoE block one FSDP2 unit, its routed
    experts placed on the expert data-parallel mesh (profile ``fsdp_experts_unit: block``): the
    block's copy-out gathers the attention and the rank's local experts twice and holds the
    block above's fp32 reduce-scatter input (the tracker agrees: grid index 35).  With the
    experts a unit of their own (``own``: Automodel, torchtitan before) those moments are
    smaller, and ``simulate --json`` says which wrapping priced the plan."""
    import dataclasses
    import json

    from planner.cli import main
    from validate.memgrid import build_plan
    from sim.cost.memory import plan_memory

    plan = build_plan("mixtral-8x7b", 2, 8, "dp=8,ep=2,mbs=1,gbs=8,seq=4096,zero=3,recompute=none")
    assert plan.fsdp_experts_unit == "block"
    h, f = 4096, 14336
    block = h * (h + 2 * 1024 + h) + h * 8 + 4 * 3 * h * f + 2 * h  # attention, router, 4 local experts, norms
    m = plan_memory(plan)
    assert m.temporaries_bytes == pytest.approx(2 * block + 4 * block, rel=1e-3)
    own = plan_memory(dataclasses.replace(plan, fsdp_experts_unit="own"))
    assert own.allocated_bytes < m.allocated_bytes
    main(["simulate", "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--num-gpus", "64", "--strategy",
          "dp=64,ep=8,mbs=1,gbs=64,zero=3,recompute=full", "--framework", "torchtitan", "--json"])
    assert json.loads(capsys.readouterr().out)["fsdp_experts_unit"] == "block"


def test_a_layers_backward_rebuilds_what_its_recomputation_dropped():
    """``layer_activations``' last entry: the full activations of the largest layer under full
    recomputation, full less kept under selective (torchtitan's op-level policy keeps little of
    a Mixtral block, which rebuilds the rest in its backward), zero for Megatron-Core's
    attention-only policy with a flash kernel (it drops nothing a flash kernel saves) and
    without recomputation."""
    from sim.cost.memory import layer_activations

    base = "tp=1,pp=1,dp=8,ep=2,mbs=1,gbs=8,seq=4096,zero=3,recompute="

    def acts(recompute: str, framework: str) -> tuple:
        p = _plan("mixtral-8x7b", 8, base + recompute, framework)
        return layer_activations(p.model, p.strategy, attention=p.attention_kernel, selective_policy=p.selective_policy,
                                 eager=p.eager_activations, fp8_saved_inputs=p.fp8_saved_inputs)

    for fw in ("torchtitan", "megatron-core"):
        none, full = acts("none", fw), acts("full", fw)
        assert none[4] == 0.0
        assert full[4] == pytest.approx(max(none[0], none[1]))
    none, op = acts("none", "torchtitan"), acts("selective", "torchtitan")
    assert op[4] == pytest.approx(max(none[0] - op[0], none[1] - op[1]))
    assert op[1] < 0.1 * none[1] and op[4] > 0.9 * none[1]
    assert acts("selective", "megatron-core")[4] == 0.0
