"""Issue 23, third pass: a framework's pipeline flushes per step (NeMo Automodel runs
``schedule.step`` once per gradient-accumulation step) and memory-bound ops a profile runs fused
inside eager model code (``fused_ops``)."""

from dataclasses import replace

import pytest

from sim.engines.analytic import simulate_analytic
from sim.base.errors import InfeasibleError, InputError
from sim.engines.event import simulate_event
from sim.engines.event.schedules import flushed_orders, schedule_orders
from sim.cost.framework import apply_framework, get_framework
from sim.data.models import load_model
from sim.layers.ops import FUSIBLE_OPS
from sim.cost.plan import Plan, parse_strategy
from tests.conftest import cluster


def _plan(strategy: str, n: int = 8, seq: int = 2048, **kw) -> Plan:
    return Plan(model=load_model("llama3-8b"), cluster=cluster("h100-80gb", n),
                strategy=parse_strategy(strategy, num_gpus=n, seq_len=seq), **kw).checked()


@pytest.mark.parametrize("strategy", ["tp=1,pp=4,mbs=1,gbs=16,zero=1",
                                      "tp=1,pp=4,vp=2,mbs=1,gbs=16,zero=1,schedule=interleaved",
                                      "tp=1,pp=4,mbs=1,gbs=16,zero=1,schedule=gpipe"])
def test_k_flushes_take_k_times_one_schedule_of_m_over_k(strategy):
    """Closed form: the pipeline of ``k`` back-to-back schedules of ``m/k`` micro-batches takes
    ``k`` times one such schedule (each fills and drains); the event engine, scheduling the
    concatenated orders pass by pass, gives the same pipeline time."""
    one = _plan(strategy.replace("gbs=16", "gbs=8"))  # m/k = 4 micro-batches, one schedule
    two = _plan(strategy, pipeline_flushes=2)
    whole = _plan(strategy)  # 8 micro-batches in one schedule
    a1, a2, aw = simulate_analytic(one), simulate_analytic(two), simulate_analytic(whole)
    assert a2.breakdown.bubble_s == pytest.approx(2 * a1.breakdown.bubble_s, rel=1e-9)  # two fills and drains
    assert a2.breakdown.compute_s == pytest.approx(aw.breakdown.compute_s, rel=1e-9)
    assert a2.step_time_s > aw.step_time_s  # one more fill and drain
    e2 = simulate_event(two)
    assert e2.step_time_s == pytest.approx(a2.step_time_s, rel=0.02)


def test_flushes_without_pipelining_change_nothing():
    base = "tp=1,pp=1,mbs=1,gbs=32,zero=1"
    assert simulate_analytic(_plan(base, pipeline_flushes=4)).step_time_s == \
        pytest.approx(simulate_analytic(_plan(base)).step_time_s, rel=1e-12)


def test_flushed_orders_number_micro_batches_on():
    orders = flushed_orders("1f1b", 2, 4, 1, 2)
    first = schedule_orders("1f1b", 2, 2, 1)
    assert orders[0][:4] == first[0]
    assert orders[0][4:] == [(ph, mb + 2, c) for ph, mb, c in first[0]]
    assert sorted(mb for ph, mb, _ in orders[1] if ph == "F") == [0, 1, 2, 3]


def test_flushes_that_do_not_divide_are_refused():
    with pytest.raises(InfeasibleError, match="pipeline_flushes"):
        _plan("tp=1,pp=4,mbs=1,gbs=12,zero=1", pipeline_flushes=8)
    with pytest.raises(InfeasibleError, match="pipeline_flushes"):  # 16/4 = 4 per schedule, interleaving needs 4k
        _plan("tp=1,pp=4,vp=2,mbs=1,gbs=8,zero=1,schedule=interleaved", pipeline_flushes=4)
    with pytest.raises(InputError, match="pipeline_flushes"):
        _plan("tp=1,pp=4,mbs=1,gbs=16,zero=1", pipeline_flushes=0)


def test_automodel_profile_fuses_its_te_ops_and_runs_a_schedule_per_local_batch():
    fw = get_framework("automodel")
    assert fw.pipeline_schedule_per == "local_batch"
    assert set(fw.fused_ops) <= set(FUSIBLE_OPS) and "rope" in fw.fused_ops
    kw = apply_framework({}, fw)
    eager = _plan("tp=1,pp=1,mbs=4,gbs=32,zero=3", seq=8192, **kw)  # ops above the host floor
    unfused = replace(eager, fused_ops=())
    fused_all = replace(eager, eager_elementwise=False, fused_ops=())
    t, t_unfused, t_fused = (simulate_analytic(p).step_time_s for p in (eager, unfused, fused_all))
    assert t_fused < t < t_unfused  # the TE norms and RoPE fused, residuals and SwiGLU still eager
    assert get_framework("torchtitan").fused_ops == () and get_framework("megatron-core").pipeline_schedule_per == "step"


def test_reference_maps_automodel_local_batch_to_flushes():
    from planner.fitting.reference import framework_of, load_reference, strategy_of
    row = next(r.raw for r in load_reference("dev") if r.id == "automodel-kimi-k2-bf16-h100-256")
    mapped = strategy_of(row, framework_of(row), unstated_vp_searched=False)
    assert mapped.plan["pipeline_flushes"] == 2  # 512 / (local batch 8 x dp 32)
    row = next(r.raw for r in load_reference("dev") if r.id == "automodel-deepseek-v3-bf16-h100-256")
    assert "pipeline_flushes" not in strategy_of(row, framework_of(row), unstated_vp_searched=False).plan
