"""Start a measurement job locally (``torchrun``), and what every launcher shares: the job
file, reading results back, turning failures into one error, killing what a job started.

Slurm (``sbatch``) is ``validate.slurm``, Kubernetes (a Kubeflow ``PyTorchJob``) ``validate.k8s``.
Every launcher runs ``python -m validate.worker JOB.json OUT_DIR`` on every rank and reads
``OUT_DIR/results.json`` back.  Failures surface as one ``RunError`` whose message names the
first rank that failed and why (its traceback stays in ``OUT_DIR/error-rank{R}.json``); a
run past its timeout is killed with every process it started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


class RunError(RuntimeError):
    """A measurement job failed; the message is one line naming the rank and the cause."""


def _clear(out_dir: Path) -> None:
    """Remove a previous run's results and error records from ``out_dir``."""
    import shutil

    for stale in list(out_dir.glob("error-rank*.json")) + [out_dir / "results.json"]:
        stale.unlink(missing_ok=True)
    shutil.rmtree(out_dir / "ranks", ignore_errors=True)


def write_job(job: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "job.json"
    path.write_text(json.dumps(job, indent=1), encoding="utf-8")
    return path


PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe", "timed out",
             "communicator was aborted", "remote process exited", "socket closed")
"""Messages of ranks that failed because another rank died first (not root causes)."""

CRASH_MARKERS = ("what():", "Fatal Python error", "Segmentation fault", "Bus error", "Illegal instruction")


def _rank_crashes(out_dir: Path, known: set[int]) -> list[dict]:
    """Ranks that died without writing an error record (C++ abort, segfault): read their
    stderr as teed by torchrun into ``OUT_DIR/ranks/<run>/attempt_0/<local_rank>/stderr.log``."""
    out = []
    for log in sorted((out_dir / "ranks").glob("**/stderr.log")):
        try:
            rank = int(log.parent.name)
        except ValueError:
            continue
        if rank in known:
            continue
        text = log.read_text(encoding="utf-8", errors="replace")
        lines = [ln.strip() for ln in text.splitlines() if any(m in ln for m in CRASH_MARKERS)]
        if lines:
            what = next((ln.split("what():", 1)[1].strip() for ln in lines if "what():" in ln), lines[0])
            out.append({"rank": rank, "time": log.stat().st_mtime, "type": "crash", "message": what[:400],
                        "file": str(log)})
    return out


def _summary_failures(log: Path | None) -> str:
    """torchrun's own failure summary (``rank : R`` / ``exitcode : C``), as one phrase."""
    if log is None or not log.exists():
        return ""
    text = log.read_text(encoding="utf-8", errors="replace")
    found = re.findall(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)[^\n]*?(?:\((SIG\w+)\))?\s*$", text, re.M)
    parts = [f"rank {r} exited with {sig or 'status ' + c}" for r, c, sig in found]
    return "; ".join(dict.fromkeys(parts))


def root_cause(errors: list[dict]) -> dict | None:
    """The error that started it: the earliest one that is not a peer-lost symptom."""
    if not errors:
        return None
    primary = [e for e in errors if not any(p in str(e.get("message", "")).lower() for p in PEER_LOST)]
    return min(primary or errors, key=lambda e: e["time"])


def collect(out_dir: Path, *, returncode: int | None = None, log: Path | None = None,
            timed_out_s: float | None = None) -> dict:
    """Read ``results.json``, or raise ``RunError`` naming the root cause of the failure.

    Error records come from ``error-rank*.json`` (Python exceptions) and from the stderr of
    ranks that crashed without one; the root cause is the earliest error that is not a
    symptom of a peer dying (``PEER_LOST``).
    """
    errors = []
    for p in sorted(out_dir.glob("error-rank*.json")):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        rec["file"] = str(p)
        errors.append(rec)
    errors += _rank_crashes(out_dir, {int(e["rank"]) for e in errors})
    first = root_cause(errors)
    results = out_dir / "results.json"
    if timed_out_s is not None:
        extra = f"; rank {first['rank']} reported {first['type']}: {first['message']}" if first else ""
        raise RunError(f"run timed out after {timed_out_s:g} s and was killed{extra} (logs in {out_dir})")
    if first is not None:
        others = len({e["rank"] for e in errors}) - 1
        tail = f"; {others} other rank(s) failed after it" if others > 0 else ""
        raise RunError(f"rank {first['rank']} failed: {first['type']}: {first['message']}{tail} "
                       f"(details in {first['file']})")
    if returncode not in (0, None) or not results.exists():
        why = _summary_failures(log) or _last_line(log)
        raise RunError(f"job exited with status {returncode} without results"
                       f"{': ' + why if why else ''} (logs in {out_dir})")
    return json.loads(results.read_text(encoding="utf-8"))


def _last_line(path: Path | None) -> str:
    if path is None or not path.exists():
        return ""
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# ---------------------------------------------------------------------- processes


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux ``/proc``), depth first."""
    seen: list[int] = []
    stack = _children(pid)
    while stack:
        p = stack.pop()
        if p not in seen:
            seen.append(p)
            stack += _children(p)
    return seen


def kill_tree(proc: subprocess.Popen, *, grace_s: float = 5.0) -> int:
    """SIGTERM the launcher and everything below it, then SIGKILL what is left.  Returns the
    number of processes signalled."""
    pids = [proc.pid] + descendants(proc.pid)
    for p in pids:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    pids += [p for p in descendants(proc.pid) if p not in pids]
    for p in pids:
        _signal(p, signal.SIGKILL)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    return len(pids)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def worker_env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return env


def torchrun_args(nproc: int, *, python: str = sys.executable, log_dir: Path | None = None) -> list[str]:
    """``torchrun`` for one node; with ``log_dir`` every rank's output is also kept per rank."""
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0"]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir), "--tee", "3"]
    return cmd + ["-m", "validate.worker"]


def run_local(job: dict, *, nproc: int, out_dir: Path, timeout_s: float, python: str = sys.executable) -> dict:
    """Run ``job`` on ``nproc`` local ranks through ``torchrun``; return rank 0's results."""
    out_dir = Path(out_dir)
    job = {**job, "timeout_s": min(float(job.get("timeout_s", timeout_s)), timeout_s)}
    job_path = write_job(job, out_dir)
    _clear(out_dir)
    log = out_dir / "launcher.log"
    cmd = torchrun_args(nproc, python=python, log_dir=out_dir / "ranks") + [str(job_path), str(out_dir)]
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=worker_env(job.get("threads")),
                                cwd=str(REPO_ROOT), start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            return collect(out_dir, log=log, timed_out_s=timeout_s)
        except BaseException:
            kill_tree(proc)
            raise
        leftover = descendants(proc.pid)
        if leftover:  # pragma: no cover - torchrun normally reaps its workers
            for p in leftover:
                _signal(p, signal.SIGKILL)
    return collect(out_dir, returncode=rc, log=log)
