"""The program every rank runs: ``python -m validate.worker JOB.json OUT_DIR``.

``JOB.json`` lists tasks run in order by all ranks of one job::

    {"timeout_s": 300, "threads": null, "device": "cuda", "world_size": 8,
     "tasks": [{"type": "microbench", "config": {...}, "parts": ["compute", "host", "comm"]},
               {"type": "workload", "spec": {...}}]}

``device`` (``cuda`` or ``cpu``; absent: a GPU when torch sees one) is asserted: a rank asked
for ``cuda`` that sees no GPU fails (``validate.rankenv.DeviceError``) rather than measuring
its CPU; ``world_size`` is checked against the launcher's.  Rank 0 writes ``OUT_DIR/results.json`` (``env``, ``microbench`` records, ``workloads``).
A rank that fails writes ``OUT_DIR/error-rank{R}.json`` (time, type, message, traceback)
and exits 1; the launcher (``validate.launch``) turns the earliest of these into one error.
Diagnostic task types ``fail`` (raise on one rank), ``crash`` (abort one rank) and ``hang``
(sleep on one rank) exist so the tests can check that failures and timeouts surface cleanly.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)


def run_job(job: dict, out_dir: Path) -> dict:
    import torch.distributed as dist

    from validate import microbench, runtime, workloads

    env = runtime.init(timeout_s=float(job.get("timeout_s", 300)), threads=job.get("threads"),
                       device=job.get("device"), world_size=job.get("world_size"))
    results: dict[str, object] = {"env": runtime.describe(env), "microbench": [], "workloads": []}
    for task in job.get("tasks", []):
        kind = task.get("type")
        if kind == "microbench":
            cfg = microbench.MicrobenchConfig.from_dict(task.get("config", {}))
            results["microbench"] += microbench.run(env, cfg, parts=tuple(task.get("parts", microbench.PARTS)))
        elif kind == "workload":
            spec = workloads.WorkloadSpec.from_dict(task["spec"])
            results["workloads"].append(workloads.run(spec, env))  # type: ignore[union-attr]
        elif kind == "fail":
            if env.rank == int(task.get("rank", 0)):
                raise RuntimeError(task.get("message", "injected failure"))
            dist.barrier()  # peers wait here until the failed rank's exit tears the job down
        elif kind == "crash":  # a hard crash (C++ abort), no Python exception to catch
            if env.rank == int(task.get("rank", 0)):
                os.abort()
            dist.barrier()
        elif kind == "hang":
            if env.rank == int(task.get("rank", 0)):
                time.sleep(float(task.get("seconds", 3600)))
            dist.barrier()
        else:
            raise ValueError(f"unknown task type {kind!r}")
    runtime.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m validate.worker JOB.json OUT_DIR", file=sys.stderr)
        return 2
    import faulthandler

    faulthandler.enable()  # a segfault or abort prints a traceback the launcher can find
    job_path, out_dir = Path(argv[0]), Path(argv[1])
    from validate.rankenv import from_environ

    rank = from_environ(resolve=lambda nodes: []).rank
    try:
        job = json.loads(job_path.read_text(encoding="utf-8"))
        out_dir.mkdir(parents=True, exist_ok=True)
        results = run_job(job, out_dir)
        if rank == 0:
            _write_json(out_dir / "results.json", results)
        return 0
    except BaseException as exc:  # noqa: BLE001  every failure becomes a record, then exit 1
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            _write_json(out_dir / f"error-rank{rank}.json", {
                "rank": rank, "time": time.time(), "type": type(exc).__name__, "message": msg,
                "traceback": traceback.format_exc()})
        except OSError:
            pass
        print(f"rank {rank}: {type(exc).__name__}: {msg}", file=sys.stderr, flush=True)
        # Skip interpreter teardown: a rank stuck in a collective must not block exit.
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
