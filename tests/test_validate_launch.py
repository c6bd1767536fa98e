"""Real torch.distributed runs on this machine (gloo): every parallelism trains correctly, a
failing, crashing or hanging rank surfaces as one clear error, and nothing is left running."""

import os
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")

from validate.launch import RunError, pytorchjob_manifest, run_local, sbatch_script  # noqa: E402
from validate.model import ModelConfig  # noqa: E402
from validate.workloads import WorkloadSpec  # noqa: E402

TINY = ModelConfig(name="tiny", num_layers=4, hidden_size=64, num_heads=4, ffn_hidden_size=128, vocab_size=256,
                   seq_len=32)
KW = dict(model=TINY, warmup_steps=0, steps=2)


def _job(*specs):
    return {"tasks": [{"type": "workload", "spec": s.as_dict()} for s in specs]}


def _processes_mentioning(text: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(int(pid))
    return out


def test_every_parallelism_computes_the_same_loss(tmp_path):
    """Same weights, same data: single rank, TP+SP, GPipe, 1F1B, interleaved 1F1B, DDP, FSDP2,
    a 2x2 (dp x tp) and a 2x2x2 (pp x dp x tp) mesh give the same first-step loss."""
    mb = dict(mbs=1, num_microbatches=2)
    two = [WorkloadSpec(name="ddp", dp=2, mbs=2, **KW), WorkloadSpec(name="fsdp", dp=2, dp_mode="fsdp", mbs=2, **KW),
           WorkloadSpec(name="tp", tp=2, mbs=2, **KW),
           WorkloadSpec(name="gpipe", pp=2, schedule="gpipe", **mb, **KW),
           WorkloadSpec(name="1f1b", pp=2, **mb, **KW),
           WorkloadSpec(name="interleaved", pp=2, vp=2, schedule="interleaved", **mb, **KW)]
    res = run_local(_job(*two), nproc=2, out_dir=tmp_path / "two", timeout_s=240)
    four = run_local(_job(WorkloadSpec(name="mesh2d", dp=2, tp=2, dp_mode="fsdp", mbs=2, **KW)), nproc=4,
                     out_dir=tmp_path / "four", timeout_s=240)
    eight = run_local(_job(WorkloadSpec(name="mesh3d", pp=2, dp=2, tp=2, dp_mode="fsdp", **mb, **KW)), nproc=8,
                      out_dir=tmp_path / "eight", timeout_s=300)
    rows = res["workloads"] + four["workloads"] + eight["workloads"]
    assert [w["name"] for w in rows] == [s.name for s in two] + ["mesh2d", "mesh3d"]
    first = rows[0]["loss_first"]
    for w in rows:
        assert w["loss_first"] == pytest.approx(first, rel=1e-5), w["name"]
        assert w["measured_step_time_s"] > 0 and len(w["step_times_s"]) == 2
        assert w["tokens_per_s"] > 0 and w["measured_memory_peak_bytes"] >= 0
        assert w["env"]["backend"] == "gloo"
    kinds = {w["name"]: w["kind"] for w in rows}
    assert kinds == {"ddp": "ddp", "fsdp": "fsdp", "tp": "tp", "gpipe": "pp", "1f1b": "pp", "interleaved": "pp",
                     "mesh2d": "mesh", "mesh3d": "mesh"}
    assert "schedule=interleaved" in rows[5]["strategy"] and "vp=2" in rows[5]["strategy"]


@pytest.mark.parametrize("task,expect", [
    ({"type": "fail", "rank": 1, "message": "boom on purpose"}, "rank 1 failed: RuntimeError: boom on purpose"),
    ({"type": "crash", "rank": 1}, "rank 1 failed: crash"),
])
def test_a_failing_rank_is_one_clear_error_and_no_orphans(tmp_path, task, expect):
    out = tmp_path / "run"
    with pytest.raises(RunError) as exc:
        run_local({"tasks": [task]}, nproc=2, out_dir=out, timeout_s=120)
    msg = str(exc.value)
    assert expect in msg and "\n" not in msg
    assert _processes_mentioning(str(out)) == []


def test_timeout_kills_every_rank(tmp_path):
    out = tmp_path / "hang"
    with pytest.raises(RunError) as exc:
        run_local({"tasks": [{"type": "hang", "rank": 0, "seconds": 600}]}, nproc=2, out_dir=out, timeout_s=15)
    assert "timed out after 15 s" in str(exc.value)
    assert _processes_mentioning(str(out)) == []


def test_sbatch_script_runs_torchrun_per_node(tmp_path):
    one = sbatch_script(tmp_path / "job.json", tmp_path, nodes=1, nproc_per_node=2, time_limit_s=90)
    assert "#SBATCH --nodes=1" in one and "#SBATCH --time=2" in one and "--standalone" in one
    assert "srun --kill-on-bad-exit=1" in one and "-m validate.worker" in one
    two = sbatch_script(tmp_path / "job.json", tmp_path, nodes=2, nproc_per_node=4, gpus_per_node=4,
                        partition="gpu")
    assert "--rdzv-backend c10d" in two and '--rdzv-endpoint "$head:$port"' in two
    assert "#SBATCH --gpus-per-node=4" in two and "#SBATCH --partition=gpu" in two


def test_pytorchjob_manifest():
    job = _job(WorkloadSpec(name="ddp", dp=2, **KW))
    docs = list(yaml.safe_load_all(pytorchjob_manifest(job, image="repo/planner:1", nodes=2, nproc_per_node=4,
                                                       gpus_per_node=4)))
    cm, pj = docs
    assert cm["kind"] == "ConfigMap" and "job.json" in cm["data"]
    assert pj["apiVersion"] == "kubeflow.org/v1" and pj["kind"] == "PyTorchJob"
    spec = pj["spec"]
    assert spec["nprocPerNode"] == "4"
    assert spec["pytorchReplicaSpecs"]["Master"]["replicas"] == 1
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    c = spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert c["image"] == "repo/planner:1" and c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert "validate.worker" in c["command"][-1]


def test_collective_layouts_on_two_nodes():
    """Group layouts of a 2-node x 2-rank job and the tier each crosses (no processes needed)."""
    from validate.fit import collective_groups
    from validate.microbench import _pp_pairs, _tier, group_layouts
    from validate.runtime import Env

    env = Env(rank=0, world_size=4, local_rank=0, local_world_size=2, backend="gloo",
              device=torch.device("cpu"), threads=1)
    layouts = dict(group_layouts(env))
    assert layouts["world"] == [[0, 1, 2, 3]]
    assert layouts["tp"] == [[0, 1], [2, 3]] and layouts["dp"] == [[0, 2], [1, 3]]
    assert layouts["node"] == [[0, 1], [2, 3]] and layouts["cross"] == [[0, 2], [1, 3]]
    assert [_tier(env, g[0]) for g in layouts.values()] == ["inter", "intra", "inter", "intra", "inter"]
    assert dict(_pp_pairs(env))["pp_cross"] == [(0, 2), (1, 3)]
    rec = {"ranks": [0, 2], "group_size": 2, "num_groups": 2, "layout": "dp"}
    assert collective_groups(rec) == [[0, 2], [1, 3]]
