"""Fabric graphs and their metrics against hand-counted small cases and networkx min cuts."""

from __future__ import annotations

import networkx as nx
import pytest

from sim.net.fabric import TIERS, grid_shape, layout_fabric
from sim.net.routing import graph_bisection_bytes_per_s, route_stripes
from sim.net.topology import build_topology, topology_metrics
from tests.topo_fixtures import A100, GB200, HDR, make_cluster, make_gpu, make_nic

ONE = make_gpu(id="one-per-node", domain=1, gpus_per_node=1, nics_per_node=1)


def one_nic_cluster(num: int, *, radix: int, topology: str = "fat-tree", oversubscription: float = 1.0,
                    tree_levels: int = 2):
    """``num`` single-GPU, single-NIC nodes (no NVLink): the textbook host-switch setting."""
    return make_cluster(num, gpu=ONE, nic=make_nic(radix=radix), topology=topology,
                        oversubscription=oversubscription, tree_levels=tree_levels)


def test_star_of_four_nodes() -> None:
    c = make_cluster(32, topology="star")
    m = topology_metrics(c)
    assert m.num_nodes == 4 and m.num_nics == 32
    assert m.num_switches == 1 and m.switches_by_level == {"leaf": 1}
    assert m.cables_by_tier == {"nic-leaf": 32}
    assert m.bisection_bytes_per_s == pytest.approx(0.5 * 32 * 25e9)
    assert m.diameter_hops == 1
    g = build_topology(c)
    assert graph_bisection_bytes_per_s(g, first_half=[0, 1]) == pytest.approx(m.bisection_bytes_per_s)


def test_star_ignores_radix() -> None:
    m = topology_metrics(one_nic_cluster(100, radix=8, topology="star"))
    assert m.num_switches == 1 and m.switches_by_radix == {100: 1}


@pytest.mark.parametrize("topology", ["tree", "fat-tree"])
def test_two_level_oversubscription_two_halves_bisection(topology: str) -> None:
    full = one_nic_cluster(8, radix=4, topology=topology, oversubscription=1.0)
    half = one_nic_cluster(8, radix=6, topology=topology, oversubscription=2.0)  # 4 down, 2 up per leaf
    mf, mh = topology_metrics(full), topology_metrics(half)
    assert mf.num_levels == mh.num_levels == 2
    assert mf.bisection_bytes_per_s == pytest.approx(4 * 25e9)
    assert mh.bisection_bytes_per_s == pytest.approx(mf.bisection_bytes_per_s / 2)
    for c, m in ((full, mf), (half, mh)):
        assert graph_bisection_bytes_per_s(build_topology(c)) == pytest.approx(m.bisection_bytes_per_s)
    assert mh.switches_by_level == {"leaf": 2, "spine": 1}
    assert mh.cables_by_tier == {"nic-leaf": 8, "leaf-spine": 4}


def test_fat_tree_radix_4_is_al_fares_k4() -> None:
    # Al-Fares et al. 2008: a k=4 fat-tree joins k^3/4 = 16 hosts with 5k^2/4 = 20 switches.
    c = one_nic_cluster(16, radix=4)
    m = topology_metrics(c)
    assert m.num_levels == 3
    assert m.switches_by_level == {"leaf": 8, "spine": 8, "core": 4}
    assert m.num_switches == 20 and m.switches_by_radix == {4: 20}
    assert m.cables_by_tier == {"nic-leaf": 16, "leaf-spine": 16, "spine-core": 16}
    assert m.diameter_hops == 5
    assert m.bisection_bytes_per_s == pytest.approx(8 * 25e9)
    assert graph_bisection_bytes_per_s(build_topology(c)) == pytest.approx(m.bisection_bytes_per_s)


def test_fat_tree_levels_from_radix() -> None:
    assert topology_metrics(one_nic_cluster(4, radix=4)).num_levels == 1       # fits one switch
    assert topology_metrics(one_nic_cluster(8, radix=4)).num_levels == 2       # <= R^2/2
    assert topology_metrics(one_nic_cluster(10, radix=4)).num_levels == 3      # > R^2/2
    m = topology_metrics(make_cluster(2048, nic=make_nic(radix=64)))
    assert m.num_levels == 2 and m.switches_by_level == {"leaf": 64, "spine": 32}   # 2048 = 64^2/2
    m = topology_metrics(make_cluster(4096, nic=make_nic(radix=64)))
    assert m.num_levels == 3 and m.switches_by_level["leaf"] == 128


def test_tree_tapers_at_every_level() -> None:
    # Radix 6, oversubscription 2: leaves of 4 NICs with 2 uplinks; 32 NICs need 3 levels.
    fat = one_nic_cluster(32, radix=6, topology="fat-tree", oversubscription=2.0)
    tree = one_nic_cluster(32, radix=6, topology="tree", oversubscription=2.0, tree_levels=3)
    mf, mt = topology_metrics(fat), topology_metrics(tree)
    assert mf.num_levels == mt.num_levels == 3
    assert mf.bisection_bytes_per_s == pytest.approx(32 * 25e9 / 2 / 2)
    assert mt.bisection_bytes_per_s == pytest.approx(32 * 25e9 / 2 / 4)
    assert graph_bisection_bytes_per_s(build_topology(tree), first_half=range(16)) == \
        pytest.approx(mt.bisection_bytes_per_s)


def test_rail_optimized_rails_and_one_hop() -> None:
    c = make_cluster(32, topology="rail-optimized")
    g = build_topology(c)
    m = topology_metrics(c)
    assert m.switches_by_level == {"leaf": 8, "spine": 1}
    for k in range(8):  # rail leaf k holds NIC k of every node
        leaves = {next(n for n in g[("nic", node, k)] if n[0] == "switch") for node in range(4)}
        assert len(leaves) == 1
    # GPU 3 of node 0 to GPU 3 of node 2: every stripe crosses exactly one switch.
    for path in route_stripes(g, 3, 19):
        assert sum(n[0] == "switch" for n in path) == 1
    assert m.diameter_hops == 3


def test_torus_and_mesh_diameters_and_bisection() -> None:
    assert grid_shape(16) == (4, 4) and grid_shape(12) == (3, 4) and grid_shape(7) == (1, 7)
    torus = make_cluster(16 * 8, topology="torus")
    mesh = make_cluster(9 * 8, topology="mesh")
    mt, mm = topology_metrics(torus), topology_metrics(mesh)
    assert mt.diameter_hops == 4 and mm.diameter_hops == 4
    assert mt.num_switches == 0 and mm.num_switches == 0
    link = 8 * 25e9 / 4
    assert mt.bisection_bytes_per_s == pytest.approx(2 * 4 * link)
    assert mm.bisection_bytes_per_s == pytest.approx(3 * link)
    for c, m in ((torus, mt), (mesh, mm)):
        g = build_topology(c)
        routers = g.subgraph(n for n in g if n[0] == "router")
        assert nx.diameter(routers) == m.diameter_hops
    g = build_topology(torus)
    assert graph_bisection_bytes_per_s(g, first_half=range(8)) == pytest.approx(mt.bisection_bytes_per_s)
    assert mt.cables_by_tier == {"node-node": 32 * 2}


def test_gb200_nvl72_domain_spans_nodes() -> None:
    c = make_cluster(144, gpu=GB200, nic=make_nic(bytes_per_s=100e9))
    g = build_topology(c)
    nvs = [n for n in g if n[0] == "nvswitch"]
    assert len(nvs) == 2 and g.degree(("nvswitch", 0)) == 72
    assert layout_fabric(c).num_nodes == 36
    m = topology_metrics(c)
    assert m.num_scale_up_domains == 2 and m.num_nics == 144


@pytest.mark.parametrize("topology", ["star", "tree", "fat-tree", "rail-optimized", "mesh", "torus"])
def test_every_edge_is_described_and_graph_connected(topology: str) -> None:
    c = make_cluster(48, topology=topology, oversubscription=2.0, nic=make_nic(radix=8))
    g = build_topology(c)
    assert nx.is_connected(g)
    for _, _, attrs in g.edges(data=True):
        assert attrs["tier"] in TIERS and attrs["bytes_per_s"] > 0 and attrs["latency_s"] >= 0
        assert isinstance(attrs["link"], str) and attrs["link"]
    assert topology_metrics(g) == topology_metrics(c)
    assert sum(1 for n in g if n[0] == "gpu") == 48


def test_host_edge_is_pcie_of_the_gpu_generation() -> None:
    g = build_topology(make_cluster(16, gpu=A100, nic=HDR))
    attrs = g.edges[("gpu", 0), ("nic", 0, 0)]
    assert attrs["tier"] == "host" and attrs["link"] == "pcie-gen4" and attrs["bytes_per_s"] == pytest.approx(31.5e9)


def test_nic_sharing_and_multi_nic_attachment() -> None:
    g = build_topology(make_cluster(8, nics_per_node=4))
    assert sorted(n for n in g[("nic", 0, 1)] if n[0] == "gpu") == [("gpu", 2), ("gpu", 3)]
    g = build_topology(make_cluster(4, gpu=make_gpu(gpus_per_node=4, domain=4), nics_per_node=8))
    assert sorted(n for n in g[("gpu", 1)] if n[0] == "nic") == [("nic", 0, 2), ("nic", 0, 3)]


@pytest.mark.parametrize("topology", ["fat-tree", "rail-optimized", "torus"])
def test_aggregated_graph_keeps_capacity(topology: str) -> None:
    c = make_cluster(64, topology=topology, nic=make_nic(radix=8))
    detailed, small = build_topology(c, aggregate=False), build_topology(c, aggregate=True)
    assert small.graph["aggregated"] and small.number_of_nodes() < detailed.number_of_nodes()

    def scale_out_bytes(g):
        return sum(a["bytes_per_s"] for _, _, a in g.edges(data=True) if a["tier"] == "scale-out")
    if topology == "torus":  # the NIC-router edges fold into the node vertex
        nic_edges = sum(a["bytes_per_s"] for u, v, a in detailed.edges(data=True) if "nic" in (u[0], v[0])
                        and a["tier"] == "scale-out")
        assert scale_out_bytes(small) == pytest.approx(scale_out_bytes(detailed) - nic_edges)
    else:
        assert scale_out_bytes(small) == pytest.approx(scale_out_bytes(detailed))
    assert nx.is_connected(small)
    assert topology_metrics(small) == topology_metrics(c)
    with pytest.raises(Exception):
        route_stripes(small, 0, 9)
