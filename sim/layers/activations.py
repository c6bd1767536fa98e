"""Saved activations of one layer for one micro-batch on one GPU, by how the framework runs it.

Two accountings, chosen by the plan's ``eager_elementwise`` (``sim.cost.framework``):

* **fused** (Megatron-Core / Transformer Engine, compiled stacks): Korthikanti et al. (2022),
  Sec. 4, eq. (1)-(2) and Table 2, generalised from GPT (4h MLP, MHA, GeLU, dropout) to GQA,
  SwiGLU, FlashAttention and MoE by counting the same saved tensors; per layer and token, in
  ``sbh`` units: ``34 sbh + 5 a s^2 b`` without parallelism, ``sbh (10 + 24/t) + 5as^2b/t``
  with TP, ``(34 sbh + 5as^2b)/t`` with SP; selective recomputation drops the ``5as^2b``
  term, full recomputation keeps the layer input ``2 sbh`` (``/t`` with SP).  With fp8 and a
  Transformer Engine-class stack (``fp8_saved_inputs``) every GEMM input is saved in its
  1-byte cast form for the weight gradient (TE ``Linear``/``LayerNormLinear`` keep the fp8
  ``inputmat``), the norm inputs and the attention's Q/K/V/out stay 16-bit.
* **eager** (torchtitan without compile: ``torchtitan/models/llama/model.py`` at 9dec370; the
  Hugging Face models of DeepSpeed/Automodel are written alike), counted tensor by tensor and
  checked against PyTorch's own tracker (``planner validate memory``): each eager ``RMSNorm``
  keeps its fp32 upcast (``4h``) and bf16 normalised output (``2h``) and the scaled output
  that feeds the next linear (``2h``); ``repeat_kv`` materialises K and V at the query width
  for ``scaled_dot_product_attention`` (Q, K, V, output and the fp32 log-sum-exp are saved);
  SwiGLU keeps ``w1``, ``silu``, ``w3`` and product outputs (``8f``), GeLU ``4f``.  Under
  sequence parallelism the norms run on the sequence shard and the all-gathered linear input
  is saved whole.  torchtitan's op-level selective checkpointing (``_save_list``: every other
  ``aten.mm`` output, the attention outputs, the reduce-scatter output) keeps the block input
  and those outputs.  With torchao float8 (Dec 2024, torchtitan's benchmarks) the policy still
  sees ``aten.mm`` (on the ``Float8Tensor`` arguments, before the subclass lowers it to
  ``_scaled_mm``), so the same outputs are kept (bf16) and the inputs are saved in bf16: the
  published torchtitan memory with and without float8 agrees (76.8 vs 77.0 GiB).

MoE layers (``moe=True``) keep, per routed copy of a token, the expert's input and MLP
internals; the busiest expert-parallel rank holds ``moe_imbalance`` times the mean number of
routed rows (``Plan.moe_imbalance``), and the token dispatch keeps the combined output of the
routed copies (one ``h`` row each) for the weighting.

Known error: the eager MoE accounting follows the token-choice MoE of ``validate.titan``
(router softmax kept in fp32, grouped experts without padding), not every MoE
implementation's permutation buffers.
"""

from __future__ import annotations

from sim.data.specs import Model, Strategy

BYTES_ACT = 2
# Attention kernels that never hold the score matrix (FlashAttention-3 / cuDNN, FlashAttention-2,
# FlexAttention): they save Q, K, V, the output and the fp32 log-sum-exp per head and query
FUSED_ATTENTION: tuple[str, ...] = ("flash", "flash2", "flex")


def model_has_dropout(model: Model) -> bool:
    """Whether the layer saves dropout masks (``Model.has_dropout``)."""
    return model.has_dropout


def activation_bytes_per_layer(model: Model, strategy: Strategy, *, moe: bool = False,
                               attention: str = "flash", dropout: bool | None = None,
                               selective_policy: str = "attention", eager: bool = False,
                               fp8_saved_inputs: bool = False, moe_imbalance: float = 1.0) -> float:
    """Saved activations of one layer for one micro-batch on one GPU (bytes); module docstring.

    With ``attention="unfused"``, ``dropout=True`` and a GPT layer this equals Korthikanti et
    al. eq. (1)/(2) and Table 2 exactly (tested).
    """
    if eager and not model.is_mla:
        return _eager_bytes(model, strategy, moe=moe, selective_policy=selective_policy, moe_imbalance=moe_imbalance)
    tp, cp = strategy.tp, strategy.cp
    b, s = strategy.mbs, strategy.seq_len
    s_loc = s // cp
    tok = b * s_loc
    h = model.hidden_size
    drop = model_has_dropout(model) if dropout is None else dropout
    rep = tok if not strategy.sp else tok / tp  # tensors replicated across TP without SP
    gemm_in = 1 if (fp8_saved_inputs and strategy.precision == "fp8") else BYTES_ACT
    if strategy.recompute == "full":
        return BYTES_ACT * rep * h  # only the layer input (Korthikanti eq. in Sec. 5)
    if strategy.recompute == "selective" and selective_policy == "op":
        return _op_sac_fused_bytes(model, strategy, moe=moe, tokens=tok, rep=rep)

    q_w, kv_w = model.q_size, model.kv_size
    v_w = model.num_attention_heads * model.v_dim_per_head if model.is_mla else kv_w
    k_w = model.num_attention_heads * model.qk_head_dim if model.is_mla else kv_w
    q_w = model.num_attention_heads * model.qk_head_dim if model.is_mla else q_w
    o_w = model.num_attention_heads * model.v_dim_per_head if model.is_mla else model.q_size

    policy = selective_policy if strategy.recompute == "selective" else ""
    # Replicated across TP (without SP): two norm inputs (16-bit), the QKV and MLP GEMM inputs
    # (fp8 with fp8_saved_inputs), dropout masks.
    replicated = BYTES_ACT * 2 * h + gemm_in * 2 * h + (2 if drop else 0) * h
    # Sharded across TP: Q, K, V, attention output (out-proj GEMM input), MLP internals.
    # mla_up_proj recomputes per-head Q, K, V from the saved latents.
    sharded = BYTES_ACT * (0 if policy == "mla_up_proj" and model.is_mla else q_w + k_w + v_w) + gemm_in * o_w
    if model.is_mla:  # the compressed latents are inputs of the up-projections
        sharded += gemm_in * ((model.q_lora_rank or 0) + (model.kv_lora_rank or 0)) * tp
    if moe:
        spec = model.moe
        assert spec is not None
        f = spec.expert_ffn_hidden_size
        etp = strategy.expert_tp
        # Each routed copy keeps its input and its MLP internals.  An expert's etp ranks gather
        # each other's tokens (sim.layers.ops): the inputs are replicated over etp, the internals split.
        # Per token of this TP rank (sharded by tp below): top_k copies x (internals + etp x input),
        # on the busiest expert-parallel rank moe_imbalance times the mean.  And back on the
        # token's own rank the combine weights each returned copy by its router probability,
        # which keeps the copy for the probability's gradient (16-bit, etp x h per copy, as the
        # eager accounting's combined rows): Megatron-Core core_v0.6.0 token_dispatcher.py
        # token_unpermutation "unpermuted_local_hidden * scores.view(-1, 1)", moe_utils.unpermute
        # "unpermuted_tokens * probs" from core_v0.7.0; unless the whole MLP is recomputed.
        combine = 0.0 if policy == "mlp" else BYTES_ACT * etp * h
        routed = (spec.top_k * moe_imbalance * (_mlp_saved(model.ffn_type, f, policy, gemm_in) + gemm_in * etp * h)
                  + spec.top_k * combine)
        shared = spec.num_shared_experts * (_mlp_saved(model.ffn_type, f, policy, gemm_in) + gemm_in * h)
        ffn = routed + shared
    else:
        ffn = _mlp_saved(model.ffn_type, model.ffn_hidden_size, "" if policy == "moe_act" else policy, gemm_in)
    sharded += ffn
    per_token = replicated * (rep / tok) + sharded / tp
    total = per_token * tok

    if attention in FUSED_ATTENTION:
        total += 4 * b * (model.num_attention_heads / tp) * s_loc  # fp32 logsumexp
    elif strategy.recompute != "selective":
        a = model.num_attention_heads
        # softmax output (2) + dropout mask (1) + dropout output (2) per score element
        per_elem = 2 + ((1 + 2) if drop else 0)
        total += per_elem * a * s_loc * s * b / tp
    return total


def _mlp_saved(ffn_type: str, f: int, policy: str = "", gemm_in: float = BYTES_ACT) -> float:
    """Bytes saved per token inside the MLP (the activation's input, 16-bit, and fc2's GEMM
    input, ``gemm_in`` bytes); a selective ``policy`` that recomputes the up-projection
    (``mlp_up``, ``mlp``) keeps none, one that recomputes the activation (``moe_act``) keeps
    only its input."""
    if policy in ("mlp_up", "mlp"):
        return 0.0
    act_in = BYTES_ACT * (2 * f if ffn_type == "swiglu" else f)
    return act_in if policy == "moe_act" else act_in + gemm_in * f


def _op_sac_fused_bytes(model: Model, strategy: Strategy, *, moe: bool, tokens: float, rep: float) -> float:
    """torchtitan's op-level selective checkpointing on a compiled (fused) layer (Liang et al.
    2024, Sec. 3.2.3): the layer input, the attention output and every other matmul output."""
    tp, h = strategy.tp, model.hidden_size
    if moe and model.moe is not None:
        f = model.moe.expert_ffn_hidden_size * (model.moe.top_k + model.moe.num_shared_experts)
    else:
        f = model.ffn_hidden_size
    mm = _odd_mm_outputs(model, f, tp)
    return (BYTES_ACT * (rep * h + tokens * model.q_size / tp) + BYTES_ACT * tokens * mm
            + 4 * strategy.mbs * model.num_attention_heads / tp * (strategy.seq_len // strategy.cp))


def _odd_mm_outputs(model: Model, f: float, tp: int) -> float:
    """Elements per token of the matmul outputs torchtitan's op-level policy keeps: the 1st,
    3rd, 5th, ... ``aten.mm`` of a block, in call order wq, wk, wv, wo, w1, (w3,) w2
    (``parallelize_llama.py`` at 9dec370, ``_custom_policy``).  Column-parallel outputs are
    sharded by tp; a row-parallel output is the full-width partial sum before its
    reduce-scatter (kept too: the reduce-scatter output, ``h / tp``, is in the list)."""
    h = model.hidden_size
    widths = [(model.q_size, True), (model.kv_size, True), (model.kv_size, True), (h, False), (f, True)]
    if model.ffn_type == "swiglu":
        widths.append((f, True))
    widths.append((h, False))
    out = 0.0
    for i, (w, col) in enumerate(widths):
        if i % 2 == 0:
            out += w / tp if col else (w + (w / tp if tp > 1 else 0.0))
    return out


def _eager_bytes(model: Model, strategy: Strategy, *, moe: bool, selective_policy: str,
                 moe_imbalance: float) -> float:
    """The eager accounting of the module docstring (torchtitan / Hugging Face model code)."""
    tp, b = strategy.tp, strategy.mbs
    tok = b * (strategy.seq_len // strategy.cp)
    h, a = model.hidden_size, model.num_attention_heads
    sp = strategy.sp
    block_in = BYTES_ACT * h * (tok / tp if sp else tok)
    if strategy.recompute == "full":
        return block_in
    lse = _lse_bytes(model, strategy)
    if strategy.recompute == "selective" and selective_policy == "op":
        if moe and model.moe is not None:
            f = model.moe.expert_ffn_hidden_size * model.moe.num_shared_experts
            mm = _odd_mm_outputs(model, f, tp) if f else 0.0
        else:
            mm = _odd_mm_outputs(model, model.ffn_hidden_size, tp)
        return block_in + BYTES_ACT * tok * (model.q_size / tp + mm) + lse
    swiglu = model.ffn_type == "swiglu"
    norms_attn = eager_attention_block_bytes(model, strategy)
    if moe:
        spec = model.moe
        assert spec is not None
        f, k, e = spec.expert_ffn_hidden_size, spec.top_k, spec.num_experts
        per_row = BYTES_ACT * (h + (4 * f if swiglu else 2 * f))  # expert input + internals
        routed = k * moe_imbalance * per_row + BYTES_ACT * k * h  # + the combined rows weighted
        router = 4 * e + 8 * k + BYTES_ACT * k  # fp32 softmax, top-k indices (dispatch uses a view), weights
        fs = f * spec.num_shared_experts
        shared = BYTES_ACT * (4 * fs if swiglu else 2 * fs)
        ffn = tok * (routed + router + shared)
    else:
        f = model.ffn_hidden_size / tp
        ffn = BYTES_ACT * tok * (4 * f if swiglu else 2 * f)
    return norms_attn + ffn


def eager_attention_block_bytes(model: Model, strategy: Strategy) -> float:
    """The eager accounting's share of a layer that is not its MLP or MoE (bytes, one
    micro-batch, no recomputation): the two norms and the attention.  Two eager RMSNorms keep
    their fp32 upcast and bf16 normalised output (on the sequence shard with SP) and the linear
    input they feed (all-gathered whole with SP); the attention keeps Q, the repeated K and V,
    its output (= the ``wo`` input) and the fp32 log-sum-exp.  What a layer's backward still
    holds once its MLP's backward has run (``sim.cost.memory.stage_memory``)."""
    tp, b = strategy.tp, strategy.mbs
    tok = b * (strategy.seq_len // strategy.cp)
    h, a = model.hidden_size, model.num_attention_heads
    norm_fp32 = 6 * h if model.ffn_type == "swiglu" else 0  # LayerNorm (GPT) saves only its input: the linear input
    norms = 2 * (norm_fp32 * (tok / tp if strategy.sp else tok) + BYTES_ACT * h * tok)
    return norms + BYTES_ACT * tok * 4 * model.q_size / tp + _lse_bytes(model, strategy)


def _lse_bytes(model: Model, strategy: Strategy) -> float:
    """The attention kernel's fp32 log-sum-exp per local head and token (eager accounting)."""
    return 4.0 * model.num_attention_heads / strategy.tp * (strategy.mbs * (strategy.seq_len // strategy.cp))
