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
* offload: ``params`` (FSDP, ZeRO-3, on the CPU) is ``[training] enable_cpu_offload = true``
  ("CPU offloading of parameters, gradients, and optimizer states in FSDP", FSDP2's
  ``CPUOffloadPolicy``); torchtitan has no optimizer-only, NVMe or activation offload, so those
  plans are refused (``InputError``), as is CPU offload without FSDP sharding (``dp * cp == 1``).
"""

from __future__ import annotations

from sim.errors import InputError

from planner.exports import LaunchSpec, Rendered

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


def dumps(sections: dict[str, dict[str, object]], comment: str = "") -> str:
    lines = [f"# {c}" for c in comment.splitlines()] if comment else []
    for name, table in sections.items():
        lines.append("")
        lines.append(f"[{name}]")
        for k, v in table.items():
            lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def torchtitan_config(spec: LaunchSpec) -> tuple[dict[str, dict[str, object]], list[str]]:
    m, s = spec.model, spec.strategy
    warn: list[str] = []
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
        chunks = s.pp * s.vp
        if m.num_layers % chunks == 0:
            parallel["pipeline_parallel_layers_per_stage"] = m.num_layers // chunks
        else:  # name each model part's modules: as even as the layers allow
            base, extra = divmod(m.num_layers, chunks)
            parts, start = [], 0
            for k in range(chunks):
                n = base + (1 if k < extra else 0)
                parts.append((["tok_embeddings"] if k == 0 else []) + [f"layers.{i}" for i in range(start, start + n)]
                             + (["norm", "output"] if k == chunks - 1 else []))
                start += n
            parallel["module_fqns_per_model_part"] = parts
    local = s.gbs // s.dp if s.pp > 1 else s.mbs
    training: dict[str, object] = {"local_batch_size": local, "global_batch_size": s.gbs, "seq_len": s.seq_len,
                                   "mixed_precision_param": "float16" if s.precision == "fp16" else "bfloat16",
                                   "mixed_precision_reduce": "float32"}
    if spec.steps is not None:
        training["steps"] = spec.steps
    if s.offload_params:
        training["enable_cpu_offload"] = True
    flavor = "custom"
    name = "deepseek_v3" if m.is_mla else ("llama3" if m.ffn_type == "swiglu" and m.moe is None else
                                           ("llama4" if m.moe is not None else "llama3"))
    warn.append(f"[model] name/flavor are placeholders ({name}/{flavor}): register {m.name}'s architecture "
                "as a torchtitan model flavor")
    converter = {"tensorwise": "float8", "mxfp8": "mx"}.get(s.fp8_recipe, "float8")
    model: dict[str, object] = {"name": name, "flavor": flavor,
                                "converters": [converter] if s.precision == "fp8" else []}
    ac: dict[str, object] = {"mode": s.recompute}
    if s.recompute == "selective":
        ac["selective_ac_option"] = "op"
    sections = {
        "job": {"description": f"{m.name} on {spec.num_gpus} GPUs: {s.to_string()}", "dump_folder": "./outputs"},
        "model": model,
        "training": training,
        "parallelism": parallel,
        "activation_checkpoint": ac,
    }
    if s.precision == "fp8" and converter == "float8":
        sections["float8"] = {"recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": s.zero >= 1}
    elif s.precision == "fp8":
        sections["mx"] = {"recipe_name": "mxfp8"}
    return sections, warn


def render_torchtitan(spec: LaunchSpec) -> Rendered:
    sections, warn = torchtitan_config(spec)
    comment = (f"torchtitan job config for {spec.model.name} on {spec.num_gpus} GPUs, written by `planner recommend`.\n"
               f"strategy: {spec.strategy.to_string()}\n"
               f"run: torchrun --nnodes {spec.num_nodes} --nproc_per_node {spec.procs_per_node} "
               "-m torchtitan.train --job.config_file torchtitan.toml")
    return Rendered(files={"torchtitan.toml": dumps(sections, comment)}, warnings=warn)
