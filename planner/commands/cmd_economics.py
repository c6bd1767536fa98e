"""``planner tco | goodput | schedule | sweep | input-pipeline | comm-reduce`` (economics).

Each command builds its inputs with ``planner.commands.inputs`` (the same cluster flags as
``simulate``), calls ``planner.economics`` and prints a short report or ``--json``.  Every
bad value is an ``InputError`` (one line, exit 2).  User guide: docs/economics.md.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

from sim.base.errors import InputError
from sim.base.jsonout import print_json

from planner.commands.argcheck import check_applies

DEFAULT_SWEEP_GPUS = ["a100-80gb", "h100-80gb", "b200-180gb"]
CHECKPOINT_STORAGE_DEFAULT = "lustre-ddn"

# ------------------------------------------------------------------ helpers


def _usd(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"${x / div:,.2f}{unit}"
    return f"${x:,.0f}"


def _dur(s: float) -> str:
    if s >= 86400:
        return f"{s / 86400:.1f} days"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def _list(conv: Callable[[str], object], field: str) -> Callable[[str], list]:
    def parse(text: str) -> list:
        items = [t.strip() for t in str(text).split(",") if t.strip()]
        if not items:
            raise InputError(field, text, "must be a comma-separated list")
        out = []
        for t in items:
            try:
                out.append(conv(t))
            except ValueError:
                raise InputError(field, t, f"is not a valid {conv.__name__}") from None
        return out
    return parse


def _positive(name: str, v: float | None, *, allow_zero: bool = False) -> None:
    if v is None:
        return
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise InputError(name, v, "must be a finite number " + (">= 0" if allow_zero else "> 0"))


def _model_cluster(args: argparse.Namespace):
    from planner.commands.inputs import cluster_from_args, model_from_args

    return model_from_args(args), cluster_from_args(args)


def _run(args: argparse.Namespace, model, cluster):
    """The resolved run of ``--strategy`` (``sim.engines.run.resolve``, as ``planner simulate`` resolves it)."""
    from planner.commands.inputs import seq_len_from_args
    from planner.report import run_choices
    from sim.engines.run import resolve

    return resolve(model, cluster, args.strategy, run_choices(args), seq_len=seq_len_from_args(args))


def _tco_options(args: argparse.Namespace):
    from planner.economics.tco import TcoOptions

    return TcoOptions(tokens=args.tokens, tokens_per_param=args.tokens_per_param, pricing=args.pricing,
                      usd_per_kwh=args.usd_per_kwh, pue=args.pue, amortization_years=args.amortization_years,
                      gpu_price_usd=args.gpu_price_usd, usd_per_gpu_hour=args.usd_per_gpu_hour,
                      facility_usd_per_kw_month=args.facility_usd_per_kw_month,
                      include_failures=not args.ignore_failures, storage=args.storage)


def _add_cost_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cost")
    g.add_argument("--tokens", type=float, default=None, help="token budget (default: --tokens-per-param x parameters)")
    g.add_argument("--tokens-per-param", type=float, default=None,
                   help="token budget per parameter (default: catalogs/conventions.yaml, the Chinchilla 20)")
    g.add_argument("--pricing", choices=("owned", "cloud"), default="owned",
                   help="cost_to_train_usd from owned hardware (depreciation + energy) or cloud rent")
    g.add_argument("--usd-per-kwh", type=float, default=None)
    g.add_argument("--pue", type=float, default=None)
    g.add_argument("--amortization-years", type=float, default=None)
    g.add_argument("--gpu-price-usd", type=float, default=None)
    g.add_argument("--usd-per-gpu-hour", type=float, default=None)
    g.add_argument("--facility-usd-per-kw-month", type=float, default=0.0,
                   help="colocation/facility rent per kW of IT power (default 0: not counted)")
    g.add_argument("--storage", default=CHECKPOINT_STORAGE_DEFAULT, help="checkpoint storage tier for the goodput factor")
    g.add_argument("--ignore-failures", action="store_true", help="time to train without failures (goodput 1)")
    g.add_argument("--gbs", type=int, default=None, help="global batch for the strategy search (sequences)")


# ------------------------------------------------------------------ tco


def cmd_tco(args: argparse.Namespace) -> int:
    from planner.economics.input_pipeline import input_pipeline
    from planner.economics.tco import compute_tco
    from planner.commands.inputs import seq_len_from_args

    from planner.report import run_choices

    model, cluster = _model_cluster(args)
    if args.gbs is not None and args.gbs < 1:
        raise InputError("gbs", args.gbs, "must be >= 1")
    res = compute_tco(model, cluster, strategy=args.strategy, gbs=args.gbs, seq_len=seq_len_from_args(args),
                      options=_tco_options(args), choices=run_choices(args))
    pipe = input_pipeline(model, cluster, res.plan.strategy, res.plan.result.tokens_per_s, storage=args.storage)
    out = res.as_dict()
    out["input_pipeline"] = pipe.as_dict()
    out["warnings"] = list(dict.fromkeys(out["warnings"] + list(pipe.warnings)))
    if args.json:
        print_json(out)
        return 0
    p = out["power"]
    lines = [
        f"{out['model']} on {cluster.num_gpus} x {cluster.gpu.id} ({cluster.num_nodes} nodes, {cluster.nic.id}, "
        f"{cluster.topology}, oversubscription {cluster.oversubscription:g})",
        f"strategy           {out['strategy']}  [{out['strategy_source']}; framework {out['framework']}]",
        f"step time          {out['step_time_s']:.3f} s (80% band {out['step_time_s_low']:.3f} .. "
        f"{out['step_time_s_high']:.3f} s; the model's {out['model_step_time_s']:.3f} s)",
        f"throughput         {out['tokens_per_s']:,.0f} tokens/s, MFU {out['mfu']:.1%}",
        f"token budget       {out['tokens']:.3g} tokens",
        f"time to train      {_dur(out['time_to_train_s'])}  (80% band {_dur(out['time_to_train_s_low'])} .. "
        f"{_dur(out['time_to_train_s_high'])}; failure-free {_dur(out['time_to_train_ideal_s'])}, "
        f"goodput {out['goodput']:.1%})",
        f"cost to train      {_usd(out['cost_to_train_usd'])} (80% band {_usd(out['cost_to_train_usd_low'])} .. "
        f"{_usd(out['cost_to_train_usd_high'])}, {out['pricing']}); owned {_usd(out['owned_cost_to_train_usd'])}, "
        f"cloud {_usd(out['cloud_cost_to_train_usd'])}"
        + (f" at ${out['usd_per_gpu_hour']:.2f}/GPU-h" if out["usd_per_gpu_hour"] else ""),
        f"capex              {_usd(out['capex_usd'])}: GPUs {_usd(out['capex_breakdown']['gpus_usd'])}, servers "
        f"{_usd(out['capex_breakdown']['servers_usd'])}, network {_usd(out['network_capex_usd'])} "
        f"({out['num_switches']} switches, {out['num_cables']} cables)",
        f"power              {p['facility_w'] / 1e6:.3f} MW at PUE {p['pue']:.2f} (GPUs {p['gpus_w'] / 1e3:,.0f} kW at "
        f"{p['gpu_w_each']:.0f} W each, hosts {p['hosts_w'] / 1e3:,.0f} kW, network {p['network_w'] / 1e3:,.0f} kW)",
        f"energy             {out['energy_kwh'] / 1e3:,.0f} MWh at ${out['usd_per_kwh']:.3f}/kWh",
        f"input pipeline     bound by {pipe.bound_by}, {pipe.headroom:,.1f}x headroom"
        + ("  -> DATA-BOUND" if pipe.data_bound else ""),
    ]
    for item in out["network_bom"]:
        lines.append(f"   {item['quantity']:>7,} x {item['item']:<34} {_usd(item['total_usd']):>10}"
                     + ("  (estimate)" if item["estimate"] else ""))
    for w in out["warnings"]:
        lines.append(f"warning: {w}")
    print("\n".join(lines))
    return 0


# ------------------------------------------------------------------ goodput


def cmd_goodput(args: argparse.Namespace) -> int:
    from planner.economics.campaign import CampaignSpec, FailureMode, run_campaigns
    from planner.economics.failures import cluster_rates, load_failure_model
    from planner.economics.goodput import goodput_report

    for dest in ("seq_len", "host_dram_gib"):  # checkpoints and failures do not depend on them
        check_applies(args, dest, False, "to the step-time commands (simulate, recommend, tco), not to goodput")
    model, cluster = _model_cluster(args)
    _positive("restart-s", args.restart_s, allow_zero=True)
    _positive("checkpoint-interval-s", args.checkpoint_interval_s)
    _positive("repair-hours", args.repair_hours, allow_zero=True)
    _positive("campaign-days", args.campaign_days)
    fm = load_failure_model()
    rep = goodput_report(model, cluster, storage=args.storage, restart_s=args.restart_s,
                         interval_s=args.checkpoint_interval_s, async_checkpoint=args.async_checkpoint, failures=fm)
    out = rep.as_dict()
    spares = args.spares if args.spares is not None else max(1, math.ceil(fm.spare_fraction * cluster.num_nodes))
    if spares < 0:
        raise InputError("spares", spares, "must be >= 0")
    out["spares"] = spares
    if not args.no_simulation:
        rates = cluster_rates(cluster, fm)
        modes = tuple(FailureMode(name=c, rate_per_s=r, needs_node=rates.needs_node[c])
                      for c, r in rates.by_component.items() if r > 0)
        if math.isfinite(rep.checkpoint_interval_s) and modes:
            spec = CampaignSpec(work_s=args.campaign_days * 86400.0, interval_s=rep.checkpoint_interval_s,
                                write_s=rep.checkpoint_write_s, restart_s=rep.restart_s,
                                restore_s=rep.checkpoint_restore_s, modes=modes, num_spares=spares,
                                repair_s=fm.repair_s if args.repair_hours is None else args.repair_hours * 3600.0)
            out["simulation"] = run_campaigns(spec, seeds=args.seeds).as_dict()
    if args.json:
        print_json(out)
        return 0
    lines = [
        f"{model.name} on {cluster.num_gpus} x {cluster.gpu.id} ({cluster.num_nodes} nodes), checkpoints on {rep.storage}",
        f"checkpoint         {rep.checkpoint_bytes / 1e12:.2f} TB: write {rep.checkpoint_write_s:.1f} s, "
        f"restore {rep.checkpoint_restore_s:.1f} s, restart {rep.restart_s:.0f} s",
        f"failures           {rep.expected_failures_per_day:.2f} per day, cluster MTBF {_dur(rep.mtbf_s)}  ("
        + ", ".join(f"{k} {v:.2f}/day" for k, v in rep.failures_per_day_by_component.items()) + ")",
        f"checkpoint every   {_dur(rep.optimal_checkpoint_interval_s)} (Young), {_dur(rep.daly_checkpoint_interval_s)} (Daly)",
        f"goodput (Daly)     {rep.goodput:.2%} at {_dur(rep.checkpoint_interval_s)} between checkpoints",
    ]
    sim = out.get("simulation")
    if sim:
        lo, hi = sim["goodput_ci95"]
        lines.append(f"goodput (simpy)    {sim['goodput_mean']:.2%}  95% CI [{lo:.2%}, {hi:.2%}] over {sim['seeds']} "
                     f"campaigns of {args.campaign_days:g} days, {spares} spare nodes; "
                     f"{sim['failures_mean']:.0f} failures each, {_dur(sim['spare_wait_s_mean'])} waiting for spares")
    for w in out["warnings"] + (sim["notes"] if sim else []):
        lines.append(f"warning: {w}")
    print("\n".join(lines))
    return 0


# ------------------------------------------------------------------ schedule


def cmd_schedule(args: argparse.Namespace) -> int:
    from planner.economics.failures import load_failure_model
    from planner.economics.scheduler import POLICIES, ClusterSpec, simulate_schedule
    from planner.economics.traces import generate_jobs, read_trace
    from sim.data.catalog import get_gpu

    gpu = get_gpu(args.gpu)
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise InputError("gpus-per-node", args.gpus_per_node, "must be >= 1")
    gpn = args.gpus_per_node or gpu.gpus_per_node
    if args.nodes < 1 or gpn < 1:
        raise InputError("nodes", args.nodes, "must be >= 1")
    if (args.trace is None) == (args.generate is None):
        raise InputError("trace", args.trace, "give exactly one of --trace FILE or --generate N")
    if args.seed < 0:
        raise InputError("seed", args.seed, "must be an integer >= 0")
    if args.trace is not None:
        jobs = read_trace(args.trace)
    else:
        jobs = generate_jobs(num_jobs=args.generate, num_nodes=args.nodes, gpus_per_node=gpn, seed=args.seed,
                             mean_interarrival_s=args.mean_interarrival_s, median_duration_s=args.median_duration_s)
    fm = load_failure_model()
    node_rate = job_rate = 0.0
    if not args.no_failures:
        nics = gpu.nics_per_node
        units = {"gpu": gpn, "node": 1, "nic": nics, "cable": 2 * nics}
        for c in fm.components:
            r = c.rate_per_s * units[c.per]
            if c.needs_node:
                node_rate += r
            else:
                job_rate += r
    _positive("restart-s", args.restart_s, allow_zero=True)
    _positive("repair-hours", args.repair_hours, allow_zero=True)
    spec = ClusterSpec(num_nodes=args.nodes, gpus_per_node=gpn, node_failure_rate_per_s=node_rate,
                       job_failure_rate_per_s=job_rate,
                       repair_s=fm.repair_s if args.repair_hours is None else args.repair_hours * 3600.0,
                       restart_s=fm.restart_s if args.restart_s is None else args.restart_s,
                       checkpoint_interval_s=args.checkpoint_interval_s)
    policies = POLICIES if args.policy == "all" else (args.policy,)
    results = [simulate_schedule(spec, jobs, policy=p, seed=args.seed) for p in policies]
    out = {"nodes": args.nodes, "gpus_per_node": gpn, "jobs": len(jobs),
           "node_failure_rate_per_day": node_rate * 86400 * args.nodes,
           "job_interrupt_rate_per_day": job_rate * 86400 * args.nodes,
           "policies": [r.summary() for r in results]}
    if args.log:
        for r, s in zip(results, out["policies"]):
            s["log"] = [list(e) for e in r.log]
            s["per_job"] = [{"job_id": j.job_id, "nodes": j.nodes, "submit_s": j.submit_s, "start_s": j.start_s,
                             "end_s": j.end_s, "wait_s": j.wait_s, "jct_s": j.jct_s, "restarts": j.restarts,
                             "shrinks": j.shrinks, "grows": j.grows} for j in r.jobs]
    if args.json:
        print_json(out)
        return 0
    lines = [f"{len(jobs)} jobs on {args.nodes} nodes x {gpn} GPUs; failures: "
             f"{out['node_failure_rate_per_day']:.2f} node losses/day, {out['job_interrupt_rate_per_day']:.2f} job "
             "interrupts/day" + (" (off)" if args.no_failures else ""),
             f"{'policy':<10}{'util':>7}{'useful':>8}{'wait mean':>12}{'wait p95':>11}{'JCT mean':>11}"
             f"{'JCT p95':>11}{'makespan':>11}{'fails':>7}"]
    for s in out["policies"]:
        lines.append(f"{s['policy']:<10}{s['utilisation']:>7.1%}{s['useful_utilisation']:>8.1%}"
                     f"{_dur(s['queue_wait_s']['mean']):>12}{_dur(s['queue_wait_s']['p95']):>11}"
                     f"{_dur(s['jct_s']['mean']):>11}{_dur(s['jct_s']['p95']):>11}{_dur(s['makespan_s']):>11}"
                     f"{s['job_interruptions']:>7}")
    print("\n".join(lines))
    return 0


# ------------------------------------------------------------------ sweep


def cmd_sweep(args: argparse.Namespace) -> int:
    from planner.economics.design_search import (Constraints, DesignSpace, choose_search, grid_result,
                                                 parse_available, run_optuna)
    from planner.economics.search_report import write_outputs
    from planner.economics.sweep import SweepOptions, run_sweep

    if "://" in str(args.storage):  # --storage sqlite:///x.db is the Optuna storage, not a checkpoint tier
        if args.study_storage is not None and args.study_storage != args.storage:
            raise InputError("storage", args.storage, f"and --study-storage {args.study_storage} disagree")
        args.study_storage, args.storage = args.storage, CHECKPOINT_STORAGE_DEFAULT
    available = parse_available(args.available) if args.available else {}
    gpus = args.gpus if args.gpus is not None else (list(available) or DEFAULT_SWEEP_GPUS)
    nics = [None if n.lower() == "default" else n for n in args.nics]
    space = DesignSpace(models=tuple(args.models), gpus=tuple(gpus), counts=tuple(args.counts), nics=tuple(nics),
                        topologies=tuple(t.lower() for t in args.topologies),
                        oversubscriptions=tuple(args.oversubscription))
    if args.seq_len is not None and not 1 <= args.seq_len <= 1 << 26:
        raise InputError("seq-len", args.seq_len, "must be in [1, 67108864]")
    if args.gbs is not None and args.gbs < 1:
        raise InputError("gbs", args.gbs, "must be >= 1")
    _positive("budget-usd", args.budget_usd)
    _positive("power-cap-kw", args.power_cap_kw)
    constraints = Constraints(budget_usd=args.budget_usd,
                              power_cap_w=args.power_cap_kw * 1e3 if args.power_cap_kw is not None else None,
                              max_gpus=args.max_gpus, available=tuple(available.items()))
    opts = SweepOptions(tco=_tco_options(args), gbs=args.gbs, seq_len=args.seq_len,
                        quick=args.strategy_engine in ("quick", "fallback"))
    method, why = choose_search(args.search, space, constraints, args.trials)
    if method == "optuna":
        res = run_optuna(space, opts, constraints, trials=args.trials, sampler=args.sampler, seed=args.seed,
                         storage=args.study_storage, study_name=args.study_name, executor=args.executor,
                         workers=args.workers, ray_address=args.ray_address, why=why)
    else:
        points, excluded = space.designs(constraints)
        grid = run_sweep(points, opts, executor=args.executor, max_workers=args.workers, ray_address=args.ray_address)
        res = grid_result(list(grid.rows), executor=grid.executor, seconds=grid.sweep_time_s, why=why,
                          space_size=len(points), excluded=excluded, constraints=constraints,
                          pricing=opts.tco.pricing)
    out = res.as_dict()
    if args.out:
        summary = {**out["search"], "title": f"{', '.join(space.models)}: {res.method} search, "
                   f"{len(res.rows)} designs costed", "constraints": {
                       "budget_usd": args.budget_usd, "power_cap_kw": args.power_cap_kw, "max_gpus": args.max_gpus,
                       "available": available, "pricing": opts.tco.pricing}}
        paths, warnings = write_outputs(args.out, rows=res.rows, trials=res.trials, pareto=res.pareto,
                                        summary=summary)
        out["files"] = [str(p) for p in paths]
        out["warnings"] = warnings
    if args.json:
        print_json(out)
        return 0
    pareto_ids = {id(r) for r in res.pareto}
    s = out["search"]
    head = (f"{len(res.rows)} designs ({out['feasible']} feasible) in {res.sweep_time_s:.1f} s on the "
            f"{res.executor} executor by {res.method} search ({res.why}"
            + (f"; {s['evaluations']} evaluated, {s['trials']} trials, sampler {s['sampler']}" if res.method == "optuna"
               else "") + (f"; {s['excluded_by_constraints']} designs excluded by the constraints" if res.excluded
                           else "") + "); * = Pareto front (time vs cost, per model)")
    lines = [head,
             f"  {'model':<16}{'gpu':<14}{'gpus':>6} {'nic':<12}{'topology':<16}{'ovs':>4}{'days':>9}"
             f"{'cost':>11}{'capex':>11}{'MFU':>7}"]
    for r in sorted(res.rows, key=lambda r: (r["model"], r.get("time_to_train_s") or math.inf)):
        mark = "*" if id(r) in pareto_ids else " "
        head = f"{mark} {r['model']:<16}{r['gpu']:<14}{r['num_gpus']:>6} {str(r['nic']):<12}{r['topology']:<16}" \
               f"{r['oversubscription']:>4g}"
        if r["status"] in ("ok", "constrained"):
            lines.append(head + f"{r['time_to_train_days']:>9.1f}{_usd(r['cost_to_train_usd']):>11}"
                                f"{_usd(r['capex_usd']):>11}{r['mfu']:>7.1%}"
                                + (f"  constrained: {r['reason']}" if r["status"] == "constrained" else ""))
        else:
            lines.append(head + f"  {r['status']}: {r['reason'][:70]}")
    for f in out.get("files", []):
        lines.append(f"wrote {f}")
    for w in out.get("warnings", []):
        lines.append(f"warning: {w}")
    print("\n".join(lines))
    return 0


# ------------------------------------------------------------------ input pipeline and comm reduction


def cmd_input_pipeline(args: argparse.Namespace) -> int:
    from planner.economics.input_pipeline import input_pipeline
    from planner.economics.strategy import choose_plan
    from planner.commands.inputs import seq_len_from_args

    model, cluster = _model_cluster(args)
    plan = choose_plan(model, cluster, strategy=args.strategy, seq_len=seq_len_from_args(args))
    rep = input_pipeline(model, cluster, plan.strategy, plan.result.tokens_per_s, storage=args.storage,
                         pretokenized=not args.raw_text, bytes_per_token_storage=args.bytes_per_token_storage,
                         bytes_per_token_device=args.bytes_per_token_device,
                         host_bytes_per_s_per_node=args.host_bytes_per_s_per_node,
                         host_bytes_per_token=args.host_bytes_per_token)
    out = rep.as_dict()
    out.update(strategy=plan.strategy.to_string(), strategy_source=plan.source, step_time_s=plan.result.step_time_s)
    if args.json:
        print_json(out)
        return 0
    lines = [f"{model.name} on {cluster.num_gpus} x {cluster.gpu.id}: the step consumes "
             f"{rep.tokens_per_s_needed:,.0f} tokens/s ({plan.strategy.to_string()})"]
    for stage, v in rep.supply_tokens_per_s.items():
        lines.append(f"   {stage:<10} supplies {v:>20,.0f} tokens/s  ({v / rep.tokens_per_s_needed:,.1f}x)")
    lines.append(f"bound by {rep.bound_by}: " + ("DATA LOADING BOUNDS THE STEP" if rep.data_bound else
                                                 f"{rep.headroom:,.1f}x headroom, the step is not data-bound"))
    for w in rep.warnings:
        lines.append(f"warning: {w}")
    print("\n".join(lines))
    return 0


def cmd_comm_reduce(args: argparse.Namespace) -> int:
    from planner.economics.comm_reduction import comm_reduction

    check_applies(args, "sync_every", args.mode == "local-sgd", "with --mode local-sgd")
    check_applies(args, "ratio", args.mode == "compress", "with --mode compress")
    model, cluster = _model_cluster(args)
    plan = _run(args, model, cluster).plan
    rep = comm_reduction(plan, mode=args.mode, sync_every=args.sync_every, ratio=args.ratio)
    out = rep.as_dict()
    out["strategy"] = plan.strategy.to_string()
    if args.json:
        print_json(out)
        return 0
    lines = [f"{model.name} on {cluster.num_gpus} x {cluster.gpu.id}, {args.mode} "
             + ", ".join(f"{k}={v:g}" for k, v in rep.parameters.items()),
             f"step time          {rep.baseline.step_time_s:.3f} s -> {rep.step_time_s:.3f} s  (x{rep.speedup:.2f} "
             f"throughput, {rep.tokens_per_s:,.0f} tokens/s)",
             f"DP traffic         x{rep.dp_bytes_factor:g} per step (baseline exposed DP "
             f"{rep.baseline.breakdown.exposed_dp_s:.3f} s, bubble {rep.baseline.breakdown.bubble_s:.3f} s)",
             "", "CAVEAT: " + rep.caveat]
    for w in rep.warnings:
        lines.append(f"warning: {w}")
    print("\n".join(lines))
    return 0


# ------------------------------------------------------------------ registration


def register(sub: argparse._SubParsersAction) -> None:
    from planner.commands.inputs import add_cluster_args, add_model_args
    from planner.commands.ps_args import add_ps_args

    p = sub.add_parser("tco", help="capital cost, power, energy, time and cost to train a token budget")
    add_model_args(p)
    add_cluster_args(p)
    p.add_argument("--strategy", default=None, help="default: the recommender's best plan")
    p.add_argument("--framework", default=None, help="framework profile (as planner simulate --framework; default: "
                   "the first of the default profiles that runs the strategy)")
    _add_cost_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tco)

    p = sub.add_parser("goodput", help="failures, checkpoint interval (Young/Daly) and goodput (simpy campaigns)")
    add_model_args(p)
    add_cluster_args(p)
    p.add_argument("--storage", default="lustre-ddn", help="catalogs/storage.yaml tier (nvme-local, lustre-ddn, "
                                                           "tectonic, s3, gcs, hdfs)")
    p.add_argument("--restart-s", type=float, default=None, help="detect + relaunch time (default: failures.yaml)")
    p.add_argument("--checkpoint-interval-s", type=float, default=None, help="default: Young's optimum")
    p.add_argument("--async-checkpoint", action="store_true", help="only the GPU-to-host copy blocks training")
    p.add_argument("--spares", type=int, default=None, help="hot spare nodes (default: 1%% of nodes, at least 1)")
    p.add_argument("--repair-hours", type=float, default=None, help="time to repair a failed node (default 24)")
    p.add_argument("--seeds", type=int, default=20, help="simulated campaigns for the confidence interval")
    p.add_argument("--campaign-days", type=float, default=30.0, help="failure-free training time to simulate")
    p.add_argument("--no-simulation", action="store_true", help="analytic result only")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_goodput)

    p = sub.add_parser("schedule", help="simulate a shared cluster: FIFO, EASY backfill, priority; elastic jobs")
    p.add_argument("--trace", default=None, help="job trace CSV (docs/economics.md; catalogs/traces/example_jobs.csv)")
    p.add_argument("--generate", type=int, default=None, help="synthesise N jobs instead of reading a trace")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpu", default="h100-80gb", help="GPU id (node size and failure units)")
    p.add_argument("--gpus-per-node", type=int, default=None)
    p.add_argument("--policy", choices=("fifo", "backfill", "priority", "all"), default="all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-failures", action="store_true")
    p.add_argument("--restart-s", type=float, default=None)
    p.add_argument("--repair-hours", type=float, default=None)
    p.add_argument("--checkpoint-interval-s", type=float, default=3600.0)
    p.add_argument("--mean-interarrival-s", type=float, default=1800.0, help="generator: mean time between jobs")
    p.add_argument("--median-duration-s", type=float, default=7200.0, help="generator: median job run time")
    p.add_argument("--log", action="store_true", help="include the event log and per-job records in --json")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_schedule, flag_names={"jobs": "--generate", "num-nodes": "--nodes"})

    p = sub.add_parser("sweep", help="co-design sweep: Pareto front of time to train vs cost (grid or Optuna)")
    p.add_argument("--models", type=_list(str, "models"), default=["llama3-70b"])
    p.add_argument("--gpus", type=_list(str, "gpus"), default=None,
                   help=f"GPU ids (default: the --available ones, else {','.join(DEFAULT_SWEEP_GPUS)})")
    p.add_argument("--counts", type=_list(int, "counts"), default=[512, 1024, 2048])
    p.add_argument("--nics", type=_list(str, "nics"), default=["default"], help="NIC ids; 'default' = the GPU's usual")
    p.add_argument("--topologies", type=_list(str, "topologies"), default=["fat-tree", "rail-optimized"])
    p.add_argument("--oversubscription", type=_list(float, "oversubscription"), default=[1.0, 2.0])
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--strategy-engine", choices=("auto", "quick", "fallback"), default="auto",
                   help="auto: the recommender over the whole space; quick (alias fallback): over a small "
                        "documented space (planner.economics.strategy.QUICK_SPACE), for fast sweeps")
    p.add_argument("--executor", choices=("local", "ray"), default="local")
    p.add_argument("--workers", type=int, default=None, help="local processes / Ray CPUs (default: all cores)")
    p.add_argument("--ray-address", default=None, help="connect to an existing Ray cluster instead of starting one")
    s = p.add_argument_group("search (planner.economics.design_search)")
    s.add_argument("--search", choices=("auto", "grid", "optuna"), default="auto",
                   help="auto (default): the grid when it has no more designs than --trials, else Optuna")
    s.add_argument("--trials", type=int, default=64, help="Optuna: designs to evaluate per model (default 64)")
    s.add_argument("--sampler", choices=("tpe", "nsga2"), default="tpe", help="Optuna sampler (default tpe)")
    s.add_argument("--seed", type=int, default=0, help="Optuna sampler seed (default 0)")
    s.add_argument("--study-storage", default=None, metavar="URL",
                   help="Optuna storage to resume a study, e.g. sqlite:///sweep.db (--storage URL works too: a "
                        "value with :// is the study's storage, any other the checkpoint storage tier)")
    s.add_argument("--study-name", default=None, help="Optuna study name (default planner-sweep[:MODEL])")
    s.add_argument("--out", default=None, metavar="DIR",
                   help="write trials.csv, pareto.png, pareto.html and best_designs.json into DIR")
    c = p.add_argument_group("constraints")
    c.add_argument("--budget-usd", type=float, default=None,
                   help="money to spend: capex (owned pricing) or the cloud bill to train (--pricing cloud)")
    c.add_argument("--power-cap-kw", type=float, default=None, help="facility power cap (PUE included), kW")
    c.add_argument("--max-gpus", type=int, default=None, help="largest GPU count to consider")
    c.add_argument("--available", default=None, metavar="GPU:N,...",
                   help="GPUs available to buy, e.g. h100-80gb:512,a100-80gb:1024")
    _add_cost_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("input-pipeline", help="can storage, host CPUs and PCIe feed the training step?")
    add_model_args(p)
    add_cluster_args(p)
    p.add_argument("--strategy", default=None)
    p.add_argument("--storage", default="lustre-ddn")
    p.add_argument("--raw-text", action="store_true", help="tokenise on the fly (default: pre-tokenised data)")
    p.add_argument("--bytes-per-token-storage", type=float, default=None)
    p.add_argument("--bytes-per-token-device", type=float, default=None,
                   help="host-to-GPU bytes per token (default: catalogs/conventions.yaml, 16 for text)")
    p.add_argument("--host-bytes-per-s-per-node", type=float, default=None,
                   help="host decode/tokenise rate per node (bytes of input per second)")
    p.add_argument("--host-bytes-per-token", type=float, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_input_pipeline)

    p = sub.add_parser("comm-reduce", help="local SGD/DiLoCo, gradient compression, async pipelines, async parameter "
                                           "servers (throughput only)")
    add_model_args(p)
    add_cluster_args(p)
    p.add_argument("--strategy", required=True)
    p.add_argument("--mode", choices=("local-sgd", "compress", "async-pipeline", "parameter-server"), required=True)
    p.add_argument("--sync-every", type=int, default=None, help="local-sgd: steps between synchronisations (H)")
    p.add_argument("--ratio", type=float, default=None, help="compress: compression ratio (bytes / compressed)")
    add_ps_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_comm_reduce)
