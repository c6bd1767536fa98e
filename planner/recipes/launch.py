"""Megatron-LM recipes as launched: a bash/Slurm script or an args file (``planner.recipes.shell``),
or Megatron-LM's functional-test ``model_config.yaml`` (``MODEL_ARGS``), with the cluster the
launcher states: ``torchrun --nproc_per_node N --nnodes M`` (``--nproc-per-node`` too),
``deepspeed --num_gpus N --num_nodes M``, or ``#SBATCH --nodes`` with ``--gpus-per-node``,
``--gres=gpu:N`` or ``--ntasks-per-node``.  A Megatron-DeepSpeed script (``--deepspeed``) reads
the ``--deepspeed_config`` JSON beside it when it exists (``planner.recipes.deepspeed``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import yaml

from sim.base.errors import InfeasibleError, InputError
from sim.data.specs import Model

from planner.recipes.base import Recipe, RecipeKey, as_int, recipe_error
from planner.recipes.megatron import options_from_mapping, options_from_tokens, read_megatron
from planner.recipes.shell import launcher_option, read_shell


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text) if re.fullmatch(r"\d+", text) else None


def read_launch(path: str, text: str, *, model: Model | None = None, script_args: Sequence[str] = (),
                script_env: Mapping[str, str] | None = None) -> Recipe:
    if Path(path).suffix.lower() in (".yaml", ".yml"):
        doc = yaml.safe_load(text)
        if doc.get("kind") == "PyTorchJob":
            return _read_pytorchjob(path, doc, model)
        args = doc.get("MODEL_ARGS")
        if not isinstance(args, dict):
            raise recipe_error(path, "MODEL_ARGS", args, "must be a mapping of Megatron-LM options")
        extra = tuple(RecipeKey(key=str(k), value=v if not isinstance(v, dict) else "{...}", cost="no" if k in (
            "TEST_TYPE", "LAUNCHER", "METRICS", "MODE") else "unknown", note="functional-test harness")
            for k, v in doc.items() if k != "MODEL_ARGS")
        return read_megatron(path, options_from_mapping(path, args), model=model, extra_keys=extra,
                             dialect="Megatron-LM functional-test model_config.yaml (MODEL_ARGS)")
    sh = read_shell(text, args=script_args, env=script_env)
    cmds = [c for c in sh.commands if c.args]
    if cmds:
        tokens = max(cmds, key=lambda c: len(c.args)).args
    else:  # arguments kept in an array for another script to pass (megatron_args.sh)
        arrays = [a for a in sh.arrays.values() if any(w.startswith("--") for w in a)]
        if not arrays:
            raise recipe_error(path, "arguments", None, "no Megatron-LM arguments found (a launch script runs "
                               "pretrain_gpt.py with them; an args file lists them)")
        tokens = max(arrays, key=len)
    keys: list[RecipeKey] = []
    num_gpus = gpus_per_node = None
    launchers = [c.launcher for c in sh.commands if c.launcher]
    for words in launchers:
        name = next((w for w in words if w.rsplit("/", 1)[-1] in ("torchrun", "deepspeed", "launch")),
                    words[0]).rsplit("/", 1)[-1]
        nproc = _int_or_none(launcher_option(words, "--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num-gpus"))
        nnodes = _int_or_none(launcher_option(words, "--nnodes", "--num_nodes", "--num-nodes"))
        if nproc is not None:
            gpus_per_node = nproc
            keys.append(RecipeKey(key=f"{name} --nproc_per_node", value=nproc, maps_to="cluster.gpus_per_node"))
            if nnodes is not None:
                num_gpus = nproc * nnodes
                keys.append(RecipeKey(key=f"{name} --nnodes", value=nnodes, maps_to="cluster.num_gpus",
                                      note="nodes x GPUs per node"))
            break
    if sh.sbatch:
        nodes = _int_or_none(sh.sbatch.get("--nodes") or sh.sbatch.get("-N"))
        per = _int_or_none(sh.sbatch.get("--gpus-per-node"))
        gres = sh.sbatch.get("--gres", "")
        if per is None and gres.startswith("gpu"):
            per = _int_or_none(gres.rsplit(":", 1)[-1])
        if per is None:
            per = _int_or_none(sh.sbatch.get("--ntasks-per-node"))
        for k, v in sh.sbatch.items():
            maps = {"--nodes": "cluster.num_gpus", "-N": "cluster.num_gpus", "--gpus-per-node": "cluster.gpus_per_node",
                    "--gres": "cluster.gpus_per_node", "--ntasks-per-node": "cluster.gpus_per_node"}.get(k, "")
            if maps and _int_or_none(v.rsplit(":", 1)[-1]) is None:
                keys.append(RecipeKey(key=f"#SBATCH {k}", value=v, cost="no", note="not a number: ignored"))
                continue
            keys.append(RecipeKey(key=f"#SBATCH {k}", value=v, maps_to=maps, cost="no"))
        if per is not None:
            gpus_per_node = per
            if nodes is not None:
                num_gpus = nodes * per
    dialect = "Megatron-LM launch script (bash)" if launchers or sh.variables else "Megatron-LM args file"
    if sh.sbatch:
        dialect = "Megatron-LM Slurm batch script"
    try:
        options = options_from_tokens(path, tokens)
        recipe = read_megatron(path, options, dialect=dialect, model=model, num_gpus=num_gpus,
                               gpus_per_node=gpus_per_node, warnings=sh.warnings, extra_keys=tuple(keys))
    except InputError as exc:
        hint = sh.unread_hint()
        if hint and not isinstance(exc, InfeasibleError):
            raise InputError(exc.field, exc.value, f"{exc.message} ({hint})") from None
        raise
    recipe = te_attention_env(recipe, sh.variables, dict(options).get("--attention-backend"))
    ds = dict(options).get("--deepspeed_config") or dict(options).get("--deepspeed-config")
    if recipe.framework == "megatron-deepspeed" and isinstance(ds, str):
        # the config the script writes itself (a here-document, what the run reads), else the file beside it
        beside = Path(path).parent / ds
        where, text = (ds, sh.files[ds]) if ds in sh.files else \
            (str(beside), beside.read_text(encoding="utf-8")) if beside.is_file() else (None, None)
        if text is not None:
            from planner.recipes.deepspeed import merge_megatron_deepspeed

            try:
                cfg = json.loads(text)
            except json.JSONDecodeError as exc:
                raise recipe_error(path, "--deepspeed_config", ds, f"is not JSON as the script writes it: {exc.msg} "
                                   f"(line {exc.lineno})") from None
            recipe = merge_megatron_deepspeed(recipe, where, cfg)
    return recipe


def te_attention_env(recipe: Recipe, variables: dict[str, str], backend: object) -> Recipe:
    """Transformer Engine's attention backend as the script's environment picks it.

    TE's ``DotProductAttention`` enables FlashAttention (the flash-attn package) unless
    ``NVTE_FLASH_ATTN=0`` and cuDNN fused attention unless ``NVTE_FUSED_ATTN=0``, and prefers cuDNN
    on Hopper when both are on (TransformerEngine v1.4 ``transformer_engine/pytorch/attention.py``:
    ``use_flash_attention`` / ``use_fused_attention`` from the two variables; "Select FusedAttention
    on sm90").  Launch scripts of 2024 turned cuDNN off (NeMo Framework Launcher's
    ``conf/config.yaml`` ``NVTE_FUSED_ATTN: 0``, 2024-02 to 2024-08; dgxc-benchmarking 24.11's GPT-3,
    Grok-1 and Nemotron-4 340B scripts), which runs flash-attn 2 (``flash2``) on Hopper.
    Megatron-Core's ``--attention-backend`` other than ``auto`` sets the variables itself, so it wins."""
    if backend not in (None, "auto") or recipe.framework.startswith("megatron-deepspeed"):  # no TE attention there
        return recipe
    fused, flash = variables.get("NVTE_FUSED_ATTN"), variables.get("NVTE_FLASH_ATTN")
    if fused is None and flash is None:
        return recipe
    fused_on, flash_on = fused != "0", flash != "0"
    kernel = "flash" if fused_on else "flash2" if flash_on else "unfused"
    keys = tuple(RecipeKey(key=f"export {n}", value=v, maps_to="plan.attention",
                           note=f"{kernel}: Transformer Engine's attention backend from the environment")
                 for n, v in (("NVTE_FUSED_ATTN", fused), ("NVTE_FLASH_ATTN", flash)) if v is not None)
    return replace(recipe, plan={**recipe.plan, "attention": kernel}, keys=recipe.keys + keys)


def _read_pytorchjob(path: str, doc: dict, model: Model | None) -> Recipe:
    """A Kubeflow ``PyTorchJob`` running ``torchrun ... pretrain_gpt.py ARGS``: the Master
    container's command, with ``$(NAME)`` expanded from its env as Kubernetes does."""
    try:
        spec = doc["spec"]["pytorchReplicaSpecs"]
        container = spec["Master"]["template"]["spec"]["containers"][0]
        command = [str(w) for w in container.get("command", []) + container.get("args", [])]
    except (KeyError, IndexError, TypeError):
        raise recipe_error(path, "spec.pytorchReplicaSpecs.Master", None, "has no container command") from None
    env = {str(e["name"]): str(e.get("value", "")) for e in container.get("env", []) if "name" in e}
    command = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), w)
               for w in command]
    k = next((i for i, w in enumerate(command) if w.endswith(".py")), None)
    if k is None:
        raise recipe_error(path, "command", command[:3], "runs no Python training script")
    launcher, tokens = command[:k], command[k + 1:]
    nproc = _int_or_none(launcher_option(launcher, "--nproc_per_node", "--nproc-per-node"))
    nnodes = _int_or_none(launcher_option(launcher, "--nnodes"))
    keys = []
    num_gpus = None
    if nproc is not None:
        keys.append(RecipeKey(key="torchrun --nproc_per_node", value=nproc, maps_to="cluster.gpus_per_node"))
        if nnodes is not None:
            num_gpus = nproc * nnodes
            keys.append(RecipeKey(key="torchrun --nnodes", value=nnodes, maps_to="cluster.num_gpus"))
    return read_megatron(path, options_from_tokens(path, tokens), dialect="Kubeflow PyTorchJob running Megatron-LM",
                         model=model, num_gpus=num_gpus, gpus_per_node=nproc, extra_keys=tuple(keys))


__all__ = ["read_launch", "as_int"]
