"""Read an exported configuration back into the ``Strategy`` it launches.

The inverse of each exporter is the recipe reader of its framework (``planner.recipes``, what
``planner import`` runs on a user's own files), written from the tools' own semantics (what
Megatron-LM, torchtitan and DeepSpeed derive from those options), not from our writer: data
parallelism from the world size, interleaving from the virtual stages or the pipeline layout,
the ZeRO stage from the sharding options, overlaps from their switches.
``read_back(fmt, files, model, num_gpus)`` is what the tests use to check that an exported plan
is the plan that was predicted (export, read back, re-simulate, same step time).
"""

from __future__ import annotations

import ast
import json
import shlex
import tempfile
from pathlib import Path

from sim.base.errors import InputError
from sim.data.psspecs import ParameterServers
from sim.data.specs import Model, Strategy


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


FORMAT_MAIN_FILE = {"megatron": "megatron_args.sh", "torchrun": "launch_torchrun.sh", "slurm": "train.sbatch",
                    "k8s": "pytorchjob.yaml", "torchtitan": "torchtitan.toml", "deepspeed": "deepspeed_launch.sh"}


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
    """The strategy the files of export format ``fmt`` launch, read by the recipe readers a user's
    own files go through (``planner.recipes``: ``planner import``), from the files as written."""
    from planner.recipes import read_recipe, resolve

    if fmt == "tensorflow":  # a Keras script: read with ast (no recipe reader for TensorFlow)
        return strategy_from_tensorflow(files, model=model, num_gpus=num_gpus)
    if fmt not in FORMAT_MAIN_FILE:
        raise InputError("export", fmt, "no reader for this format")
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            (Path(d) / name).write_text(text, encoding="utf-8")
        recipe = read_recipe(str(Path(d) / FORMAT_MAIN_FILE[fmt]), model=model)
        return resolve(recipe, model=model, num_gpus=num_gpus)
