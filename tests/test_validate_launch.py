"""Real torch.distributed runs on this machine (gloo): every parallelism trains correctly, a
failing, crashing or hanging rank surfaces as one clear error, and nothing is left running."""

import os
from pathlib import Path

import pytest
import yaml

# serial: microbenchmarks timed on this CPU and multi-rank torch.distributed jobs; `make test` runs these after the parallel phase (pyproject markers)
pytestmark = pytest.mark.serial

torch = pytest.importorskip("torch")

from validate.k8s import pytorchjob_manifest  # noqa: E402
from validate.launch import RunError, run_local  # noqa: E402
from validate.slurm import sbatch_script  # noqa: E402
from validate.model import ModelConfig  # noqa: E402
from validate.workloads import WorkloadSpec  # noqa: E402

TINY = ModelConfig(name="tiny", num_layers=4, hidden_size=64, num_heads=4, ffn_hidden_size=128, vocab_size=256,
                   seq_len=32)
KW = dict(model=TINY, warmup_steps=0, steps=2)


def _job(*specs, device="cpu"):
    return {"tasks": [{"type": "workload", "spec": s.as_dict()} for s in specs], "device": device}


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
        run_local({"tasks": [{"type": "hang", "rank": 0, "seconds": 600}]}, nproc=2, out_dir=out, timeout_s=8)
    assert "timed out after 8 s" in str(exc.value)
    assert _processes_mentioning(str(out)) == []


def test_sbatch_script_runs_torchrun_per_node(tmp_path):
    one = sbatch_script(tmp_path / "job.json", tmp_path, nodes=1, nproc_per_node=2, time_limit_s=90)
    assert "#SBATCH --nodes=1" in one and "#SBATCH --time=2" in one and "--standalone" in one
    assert "srun --kill-on-bad-exit=1" in one and "-m validate.worker" in one
    two = sbatch_script(tmp_path / "job.json", tmp_path, nodes=2, nproc_per_node=4, gpus_per_node=4,
                        partition="gpu")
    assert "--rdzv-backend c10d" in two and '--rdzv-endpoint "$head:$port"' in two
    assert "#SBATCH --partition=gpu" in two


def _srun_line(script: str) -> str:
    return next(ln for ln in script.splitlines() if ln.startswith("srun "))


def test_sbatch_requests_gpus_whole_nodes_and_the_task_cpus(tmp_path):
    """GPUs on the allocation and on the step, --exclusive (+ --mem=0) by default, and the CPUs
    of the one task per node passed to srun itself (srun does not inherit them since 22.05)."""
    gpu = sbatch_script(tmp_path / "job.json", tmp_path, nodes=2, nproc_per_node=8, gpus_per_node=8)
    heads = [ln for ln in gpu.splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --gres=gpu:8" in heads and "#SBATCH --exclusive" in heads and "#SBATCH --mem=0" in heads
    assert "#SBATCH --ntasks-per-node=1" in heads
    step = _srun_line(gpu)
    assert "--gres=gpu:8" in step and "--ntasks-per-node=1" in step and "--nodes=2" in step
    assert '--cpus-per-task=$SLURM_CPUS_ON_NODE' in step  # the exclusive node's CPUs
    assert "--nproc-per-node 8" in step
    shared = sbatch_script(tmp_path / "job.json", tmp_path, nodes=1, nproc_per_node=4, gpus_per_node=4,
                           exclusive=False)
    assert "--exclusive" not in shared and "#SBATCH --cpus-per-task=16" in shared  # 4 CPUs per GPU rank
    assert "--cpus-per-task=16" in _srun_line(shared) and "--gres=gpu:4" in _srun_line(shared)
    cpu = sbatch_script(tmp_path / "job.json", tmp_path, nodes=1, nproc_per_node=2, exclusive=False)
    assert "gres" not in cpu and "--cpus-per-task=2" in _srun_line(cpu)
    given = sbatch_script(tmp_path / "job.json", tmp_path, nodes=1, nproc_per_node=2, cpus_per_task=6)
    assert "#SBATCH --cpus-per-task=6" in given and "--cpus-per-task=6" in _srun_line(given)


def test_slurm_cuda_job_without_gpus_is_refused(tmp_path):
    from validate.slurm import run_slurm

    with pytest.raises(ValueError, match="gpus_per_node"):
        run_slurm({"tasks": [], "device": "cuda"}, nproc_per_node=2, out_dir=tmp_path, timeout_s=10)


def test_suite_passes_device_and_gpus_to_slurm(tmp_path, monkeypatch):
    """run_suite hands every job its device (in the job file) and, on cuda, its GPUs per node."""
    from validate import slurm
    from validate.suite import build_suite, run_suite

    calls = []

    def fake(payload, **kw):
        calls.append((payload, kw))
        return {"env": {"world_size": payload["world_size"]}, "microbench": [], "workloads": []}

    monkeypatch.setattr(slurm, "run_slurm", fake)
    suite = build_suite(quick=True, device_type="cuda", ranks_per_node=8, nodes=2)
    run_suite(suite, tmp_path, launcher="slurm", slurm={"partition": "gpu", "exclusive": True})
    assert [(c[1]["nodes"], c[1]["nproc_per_node"], c[1]["gpus_per_node"]) for c in calls] == [(2, 1, 1), (2, 8, 8)]
    assert all(c[0]["device"] == "cuda" and c[1]["exclusive"] and c[1]["partition"] == "gpu" for c in calls)
    assert [c[0]["world_size"] for c in calls] == [2, 16]
    assert any(t["type"] == "microbench" for t in calls[1][0]["tasks"])


def test_cli_slurm_needs_the_device_of_the_nodes(capsys):
    from planner.cli import main

    rc = main(["validate", "measure", "--quick", "--launcher", "slurm"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: device=auto")
    rc = main(["validate", "measure", "--quick", "--launcher", "slurm", "--device", "cuda"])
    err = capsys.readouterr().err
    assert rc == 2 and "gpus-per-node" in err
    rc = main(["validate", "all", "--quick", "--device", "cuda"])
    err = capsys.readouterr().err
    assert rc == 2 and "torch sees no GPU" in err and err.count("\n") == 1


def test_slurm_script_cli_writes_gpu_scripts(tmp_path, capsys):
    import json as _json

    from planner.cli import main

    rc = main(["validate", "slurm-script", "--quick", "--device", "cuda", "--gpus-per-node", "8",
               "--out", str(tmp_path)])
    assert rc == 0
    paths = capsys.readouterr().out.split()
    assert len(paths) == 3  # 2-, 4- and 8-GPU jobs
    last = open(paths[-1], encoding="utf-8").read()
    assert "#SBATCH --gres=gpu:8" in last and "--gres=gpu:8" in _srun_line(last)
    job = _json.loads(open(paths[-1].replace("job.sbatch", "job.json"), encoding="utf-8").read())
    assert job["device"] == "cuda" and job["world_size"] == 8
    assert job["tasks"][0]["type"] == "microbench" and job["tasks"][0]["config"]["dtype"] == "bf16"


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


def test_pytorchjob_requests_rdma_for_multi_node_gpu_jobs():
    """Multi-node GPU pods get the RDMA device plugin's resource and IPC_LOCK (else NCCL falls
    back to TCP); a single node asks for none; the resource name is the cluster's choice."""
    job = _job(WorkloadSpec(name="ddp", dp=2, **KW), device="cuda")

    def container(text):
        pj = list(yaml.safe_load_all(text))[1]
        return pj["spec"]["pytorchReplicaSpecs"]["Worker" if "Worker" in pj["spec"]["pytorchReplicaSpecs"]
                                                  else "Master"]["template"]["spec"]

    pod = container(pytorchjob_manifest(job, image="i", nodes=2, nproc_per_node=8, gpus_per_node=8))
    c = pod["containers"][0]
    assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == 1
    assert c["resources"]["requests"]["rdma/rdma_shared_device_a"] == 1
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    assert {"name": "NCCL_IB_DISABLE", "value": "0"} in c["env"]
    assert "hostNetwork" not in pod
    pod = container(pytorchjob_manifest(job, image="i", nodes=2, nproc_per_node=8, gpus_per_node=8,
                                        rdma_resource="nvidia.com/rdma=2", host_network=True))
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/rdma"] == 2 and pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    one = container(pytorchjob_manifest(job, image="i", nodes=1, nproc_per_node=8, gpus_per_node=8))
    assert not any("rdma" in k for k in one["containers"][0]["resources"]["limits"])
    off = container(pytorchjob_manifest(job, image="i", nodes=2, nproc_per_node=8, gpus_per_node=8,
                                        rdma_resource="none"))
    assert "securityContext" not in off["containers"][0]


def test_k8s_cli_bad_rdma_resource_is_one_line(capsys):
    from planner.cli import main

    rc = main(["validate", "k8s", "--image", "i", "--device", "cuda", "--gpus-per-node", "8", "--nodes", "2",
               "--rdma-resource", "bogus"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "rdma-resource" in err


def test_collective_layouts_on_two_nodes():
    """Group layouts of a 2-node x 2-rank job and the tier each crosses (no processes needed)."""
    from validate.fit_links import collective_groups
    from validate.layouts import group_layouts, pp_pairs, tier

    layouts = dict(group_layouts(4, 2))
    assert layouts["world"] == [[0, 1, 2, 3]]
    assert layouts["node"] == [[0, 1], [2, 3]] and layouts["cross"] == [[0, 2], [1, 3]]
    assert [tier(g[0], 2) for g in layouts.values()] == ["inter", "intra", "inter"]
    assert dict(pp_pairs(4, 2)) == {"pp": [(0, 1), (2, 3)], "pp_cross": [(0, 2), (1, 3)]}
    rec = {"ranks": [0, 2], "group_size": 2, "num_groups": 2, "layout": "dp"}
    assert collective_groups(rec) == [[0, 2], [1, 3]]


def test_collective_layouts_on_every_gpu_of_a_node():
    """Eight GPUs: TP-like blocks of 2 and 4, DP-like strided groups, PP pairs, all inside the node."""
    from validate.layouts import group_layouts, pp_pairs, tier

    layouts = dict(group_layouts(8, 8))
    assert set(layouts) == {"world", "tp2", "tp4", "dp2", "dp4"}
    assert layouts["tp4"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layouts["dp2"] == [[0, 4], [1, 5], [2, 6], [3, 7]] and layouts["dp4"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert all(tier(g, 8) == "intra" for gs in layouts.values() for g in gs)
    assert dict(pp_pairs(8, 8))["pp"] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    one_per_node = dict(group_layouts(2, 1))
    assert one_per_node == {"world": [[0, 1]]} and tier([0, 1], 1) == "inter"
    assert dict(pp_pairs(2, 1)) == {"pp_cross": [(0, 1)]}
    assert group_layouts(1, 1) == [] and pp_pairs(1, 1) == []


def test_a_rank_asked_for_cuda_without_a_gpu_fails_in_one_line(tmp_path):
    """The device travels in the job file and the worker asserts it: no silent CPU fallback."""
    with pytest.raises(RunError) as exc:
        run_local(_job(WorkloadSpec(name="single", **KW), device="cuda"), nproc=1, out_dir=tmp_path / "cuda",
                  timeout_s=120)
    msg = str(exc.value)
    assert "rank 0 failed: DeviceError: asked for device cuda" in msg and "sees no GPU" in msg and "\n" not in msg


def test_the_one_rank_suite_runs_and_fits(tmp_path):
    """One rank (a one-GPU host's shape, on this CPU): microbenchmarks without collectives,
    single-rank training with and without accumulation, a profile with no link and the host
    memory rate but no host-device copy, predictions."""
    from validate.specs import MicrobenchConfig
    from validate.suite import Job, Suite, run_all

    mb = MicrobenchConfig(matmul_shapes=((128, 128, 128), (256, 256, 256), (64, 512, 512)), matmul_dtypes=("fp32",),
                          attention_shapes=((1, 2, 128, 32),), memory_numel=(1 << 18, 1 << 20),
                          message_bytes=(4096,), min_time_s=0.03, comm_min_time_s=0.01,
                          host_memory_bytes=(1 << 28,), host_min_time_s=0.01)
    work = (WorkloadSpec(name="single", mbs=2, **KW), WorkloadSpec(name="accum", mbs=1, num_microbatches=2, **KW))
    suite = Suite(name="quick", jobs=(Job(1, microbench=mb, workloads=work, timeout_s=240),), device_type="cpu")
    out = run_all(quick=True, out_dir=tmp_path, suite=suite)
    assert [r["name"] for r in out["workloads"]] == ["single", "accum"]
    assert all(r["kind"] == "single" and r["predicted_step_time_s"] > 0 for r in out["workloads"])
    assert out["fit"]["links"] == {"intra": None, "inter": None}
    prof = yaml.safe_load(open(out["profile_path"], encoding="utf-8"))
    assert prof["links"] == [] and prof["host"]["ranks_per_host"] == 1 and prof["host"]["torch"] == torch.__version__
    # the host memory rate is measured and written; no copy is (no CUDA here): absent, not 0
    assert prof["host"]["host_mem_bytes_per_s"] > 0.5e9
    assert not [k for k in prof["host"] if k.startswith(("h2d_", "d2h_"))]


def test_suites_for_every_machine_shape():
    """One GPU (once ValueError: no workloads for 1 ranks), one node of eight, one rank per node,
    several full nodes; the microbenchmarks always in the job spanning every rank."""
    from validate.suite import build_suite

    def shape(**kw):
        s = build_suite(quick=True, **kw)
        return [(j.nodes, j.nproc_per_node, j.microbench is not None) for j in s.jobs], s

    jobs, s = shape(device_type="cuda", ranks_per_node=1)
    assert jobs == [(1, 1, True)] and {w.kind for w in s.workloads} == {"single"}
    assert any(w.num_microbatches > 1 for w in s.workloads)
    jobs, s = shape(device_type="cuda", ranks_per_node=8)
    assert jobs == [(1, 2, False), (1, 4, False), (1, 8, True)]
    assert s.jobs[-1].microbench.dtype == "bf16"
    jobs, s = shape(device_type="cuda", ranks_per_node=1, nodes=2)
    assert jobs == [(2, 1, True)] and {w.kind for w in s.workloads} == {"ddp", "fsdp", "tp", "pp"}
    jobs, s = shape(device_type="cuda", ranks_per_node=8, nodes=2)
    assert jobs == [(2, 1, False), (2, 8, True)] and all(w.world_size == 16 for w in s.jobs[1].workloads)
    jobs, _ = shape()  # this CPU: unchanged, microbenchmarks with the two ranks on the two cores
    assert jobs == [(1, 2, True), (1, 4, False)]
    jobs, _ = shape(ranks_per_node=1)
    assert jobs == [(1, 1, True)]
