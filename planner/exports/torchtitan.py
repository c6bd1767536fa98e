"""A torchtitan job config (TOML; sections and keys of ``torchtitan/config/job_config.py``).

* ``[parallelism]``: ``data_parallel_replicate_degree`` / ``data_parallel_shard_degree`` carry
  the data-parallel degree: ZeRO-0 is plain replication (DDP), ZeRO-3 is FSDP
  (``shard = dp``) or HSDP (``shard = dp_shard``); torchtitan has no optimizer-only sharding,
  so ZeRO-1/2 plans are refused (the torchtitan profile's capabilities);
  ``expert_tensor_parallel_degree``, ``module_fqns_per_model_part`` for uneven stages;
  ``tensor_parallel_degree``, ``context_parallel_degree``, ``expert_parallel_degree``,
  ``pipeline_parallel_degree``, ``pipeline_parallel_schedule`` (``torch.distributed.pipelining``
  names: ``1F1B``, ``GPipe``, ``Interleaved1F1B``, ``InterleavedZeroBubble``,
  ``ZBVZeroBubble``), ``pipeline_parallel_microbatch_size``,
  ``pipeline_parallel_layers_per_stage``;
* ``[training]``: ``local_batch_size`` is the batch of one data-parallel rank per optimizer step
  with pipelining (split into micro-batches of ``pipeline_parallel_microbatch_size``) and the
  micro-batch without it (torchtitan then accumulates ``global / (local * dp)`` steps);
  ``global_batch_size``, ``seq_len``;
* ``[activation_checkpoint] mode``: ``none``, ``selective`` (``selective_ac_option = "op"``) or
  ``full``; fp8 enables the ``float8`` (tensorwise) or ``mx`` (MXFP8) model converter;
* the pipeline split the plan was priced with, always stated: ``module_fqns_per_model_part``
  from the plan's layout (``Strategy.pipeline_layout``, else ``sim.cost.plan.default_layout``);
* ``[model] name`` and ``flavor`` as torchtitan ships them (catalogs/torchtitan_flavors.yaml:
  Llama 3 70B is ``llama3`` / ``70B``); a model torchtitan has no flavor for is written with a
  marked placeholder flavor and a warning (register the architecture as a flavor);
* a runnable job: ``[training] steps`` (from the token budget, else a placeholder),
  ``dataset`` (torchtitan's built-in ``c4``, a placeholder for your data), ``[model]
  hf_assets_path`` (tokenizer, a placeholder path), ``[optimizer]`` and ``[lr_scheduler]`` as
  torchtitan's own ``llama3_70b.toml`` (AdamW, lr 1.5e-4, eps 1e-8, 200 warm-up steps; not
  modelled, tune them).  Written in the last TOML schema (torchtitan before 9810191bb, 2026-02;
  later releases take Python configurations and the same keys as ``--section.option`` flags);
* offload: ``params`` (FSDP, ZeRO-3, on the CPU) is ``[training] enable_cpu_offload = true``
  ("CPU offloading of parameters, gradients, and optimizer states in FSDP", FSDP2's
  ``CPUOffloadPolicy``); torchtitan has no optimizer-only, NVMe or activation offload, so those
  plans are refused (``InputError``), as is CPU offload without FSDP sharding (``dp * cp == 1``).
"""

from __future__ import annotations

from sim.base.errors import InputError
from sim.data.layout import rank_chunks
from sim.cost.plan import default_layout

from planner.exports import LaunchSpec, Rendered
from planner.recipes.torchtitan import flavor_of_model

SCHEDULES = {("1f1b", False): "1F1B", ("gpipe", False): "GPipe", ("interleaved", True): "Interleaved1F1B",
             ("zero-bubble", True): "InterleavedZeroBubble"}


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    text = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def dumps(sections: dict[str, dict[str, object]], comment: str = "",
          notes: dict[str, str] | None = None) -> str:
    """TOML text; ``notes`` puts a comment after ``section.key``."""
    notes = notes or {}
    lines = [f"# {c}" for c in comment.splitlines()] if comment else []
    for name, table in sections.items():
        lines.append("")
        lines.append(f"[{name}]")
        for k, v in table.items():
            note = notes.get(f"{name}.{k}")
            lines.append(f"{k} = {_toml_value(v)}" + (f"  # {note}" if note else ""))
    return "\n".join(lines) + "\n"


def model_parts(layout: tuple[str, ...], pp: int) -> list[list[str]]:
    """``module_fqns_per_model_part`` of a pipeline layout (virtual stage order)."""
    parts, nxt = [], 0
    for stage in layout:
        part = []
        for ch in stage:
            if ch == "E":
                part.append("tok_embeddings")
            elif ch == "t":
                part.append(f"layers.{nxt}")
                nxt += 1
            elif ch == "L":
                part += ["norm", "output"]
        parts.append(part)
    assert len(rank_chunks(layout, pp)) == pp
    return parts


def torchtitan_config(spec: LaunchSpec) -> tuple[dict[str, dict[str, object]], list[str], dict[str, str]]:
    m, s = spec.model, spec.strategy
    warn: list[str] = []
    notes: dict[str, str] = {}
    if s.pipeline_layout is not None and "m" in "".join(s.pipeline_layout):
        raise InputError("export", "torchtitan", "the plan's pipeline layout has MTP layers (m), which torchtitan's "
                         "model parts cannot hold")
    if s.recompute_num_layers is not None:
        raise InputError("export", "torchtitan", f"recompute_num_layers={s.recompute_num_layers} "
                         f"({s.recompute_method}): torchtitan's activation checkpointing is full, op-level selective "
                         "or every k-th block (selective_ac_option), not Megatron's partial block/uniform method")
    if s.offload != "none" and (s.offload != "params" or s.offload_device != "cpu" or s.dp * s.cp == 1):
        raise InputError("export", "torchtitan", f"offload={s.offload} ({s.offload_device}, dp*cp={s.dp * s.cp}) "
                         "cannot be expressed: torchtitan offloads only FSDP parameters, gradients and optimizer "
                         "states together to the CPU (offload=params, data_parallel_shard_degree > 1)")
    # ZeRO-0: replication (DDP); ZeRO-3: FSDP over dp, or HSDP (shard within dp_shard ranks,
    # replicate across dp / dp_shard groups).  capabilities refuse ZeRO-1/2 before this.
    shard = 1 if s.zero == 0 else (s.dp_shard or s.dp)
    parallel: dict[str, object] = {
        "data_parallel_replicate_degree": s.dp // shard,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": s.tp,
        "enable_async_tensor_parallel": bool(s.tp_overlap),
        "context_parallel_degree": s.cp,
        "expert_parallel_degree": s.ep,
        "pipeline_parallel_degree": s.pp,
    }
    if s.etp is not None:
        parallel["expert_tensor_parallel_degree"] = s.etp
    if s.pp > 1:
        parallel["pipeline_parallel_schedule"] = SCHEDULES[(s.schedule, s.vp > 1)]
        parallel["pipeline_parallel_microbatch_size"] = s.mbs
        # the split the plan was priced with, module by module (torchtitan's own default split
        # counts the embedding and output as layers, which the planner's default does not)
        layout = s.pipeline_layout if s.pipeline_layout is not None else default_layout(m, s)
        parallel["module_fqns_per_model_part"] = model_parts(layout, s.pp)
    local = s.gbs // s.dp if s.pp > 1 else s.mbs
    training: dict[str, object] = {"local_batch_size": local, "global_batch_size": s.gbs, "seq_len": s.seq_len,
                                   "mixed_precision_param": "float16" if s.precision == "fp16" else "bfloat16",
                                   "mixed_precision_reduce": "float32",
                                   "steps": spec.steps if spec.steps is not None else 1000, "max_norm": 1.0,
                                   "dataset": "c4"}
    notes["training.steps"] = ("optimizer steps of the token budget" if spec.steps is not None else
                               "PLACEHOLDER: steps to run (no token budget was given)")
    notes["training.dataset"] = "PLACEHOLDER: your dataset (torchtitan's built-in c4 streams from the Hugging Face Hub)"
    if s.offload_params:
        training["enable_cpu_offload"] = True
    shipped = flavor_of_model(m)
    if shipped is not None:
        name, flavor = shipped
    else:
        name = "deepseek_v3" if m.is_mla else ("llama3" if m.moe is None else "llama4")
        flavor = m.name
        notes["model.flavor"] = f"PLACEHOLDER: torchtitan ships no {name} flavor of this architecture; register it"
        warn.append(f"[model] flavor {flavor!r} is a placeholder: torchtitan ships no {name} flavor of {m.name}'s "
                    "architecture (catalogs/torchtitan_flavors.yaml); register it as a model flavor")
    if spec.attention == "flex":
        # FlexAttention is a model argument in torchtitan (use_flex_attn in torchtitan/models/*/model/args.py,
        # set by the flavor; the gpt-oss flavors have it on), not a job-config key
        flex_note = "the plan runs FlexAttention: use a flavor whose model args set use_flex_attn = True"
        notes["model.flavor"] = "; ".join(filter(None, (notes.get("model.flavor"), flex_note)))
        warn.append("attention flex: torchtitan turns FlexAttention on in the model flavor's args (use_flex_attn), "
                    f"which the job TOML cannot set; run [model] flavor {flavor!r} with use_flex_attn = True")
    converter = {"tensorwise": "float8", "mxfp8": "mx"}.get(s.fp8_recipe, "float8")
    model: dict[str, object] = {"name": name, "flavor": flavor, "hf_assets_path": "./assets/hf/tokenizer",
                                "converters": [converter] if s.precision == "fp8" else []}
    notes["model.hf_assets_path"] = "PLACEHOLDER: the model's Hugging Face tokenizer files"
    ac: dict[str, object] = {"mode": s.recompute}
    if s.recompute == "selective":
        ac["selective_ac_option"] = "op"
    sections = {
        "job": {"description": f"{m.name} on {spec.num_gpus} GPUs: {s.to_string()}", "dump_folder": "./outputs"},
        "model": model,
        # optimizer (not modelled): torchtitan's torchtitan/models/llama3/train_configs/llama3_70b.toml
        "optimizer": {"name": "AdamW", "lr": 1.5e-4, "eps": 1e-8},
        "lr_scheduler": {"warmup_steps": 200},
        "training": training,
        "parallelism": parallel,
        "activation_checkpoint": ac,
        # torch.compile of the model (the torchtitan-compile profile: fused element-wise ops, async TP)
        "compile": {"enable": spec.framework == "torchtitan-compile", "components": ["model", "loss"]},
    }
    if s.precision == "fp8" and converter == "float8":
        sections["float8"] = {"recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": s.zero >= 1}
    elif s.precision == "fp8":
        sections["mx"] = {"recipe_name": "mxfp8"}
    return sections, warn, notes


def render_torchtitan(spec: LaunchSpec) -> Rendered:
    sections, warn, notes = torchtitan_config(spec)
    comment = (f"torchtitan job config for {spec.model.name} on {spec.num_gpus} GPUs, written by `planner recommend`.\n"
               f"strategy: {spec.strategy.to_string()}\n"
               f"run: torchrun --nnodes {spec.num_nodes} --nproc_per_node {spec.procs_per_node} "
               "-m torchtitan.train --job.config_file torchtitan.toml")
    return Rendered(files={"torchtitan.toml": dumps(sections, comment, notes)}, warnings=warn)
