"""Eager element-wise traffic (validate/eager_traffic.py, catalogs/efficiency.yaml eager_traffic) and
the achieved bandwidth of eager kernels (planner.fitting.fit_kernels.fit_memory_kernels)."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from planner.fitting.fit_kernels import fit_memory_kernels
from sim.data.catalog import catalog_document, get_gpu
from sim.layers.compute import catalog_fitted, kernel_efficiency, op_time
from sim.layers.ops import Op, head_ops, layer_ops
from sim.data.specs import Strategy
from validate.eager_traffic import GPT, LLAMA, measure



@pytest.fixture(scope="module")
def measured():
    return {m.kernel: m for m in measure()}


def test_stored_table_is_what_the_measurement_gives(measured):
    stored = catalog_document("efficiency.yaml")["eager_traffic"]["kernels"]
    assert set(stored) == set(measured)
    for k, m in measured.items():
        assert stored[k]["fwd"] == pytest.approx(m.fwd, abs=1e-4), k
        assert stored[k]["bwd"] == pytest.approx(m.bwd, abs=1e-4), k
        assert stored[k]["fused_op"] == m.fused_op


def test_known_answers_counted_by_hand(measured):
    # RMSNorm eager, bf16 in: float() 2+4, pow 4+4, mean 4, mul 4+4, type_as 4+2, weight mul 2+2 = 36 B
    # per element against the fused kernel's read + write of bf16 (4 B)
    assert measured["rmsnorm"].fwd == pytest.approx(36 / 4, rel=2e-3)
    # silu(g) * u: silu 2+2, mul 4+2 = 10 B per output element, fused 6
    assert measured["swiglu"].fwd == pytest.approx(10 / 6)
    # residual add: read two, write one bf16 (6 B) against the fused count's 8; its backward is the
    # one accumulation of the input's two gradients (6 B)
    assert (measured["add"].fwd, measured["add"].bwd) == pytest.approx((6 / 8, 6 / 8))
    # LayerNorm is one ATen kernel forward and backward: eager equals fused
    assert measured["layernorm"].fwd == pytest.approx(1.0, abs=0.01)
    # Megatron's in-place vocab-parallel cross-entropy: float() 6, max 4, sub_ 8, exp_ 8, sum 4, div_ 8
    # = 38 B per logit forward; backward mul_ 8 + the float()'s backward 6 = 14; fused count 10
    assert (measured["cross_entropy_inplace"].fwd, measured["cross_entropy_inplace"].bwd) == \
        pytest.approx((3.8, 1.4), abs=1e-3)
    # torch cross_entropy on logits.float(): a 32000-wide fp32 row exceeds shared memory, so the
    # softmax reads it three times: 6 + (12 + 4) = 22 forward; 4 + (8 + 4 + 4) + 6 = 26 backward
    assert (measured["cross_entropy_upcast"].fwd, measured["cross_entropy_upcast"].bwd) == \
        pytest.approx((2.2, 2.6), abs=1e-3)


def test_counted_ratio_matches_the_timed_ratio_of_the_same_code():
    """Liger-Kernel times Hugging Face's eager RMSNorm and its own fused kernel on the same
    tensors (A100, H100): eager over fused time is the eager over fused bytes this counts, to
    within the two kernels' different achieved bandwidth (Liger's fused norm forward reaches
    ~0.9 of the STREAM rate, eager aten ops ~0.8: the timed ratio is ~17% above the counted)."""
    doc = catalog_document("microbenchmarks/elementwise.yaml")
    by: dict[tuple, dict[str, float]] = {}
    for e in doc["entries"]:
        for p in e["points"]:
            if p["kernel"] == "rms_norm" and p["provider"] in ("huggingface", "liger"):
                by.setdefault((e["id"], p["gpu"], p["x"], p["pass"]), {})[p["provider"]] = p["ms"]
    fwd = [v["huggingface"] / v["liger"] for k, v in by.items() if k[3] == "fwd" and len(v) == 2]
    stored = catalog_document("efficiency.yaml")["eager_traffic"]["kernels"]["rmsnorm"]
    assert len(fwd) >= 6
    assert statistics.median(fwd) == pytest.approx(stored["fwd"], rel=0.2)


def test_memory_kernel_fit_is_stored_and_plausible():
    got = fit_memory_kernels()
    stored = catalog_fitted()["memory_kernels"]["eager"]
    e = got["eager"]
    assert (stored["fwd"], stored["bwd"]) == (e["fwd"], e["bwd"])
    assert 0.5 < e["bwd"] < e["fwd"] <= 1.0  # eager aten kernels reach most of STREAM, backward less
    assert e["points_fwd"] >= 20 and e["points_bwd"] >= 20


def _norm_time(eager: bool, eff) -> tuple[float, float]:
    gpu = get_gpu("h100-80gb")
    op = next(o for o in layer_ops(LLAMA, Strategy(mbs=1, seq_len=4096), moe=False).ops if o.name == "norm_attn")
    t = op_time(gpu, "bf16", op, eff, eager=eager)
    return t.fwd_s, t.bwd_s


def test_eager_norm_priced_at_its_measured_traffic_and_eager_bandwidth():
    eff = kernel_efficiency(catalog_fitted())
    eff = replace(eff, kernel_overhead_s=0.0, host_op_floor_s=0.0)
    fused = _norm_time(False, eff)
    eager = _norm_time(True, eff)
    ratio = eff.eager_traffic["rmsnorm"]
    frac = eff.memory_kernel_fraction["eager"]
    assert eager[0] / fused[0] == pytest.approx(ratio[0] / frac[0])
    # backward: measured bytes over the fused forward's, against the fused backward's 1.5x
    assert eager[1] / fused[1] == pytest.approx(ratio[1] / frac[1] / 1.5)


def test_variants_follow_the_model_family_and_the_loss_code():
    llama = {o.name: o.kernel for o in layer_ops(LLAMA, Strategy(mbs=1, seq_len=256), moe=False).ops}
    gpt = {o.name: o.kernel for o in layer_ops(GPT, Strategy(mbs=1, seq_len=256), moe=False, attention="unfused").ops}
    assert (llama["norm_attn"], llama["residual_dropout_mlp"], llama["activation"], llama["rope"]) == \
        ("rmsnorm", "add", "swiglu", "rope")
    assert (gpt["norm_mlp"], gpt["residual_dropout_attn"], gpt["activation"], gpt["softmax_dropout"]) == \
        ("layernorm", "dropout_add", "gelu", "softmax_dropout")
    ce = {loss: next(o for o in head_ops(LLAMA, Strategy(mbs=1, seq_len=256), loss) if o.name == "cross_entropy")
          for loss in ("upcast", "inplace")}
    assert ce["upcast"].kernel == "cross_entropy_upcast" and ce["inplace"].kernel == "cross_entropy_inplace"


def test_unmeasured_eager_op_keeps_the_layer_level_multiplier():
    eff = replace(kernel_efficiency(catalog_fitted()), kernel_overhead_s=0.0, host_op_floor_s=0.0)
    op = Op("router_topk_permute", "memory", 0.0, 1e9)
    gpu = get_gpu("h100-80gb")
    f = op_time(gpu, "bf16", op, eff, eager=True).fwd_s / op_time(gpu, "bf16", op, eff).fwd_s
    assert f == pytest.approx(eff.eager_elementwise_traffic / eff.memory_kernel_fraction["eager"][0])


def test_megatron_fused_loss_priced_at_its_benchmark():
    """Megatron-Core's fused cross-entropy (native implementation) runs at the fraction of the
    STREAM rate Liger-Kernel's benchmark gives it over the fused loss op's bytes (about a third
    forward: its jit-fused steps pass over the fp32 logits several times); other fused losses
    at the STREAM rate."""
    eff = replace(kernel_efficiency(catalog_fitted()), kernel_overhead_s=0.0, host_op_floor_s=0.0)
    gpu = get_gpu("h100-80gb")
    s = Strategy(mbs=1, seq_len=4096)
    native, te = (next(o for o in head_ops(LLAMA, s, loss) if o.name == "cross_entropy")
                  for loss in ("megatron_fused", "fused"))
    assert native.kernel == "cross_entropy_megatron_fused" and native.hbm_bytes == te.hbm_bytes
    frac = eff.memory_kernel_fraction["fused_loss"]
    a, b = op_time(gpu, "bf16", native, eff), op_time(gpu, "bf16", te, eff)
    assert (a.fwd_s / b.fwd_s, a.bwd_s / b.bwd_s) == pytest.approx((1 / frac[0], 1 / frac[1]))
    assert 0.2 < frac[0] < 0.5 < frac[1] <= 1.0


def test_compiled_float8_casts_are_what_inductor_generates():
    """torchao's tensorwise float8 casts inside a compiled block (validate/compiled_traffic.py),
    re-measured at small shapes for an element-wise producer (torchtitan's RMSNorm): known
    answers counted by hand, and the stored table (measured at larger shapes, where the amax's
    partial reductions weigh less)."""
    from validate.compiled_traffic import measure_producer

    m = measure_producer("elementwise", hidden=64, shapes=((512, 64), (1024, 64), (512, 128), (1024, 128)))
    # forward: the amax and the cast recompute the norm from its 2-byte input (read 2 + read 2 +
    # write 1) where the 16-bit block reads 2 and writes the norm's 2-byte output: 3 B more
    assert m.input_fwd == pytest.approx(3.0, abs=0.15)
    assert m.input_bwd == pytest.approx(1.0, abs=0.05)
    # output gradient: amax (read 2), cast (2 + 1), transposed cast (2 + 1)
    assert m.grad_bwd == pytest.approx(8.0, abs=0.05)
    # the weight, per element and micro-batch: amax (read 2) and cast (2 + 1) forward, the
    # transposed cast (2 + 1) backward
    assert m.weight == pytest.approx(8.0, abs=0.25)
    stored = catalog_document("efficiency.yaml")["compiled_fp8_casts"]["recipes"]["tensorwise"]["elementwise"]
    for term in ("input_fwd", "input_bwd", "grad_bwd", "weight"):
        assert stored[term] == pytest.approx(getattr(m, term), abs=0.15), term


@pytest.mark.parametrize("q_heads,kv_heads,hidden,head_dim", [(8, 2, 1024, 128), (8, 8, 512, 64)])
def test_compiled_rope_is_what_inductor_runs(q_heads, kv_heads, hidden, head_dim):
    """torchtitan's Attention compiled whole (validate/compiled_traffic.py attention_bytes): the
    element-wise kernels inductor generates plus the ATen complex multiplies it falls back to move
    the bytes catalogs/efficiency.yaml compiled_rope counts, at a grouped-query (Llama 3 8B's
    head ratio and head dim) and a multi-head shape, within 3% (small reductions are not counted)."""
    from sim.layers.ops import compiled_rope_bytes
    from validate.compiled_traffic import ROPE_TOKENS, attention_bytes

    fwd, bwd = attention_bytes(q_heads, kv_heads, hidden, head_dim)
    want = compiled_rope_bytes(kernel_efficiency(catalog_fitted()).compiled_rope, q=q_heads * head_dim,
                               kv=kv_heads * head_dim, hidden=hidden, head_dim=head_dim, grouped=kv_heads < q_heads)
    assert fwd / ROPE_TOKENS == pytest.approx(want[0], rel=0.03)
    assert bwd / ROPE_TOKENS == pytest.approx(want[1], rel=0.03)


def test_compiled_rope_prices_the_torchtitan_compile_profile_only():
    """``rope_kernels: inductor`` (torchtitan-compile) prices the rotary embedding at the compiled
    complex code's bytes, several times one fused kernel's; other profiles keep the fused kernel."""
    from sim.cost.costs import plan_layer_ops
    from sim.cost.framework import apply_framework, get_framework
    from sim.cost.plan import Plan, parse_strategy
    from sim.data.catalog import get_model
    from sim.net.clusters import cluster_from_catalog

    eff = kernel_efficiency(catalog_fitted())
    s = parse_strategy("tp=1,dp=8,mbs=1,gbs=8,seq=8192,zero=3", num_gpus=8)
    kw = {"model": get_model("llama3-8b"), "cluster": cluster_from_catalog("h100-80gb", 8), "strategy": s}
    rope = {}
    for fw in ("torchtitan-compile", "torchtitan", "megatron-core"):
        plan = Plan(**apply_framework(dict(kw), get_framework(fw))).checked()
        assert plan.rope_kernels == ("inductor" if fw == "torchtitan-compile" else "fused")
        rope[fw] = next(op for op in plan_layer_ops(plan, s, eff, moe=False).ops if op.name == "rope")
    q, kv, h, d = 4096, 1024, 4096, 128  # Llama 3 8B: 32 query heads, 8 key/value heads of 128
    assert rope["torchtitan-compile"].hbm_bytes == pytest.approx(8192 * (24 * q + 20 * kv + 8 * d))
    assert rope["torchtitan-compile"].hbm_bytes * rope["torchtitan-compile"].backward_bytes_factor == \
        pytest.approx(8192 * (24 * q + 24 * kv + 8 * h + 8 * d))
    assert rope["megatron-core"].hbm_bytes == pytest.approx(8192 * 2 * 2 * (q + kv))
    assert rope["torchtitan"].hbm_bytes == rope["megatron-core"].hbm_bytes


def test_compiled_casts_price_the_torchtitan_compile_profile_only():
    """``fp8_cast_kernels: inductor`` (torchtitan-compile) prices a linear's casts at inductor's
    bytes by the input's producer; Transformer Engine profiles keep the recipe's standalone cost."""
    from sim.cost.costs import plan_layer_ops
    from sim.cost.framework import apply_framework, get_framework
    from sim.cost.plan import Plan, parse_strategy
    from sim.data.catalog import get_model
    from sim.net.clusters import cluster_from_catalog

    eff = kernel_efficiency(catalog_fitted())
    s = parse_strategy("tp=1,dp=8,mbs=1,gbs=8,seq=8192,zero=3,precision=fp8,fp8_recipe=tensorwise", num_gpus=8)

    def casts(fw: str) -> dict:
        plan = Plan(**apply_framework({"model": get_model("llama3-8b"), "cluster": cluster_from_catalog(
            gpu="h100-80gb", num_gpus=8), "strategy": s}, get_framework(fw)))
        lops = plan_layer_ops(plan, s, eff, moe=False)
        return {op.name: op for op in lops.ops if op.name.startswith("fp8_cast_")}

    compiled, te = casts("torchtitan-compile"), casts("megatron-core")
    table = eff.compiled_fp8_casts["tensorwise"]
    tok, h = 8192, 4096
    assert compiled["fp8_cast_ffn_up"].hbm_bytes == pytest.approx(table["elementwise"][0] * tok * h)  # after the norm
    assert compiled["fp8_cast_out_proj"].hbm_bytes == pytest.approx(table["extern"][0] * tok * h)  # after attention
    q = eff.fp8_recipe("tensorwise").quantize_bytes_per_element
    assert te["fp8_cast_ffn_up"].hbm_bytes == pytest.approx(q * tok * h)
    # the weights' casts, per parameter and micro-batch: inductor's measured bytes, not the recipe's
    from sim.layers.compute import fp8_weight_cast_bytes_per_param
    assert fp8_weight_cast_bytes_per_param(eff, "fp8", "tensorwise", False, 1, compiled=True) == \
        pytest.approx(eff.compiled_fp8_weight_casts["tensorwise"]) == pytest.approx(8.0, abs=0.25)
    assert fp8_weight_cast_bytes_per_param(eff, "fp8", "tensorwise", False, 1) == pytest.approx(q)
    assert fp8_weight_cast_bytes_per_param(eff, "fp8", "mxfp8", False, 1, compiled=True) == \
        pytest.approx(eff.fp8_recipe("mxfp8").quantize_bytes_per_element)
