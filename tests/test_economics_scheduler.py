"""Shared-cluster scheduler: golden event logs (FIFO, EASY backfill, priority, elastic), invariants."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.economics.scheduler import ClusterSpec, simulate_schedule
from planner.economics.traces import JobSpec, format_trace, generate_jobs, parse_trace, read_trace
from sim.base.errors import InputError

EXAMPLE = Path(__file__).resolve().parent.parent / "catalogs" / "traces" / "example_jobs.csv"
NODES4 = ClusterSpec(num_nodes=4, gpus_per_node=8)


def job(jid, submit, nodes, dur, **kw):
    return JobSpec(job_id=jid, submit_s=submit, num_gpus=8 * nodes, duration_s=dur, **kw)


BACKFILL_JOBS = [job("A", 0, 3, 100), job("B", 10, 4, 50), job("C", 20, 1, 50), job("D", 30, 1, 200)]


def test_fifo_golden_log():
    r = simulate_schedule(NODES4, BACKFILL_JOBS, policy="fifo")
    assert list(r.log) == [(0, "submit", "A"), (0, "start", "A"), (10, "submit", "B"), (20, "submit", "C"),
                           (30, "submit", "D"), (100, "end", "A"), (100, "start", "B"), (150, "end", "B"),
                           (150, "start", "C"), (150, "start", "D"), (200, "end", "C"), (350, "end", "D")]


def test_easy_backfill_golden_log():
    """C (ends at 70, before B's reservation at 100) is backfilled; D (ends at 270) is not."""
    r = simulate_schedule(NODES4, BACKFILL_JOBS, policy="backfill")
    assert list(r.log) == [(0, "submit", "A"), (0, "start", "A"), (10, "submit", "B"), (20, "submit", "C"),
                           (20, "start", "C"), (30, "submit", "D"), (70, "end", "C"), (100, "end", "A"),
                           (100, "start", "B"), (150, "end", "B"), (150, "start", "D"), (350, "end", "D")]
    waits = {j.job_id: j.wait_s for j in r.jobs}
    assert waits == {"A": 0, "B": 90, "C": 0, "D": 120}


def test_priority_reorders_the_queue():
    jobs = [job("A", 0, 4, 100), job("X", 10, 4, 10), job("Y", 20, 4, 10, priority=5)]
    starts = {p: {j.job_id: j.start_s for j in simulate_schedule(NODES4, jobs, policy=p).jobs}
              for p in ("fifo", "priority")}
    assert starts["fifo"] == {"A": 0, "X": 100, "Y": 110}
    assert starts["priority"] == {"A": 0, "X": 110, "Y": 100}


FAIL_SPEC = ClusterSpec(num_nodes=4, gpus_per_node=8, repair_s=50, restart_s=5, reconfigure_s=2,
                        checkpoint_interval_s=10)


def test_elastic_job_shrinks_on_failure_and_grows_back():
    jobs = [job("E", 0, 4, 100, elastic=True, min_gpus=16)]
    r = simulate_schedule(FAIL_SPEC, jobs, failures=[(25.0, 3, True)])
    # 25: lose 5 s since the checkpoint at 20; 3/4 speed after a 5 s restart; node back at 75:
    # done 20 + 45 * 0.75 = 53.75; +2 s reconfigure; 46.25 s left at full speed -> 123.25.
    assert list(r.log) == [(0, "submit", "E"), (0, "start", "E"), (25, "node_down", "node3"), (25, "shrink", "E"),
                           (75, "repaired", "node3"), (75, "grow", "E"), (123.25, "end", "E")]
    (e,) = r.jobs
    assert (e.shrinks, e.grows, e.restarts) == (1, 1, 1)


def test_rigid_job_is_requeued_and_waits_for_the_repair():
    r = simulate_schedule(FAIL_SPEC, [job("R", 0, 4, 100)], failures=[(25.0, 3, True)])
    assert list(r.log) == [(0, "submit", "R"), (0, "start", "R"), (25, "node_down", "node3"), (25, "requeue", "R"),
                           (75, "repaired", "node3"), (75, "start", "R"), (160, "end", "R")]
    assert r.useful_utilisation < r.utilisation


def test_job_level_failure_restarts_in_place():
    r = simulate_schedule(FAIL_SPEC, [job("R", 0, 4, 100)], failures=[(25.0, 0, False)])
    assert list(r.log) == [(0, "submit", "R"), (0, "start", "R"), (25, "restart", "R"), (110, "end", "R")]


def test_failure_on_a_free_node_only_takes_it_down():
    r = simulate_schedule(FAIL_SPEC, [job("S", 0, 1, 100)], failures=[(10.0, 3, True)])
    assert r.jobs[0].end_s == 100 and r.node_failures == 1 and r.job_interruptions == 0


@settings(max_examples=25, deadline=None)
@given(spec=st.lists(st.tuples(st.floats(0, 500), st.integers(1, 4), st.floats(1, 300), st.booleans(),
                               st.integers(0, 2)), min_size=1, max_size=8),
       policy=st.sampled_from(["fifo", "backfill", "priority"]), seed=st.integers(0, 5))
def test_invariants_under_random_failures(spec, policy, seed):
    jobs = [JobSpec(job_id=f"j{i}", submit_s=t, num_gpus=8 * n, duration_s=d, elastic=e and n > 1,
                    min_gpus=8 if e and n > 1 else None, priority=p, estimate_s=d * 1.5)
            for i, (t, n, d, e, p) in enumerate(spec)]
    c = ClusterSpec(num_nodes=4, gpus_per_node=8, node_failure_rate_per_s=1 / 5000, job_failure_rate_per_s=1 / 8000,
                    repair_s=200, restart_s=10, checkpoint_interval_s=30)
    r = simulate_schedule(c, jobs, policy=policy, seed=seed)
    assert r.unfinished == 0
    for rec, j in zip(sorted(r.jobs, key=lambda x: x.job_id), sorted(jobs, key=lambda x: x.job_id)):
        assert rec.start_s >= j.submit_s - 1e-9
        assert rec.end_s >= rec.start_s + j.duration_s - 1e-6  # never faster than at full size
    assert 0 <= r.useful_utilisation <= r.utilisation + 1e-9 <= 1 + 1e-9


def test_example_trace_and_round_trip():
    jobs = read_trace(EXAMPLE)
    assert len(jobs) == 10 and any(j.elastic for j in jobs)
    assert parse_trace(format_trace(jobs)) == jobs


@pytest.mark.parametrize("text,needle", [
    ("job_id,submit_s,num_gpus\nx,0,8\n", "duration_s"),
    ("job_id,submit_s,num_gpus,duration_s\nx,0,8,abc\n", "duration_s"),
    ("job_id,submit_s,num_gpus,duration_s\nx,0,8,10\nx,1,8,10\n", "unique"),
    ("job_id,submit_s,num_gpus,duration_s,colour\nx,0,8,10,red\n", "colour"),
    ("job_id,submit_s,num_gpus,duration_s\nx,0,8,-10\n", "duration_s"),
    ("job_id,submit_s,num_gpus,duration_s,elastic,min_gpus\nx,0,8,10,1,16\n", "min_gpus"),
])
def test_bad_traces(text, needle):
    with pytest.raises(InputError, match=needle):
        parse_trace(text)


def test_too_big_job_is_rejected():
    with pytest.raises(InputError, match="nodes"):
        simulate_schedule(NODES4, [job("big", 0, 5, 10)])


def test_generator_is_deterministic_and_fits():
    a = generate_jobs(num_jobs=50, num_nodes=16, gpus_per_node=8, seed=3)
    assert a == generate_jobs(num_jobs=50, num_nodes=16, gpus_per_node=8, seed=3)
    assert all(j.num_gpus <= 16 * 8 for j in a) and a != generate_jobs(num_jobs=50, num_nodes=16, gpus_per_node=8, seed=4)


def test_cli_schedule_example_trace(capsys):
    code = main(["schedule", "--trace", str(EXAMPLE), "--nodes", "8", "--json", "--log"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    d = json.loads(cap.out)
    assert [p["policy"] for p in d["policies"]] == ["fifo", "backfill", "priority"]
    for p in d["policies"]:
        assert p["unfinished"] == 0 and 0 < p["utilisation"] <= 1 and p["queue_wait_s"]["mean"] >= 0
        assert len(p["per_job"]) == 10


def test_cli_schedule_needs_a_source(capsys):
    code = main(["schedule", "--nodes", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "trace" in err
