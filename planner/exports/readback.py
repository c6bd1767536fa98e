"""Read an exported configuration back into the ``Strategy`` it launches.

The inverse of each exporter is the recipe reader of its framework (``planner.recipes``, what
``planner import`` runs on a user's own files), written from the tools' own semantics (what
Megatron-LM, torchtitan and DeepSpeed derive from those options), not from our writer: data
parallelism from the world size, interleaving from the virtual stages or the pipeline layout,
the ZeRO stage from the sharding options, overlaps from their switches.
``read_back(fmt, files, model, num_gpus)`` is what the tests use to check that an exported plan
is the plan that was predicted (export, read back, re-simulate, same step time).
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

from sim.errors import InputError
from sim.specs import Model, Strategy


def options(tokens: list[str]) -> dict[str, str | bool]:
    """``--flag value`` / ``--switch`` tokens as a mapping."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise InputError("export", tok, "expected an option")
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[tok], i = tokens[i + 1], i + 2
        else:
            out[tok], i = True, i + 1
    return out


def bash_array(script: str, name: str) -> list[str]:
    """The words of ``name=( ... )`` in a bash script (one option per line, shell-quoted)."""
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{name}=("))
    end = next(i for i in range(start, len(lines)) if lines[i] == ")")
    return [w for ln in lines[start + 1:end] for w in shlex.split(ln)]


FORMAT_MAIN_FILE = {"megatron": "megatron_args.sh", "torchrun": "launch_torchrun.sh", "slurm": "train.sbatch",
                    "k8s": "pytorchjob.yaml", "torchtitan": "torchtitan.toml", "deepspeed": "deepspeed_launch.sh"}


def read_back(fmt: str, files: dict[str, str], *, model: Model, num_gpus: int) -> Strategy:
    """The strategy the files of export format ``fmt`` launch, read by the recipe readers a user's
    own files go through (``planner.recipes``: ``planner import``), from the files as written."""
    from planner.recipes import read_recipe, resolve

    if fmt not in FORMAT_MAIN_FILE:
        raise InputError("export", fmt, "no reader for this format")
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            (Path(d) / name).write_text(text, encoding="utf-8")
        recipe = read_recipe(str(Path(d) / FORMAT_MAIN_FILE[fmt]), model=model)
        return resolve(recipe, model=model, num_gpus=num_gpus)
