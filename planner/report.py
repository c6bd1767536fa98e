"""What every entry point reports for a priced run: the same JSON and the same words.

``run_choices`` reads the run flags (``--framework``, ``--calibration``, ``--attention``,
``--recompute-policy``, ``--moe-*``) into ``sim.engines.run.RunChoices``; ``priced`` turns a resolved
run and its ``StepResult`` into the JSON ``planner simulate --json`` prints (the number to plan
with and its band from ``planner.fitting.uncertainty``, the framework that runs it, the run's notes),
which ``planner tco``, ``planner recommend`` and the app report too; ``mfu_text`` says MFU the
one way the text outputs say it; ``simulate_command`` is the ``planner simulate`` line that
reproduces a run.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Mapping, Sequence

from sim.engines.result import StepResult
from sim.engines.run import Run, RunChoices

from planner.plans.explain import bound
from planner.commands.ps_args import ps_from_args
from planner.fitting.uncertainty import above_published_note, band_for, headline


def run_choices(args: argparse.Namespace, *, framework: str | None = None) -> RunChoices:
    """The run flags of ``args`` (absent ones: the framework's); ``framework`` when given
    stands for ``--framework``."""
    return RunChoices(framework=framework if framework is not None else getattr(args, "framework", None),
                      calibration=getattr(args, "calibration", None), attention=getattr(args, "attention", None),
                      selective_policy=getattr(args, "recompute_policy", None),
                      moe_imbalance=getattr(args, "moe_imbalance", None),
                      moe_dispatcher=getattr(args, "moe_dispatcher", None), nccl=getattr(args, "nccl", None),
                      parameter_servers=ps_from_args(args) if hasattr(args, "ps_placement") else None)


def priced(run: Run, result: StepResult) -> dict[str, object]:
    """The JSON of a priced run (docs/interface.md ``planner simulate``): the step result with
    the calibrated estimate as ``step_time_s`` inside its band, the model's own step as
    ``model_step_time_s``, the framework profile that runs it, the one verdict on what bounds
    it (``bound_by``, ``planner.plans.explain.bound``: the verdict ``recommend`` explains), and one
    warning each for the run's notes and an MFU above every published run like it."""
    plan, cluster = run.plan, run.plan.cluster
    cal = run.calibration.id if run.calibration is not None else None
    out = headline(result.to_dict(), band_for(plan, run.framework.id, calibration=cal))
    out.update({"model": plan.model.name, "gpu": cluster.gpu.id, "nic": cluster.nic.id, "topology": cluster.topology,
                "framework": run.framework.id if run.runnable else None, "attention": plan.attention,
                "attention_kernel": plan.attention_kernel, "model_states_layout": plan.model_states_layout,
                "nvls": plan.nvls, "nccl": plan.nccl_release, "nvls_multinode": plan.nvls_multinode, "fsdp_experts_unit": plan.fsdp_experts_unit,
                "fp8_recipe": plan.strategy.fp8_recipe if plan.strategy.precision == "fp8" else None,
                "fp8_cast_kernels": plan.fp8_cast_kernels if plan.strategy.precision == "fp8" else None,
                "rope_kernels": plan.rope_kernels,
                "cuda_graph_scope": plan.cuda_graph_scope if plan.strategy.cuda_graphs else None,
                "bound_by": bound(out)[0]})
    warnings = list(run.notes) + list(out["warnings"])  # type: ignore[arg-type]
    precision = "bf16" if plan.strategy.precision == "fp16" else plan.strategy.precision
    note = above_published_note(float(out["mfu"]), cluster.gpu.architecture or "unknown", precision)  # type: ignore[arg-type]
    if note:
        warnings.append(note)
    out["warnings"] = warnings
    if run.calibration is not None and not run.calibration.host_bandwidth.empty:
        out["host_bandwidth"] = run.calibration.host_bandwidth.as_dict()  # measured host rates (docs/interface.md)
    return out


def mfu_text(out: Mapping[str, object]) -> str:
    """MFU as the text outputs show it: against the bf16 peak (the convention Megatron, NeMo and
    torchtitan print); fp8 plans against the fp8 peak too, each labelled; never above 100%
    (a figure above the peak is shown as a multiple of it)."""
    def pct(x: float) -> str:
        return f"{x:.1%}" if x <= 1.0 else f"{x:.2f}x the peak (above 100%: not an MFU)"

    mfu = float(out["mfu"])  # type: ignore[arg-type]
    if out.get("precision") != "fp8":
        return pct(mfu)
    return f"{pct(float(out['mfu_of_precision_peak']))} of the fp8 peak, {pct(mfu)} of the bf16 peak"  # type: ignore[arg-type]


def simulate_command(*, model: str, cluster_flags: Sequence[str], strategy: str, run: Run,
                     engine: str = "analytic") -> str:
    """The ``planner simulate`` line that resolves and prices the same run."""
    parts = ["planner", "simulate", "--model", model, *cluster_flags, "--strategy", strategy, "--engine", engine,
             *run.flags()]
    return " ".join(shlex.quote(str(p)) for p in parts)
