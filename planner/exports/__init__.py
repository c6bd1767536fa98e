"""Write a recommended plan in the formats people launch training with.

``render(fmt, spec)`` returns the files (name -> text) and warnings for one format;
``write(fmt, spec, out_dir)`` writes them.  Formats:

* ``megatron``: ``megatron_args.sh``, a bash array of Megatron-LM ``pretrain_gpt.py`` arguments;
* ``torchtitan``: ``torchtitan.toml``, a torchtitan job config;
* ``deepspeed``: ``ds_config.json`` plus ``deepspeed_launch.sh`` (Megatron-DeepSpeed arguments);
* ``torchrun``: ``launch_torchrun.sh``, one node's ``torchrun`` command (Megatron-LM);
* ``slurm``: ``train.sbatch``, an ``sbatch`` script that runs torchrun on every node;
* ``k8s``: ``pytorchjob.yaml``, a Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``);
* ``tensorflow``: ``train_keras.py``, a Keras script on ``tf.distribute`` (Mirrored,
  MultiWorkerMirrored or ParameterServer strategy), with ``tf_configs.json`` and
  ``launch_tf.sh`` across machines.

Each tool's real option names are used.  Each format launches one framework profile
(``FORMAT_FRAMEWORK``; ``tensorflow`` picks its tf.distribute profile per plan,
``format_framework``); a plan that framework cannot run (a schedule it lacks, ZeRO-1 in
torchtitan, ...) is refused with a one-line error, so the files always carry the predicted plan
(``planner.exports.readback`` reads them back; the tests re-simulate what it reads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sim.base.errors import InfeasibleError, InputError
from sim.cost.framework import check_supported, get_framework
from sim.data.psspecs import ParameterServers
from sim.base.outpaths import make_folder, write_text, writing
from sim.cost.plan import Plan
from sim.data.specs import Model, Strategy

FORMATS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed", "torchrun", "slurm", "k8s", "tensorflow")
# The framework profile (catalogs/frameworks.yaml) each format launches: its capabilities decide
# which plans the format can carry (the launchers run Megatron-LM's pretrain_gpt.py).
FORMAT_FRAMEWORK: dict[str, str] = {"megatron": "megatron-core", "torchrun": "megatron-core", "slurm": "megatron-core",
                                    "k8s": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "megatron-deepspeed",
                                    # synchronous plans searched as MultiWorkerMirroredStrategy (tf-mirrored runs
                                    # the same mechanisms on one node); the script picks per plan
                                    "tensorflow": "tf-multiworker"}


def formats_of(framework: str) -> list[str]:
    """The formats that launch ``framework`` (its own first: ``megatron``, ``torchtitan``,
    ``deepspeed``, then the launchers)."""
    return [f for f in FORMATS if FORMAT_FRAMEWORK[f] == framework]


# Other framework profiles a format can launch as they are (torchtitan.toml with [compile] for
# torchtitan-compile; Megatron-LM arguments for NeMo's Megatron-Core plans)
FORMAT_ALSO_LAUNCHES: dict[str, tuple[str, ...]] = {"torchtitan": ("torchtitan-compile",),
                                                    "megatron": ("nemo",), "torchrun": ("nemo",),
                                                    "slurm": ("nemo",), "k8s": ("nemo",)}


def launch_framework(fmt: str, framework: str | None) -> str:
    """The profile ``fmt`` launches for a plan of ``framework`` (its own when the format can run
    that profile, else the format's)."""
    if framework is not None and framework in FORMAT_ALSO_LAUNCHES.get(fmt, ()):
        return framework
    return FORMAT_FRAMEWORK[fmt]


def framework_of_formats(formats: list[str]) -> str | None:
    """The one framework profile ``formats`` launch, or ``None`` when they launch several (the
    plan is then searched without that restriction and each format that cannot carry it is
    skipped with the reason)."""
    fws = {FORMAT_FRAMEWORK[f] for f in formats}
    return fws.pop() if len(fws) == 1 else None


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchSpec:
    """Everything an export needs: the plan and where it runs."""

    model: Model
    strategy: Strategy
    num_gpus: int
    gpus_per_node: int
    gpu: str = ""
    attention: str = "flash"
    cuda_graph_scope: str = "layer"  # Plan.cuda_graph_scope: what the strategy's CUDA graphs capture
    job_name: str = "train"
    steps: int | None = None  # optimizer steps to run (from a token budget), None = unknown
    time_limit_s: float | None = None  # expected wall time (Slurm --time), None = unset
    image: str = "nvcr.io/nvidia/pytorch:24.09-py3"
    megatron_path: str = "/opt/Megatron-LM"
    parameter_servers: ParameterServers | None = None  # dp_impl=parameter-server: the PS tasks
    framework: str | None = None  # the plan's profile (torchtitan-compile: the torchtitan format compiles)

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def procs_per_node(self) -> int:
        return min(self.gpus_per_node, self.num_gpus)


@dataclass(slots=True)
class Rendered:
    files: dict[str, str]
    warnings: list[str] = field(default_factory=list)


def format_framework(fmt: str, spec: LaunchSpec) -> str:
    """The framework profile ``fmt``'s files for ``spec`` launch: ``launch_framework`` of the
    plan's profile, except ``tensorflow``, whose strategy follows the plan
    (``planner.exports.tensorflow.profile_for``)."""
    if fmt == "tensorflow":
        from planner.exports.tensorflow import profile_for

        return profile_for(spec)
    return launch_framework(fmt, spec.framework)


def job_name(model: Model, num_gpus: int) -> str:
    """A DNS-1123 label (Kubernetes, Slurm-friendly) from the model name and GPU count."""
    base = re.sub(r"[^a-z0-9]+", "-", model.name.lower()).strip("-") or "model"
    return f"{base[:40].strip('-')}-{num_gpus}gpu"


def render(fmt: str, spec: LaunchSpec) -> Rendered:
    """``fmt``'s files for ``spec``; a plan the format's framework cannot run is refused
    (``InputError``), never written as a different one."""
    if fmt not in FORMATS:
        raise InputError("export", fmt, f"unknown format; known: {', '.join(FORMATS)}")
    try:
        check_supported(get_framework(format_framework(fmt, spec)), spec.strategy)
    except InfeasibleError as exc:
        raise InputError("export", fmt, f"cannot carry {exc.field}={exc.value}: {exc.message}; "
                         f"`planner recommend --export {fmt}` searches only plans it runs") from None
    if fmt == "megatron":
        from planner.exports.megatron import render_megatron

        return render_megatron(spec)
    if fmt == "torchtitan":
        from planner.exports.torchtitan import render_torchtitan

        return render_torchtitan(spec)
    if fmt == "deepspeed":
        from planner.exports.deepspeed import render_deepspeed

        return render_deepspeed(spec)
    if fmt in ("torchrun", "slurm", "k8s"):
        from planner.exports import launchers

        return {"torchrun": launchers.render_torchrun, "slurm": launchers.render_slurm,
                "k8s": launchers.render_k8s}[fmt](spec)
    if fmt == "tensorflow":
        from planner.exports.tensorflow import render_tensorflow

        return render_tensorflow(spec)
    raise InputError("export", fmt, f"unknown format; known: {', '.join(FORMATS)}")


def parse_formats(text: str) -> list[str]:
    """``megatron,slurm`` or ``all`` -> list of formats (InputError on unknown names)."""
    names = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    if not names:
        raise InputError("export", text, f"needs a format: {', '.join(FORMATS)} or all")
    if names == ["all"]:
        return list(FORMATS)
    for n in names:
        if n not in FORMATS:
            raise InputError("export", n, f"unknown format; known: {', '.join(FORMATS)}, all")
    return list(dict.fromkeys(names))


def write(fmt: str, spec: LaunchSpec, out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Write ``fmt``'s files into ``out_dir`` (created); returns (paths, warnings)."""
    rendered = render(fmt, spec)
    out = make_folder("out", out_dir)
    paths = []
    for name, text in rendered.files.items():
        p = write_text("out", out / name, text)
        if name.endswith(".sh") or name.endswith(".sbatch"):
            with writing("out", p):
                p.chmod(0o755)
        paths.append(p)
    return paths, rendered.warnings


def launchable(plan: Plan, framework: str) -> bool:
    """Whether the launch format of ``framework`` (``planner.exports.formats_of``, its own
    first) can state ``plan``: every recommended plan is one a user can launch as predicted.
    A framework without a format (none in the default profiles) is not held to it."""
    fmts = formats_of(framework)
    if not fmts:
        return True
    c = plan.cluster
    try:
        render(fmts[0], LaunchSpec(model=plan.model, strategy=plan.strategy, num_gpus=c.num_gpus,
                                   gpus_per_node=c.gpus_per_node, gpu=c.gpu.id, attention=plan.attention,
                                   cuda_graph_scope=plan.cuda_graph_scope))
    except InputError:
        return False
    return True
