"""Read an exported configuration back into the ``Strategy`` it launches.

The inverse of each exporter, written from the tools' own semantics (what Megatron-LM,
torchtitan and DeepSpeed derive from those options), not from our writer: data parallelism from
the world size, interleaving from the virtual stages, the ZeRO stage from the sharding options,
overlaps from their switches.  ``read_back(fmt, files, model, num_gpus)`` is what the tests use
to check that an exported plan is the plan that was predicted (export, read back, re-simulate,
same step time).
"""

from __future__ import annotations

import ast
import json
import shlex
import tomllib

import yaml

from sim.errors import InputError
from sim.psspecs import ParameterServers
from sim.specs import Model, Strategy


def options(tokens: list[str]) -> dict[str, str | bool]:
    """``--flag value`` / ``--switch`` tokens as a mapping."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise InputError("export", tok, "expected an option")
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[tok], i = tokens[i + 1], i + 2
        else:
            out[tok], i = True, i + 1
    return out


def bash_array(script: str, name: str) -> list[str]:
    """The words of ``name=( ... )`` in a bash script (one option per line, shell-quoted)."""
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{name}=("))
    end = next(i for i in range(start, len(lines)) if lines[i] == ")")
    return [w for ln in lines[start + 1:end] for w in shlex.split(ln)]


def strategy_from_megatron(tokens: list[str], *, model: Model, num_gpus: int) -> Strategy:
    """Megatron-LM ``pretrain_gpt.py`` arguments -> the strategy Megatron-LM runs."""
    o = options(tokens)
    tp, pp = int(o["--tensor-model-parallel-size"]), int(o["--pipeline-model-parallel-size"])
    cp = int(o.get("--context-parallel-size", 1))
    vp = int(o.get("--num-virtual-stages-per-pipeline-rank", 1))
    dp = num_gpus // (tp * pp * cp)  # Megatron: world size / model-parallel size
    sharding = o.get("--data-parallel-sharding-strategy")
    zero = {"optim_grads": 2, "optim_grads_params": 3}[str(sharding)] if sharding else \
        (1 if "--use-distributed-optimizer" in o else 0)
    instances = o.get("--num-distributed-optimizer-instances")
    precision = "fp8" if "--fp8-format" in o else ("fp16" if "--fp16" in o else "bf16")
    return Strategy(tp=tp, pp=pp, dp=dp, cp=cp, ep=int(o.get("--expert-model-parallel-size", 1)),
                    etp=int(o["--expert-tensor-parallel-size"]) if "--expert-tensor-parallel-size" in o else None,
                    vp=vp, mbs=int(o["--micro-batch-size"]), gbs=int(o["--global-batch-size"]),
                    seq_len=int(o["--seq-length"]), zero=zero, sp="--sequence-parallel" in o,
                    recompute=str(o.get("--recompute-granularity", "none")), precision=precision,
                    schedule="interleaved" if vp > 1 else "1f1b", tp_overlap="--tp-comm-overlap" in o,
                    dp_overlap="--overlap-grad-reduce" in o, ep_overlap="--overlap-moe-expert-parallel-comm" in o,
                    pp_overlap=vp > 1 and "--no-overlap-p2p-communication" not in o,
                    cuda_graphs="--enable-cuda-graph" in o, fp8_recipe=str(o.get("--fp8-recipe", "delayed")),
                    dp_shard=dp // int(instances) if instances else None,
                    offload="optimizer" if "--optimizer-cpu-offload" in o else
                    ("activations" if "--cpu-offloading-num-layers" in o else "none"),
                    offload_num_layers=int(o["--cpu-offloading-num-layers"]) if "--cpu-offloading-num-layers" in o
                    else None, **_recompute_layers(o))


def _recompute_layers(o: dict) -> dict[str, object]:
    """Megatron's ``--recompute-method`` / ``--recompute-num-layers`` as the strategy keys
    (uniform groups of 1 = every layer = the keys left out)."""
    method, n = str(o.get("--recompute-method", "uniform")), int(o.get("--recompute-num-layers", 1))
    if o.get("--recompute-granularity") != "full" or (method == "uniform" and n == 1):
        return {}
    return {"recompute_num_layers": n, "recompute_method": method}


_TT_SCHEDULES = {"1F1B": ("1f1b", False), "GPipe": ("gpipe", False), "Interleaved1F1B": ("interleaved", True),
                 "InterleavedZeroBubble": ("zero-bubble", True)}


def strategy_from_torchtitan(text: str, *, model: Model, num_gpus: int) -> Strategy:
    """A torchtitan job config -> the strategy torchtitan runs."""
    tt = tomllib.loads(text)
    par, tr, ac = tt["parallelism"], tt["training"], tt["activation_checkpoint"]
    rep, shard = int(par["data_parallel_replicate_degree"]), int(par["data_parallel_shard_degree"])
    tp, pp = int(par["tensor_parallel_degree"]), int(par["pipeline_parallel_degree"])
    schedule, vp = "1f1b", 1
    if pp > 1:
        schedule, interleaved = _TT_SCHEDULES[par["pipeline_parallel_schedule"]]
        if "module_fqns_per_model_part" in par:
            vp = len(par["module_fqns_per_model_part"]) // pp
        elif "pipeline_parallel_layers_per_stage" in par:
            vp = model.num_layers // (int(par["pipeline_parallel_layers_per_stage"]) * pp)
        if interleaved != (vp > 1):
            raise InputError("export", par["pipeline_parallel_schedule"], f"does not match {vp} stages per rank")
    converters = tt["model"].get("converters", [])
    fp8 = "float8" in converters or "mx" in converters
    return Strategy(tp=tp, pp=pp, dp=rep * shard, cp=int(par["context_parallel_degree"]),
                    ep=int(par["expert_parallel_degree"]), etp=par.get("expert_tensor_parallel_degree"), vp=vp,
                    mbs=int(par["pipeline_parallel_microbatch_size"]) if pp > 1 else int(tr["local_batch_size"]),
                    gbs=int(tr["global_batch_size"]), seq_len=int(tr["seq_len"]), zero=0 if shard == 1 else 3,
                    sp=tp > 1,  # torchtitan's TP plan always shards the sequence between the GEMMs
                    recompute=str(ac["mode"]),
                    precision="fp8" if fp8 else ("fp16" if tr["mixed_precision_param"] == "float16" else "bf16"),
                    schedule=schedule, tp_overlap=bool(par["enable_async_tensor_parallel"]), dp_overlap=True,
                    fp8_recipe=("mxfp8" if "mx" in converters else "tensorwise") if fp8 else "delayed",
                    dp_shard=shard if shard > 1 and rep > 1 else None,
                    offload="params" if tr.get("enable_cpu_offload") else "none")


def strategy_from_deepspeed(cfg_text: str, tokens: list[str], *, model: Model, num_gpus: int) -> Strategy:
    """``ds_config.json`` plus the Megatron-DeepSpeed arguments -> the strategy they run."""
    cfg, o = json.loads(cfg_text), options(tokens)
    tp = int(o["--tensor-model-parallel-size"])
    pp = 1 if "--no-pipeline-parallel" in o else int(o["--pipeline-model-parallel-size"])
    cp = int(o.get("--ds-sequence-parallel-size", 1))
    dp = num_gpus // (tp * pp * cp)
    if cfg["train_batch_size"] != cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp:
        raise InputError("export", "ds_config.json", "train_batch_size != micro batch * accumulation * data parallel")
    zo = cfg["zero_optimization"]
    states = "params" if "offload_param" in zo else ("optimizer" if "offload_optimizer" in zo else "")
    acts = "activations" if cfg["activation_checkpointing"].get("cpu_checkpointing") else ""
    target = zo.get("offload_param") or zo.get("offload_optimizer") or {"device": "cpu"}
    return Strategy(tp=tp, pp=pp, dp=dp, cp=cp, ep=int(o.get("--expert-model-parallel-size", 1)),
                    offload="+".join(p for p in (states, acts) if p) or "none", offload_device=str(target["device"]),
                    mbs=int(cfg["train_micro_batch_size_per_gpu"]), gbs=int(cfg["train_batch_size"]),
                    seq_len=int(o["--seq-length"]), zero=int(cfg["zero_optimization"]["stage"]),
                    sp="--sequence-parallel" in o, recompute=str(o.get("--recompute-granularity", "none")),
                    precision="fp16" if cfg["fp16"]["enabled"] else "bf16",
                    dp_overlap=bool(cfg["zero_optimization"]["overlap_comm"]))


_TF_POLICIES = {"mixed_bfloat16": "bf16", "mixed_float16": "fp16"}
_TF_STRATEGIES = ("MirroredStrategy", "MultiWorkerMirroredStrategy", "ParameterServerStrategy")


def _tf_script(text: str) -> tuple[dict[str, object], dict[str, ast.Call]]:
    """A Keras script's module-level constants (literal assignments) and its calls by the
    name they end in (``tf.distribute.MirroredStrategy(...)`` -> ``MirroredStrategy``)."""
    tree = ast.parse(text)
    consts: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    calls: dict[str, ast.Call] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")
            calls.setdefault(name, node)
    return consts, calls


def _kwarg(call: ast.Call, key: str, consts: dict[str, object]) -> object:
    """A keyword argument's value: a literal, a module constant, a call (its node) or None."""
    for kw in call.keywords:
        if kw.arg == key:
            v = kw.value
            if isinstance(v, ast.Name) and v.id in consts:
                return consts[v.id]
            if isinstance(v, ast.Constant):
                return v.value
            return v
    return None


def tensorflow_strategy_class(files: dict[str, str]) -> str:
    """Which tf.distribute strategy ``train_keras.py`` constructs."""
    _, calls = _tf_script(files["train_keras.py"])
    found = [c for c in _TF_STRATEGIES if c in calls]
    if len(found) != 1:
        raise InputError("export", "train_keras.py", f"expected one tf.distribute strategy, found {found}")
    return found[0]


def strategy_from_tensorflow(files: dict[str, str], *, model: Model, num_gpus: int) -> Strategy:
    """A Keras ``tf.distribute`` script (and its ``TF_CONFIG`` values) -> the strategy it runs:
    every GPU a data-parallel replica (TensorFlow has no tensor or pipeline parallelism); the
    micro-batch is the per-replica batch, the global batch that times the replicas times the
    optimizer's accumulation steps; MultiWorkerMirrored packs of ``bytes_per_pack > 0`` reduce
    under the backward, one pack (0) and MirroredStrategy's ``NcclAllReduce`` after it;
    ``ParameterServerStrategy`` is asynchronous (``dp_impl=parameter-server``)."""
    consts, calls = _tf_script(files["train_keras.py"])
    cls = tensorflow_strategy_class(files)
    if cls != "MirroredStrategy":
        configs = json.loads(files["tf_configs.json"])
        workers = len(next(iter(configs.values()))["cluster"]["worker"])
        if workers * int(consts["GPUS_PER_WORKER"]) != num_gpus:  # type: ignore[arg-type]
            raise InputError("export", "tf_configs.json", f"{workers} workers x {consts['GPUS_PER_WORKER']} GPUs "
                             f"!= {num_gpus}")
    mbs = int(consts["PER_REPLICA_BATCH_SIZE"])  # type: ignore[arg-type]
    acc = int(consts["GRADIENT_ACCUMULATION_STEPS"] or 1)  # type: ignore[arg-type]
    gbs = mbs * num_gpus * acc
    if gbs != consts["GLOBAL_BATCH_SIZE"]:
        raise InputError("export", "GLOBAL_BATCH_SIZE", f"{consts['GLOBAL_BATCH_SIZE']} != per-replica batch x "
                         f"replicas x accumulation = {gbs}")
    overlap = False
    if cls == "MultiWorkerMirroredStrategy":
        opts = _kwarg(calls["MultiWorkerMirroredStrategy"], "communication_options", consts)
        if not isinstance(opts, ast.Name) or "CommunicationOptions" not in calls:
            raise InputError("export", "train_keras.py", "MultiWorkerMirroredStrategy without CommunicationOptions")
        impl = _kwarg(calls["CommunicationOptions"], "implementation", consts)
        if not (isinstance(impl, ast.Attribute) and impl.attr == "NCCL"):
            raise InputError("export", "train_keras.py", "collectives other than NCCL are not priced")
        overlap = int(_kwarg(calls["CommunicationOptions"], "bytes_per_pack", consts) or 0) > 0  # type: ignore[arg-type]
    elif cls == "MirroredStrategy":
        ops = _kwarg(calls["MirroredStrategy"], "cross_device_ops", consts)
        if not (isinstance(ops, ast.Call) and isinstance(ops.func, ast.Attribute) and ops.func.attr == "NcclAllReduce"):
            raise InputError("export", "train_keras.py", "MirroredStrategy without NcclAllReduce is not priced")
    return Strategy(dp=num_gpus, mbs=mbs, gbs=gbs, seq_len=int(consts["SEQ_LEN"]),  # type: ignore[arg-type]
                    recompute=str(consts["RECOMPUTE"]), precision=_TF_POLICIES[str(consts["MIXED_PRECISION_POLICY"])],
                    dp_overlap=overlap, dp_impl="parameter-server" if cls == "ParameterServerStrategy" else "ddp")


def parameter_servers_from_tensorflow(files: dict[str, str]) -> ParameterServers:
    """The PS tasks of a ``ParameterServerStrategy`` script: their number (``TF_CONFIG``'s ``ps``
    list) and the partition (``MinSizePartitioner`` over them, or none)."""
    consts, calls = _tf_script(files["train_keras.py"])
    configs = json.loads(files["tf_configs.json"])
    num_ps = len(next(iter(configs.values()))["cluster"]["ps"])
    part = calls.get("MinSizePartitioner")
    even = part is not None and _kwarg(part, "max_shards", consts) == num_ps and consts.get("PS_PARTITION") == "even"
    return ParameterServers(num_ps=num_ps, partition="even" if even else "round-robin")


def read_back(fmt: str, files: dict[str, str], *, model: Model, num_gpus: int) -> Strategy:
    """The strategy the files of export format ``fmt`` launch."""
    if fmt == "megatron":
        tokens = bash_array(files["megatron_args.sh"], "MEGATRON_ARGS")
    elif fmt == "torchrun":
        tokens = bash_array(files["launch_torchrun.sh"], "MEGATRON_ARGS")
    elif fmt == "slurm":
        tokens = bash_array(files["train.sbatch"], "MEGATRON_ARGS")
    elif fmt == "k8s":
        job = yaml.safe_load(files["pytorchjob.yaml"])
        cmd = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
        tokens = cmd[next(i for i, t in enumerate(cmd) if t.endswith("pretrain_gpt.py")) + 1:]
    elif fmt == "torchtitan":
        return strategy_from_torchtitan(files["torchtitan.toml"], model=model, num_gpus=num_gpus)
    elif fmt == "deepspeed":
        return strategy_from_deepspeed(files["ds_config.json"], bash_array(files["deepspeed_launch.sh"], "DS_ARGS"),
                                       model=model, num_gpus=num_gpus)
    elif fmt == "tensorflow":
        return strategy_from_tensorflow(files, model=model, num_gpus=num_gpus)
    else:
        raise InputError("export", fmt, "no reader for this format")
    return strategy_from_megatron([str(t) for t in tokens], model=model, num_gpus=num_gpus)
