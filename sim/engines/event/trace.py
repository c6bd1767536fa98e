"""The simulated step as Chrome trace-event JSON (opens in Perfetto and chrome://tracing).

One process per simulated unit, ``pid`` its representative rank, named with the ranks it
stands for (symmetric mode) or runs in lock-step with (explicit mode), one thread (``tid``) per stream: ``compute`` (passes, optimizer, waits),
``tp``/``cp``/``ep`` (exposed in-layer collectives), ``pp`` (pipeline sends), ``dp``
(gradient buckets, parameter gathers), ``dp-ag`` (ZeRO-3 all-gathers) and ``host`` (offload
copies over the host link).  Complete events
(``"ph": "X"``) in microseconds; format: the Trace Event Format document (Google, 2016).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from sim.base.jsonout import dumps
from sim.base.outpaths import write_text

if TYPE_CHECKING:  # the engine imports this module
    from sim.engines.event.engine import Engine, Entry

STREAMS: tuple[str, ...] = ("compute", "tp", "cp", "ep", "pp", "dp", "dp-ag", "host")


def trace_events(eng: Engine) -> dict[str, object]:
    """The trace as a JSON-ready dictionary."""
    sc = eng.sc
    s = sc.plan.strategy
    events: list[dict[str, object]] = []
    used: set[tuple[int, str]] = set()
    pid = [u.rep_rank for u in sc.units]
    for e in _entries(eng):
        used.add((e.unit, e.stream))
        ev: dict[str, object] = {"name": e.name, "cat": e.cat, "ph": "X", "ts": round(e.start * 1e6, 3),
                                 "dur": round((e.end - e.start) * 1e6, 3), "pid": pid[e.unit],
                                 "tid": STREAMS.index(e.stream)}
        if e.op or e.recompute_s:
            ev["args"] = {"op": e.op, **({"recompute_us": e.recompute_s * 1e6} if e.recompute_s else {})}
        events.append(ev)
    meta: list[dict[str, object]] = []
    for u in sc.units:
        if not sc.explicit:
            label = f"rank {u.rep_rank} (stage {u.stage}, stands for its {u.ranks.size} ranks)"
        elif u.ranks.size > 1:
            label = (f"rank {u.rep_rank} (stage {u.stage}, replica {u.replica}, ranks "
                     f"{int(u.ranks.min())}-{int(u.ranks.max())} in lock-step)")
        else:
            label = f"rank {u.rep_rank} (stage {u.stage}, replica {u.replica})"
        meta.append({"name": "process_name", "ph": "M", "pid": u.rep_rank, "args": {"name": label}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": u.rep_rank, "args": {"sort_index": u.index}})
        for tid, stream in enumerate(STREAMS):
            if (u.index, stream) in used or stream == "compute":
                meta.append({"name": "thread_name", "ph": "M", "pid": u.rep_rank, "tid": tid,
                             "args": {"name": stream}})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"strategy": s.to_string(), "model": sc.plan.model.name,
                          "mode": "explicit" if sc.explicit else "symmetric"}}


def _entries(eng: Engine) -> Iterable[Entry]:
    yield from eng.log
    yield from eng.comm_log()


def write_trace(path: str, eng: Engine) -> None:
    """Write the trace of ``eng``'s run to ``path`` (``InputError`` if it cannot be written)."""
    write_text("trace", path, dumps(trace_events(eng), compact=True))
