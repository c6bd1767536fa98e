"""Bring your own recipe (planner/recipes/): every file of the corpus (tests/data/recipes/, real
public recipes from the frameworks' own repositories) imports, simulates and round-trips through
the export of its framework; the readers read what the frameworks would; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.exports import LaunchSpec, render
from planner.exports.readback import read_back
from planner.recipes import read_recipe, resolve
from planner.recipes.shell import read_shell
from sim.engines.analytic import simulate_analytic
from sim.data.catalog import get_model
from sim.cost.framework import apply_framework, check_supported, get_framework
from sim.data.layout import parse_layout
from sim.cost.plan import Plan
from tests.conftest import cluster

ROOT = Path(__file__).resolve().parents[1]
CORPUS_DIR = ROOT / "tests" / "data" / "recipes"
CORPUS = yaml.safe_load((CORPUS_DIR / "corpus.yaml").read_text())
ENTRIES = CORPUS["recipes"]
# the export format of each framework a recipe runs under
EXPORT_FORMAT = {"megatron-core": "megatron", "nemo": "megatron", "torchtitan": "torchtitan",
                 "torchtitan-compile": "torchtitan", "deepspeed-hf": "deepspeed", "megatron-deepspeed": "deepspeed"}


def _read(entry: dict):
    """The corpus file as its harness runs it (``recipe_args``: the launch script's arguments)."""
    model = get_model(entry["model"]) if "model" in entry else None
    return read_recipe(str(CORPUS_DIR / entry["file"]), model=model, script_args=entry.get("recipe_args", ()))


def _load(entry: dict):
    model = get_model(entry["model"]) if "model" in entry else None
    recipe = _read(entry)
    model = model or recipe.model
    n = entry.get("num_gpus") or recipe.num_gpus
    return recipe, model, n, resolve(recipe, model=model, num_gpus=n)


def test_the_corpus_is_large_and_documented():
    assert len(ENTRIES) >= 20
    formats = {_read(e).format for e in ENTRIES}
    assert formats == {"megatron", "nemo", "torchtitan", "deepspeed"}
    readme = (CORPUS_DIR / "README.md").read_text()
    for e in ENTRIES:
        assert (CORPUS_DIR / e["file"]).is_file()
        assert len(e["commit"]) == 40 and e["licence"] and e["repository"].startswith("https://github.com/")
        assert e["file"] in readme and e["commit"][:12] in readme


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_corpus_imports_simulates_and_round_trips(entry):
    recipe, model, n, s = _load(entry)
    # every key read is accounted for: mapped to a planner field, or ignored with whether it costs
    assert recipe.keys and all(k.maps_to or k.cost in ("yes", "no", "unknown") for k in recipe.keys)
    fw = get_framework(recipe.framework)
    check_supported(fw, s)
    gpn = min(8, n)
    cl = cluster(CORPUS["gpu"], n, gpn=gpn)
    plan = Plan(**apply_framework({"model": model, "cluster": cl, "strategy": s}, fw))
    res = simulate_analytic(plan)
    assert res.step_time_s > 0 and res.memory_peak_bytes > 0
    # export(import(recipe)) keeps every modelled key: the export reads back to the same plan
    fmt = EXPORT_FORMAT[recipe.framework]
    spec = LaunchSpec(model=model, strategy=s, num_gpus=n, gpus_per_node=gpn, gpu=CORPUS["gpu"],
                      framework=recipe.framework)
    files = render(fmt, spec).files
    assert read_back(fmt, files, model=model, num_gpus=n) == s


def test_a_deepseek_v3_style_layout_with_vp_simulates_and_exports_back(tmp_path, capsys):
    """Megatron-LM's DeepSeek-V3 proxy recipe: an uneven layout over pp=4 x vp=2, MTP in the last
    chunk; both engines price it, and the export states the same layout."""
    entry = next(e for e in ENTRIES if e["file"].endswith("deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release.yaml"))
    recipe, model, n, s = _load(entry)
    assert s.vp == 2 and s.pipeline_layout == parse_layout("Et*2|(tt|)*5t|tmL", 4)
    plan = Plan(**apply_framework({"model": model, "cluster": cluster("h100-80gb", n), "strategy": s},
                                  get_framework(recipe.framework)))
    from sim.engines.simulate import simulate

    a, e = simulate(plan, engine="analytic"), simulate(plan, engine="event")
    assert a.step_time_s == pytest.approx(e.step_time_s, rel=0.03)
    files = render("megatron", LaunchSpec(model=model, strategy=s, num_gpus=n, gpus_per_node=8)).files
    assert "--pipeline-model-parallel-layout 'Ett|(tt|)*5t|tmL'" in files["megatron_args.sh"]
    assert "--mtp-num-layers 1" in files["megatron_args.sh"]
    (tmp_path / "megatron_args.sh").write_text(files["megatron_args.sh"])
    assert main(["import", str(tmp_path / "megatron_args.sh"), "--num-gpus", str(n), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pipeline_layout_canonical"] == "Ett|(tt|)*5t|tmL"


def test_full_size_deepseek_v3_with_megatrons_documented_layout(tmp_path, capsys):
    """The layout of Megatron-Core's docs (Et*3|(tt|)*29,m|L, pp=16 x vp=2) on the 671B model."""
    script = tmp_path / "dsv3.sh"
    script.write_text("ARGS=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 16 "
                      "--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L' --expert-model-parallel-size 64 "
                      "--expert-tensor-parallel-size 1 --sequence-parallel --use-distributed-optimizer "
                      "--micro-batch-size 1 --global-batch-size 8192 --seq-length 4096 --bf16 --mtp-num-layers 1)\n"
                      "torchrun --nproc_per_node 8 --nnodes 128 pretrain_gpt.py \"${ARGS[@]}\"\n")
    assert main(["simulate", "--recipe", str(script), "--model", "deepseek-v3", "--gpu", "h100-80gb",
                 "--engine", "analytic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "layout=Et*3|(tt|)*29m|L" in out["strategy"] and out["num_gpus"] == 1024
    assert "--mtp-num-layers" in out["recipe"]["ignored_costly"]


def test_shell_reader_evaluates_what_launch_scripts_use():
    sh = read_shell(
        'GPUS=${GPUS:-8}\nNODES=4\nWORLD=$(($GPUS*$NODES))\nDTYPE="fp8"\n'
        'A=(\n  --num-layers 32  # comment\n  "--fp8-format hybrid"\n)\n'
        'if [[ "$DTYPE" == "fp8" ]]; then\n  A+=(--fp8-recipe tensorwise)\nelse\n  A+=(--bf16)\nfi\n'
        'if [ -n "${WANDB_API_KEY}" ]; then A+=(--wandb-project x); fi\n'
        'torchrun --nproc_per_node $GPUS --nnodes $NODES pretrain_gpt.py ${A[@]} \\\n  --seq-length 4096\n')
    assert sh.variables["WORLD"] == "32" and not sh.warnings
    cmd = sh.commands[0]
    assert cmd.launcher[:5] == ["torchrun", "--nproc_per_node", "8", "--nnodes", "4"]
    assert cmd.args == ["--num-layers", "32", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                        "--seq-length", "4096"]


def test_torchtitan_renamed_keys_read_alike():
    """llama3_70b.toml as torchtitan shipped it in 2024-04 ([training] batch_size,
    data_parallel_degree), 2024-07 ([experimental] pipeline_parallel_degree) and 2025-09
    ([parallelism], local_batch_size): the same run, at its batch of the day."""
    got = {}
    for name in ("llama3_70b_2024-04.toml", "llama3_70b_2024-07.toml", "llama3_70b_2025-09.toml"):
        r = read_recipe(str(CORPUS_DIR / "torchtitan" / name))
        got[name] = resolve(r, model=r.model, num_gpus=64)
    base = {k: v for k, v in vars_of(got["llama3_70b_2025-09.toml"]).items() if k not in ("mbs", "gbs")}
    for s in got.values():
        assert {k: v for k, v in vars_of(s).items() if k not in ("mbs", "gbs")} == base
    assert got["llama3_70b_2024-04.toml"].mbs == 16 and got["llama3_70b_2025-09.toml"].mbs == 8
    assert base["tp"] == 8 and base["zero"] == 3 and base["recompute"] == "full"


def vars_of(s) -> dict:
    return {k: getattr(s, k) for k in s.__slots__}


def test_torchtitan_pipeline_split_is_torchtitans():
    """torchtitan's default split (generate_llm_fqn_per_model_part: embedding and output counted
    as a layer each, extras to the first stages) read as a layout: Llama 4 Maverick, pp=4."""
    r = read_recipe(str(CORPUS_DIR / "torchtitan" / "llama4_17bx128e_pp4.toml"))
    s = resolve(r, model=r.model, num_gpus=256)
    assert s.pipeline_layout == ("Et*12".replace("t*12", "t" * 12), "t" * 13, "t" * 12, "t" * 11 + "L")


def test_cli_import_lists_ignored_keys_and_their_cost(capsys):
    f = CORPUS_DIR / "megatron" / "train_llama3_8b_h100_fp8.sh"
    assert main(["import", str(f)]) == 0
    text = capsys.readouterr().out
    assert "framework          megatron-core" in text and "precision fp8 (delayed)" in text
    assert "precision fp8 (delayed), fp8 parameters" in text and "fp8_params=1" in text  # --fp8-param-gather
    assert "--fp8-param-gather" not in text.split("ignored keys")[1]
    assert "--lr = 0.00015   changes cost: no" in text
    assert main(["import", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_gpus"] == 8 and out["framework"] == "megatron-core"
    assert {"key", "value", "maps_to", "changes_cost", "note"} <= set(out["ignored"][0])


def test_simulate_recipe_is_simulate_with_its_flags(capsys):
    f = str(CORPUS_DIR / "torchtitan" / "llama3_8b.toml")
    assert main(["simulate", "--recipe", f, "--gpu", "h100-80gb", "--num-gpus", "8", "--engine", "analytic",
                 "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8", "--engine", "analytic",
                 "--framework", "torchtitan", "--seq-len", "8192", "--strategy", a["strategy"], "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a["framework"] == "torchtitan" and a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-12)


def test_recommend_recipe_keeps_what_is_pinned(capsys):
    f = str(CORPUS_DIR / "megatron" / "train_mixtral_8x7b_distributed.sh")
    assert main(["recommend", "--recipe", f, "--gpu", "h100-80gb", "--num-gpus", "64", "--keep", "pp,ep",
                 "--rerank", "0", "--top", "2", "--max-mbs", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["framework"] == "megatron-core" and out["gbs"] == 256 and out["seq_len"] == 4096
    for p in out["plans"]:
        assert ",pp=4," in p["strategy"] and ",ep=8," in p["strategy"] and "precision=bf16" in p["strategy"]
    assert out["recipe"]["strategy"].startswith("tp=1,pp=4") and out["recipe"]["step_time_s"] > 0


BAD = [
    ("bad.sh", "torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
               "--pipeline-model-parallel-layout 'Et|tx|tL' --num-layers 3 --hidden-size 64 "
               "--num-attention-heads 4 --vocab-size 100 --bf16\n", "invalid layer character"),
    ("fp32.json", '{"train_batch_size": 8, "zero_optimization": {"stage": 1}}', "bf16.enabled"),
    ("auto.json", '{"train_batch_size": "auto", "bf16": {"enabled": true}}', "train_batch_size=auto"),
    ("bad.toml", "[parallelism\ntensor_parallel_degree = 2", "bad.toml"),
    ("mp.yaml", "model:\n  tensor_model_parallel_size: 2\nmixed_precision: bf17_mixed\n", "mixed_precision=bf17_mixed"),
    ("tt.toml", '[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\n'
                'pipeline_parallel_schedule = "ZBVZeroBubble"\n', "pipeline_parallel_schedule=ZBVZeroBubble"),
    ("gbs.sh", "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100 "
               "--micro-batch-size 3 --global-batch-size 10 --bf16\n", "--global-batch-size=10"),
    # a value that lived in a file the script sources: the message says which variable went unset and why
    ("src.sh", "source ./env.sh\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP --num-layers 2 "
               "--hidden-size 64 --num-attention-heads 4 --vocab-size 100 --bf16\n",
     "uses $TP without setting it; it sources ./env.sh, which is not read"),
]


@pytest.mark.parametrize("name,text,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_recipes_are_one_line_naming_file_key_and_value(tmp_path, capsys, name, text, needle):
    f = tmp_path / name
    f.write_text(text)
    rc = main(["import", str(f), "--model", "llama3-8b", "--num-gpus", "2"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err, err
    assert name in err or needle.startswith(name)


def test_each_format_page_names_every_key_its_reader_maps_or_prices():
    """docs/recipes/<format>.md has the key table: every key a corpus recipe maps and every
    ignored key the reader knows to change the cost is named on its format's page."""
    from planner.recipes import deepspeed, megatron, torchtitan

    pages = {f: (ROOT / "docs" / "recipes" / f"{f}.md").read_text() for f in ("megatron", "nemo", "torchtitan",
                                                                                "deepspeed")}
    for mod, fmt in ((megatron, "megatron"), (torchtitan, "torchtitan"), (deepspeed, "deepspeed")):
        for key in mod.COSTLY:
            assert f"`{key}`" in pages[fmt], (fmt, key)
    for e in ENTRIES:
        recipe, *_ = _load(e)
        for k in recipe.keys:
            if not k.maps_to or k.maps_to.startswith("cluster"):
                continue
            name = k.key.rsplit(".", 1)[-1] if recipe.format != "megatron" else k.key
            if recipe.format == "megatron" and recipe.framework == "megatron-deepspeed" and ":" in name:
                continue
            assert name in pages[recipe.format], (e["file"], k.key)


@pytest.mark.parametrize("suffix", [".sh", ".yaml", ".toml", ".json"])
def test_any_text_is_read_or_refused_in_one_line(tmp_path, capsys, suffix):
    """Whatever the file holds, import exits 0 or 2 (one line), never an internal error."""
    from hypothesis import given, settings, strategies as st

    fragments = ["--tensor-model-parallel-size", "--pipeline-model-parallel-layout", "Et*2|tL", "[parallelism]",
                 "pipeline_parallel_degree = 2", "model:", "  num_layers: -3", '"train_batch_size": 8', "{", "}",
                 "--num-layers", "32", "--bf16", "tensor_model_parallel_size: 0", "= \"x\"", "(tt|)*99999999", "$((1/0))"]

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.one_of(st.sampled_from(fragments), st.text(max_size=12)), max_size=12))
    def run(parts):
        f = tmp_path / f"r{suffix}"
        f.write_text(" ".join(parts) if suffix != ".yaml" else "\n".join(parts))
        rc = main(["import", str(f), "--model", "llama3-8b", "--num-gpus", "8"])
        err = capsys.readouterr().err
        assert rc in (0, 2), err
        assert rc == 0 or err.count("\n") == 1

    run()


@pytest.mark.parametrize("key", ["fp8_params", "fp8_param_gather"])
def test_nemo_fp8_parameters_map_to_the_strategy(tmp_path, key):
    """NeMo 1's fp8_params (MLPerf's FP8_PARAMS) and NeMo 2 / Bridge's fp8_param_gather are
    Megatron-Core's --fp8-param-gather: Strategy.fp8_params."""
    doc = yaml.safe_load((CORPUS_DIR / "nemo" / "megatron_gpt_config.yaml").read_text())
    doc["model"]["fp8"] = True
    doc["model"]["fp8_hybrid"] = True
    doc["model"][key] = True
    doc["model"]["optim"]["name"] = "distributed_fused_adam"
    f = tmp_path / "gpt_fp8.yaml"
    f.write_text(yaml.safe_dump(doc))
    r = read_recipe(str(f))
    assert r.settings["precision"] == "fp8" and r.settings.get("fp8_params") is True


_TE_SCRIPT = """#!/bin/bash
{env}
torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 32 --hidden-size 4096 \\
  --num-attention-heads 32 --ffn-hidden-size 11008 --swiglu --seq-length 4096 --max-position-embeddings 4096 \\
  --micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer --sequence-parallel {args}
"""


@pytest.mark.parametrize("env,args,kernel", [
    ("export NVTE_FUSED_ATTN=0", "", "flash2"),  # NeMo Framework Launcher 2024: cuDNN off, flash-attn runs
    ("export NVTE_FLASH_ATTN=0\nexport NVTE_FUSED_ATTN=1", "", "flash"),  # cuDNN fused attention
    ("export NVTE_FLASH_ATTN=0\nexport NVTE_FUSED_ATTN=0", "", "unfused"),
    ("export NVTE_FUSED_ATTN=0", "--attention-backend fused", "flash"),  # Megatron's backend option wins
    ("", "", None),  # nothing said: the profile's kernel
])
def test_transformer_engine_attention_env_picks_the_kernel(tmp_path, env, args, kernel):
    path = tmp_path / "train.sh"
    path.write_text(_TE_SCRIPT.format(env=env, args=args))
    recipe = read_recipe(str(path))
    assert recipe.plan.get("attention") == kernel
    if kernel and not args:
        assert any(k.key.startswith("export NVTE_") and k.maps_to == "plan.attention" for k in recipe.keys)


@pytest.mark.parametrize("args,biased", [("", True), ("--disable-bias-linear", False),
                                         ("--add-bias-linear", True)])
def test_megatron_linears_are_biased_unless_disabled(tmp_path, args, biased):
    """Megatron-LM's add_bias_linear defaults to True (arguments.py); --disable-bias-linear turns it
    off: Model.linear_bias, which the Megatron export writes back."""
    path = tmp_path / "train.sh"
    path.write_text(_TE_SCRIPT.format(env="", args=args))
    recipe = read_recipe(str(path))
    assert recipe.model.linear_bias is biased
    if args:
        assert any(k.key == args and k.maps_to == "model.linear_bias" for k in recipe.keys)


@pytest.mark.parametrize("args,layout", [("", None), ("--grad-reduce-in-bf16", "megatron_bf16_grads"),
                                         ("--use-precision-aware-optimizer", "megatron_remainders_fp32_grads"),
                                         ("--use-precision-aware-optimizer --grad-reduce-in-bf16",
                                          "megatron_remainders")])
def test_megatron_gradient_dtype_and_precision_aware_optimizer_set_the_state_layout(tmp_path, args, layout):
    """--grad-reduce-in-bf16 keeps a bf16 main_grad buffer; --use-precision-aware-optimizer holds the
    master weights as 16-bit remainders in TE's FusedAdam and reads the gradient shard as it is
    (Megatron-Core optimizer/__init__.py, distrib_optimizer.py): Plan.state_layout for either precision."""
    path = tmp_path / "train.sh"
    path.write_text(_TE_SCRIPT.format(env="", args=args))
    recipe = read_recipe(str(path))
    assert recipe.plan.get("state_layout") == layout
    assert recipe.plan.get("fp8_state_layout") == layout


def test_shell_reader_runs_a_script_with_its_arguments_and_environment():
    """Harnesses pass parallel sizes as positional arguments (FlagPerf's run_pretraining.py runs
    ``bash pretrain_llama3.sh DATA 8 1 0 ... TP PP ...``) and options in quoted strings that span
    lines; the reader takes the arguments (``$1``, ``${10}``, ``$#``, ``"$@"``, ``shift``) and the
    caller's environment (the script's own assignments win), and names arguments it lacks."""
    text = ('TP=${10}\nPP=${11:-4}\nN=$#\nexport HOME_DIR=${HOME_DIR:-/root}\nMODE=train\n'
            'ARGS="\n    --tensor-model-parallel-size $TP \\\n    --pipeline-model-parallel-size $PP\n"\n'
            'shift 2\nFIRST=$1\ntorchrun pretrain_gpt.py $ARGS "$@"\n')
    sh = read_shell(text, args=[str(k) for k in range(1, 12)], env={"HOME_DIR": "/home/x", "MODE": "eval"})
    assert sh.variables["TP"] == "10" and sh.variables["PP"] == "11" and sh.variables["N"] == "11"
    assert sh.variables["HOME_DIR"] == "/home/x" and sh.variables["MODE"] == "train"  # the script's assignment wins
    assert sh.variables["FIRST"] == "3"  # after shift 2
    assert sh.commands[0].args == ["--tensor-model-parallel-size", "10", "--pipeline-model-parallel-size", "11",
                                   *[str(k) for k in range(3, 12)]]
    bare = read_shell(text)
    assert bare.variables["TP"] == "" and bare.variables["PP"] == "4"  # unset: empty, or the default
    assert bare.unread_hint() == "the script reads its arguments $1, ${10}, 0 given (--recipe-args)"
    # a '#' inside a multi-line quoted string is text, and an apostrophe in a comment opens no quote
    sh = read_shell("# don't\nA=\"--x 1 # not a comment\n --y 2\"\nrun.py $A\n")
    assert sh.commands[0].args == ["--x", "1", "#", "not", "a", "comment", "--y", "2"]


def test_flagperf_script_needs_its_arguments_and_reads_with_them(capsys):
    """FlagPerf's Llama 3 8B Megatron script (corpus): without the arguments its harness passes,
    one line naming the option and the missing arguments; with them (--recipe-args), the
    strategy of FlagPerf's A100 config, the Llama 3 vocabulary of its patched tokenizer type, and
    Megatron-LM's defaults the script leaves in place (dropout 0.1, learned absolute positions,
    biased linears), each said."""
    f = str(CORPUS_DIR / "flagperf" / "pretrain_llama3.sh")
    assert main(["import", f]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tensor-model-parallel-size" in err and "$1..${13}, 0 given" in err
    entry = next(e for e in ENTRIES if e["file"] == "flagperf/pretrain_llama3.sh")
    assert main(["import", f, "--recipe-args", " ".join(entry["recipe_args"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_gpus"] == 8 and out["strategy"].startswith("tp=1,pp=2,dp=4,mbs=1,gbs=512,seq=8192")
    assert "vocabulary 128256 of Llama3Tokenizer" in out["model_source"]
    assert any("--hidden-dropout 0.1" in w and "priced with dropout" in w for w in out["warnings"])
    assert any("learned absolute positions" in w for w in out["warnings"])
    from planner.recipes import read_recipe
    model = read_recipe(f, script_args=entry["recipe_args"]).model
    assert model.dropout is True and model.position_embedding == "learned" and model.linear_bias
    # simulate takes the same arguments; without --recipe they are bad input
    assert main(["simulate", "--recipe", f, "--recipe-args", " ".join(entry["recipe_args"]), "--gpu", "a800-80gb",
                 "--engine", "analytic", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"].startswith("tp=1,pp=2,dp=4")
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--num-gpus", "8", "--strategy", "tp=8",
                 "--recipe-args", "1 2"]) == 2
    assert "recipe-args" in capsys.readouterr().err
    toml = str(CORPUS_DIR / "torchtitan" / "llama3_8b.toml")
    assert main(["import", toml, "--recipe-env", "TP=2"]) == 2
    assert "applies to a launch script" in capsys.readouterr().err
    assert main(["import", f, "--recipe-env", "2TP=1"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("ffn,kv,vocab", [(14336, 8, 128256), (11008, None, 32000)])
def test_vocabulary_from_the_catalog_needs_the_whole_shape(tmp_path, ffn, kv, vocab):
    """Llama 2 7B and Llama 3 8B share layers, width and heads; their vocabularies differ 4x.  A
    recipe without a tokenizer that says its vocabulary takes the catalog model of its whole shape
    (FFN width, KV heads), and one that matches none is asked for it."""
    gqa = f"--group-query-attention --num-query-groups {kv} " if kv else ""
    f = tmp_path / "arch.sh"
    f.write_text(f"torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 {gqa}"
                 f"--ffn-hidden-size {ffn} --swiglu --bf16 --micro-batch-size 1 --global-batch-size 8\n")
    assert read_recipe(str(f)).model.vocab_size == vocab
    f.write_text("torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                 "--ffn-hidden-size 12000 --swiglu --bf16\n")
    with pytest.raises(Exception, match="--vocab-size"):
        read_recipe(str(f))


def test_eval_reads_a_hash_word_as_a_comment_as_bash_does():
    """``eval $cmd`` parses the joined words again, where a word starting with '#' opens a comment:
    FlagPerf's megatron-deepspeed_main.sh keeps a '#--recompute-activations' line inside its
    command string, and every option after it is dropped (the dev row's LAUNCH QUIRK).  The reader
    drops them too and says so; bash itself is the reference."""
    import shutil
    import subprocess

    script = ('cmd="torchrun --nproc_per_node 8 pretrain_gpt.py \\\n   --num-layers 2 \\\n'
              '   #--recompute-activations \\\n   --hidden-size 64"\neval $cmd\n')
    sh = read_shell(script)
    assert sh.commands[0].args == ["--num-layers", "2"]
    assert any("eval reads `#--recompute-activations` as a comment: the 3 words" in w for w in sh.warnings)
    bash = shutil.which("bash")
    if bash is not None:  # what bash passes to the launcher
        out = subprocess.run([bash, "-c", 'torchrun() { printf "%s\\n" "$@"; }\n' + script], capture_output=True,
                             text=True, check=True).stdout.split()
        assert out == ["--nproc_per_node", "8", "pretrain_gpt.py", "--num-layers", "2"]


def test_megatron_deepspeed_example_reads_its_gqa_rope_and_integer_tests(tmp_path):
    """Megatron-DeepSpeed's own example (examples_deepspeed/pretrain_llama2_distributed.sh at
    f4157be, abridged): grouped-query attention through its --num-key-value-heads, RoPE through
    --use-rotary-position-embeddings, and `[ $X -eq 1 ]` tests evaluated."""
    f = tmp_path / "pretrain_llama2_distributed.sh"
    f.write_text('TP=2\nPP=2\nNUM_KV_HEADS=4\nLOG_TO_WANDB=0\nWANDB_ARGS=\nif [ $LOG_TO_WANDB -eq 1 ]\nthen\n'
                 'WANDB_ARGS="--wandb-project x"\nfi\n'
                 'torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size $TP '
                 '--pipeline-model-parallel-size $PP --num-layers 24 --hidden-size 2048 --ffn-hidden-size 5504 '
                 '--num-attention-heads 16 --micro-batch-size 4 --global-batch-size 32 --seq-length 2048 '
                 '--vocab-size 32000 --bf16 --attention-dropout 0 --hidden-dropout 0 --use-rotary-position-embeddings '
                 '--swiglu --deepspeed '
                 '--num-key-value-heads $NUM_KV_HEADS $WANDB_ARGS\n')
    recipe = read_recipe(str(f))
    assert recipe.model.num_kv_heads == 4 and recipe.model.position_embedding == "rope"
    assert recipe.framework == "megatron-deepspeed" and not recipe.warnings
    assert not any(k.key.startswith("--wandb") for k in recipe.keys)
    one_line = read_shell("A=3\nif [ $A -gt 2 ] && [ $A -le 3 ]; then B=yes; fi\nif [ $A -eq 1 ]; then C=1; else C=2; fi\n")
    assert one_line.variables["B"] == "yes" and one_line.variables["C"] == "2"


def test_here_documents_pipes_and_spaced_arithmetic_read_as_bash_does():
    """Megatron-DeepSpeed's examples write their DeepSpeed config in a here-document and pipe the
    run into `tee` (examples_deepspeed/azure/run-175b.sh, corpus): the body is the config the
    launch reads (expanded unless the delimiter is quoted) and no command; `| tee log`,
    redirections and `2>&1` are not arguments; `$(( a * b ))` with spaces is arithmetic."""
    sh = read_shell('MB=4\nN=$(( 8 * ${MB} ))\nCFG=ds.json\ncat <<EOT > $CFG\n{"train_batch_size": $N,\n'
                    ' "zero_optimization": {"stage": 3}}\nEOT\ncat > raw.txt <<-\'END\'\n\t$N stays\n\tEND\n'
                    'deepspeed pretrain_gpt.py --micro-batch-size $MB --deepspeed_config $CFG 2>&1 | tee log.txt\n')
    assert sh.variables["N"] == "32"
    assert json.loads(sh.files["ds.json"]) == {"train_batch_size": 32, "zero_optimization": {"stage": 3}}
    assert sh.files["raw.txt"] == "$N stays"
    assert sh.commands[0].args == ["--micro-batch-size", "4", "--deepspeed_config", "ds.json"]
    entry = next(e for e in ENTRIES if e["file"].endswith("run-175b_megatron_deepspeed_azure.sh"))
    recipe, _, _, s = _load(entry)
    assert "DeepSpeed config ds_config.json" in recipe.dialect
    assert (s.zero, s.precision, s.recompute, s.mbs, s.gbs) == (3, "fp16", "full", 4, 32)


@pytest.mark.parametrize("experts,interval,topk,moe_layers", [("1", None, None, None), ("128", None, None, (2, 1, 1)),
                                                           ("64", "1", "2", (1, 0, 2))])
def test_megatron_deepspeed_moe_is_deepspeed_moe(tmp_path, experts, interval, topk, moe_layers):
    """Megatron-DeepSpeed's MoE options are DeepSpeed-MoE's (examples_deepspeed/MoE/*.sh at f4157be):
    --num-experts 1 is the dense model, MoE every --expert-interval-th layer from the second
    (default 2), --topk default 1, --moe-expert-parallel-size the expert parallelism."""
    extra = (f" --expert-interval {interval}" if interval else "") + (f" --topk {topk}" if topk else "")
    f = tmp_path / "ds_moe.sh"
    f.write_text("deepspeed pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
                 "--seq-length 2048 --micro-batch-size 4 --global-batch-size 256 --vocab-size 50257 --fp16 "
                 f"--deepspeed --num-experts {experts} --moe-expert-parallel-size 8 --moe-loss-coeff 0.01{extra}\n")
    recipe = read_recipe(str(f))
    moe = recipe.model.moe
    if moe_layers is None:
        assert moe is None
        return
    freq, first, k = moe_layers
    assert (moe.num_experts, moe.layer_frequency, moe.first_k_dense_layers, moe.top_k) == (int(experts), freq, first, k)
    assert moe.expert_ffn_hidden_size == recipe.model.ffn_hidden_size and recipe.settings["ep"] == 8
    assert not [k for k in recipe.keys if k.key == "--moe-loss-coeff" and k.cost != "no"]
