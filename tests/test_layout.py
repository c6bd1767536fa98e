"""Pipeline layouts (sim/data/layout.py): Megatron-Core's layout syntax, the layouts its older flags
build, and chunks of unequal cost priced by both engines (sim/cost/interleave.py, the event engine)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.plans.recommend import Settings, framework_space
from planner.plans.search import SearchSpace, search
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_model
from sim.base.errors import InfeasibleError, InputError
from sim.cost.interleave import interleaved_time_s
from sim.data.layout import (balanced_layout, check_layout, chunk_layer_ids, format_layout, layout_counts,
                        megatron_layout, parse_layout)
from sim.cost.plan import Plan, default_layout, normalize_layout, parse_strategy
from sim.engines.simulate import simulate
from tests.conftest import cluster


def test_megatron_documented_example():
    # docs/user-guide/features/pipeline_parallel_layout.md: DeepSeek-V3 with PP16 and VPP2
    lay = parse_layout("Et*3|(tt|)*29,m|L", 16)
    assert len(lay) == 32 and lay[0] == "Ettt" and lay[-2:] == ("m", "L")
    counts = layout_counts(lay, 16)
    assert counts[0] == [3, 2] and counts[7] == [2, 2] and counts[14] == [2, 0] and counts[15] == [2, 0]
    check_layout(lay, pp=16, num_layers=61)
    ids = chunk_layer_ids(lay, 16)
    assert ids[0][0] == [0, 1, 2] and ids[1][0] == [3, 4] and ids[0][1] == [33, 34]  # flat (virtual stage) order
    assert parse_layout("E||t|L") == ("E", "", "t", "L")  # empty stages are allowed


def test_megatron_rules_are_enforced():
    for text, pp, why in (("Et*3|tt|L", 3, "decoder layers"), ("tE|ttL", 2, "embedding"), ("Et|tLt", 2, "loss"),
                          ("Etm|tt|t|L", 4, "follow")):
        with pytest.raises(InfeasibleError, match=why):
            check_layout(parse_layout(text), pp=pp, num_layers=4 if "m" in text else 6)
    with pytest.raises(InputError, match="invalid layer character"):
        parse_layout("Ex|tL")
    with pytest.raises(InputError, match="multiple of pp"):
        parse_layout("Et|t|tL", 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), min_size=1, max_size=6), st.integers(0, 2))
def test_format_parses_back(rows, mtp):
    width = max(len(r) for r in rows)
    counts = [r + [1] * (width - len(r)) for r in rows]
    from sim.data.layout import layout_from_counts

    lay = layout_from_counts(counts, mtp=mtp)
    assert parse_layout(format_layout(lay)) == lay


def test_first_last_and_account_for_as_megatron_builds_them():
    # transformer_block.get_num_layers_to_build: 8 layers, 2 stages, 4 chunks -> one layer each
    assert layout_counts(megatron_layout(8, 2, 4), 2) == [[1] * 4, [1] * 4]
    assert layout_counts(megatron_layout(32, 4, 2, first=6, last=6), 4) == [[3, 3], [5, 5], [5, 5], [3, 3]]
    lay = megatron_layout(126, 8, 8, account_embedding=True, account_loss=True)  # Llama 3.1 405B, pp8 vp8
    assert lay[0] == "Et" and lay[-1] == "tL" and layout_counts(lay, 8)[3] == [2] * 8
    with pytest.raises(InputError, match="split evenly"):
        megatron_layout(31, 4, 1, first=3, last=3)  # 25 layers over the 2 middle stages
    with pytest.raises(InputError, match="vp=2"):
        megatron_layout(30, 4, 2, first=3)  # 3 layers of the first stage over 2 chunks


def test_default_layout_normalises_away():
    m = get_model("llama3-70b")
    s = parse_strategy("tp=8,pp=4,vp=5,mbs=1,gbs=64", num_gpus=128)
    lay = default_layout(m, s)
    assert layout_counts(lay, 4) == [[4] * 5] * 4
    assert normalize_layout(m, s.with_(pipeline_layout=lay)).pipeline_layout is None
    other = balanced_layout(80, 4, 5, count_ends=True)
    assert normalize_layout(m, s.with_(pipeline_layout=other)).pipeline_layout == other


def test_recurrence_is_the_closed_form_for_equal_chunks():
    # Narayanan et al. 2021 Sec. 2.2.2: (m + (p - 1)/v) (F + B) for equal chunks
    for p, v, m, f, b in ((4, 2, 8, 1.0, 2.0), (4, 3, 12, 1.0, 2.0), (8, 2, 16, 0.7, 1.9), (4, 1, 8, 1.0, 2.0)):
        t, _ = interleaved_time_s([[f / v] * v] * p, [[b / v] * v] * p, m=m)
        assert t == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v, rel=1e-12)


def test_unequal_chunks_lose_time_every_micro_batch():
    # four ranks, chunks of 6 and 2 layer-times (B = 2F): the bubble grows with m, unlike equal chunks
    def bubble(chunks: list[float], m: int) -> float:
        t, _ = interleaved_time_s([chunks] * 4, [[2 * c for c in chunks]] * 4, m=m)
        return (t - m * 3 * sum(chunks)) / 3

    assert bubble([4, 4], 4) == pytest.approx(12) and bubble([4, 4], 16) == pytest.approx(12)
    assert bubble([6, 2], 4) == pytest.approx(18) and bubble([6, 2], 16) > 30


def test_steady_state_extrapolation_is_the_exact_schedule(monkeypatch):
    """Past EXACT_MICROBATCHES the schedule is extended from its periodic steady state: the
    extension equals the pass-by-pass evaluation (random uneven chunks, arrays of plans too)."""
    from sim.cost import interleave

    rng = np.random.default_rng(7)
    for _ in range(12):
        p, v = int(rng.choice([2, 3, 4, 8])), int(rng.choice([1, 2, 3, 4]))
        f = [[rng.uniform(0.5, 3, size=3) for _ in range(v)] for _ in range(p)]  # three plans at once
        b = [[x * rng.uniform(1.5, 2.5) for x in row] for row in f]
        m = p * int(rng.integers(60, 150))
        exact_t, exact_e = interleave.interleaved_time_s(f, b, m=m)
        monkeypatch.setattr(interleave, "EXACT_MICROBATCHES", 16 * p)
        t, e = interleave.interleaved_time_s(f, b, m=m)
        monkeypatch.undo()
        np.testing.assert_allclose(t, exact_t, rtol=1e-11)
        for x, y in zip(e, exact_e):
            np.testing.assert_allclose(x, y, rtol=1e-11)


def test_millions_of_micro_batches_answer_at_once():
    # --seq-len 2 makes the default ~4M-token batch two million sequences: 524,288 micro-batches per pipeline
    t, _ = interleaved_time_s([[1.0, 3.0]] * 2, [[2.0, 6.0]] * 2, m=524_288)
    t_small, _ = interleaved_time_s([[1.0, 3.0]] * 2, [[2.0, 6.0]] * 2, m=1024)
    assert t == pytest.approx(t_small * 512, rel=1e-3)


CASES = [  # llama3-8b on 8 H100s, pp=4: equal, heavy first chunk, heavy second chunk, mixed, empty first stage
    "layout=Et*4|(t*4|)*6t*4L",
    "layout=Et*6|t*6|t*6|t*6|tt|tt|tt|ttL",
    "layout=Ett|tt|tt|tt|t*6|t*6|t*6|t*6L",
    "layout=Et*3|t*5|t*5|t*3|t*5|t*3|t*3|t*5L",
    "layout=E|t*10|t*11|t*11L",
]


@pytest.mark.parametrize("layout", CASES)
def test_both_engines_price_every_chunk(layout):
    m = get_model("llama3-8b")
    s = parse_strategy(f"tp=1,pp=4,dp=2,mbs=1,gbs=16,seq=4096,zero=1,{layout}", num_gpus=8)
    plan = Plan(model=m, cluster=cluster("h100-80gb", 8), strategy=s)
    a = simulate(plan, engine="analytic")
    e = simulate(plan, engine="event")
    assert a.step_time_s == pytest.approx(e.step_time_s, rel=0.02), (a.step_time_s, e.step_time_s)
    assert a.breakdown.bubble_s == pytest.approx(e.breakdown.bubble_s, rel=0.1, abs=2e-3)


def test_heavier_chunks_cost_more_and_weigh_on_memory():
    m = get_model("llama3-8b")
    cl = cluster("h100-80gb", 8)

    def run(layout: str):
        s = parse_strategy(f"tp=1,pp=4,dp=2,mbs=1,gbs=32,seq=4096,{layout}", num_gpus=8)
        return simulate_analytic(Plan(model=m, cluster=cl, strategy=s))

    even, front, back = run(CASES[0]), run(CASES[1]), run(CASES[2])
    assert front.step_time_s > even.step_time_s and back.step_time_s > even.step_time_s
    # rank 0 holds more micro-batches of chunk 0 in flight: a heavy first chunk weighs more
    assert front.memory_peak_bytes > back.memory_peak_bytes > 0


def test_search_prices_layouts_as_simulate_does():
    model, cl = get_model("llama3.1-405b"), cluster("h100-80gb", 256)
    st_ = Settings.from_framework("megatron-core")
    space = framework_space(SearchSpace(tp=(8,), cp=(1,), pp=(8,), mbs=(1,), vp=(3,), zero=(1,),
                                        recompute=("full",), precision=("bf16",)), "megatron-core", cl)
    r = search(model, cl, gbs=256, seq_len=4096, space=space, plan_kwargs=st_.kwargs, dp_overlap=st_.dp_overlap)
    with_layout = [i for i in range(r.evaluated)
                   if r.candidates.layouts[int(r.candidates.layout_id[i])].pipeline_layout is not None]
    assert with_layout, "126 layers over pp=8, vp=3 need a layout under Megatron-Core"
    for i in with_layout:
        s = r.strategy(i)
        res = simulate_analytic(r.fastmodel.plan(s), net=r.fastmodel.net)
        assert r.candidates.step_time_s[i] == pytest.approx(res.step_time_s, rel=1e-9)
        assert r.candidates.memory_device_bytes[i] == pytest.approx(res.memory_device_bytes, rel=1e-9)
    assert np.isfinite(r.candidates.step_time_s).all()


def test_frameworks_without_layouts_refuse_them():
    from sim.cost.framework import get_framework

    s = parse_strategy("tp=1,pp=4,dp=2,mbs=1,gbs=16,layout=Et*4|(t*4|)*6t*4L", num_gpus=8)
    assert get_framework("megatron-core").capabilities.refusal(s) is None
    assert get_framework("megatron-deepspeed").capabilities.refusal(s)[0] == "pipeline_layout"
