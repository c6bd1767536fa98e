"""Hypothesis-driven fuzz of the CLI: random flags and values never produce a traceback or a hang.

Bad input is exit 2 with one line; good input exits 0 and its ``--json`` is strict JSON (no
NaN/Infinity).  The flags include the ones added since the first fuzz (MoE, framework, output
paths, NICs, PCIe servers, offload, rank order, fp8 recipes), and the limits of ``sim.base.limits``
are lowered so every accepted run stays fast: work beyond them is refused, never run.
"""

import contextlib
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main
from sim.base import limits


@pytest.fixture(autouse=True)
def _small_limits(monkeypatch):
    monkeypatch.setattr(limits, "EVENT_MAX_PIECES", 20_000)

VALUES = st.one_of(
    st.integers(min_value=-10, max_value=10**4).map(str),
    st.sampled_from(["0", "1", "8", "-1", "1e9", "nan", "inf", "99999999999999999999999", "", "x", "1.5",
                     "a100-80gb", "h100-80gb", "gb200-186gb", "gpt3-175b", "llama3-8b", "mixtral-8x7b",
                     "deepseek-v3", "fat-tree", "torus", "star", "ib-ndr-400", "eth-10", "eth-100", "16", "64",
                     "megatron-core", "torchtitan", "deepep", "alltoall", "2", "0.5", "/proc/x.json",
                     "/nonexistent/t.json", "/tmp", "l40s-48gb", "srv-8gpu-2s-dualroot-gen5-switch", " "]),
    st.text(max_size=12),
)
STRAT_KEYS = ["tp", "pp", "dp", "cp", "ep", "vp", "mbs", "gbs", "zero", "sp", "recompute", "precision", "schedule",
              "seq", "fsdp", "bogus", "fp8_recipe", "etp", "offload", "offload_device", "order", "dp_impl",
              "dp_shard", "dp_overlap", "tp_overlap"]
STRAT_VALUES = st.one_of(st.integers(min_value=-2, max_value=4096).map(str),
                         st.sampled_from(["none", "selective", "full", "bf16", "fp8", "fp16", "gpipe", "1f1b",
                                          "interleaved", "zero-bubble", "x", "", "mxfp8", "delayed", "tensorwise",
                                          "optimizer", "params", "cpu", "nvme", "tp-cp-dp-pp", "ddp",
                                          "dataparallel", "1e9", "nan"]))
strategies_text = st.lists(st.tuples(st.sampled_from(STRAT_KEYS), STRAT_VALUES), max_size=6).map(
    lambda kv: ",".join(f"{k}={v}" for k, v in kv))
FLAGS = ["--model", "--gpu", "--num-gpus", "--gpus-per-node", "--nvlink-domain", "--nic", "--nics-per-node",
         "--topology", "--oversubscription", "--seq-len", "--engine", "--framework", "--moe-imbalance",
         "--moe-dispatcher", "--trace", "--server", "--sockets", "--host-dram-gib", "--attention"]


def _call(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.lists(st.tuples(st.sampled_from(FLAGS), VALUES), max_size=6), strategy=strategies_text)
def test_simulate_fuzz_never_tracebacks(flags, strategy, tmp_path_factory):
    argv = ["simulate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "64"]
    for k, v in flags:
        argv += [k, v]
    argv += ["--strategy", strategy, "--json"]
    with contextlib.chdir(tmp_path_factory.mktemp("cwd")):  # a relative --trace lands in a scratch folder
        code, out, err = _call(argv)
    assert code in (0, 2), (argv, err)
    assert "Traceback" not in err and "internal" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    else:  # strict JSON: NaN/Infinity are refused by the parser here
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON of {argv}"))


@settings(max_examples=60, deadline=None)
@given(argv=st.lists(st.one_of(st.sampled_from(FLAGS + ["simulate", "catalog", "--json", "--strategy"]), VALUES),
                     max_size=10))
def test_random_argv_never_tracebacks(argv, tmp_path_factory):
    with contextlib.chdir(tmp_path_factory.mktemp("cwd")):
        code, _, err = _call(argv)
    assert code in (0, 2), (argv, err)
    assert "Traceback" not in err


REC_FLAGS = ["--framework", "--export", "--out", "--moe-imbalance", "--moe-dispatcher", "--precision", "--nics-per-node",
             "--gpus-per-node", "--tp", "--pp", "--vp", "--zero", "--offload", "--gbs", "--seq-len", "--nic"]
REC_VALUES = st.one_of(st.sampled_from(["", ",", "megatron-core", "torchtitan", "torchtitan-compile", "megatron",
                                        "deepspeed", "all", "torchtitan,megatron", "/proc/x", "/etc/passwd", "fp8",
                                        "bf16,fp8", "deepep", "1.5", "nan", "16", "64", "0", "-1", "1,2", "3",
                                        "optimizer", "eth-100", "ib-ndr-400"]),
                       st.integers(min_value=-2, max_value=128).map(str))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.lists(st.tuples(st.sampled_from(REC_FLAGS), REC_VALUES), max_size=3, unique_by=lambda kv: kv[0]))
def test_recommend_fuzz_never_tracebacks(flags, tmp_path_factory):
    argv = ["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--rerank", "0",
            "--no-suggest", "--json"]
    for k, v in flags:
        argv += [k, v]
    if "--out" in argv and "--export" not in argv:
        argv += ["--export", "megatron"]
    with contextlib.chdir(tmp_path_factory.mktemp("cwd")):  # a relative --out lands in a scratch folder
        code, out, err = _call(argv)
    assert code in (0, 2), (argv, err)
    assert "Traceback" not in err and "internal" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    else:
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON of {argv}"))
