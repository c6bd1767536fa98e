"""Pipeline schedules of the event engine: orders, golden event logs, closed-form bubbles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from sim.base.errors import InfeasibleError, InputError
from sim.engines.event.measure import breakdown_from_log
from sim.engines.event.schedules import stage_order
from tests.test_event_fixtures import compute_log, run_engine, synthetic_costs, tiny_plan

# --------------------------------------------------------------------------- orders


def test_1f1b_warmup_then_alternate() -> None:
    # Narayanan et al. 2021, Fig. 4: stage 0 of 4 runs 3 warm-up forwards.
    assert stage_order("1f1b", 4, 6, 1, 0)[:5] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 3, 0), ("B", 0, 0)]
    assert stage_order("1f1b", 4, 6, 1, 3)[:4] == [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0)]


def test_gpipe_all_forwards_first() -> None:
    order = stage_order("gpipe", 3, 4, 1, 1)
    assert [ph for ph, _, _ in order] == ["F"] * 4 + ["B"] * 4


def test_interleaved_matches_megatron_chunk_mapping() -> None:
    # Megatron-LM get_model_chunk_id: virtual micro-batch k -> chunk (k mod pv) // p, and
    # warm-up 2 (p - i - 1) + (v - 1) p on stage i.
    p, m, v = 2, 4, 2
    order = stage_order("interleaved", p, m, v, 0)
    warm = 2 * (p - 0 - 1) + (v - 1) * p
    assert order[:warm] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1)]
    assert order[warm:warm + 2] == [("F", 2, 0), ("B", 0, 1)]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "interleaved", "zero-bubble"]), st.integers(1, 5), st.integers(1, 4),
       st.integers(1, 3), st.data())
def test_every_pass_once_and_forward_before_backward(schedule: str, p: int, k: int, v: int, data) -> None:
    if schedule == "gpipe" or (schedule == "interleaved" and p == 1):
        v = 1
    if schedule == "interleaved" and p == 1:
        schedule = "1f1b"
    m = p * k
    stage = data.draw(st.integers(0, p - 1))
    order = stage_order(schedule, p, m, v, stage)
    expected = {(ph, j, c) for ph in "FB" for j in range(m) for c in range(v)}
    assert sorted(order) == sorted(expected)
    pos = {op: i for i, op in enumerate(order)}
    for j in range(m):
        for c in range(v):
            assert pos[("F", j, c)] < pos[("B", j, c)]


def test_bad_orders_rejected() -> None:
    with pytest.raises(InputError):
        stage_order("pipedream", 2, 2, 1, 0)
    with pytest.raises(InputError):
        stage_order("1f1b", 2, 2, 1, 2)
    with pytest.raises(InfeasibleError):
        stage_order("interleaved", 4, 6, 2, 0)

# --------------------------------------------------------------------------- golden logs


def test_golden_1f1b_two_stages_with_sends() -> None:
    """F = 1 s, B = 2 s per stage, 0.5 s sends, optimizer 0.25 s: the whole log by hand."""
    plan = tiny_plan(p=2, m=3)
    eng = run_engine(plan, synthetic_costs(plan, p2p_s=0.5, optimizer_s=0.25))
    log = sorted(((e.unit, e.stream, e.name, e.start, e.end) for e in eng.log), key=lambda x: (x[3], x[0], x[1]))
    expected = [
        (0, "compute", "F0", 0.0, 1.0), (0, "pp", "send F0 to stage 1", 1.0, 1.5),
        (0, "compute", "F1", 1.5, 2.5), (1, "compute", "F0", 1.5, 2.5),
        (0, "pp", "send F1 to stage 1", 2.5, 3.0), (1, "compute", "B0", 2.5, 4.5),
        (1, "pp", "send B0 to stage 0", 4.5, 5.0),
        (0, "compute", "B0", 5.0, 7.0), (1, "compute", "F1", 5.0, 6.0), (1, "compute", "B1", 6.0, 8.0),
        (0, "compute", "F2", 7.0, 8.0), (0, "pp", "send F2 to stage 1", 8.0, 8.5),
        (1, "pp", "send B1 to stage 0", 8.0, 8.5),
        (0, "compute", "B1", 8.5, 10.5), (1, "compute", "F2", 8.5, 9.5), (1, "compute", "B2", 9.5, 11.5),
        (1, "pp", "send B2 to stage 0", 11.5, 12.0),
        (0, "compute", "B2", 12.0, 14.0), (1, "compute", "optimizer", 12.0, 12.25),
        (0, "compute", "optimizer", 14.0, 14.25),
    ]
    assert [x[:3] for x in log] == [x[:3] for x in expected]
    for got, want in zip(log, expected):
        assert got[3:] == pytest.approx(want[3:], abs=1e-9), got
    assert eng.unit_end == pytest.approx([14.25, 12.25])


def test_golden_gpipe_three_stages() -> None:
    plan = tiny_plan(p=3, m=2, schedule="gpipe")
    eng = run_engine(plan, synthetic_costs(plan))
    assert compute_log(eng) == [
        (0, "F0", 0.0, 1.0), (0, "F1", 1.0, 2.0), (1, "F0", 1.0, 2.0), (1, "F1", 2.0, 3.0), (2, "F0", 2.0, 3.0),
        (2, "F1", 3.0, 4.0), (2, "B0", 4.0, 6.0), (1, "B0", 6.0, 8.0), (2, "B1", 6.0, 8.0), (0, "B0", 8.0, 10.0),
        (1, "B1", 8.0, 10.0), (0, "B1", 10.0, 12.0)]


def test_golden_interleaved_two_stages_two_chunks() -> None:
    plan = tiny_plan(p=2, m=2, v=2)
    eng = run_engine(plan, synthetic_costs(plan))
    assert compute_log(eng) == [
        (0, "F0.0", 0.0, 0.5), (0, "F1.0", 0.5, 1.0), (1, "F0.0", 0.5, 1.0), (0, "F0.1", 1.0, 1.5),
        (1, "F1.0", 1.0, 1.5), (0, "F1.1", 1.5, 2.0), (1, "F0.1", 1.5, 2.0), (1, "F1.1", 2.0, 2.5),
        (1, "B0.1", 2.5, 3.5), (0, "B0.1", 3.5, 4.5), (1, "B1.1", 3.5, 4.5), (0, "B1.1", 4.5, 5.5),
        (1, "B0.0", 4.5, 5.5), (0, "B0.0", 5.5, 6.5), (1, "B1.0", 5.5, 6.5), (0, "B1.0", 6.5, 7.5)]


def test_golden_zero_bubble_defers_weight_gradients() -> None:
    """ZB-H1 with F = 1 s, B (input grads) = 1 s, W (weight grads) = 1 s: stage 0 fills the
    wait for B1 with W0; the last stage may defer one W (its 1F1B in-flight count), so it runs
    F B W F B W.  Step 8 s = m (F + B + W) + (p - 1)(F + B), against 9 s for 1F1B."""
    plan = tiny_plan(p=2, m=2, schedule="zero-bubble")
    eng = run_engine(plan, synthetic_costs(plan))
    assert compute_log(eng) == [
        (0, "F0", 0.0, 1.0), (0, "F1", 1.0, 2.0), (1, "F0", 1.0, 2.0), (1, "B0", 2.0, 3.0), (0, "B0", 3.0, 4.0),
        (1, "W0", 3.0, 4.0), (0, "W0", 4.0, 5.0), (1, "F1", 4.0, 5.0), (1, "B1", 5.0, 6.0), (0, "B1", 6.0, 7.0),
        (1, "W1", 6.0, 7.0), (0, "W1", 7.0, 8.0)]
    assert max(eng.unit_end) == 8.0


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("schedule,p,m,v", [
    ("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 16, 1), ("1f1b", 3, 5, 1),
    ("interleaved", 4, 8, 2), ("interleaved", 4, 8, 4), ("interleaved", 8, 16, 3), ("interleaved", 4, 4, 2),
])
def test_bubble_matches_closed_form(schedule: str, p: int, m: int, v: int) -> None:
    """Negligible communication: bubble fraction (p-1)/(m+p-1) for GPipe and 1F1B and
    (p-1)/(v m + p-1) interleaved (Narayanan et al. 2021, Sec. 2.2), within 1%."""
    plan = tiny_plan(p=p, m=m, v=v, schedule=schedule)
    eng = run_engine(plan, synthetic_costs(plan, fwd_s=1.0, bwd_s=2.0))
    bd, crit, _ = breakdown_from_log(eng.log, eng.unit_end)
    step = eng.unit_end[crit]
    closed = (p - 1) / (v * m + p - 1)
    assert bd.bubble_s / step == pytest.approx(closed, rel=0.01)
    assert step == pytest.approx((m + (p - 1) / v) * 3.0, rel=0.01)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 24)])
def test_zero_bubble_matches_zb_h1(p: int, m: int) -> None:
    """ZB-H1 (Qi et al. 2024, Sec. 3): T = m (F + B) + (p - 1)(F + B - W) with W half the backward."""
    plan = tiny_plan(p=p, m=m, schedule="zero-bubble")
    eng = run_engine(plan, synthetic_costs(plan, fwd_s=1.0, bwd_s=2.0))
    assert max(eng.unit_end) == pytest.approx(m * 3.0 + (p - 1) * 2.0, rel=1e-9)


def test_slowest_stage_sets_the_pace() -> None:
    """1F1B, p = 4, m = 8, stage 1 twice as slow (F = 2, B = 4).  By hand: stage 1 starts at 1,
    runs its 3 forwards until 7, waits for B0's round trip through stages 2-3 (back at 9), then
    is busy 8 x 6 - 6 = 42 s until 51; stage 0's last B ends at 53.  The closed form
    sum (F_i + B_i) + (m - 1) max (F_i + B_i) = 57 is an upper bound for unbalanced stages."""
    plan = tiny_plan(p=4, m=8)
    eng = run_engine(plan, synthetic_costs(plan, stage_scale=(1.0, 2.0, 1.0, 1.0)))
    assert eng.unit_end == pytest.approx([53.0, 51.0, 45.0, 43.0], abs=1e-9)
    assert max(eng.unit_end) < 3 * 5 + 7 * 6
