"""PCIe cards: catalog records, the topology inside a server, and torch.nn.DataParallel.

Known answers are written from first principles here, not taken from the code: a ring
all-reduce over ``n`` GPUs moves ``2(n-1)/n * S`` per GPU (Patarasuk & Yuan 2009) at the rate of
its slowest flow, every flow running at once; without peer-to-peer each hop is staged through
host memory (NCCL's SHM path), i.e. written to and read from the sender's socket DRAM.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from planner.cli import main
from sim.data import catalog
from sim.data.catalog import get_cpu, get_gpu, get_host_part, get_link
from sim.net.clusters import cluster_from_catalog
from sim.cost.costs import default_network
from sim.base.errors import InfeasibleError, InputError
from sim.cost.plan import Plan, parse_strategy
from sim.net.server import pcie_defaults, server_tables
from sim.engines.simulate import simulate
from sim.data.specs import Strategy
from sim.net.topology import build_topology

PCIE_GPUS = ("l4-24gb", "l40s-48gb", "rtx4090-24gb", "rtx5090-32gb", "rtx6000ada-48gb", "rtx-pro-6000-96gb",
             "a100-pcie-80gb", "h100-pcie-80gb", "h100-nvl-94gb", "mi210-64gb")
S = float(1 << 30)


@pytest.fixture(autouse=True)
def _default_catalog(monkeypatch):
    monkeypatch.delenv(catalog.ENV_VAR, raising=False)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- catalog


@pytest.mark.parametrize("gpu_id", PCIE_GPUS)
def test_pcie_gpus_load(gpu_id):
    g = get_gpu(gpu_id)
    assert g.id == gpu_id and g.form_factor == "pcie" and len(g.source) > 20
    assert g.pcie_lanes == 16 and g.p2p in ("pcie", "none")
    if g.nvlink_bridge_gpus:
        assert get_link(g.nvlink_generation).kind == "scale-up" and g.nvlink_bridge_bytes_per_s_per_direction > 0
    else:  # no NVLink at all: the server's PCIe topology is the scale-up
        assert g.nvlink_generation == "" and g.nvlink_bytes_per_s_per_direction == 0


def test_geforce_rates_are_fp32_accumulate_and_have_no_p2p():
    for gpu_id, bf16 in (("rtx4090-24gb", 165.2), ("rtx5090-32gb", 209.5)):
        g = get_gpu(gpu_id)
        assert g.fp32_accumulate_halved and g.p2p == "none"
        assert g.dense_flops_per_s["bf16"] == pytest.approx(bf16 * 1e12)  # half the FP16-accumulate rate
    pro = get_gpu("rtx6000ada-48gb")
    assert not pro.fp32_accumulate_halved and pro.p2p == "pcie"
    assert get_gpu("h100-nvl-94gb").nvlink_bridge_gpus == 2 and get_gpu("mi210-64gb").nvlink_bridge_gpus == 4


def test_host_parts_and_server_designs_load():
    assert {p.id for p in catalog.list_host_parts("cpu")} >= {"epyc-9654", "xeon-8480plus", "xeon-w9-3495x"}
    cpu = get_cpu("xeon-8480plus")
    assert cpu.dram_bytes_per_s == pytest.approx(307.2e9) and cpu.socket_link_bytes_per_s_per_direction == 128e9
    assert get_host_part("broadcom-pex89144", "pcie-switch").latency_s == pytest.approx(115e-9)
    m = get_host_part("meas-5090-pcie5-nop2p-nccl", "pcie-link")
    assert m.p2p_enabled is False and m.value("allreduce_busbw_bytes_per_s") == 28e9
    designs = {d.id: d for d in catalog.list_server_designs()}
    assert len(designs) == 6 and all(d.source for d in designs.values())
    assert catalog.default_server_design(4).id == "ws-4x-rtxpro6000-w790"
    assert catalog.default_server_design(8).id == "srv-8gpu-2s-dualroot-gen5-switch"
    with pytest.raises(InputError) as err:
        catalog.get_server_design("srv-nope")
    assert err.value.field == "server" and "known:" in err.value.message


def _catalog_copy(tmp_path, monkeypatch, edit: tuple[str, str]) -> None:
    for f in catalog.catalog_dir().glob("*.yaml"):
        shutil.copy(f, tmp_path / f.name)
    text = (tmp_path / "servers.yaml").read_text()
    assert edit[0] in text
    (tmp_path / "servers.yaml").write_text(text.replace(edit[0], edit[1], 1))
    monkeypatch.setenv(catalog.ENV_VAR, str(tmp_path))


@pytest.mark.parametrize("edit, field_part", [
    (("gpus_on_root_ports: {0: [0, 1, 2, 3]}", "gpus_on_root_ports: {0: [0, 1, 2, 2]}"), "gpus_on_root_ports"),
    (("cpu: xeon-w9-3495x", "cpu: xeon-w9-9999x"), "cpu"),
    (("    sockets: 1\n", "    sockets: 2\n"), "sockets"),  # a one-socket workstation CPU
    (("power_w: 4000", "power_watts: 4000"), "power_watts"),  # unknown key
])
def test_malformed_server_record_is_input_error(tmp_path, monkeypatch, edit, field_part):
    _catalog_copy(tmp_path, monkeypatch, edit)
    with pytest.raises(InputError) as err:
        catalog.list_server_designs()
    assert field_part in err.value.field or field_part in err.value.message


# --------------------------------------------------------------------------- topology inside a server


def _ring_closed_form(n: int, gpu: str, cpu: str, p2p: str) -> float:
    """Ring all-reduce of ``S`` bytes per GPU over ``n`` cards on CPU root ports of one socket."""
    d, g, host = pcie_defaults(), get_gpu(gpu), get_cpu(cpu)
    pcie = get_link(f"pcie{min(g.pcie_generation, host.pcie_generation)}")
    slot = pcie.bytes_per_s_per_direction * d.collective_efficiency  # each slot: one flow per direction
    alpha = pcie.latency_s  # a hop crosses the sender's and the receiver's slot
    rate = slot
    if p2p == "none":
        dram = host.stream_bytes_per_s or host.dram_bytes_per_s * d.dram_stream_fraction
        rate = min(slot, dram / (2 * n))  # n flows, each written to and read from the socket's DRAM
        alpha += d.host_staged_latency_s
    return 2 * (n - 1) / n * S / rate + 2 * (n - 1) * alpha


@pytest.mark.parametrize("gpu, bound", [("rtx5090-32gb", "host-memory"), ("rtx4090-24gb", "pcie4 x16")])
def test_no_p2p_ring_all_reduce_through_host_memory_matches_closed_form(gpu, bound):
    # 4 GeForce cards (no P2P) in the 4-GPU W790 workstation: Gen5 cards are bound by the
    # socket's memory (249 GB/s / 8 transfers), Gen4 cards by their own x16 slot.
    c = cluster_from_catalog(gpu, 4)
    assert c.server.design == "ws-4x-rtxpro6000-w790" and c.server.p2p == "none"
    net = default_network(c)
    t = net.collective_time_s("all_reduce", range(4), S, algorithm="ring")
    assert t == pytest.approx(_ring_closed_form(4, gpu, "xeon-w9-3495x", "none"), rel=1e-9)
    assert bound in net.dim_bottleneck(Strategy(dp=4, gbs=4), "dp_cp")[0]
    # with a P2P driver the same ring skips host memory
    p2p = default_network(cluster_from_catalog(gpu, 4, p2p="pcie"))
    assert p2p.collective_time_s("all_reduce", range(4), S, algorithm="ring") == pytest.approx(
        _ring_closed_form(4, gpu, "xeon-w9-3495x", "pcie"), rel=1e-9)


@pytest.mark.parametrize("kw, strategy, dim, link", [
    # dual-root switches: the dp pairs (i, i+4) cross both switch uplinks, 4 flows each
    (dict(gpu="l40s-48gb"), dict(tp=4, dp=2), "dp_cp", "pcie-switch-uplink"),
    # root ports on two Xeon sockets with P2P: the same pairs share the 128 GB/s UPI links
    (dict(gpu="rtx5090-32gb", server="srv-8x-rtx5090-2s-genoa-rootports", cpu="xeon-8480plus", p2p="pcie"),
     dict(tp=4, dp=2), "dp_cp", "upi"),
    # without P2P every GPU-GPU hop is staged in DRAM: 8 flows x 2 transfers per socket
    (dict(gpu="rtx5090-32gb", server="srv-8x-rtx5090-2s-genoa-rootports"), dict(dp=8), "dp_cp", "host-memory"),
    # single-root switches without P2P: the staged traffic funnels through the two uplinks
    (dict(gpu="rtx4090-24gb", server="srv-8gpu-1root-gen5-switch"), dict(dp=8), "dp_cp", "pcie-switch-uplink"),
    # bridged H100 NVL pairs: tp=2 rides the bridge, dp crosses PCIe
    (dict(gpu="h100-nvl-94gb"), dict(tp=2, dp=4), "tp", "nvlink-bridge"),
])
def test_intra_node_bottleneck_is_where_the_design_puts_it(kw, strategy, dim, link):
    gpu = kw.pop("gpu")
    net = default_network(cluster_from_catalog(gpu, 8, **kw))
    s = Strategy(**strategy, gbs=strategy.get("dp", 1))
    name, rate = net.dim_bottleneck(s, dim)
    assert link in name
    assert net.dim_link(s, dim).bytes_per_s == pytest.approx(rate)


def test_switch_uplink_share_is_its_capacity_over_its_flows():
    c = cluster_from_catalog("l40s-48gb", 8)
    net = default_network(c)
    uplink = get_link("pcie5").bytes_per_s_per_direction * pcie_defaults().collective_efficiency
    assert net.dim_link(Strategy(tp=4, dp=2, gbs=2), "dp_cp").bytes_per_s == pytest.approx(uplink / 4)
    # under one switch P2P never touches the CPU: a tp=4 ring runs at the GPU slot rate (Gen4 card)
    slot = get_link("pcie4").bytes_per_s_per_direction * pcie_defaults().collective_efficiency
    assert net.dim_link(Strategy(tp=4, dp=2, gbs=2), "tp").bytes_per_s == pytest.approx(slot)


def test_socket_link_measurement_and_model_agree_within_reason():
    # NVIDIA/nccl#1639: 8 x RTX 5090, dual Xeon 8480+, no P2P: all-reduce busbw 28 GB/s
    c = cluster_from_catalog("rtx5090-32gb", 8, server="srv-8x-rtx5090-2s-genoa-rootports", cpu="xeon-8480plus")
    t = default_network(c).collective_time_s("all_reduce", range(8), 8 * S, algorithm="ring")
    busbw = 2 * 7 / 8 * 8 * S / t
    measured = get_host_part("meas-5090-pcie5-nop2p-nccl").value("allreduce_busbw_bytes_per_s")
    assert busbw == pytest.approx(measured, rel=0.15)


def test_server_tables_are_tree_paths_and_dram_is_loaded_twice():
    srv = cluster_from_catalog("rtx4090-24gb", 4).server
    t = server_tables(srv)
    dram = [i for i, name in enumerate(t.label) if "host-memory" in name]
    assert len(dram) == 1  # one shared link for reads and writes
    path = t.gg[0, 1][t.gg[0, 1] >= 0]
    assert list(path).count(dram[0]) == 2 and len(path) == 4  # slot up, DRAM write, DRAM read, slot down
    g = build_topology(cluster_from_catalog("l40s-48gb", 16))
    assert {n[0] for n in g} >= {"gpu", "pcie-switch", "root", "dram", "nic", "switch"}


def test_described_server_and_partial_nodes():
    c = cluster_from_catalog("rtx4090-24gb", 8, sockets=2, pcie_switches=4, cpu="xeon-8480plus")
    assert c.server.design == "custom" and c.server.switch_socket == (0, 0, 1, 1)
    assert c.server.gpu_switch == (0, 0, 1, 1, 2, 2, 3, 3) and c.server.gpu_socket == (0,) * 4 + (1,) * 4
    assert cluster_from_catalog("h100-nvl-94gb", 3).server.bridges == ((0, 1),)
    assert cluster_from_catalog("h100-pcie-80gb", 8, nvlink_bridge=0).server.bridges == ()
    desktop = cluster_from_catalog("rtx4090-24gb", 2, sockets=1, cpu="ryzen9-7950x")
    assert desktop.server.gpu_link_label == "pcie4 x8"  # 28 CPU lanes split over two cards


def test_sxm_clusters_are_unchanged():
    c = cluster_from_catalog("h100-80gb", 16)
    assert c.server is None and c.nvlink_domain == 8
    links = default_network(c).links
    ids = np.arange(links.num_links)
    layout = np.where(ids < links.host_up, 0, np.where(ids < links.nic_up, 1, 2))
    assert (links.tier == layout).all()  # ids by tier, as before PCIe servers existed


@pytest.mark.parametrize("call, field", [
    (lambda: cluster_from_catalog("h100-80gb", 8, server="ws-4x-rtxpro6000-w790"), "server"),
    (lambda: cluster_from_catalog("rtx4090-24gb", 4, nvlink_domain=4), "nvlink-domain"),
    (lambda: cluster_from_catalog("rtx4090-24gb", 4, server="ws-4x-rtxpro6000-w790", sockets=1), "server"),
    (lambda: cluster_from_catalog("rtx4090-24gb", 8, gpus_per_node=8, server="ws-4x-rtxpro6000-w790"),
     "gpus-per-node"),
    (lambda: cluster_from_catalog("rtx4090-24gb", 4, nvlink_bridge=2), "nvlink-bridge"),
    (lambda: cluster_from_catalog("rtx4090-24gb", 4, sockets=2, cpu="xeon-w9-3495x"), "cpu"),
])
def test_bad_server_input_names_the_field(call, field):
    with pytest.raises(InputError) as err:
        call()
    assert err.value.field == field


# --------------------------------------------------------------------------- CLI


def test_cli_simulate_4x_rtx4090(capsys):
    rc, out, err = run(capsys, "simulate", "--model", "llama2-7b", "--gpu", "rtx4090-24gb", "--num-gpus", "4",
                       "--seq-len", "2048", "--strategy", "zero=3,mbs=1,gbs=16,recompute=full",
                       "--engine", "analytic", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["step_time_s"] > 0 and d["server"]["design"] == "ws-4x-rtxpro6000-w790"
    assert d["server"]["p2p"] == "none" and "dp" in d["server"]["bottlenecks"]
    rc, out, _ = run(capsys, "simulate", "--model", "llama2-7b", "--gpu", "rtx4090-24gb", "--num-gpus", "4",
                     "--strategy", "zero=3", "--engine", "analytic")
    assert rc == 0 and "dp collectives bound by" in out


@pytest.mark.parametrize("extra, needle", [
    (("--gpu", "rtx4090-24gb", "--server", "srv-nope"), "server=srv-nope"),
    (("--gpu", "h100-80gb", "--server", "ws-4x-rtxpro6000-w790"), "server"),
    (("--gpu", "rtx4090-24gb", "--p2p", "nvlink"), "--p2p"),
])
def test_cli_bad_server_exits_2_with_one_line(capsys, extra, needle):
    rc, out, err = run(capsys, "simulate", "--model", "llama2-7b", "--num-gpus", "4", "--strategy", "dp=4", *extra)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err


def test_cli_recommend_takes_server_flags(capsys):
    rc, out, err = run(capsys, "recommend", "--model", "llama2-7b", "--gpu", "rtx5090-32gb", "--num-gpus", "8",
                       "--server", "srv-8x-rtx5090-2s-genoa-rootports", "--gbs", "32", "--top", "1", "--rerank", "0",
                       "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["plans"] and "--server srv-8x-rtx5090-2s-genoa-rootports" in d["reproduce"]


# --------------------------------------------------------------------------- DataParallel


def _plan(strategy: str, gpu: str = "rtx6000ada-48gb", n: int = 4, model: str = "llama2-7b") -> Plan:
    c = cluster_from_catalog(gpu, n)
    return Plan(model=catalog.get_model(model), cluster=c,
                strategy=parse_strategy(strategy, num_gpus=n, seq_len=2048))


def test_dataparallel_is_slower_than_ddp_and_says_why():
    # One process: the parameters are broadcast from GPU 0 every forward and the gradients
    # reduced onto it after the backward (not overlapped), on top of DDP's compute.
    r = simulate(_plan("dp_impl=dataparallel,mbs=1,gbs=8,recompute=full"), engine="event")
    dp = r.extra["dataparallel"]
    assert r.engine == "analytic" and r.step_time_s == pytest.approx(dp["step_time_s"])
    assert dp["ddp_step_time_s"] < r.step_time_s and dp["ddp_speedup"] > 1
    assert dp["replicate_s"] > 0 and dp["reduce_grads_s"] > 0 and dp["gather_outputs_s"] > 0
    assert "switching to DDP" in r.warnings[0] and "broadcast from GPU 0" in r.warnings[0]
    ddp = simulate(_plan("mbs=1,gbs=8,recompute=full"), engine="analytic")
    assert ddp.step_time_s == pytest.approx(dp["ddp_step_time_s"], rel=1e-9)
    assert r.memory_peak_bytes > ddp.memory_peak_bytes  # GPU 0 holds every replica's logits


def test_dataparallel_replicate_is_a_pipelined_broadcast_from_gpu0():
    plan = _plan("dp_impl=dataparallel,mbs=1,gbs=4")
    net = default_network(plan.cluster)
    r = simulate(plan, engine="analytic")
    params = catalog.get_model("llama2-7b").num_params
    chain = net.group_link((0, 1, 2, 3), pattern="chain")  # GPU 0 -> 1 -> 2 -> 3
    from sim.layers.compute import default_efficiency
    expected = 4 * params / chain.bytes_per_s + 3 * chain.latency_s + default_efficiency().collective_overhead_s
    assert r.extra["dataparallel"]["replicate_s"] == pytest.approx(expected, rel=1e-9)


def test_dataparallel_gil_factor_only_adds_time():
    r = simulate(_plan("dp_impl=dataparallel,mbs=1,gbs=4", model="gpt-1.7b"), engine="analytic")
    dp = r.extra["dataparallel"]
    assert dp["gil_factor"] == pytest.approx(2.0) and dp["gil_s"] >= 0  # 4 threads x half the host floor


@pytest.mark.parametrize("strategy, n, error", [
    ("dp_impl=dataparallel,tp=2", 4, InputError),
    ("dp_impl=dataparallel,zero=1", 4, InputError),
    ("dp_impl=dataparallel", 8, InfeasibleError),  # two 4-GPU workstations: not one process
    ("dp_impl=threads", 4, InputError),
])
def test_dataparallel_bad_input(strategy, n, error):
    with pytest.raises(error):
        c = cluster_from_catalog("rtx6000ada-48gb", n, gpus_per_node=4)
        Plan(model=catalog.get_model("llama2-7b"), cluster=c, strategy=parse_strategy(strategy, num_gpus=n)).checked()


def test_cli_dataparallel_prints_the_ddp_gain(capsys):
    rc, out, err = run(capsys, "simulate", "--model", "llama2-7b", "--gpu", "l40s-48gb", "--num-gpus", "8",
                       "--strategy", "dp_impl=dataparallel,mbs=1,gbs=16,recompute=full")
    assert rc == 0, err
    assert "switching to DDP is" in out and "dp_impl=dataparallel" in out
    rc, out, err = run(capsys, "simulate", "--model", "llama2-7b", "--gpu", "l40s-48gb", "--num-gpus", "8",
                       "--strategy", "dp_impl=dataparallel,tp=2")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "dp_impl" in err


def test_app_topology_folds_the_server_into_host_boxes():
    from appkit.topoview import HOST_KINDS, summarize_topology, topology_figure

    g = build_topology(cluster_from_catalog("l40s-48gb", 64))
    s = summarize_topology(g, max_boxes=12)
    kinds: dict[str, int] = {}
    for _, a in g.nodes(data=True):
        k = "host" if a["kind"] in HOST_KINDS else a["kind"]
        kinds[k] = kinds.get(k, 0) + 1
    folded: dict[str, int] = {}
    for b in s.boxes:
        folded[b.kind] = folded.get(b.kind, 0) + b.members
    assert folded == kinds and kinds["host"] == 8 * (2 + 2 + 2)  # per node: 2 switches, 2 roots, 2 DRAMs
    assert len(topology_figure(s).data) >= 3
