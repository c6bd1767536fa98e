"""Uncertainty bands (planner.uncertainty): the stored table is what the leave-one-source-out
residuals give, the quantiles and fallbacks follow their definition, and simulate / recommend /
the app carry the band."""

import json
import shutil

import pytest

from planner.cli import main
from planner.uncertainty import MIN_RUNS, Band, band_for, class_of, fit_table, levels, residual_rows, stored_table
from sim.catalog import ENV_VAR, catalog_dir, get_model
from sim.errors import InputError
from sim.plan import Plan, parse_strategy
from tests.conftest import cluster


def test_stored_table_is_the_fit_of_the_loso_residuals(loso_rows):
    rows, _ = loso_rows
    fresh = fit_table(residual_rows(rows))
    stored = {k: {"runs": b.runs, "q10": b.q10, "q90": b.q90} for k, b in stored_table().items()}
    assert stored == fresh, "rerun scripts/fit_uncertainty.py --write"


def test_quantiles_and_minimum_runs_known_answer():
    cls = ("megatron", "hopper", "dense")
    rows = [(cls, r) for r in (0.0, 0.1, 0.2, 0.3, 0.4)] + [(("fsdp", "hopper", "moe"), 1.0)] * (MIN_RUNS - 1)
    t = fit_table(rows)
    # 5 residuals 0..0.4: q10 at rank 0.4 -> 0.04, q90 at rank 3.6 -> 0.36 (linear interpolation)
    assert t["megatron/hopper/dense"] == {"runs": 5, "q10": 0.04, "q90": 0.36}
    assert "fsdp/hopper/moe" not in t and "fsdp" not in t  # 4 runs: below MIN_RUNS, no band of its own
    assert t["all"]["runs"] == 5 + MIN_RUNS - 1
    assert levels(cls) == ("megatron/hopper/dense", "megatron/hopper", "megatron", "all")


def test_residual_is_published_over_predicted():
    class C:  # a Comparison with step_error = predicted/published - 1 = -0.2
        step_error, framework = -0.2, "torchtitan"
        plan = Plan(model=get_model("llama3-8b"), cluster=cluster("h100-80gb", 8),
                    strategy=parse_strategy("mbs=1,gbs=8,zero=3", num_gpus=8))
    [(cls, r)] = residual_rows([C()])
    assert cls == ("fsdp", "hopper", "dense") and r == pytest.approx(0.25)  # the run took 1/0.8 of the prediction


def test_band_falls_back_to_a_coarser_class():
    plan = Plan(model=get_model("llama3-8b"), cluster=cluster("v100-32gb", 8),
                strategy=parse_strategy("mbs=1,gbs=8", num_gpus=8))
    assert class_of(plan, "megatron-core") == ("megatron", "volta", "dense")
    b = band_for(plan, "megatron-core")
    assert b.cls == "megatron" and b.runs >= MIN_RUNS  # no Volta rows in the development set
    assert b.low(2.0) == pytest.approx(2.0 * (1 + b.q10)) and b.high(2.0) == pytest.approx(2.0 * (1 + b.q90))


def test_simulate_reports_the_band(capsys):
    args = ["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8",
            "--strategy", "mbs=1,gbs=8,zero=3", "--framework", "torchtitan", "--engine", "analytic"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    u = out["uncertainty"]
    assert u["class"].startswith("fsdp/hopper") and u["runs"] >= MIN_RUNS
    assert out["step_time_s_low"] == pytest.approx(out["step_time_s"] * (1 + u["q10"]))
    assert out["step_time_s_high"] == pytest.approx(out["step_time_s"] * (1 + u["q90"]))
    assert main(args) == 0
    assert "80% band" in capsys.readouterr().out


def test_recommend_flags_a_winner_inside_the_band(capsys):
    assert main(["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--gbs", "64",
                 "--json", "--rerank", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    p1, p2 = out["plans"][:2]
    margin = out["winner_margin"]
    assert margin["margin"] == pytest.approx(p2["objective_value"] / p1["objective_value"] - 1)
    inside = margin["margin"] < margin["band_half_width"]
    assert margin["within_band"] is inside
    assert any("inside the" in w for w in out["warnings"]) is inside
    assert all("step_time_s_low" in p for p in out["plans"])


def test_malformed_table_is_one_line_error(tmp_path, monkeypatch, capsys):
    shutil.copytree(catalog_dir(), tmp_path / "c")
    (tmp_path / "c" / "uncertainty.yaml").write_text(
        "schema_version: 1\nclasses:\n  - {class: all, runs: 10, q10: 0.3, q90: 0.1}\n")
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "c"))
    with pytest.raises(InputError, match="q10"):
        stored_table()
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8",
                 "--strategy", "mbs=1,gbs=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "q10" in err[0]


def test_band_dataclass_is_frozen():
    b = Band(cls="all", runs=5, q10=-0.1, q90=0.2)
    with pytest.raises(AttributeError):
        b.q10 = 0.0  # type: ignore[misc]
