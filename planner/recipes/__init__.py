"""Bring your own recipe: read a training framework's own configuration into the planner.

``read_recipe(path)`` recognises the format and returns a ``planner.recipes.base.Recipe``:

* Megatron-LM / Megatron-Core argument lists: a launch script (bash, Slurm), an args file, or
  the ``MODEL_ARGS`` mapping of a functional-test ``model_config.yaml`` (``megatron.py``);
* NeMo 2 / Megatron-Bridge configuration dumps and overrides (YAML: a ``ConfigContainer``, a
  NeMo 2 ``io`` dump, a NeMo 1 ``megatron_*_config.yaml``; ``nemo.py``);
* torchtitan job TOML, 2024 to the last TOML release (renamed keys included; ``torchtitan.py``);
* DeepSpeed JSON (``deepspeed.py``), with the model from ``--model``.

``resolve(recipe, model=..., num_gpus=...)`` turns the recipe's settings into the ``Strategy``
it runs once the GPU count is known (data parallelism is what the degrees leave), checking the
recipe's own batch arithmetic; ``cli_inputs`` gives the values the command-line flags would
(the thin hook of ``simulate --recipe`` and ``recommend --recipe``).  Each format's key table:
docs/recipes/.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import yaml

from sim.base.errors import InputError
from sim.cost.plan import normalize_layout
from sim.data.specs import Model, Strategy

from planner.recipes.base import Recipe, RecipeKey, read_text, recipe_error

FORMATS: tuple[str, ...] = ("megatron", "nemo", "torchtitan", "deepspeed")


def detect(path: str, text: str) -> str:
    """The recipe format of ``path`` (by extension, then content)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".toml":
        return "torchtitan"
    if suffix == ".json":
        return "deepspeed"
    if suffix in (".yaml", ".yml"):
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InputError(f"{Path(path).name}", "yaml", f"is not valid YAML: {str(exc).splitlines()[0]}") from None
        if isinstance(doc, dict) and ("MODEL_ARGS" in doc or doc.get("kind") == "PyTorchJob"):
            return "megatron"
        return "nemo"
    return "megatron"


def read_recipe(path: str, *, model: Model | None = None, script_args: Sequence[str] = (),
                script_env: Mapping[str, str] | None = None) -> Recipe:
    """Read ``path`` (module docstring); ``model`` (from ``--model``) replaces the recipe's
    architecture and supplies one where the recipe names none.  A launch script runs with the
    positional arguments ``script_args`` in the environment ``script_env`` (``--recipe-args``,
    ``--recipe-env``: what its caller would pass); other formats take neither."""
    text = read_text(path)
    fmt = detect(path, text)
    if (script_args or script_env) and (fmt != "megatron" or Path(path).suffix.lower() in (".yaml", ".yml")):
        given = "recipe-args" if script_args else "recipe-env"
        raise InputError(given, " ".join(script_args) if script_args else ",".join(f"{k}={v}" for k, v in
                                                                                   (script_env or {}).items()),
                         f"applies to a launch script (bash), not {Path(path).name}")
    if fmt == "torchtitan":
        from planner.recipes.torchtitan import read_torchtitan

        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(Path(path).name, "toml", f"is not valid TOML: {exc}") from None
        return read_torchtitan(path, doc, model=model)
    if fmt == "deepspeed":
        from planner.recipes.deepspeed import read_deepspeed

        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(Path(path).name, "json", f"is not valid JSON: {exc.msg} (line {exc.lineno})") from None
        return read_deepspeed(path, doc, model=model)
    if fmt == "nemo":
        from planner.recipes.nemo import read_nemo

        return read_nemo(path, yaml.safe_load(text), model=model)
    from planner.recipes.launch import read_launch

    return read_launch(path, text, model=model, script_args=script_args, script_env=script_env)


def key_of(recipe: Recipe, field: str) -> str:
    """The recipe key that set ``strategy.<field>`` (for error messages)."""
    for k in recipe.keys:
        if k.maps_to == f"strategy.{field}":
            return k.key
    return field


def resolve(recipe: Recipe, *, model: Model, num_gpus: int, seq_len: int | None = None) -> Strategy:
    """The ``Strategy`` the recipe runs on ``num_gpus`` GPUs (module docstring); the recipe's
    own arithmetic that does not hold is an ``InputError`` naming the file and the key."""
    st = {k: v for k, v in recipe.settings.items() if not k.startswith("_")}
    tp, pp, cp = int(st.get("tp", 1)), int(st.get("pp", 1)), int(st.get("cp", 1))
    if num_gpus % (tp * pp * cp):
        raise recipe_error(recipe.path, "world size", num_gpus,
                           f"is not a multiple of tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp} "
                           "(give --num-gpus, or fix the recipe's degrees)")
    dp = num_gpus // (tp * pp * cp)
    if recipe.dp is not None and recipe.dp != dp:
        raise recipe_error(recipe.path, key_of(recipe, "dp"), recipe.dp,
                           f"states data parallelism {recipe.dp}, but {num_gpus} GPUs over tp*pp*cp = {tp * pp * cp} "
                           f"leave {dp}")
    st["dp"] = dp
    if "_tt_replicate" in recipe.settings:  # torchtitan: replicate x shard, shard -1 = the rest
        rep = int(recipe.settings["_tt_replicate"])  # type: ignore[call-overload]
        if dp % rep:
            raise recipe_error(recipe.path, "data_parallel_replicate_degree", rep, f"must divide data parallelism {dp}")
        shard = dp // rep
        st["zero"] = 3 if shard > 1 else 0
        if rep > 1 and shard > 1:
            st["dp_shard"] = shard
    inst = recipe.settings.get("_dp_instances")
    if inst:
        if dp % int(inst):  # type: ignore[call-overload]
            raise recipe_error(recipe.path, key_of(recipe, "dp_shard"), inst, f"must divide data parallelism {dp}")
        st["dp_shard"] = dp // int(inst)  # type: ignore[call-overload]
    if "_ds_micro_from_global" in recipe.settings:  # DeepSpeed: micro = train / (accumulation x dp)
        acc = int(recipe.settings["_ds_micro_from_global"])  # type: ignore[call-overload]
        if int(st["gbs"]) % (acc * dp):
            raise recipe_error(recipe.path, "train_batch_size", st["gbs"], f"must be a multiple of accumulation {acc} "
                               f"x data parallelism {dp}")
        st["mbs"] = int(st["gbs"]) // (acc * dp)
    if "_dp_shard_size" in recipe.settings:
        size = int(recipe.settings["_dp_shard_size"])  # type: ignore[call-overload]
        if dp % size:
            raise recipe_error(recipe.path, key_of(recipe, "dp_shard"), size, f"must divide data parallelism {dp}")
        st["dp_shard"] = size if size < dp else None
    mbs = int(st.get("mbs", 1))
    st["mbs"] = mbs
    if "gbs" not in st:  # Megatron-LM's default; readers set their framework's own
        st["gbs"] = mbs * dp * int(recipe.settings.get("_accumulation", 1))  # type: ignore[call-overload]
    gbs = int(st["gbs"])
    if gbs % (mbs * dp):
        raise recipe_error(recipe.path, key_of(recipe, "gbs"), gbs,
                           f"must be a multiple of micro-batch {mbs} x data parallelism {dp} = {mbs * dp}")
    if seq_len is not None:
        st["seq_len"] = seq_len
    vp = int(st.get("vp", 1))
    st.setdefault("schedule", "interleaved" if vp > 1 else "1f1b")
    if st.get("schedule") in ("1f1b", "gpipe") and pp == 1:
        st["schedule"] = "1f1b"
    try:
        s = Strategy(**st)  # type: ignore[arg-type]
    except InputError as exc:
        raise recipe_error(recipe.path, key_of(recipe, exc.field), exc.value, exc.message) from None
    if s.pipeline_layout is not None:
        s = normalize_layout(model, s)
    return s


def plan_overrides(recipe: Recipe) -> dict[str, object]:
    """``Plan`` fields the recipe states (attention kernel, selective policy, MoE dispatcher)."""
    return dict(recipe.plan)


def summary(recipe: Recipe, strategy: Strategy | None, *, model: Model | None, num_gpus: int | None) -> dict:
    """What ``planner import --json`` prints."""
    return {
        "recipe": recipe.path, "format": recipe.format, "dialect": recipe.dialect, "versions": recipe.versions,
        "framework": recipe.framework,
        "model": None if model is None else model.name, "model_source": recipe.model_note,
        "num_gpus": num_gpus, "gpus_per_node": recipe.gpus_per_node,
        "strategy": None if strategy is None else strategy.to_string(),
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in recipe.settings.items()
                     if not k.startswith("_") and k != "pipeline_layout"},
        "pipeline_layout": recipe.layout or None,
        "plan": dict(recipe.plan),
        "keys": [k.as_dict() for k in recipe.keys if not k.ignored],
        "ignored": [k.as_dict() for k in recipe.ignored],
        "warnings": list(recipe.warnings),
    }


__all__ = ["FORMATS", "Recipe", "RecipeKey", "detect", "read_recipe", "resolve", "plan_overrides", "summary",
           "key_of", "replace"]
