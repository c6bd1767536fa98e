"""Sliding-window (local) attention: Model.local_attention_window / local_attention_layers read
from project files, Hugging Face configs, Megatron recipes and reference rows, written back by
the Megatron export, and priced at the keys each query attends (sim.layers.ops.layer_ops)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from planner.exports import render
from planner.exports.megatron import window_pattern
from planner.recipes import read_recipe
from sim.base.errors import InputError
from sim.cost.plan import Plan, parse_strategy
from sim.data.catalog import get_model
from sim.data.modelio import model_from_dict
from sim.engines.analytic import simulate_analytic
from sim.layers.ops import layer_ops, model_flops_per_step, windowed_keys
from tests.conftest import cluster
from tests.test_exports import _spec

DATA = Path(__file__).parent / "data"
BASE = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128, "vocab_size": 100,
        "ffn_type": "swiglu"}


def test_windowed_keys_closed_form():
    """sum_q min(q, w) / s by brute force, less the half key of the diagonal that the full
    layers' s / 2 convention leaves out too; at w >= s the causal s / 2."""
    for s, w in ((4096, 128), (8192, 4096), (100, 7)):
        brute = sum(min(q, w) for q in range(1, s + 1)) / s
        assert windowed_keys(s, w) == pytest.approx(brute - w / (2 * s), rel=1e-12)
    assert windowed_keys(4096, 128) == 126.0
    assert windowed_keys(2048, 4096) == 1024.0 == windowed_keys(2048, 2048)


def test_model_fields_validated_and_read_from_project_files():
    m = model_from_dict({**BASE, "local_attention_window": 16, "local_attention_layers": 2}, where="m.yaml")
    assert (m.local_attention_window, m.local_attention_layers) == (16, 2)
    assert window_pattern(4, 2) == "[1,0,1,0]" and window_pattern(6, 5) == "[1,1,1,1,1,0]"
    assert window_pattern(3, 3) == "[1,1,1]"
    with pytest.raises(InputError) as e:
        model_from_dict({**BASE, "local_attention_layers": 2}, where="m.yaml")
    assert e.value.field == "model.local_attention_layers"
    with pytest.raises(InputError) as e:
        model_from_dict({**BASE, "local_attention_window": 16, "local_attention_layers": 5}, where="m.yaml")
    assert e.value.field == "model.local_attention_layers"
    with pytest.raises(InputError) as e:
        model_from_dict({**BASE, "local_attention_window": 0, "local_attention_layers": 1}, where="m.yaml")
    assert e.value.field == "model.local_attention_window"


def test_hugging_face_configs():
    """gpt-oss lists layer_types; Mistral windows every layer; Gemma 3 all but every
    sliding_window_pattern-th; Qwen2's window is off unless use_sliding_window."""
    llama = json.loads((DATA / "hf_llama3_8b_config.json").read_text())
    n = llama["num_hidden_layers"]
    oss = {**llama, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * (n // 2)}
    m = model_from_dict(oss, where="c.json")
    assert (m.local_attention_window, m.local_attention_layers) == (128, n // 2)
    m = model_from_dict({**llama, "model_type": "mistral", "sliding_window": 4096}, where="c.json")
    assert (m.local_attention_window, m.local_attention_layers) == (4096, n)
    m = model_from_dict({**llama, "model_type": "gemma3_text", "sliding_window": 1024, "sliding_window_pattern": 6},
                        where="c.json")
    assert m.local_attention_layers == n - n // 6
    m = model_from_dict({**llama, "sliding_window": 131072, "use_sliding_window": False}, where="c.json")
    assert m.local_attention_layers == 0 and m.local_attention_window is None
    assert model_from_dict(llama, where="c.json").local_attention_layers == 0


def test_priced_at_the_keys_each_query_attends():
    """Half the layers windowed: the layer's attention work is half the full causal work plus half
    the windowed work, model FLOPs count the windowed layers at their work; a window as long as
    the sequence prices exactly like full attention; a model without windows is unchanged."""
    llama = get_model("llama3-8b")
    s = parse_strategy("mbs=1,gbs=8,seq=8192,recompute=none", num_gpus=8)
    windowed = dataclasses.replace(llama, local_attention_window=512, local_attention_layers=llama.num_layers // 2)
    full_op = next(op for op in layer_ops(llama, s, moe=False).ops if op.kind == "attention")
    ops = {op.name: op for op in layer_ops(windowed, s, moe=False).ops if op.kind == "attention"}
    assert ops["attention"].flops == pytest.approx(0.5 * full_op.flops)
    assert ops["attention_local"].flops == pytest.approx(0.5 * full_op.flops * windowed_keys(8192, 512) / 4096)
    assert ops["attention_local"].m == 1024 and ops["attention_local"].hbm_bytes == pytest.approx(0.5 * full_op.hbm_bytes)
    assert model_flops_per_step(windowed, s) < model_flops_per_step(llama, s)
    long_window = dataclasses.replace(windowed, local_attention_window=8192)
    cl = cluster("h100-80gb", 8)
    assert simulate_analytic(Plan(model=windowed, cluster=cl, strategy=s)).step_time_s \
        < simulate_analytic(Plan(model=llama, cluster=cl, strategy=s)).step_time_s
    assert simulate_analytic(Plan(model=long_window, cluster=cl, strategy=s)).step_time_s == pytest.approx(
        simulate_analytic(Plan(model=llama, cluster=cl, strategy=s)).step_time_s, rel=1e-9)


_SCRIPT = """#!/bin/bash
torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 24 --hidden-size 2880 \\
  --num-attention-heads 64 --kv-channels 64 --group-query-attention --num-query-groups 8 --ffn-hidden-size 2880 \\
  --swiglu --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 \\
  --disable-bias-linear --vocab-size 201088 {args}
"""


@pytest.mark.parametrize("args,window,layers", [("--window-size 128,0 --window-attn-skip-freq 2", 128, 12),
                                                ("--window-size 128,0 --window-attn-skip-freq [1,0]*12", 128, 12),
                                                ("--window-size 4096,0", 4096, 24),
                                                ("--window-size -1,0", None, 0), ("", None, 0)])
def test_megatron_recipe_and_export_round_trip(tmp_path, args, window, layers):
    """Megatron-Core's --window-size LEFT,RIGHT and --window-attn-skip-freq (N: one full layer after
    N - 1 windowed; a per-layer list, 1 = windowed) read into the model, and written back."""
    path = tmp_path / "train.sh"
    path.write_text(_SCRIPT.format(args=args))
    model = read_recipe(str(path)).model
    assert (model.local_attention_window, model.local_attention_layers) == (window, layers)
    spec = _spec("llama3-8b", 16, "tp=2,pp=1,mbs=1,gbs=32,zero=1,recompute=none")
    spec = dataclasses.replace(spec, model=model)
    meg = render("megatron", spec).files["megatron_args.sh"]
    assert ("--window-size" in meg) is bool(layers)
    if layers:
        back = tmp_path / "back.sh"
        back.write_text(_SCRIPT.format(args=" ".join(
            f"{k} {v}" for k, v in _window_args(meg))))
        again = read_recipe(str(back)).model
        assert (again.local_attention_window, again.local_attention_layers) == (window, layers)


def _window_args(text: str) -> list[tuple[str, str]]:
    toks = text.replace("\\\n", " ").split()
    return [(t, toks[i + 1]) for i, t in enumerate(toks) if t in ("--window-size", "--window-attn-skip-freq")]


def test_exports_that_cannot_express_windows_refuse():
    """The Keras skeleton attends the whole causal prefix: a windowed model is refused by name."""
    spec = _spec("llama3-8b", 8, "tp=1,pp=1,mbs=1,gbs=8,zero=0,recompute=none")
    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, local_attention_window=4096,
                                                               local_attention_layers=32))
    with pytest.raises(InputError, match="sliding-window"):
        render("tensorflow", spec)
