"""Megatron-LM ``pretrain_gpt.py`` arguments (names from ``megatron/training/arguments.py``).

Mapping of the plan:

* degrees: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--context-parallel-size``, ``--expert-model-parallel-size``; interleaving:
  ``--num-virtual-stages-per-pipeline-rank vp``; ``--sequence-parallel``;
* batch: ``--micro-batch-size``, ``--global-batch-size`` (Megatron derives data parallelism
  and the number of micro-batches from them and the world size);
* ZeRO: 1 -> ``--use-distributed-optimizer`` (shards optimizer states; gradients are
  reduce-scattered into the shard); 2/3 -> Megatron-FSDP ``--use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads`` / ``optim_grads_params``;
* recomputation: ``--recompute-granularity selective`` or ``full`` with
  ``--recompute-method uniform|block --recompute-num-layers N`` (the plan's
  ``recompute_method`` / ``recompute_num_layers``, default uniform 1);
* activation offload of N layers: ``--cpu-offloading-num-layers N`` (Megatron-Core's CPU
  offloading; pp = 1 and no recomputation, transformer_config.py);
* precision: ``--bf16``, ``--fp16``, fp8 as ``--bf16 --fp8-format hybrid`` (Transformer Engine);
* overlap: ``--overlap-grad-reduce``/``--overlap-param-gather`` (data parallel),
  ``--tp-comm-overlap``, ``--overlap-moe-expert-parallel-comm``, pipeline sends
  (``overlap_p2p_comm``, on by default with interleaving: ``--no-overlap-p2p-communication``
  when the plan has it off); ``--enable-cuda-graph``; HSDP as
  ``--num-distributed-optimizer-instances``; ``--fp8-recipe``; expert tensor parallelism
  ``--expert-tensor-parallel-size``;
* uneven stages: ``--decoder-first/last-pipeline-num-layers``; interleaved chunks that are
  equal once the embedding and loss count as layers: ``--account-for-embedding-in-pipeline-split
  --account-for-loss-in-pipeline-split``; a plan's pipeline layout (``Strategy.pipeline_layout``)
  as ``--pipeline-model-parallel-layout`` (with ``--mtp-num-layers`` for its MTP layers), the
  virtual stages then coming from the layout (Megatron-LM sets no ``--num-virtual-stages-per-
  pipeline-rank`` with it);
* recomputation method and layers (``--recompute-method``, ``--recompute-num-layers``) and
  Megatron-Core's ``--cpu-offloading-num-layers`` as the plan carries them;
* a runnable script: the data, tokenizer and checkpoint paths are clearly marked placeholders
  (``DATA_PATH``, ``TOKENIZER_MODEL``, ``CHECKPOINT_DIR``, shell variables with defaults set
  above the arguments), the training length is ``--train-iters`` (from the token budget, else
  ``TRAIN_ITERS``), and the optimizer hyperparameters are those of Megatron-LM's
  ``examples/llama/train_llama3_8b_h100_fp8.sh`` (learning rate 1.5e-4 to 1e-5, cosine, weight
  decay 0.1, Adam betas 0.9/0.95, gradient clipping 1.0): not modelled, tune them.
* offload: ``optimizer`` with ZeRO-1 (the distributed optimizer) as Megatron-Core's CPU
  optimizer (``--optimizer-cpu-offload --optimizer-offload-fraction 1.0
  --use-precision-aware-optimizer``, megatron/core/optimizer/cpu_offloading/README.md, without
  ``--overlap-cpu-optimizer-d2h-h2d``: the plan's copies are not overlapped); any other offload
  is refused (``InputError``): Megatron-LM cannot express it.

Plans the megatron-core profile cannot run (GPipe, zero-bubble) are refused by
``planner.exports.render``; ``planner.recipes`` (the Megatron-LM recipe reader, through
``planner.exports.readback``) reads the arguments back.
"""

from __future__ import annotations

import re
import shlex
from typing import Callable

from planner.exports import LaunchSpec, Rendered
from sim.base.errors import InputError
from sim.data.layout import format_layout, num_mtp_layers
from sim.cost.plan import default_layout, vp_split
from sim.layers.stages import stage_layers

# The run's own paths: (variable, placeholder default, what it is).  Nothing the plan depends on.
PLACEHOLDERS: tuple[tuple[str, str, str], ...] = (
    ("DATA_PATH", "/path/to/my-corpus_text_document",
     "PLACEHOLDER: prefix of your data preprocessed by Megatron-LM tools/preprocess_data.py"),
    ("TOKENIZER_MODEL", "/path/to/tokenizer",
     "PLACEHOLDER: a Hugging Face tokenizer (name or path) whose vocabulary the model's matches"),
    ("CHECKPOINT_DIR", "./checkpoints", "where checkpoints are saved and resumed from"),
)
DEFAULT_TRAIN_ITERS = 1000  # without a token budget: a placeholder length, TRAIN_ITERS overrides it


def shell_var(name: str) -> str:
    return "${" + name + "}"


def window_pattern(num_layers: int, local_layers: int) -> str:
    """``--window-attn-skip-freq``'s per-layer list (1 = sliding window, 0 = full attention) for
    ``local_layers`` windowed layers spread evenly, each period's full layer last (gpt-oss: 1, 0,
    1, 0, ...; Gemma 3: five 1s, then a 0)."""
    full = num_layers - local_layers
    return "[" + ",".join("1" if (i + 1) * full // num_layers == i * full // num_layers else "0"
                          for i in range(num_layers)) + "]"


def placeholder_block(spec: LaunchSpec, *, style: str = "shell") -> str:
    """The placeholder variables, one per line with what they are (shell assignments)."""
    lines = ["# ---- set these for your run (placeholders; the predicted plan does not depend on them) ----"]
    for name, default, what in PLACEHOLDERS:
        lines.append(f"{name}=${{{name}:-{default}}}  # {what}")
    steps = spec.steps if spec.steps is not None else DEFAULT_TRAIN_ITERS
    why = "optimizer steps of the token budget" if spec.steps is not None else \
        "PLACEHOLDER: optimizer steps to run (no token budget was given)"
    lines.append(f"TRAIN_ITERS=${{TRAIN_ITERS:-{steps}}}  # {why}")
    return "\n".join(lines) + "\n"


def megatron_args(spec: LaunchSpec, var: Callable[[str], str] = shell_var) -> tuple[list[str], list[str]]:
    """(argument tokens, warnings).  ``var(name)`` writes a reference to a run variable
    (``PLACEHOLDERS``, ``TRAIN_ITERS``): ``${NAME}`` in shell scripts, ``$(NAME)`` in Kubernetes."""
    act_offload = _check_offload(spec)
    warn: list[str] = []
    a: list[str] = []

    def opt(flag: str, value: object | None = None) -> None:
        a.append(flag)
        if value is not None:  # a tuple: an nargs='+' option's values
            a.extend(str(v) for v in (value if isinstance(value, tuple) else (value,)))

    _architecture_args(spec, opt, var)
    _parallel_args(spec, opt)
    _batch_args(spec, opt, var)
    _memory_args(spec, opt, act_offload)
    _precision_args(spec, opt)
    return a, warn


def _check_offload(spec: LaunchSpec) -> bool:
    """Refuse offloading Megatron-LM cannot state; whether the plan offloads activations."""
    m, s = spec.model, spec.strategy
    act_offload = s.offload == "activations" and s.offload_num_layers is not None
    if s.offload != "none" and not (s.offload == "optimizer" and s.zero == 1 and s.offload_device == "cpu") \
            and not act_offload:
        raise InputError("export", "megatron", f"offload={s.offload} (zero={s.zero}, {s.offload_device}) cannot be "
                         "expressed: Megatron-LM offloads the distributed optimizer (offload=optimizer, zero=1, "
                         "cpu) or the activations of N layers (offload=activations with offload_num_layers); use "
                         "--export deepspeed or torchtitan")
    if act_offload and (s.pp > 1 or s.recompute != "none" or s.offload_num_layers >= m.num_layers):
        # megatron/core/transformer/transformer_config.py: CPU offloading needs pp == 1, no recomputation,
        # and fewer offloaded layers than the model has
        raise InputError("export", "megatron", f"offload_num_layers={s.offload_num_layers}: Megatron-Core's CPU "
                         "activation offloading (--cpu-offloading-num-layers) needs pp=1, recompute=none and fewer "
                         f"layers than the model's {m.num_layers}")
    return act_offload


def _architecture_args(spec: LaunchSpec, opt, var: Callable[[str], str]) -> None:
    """The model's shape, attention, MoE, tokenizer and data."""
    m, s = spec.model, spec.strategy
    opt("--num-layers", m.num_layers)
    opt("--hidden-size", m.hidden_size)
    opt("--ffn-hidden-size", m.ffn_hidden_size)
    opt("--num-attention-heads", m.num_attention_heads)
    if m.is_mla:
        opt("--multi-latent-attention")
        if m.q_lora_rank is not None:
            opt("--q-lora-rank", m.q_lora_rank)
        opt("--kv-lora-rank", m.kv_lora_rank)
        opt("--qk-head-dim", m.dim_per_head)
        opt("--qk-pos-emb-head-dim", m.qk_rope_head_dim)
        opt("--v-head-dim", m.v_dim_per_head)
    else:
        if m.kv_heads != m.num_attention_heads:
            opt("--group-query-attention")
            opt("--num-query-groups", m.kv_heads)
        if m.head_dim is not None and m.head_dim * m.num_attention_heads != m.hidden_size:
            opt("--kv-channels", m.head_dim)
    opt("--seq-length", s.seq_len)
    opt("--max-position-embeddings", max(s.seq_len, m.max_seq_len or 0))
    if m.ffn_type == "swiglu":  # Llama-style block
        opt("--swiglu")
        opt("--normalization", "RMSNorm")
    if m.uses_rope:  # Megatron-LM's default is a learned table (learned_absolute)
        opt("--position-embedding-type", "rope")
    if not m.linear_bias:  # Megatron-LM biases every linear unless told not to (Model.linear_bias)
        opt("--disable-bias-linear")
    if not m.tied_embeddings:
        opt("--untie-embeddings-and-output-weights")
    if not m.has_dropout:  # Megatron-LM's --hidden-dropout / --attention-dropout default to 0.1 (Model.dropout)
        opt("--hidden-dropout", 0.0)
        opt("--attention-dropout", 0.0)
    if m.local_attention_layers:  # Megatron-Core core_v0.17 --window-size / --window-attn-skip-freq
        opt("--window-size", f"{m.local_attention_window},0")
        if m.local_attention_layers < m.num_layers:
            opt("--window-attn-skip-freq", window_pattern(m.num_layers, m.local_attention_layers))
    if m.moe is not None:
        e = m.moe
        opt("--num-experts", e.num_experts)
        opt("--moe-router-topk", e.top_k)
        opt("--moe-ffn-hidden-size", e.expert_ffn_hidden_size)
        if e.num_shared_experts:
            opt("--moe-shared-expert-intermediate-size", e.num_shared_experts * e.expert_ffn_hidden_size)
        if e.first_k_dense_layers or e.layer_frequency > 1:
            pattern = "[" + ",".join("1" if m.is_moe_layer(i) else "0" for i in range(m.num_layers)) + "]"
            opt("--moe-layer-freq", pattern)
        opt("--moe-grouped-gemm")
    opt("--tokenizer-type", "HuggingFaceTokenizer")
    opt("--tokenizer-model", var("TOKENIZER_MODEL"))
    opt("--vocab-size", m.vocab_size)  # the model's (padded) vocabulary; NullTokenizer runs use it
    opt("--make-vocab-size-divisible-by", 1)  # the vocabulary above is already the model's
    opt("--data-path", var("DATA_PATH"))
    opt("--split", "99,1,0")


def _parallel_args(spec: LaunchSpec, opt) -> None:
    """Tensor, pipeline (with the layer split), context and expert parallelism and their overlaps."""
    m, s = spec.model, spec.strategy
    opt("--tensor-model-parallel-size", s.tp)
    opt("--pipeline-model-parallel-size", s.pp)
    _pipeline_split(spec, opt)
    if s.sp:
        opt("--sequence-parallel")
    if s.cp > 1:
        opt("--context-parallel-size", s.cp)
    if m.moe is not None:
        opt("--expert-model-parallel-size", s.ep)
        if s.etp is not None:
            opt("--expert-tensor-parallel-size", s.etp)
        if s.ep > 1:
            opt("--moe-token-dispatcher-type", "alltoall")
    if s.tp_overlap:
        opt("--tp-comm-overlap")
    if s.ep_overlap:
        opt("--overlap-moe-expert-parallel-comm")
    if s.pp > 1 and s.vp > 1 and not s.pp_overlap:
        opt("--no-overlap-p2p-communication")  # on by default with interleaving
    elif s.pp_overlap and s.vp == 1:
        raise InputError("export", "megatron", "pp_overlap=1 needs interleaving (vp > 1): Megatron-LM overlaps "
                         "pipeline sends only between model chunks (overlap_p2p_comm)")
    if s.cuda_graphs and spec.cuda_graph_scope == "attention":
        # Transformer Engine graphs of the attention block (and the MoE router): what a dropless
        # MoE layer can capture (Plan.cuda_graph_scope)
        opt("--cuda-graph-impl", "transformer_engine")
        opt("--cuda-graph-scope", ("attn", "moe_router", "moe_preprocess") if m.moe is not None else ("attn",))
    elif s.cuda_graphs:
        opt("--enable-cuda-graph")


def _batch_args(spec: LaunchSpec, opt, var: Callable[[str], str]) -> None:
    """Batch, iterations, the (unmodelled) optimizer settings, checkpointing and logging."""
    s = spec.strategy
    opt("--micro-batch-size", s.mbs)
    opt("--global-batch-size", s.gbs)
    opt("--train-iters", var("TRAIN_ITERS"))
    # optimizer (not modelled): Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh
    for flag, value in (("--lr", "1.5e-4"), ("--min-lr", "1.0e-5"), ("--lr-decay-style", "cosine"),
                        ("--lr-warmup-fraction", "0.01"), ("--weight-decay", "0.1"), ("--adam-beta1", "0.9"),
                        ("--adam-beta2", "0.95"), ("--clip-grad", "1.0")):
        opt(flag, value)
    opt("--save", var("CHECKPOINT_DIR"))
    opt("--load", var("CHECKPOINT_DIR"))
    opt("--save-interval", 1000)
    opt("--log-interval", 10)
    opt("--eval-interval", 1000)
    opt("--eval-iters", 10)


def _memory_args(spec: LaunchSpec, opt, act_offload: bool) -> None:
    """Recomputation, activation and optimizer offloading, the distributed optimizer / Megatron
    FSDP, and the data-parallel overlaps."""
    s = spec.strategy
    if s.recompute == "selective":
        opt("--recompute-granularity", "selective")
    elif s.recompute == "full":
        opt("--recompute-granularity", "full")
        opt("--recompute-method", s.recompute_method)
        opt("--recompute-num-layers", s.recompute_num_layers or 1)
    if act_offload:
        opt("--cpu-offloading-num-layers", s.offload_num_layers)  # sets cpu_offloading (activations)
    if s.zero >= 1:
        opt("--use-distributed-optimizer")
    if s.dp_shard is not None:
        # partial sharding: states sharded over dp_shard ranks, replicated over dp / dp_shard groups
        opt("--num-distributed-optimizer-instances", s.dp // s.dp_shard)
    if s.zero >= 2:
        opt("--use-megatron-fsdp")
        opt("--data-parallel-sharding-strategy", "optim_grads" if s.zero == 2 else "optim_grads_params")
        opt("--no-gradient-accumulation-fusion")
        opt("--ckpt-format", "fsdp_dtensor")
    if s.offload_optimizer:
        opt("--optimizer-cpu-offload")
        opt("--optimizer-offload-fraction", "1.0")
        opt("--use-precision-aware-optimizer")
    if s.dp_overlap:
        opt("--overlap-grad-reduce")
        if s.zero >= 1:
            opt("--overlap-param-gather")


def _precision_args(spec: LaunchSpec, opt) -> None:
    """Precision, the fp8 recipe and the attention backend."""
    s = spec.strategy
    if s.precision == "fp16":
        opt("--fp16")
    else:
        opt("--bf16")
    if s.precision == "fp8":
        opt("--fp8-format", "e4m3" if s.fp8_recipe in ("mxfp8", "blockwise") else "hybrid")
        opt("--fp8-recipe", s.fp8_recipe)
        if s.fp8_params:
            opt("--fp8-param-gather")
    # Megatron-Core's backends: auto (the best fused kernel: cuDNN/TE), flash (the flash-attn package)
    opt("--attention-backend", {"flash": "auto", "flash2": "flash"}.get(spec.attention, "unfused"))


def _pipeline_split(spec: LaunchSpec, opt) -> None:
    """Megatron-LM arguments for the plan's layer split (``sim.layers.stages.stage_layers``: uneven
    stages give the first and last stage the fewer layers) and its model chunks
    (``sim.cost.plan.vp_split``); a split Megatron-LM cannot state is refused."""
    m, s = spec.model, spec.strategy
    if s.pipeline_layout is not None:  # the plan's chunks exactly; vp comes from the layout
        opt("--pipeline-model-parallel-layout", format_layout(s.pipeline_layout))
        if num_mtp_layers(s.pipeline_layout):
            opt("--mtp-num-layers", num_mtp_layers(s.pipeline_layout))
        return
    if s.pp == 1:
        return
    counts = [len(layers) for layers in stage_layers(m, s)]
    split = vp_split(m, s) if s.vp > 1 else "even"
    if split is None:
        raise InputError("export", "megatron", f"vp={s.vp} does not split the stages' layers ({counts}) into equal "
                         "model chunks, which Megatron-LM needs")
    if split == "embedding+loss":
        opt("--num-virtual-stages-per-pipeline-rank", s.vp)
        opt("--account-for-embedding-in-pipeline-split")
        opt("--account-for-loss-in-pipeline-split")
        return
    if len(set(counts)) > 1:
        middle = set(counts[1:-1]) or {counts[0]}
        if len(middle) > 1:  # first/last cannot say it: state every stage's layers
            opt("--pipeline-model-parallel-layout", format_layout(default_layout(m, s)))
            return
        opt("--decoder-first-pipeline-num-layers", counts[0])
        opt("--decoder-last-pipeline-num-layers", counts[-1])
    if s.vp > 1:
        opt("--num-virtual-stages-per-pipeline-rank", s.vp)


def _quote(value: str) -> str:
    """Shell quoting that leaves a run-variable reference (``${NAME}``) expandable."""
    if re.fullmatch(r"\$\{[A-Z_]+\}", value):
        return f'"{value}"'
    return shlex.quote(value)


def format_array(name: str, tokens: list[str], indent: str = "  ") -> str:
    """A bash array with one option (and its value) per line."""
    lines = [f"{name}=("]
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            lines.append(f"{indent}{tok} {_quote(tokens[i + 1])}")
            i += 2
        else:
            lines.append(f"{indent}{tok}")
            i += 1
    lines.append(")")
    return "\n".join(lines)


def header(spec: LaunchSpec, what: str) -> str:
    s = spec.strategy
    return (f"# {what} for {spec.model.name} on {spec.num_gpus} x {spec.gpu or 'GPU'} "
            f"({spec.num_nodes} nodes x {spec.procs_per_node}), written by `planner recommend`.\n"
            f"# strategy: {s.to_string()}\n"
            f"# data parallel {s.dp}, {s.num_microbatches} micro-batches of {s.mbs} per step\n")


def render_megatron(spec: LaunchSpec) -> Rendered:
    tokens, warn = megatron_args(spec)
    text = ("#!/usr/bin/env bash\n" + header(spec, "Megatron-LM pretrain_gpt.py arguments")
            + "# Use: source megatron_args.sh; torchrun ... pretrain_gpt.py \"${MEGATRON_ARGS[@]}\"\n"
            + placeholder_block(spec) + format_array("MEGATRON_ARGS", tokens) + "\n")
    return Rendered(files={"megatron_args.sh": text}, warnings=warn)
