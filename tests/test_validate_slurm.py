"""validate's sbatch path against a real one-node Slurm (slurm-wlm + munge on loopback).

The fixture starts the cluster with scripts/slurm_local.sh (root, Debian packages installed by
scripts/setup_test_env.sh); the tests submit real jobs with sbatch and collect their results.
Skipped, with the reason, only when Slurm or munge cannot be installed or started here.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# serial: one local Slurm controller and node shared by its jobs; `make test` runs these after the parallel phase (pyproject markers)
pytestmark = pytest.mark.serial

pytest.importorskip("torch")

from validate.launch import RunError  # noqa: E402
from validate.slurm import run_slurm  # noqa: E402
from validate.model import ModelConfig  # noqa: E402
from validate.workloads import WorkloadSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = ModelConfig(name="tiny", num_layers=2, hidden_size=64, num_heads=2, ffn_hidden_size=128, vocab_size=256,
                   seq_len=32)


@pytest.fixture(scope="module")
def slurm():
    missing = [b for b in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(b) is None
               and not Path("/usr/sbin", b).exists()]
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)} missing; scripts/setup_test_env.sh installs "
                    "slurm-wlm and munge as root)")
    if os.geteuid() != 0:
        pytest.skip("a local Slurm needs root to start slurmd")
    env = dict(os.environ)
    was_up = subprocess.run([str(ROOT / "scripts/slurm_local.sh"), "status"], env=env, capture_output=True)
    start = subprocess.run([str(ROOT / "scripts/slurm_local.sh"), "start"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert start.returncode == 0, f"could not start Slurm: {start.stderr.strip()}"
    conf = start.stdout.strip().split("=", 1)[1]
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    if was_up.returncode != 0:
        subprocess.run([str(ROOT / "scripts/slurm_local.sh"), "stop"], env=env, capture_output=True, timeout=60)


def test_sbatch_job_runs_and_results_come_back(slurm, tmp_path):
    out = Path(tmp_path, "ok")  # results travel through the (shared) filesystem
    job = {"tasks": [{"type": "microbench", "config": {
              "matmul_shapes": [[64, 64, 64], [128, 128, 128]], "matmul_dtypes": ["fp32"],
              "attention_shapes": [[1, 2, 64, 32]], "memory_numel": [1 << 16],
              "message_bytes": [4096, 65536], "collective_ops": ["all_reduce", "send_recv"],
              "min_time_s": 0.01, "comm_min_time_s": 0.01}},
        {"type": "workload", "spec": WorkloadSpec(name="ddp", model=TINY, dp=2, warmup_steps=1, steps=2).as_dict()}]}
    res = run_slurm(job, nproc_per_node=2, out_dir=out, timeout_s=180)
    assert res["env"]["world_size"] == 2 and res["env"]["backend"] == "gloo"
    assert res["workloads"][0]["name"] == "ddp" and res["workloads"][0]["measured_step_time_s"] > 0
    assert {r["kind"] for r in res["microbench"]} >= {"matmul", "collective", "memory", "attention"}
    script = (out / "job.sbatch").read_text()
    assert script.startswith("#!/bin/bash") and "srun" in script
    assert list(out.glob("slurm-*.out"))


def test_sbatch_job_failure_names_the_rank(slurm, tmp_path):
    with pytest.raises(RunError) as exc:
        run_slurm({"tasks": [{"type": "fail", "rank": 1, "message": "slurm boom"}]}, nproc_per_node=2,
                  out_dir=tmp_path / "fail", timeout_s=180)
    msg = str(exc.value)
    assert "FAILED" in msg and "rank 1 failed: RuntimeError: slurm boom" in msg


def test_exclusive_job_hands_the_task_the_node_cpus(slurm, tmp_path):
    """--exclusive (the default) with --mem=0; srun gets --cpus-per-task=$SLURM_CPUS_ON_NODE, so
    the node's torchrun and its two ranks may use every core (the ranks see them)."""
    out = tmp_path / "excl"
    job = {"device": "cpu", "world_size": 2, "tasks": [
        {"type": "workload", "spec": WorkloadSpec(name="ddp", model=TINY, dp=2, warmup_steps=0, steps=1).as_dict()}]}
    res = run_slurm(job, nproc_per_node=2, out_dir=out, timeout_s=180)
    script = (out / "job.sbatch").read_text()
    assert "#SBATCH --exclusive" in script and "--cpus-per-task=$SLURM_CPUS_ON_NODE" in script
    assert res["env"]["host_cores"] == os.cpu_count()  # the task's CPU set is the whole node
    assert res["workloads"][0]["env"]["threads_per_rank"] == max(1, os.cpu_count() // 2)


def test_a_cuda_job_on_a_node_without_gpus_fails_naming_the_device(slurm, tmp_path, monkeypatch):
    """The device reaches the ranks through the job file: asked for cuda on this CPU node, rank 0
    says so in one line instead of measuring its CPU with gloo.  (This loopback node has no GPU
    gres, so the script's GPU request is dropped here; test_validate_launch checks it is written.)"""
    from validate import slurm as slurm_mod
    from validate.suite import Job

    real = slurm_mod.sbatch_script

    def without_gres(*a, **kw):
        text = real(*a, **kw)
        assert "--gres=gpu:1" in text
        return "\n".join(ln.replace(" --gres=gpu:1", "") for ln in text.splitlines()
                         if ln != "#SBATCH --gres=gpu:1") + "\n"

    monkeypatch.setattr(slurm_mod, "sbatch_script", without_gres)
    job = Job(1, workloads=(WorkloadSpec(name="single", model=TINY, warmup_steps=0, steps=1),)).to_json(device="cuda")
    with pytest.raises(RunError) as exc:
        slurm_mod.run_slurm(job, nproc_per_node=1, out_dir=tmp_path / "cuda", timeout_s=180, gpus_per_node=1)
    msg = str(exc.value)
    assert "rank 0 failed: DeviceError: asked for device cuda" in msg and "\n" not in msg
