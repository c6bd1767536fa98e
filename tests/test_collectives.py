"""Collective closed forms against the textbook, and the placement-aware Network against
routing every flow on the networkx graph."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.net import collectives as cf
from sim.base.errors import InputError
from sim.net.network import GroupLink, Network
from sim.net.placement import all_groups, group_ranks, pipeline_pairs
from sim.net.routing import graph_group_link
from sim.net.topology import build_topology
from tests.topo_fixtures import A100, GB200, make_cluster, make_gpu, make_nic, make_strategy

S, B, A = 1e9, 25e9, 5e-6


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_textbook_formulas(n: int) -> None:
    assert cf.ring_all_reduce_time_s(n, S, B, A) == pytest.approx(2 * (n - 1) / n * S / B + 2 * (n - 1) * A)
    assert cf.ring_all_gather_time_s(n, S, B, A) == pytest.approx((n - 1) / n * S / B + (n - 1) * A)
    assert cf.ring_reduce_scatter_time_s(n, S, B, A) == pytest.approx((n - 1) / n * S / B + (n - 1) * A)
    assert cf.all_to_all_time_s(n, S, B, A) == pytest.approx((n - 1) / n * S / B + (n - 1) * A)
    tree = 0.0 if n == 1 else 2 * S / B + 2 * math.ceil(math.log2(n)) * A
    assert cf.tree_all_reduce_time_s(n, S, B, A) == pytest.approx(tree)
    assert cf.p2p_time_s(S, B, A) == pytest.approx(S / B + A)
    # All-reduce = reduce-scatter then all-gather.
    assert cf.ring_all_reduce_time_s(n, S, B, A) == pytest.approx(
        cf.ring_reduce_scatter_time_s(n, S, B, A) + cf.ring_all_gather_time_s(n, S, B, A))


def test_hierarchical_matches_ring_on_a_flat_network() -> None:
    for k, d in ((8, 4), (4, 2), (2, 16)):
        n = k * d
        per_byte_h, _ = cf.hierarchical_all_reduce_coeffs(k, d, B, 0.0, B, 0.0)
        per_byte_r, _ = cf.ring_all_reduce_coeffs(n, B, 0.0)
        assert per_byte_h == pytest.approx(per_byte_r)
        ag_h, _ = cf.hierarchical_all_gather_coeffs(k, d, B, 0.0, B, 0.0)
        assert ag_h == pytest.approx(cf.ring_all_gather_coeffs(n, B, 0.0)[0])
        fixed = cf.hierarchical_all_reduce_time_s(k, d, S, 300e9, 1e-6, B, A) - \
            (2 * (k - 1) / k * S / 300e9 + 2 * (d - 1) / d * S / k / B)
        assert fixed == pytest.approx(2 * (k - 1) * 1e-6 + 2 * (d - 1) * A)


@pytest.mark.parametrize("op,algorithms", [("all_reduce", ["ring", "tree", "hierarchical"]),
                                           ("all_gather", ["ring", "hierarchical"]),
                                           ("reduce_scatter", ["ring", "hierarchical"])])
def test_every_algorithm_moves_the_same_bytes(op: str, algorithms: list[str]) -> None:
    n, k = 32, 8
    sent = {a: cf.bytes_sent_per_rank(op, a, n, S, ranks_per_domain=k) for a in algorithms}
    expected = cf.bus_bandwidth_factor(op, n) * S
    assert all(v == pytest.approx(expected) for v in sent.values()), sent


def _simulate_ring_all_reduce(values: np.ndarray) -> tuple[np.ndarray, float]:
    """Execute ring reduce-scatter + all-gather chunk by chunk; return result and bytes sent/rank."""
    n, size = values.shape
    chunks = [list(np.array_split(v.astype(float), n)) for v in values]
    sent = 0.0
    for step in range(n - 1):  # reduce-scatter: rank r sends chunk (r - step) to r + 1
        msgs = [(r, (r - step) % n, chunks[r][(r - step) % n].copy()) for r in range(n)]
        for r, c, data in msgs:
            chunks[(r + 1) % n][c] += data
            sent += data.size
    for step in range(n - 1):  # all-gather: rank r forwards its complete chunk (r + 1 - step)
        msgs = [(r, (r + 1 - step) % n, chunks[r][(r + 1 - step) % n].copy()) for r in range(n)]
        for r, c, data in msgs:
            chunks[(r + 1) % n][c] = data
            sent += data.size
    return np.array([np.concatenate(c) for c in chunks]), sent / n


def test_ring_all_reduce_execution_moves_textbook_bytes() -> None:
    n, size = 5, 40
    values = np.random.default_rng(0).normal(size=(n, size))
    out, sent = _simulate_ring_all_reduce(values)
    assert np.allclose(out, values.sum(axis=0))
    assert sent == pytest.approx(cf.bytes_sent_per_rank("all_reduce", "ring", n, size))


def test_auto_picks_tree_for_small_and_ring_for_large_messages() -> None:
    net = Network(make_cluster(512))
    s = make_strategy(tp=1, dp=512)
    ranks = group_ranks(s, "dp")
    assert net.best_algorithm("all_reduce", ranks, 1e3) in ("tree", "hierarchical")
    assert net.best_algorithm("all_reduce", ranks, 1e3) != "ring"
    t_auto = net.collective_time_s("all_reduce", ranks, 1e9)
    assert t_auto == pytest.approx(min(net.collective_time_s("all_reduce", ranks, 1e9, algorithm=a)
                                       for a in ("ring", "tree", "hierarchical")))


def test_closed_form_errors() -> None:
    with pytest.raises(InputError):
        cf.ring_all_reduce_time_s(0, S, B, A)
    with pytest.raises(InputError):
        cf.ring_all_reduce_time_s(4, -1.0, B, A)
    with pytest.raises(InputError):
        cf.bytes_sent_per_rank("all_gather", "tree", 4, S)


# --------------------------------------------------------------------------- placement-aware


def test_dp_ring_across_nodes_gets_the_nic_per_gpu_tp_gets_nvlink() -> None:
    c = make_cluster(16)  # 2 nodes x 8 A100, 8 HDR NICs each
    net = Network(c)
    s = make_strategy(tp=8, dp=2)
    dp = net.group_link(group_ranks(s, "dp"), concurrent_groups=all_groups(s, "dp"))
    assert dp.bytes_per_s == pytest.approx(c.nic_bytes_per_s_per_gpu) and dp.tier == "scale-out"
    tp = net.group_link(group_ranks(s, "tp"), concurrent_groups=all_groups(s, "tp"))
    assert tp.bytes_per_s == pytest.approx(300e9) and tp.tier == "scale-up"
    assert net.dim_link(s, "dp") == dp
    # A flat 16-GPU ring crosses each node boundary once; its crossing is striped over all
    # eight NICs of the node (NCCL channels + PXN), so it runs at the node's NIC total.
    flat = net.group_link(tuple(range(16)))
    assert flat.bytes_per_s == pytest.approx(8 * 25e9)


def test_ring_time_uses_group_link() -> None:
    net = Network(make_cluster(16))
    s = make_strategy(tp=8, dp=2)
    ranks, groups = group_ranks(s, "dp"), all_groups(s, "dp")
    link = net.group_link(ranks, concurrent_groups=groups)
    t = net.collective_time_s("all_reduce", ranks, S, algorithm="ring", concurrent_groups=groups)
    assert t == pytest.approx(cf.ring_all_reduce_time_s(2, S, link.bytes_per_s, link.latency_s))
    assert net.dim_collective_time_s("all_reduce", s, "dp", S, algorithm="ring") == pytest.approx(t)
    p2p = net.p2p_time_s(0, 8, S)
    one = net.group_link((0, 8), pattern="p2p")
    assert p2p == pytest.approx(S / one.bytes_per_s + one.latency_s)
    assert net.p2p_time_s(3, 3, S) == 0.0
    assert net.collective_time_s("all_reduce", (5,), S) == 0.0


def test_hierarchical_all_reduce_splits_at_the_nvlink_domain() -> None:
    net = Network(make_cluster(16))
    ranks = tuple(range(16))  # two nodes of 8: k = 8 per domain, D = 2 domains
    t = net.collective_time_s("all_reduce", ranks, S, algorithm="hierarchical")
    intra = net.group_link(ranks[:8], concurrent_groups=[ranks[:8], ranks[8:]])
    inter = net.group_link((0, 8), concurrent_groups=[(i, i + 8) for i in range(8)])
    assert intra.bytes_per_s == pytest.approx(300e9) and inter.bytes_per_s == pytest.approx(25e9)
    assert t == pytest.approx(cf.hierarchical_all_reduce_time_s(8, 2, S, intra.bytes_per_s, intra.latency_s,
                                                                inter.bytes_per_s, inter.latency_s))
    # A group that does not split evenly over domains falls back to the ring.
    odd = (0, 1, 2, 8)
    assert net.collective_time_s("all_reduce", odd, S, algorithm="hierarchical") == \
        pytest.approx(net.collective_time_s("all_reduce", odd, S, algorithm="ring"))


def test_oversubscription_reduces_cross_leaf_ring_bandwidth() -> None:
    # Radix 8: leaves of 4 NICs with 4 uplinks (o=1), of 5 with 2.5 (o=2), of 6 with 1.5 (o=4).
    # DP rings of 8 nodes (tp=8): every NIC carries one flow that leaves its leaf.
    links = {}
    for o in (1.0, 2.0, 4.0):
        c = make_cluster(64, nic=make_nic(radix=8), oversubscription=o)
        links[o] = Network(c).dim_link(make_strategy(tp=8, dp=8), "dp")
    assert links[1.0].bytes_per_s == pytest.approx(25e9)
    assert links[2.0].bytes_per_s < links[1.0].bytes_per_s
    assert links[4.0].bytes_per_s < links[2.0].bytes_per_s


def test_efficiency_scales_the_bottleneck_tier() -> None:
    c = make_cluster(16)
    s = make_strategy(tp=8, dp=2)
    base = Network(c).dim_link(s, "dp").bytes_per_s
    half = Network(c, bandwidth_efficiency={"scale-out": 0.5}).dim_link(s, "dp").bytes_per_s
    assert half == pytest.approx(base / 2)
    with pytest.raises(InputError):
        Network(c, bandwidth_efficiency={"nvlink": 0.5})


def test_pipeline_sends_and_all_to_all_dimensions() -> None:
    c = make_cluster(32)
    net = Network(c)
    s = make_strategy(tp=8, pp=2, dp=2, ep=2)
    pp = net.dim_link(s, "pp", pattern="p2p")
    assert pp.bytes_per_s == pytest.approx(25e9) and pp.tier == "scale-out"
    t = net.dim_collective_time_s("p2p", s, "pp", S)
    assert t == pytest.approx(S / pp.bytes_per_s + pp.latency_s)
    pairs = pipeline_pairs(s)
    assert t == pytest.approx(net.collective_time_s("p2p", pairs[0], S, concurrent_groups=pairs))
    ep = net.dim_collective_time_s("all_to_all", s, "ep", S)
    link = net.dim_link(s, "ep", pattern="all_to_all")
    assert ep == pytest.approx(cf.all_to_all_time_s(2, S, link.bytes_per_s, link.latency_s))


def test_network_input_errors() -> None:
    net = Network(make_cluster(16))
    with pytest.raises(InputError):
        net.collective_time_s("barrier", (0, 1), S)
    with pytest.raises(InputError):
        net.collective_time_s("all_gather", (0, 1), S, algorithm="tree")
    with pytest.raises(InputError):
        net.collective_time_s("all_reduce", (0, 16), S)
    with pytest.raises(InputError):
        net.collective_time_s("all_reduce", (0, 0), S)
    with pytest.raises(InputError):
        net.collective_time_s("p2p", (0, 1, 2), S)
    with pytest.raises(InputError):
        net.collective_time_s("all_reduce", (0, 1), -1.0)


# --------------------------------------------------------------------------- agreement with the graph

NIC = make_nic(radix=6)
CONFIGS = {  # name: (gpu, cluster keyword overrides)
    "a100": (A100, {}),
    "shared-nic": (A100, {"nics_per_node": 4}),
    # two 25 GB/s NICs per GPU: 50 GB/s, which a PCIe gen5 x16 link feeds (sim.net.fabric.check_nics)
    "two-nics-per-gpu": (make_gpu(gpus_per_node=4, domain=4, nics_per_node=8, pcie_generation=5), {}),
    "pcie-only": (make_gpu(domain=1), {"nvlink_domain": 1, "nics_per_node": 4}),
    "half-node-domain": (A100, {"nvlink_domain": 4}),
    "multi-node-domain": (make_gpu(gpus_per_node=4, domain=16, nics_per_node=4), {}),
}
TOPOLOGIES = ["star", "tree", "fat-tree", "rail-optimized", "mesh", "torus"]


def _agree(cluster, groups, index, pattern) -> None:
    eff = {"scale-out": 0.8, "host": 0.9, "scale-up": 0.95}
    net = Network(cluster, bandwidth_efficiency=eff)
    ref_bw, ref_lat, ref_tier = graph_group_link(build_topology(cluster), groups, index=index, pattern=pattern,
                                                 bandwidth_efficiency=eff)
    got = net.group_link(groups[index], concurrent_groups=groups, pattern=pattern)
    assert got.bytes_per_s == pytest.approx(ref_bw, rel=1e-9)
    assert got.latency_s == pytest.approx(ref_lat, rel=1e-9, abs=1e-15)
    assert got.tier == ref_tier


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_network_matches_graph_routing(config: str, topology: str) -> None:
    gpu, kw = CONFIGS[config]
    cluster = make_cluster(32, gpu=gpu, nic=NIC, topology=topology, oversubscription=2.0, **kw)
    s = make_strategy(tp=2, cp=2, dp=8, ep=2)
    for dim, pattern in (("dp", "ring"), ("tp", "ring"), ("dp_cp", "ring"), ("ep", "all_to_all"),
                         ("dp", "all_to_all")):
        groups = all_groups(s, dim)
        _agree(cluster, groups, len(groups) - 1, pattern)
    flat = [tuple(range(32))]
    _agree(cluster, flat, 0, "ring")


@settings(max_examples=12, deadline=None)
@given(config=st.sampled_from(sorted(CONFIGS)), topology=st.sampled_from(TOPOLOGIES),
       tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]), o=st.sampled_from([1.0, 3.0]),
       pattern=st.sampled_from(["ring", "p2p", "all_to_all"]), seed=st.integers(0, 1000))
def test_network_matches_graph_routing_random(config, topology, tp, pp, o, pattern, seed) -> None:
    gpu, kw = CONFIGS[config]
    cluster = make_cluster(32, gpu=gpu, nic=NIC, topology=topology, oversubscription=o, **kw)
    s = make_strategy(tp=tp, pp=pp, dp=32 // (tp * pp))
    dim = "pp" if pattern == "p2p" else ("dp" if seed % 2 else "tp")
    groups = [g[:2] for g in all_groups(s, dim)] if pattern == "p2p" else all_groups(s, dim)
    if len(groups[0]) < 2:
        return
    _agree(cluster, groups, seed % len(groups), pattern)


# --------------------------------------------------------------------------- properties

OPS_ALGS = [("all_reduce", "ring"), ("all_reduce", "tree"), ("all_reduce", "hierarchical"),
            ("all_reduce", "auto"), ("all_gather", "auto"), ("reduce_scatter", "hierarchical"),
            ("all_to_all", "auto")]


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(1.0, 8.0), which=st.sampled_from(["nic", "nvlink"]),
       topology=st.sampled_from(TOPOLOGIES), tp=st.sampled_from([1, 2, 8]),
       op_alg=st.sampled_from(OPS_ALGS), size=st.floats(1e2, 1e10))
def test_more_bandwidth_never_slower(scale, which, topology, tp, op_alg, size) -> None:
    op, alg = op_alg
    base_nic, base_nvl = 25e9, 300e9
    nic_bw = base_nic * (scale if which == "nic" else 1.0)
    nvl_bw = base_nvl * (scale if which == "nvlink" else 1.0)
    s = make_strategy(tp=tp, dp=32 // tp)
    times = []
    for n_bw, v_bw in ((base_nic, base_nvl), (nic_bw, nvl_bw)):
        c = make_cluster(32, gpu=make_gpu(nvlink_bytes_per_s=v_bw, pcie_generation=6),
                         nic=make_nic(bytes_per_s=n_bw, radix=8), topology=topology, oversubscription=2.0)
        times.append(Network(c).dim_collective_time_s(op, s, "dp" if op != "all_to_all" else "dp_cp", size,
                                                      algorithm=alg))
    assert times[1] <= times[0] * (1 + 1e-12)


@settings(max_examples=25, deadline=None)
@given(topology=st.sampled_from(TOPOLOGIES), op_alg=st.sampled_from(OPS_ALGS),
       sizes=st.lists(st.floats(0.0, 1e11), min_size=2, max_size=6))
def test_time_non_decreasing_in_message_size(topology, op_alg, sizes) -> None:
    op, alg = op_alg
    net = _NETS.setdefault(topology, Network(make_cluster(64, topology=topology)))
    ranks = tuple(range(0, 64, 4))
    times = [net.collective_time_s(op, ranks, b, algorithm=alg) for b in sorted(sizes)]
    assert all(a <= b for a, b in zip(times, times[1:]))
    assert times[0] >= 0.0


_NETS: dict[str, Network] = {}


def test_cached_calls_are_consistent_and_group_link_is_frozen() -> None:
    net = Network(make_cluster(64, gpu=GB200, nic=make_nic(bytes_per_s=100e9), nvlink_domain=32))
    s = make_strategy(tp=4, dp=16)
    a = net.dim_collective_time_s("all_reduce", s, "dp", 1e8)
    b = net.dim_collective_time_s("all_reduce", s, "dp", 1e8)
    assert a == b > 0
    link = net.dim_link(s, "dp")
    assert isinstance(link, GroupLink) and link.num_ranks == 16
    with pytest.raises(AttributeError):
        link.bytes_per_s = 1.0  # type: ignore[misc]
