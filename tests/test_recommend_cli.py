"""``planner recommend`` on the command line: the docs/interface.md JSON, the table, exports, and bad
input (exit 2, one line naming the field)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main

BASE = ["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--gbs", "64",
        "--max-mbs", "4", "--max-vp", "2"]
SIMULATE_KEYS = ("step_time_s", "tokens_per_s", "mfu", "hfu", "model_flops_per_step", "memory_peak_bytes",
                 "fits_memory", "breakdown", "warnings")


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_per_interface_and_strategy_round_trips_through_simulate(capsys):
    code, out, err = run(BASE + ["--json", "--top", "3", "--rerank", "0"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["candidates_evaluated"] > 0 and d["search_time_s"] > 0
    assert d["candidates_considered"] == d["candidates_evaluated"] + d["rejected_total"]
    assert len(d["plans"]) == 3 and d["ranking"]["engine"] == "analytic"
    for p in d["plans"]:
        for key in SIMULATE_KEYS:
            assert key in p
        assert p["fits_memory"] is True
        for k in ("compute_s", "exposed_comm_s", "bubble_s"):
            assert k in p["breakdown"]
    best = d["plans"][0]
    code, out, err = run(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16",
                          "--strategy", best["strategy"], "--engine", "analytic", "--json"], capsys)
    assert code == 0, err
    sim = json.loads(out)
    assert sim["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
    assert sim["memory_peak_bytes"] == pytest.approx(best["memory_peak_bytes"], rel=1e-9)
    assert d["explanation"]["lines"] and d["explanation"]["bound_by"]


def test_event_ranked_plans_match_planner_simulate_event(capsys):
    code, out, err = run(BASE + ["--json", "--top", "2"], capsys)
    assert code == 0, err
    d = json.loads(out)
    if d["ranking"]["engine"] != "event":
        pytest.skip(d["ranking"]["note"])
    best = d["plans"][0]
    assert best["engine"] == "event"
    code, out, err = run(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16",
                          "--strategy", best["strategy"], "--engine", "event", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)


def test_table_output(capsys):
    code, out, err = run(BASE + ["--top", "2", "--rerank", "0", "--precision", "bf16"], capsys)
    assert code == 0, err
    assert "candidates" in out and "step time" in out and "MFU" in out and "why #1:" in out
    assert "reproduce: planner simulate" in out
    assert "precision=bf16" in out and "precision=fp8" not in out


def test_export_all_to_directory(tmp_path, capsys):
    code, out, err = run(BASE + ["--rerank", "0", "--export", "all", "--out", str(tmp_path), "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    names = {p.rsplit("/", 1)[-1] for info in d["exports"].values() for p in info["files"]}
    expected = {"megatron": {"megatron_args.sh"}, "torchtitan": {"torchtitan.toml"},
                "deepspeed": {"ds_config.json", "deepspeed_launch.sh"}, "torchrun": {"launch_torchrun.sh"},
                "slurm": {"train.sbatch"}, "k8s": {"pytorchjob.yaml"}, "tensorflow": {"train_keras.py"}}
    assert set(d["exports"]) == set(expected)
    for fmt, info in d["exports"].items():  # written, or skipped with the reason (its framework cannot run it)
        assert (expected[fmt] <= names) != bool(info.get("skipped")), fmt
        assert not info.get("skipped") or "skipped:" in info["warnings"][0]
    assert "megatron_args.sh" in names and all((tmp_path / n).exists() for n in names)


def test_export_without_out_prints_the_file(capsys):
    code, out, err = run(BASE + ["--rerank", "0", "--export", "deepspeed"], capsys)
    assert code == 0, err
    assert "===== deepspeed: ds_config.json =====" in out and '"train_batch_size": 64' in out


def test_fewer_gpus_and_cost_objective(capsys):
    code, out, err = run(BASE + ["--rerank", "0", "--min-gpus", "8", "--objective", "cost", "--tokens", "1e11",
                                 "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["gpu_counts_searched"] == [16, 8]
    assert "cost_to_train_usd" in d["plans"][0] and d["objective"]["kind"] == "cost"


@pytest.mark.parametrize("extra,field", [
    (["--tp", "abc"], "tp"),
    (["--tp", "0"], "tp"),
    (["--zero", "5"], "zero"),
    (["--recompute", "most"], "recompute"),
    (["--schedule", "dualpipe"], "schedule"),
    (["--precision", "fp4"], "precision"),
    (["--sp", "2"], "sp"),
    (["--export", "helm"], "export"),
    (["--out", "/tmp/x"], "out"),
    (["--objective", "time"], "tokens"),
    (["--tokens", "-5"], "tokens"),
    (["--min-gpus", "3000"], "min-gpus"),
    (["--top", "0"], "top"),
    (["--max-mbs", "0"], "max-mbs"),
    (["--tie-tolerance", "2"], "tie-tolerance"),
    (["--framework", "jax"], "framework"),
])
def test_bad_input_exits_2_with_one_line(extra, field, capsys):
    code, out, err = run(BASE + extra, capsys)
    assert code == 2
    assert err.count("\n") == 1 and field in err, err


def test_bad_batch_and_gpu_without_price(capsys):
    code, _, err = run(["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--gbs", "0"],
                       capsys)
    assert code == 2 and "gbs" in err
    code, _, err = run(["recommend", "--model", "llama3-8b", "--gpu", "h800-80gb", "--num-gpus", "8", "--gbs", "8",
                        "--objective", "cost"], capsys)
    assert code == 2 and "price" in err and err.count("\n") == 1


def test_nothing_fits_says_what_would(capsys):
    code, out, err = run(["recommend", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "8", "--gbs", "16",
                          "--max-mbs", "1", "--max-vp", "2", "--rerank", "0", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["plans"] == [] and d["rejected"]["oom"] > 0
    assert any(s["change"] == "num_gpus" and s["verified"] for s in d["suggestions"])


FUZZ_FLAGS = ["--tp", "--pp", "--cp", "--ep", "--vp", "--mbs", "--zero", "--sp", "--recompute", "--schedule",
              "--precision", "--gbs", "--seq-len", "--min-gpus", "--objective", "--tokens", "--top", "--max-vp",
              "--tie-tolerance", "--export"]
FUZZ_VALUES = ["0", "1", "2", "3", "8", "-1", "1,2", "abc", "", "1e99", "nan", "full", "fp8", "interleaved",
               "cost", "time", "all", "2,x"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs=st.lists(st.tuples(st.sampled_from(FUZZ_FLAGS), st.sampled_from(FUZZ_VALUES)), max_size=4))
def test_fuzzed_flags_never_traceback(pairs):
    argv = ["recommend", "--model", "gpt-1.7b", "--gpu", "a100-80gb", "--num-gpus", "8", "--max-mbs", "2",
            "--rerank", "0", "--json", "--no-suggest"]
    for flag, value in pairs:
        argv += [flag, value]
    import contextlib
    import io

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    assert code in (0, 2), (argv, err.getvalue())
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
    else:
        json.loads(out.getvalue())
