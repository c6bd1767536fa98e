"""Launchers for the Megatron-LM arguments: ``torchrun``, Slurm ``sbatch``, Kubeflow PyTorchJob.

* ``launch_torchrun.sh``: ``torchrun --nnodes N --nproc_per_node G --node_rank R
  --master_addr A --master_port P pretrain_gpt.py ARGS`` for one node (run it on every node
  with its ``NODE_RANK``);
* ``train.sbatch``: ``#SBATCH --nodes/--ntasks-per-node=1/--gpus-per-node/--exclusive``, then
  ``srun torchrun`` with the c10d rendezvous on the first node (``scontrol show hostnames``);
* ``pytorchjob.yaml``: ``apiVersion: kubeflow.org/v1``, ``kind: PyTorchJob``, a ``Master``
  replica and ``nodes - 1`` ``Worker`` replicas, each one pod per node with ``nvidia.com/gpu``
  limits; the training operator sets ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``,
  ``PET_MASTER_PORT`` which ``torchrun`` reads, and ``spec.nprocPerNode`` the processes per pod.
"""

from __future__ import annotations

import math

import yaml

from planner.exports import LaunchSpec, Rendered
from planner.exports.megatron import (DEFAULT_TRAIN_ITERS, PLACEHOLDERS, format_array, header, megatron_args,
                                      placeholder_block)


def render_torchrun(spec: LaunchSpec) -> Rendered:
    tokens, warn = megatron_args(spec)
    text = ("#!/usr/bin/env bash\n" + header(spec, "torchrun launch (one node; run on every node)")
            + "set -euo pipefail\n"
            f"NNODES=${{NNODES:-{spec.num_nodes}}}\n"
            f"NPROC_PER_NODE=${{NPROC_PER_NODE:-{spec.procs_per_node}}}\n"
            "NODE_RANK=${NODE_RANK:-0}\n"
            "MASTER_ADDR=${MASTER_ADDR:-localhost}\n"
            "MASTER_PORT=${MASTER_PORT:-29500}\n"
            f"MEGATRON_LM=${{MEGATRON_LM:-{spec.megatron_path}}}\n"
            "export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}\n"
            + placeholder_block(spec) + format_array("MEGATRON_ARGS", tokens) + "\n"
            "exec torchrun --nnodes \"$NNODES\" --nproc_per_node \"$NPROC_PER_NODE\" --node_rank \"$NODE_RANK\" \\\n"
            "  --master_addr \"$MASTER_ADDR\" --master_port \"$MASTER_PORT\" \\\n"
            "  \"$MEGATRON_LM/pretrain_gpt.py\" \"${MEGATRON_ARGS[@]}\" \"$@\"\n")
    return Rendered(files={"launch_torchrun.sh": text}, warnings=warn)


def _slurm_time(seconds: float) -> str:
    """Slurm ``--time`` as ``D-HH:MM:SS`` (rounded up to the minute)."""
    minutes = max(1, math.ceil(round(seconds / 60, 6)))
    d, rem = divmod(minutes, 24 * 60)
    h, mi = divmod(rem, 60)
    return f"{d}-{h:02d}:{mi:02d}:00"


def render_slurm(spec: LaunchSpec) -> Rendered:
    tokens, warn = megatron_args(spec)
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={spec.job_name}",
             f"#SBATCH --nodes={spec.num_nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={spec.procs_per_node}",
             "#SBATCH --exclusive"]
    if spec.time_limit_s is not None:
        lines.append(f"#SBATCH --time={_slurm_time(spec.time_limit_s * 1.1)}")
    text = ("\n".join(lines) + "\n" + header(spec, "Slurm batch script") + "set -euo pipefail\n"
            "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
            "MASTER_PORT=${MASTER_PORT:-29500}\n"
            f"MEGATRON_LM=${{MEGATRON_LM:-{spec.megatron_path}}}\n"
            "export MASTER_ADDR MASTER_PORT CUDA_DEVICE_MAX_CONNECTIONS=1\n"
            + placeholder_block(spec) + format_array("MEGATRON_ARGS", tokens) + "\n"
            f"srun --kill-on-bad-exit=1 torchrun --nnodes \"$SLURM_NNODES\" --nproc_per_node {spec.procs_per_node} \\\n"
            "  --rdzv_id \"$SLURM_JOB_ID\" --rdzv_backend c10d --rdzv_endpoint \"$MASTER_ADDR:$MASTER_PORT\" \\\n"
            "  \"$MEGATRON_LM/pretrain_gpt.py\" \"${MEGATRON_ARGS[@]}\"\n")
    return Rendered(files={"train.sbatch": text}, warnings=warn)


def pytorchjob(spec: LaunchSpec) -> tuple[dict[str, object], list[str]]:
    # Kubernetes expands $(NAME) in a container's command from its env (the placeholders below)
    tokens, warn = megatron_args(spec, var=lambda name: f"$({name})")
    env = [{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}]
    env += [{"name": name, "value": default} for name, default, _ in PLACEHOLDERS]
    env.append({"name": "TRAIN_ITERS", "value": str(spec.steps if spec.steps is not None else DEFAULT_TRAIN_ITERS)})
    command = ["torchrun", "--nnodes", str(spec.num_nodes), "--nproc_per_node", str(spec.procs_per_node),
               f"{spec.megatron_path}/pretrain_gpt.py", *tokens]

    def replica(n: int) -> dict[str, object]:
        return {
            "replicas": n,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [{
                "name": "pytorch",
                "image": spec.image,
                "command": command,
                "env": env,
                "resources": {"limits": {"nvidia.com/gpu": spec.procs_per_node}},
            }]}},
        }

    replicas: dict[str, object] = {"Master": replica(1)}
    if spec.num_nodes > 1:
        replicas["Worker"] = replica(spec.num_nodes - 1)
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": spec.job_name,
                     "annotations": {"planner/strategy": spec.strategy.to_string(),
                                     "planner/placeholders": "; ".join(f"{n}: {w}" for n, _, w in PLACEHOLDERS)}},
        "spec": {"nprocPerNode": str(spec.procs_per_node), "pytorchReplicaSpecs": replicas},
    }
    return job, warn


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated lists out in full (no ``&id001`` anchors), as kubectl users expect."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def render_k8s(spec: LaunchSpec) -> Rendered:
    job, warn = pytorchjob(spec)
    text = header(spec, "Kubeflow PyTorchJob") + yaml.dump(job, Dumper=_NoAliasDumper, sort_keys=False, width=120)
    return Rendered(files={"pytorchjob.yaml": text}, warnings=warn)
