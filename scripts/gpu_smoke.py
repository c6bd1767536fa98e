#!/usr/bin/env python3
"""One command that runs `planner validate`'s whole GPU path on one node, in under 3 minutes.

    python scripts/gpu_smoke.py [--gpus N] [--out DIR] [--install] [--json]

With 8 GPUs (or more; 8 are used): DDP, FSDP2, TP+SP, 1F1B, GPipe and interleaved 1F1B on two
GPUs, the dp x tp and pp x dp meshes on four, the 3-D pp x dp x tp mesh on eight, and the
microbenchmarks on all eight (GEMM, attention, memory-bound kernels, overhead probes, host
memory bandwidth and H2D/D2H copies pinned and pageable; collectives on every layout: world,
tp2, tp4, dp2, dp4, pp pairs); then the fit and the
comparison.  With one GPU: the single-rank workloads (plain and with gradient accumulation)
and the single-GPU microbenchmarks, fit, compare.  With 2-7 GPUs: the jobs that fit.

It asserts what a wrong setup would otherwise hide: every job ran NCCL on CUDA devices with
the world size it was launched for, every workload, layout and host copy path is there, and
the profile has a scale-up link exactly when several GPUs were measured and every host copy
path exactly on CUDA.  It prints the measured-vs-predicted
table, the fitted constants and the software versions.  Exit status: 0 passed, 1 a check or a
run failed (one line), 2 no CUDA device (one line; ``--cpu-rehearsal`` runs the same path with
gloo on CPU ranks and tiny shapes, which is how the tests exercise this script).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUDGET_S = 180.0


class SmokeError(RuntimeError):
    """A check failed; the message is one line."""


def smoke_suite(gpus: int, *, device_type: str = "cuda"):  # -> validate.suite.Suite
    """The jobs for ``gpus`` devices of one node (module docstring)."""
    from validate.specs import MicrobenchConfig, ModelConfig, WorkloadSpec
    from validate.suite import GPU_SMALL, Job, Suite

    if device_type == "cuda":
        model, mbs = GPU_SMALL, 2
        mb = replace(MicrobenchConfig.gpu(quick=True), min_time_s=0.02, comm_min_time_s=0.01,
                     message_bytes=(1 << 16, 1 << 20, 1 << 24, 1 << 28))
    else:
        model, mbs = ModelConfig(name="tiny", num_layers=4, hidden_size=64, num_heads=4, ffn_hidden_size=128,
                                 vocab_size=256, seq_len=32), 2
        mb = MicrobenchConfig(matmul_shapes=((64, 128, 128), (128, 128, 256), (256, 256, 256)), matmul_dtypes=("fp32",),
                              attention_shapes=((1, 2, 128, 32),), memory_numel=(1 << 18, 1 << 20),
                              message_bytes=(1 << 12, 1 << 16), min_time_s=0.02, comm_min_time_s=0.01,
                              host_memory_bytes=(1 << 24,), host_min_time_s=0.01)
    kw = dict(model=model, warmup_steps=2, steps=3)
    half = mbs // 2
    by_world = {
        1: (WorkloadSpec(name=f"{model.name}-single", mbs=mbs, **kw),
            WorkloadSpec(name=f"{model.name}-single-accum", mbs=half, num_microbatches=2, **kw)),
        2: (WorkloadSpec(name=f"{model.name}-ddp", dp=2, mbs=mbs, **kw),
            WorkloadSpec(name=f"{model.name}-fsdp", dp=2, dp_mode="fsdp", mbs=mbs, **kw),
            WorkloadSpec(name=f"{model.name}-tp", tp=2, mbs=mbs, **kw),
            WorkloadSpec(name=f"{model.name}-pp-1f1b", pp=2, mbs=half, num_microbatches=4, **kw),
            WorkloadSpec(name=f"{model.name}-pp-gpipe", pp=2, mbs=half, num_microbatches=4, schedule="gpipe", **kw),
            WorkloadSpec(name=f"{model.name}-pp-interleaved", pp=2, vp=2, mbs=half, num_microbatches=4,
                         schedule="interleaved", **kw)),
        4: (WorkloadSpec(name=f"{model.name}-mesh-dp2-tp2", dp=2, tp=2, dp_mode="fsdp", mbs=mbs, **kw),
            WorkloadSpec(name=f"{model.name}-mesh-pp2-dp2", pp=2, dp=2, dp_mode="fsdp", mbs=half,
                         num_microbatches=4, **kw)),
        8: (WorkloadSpec(name=f"{model.name}-mesh-pp2-dp2-tp2", pp=2, dp=2, tp=2, dp_mode="fsdp", mbs=half,
                         num_microbatches=4, **kw),),
    }
    worlds = [1] if gpus == 1 else [w for w in (2, 4, 8) if w <= gpus]
    jobs = tuple(Job(w, microbench=mb if w == worlds[-1] else None, workloads=by_world[w], timeout_s=600)
                 for w in worlds)
    return Suite(name="smoke", jobs=jobs, device_type=device_type)


def check_measurements(suite, meas: dict, *, backend: str, device_type: str) -> None:
    """Raise ``SmokeError`` unless every job ran ``backend`` on ``device_type`` with its world
    size, and every workload, overhead probe and collective layout is present."""
    from validate.layouts import group_layouts, pp_pairs

    mb_job = next(j for j in suite.jobs if j.microbench is not None)
    env = meas.get("env") or {}
    for key, want in (("backend", backend), ("device_type", device_type), ("world_size", mb_job.nproc)):
        if env.get(key) != want:
            raise SmokeError(f"microbenchmark job ran {key}={env.get(key)!r}, expected {want!r}")
    want_names = [w.name for j in suite.jobs for w in j.workloads]
    got = {w["name"]: w for w in meas["workloads"]}
    missing = [n for n in want_names if n not in got]
    if missing:
        raise SmokeError(f"workloads missing: {', '.join(missing)}")
    for j in suite.jobs:
        for spec in j.workloads:
            w = got[spec.name]
            we = w.get("env", {})
            if (we.get("backend"), we.get("device_type")) != (backend, device_type):
                raise SmokeError(f"{spec.name} ran {we.get('backend')} on {we.get('device_type')}, "
                                 f"expected {backend} on {device_type}")
            if not w["world_size"] == spec.world_size == j.nproc:
                raise SmokeError(f"{spec.name} ran on {w['world_size']} ranks, expected {j.nproc}")
            if not w["measured_step_time_s"] > 0:
                raise SmokeError(f"{spec.name}: no step time")
    recs = meas["microbench"]
    probes = {r["op"] for r in recs if r["kind"] == "overhead"}
    need = {"queued_add", "eager_add"} if device_type == "cuda" else {"tiny_add"}
    if not need <= probes:
        raise SmokeError(f"overhead probes {sorted(probes)}, expected {sorted(need)}")
    for kind in ("matmul", "attention", "memory"):
        if not any(r["kind"] == kind for r in recs):
            raise SmokeError(f"no {kind} microbenchmark recorded")
    if not {r["op"] for r in recs if r["kind"] == "host_memory"} >= {"copy", "triad"}:
        raise SmokeError("no host memory (STREAM copy/triad) microbenchmark recorded")
    from validate.specs import HOST_COPY_PATHS

    for direction, pinned in HOST_COPY_PATHS:
        mine = [r for r in recs if r["kind"] == "host_copy" and r["direction"] == direction and r["pinned"] == pinned]
        sizes = {r["bytes"] for r in mine if r.get("measured")}
        label = f"{direction} {'pinned' if pinned else 'pageable'}"
        if device_type == "cuda" and len(sizes) < 2:
            raise SmokeError(f"host copy {label} measured at {len(sizes)} size(s), expected the sweep")
        if device_type != "cuda" and (sizes or not mine):
            raise SmokeError(f"host copy {label}: expected one not-measured record without CUDA")
    world = mb_job.nproc
    layouts = {name for name, _ in group_layouts(world, world)} | {name for name, _ in pp_pairs(world, world)}
    seen = {r.get("layout") for r in recs if r["kind"] == "collective"}
    if layouts - seen:
        raise SmokeError(f"collective layouts not measured: {', '.join(sorted(layouts - seen))}")


def _fail(msg: str, code: int) -> int:
    print(f"error: gpu_smoke: {msg}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all visible, at most 8)")
    p.add_argument("--out", default=None, help="output folder (default: a new temporary folder)")
    p.add_argument("--install", action="store_true", help="copy the profile into catalogs/calibration/")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--cpu-rehearsal", type=int, default=None, metavar="RANKS",
                   help="run the same path with gloo on RANKS CPU ranks and tiny shapes (no GPU needed)")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        return _fail("needs PyTorch: pip install 'cluster-planner[torch]'", 2)
    if args.cpu_rehearsal is not None:
        device, backend, gpus = "cpu", "gloo", args.cpu_rehearsal
    else:
        if not torch.cuda.is_available():
            return _fail(f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}) sees no GPU "
                         "on this machine; run it on a GPU node", 2)
        visible = torch.cuda.device_count()
        gpus = args.gpus or min(visible, 8)
        if not 1 <= gpus <= visible:
            return _fail(f"--gpus {gpus}: this node has {visible} visible GPU(s)", 2)
        device, backend = "cuda", "nccl"
    if gpus < 1:
        return _fail(f"{gpus} ranks: need at least 1", 2)

    from validate.launch import RunError
    from validate.suite import run_all

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    suite = smoke_suite(gpus, device_type=device)
    t0 = time.monotonic()
    start = t0

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    try:
        result = run_all(quick=True, out_dir=out, suite=suite, progress=progress,
                         check=lambda s, m: check_measurements(s, m, backend=backend, device_type=device))
    except (RunError, SmokeError) as exc:
        return _fail(str(exc), 1)
    wall = time.monotonic() - t0
    import yaml

    profile = yaml.safe_load(Path(result["profile_path"]).read_text(encoding="utf-8"))
    kinds = sorted(link["kind"] for link in profile["links"])
    if kinds != (["scale-up"] if gpus > 1 else []):
        return _fail(f"profile links {kinds}: expected {'a scale-up link' if gpus > 1 else 'none'} for {gpus} rank(s)", 1)
    copy_keys = sorted(k for k in profile["host"] if k.startswith(("h2d_", "d2h_")))
    if device == "cuda" and len(copy_keys) != 8:
        return _fail(f"profile host copies {copy_keys}: expected all four paths (bandwidth and latency)", 1)
    if device != "cuda" and copy_keys:
        return _fail(f"profile host copies {copy_keys} written without CUDA", 1)
    if args.install:
        dest = ROOT / "catalogs" / "calibration" / f"{profile['id']}.yaml"
        shutil.copyfile(result["profile_path"], dest)
        result["installed_profile"] = str(dest)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    from validate.compare import format_table
    from validate.profile import software_line

    f = result["fit"]
    print(format_table(result))
    print(f"fit: GEMM {f['matmul']['flops_per_s'] / 1e12:.1f} TFLOP/s ({f['matmul']['dtype']}, half-dim "
          f"{f['matmul']['gemm_half_dim']:.0f}), attention {f['attention']['fwd_vs_matmul']:.2f}/"
          f"{f['attention']['bwd_vs_matmul']:.2f} of GEMM, memory {f['memory']['bytes_per_s'] / 1e12:.2f} TB/s, "
          f"kernel {f['kernel_overhead_s'] * 1e6:.1f} us + host floor {f['host_op_floor_s'] * 1e6:.1f} us")
    for tier, lf in f["links"].items():
        if lf:
            print(f"     {tier}: {lf['bytes_per_s'] / 1e9:.1f} GB/s, {lf['latency_s'] * 1e6:.1f} us per step, "
                  f"rms log error {lf['rms_log_error']:.2f} over {', '.join(lf['layouts'])}")
    for name, hf in f.get("host", {}).items():
        if hf.get("measured") is False:
            print(f"     host {name}: not measured ({hf['reason']})")
        else:
            print(f"     host {name}: {hf['bytes_per_s'] / 1e9:.1f} GB/s"
                  + (f", {hf['latency_s'] * 1e6:.1f} us" if "latency_s" in hf else f" ({hf['op']}, the host)"))
    print(f"software: {software_line(profile['host'])}")
    print(f"profile {result['profile_path']}" + (f" (installed {result['installed_profile']})" if args.install else ""))
    print(f"passed: {len(result['workloads'])} workloads on {gpus} {device} rank(s) in {wall:.0f} s"
          + (f" (over the {BUDGET_S:.0f} s budget)" if wall > BUDGET_S and device == "cuda" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
