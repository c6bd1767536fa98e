"""A GPU profile fitted from exact synthetic H200 measurements (validate.synthetic: known
constants pushed through the simulator's own formulas) gives the constants back, writes only
the links it measured, and predicts through `planner simulate --calibration` what the known
constants predict (no torch needed)."""

import json
from dataclasses import replace

import pytest

from sim.cost.calibration import dump_profile, load_calibration
from validate import synthetic as S
from validate.profile import fit_profile, profile_header

TRUTH = S.Truth()
REL = 0.03  # "within a few percent"


def _profile(tmp_path, world, rpn, name):
    recs = S.records(TRUTH, world, rpn)
    prof = fit_profile(recs, S.environment(world, rpn), profile_id=name)
    path = dump_profile(prof, tmp_path / f"{name}.yaml", header=profile_header(prof, "synthetic"))
    return prof, load_calibration(str(path))


@pytest.mark.parametrize("world,rpn", [(8, 8), (1, 1), (2, 1), (16, 8)])
def test_fit_recovers_the_constants(tmp_path, world, rpn):
    prof, cal = _profile(tmp_path, world, rpn, f"syn-{world}-{rpn}")
    g, t = cal.gpu, TRUTH
    assert cal.host.base_gpu == "h200-141gb" and g.architecture == "hopper"
    assert g.achievable_matmul_fraction("bf16") == pytest.approx(t.matmul_fraction, rel=REL)
    assert g.hbm_bytes_per_s * g.hbm_efficiency == pytest.approx(t.hbm_bytes_per_s, rel=REL)
    e = cal.efficiency
    assert e["gemm_half_dim"] == pytest.approx(t.gemm_half_dim, rel=REL)
    assert e["attention_fwd_vs_matmul"] == pytest.approx(t.attention_fwd_vs_matmul, rel=REL)
    assert e["attention_bwd_vs_matmul"] == pytest.approx(t.attention_bwd_vs_matmul, rel=REL)
    assert e["kernel_overhead_s"] == pytest.approx(t.kernel_overhead_s, rel=REL)
    assert e["host_op_floor_s"] == pytest.approx(t.host_op_floor_s, rel=REL)
    kinds = sorted(link["kind"] for link in prof["links"])
    assert kinds == sorted((["scale-up"] if rpn > 1 else []) + (["nic"] if world > rpn else []))
    if rpn > 1:
        assert cal.scale_up.bytes_per_s_per_direction == pytest.approx(t.intra_bytes_per_s, rel=REL)
        assert cal.scale_up.latency_s == pytest.approx(t.intra_latency_s, rel=0.05)
        assert g.nvlink_bytes_per_s_per_direction == pytest.approx(t.intra_bytes_per_s, rel=REL)
    else:
        assert cal.scale_up is None and g.nvlink_generation == "nvlink4"  # the catalog's, not a placeholder
    if world > rpn:
        assert cal.nic.bytes_per_s_per_direction == pytest.approx(t.inter_bytes_per_s, rel=REL)
        assert cal.nic.latency_s == pytest.approx(t.inter_latency_s, rel=0.05)
    else:
        assert cal.nic is None
    if world > 1:
        assert e["collective_overhead_s"] == pytest.approx(t.collective_overhead_s, rel=0.05)


def test_profile_header_records_the_software(tmp_path):
    prof, cal = _profile(tmp_path, 1, 1, "syn-sw")
    text = open(cal.path, encoding="utf-8").read()
    head = text.split("schema_version")[0]
    assert "CUDA 12.8" in head and "NCCL 2.27.3" in head and "torch 2.13.0+cu128" in head
    assert "TF32 matmul off" in head and "float32_matmul_precision highest" in head
    assert prof["host"]["nccl"] == "2.27.3" and prof["host"]["tf32"]["cudnn_allow_tf32"] is True
    assert cal.host.software["cuda"] == "12.8"


def _llama_tp8(gpu_id, *extra):
    return ["simulate", "--model", "llama3-8b", "--gpu", gpu_id, "--num-gpus", "8", "--gpus-per-node", "8",
            "--seq-len", "4096", "--strategy", "tp=8,mbs=1,gbs=8,sp=1", "--engine", "analytic", "--json", *extra]


def _run(capsys, argv):
    from planner.cli import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _truth_step(strategy_text: str, num_gpus: int, gpus_per_node: int) -> float:
    """The step the known constants predict, without any profile."""
    from sim.engines.analytic import simulate_analytic
    from sim.data.catalog import get_model
    from sim.net.netefficiency import network_size_curves
    from sim.net.network import Network
    from sim.cost.plan import Plan, parse_strategy

    cluster = TRUTH.cluster(num_gpus, gpus_per_node)
    plan = Plan(model=get_model("llama3-8b"), cluster=cluster,
                strategy=parse_strategy(strategy_text, num_gpus=num_gpus, seq_len=4096))
    curves = {k: v for k, v in network_size_curves().items() if k not in ("scale-up", "scale-out")}
    net = Network(cluster, bandwidth_efficiency={"scale-up": 1.0, "scale-out": 1.0}, size_curves=curves)
    return simulate_analytic(plan, net=net, eff=TRUTH.efficiency()).step_time_s


def test_round_trip_through_simulate_calibration(tmp_path, capsys):
    """`planner simulate --gpu <profile id> --calibration <file>` predicts what the constants
    predict; the profile's base GPU works as --gpu too; another GPU is refused in one line."""
    prof, cal = _profile(tmp_path, 8, 8, "syn-node")
    rc, out, err = _run(capsys, _llama_tp8("syn-node", "--calibration", cal.path))
    assert rc == 0, err
    got = json.loads(out)
    assert got["gpu"] == "syn-node"
    assert got["step_time_s"] == pytest.approx(_truth_step("tp=8,mbs=1,gbs=8,sp=1", 8, 8), rel=REL)
    rc, out2, _ = _run(capsys, _llama_tp8("h200-141gb", "--calibration", cal.path))
    assert rc == 0 and json.loads(out2)["step_time_s"] == pytest.approx(got["step_time_s"], rel=1e-9)
    rc, _, err = _run(capsys, _llama_tp8("a100-80gb", "--calibration", cal.path))
    assert rc == 2 and err.count("\n") == 1 and "a100-80gb" in err and "syn-node" in err


@pytest.mark.parametrize("world,rpn", [(16, 8), (2, 1)])
def test_round_trip_across_nodes(tmp_path, capsys, world, rpn):
    """Two full nodes (tp=8 inside, dp=2 across) on a profile measured on two full nodes, or on
    two nodes with one GPU each (whose NIC is per rank, as the plan's one-NIC-per-GPU nodes use it).
    The gradient reduction is not overlapped (dp_overlap=0): its exposed time is the NIC's, not
    what is left after a backward whose TP traffic runs on the catalog's NVLink in the one-GPU
    profile and on the true one in the truth."""
    prof, cal = _profile(tmp_path, world, rpn, f"syn-{world}x{rpn}")
    strategy = "tp=8,dp=2,mbs=1,gbs=16,sp=1,dp_overlap=0"
    argv = ["simulate", "--model", "llama3-8b", "--gpu", cal.id, "--num-gpus", "16", "--gpus-per-node", "8",
            "--seq-len", "4096", "--strategy", strategy, "--engine", "analytic", "--json", "--calibration", cal.path]
    rc, out, err = _run(capsys, argv)
    assert rc == 0, err
    got = json.loads(out)
    assert got["nic"] == f"syn-{world}x{rpn}-nic"
    if rpn == 8:  # both tiers measured: the constants' step
        assert got["step_time_s"] == pytest.approx(_truth_step(strategy, 16, 8), rel=REL)
    assert got["breakdown"]["exposed_dp_s"] == pytest.approx(
        _truth_breakdown(strategy, 16, 8)["exposed_dp_s"], rel=0.1, abs=1e-4)


def _truth_breakdown(strategy_text: str, num_gpus: int, gpus_per_node: int) -> dict:
    from sim.engines.analytic import simulate_analytic
    from sim.data.catalog import get_model
    from sim.net.netefficiency import network_size_curves
    from sim.net.network import Network
    from sim.cost.plan import Plan, parse_strategy

    cluster = TRUTH.cluster(num_gpus, gpus_per_node)
    plan = Plan(model=get_model("llama3-8b"), cluster=cluster,
                strategy=parse_strategy(strategy_text, num_gpus=num_gpus, seq_len=4096))
    curves = {k: v for k, v in network_size_curves().items() if k not in ("scale-up", "scale-out")}
    net = Network(cluster, bandwidth_efficiency={"scale-up": 1.0, "scale-out": 1.0}, size_curves=curves)
    return simulate_analytic(plan, net=net, eff=TRUTH.efficiency()).breakdown.as_dict()


def test_one_rank_per_node_profile_keeps_the_catalog_nvlink(tmp_path, capsys):
    """Two nodes with one GPU each measure only the NIC.  Nothing is written for the scale-up
    link, so tp=8 inside a node is priced on the catalog's NVLink (the placeholder 1 GB/s link
    of old made llama3-8b at tp=8 take 30.9 s instead of 0.76 s)."""
    from sim.data.catalog import get_gpu
    from sim.net.netefficiency import network_kwargs
    from sim.net.network import Network
    from sim.data.hardware import Cluster

    prof, cal = _profile(tmp_path, 2, 1, "syn-2n")
    assert [link["kind"] for link in prof["links"]] == ["nic"]
    rc, out, err = _run(capsys, _llama_tp8("syn-2n", "--calibration", cal.path))
    assert rc == 0, err
    step = json.loads(out)["step_time_s"]
    rc, out, _ = _run(capsys, _llama_tp8("h200-141gb"))
    plain = json.loads(out)["step_time_s"]
    assert 0.5 * plain < step < 2.0 * plain < 5.0
    # the network it used is the catalog's NVLink4 with its fitted efficiency and size curve
    h200 = get_gpu("h200-141gb")
    plan_cluster = Cluster(gpu=cal.gpu, num_gpus=8, nic=cal.nic, gpus_per_node=8, nvlink_domain=8, nics_per_node=8)
    cat_cluster = replace(plan_cluster, gpu=h200)
    ours = Network(plan_cluster, **cal.network_kwargs(plan_cluster))
    ref = Network(cat_cluster, **network_kwargs(h200.nvlink_generation))
    for size in (1 << 20, 1 << 26):
        assert ours.collective_time_s("all_reduce", range(8), size) == pytest.approx(
            ref.collective_time_s("all_reduce", range(8), size), rel=1e-9)


def test_unknown_gpu_keeps_measured_peaks_and_pcie_never_maps_to_sxm():
    from validate.profile import guess_base_gpu

    def guess(name, gib):
        return guess_base_gpu({"device_type": "cuda", "device_name": name, "device_memory_bytes": gib * 2**30})

    assert guess("NVIDIA H200", 139.8) == "h200-141gb"
    assert guess("NVIDIA H100 80GB HBM3", 79.2) == "h100-80gb"
    assert guess("NVIDIA A100-SXM4-80GB", 79.2) == "a100-80gb"
    assert guess("NVIDIA A100-SXM4-40GB", 39.4) == "a100-40gb"
    # PCIe cards map to their own PCIe records, never to the SXM part of the same name
    assert guess("NVIDIA H100 PCIe", 79.2) == "h100-pcie-80gb"
    assert guess("NVIDIA H100 NVL", 93.0) == "h100-nvl-94gb"
    assert guess("NVIDIA A100 80GB PCIe", 79.2) == "a100-pcie-80gb"
    assert guess("NVIDIA A100 40GB PCIe", 39.4) is None  # no 40 GB PCIe record, and never the SXM one
    assert guess("NVIDIA GH200 480GB", 94.5) is None
    assert guess_base_gpu({"device_type": "cpu", "device_name": "AMD EPYC"}) is None
    recs = S.records(TRUTH, 1, 1)
    prof = fit_profile(recs, S.environment(1, 1, device_name="NVIDIA GH200 480GB", memory_bytes=101e9))
    assert prof["host"]["base_gpu"] is None
    assert prof["device"]["dense_tflops"]["bf16"] == pytest.approx(
        TRUTH.matmul_fraction * TRUTH.gpu().peak_flops_per_s("bf16") / 1e12, rel=REL)


def test_fit_cli_on_gpu_measurements(tmp_path, capsys):
    """`planner validate fit` on a one-rank-per-node GPU measurement: the NIC fitted, the
    scale-up link reported as not measured (nothing written for it)."""
    from planner.cli import main

    m = tmp_path / "measurements.json"
    m.write_text(json.dumps({"suite": "quick", "env": S.environment(2, 1), "microbench": S.records(TRUTH, 2, 1),
                             "workloads": []}), encoding="utf-8")
    assert main(["validate", "fit", str(m), "--id", "cli-2n"]) == 0
    out = capsys.readouterr().out
    assert "intra    not measured: no link written" in out and "inter" in out and "host floor 6.0 us" in out
    cal = load_calibration(str(tmp_path / "profile.yaml"))
    assert cal.scale_up is None and cal.nic is not None and cal.host.software["nccl"] == "2.27.3"
