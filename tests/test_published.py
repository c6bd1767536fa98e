"""Accuracy against the published reference runs, locked per row.

Every row of catalogs/reference/published_runs.yaml is simulated with the calibrated model
(no per-run parameter) and must stay within its group's tolerance; the tolerance and the reason
for it are data here, next to the source they refer to.  A change that makes any row worse than
its tolerance, or the summary worse than the recorded figures, fails CI.
"""

import pytest

from planner.published import compare_all, load_runs, summary

# (id prefix, step-time tolerance, why)
TOLERANCES = [
    ("megatron-sc21-t1-", 0.13, "Narayanan et al. 2021 Table 1: mbs/vp unstated (filled by rule); pipelined rows "
                                "run 5-11% fast; the same per-GPU work runs 3-9% slower here than in "
                                "Korthikanti et al. 2022 (docs/accuracy.md)"),
    ("korthikanti22-", 0.09, "Korthikanti et al. 2022: layer timings of the same paper calibrate the GEMM "
                             "shape factor; whole-iteration overheads beyond the layers are ~0-7%"),
    ("torchtitan-2412-t1-", 0.20, "torchtitan on 500 W H100 (peak unknown, +-8%): compute-bound kernels run "
                                  "~10-16% slower than the A100-calibrated model; see docs/accuracy.md"),
    ("torchtitan-2412-t3-", 0.22, "as t1, 128 GPUs"),
    ("torchtitan-2412-t2-", 0.42, "context-parallel ring attention at 32k-262k tokens: per-step attention "
                                  "kernels run below the FlashAttention-2 headline efficiency we use"),
]
MEMORY_TOLERANCE = 0.10  # issue 4 target: memory within 10% where published


def _tol(run_id: str) -> float:
    for prefix, tol, _ in TOLERANCES:
        if run_id.startswith(prefix):
            return tol
    raise AssertionError(f"no tolerance recorded for {run_id}")


@pytest.fixture(scope="module")
def rows():
    return {r.run_id: r for r in compare_all()}


@pytest.mark.parametrize("run_id", [r["id"] for r in load_runs()])
def test_step_time_within_tolerance(rows, run_id):
    r = rows[run_id]
    assert abs(r.step_error) <= _tol(run_id), (run_id, r.as_dict())


@pytest.mark.parametrize("run_id", [r["id"] for r in load_runs() if r["measured"].get("memory_gib_per_gpu")])
def test_memory_within_10_percent(rows, run_id):
    r = rows[run_id]
    assert r.memory_error is not None
    assert abs(r.memory_error) <= MEMORY_TOLERANCE, (run_id, r.as_dict())


def test_summary_does_not_regress(rows):
    s = summary(list(rows.values()))
    assert s["num_runs"] == 30
    assert s["median_abs_step_error"] <= 0.08
    assert s["median_abs_memory_error"] <= 0.06


def test_utilisation_follows_source_definition(rows):
    # Narayanan's "% of peak" counts recomputation: compare with our HFU, which must be close.
    r = rows["megatron-sc21-t1-gpt18.4b-256gpu"]
    assert r.published.hfu == pytest.approx(0.43)
    assert r.predicted.hfu == pytest.approx(r.published.hfu, rel=0.06)
    assert r.predicted.mfu < r.predicted.hfu  # full recomputation
    k = rows["korthikanti22-175b-sp-selective-64gpu"]
    assert k.predicted.mfu == pytest.approx(k.published.mfu, rel=0.12)


def test_every_run_resolves_to_catalog_hardware(rows):
    for r in rows.values():
        assert r.plan.cluster.gpu.id in ("a100-80gb", "h100-96gb")


def test_event_engine_agrees_on_memory_and_roughly_on_time(rows):
    """Both engines report memory through sim.memory.plan_memory (framework policy included)."""
    rid = "torchtitan-2412-t1-llama31-8b-8gpu-fsdp-seq8192"
    ev = compare_all(engine="event", ids=[rid])[0]
    an = rows[rid]
    assert ev.predicted.memory_peak_bytes == pytest.approx(an.predicted.memory_peak_bytes, rel=1e-12)
    assert ev.predicted.step_time_s == pytest.approx(an.predicted.step_time_s, rel=0.05)
