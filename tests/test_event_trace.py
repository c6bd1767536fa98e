"""Chrome trace output and the `planner simulate` surface of the event engine."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from planner.cli import main
from sim.engines.event.engine import simulate_event
from sim.engines.event.trace import STREAMS
from tests.test_event_engine import real_plan

BASE = ["simulate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "256",
        "--strategy", "tp=8,pp=4,mbs=1,gbs=256,sp=1"]


def _load(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@pytest.mark.parametrize("explicit", [False, True])
def test_trace_has_one_track_per_rank_and_stream(tmp_path, explicit: bool) -> None:
    plan = real_plan("gpt3-175b", "a100-80gb", 128, "tp=8,pp=4,dp=4,mbs=1,gbs=64,sp=1,zero=1")
    path = tmp_path / "trace.json"
    r = simulate_event(plan, trace_path=str(path), explicit_ranks=explicit)
    data = _load(path)
    events = data["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    spans = [e for e in events if e["ph"] == "X"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    units = 4 * (4 if explicit else 1)
    assert len(names) == units == r.extra["event"]["simulated_units"]
    assert all(n.startswith(f"rank {pid} ") for pid, n in names.items())
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in spans} <= set(threads)
    assert {threads[k] for k in threads} >= {"compute", "pp", "dp", "tp"}
    assert all(threads[k] == STREAMS[k[1]] for k in threads)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    # Every micro-batch's forward and backward on every simulated rank's compute track.
    per_rank = Counter(e["pid"] for e in spans if e["tid"] == 0 and e["cat"] == "compute")
    assert set(per_rank) == set(names) and min(per_rank.values()) >= 2 * plan.strategy.num_microbatches
    # The step ends with the last span on the critical rank's compute track.
    crit = r.extra["event"]["critical_rank"]
    last = max(e["ts"] + e["dur"] for e in spans if e["pid"] == crit and e["tid"] == 0)
    assert last == pytest.approx(r.step_time_s * 1e6, rel=1e-9)


def test_cli_event_is_default_and_writes_trace(tmp_path, capsys) -> None:
    path = tmp_path / "out.json"
    assert main(BASE + ["--engine", "event", "--trace", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["engine"] == "event" and d["step_time_s"] > 0
    assert sum(d["breakdown"][k] for k in ("compute_s", "exposed_comm_s", "bubble_s", "optimizer_s", "overhead_s")) \
        == pytest.approx(d["step_time_s"], rel=1e-6)
    assert "traceEvents" in _load(path)
    assert main(BASE + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["engine"] == "event"
    assert main(BASE + ["--json", "--engine", "analytic"]) == 0
    assert json.loads(capsys.readouterr().out)["engine"] == "analytic"


def test_cli_whatifs(capsys) -> None:
    assert main(BASE + ["--json"]) == 0
    base = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(BASE + ["--json", "--straggler", "70:25", "--slow-link", "node:9:100", "--explicit-ranks",
                        "--layers-per-stage", "24,24,24,24"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["step_time_s"] > base
    assert d["event"]["mode"] == "explicit" and d["event"]["whatif"]["stragglers"] == [{"rank": 70, "slowdown_pct": 25.0}]
    assert any("what-if" in w for w in d["warnings"])


@pytest.mark.parametrize("flags,needle", [
    (["--straggler", "70"], "straggler"),
    (["--straggler", "256:10"], "straggler"),
    (["--straggler", "3:fast"], "straggler"),
    (["--slow-link", "node:99:50"], "slow-link"),
    (["--slow-link", "warp:1:50"], "slow-link"),
    (["--slow-link", "scale-out:-1"], "slow-link"),
    (["--layers-per-stage", "24,24"], "layers-per-stage"),
    (["--layers-per-stage", "30,30,30,30"], "layers-per-stage"),
    (["--engine", "analytic", "--straggler", "1:10"], "engine"),
    (["--engine", "analytic", "--explicit-ranks"], "engine"),
    (["--engine", "analytic", "--trace", "x.json"], "trace"),
    (["--trace", "/nonexistent-dir/t.json"], "trace"),
])
def test_cli_bad_whatif_exits_2_with_one_line(flags, needle, capsys) -> None:
    code = main(BASE + flags)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert needle in lines[0]
