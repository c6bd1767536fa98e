"""validate.rankenv: a rank's place from torchrun's or Slurm's variables, the rendezvous host
from the step's node list, and the device when Slurm binds one GPU per task (no torch needed
except for pick_device)."""

import pytest

# serial: torch.distributed ranks that meet on fixed ports; `make test` runs these after the parallel phase (pyproject markers)
pytestmark = pytest.mark.serial

from validate.rankenv import (DeviceError, device_index, expand_nodelist, from_environ, hostnames, slurm_port,
                              tasks_on_node)


def test_torchrun_variables_win():
    env = {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "n1",
           "MASTER_PORT": "29400", "SLURM_PROCID": "0"}
    r = from_environ(env)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.master_addr, r.master_port, r.source) == \
        (5, 16, 5, 8, "n1", 29400, "torchrun")


def test_srun_started_ranks_get_a_rendezvous_address_and_port():
    """srun --ntasks-per-node=4 on gpu[07-08]: rank 6 is local rank 2 on the second node; every
    task computes the same MASTER_ADDR (the first host) and MASTER_PORT (from the job/step ids)."""
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NODEID": "1",
           "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "1234",
           "SLURM_STEP_ID": "0"}
    r = from_environ(env, resolve=expand_nodelist)
    assert (r.rank, r.world_size, r.local_rank, r.local_world_size, r.source) == (6, 8, 2, 4, "slurm")
    assert r.master_addr == "gpu07"
    assert r.master_port == slurm_port(env) == from_environ({**env, "SLURM_PROCID": "0"}, resolve=expand_nodelist).master_port
    out: dict[str, str] = {}
    r.export(out)
    assert out == {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4",
                   "MASTER_ADDR": "gpu07", "MASTER_PORT": str(r.master_port)}
    kept = {"MASTER_ADDR": "given"}
    r.export(kept)
    assert kept["MASTER_ADDR"] == "given"  # existing variables win


def test_uneven_tasks_per_node():
    assert tasks_on_node("4(x2),3", 2) == 3 and tasks_on_node("2", 0) == 2
    with pytest.raises(ValueError):
        tasks_on_node("4(x2)", 5)


def test_nodelist_expansion():
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_nodelist("a1,b2") == ["a1", "b2"]
    assert expand_nodelist("rack[8-10]-n") == ["rack8-n", "rack9-n", "rack10-n"]


def test_hostnames_falls_back_without_scontrol(monkeypatch):
    import subprocess

    def boom(*a, **k):
        raise FileNotFoundError("scontrol")

    monkeypatch.setattr(subprocess, "run", boom)
    assert hostnames("n[1-2]") == ["n1", "n2"]


def test_one_gpu_per_task_uses_device_zero():
    """srun --gpus-per-task=1 leaves each task one visible GPU: local rank 3 drives cuda:0."""
    assert device_index(3, 1) == 0
    assert device_index(3, 8) == 3
    with pytest.raises(DeviceError, match="only 4 GPUs"):
        device_index(5, 4)


def test_pick_device_refuses_a_silent_cpu_fallback(monkeypatch):
    torch = pytest.importorskip("torch")
    from validate.rankenv import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="asked for device cuda"):
        pick_device("cuda", 0)
    assert pick_device(None, 0).type == "cpu" and pick_device("cpu", 3).type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick_device("cuda", 5) == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert pick_device(None, 5) == torch.device("cuda", 5)
    assert pick_device("cpu", 5).type == "cpu"  # asked for cpu on a GPU host: cpu
    with pytest.raises(DeviceError):
        pick_device("tpu", 0)


def test_ranks_started_by_srun_without_torchrun_join_the_job(tmp_path):
    """Two ranks with only Slurm's variables (as `srun --ntasks=2 python -m validate.worker`
    starts them): they find each other through the derived MASTER_ADDR/MASTER_PORT and train."""
    pytest.importorskip("torch")
    import json
    import os
    import random
    import subprocess
    import sys

    from validate.launch import REPO_ROOT, worker_env
    from validate.specs import ModelConfig, WorkloadSpec

    tiny = ModelConfig(name="tiny", num_layers=2, hidden_size=32, num_heads=2, ffn_hidden_size=64, vocab_size=64,
                       seq_len=16)
    job = {"device": "cpu", "world_size": 2, "timeout_s": 60,
           "tasks": [{"type": "workload", "spec": WorkloadSpec(name="ddp", model=tiny, dp=2, warmup_steps=0,
                                                               steps=1).as_dict()}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job), encoding="utf-8")
    base = {k: v for k, v in worker_env(1).items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                                "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    base.update({"SLURM_NTASKS": "2", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2",
                 "SLURM_STEP_NODELIST": "localhost", "SLURM_JOB_ID": str(random.randint(1, 10**6)),
                 "SLURM_STEP_ID": "0", "PATH": os.environ.get("PATH", "")})
    procs = [subprocess.Popen([sys.executable, "-m", "validate.worker", str(path), str(tmp_path)],
                              env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}, cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    res = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert res["env"]["rank_source"] == "slurm" and res["env"]["world_size"] == 2
    assert res["workloads"][0]["measured_step_time_s"] > 0
