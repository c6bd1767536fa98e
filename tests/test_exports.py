"""Every export parses (JSON, TOML, YAML, ``bash -n``) and round-trips the plan's degrees,
batch sizes and ZeRO stage."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import tomllib

import pytest
import yaml

from planner.exports import FORMAT_FRAMEWORK, FORMATS, LaunchSpec, parse_formats, render, write
from planner.exports.readback import options as _options
from sim.data.catalog import get_model
from sim.base.errors import InputError
from sim.cost.framework import get_framework
from sim.cost.plan import parse_strategy

BASH = shutil.which("bash")

# (model, num_gpus, strategy): dense pipeline + interleaving, FSDP, CP + GQA, MoE + EP, fp8, ZeRO-1.
PLANS = [
    ("gpt3-175b", 1024, "tp=8,pp=16,vp=3,mbs=1,gbs=1536,sp=1,recompute=selective,zero=1"),
    ("llama3-70b", 64, "tp=8,pp=1,cp=2,mbs=1,gbs=64,seq=8192,zero=3,sp=1,recompute=full"),
    ("llama3-8b", 16, "tp=1,pp=1,mbs=2,gbs=64,zero=0,recompute=none"),
    ("mixtral-8x7b", 64, "tp=2,pp=2,ep=4,mbs=1,gbs=256,zero=2,sp=1,recompute=selective,precision=fp8"),
    ("gpt3-175b", 256, "tp=4,pp=8,mbs=1,gbs=512,zero=1,recompute=full"),
    ("llama3-70b", 128, "tp=8,pp=4,vp=5,mbs=1,gbs=256,zero=0,sp=1,recompute=none,precision=fp16,schedule=interleaved"),
    ("llama3-8b", 64, "tp=2,pp=1,mbs=1,gbs=64,seq=8192,zero=1,sp=1,recompute=none,precision=fp8,fp8_params=1"),
]


def _spec(model_id: str, n: int, text: str) -> LaunchSpec:
    model = get_model(model_id)
    s = parse_strategy(text, num_gpus=n)
    return LaunchSpec(model=model, strategy=s, num_gpus=n, gpus_per_node=min(8, n), gpu="h100-80gb",
                      job_name="test-job", steps=1000, time_limit_s=3600.0)


def _bash_array(script: str, name: str, tmp_path) -> list[str]:
    """Source a script's array definition (not its commands) and print the array."""
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{name}=("))
    end = next(i for i in range(start, len(lines)) if lines[i] == ")")
    f = tmp_path / "array.sh"
    f.write_text("\n".join(lines[start:end + 1]) + "\n")
    out = subprocess.run([BASH, "-c", f'source "{f}"; printf "%s\\n" "${{{name}[@]}}"'], check=True,
                         capture_output=True, text=True).stdout
    return out.splitlines()


def _bash_n(text: str, tmp_path) -> None:
    f = tmp_path / "script.sh"
    f.write_text(text)
    r = subprocess.run([BASH, "-n", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _check_megatron(opts: dict, spec: LaunchSpec) -> None:
    s = spec.strategy
    assert int(opts["--tensor-model-parallel-size"]) == s.tp
    assert int(opts["--pipeline-model-parallel-size"]) == s.pp
    assert int(opts.get("--context-parallel-size", 1)) == s.cp
    assert int(opts.get("--expert-model-parallel-size", 1)) == s.ep
    assert int(opts["--micro-batch-size"]) == s.mbs
    assert int(opts["--global-batch-size"]) == s.gbs
    assert int(opts["--seq-length"]) == s.seq_len
    assert bool(opts.get("--sequence-parallel", False)) == s.sp
    assert int(opts.get("--num-virtual-stages-per-pipeline-rank", 1)) == s.vp
    # Megatron derives dp from the world size; the micro-batch count follows.
    dp = spec.num_gpus // (s.tp * s.pp * s.cp)
    assert dp == s.dp and s.gbs // (s.mbs * dp) == s.num_microbatches
    assert opts.get("--recompute-granularity", "none") == s.recompute
    strategy = opts.get("--data-parallel-sharding-strategy")
    zero = {"optim": 1, "optim_grads": 2, "optim_grads_params": 3}[strategy] if strategy else \
        (1 if "--use-distributed-optimizer" in opts else 0)
    assert zero == s.zero
    precision = "fp8" if "--fp8-format" in opts else ("fp16" if "--fp16" in opts else "bf16")
    assert precision == s.precision
    assert ("--fp8-param-gather" in opts) == s.fp8_params


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("model_id,n,text", PLANS)
def test_every_format_parses_and_round_trips(model_id, n, text, tmp_path):
    spec = _spec(model_id, n, text)
    s = spec.strategy
    runs = {f: get_framework(FORMAT_FRAMEWORK[f]).capabilities.refusal(s) is None for f in FORMATS}

    if runs["megatron"]:
        meg = render("megatron", spec).files["megatron_args.sh"]
        _bash_n(meg, tmp_path)
        _check_megatron(_options(_bash_array(meg, "MEGATRON_ARGS", tmp_path)), spec)
        for fmt, name in (("torchrun", "launch_torchrun.sh"), ("slurm", "train.sbatch")):
            text_ = render(fmt, spec).files[name]
            _bash_n(text_, tmp_path)
            _check_megatron(_options(_bash_array(text_, "MEGATRON_ARGS", tmp_path)), spec)
        run = render("torchrun", spec).files["launch_torchrun.sh"]
        assert f"NNODES=${{NNODES:-{spec.num_nodes}}}" in run and "exec torchrun" in run
        sb = render("slurm", spec).files["train.sbatch"]
        sbatch = dict(line[len("#SBATCH "):].split("=", 1) for line in sb.splitlines()
                      if line.startswith("#SBATCH --") and "=" in line)
        assert int(sbatch["--nodes"]) * int(sbatch["--gpus-per-node"]) == spec.num_gpus
        assert sbatch["--ntasks-per-node"] == "1" and sbatch["--time"] == "0-01:06:00"
        assert "srun" in sb and "torchrun" in sb
        job = yaml.safe_load(render("k8s", spec).files["pytorchjob.yaml"])
        assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
        reps = job["spec"]["pytorchReplicaSpecs"]
        assert sum(r["replicas"] for r in reps.values()) == spec.num_nodes
        assert reps["Master"]["replicas"] == 1
        c = reps["Master"]["template"]["spec"]["containers"][0]
        assert c["name"] == "pytorch"
        assert c["resources"]["limits"]["nvidia.com/gpu"] * spec.num_nodes == spec.num_gpus
        assert int(job["spec"]["nprocPerNode"]) == spec.procs_per_node
        cmd = c["command"]
        assert cmd[0] == "torchrun" and cmd[cmd.index("--nnodes") + 1] == str(spec.num_nodes)
        script_at = next(i for i, t in enumerate(cmd) if t.endswith("pretrain_gpt.py"))
        _check_megatron(_options(cmd[script_at + 1:]), spec)
    else:
        with pytest.raises(InputError, match="megatron"):
            render("megatron", spec)

    if runs["torchtitan"]:
        tt = tomllib.loads(render("torchtitan", spec).files["torchtitan.toml"])
        par, tr = tt["parallelism"], tt["training"]
        dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
        assert (dp, par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"],
                par["expert_parallel_degree"]) == (s.dp, s.tp, s.pp, s.cp, s.ep)
        assert dp * s.tp * s.pp * s.cp == spec.num_gpus
        assert tr["global_batch_size"] == s.gbs and tr["seq_len"] == s.seq_len
        if s.pp > 1:
            assert par["pipeline_parallel_microbatch_size"] == s.mbs
            assert tr["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == s.num_microbatches
        else:  # gradient accumulation: global / (local * dp) steps
            assert tr["local_batch_size"] == s.mbs
            assert tr["global_batch_size"] // (tr["local_batch_size"] * dp) == s.num_microbatches
        assert (par["data_parallel_shard_degree"] > 1) == (s.zero == 3 and s.dp > 1)
        assert tt["activation_checkpoint"]["mode"] == s.recompute
        assert bool(tt["model"]["converters"]) == (s.precision == "fp8")

    if runs["deepspeed"]:
        ds = render("deepspeed", spec)
        cfg = json.loads(ds.files["ds_config.json"])
        assert cfg["train_batch_size"] == s.gbs
        assert cfg["train_micro_batch_size_per_gpu"] == s.mbs
        assert cfg["gradient_accumulation_steps"] == s.num_microbatches
        assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * s.dp
        assert cfg["zero_optimization"]["stage"] == s.zero
        assert cfg["tensor_parallel"]["autotp_size"] == s.tp
        assert cfg["bf16"]["enabled"] == (s.precision != "fp16") and cfg["fp16"]["enabled"] == (s.precision == "fp16")
        launch = ds.files["deepspeed_launch.sh"]
        _bash_n(launch, tmp_path)
        args = _options(_bash_array(launch, "DS_ARGS", tmp_path))
        assert int(args["--tensor-model-parallel-size"]) == s.tp and int(args["--zero-stage"]) == s.zero
        assert int(args.get("--pipeline-model-parallel-size", 1)) == s.pp
        assert ("--no-pipeline-parallel" in args) == (s.pp == 1)
    assert any(runs.values()), "every plan here runs on at least one exported framework"


def test_plans_a_format_cannot_carry_are_refused_not_rewritten():
    zb = _spec("gpt3-175b", 256, "tp=4,pp=8,mbs=1,gbs=512,zero=1,recompute=full,schedule=zero-bubble")
    with pytest.raises(InputError, match="schedule=zero-bubble"):
        render("megatron", zb)
    with pytest.raises(InputError, match="zero=1"):
        render("torchtitan", _spec("gpt3-175b", 256, "tp=4,pp=8,mbs=1,gbs=512,zero=1,sp=1"))
    uneven = _spec("llama3-70b", 128, "tp=8,pp=4,vp=3,mbs=1,gbs=256,sp=1,schedule=interleaved,zero=3")  # 80 layers / 12
    with pytest.raises(InputError, match="equal"):
        render("megatron", uneven)
    tt = tomllib.loads(render("torchtitan", uneven).files["torchtitan.toml"])
    parts = tt["parallelism"]["module_fqns_per_model_part"]
    assert len(parts) == 12 and sum(p.count("layers.") for p in map(str, parts)) >= 0
    assert [sum(1 for x in p if x.startswith("layers.")) for p in parts] == [7] * 8 + [6] * 4


def test_write_creates_files_and_rejects_bad_input(tmp_path):
    spec = _spec("llama3-8b", 16, "tp=1,pp=1,mbs=2,gbs=64")
    for fmt in FORMATS:
        paths, _ = write(fmt, spec, tmp_path / "out")
        assert paths and all(p.exists() and p.stat().st_size > 0 for p in paths)
    assert parse_formats("all") == list(FORMATS)
    assert parse_formats("slurm, k8s") == ["slurm", "k8s"]
    with pytest.raises(InputError, match="export"):
        parse_formats("helm")
    with pytest.raises(InputError, match="export"):
        render("helm", spec)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="out"):
        write("slurm", spec, blocker)


def _ds_offload(cfg: dict) -> tuple[str, str]:
    """(offload, device) a DeepSpeed config encodes."""
    zo = cfg["zero_optimization"]
    states = "params" if "offload_param" in zo else ("optimizer" if "offload_optimizer" in zo else "")
    acts = "activations" if cfg["activation_checkpointing"].get("cpu_checkpointing") else ""
    target = zo.get("offload_param") or zo.get("offload_optimizer") or {"device": "cpu"}
    assert all(t.get("pin_memory") is True for t in (zo.get("offload_param"), zo.get("offload_optimizer")) if t)
    return "+".join(p for p in (states, acts) if p) or "none", target["device"]


OFFLOAD_PLANS = [
    ("llama3-8b", 8, "tp=1,mbs=1,gbs=16,zero=2,offload=optimizer"),
    ("llama3-70b", 64, "tp=8,mbs=1,gbs=64,zero=3,recompute=full,offload=params"),
    ("llama3-70b", 64, "tp=8,mbs=1,gbs=64,zero=3,recompute=full,offload=params,offload_device=nvme"),
    ("llama3-70b", 64, "tp=8,mbs=1,gbs=64,zero=3,recompute=full,offload=params+activations"),
    ("llama3-8b", 16, "tp=2,mbs=1,gbs=16,zero=1,offload=optimizer"),
]


@pytest.mark.parametrize("model_id,n,text", OFFLOAD_PLANS)
def test_offload_round_trips_or_is_refused(model_id, n, text, tmp_path):
    """DeepSpeed carries every state offload (offload_optimizer / offload_param with device and
    pinned memory) and activation offload as cpu_checkpointing; torchtitan carries FSDP CPU
    offload (enable_cpu_offload) and Megatron-LM the distributed optimizer's CPU offload; a
    target that cannot express the plan refuses it in one line instead of writing another."""
    spec = _spec(model_id, n, text)
    s = spec.strategy
    cfg = json.loads(render("deepspeed", spec).files["ds_config.json"])
    assert _ds_offload(cfg) == (s.offload, s.offload_device)
    assert cfg["zero_optimization"]["stage"] == s.zero
    if s.offload_device == "nvme":
        assert cfg["zero_optimization"]["offload_param"]["nvme_path"]
    back = parse_strategy(f"tp={s.tp},pp={s.pp},mbs={cfg['train_micro_batch_size_per_gpu']},"
                          f"gbs={cfg['train_batch_size']},zero={cfg['zero_optimization']['stage']},"
                          f"offload={_ds_offload(cfg)[0]},offload_device={_ds_offload(cfg)[1]}", num_gpus=n)
    assert (back.offload, back.offload_device, back.zero, back.dp) == (s.offload, s.offload_device, s.zero, s.dp)

    tt_spec = dataclasses.replace(spec, strategy=s.with_(sp=s.tp > 1))  # torchtitan's TP always shards the sequence
    if s.offload == "params" and s.offload_device == "cpu":
        tt = tomllib.loads(render("torchtitan", tt_spec).files["torchtitan.toml"])
        assert tt["training"]["enable_cpu_offload"] is True
        assert tt["parallelism"]["data_parallel_shard_degree"] == s.dp
    else:
        with pytest.raises(InputError, match="torchtitan"):
            render("torchtitan", tt_spec)

    if s.offload == "optimizer" and s.zero == 1:
        opts = _options(_bash_array(render("megatron", spec).files["megatron_args.sh"], "MEGATRON_ARGS", tmp_path))
        assert opts["--optimizer-cpu-offload"] is True and opts["--optimizer-offload-fraction"] == "1.0"
        assert "--use-distributed-optimizer" in opts
    else:
        for fmt in ("megatron", "torchrun", "slurm", "k8s"):
            with pytest.raises(InputError, match="megatron"):
                render(fmt, spec)


def test_deepspeed_refuses_activation_offload_it_cannot_express():
    spec = _spec("llama3-8b", 8, "tp=1,mbs=1,gbs=16,zero=2,recompute=none,offload=optimizer+activations")
    with pytest.raises(InputError, match="cpu_checkpointing"):
        render("deepspeed", spec)
    assert "offload" not in json.dumps(json.loads(render("deepspeed", _spec("llama3-8b", 8, "mbs=1,gbs=16"))
                                                  .files["ds_config.json"]))


def test_megatron_export_disables_biases_exactly_when_the_model_has_none():
    """--disable-bias-linear follows Model.linear_bias (Megatron-LM biases every linear by default),
    not the activation: a GPT from the catalog keeps its biases, a Llama or an unbiased GeLU model
    turns them off."""
    for model_id, biased in (("gpt3-175b", True), ("llama3-8b", False)):
        spec = _spec(model_id, 16, "tp=2,pp=1,mbs=1,gbs=32,zero=1,recompute=none")
        meg = render("megatron", spec).files["megatron_args.sh"]
        assert ("--disable-bias-linear" in meg) is not biased, model_id
    spec = _spec("gpt3-175b", 16, "tp=2,pp=1,mbs=1,gbs=32,zero=1,recompute=none")
    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, linear_bias=False))
    assert "--disable-bias-linear" in render("megatron", spec).files["megatron_args.sh"]
