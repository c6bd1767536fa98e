"""FlexAttention as an attention kernel: priced at its authors' measured ratio to FlashAttention-2,
launched only by the stacks whose model code calls it, and read from the rows that name it."""

from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.fitting.published import compare_run, load_runs
from sim.cost.framework import apply_framework, get_framework
from sim.cost.plan import Plan, parse_strategy
from sim.data.specs import Model
from sim.layers.compute import default_efficiency
from tests.conftest import cluster

GPT_OSS_ROWS = ("automodel-gpt-oss-20b-bf16-h100-8", "automodel-gpt-oss-120b-bf16-h100-64")


@pytest.mark.parametrize("arch, fwd, bwd", [("hopper", 1.25, 1.03), ("ampere", 0.90, 0.85),
                                            ("blackwell", 0.90, 0.85)])
def test_flex_is_its_measured_share_of_flashattention_2(arch, fwd, bwd):
    """catalogs/efficiency.yaml flex_attention: H100 forward ~25% and backward ~3% faster than
    FlashAttention-2 (PyTorch's GTC 2025 FlexAttention abstract), A100 90% / 85% of it (the
    FlexAttention blog); an architecture without a measurement takes the A100 ratios."""
    eff = default_efficiency()
    for length in (512, 4096, 32768):
        f2 = eff.attention_fraction(arch, "flash2", length, 0.8)
        flex = eff.attention_fraction(arch, "flex", length, 0.8)
        assert flex == pytest.approx((f2[0] * fwd, f2[1] * bwd), rel=1e-12)


def test_flex_has_no_head_dim_fallback_and_saves_what_flash_saves():
    """Transformer Engine falls back from its fused kernel beyond head dim 128 on Blackwell (2025H1);
    FlexAttention generates a kernel for any head dimension.  Its saved activations are the fused
    kernels' (Q, K, V, output, log-sum-exp), and its time follows its fraction."""
    from sim.engines.analytic import simulate_analytic

    wide = Model(name="hd192", num_layers=4, hidden_size=6144, num_attention_heads=32, ffn_hidden_size=16384,
                 vocab_size=32000, num_kv_heads=8)
    assert wide.dim_per_head == 192
    kw = {"model": wide, "cluster": cluster("h100-80gb", 8),
          "strategy": parse_strategy("tp=1,mbs=1,gbs=8,seq=8192", num_gpus=8)}
    base = apply_framework(kw, get_framework("torchtitan"))
    flex, fa2 = Plan(**{**base, "attention": "flex"}), Plan(**{**base, "attention": "flash2"})
    assert flex.attention_kernel == "flex"
    rf, r2 = simulate_analytic(flex), simulate_analytic(fa2)
    assert rf.memory.activations_bytes == pytest.approx(r2.memory.activations_bytes)
    assert rf.step_time_s < r2.step_time_s  # faster than FA2 on Hopper, forward and backward
    te = Plan(**{**apply_framework({**kw, "cluster": cluster("b200-180gb", 8)}, get_framework("nemo-2025h1"))})
    assert te.attention_kernel == "flash2"


def test_only_stacks_that_call_flex_attention_launch_it(capsys):
    """--attention flex with a Megatron profile is a one-line input error (exit 2); without a
    framework the first default profile that launches it (torchtitan) runs the plan."""
    base = ["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8",
            "--strategy", "tp=1,mbs=1,gbs=8,seq=8192,zero=3"]
    code = main(base + ["--framework", "megatron-core", "--attention", "flex"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "attention" in err and "flex" in err
    code = main(base + ["--attention", "flex", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["framework"] == "torchtitan" and out["attention_kernel"] == "flex"
    assert set(get_framework("automodel").attention_kernels) >= {"flex", "flash"}
    assert "flex" not in get_framework("megatron-core").attention_kernels


def test_rows_naming_flex_attention_run_it():
    """NeMo Automodel's gpt-oss benchmark configs set ``backend.attn: flex`` (GPT-OSS asserts it);
    the rows say "kernels: TE + DeepEP + FlexAttn", the other Automodel rows run TE attention."""
    runs = {r["id"]: r for r in load_runs()}
    for rid in GPT_OSS_ROWS:
        c = compare_run(runs[rid])
        assert c.plan.attention == "flex" and "FlexAttention (the row's kernels)" in c.assumptions
    other = compare_run(runs["automodel-qwen3-30b-a3b-bf16-h100-8"])
    assert other.plan.attention == "flash"


def test_torchtitan_export_says_flex_attention_is_a_flavor_setting():
    """torchtitan turns FlexAttention on in the model flavor's args (use_flex_attn), which its job
    TOML cannot set: the export warns and marks the flavor line instead of dropping the kernel."""
    from planner.exports import LaunchSpec
    from planner.exports.torchtitan import render_torchtitan
    from sim.data.catalog import get_model

    s = parse_strategy("tp=2,dp=4,mbs=1,gbs=32,seq=8192,zero=3,sp=1", num_gpus=8)
    spec = LaunchSpec(model=get_model("llama3-8b"), strategy=s, num_gpus=8, gpus_per_node=8, gpu="h100-80gb",
                      attention="flex", framework="torchtitan")
    out = render_torchtitan(spec)
    assert any("use_flex_attn" in w for w in out.warnings)
    assert any("use_flex_attn = True" in text for text in out.files.values())
    plain = render_torchtitan(LaunchSpec(model=get_model("llama3-8b"), strategy=s, num_gpus=8, gpus_per_node=8,
                                         gpu="h100-80gb", attention="flash2", framework="torchtitan"))
    assert not any("use_flex_attn" in w for w in plain.warnings)
