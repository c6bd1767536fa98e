"""Per-layer operations of a decoder transformer, sharded by TP, SP, CP and EP.

Each ``Op`` is what one GPU executes for one micro-batch in the forward pass: its FLOPs, its
HBM traffic and, for matrix multiplies, its GEMM shape (M, N, K), so a roofline with a
shape-dependent efficiency can time it (``sim.layers.compute``).  Backward costs are derived per op
kind (``Op.backward_flop_factor``).

FLOP counts follow Narayanan et al. (2021) eq. (2)-(3) and Korthikanti et al. (2022) Sec. 4:
a GEMM of (M x K) by (K x N) costs 2*M*N*K FLOPs forward and twice that backward (input and
weight gradients).  Attention scores cost 2*b*s*s*d per head for QK^T and the same for AV;
``causal`` halves the executed work when a kernel skips masked blocks (FlashAttention), while
*model* FLOPs count the full square as Narayanan et al. and PaLM (Chowdhery et al. 2022,
App. B) do.  Known approximations: biases, softmax and norm FLOPs are not counted as FLOPs
(they are timed as memory-bound ops instead); router and top-k selection are a GEMM plus one
memory pass; expert load is balanced unless ``moe_imbalance`` says how much the busiest rank
gets above the mean.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Mapping

from sim.data.conventions import conventions
from sim.data.specs import Model, Strategy
from sim.layers.activations import FUSED_ATTENTION

OpKind = Literal["matmul", "attention", "memory"]
BYTES_BF16 = 2


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel (or fused group) of the forward pass on one GPU, one micro-batch."""

    name: str
    kind: OpKind
    flops: float  # executed forward FLOPs
    hbm_bytes: float  # forward HBM traffic
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1  # batched GEMMs (attention heads)
    model_flops: float | None = None  # FLOPs counted by MFU when they differ from executed
    recompute_selective: bool = False  # recomputed under selective recomputation
    tp_sharded: bool = True
    # attention ops: the kernel family (flash | flash2); fp8 GEMMs: the scaling recipe
    kernel: str = ""
    # Backward FLOPs relative to forward; None: the kind's rule (``backward_flop_factor``).
    backward_flops_per_forward: float | None = None
    # Backward HBM traffic relative to forward; None: the element-wise rule (``backward_bytes_factor``).
    backward_bytes_per_forward: float | None = None

    @property
    def backward_flop_factor(self) -> float:
        """Backward work relative to forward.  GEMMs: 2x (dgrad + wgrad).  A fused attention
        kernel's backward: ``catalogs/conventions.yaml`` ``attention_backward_per_forward``
        (2.5x: it recomputes the score matrix; Dao 2023, FlashAttention-2, Sec. 3.1)."""
        if self.backward_flops_per_forward is not None:
            return self.backward_flops_per_forward
        return conventions().attention_backward_per_forward if self.kind == "attention" else 2.0

    @property
    def backward_bytes_factor(self) -> float:
        """Backward HBM traffic relative to forward for memory-bound ops: an element-wise op
        reads x and writes y forward (2 passes) and reads x and dy and writes dx backward
        (3 passes): 1.5x.  Norms and softmax follow the same count."""
        return 1.5 if self.backward_bytes_per_forward is None else self.backward_bytes_per_forward

    @property
    def counted_flops(self) -> float:
        return self.flops if self.model_flops is None else self.model_flops


@dataclass(frozen=True, slots=True)
class LayerOps:
    """Forward ops of one transformer layer plus its collective volumes (bytes per GPU)."""

    ops: tuple[Op, ...]
    tp_comm_bytes: float  # forward bytes of one TP all-reduce (two per layer per pass)
    tp_collectives_per_pass: int
    cp_kv_bytes: float  # K and V of the local chunk, sent once per ring step
    ep_a2a_bytes: float  # tokens * top_k * hidden sent by one GPU, one all-to-all
    ep_a2a_per_pass: int
    etp_comm_bytes: float = 0.0  # routed tokens gathered by an expert-tensor group (etp != tp), per pass

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    @property
    def model_flops(self) -> float:
        return sum(op.counted_flops for op in self.ops)


def _gemm(name: str, m: int, n: int, k: int, *, batch: int = 1, elt_bytes: float = BYTES_BF16,
          **kw: object) -> Op:
    flops = 2.0 * m * n * k * batch
    hbm = elt_bytes * batch * (m * k + k * n + m * n)
    return Op(name, "matmul", flops, hbm, m, n, k, batch, **kw)  # type: ignore[arg-type]


# memory-bound ops a framework may run as one fused kernel while its other element-wise ops run
# eagerly (``Plan.fused_ops``, a profile's ``fused_ops``): the names ``_mem`` gives them below
# ("fp8_cast" names every linear layer's fp8 quantization op, fp8_cast_<linear>)
FUSIBLE_OPS: tuple[str, ...] = ("norm_attn", "norm_mlp", "final_norm", "rope", "router_topk_permute",
                                "activation", "expert_activation", "shared_activation", "softmax_dropout",
                                "residual_dropout_attn", "residual_dropout_mlp", "cross_entropy", "fp8_cast")


def fusible_name(name: str) -> str:
    """The ``FUSIBLE_OPS`` name an op answers to (its own, or ``fp8_cast`` for a linear's cast)."""
    return "fp8_cast" if name.startswith("fp8_cast_") else name


def _mem(name: str, hbm_bytes: float, **kw: object) -> Op:
    return Op(name, "memory", 0.0, hbm_bytes, **kw)  # type: ignore[arg-type]


def windowed_keys(seq_len: int, window: int) -> float:
    """Mean keys a query attends in causal attention over ``seq_len`` tokens limited to the last
    ``window`` (itself included): ``sum_q min(q, w) / s = w - w^2 / (2 s)`` for ``s >= w``, the
    causal ``s / 2`` otherwise (the convention ``layer_ops`` uses for full layers)."""
    if window >= seq_len:
        return seq_len / 2
    return window - window * window / (2 * seq_len)


def layer_ops(model: Model, strategy: Strategy, *, moe: bool, attention: str = "flash",
              fp8_quantize_bytes_per_element: float = 0.0, moe_imbalance: float = 1.0,
              fp8_compiled_casts: Mapping[str, tuple[float, float, float]] | None = None,
              compiled_rope: Mapping[str, Mapping[str, float]] | None = None) -> LayerOps:
    """Forward ops of one layer on one GPU for one micro-batch.

    ``attention`` is ``"flash"`` / ``"flash2"`` / ``"flex"`` (fused, causal blocks skipped, no s^2 tensor
    in HBM; the best kernel for the GPU, FlashAttention-2 specifically, or FlexAttention) or ``"unfused"`` (score matrix materialised, softmax and dropout as memory passes, as
    Megatron-LM did before FlashAttention).  With ``precision=fp8`` every linear layer pays its
    recipe's quantization of activations and gradients (``fp8_quantize_bytes_per_element``,
    ``catalogs/efficiency.yaml`` ``fp8_recipes``), or with ``fp8_compiled_casts`` the bytes of the
    casts inductor fuses into the compiled block (``_with_fp8_casts``); the weights' share is per-parameter work
    (``sim.layers.compute.fp8_weight_cast_bytes_per_param``).  ``moe_imbalance`` is the busiest
    expert-parallel rank's routed tokens over the mean (1: balanced routing, as benchmarks that
    force load balancing run, e.g. Megatron-Core ``--moe-router-force-load-balancing``): that
    rank's expert GEMMs and the tokens it receives set the pace of the layer.  With ``compiled_rope``
    (``catalogs/efficiency.yaml`` ``compiled_rope``) the rotary embedding moves the bytes of
    torchtitan's complex-fp32 code under inductor (``compiled_rope_bytes``) instead of one fused kernel's.
    """
    tp, cp = strategy.tp, strategy.cp
    b, s = strategy.mbs, strategy.seq_len
    s_loc = s // cp  # tokens of one sequence on this GPU
    tokens = b * s_loc
    h = model.hidden_size
    a_loc = max(1, model.num_attention_heads // tp)
    kv_loc = max(1, model.kv_heads // tp)
    d_qk = model.qk_head_dim if model.is_mla else model.dim_per_head
    d_v = model.v_dim_per_head if model.is_mla else model.dim_per_head
    act = BYTES_BF16
    norm_tokens = tokens / tp if strategy.sp else tokens  # SP shards norms/dropout by sequence

    # eager code variants of the memory-bound ops (Op.kernel; catalogs/efficiency.yaml eager_traffic)
    norm_k, residual_k, act_k = _eager_kernels(model)
    ops: list[Op] = [_mem("norm_attn", 2 * act * norm_tokens * h, kernel=norm_k)]
    if model.is_mla:
        r, rq = model.kv_lora_rank, model.q_lora_rank
        assert r is not None
        if rq is None:
            ops.append(_gemm("q_proj", tokens, a_loc * d_qk, h))
        else:  # down-projection replicated across TP, up-projection sharded
            ops.append(_gemm("q_down", tokens, rq, h, tp_sharded=False))
            ops.append(_gemm("q_up", tokens, a_loc * d_qk, rq))
        ops.append(_gemm("kv_down", tokens, r + model.qk_rope_head_dim, h, tp_sharded=False))
        ops.append(_gemm("kv_up", tokens, a_loc * (model.dim_per_head + d_v), r))
        kv_width = a_loc * (d_qk + d_v)  # MLA materialises per-head K and V
    else:
        ops.append(_gemm("qkv_proj", tokens, (a_loc + 2 * kv_loc) * model.dim_per_head, h))
        kv_width = 2 * kv_loc * model.dim_per_head

    if model.uses_rope and compiled_rope is not None and not model.is_mla:
        fwd_b, bwd_b = compiled_rope_bytes(compiled_rope, q=a_loc * d_qk, kv=kv_loc * d_qk, hidden=h, head_dim=d_qk,
                                           grouped=kv_loc < a_loc)
        ops.append(_mem("rope", tokens * fwd_b, kernel="rope", backward_bytes_per_forward=bwd_b / fwd_b))
    elif model.uses_rope:  # rotary embedding of q and k: read and write both once (fused)
        ops.append(_mem("rope", 2 * act * tokens * (a_loc * d_qk + (kv_width // 2 if not model.is_mla else a_loc * d_qk)),
                        kernel="rope"))

    # Attention core.  Scores over the full (global) sequence: with CP each GPU's queries
    # attend to all s keys (ring attention), so work is b*a*s_loc*s*d.
    full_flops = 2.0 * b * a_loc * s_loc * s * (d_qk + d_v)
    if attention in FUSED_ATTENTION:
        hbm = act * tokens * (a_loc * d_qk + kv_width + a_loc * d_v) + 4 * b * a_loc * s_loc
        bwd = conventions().attention_backward_per_forward
        # sliding-window layers (Model.local_attention_layers): the layer op list stands for the
        # stage's average layer, so their share of the layers attends the window (one no shorter
        # than the sequence is full attention)
        window = model.local_attention_window or s
        local = model.local_attention_layers / model.num_layers if window < s else 0.0
        if local < 1.0:
            # m: the per-kernel query length (with CP each ring step attends a local chunk), which
            # decides the kernel's efficiency (sim.layers.compute attention curves)
            ops.append(Op("attention", "attention", (1 - local) * full_flops / 2, (1 - local) * hbm, m=s_loc, n=s,
                          k=d_qk, batch=b * a_loc, model_flops=(1 - local) * full_flops, recompute_selective=True,
                          kernel=attention, backward_flops_per_forward=bwd))
        if local > 0.0:
            work = 2.0 * b * a_loc * s_loc * windowed_keys(s, window) * (d_qk + d_v)
            # a causal kernel over 2w tokens attends w keys per query on average: its efficiency
            # curve point; one ring step (the window reaches at most the neighbour's chunk, whose
            # exchange the CP pricing already counts)
            m = min(s_loc, 2 * window)
            ops.append(Op("attention_local", "attention", local * work, local * hbm, m=m, n=m, k=d_qk,
                          batch=b * a_loc, model_flops=local * 2 * work, recompute_selective=True,
                          kernel=attention, backward_flops_per_forward=bwd))
    else:
        sq = b * a_loc * s_loc * s  # score elements
        ops.append(_gemm("scores_qk", s_loc, s, d_qk, batch=b * a_loc, recompute_selective=True))
        # scale+mask+softmax fused (read fp16 scores, write fp16 probs) + dropout (read probs,
        # write probs and a 1-byte mask): Korthikanti et al. Sec. 4.1 tensors.
        ops.append(_mem("softmax_dropout", sq * (act + act + act + act + 1), recompute_selective=True,
                        kernel="softmax_dropout"))
        ops.append(_gemm("attn_v", s_loc, d_v, s, batch=b * a_loc, recompute_selective=True))
    ops.append(_gemm("out_proj", tokens, h, a_loc * d_v))
    ops.append(_mem("residual_dropout_attn", 4 * act * norm_tokens * h, kernel=residual_k))
    ops.append(_mem("norm_mlp", 2 * act * norm_tokens * h, kernel=norm_k))

    ep_bytes = 0.0
    ep_count = 0
    etp_bytes = 0.0
    m_ffn = model.num_ffn_matrices
    if not moe:
        f_loc = model.ffn_hidden_size // tp
        up = (m_ffn - 1) * f_loc
        ops.append(_gemm("ffn_up", tokens, up, h))
        ops.append(_mem("activation", act * tokens * (up + f_loc), kernel=act_k))
        ops.append(_gemm("ffn_down", tokens, h, f_loc))
    else:
        spec = model.moe
        assert spec is not None
        ep, etp = strategy.ep, strategy.expert_tp
        ops.append(_gemm("router", tokens, spec.num_experts, h, tp_sharded=False))
        ops.append(_mem("router_topk_permute", 2 * act * tokens * h * spec.top_k + 4 * tokens * spec.num_experts))
        # Megatron-Core's token dispatcher (MoE parallel folding): each rank dispatches its
        # (sequence-parallel) share of the tokens to the ep ranks holding the chosen experts
        # (all-to-all), then the etp ranks of an expert gather each other's tokens and each
        # computes 1/etp of the expert FFN.  Balanced routing: every rank receives as many
        # token copies as it sends.  Without SP (tp > 1) the tp ranks hold the same tokens and
        # shard the experts by tp (etp = tp).
        fe_loc = spec.expert_ffn_hidden_size // etp
        local_experts = max(1, spec.num_experts // ep)
        sent_tokens = tokens * spec.top_k / (tp if strategy.sp else 1)  # copies this rank dispatches
        routed_tokens = tokens * spec.top_k * etp / tp * moe_imbalance  # copies the busiest rank's experts compute
        per_expert = max(1, round(routed_tokens / local_experts))
        up = (m_ffn - 1) * fe_loc
        ops.append(_gemm("expert_up", per_expert, up, h, batch=local_experts))
        ops.append(_mem("expert_activation", act * routed_tokens * (up + fe_loc), kernel=act_k))
        ops.append(_gemm("expert_down", per_expert, h, fe_loc, batch=local_experts))
        if spec.num_shared_experts:
            fs = spec.num_shared_experts * spec.expert_ffn_hidden_size // tp
            ops.append(_gemm("shared_up", tokens, (m_ffn - 1) * fs, h))
            ops.append(_mem("shared_activation", act * tokens * m_ffn * fs, kernel=act_k))
            ops.append(_gemm("shared_down", tokens, h, fs))
        if ep > 1:
            ep_bytes = act * sent_tokens * h * moe_imbalance  # the busiest rank receives this much
            ep_count = 2  # dispatch + combine
        if etp > 1 and etp != tp:
            # the etp group gathers its tokens before the experts and reduce-scatters after:
            # one all-reduce's worth of traffic on the routed tokens (output size)
            etp_bytes = act * routed_tokens * h
    ops.append(_mem("residual_dropout_mlp", 4 * act * norm_tokens * h, kernel=residual_k))

    if strategy.precision == "fp8":
        ops = _with_fp8_casts(ops, strategy.fp8_recipe, fp8_quantize_bytes_per_element, fp8_compiled_casts)

    tp_bytes = act * tokens * h if tp > 1 else 0.0
    # Two TP collectives per pass (attention, MLP); an MoE layer whose experts use another
    # tensor-parallel size has one (attention) plus its etp collective.
    tp_count = 0 if tp == 1 else (1 if moe and strategy.expert_tp != tp else 2)
    cp_bytes = act * b * s_loc * kv_width if cp > 1 else 0.0
    return LayerOps(tuple(ops), tp_bytes, tp_count, cp_bytes, ep_bytes, ep_count, etp_bytes)


def compiled_rope_bytes(terms: Mapping[str, Mapping[str, float]], *, q: float, kv: float, hidden: float,
                        head_dim: float, grouped: bool) -> tuple[float, float]:
    """(forward, backward) bytes per token of torchtitan's attention element-wise code compiled by
    inductor (``catalogs/efficiency.yaml`` ``compiled_rope``, counted from inductor's kernels by
    ``validate.compiled_traffic``): the complex-fp32 rotary embedding (a conversion to fp32, an
    ATen complex multiply inductor cannot generate, a conversion back, for Q and K), repeat_kv's
    copies of K and V at the query width (``grouped``), and the sum of the three projections'
    input gradients; ``q``/``kv`` are the local query and key widths, ``hidden`` the block input's."""
    def side(t: Mapping[str, float]) -> float:
        return (t["q"] * q + t["kv"] * kv + t["hidden"] * hidden + t["head_dim"] * head_dim
                + (t["repeat_q"] * q + t["repeat_kv"] * kv if grouped else 0.0))
    return side(terms["fwd"]), side(terms["bwd"])


def _eager_kernels(model: Model) -> tuple[str, str, str]:
    """(norm, residual, activation) code variants the model family's reference code runs
    (``Model.is_llama_family``; the residual with dropout where the model trains with it,
    ``Model.has_dropout``): what their element-wise ops cost when run eagerly."""
    residual = "dropout_add" if model.has_dropout else "add"
    if model.is_llama_family:
        return "rmsnorm", residual, "swiglu"
    return "layernorm", residual, "gelu"


BF16_GEMMS = frozenset({"scores_qk", "attn_v", "logits", "router"})


def _with_fp8_casts(ops: list[Op], recipe: str, bytes_per_element: float,
                    compiled: Mapping[str, tuple[float, float, float]] | None = None) -> list[Op]:
    """Mark the fp8 linear layers with their recipe and add the quantization of their
    activations: the input x (M x K) before the forward GEMM and the output gradient dy
    (M x N) before the backward GEMMs, each with the transposed copy the other GEMM needs
    (Micikevicius et al. 2022, "FP8 Formats for Deep Learning", Sec. 4; Transformer Engine).
    The bytes per element are the recipe's fitted cost (amax, scale, cast, transpose); the
    weights (K x N) are cast as per-parameter work (``sim.cost.step.stage_pieces``).

    ``compiled``: the casts run inside a compiled block (torchao under torch.compile), at the
    bytes inductor's kernels move for them (``validate/compiled_traffic.py``: per input element
    forward and backward, per output-gradient element), by the input's producer: an element-wise
    op (listed just before the GEMM: a norm, activation or permutation), whose kernel the amax and
    cast recompute from its own input, or an extern kernel (attention, another GEMM) whose output
    they read."""
    out: list[Op] = []
    prev: Op | None = None
    for op in ops:
        if op.kind == "matmul" and op.name not in BF16_GEMMS:
            fwd_elems = op.batch * op.m * op.k
            bwd_elems = op.batch * op.m * op.n
            if compiled is None:
                fwd_bytes, ratio = bytes_per_element * fwd_elems, bwd_elems / fwd_elems
            else:
                x_fwd, x_bwd, dy = compiled["elementwise" if prev is not None and prev.kind == "memory" else "extern"]
                fwd_bytes, ratio = x_fwd * fwd_elems, (x_bwd * fwd_elems + dy * bwd_elems) / (x_fwd * fwd_elems)
            out.append(_mem(f"fp8_cast_{op.name}", fwd_bytes, backward_bytes_per_forward=ratio))
            op = replace(op, kernel=recipe)
        out.append(op)
        prev = op
    return out


def head_ops(model: Model, strategy: Strategy, loss: str = "inplace") -> tuple[Op, ...]:
    """Final norm, output projection (logits) and cross-entropy on the last pipeline stage.

    ``loss`` is the framework's loss code (``Plan.loss``): which eager kernels the
    cross-entropy runs (catalogs/efficiency.yaml eager_traffic ``cross_entropy_<loss>``).

    With multi-token prediction (``model.mtp_layers``), each depth adds what Megatron-Core's
    ``MultiTokenPredictionLayer`` runs around its transformer layer (which ``sim.layers.stages`` puts on
    this stage as one more layer): the embedding of the shifted tokens, ``enorm`` and ``hnorm``,
    ``eh_proj`` (a column-parallel ``2h -> h`` linear), its final norm, and the shared output layer
    and loss again (megatron/core/transformer/multi_token_prediction.py, core_v0.12.0
    ``MultiTokenPredictionLayer.__init__`` and ``MultiTokenPredictionBlock.forward``; the
    output-layer call in ``process_mtp_loss`` of later versions)."""
    tp, b, s_loc = strategy.tp, strategy.mbs, strategy.seq_len // strategy.cp
    tokens = b * s_loc
    h, v_loc = model.hidden_size, model.vocab_size // tp
    sp = tp if strategy.sp else 1
    norm_k = _eager_kernels(model)[0]
    one = (
        _mem("final_norm", 2 * BYTES_BF16 * tokens * h / sp, kernel=norm_k),
        _gemm("logits", tokens, v_loc, h),
        # fp32 upcast, log-softmax, loss: read bf16 logits, write/read fp32 twice
        _mem("cross_entropy", tokens * v_loc * (BYTES_BF16 + 4 + 4), kernel=f"cross_entropy_{loss}"),
    )
    mtp: tuple[Op, ...] = ()
    for _ in range(model.mtp_layers):
        mtp += (_mem("mtp_embedding", 2 * BYTES_BF16 * tokens * h / sp),
                _mem("mtp_norms", 2 * 2 * BYTES_BF16 * tokens * h / sp, kernel=norm_k),
                _gemm("mtp_eh_proj", tokens, h // tp, 2 * h)) + one
    return one + mtp


def embedding_ops(model: Model, strategy: Strategy) -> tuple[Op, ...]:
    """Token embedding lookup on the first pipeline stage (a gather: memory-bound)."""
    tokens = strategy.mbs * strategy.seq_len // strategy.cp
    return (_mem("embedding", 2 * BYTES_BF16 * tokens * model.hidden_size),)


def model_flops_per_step(model: Model, strategy: Strategy) -> float:
    """Model FLOPs of one optimizer step: 3x forward, full-square attention, logits included.

    This is the MFU numerator of PaLM (Chowdhery et al. 2022, App. B: 6N + 12*L*H*Q*T per
    token) and of Narayanan et al. (2021) eq. (3) without the recomputation term; it
    excludes recomputation (HFU adds it) and counts only routed (active) experts.
    Independent of how the model is sharded.
    """
    one = strategy.with_(tp=1, cp=1, ep=1, etp=None, sp=False, dp=1, dp_shard=None, pp=1, vp=1, zero=0,
                         schedule="1f1b", gbs=strategy.mbs)
    per_seq_fwd = 0.0
    dense = layer_ops(model, one, moe=False)
    per_seq_fwd += model.num_dense_layers * sum(op.counted_flops for op in dense.ops if op.kind != "memory")
    if model.moe is not None:
        moe = layer_ops(model, one, moe=True)
        per_seq_fwd += model.num_moe_layers * sum(op.counted_flops for op in moe.ops if op.kind != "memory")
    per_seq_fwd += sum(op.counted_flops for op in head_ops(model, one))
    return 3.0 * per_seq_fwd * strategy.gbs / strategy.mbs
