"""The number to plan with and its band (planner.fitting.uncertainty): the stored document is what the
leave-one-source-out comparisons give, the band's coverage of published runs is measured
leave-one-source-out (each source scored by a table fitted without it) and locked at 75-85%
overall and per class, the estimate lies inside its band, and simulate / recommend / tco carry it."""

import json
import math
import shutil

import pytest

from planner.cli import main
from planner.fitting.uncertainty import (MIN_RUNS, MIN_SOURCES, Band, Residual, band_coverage, band_for, band_from,
                                 band_levels, class_of, fit_document, fit_table, headline, residual_rows, stored_table)
from sim.data.catalog import ENV_VAR, catalog_dir, catalog_document, get_model
from sim.base.errors import InputError
from sim.cost.plan import Plan, parse_strategy
from tests.conftest import cluster

COVERAGE = (0.75, 0.85)  # the 80% band, measured leave-one-source-out (issue 21)


def test_stored_document_is_the_fit_of_the_loso_comparisons(loso_rows):
    rows, _ = loso_rows
    fresh = fit_document(rows)
    stored = {k: v for k, v in catalog_document("uncertainty.yaml").items() if k in fresh}
    assert json.loads(json.dumps(stored)) == json.loads(json.dumps(fresh)), "rerun scripts/fit_uncertainty.py --write"


def test_band_coverage_is_calibrated_leave_one_source_out(loso_rows):
    """Each source's rows are scored by the band fitted without that source (centers and
    deviations both): the coverage is then a prediction, not a restatement of the fit."""
    rows, _ = loso_rows
    cov = band_coverage(residual_rows(rows), loso=True)
    assert cov["runs"] >= 108
    assert COVERAGE[0] <= cov["coverage"] <= COVERAGE[1], cov
    assert set(cov["by_class"]) >= {"all", "dense", "moe", "long-context", "ampere/dense", "hopper/dense"}
    for cls, c in cov["by_class"].items():  # a class of n runs scatters by sqrt(0.8 * 0.2 / n) around 80%
        sigma = math.sqrt(0.8 * 0.2 / c["runs"])
        assert abs(c["coverage"] - 0.8) <= 2 * sigma, (cls, c)
    assert cov["loso"] is True and band_coverage(residual_rows(rows), loso=False)["loso"] is False


ESTIMATE = {"median": 0.06, "signed": 0.02}  # issue 23's targets, met by the calibrated estimate (docs/accuracy.md)


def test_the_calibrated_estimate_scores_leave_one_source_out(loso_rows):
    """The number users plan with (the model x the bias of runs like it, the bias fitted
    without the scored source): median |error| and signed median inside issue 23's targets."""
    rows, _ = loso_rows
    est = band_coverage(residual_rows(rows), loso=True)["estimate"]
    assert est["median_abs_step_error"] <= ESTIMATE["median"], est
    assert abs(est["signed_median_step_error"]) <= ESTIMATE["signed"], est
    assert est["p90_abs_step_error"] <= est["max_abs_step_error"]


def test_check_published_json_reports_coverage_and_signed_error(capsys):
    ids = "korthikanti22-22b-sp-selective-8gpu,megatron-sc21-t1-gpt1.7b-32gpu,flagperf-llama3-8b-bf16-h100-8"
    assert main(["check-published", "--ids", ids, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert 0 <= s["band_coverage"] <= 1 and set(s["band_coverage_by_class"]) >= {"all"}
    assert s["signed_median_step_error"] <= s["median_abs_step_error"]


def test_loso_coverage_does_not_see_the_scored_source():
    """A source whose runs all sit far from the others is outside a band fitted without it,
    however its own residuals look: the held-out source never shapes its band."""
    rows = [Residual(cls=("megatron", "hopper", "dense"), source=f"s{k}", ratio=1.0 + 0.01 * i)
            for k in range(4) for i in range(5)]
    odd = [Residual(cls=("megatron", "hopper", "dense"), source="odd", ratio=2.0) for _ in range(5)]
    cov = band_coverage(rows + odd, loso=True)
    assert cov["by_family"]["megatron"]["runs"] == 25
    inside_odd = [band_from(fit_table(rows), r.cls).covers(r.ratio) for r in odd]
    assert not any(inside_odd)
    assert cov["coverage"] <= 20 / 25


def test_fit_known_answer_center_and_out_of_source_deviations():
    """Three sources with median ratios 1.0, 1.1, 1.2: the center is the median of all, and each
    row's deviation is taken from the center fitted without its source."""
    cls = ("megatron", "ampere", "dense")
    rows = [Residual(cls=cls, source=f"s{k}", ratio=base) for k, base in enumerate((1.0, 1.1, 1.2)) for _ in range(5)]
    t = fit_table(rows)
    assert t["centers"]["ampere/megatron"]["bias"] == pytest.approx(0.1, abs=1e-4)
    assert t["centers"]["ampere/megatron"]["runs"] == 15 and t["centers"]["ampere/megatron"]["sources"] == 3
    # without s0 the center is the median of {1.1 x5, 1.2 x5} = sqrt(1.1*1.2) (log space)
    d0 = math.log(1.0) - 0.5 * (math.log(1.1) + math.log(1.2))
    assert t["spreads"]["ampere/dense"]["q10"] == pytest.approx(math.expm1(d0), abs=1e-4)
    b = band_from(t, cls)
    assert b.cls == "ampere/megatron" and b.spread_class == "ampere/dense"
    assert b.low(1.0) <= b.estimate(1.0) <= b.high(1.0)


def test_classes_need_runs_from_several_sources():
    one_source = [Residual(cls=("fsdp", "hopper", "moe"), source="one", ratio=0.7) for _ in range(MIN_RUNS + 5)]
    others = [Residual(cls=("megatron", "ampere", "dense"), source=f"s{k}", ratio=1.05) for k in range(MIN_SOURCES)
              for _ in range(5)]
    t = fit_table(one_source + others)
    assert "hopper/fsdp" not in t["centers"] and "hopper/moe" not in t["spreads"]  # one source: no class of its own
    assert "moe" not in t["spreads"]
    assert band_from(t, ("fsdp", "hopper", "moe")).cls == "all"


def test_residual_is_published_over_predicted():
    class C:  # a Comparison with step_error = predicted/published - 1 = -0.2
        step_error, framework, source = -0.2, "torchtitan", "x"
        plan = Plan(model=get_model("llama3-8b"), cluster=cluster("h100-80gb", 8),
                    strategy=parse_strategy("mbs=1,gbs=8,zero=3", num_gpus=8))
    [r] = residual_rows([C()])
    assert r.cls == ("fsdp", "hopper", "dense") and r.ratio == pytest.approx(1.25)  # the run took 1/0.8 of it


def test_band_falls_back_to_a_coarser_class():
    plan = Plan(model=get_model("llama3-8b"), cluster=cluster("v100-32gb", 8),
                strategy=parse_strategy("mbs=1,gbs=8", num_gpus=8))
    assert class_of(plan, "megatron-core") == ("megatron", "volta", "dense")
    b = band_for(plan, "megatron-core")
    assert b.cls == "all" and b.spread_class == "dense"  # no Volta rows in the development set: the dense runs
    assert b.low(2.0) <= b.estimate(2.0) <= b.high(2.0)


def test_headline_carries_the_bias_and_keeps_the_breakdown_summing():
    b = Band(cls="all", spread_class="all", runs=100, bias=0.1, q10=-0.2, q90=0.3)
    out = {"step_time_s": 2.0, "tokens_per_s": 100.0, "tokens_per_s_per_gpu": 10.0, "mfu": 0.5, "hfu": 0.6,
           "model_tflops_per_gpu": 400.0, "breakdown": {"compute_s": 1.5, "bubble_s": 0.5, "overhead_s": 0.0}}
    h = headline(out, b)
    assert h["step_time_s"] == pytest.approx(2.2) and h["model_step_time_s"] == 2.0
    assert h["step_time_s_low"] == pytest.approx(2.2 * 0.8) and h["step_time_s_high"] == pytest.approx(2.2 * 1.3)
    assert h["mfu"] == pytest.approx(0.5 / 1.1) and h["tokens_per_s"] == pytest.approx(100 / 1.1)
    assert sum(v for k, v in h["breakdown"].items() if k != "calibration_s") == pytest.approx(2.2)
    tight = Band(cls="all", spread_class="all", runs=100, bias=0.1, q10=0.05, q90=0.2)  # estimate stays inside
    assert tight.low(1.0) <= tight.estimate(1.0) <= tight.high(1.0)


def test_simulate_reports_the_estimate_inside_its_band(capsys):
    args = ["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8",
            "--strategy", "mbs=1,gbs=8,zero=3", "--framework", "torchtitan", "--engine", "analytic"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    u = out["uncertainty"]
    assert u["class"].startswith("hopper") and u["runs"] >= MIN_RUNS
    assert out["step_time_s"] == pytest.approx(out["model_step_time_s"] * (1 + u["bias"]))
    assert out["step_time_s_low"] <= out["step_time_s"] <= out["step_time_s_high"]
    assert main(args) == 0
    assert "80% band" in capsys.readouterr().out


def test_recommend_flags_a_winner_inside_the_band(capsys):
    assert main(["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--gbs", "64",
                 "--json", "--rerank", "0", "--framework", "megatron-core"]) == 0
    out = json.loads(capsys.readouterr().out)
    p1, p2 = out["plans"][:2]
    margin = out["winner_margin"]
    assert margin["margin"] == pytest.approx(p2["objective_value"] / p1["objective_value"] - 1)
    inside = margin["margin"] < margin["band_half_width"]
    assert margin["within_band"] is inside
    assert any("inside the" in w for w in out["warnings"]) is inside
    assert all(p["step_time_s_low"] <= p["step_time_s"] <= p["step_time_s_high"] for p in out["plans"])


def test_malformed_table_is_one_line_error(tmp_path, monkeypatch, capsys):
    shutil.copytree(catalog_dir(), tmp_path / "c")
    (tmp_path / "c" / "uncertainty.yaml").write_text(
        "schema_version: 2\ncenters:\n  - {class: all, runs: 10, sources: 3, bias: 0.1}\n"
        "spreads:\n  - {class: all, runs: 10, sources: 3, q10: 0.3, q90: 0.1}\n")
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "c"))
    with pytest.raises(InputError, match="q10"):
        stored_table()
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8",
                 "--strategy", "mbs=1,gbs=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "q10" in err[0]


def test_band_dataclass_is_frozen():
    b = Band(cls="all", spread_class="all", runs=5, bias=0.0, q10=-0.1, q90=0.2)
    with pytest.raises(AttributeError):
        b.q10 = 0.0  # type: ignore[misc]


def test_band_levels_carry_the_conformal_finite_sample_correction():
    """Known answers: the ends are the floor(0.1 (n + 1))-th and ceil(0.9 (n + 1))-th smallest of
    n deviations (Lei et al. 2018): with 9 runs the 1st and the 9th (the extremes); with 20 the 2nd
    and the 19th; with 110 the 11th and the 100th.  The levels stay inside [0, 1], widen as n
    shrinks and tend to (0.1, 0.9)."""
    assert band_levels(9) == (0.0, 1.0)
    assert band_levels(20) == pytest.approx((1 / 19, 18 / 19))
    assert band_levels(110) == pytest.approx((10 / 109, 99 / 109))
    for n in (2, 5, 10, 20, 50, 110, 1000):
        lo, hi = band_levels(n)
        assert 0.0 <= lo <= 0.1 and 0.9 <= hi <= 1.0
    assert band_levels(10**6) == pytest.approx((0.1, 0.9), abs=1e-5)


def test_recommend_and_simulate_report_the_same_band_for_an_moe_plan(capsys):
    """One code path resolves a run: the band recommend shows for its winner is the one simulate
    reports for the same plan (an MoE model: the moe spread, not the dense one)."""
    assert main(["recommend", "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--num-gpus", "16", "--gbs", "64",
                 "--seq-len", "2048", "--json", "--rerank", "0", "--framework", "megatron-core",
                 ]) == 0
    rec = json.loads(capsys.readouterr().out)
    win = rec["plans"][0]
    assert win["uncertainty"]["spread_class"] == "moe"
    assert main(["simulate", "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--num-gpus", "16",
                 "--strategy", win["strategy"], "--framework", "megatron-core", "--engine", "analytic", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["uncertainty"] == win["uncertainty"]
    assert sim["step_time_s_low"] == pytest.approx(win["step_time_s_low"], rel=1e-9)
