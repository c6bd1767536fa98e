"""A configurable GPT-style decoder, small enough to train on a laptop, shaped like the simulator's.

The layer is the one ``sim.layers.ops.layer_ops`` counts for ``ffn_type="gelu"``: pre-norm
LayerNorm (weight only), separate Q/K/V projections (so tensor parallelism can shard heads
column-wise, as torchtitan does), causal ``scaled_dot_product_attention``, an output
projection, LayerNorm, ``Linear(h, f) -> GELU -> Linear(f, h)``, no biases and no dropout.
Embedding and output layer are untied; there is no positional embedding (the causal mask
orders tokens; throughput, not quality, is measured).  Parameter count equals
``ModelConfig.to_sim_model().num_params`` exactly (tested), so the simulator and the run
count the same weights.

Parameters are fp32; on a GPU the forward runs under bf16 autocast (mixed precision, as the
simulator's ``precision=bf16`` assumes), on a CPU in fp32 (bf16 GEMMs are slow on many CPUs;
the CPU profile is fitted and corrected for fp32, ``sim.cost.calibration``).
With autocast the residual stream stays in bf16 end to end: the embedding output is cast to
it and ``LayerNorm`` returns its input's dtype (``layer_norm`` is on autocast's fp32 list,
which would otherwise make every norm output, residual, sequence-parallel gather and pipeline
send fp32, twice the bytes the simulator counts).

Layers live in an ``nn.ModuleDict`` keyed ``"0".."L-1"`` and the embedding, final norm and
output layer may be ``None``: a pipeline stage deletes what it does not own (torchtitan's
manual split) and ``forward`` skips it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from validate.specs import ModelConfig


class LayerNorm(nn.LayerNorm):
    """LayerNorm (weight only) whose output keeps the input's dtype: bf16 in, bf16 out, with
    the statistics accumulated in fp32 inside the kernel, as Megatron's and Transformer
    Engine's fused norms do.  Autocast would run it in fp32 and return fp32 (PyTorch docs,
    "Automatic Mixed Precision package": CUDA ops that can autocast to float32 include
    ``layer_norm``), so it runs with autocast off on the weight cast to the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            w = self.weight.to(x.dtype) if self.weight is not None else None
            return F.layer_norm(x, self.normalized_shape, w, None, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.head_dim = h // cfg.num_heads
        self.wq = nn.Linear(h, h, bias=False)
        self.wk = nn.Linear(h, h, bias=False)
        self.wv = nn.Linear(h, h, bias=False)
        self.wo = nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads/tp of them.
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = LayerNorm(cfg.hidden_size, bias=False)
        self.attention = Attention(cfg)
        self.ffn_norm = LayerNorm(cfg.hidden_size, bias=False)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(nn.Module):
    """Token ids ``(b, s)`` in, logits ``(b, s, vocab)`` out (hidden states on inner stages)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.num_layers)})
        self.norm: nn.LayerNorm | None = LayerNorm(cfg.hidden_size, bias=False)
        self.output: nn.Linear | None = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # bf16 autocast on GPUs (the simulator's mixed-precision recipe); None: train in fp32
        self.autocast_dtype: torch.dtype | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                            enabled=self.autocast_dtype is not None):
            h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
            if self.autocast_dtype is not None and h.is_floating_point():
                h = h.to(self.autocast_dtype)  # the residual stream in the training dtype
            for layer in self.layers.values():
                h = layer(h)
            h = self.norm(h) if self.norm is not None else h
            return self.output(h) if self.output is not None else h


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
