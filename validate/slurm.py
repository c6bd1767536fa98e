"""Run a measurement job on Slurm: an ``sbatch`` script with one ``srun`` task per node, each
running ``torchrun`` for that node's ranks; results come back through the shared filesystem.

What the script asks Slurm for, and why (``sbatch(1)``/``srun(1)`` man pages, Slurm 22.05+):

* ``--exclusive`` by default (whole nodes: no other job's ranks share the GPUs, NICs, memory
  bandwidth or cores being measured); with it ``--mem=0`` (an exclusive job otherwise gets
  only the memory it asked for);
* ``--ntasks-per-node=1``: one task per node, ``torchrun``, which starts that node's ranks;
  the task therefore needs every CPU its ranks use: ``--cpus-per-task`` is passed to ``srun``
  itself, because since 22.05 ``srun`` does not inherit it from ``sbatch`` ("NOTE: Beginning
  with 22.05, srun will not inherit the --cpus-per-task value requested by salloc or sbatch");
  exclusive jobs hand the task the node's CPUs (``$SLURM_CPUS_ON_NODE``), shared ones ask for
  ``ranks x cpus_per_rank``;
* GPUs: ``--gres=gpu:G`` on the allocation and again on the step (``srun --gres``: "a job step
  is allocated all of the generic resources that have been requested by the job, except those
  implicitly requested when a job is exclusive"), so the node's ``torchrun`` sees its G GPUs
  (Slurm sets ``CUDA_VISIBLE_DEVICES``);
* the device the ranks must use travels in the job file (``"device": "cuda"``); a rank that
  sees no GPU fails with one line instead of measuring its CPU (``validate.rankenv``);
* rendezvous: ``--standalone`` on one node; on several, c10d on the first host of
  ``scontrol show hostnames $SLURM_JOB_NODELIST`` at a port derived from the job id.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

from validate.launch import REPO_ROOT, RunError, _clear, collect, worker_env, write_job

CPUS_PER_GPU_RANK = 4
"""CPUs a GPU rank gets in a shared (non-exclusive) job: its Python thread, NCCL's proxy
threads and the allocator's."""


def sbatch_script(job_path: Path, out_dir: Path, *, nodes: int = 1, nproc_per_node: int = 1,
                  time_limit_s: float = 900, python: str = sys.executable, partition: str | None = None,
                  cpus_per_task: int | None = None, gpus_per_node: int | None = None, exclusive: bool = True,
                  job_name: str = "planner-validate", extra_sbatch: tuple[str, ...] = ()) -> str:
    """The ``sbatch`` script (module docstring).  ``gpus_per_node``: GPUs each node's task
    gets (None on CPU nodes); ``cpus_per_task``: CPUs of that task (default: the whole node
    when ``exclusive``, else ``nproc_per_node`` per CPU rank or ``4 x`` per GPU rank)."""
    if nodes < 1 or nproc_per_node < 1:
        raise ValueError(f"nodes={nodes}, nproc_per_node={nproc_per_node}: must be >= 1")
    minutes = max(1, int(-(-time_limit_s // 60)))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --time={minutes}",
        f"#SBATCH --output={out_dir}/slurm-%j.out",
        f"#SBATCH --chdir={REPO_ROOT}",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if exclusive:
        lines += ["#SBATCH --exclusive", "#SBATCH --mem=0"]
    if cpus_per_task is None and not exclusive:
        cpus_per_task = nproc_per_node * (CPUS_PER_GPU_RANK if gpus_per_node else 1)
    if cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    if gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{gpus_per_node}")
    lines += [f"#SBATCH {x}" for x in extra_sbatch]
    env = worker_env(None)
    step = ["srun", "--kill-on-bad-exit=1", f"--nodes={nodes}", "--ntasks-per-node=1",
            f'--cpus-per-task={cpus_per_task if cpus_per_task else "$SLURM_CPUS_ON_NODE"}']
    if gpus_per_node:
        step.append(f"--gres=gpu:{gpus_per_node}")
    torchrun = " ".join(shlex.quote(x) for x in [
        python, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", str(nproc_per_node),
        "--max-restarts=0", "--log-dir", str(out_dir / "ranks"), "--tee", "3"])
    rdzv = (" --standalone" if nodes == 1 else
            ' --rdzv-backend c10d --rdzv-id "$SLURM_JOB_ID" --rdzv-endpoint "$head:$port"')
    lines += [
        "set -euo pipefail",
        f"export PYTHONPATH={shlex.quote(env['PYTHONPATH'])}",
        f"export OMP_NUM_THREADS={shlex.quote(env['OMP_NUM_THREADS'])}",
        "export PYTHONUNBUFFERED=1 TORCH_CPP_LOG_LEVEL=ERROR",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "port=$((20000 + SLURM_JOB_ID % 20000))",
        " ".join(step) + " " + torchrun + rdzv
        + f" -m validate.worker {shlex.quote(str(job_path))} {shlex.quote(str(out_dir))}",
    ]
    return "\n".join(lines) + "\n"


def run_slurm(job: dict, *, nodes: int = 1, nproc_per_node: int, out_dir: Path, timeout_s: float,
              python: str = sys.executable, partition: str | None = None, cpus_per_task: int | None = None,
              gpus_per_node: int | None = None, exclusive: bool = True, poll_s: float = 1.0) -> dict:
    """Submit ``job`` with ``sbatch``, wait for it, return rank 0's results.  A ``cuda`` job
    must say how many GPUs a node gives it."""
    if job.get("device") == "cuda" and not gpus_per_node:
        raise ValueError("a cuda job on Slurm needs gpus_per_node (the GPUs each node's task gets)")
    out_dir = Path(out_dir).resolve()
    job = {**job, "timeout_s": min(float(job.get("timeout_s", timeout_s)), timeout_s)}
    job_path = write_job(job, out_dir)
    _clear(out_dir)
    script = out_dir / "job.sbatch"
    script.write_text(sbatch_script(job_path, out_dir, nodes=nodes, nproc_per_node=nproc_per_node,
                                    time_limit_s=timeout_s, python=python, partition=partition,
                                    cpus_per_task=cpus_per_task, gpus_per_node=gpus_per_node,
                                    exclusive=exclusive), encoding="utf-8")
    sub = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    if sub.returncode != 0:
        raise RunError(f"sbatch failed: {(sub.stderr or sub.stdout).strip().splitlines()[-1:] or ['no output']}")
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout_s + 60
    while True:
        state = slurm_job_state(job_id)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"):
            break
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
            return collect(out_dir, timed_out_s=timeout_s)
        time.sleep(poll_s)
    log = out_dir / f"slurm-{job_id}.out"
    if state == "TIMEOUT":
        return collect(out_dir, log=log, timed_out_s=timeout_s)
    rc = 0 if state == "COMPLETED" else 1
    try:
        return collect(out_dir, returncode=rc, log=log)
    except RunError as exc:
        raise RunError(f"slurm job {job_id} ended {state}: {exc}") from None


def slurm_job_state(job_id: str) -> str:
    """The job's state from ``scontrol`` (works without accounting)."""
    res = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    for tok in res.stdout.split():
        if tok.startswith("JobState="):
            return tok.split("=", 1)[1]
    if "Invalid job id" in res.stderr:
        return "UNKNOWN"  # purged after MinJobAge: finished
    return "PENDING"
