"""Event engine: shared links, invariants, agreement with the analytic engine, what-ifs."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import fields, replace

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_gpu, get_nic
from sim.net.network import Network
from sim.cost.costs import step_costs
from sim.base.errors import InputError
from sim.engines.event.engine import Engine, simulate_event
from sim.engines.event.resources import FairShare, LinkTable
from sim.engines.event.scenario import Scenario
from sim.engines.event.whatif import (SlowLink, Straggler, WhatIf, apply_layers_per_stage, parse_layers_per_stage,
                              parse_slow_link, parse_straggler)
from sim.data.models import load_model
from sim.cost.plan import Plan, parse_strategy
from sim.net.placement import all_groups
from sim.data.hardware import Cluster
from sim.cost.step import SCALES, StagePieces
from sim.net.routing import route_stripes
from sim.net.topology import build_topology
from tests.conftest import cluster as shared_cluster
from tests.test_event_fixtures import run_engine, synthetic_costs, tiny_plan


def real_plan(model: str, gpu: str, n: int, strategy: str, **cluster: object) -> Plan:
    gpn, dom = cluster.pop("gpus_per_node", None), cluster.pop("nvlink_domain", None)
    o = cluster.pop("oversubscription", 1.0)
    c = shared_cluster(gpu, n, gpn=gpn, domain=dom, o=o, **cluster)  # type: ignore[arg-type]
    return Plan(model=load_model(model), cluster=c, strategy=parse_strategy(strategy, num_gpus=n))


def _two_flows_one_nic() -> tuple[FairShare, simpy.Environment, object, object]:
    """Two nodes of 8 GPUs with one NIC each: GPU0->8 and GPU1->9 share both NICs."""
    g = get_gpu("a100-80gb")
    c = Cluster(gpu=g, num_gpus=16, nic=get_nic("ib-hdr-200"), gpus_per_node=8, nvlink_domain=8, nics_per_node=1)
    env = simpy.Environment()
    fs = FairShare(env, LinkTable(Network(c)), check=True)
    a = fs.kind("a", np.array([0]), np.array([8]))
    b = fs.kind("b", np.array([1]), np.array([9]))
    fs.link_neighbours()
    return fs, env, a, b


def test_flows_sharing_a_nic_split_it() -> None:
    fs, env, a, b = _two_flows_one_nic()
    assert a.alone_rate == pytest.approx(get_nic("ib-hdr-200").bytes_per_s_per_direction)
    assert b.index in a.neighbours
    done: dict[str, float] = {}
    one_second = a.alone_rate

    def go(name: str, kind: object, delay: float):
        yield env.timeout(delay)
        yield fs.start(kind, one_second)  # type: ignore[arg-type]
        done[name] = env.now

    env.process(go("a", a, 0.0))
    env.process(go("b", b, 0.5))
    env.run()
    # a: 0.5 s alone (half its bytes), then half rate for 1 s; b: half rate to 1.5 s, then alone.
    assert done == pytest.approx({"a": 1.5, "b": 2.0})
    assert fs.max_utilisation == pytest.approx(1.0)


def test_link_loads_match_network_bottleneck() -> None:
    """LinkTable routes exactly as sim.net.network: a group's alone rate is group_link's."""
    plan = real_plan("gpt3-175b", "a100-80gb", 256, "tp=8,pp=4,mbs=1,gbs=256", oversubscription=4.0)
    net = Network(plan.cluster)
    table = LinkTable(net)
    s = plan.strategy
    for dim in ("dp_cp", "tp", "pp"):
        groups = all_groups(s, dim)
        src = np.concatenate([np.array(g) for g in groups])
        dst = np.concatenate([np.roll(np.array(g), -1) for g in groups])
        ids, loads = table.loads(src, dst)
        want = net.dim_link(s, dim).bytes_per_s
        assert table.alone_rate(ids, loads) == pytest.approx(want, rel=1e-12), dim


def test_link_loads_match_graph_routing() -> None:
    """Per-link loads equal routing every stripe on the networkx topology (small cluster)."""
    g = get_gpu("h100-80gb")
    c = Cluster(gpu=g, num_gpus=32, nic=get_nic("ib-ndr-400"), gpus_per_node=8, nvlink_domain=8, nics_per_node=4)
    table = LinkTable(Network(c))
    graph = build_topology(c)
    src, dst = np.array([0, 3, 9, 17]), np.array([8, 30, 10, 2])
    ids, loads = table.loads(src, dst)
    total = 0.0
    for s_, d_ in zip(src, dst):
        stripes = route_stripes(graph, int(s_), int(d_))
        total += sum(len(p) - 1 for p in stripes) / len(stripes)
    assert loads.sum() == pytest.approx(total)


def test_slow_link_targets() -> None:
    table = LinkTable(Network(real_plan("gpt3-175b", "a100-80gb", 64, "tp=8,pp=8,mbs=1,gbs=64").cluster))
    assert len(table.select("node:2")) == 2 * 8
    assert len(table.select("scale-out")) > 0
    slow = table.scaled(table.select("nic:3"), 0.5)
    assert (slow.cap < table.cap).sum() == 2
    for bad in ("node:8", "nic:99", "leaf:999", "switch:1", "gpu:x"):
        with pytest.raises(InputError):
            table.select(bad)

# --------------------------------------------------------------------------- invariants


@settings(max_examples=25, deadline=None)
@given(p=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2]),
       k=st.integers(1, 3), schedule=st.sampled_from(["1f1b", "gpipe", "zero-bubble"]), zero=st.sampled_from([0, 1, 3]),
       oversub=st.sampled_from([1.0, 4.0]), nics=st.sampled_from([1, 8]), explicit=st.booleans())
def test_invariants_on_small_plans(p: int, dp: int, tp: int, k: int, schedule: str, zero: int, oversub: float,
                                   nics: int, explicit: bool) -> None:
    """Every pass runs exactly once, no shared link is loaded above capacity, the step is at
    least the busiest unit's compute, and the same input gives the same log."""
    if p == 1:
        schedule = "1f1b"
    m = p * k
    g = get_gpu("a100-80gb")
    n = p * dp * tp
    model = tiny_plan(p=p, m=m).model
    # 8 NICs for 4 GPUs: 100G ones, two of which an A100's PCIe gen4 x16 link can feed (sim.net.fabric.check_nics)
    c = Cluster(gpu=g, num_gpus=n, nic=get_nic("ib-hdr-200" if nics <= 4 else "eth-100"), gpus_per_node=min(4, n),
                nvlink_domain=min(4, n), nics_per_node=nics, oversubscription=oversub)
    from sim.data.specs import Strategy
    plan = Plan(model=model, cluster=c, strategy=Strategy(tp=tp, pp=p, dp=dp, mbs=1, gbs=m * dp, schedule=schedule,
                                                          zero=zero))
    net = Network(c)
    costs = step_costs(plan, net)
    runs = []
    for _ in range(2):
        eng = Engine(Scenario(plan, costs, net, explicit=explicit), LinkTable(net), check_links=True)
        eng.run()
        runs.append(eng)
    eng = runs[0]
    assert runs[1].log == eng.log and runs[1].unit_end == eng.unit_end
    assert eng.net.max_utilisation <= 1 + 1e-9
    passes = Counter((e.unit, e.op) for e in eng.log if e.cat == "compute" and e.op)
    phases = "FBW" if schedule == "zero-bubble" else "FB"
    for u in eng.sc.units:
        ops = {op for (unit, op) in passes if unit == u.index}
        assert ops == {f"{ph}{j}" for ph in phases for j in range(m)}
        # A pass runs as one entry, or one per layer (the last backward, ZeRO-3): never twice.
        per_op = Counter(op for (unit, op) in passes.elements() if unit == u.index)
        n_pieces = {len(eng.sc.pieces[(u.stage, 0, ph)][0]) for ph in phases}
        assert all(v in {1} | n_pieces for v in per_op.values())
    work = [sum(e.end - e.start for e in eng.log if e.unit == u.index and e.cat == "compute") for u in eng.sc.units]
    assert max(eng.unit_end) >= max(work) * (1 - 1e-9)


def test_identical_input_identical_json(tmp_path) -> None:
    plan = real_plan("gpt3-175b", "a100-80gb", 256, "tp=8,pp=4,mbs=1,gbs=256,sp=1")
    outs = [json.dumps(simulate_event(plan, trace_path=str(tmp_path / f"t{i}.json")).to_dict(), sort_keys=True)
            for i in range(2)]
    assert outs[0] == outs[1]
    assert (tmp_path / "t0.json").read_bytes() == (tmp_path / "t1.json").read_bytes()


def test_breakdown_sums_to_step() -> None:
    plan = real_plan("mixtral-8x7b", "h100-80gb", 128, "tp=2,pp=4,ep=8,mbs=1,gbs=256")
    r = simulate_event(plan)
    b = r.breakdown
    assert b.total_s == pytest.approx(r.step_time_s, rel=1e-9)
    assert b.exposed_ep_s > 0 and b.bubble_s > 0 and b.compute_s > 0
    assert r.engine == "event" and 0 < r.mfu <= r.hfu <= 1

# --------------------------------------------------------------------------- agreement


# (plan, tolerance, why they may differ)
AGREEMENT = [
    (("gpt3-175b", "a100-80gb", 1024, "tp=8,pp=16,mbs=1,gbs=1536,sp=1,recompute=selective"), 0.02,
     "1F1B, balanced stages: same closed form; DP buckets pay their latency per bucket"),
    (("gpt3-175b", "a100-80gb", 512, "tp=8,pp=8,vp=3,mbs=1,gbs=512,sp=1"), 0.05,
     "interleaved: earlier chunks finish their gradients early and the event engine overlaps their "
     "reduction with the rest of the drain (Megatron reduces per chunk); the closed form hides DP "
     "behind the last backward only"),
    (("llama3-70b", "h100-80gb", 256, "tp=8,pp=4,cp=2,mbs=1,gbs=128,seq=8192"), 0.03, "context parallel ring"),
    (("mixtral-8x7b", "h100-80gb", 128, "tp=2,pp=4,ep=8,mbs=1,gbs=256"), 0.03, "expert all-to-all"),
    (("llama3-8b", "a100-80gb", 64, "tp=1,pp=1,mbs=2,gbs=128,zero=3"), 0.05,
     "FSDP: per-layer prefetch simulated instead of the closed-form exposure"),
    (("llama3-8b", "h100-80gb", 64, "tp=2,pp=4,mbs=1,gbs=128,schedule=zero-bubble"), 0.03, "ZB-H1"),
]


@pytest.mark.parametrize("spec,tol,why", AGREEMENT, ids=[a[0][3] for a in AGREEMENT])
def test_event_agrees_with_analytic(spec: tuple, tol: float, why: str) -> None:
    plan = real_plan(*spec)
    net = Network(plan.cluster)
    costs = step_costs(plan, net)
    a = simulate_analytic(plan, net=net, costs=costs)
    e = simulate_event(plan, net=net, costs=costs)
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=tol), why
    assert e.model_flops_per_step == a.model_flops_per_step
    assert e.memory_peak_bytes == a.memory_peak_bytes


def test_explicit_ranks_agree_with_symmetric() -> None:
    plan = real_plan("gpt3-175b", "a100-80gb", 256, "tp=4,pp=4,mbs=1,gbs=256,sp=1")
    net = Network(plan.cluster)
    costs = step_costs(plan, net)
    sym = simulate_event(plan, net=net, costs=costs)
    exp = simulate_event(plan, net=net, costs=costs, explicit_ranks=True)
    assert exp.extra["event"]["simulated_units"] == 4 * 16
    assert exp.step_time_s == pytest.approx(sym.step_time_s, rel=0.005)

# --------------------------------------------------------------------------- what-ifs


def test_straggler_slows_the_step_by_its_stage() -> None:
    plan = tiny_plan(p=4, m=8, dp=2)
    costs = synthetic_costs(plan)
    base = max(run_engine(plan, costs).unit_end)
    slow = run_engine(plan, costs, explicit=True, whatif=WhatIf(stragglers=(Straggler(rank=2, slowdown_pct=50),)))
    # Rank 2 is stage 1 of replica 0: that pipeline runs at 1.5x the pace of its stage 1
    # (F + B = 4.5 s, 8 micro-batches); replica 1 finishes early, then waits for it at the
    # gradient reduction, which (even free) is a barrier.
    ends = {(u.stage, u.replica): slow.unit_end[u.index] for u in slow.sc.units}
    assert ends[(0, 0)] == ends[(0, 1)] > base
    waits = {u.replica: sum(e.end - e.start for e in slow.log if e.unit == u.index and e.name == "wait gradient reduction")
             for u in slow.sc.units if u.stage == 0}
    assert waits[0] == pytest.approx(0.0) and waits[1] == pytest.approx(ends[(0, 1)] - base)
    sym = run_engine(plan, costs, whatif=WhatIf(stragglers=(Straggler(rank=2, slowdown_pct=50),)))
    assert max(sym.unit_end) == pytest.approx(max(slow.unit_end))


def test_straggler_and_slow_link_on_a_real_plan() -> None:
    plan = real_plan("gpt3-175b", "a100-80gb", 256, "tp=8,pp=4,mbs=1,gbs=256,sp=1")
    net = Network(plan.cluster)
    costs = step_costs(plan, net)
    base = simulate_event(plan, net=net, costs=costs).step_time_s
    strag = simulate_event(plan, net=net, costs=costs, explicit_ranks=True,
                           whatif=WhatIf(stragglers=(Straggler(rank=70, slowdown_pct=10),)))
    assert base < strag.step_time_s < base * 1.11
    link = simulate_event(plan, net=net, costs=costs, whatif=WhatIf(slow_links=(SlowLink(target="node:9",
                                                                                            slowdown_pct=300),)))
    assert link.step_time_s > base
    assert link.extra["event"]["critical_stage"] == 9 * 8 // 64  # node 9 holds stage 1


def test_layers_per_stage_moves_work() -> None:
    plan = tiny_plan(p=4, m=8, layers_per_chunk=4)
    costs = synthetic_costs(plan, fwd_s=1.0, bwd_s=2.0)  # 0.25 + 0.5 s per layer
    even = max(run_engine(plan, costs).unit_end)
    uneven = run_engine(plan, costs, whatif=WhatIf(layers_per_stage=(2, 6, 4, 4)))
    # Stage 1 now holds 6 layers: 1.5x the work per micro-batch sets the pace.
    assert max(uneven.unit_end) > even
    assert len(uneven.sc.costs.stages[1].layer_costs) == 6


def test_moving_layers_rescales_every_stage_piece() -> None:
    """Every field of ``StagePieces`` states how it scales (``SCALES``); moving layers rescales
    each as it states.  A field added without a scale fails here (``rescaled`` reads it)."""
    plan = tiny_plan(p=4, m=8, layers_per_chunk=4)
    costs = synthetic_costs(plan)
    ones = StagePieces(**{f.name: 1.0 for f in fields(StagePieces)})
    costs = replace(costs, stages=tuple(replace(st, pieces=ones) for st in costs.stages))
    moved = apply_layers_per_stage(costs, (2, 6, 4, 4))
    for st, n in zip(moved.stages, (2, 6, 4, 4)):
        ratio = n / 4  # every synthetic layer holds one parameter, as does nothing else
        assert st.params == n
        for f in fields(StagePieces):
            assert f.metadata.get("scales") in SCALES, f.name
            want = ratio if f.metadata["scales"] == "params" else 1.0
            assert getattr(st.pieces, f.name) == pytest.approx(want), f.name
    assert {f.metadata["scales"] for f in fields(StagePieces)} == set(SCALES)


def test_whatif_parsing_errors() -> None:
    assert parse_straggler("17:20") == Straggler(rank=17, slowdown_pct=20.0)
    assert parse_slow_link("Node:3:100") == SlowLink(target="node:3", slowdown_pct=100.0)
    assert parse_slow_link("scale-out:50").target == "scale-out"
    assert parse_layers_per_stage("22,26,26,22") == (22, 26, 26, 22)
    for fn, bad in ((parse_straggler, "17"), (parse_straggler, "x:1"), (parse_straggler, "1:nan"),
                    (parse_straggler, "1:-3"), (parse_slow_link, "node:3"), (parse_slow_link, "moon:1:5"),
                    (parse_layers_per_stage, "1,,2"), (parse_layers_per_stage, "0,4")):
        with pytest.raises(InputError):
            fn(bad)
    plan = tiny_plan(p=2, m=2)
    with pytest.raises(InputError, match="layers-per-stage"):
        WhatIf(layers_per_stage=(1, 2)).check(plan)
    with pytest.raises(InputError, match="straggler"):
        WhatIf(stragglers=(Straggler(rank=2, slowdown_pct=5),)).check(plan)

# --------------------------------------------------------------------------- overlap slowdown


def _with_sigma(sigma: float):
    from dataclasses import replace

    from sim.layers.compute import default_efficiency

    return replace(default_efficiency(), overlap_compute_slowdown=sigma)


def test_overlap_slowdown_charges_hidden_collectives_only() -> None:
    """Compute under a hidden collective is slowed by sigma (arXiv:2507.03114); exposed
    collectives and plans without overlap pay nothing extra."""
    sigma = _with_sigma(0.189)
    plan = real_plan("gpt3-175b", "h100-80gb", 64, "tp=8,pp=8,mbs=1,gbs=64,sp=1,tp_overlap=1")
    net = Network(plan.cluster)
    lc = step_costs(plan, net, sigma).stages[1].layer_costs[0]
    lc0 = step_costs(plan, net, _with_sigma(0.0)).stages[1].layer_costs[0]
    hidden_f = lc.tp_comm_fwd_s - lc.exposed_tp_fwd_s
    assert hidden_f > 0
    assert lc.overlap_slowdown_fwd_s == pytest.approx(0.189 * hidden_f)
    assert lc.fwd_s == pytest.approx(lc0.fwd_s + 0.189 * hidden_f)
    no_overlap = real_plan("gpt3-175b", "h100-80gb", 64, "tp=8,pp=8,mbs=1,gbs=64,sp=1")
    lc_n = step_costs(no_overlap, Network(no_overlap.cluster), sigma).stages[1].layer_costs[0]
    assert lc_n.overlap_slowdown_fwd_s == 0 and lc_n.overlap_slowdown_bwd_s == 0


def test_overlap_slowdown_of_ddp_reduction_in_both_engines() -> None:
    """DDP with overlapped bucketed reduction: the analytic engine adds sigma x the reduction
    hidden under the last backward; the event engine measures the hidden time on its flows."""
    plan = real_plan("llama3-8b", "a100-80gb", 64, "tp=1,pp=1,mbs=1,gbs=64,zero=1")
    net = Network(plan.cluster)
    eff0, eff1 = _with_sigma(0.0), _with_sigma(0.189)
    c0, c1 = step_costs(plan, net, eff0), step_costs(plan, net, eff1)
    a0, a1 = simulate_analytic(plan, net=net, eff=eff0, costs=c0), simulate_analytic(plan, net=net, eff=eff1, costs=c1)
    st = c0.stages[0]
    assert st.pieces.dp_grad_sync_s > 0
    assert a1.step_time_s > a0.step_time_s
    assert a1.step_time_s - a0.step_time_s <= 0.189 * (st.pieces.dp_grad_sync_s + st.pieces.dp_param_gather_s) + 1e-12
    e0, e1 = simulate_event(plan, net=net, eff=eff0, costs=c0), simulate_event(plan, net=net, eff=eff1, costs=c1)
    assert e1.step_time_s > e0.step_time_s
    assert (e1.step_time_s - e0.step_time_s) == pytest.approx(a1.step_time_s - a0.step_time_s, rel=0.25)
    assert e1.breakdown.total_s == pytest.approx(e1.step_time_s, rel=1e-9)


def test_overlap_slowdown_of_fsdp_prefetch() -> None:
    plan = real_plan("llama3-8b", "h100-80gb", 64, "tp=1,pp=1,mbs=2,gbs=128,zero=3,seq=8192")
    net = Network(plan.cluster)
    s0, s1 = step_costs(plan, net, _with_sigma(0.0)).stages[0], step_costs(plan, net, _with_sigma(0.189)).stages[0]
    assert s1.pieces.overlap_slowdown_fwd_s > 0 and s1.pieces.overlap_slowdown_bwd_s > 0
    assert s1.compute_fwd_s == pytest.approx(s0.compute_fwd_s + s1.pieces.overlap_slowdown_fwd_s)
    # the hidden all-gather is at most the whole all-gather (same bytes as the reduce-scatter
    # at 2 of its 4 bytes per parameter)
    assert s1.pieces.overlap_slowdown_fwd_s <= 0.189 * s1.pieces.dp_grad_sync_s
    e0 = simulate_event(plan, net=net, eff=_with_sigma(0.0))
    e1 = simulate_event(plan, net=net, eff=_with_sigma(0.189))
    assert e1.step_time_s > e0.step_time_s
