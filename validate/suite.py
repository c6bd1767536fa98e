"""What ``planner validate`` measures, and the measure -> fit -> compare loop.

A suite is a list of *jobs*, one launch each (one ``torchrun`` per node), built for the
machine it runs on: the device (``cpu`` or ``cuda``), the ranks per node (GPUs per node on
``cuda``) and the nodes.  The microbenchmarks run in the job that spans every rank of every
node (on a GPU node: every GPU, so collectives are measured on the node's real TP/DP/PP-like
layouts and, across nodes, on the NICs); the workloads are the held-out test.

* one node, one rank (a one-GPU host, or ``--ranks-per-node 1``): one job with the
  microbenchmarks (compute only) and single-rank training (plain, and with gradient
  accumulation);
* one node, several ranks: jobs of 2, 4 and 8 ranks (up to the node's): DDP, FSDP2, TP+SP,
  1F1B on two ranks (GPipe and interleaved 1F1B on the small model), 2-D meshes (dp x tp with
  FSDP + TP, pp x dp) on four, the 3-D pp x dp x tp mesh on eight.  On a CPU the four-rank
  job (and the eight-rank one in the full suite) time-share the measured cores, and train
  the small model only where they exceed the host's ranks (the quick suite's four, the full
  suite's eight);
* several nodes, one rank each (the one-rank-per-node suite): one job, microbenchmarks across
  nodes (the inter-node link alone) and the workloads of that many ranks;
* several nodes with several ranks each: a one-rank-per-node job, then a full job with the
  microbenchmarks (both tiers) and the workloads of every rank.

The quick suite fits a two-core CPU in about three minutes; the full suite adds shapes and
steps.  The profile is fitted on the microbenchmarks only.
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
    """One launch: ``nodes`` x ``nproc_per_node`` ranks run the microbenchmarks (if any),
    then the workloads."""

    nproc_per_node: int
    nodes: int = 1
    microbench: MicrobenchConfig | None = None
    workloads: tuple[WorkloadSpec, ...] = ()
    timeout_s: float = 600.0

    @property
    def nproc(self) -> int:
        return self.nodes * self.nproc_per_node

    def to_json(self, *, device: str | None = None, threads: int | None = None) -> dict[str, Any]:
        """The job file the ranks read (``validate.worker``): the device they must use and the
        world size they must find are checked there."""
        tasks: list[dict[str, Any]] = []
        if self.microbench is not None:
            tasks.append({"type": "microbench", "config": self.microbench.as_dict()})
        tasks += [{"type": "workload", "spec": w.as_dict()} for w in self.workloads]
        return {"tasks": tasks, "timeout_s": self.timeout_s, "threads": threads, "device": device,
                "world_size": self.nproc}


@dataclass(frozen=True)
class Suite:
    name: str
    jobs: tuple[Job, ...] = field(default_factory=tuple)
    device_type: str = "cpu"

    @property
    def workloads(self) -> list[WorkloadSpec]:
        return [w for j in self.jobs for w in j.workloads]


def _workloads_for(model: ModelConfig, *, mbs: int, steps: int, warmup: int, pipeline_extras: bool,
                   ranks: int, ranks_per_node: int = 1) -> list[WorkloadSpec]:
    kw = dict(model=model, warmup_steps=warmup, steps=steps)
    tag = model.name
    half = max(1, mbs // 2)
    if ranks == 1:
        return [WorkloadSpec(name=f"{tag}-single", mbs=mbs, **kw),
                WorkloadSpec(name=f"{tag}-single-accum", mbs=half, num_microbatches=2, **kw)]
    if ranks == 2:
        out = [
            WorkloadSpec(name=f"{tag}-ddp", dp=2, mbs=mbs, **kw),
            WorkloadSpec(name=f"{tag}-fsdp", dp=2, dp_mode="fsdp", mbs=mbs, **kw),
            WorkloadSpec(name=f"{tag}-tp", tp=2, mbs=mbs, **kw),
            WorkloadSpec(name=f"{tag}-pp-1f1b", pp=2, mbs=half, num_microbatches=4, **kw),
        ]
        if pipeline_extras:
            out += [
                WorkloadSpec(name=f"{tag}-pp-gpipe", pp=2, mbs=half, num_microbatches=4, schedule="gpipe", **kw),
                WorkloadSpec(name=f"{tag}-pp-interleaved", pp=2, vp=2, mbs=half, num_microbatches=4,
                             schedule="interleaved", **kw),
            ]
        return out
    if ranks == 4:
        return [WorkloadSpec(name=f"{tag}-mesh-dp2-tp2", dp=2, tp=2, dp_mode="fsdp", mbs=mbs, **kw),
                WorkloadSpec(name=f"{tag}-mesh-pp2-dp2", pp=2, dp=2, dp_mode="fsdp", mbs=half,
                             num_microbatches=4, **kw)]
    if ranks == 8:
        return [WorkloadSpec(name=f"{tag}-mesh-pp2-dp2-tp2", pp=2, dp=2, tp=2, dp_mode="fsdp",
                             mbs=half, num_microbatches=4, **kw)]
    out = [WorkloadSpec(name=f"{tag}-fsdp{ranks}", dp=ranks, dp_mode="fsdp", mbs=mbs, **kw)]
    tp = ranks_per_node
    if 1 < tp < ranks and ranks % tp == 0 and not (model.num_heads % tp or model.ffn_hidden_size % tp
                                                   or model.seq_len % tp):
        out.append(WorkloadSpec(name=f"{tag}-mesh-dp{ranks // tp}-tp{tp}", dp=ranks // tp, tp=tp, dp_mode="fsdp",
                                mbs=mbs, **kw))
    return out


def build_suite(*, quick: bool, device_type: str = "cpu", ranks_per_node: int | None = None,
                nodes: int = 1) -> Suite:
    """The quick or full suite (module docstring).  ``ranks_per_node``: GPUs per node on
    ``cuda`` (default 8), ranks sharing the host on ``cpu`` (default 2)."""
    cuda = device_type == "cuda"
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type={device_type!r}: must be cpu or cuda")
    models = (GPU_SMALL, GPU_MEDIUM) if cuda else (SMALL, MEDIUM)
    per_node = int(ranks_per_node or (8 if cuda else 2))
    if per_node < 1 or nodes < 1:
        raise ValueError(f"ranks_per_node={per_node}, nodes={nodes}: must be >= 1")
    steps, warmup = (5, 2) if quick else (10, 3)
    limit = 600.0 if quick else 1800.0
    mb = MicrobenchConfig.for_device(device_type, quick=quick)

    def workloads(ranks: int, extras: bool = True) -> tuple[WorkloadSpec, ...]:
        # CPU ranks beyond the host's cores time-share them: one model there (eight ranks; four in
        # the quick suite, whose two-rank job already trains both sizes)
        used = models[:1] if not cuda and (ranks > 4 or (quick and ranks > per_node)) else models
        return tuple(w for i, m in enumerate(used)
                     for w in _workloads_for(m, mbs=2, steps=steps, warmup=warmup, ranks=ranks,
                                             pipeline_extras=extras and (i == 0 or not quick),
                                             ranks_per_node=per_node))

    jobs: list[Job] = []
    if nodes > 1:
        if per_node == 1:
            jobs.append(Job(1, nodes=nodes, microbench=mb, workloads=workloads(nodes), timeout_s=limit))
        else:
            jobs.append(Job(1, nodes=nodes, workloads=workloads(nodes), timeout_s=limit))
            jobs.append(Job(per_node, nodes=nodes, microbench=mb, workloads=workloads(nodes * per_node, False),
                            timeout_s=limit))
    elif per_node == 1:
        jobs.append(Job(1, microbench=mb, workloads=workloads(1), timeout_s=limit))
    else:
        worlds = [w for w in (2, 4, 8) if w <= per_node]
        if not cuda:  # CPU ranks time-share the measured cores beyond the host's ranks
            worlds = sorted(set(worlds) | {2, 4} | (set() if quick else {8}))
        fullest = max(w for w in worlds if w <= per_node)
        for w in worlds:
            jobs.append(Job(w, microbench=mb if w == fullest else None,
                            workloads=workloads(w, extras=w == 2), timeout_s=limit))
    return Suite(name="quick" if quick else "full", jobs=tuple(jobs), device_type=device_type)


# ---------------------------------------------------------------------- running


def run_suite(suite: Suite, out_dir: Path, *, launcher: str = "local", timeout_s: float | None = None,
              threads: int | None = None, slurm: dict[str, Any] | None = None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every job; return ``{"env", "microbench", "workloads", "jobs"}``.

    ``slurm``: ``partition``, ``cpus_per_task``, ``exclusive`` for ``validate.slurm.run_slurm``;
    a ``cuda`` suite asks Slurm for the job's GPUs per node.  Raises
    ``validate.launch.RunError`` when a job fails (the message names the rank).
    """
    from validate import launch, slurm as slurm_launch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    combined: dict[str, Any] = {"suite": suite.name, "device_type": suite.device_type, "env": None,
                                "microbench": [], "workloads": [], "jobs": []}
    res: dict[str, Any] = {}
    for i, job in enumerate(suite.jobs):
        jdir = out_dir / f"job{i}-n{job.nproc}"
        t0 = time.monotonic()
        limit = min(timeout_s, job.timeout_s) if timeout_s else job.timeout_s
        if progress:
            progress(f"job {i}: {job.nodes} node(s) x {job.nproc_per_node} rank(s) on {suite.device_type}, "
                     f"{'microbenchmarks + ' if job.microbench else ''}{len(job.workloads)} workloads ({launcher})")
        payload = job.to_json(device=suite.device_type, threads=threads)
        if launcher == "local":
            if job.nodes > 1:
                raise ValueError(f"job {i} spans {job.nodes} nodes: the local launcher runs one (use --launcher slurm)")
            res = launch.run_local(payload, nproc=job.nproc_per_node, out_dir=jdir, timeout_s=limit)
        elif launcher == "slurm":
            opts = {k: v for k, v in (slurm or {}).items() if k in ("partition", "cpus_per_task", "exclusive")}
            res = slurm_launch.run_slurm(payload, nodes=job.nodes, nproc_per_node=job.nproc_per_node, out_dir=jdir,
                                         timeout_s=limit,
                                         gpus_per_node=job.nproc_per_node if suite.device_type == "cuda" else None,
                                         **opts)
        else:
            raise ValueError(f"launcher={launcher!r}: must be local or slurm")
        if job.microbench is not None:
            combined["env"] = res["env"]
        combined["microbench"] += res["microbench"]
        combined["workloads"] += res["workloads"]
        combined["jobs"].append({"dir": str(jdir), "nodes": job.nodes, "nproc": job.nproc,
                                 "wall_s": time.monotonic() - t0})
    if combined["env"] is None and suite.jobs:
        combined["env"] = res["env"]
    (out_dir / "measurements.json").write_text(json.dumps(combined, indent=1), encoding="utf-8")
    return combined


def run_all(*, quick: bool, out_dir: Path, launcher: str = "local", timeout_s: float | None = None,
            profile_id: str | None = None, base_gpu: str | None = None, engine: str = "analytic",
            slurm: dict[str, Any] | None = None, progress: Callable[[str], None] | None = None,
            device_type: str | None = None, ranks_per_node: int | None = None, nodes: int = 1,
            suite: Suite | None = None, check: Callable[[Suite, dict[str, Any]], None] | None = None
            ) -> dict[str, Any]:
    """Measure, fit the profile from the microbenchmarks, compare on the workloads.

    ``device_type`` None: what torch sees here (local runs); ``ranks_per_node`` None: every
    local GPU on ``cuda``.  ``suite`` replaces the built one and ``check(suite, measurements)``
    runs between measuring and fitting (``scripts/gpu_smoke.py`` asserts there).
    """
    from sim.cost.calibration import dump_profile
    from validate.compare import compare, contention_warnings
    from validate.profile import fit_profile, profile_header

    if suite is None:
        if device_type is None or (device_type == "cuda" and ranks_per_node is None and launcher == "local"):
            found, gpus = local_device()
            device_type = device_type or found
            ranks_per_node = ranks_per_node or (gpus if device_type == "cuda" else None)
        suite = build_suite(quick=quick, device_type=device_type, ranks_per_node=ranks_per_node, nodes=nodes)
    t0 = time.monotonic()
    meas = run_suite(suite, out_dir, launcher=launcher, timeout_s=timeout_s, slurm=slurm, progress=progress)
    if check is not None:
        check(suite, meas)
    t1 = time.monotonic()
    profile = fit_profile(meas["microbench"], meas["env"], profile_id=profile_id, base_gpu=base_gpu)
    path = dump_profile(profile, Path(out_dir) / "profile.yaml", header=profile_header(profile, suite.name))
    t2 = time.monotonic()
    result = compare(meas["workloads"], str(path), engine=engine)
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
        "device_type": suite.device_type, "fit": profile["fit"], "env": meas["env"],
        "timings_s": {"measure": t1 - t0, "fit": t2 - t1, "compare": t3 - t2, "total": t3 - t0,
                      "jobs": [j["wall_s"] for j in meas["jobs"]]},
    })
    (Path(out_dir) / "compare.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def local_device() -> tuple[str, int | None]:
    """("cuda", GPUs) when torch sees GPUs here, else ("cpu", None)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - validate needs torch
        return "cpu", None
    if torch.cuda.is_available():
        return "cuda", torch.cuda.device_count()
    return "cpu", None
