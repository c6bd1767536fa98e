"""One entry point for both engines: ``simulate_run(run, engine=...)`` for a resolved run
(``sim.engines.run``), ``simulate(plan, engine=...)`` for a plan built by hand."""

from __future__ import annotations

from dataclasses import replace

from sim.engines.analytic import simulate_analytic
from sim.layers.compute import KernelEfficiency
from sim.engines.dataparallel import simulate_dataparallel
from sim.base.errors import InputError
from sim.engines.event.engine import simulate_event
from sim.engines.event.whatif import WhatIf
from sim.net.network import Network
from sim.engines.parameter_server import simulate_parameter_server
from sim.cost.plan import Plan
from sim.engines.result import StepResult
from sim.engines.run import Run, calibrated

ENGINES: tuple[str, ...] = ("analytic", "event")


def simulate(plan: Plan, *, engine: str = "analytic", trace_path: str | None = None,
             calibration: str | None = None, whatif: WhatIf | None = None,
             explicit_ranks: bool = False) -> StepResult:
    """Predict one training step.  ``engine="event"`` runs the simpy discrete-event engine
    (``sim.engines.event``), which alone takes ``whatif`` (stragglers, slow links, uneven stages),
    ``explicit_ranks`` (every data-parallel replica simulated) and ``trace_path``.
    ``calibration`` (a profile file or name, ``sim.cost.calibration``) replaces the catalog's
    hardware and efficiency with a measured machine's.  ``dp_impl=dataparallel`` is priced by
    ``sim.engines.dataparallel`` (closed form, next to the DDP step) and ``dp_impl=parameter-server`` by
    ``sim.engines.parameter_server`` (asynchronous, next to the all-reduce step) under either engine.  Entry points
    resolve their run with ``sim.engines.run.resolve`` and call ``simulate_run``; this form prices a
    ``Plan`` built by hand (tests, fits, the event engine's what-ifs)."""
    _check_engine(engine, trace_path, whatif, explicit_ranks)
    plan, eff, net_kwargs, _ = calibrated(plan, calibration)
    net = Network(plan.cluster, **net_kwargs)  # type: ignore[arg-type]
    return _simulate(plan, net=net, eff=eff, engine=engine, trace_path=trace_path, whatif=whatif,
                     explicit_ranks=explicit_ranks)


def simulate_run(run: Run, *, engine: str = "analytic", trace_path: str | None = None,
                 whatif: WhatIf | None = None, explicit_ranks: bool = False) -> StepResult:
    """``simulate`` of a resolved run (``sim.engines.run.resolve``: framework, calibration and overrides
    already applied): the call every entry point makes."""
    _check_engine(engine, trace_path, whatif, explicit_ranks)
    return _simulate(run.plan, net=run.network(), eff=run.eff, engine=engine, trace_path=trace_path,
                     whatif=whatif, explicit_ranks=explicit_ranks)


def _check_engine(engine: str, trace_path: str | None, whatif: WhatIf | None, explicit_ranks: bool) -> None:
    if engine not in ENGINES:
        raise InputError("engine", engine, f"must be one of {', '.join(ENGINES)}")
    if engine != "event" and (explicit_ranks or (whatif is not None and not whatif.empty)):
        raise InputError("engine", engine, "what-ifs and --explicit-ranks need --engine event")
    if engine != "event" and trace_path is not None:
        raise InputError("trace", trace_path, "--trace needs --engine event")


def _simulate(plan: Plan, *, net: Network, eff: KernelEfficiency, engine: str, trace_path: str | None, whatif: WhatIf | None,
              explicit_ranks: bool) -> StepResult:
    if plan.strategy.dp_impl == "dataparallel":  # single-process DataParallel: closed form, either engine
        if explicit_ranks or trace_path is not None or (whatif is not None and not whatif.empty):
            raise InputError("dp_impl", "dataparallel", "what-ifs, --trace and --explicit-ranks need the event "
                             "engine, which does not schedule torch.nn.DataParallel")
        return with_server_report(simulate_dataparallel(plan, net=net, eff=eff), plan, net)
    if plan.strategy.dp_impl == "parameter-server":  # asynchronous PS: its own closed form, either engine
        if explicit_ranks or trace_path is not None or (whatif is not None and not whatif.empty):
            raise InputError("dp_impl", "parameter-server", "what-ifs, --trace and --explicit-ranks need the event "
                             "engine, which schedules synchronous steps only")
        return with_server_report(simulate_parameter_server(plan, net=net, eff=eff), plan, net)
    if engine == "event":
        result = simulate_event(plan, net=net, eff=eff, trace_path=trace_path, whatif=whatif,
                                explicit_ranks=explicit_ranks)
    else:
        result = simulate_analytic(plan, net=net, eff=eff)
    return with_server_report(result, plan, net)


def with_server_report(result: StepResult, plan: Plan, net: Network) -> StepResult:
    """PCIe cards: ``server`` in the result (the design, its P2P mode and, per parallel
    dimension, the link its collectives are bound by: a GPU slot, a switch uplink, the socket
    link, host memory, a bridge or the scale-out network)."""
    srv = plan.cluster.server
    if srv is None:
        return result
    report = {**srv.describe(), "bottlenecks": net.bottlenecks(plan.strategy)}
    return replace(result, extra={**result.extra, "server": report})
