"""Design sweeps: Pareto front known answers, local processes vs serial vs Ray."""

import json

import pytest

import planner.economics.sweep as sweep_mod
from planner.cli import main
from planner.economics.sweep import SweepOptions, design_grid, evaluate_point, pareto_front, run_sweep
from planner.economics.tco import TcoOptions
from sim.base.errors import InputError

OPTS = SweepOptions(tco=TcoOptions(tokens=1e11), quick=True)


def grid():
    return design_grid(models=["llama3-8b"], gpus=["a100-80gb", "h100-80gb"], counts=[64], nics=[None],
                       topologies=["fat-tree"], oversubscriptions=[1.0])


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "eval_time_s"} for r in rows]


def test_pareto_front_known_answer():
    rows = [
        {"model": "m", "status": "ok", "time_to_train_s": 1.0, "cost_to_train_usd": 10.0, "id": "fast"},
        {"model": "m", "status": "ok", "time_to_train_s": 5.0, "cost_to_train_usd": 2.0, "id": "cheap"},
        {"model": "m", "status": "ok", "time_to_train_s": 6.0, "cost_to_train_usd": 3.0, "id": "dominated"},
        {"model": "m", "status": "ok", "time_to_train_s": 3.0, "cost_to_train_usd": 5.0, "id": "middle"},
        {"model": "m", "status": "infeasible", "id": "bad"},
        {"model": "other", "status": "ok", "time_to_train_s": 9.0, "cost_to_train_usd": 99.0, "id": "alone"},
    ]
    assert [r["id"] for r in pareto_front(rows)] == ["fast", "middle", "cheap", "alone"]


def test_grid_checks_ids_up_front():
    with pytest.raises(InputError, match="gpu"):
        design_grid(models=["llama3-8b"], gpus=["nope"], counts=[8], nics=[None], topologies=["fat-tree"],
                    oversubscriptions=[1.0])
    with pytest.raises(InputError, match="topolog"):
        design_grid(models=["llama3-8b"], gpus=["h100-80gb"], counts=[8], nics=[None], topologies=["ring"],
                    oversubscriptions=[1.0])


def test_infeasible_points_are_rows_not_crashes():
    pts = design_grid(models=["llama3.1-405b"], gpus=["v100-32gb"], counts=[8], nics=[None],
                      topologies=["fat-tree"], oversubscriptions=[1.0])
    row = evaluate_point(pts[0], OPTS)
    assert row["status"] == "infeasible" and "oom" in row["reason"]


def test_local_processes_equal_serial():
    serial = run_sweep(grid(), OPTS, executor="local", max_workers=1)
    parallel = run_sweep(grid(), OPTS, executor="local", max_workers=2)
    assert _strip(serial.rows) == _strip(parallel.rows)
    assert all(r["status"] == "ok" for r in serial.rows)
    assert 1 <= len(serial.pareto) <= 2


def test_unknown_executor():
    with pytest.raises(InputError, match="executor"):
        run_sweep(grid(), OPTS, executor="dask")


def test_ray_missing_is_a_clear_input_error(monkeypatch):
    monkeypatch.setattr(sweep_mod, "ray_available", lambda: (False, "ModuleNotFoundError: No module named 'ray'"))
    with pytest.raises(InputError, match="pip install"):
        run_sweep(grid(), OPTS, executor="ray")


def test_ray_executor_matches_local():
    ok, why = sweep_mod.ray_available()
    if not ok:
        pytest.skip(f"ray is not importable on this Python: {why}")
    local = run_sweep(grid(), OPTS, executor="local", max_workers=1)
    remote = run_sweep(grid(), OPTS, executor="ray", max_workers=2)  # ray.init(num_cpus=2) locally
    assert remote.executor == "ray"
    assert _strip(remote.rows) == _strip(local.rows)


def test_cli_sweep_json(capsys):
    code = main(["sweep", "--models", "llama3-8b", "--gpus", "h100-80gb", "--counts", "64,128",
                 "--topologies", "fat-tree", "--oversubscription", "1,2", "--strategy-engine", "fallback",
                 "--tokens", "1e11", "--workers", "1", "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    d = json.loads(cap.out)
    assert d["points_evaluated"] == 4 and d["feasible"] == 4 and d["pareto"]
    assert all(p["status"] == "ok" for p in d["pareto"])


@pytest.mark.parametrize("argv,needle", [(["--counts", "8,x"], "counts"), (["--gpus", "h900"], "gpu"),
                                         (["--oversubscription", "0.5"], "oversubscription")])
def test_cli_sweep_bad_input(capsys, argv, needle):
    code = main(["sweep", "--models", "llama3-8b", "--workers", "1"] + argv)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
