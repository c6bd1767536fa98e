"""Design search: constraints as users state them, the Optuna study against the grid (a front
within 2% in fewer evaluations), resuming a study, both executors, and the files people read."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

from planner.cli import main
from planner.economics import design_search as ds
from planner.economics.design_search import (Constraints, DesignSpace, apply_constraints, choose_search,
                                             epsilon_indicator, hypervolume_2d, parse_available, run_optuna)
from planner.economics.search_report import read_trials_csv
from planner.economics.sweep import SweepOptions, evaluate_point, pareto_front, ray_available
from planner.economics.tco import TcoOptions
from sim.base.errors import InputError

optuna = pytest.importorskip("optuna")

OPTS = SweepOptions(tco=TcoOptions(tokens=1e11), quick=True)
# 2 GPU types x 4 counts x 2 topologies x 2 oversubscriptions = 32 designs the grid still covers
SPACE = DesignSpace(models=("llama3-8b",), gpus=("a100-80gb", "h100-80gb"), counts=(16, 32, 64, 128), nics=(None,),
                    topologies=("fat-tree", "rail-optimized"), oversubscriptions=(1.0, 2.0))


@pytest.fixture(scope="module")
def grid_rows() -> dict[tuple, dict]:
    """Every design of SPACE costed once by the real evaluation (the grid)."""
    pts, _ = SPACE.designs(Constraints())
    return {(p.gpu, p.num_gpus, p.topology, p.oversubscription): evaluate_point(p, OPTS) for p in pts}


class Memo:
    """The grid's evaluation, looked up: the same numbers, counted per call."""

    def __init__(self, rows: dict[tuple, dict]) -> None:
        self.rows, self.calls = rows, 0

    def __call__(self, p, options) -> dict:
        self.calls += 1
        return dict(self.rows[(p.gpu, p.num_gpus, p.topology, p.oversubscription)])


# ----------------------------------------------------------------- constraints


def test_available_parses_ids_and_aliases():
    assert parse_available("h100-80gb:512, a100-80gb:1024") == {"h100-80gb": 512, "a100-80gb": 1024}
    for bad, needle in (("h100-80gb", "GPU:COUNT"), ("h100-80gb:x", "integer"), ("h100-80gb:0", ">= 1"),
                        ("nope:8", "gpu"), ("h100-80gb:8,h100-80gb:16", "twice")):
        with pytest.raises(InputError, match=needle):
            parse_available(bad)


def test_constraints_exclude_and_violate():
    c = Constraints(budget_usd=1e6, power_cap_w=5e5, max_gpus=64, available=(("h100-80gb", 32),))
    pt = ds.DesignPoint(model="m", gpu="h100-80gb", num_gpus=64, nic=None)
    assert "exceed the 32 available" in c.excluded(pt)
    assert "not available" in c.excluded(replace(pt, gpu="a100-80gb"))
    assert c.excluded(replace(pt, num_gpus=16)) is None
    row = {"status": "ok", "capex_usd": 2e6, "cost_to_train_usd": 5e4, "power_w": 2.5e5}
    assert c.violations(row, "owned") == pytest.approx((1.0, -0.5))
    assert c.violations(row, "cloud") == pytest.approx((-0.95, -0.5))  # the budget is the cloud bill
    out = apply_constraints(dict(row), c, "owned")
    assert out["status"] == "constrained" and "budget" in out["reason"] and "power" not in out["reason"]
    assert apply_constraints(dict(row), c, "cloud")["status"] == "ok"


def test_auto_is_the_grid_for_small_spaces(monkeypatch):
    assert choose_search("auto", SPACE, Constraints(), 64)[0] == "grid"
    assert choose_search("auto", SPACE, Constraints(), 16)[0] == "optuna"
    monkeypatch.setattr(ds, "optuna_available", lambda: (False, "ModuleNotFoundError: optuna"))
    method, why = choose_search("auto", SPACE, Constraints(), 16)
    assert method == "grid" and "not importable" in why


def test_front_indicators_known_answers():
    ref = [{"time_to_train_s": 1.0, "cost_to_train_usd": 10.0}, {"time_to_train_s": 4.0, "cost_to_train_usd": 2.0}]
    assert epsilon_indicator(ref, ref) == 1.0
    worse = [{"time_to_train_s": 1.02, "cost_to_train_usd": 10.0}, {"time_to_train_s": 4.0, "cost_to_train_usd": 2.04}]
    assert epsilon_indicator(worse, ref) == pytest.approx(1.02)
    assert epsilon_indicator(ref[:1], ref) == pytest.approx(5.0)  # (1, 10) covers (4, 2) only scaled by 5
    # staircase to (5, 12): [1, 4) x (10, 12] + [4, 5) x (2, 12] = 3*2 + 1*10
    assert hypervolume_2d(ref, (5.0, 12.0)) == pytest.approx(16.0)


# ----------------------------------------------------------------- Optuna against the grid


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_optuna_finds_the_grid_front_within_2_percent_in_fewer_evaluations(grid_rows, seed):
    reference = pareto_front(list(grid_rows.values()))
    memo = Memo(grid_rows)
    res = run_optuna(SPACE, OPTS, Constraints(), trials=20, seed=seed, workers=1, evaluate=memo)
    assert res.evaluations == memo.calls == 20 < len(grid_rows) == 32
    assert epsilon_indicator(res.pareto, reference) <= 1.02
    # a sampler's repeats of a costed design are trials answered from the cache, not evaluations
    assert sum(not t["duplicate"] for t in res.trials) == res.evaluations <= len(res.trials)


def test_available_gpus_shape_the_study(grid_rows):
    memo = Memo(grid_rows)
    c = Constraints(available=(("h100-80gb", 64),))
    res = run_optuna(SPACE, OPTS, c, trials=6, seed=0, workers=1, evaluate=memo)
    assert res.rows and all(r["gpu"] == "h100-80gb" and r["num_gpus"] <= 64 for r in res.rows)
    assert res.excluded == 20 and res.space_size == 12


def test_budget_keeps_expensive_designs_off_the_front(grid_rows):
    capex = sorted(r["capex_usd"] for r in grid_rows.values())
    budget = capex[len(capex) // 2]
    memo = Memo(grid_rows)
    res = run_optuna(SPACE, OPTS, Constraints(budget_usd=budget), trials=12, seed=0, workers=1, evaluate=memo)
    over = [r for r in res.rows if r["capex_usd"] > budget]
    assert over and all(r["status"] == "constrained" for r in over)
    assert res.pareto and all(r["capex_usd"] <= budget for r in res.pareto)


def test_a_study_resumes_from_its_storage(grid_rows, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = Memo(grid_rows)
    a = run_optuna(SPACE, OPTS, Constraints(), trials=5, seed=0, workers=1, storage=url, study_name="s",
                   evaluate=first)
    second = Memo(grid_rows)
    b = run_optuna(SPACE, OPTS, Constraints(), trials=5, seed=1, workers=1, storage=url, study_name="s",
                   evaluate=second)
    assert a.evaluations == 5 and b.reused == 5 and b.evaluations == second.calls == 5
    assert len(b.rows) == 10 and len({(r["gpu"], r["num_gpus"], r["topology"], r["oversubscription"])
                                      for r in b.rows}) == 10  # nothing costed twice
    assert optuna.load_study(study_name="s", storage=url).trials[-1].number >= 9


def test_ray_executor_costs_the_same_designs():
    ok, why = ray_available()
    if not ok:
        pytest.skip(f"ray is not importable: {why}")
    small = replace(SPACE, gpus=("h100-80gb",), counts=(16, 32), topologies=("fat-tree",))
    local = run_optuna(small, OPTS, Constraints(), trials=2, seed=0, workers=1)
    remote = run_optuna(small, OPTS, Constraints(), trials=2, seed=0, workers=1, executor="ray")
    strip = lambda rows: sorted(({k: v for k, v in r.items() if k != "eval_time_s"} for r in rows),  # noqa: E731
                                key=lambda r: r["num_gpus"])
    assert remote.executor == "ray" and strip(remote.rows) == strip(local.rows)


# ----------------------------------------------------------------- the command and its files


def test_cli_optuna_study_writes_plot_csv_and_best_designs(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main(["sweep", "--models", "llama3-8b", "--gpus", "h100-80gb", "--counts", "16,32,64",
                 "--topologies", "fat-tree", "--oversubscription", "1,2", "--strategy-engine", "quick",
                 "--tokens", "1e11", "--workers", "1", "--search", "optuna", "--trials", "4", "--power-cap-kw", "1e4",
                 "--out", str(out), "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    d = json.loads(cap.out)
    assert d["search"]["method"] == "optuna" and d["search"]["evaluations"] == 4 and d["pareto"]
    assert {p.rsplit("/", 1)[-1] for p in d["files"]} == {"trials.csv", "best_designs.json", "pareto.png",
                                                          "pareto.html"}
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plotly" in (out / "pareto.html").read_text()[:200000].lower()
    with (out / "trials.csv").open() as f:
        trials = list(csv.DictReader(f))
    assert len(trials) == d["search"]["trials"] and sum(t["on_front"] == "1" for t in trials) >= len(d["pareto"])
    best = json.loads((out / "best_designs.json").read_text())["best_designs"]
    assert [b["plan"]["strategy"] for b in best] == [p["strategy"] for p in d["pareto"]]
    assert all(b["command"].startswith("planner tco ") for b in best)
    rows = read_trials_csv(out / "trials.csv")
    assert {r["num_gpus"] for r in rows if r["on_front"]} == {p["num_gpus"] for p in d["pareto"]}


def test_cli_grid_writes_the_same_files_and_stays_the_default_for_small_spaces(tmp_path, capsys):
    code = main(["sweep", "--models", "llama3-8b", "--gpus", "h100-80gb", "--counts", "16,32", "--topologies",
                 "fat-tree", "--oversubscription", "1", "--strategy-engine", "quick", "--tokens", "1e11",
                 "--workers", "1", "--available", "h100-80gb:16", "--out", str(tmp_path), "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    d = json.loads(cap.out)
    assert d["search"]["method"] == "grid" and d["points_evaluated"] == 1
    assert d["search"]["excluded_by_constraints"] == 1
    assert (tmp_path / "trials.csv").exists() and (tmp_path / "best_designs.json").exists()


@pytest.mark.parametrize("argv,needle", [
    (["--available", "h100-80gb"], "available"),
    (["--budget-usd", "-5"], "budget-usd"),
    (["--search", "optuna", "--trials", "0"], "trials"),
    (["--search", "optuna", "--study-storage", "study.db"], "storage"),
    (["--max-gpus", "8"], "max-gpus"),
])
def test_cli_search_bad_input_is_one_line(capsys, argv, needle):
    code = main(["sweep", "--models", "llama3-8b", "--gpus", "h100-80gb", "--counts", "16", "--workers", "1",
                 "--strategy-engine", "quick"] + argv)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def _front_section() -> None:
    from appkit import search_front

    search_front.render()


def test_the_app_shows_the_front_the_sweep_wrote(tmp_path, monkeypatch, capsys):
    from streamlit.testing.v1 import AppTest

    code = main(["sweep", "--models", "llama3-8b", "--gpus", "h100-80gb", "--counts", "16,32", "--topologies",
                 "fat-tree", "--oversubscription", "1,2", "--strategy-engine", "quick", "--tokens", "1e11",
                 "--workers", "1", "--out", str(tmp_path), "--json"])
    assert code == 0, capsys.readouterr().err
    best = json.loads((tmp_path / "best_designs.json").read_text())["best_designs"]
    monkeypatch.setenv("PLANNER_SWEEP_DIR", str(tmp_path))
    at = AppTest.from_function(_front_section, default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    front = next(t for t in spec["data"] if t["name"].startswith("Pareto front"))
    assert front["y"] == pytest.approx([b["cost_to_train_usd"] for b in best])
    assert list(at.dataframe[0].value["plan"]) == [b["plan"]["strategy"] for b in best]
