"""Where this rank is in the job: from ``torchrun``'s variables, or from Slurm's when ``srun``
starts the ranks itself (one task per GPU), plus which device it drives.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` (PyTorch docs, "torchrun (Elastic Launch)": environment
variables), which ``init_process_group``'s default ``env://`` method reads.  A rank started by
``srun`` without torchrun has only Slurm's variables (Slurm ``srun`` man page, "OUTPUT
ENVIRONMENT VARIABLES"): ``SLURM_PROCID`` (global rank), ``SLURM_NTASKS``, ``SLURM_LOCALID``
(rank on the node), ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE`` (``"4(x2),3"``) and
``SLURM_STEP_NODELIST``.  ``from_environ`` turns those into torchrun's: the rendezvous host
is the first host of the step's node list (``scontrol show hostnames``, with a built-in
expansion of the common ``node[01-04,07]`` forms when ``scontrol`` cannot run), the port is
derived from the job and step ids so every task computes the same one.

When Slurm binds one GPU per task (``--gpus-per-task=1``), each task sees exactly one device
(``CUDA_VISIBLE_DEVICES`` holds its GPU), so the device index is 0, not ``SLURM_LOCALID``
(``device_index``).

No torch here (``pick_device`` imports it lazily), so the tests check this on any machine.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping


class DeviceError(RuntimeError):
    """The rank cannot drive the device it was asked for (one line, names the host)."""


@dataclass(frozen=True, slots=True)
class RankEnv:
    """A rank's place: global rank, ranks in the job, rank on its node, ranks on its node,
    and the rendezvous address; ``source`` is ``torchrun``, ``slurm`` or ``single``."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str

    def export(self, environ: dict[str, str] | None = None) -> None:
        """Set the ``env://`` variables ``init_process_group`` reads (existing ones win)."""
        env = os.environ if environ is None else environ
        for key, value in (("RANK", self.rank), ("WORLD_SIZE", self.world_size), ("LOCAL_RANK", self.local_rank),
                           ("LOCAL_WORLD_SIZE", self.local_world_size), ("MASTER_ADDR", self.master_addr),
                           ("MASTER_PORT", self.master_port)):
            env.setdefault(key, str(value))


def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a Slurm node list (``"gpu[01-03,07],login1"``) without ``scontrol``.

    Handles one bracket group per name with zero-padded ranges, which is what Slurm prints
    for ordinary clusters; ``hostnames`` prefers ``scontrol show hostnames``.
    """
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        head, body, tail = m.groups()
        for item in body.split(","):
            if "-" in item:
                lo, hi = item.split("-", 1)
                width = len(lo)
                out += [f"{head}{i:0{width}d}{tail}" for i in range(int(lo), int(hi) + 1)]
            else:
                out.append(f"{head}{item}{tail}")
    return out


def hostnames(nodelist: str) -> list[str]:
    """Host names of a Slurm node list: ``scontrol show hostnames`` (Slurm's own parser), or
    ``expand_nodelist`` when ``scontrol`` is missing or cannot run."""
    try:
        res = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30)
        names = res.stdout.split()
        if res.returncode == 0 and names:
            return names
    except (OSError, subprocess.SubprocessError):
        pass
    return expand_nodelist(nodelist)


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Tasks on node ``node_id`` from Slurm's compressed count list (``"4(x2),3"``)."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise ValueError(f"SLURM tasks-per-node {tasks_per_node!r}: not a Slurm count list")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if not 0 <= node_id < len(counts):
        raise ValueError(f"SLURM_NODEID={node_id}: outside the tasks-per-node list {tasks_per_node!r}")
    return counts[node_id]


def slurm_port(environ: Mapping[str, str]) -> int:
    """A rendezvous port every task of a step derives alike (job id, step id), clear of the
    port range the sbatch scripts give torchrun's rendezvous (``validate.slurm``)."""
    job = int(environ.get("SLURM_JOB_ID", "0") or 0)
    step = int(environ.get("SLURM_STEP_ID", "0") or 0)
    return 40000 + (job * 16 + step) % 20000


def from_environ(environ: Mapping[str, str] | None = None, *,
                 resolve: Callable[[str], list[str]] = hostnames) -> RankEnv:
    """The rank's place from torchrun's variables, else from Slurm's (module docstring)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return RankEnv(rank=int(env["RANK"]), world_size=world, local_rank=int(env.get("LOCAL_RANK", "0")),
                       local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
                       master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                       master_port=int(env.get("MASTER_PORT", "29500")), source="torchrun")
    if "SLURM_PROCID" in env:
        world = int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1")))
        node_id = int(env.get("SLURM_NODEID", "0"))
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE"))
        if per_node:
            local_world = tasks_on_node(per_node, node_id)
        else:
            local_world = int(env.get("SLURM_NTASKS_PER_NODE", str(world)))
        nodes = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", ""))
        if "MASTER_ADDR" in env:
            addr = env["MASTER_ADDR"]
        else:
            hosts = resolve(nodes) if nodes else []
            addr = hosts[0] if hosts else "127.0.0.1"
        port = int(env["MASTER_PORT"]) if "MASTER_PORT" in env else slurm_port(env)
        return RankEnv(rank=int(env["SLURM_PROCID"]), world_size=world, local_rank=int(env.get("SLURM_LOCALID", "0")),
                       local_world_size=local_world, master_addr=addr, master_port=port, source="slurm")
    return RankEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="127.0.0.1",
                   master_port=int(env.get("MASTER_PORT", "29500")), source="single")


def device_index(local_rank: int, visible: int) -> int:
    """The CUDA device a rank drives: its local rank when it sees every GPU of the node, 0
    when Slurm bound one GPU to the task (it sees one)."""
    if visible < 1:
        raise DeviceError("no CUDA device visible")
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise DeviceError(f"local rank {local_rank} but only {visible} GPUs are visible "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    return local_rank


def pick_device(requested: str | None, local_rank: int):  # -> torch.device
    """The device this rank drives: ``requested`` is ``cuda``, ``cpu`` or None (a GPU when
    torch sees one).  Raises ``DeviceError`` when ``cuda`` was asked for and torch sees none:
    a rank never falls back to CPU silently."""
    import socket

    import torch

    if requested not in (None, "auto", "cpu", "cuda"):
        raise DeviceError(f"device {requested!r}: must be cpu or cuda")
    if requested == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if requested == "cuda":
            raise DeviceError(f"asked for device cuda but torch {torch.__version__} on {socket.gethostname()} sees "
                              f"no GPU (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        return torch.device("cpu")
    return torch.device("cuda", device_index(local_rank, torch.cuda.device_count()))
