"""The caching-allocator replay (``validate.allocator``): PyTorch's rules on hand-worked traces,
and the trace ``validate.memtrack`` records replays to the tracker's own allocated peak."""

from __future__ import annotations

import pytest

from validate.allocator import CachingAllocator, allocation_size, replay, round_size

MiB = 1 << 20


def test_rounding_and_segment_sizes() -> None:
    # c10/cuda/CUDACachingAllocator.cpp round_size / get_allocation_size
    assert round_size(1) == 512 and round_size(513) == 1024
    assert allocation_size(512) == 2 * MiB            # small pool: kSmallBuffer
    assert allocation_size(MiB + 512) == 20 * MiB     # under kMinLargeAlloc: kLargeBuffer
    assert allocation_size(13 * MiB) == 14 * MiB      # else rounded to kRoundLarge


def test_split_reuse_and_merge() -> None:
    a = CachingAllocator()
    for h in (1, 2, 3):  # three 5 MiB blocks carved out of one 20 MiB segment
        a.malloc(h, 5 * MiB)
    assert a.reserved_bytes == 20 * MiB
    a.free(1)
    a.free(2)  # merges with block 1: one free 10 MiB block at the segment's start
    a.malloc(4, 9 * MiB)  # best fit: the merged 10 MiB block, not the 5 MiB tail; the 1 MiB
    # left is not more than kSmallSize, so the block is not split and counts whole (10 + 5 MiB)
    assert a.reserved_bytes == 20 * MiB and a.allocated_bytes == 15 * MiB
    assert a.live[4].address == a.live[3].address - 10 * MiB


def test_hole_too_small_costs_a_segment_unless_expandable() -> None:
    trace = [("alloc", 1, 12 * MiB), ("alloc", 2, 12 * MiB), ("free", 1, 0), ("alloc", 3, 14 * MiB)]
    classic = replay(trace)
    # 12 + 12 MiB segments; the 12 MiB hole cannot take 14 MiB: a third segment
    assert classic["reserved_bytes"] == 38 * MiB and classic["allocated_bytes"] == 26 * MiB
    assert classic["fragmentation"] == pytest.approx(38 / 26 - 1)
    # expandable: 20 MiB pages; after A and B the free tail is 16 MiB, which takes C
    grown = replay(trace, expandable_segments=True)
    assert grown["reserved_bytes"] == 40 * MiB


def test_tracker_trace_replays_to_its_allocated_peak() -> None:
    pytest.importorskip("torch")
    from validate.memgrid import build_plan
    from validate.memtrack import track

    plan = build_plan("llama3-8b", 1, 8, "dp=8,mbs=1,gbs=8,seq=2048,zero=3,recompute=selective")
    events: list = []
    out = track(plan, events=events, steps=2)
    r = replay(events)
    # the tracker counts a CPU (fake) tensor's exact bytes, the replay rounds each to 512 B
    assert r["allocated_bytes"] == pytest.approx(out["total"], rel=1e-5)
    assert r["reserved_bytes"] >= r["allocated_bytes"]


def test_catalog_medians_by_allocator_and_recomputation() -> None:
    """sim.data.runtime keeps the median of the replayed plans per allocator mode and
    recomputation mode; a calibration profile's single value overrides every mode."""
    import statistics
    from dataclasses import replace

    from sim.data.catalog import catalog_document
    from sim.data.runtime import default_runtime

    rt = default_runtime()
    plans = catalog_document("runtime.yaml")["memory"]["fragmentation"]["plans"]
    for mode in ("caching", "expandable_segments"):
        for rc in ("none", "selective", "full"):
            vals = [p[mode] for p in plans if p["recompute"] == rc]
            assert rt.fragmentation[mode][rc] == pytest.approx(statistics.median(vals))
            assert rt.fragmentation_of(mode, rc == "full", rc == "selective") == pytest.approx(statistics.median(vals))
    assert replace(rt, fragmentation_fraction=0.07).fragmentation_of("caching", True, False) == pytest.approx(0.07)


def test_torchtitan_launches_with_expandable_segments() -> None:
    from sim.cost.framework import get_framework

    assert get_framework("torchtitan").allocator == "expandable_segments"
    assert get_framework("torchtitan-compile").allocator == "expandable_segments"
    assert get_framework("megatron-core").allocator == "caching"


def test_a_catalog_plan_replays_to_its_recorded_value(capsys) -> None:
    """``planner validate fragmentation --plans 1`` replays the first plan of the standing set
    again (deterministic: the trace is the eager step's order) and gives the values
    runtime.yaml records for it."""
    pytest.importorskip("torch")
    import json

    from planner.cli import main
    from sim.data.catalog import catalog_document
    from validate.fragmentation import PLANS

    assert main(["validate", "fragmentation", "--plans", "1", "--workers", "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["plans"][0]
    assert got["strategy"] == PLANS[0]
    row = next(p for p in catalog_document("runtime.yaml")["memory"]["fragmentation"]["plans"]
               if p["strategy"] == PLANS[0])
    assert got["caching"] == pytest.approx(row["caching"], abs=1e-3)
    assert got["expandable_segments"] == pytest.approx(row["expandable_segments"], abs=1e-3)
    assert got["caching_reserved_bytes"] >= got["allocated_bytes"]


@pytest.mark.parametrize("argv, field", [(["--plans", "0"], "plans"), (["--workers", "0"], "workers")])
def test_bad_counts_exit_2_naming_the_flag(capsys, argv, field) -> None:
    pytest.importorskip("torch")
    from planner.cli import main

    assert main(["validate", "fragmentation", *argv]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


def test_zero_engine_step_transient_takes_a_segment_of_its_own() -> None:
    """The replay behind runtime.yaml's deepspeed step_* keys: DeepSpeed's fp32 copy of the
    flattened gradient partition at the optimizer step is one request; larger than every block
    the step's tensors left cached (the fp32 logits are the largest), it maps a segment of its
    own and the reserved peak grows by its size; smaller, it reuses the logits' block.
    sim.cost.memory makes the same call."""
    pytest.importorskip("torch")
    from sim.cost.memory import plan_memory
    from validate.memgrid import build_plan
    from validate.memtrack import track

    logits_fp32 = 4.0 * 2048 * 128256
    for dp, grows in ((8, False), (2, True)):  # fp32 copy 0.96 GB < 1.05 GB logits; 3.85 GB > it
        plan = build_plan("llama3-8b", 4, dp, f"dp={dp},mbs=1,gbs={dp},seq=2048,zero=3,recompute=none")
        fp32_copy = 4.0 * plan.model.num_params / dp
        assert (fp32_copy > logits_fp32) == grows
        peaks = []
        for engine in (False, True):
            events: list = []
            track(plan, events=events, steps=2, zero_engine_step=engine)
            peaks.append(replay(events)["reserved_bytes"])
        growth = peaks[1] - peaks[0]
        if grows:
            assert 0.9 * fp32_copy <= growth <= 1.1 * fp32_copy
        else:
            assert growth <= 0.1 * fp32_copy
        ds = build_plan("llama3-8b", 4, dp, f"dp={dp},mbs=1,gbs={dp},seq=2048,zero=3,recompute=none",
                        framework="deepspeed-hf")
        mem = plan_memory(ds)
        from sim.data.runtime import default_runtime
        rt = default_runtime()
        base = mem.allocated_bytes * (1 + rt.fragmentation["caching"]["none"]) + rt.workspace_bytes
        assert mem.reserved_bytes - base == pytest.approx(fp32_copy if grows else 0.0, rel=1e-9, abs=1.0)
