"""NeMo 2 / Megatron-Bridge configuration dumps and overrides (YAML), and NeMo 1 model configs.

Three forms share Megatron-Core's ``TransformerConfig`` key names (``tensor_model_parallel_size``,
``num_layers_in_first_pipeline_stage``, ``pipeline_model_parallel_layout``, ``recompute_granularity``,
``fp8_recipe``, ...), which this reader translates into the Megatron-LM options they mirror and
reads with ``planner.recipes.megatron`` (one reading of their meaning), reporting every key under
its own name:

* Megatron-Bridge ``ConfigContainer`` (``run_config.yaml`` dumps and the override files of its
  recipes; 2025-2026): sections ``model`` (the model provider: architecture and parallelism),
  ``train`` (``micro_batch_size``, ``global_batch_size``), ``ddp`` (``use_distributed_optimizer``,
  ``overlap_grad_reduce``, ``use_megatron_fsdp``, ``data_parallel_sharding_strategy``),
  ``optimizer`` (``optimizer_cpu_offload``), ``comm_overlap`` (``tp_comm_overlap``,
  ``overlap_p2p_comm``), ``mixed_precision`` (a recipe name such as ``bf16_mixed`` or
  ``bf16_with_fp8_current_scaling_mixed``, or its fields), ``dataset.seq_length``, ``dist``;
  a top-level ``ConfigContainer:`` wrapper (performance configs) is unwrapped;
* NeMo 2 ``io`` dumps (``context/model.yaml``: ``_target_: ...GPTModel`` with ``config``
  holding the ``GPTConfig``, ``optim.config`` the optimizer; 2024-2025) and NeMo 2 trainer dumps
  (``trainer.strategy``: ``MegatronStrategy`` degrees, ``trainer.devices/num_nodes``,
  ``data.micro_batch_size/global_batch_size/seq_length``);
* NeMo 1 ``megatron_*_config.yaml`` (``trainer.devices``, ``trainer.num_nodes``,
  ``trainer.precision``; ``model.micro_batch_size``, ``encoder_seq_length``,
  ``activations_checkpoint_granularity``, ``activation: fast-swiglu``, ``optim.name:
  distributed_fused_adam``, ``fp8`` with ``fp8_hybrid``, ``ub_tp_comm_overlap``), with OmegaConf
  ``${a.b}`` / ``${.b}`` interpolations resolved.

Settings a dump leaves out take the NeMo profile's recipe defaults (distributed optimizer,
overlapped gradient reduction, sequence parallelism and TP overlap with tp > 1;
catalogs/frameworks.yaml ``nemo``), each said in the warnings.  Key table: docs/recipes/nemo.md.
"""

from __future__ import annotations

import re
from pathlib import Path

from sim.base.errors import InputError
from sim.data.specs import Model

from planner.recipes.base import Recipe, RecipeKey, as_int, flatten, recipe_error
from planner.recipes.megatron import read_megatron

VERSIONS = ("Megatron-Bridge ConfigContainer (2025-2026), NeMo 2 io/trainer dumps (2024-2025), NeMo 1 "
            "megatron_*_config.yaml (Megatron-Core TransformerConfig key names)")

# key (last path component) -> Megatron-LM option, where the name is not just --with-dashes
RENAMED: dict[str, str] = {
    "num_moe_experts": "--num-experts",
    "virtual_pipeline_model_parallel_size": "--num-virtual-stages-per-pipeline-rank",
    "num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "encoder_seq_length": "--seq-length",
    "seq_length": "--seq-length",
    "activations_checkpoint_granularity": "--recompute-granularity",
    "activations_checkpoint_method": "--recompute-method",
    "activations_checkpoint_num_layers": "--recompute-num-layers",
    "ub_tp_comm_overlap": "--tp-comm-overlap",
    "layernorm_epsilon": "--norm-epsilon",
    "cpu_offloading_num_layers": "--cpu-offloading-num-layers",
    "fp8_params": "--fp8-param-gather",  # NeMo 1 / MLPerf: TE fp8_model_init (fp8 weights as the parameters)
    "use_custom_fsdp": "--use-megatron-fsdp",
    "overlap_p2p_comm": "--overlap-p2p-communication",
}
# keys whose meaning needs more than a rename (handled in _translate)
SPECIAL = {"share_embeddings_and_output_weights", "gated_linear_unit", "activation", "activation_func", "fp8",
           "fp8_hybrid", "fp8_e4m3", "mixed_precision", "precision", "devices", "num_nodes", "num_query_groups",
           "pipeline_model_parallel_layout", "name", "attention_backend", "bf16", "fp16", "megatron_amp_O2",
           "_target_", "_call_", "params_dtype", "pipeline_dtype", "autocast_dtype"}
# Megatron-Bridge / NeMo 2 mixed-precision recipe names (megatron/bridge/training/mixed_precision.py)
MIXED_PRECISION = {
    "bf16_mixed": ("bf16", None), "fp16_mixed": ("fp16", None), "32": ("fp32", None), "fp32": ("fp32", None),
    "bf16_with_fp8_delayed_scaling_mixed": ("fp8", "delayed"), "fp16_with_fp8_delayed_scaling_mixed": ("fp8", "delayed"),
    "bf16_with_mxfp8_mixed": ("fp8", "mxfp8"), "fp16_with_mxfp8_mixed": ("fp8", "mxfp8"),
    "bf16_with_fp8_current_scaling_mixed": ("fp8", "tensorwise"),
    "fp16_with_fp8_current_scaling_mixed": ("fp8", "tensorwise"),
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": ("fp8", "tensorwise"),
    "nanov2_bf16_with_fp8_current_scaling_mixed": ("fp8", "tensorwise"),
    "bf16_with_fp8_subchannel_scaling_mixed": ("fp8", "blockwise"),
    "fp16_with_fp8_subchannel_scaling_mixed": ("fp8", "blockwise"),
    "bf16_with_nvfp4_mixed": ("fp4", None), "nemotron_3_super_bf16_with_nvfp4_mixed": ("fp4", None),
}
_TRAINER_PRECISION = {"bf16": "bf16", "bf16-mixed": "bf16", "bf16_mixed": "bf16", "16": "fp16", "16-mixed": "fp16",
                      "fp16": "fp16", "32": "fp32", "32-true": "fp32", "fp32": "fp32"}
_SECTIONS = ("model", "train", "ddp", "optimizer", "scheduler", "dataset", "logger", "tokenizer", "checkpoint",
             "dist", "rng", "rerun_state_machine", "profiling", "comm_overlap", "mixed_precision", "peft",
             "inprocess_restart", "ft", "straggler", "nvrx_straggler", "validation", "tensor_inspect", "env_vars")


def _resolve_interpolations(doc: object) -> object:
    """OmegaConf ``${a.b}`` (absolute) and ``${.b}`` (sibling) references, as far as they
    resolve to plain values; others (resolvers such as ``${multiply:...}``) stay as text."""
    def lookup(path: list[str], node: object) -> object:
        for p in path:
            if not isinstance(node, dict) or p not in node:
                return None
            node = node[p]
        return node

    def walk(node: object, parents: list[dict]) -> object:
        if isinstance(node, dict):
            return {k: walk(v, parents + [node]) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, parents) for v in node]
        if isinstance(node, str):
            mt = re.fullmatch(r"\$\{(\.*)([A-Za-z_][\w.]*)\}", node.strip())
            if mt:
                dots, ref = mt.group(1), mt.group(2).split(".")
                base = parents[-len(dots)] if dots and len(dots) <= len(parents) else parents[0] if parents else {}
                got = lookup(ref, base)
                if got is not None and not isinstance(got, (dict, list)):
                    return walk(got, parents) if isinstance(got, str) and got.startswith("${") else got
        return node

    return walk(doc, [])


def _dialect(doc: dict) -> tuple[str, dict]:
    """(dialect, the mapping to read)."""
    if "ConfigContainer" in doc and isinstance(doc["ConfigContainer"], dict):
        return "Megatron-Bridge ConfigContainer (performance config)", doc
    target = str(doc.get("_target_", ""))
    if target.startswith("nemo.") or "nemo.collections" in str(doc.get("model", {}).get("_target_", "")
                                                                  if isinstance(doc.get("model"), dict) else ""):
        return "NeMo 2 io dump", doc
    trainer = doc.get("trainer")
    if isinstance(trainer, dict) and isinstance(trainer.get("strategy"), dict):
        return "NeMo 2 trainer dump", doc
    if isinstance(trainer, dict) and isinstance(doc.get("model"), dict) and \
            any(k in doc["model"] for k in ("micro_batch_size", "encoder_seq_length", "mcore_gpt")):
        return "NeMo 1 model config", doc
    if any(k in doc for k in _SECTIONS):
        return "Megatron-Bridge ConfigContainer", doc
    raise recipe_error("", "yaml", sorted(doc)[:6], "not a NeMo / Megatron-Bridge configuration (no model, train or "
                       "trainer section)")


def _translate(path: str, flat: list[tuple[str, object]], warn: list[str]) -> tuple[
        list[tuple[str, object]], dict[str, str], list[RecipeKey], dict[str, object]]:
    """Megatron options for the flat keys, the option -> original key map, the keys read here
    (cluster, precision, ignored), and cluster/precision values."""
    opts: list[tuple[str, object]] = []
    origin: dict[str, str] = {}
    keys: list[RecipeKey] = []
    extra: dict[str, object] = {}
    heads = dict(flat)

    def add(opt: str, value: object, key: str) -> None:
        opts.append((opt, value))
        origin[opt] = key

    fp8_fmt = None
    for key, value in flat:
        name = key.rsplit(".", 1)[-1]
        section = key.split(".", 1)[0]
        if section in ("logger", "checkpoint", "tokenizer", "rng", "profiling", "scheduler", "exp_manager",
                       "rerun_state_machine", "env_vars", "validation", "ft", "straggler", "nvrx_straggler",
                       "inprocess_restart", "tensor_inspect", "peft", "perf_matrix") \
                or name in ("_target_", "_call_") or ".tokenizer." in f".{key}." or key.startswith("model.data."):
            if name == "pretrained_model_name" and isinstance(value, str):
                extra["tokenizer"] = value
            if name == "type" and ".tokenizer." in f".{key}." and isinstance(value, str):
                extra["tokenizer_type"] = value
            if section == "perf_matrix":
                continue
            keys.append(RecipeKey(key=key, value=value, cost="no" if section != "perf_matrix" else "unknown",
                                  note="" if name not in ("_target_",) else "class name"))
            continue
        if section == "perf_matrix":
            continue
        if value is None:
            keys.append(RecipeKey(key=key, value=None, cost="no", note="unset"))
            continue
        if isinstance(value, str) and "${" in value:  # an OmegaConf resolver the reader does not evaluate
            keys.append(RecipeKey(key=key, value=value, cost="unknown", note="OmegaConf resolver not evaluated"))
            warn.append(f"{key} = {value}: OmegaConf resolver not evaluated (key ignored)")
            continue
        if name in ("devices", "num_nodes") and section == "trainer":
            if isinstance(value, int) and not isinstance(value, bool):
                extra[name] = value
                keys.append(RecipeKey(key=key, value=value, maps_to="cluster.num_gpus"))
            else:
                keys.append(RecipeKey(key=key, value=value, cost="no", note="not a number"))
            continue
        if name == "precision" and section == "trainer":
            extra["precision"] = _TRAINER_PRECISION.get(str(value).lower())
            if extra["precision"] is None:
                raise recipe_error(path, key, value, f"must be one of {', '.join(_TRAINER_PRECISION)}")
            keys.append(RecipeKey(key=key, value=value, maps_to="strategy.precision"))
            continue
        if key == "mixed_precision" and isinstance(value, str):
            prec = MIXED_PRECISION.get(value.replace("-", "_"))
            if prec is None:
                raise recipe_error(path, key, value, f"unknown mixed-precision recipe (known: {', '.join(MIXED_PRECISION)})")
            extra["precision"] = prec[0]
            if prec[1]:
                extra["fp8_recipe"] = prec[1]
            keys.append(RecipeKey(key=key, value=value, maps_to="strategy.precision"))
            continue
        if section == "mixed_precision" and name in ("bf16", "fp16", "fp8", "fp8_recipe"):
            pass  # MixedPrecisionConfig fields: the same names as the model's, below
        if name in ("bf16", "fp16"):
            if value is True:
                add(f"--{name}", True, key)
            else:
                keys.append(RecipeKey(key=key, value=value, cost="no", note="false"))
            continue
        if name == "megatron_amp_O2":
            keys.append(RecipeKey(key=key, value=value, cost="no", note="NeMo 1 master weights in fp32 (the planner's "
                                                                          "mixed-precision Adam)"))
            continue
        if name in ("params_dtype", "pipeline_dtype", "autocast_dtype"):
            keys.append(RecipeKey(key=key, value=value, cost="no"))
            continue
        if name == "fp8":
            if isinstance(value, str) and value in ("hybrid", "e4m3"):
                fp8_fmt = value
                add("--fp8-format", value, key)
            elif value is True:
                fp8_fmt = "hybrid" if heads.get(key.rsplit(".", 1)[0] + ".fp8_hybrid", True) else "e4m3"
                add("--fp8-format", fp8_fmt, key)
            else:
                keys.append(RecipeKey(key=key, value=value, cost="no", note="off"))
            continue
        if name in ("fp8_hybrid", "fp8_e4m3"):
            keys.append(RecipeKey(key=key, value=value, cost="no", note="fp8 format (with fp8)"))
            continue
        if name == "share_embeddings_and_output_weights":
            if value is False or str(value).lower() == "false":
                add("--untie-embeddings-and-output-weights", True, key)
            else:
                add("--untie-embeddings-and-output-weights", "false", key)
            continue
        if name in ("gated_linear_unit", "activation", "activation_func"):
            gated = value is True if name == "gated_linear_unit" else \
                ("swiglu" in str(value) or "silu" in str(value) or "glu" in str(value))
            if name == "activation_func" and not gated:
                keys.append(RecipeKey(key=key, value=value, cost="no", note="with gated_linear_unit"))
                continue
            add("--swiglu", "true" if gated else "false", key)
            continue
        if name == "num_query_groups":
            heads_n = heads.get(key.rsplit(".", 1)[0] + ".num_attention_heads")
            if value != heads_n:
                add("--group-query-attention", True, key)
            add("--num-query-groups", value, key)
            continue
        if name == "pipeline_model_parallel_layout":
            if isinstance(value, list):
                value = "|".join("".join({"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}.get(
                    str(x).lower(), "?") for x in stage) for stage in value)
            add("--pipeline-model-parallel-layout", str(value), key)
            continue
        if name == "name" and section in ("model", "optim") and key.endswith("optim.name"):
            if "distributed" in str(value):
                add("--use-distributed-optimizer", True, key)
            else:
                keys.append(RecipeKey(key=key, value=value, cost="no", note="optimizer"))
            continue
        if name == "attention_backend":
            add("--attention-backend", str(value).rsplit(".", 1)[-1], key)
            continue
        opt = RENAMED.get(name, "--" + name.replace("_", "-"))
        if isinstance(value, bool):
            add(opt, True if value else "false", key)
        elif isinstance(value, list):
            add(opt, [str(x) for x in value], key)
        elif isinstance(value, dict):
            keys.append(RecipeKey(key=key, value="{...}", cost="unknown"))
        else:
            add(opt, str(value), key)
    return opts, origin, keys, extra


def read_nemo(path: str, doc: object, *, model: Model | None = None) -> Recipe:
    if not isinstance(doc, dict):
        raise recipe_error(path, "yaml", type(doc).__name__, "must be a mapping")
    try:
        dialect, body = _dialect(doc)
    except InputError as exc:  # re-raised with the file name
        raise recipe_error(path, "yaml", exc.value, exc.message) from None
    if "ConfigContainer" in body:
        body = {**body["ConfigContainer"], **{k: v for k, v in body.items() if k != "ConfigContainer"}}
    body = _resolve_interpolations(body)
    if dialect == "NeMo 2 io dump":
        body = {"model": body.get("config", {}), **{k: v for k, v in body.items() if k != "config"}}
    flat = flatten(body)
    # the NeMo 2 trainer strategy and data module carry the degrees and batch
    flat = [(k.replace("trainer.strategy.", "model.").replace("data.", "train.", 1) if k.startswith(
        ("trainer.strategy.", "data.")) else k, v) for k, v in flat]
    warn: list[str] = []
    opts, origin, keys, extra = _translate(path, flat, warn)
    if extra.get("precision") == "fp32":
        raise recipe_error(path, "precision", "32", "fp32 training is not modelled (precisions: bf16, fp16, fp8)")
    if extra.get("precision") == "fp4":
        raise recipe_error(path, "mixed_precision", "nvfp4", "fp4 training is not modelled (precisions: bf16, fp16, fp8)")
    if extra.get("precision") == "fp8":
        opts.append(("--fp8-format", dict(opts).get("--fp8-format", "hybrid")))
        if "fp8_recipe" in extra:
            opts.append(("--fp8-recipe", extra["fp8_recipe"]))
    elif extra.get("precision") in ("bf16", "fp16"):
        opts.append((f"--{extra['precision']}", True))
    num_gpus = gpus_per_node = None
    if "devices" in extra:
        gpus_per_node = int(extra["devices"])  # type: ignore[call-overload]
        num_gpus = gpus_per_node * int(extra.get("num_nodes", 1))  # type: ignore[call-overload]
    if model is None and "tokenizer" in extra and not any(k == "--vocab-size" for k, _ in opts):
        tok = str(extra["tokenizer"])
        if tok == "gpt2":
            opts.append(("--tokenizer-type", "GPT2BPETokenizer"))
    if model is None and "tokenizer_type" in extra and not any(k == "--vocab-size" for k, _ in opts):
        opts.append(("--tokenizer-type", str(extra["tokenizer_type"])))
    try:
        recipe = read_megatron(path, opts, dialect=dialect, model=model, num_gpus=num_gpus,
                               gpus_per_node=gpus_per_node, warnings=warn, default_precision="bf16", framework="nemo",
                               versions=VERSIONS, format="nemo")
    except InputError as exc:  # name the key as the file does
        head, _, option = exc.field.rpartition(": ")
        if option in origin:
            raise InputError(f"{head}: {origin[option]}" if head else origin[option], exc.value, exc.message) from None
        raise
    # report every key under its own name
    renamed = []
    for k in recipe.keys:
        src = origin.get(k.key)
        if src is None and k.key in ("--fp8-format", "--fp8-recipe", "--bf16", "--fp16", "--tokenizer-type"):
            continue  # synthesised from mixed_precision / trainer.precision / the tokenizer
        renamed.append(RecipeKey(key=src or k.key, value=k.value, maps_to=k.maps_to, cost=k.cost, note=k.note))
    st = dict(recipe.settings)
    mapped = {k.maps_to for k in renamed}
    defaults = []
    if "strategy.dp_overlap" not in mapped:
        st["dp_overlap"] = True
        defaults.append("gradient reduction overlapped")
    if "strategy.zero" not in mapped:
        st["zero"] = 1
        defaults.append("distributed optimizer")
    tp = int(st.get("tp", 1))
    if tp > 1 and "strategy.sp" not in mapped:
        st["sp"] = True
        defaults.append("sequence parallelism")
    if tp > 1 and st.get("sp") and "strategy.tp_overlap" not in mapped:
        st["tp_overlap"] = True
        defaults.append("TP communication overlap")
    warnings = list(recipe.warnings)
    if defaults:
        warnings.append("not stated, NeMo recipe defaults assumed (catalogs/frameworks.yaml nemo): " + ", ".join(defaults))
    from dataclasses import replace

    return replace(recipe, settings=st, keys=tuple(keys) + tuple(renamed), warnings=tuple(warnings),
                   layout=recipe.layout.replace("--pipeline-model-parallel-layout", "pipeline_model_parallel_layout"))


__all__ = ["read_nemo", "as_int", "Path"]
