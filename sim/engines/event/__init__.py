"""The discrete-event engine (simpy): pipeline schedules, overlap, contention, what-ifs, traces.

``simulate_event(plan, ...)`` is the entry point; see docs/event_engine.md.
"""

from sim.engines.event.engine import simulate_event
from sim.engines.event.whatif import SlowLink, Straggler, WhatIf

__all__ = ["simulate_event", "WhatIf", "Straggler", "SlowLink"]
