"""What-if perturbations the event engine can apply: stragglers, degraded links, uneven stages.

* ``Straggler(rank, slowdown_pct)``: every compute pass and the optimizer step of GPU ``rank``
  take ``1 + slowdown_pct / 100`` times as long.  Tensor/context/expert-parallel peers run in
  lock-step with it (their collectives every layer wait for it), so its whole lock-step group
  slows; data-parallel peers wait for it at the gradient reduction.
* ``SlowLink(target, slowdown_pct)``: the named links carry ``1 / (1 + slowdown_pct / 100)`` of
  their bandwidth (``100`` = half speed).  Targets: a tier (``scale-up``, ``host``,
  ``scale-out``: every link of it), ``gpu:N`` (GPU N's NVLink port and host edge), ``nic:N``,
  ``node:N`` (all NICs of node N), ``leaf:N`` (leaf switch N's uplinks).
* ``layers_per_stage``: transformer layers per pipeline stage (sums to the model's layers);
  the embedding stays on the first stage and the output layer and loss on the last, as in
  ``sim.cost.costs``.  Every per-stage piece (``sim.cost.step.StagePieces``: data-parallel, gather,
  optimizer, accumulation, FSDP copies, fp8 casts, overlap slowdown, HSDP sync, offload) is
  scaled by the stage's parameter count as the field declares (``StagePieces.rescaled``: their
  bandwidth terms are linear in it; the latency terms, a few microseconds, ride along; host
  synchronisations per pass do not scale); memory is still reported for the even split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sim.cost.costs import StageCost, StepCosts
from sim.base.errors import InputError
from sim.cost.plan import Plan

MAX_SLOWDOWN_PCT = 10_000.0


def _pct(field: str, text: str, whole: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InputError(field, whole, f"percentage {text!r} is not a number") from None
    if not math.isfinite(v) or v < 0 or v > MAX_SLOWDOWN_PCT:
        raise InputError(field, whole, f"percentage must be in [0, {MAX_SLOWDOWN_PCT:g}]")
    return v


@dataclass(frozen=True, kw_only=True, slots=True)
class Straggler:
    rank: int
    slowdown_pct: float

    @property
    def factor(self) -> float:
        return 1.0 + self.slowdown_pct / 100.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SlowLink:
    target: str
    slowdown_pct: float

    @property
    def capacity_factor(self) -> float:
        return 1.0 / (1.0 + self.slowdown_pct / 100.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class WhatIf:
    """Perturbations of one simulated step (module docstring).  Empty = the plan as is."""

    stragglers: tuple[Straggler, ...] = ()
    slow_links: tuple[SlowLink, ...] = ()
    layers_per_stage: tuple[int, ...] | None = None

    @property
    def empty(self) -> bool:
        return not self.stragglers and not self.slow_links and self.layers_per_stage is None

    def check(self, plan: Plan) -> None:
        """Raise ``InputError`` for a perturbation that does not fit ``plan``."""
        s = plan.strategy
        for st in self.stragglers:
            if not 0 <= st.rank < s.num_gpus:
                raise InputError("straggler", f"{st.rank}:{st.slowdown_pct:g}",
                                 f"rank must be in [0, {s.num_gpus})")
        if self.layers_per_stage is not None:
            lps = self.layers_per_stage
            text = ",".join(map(str, lps))
            if s.pipeline_layout is not None:
                raise InputError("layers-per-stage", text, "the strategy's pipeline layout already places every "
                                 "layer (change the layout instead)")
            if len(lps) != s.pp:
                raise InputError("layers-per-stage", text, f"needs pp={s.pp} entries, got {len(lps)}")
            if sum(lps) != plan.model.num_layers:
                raise InputError("layers-per-stage", text,
                                 f"must sum to num_layers={plan.model.num_layers}, got {sum(lps)}")
            if s.vp > 1 and any(n % s.vp for n in lps):
                raise InputError("layers-per-stage", text, f"every entry must be divisible by vp={s.vp}")

    def as_dict(self) -> dict[str, object]:
        return {"stragglers": [{"rank": x.rank, "slowdown_pct": x.slowdown_pct} for x in self.stragglers],
                "slow_links": [{"target": x.target, "slowdown_pct": x.slowdown_pct} for x in self.slow_links],
                "layers_per_stage": list(self.layers_per_stage) if self.layers_per_stage else None}


def parse_straggler(text: str) -> Straggler:
    """``RANK:PCT``, e.g. ``17:20`` (GPU 17 computes 20% slower)."""
    rank, sep, pct = str(text).strip().partition(":")
    if not sep or not rank.strip().isdigit():
        raise InputError("straggler", text, "expected RANK:PCT, e.g. 17:20")
    return Straggler(rank=int(rank), slowdown_pct=_pct("straggler", pct.strip(), text))


def parse_slow_link(text: str) -> SlowLink:
    """``TARGET:PCT``, e.g. ``node:3:100`` or ``scale-out:50`` (see module docstring)."""
    target, sep, pct = str(text).strip().rpartition(":")
    target = target.strip().lower()
    if not sep or not target:
        raise InputError("slow-link", text, "expected TARGET:PCT, e.g. node:3:100 or scale-out:50")
    kind, _, num = target.partition(":")
    tiers = ("scale-up", "host", "scale-out")
    if not ((kind in tiers and not num) or (kind in ("gpu", "nic", "node", "leaf") and num.isdigit())):
        raise InputError("slow-link", text, "target must be scale-up, host, scale-out, gpu:N, nic:N, node:N or leaf:N")
    return SlowLink(target=target, slowdown_pct=_pct("slow-link", pct.strip(), text))


def parse_layers_per_stage(text: str) -> tuple[int, ...]:
    """``8,12,12,8``: transformer layers of each pipeline stage."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p.isdigit() for p in parts):
        raise InputError("layers-per-stage", text, "expected comma-separated layer counts, e.g. 22,26,26,22")
    out = tuple(int(p) for p in parts)
    if any(n < 1 for n in out):
        raise InputError("layers-per-stage", text, "every stage needs at least one layer")
    return out


def apply_layers_per_stage(costs: StepCosts, counts: tuple[int, ...]) -> StepCosts:
    """Re-split the costed layers of ``costs`` into stages of ``counts`` layers (docstring)."""
    layers: list[tuple[int, object]] = []
    for st in costs.stages:
        layers += list(zip(st.layers, st.layer_costs))
    layers.sort(key=lambda x: x[0])
    assert sum(counts) == len(layers) and len(counts) == len(costs.stages)
    out: list[StageCost] = []
    start = 0
    for st, n in zip(costs.stages, counts):
        mine = layers[start:start + n]
        start += n
        old = sum(c.params for c in st.layer_costs)
        new = sum(c.params for _, c in mine)  # type: ignore[attr-defined]
        params = max(st.params - old + new, 0.0)
        scale = params / st.params if st.params > 0 else 1.0
        out.append(replace(st, layers=tuple(i for i, _ in mine), layer_costs=tuple(c for _, c in mine),  # type: ignore[misc]
                           params=params, pieces=st.pieces.rescaled(scale)))
    return replace(costs, stages=tuple(out))
