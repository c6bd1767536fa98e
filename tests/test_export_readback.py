"""Every exporter writes the plan that was predicted: export, read the files back with the
tools' own semantics (planner.exports.readback), re-simulate, same strategy and step time.
``recommend --export F`` searches only plans F runs and says what F's limits cost."""

from __future__ import annotations

import dataclasses
import json

import pytest

from planner.cli import main
from planner.exports import FORMAT_FRAMEWORK, FORMATS, LaunchSpec, render
from planner.exports.readback import read_back
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_model
from sim.cost.framework import apply_framework, get_framework
from sim.cost.plan import Plan, parse_strategy
from tests.conftest import cluster

# (model, GPUs, strategy) per framework an exporter launches; each uses that framework's options.
PLANS = {
    "megatron-core": [
        ("gpt3-175b", 1024, "tp=8,pp=16,vp=3,mbs=1,gbs=1536,sp=1,recompute=selective,zero=1"),
        # 126 layers, pp=8, vp=8: equal chunks once the embedding and the loss count as layers
        ("llama3.1-405b", 512, "tp=8,pp=8,vp=8,mbs=1,gbs=256,sp=1,zero=1,precision=fp8,fp8_recipe=tensorwise,"
                               "tp_overlap=1,pp_overlap=1"),
        ("mixtral-8x7b", 64, "tp=2,pp=2,ep=8,etp=1,mbs=1,gbs=256,zero=1,sp=1,ep_overlap=1"),
        ("llama3-8b", 16, "tp=2,sp=1,mbs=1,gbs=16,zero=1,offload=optimizer"),
        ("llama3-70b", 64, "tp=8,mbs=1,gbs=64,zero=3,dp_shard=4,sp=1,recompute=full,cuda_graphs=1"),
        ("llama3-70b", 96, "tp=8,pp=3,mbs=1,gbs=96,zero=2,sp=1"),  # 80 layers: 26/28/26 via first/last
    ],
    "torchtitan": [
        ("llama3-8b", 16, "mbs=2,gbs=64,zero=3"),
        ("llama3-70b", 128, "tp=8,pp=4,vp=3,mbs=1,gbs=256,sp=1,zero=3,recompute=full"),  # 80 layers / 12 parts
        ("llama3-70b", 128, "tp=8,pp=4,vp=2,schedule=zero-bubble,mbs=1,gbs=256,sp=1,zero=3"),
        ("llama3-8b", 64, "tp=2,cp=2,sp=1,mbs=1,gbs=64,seq=8192,zero=3,precision=fp8,fp8_recipe=tensorwise"),
        ("llama3-8b", 64, "mbs=1,gbs=64,zero=3,dp_shard=8"),
        ("llama3-70b", 64, "tp=8,sp=1,mbs=1,gbs=64,zero=3,recompute=full,offload=params"),
    ],
    "megatron-deepspeed": [
        ("gpt3-175b", 256, "tp=8,pp=8,mbs=1,gbs=512,zero=1,recompute=full,precision=fp16,dp_overlap=0"),
        ("llama3-8b", 16, "mbs=2,gbs=64,zero=1,dp_overlap=0"),
        ("llama3-8b", 8, "mbs=1,gbs=16,zero=2,offload=optimizer,dp_overlap=0"),
        ("llama3-70b", 64, "tp=8,mbs=1,gbs=64,zero=3,recompute=full,offload=params,offload_device=nvme,dp_overlap=0"),
    ],
    # tf.distribute: MirroredStrategy on one node, MultiWorkerMirrored across nodes (one pack or
    # bytes_per_pack > 0), accumulation, recomputation, fp16
    "tf-multiworker": [
        ("gpt-1.7b", 8, "mbs=4,gbs=64,recompute=selective,dp_overlap=0"),
        ("gpt-1.7b", 32, "mbs=2,gbs=64,precision=fp16,dp_overlap=0"),
        ("llama3-8b", 64, "mbs=1,gbs=256,recompute=full,dp_overlap=1"),
    ],
}
CASES = [(fmt, *p) for fmt in FORMATS for p in PLANS[FORMAT_FRAMEWORK[fmt]]]


def _same(a, b) -> bool:
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    if a.precision != "fp8":  # the recipe is not a setting of a bf16/fp16 run
        da.pop("fp8_recipe"), db.pop("fp8_recipe")
    return da == db


@pytest.mark.parametrize("fmt,model_id,n,text", CASES)
def test_export_reads_back_to_the_predicted_plan(fmt, model_id, n, text):
    model = get_model(model_id)
    fw = get_framework(FORMAT_FRAMEWORK[fmt])
    s = parse_strategy(text, num_gpus=n)
    gpu = "h100-80gb"
    cl = cluster(gpu, n)
    plan = Plan(**apply_framework({"model": model, "cluster": cl, "strategy": s}, fw))  # feasible for fw
    spec = LaunchSpec(model=model, strategy=s, num_gpus=n, gpus_per_node=8, gpu=gpu, steps=10)
    back = read_back(fmt, render(fmt, spec).files, model=model, num_gpus=n)
    assert _same(back, s), (back.to_string(), s.to_string())
    again = Plan(**apply_framework({"model": model, "cluster": cl, "strategy": back}, fw))
    assert simulate_analytic(again).step_time_s == pytest.approx(simulate_analytic(plan).step_time_s, rel=1e-12)


def test_recommend_export_searches_what_the_framework_runs(capsys, tmp_path):
    args = ["recommend", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--num-gpus", "256", "--gbs", "512",
            "--rerank", "0", "--top", "3", "--json"]
    assert main(args + ["--export", "megatron", "--out", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["framework"] == "megatron-core"
    best = parse_strategy(out["plans"][0]["strategy"], num_gpus=256)
    caps = get_framework("megatron-core").capabilities
    assert all(caps.refusal(parse_strategy(p["strategy"], num_gpus=256)) is None for p in out["plans"])
    files = {p.name: p.read_text() for p in tmp_path.iterdir()}
    back = read_back("megatron", files, model=get_model("gpt3-175b"), num_gpus=256)
    assert _same(back, best)
    gap = out["framework_gap"]
    assert gap["framework"] == "megatron-core" and gap["gap"] >= 0
    if gap["gap"] > 0:  # the overall best needs something Megatron-Core lacks, and the output says what
        assert caps.refusal(parse_strategy(gap["best_overall_strategy"], num_gpus=256)) is not None
        assert any("cannot run the overall best plan" in w for w in out["warnings"])


def test_formats_of_several_frameworks_skip_what_they_cannot_carry(capsys):
    rc = main(["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--gbs", "64",
               "--rerank", "0", "--export", "all", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["framework"] is None  # no single framework implied: searched unrestricted
    s = parse_strategy(out["plans"][0]["strategy"], num_gpus=8)
    for fmt, info in out["exports"].items():
        refused = get_framework(FORMAT_FRAMEWORK[fmt]).capabilities.refusal(s)
        assert bool(info.get("skipped")) == (refused is not None)
        assert bool(info["files"]) == (refused is None)


def test_megatron_export_states_the_dropout_and_positions_the_plan_prices(tmp_path):
    """Megatron-LM trains with dropout 0.1 and a learned position table unless told otherwise
    (arguments.py: --hidden-dropout / --attention-dropout 0.1, --position-embedding-type
    learned_absolute).  A Llama plan priced without dropout and with RoPE must say both; a
    FlagPerf-style Llama (Megatron's defaults left in place: ``Model.dropout``, learned positions)
    must not, and its launch script reads back to the same model."""
    from planner.exports.readback import FORMAT_MAIN_FILE
    from planner.recipes import read_recipe

    def exported(model):
        spec = LaunchSpec(model=model, strategy=parse_strategy("tp=2,sp=1,mbs=1,gbs=16,zero=1", num_gpus=8),
                          num_gpus=8, gpus_per_node=8, gpu="h100-80gb", steps=10)
        files = render("megatron", spec).files
        d = tmp_path / model.name
        d.mkdir()
        for name, text in files.items():
            (d / name).write_text(text, encoding="utf-8")
        return " ".join(files.values()), read_recipe(str(d / FORMAT_MAIN_FILE["megatron"])).model

    llama = get_model("llama3-8b")
    text, back = exported(llama)
    assert "--hidden-dropout 0.0" in text and "--attention-dropout 0.0" in text
    assert "--position-embedding-type rope" in text
    assert not back.has_dropout and back.uses_rope
    flagperf = dataclasses.replace(llama, name="flagperf-llama3-8b", dropout=True, position_embedding="learned",
                                   linear_bias=True)
    text, back = exported(flagperf)
    assert "--hidden-dropout" not in text and "--position-embedding-type" not in text
    assert "--disable-bias-linear" not in text
    assert back.has_dropout and not back.uses_rope and back.linear_bias
