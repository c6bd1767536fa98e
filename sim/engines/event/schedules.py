"""Pipeline schedules as per-stage orderings of forward and backward passes.

An op is ``(phase, microbatch, chunk)`` with ``phase`` ``"F"`` or ``"B"``; stage ``i``'s chunk
``c`` is virtual stage ``c * p + i`` (Megatron-LM's interleaved layout).  The engine runs each
stage's list in order, every op as soon as its input has arrived; the bubble then follows from
the ordering instead of a closed form.

* ``gpipe`` (Huang et al. 2019): all forwards, then all backwards.
* ``1f1b`` (PipeDream-Flush; Narayanan et al. 2021, Sec. 2.2.1): ``min(p - i - 1, m)`` warm-up
  forwards on stage ``i``, then alternate one forward and one backward, then the remaining
  backwards.
* ``interleaved`` (Narayanan et al. 2021, Sec. 2.2.2), exactly as Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``: warm-up ``2 (p - i - 1) + (v - 1) p``
  forward chunk-passes (all of them when ``m == p``); virtual micro-batch ``k`` is chunk
  ``(k mod pv) // p`` (reversed for backward) of micro-batch ``(k // pv) p + k mod p``.
* ``zero-bubble`` (ZB-H1; Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 3): the
  1F1B (or interleaved) order of ``F`` and ``B`` where ``B`` computes only input gradients; the
  weight-gradient passes ``W`` are not in the list: the engine runs them whenever the next
  ``F``/``B`` is not ready yet, or when more than ``w_limit(p, i, v)`` are pending (ZB-H1's
  memory bound: no more in-flight activations than 1F1B).
"""

from __future__ import annotations

from sim.base.errors import InfeasibleError, InputError
from sim.cost.interleave import Op, interleaved_order as _interleaved
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zero-bubble")


def _check(p: int, m: int, v: int) -> None:
    for name, x in (("pp", p), ("microbatches", m), ("vp", v)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise InputError(name, x, "must be an integer >= 1")


def stage_order(schedule: str, p: int, m: int, v: int, stage: int) -> list[Op]:
    """The ordered ``F``/``B`` passes of ``stage`` (0-based) for ``m`` micro-batches."""
    _check(p, m, v)
    if schedule not in SCHEDULES:
        raise InputError("schedule", schedule, f"must be one of {', '.join(SCHEDULES)}")
    if not 0 <= stage < p:
        raise InputError("stage", stage, f"must be in [0, {p})")
    if schedule == "gpipe":
        if v != 1:
            raise InputError("vp", v, "gpipe has one chunk per stage")
        return [("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)]
    if v > 1 and m % p:
        raise InfeasibleError("indivisible", "gbs", m,
                              f"{schedule} with vp={v} needs micro-batches ({m}) divisible by pp={p}")
    return _interleaved(p, m, v, stage)


def w_limit(p: int, stage: int, v: int) -> int:
    """Most weight-gradient passes ZB-H1 lets stage ``stage`` defer (its 1F1B in-flight count)."""
    return max(1, (p - stage) * v)


def schedule_orders(schedule: str, p: int, m: int, v: int) -> list[list[Op]]:
    return [stage_order(schedule, p, m, v, i) for i in range(p)]


def flushed_orders(schedule: str, p: int, m: int, v: int, flushes: int = 1) -> list[list[Op]]:
    """Each stage's passes when a step runs ``flushes`` schedules back to back, each over
    ``m / flushes`` micro-batches with its own fill and drain (``Plan.pipeline_flushes``: NeMo
    Automodel calls ``schedule.step`` once per gradient-accumulation step); micro-batches are
    numbered on across the schedules.  Under zero-bubble the engine may run a schedule's deferred
    ``W`` passes while the next one fills, which the closed form (``sim.cost.step.compose``) does not."""
    if flushes == 1 or p == 1:
        return schedule_orders(schedule, p, m, v)
    one = m // flushes
    if one * flushes != m:
        raise InfeasibleError("indivisible", "pipeline_flushes", flushes,
                              f"{m} micro-batches do not split into {flushes} pipeline schedules")
    orders = schedule_orders(schedule, p, one, v)
    return [[(ph, mb + f * one, c) for f in range(flushes) for ph, mb, c in order] for order in orders]
