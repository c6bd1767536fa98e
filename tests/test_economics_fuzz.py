"""Random flags for the economics commands never produce a traceback (exit 0 or one-line exit 2).

The work limits of ``sim.base.limits`` are lowered so every accepted run stays fast; seeds, cluster
sizes, campaign lengths, job counts and nodes are then fuzzed over their whole range: what is
beyond a limit is refused with the limit named, nothing runs for minutes.
"""

import contextlib
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main
from sim.base import limits


@pytest.fixture(autouse=True)
def _small_limits(monkeypatch):
    monkeypatch.setattr(limits, "CAMPAIGN_MAX_EVENTS", 100_000)
    monkeypatch.setattr(limits, "SCHEDULE_MAX_WORK", 2_000_000)

VALUES = st.one_of(st.integers(min_value=-5, max_value=5000).map(str),
                   st.sampled_from(["0", "1", "-1", "nan", "inf", "1e40", "", "x", "0.5", "2", "hdfs", "s3",
                                    "fifo", "ray", "owned", "cloud", "h100-80gb", "ib-ndr-400"]),
                   st.text(max_size=8))
TCO_FLAGS = ["--tokens", "--tokens-per-param", "--pricing", "--usd-per-kwh", "--pue", "--amortization-years",
             "--gpu-price-usd", "--usd-per-gpu-hour", "--facility-usd-per-kw-month", "--storage", "--topology",
             "--oversubscription", "--nic"]
GOODPUT_FLAGS = ["--storage", "--restart-s", "--checkpoint-interval-s", "--spares", "--repair-hours", "--seeds",
                 "--campaign-days", "--num-gpus", "--seq-len", "--host-dram-gib"]
SCHEDULE_FLAGS = ["--nodes", "--generate", "--policy", "--seed", "--restart-s", "--repair-hours",
                  "--checkpoint-interval-s", "--mean-interarrival-s", "--median-duration-s", "--gpus-per-node"]


def _call(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def _check(argv):
    code, err = _call(argv)
    assert code in (0, 2), (argv, err)
    assert "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.lists(st.tuples(st.sampled_from(TCO_FLAGS), VALUES), max_size=4))
def test_tco_fuzz(flags):
    argv = ["tco", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "64",
            "--strategy", "tp=1,pp=1,mbs=1,gbs=256,zero=1", "--json"]
    for k, v in flags:
        argv += [k, v]
    _check(argv)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.lists(st.tuples(st.sampled_from(GOODPUT_FLAGS), VALUES), max_size=4))
def test_goodput_fuzz(flags):
    argv = ["goodput", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "64", "--seeds", "2",
            "--campaign-days", "1", "--json"]
    for k, v in flags:
        argv += [k, v]
    _check(argv)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.lists(st.tuples(st.sampled_from(SCHEDULE_FLAGS), VALUES), max_size=4))
def test_schedule_fuzz(flags):
    argv = ["schedule", "--nodes", "8", "--generate", "20", "--json"]
    for k, v in flags:
        argv += [k, v]
    _check(argv)
