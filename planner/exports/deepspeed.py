"""A DeepSpeed config (``ds_config.json``) and a Megatron-DeepSpeed launch script.

DeepSpeed's batch identity is ``train_batch_size = train_micro_batch_size_per_gpu *
gradient_accumulation_steps * data-parallel size`` (DeepSpeed config docs, "Batch size related
parameters"); ``zero_optimization.stage`` is the ZeRO stage; ``bf16.enabled``/``fp16.enabled``
the precision; ``tensor_parallel.autotp_size`` the tensor-parallel degree (AutoTP training).
Pipeline, context (Ulysses) and expert degrees are set by the training script, so
``deepspeed_launch.sh`` passes them as Megatron-DeepSpeed arguments
(``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size`` or
``--no-pipeline-parallel``, ``--ds-sequence-parallel-size``, ``--expert-model-parallel-size``,
``--zero-stage``, ``--deepspeed_config``).  Offload: ``zero_optimization.offload_optimizer``
and (``params``) ``offload_param`` ``{device: cpu|nvme, pin_memory: true}`` (``nvme_path`` for
NVMe); activation offload only as DeepSpeed's ``cpu_checkpointing`` of partitioned checkpoints
(``recompute=full`` with ``tp > 1``), anything else is refused (DeepSpeed config docs,
"Parameter offloading", "Optimizer offloading", "Activation Checkpointing").  The launch
script runs as written: the data, tokenizer and checkpoint paths are marked placeholders
(``planner.exports.megatron.PLACEHOLDERS``), with ``--train-iters`` and the optimizer settings of
the Megatron export (not modelled).
"""

from __future__ import annotations

from sim.base.errors import InputError
from sim.base.jsonout import dumps

from planner.exports import LaunchSpec, Rendered

NVME_PATH = "/local_nvme"  # DeepSpeed's documented default nvme_path
from planner.exports.megatron import format_array, header, placeholder_block, shell_var


def deepspeed_config(spec: LaunchSpec) -> tuple[dict[str, object], list[str]]:
    s = spec.strategy
    warn: list[str] = []
    cfg: dict[str, object] = {
        "train_batch_size": s.gbs,
        "train_micro_batch_size_per_gpu": s.mbs,
        "gradient_accumulation_steps": s.num_microbatches,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "zero_optimization": {
            "stage": s.zero,
            "overlap_comm": bool(s.dp_overlap),
            "contiguous_gradients": True,
            "reduce_scatter": True,
        },
        "bf16": {"enabled": s.precision in ("bf16", "fp8")},
        "fp16": {"enabled": s.precision == "fp16"},
        "activation_checkpointing": {
            "partition_activations": bool(s.recompute != "none" and s.tp > 1),
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        },
        "tensor_parallel": {"autotp_size": s.tp},
        "wall_clock_breakdown": False,
    }
    if s.zero == 3:
        cfg["zero_optimization"].update({"stage3_prefetch_bucket_size": "auto",  # type: ignore[union-attr]
                                         "stage3_param_persistence_threshold": "auto"})
    target = {"device": s.offload_device, "pin_memory": True}
    if s.offload_device == "nvme":
        target["nvme_path"] = NVME_PATH
    if s.offload_optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = dict(target)  # type: ignore[index]
    if s.offload_params:
        cfg["zero_optimization"]["offload_param"] = dict(target)  # type: ignore[index]
    if s.recompute_num_layers is not None or s.offload_num_layers is not None:
        raise InputError("export", "deepspeed", "recompute_num_layers / offload_num_layers: DeepSpeed's activation "
                         "checkpointing (number_checkpoints, cpu_checkpointing) is not Megatron's partial "
                         "recomputation or N-layer offload; use --export megatron")
    if s.offload_activations:
        if s.recompute != "full" or s.tp == 1:
            raise InputError("export", "deepspeed", f"offload={s.offload}: DeepSpeed offloads activations only as "
                             "partitioned checkpoints (cpu_checkpointing needs recompute=full and tp > 1)")
        cfg["activation_checkpointing"]["cpu_checkpointing"] = True  # type: ignore[index]
    if s.recompute == "selective":
        warn.append("DeepSpeed activation checkpointing is per layer (full); selective recomputation is set by "
                    "the model code (Megatron-DeepSpeed --recompute-granularity selective)")
    return cfg, warn


def launch_args(spec: LaunchSpec) -> list[str]:
    s, m = spec.strategy, spec.model
    a = ["--deepspeed", "--deepspeed_config", "ds_config.json", "--zero-stage", str(s.zero),
         "--tensor-model-parallel-size", str(s.tp)]
    a += ["--pipeline-model-parallel-size", str(s.pp)] if s.pp > 1 else ["--no-pipeline-parallel"]
    if s.cp > 1:
        a += ["--ds-sequence-parallel-size", str(s.cp)]
    if m.moe is not None:
        a += ["--num-experts", str(m.moe.num_experts), "--expert-model-parallel-size", str(s.ep)]
    if s.sp:
        a += ["--sequence-parallel"]
    a += ["--micro-batch-size", str(s.mbs), "--global-batch-size", str(s.gbs),
          "--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
          "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads),
          "--seq-length", str(s.seq_len), "--max-position-embeddings", str(max(s.seq_len, m.max_seq_len or 0))]
    if s.recompute != "none":
        a += ["--deepspeed-activation-checkpointing", "--recompute-granularity", s.recompute]
    a += ["--fp16"] if s.precision == "fp16" else ["--bf16"]
    a += ["--tokenizer-type", "HFTokenizer", "--tokenizer-model", shell_var("TOKENIZER_MODEL"),
          "--data-path", shell_var("DATA_PATH"), "--split", "99,1,0", "--train-iters", shell_var("TRAIN_ITERS"),
          "--lr", "1.5e-4", "--min-lr", "1.0e-5", "--lr-decay-style", "cosine", "--lr-warmup-iters", "100",
          "--weight-decay", "0.1", "--clip-grad", "1.0", "--save", shell_var("CHECKPOINT_DIR"),
          "--load", shell_var("CHECKPOINT_DIR"), "--save-interval", "1000", "--log-interval", "10",
          "--eval-interval", "1000", "--eval-iters", "10"]
    return a


def render_deepspeed(spec: LaunchSpec) -> Rendered:
    cfg, warn = deepspeed_config(spec)
    script = ("#!/usr/bin/env bash\n" + header(spec, "Megatron-DeepSpeed launch") + "set -euo pipefail\n"
              "MEGATRON_DEEPSPEED=${MEGATRON_DEEPSPEED:-/opt/Megatron-DeepSpeed}\n"
              + placeholder_block(spec) + format_array("DS_ARGS", launch_args(spec)) + "\n"
              f"deepspeed --num_nodes {spec.num_nodes} --num_gpus {spec.procs_per_node} "
              "${HOSTFILE:+--hostfile \"$HOSTFILE\"} "
              "\"$MEGATRON_DEEPSPEED/pretrain_gpt.py\" \"${DS_ARGS[@]}\" \"$@\"\n")
    return Rendered(files={"ds_config.json": dumps(cfg) + "\n", "deepspeed_launch.sh": script},
                    warnings=warn)
