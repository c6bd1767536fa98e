"""What CUDA graphs capture (Plan.cuda_graph_scope): the whole layer, or the attention block and the
MoE router (Megatron-Core --cuda-graph-scope attn moe_router moe_preprocess, the most a dropless MoE
layer can capture), the experts and their dispatch then dispatched op by op."""

from __future__ import annotations

import dataclasses
import os
import tempfile

import pytest

from planner.exports import render
from planner.recipes import read_recipe
from sim.base.errors import InputError
from sim.cost.costs import ATTENTION_BLOCK_OPS, layer_cost, plan_layer_ops, default_network
from sim.cost.plan import Plan, parse_strategy
from sim.data.catalog import get_model
from sim.engines.analytic import simulate_analytic
from sim.layers.compute import default_efficiency
from tests.conftest import cluster
from tests.test_exports import _spec


def _plans():
    model, cl = get_model("mixtral-8x7b"), cluster("gb200-186gb", 8)
    s = parse_strategy("ep=8,mbs=1,gbs=64,seq=4096,zero=1,recompute=none,cuda_graphs=1", num_gpus=8)
    graphs = Plan(model=model, cluster=cl, strategy=s)
    return graphs, dataclasses.replace(graphs, cuda_graph_scope="attention"), \
        dataclasses.replace(graphs, strategy=dataclasses.replace(s, cuda_graphs=False))


def test_attention_scope_sits_between_no_graphs_and_whole_layer_graphs():
    layer, attention, none = _plans()
    t = [simulate_analytic(p).step_time_s for p in (layer, attention, none)]
    assert t[0] < t[1] < t[2]
    with pytest.raises(InputError, match="cuda_graph_scope"):
        dataclasses.replace(layer, cuda_graph_scope="moe")


def test_only_the_attention_block_and_router_lose_their_host_floor():
    """The MoE layer's cost under attention-scope graphs equals whole-layer graphs for the captured
    ops plus no graphs for the rest, op by op."""
    layer, attention, none = _plans()
    eff = default_efficiency()
    net = default_network(attention.cluster)
    lops = plan_layer_ops(attention, attention.strategy, eff, moe=True)
    captured = [op for op in lops.ops if op.name.removeprefix("fp8_cast_") in ATTENTION_BLOCK_OPS]
    assert {op.name for op in captured} >= {"attention", "qkv_proj", "router"}
    assert not any(op.name.startswith("expert_") for op in captured)
    f = {p.cuda_graph_scope + str(p.strategy.cuda_graphs): layer_cost(p, net, lops, eff, 0.0).fwd_s
         for p in (layer, attention, none)}
    assert f["layerTrue"] < f["attentionTrue"] < f["layerFalse"]


def test_megatron_recipe_and_export():
    script = """#!/bin/bash
torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 1 --num-layers 32 --hidden-size 4096 \\
  --num-attention-heads 32 --ffn-hidden-size 14336 --swiglu --seq-length 4096 --max-position-embeddings 4096 \\
  --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 --vocab-size 32000 \\
  --micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer {args}
"""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "train.sh")
        for args, scope in (("--cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router moe_preprocess",
                             "attention"),
                            ("--cuda-graph-impl transformer_engine --cuda-graph-scope attn", "attention"),
                            ("--enable-cuda-graph", None),
                            ("--cuda-graph-impl transformer_engine --cuda-graph-scope full", None)):
            with open(path, "w") as fh:
                fh.write(script.format(args=args))
            recipe = read_recipe(path)
            assert recipe.settings.get("cuda_graphs"), args
            assert recipe.plan.get("cuda_graph_scope") == scope, args
    spec = _spec("mixtral-8x7b", 8, "ep=8,mbs=1,gbs=64,zero=1,recompute=none,cuda_graphs=1")
    meg = " ".join(render("megatron", dataclasses.replace(spec, cuda_graph_scope="attention"))
                   .files["megatron_args.sh"].split())
    assert "--cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router moe_preprocess" in meg
    assert "--enable-cuda-graph" not in meg
    assert "--enable-cuda-graph" in render("megatron", spec).files["megatron_args.sh"]
