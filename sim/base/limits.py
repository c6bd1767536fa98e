"""The documented limits of the tool, and the one check that refuses work beyond them.

Costs that grow with the input are bounded here, so that every command answers within about a
minute on a 2-core machine for inputs inside the limits, and refuses what lies beyond with the
limit named (``InputError``: exit status 2, one line) instead of running for minutes without
output.  The limits are properties of this tool (how much work it does per second), not of
hardware, so they live in code; docs/interface.md ("Limits") lists them for users.

Each bounded cost is *estimated* from the input before the work starts (``work`` below is
counted in the unit the cost grows with, measured on the project's 2-core machine under load):

* ``MAX_LAYERS``: transformer layers of a model.  The cost model is linear in the layer count
  (per-layer pieces of the event engine, stage shapes, memory per layer); 2^16 covers every
  published model (the deepest dense transformer trained at scale, DeepNet, has 1,000 layers)
  by a factor of 65.
* ``MAX_CLUSTER_GPUS``: GPUs of a cluster.  The network model is linear in the GPU count
  (every GPU, NIC and link is an array entry): on 2^20 GPUs (the largest clusters announced)
  ``simulate`` takes 14 s with the analytic engine and 28 s (3.3 GB) with the event engine;
  ``recommend``, which routes every group shape of its search, reports its progress.
* ``EVENT_MAX_PIECES``: pieces (a layer or a whole model chunk of one pass on one unit) the
  event engine schedules for one step (``sim.engines.event.scenario.event_pieces``).  It runs 6,000 to
  20,000 pieces per second on that machine under load (each piece is a few simpy events, its
  flows and a log entry; 200,000 pieces: 24-32 s at a load of 9), so half a million take about
  a minute; the analytic engine prices the same step by its closed forms in milliseconds.
* ``CAMPAIGN_MAX_EVENTS``: simpy events of the Monte-Carlo goodput campaigns (checkpoints,
  failures, spares, repairs: ``planner.economics.campaign.campaign_events``), summed over the
  seeds: 60,000 to 440,000 per second measured under load, so 4 million take under a minute.
"""

from __future__ import annotations

from sim.base.errors import InputError

MAX_LAYERS = 1 << 16
MAX_CLUSTER_GPUS = 1 << 20
EVENT_MAX_PIECES = 500_000
CAMPAIGN_MAX_EVENTS = 4_000_000
SCHEDULE_MAX_WORK = 100_000_000


def check_work(field: str, value: object, work: float, limit: float, *, unit: str, hint: str) -> None:
    """Refuse ``work`` (estimated in ``unit``) above ``limit``: an ``InputError`` on ``field``
    that names the estimate, the limit and what to change (``hint``)."""
    if work > limit:
        raise InputError(field, value, f"would take {work:,.0f} {unit} (limit {limit:,.0f}, about a minute on "
                                       f"2 cores; docs/interface.md Limits): {hint}")
