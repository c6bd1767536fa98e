"""torchtitan job TOML, from the first releases (2024) to the last TOML one (2026-02; torchtitan
replaced TOML by Python configuration registries in 9810191bb, "Config System Refactor").

Keys moved and were renamed over those two years; every form is read (docs/recipes/torchtitan.md):

* degrees in ``[training]`` (2024: ``data_parallel_degree``, then ``data_parallel_replicate_degree``
  / ``data_parallel_shard_degree``, ``tensor_parallel_degree``), ``[experimental]``
  (``pipeline_parallel_degree``, ``context_parallel_degree``, ``enable_async_tensor_parallel``,
  2024-2025) and ``[parallelism]`` (2025-04 on, with ``expert_parallel_degree`` /
  ``expert_tensor_parallel_degree``);
* the batch: ``[training] batch_size`` (per data-parallel rank, to 2025-06) then
  ``local_batch_size`` with ``global_batch_size`` (gradient accumulation); pipelining splits the
  local batch into ``pipeline_parallel_microbatches`` micro-batches (to 2025-04) or micro-batches
  of ``pipeline_parallel_microbatch_size``;
* the pipeline split: ``pipeline_parallel_split_points`` (to 2025-07), then
  ``module_fqns_per_model_part`` or ``pipeline_parallel_layers_per_stage``, else torchtitan's
  own even split with the embedding and the output counted as
  ``pipeline_parallel_first/last_stage_less_layers`` layers (1 each;
  ``generate_llm_fqn_per_model_part``): read as a pipeline layout, virtual stage ``k`` on rank
  ``k mod pp`` (looped schedules);
* fp8: ``[training] fp8_linear`` / ``enable_fp8_linear`` (2024), ``[float8]
  enable_float8_linear`` (2025-02), ``[model] converters = ["float8"]`` / ``["mx"]`` (2025-02 on)
  and ``quantize.linear.float8`` / ``quantize.linear.mx`` (2025-09 on), with ``recipe_name``;
* ``[compile] enable`` (2025-09 on) or ``[training] compile``: the torchtitan-compile profile.

The model is the ``[model]`` name and flavor (catalogs/torchtitan_flavors.yaml) or ``--model``.
Unset keys take torchtitan's defaults of the last TOML release (``torchtitan/config/job_config.py``
at 9810191bb^: ``local_batch_size`` 8, ``seq_len`` 2048, ``data_parallel_shard_degree`` -1,
``pipeline_parallel_schedule`` 1F1B, ``activation_checkpoint.mode`` selective with
``selective_ac_option`` "2").
"""

from __future__ import annotations

import math

from sim.data.catalog import catalog_document, get_model
from sim.data.layout import format_layout
from sim.data.modelio import model_from_dict
from sim.data.specs import Model

from planner.recipes.base import Recipe, RecipeKey, as_bool, as_int, classify, flatten, recipe_error

VERSIONS = "torchtitan job TOML, 2024-04 to 2026-02 (9810191bb^, the last TOML release), renamed keys included"

SCHEDULES = {"1F1B": ("1f1b", True), "GPipe": ("gpipe", True), "Interleaved1F1B": ("interleaved", False),
             "FlexibleInterleaved1F1B": ("interleaved", False), "LoopedBFS": ("interleaved", False),
             "InterleavedZeroBubble": ("zero-bubble", False)}
V_SHAPED = ("ZBVZeroBubble", "DualPipeV", "ScheduleDualPipeV")

COSTLY = {
    "parallelism.fsdp_reshard_after_forward": "never/always change what FSDP keeps between forward and backward",
    "parallelism.disable_loss_parallel": "the loss on gathered logits (memory and a gather)",
    "float8.enable_fsdp_float8_all_gather": "fp8 FSDP all-gathers (half the volume)",
    "quantize.linear.float8.enable_fsdp_float8_all_gather": "fp8 FSDP all-gathers (half the volume)",
    "float8.precompute_float8_dynamic_scale_for_fsdp": "one amax reduction for all weights",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": "one amax reduction for all weights",
    "float8.filter_fqns": "layers left in bf16",
    "quantize.linear.float8.filter_fqns": "layers left in bf16",
    "quantize.linear.mx.filter_fqns": "layers left in bf16",
    "model.norm_type": "fused RMSNorm kernel (fused_rmsnorm)",
    "parallelism.context_parallel_rotate_method": "CP ring (allgather) or all-to-all",
    "parallelism.context_parallel_load_balancer": "CP load balancing",
    "experimental.context_parallel_rotate_method": "CP ring (allgather) or all-to-all",
    "parallelism.pipeline_parallel_expert_parallel_overlap": "EP all-to-all overlapped in the pipeline",
    "training.gc_freq": "Python garbage collection every N steps",
    "activation_checkpoint.memory_budget": "memory-budget activation checkpointing",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": "op-level SAC detail",
    "training.enable_compiled_autograd": "compiled autograd",
    "parallelism.enable_compiled_autograd": "compiled autograd",
    "compile.components": "what torch.compile covers",
    "compile.backend": "torch.compile backend",
    "debug.moe_force_load_balance": "forces balanced routing (what the planner assumes)",
    "quantize.grouped_mm.float8.fqns": "fp8 expert grouped GEMMs (the planner prices experts at the plan's precision)",
    "quantize.grouped_mm.mx.fqns": "MXFP8 expert grouped GEMMs",
}
NO_COST = ("job.*", "metrics.*", "profiling.*", "checkpoint.*", "optimizer.*", "lr_scheduler.*", "validation.*",
           "comm.*", "fault_tolerance.*", "experimental.custom_*", "model.tokenizer_path", "model.hf_assets_path",
           "training.dataset*", "training.steps", "training.max_norm", "training.warmup_steps", "training.seed",
           "training.deterministic", "training.mixed_precision_reduce", "training.dataloader.*", "debug.*",
           "memory_estimation.*", "model.print_after_conversion", "training.dtype")


def flavors() -> list[dict]:
    return [dict(f) for f in catalog_document("torchtitan_flavors.yaml")["flavors"]]


def model_of_flavor(name: str, flavor: str) -> Model | None:
    for f in flavors():
        if f["name"] == name and str(f["flavor"]) == str(flavor):
            if "model" in f:
                return get_model(str(f["model"]))
            return model_from_dict(dict(f["architecture"]), where=f"torchtitan_flavors[{name}/{flavor}]")
    return None


def flavor_of_model(model: Model) -> tuple[str, str] | None:
    """torchtitan's (name, flavor) for a model of the same architecture, if torchtitan ships one."""
    for f in flavors():
        m = model_of_flavor(str(f["name"]), str(f["flavor"]))
        if m is not None and _same_shape(m, model):
            return str(f["name"]), str(f["flavor"])
    return None


def _same_shape(a: Model, b: Model) -> bool:
    keys = ("num_layers", "hidden_size", "num_attention_heads", "kv_heads", "ffn_hidden_size", "ffn_type",
            "vocab_size", "moe", "kv_lora_rank", "q_lora_rank")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def llm_parts(num_stages: int, num_layers: int, input_weight: int = 1, output_weight: int = 1) -> list[str]:
    """torchtitan's even split (``generate_llm_fqn_per_model_part``, 9810191bb^; the same
    arithmetic as ``generate_split_points`` before it): each virtual stage as layout text."""
    if num_stages == 1:
        return ["E" + "t" * num_layers + "L"]
    eff = num_layers + input_weight + output_weight
    per, extra = divmod(eff, num_stages)
    out, cur = [], 0
    for k in range(num_stages):
        n = per + (1 if k < extra else 0)
        if k == 0:
            take = max(0, n - input_weight)
        elif k == num_stages - 1:
            take = max(0, n - output_weight)
        else:
            take = n
        take = min(take, num_layers - cur)
        cur += take
        out.append(("E" if k == 0 else "") + "t" * take + ("L" if k == num_stages - 1 else ""))
    return out


def _parts_from_fqns(path: str, key: str, parts: object) -> list[str]:
    if not isinstance(parts, list) or not all(isinstance(p, list) for p in parts):
        raise recipe_error(path, key, parts, "must be a list of lists of module names")
    out = []
    for p in parts:
        text = ""
        for name in p:
            name = str(name)
            if name == "tok_embeddings":
                text += "E"
            elif name.startswith("layers."):
                text += "t"
            elif name == "output":
                text += "L"
        out.append(text)
    return out


def read_torchtitan(path: str, doc: dict, *, model: Model | None = None) -> Recipe:
    flat = dict(flatten(doc))
    used: dict[str, tuple[str, str]] = {}
    warn: list[str] = []

    def get(*keys: str, maps_to: str = "", note: str = "") -> tuple[str, object] | tuple[None, None]:
        for k in keys:
            if k in flat:
                used[k] = (maps_to, note)
                return k, flat[k]
        return None, None

    def integer(*keys: str, maps_to: str, default: int | None = None, minimum: int = 1, note: str = "") -> int | None:
        k, v = get(*keys, maps_to=maps_to, note=note)
        if k is None:
            return default
        return as_int(path, k, v, minimum=minimum)

    st: dict[str, object] = {}
    tp = integer("parallelism.tensor_parallel_degree", "training.tensor_parallel_degree", maps_to="strategy.tp",
                 default=1) or 1
    pp = integer("parallelism.pipeline_parallel_degree", "experimental.pipeline_parallel_degree",
                 "training.pipeline_parallel_degree", maps_to="strategy.pp", default=1) or 1
    cp = integer("parallelism.context_parallel_degree", "experimental.context_parallel_degree",
                 maps_to="strategy.cp", default=1) or 1
    ep = integer("parallelism.expert_parallel_degree", maps_to="strategy.ep", default=1) or 1
    etp = integer("parallelism.expert_tensor_parallel_degree", maps_to="strategy.etp")
    st.update(tp=tp, pp=pp, cp=cp, ep=ep)
    if etp is not None and etp != tp and ep > 1:
        st["etp"] = etp
    st["sp"] = tp > 1  # torchtitan's TP plan shards the sequence between the blocks
    k, v = get("parallelism.enable_async_tensor_parallel", "experimental.enable_async_tensor_parallel",
               maps_to="strategy.tp_overlap")
    if k is not None and as_bool(path, k, v):
        st["tp_overlap"] = True
    rep = integer("parallelism.data_parallel_replicate_degree", "training.data_parallel_replicate_degree",
                  maps_to="strategy.dp", default=1) or 1
    k, shard_v = get("parallelism.data_parallel_shard_degree", "training.data_parallel_shard_degree",
                     "training.data_parallel_degree", maps_to="strategy.zero", note="FSDP over the shard degree")
    shard = -1 if k is None else as_int(path, k, shard_v, minimum=-1)
    if shard == 0:
        raise recipe_error(path, k or "data_parallel_shard_degree", shard, "must be -1 (the rest) or >= 1")
    st["_tt_replicate"] = rep
    st["_tt_shard"] = shard
    dp = rep * shard if shard > 0 else None
    st["dp_overlap"] = True

    # batch
    k_local, local = get("training.local_batch_size", "training.batch_size", maps_to="strategy.gbs",
                         note="per data-parallel rank")
    local_n = 8 if k_local is None else as_int(path, k_local, local)
    glob = integer("training.global_batch_size", maps_to="strategy.gbs", minimum=-1)
    seq = integer("training.seq_len", maps_to="strategy.seq_len", default=2048)
    st["seq_len"] = seq
    if pp > 1:
        mb = integer("parallelism.pipeline_parallel_microbatch_size", maps_to="strategy.mbs")
        n_mb = integer("parallelism.pipeline_parallel_microbatches", "experimental.pipeline_parallel_microbatches",
                       maps_to="strategy.mbs", note="micro-batches of the local batch")
        if mb is None:
            if n_mb is None and "parallelism" in doc:  # 2025-04 on: micro-batches of size 1 by default
                mb = 1
            else:  # before: the local batch in pipeline_parallel_microbatches parts, pp by default
                n = n_mb or pp
                if local_n % n:
                    raise recipe_error(path, "pipeline_parallel_microbatches", n, f"must divide the local batch {local_n}")
                mb = local_n // n
        if local_n % mb:
            raise recipe_error(path, "pipeline_parallel_microbatch_size", mb, f"must divide the local batch {local_n}")
        st["mbs"] = mb
        st["_accumulation"] = local_n // mb
    else:
        st["mbs"] = local_n
    if glob is not None and glob > 0:
        st["gbs"] = glob

    # precision
    k, conv = get("model.converters", maps_to="strategy.precision")
    converters = [str(c) for c in conv] if isinstance(conv, list) else ([str(conv)] if conv else [])
    fp8 = None
    if any(c in ("float8", "quantize.linear.float8", "quantize.grouped_mm.float8") for c in converters):
        _, rec = get("quantize.linear.float8.recipe_name", "float8.recipe_name", maps_to="strategy.fp8_recipe")
        fp8 = {None: "tensorwise", "tensorwise": "tensorwise", "rowwise": "blockwise",
               "rowwise_with_gw_hp": "blockwise"}.get(rec, None)
        if fp8 is None:
            raise recipe_error(path, "float8.recipe_name", rec, "must be tensorwise, rowwise or rowwise_with_gw_hp")
        if rec in ("rowwise", "rowwise_with_gw_hp"):
            warn.append(f"float8 {rec} scaling priced as the blockwise recipe (the nearest fitted one)")
    if any(c in ("mx", "quantize.linear.mx", "quantize.grouped_mm.mx") for c in converters):
        get("mx.recipe_name", "quantize.linear.mx.recipe_name", maps_to="strategy.fp8_recipe")
        fp8 = "mxfp8"
    for key in ("training.fp8_linear", "training.enable_fp8_linear", "float8.enable_float8_linear"):
        kk, vv = get(key, maps_to="strategy.precision")
        if kk is not None and vv not in (False, "", "false", None):
            fp8 = "tensorwise"
    k, mp = get("training.mixed_precision_param", maps_to="strategy.precision")
    if mp is not None and mp not in ("bfloat16", "float32"):
        raise recipe_error(path, k, mp, "must be bfloat16 or float32")
    if mp == "float32" and fp8 is None:
        raise recipe_error(path, k, mp, "fp32 training is not modelled (precisions: bf16, fp16, fp8)")
    st["precision"] = "fp8" if fp8 else "bf16"
    if fp8:
        st["fp8_recipe"] = fp8

    # recomputation (torchtitan's default: selective, every 2nd layer)
    k, mode = get("activation_checkpoint.mode", maps_to="strategy.recompute")
    ko, opt = get("activation_checkpoint.selective_ac_option", maps_to="strategy.recompute")
    mode = "selective" if mode is None else str(mode)
    opt = "2" if opt is None else str(opt)
    plan: dict[str, object] = {}
    if mode == "none":
        st["recompute"] = "none"
    elif mode == "full":
        st["recompute"] = "full"
    elif mode == "selective" and opt == "op":
        st["recompute"] = "selective"
        plan["selective_policy"] = "op"
    elif mode == "selective" and opt.isdigit():
        n = int(opt)
        st["recompute"] = "full" if n >= 1 else "none"
        if n > 1:
            warn.append(f"selective_ac_option {n}: torchtitan recomputes every {n}-th layer; priced as full "
                        "recomputation of every layer (an over-estimate of the recompute)" +
                        (" (torchtitan's default when [activation_checkpoint] is not given)" if k is None else ""))
    elif mode == "memory_budget":
        st["recompute"] = "selective"
        warn.append("activation_checkpoint.mode memory_budget: priced as selective recomputation")
    else:
        raise recipe_error(path, "activation_checkpoint.mode", mode, "must be none, selective, full or memory_budget")

    # offload, compile, MoE backend
    k, off = get("training.enable_cpu_offload", maps_to="strategy.offload")
    if k is not None and as_bool(path, k, off):
        st["offload"] = "params"
    framework = "torchtitan"
    k, comp = get("compile.enable", "training.compile", maps_to="framework", note="torchtitan-compile")
    components = flat.get("compile.components", ["model", "loss"])
    if k is not None and as_bool(path, k, comp):
        if "model" in (components if isinstance(components, list) else [components]):
            framework = "torchtitan-compile"
        else:
            used[k] = ("", "compiles only the loss: the model runs eagerly")
    k, backend = get("parallelism.expert_parallel_comm_backend", maps_to="plan.moe_dispatcher")
    if backend == "deepep":
        plan["moe_dispatcher"] = "deepep"

    # model
    k_name, name = get("model.name", maps_to="model")
    k_flavor, flavor = get("model.flavor", maps_to="model")
    note = ""
    if model is None:
        if name is not None and flavor is not None:
            model = model_of_flavor(str(name), str(flavor))
            note = (f"torchtitan flavor {name}/{flavor} (catalogs/torchtitan_flavors.yaml)" if model is not None else
                    f"torchtitan flavor {name}/{flavor} is not in catalogs/torchtitan_flavors.yaml: give --model")
        else:
            note = "no [model] name/flavor: give --model"
    else:
        note = "--model"

    # pipeline: schedule, chunks, layout
    layout_note = ""
    if pp > 1:
        k, sched = get("parallelism.pipeline_parallel_schedule", "experimental.pipeline_parallel_schedule",
                       maps_to="strategy.schedule")
        sched = "1F1B" if sched is None else str(sched)
        if sched in V_SHAPED:
            raise recipe_error(path, k or "pipeline_parallel_schedule", sched, "V-shaped stage placement is not "
                               "modelled (schedules: " + ", ".join(SCHEDULES) + ")")
        if sched not in SCHEDULES:
            raise recipe_error(path, k or "pipeline_parallel_schedule", sched, f"must be one of {', '.join(SCHEDULES)}")
        schedule, single = SCHEDULES[sched]
        st["schedule"] = schedule
        if sched == "LoopedBFS":
            warn.append("LoopedBFS runs all forwards of a chunk first; priced as interleaved 1F1B")
        kf, fqns = get("parallelism.module_fqns_per_model_part", maps_to="strategy.pipeline_layout")
        ks, splits = get("parallelism.pipeline_parallel_split_points", "experimental.pipeline_parallel_split_points",
                         maps_to="strategy.pipeline_layout")
        lps = integer("parallelism.pipeline_parallel_layers_per_stage", maps_to="strategy.pipeline_layout")
        w_in = integer("parallelism.pipeline_parallel_first_stage_less_layers", maps_to="strategy.pipeline_layout",
                       default=1, minimum=0)
        w_out = integer("parallelism.pipeline_parallel_last_stage_less_layers", maps_to="strategy.pipeline_layout",
                        default=1, minimum=0)
        parts: list[str] | None = None
        split_key = "parallelism.pipeline_parallel_schedule"
        if fqns is not None:
            split_key = kf or split_key
            parts = _parts_from_fqns(path, kf, fqns)
            layout_note = "module_fqns_per_model_part"
        elif model is not None:
            L = model.num_layers
            if splits:
                if not isinstance(splits, list):
                    raise recipe_error(path, ks, splits, "must be a list of layer names")
                cuts = []
                for s in splits:
                    try:
                        cuts.append(int(str(s).rsplit(".", 1)[-1]))
                    except ValueError:
                        raise recipe_error(path, ks, s, "must name layers as layers.N") from None
                bounds = [0] + cuts + [L]
                parts = [("E" if i == 0 else "") + "t" * (bounds[i + 1] - bounds[i]) + ("L" if i == len(bounds) - 2 else "")
                         for i in range(len(bounds) - 1)]
                layout_note = "pipeline_parallel_split_points"
                split_key = ks or split_key
            else:
                if lps is not None:
                    n_stages = math.ceil((L + (w_in or 0) + (w_out or 0)) / lps)
                    layout_note = "pipeline_parallel_layers_per_stage"
                    split_key = "parallelism.pipeline_parallel_layers_per_stage"
                else:
                    n_stages = pp * (1 if single else 2)
                    layout_note = "torchtitan's default split"
                parts = llm_parts(n_stages, L, w_in or 0, w_out or 0)
        if parts is not None:
            if len(parts) % pp:
                raise recipe_error(path, split_key, lps if "layers_per_stage" in split_key else len(parts),
                                   f"gives {len(parts)} model parts, not a multiple of pipeline_parallel_degree={pp}")
            vp = len(parts) // pp
            if single and vp != 1:
                raise recipe_error(path, "pipeline_parallel_schedule", sched, f"runs one stage per rank, the split has {vp}")
            if not single and vp < 2:
                raise recipe_error(path, "pipeline_parallel_schedule", sched, "needs at least 2 stages per rank")
            st["vp"] = vp
            st["pipeline_layout"] = tuple(parts)
            layout_note += f" -> {format_layout(tuple(parts))}"
        elif not single:
            st["vp"] = 2

    if pp == 1:
        for key in ("parallelism.pipeline_parallel_schedule", "experimental.pipeline_parallel_schedule",
                    "parallelism.pipeline_parallel_microbatch_size", "parallelism.pipeline_parallel_layers_per_stage"):
            if key in flat and key not in used:
                used[key] = ("", "no pipelining (pipeline_parallel_degree 1): no effect")
    keys = []
    for key, value in flatten(doc):
        if key in used and not used[key][0]:
            keys.append(RecipeKey(key=key, value=value, cost="no", note=used[key][1]))
        elif key in used:
            maps_to, nt = used[key]
            keys.append(RecipeKey(key=key, value=value, maps_to=maps_to, note=nt))
        else:
            cost, nt = classify(key, NO_COST, COSTLY)
            keys.append(RecipeKey(key=key, value=value, cost=cost, note=nt))
    return Recipe(path=path, format="torchtitan", dialect="torchtitan job config (TOML)", versions=VERSIONS,
                  framework=framework, settings=st, model=model, model_note=note, plan=plan, keys=tuple(keys),
                  warnings=tuple(warn), layout=layout_note, dp=dp)
