"""The memos of the search's cost pieces (issue 20 part 4): a memoised value is keyed by
everything it depends on, so two inputs differing in one field never share a cached value."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from sim.layers import compute
from sim.data.catalog import get_model
from sim.net.clusters import cluster_from_catalog
from sim.layers.compute import default_efficiency, op_time, op_times, ops_time
from sim.cost.costs import default_network, layer_cost, plan_layer_ops
from sim.layers.ops import layer_ops
from sim.cost.plan import Plan
from sim.data.specs import Strategy

GPU = cluster_from_catalog("h100-80gb", 64)


def _unmemoised(gpu, precision, ops, eff, eager=False):
    f = b = 0.0
    for op in ops:
        t = op_time(gpu, precision, op, eff, eager=eager)
        f, b = f + t.fwd_s, b + t.bwd_s
    return f, b


def _moe_plan(**kw) -> Plan:
    s = Strategy(**{"tp": 2, "ep": 4, "dp": 32, "gbs": 64, "mbs": 2, "seq_len": 4096, "sp": True, **kw})
    return Plan(model=get_model("mixtral-8x7b"), cluster=GPU, strategy=s)


def test_op_times_equal_op_time():
    p = _moe_plan()
    eff = default_efficiency()
    ops = plan_layer_ops(p, p.strategy, eff, moe=True).ops
    for eager in (False, True):
        for _ in range(2):  # the second call is served from the memo
            assert ops_time(GPU.gpu, "bf16", ops, eff, eager=eager) == _unmemoised(GPU.gpu, "bf16", ops, eff, eager)


@pytest.mark.parametrize("field", ["flops", "hbm_bytes", "m", "n", "k", "batch", "kernel",
                                   "backward_flops_per_forward", "backward_bytes_per_forward", "kind"])
def test_ops_differing_in_one_field_do_not_share(field):
    """Two layers whose ops differ only in one field of one op get that op's own time."""
    p = _moe_plan()
    eff = default_efficiency()
    ops = plan_layer_ops(p, p.strategy, eff, moe=True).ops
    i = next(j for j, op in enumerate(ops) if op.kind == "matmul" and op.m > 1)
    op = ops[i]
    changed = {"flops": op.flops * 3, "hbm_bytes": op.hbm_bytes * 7, "m": op.m // 2, "n": op.n // 2, "k": op.k // 2,
               "batch": op.batch + 1, "kernel": "tensorwise", "backward_flops_per_forward": 3.0,
               "backward_bytes_per_forward": 5.0, "kind": "memory"}[field]
    other = ops[:i] + (replace(op, **{field: changed}),) + ops[i + 1:]
    ops_time(GPU.gpu, "fp8", ops, eff)  # memoise the first
    assert ops_time(GPU.gpu, "fp8", other, eff) == _unmemoised(GPU.gpu, "fp8", other, eff)


def test_memo_keyed_by_precision_eager_gpu_and_efficiency():
    p = _moe_plan()
    eff = default_efficiency()
    ops = plan_layer_ops(p, p.strategy, eff, moe=True).ops
    a100 = cluster_from_catalog("a100-80gb", 64).gpu
    no_floor = replace(eff, host_op_floor_s=0.0)
    more_overhead = replace(eff, kernel_overhead_s=eff.kernel_overhead_s * 3 + 1e-6)
    base = ops_time(GPU.gpu, "bf16", ops, eff)
    for gpu, prec, e, eager in ((GPU.gpu, "fp8", eff, False), (GPU.gpu, "bf16", eff, True), (a100, "bf16", eff, False),
                                (GPU.gpu, "bf16", no_floor, False), (GPU.gpu, "bf16", more_overhead, False)):
        got = ops_time(gpu, prec, ops, e, eager=eager)
        assert got == _unmemoised(gpu, prec, ops, e, eager)
    assert ops_time(GPU.gpu, "bf16", ops, more_overhead) != base


def test_memo_keyed_by_the_fused_ops():
    """Under eager execution, naming an op fused (Plan.fused_ops) changes its time: the memo
    keeps the two apart."""
    p = _moe_plan()
    eff = default_efficiency()
    ops = plan_layer_ops(p, p.strategy, eff, moe=True).ops
    names = tuple(sorted({op.name for op in ops}))
    eager = ops_time(GPU.gpu, "bf16", ops, eff, eager=True)
    fused = ops_time(GPU.gpu, "bf16", ops, eff, eager=True, fused=names)
    assert fused == ops_time(GPU.gpu, "bf16", ops, eff, eager=False) != eager
    assert ops_time(GPU.gpu, "bf16", ops, eff, eager=True) == eager  # the eager entry is still its own


def test_memo_bounded():
    eff = replace(default_efficiency(), kernel_overhead_s=1.234e-6)
    ops = plan_layer_ops(_moe_plan(), _moe_plan().strategy, eff, moe=False).ops
    for n in range(1, compute._MEMO_MAX + 50, 997):
        op_times(GPU.gpu, "bf16", (replace(ops[1], flops=float(n)),), eff)
    assert all(len(e[2]) <= compute._MEMO_MAX for e in compute._MEMO.values())


def test_layer_ops_do_not_depend_on_recompute():
    """planner.plans.fastmodel caches a layer's ops without the recompute setting (its key)."""
    model = get_model("deepseek-v3")
    base = Strategy(tp=2, ep=8, dp=32, gbs=64, mbs=1, seq_len=4096, sp=True)
    for moe in (False, True):
        ref = layer_ops(model, base, moe=moe)
        for rc in ("selective", "full"):
            assert layer_ops(model, base.with_(recompute=rc), moe=moe) == ref
        assert layer_ops(model, base.with_(recompute="full", recompute_num_layers=2, recompute_method="block"),
                         moe=moe) == ref


def test_layer_cost_follows_recompute_and_cuda_graphs_through_the_memo():
    """Plans differing only in recomputation, or only in CUDA graphs, share the ops' memo but
    not a layer cost."""
    eff, net = default_efficiency(), default_network(GPU)
    costs = {}
    for rc in ("none", "selective", "full"):
        for graphs in (False, True):
            p = _moe_plan(recompute=rc, cuda_graphs=graphs)
            lops = plan_layer_ops(p, p.strategy, eff, moe=True)
            costs[rc, graphs] = layer_cost(p, net, lops, eff, 1.0)
    assert len({c.recompute_s for c in costs.values()}) >= 4
    assert costs["none", True].fwd_s < costs["none", False].fwd_s  # no host floor per op in a graph
    assert costs["full", False].exposed_tp_bwd_s == pytest.approx(2 * costs["none", False].exposed_tp_bwd_s)
    assert [f.name for f in fields(costs["none", False])]  # a LayerCost


def test_event_link_sharing_groups_match_the_plain_loop():
    """``sim.engines.event.resources``: the vectorised grouping of shared links and the distinct
    demand columns equal the loop and ``np.unique(axis=1)`` they replace."""
    import numpy as np

    from sim.engines.event.resources import _sharing_groups, _unique_columns

    rng = np.random.default_rng(3)
    for trial in range(30):
        kinds = int(rng.integers(2, 40))
        link = rng.integers(0, 200, size=600)
        owner = rng.integers(0, kinds, size=600)
        pairs = np.unique(np.stack([link, owner]), axis=1)  # one entry per (link, kind)
        link, owner = pairs[0], pairs[1]
        order = np.lexsort((owner, link))
        link, owner = link[order], owner[order]
        starts = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])
        ends = np.r_[starts[1:], len(link)]
        multi = np.flatnonzero(ends - starts > 1)
        fast = _sharing_groups(link, owner, starts, ends, multi, kinds)
        slow = _sharing_groups(link, owner, starts, ends, multi, 100)  # > 62 kinds: the loop
        assert [(g, ids.tolist()) for g, ids in fast] == [(g, ids.tolist()) for g, ids in slow]
        dem = rng.choice([0.0, 0.25, 0.5, 1.0, 1 / 3], size=(int(rng.integers(1, 5)), int(rng.integers(1, 50))))
        assert np.array_equal(_unique_columns(dem), np.unique(dem, axis=1))
