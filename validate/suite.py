"""What ``planner validate`` measures, and the measure -> fit -> compare loop.

The suite is a list of *jobs*, one per world size: the microbenchmarks and the workloads
that need the same number of ranks share one launch (one ``torchrun``), so a job pays the
start-up of its ranks once.  The quick suite fits a two-core CPU in about three minutes;
the full suite adds shapes, steps, pipeline schedules and a 3-D mesh.

Workloads: two GPT sizes, each under DDP, FSDP2, TP+SP and 1F1B pipelining on 2 ranks and
two 2-D meshes on 4 ranks (dp x tp with FSDP + TP, pp x dp with pipelining + FSDP); GPipe and
interleaved 1F1B on the small model; the full suite adds a 3-D pp x dp x tp mesh on 8 ranks.  The profile is
fitted on the microbenchmarks only; the workloads are the held-out test.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from validate.specs import MicrobenchConfig, ModelConfig, WorkloadSpec

SMALL = ModelConfig(name="gpt-s", num_layers=4, hidden_size=256, num_heads=4, ffn_hidden_size=1024,
                    vocab_size=4096, seq_len=256)
MEDIUM = ModelConfig(name="gpt-m", num_layers=4, hidden_size=512, num_heads=8, ffn_hidden_size=2048,
                     vocab_size=8192, seq_len=256)
GPU_SMALL = ModelConfig(name="gpt-1b", num_layers=8, hidden_size=2048, num_heads=16, ffn_hidden_size=8192,
                        vocab_size=32768, seq_len=2048)
GPU_MEDIUM = ModelConfig(name="gpt-2b", num_layers=8, hidden_size=3072, num_heads=24, ffn_hidden_size=12288,
                         vocab_size=32768, seq_len=2048)


@dataclass(frozen=True)
class Job:
    """One launch: ``nproc`` ranks run the microbenchmarks (if any) then the workloads."""

    nproc: int
    microbench: MicrobenchConfig | None = None
    workloads: tuple[WorkloadSpec, ...] = ()
    timeout_s: float = 600.0

    def to_json(self, *, threads: int | None = None) -> dict[str, Any]:
        tasks: list[dict[str, Any]] = []
        if self.microbench is not None:
            tasks.append({"type": "microbench", "config": self.microbench.as_dict()})
        tasks += [{"type": "workload", "spec": w.as_dict()} for w in self.workloads]
        return {"tasks": tasks, "timeout_s": self.timeout_s, "threads": threads}


@dataclass(frozen=True)
class Suite:
    name: str
    jobs: tuple[Job, ...] = field(default_factory=tuple)

    @property
    def workloads(self) -> list[WorkloadSpec]:
        return [w for j in self.jobs for w in j.workloads]


def _workloads_for(model: ModelConfig, *, mbs: int, steps: int, warmup: int, pipeline_extras: bool,
                   ranks: int) -> list[WorkloadSpec]:
    kw = dict(model=model, warmup_steps=warmup, steps=steps)
    tag = model.name
    if ranks == 2:
        out = [
            WorkloadSpec(name=f"{tag}-ddp", dp=2, mbs=mbs, **kw),
            WorkloadSpec(name=f"{tag}-fsdp", dp=2, dp_mode="fsdp", mbs=mbs, **kw),
            WorkloadSpec(name=f"{tag}-tp", tp=2, mbs=mbs, **kw),
            WorkloadSpec(name=f"{tag}-pp-1f1b", pp=2, mbs=max(1, mbs // 2), num_microbatches=4, **kw),
        ]
        if pipeline_extras:
            out += [
                WorkloadSpec(name=f"{tag}-pp-gpipe", pp=2, mbs=max(1, mbs // 2), num_microbatches=4,
                             schedule="gpipe", **kw),
                WorkloadSpec(name=f"{tag}-pp-interleaved", pp=2, vp=2, mbs=max(1, mbs // 2), num_microbatches=4,
                             schedule="interleaved", **kw),
            ]
        return out
    if ranks == 4:
        return [WorkloadSpec(name=f"{tag}-mesh-dp2-tp2", dp=2, tp=2, dp_mode="fsdp", mbs=mbs, **kw),
                WorkloadSpec(name=f"{tag}-mesh-pp2-dp2", pp=2, dp=2, dp_mode="fsdp", mbs=max(1, mbs // 2),
                             num_microbatches=4, **kw)]
    if ranks == 8:
        return [WorkloadSpec(name=f"{tag}-mesh-pp2-dp2-tp2", pp=2, dp=2, tp=2, dp_mode="fsdp",
                             mbs=max(1, mbs // 2), num_microbatches=4, **kw)]
    raise ValueError(f"no workloads for {ranks} ranks")


def build_suite(*, quick: bool, device_type: str = "cpu", gpus: int | None = None) -> Suite:
    """The quick or full suite for this kind of device (``gpus``: devices per node)."""
    if device_type == "cuda":
        models = (GPU_SMALL, GPU_MEDIUM)
        mbs = 2
        n = gpus or 8
        two = 2 if n >= 2 else 1
    else:
        models = (SMALL, MEDIUM)
        mbs = 2
        n = 4
        two = 2
    steps, warmup = (5, 2) if quick else (10, 3)
    mb = MicrobenchConfig.quick(device_type=device_type) if quick else MicrobenchConfig(
        dtype="bf16" if device_type == "cuda" else "fp32")
    jobs: list[Job] = []
    w2 = [w for i, m in enumerate(models)
          for w in _workloads_for(m, mbs=mbs, steps=steps, warmup=warmup, pipeline_extras=(i == 0 or not quick),
                                  ranks=two)]
    jobs.append(Job(nproc=two, microbench=mb, workloads=tuple(w2), timeout_s=600 if quick else 1800))
    if n >= 4:
        w4 = [w for m in models for w in _workloads_for(m, mbs=mbs, steps=steps, warmup=warmup,
                                                         pipeline_extras=False, ranks=4)]
        jobs.append(Job(nproc=4, workloads=tuple(w4), timeout_s=600 if quick else 1800))
    if not quick and (device_type == "cuda" and n >= 8 or device_type == "cpu"):
        w8 = [w for m in models[:1] for w in _workloads_for(m, mbs=mbs, steps=steps, warmup=warmup,
                                                             pipeline_extras=False, ranks=8)]
        jobs.append(Job(nproc=8, workloads=tuple(w8), timeout_s=1800))
    return Suite(name="quick" if quick else "full", jobs=tuple(jobs))


# ---------------------------------------------------------------------- running


Launcher = Callable[..., dict]


def run_suite(suite: Suite, out_dir: Path, *, launcher: str = "local", timeout_s: float | None = None,
              threads: int | None = None, slurm: dict[str, Any] | None = None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every job; return ``{"env", "microbench", "workloads", "jobs"}``.

    Raises ``validate.launch.RunError`` when a job fails (the message names the rank).
    """
    from validate import launch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    combined: dict[str, Any] = {"suite": suite.name, "env": None, "microbench": [], "workloads": [], "jobs": []}
    for i, job in enumerate(suite.jobs):
        jdir = out_dir / f"job{i}-n{job.nproc}"
        t0 = time.monotonic()
        limit = min(timeout_s, job.timeout_s) if timeout_s else job.timeout_s
        if progress:
            progress(f"job {i}: {job.nproc} ranks, {'microbenchmarks + ' if job.microbench else ''}"
                     f"{len(job.workloads)} workloads ({launcher})")
        payload = job.to_json(threads=threads)
        if launcher == "local":
            res = launch.run_local(payload, nproc=job.nproc, out_dir=jdir, timeout_s=limit)
        elif launcher == "slurm":
            opts = dict(slurm or {})
            nodes = int(opts.pop("nodes", 1) or 1)
            if job.nproc % nodes:
                raise ValueError(f"nodes={nodes} must divide the job's {job.nproc} ranks")
            res = launch.run_slurm(payload, nodes=nodes, nproc_per_node=job.nproc // nodes, out_dir=jdir,
                                   timeout_s=limit, **opts)
        else:
            raise ValueError(f"launcher={launcher!r}: must be local or slurm")
        if job.microbench is not None and combined["env"] is None:
            combined["env"] = res["env"]
        combined["microbench"] += res["microbench"]
        combined["workloads"] += res["workloads"]
        combined["jobs"].append({"dir": str(jdir), "nproc": job.nproc, "wall_s": time.monotonic() - t0})
    if combined["env"] is None and suite.jobs:
        combined["env"] = res["env"]
    (out_dir / "measurements.json").write_text(json.dumps(combined, indent=1), encoding="utf-8")
    return combined


def run_all(*, quick: bool, out_dir: Path, launcher: str = "local", timeout_s: float | None = None,
            profile_id: str | None = None, base_gpu: str | None = None, engine: str = "analytic",
            slurm: dict[str, Any] | None = None, progress: Callable[[str], None] | None = None,
            device_type: str | None = None) -> dict[str, Any]:
    """Measure, fit the profile from the microbenchmarks, compare on the workloads."""
    from sim.calibration import dump_profile
    from validate.compare import compare
    from validate.fit import fit_profile

    if device_type is None:
        device_type, gpus = local_device()
    else:
        gpus = None
    t0 = time.monotonic()
    suite = build_suite(quick=quick, device_type=device_type, gpus=gpus)
    meas = run_suite(suite, out_dir, launcher=launcher, timeout_s=timeout_s, slurm=slurm, progress=progress)
    t1 = time.monotonic()
    profile = fit_profile(meas["microbench"], meas["env"], profile_id=profile_id, base_gpu=base_gpu)
    path = dump_profile(profile, Path(out_dir) / "profile.yaml", header=profile_header(profile, suite.name))
    t2 = time.monotonic()
    result = compare(meas["workloads"], str(path), engine=engine)
    from validate.compare import contention_warnings

    result["warnings"] = contention_warnings(meas["workloads"], meas["microbench"])
    # the profile carries how well it predicted the held-out workloads (provenance)
    profile["validation"] = {
        "suite": suite.name, "engine": engine, "median_abs_error": result["median_abs_error"],
        "workloads": {r["name"]: {"strategy": r["strategy"], "measured_step_time_s": r["measured_step_time_s"],
                                  "predicted_step_time_s": r["predicted_step_time_s"], "error": r["error"]}
                      for r in result["workloads"]}}
    dump_profile(profile, path, header=profile_header(profile, suite.name))
    t3 = time.monotonic()
    result.update({
        "profile_path": str(path), "out_dir": str(out_dir), "suite": suite.name, "launcher": launcher,
        "fit": profile["fit"], "env": meas["env"],
        "timings_s": {"measure": t1 - t0, "fit": t2 - t1, "compare": t3 - t2, "total": t3 - t0,
                      "jobs": [j["wall_s"] for j in meas["jobs"]]},
    })
    (Path(out_dir) / "compare.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def profile_header(profile: dict[str, Any], suite: str) -> str:
    return (f"Calibration profile {profile['id']} (schema: sim/calibration.py, docs/validate.md).\n"
            f"Fitted from the {suite} microbenchmark suite only; {profile['source']}.\n"
            "Regenerate: planner validate all" + (" --quick" if suite == "quick" else "") + " --install")


def local_device() -> tuple[str, int | None]:
    """("cuda", GPUs) when torch sees GPUs here, else ("cpu", None)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - validate needs torch
        return "cpu", None
    if torch.cuda.is_available():
        return "cuda", torch.cuda.device_count()
    return "cpu", None
