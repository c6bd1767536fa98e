"""HBM traffic of torchao's float8 casts when torch.compile (inductor) fuses them into the
layer's other element-wise kernels, counted from inductor's own scheduler.

Transformer Engine quantizes each fp8 GEMM's input and output gradient in kernels of its own
(amax, scale, cast and the transposed copy): ``catalogs/efficiency.yaml`` ``fp8_recipes`` prices
them from TE's profiled kernel times.  torchtitan's float8 training (torchao ``Float8Linear``,
recipe ``tensorwise``) runs the same steps as PyTorch ops inside the compiled transformer block,
so inductor fuses them with their neighbours: the amax and the cast recompute a norm's output
from its input instead of reading a stored copy, and no 16-bit copy of that output is written.

``measure()`` compiles a block (an element-wise producer, RMSNorm as torchtitan writes it, or an
extern one, a matmul standing for attention, then one linear ``H -> N``) twice, with torchao's
``Float8Linear`` and with ``nn.Linear``, and sums ``get_read_write_buffers_sizes()`` over the
scheduler's generated kernels (extern kernels, the GEMMs, are not counted), forward and
backward.  The float8 block's extra bytes at four shapes (tokens ``T`` and output width ``N``
each at two values) separate the per-token terms from the per-weight ones: bytes per input
element forward (``input_fwd``) and backward (``input_bwd``), per output-gradient element
(``grad_bwd``), and per weight element, forward and backward (``weight``: the weight's amax, cast
and transposed cast, which ``sim.layers.compute.fp8_weight_cast_bytes_per_param`` prices per
parameter and micro-batch).  Measured on CPU: the fusion decisions are the scheduler's, shared by
the CPU and GPU backends; the bytes are those of the kernels it generates, read and written
once each (a GPU's Triton kernels may read a tile twice where a reduction does not fit).

``attention_bytes()`` counts the element-wise kernels of torchtitan's ``Attention`` (``validate.titan``)
compiled whole, forward and backward: inductor's generated kernels and the ATen fallbacks tagged
pointwise (the complex multiplies of torchtitan's rotary embedding, which inductor cannot generate),
not the GEMMs, the attention kernel or views.  ``catalogs/efficiency.yaml`` ``compiled_rope`` holds
the per-element counts those kernels add up to (tests/test_eager_traffic.py compares them).

Known answers (torch 2.13, torchao 0.18): with an element-wise producer, forward 3 B per input
element (amax and cast recompute the norm from its 2-byte input: 2 + 2 + 1 read/written where
the 16-bit block writes 2), backward 1; with an extern producer, forward 5 (amax read 2, cast
read 2 + write 1); output gradient 8 (amax 2, cast 2 + 1, transposed cast 2 + 1).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch._functorch.config
import torch._inductor.config
import torch._inductor.scheduler as inductor_scheduler

from sim.data.specs import Model
from validate.patching import replaced
from validate.titan import Attention

SHAPES = ((2048, 256), (4096, 256), (2048, 512), (4096, 512))  # (tokens, output width) at hidden 256
HIDDEN = 256


@dataclass(frozen=True, slots=True)
class Fp8CastTraffic:
    """Bytes per element of one fp8 linear's activation casts under inductor."""

    producer: str  # "elementwise" (a norm, activation or permutation kernel) or "extern" (attention)
    input_fwd: float  # per input element, forward
    input_bwd: float  # per input element, backward
    grad_bwd: float  # per output-gradient element, backward
    weight: float  # per weight element, forward and backward (the weight's amax, cast and transposed cast)


class _Block(torch.nn.Module):
    def __init__(self, hidden: int, out: int, producer: str) -> None:
        super().__init__()
        self.producer = producer
        self.norm_weight = torch.nn.Parameter(torch.ones(hidden))
        self.mix = torch.nn.Parameter(torch.randn(hidden, hidden) / hidden ** 0.5)
        self.linear = torch.nn.Linear(hidden, out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.producer == "extern":
            y = x @ self.mix.to(x.dtype)
        else:  # torchtitan's RMSNorm
            xf = x.float()
            y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.norm_weight.to(x.dtype)
        return self.linear(y)


def _generated(node) -> float:
    """A scheduler node's bytes if inductor generates its kernel (extern kernels, the GEMMs, are not counted)."""
    if type(node).__name__ in ("ExternKernelSchedulerNode", "NopKernelSchedulerNode"):
        return 0.0
    return float(node.get_read_write_buffers_sizes())


def _compiled_bytes(module: torch.nn.Module, args: tuple, count, *, expect_kernels: bool) -> tuple[float, float]:
    """(forward, backward) sums of ``count`` over the scheduler nodes of ``module`` compiled by inductor
    and run forward and backward on ``args`` (the first requires grad).  The compile caches are off:
    they would skip the scheduler on a second run of the same graph."""
    counted: list[float] = []
    original = inductor_scheduler.Scheduler._codegen

    def codegen(self, nodes):  # the kernels inductor schedules, in order
        counted.extend(count(n) for n in nodes)
        return original(self, nodes)

    torch._dynamo.reset()
    try:
        with replaced(inductor_scheduler.Scheduler, "_codegen", codegen), \
                torch._inductor.config.patch(force_disable_caches=True), \
                torch._functorch.config.patch(enable_autograd_cache=False), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not support code generation for complex")
            y = torch.compile(module, dynamic=False)(*args)
            forward = sum(counted)
            if expect_kernels and not any(counted):
                raise RuntimeError(f"inductor generated no kernels for {type(module).__name__} (a compile cache answered?)")
            y.backward(torch.ones_like(y))
            backward = sum(counted) - forward
    finally:
        torch._dynamo.reset()
    return forward, backward


def _kernel_bytes(tokens: int, hidden: int, out: int, producer: str, fp8: bool) -> tuple[float, float]:
    """(forward, backward) bytes of the generated kernels of one compiled block."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    block = _Block(hidden, out, producer).to(torch.bfloat16)
    if fp8:
        convert_to_float8_training(block, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                   module_filter_fn=lambda m, fqn: fqn == "linear")
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    # (a 16-bit block with an extern producer has no kernels of its own)
    return _compiled_bytes(block, (x,), _generated, expect_kernels=fp8)


def _extra(tokens: int, hidden: int, out: int, producer: str) -> tuple[float, float]:
    f8, b16 = _kernel_bytes(tokens, hidden, out, producer, True), _kernel_bytes(tokens, hidden, out, producer, False)
    return f8[0] - b16[0], f8[1] - b16[1]


def measure_producer(producer: str, hidden: int = HIDDEN,
                     shapes: tuple[tuple[int, int], ...] = SHAPES) -> Fp8CastTraffic:
    """The per-element terms (module docstring) from the float8 block's extra bytes at ``shapes``
    ((tokens, output width): two token counts by two widths): per token, forward ``H a_f`` and
    backward ``H a_b + N g``, linear in the output width ``N``."""
    (t1, n1), (t2, _), (_, n2), _ = shapes
    extra = {(t, n): _extra(t, hidden, n, producer) for t, n in shapes}
    slope = {n: [(extra[(t2, n)][i] - extra[(t1, n)][i]) / (t2 - t1) for i in (0, 1)] for n in (n1, n2)}
    grad = (slope[n2][1] - slope[n1][1]) / (n2 - n1)
    # what does not grow with the tokens is the weight's: its amax and casts, per weight element
    # (hidden x n), forward plus backward, the mean of the two widths
    weight = sum(sum(extra[(t1, n)][i] - t1 * slope[n][i] for i in (0, 1)) / (hidden * n) for n in (n1, n2)) / 2
    return Fp8CastTraffic(producer=producer, input_fwd=slope[n1][0] / hidden,
                          input_bwd=(slope[n1][1] - n1 * grad) / hidden, grad_bwd=grad, weight=weight)


def measure() -> list[Fp8CastTraffic]:
    return [measure_producer(p) for p in ("elementwise", "extern")]


# ------------------------------------------------------------ torchtitan's attention, compiled

ROPE_TOKENS = 1024


def _elementwise(node) -> float:
    """A scheduler node's bytes if it is an element-wise kernel: one inductor generates, or an ATen
    fallback tagged pointwise (the complex multiplies inductor cannot generate code for:
    torch/_inductor/lowering.py falls back on complex dtypes); GEMMs, attention and views are not."""
    if type(node).__name__ == "ExternKernelSchedulerNode":
        op = getattr(node.node, "op_overload", None)
        if op is None or op.is_view or torch.Tag.pointwise not in op.tags:
            return 0.0
        return float(node.get_read_write_buffers_sizes())
    return _generated(node)


def attention_bytes(q_heads: int, kv_heads: int, hidden: int, head_dim: int,
                    tokens: int = ROPE_TOKENS) -> tuple[float, float]:
    """(forward, backward) element-wise bytes of one compiled ``validate.titan.Attention``."""
    model = Model(name="probe", num_layers=1, hidden_size=hidden, num_attention_heads=q_heads,
                  ffn_hidden_size=4 * hidden, vocab_size=128, num_kv_heads=kv_heads, head_dim=head_dim,
                  ffn_type="swiglu")
    torch.manual_seed(0)
    attention = Attention(model).to(torch.bfloat16)
    freqs = torch.polar(torch.ones(tokens, head_dim // 2), torch.rand(tokens, head_dim // 2))
    x = torch.randn(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    return _compiled_bytes(attention, (x, freqs), _elementwise, expect_kernels=True)
