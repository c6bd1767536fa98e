"""Hypothesis-driven fuzz of the CLI: random flags and values never produce a traceback or a hang."""

import contextlib
import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main

VALUES = st.one_of(
    st.integers(min_value=-10, max_value=10**4).map(str),
    st.sampled_from(["0", "1", "8", "-1", "1e9", "nan", "inf", "99999999999999999999999", "", "x", "1.5",
                     "a100-80gb", "h100-80gb", "gb200-186gb", "gpt3-175b", "llama3-8b", "mixtral-8x7b",
                     "deepseek-v3", "fat-tree", "torus", "star", "ib-ndr-400", "eth-10"]),
    st.text(max_size=12),
)
STRAT_KEYS = ["tp", "pp", "dp", "cp", "ep", "vp", "mbs", "gbs", "zero", "sp", "recompute", "precision", "schedule",
              "seq", "fsdp", "bogus"]
STRAT_VALUES = st.one_of(st.integers(min_value=-2, max_value=4096).map(str),
                         st.sampled_from(["none", "selective", "full", "bf16", "fp8", "fp16", "gpipe", "1f1b",
                                          "interleaved", "zero-bubble", "x", ""]))
strategies_text = st.lists(st.tuples(st.sampled_from(STRAT_KEYS), STRAT_VALUES), max_size=6).map(
    lambda kv: ",".join(f"{k}={v}" for k, v in kv))
FLAGS = ["--model", "--gpu", "--num-gpus", "--gpus-per-node", "--nvlink-domain", "--nic", "--nics-per-node",
         "--topology", "--oversubscription", "--seq-len", "--engine"]


def _call(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.lists(st.tuples(st.sampled_from(FLAGS), VALUES), max_size=6), strategy=strategies_text)
def test_simulate_fuzz_never_tracebacks(flags, strategy):
    argv = ["simulate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "64"]
    for k, v in flags:
        argv += [k, v]
    argv += ["--strategy", strategy, "--json"]
    code, out, err = _call(argv)
    assert code in (0, 2), (argv, err)
    assert "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


@settings(max_examples=60, deadline=None)
@given(argv=st.lists(st.one_of(st.sampled_from(FLAGS + ["simulate", "catalog", "--json", "--strategy"]), VALUES),
                     max_size=10))
def test_random_argv_never_tracebacks(argv):
    code, _, err = _call(argv)
    assert code in (0, 2), (argv, err)
    assert "Traceback" not in err
