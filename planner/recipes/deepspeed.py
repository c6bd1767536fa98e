"""DeepSpeed JSON configs (``ds_config.json``), DeepSpeed 0.3 (2020) to 0.18 (2026).

A DeepSpeed config names no model: the model comes from ``--model`` (a catalog id, a model file
or a Hugging Face ``config.json``).  What it states:

* the batch identity ``train_batch_size = train_micro_batch_size_per_gpu *
  gradient_accumulation_steps * data parallelism`` (DeepSpeed config docs, "Batch size related
  parameters"): any two give the third, all three fix the data-parallel degree;
* ``zero_optimization.stage`` (ZeRO 0-3), ``overlap_comm``, ``offload_optimizer`` /
  ``offload_param`` ``{device: cpu|nvme}`` (0.3.16+), and their predecessors ``cpu_offload``
  (optimizer to the CPU) and ``cpu_offload_params`` (0.3.x); ``mics_shard_size`` (MiCS: ZeRO-3
  sharded within groups of that many ranks, replicated across them: HSDP);
* ``bf16.enabled`` (``bfloat16.enabled`` before 0.6), ``fp16.enabled``, ``amp.enabled`` (Apex
  AMP, fp16); neither is fp32 training, which the planner does not model (refused);
* ``activation_checkpointing.cpu_checkpointing`` (partitioned checkpoints offloaded to the host);
  the section does not itself turn recomputation on (the training script does);
* ``tensor_parallel.autotp_size`` (AutoTP training, 0.16+), ``sequence_parallel_size``
  (DeepSpeed-Ulysses, priced as context parallelism).

The framework is the Hugging Face Trainer + DeepSpeed profile (``deepspeed-hf``); a Megatron-
DeepSpeed launch script that points at the config (``--deepspeed_config``) keeps its own degrees
(``merge_megatron_deepspeed``).  Values ``"auto"`` (filled in by the Hugging Face Trainer) are
bad input here: the planner needs the numbers.  Key table: docs/recipes/deepspeed.md.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sim.data.specs import Model

from planner.recipes.base import Recipe, RecipeKey, as_bool, as_int, classify, flatten, recipe_error

VERSIONS = "DeepSpeed 0.3 (2020) to 0.18 (2026) config keys (deepspeed/runtime/config.py, zero/config.py)"

COSTLY = {
    "zero_optimization.stage3_prefetch_bucket_size": "ZeRO-3 prefetch size (the planner assumes one layer ahead)",
    "zero_optimization.stage3_param_persistence_threshold": "small parameters kept unsharded",
    "zero_optimization.stage3_max_live_parameters": "memory of gathered parameters",
    "zero_optimization.stage3_max_reuse_distance": "re-gathering of parameters",
    "zero_optimization.reduce_bucket_size": "gradient bucket size",
    "zero_optimization.allgather_bucket_size": "all-gather bucket size",
    "zero_optimization.contiguous_gradients": "gradient copies into a contiguous buffer",
    "zero_optimization.reduce_scatter": "reduce-scatter instead of all-reduce for ZeRO-1/2 gradients",
    "zero_optimization.allgather_partitions": "all-gather instead of broadcasts",
    "zero_optimization.round_robin_gradients": "gradient copy parallelism",
    "zero_optimization.sub_group_size": "optimizer step granularity",
    "zero_optimization.zero_hpz_partition_size": "ZeRO++ hierarchical weight partition (secondary copy per node)",
    "zero_optimization.zero_quantized_weights": "ZeRO++ quantized weight gathers",
    "zero_optimization.zero_quantized_gradients": "ZeRO++ quantized gradient reduction",
    "zero_optimization.offload_optimizer.pin_memory": "pinned host memory",
    "zero_optimization.offload_param.pin_memory": "pinned host memory",
    "zero_optimization.offload_optimizer.buffer_count": "NVMe buffers",
    "zero_optimization.offload_param.buffer_count": "NVMe buffers",
    "zero_optimization.offload_param.buffer_size": "NVMe buffers",
    "zero_optimization.offload_optimizer.ratio": "partial optimizer offload (the planner offloads all of it)",
    "zero_optimization.cpu_offload_use_pin_memory": "pinned host memory",
    "aio.*": "NVMe I/O tuning",
    "data_types.grad_accum_dtype": "gradient accumulation precision (memory)",
    "communication_data_type": "gradient reduction precision (volume)",
    "activation_checkpointing.partition_activations": "checkpoints split over tensor parallelism (memory)",
    "activation_checkpointing.contiguous_memory_optimization": "checkpoint buffer",
    "activation_checkpointing.number_checkpoints": "checkpoint buffer",
    "activation_checkpointing.synchronize_checkpoint_boundary": "a synchronisation per checkpoint",
    "compression_training.*": "compression changes the model's compute",
    "curriculum_learning.*": "sequence-length curriculum (early steps run shorter sequences)",
    "data_efficiency.*": "data sampling and routing (random-LTD skips layers)",
    "sparse_attention.*": "sparse attention kernels",
    "flops_profiler.*": "profiling slows the profiled step",
    "pipeline.*": "pipeline engine settings",
    "torch_autocast.*": "autocast precision",
    "compile.*": "torch.compile",
}
NO_COST = ("optimizer.*", "scheduler.*", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
           "tensorboard.*", "wandb.*", "csv_monitor.*", "comet.*", "comms_logger.*", "checkpoint.*", "elasticity.*",
           "autotuning.*", "zero_allow_untested_optimizer", "memory_breakdown", "dump_state", "prescale_gradients",
           "gradient_predivide_factor", "fp16.loss_scale_window", "fp16.hysteresis", "fp16.min_loss_scale",
           "fp16.initial_scale_power", "fp16.consecutive_hysteresis", "zero_optimization.elastic_checkpoint",
           "zero_optimization.stage3_gather_16bit_weights_on_model_save",
           "zero_optimization.stage3_gather_fp16_weights_on_model_save", "zero_optimization.load_from_fp32_weights",
           "zero_optimization.ignore_unused_parameters", "zero_optimization.legacy_stage1",
           "zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_param.nvme_path",
           "zero_force_ds_cpu_optimizer", "seed", "train_batch_size_*", "bf16.immediate_grad_update",
           "data_sampling.*", "weight_quantization.*", "quantize_training.*", "fp16.loss_scale",
           "activation_checkpointing.profile")


def _value(path: str, key: str, value: object) -> object:
    if value == "auto":
        raise recipe_error(path, key, value, "'auto' is filled in by the Hugging Face Trainer at launch: the planner "
                           "needs the number")
    return value


def read_deepspeed(path: str, doc: object, *, model: Model | None = None) -> Recipe:
    if not isinstance(doc, dict):
        raise recipe_error(path, "json", type(doc).__name__, "must be an object")
    if not any(k in doc for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization",
                                  "gradient_accumulation_steps", "fp16", "bf16")):
        if "num_hidden_layers" in doc or "n_layer" in doc:
            raise recipe_error(path, "json", "config.json", "is a model config, not a DeepSpeed config: pass it as "
                               "--model with the DeepSpeed config as the recipe")
        raise recipe_error(path, "json", sorted(doc)[:5], "not a DeepSpeed config (no batch, ZeRO or precision keys)")
    flat = dict(flatten(doc))
    used: dict[str, tuple[str, str]] = {}
    warn: list[str] = []

    def get(key: str, maps_to: str, note: str = "") -> object | None:
        if key not in flat:
            return None
        used[key] = (maps_to, note)
        return _value(path, key, flat[key])

    st: dict[str, object] = {}
    tbs = get("train_batch_size", "strategy.gbs")
    mbs = get("train_micro_batch_size_per_gpu", "strategy.mbs")
    gas = get("gradient_accumulation_steps", "strategy.gbs", "micro-batches per step")
    tbs_n = None if tbs is None else as_int(path, "train_batch_size", tbs)
    mbs_n = None if mbs is None else as_int(path, "train_micro_batch_size_per_gpu", mbs)
    gas_n = None if gas is None else as_int(path, "gradient_accumulation_steps", gas)
    dp = None
    if tbs_n is not None and mbs_n is not None and gas_n is not None:
        if tbs_n % (mbs_n * gas_n):
            raise recipe_error(path, "train_batch_size", tbs_n, f"must be a multiple of micro batch {mbs_n} x "
                               f"accumulation {gas_n} (DeepSpeed's batch identity)")
        dp = tbs_n // (mbs_n * gas_n)
    if mbs_n is None:
        if tbs_n is None:
            raise recipe_error(path, "train_micro_batch_size_per_gpu", None, "neither it nor train_batch_size is set")
        # DeepSpeed: micro batch = train_batch / (accumulation x data parallel): known once dp is
        st["_ds_micro_from_global"] = gas_n or 1
    else:
        st["mbs"] = mbs_n
    if tbs_n is not None:
        st["gbs"] = tbs_n
    elif gas_n is not None:
        st["_accumulation"] = gas_n

    zero = get("zero_optimization.stage", "strategy.zero")
    st["zero"] = 0 if zero is None else as_int(path, "zero_optimization.stage", zero, minimum=0)
    if st["zero"] > 3:  # type: ignore[operator]
        raise recipe_error(path, "zero_optimization.stage", zero, "must be 0, 1, 2 or 3")
    ov = get("zero_optimization.overlap_comm", "strategy.dp_overlap")
    # DeepSpeed's default: overlap_comm true for ZeRO-3, false otherwise (zero/config.py)
    st["dp_overlap"] = as_bool(path, "zero_optimization.overlap_comm", ov) if ov is not None else st["zero"] == 3
    states, device = "", "cpu"
    p_dev = get("zero_optimization.offload_param.device", "strategy.offload", "params")
    o_dev = get("zero_optimization.offload_optimizer.device", "strategy.offload", "optimizer")
    for key, dev, kind in (("zero_optimization.offload_param.device", p_dev, "params"),
                           ("zero_optimization.offload_optimizer.device", o_dev, "optimizer")):
        if dev is None or str(dev).lower() == "none":
            continue
        if str(dev).lower() not in ("cpu", "nvme"):
            raise recipe_error(path, key, dev, "must be cpu, nvme or none")
        if not states:
            states, device = kind, str(dev).lower()
    if get("zero_optimization.cpu_offload_params", "strategy.offload", "params (DeepSpeed 0.3.x)") in (True, "true"):
        states = "params"
    if get("zero_optimization.cpu_offload", "strategy.offload", "optimizer (DeepSpeed 0.3.x)") in (True, "true") \
            and states != "params":
        states = "optimizer"
    acts = get("activation_checkpointing.cpu_checkpointing", "strategy.offload", "activations")
    parts = [p for p in (states, "activations" if acts in (True, "true") else "") if p]
    if parts:
        st["offload"] = "+".join(parts)
        if device != "cpu":
            st["offload_device"] = device
    mics = get("zero_optimization.mics_shard_size", "strategy.dp_shard", "MiCS shard group")
    if mics is not None and as_int(path, "zero_optimization.mics_shard_size", mics, minimum=-1) > 0:
        st["_dp_shard_size"] = as_int(path, "zero_optimization.mics_shard_size", mics)
        st["zero"] = 3

    bf16 = get("bf16.enabled", "strategy.precision") if "bf16.enabled" in flat else \
        get("bfloat16.enabled", "strategy.precision", "bf16 (renamed bf16)")
    fp16 = get("fp16.enabled", "strategy.precision")
    amp = get("amp.enabled", "strategy.precision", "fp16 (Apex AMP)")
    if bf16 in (True, "true"):
        st["precision"] = "bf16"
    elif fp16 in (True, "true") or amp in (True, "true"):
        st["precision"] = "fp16"
    else:
        raise recipe_error(path, "bf16.enabled", bf16, "neither bf16 nor fp16 is enabled: fp32 training is not "
                           "modelled (precisions: bf16, fp16, fp8)")
    tp = get("tensor_parallel.autotp_size", "strategy.tp", "AutoTP training")
    if tp is not None:
        st["tp"] = as_int(path, "tensor_parallel.autotp_size", tp)
        st["sp"] = False
    sp = get("sequence_parallel_size", "strategy.cp", "DeepSpeed-Ulysses, priced as context parallelism")
    if sp is not None and as_int(path, "sequence_parallel_size", sp) > 1:
        st["cp"] = as_int(path, "sequence_parallel_size", sp)
        warn.append("sequence_parallel_size (Ulysses all-to-all) priced as ring context parallelism")
    if "activation_checkpointing" in doc:
        warn.append("activation_checkpointing configures checkpoints; recomputation is turned on by the training "
                    "script (HF gradient_checkpointing, Megatron-DeepSpeed --checkpoint-activations): not assumed")
    st["recompute"] = "none"

    keys = []
    for key, value in flatten(doc):
        if key in used:
            maps_to, note = used[key]
            keys.append(RecipeKey(key=key, value=value, maps_to=maps_to, note=note))
        else:
            cost, note = classify(key, NO_COST, COSTLY)
            keys.append(RecipeKey(key=key, value=value, cost=cost, note=note))
    return Recipe(path=path, format="deepspeed", dialect="DeepSpeed config (JSON)", versions=VERSIONS,
                  framework="deepspeed-hf", settings=st, model=model,
                  model_note="--model" if model is not None else "a DeepSpeed config names no model: give --model",
                  keys=tuple(keys), warnings=tuple(warn), dp=dp)


def merge_megatron_deepspeed(megatron: Recipe, ds_path: str, doc: dict) -> Recipe:
    """A Megatron-DeepSpeed script's recipe with the DeepSpeed config it names: ZeRO stage,
    offload, overlap and precision from the config, degrees and batch from the script."""
    ds = read_deepspeed(ds_path, doc, model=megatron.model)
    st = dict(megatron.settings)
    for k in ("zero", "offload", "offload_device", "dp_overlap", "precision"):
        if k in ds.settings:
            st[k] = ds.settings[k]
    name = Path(ds_path).name
    keys = megatron.keys + tuple(replace(k, key=f"{name}: {k.key}") for k in ds.keys)
    return replace(megatron, settings=st, keys=keys, warnings=megatron.warnings + ds.warnings,
                   dialect=megatron.dialect + f" + DeepSpeed config {name}")
