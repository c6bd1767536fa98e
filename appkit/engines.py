"""The app's calls into the planner: recommender, event engine, economics, launch configs.

Thin adapters that turn the planner's results into the JSON-like dicts the app shows.  The
one estimate made here is ``simple_economics`` (GPU-hours x the catalog's on-demand price),
for a design ``planner tco`` cannot cost (no price at all), labelled as such.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from typing import Any, Callable, Mapping

from planner.economics.tco import TcoOptions, compute_tco
from planner.exports import FORMATS, LaunchSpec, job_name, render
from planner.plans.recommend import Settings, recommend as planner_recommend
from planner.plans.search import SearchSpace
from sim.data.conventions import default_global_batch
from sim.base.errors import InputError
from sim.cost.plan import Plan
from sim.engines.run import RunChoices
from sim.engines.simulate import simulate
from sim.data.hardware import Cluster
from sim.data.specs import Model


# --------------------------------------------------------------------------- recommender

def recommend(model: Model, cluster: Cluster, *, gbs: int | None, seq_len: int, top: int,
              rerank: bool = True, precisions: tuple[str, ...] | None = None, framework: str | None = None,
              memory_headroom: float | None = None, progress: Callable[[str], None] | None = None
              ) -> dict[str, Any]:
    """Best plans for the design, as ``planner recommend --json``: ``plans`` (best first, each
    with ``strategy`` and the simulate keys), ``candidates_evaluated``, ``search_time_s``,
    ``rejected`` (per reason), ``explanation`` and, when nothing fits, ``suggestions``.
    ``rerank=False`` ranks with the analytic model only (``planner recommend --rerank 0``);
    ``precisions`` are the training precisions searched (``--precision``; ``None``: the GPU's
    own, bf16 or fp16, as without the flag: fp8 changes numerics and is searched only when
    asked for); ``framework`` a profile of ``catalogs/frameworks.yaml`` (``--framework``; the
    search then holds only plans it runs); ``memory_headroom`` the fraction of GPU memory a plan
    keeps free (``--memory-headroom``; ``None``: the memory model's measured error);
    ``progress`` is called with each phase's name as it starts.  The search space is the one
    ``planner recommend`` builds from these flags (``planner.commands.cmd_recommend.space_from_args``)."""
    space = SearchSpace(precision=tuple(precisions) if precisions is not None else None)
    res = planner_recommend(model, cluster, gbs=gbs if gbs is not None else default_global_batch(seq_len), seq_len=seq_len,
                            top=top, rerank=None if rerank else 0, space=space,
                            settings=Settings.from_framework(framework), memory_headroom=memory_headroom,
                            progress=progress)
    return res.to_dict()


# --------------------------------------------------------------------------- event engine


def event_trace(plan: Plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """Simulate ``plan`` with the event engine; return (its result JSON, the Chrome trace)."""
    fd, path = tempfile.mkstemp(prefix="planner-trace-", suffix=".json")
    os.close(fd)
    try:
        result = simulate(plan, engine="event", trace_path=path)
        with open(path, encoding="utf-8") as fh:
            trace = json.load(fh)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return result.to_dict(), trace


# --------------------------------------------------------------------------- economics

PRICINGS: tuple[str, ...] = ("owned", "cloud")


def economics(model: Model, cluster: Cluster, strategy: str, *, framework: str | None, seq_len: int | None,
              tokens: float, pricing: str = "owned") -> dict[str, Any]:
    """Time and cost to train ``tokens`` with a STRATEGY string under ``framework``, resolved as
    ``planner tco --strategy`` resolves it (``planner tco --json`` keys: ``time_to_train_s``
    with failures and its band, ``cost_to_train_usd``, ``capex_usd``, ``power_w`` ...).

    ``pricing='owned'`` needs a GPU purchase price; without one the cloud price is used and
    ``pricing`` in the answer says so."""
    choices = RunChoices(framework=framework)

    def tco(p: str):
        return compute_tco(model, cluster, strategy=strategy, seq_len=seq_len, choices=choices,
                           options=TcoOptions(tokens=tokens, pricing=p))
    try:
        res = tco(pricing)
    except InputError as exc:
        if pricing != "owned" or not str(exc.field).startswith("gpu-price"):
            raise
        res = tco("cloud")
    return res.as_dict()


def simple_economics(cluster: Cluster, result: Mapping[str, Any], *, tokens: float) -> dict[str, Any]:
    """Time to train = tokens / throughput; cost = GPU-hours x the catalog's on-demand price
    per GPU-hour (no failures, no power, no network capex).  Used only for a design
    ``planner tco`` cannot cost, and labelled so."""
    tps = float(result["tokens_per_s"])
    time_s = tokens / tps if tps > 0 else float("inf")
    price = cluster.gpu.price_usd_per_hour
    gpu_hours = cluster.num_gpus * time_s / 3600.0
    return {
        "time_to_train_s": time_s,
        "cost_to_train_usd": gpu_hours * price if price is not None else None,
        "gpu_hours": gpu_hours,
        "price_usd_per_gpu_hour": price,
        "tokens": tokens,
        "method": "simple: tokens / throughput; GPU-hours x on-demand price (catalogs/gpus.yaml)",
    }


# --------------------------------------------------------------------------- exports


def export_files(plan: Plan, *, steps: int | None = None, time_limit_s: float | None = None
                 ) -> tuple[dict[str, bytes], list[str]]:
    """Launch configs of ``plan`` in every format ``planner.exports`` renders:
    (``format/file name`` -> bytes, warnings about what a tool cannot express)."""
    c = plan.cluster
    spec = LaunchSpec(model=plan.model, strategy=plan.strategy, num_gpus=c.num_gpus, gpus_per_node=c.gpus_per_node,
                      gpu=c.gpu.id, attention=plan.attention, cuda_graph_scope=plan.cuda_graph_scope,
                      job_name=job_name(plan.model, c.num_gpus),
                      steps=steps, time_limit_s=time_limit_s)
    files: dict[str, bytes] = {}
    warnings: list[str] = []
    for fmt in FORMATS:
        try:
            out = render(fmt, spec)
        except InputError as exc:  # the format's framework cannot run this plan: not written, said why
            warnings.append(f"{fmt}: not exported: {exc.message}")
            continue
        for name, text in out.files.items():
            files[f"{fmt}/{name}"] = text.encode("utf-8")
        warnings += [f"{fmt}: {w}" for w in out.warnings]
    return files, warnings


def zip_bytes(files: Mapping[str, bytes]) -> bytes:
    """A zip archive of ``files`` (name -> content), deterministic order."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, files[name])
    return buf.getvalue()
