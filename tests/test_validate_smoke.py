"""scripts/gpu_smoke.py on this CPU machine: without CUDA it exits 2 with one line; its CPU
rehearsal runs the same measure -> check -> fit -> compare path end to end with gloo; its
suites cover what the issue lists; its checks catch a job that quietly ran gloo."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

# serial: microbenchmarks timed on this CPU; `make test` runs these after the parallel phase (pyproject markers)
pytestmark = pytest.mark.serial

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_smoke.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_without_cuda_it_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: gpu_smoke: no CUDA device")


def test_the_eight_gpu_suite_covers_every_parallelism_and_the_one_gpu_suite_one_rank():
    smoke = _module()
    eight = smoke.smoke_suite(8)
    assert [j.nproc for j in eight.jobs] == [2, 4, 8]
    assert [j.microbench is not None for j in eight.jobs] == [False, False, True]
    specs = [w for j in eight.jobs for w in j.workloads]
    assert {w.kind for w in specs} == {"ddp", "fsdp", "tp", "pp", "mesh"}
    assert {w.schedule for w in specs if w.pp > 1} == {"gpipe", "1f1b", "interleaved"}
    assert any(w.pp > 1 and w.dp > 1 and w.tp > 1 for w in specs)
    mb = eight.jobs[-1].microbench
    assert mb.dtype == "bf16" and min(min(s) for s in mb.matmul_shapes) >= 256
    one = smoke.smoke_suite(1)
    assert [j.nproc for j in one.jobs] == [1] and one.jobs[0].microbench is not None
    assert {w.kind for w in one.jobs[0].workloads} == {"single"}
    assert [j.nproc for j in smoke.smoke_suite(4).jobs] == [2, 4]


def test_checks_catch_a_gloo_run_and_missing_layouts():
    smoke = _module()
    suite = smoke.smoke_suite(2)
    w = [{"name": s.name, "world_size": 2, "measured_step_time_s": 0.1,
          "env": {"backend": "nccl", "device_type": "cuda"}} for s in suite.jobs[0].workloads]
    recs = [{"kind": "overhead", "op": "queued_add"}, {"kind": "overhead", "op": "eager_add"},
            {"kind": "matmul"}, {"kind": "attention"}, {"kind": "memory"},
            {"kind": "host_memory", "op": "copy"}, {"kind": "host_memory", "op": "triad"}]
    recs += [{"kind": "host_copy", "direction": d, "pinned": p, "measured": True, "bytes": n}
             for d in ("h2d", "d2h") for p in (True, False) for n in (1 << 20, 1 << 22)]
    recs += [{"kind": "collective", "layout": "world"}, {"kind": "collective", "layout": "pp"}]
    good = {"env": {"backend": "nccl", "device_type": "cuda", "world_size": 2}, "workloads": w, "microbench": recs}
    smoke.check_measurements(suite, good, backend="nccl", device_type="cuda")
    no_pageable_d2h = [r for r in recs if not (r["kind"] == "host_copy" and r["direction"] == "d2h" and not r["pinned"])]
    with pytest.raises(smoke.SmokeError, match="host copy d2h pageable measured at 0 size"):
        smoke.check_measurements(suite, {**good, "microbench": no_pageable_d2h}, backend="nccl", device_type="cuda")
    with pytest.raises(smoke.SmokeError, match="backend='gloo'"):
        smoke.check_measurements(suite, {**good, "env": {**good["env"], "backend": "gloo"}},
                                 backend="nccl", device_type="cuda")
    bad_w = [dict(w[0], env={"backend": "gloo", "device_type": "cpu"})] + w[1:]
    with pytest.raises(smoke.SmokeError, match="ran gloo on cpu"):
        smoke.check_measurements(suite, {**good, "workloads": bad_w}, backend="nccl", device_type="cuda")
    with pytest.raises(smoke.SmokeError, match="layouts not measured: pp"):
        smoke.check_measurements(suite, {**good, "microbench": recs[:-1]}, backend="nccl", device_type="cuda")
    with pytest.raises(smoke.SmokeError, match="queued_add"):
        smoke.check_measurements(suite, {**good, "microbench": recs[2:]}, backend="nccl", device_type="cuda")


@pytest.mark.timeout(300)
def test_cpu_rehearsal_runs_the_whole_path(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu-rehearsal", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "passed: 2 workloads on 1 cpu rank(s)" in proc.stdout
    assert "tiny-single-accum" in proc.stdout and "software: torch" in proc.stdout
    assert (tmp_path / "profile.yaml").exists() and (tmp_path / "measurements.json").exists()
