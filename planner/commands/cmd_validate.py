"""``planner validate``: measure this machine with torch.distributed, calibrate, compare.

Subcommands (docs/validate.md)::

    planner validate all [--quick] [--json] [--out DIR] [--launcher local|slurm] [--install]
                         [--device cpu|cuda] [--ranks-per-node N] [--nodes N] [--no-exclusive]
    planner validate measure [--quick] [--out DIR] [--launcher local|slurm] [...same]
    planner validate fit MEASUREMENTS.json [--id ID] [--base-gpu GPU] [--out FILE | --install]
    planner validate compare --calibration FILE|NAME MEASUREMENTS.json [--json]
    planner validate memory [--json] [--sample K] [--model M --layers L --num-gpus N --strategy S
                            [--framework F] [--moe-imbalance R]]
    planner validate slurm-script [--quick] --out DIR [--device cpu|cuda] [--nodes N] [--gpus-per-node N]
    planner validate k8s --image IMAGE [--quick] [--device cuda] [--nodes N] [--gpus-per-node N]
                         [--rdma-resource NAME[=COUNT]|none] [--host-network] [--out FILE]

The device the ranks use is decided for the compute nodes, never by the submit host: locally
what torch sees (or ``--device``); on Slurm ``--device`` is required, and ``cuda`` needs
``--gpus-per-node`` (the GPUs each node gives the job, passed to sbatch and srun).

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

from sim.base.errors import InputError
from sim.base.jsonout import print_json
from sim.base.outpaths import check_file, make_folder, write_text, writing


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out:
        return make_folder("out", args.out)
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
    return {"partition": args.partition, "cpus_per_task": args.cpus_per_task, "exclusive": args.exclusive}


def _check_counts(args: argparse.Namespace) -> None:
    if args.nodes < 1:
        raise InputError("nodes", args.nodes, "must be >= 1")
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise InputError("ranks-per-node", args.ranks_per_node, "must be >= 1")
    if getattr(args, "cpus_per_task", None) is not None and args.cpus_per_task < 1:
        raise InputError("cpus-per-task", args.cpus_per_task, "must be >= 1")


def machine_from_args(args: argparse.Namespace) -> tuple[str, int | None]:
    """(device type, ranks per node) for the compute nodes (module docstring)."""
    _check_counts(args)
    device, per_node = args.device, args.ranks_per_node
    launcher = getattr(args, "launcher", "local")
    if launcher == "local":
        if args.nodes > 1:
            raise InputError("nodes", args.nodes, "the local launcher runs on this machine only; use --launcher slurm")
        from validate.suite import local_device

        found, gpus = local_device()
        device = found if device == "auto" else device
        if device == "cuda":
            if found != "cuda":
                raise InputError("device", "cuda", "torch sees no GPU on this machine")
            if per_node is not None and per_node > (gpus or 0):
                raise InputError("ranks-per-node", per_node, f"this machine has {gpus} GPU(s)")
            per_node = per_node or gpus
        return device, per_node
    if device == "auto":
        raise InputError("device", "auto", "--launcher slurm needs --device cuda (GPU nodes, with --gpus-per-node) "
                                           "or --device cpu: the submit host cannot tell what the nodes have")
    if device == "cuda" and per_node is None:
        raise InputError("gpus-per-node", None, "--device cuda on Slurm needs the GPUs each node gives the job")
    return device, per_node


def _run_error(exc: Exception) -> int:
    print(f"error: validate: {exc}", file=sys.stderr)
    return 1


def _check_timeout(args: argparse.Namespace) -> None:
    if args.timeout is not None and not args.timeout > 0:
        raise InputError("timeout", args.timeout, "must be > 0 seconds")


def cmd_all(args: argparse.Namespace) -> int:
    _need_torch()
    _check_timeout(args)
    from validate.fit import FitError
    from validate.launch import RunError
    from validate.suite import run_all

    device, per_node = machine_from_args(args)
    out = _out_dir(args)
    try:
        result = run_all(quick=args.quick, out_dir=out, launcher=args.launcher, timeout_s=args.timeout,
                         profile_id=args.id, base_gpu=args.base_gpu, engine=args.engine,
                         slurm=_slurm_opts(args), progress=_progress(args), device_type=device,
                         ranks_per_node=per_node, nodes=args.nodes)
    except RunError as exc:
        return _run_error(exc)
    except FitError as exc:
        print(f"error: validate: cannot fit a profile from {out / 'measurements.json'}: {exc}", file=sys.stderr)
        return 1
    if args.install:
        result["installed_profile"] = str(_install(Path(result["profile_path"])))
    if args.json:
        print_json(result)
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

    from sim.cost.calibration import calibration_dir, load_calibration

    cal = load_calibration(str(profile_path))
    dest = check_file("install", make_folder("install", calibration_dir()) / f"{cal.id}.yaml")
    with writing("install", dest):
        shutil.copyfile(profile_path, dest)
    yaml.safe_load(dest.read_text(encoding="utf-8"))
    return dest


def cmd_measure(args: argparse.Namespace) -> int:
    _need_torch()
    _check_timeout(args)
    from validate.launch import RunError
    from validate.suite import build_suite, run_suite

    device, per_node = machine_from_args(args)
    suite = build_suite(quick=args.quick, device_type=device, ranks_per_node=per_node, nodes=args.nodes)
    out = _out_dir(args)
    try:
        meas = run_suite(suite, out, launcher=args.launcher, timeout_s=args.timeout, slurm=_slurm_opts(args),
                         progress=_progress(args))
    except RunError as exc:
        return _run_error(exc)
    path = out / "measurements.json"
    if args.json:
        print_json({"measurements": str(path), "workloads": meas["workloads"],
                    "num_microbench_records": len(meas["microbench"])})
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
    from sim.cost.calibration import dump_profile
    from validate.fit import FitError
    from validate.profile import fit_profile, profile_header

    data = _read_measurements(args.measurements)
    out = check_file("out", args.out if args.out else Path(args.measurements).with_name("profile.yaml"))
    if not data.get("microbench"):
        raise InputError("measurements", args.measurements, "has no microbenchmark records")
    try:
        profile = fit_profile(data["microbench"], data["env"] or {}, profile_id=args.id, base_gpu=args.base_gpu)
    except FitError as exc:
        raise InputError("measurements", args.measurements, str(exc)) from None
    path = dump_profile(profile, out, header=profile_header(profile, str(data.get("suite", "?"))))
    if args.install:
        path = _install(path)
    if args.json:
        print_json({"profile": str(path), "id": profile["id"], "fit": profile["fit"]})
    else:
        f = profile["fit"]
        print(f"profile {profile['id']} -> {path}")
        print(f"  matmul   {f['matmul']['flops_per_s'] / 1e9:8.1f} GFLOP/s ({f['matmul']['dtype']}), "
              f"half-dim {f['matmul']['gemm_half_dim']:.0f}, rms error {f['matmul']['rms_rel_error']:.0%}")
        print(f"  attention fwd {f['attention']['fwd_vs_matmul']:.2f} / bwd {f['attention']['bwd_vs_matmul']:.2f} "
              f"of matmul, rms error {f['attention']['rms_rel_error']:.0%}")
        print(f"  memory   {f['memory']['bytes_per_s'] / 1e9:8.1f} GB/s, rms error {f['memory']['rms_rel_error']:.0%}")
        print(f"  overhead {f['kernel_overhead_s'] * 1e6:8.1f} us per kernel, host floor "
              f"{f.get('host_op_floor_s', 0.0) * 1e6:.1f} us per op")
        for tier, lf in f["links"].items():
            if lf:
                print(f"  {tier:<8} {lf['bytes_per_s'] / 1e9:8.2f} GB/s, latency {lf['latency_s'] * 1e6:.0f} us, "
                      f"rms log error {lf['rms_log_error']:.2f}")
            else:
                print(f"  {tier:<8} not measured: no link written (the catalog's applies)")
        for name, hf in (f.get("host") or {}).items():
            label = "host mem" if name == "memory" else name.replace("_", " ")
            if hf.get("measured") is False:
                print(f"  {label:<12} not written: {hf['reason']}")
            elif name == "memory":
                print(f"  {label:<12} {hf['bytes_per_s'] / 1e9:8.2f} GB/s ({hf['op']}, the host's ranks together)")
            else:
                print(f"  {label:<12} {hf['bytes_per_s'] / 1e9:8.2f} GB/s, latency {hf['latency_s'] * 1e6:.1f} us, "
                      f"rms error {hf['rms_rel_error']:.0%}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from validate.compare import compare, format_table

    data = _read_measurements(args.measurements)
    if not data["workloads"]:
        raise InputError("measurements", args.measurements, "has no workload measurements")
    result = compare(data["workloads"], args.calibration, engine=args.engine)
    if args.json:
        print_json(result)
    else:
        print(format_table(result))
    return 0


def _script_machine(args: argparse.Namespace) -> tuple[str, int | None]:
    _check_counts(args)
    if args.device == "cuda" and args.ranks_per_node is None:
        raise InputError("gpus-per-node", None, "--device cuda needs the GPUs each node gives the job")
    return args.device, args.ranks_per_node


def cmd_memory(args: argparse.Namespace) -> int:
    """The planner's memory per category against PyTorch's MemTracker/FSDPMemTracker
    (``validate.memgrid``): the standing grid, a sample of it, or one plan."""
    _need_torch()
    from validate.memgrid import build_plan, compare, format_table, run_grid

    if args.strategy:
        if not args.model or not args.num_gpus:
            raise InputError("memory", args.strategy, "--strategy needs --model and --num-gpus")
        if args.layers is not None and args.layers < 1:
            raise InputError("layers", args.layers, "must be >= 1")
        plan = build_plan(args.model, args.layers or 2, args.num_gpus, args.strategy, framework=args.framework,
                          moe_imbalance=args.moe_imbalance)
        row = compare(plan)
        result = {"plans": [row], "num_plans": 1, "num_within_tolerance": int(bool(row["within_tolerance"])),
                  "tolerance": 0.03}
    else:
        if args.sample is not None and args.sample < 1:
            raise InputError("sample", args.sample, "must be >= 1")
        result = run_grid(sample=args.sample)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(format_table(result))
    return 0


def cmd_fragmentation(args: argparse.Namespace) -> int:
    """The caching allocator's slack per plan, by replaying each plan's allocation trace
    (``validate.fragmentation``); prints the ``memory.fragmentation`` block of runtime.yaml."""
    _need_torch()
    from validate.fragmentation import PLANS, format_yaml, run

    plans = PLANS
    if args.plans is not None:
        if args.plans < 1:
            raise InputError("plans", args.plans, "must be >= 1")
        plans = PLANS[:args.plans]
    if args.workers < 1:
        raise InputError("workers", args.workers, "must be >= 1")
    result = run(plans, workers=args.workers)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'plan (' + result['model'] + ', full depth)':70s} {'caching':>9s} {'expandable':>11s}")
    for r in result["plans"]:
        print(f"{r['strategy'][:70]:70s} {r['caching']:>+9.3f} {r['expandable_segments']:>+11.3f}")
    print("reserved / allocated - 1 at the peaks of a replay of PyTorch's caching allocator; for catalogs/runtime.yaml:")
    print(format_yaml(result))
    return 0


def cmd_slurm_script(args: argparse.Namespace) -> int:
    from validate.launch import write_job
    from validate.slurm import sbatch_script
    from validate.suite import build_suite

    device, per_node = _script_machine(args)
    suite = build_suite(quick=args.quick, device_type=device, ranks_per_node=per_node, nodes=args.nodes)
    out = make_folder("out", args.out).resolve()
    paths = []
    for i, job in enumerate(suite.jobs):
        jdir = out / f"job{i}-n{job.nproc}"
        jpath = write_job(job.to_json(device=device), jdir)
        script = sbatch_script(jpath, jdir, nodes=job.nodes, nproc_per_node=job.nproc_per_node,
                               time_limit_s=job.timeout_s, partition=args.partition, cpus_per_task=args.cpus_per_task,
                               gpus_per_node=job.nproc_per_node if device == "cuda" else None,
                               exclusive=args.exclusive)
        paths.append(str(write_text("out", jdir / "job.sbatch", script)))
    for p in paths:
        print(p)
    print("submit each with sbatch, then: planner validate fit/compare on the results.json files", file=sys.stderr)
    return 0


def cmd_k8s(args: argparse.Namespace) -> int:
    from validate.k8s import parse_rdma_resource, pytorchjob_manifest
    from validate.suite import build_suite

    device, per_node = _script_machine(args)
    try:
        parse_rdma_resource(args.rdma_resource)
    except ValueError as exc:
        raise InputError("rdma-resource", args.rdma_resource, str(exc).split(": ", 1)[-1]) from None
    suite = build_suite(quick=args.quick, device_type=device, ranks_per_node=per_node, nodes=args.nodes)
    docs = []
    for i, job in enumerate(suite.jobs):
        nproc = job.nproc_per_node
        docs.append(pytorchjob_manifest(job.to_json(device=device), name=f"{args.name}-{i}", image=args.image,
                                        nodes=job.nodes, nproc_per_node=nproc,
                                        gpus_per_node=nproc if device == "cuda" else 0,
                                        cpus_per_node=None if device == "cuda" else nproc,
                                        namespace=args.namespace, results_pvc=args.results_pvc,
                                        rdma_resource=args.rdma_resource, host_network=args.host_network))
    text = "---\n".join(docs)
    if args.out:
        write_text("out", args.out, text)
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
        q.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="device of the ranks (auto: what torch sees here; required with --launcher slurm)")
        q.add_argument("--ranks-per-node", "--gpus-per-node", dest="ranks_per_node", type=int, default=None,
                       help="ranks per node: GPUs per node on cuda (default: all torch sees here), ranks sharing "
                            "the host on cpu (default 2); 1 = the one-GPU / one-rank-per-node suite")
        q.add_argument("--nodes", type=int, default=1, help="nodes (Slurm); with several, the suite measures "
                                                            "the inter-node link")
        q.add_argument("--partition", default=None, help="Slurm partition")
        q.add_argument("--cpus-per-task", type=int, default=None,
                       help="Slurm CPUs of each node's task (default: the node's, with --exclusive)")
        q.add_argument("--no-exclusive", dest="exclusive", action="store_false",
                       help="share nodes with other jobs (default: sbatch --exclusive)")
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

    q = sub.add_parser("memory", help="the planner's memory per category against PyTorch's memory tracker "
                                      "(FakeTensorMode, fake process group; no GPU needed)")
    q.add_argument("--json", action="store_true")
    q.add_argument("--sample", type=int, default=None, help="compare K plans of the grid drawn at random")
    q.add_argument("--model", default=None, help="one plan: catalog model id")
    q.add_argument("--layers", type=int, default=None, help="layers kept (width unchanged; default 2)")
    q.add_argument("--num-gpus", type=int, default=None)
    q.add_argument("--strategy", default=None)
    q.add_argument("--framework", default="torchtitan")
    q.add_argument("--moe-imbalance", type=float, default=1.0)
    q.set_defaults(func=cmd_memory)

    q = sub.add_parser("fragmentation", help="the caching allocator's slack per plan, by replaying each plan's "
                                             "allocation trace (FakeTensorMode; no GPU needed)")
    q.add_argument("--json", action="store_true")
    q.add_argument("--plans", type=int, default=None, help="only the first K plans of the standing set")
    q.add_argument("--workers", type=int, default=2, help="plans replayed in parallel (one process each)")
    q.set_defaults(func=cmd_fragmentation)

    for name, fn, helptext in (("slurm-script", cmd_slurm_script, "write sbatch scripts for the suite"),
                               ("k8s", cmd_k8s, "write a Kubeflow PyTorchJob manifest for the suite")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--quick", action="store_true")
        q.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
        q.add_argument("--nodes", type=int, default=1)
        q.add_argument("--ranks-per-node", "--gpus-per-node", "--nproc-per-node", dest="ranks_per_node", type=int,
                       default=None, help="ranks per node: the GPUs each node gives the job (required with "
                                          "--device cuda), ranks sharing a CPU host (default 2)")
        if name == "slurm-script":
            q.add_argument("--out", required=True, help="folder for the scripts, jobs and results")
            q.add_argument("--partition", default=None)
            q.add_argument("--cpus-per-task", type=int, default=None)
            q.add_argument("--no-exclusive", dest="exclusive", action="store_false",
                           help="share nodes with other jobs (default: sbatch --exclusive)")
        else:
            q.add_argument("--rdma-resource", default="rdma/rdma_shared_device_a",
                           help="RDMA device-plugin resource NAME[=COUNT] for multi-node GPU jobs "
                                "(default rdma/rdma_shared_device_a; 'none' to request none)")
            q.add_argument("--host-network", action="store_true", help="run the pods on the node network")
            q.add_argument("--image", required=True, help="container image with this project and torch")
            q.add_argument("--name", default="planner-validate")
            q.add_argument("--namespace", default="default")
            q.add_argument("--results-pvc", default=None, help="PVC for /results (default: emptyDir + log)")
            q.add_argument("--out", default=None, help="manifest file (default: stdout)")
        q.set_defaults(func=fn)
