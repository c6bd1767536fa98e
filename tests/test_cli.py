"""End-to-end tests of the `planner` CLI: JSON keys, exit codes, one-line errors."""

import json
import subprocess
import sys

import pytest

from planner.cli import main

REQUIRED = ["step_time_s", "tokens_per_s", "mfu", "hfu", "model_flops_per_step", "memory_peak_bytes",
            "fits_memory", "breakdown", "warnings"]
BASE = ["simulate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "1024"]
GOOD = "tp=8,pp=16,mbs=1,gbs=1536,sp=1,recompute=selective"


def run(argv, capsys):
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_simulate_json_has_interface_keys(capsys):
    code, out, err = run(BASE + ["--strategy", GOOD, "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    for k in REQUIRED:
        assert k in d
    for k in ("compute_s", "exposed_comm_s", "bubble_s"):
        assert k in d["breakdown"]
    assert 0 < d["mfu"] <= d["hfu"] <= 1
    assert d["fits_memory"] is True
    assert sum(d["breakdown"][k] for k in ("compute_s", "exposed_comm_s", "bubble_s", "optimizer_s", "overhead_s")) \
        == pytest.approx(d["step_time_s"], rel=1e-6)


def test_simulate_readable_summary(capsys):
    code, out, _ = run(BASE + ["--strategy", GOOD], capsys)
    assert code == 0
    assert "step time" in out and "MFU" in out and "where the time goes" in out


def test_dp_derived_and_interleaved(capsys):
    code, out, err = run(BASE + ["--strategy", "tp=8,pp=16,vp=3,mbs=1,gbs=1536,sp=1,recompute=selective", "--json"],
                         capsys)
    assert code == 0, err
    d = json.loads(out)
    assert "dp=8" in d["strategy"] and "schedule=interleaved" in d["strategy"]


def test_not_fitting_is_not_an_error(capsys):
    code, out, _ = run(BASE + ["--strategy", "tp=1,pp=1,mbs=1,gbs=1024", "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert d["fits_memory"] is False
    assert any("memory" in w for w in d["warnings"])


@pytest.mark.parametrize("argv,needle", [
    (["simulate", "--model", "gpt3-175b", "--gpu", "no-such-gpu", "--num-gpus", "8", "--strategy", "tp=8"], "gpu"),
    (["simulate", "--model", "nope", "--gpu", "a100-80gb", "--num-gpus", "8", "--strategy", "tp=8"], "model"),
    (BASE[:-1] + ["1000", "--strategy", "tp=8,pp=16"], "num-gpus"),
    (BASE + ["--strategy", "tp=7"], "tp"),
    (BASE + ["--strategy", "tp=8,pp=16,dp=4"], "strategy"),
    (BASE + ["--strategy", "tp=8,pp=16,mbs=5,gbs=1536"], "gbs"),
    (BASE + ["--strategy", "tp=-1"], "tp"),
    (BASE + ["--strategy", "tp=8,pp=16,bogus=3"], "bogus"),
    (BASE + ["--strategy", "tp=8,recompute=sometimes"], "recompute"),
    (BASE + ["--strategy", "tp=8", "--nic", "carrier-pigeon"], "nic"),
    (BASE + ["--strategy", "tp=8", "--topology", "hypercube"], "topology"),
    (["simulate", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "abc", "--strategy", "tp=8"], "num-gpus"),
    (BASE + ["--strategy", "tp=8", "--seq-len", "0"], "seq"),
    (BASE + ["--strategy", "tp=8", "--nccl", "two"], "nccl"),
    (["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--strategy", "tp=8",
      "--nccl", "2.17.1"], "nccl"),
    (["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--nccl", "2.x"], "nccl"),
    (["simulate", "--model", "/nonexistent/model.yaml", "--gpu", "a100-80gb", "--num-gpus", "8", "--strategy", "tp=8"], "model"),
])
def test_bad_input_exits_2_with_one_line(argv, needle, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert "Traceback" not in err


def test_nccl_release_reaches_the_plan_and_its_simulate_line(capsys):
    """``--nccl 2.20.3``: NCCL 2.20 maps no NVLS buffers for the data-parallel groups that span
    the two nodes (runtime.yaml nvls_by_release); the JSON names the release, the default is the
    GPU generation's, and the resolved run's flags carry it (``Run.flags``)."""
    from sim.engines.run import RunChoices, resolve
    from sim.data.catalog import get_model
    from sim.net.clusters import cluster_from_catalog

    argv = ["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--engine", "analytic",
            "--strategy", "tp=2,mbs=1,gbs=64", "--json"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    default = json.loads(out)
    code, out, err = run(argv + ["--nccl", "2.20.3"], capsys)
    assert code == 0, err
    old = json.loads(out)
    assert (default["nccl"], default["nvls_multinode"]) == ("2.19", True)
    assert (old["nccl"], old["nvls_multinode"]) == ("2.20.3", False)
    assert old["memory_device_bytes"] < default["memory_device_bytes"]
    assert old["memory_reserved_bytes"] == default["memory_reserved_bytes"]
    for release in ("2.27", "2.17"):  # no NVLS on A100: any well-formed release prices the same
        code, out, err = run(argv[:4] + ["a100-80gb"] + argv[5:] + ["--nccl", release], capsys)
        assert code == 0 and json.loads(out)["nccl"] == release, err
    cluster = cluster_from_catalog("h100-80gb", 16)
    r = resolve(get_model("llama3-8b"), cluster, "tp=2,mbs=1,gbs=64", RunChoices(nccl="2.20.3"))
    assert r.plan.nccl == "2.20.3" and r.flags()[-2:] == ["--nccl", "2.20.3"]


def test_catalog_lists_interface_ids(capsys):
    code, out, _ = run(["catalog", "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    gpu_ids = {r["id"] for r in d["gpus"]}
    for gid in ("v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "h100-96gb", "h800-80gb", "h200-141gb",
                "b200-180gb", "gb200-186gb", "gb300-288gb", "mi250x-128gb", "mi300x-192gb"):
        assert gid in gpu_ids
    link_ids = {r["id"] for r in d["links"]}
    for nid in ("ib-hdr-200", "ib-ndr-400", "ib-xdr-800", "roce-100", "roce-200", "roce-400", "eth-10", "eth-25",
                "eth-40", "eth-100", "efa-400"):
        assert nid in link_ids
    model_ids = {r["id"] for r in d["models"]}
    for mid in ("gpt3-175b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-405b", "mixtral-8x7b", "deepseek-v3"):
        assert mid in model_ids
    fws = {r["id"]: r for r in d["frameworks"]}
    assert fws["megatron-lm-2021"]["grad_accumulation"] == "fp32_main_grad"
    assert fws["torchtitan"]["fsdp_copies"] is True and fws["megatron-core"]["dp_overlap"] is True
    assert "default" in fws["megatron-core"]["aliases"]  # no superset profile (issue 21)


def test_console_script_subprocess():
    exe = [sys.executable, "-m", "planner.cli"]
    ok = subprocess.run(exe + BASE + ["--strategy", GOOD, "--json"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(exe + ["simulate", "--model", "gpt3-175b", "--gpu", "no-such-gpu", "--num-gpus", "8",
                                "--strategy", "tp=8", "--json"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_framework_profile_changes_kernels_and_overlap(capsys):
    argv = ["simulate", "--engine", "analytic", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8",
            "--seq-len", "8192", "--strategy", "tp=1,mbs=1,gbs=8,zero=3,recompute=selective", "--json"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    default = json.loads(out)
    code, out, err = run(argv + ["--framework", "torchtitan"], capsys)
    assert code == 0, err
    titan = json.loads(out)
    assert default["attention"] == "flash" and titan["attention"] == "flash2"
    # eager element-wise ops, FlashAttention-2 on Hopper and op-level checkpointing cost time
    assert titan["step_time_s"] > default["step_time_s"]
    assert titan["hfu"] > titan["mfu"]


def test_ep_overlap_never_slower_and_hides_all_to_all(capsys):
    base = ["simulate", "--engine", "analytic", "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--num-gpus", "64",
            "--json", "--strategy"]
    code, out, err = run(base + ["tp=2,ep=8,mbs=1,gbs=64"], capsys)
    assert code == 0, err
    plain = json.loads(out)
    code, out, err = run(base + ["tp=2,ep=8,mbs=1,gbs=64,ep_overlap=1"], capsys)
    assert code == 0, err
    hidden = json.loads(out)
    assert "ep_overlap=1" in hidden["strategy"]
    assert hidden["step_time_s"] <= plain["step_time_s"]
    assert hidden["breakdown"]["exposed_ep_s"] < plain["breakdown"]["exposed_ep_s"]
