"""Destinations per token of a deduplicating MoE dispatcher (sim/layers/moe_routing.py): closed forms
against enumeration of the routings they describe."""

import itertools
import math

import numpy as np
import pytest

from sim.layers.moe_routing import dedup_fraction, remote_destinations


def _enumerate_random(e: int, k: int, u: int) -> float:
    """Exact mean over every k-subset of experts (small E) of the remote units it hits."""
    per = e // u
    total = count = 0
    for experts in itertools.combinations(range(e), k):
        hit = {x // per for x in experts}
        total += len(hit) * (u - 1) / u  # the sender is any unit equally often
        count += 1
    return total / count


@pytest.mark.parametrize("e,k,u", [(8, 2, 4), (12, 3, 4), (16, 4, 8), (16, 4, 2)])
def test_random_routing_matches_enumeration(e, k, u):
    assert remote_destinations(e, k, u, "random") == pytest.approx(_enumerate_random(e, k, u), rel=1e-12)


def test_random_routing_monte_carlo_deepseek_shape():
    # DeepSeek-V3: 256 experts, top-8, over 64 ranks (4 experts each) and over 8 nodes
    rng = np.random.default_rng(0)
    picks = np.argsort(rng.random((20000, 256)), axis=1)[:, :8]
    for units in (64, 8):
        hits = np.array([len(set(row // (256 // units))) for row in picks])
        assert remote_destinations(256, 8, units) == pytest.approx(hits.mean() * (units - 1) / units, rel=0.01)


def test_fake_balanced_gate_known_answers():
    # Automodel FakeBalancedGate: token t -> experts (t*k + j) mod E.  Qwen3-30B-A3B on EP 8:
    # 16 experts per rank, 8 consecutive ones aligned to 8 -> one rank per token, remote 7/8.
    assert remote_destinations(128, 8, 8, "contiguous") == pytest.approx(7 / 8)
    # DeepSeek-V3 on EP 64: 4 experts per rank -> exactly 2 ranks per token
    assert remote_destinations(256, 8, 64, "contiguous") == pytest.approx(2 * 63 / 64)


@pytest.mark.parametrize("routing", ["random", "contiguous"])
@pytest.mark.parametrize("e,k", [(8, 2), (64, 6), (128, 8), (256, 8), (384, 8)])
@pytest.mark.parametrize("u", [1, 2, 4, 8, 32])
def test_dedup_never_sends_more_than_per_copy(e, k, u, routing):
    if e % u:
        return
    f = dedup_fraction(e, k, u, routing)
    assert 0 < f <= 1 + 1e-12
    if k == 1 or u == 1:
        assert f == pytest.approx(1.0)
    d = remote_destinations(e, k, u, routing)
    assert d <= min(k, u - 1) + 1e-12 and math.isfinite(d)


def test_deepep_dispatch_pays_distinct_destinations_only():
    """Mixtral (8 experts, top-2) with ep=4 on one node: 2 experts per rank, so a random token
    reaches 1.39 remote ranks (not 1.5 copies) and a FakeBalancedGate token 0.75; NCCL
    all-to-all sends every copy whatever the routing."""
    from sim.engines.analytic import simulate_analytic
    from sim.data.catalog import get_model
    from sim.cost.plan import Plan, parse_strategy
    from tests.conftest import cluster

    model, cl = get_model("mixtral-8x7b"), cluster("h100-80gb", 8, gpn=8)
    s = parse_strategy("ep=4,mbs=1,gbs=16,recompute=full,zero=1", num_gpus=8)

    def ep_s(dispatcher: str, routing: str) -> float:
        plan = Plan(model=model, cluster=cl, strategy=s, moe_dispatcher=dispatcher, moe_routing=routing)
        return simulate_analytic(plan).breakdown.exposed_ep_s

    assert ep_s("alltoall", "random") == ep_s("alltoall", "contiguous")
    assert ep_s("deepep", "contiguous") < ep_s("deepep", "random")
    assert remote_destinations(8, 2, 4) == pytest.approx(3 * (1 - math.comb(6, 2) / math.comb(8, 2)))
    with pytest.raises(Exception, match="moe_routing"):
        Plan(model=model, cluster=cl, strategy=s, moe_routing="zipf")


def test_deepep_internode_remote_bytes_at_the_nic_rate():
    """DeepEP over two 8-GPU H100 nodes (ep 16, one 400G NIC per GPU): the remote-node bytes (a
    random token reaches the other node with the probability its top-2 of 8 experts miss this
    node's 4) go at the NIC's nominal rate x DeepEP's fitted fraction of it, not at the
    all-to-all's send rate over all 15 peers (which counts the 7 on this node's NVLink)."""
    from sim.cost.costs import default_network, moe_dispatch_s
    from sim.cost.plan import Plan, parse_strategy
    from sim.data.catalog import get_model
    from sim.layers.compute import default_efficiency
    from tests.conftest import cluster

    model, cl = get_model("mixtral-8x7b"), cluster("h100-80gb", 16, gpn=8)
    s = parse_strategy("ep=16,mbs=1,gbs=16,recompute=full,zero=1", num_gpus=16)
    plan = Plan(model=model, cluster=cl, strategy=s, moe_dispatcher="deepep", moe_routing="random")
    net, eff = default_network(cl), default_efficiency()
    nbytes = 2 * 4096 * 4096 * 2.0  # top-2 copies of 4096 tokens of hidden 4096 in bf16
    link = net.dim_link(s, "ep", pattern="all_to_all")
    remote = nbytes / 2 * (1 - math.comb(4, 2) / math.comb(8, 2))
    rate = cl.nic_bytes_per_s_per_gpu * eff.deepep_dispatch["scale-out"]
    want = link.latency_s + remote / rate + eff.collective_overhead_s
    assert link.tier == "scale-out"
    assert moe_dispatch_s(plan, net, eff, nbytes) == pytest.approx(want, rel=1e-6)
