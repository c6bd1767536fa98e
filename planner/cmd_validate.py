"""``planner validate``: measure this machine with torch.distributed, calibrate, compare.

Subcommands (docs/validate.md)::

    planner validate all [--quick] [--json] [--out DIR] [--launcher local|slurm] [--install]
    planner validate measure [--quick] [--out DIR] [--launcher local|slurm]
    planner validate fit MEASUREMENTS.json [--id ID] [--base-gpu GPU] [--out FILE | --install]
    planner validate compare --calibration FILE|NAME MEASUREMENTS.json [--json]
    planner validate slurm-script [--quick] --out DIR [--nodes N] [--nproc-per-node N]
    planner validate k8s --image IMAGE [--quick] [--nodes N] [--nproc-per-node N] [--out FILE]

``validate`` (and torch) is imported only inside the command functions, so ``planner``
works without torch installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from sim.errors import InputError


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out:
        return Path(args.out)
    return Path(tempfile.mkdtemp(prefix="planner-validate-"))


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError("validate", "torch", "needs PyTorch: pip install 'cluster-planner[torch]'") from None


def _progress(args: argparse.Namespace):
    if getattr(args, "json", False) and not getattr(args, "verbose", False):
        return None
    start = time.monotonic()
    return lambda msg: print(f"[{time.monotonic() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _slurm_opts(args: argparse.Namespace) -> dict[str, object]:
    return {"partition": args.partition, "cpus_per_task": args.cpus_per_task, "nodes": args.nodes}


def _per_node(job_nproc: int, nodes: int, given: int | None) -> int:
    """Ranks per node so that nodes x ranks = the job's world size."""
    if nodes < 1:
        raise InputError("nodes", nodes, "must be >= 1")
    if given is None and job_nproc % nodes:
        raise InputError("nodes", nodes, f"must divide every job's ranks (a job has {job_nproc})")
    nproc = given if given is not None else job_nproc // nodes
    if nproc < 1 or nproc * nodes != job_nproc:
        raise InputError("nproc-per-node", given if given is not None else nproc,
                         f"nodes x ranks per node must equal the job's {job_nproc} ranks")
    return nproc


def _run_error(exc: Exception) -> int:
    print(f"error: validate: {exc}", file=sys.stderr)
    return 1


def _check_timeout(args: argparse.Namespace) -> None:
    if args.timeout is not None and not args.timeout > 0:
        raise InputError("timeout", args.timeout, "must be > 0 seconds")


def cmd_all(args: argparse.Namespace) -> int:
    _need_torch()
    _check_timeout(args)
    from validate.launch import RunError
    from validate.suite import run_all

    out = _out_dir(args)
    try:
        result = run_all(quick=args.quick, out_dir=out, launcher=args.launcher, timeout_s=args.timeout,
                         profile_id=args.id, base_gpu=args.base_gpu, engine=args.engine,
                         slurm=_slurm_opts(args), progress=_progress(args))
    except RunError as exc:
        return _run_error(exc)
    if args.install:
        result["installed_profile"] = str(_install(Path(result["profile_path"])))
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        from validate.compare import format_table

        print(format_table(result))
        t = result["timings_s"]
        print(f"profile {result['profile_path']}  (measure {t['measure']:.0f} s, fit {t['fit']:.1f} s, "
              f"compare {t['compare']:.1f} s)")
        if args.install:
            print(f"installed as {result['installed_profile']}")
    return 0


def _install(profile_path: Path) -> Path:
    import shutil

    import yaml

    from sim.calibration import calibration_dir, load_calibration

    cal = load_calibration(str(profile_path))
    dest = calibration_dir() / f"{cal.id}.yaml"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(profile_path, dest)
    yaml.safe_load(dest.read_text(encoding="utf-8"))
    return dest


def cmd_measure(args: argparse.Namespace) -> int:
    _need_torch()
    _check_timeout(args)
    from validate.launch import RunError
    from validate.suite import build_suite, local_device, run_suite

    device, gpus = local_device()
    suite = build_suite(quick=args.quick, device_type=device, gpus=gpus)
    out = _out_dir(args)
    try:
        meas = run_suite(suite, out, launcher=args.launcher, timeout_s=args.timeout, slurm=_slurm_opts(args),
                         progress=_progress(args))
    except RunError as exc:
        return _run_error(exc)
    path = out / "measurements.json"
    if args.json:
        print(json.dumps({"measurements": str(path), "workloads": meas["workloads"],
                          "num_microbench_records": len(meas["microbench"])}, indent=2, default=str))
    else:
        for w in meas["workloads"]:
            print(f"{w['name']:<28} {w['measured_step_time_s'] * 1e3:9.1f} ms/step  "
                  f"{w['tokens_per_s']:10.0f} tokens/s  peak {w['measured_memory_peak_bytes'] / 2**20:7.0f} MiB")
        print(f"measurements: {path}")
    return 0


def _read_measurements(path: str) -> dict:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError("measurements", path, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputError("measurements", path, f"not JSON: {exc}") from None
    if not isinstance(data, dict) or "workloads" not in data:
        raise InputError("measurements", path, "not a measurements.json from 'planner validate measure'")
    return data


def cmd_fit(args: argparse.Namespace) -> int:
    from sim.calibration import dump_profile
    from validate.fit import FitError, fit_profile
    from validate.suite import profile_header

    data = _read_measurements(args.measurements)
    if not data.get("microbench"):
        raise InputError("measurements", args.measurements, "has no microbenchmark records")
    try:
        profile = fit_profile(data["microbench"], data["env"] or {}, profile_id=args.id, base_gpu=args.base_gpu)
    except FitError as exc:
        raise InputError("measurements", args.measurements, str(exc)) from None
    out = Path(args.out) if args.out else Path(args.measurements).with_name("profile.yaml")
    path = dump_profile(profile, out, header=profile_header(profile, str(data.get("suite", "?"))))
    if args.install:
        path = _install(path)
    if args.json:
        print(json.dumps({"profile": str(path), "id": profile["id"], "fit": profile["fit"]}, indent=2))
    else:
        f = profile["fit"]
        print(f"profile {profile['id']} -> {path}")
        print(f"  matmul   {f['matmul']['flops_per_s'] / 1e9:8.1f} GFLOP/s ({f['matmul']['dtype']}), "
              f"half-dim {f['matmul']['gemm_half_dim']:.0f}, rms error {f['matmul']['rms_rel_error']:.0%}")
        print(f"  attention fwd {f['attention']['fwd_vs_matmul']:.2f} / bwd {f['attention']['bwd_vs_matmul']:.2f} "
              f"of matmul, rms error {f['attention']['rms_rel_error']:.0%}")
        print(f"  memory   {f['memory']['bytes_per_s'] / 1e9:8.1f} GB/s, rms error {f['memory']['rms_rel_error']:.0%}")
        print(f"  overhead {f['kernel_overhead_s'] * 1e6:8.1f} us per kernel")
        for tier, lf in f["links"].items():
            if lf:
                print(f"  {tier:<8} {lf['bytes_per_s'] / 1e9:8.2f} GB/s, latency {lf['latency_s'] * 1e6:.0f} us, "
                      f"rms log error {lf['rms_log_error']:.2f}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from validate.compare import compare, format_table

    data = _read_measurements(args.measurements)
    if not data["workloads"]:
        raise InputError("measurements", args.measurements, "has no workload measurements")
    result = compare(data["workloads"], args.calibration, engine=args.engine)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(format_table(result))
    return 0


def cmd_slurm_script(args: argparse.Namespace) -> int:
    from validate.launch import sbatch_script, write_job
    from validate.suite import build_suite

    suite = build_suite(quick=args.quick, device_type=args.device, gpus=args.gpus_per_node)
    out = Path(args.out).resolve()
    paths = []
    for i, job in enumerate(suite.jobs):
        jdir = out / f"job{i}-n{job.nproc}"
        jpath = write_job(job.to_json(), jdir)
        nproc = _per_node(job.nproc, args.nodes, args.nproc_per_node)
        script = sbatch_script(jpath, jdir, nodes=args.nodes, nproc_per_node=nproc, time_limit_s=job.timeout_s,
                               partition=args.partition, cpus_per_task=args.cpus_per_task,
                               gpus_per_node=nproc if args.device == "cuda" else None)
        sp = jdir / "job.sbatch"
        sp.write_text(script, encoding="utf-8")
        paths.append(str(sp))
    for p in paths:
        print(p)
    print("submit each with sbatch, then: planner validate fit/compare on the results.json files", file=sys.stderr)
    return 0


def cmd_k8s(args: argparse.Namespace) -> int:
    from validate.launch import pytorchjob_manifest
    from validate.suite import build_suite

    suite = build_suite(quick=args.quick, device_type=args.device, gpus=args.gpus_per_node)
    docs = []
    for i, job in enumerate(suite.jobs):
        nproc = _per_node(job.nproc, args.nodes, args.nproc_per_node)
        docs.append(pytorchjob_manifest(job.to_json(), name=f"{args.name}-{i}", image=args.image, nodes=args.nodes,
                                        nproc_per_node=nproc, gpus_per_node=nproc if args.device == "cuda" else 0,
                                        cpus_per_node=None if args.device == "cuda" else nproc,
                                        namespace=args.namespace, results_pvc=args.results_pvc))
    text = "---\n".join(docs)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(args.out)
    else:
        print(text, end="")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="measure this machine with torch.distributed and calibrate the simulator")
    sub = p.add_subparsers(dest="validate_command", parser_class=type(p))
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    def run_opts(q: argparse.ArgumentParser) -> None:
        q.add_argument("--quick", action="store_true", help="the ~5 minute suite (CI, laptops)")
        q.add_argument("--out", default=None, help="output folder (default: a new temporary folder)")
        q.add_argument("--launcher", choices=("local", "slurm"), default="local",
                       help="local: torchrun here; slurm: sbatch on this cluster (shared filesystem)")
        q.add_argument("--timeout", type=float, default=None, help="seconds per launched job (default: suite's)")
        q.add_argument("--partition", default=None, help="Slurm partition")
        q.add_argument("--cpus-per-task", type=int, default=None, help="Slurm --cpus-per-task")
        q.add_argument("--nodes", type=int, default=1, help="Slurm nodes per job (ranks are split evenly)")
        q.add_argument("--json", action="store_true")
        q.add_argument("--verbose", action="store_true", help="progress on stderr even with --json")

    q = sub.add_parser("all", help="measure, fit a calibration profile, compare predicted vs measured")
    run_opts(q)
    q.add_argument("--id", default=None, help="profile id (default: derived from the device)")
    q.add_argument("--base-gpu", default=None, help="catalog GPU whose data-sheet peaks the profile keeps")
    q.add_argument("--engine", choices=("analytic", "event"), default="analytic")
    q.add_argument("--install", action="store_true", help="copy the profile into catalogs/calibration/")
    q.set_defaults(func=cmd_all)

    q = sub.add_parser("measure", help="run the microbenchmarks and workloads, write measurements.json")
    run_opts(q)
    q.set_defaults(func=cmd_measure)

    q = sub.add_parser("fit", help="fit a calibration profile from measurements.json")
    q.add_argument("measurements")
    q.add_argument("--id", default=None)
    q.add_argument("--base-gpu", default=None)
    q.add_argument("--out", default=None, help="profile path (default: profile.yaml next to the measurements)")
    q.add_argument("--install", action="store_true", help="also copy it into catalogs/calibration/")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_fit)

    q = sub.add_parser("compare", help="simulate each measured workload with a profile; predicted vs measured")
    q.add_argument("measurements")
    q.add_argument("--calibration", required=True, help="profile file or name in catalogs/calibration/")
    q.add_argument("--engine", choices=("analytic", "event"), default="analytic")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_compare)

    for name, fn, helptext in (("slurm-script", cmd_slurm_script, "write sbatch scripts for the suite"),
                               ("k8s", cmd_k8s, "write a Kubeflow PyTorchJob manifest for the suite")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--quick", action="store_true")
        q.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
        q.add_argument("--nodes", type=int, default=1)
        q.add_argument("--nproc-per-node", type=int, default=None,
                       help="ranks per node (default: each job's ranks / --nodes)")
        q.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node the suite may use (cuda)")
        if name == "slurm-script":
            q.add_argument("--out", required=True, help="folder for the scripts, jobs and results")
            q.add_argument("--partition", default=None)
            q.add_argument("--cpus-per-task", type=int, default=None)
        else:
            q.add_argument("--image", required=True, help="container image with this project and torch")
            q.add_argument("--name", default="planner-validate")
            q.add_argument("--namespace", default="default")
            q.add_argument("--results-pvc", default=None, help="PVC for /results (default: emptyDir + log)")
            q.add_argument("--out", default=None, help="manifest file (default: stdout)")
        q.set_defaults(func=fn)
