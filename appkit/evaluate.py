"""One design -> the plans, the chosen plan's step, and time and cost to train.

``evaluate`` is pure (same design, same answer) so the app caches it per design; it raises
``InputError`` for bad input and returns what it could not do (no recommendation next to a
fixed strategy, a design ``planner tco`` cannot cost) as ``notes`` rather than failing.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from planner.report import priced, simulate_command
from appkit import engines
from appkit.design import Design, cluster_of
from sim.base.errors import InputError
from sim.cost.plan import Plan, parse_strategy
from sim.engines.run import Run, RunChoices, resolve
from sim.engines.simulate import simulate_run
from sim.data.hardware import Cluster
from sim.data.specs import Strategy

DEFAULT_TOP = 5


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What the app shows for one design.

    ``plans`` are simulate JSON objects (``StepResult.to_dict()`` keys), best first, each
    with ``strategy`` and ``source`` (``recommended`` or ``yours``); ``economics`` has
    ``time_to_train_s`` and ``cost_to_train_usd`` (``None`` without a price) and ``method``.
    """

    design: Design
    cluster: Cluster
    plans: tuple[dict[str, Any], ...]
    search: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def has_plans(self) -> bool:
        return bool(self.plans)


def fixed_strategy_text(design: Design) -> str:
    """The user's STRATEGY string, with the sidebar's global batch unless the string sets it
    (the sequence length is the sidebar's unless the string sets ``seq``)."""
    assert design.strategy is not None
    text = design.strategy.strip()
    keys = {p.partition("=")[0].strip().lower() for p in text.split(",") if p.strip()}
    if design.gbs is not None and not keys & {"gbs", "global_batch"}:
        text += f",gbs={design.gbs}"
    return text


def fixed_strategy(design: Design, cluster: Cluster) -> Strategy:
    """The user's STRATEGY (``fixed_strategy_text``) as parsed, before its framework completes it
    (``evaluate`` prices it with the sidebar's framework, ``run_of``)."""
    return parse_strategy(fixed_strategy_text(design), num_gpus=cluster.num_gpus, seq_len=design.seq_len)


def run_of(design: Design, cluster: Cluster, strategy: str, framework: str | None = None) -> Run:
    """The resolved run of a STRATEGY string on the design (``sim.engines.run.resolve``, as ``planner
    simulate`` resolves it): ``framework`` None picks the first default profile that runs it."""
    return resolve(design.model, cluster, strategy, RunChoices(framework=framework), seq_len=design.seq_len)


def simulate_strategy(design: Design, cluster: Cluster, strategy: str, framework: str | None = None
                      ) -> dict[str, Any]:
    """Analytic simulate JSON of one strategy on the design (``planner simulate --engine
    analytic --json``: the calibrated estimate, its band, the framework that runs it)."""
    run = run_of(design, cluster, strategy, framework)
    return priced(run, simulate_run(run, engine="analytic"))


def _complete(design: Design, cluster: Cluster, plan: Mapping[str, Any]) -> dict[str, Any]:
    """A recommender plan with every simulate key (re-simulated analytically when it lacks
    the memory or breakdown detail the charts draw)."""
    p = dict(plan)
    need = ("breakdown", "memory", "step_time_s", "tokens_per_s", "mfu")
    if all(k in p for k in need) and isinstance(p.get("memory"), Mapping):
        return p
    full = simulate_strategy(design, cluster, str(p["strategy"]), p.get("framework"))
    full.update({k: v for k, v in p.items() if k not in full})
    return full


def recommendation(design: Design, cluster: Cluster, *, top: int = DEFAULT_TOP,
                   progress: Callable[[str], None] | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(``planner recommend`` output for the design, or ``None`` with the reason): the search
    ``recommend_command`` prints.

    Depends only on ``design.recommend_key()`` (model, cluster, sequence length, global batch,
    precisions, framework, memory headroom), so the app caches it apart from the token budget,
    pricing and a fixed strategy.  ``progress`` gets each phase's name.  Raises ``InputError``
    for input the recommender rejects."""
    return engines.recommend(design.model, cluster, gbs=design.gbs, seq_len=design.seq_len, top=top,
                             rerank=design.rerank, precisions=design.precisions, framework=design.framework,
                             memory_headroom=design.memory_headroom, progress=progress), None


def evaluate(design: Design, *, top: int = DEFAULT_TOP,
             rec: tuple[dict[str, Any] | None, str | None] | None = None) -> Evaluation:
    """Plans for ``design``: the fixed strategy (if any) first, then the recommender's.

    ``rec`` is a precomputed ``recommendation(design, ...)`` (the app passes its cached one)."""
    t0 = time.perf_counter()
    cluster = cluster_of(design)
    timings = {"cluster_s": time.perf_counter() - t0}
    notes: list[str] = []
    plans: list[dict[str, Any]] = []
    search: dict[str, Any] = {}
    if design.strategy is not None:
        t = time.perf_counter()
        mine = simulate_strategy(design, cluster, fixed_strategy_text(design), design.framework)
        mine["source"] = "yours"
        plans.append(mine)
        timings["simulate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out: dict[str, Any] | None
    if rec is None:
        try:
            out, note = recommendation(design, cluster, top=top)
        except InputError as exc:
            if design.strategy is None:
                raise
            out, note = None, f"no recommendation: {exc}"
    else:
        out, note = rec
    if note:
        notes.append(note)
    timings["recommend_s"] = time.perf_counter() - t
    if out is not None:
        search = {k: v for k, v in out.items() if k != "plans"}
        seen = {p["strategy"] for p in plans}
        for p in out.get("plans", [])[:top]:
            if p.get("strategy") in seen:
                continue
            full = _complete(design, cluster, p)
            full["source"] = "recommended"
            plans.append(full)
    timings["total_s"] = time.perf_counter() - t0
    return Evaluation(design=design, cluster=cluster, plans=tuple(plans), search=search, notes=tuple(notes),
                      timings_s=timings)


def plan_of(design: Design, cluster: Cluster, plan: Mapping[str, Any]) -> Plan:
    """The ``Plan`` behind a plan row: its STRATEGY string resolved with its framework."""
    return run_of(design, cluster, str(plan["strategy"]), plan.get("framework")).plan


def economics_of(design: Design, cluster: Cluster, plan: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(time/cost to train the design's token budget, a note when the estimate is the simple one)."""
    tokens = design.token_budget
    try:
        eco = engines.economics(design.model, cluster, str(plan["strategy"]), framework=plan.get("framework"),
                                seq_len=design.seq_len, tokens=tokens, pricing=design.pricing)
        note = None
        if eco.get("pricing") != design.pricing:
            note = f"{cluster.gpu.id} has no purchase price in the catalogs: costed at cloud prices"
        return eco, note
    except InputError as exc:  # e.g. no price at all for this GPU: time still counts
        return (engines.simple_economics(cluster, plan, tokens=tokens),
                f"planner tco could not cost this design ({exc}); showing GPU-hours x price only")


def result_document(ev: Evaluation, plan: Mapping[str, Any], economics: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON the app hands off: the design as built (defaults resolved), the chosen plan
    (simulate JSON), time/cost to train, every plan shown and the search summary."""
    c, d = ev.cluster, ev.design
    return {
        "design": {"model": d.model.name, "model_ref": d.model_ref, "gpu": c.gpu.id, "num_gpus": c.num_gpus,
                   "gpus_per_node": c.gpus_per_node, "nvlink_domain": c.nvlink_domain, "nic": c.nic.id,
                   "nics_per_node": c.nics_per_node, "topology": c.topology,
                   "oversubscription": c.oversubscription, "seq_len": d.seq_len, "gbs": d.gbs,
                   "token_budget": d.token_budget, "framework": d.framework,
                   "precisions": list(ev.search.get("precisions_searched") or d.precisions or [c.gpu.default_precision]),
                   "memory_headroom": (ev.search.get("memory_headroom") or {}).get("fraction", d.memory_headroom)},
        "plan": dict(plan),
        "economics": dict(economics),
        "plans": [dict(p) for p in ev.plans],
        "search": dict(ev.search),
    }


def cluster_flags(ev: Evaluation) -> list[str]:
    """The cluster as CLI flags, every default spelled out (``--nvlink-domain`` and
    ``--nics-per-node`` for NVLink parts; a PCIe card's ``--server`` and ``--p2p``: its node is
    its scale-up domain, and the CLI refuses ``--nvlink-domain`` for it)."""
    c = ev.cluster
    flags = ["--gpu", c.gpu.id, "--num-gpus", str(c.num_gpus), "--gpus-per-node", str(c.gpus_per_node)]
    if c.server is None:
        flags += ["--nvlink-domain", str(c.nvlink_domain), "--nics-per-node", str(c.nics_per_node)]
    else:
        flags += ["--server", c.server.design] if c.server.design != "custom" else []
        flags += ["--p2p", c.server.p2p]
    return flags + ["--nic", c.nic.id, "--topology", c.topology, "--oversubscription", f"{c.oversubscription:g}",
                    "--seq-len", str(ev.design.seq_len)]


def cli_command(ev: Evaluation, plan: Mapping[str, Any], *, catalog_model: bool) -> str:
    """The ``planner simulate`` command line that reproduces ``plan`` exactly: every cluster
    default spelled out (``cluster_flags``), the plan's STRATEGY string (its precision
    included), the engine that timed it (``event`` for the plans the recommender re-ranked,
    else ``analytic``) and the plan's framework (``Run.flags``: its run, ``sim.engines.run.resolve``,
    is the one the app priced, fp8 recipe included)."""
    d = ev.design
    run = run_of(d, ev.cluster, str(plan["strategy"]), plan.get("framework"))
    engine = "event" if plan.get("engine") == "event" else "analytic"
    return simulate_command(model=d.model_ref if catalog_model else "MODEL_FILE", cluster_flags=cluster_flags(ev),
                            strategy=str(plan["strategy"]), run=run, engine=engine)


def recommend_command(ev: Evaluation, *, catalog_model: bool, top: int = DEFAULT_TOP) -> str:
    """The ``planner recommend`` command line that runs the search the app ran
    (``recommendation``): the same cluster, global batch, searched precisions
    (``--precision``), framework, memory headroom and re-ranking; a flag the app left at its
    default is left out, so the CLI's default applies, as it did in the app."""
    d = ev.design
    flags = ["planner", "recommend", "--model", d.model_ref if catalog_model else "MODEL_FILE", *cluster_flags(ev)]
    if d.gbs is not None:
        flags += ["--gbs", str(d.gbs)]
    if d.precisions is not None:
        flags += ["--precision", ",".join(d.precisions)]
    if d.framework is not None:
        flags += ["--framework", d.framework]
    if d.memory_headroom is not None:
        flags += ["--memory-headroom", f"{d.memory_headroom:g}"]
    if not d.rerank:
        flags += ["--rerank", "0"]
    if top != 5:
        flags += ["--top", str(top)]
    return " ".join(shlex.quote(f) for f in flags)
