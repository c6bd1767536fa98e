"""HBM traffic of the element-wise ops of a transformer layer when PyTorch runs them eagerly,
counted from the aten calls their module code dispatches, forward and autograd backward.

The planner prices a memory-bound op (``sim.layers.ops``: norms, rotary embedding, activation,
residual add, loss, unfused softmax) as the bytes of one fused kernel.  Eager PyTorch runs
every aten op of the module's code as its own kernel, which reads its inputs from HBM and
writes its outputs back, and autograd runs each op's derivative formula
(``tools/autograd/derivatives.yaml``) the same way.  Under a ``TorchDispatchMode`` every
aten call of the forward and of ``torch.autograd.backward`` is seen with its tensors, so the
traffic of the code as written is counted exactly, on CPU, for any shape: views are free,
reductions write their small outputs, in-place ops read and write, indexing ops touch only the
indexed elements, and a softmax over a row wider than shared memory re-reads it as CUDA's kernel
does (``_SOFTMAX_EXTRA_READS``).  The derivative formulas are device-independent, so the count
is the one a GPU runs.  Checked against Liger-Kernel's timings of the same code on A100 and H100
(catalogs/microbenchmarks/elementwise.yaml): Hugging Face's RMSNorm runs 9.5x (forward) and
25x (backward, over the fused forward) the fused kernel's time where this counts 9.0x and 24x.

``measure()`` returns, per code variant, the forward and backward bytes over the fused op's
forward bytes (``sim.layers.ops.layer_ops`` / ``head_ops`` at the same shapes);
``scripts/measure_eager_traffic.py --write`` stores them as ``catalogs/efficiency.yaml``
``eager_traffic`` (read by ``sim.layers.compute.op_time``).

Code measured (the source each follows):

* ``rmsnorm``: torchtitan's ``RMSNorm`` (``validate.titan``: ``x.float()``, ``pow``, ``mean``,
  ``rsqrt``, ``type_as``, weight ``mul``; Hugging Face ``LlamaRMSNorm`` runs the same ops).
* ``layernorm``: ``F.layer_norm`` (one ATen kernel forward and backward).
* ``rope``: the mean of torchtitan's complex-fp32 rotary embedding (``validate.titan._rope``)
  and Hugging Face's ``rotate_half`` form (``q * cos + rotate_half(q) * sin``), per q/k element.
* ``swiglu``: ``F.silu(w1 x) * w3 x``; ``gelu``: ``F.gelu(x, approximate="tanh")``.
* ``add`` / ``dropout_add``: the residual ``x + f(x)`` (``f`` followed by dropout, p = 0.1, for
  the GPT family), backward including the accumulation of ``x``'s two gradients (measured as
  the residual around a norm, minus the norm alone).
* ``cross_entropy_upcast``: ``F.cross_entropy(logits.float(), labels)`` (torchtitan, Hugging
  Face); ``cross_entropy_inplace``: Megatron's ``_VocabParallelCrossEntropy`` at one tensor-
  parallel rank on ``logits.float()`` (megatron/core/tensor_parallel/cross_entropy.py: max,
  subtract in place, gather the target logit, ``exp`` in place, sum, log, divide in place;
  backward: subtract one at the target, multiply by the incoming gradient);
  ``cross_entropy_outofplace``: the same with the maximum subtracted into a new tensor
  (core_v0.6.0-v0.7.0, Megatron-DeepSpeed): the same bytes move, more are held;
  ``cross_entropy_bf16``: ``F.cross_entropy(logits, labels)`` on the bf16 logits themselves
  (NeMo Automodel's ``MaskedCrossEntropy(fp32_upcast=False)``); ``cross_entropy_loss_parallel``:
  torchtitan's ``cross_entropy(logits.float())`` under ``loss_parallel()`` with tensor
  parallelism, whose DTensor handlers run a decomposed log-softmax and a combined backward on
  each rank's vocabulary shard (torch/distributed/tensor/parallel/loss.py ``_log_softmax``,
  ``_nll_loss_forward``, ``_nll_loss_and_log_softmax_backward``): those functions are run
  directly on one rank's shard (a one-rank gloo group: their all-reduces move a value per token).
* ``softmax_dropout``: unfused attention's score path as Hugging Face GPT-2 runs it (scale,
  ``torch.where`` causal mask, softmax, dropout p = 0.1), per score element.

Known error: tensors small enough to stay in L2 (tens of MB) are read from cache, not HBM,
so small shapes read less than counted; broadcast operands are counted at their own size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from sim.data.specs import Model, Strategy
from sim.layers.ops import head_ops, layer_ops
from validate.titan import RMSNorm, _rope

_FREE = frozenset({"aten::detach", "aten::lift_fresh"})
# CUDA's softmax over a row wider than one block's shared memory (48 KiB) reads the row three
# times (max, sum of exponentials, then the write pass) and its backward reads the incoming
# gradient twice (sum, then the write pass): ATen native/cuda/SoftMax.cu cunn_SoftMaxForward /
# cunn_SoftMaxBackward (cunn_SoftMaxForwardSmem keeps a row that fits in shared memory).
_SOFTMAX_ROW_BYTES = 48 * 1024
_SOFTMAX_EXTRA_READS = {"aten::_log_softmax": 2, "aten::_softmax": 2,
                        "aten::_log_softmax_backward_data": 1, "aten::_softmax_backward_data": 1}
# Indexing ops touch only the indexed elements of the tensor they index (the argument at this
# position): its size is not traffic.  An in-place one writes as many elements as it reads.
_INDEXED = {"aten::nll_loss_forward": 0, "aten::nll_loss_backward": 1, "aten::index": 0, "aten::index_put_": 0,
            "aten::index_put": 0, "aten::gather": 0}


class _Traffic(TorchDispatchMode):
    """Sums the bytes every non-view aten call reads (its tensor arguments) and writes (its
    tensor results)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if func.is_view or name in _FREE:
            return out
        reads = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        writes = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if name in _INDEXED:
            indexed = args[_INDEXED[name]]
            reads = [t for t in reads if t is not indexed]
            if name.endswith("_"):  # in place: the indexed tensor is the result; the values are written
                writes = [t for t in reads if t.is_floating_point()]
        self.bytes += sum(t.numel() * t.element_size() for t in reads + writes)
        if name in _SOFTMAX_EXTRA_READS and reads[0].shape[-1] * reads[0].element_size() > _SOFTMAX_ROW_BYTES:
            self.bytes += _SOFTMAX_EXTRA_READS[name] * reads[0].numel() * reads[0].element_size()
        return out


def _count(fn, *inputs: torch.Tensor) -> tuple[int, int]:  # noqa: ANN001
    """(forward, backward) bytes of ``fn(*inputs)`` with a random incoming gradient."""
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    fwd = _Traffic()
    with fwd:
        out = fn(*leaves)
    grad = torch.randn_like(out)
    bwd = _Traffic()
    with bwd:
        torch.autograd.backward(out, grad)
    return fwd.bytes, bwd.bytes


def _count_loss_parallel(logits: torch.Tensor, target: torch.Tensor) -> tuple[int, int]:
    """(forward, backward) bytes of ``cross_entropy(logits.float())`` under ``loss_parallel()`` at
    one rank: the ``.float()`` cast, DTensor's ``_log_softmax`` and ``_nll_loss_forward`` on the
    shard, then ``_nll_loss_and_log_softmax_backward`` (the log-softmax backward handler only
    returns its incoming gradient) and the cast's backward."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss as lp
    from torch.nn.modules.loss import _Reduction

    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        mean = _Reduction.get_enum("mean")
        fwd = _Traffic()
        with fwd:
            x = logits.float()
            logp = lp._log_softmax(x, 1, False, mesh, 0)
            _, total_weight = lp._nll_loss_forward(logp, target, None, None, mean, -100, logp.shape, 1, mesh, 0)
        bwd = _Traffic()
        with bwd:
            grad = lp._nll_loss_and_log_softmax_backward(torch.ones(()), logp, target, None, mean, -100, total_weight,
                                                         logp.shape, 1, mesh, 0)
            grad.to(logits.dtype)
        return fwd.bytes, bwd.bytes
    finally:
        if ours:
            dist.barrier()
            dist.destroy_process_group()


def _rotate_half_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)
    qe = q * cos + rot(q) * sin
    ke = k * cos + rot(k) * sin
    return torch.cat((qe.flatten(), ke.flatten()))


def _megatron_cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, inplace: bool = True) -> torch.Tensor:
    """_VocabParallelCrossEntropy at tp=1 on ``logits.float()``, as an autograd function.

    ``inplace``: the maximum is subtracted in place (Megatron-LM before September 2022 and
    Megatron-Core from core_v0.8.0, commit 9634c0e "Reduce logit memory pressure by using in-place
    operation"); else into a new fp32 tensor while the ``.float()`` copy is still held by the
    caller (core_v0.6.0 / core_v0.7.0 and Megatron-DeepSpeed since 2023:
    ``vocab_parallel_logits = vocab_parallel_logits - logits_max.unsqueeze(dim=-1)``)."""

    class _CE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
            if inplace:
                x.sub_(x.max(dim=-1)[0].unsqueeze(-1))
            else:
                x = x - x.max(dim=-1)[0].unsqueeze(-1)
            rows = torch.arange(x.shape[0])
            predicted = x[rows, t].clone()
            x.exp_()
            total = x.sum(dim=-1)
            loss = torch.log(total) - predicted
            x.div_(total.unsqueeze(-1))
            ctx.save_for_backward(x, t)
            return loss

        @staticmethod
        def backward(ctx, g: torch.Tensor):  # noqa: ANN001
            softmax, t = ctx.saved_tensors
            grad = softmax
            grad[torch.arange(grad.shape[0]), t] -= 1.0
            grad.mul_(g.unsqueeze(-1))
            return grad, None

    return _CE.apply(logits.float(), target)


def _gpt2_scores(w: torch.Tensor) -> torch.Tensor:
    s = w.shape[-1]
    mask = torch.tril(torch.ones(s, s, dtype=torch.bool))
    w = w / math.sqrt(64.0)
    w = torch.where(mask, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
    return _dropout(torch.softmax(w, dim=-1), 0.1)


def _dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout as it runs on a GPU: ``F.dropout`` dispatches CUDA tensors to the fused
    ``native_dropout`` (output and a bool mask; ATen Dropout.cpp ``is_fused_kernel_acceptable``),
    CPU tensors to a bernoulli-mask decomposition; count the GPU's."""
    return torch.native_dropout(x, p, True)[0]


@dataclass(frozen=True)
class EagerTraffic:
    """One code variant: eager forward and backward bytes over the fused op's forward bytes."""

    kernel: str
    fwd: float
    bwd: float
    fused_op: str


# The shapes measured: Llama 3 8B (the SwiGLU family's variants) and GPT-3 2.7B (the GeLU family's).
LLAMA = Model(name="llama3-8b", num_layers=1, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
              ffn_hidden_size=14336, vocab_size=32000, ffn_type="swiglu")
GPT = Model(name="gpt3-2.7b", num_layers=1, hidden_size=2560, num_attention_heads=32, ffn_hidden_size=10240,
            vocab_size=32000, ffn_type="gelu")


def measure(tokens: int = 256) -> list[EagerTraffic]:
    """Every variant of the module docstring at ``tokens`` tokens of ``LLAMA`` and ``GPT``."""
    torch.manual_seed(0)
    bf = torch.bfloat16
    s = Strategy(mbs=1, seq_len=tokens)
    out: list[EagerTraffic] = []
    for m in (LLAMA, GPT):
        llama = m.is_llama_family
        ops = layer_ops(m, s, moe=False, attention="flash" if llama else "unfused").ops + head_ops(m, s)
        fused = {op.name: op.hbm_bytes for op in ops}

        def add(kernel: str, op: str, counts: tuple[float, float]) -> None:
            out.append(EagerTraffic(kernel, counts[0] / fused[op], counts[1] / fused[op], op))

        h, f = m.hidden_size, m.ffn_hidden_size
        x = torch.randn(1, tokens, h, dtype=bf)
        norm = RMSNorm(h).to(bf) if llama else torch.nn.LayerNorm(h).to(bf)
        n_f, n_b = _count(norm, x)
        add("rmsnorm" if llama else "layernorm", "norm_attn", (n_f, n_b))
        # the residual around the norm, less the norm alone: the add and its gradients' accumulation
        # (from no weight gradient, as the norm alone was: its accumulation is not the add's)
        norm.zero_grad(set_to_none=True)
        r_f, r_b = _count((lambda v: v + norm(v)) if llama else (lambda v: v + _dropout(norm(v), 0.1)), x)
        add("add" if llama else "dropout_add", "residual_dropout_attn", (r_f - n_f, r_b - n_b))
        if not llama:
            add("gelu", "activation", _count(lambda a: F.gelu(a, approximate="tanh"), torch.randn(1, tokens, f, dtype=bf)))
            scores = torch.randn(1, m.num_attention_heads, tokens, tokens, dtype=bf)
            add("softmax_dropout", "softmax_dropout", _count(_gpt2_scores, scores))
            continue
        g, u = torch.randn(1, tokens, f, dtype=bf), torch.randn(1, tokens, f, dtype=bf)
        add("swiglu", "activation", _count(lambda a, b: F.silu(a) * b, g, u))
        d = m.dim_per_head
        q = torch.randn(1, tokens, m.num_attention_heads, d, dtype=bf)
        k = torch.randn(1, tokens, m.kv_heads, d, dtype=bf)
        freqs = torch.polar(torch.ones(tokens, d // 2), torch.rand(tokens, d // 2))
        c1 = _count(lambda a, b: torch.cat([t.flatten() for t in _rope(a, b, freqs)]), q, k)
        cos, sin = torch.rand(1, tokens, 1, d, dtype=bf), torch.rand(1, tokens, 1, d, dtype=bf)
        c2 = _count(lambda a, b: _rotate_half_rope(a, b, cos, sin), q, k)
        # the flatten/cat that joins the two outputs into one tensor is not the code's: take it out
        join = _count(lambda a, b: torch.cat((a.flatten(), b.flatten())), q, k)
        add("rope", "rope", ((c1[0] + c2[0]) / 2 - join[0], (c1[1] + c2[1]) / 2 - join[1]))
        logits = torch.randn(tokens, m.vocab_size, dtype=bf)
        target = torch.randint(0, m.vocab_size, (tokens,))
        add("cross_entropy_upcast", "cross_entropy", _count(lambda z: F.cross_entropy(z.float(), target), logits))
        add("cross_entropy_inplace", "cross_entropy", _count(lambda z: _megatron_cross_entropy(z, target).sum(), logits))
        add("cross_entropy_outofplace", "cross_entropy",
            _count(lambda z: _megatron_cross_entropy(z, target, inplace=False).sum(), logits))
        add("cross_entropy_bf16", "cross_entropy", _count(lambda z: F.cross_entropy(z, target), logits))
        add("cross_entropy_loss_parallel", "cross_entropy", _count_loss_parallel(logits, target))
    return out
