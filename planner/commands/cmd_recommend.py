"""``planner recommend``: the best parallel strategies for a model on a cluster (docs/recommend.md)."""

from __future__ import annotations

import argparse
import math

from sim.data.conventions import conventions, default_global_batch
from sim.base.errors import InputError
from sim.base.jsonout import print_json
from sim.base.outpaths import check_folder
from sim.cost.plan import MOE_DISPATCHERS
from sim.data.specs import DEFAULT_SEQ_LEN, OFFLOAD_DEVICES, RECOMPUTES, SCHEDULES, TRAIN_PRECISIONS
from sim.base.units import GIB, fmt_s

from planner.commands.argcheck import check_model_flags
from planner.plans.rerank import DEFAULT_RERANK_PASSES



def register(sub: argparse._SubParsersAction) -> None:
    from planner.commands.inputs import add_cluster_args, add_model_args, add_recipe_script_args

    p = sub.add_parser("recommend", help="search the parallel-strategy space and recommend the best plans")
    add_model_args(p, recipe=True)
    add_cluster_args(p, recipe=True)
    r = p.add_argument_group("recipe")
    r.add_argument("--recipe", default=None, metavar="FILE",
                   help="start from a recipe (`planner import`): its model, cluster, batch, sequence length, framework "
                        "and precision; the recipe's own plan is simulated next to the best")
    add_recipe_script_args(p)
    r.add_argument("--keep", default=None, metavar="KEY,...",
                   help="recipe settings pinned in the search: tp, pp, cp, ep, etp, vp, mbs, zero, sp, recompute, "
                        "schedule, offload, offload_device, precision, or all")
    g = p.add_argument_group("batch and objective")
    g.add_argument("--gbs", type=int, default=None, help="global batch in sequences (default: ~4M tokens per step)")
    g.add_argument("--batch-tokens", type=float, default=None, help="global batch in tokens (instead of --gbs)")
    g.add_argument("--tokens", type=float, default=None, help="training token budget (time and cost to train)")
    g.add_argument("--objective", default="throughput", choices=("throughput", "time", "cost"))
    g.add_argument("--min-gpus", type=int, default=None,
                   help="also consider using fewer GPUs (halvings of --num-gpus down to this)")
    s = p.add_argument_group("search space (comma-separated values restrict a dimension)")
    for dim in ("tp", "pp", "cp", "ep", "etp", "vp", "mbs"):
        s.add_argument(f"--{dim}", default=None, help=f"allowed {dim} values, e.g. 1,2,4,8"
                       + (" (expert tensor parallelism; default: tp and 1)" if dim == "etp" else ""))
    s.add_argument("--zero", default=None, help="allowed ZeRO stages (0-3; 3 = FSDP)")
    s.add_argument("--sp", default=None, help="sequence parallelism: 0, 1 or 0,1")
    s.add_argument("--recompute", default=None, help="|".join(RECOMPUTES))
    s.add_argument("--schedule", default=None, help="|".join(SCHEDULES))
    s.add_argument("--offload", default=None,
                   help="allowed offload modes, comma-separated: none, optimizer, params, activations or a + of them "
                        "(default: none,optimizer,params; offload is timed only where the plan does not fit without it)")
    s.add_argument("--offload-device", default=None, help="allowed offload devices: cpu, nvme (default cpu)")
    s.add_argument("--precision", default=None, help="|".join(TRAIN_PRECISIONS) + " or a comma list, e.g. bf16,fp8 "
                   "(default: bf16, fp16 where the GPU has no bf16; fp8 changes numerics and is searched only when "
                   "asked for)")
    s.add_argument("--memory-headroom", type=float, default=None, metavar="F",
                   help="fraction of GPU memory a plan keeps free (default: the memory model's measured error, "
                        "stated in the output; 0 = plans may fill the GPU)")
    s.add_argument("--max-tp", type=int, default=64)
    s.add_argument("--max-cp", type=int, default=16)
    s.add_argument("--max-vp", type=int, default=8)
    s.add_argument("--max-mbs", type=int, default=16)
    o = p.add_argument_group("output")
    o.add_argument("--top", type=int, default=5, help="plans to show (default 5)")
    o.add_argument("--rerank", type=int, default=None, help="plans re-ranked by the event engine (default --top; 0 = off)")
    o.add_argument("--rerank-budget", type=int, default=None, metavar="PASSES",
                   help="event-engine passes (forward and backward of a micro-batch on a stage) the re-ranking may "
                        "schedule, a cost model so the ranking does not depend on the machine's load "
                        f"(default {DEFAULT_RERANK_PASSES:,})")
    o.add_argument("--workers", type=int, default=None,
                   help="processes for the search (default: 1 when several framework profiles are searched, as they "
                        "share the network's routing; with one, all cores on clusters of 4096+ GPUs, else 1)")
    o.add_argument("--tie-tolerance", type=float, default=1e-3,
                   help="relative objective difference treated as a tie; the simpler plan wins (default 0.001)")
    o.add_argument("--framework", default=None, help="framework profile (catalogs/frameworks.yaml); default: every "
                   "profile searched by default (megatron-core, torchtitan, megatron-deepspeed), each plan with the one "
                   "that runs it")
    o.add_argument("--attention", default=None, help="attention kernel (sim.cost.plan.ATTENTION_IMPLS)")
    o.add_argument("--moe-dispatcher", default=None, choices=MOE_DISPATCHERS,
                   help="MoE token dispatch (default: the framework profile's)")
    o.add_argument("--moe-imbalance", type=float, default=None,
                   help="routed tokens of the busiest expert-parallel rank / the mean (default 1: balanced)")
    o.add_argument("--nccl", default=None, metavar="RELEASE",
                   help="the NCCL release the runs use, e.g. 2.20.3: its NVLS buffers (default: the GPU generation's)")
    o.add_argument("--export", default=None,
                   help="write the best plan as megatron, torchtitan, deepspeed, torchrun, slurm, k8s (comma list or all)")
    o.add_argument("--out", default=None, help="directory for --export (default: print the files)")
    o.add_argument("--no-suggest", action="store_true", help="when nothing fits, do not search for what would")
    o.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_recommend)


def _int_list(name: str, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = int(part, 10)
        except ValueError:
            raise InputError(name, part, "must be a comma-separated list of integers") from None
        if v < 0 or v > 1 << 22:
            raise InputError(name, v, "out of range")
        out.append(v)
    if not out:
        raise InputError(name, text, "needs at least one value")
    return tuple(dict.fromkeys(out))


def _str_list(name: str, text: str | None, choices: tuple[str, ...]) -> tuple[str, ...] | None:
    if text is None:
        return None
    out = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    for v in out:
        if v not in choices:
            raise InputError(name, v, f"must be one of {', '.join(choices)}")
    if not out:
        raise InputError(name, text, "needs at least one value")
    return tuple(dict.fromkeys(out))


def space_from_args(args: argparse.Namespace):
    from planner.plans.search import SearchSpace

    kw: dict[str, object] = {}
    for dim in ("tp", "pp", "cp", "ep", "etp", "vp", "mbs"):
        v = _int_list(dim, getattr(args, dim))
        if v is not None:
            if any(x < 1 for x in v):
                raise InputError(dim, min(v), "must be >= 1")
            kw[dim] = v
    z = _int_list("zero", args.zero)
    if z is not None:
        kw["zero"] = z
    sp = _int_list("sp", args.sp)
    if sp is not None:
        if any(x not in (0, 1) for x in sp):
            raise InputError("sp", args.sp, "must be 0, 1 or 0,1")
        kw["sp"] = tuple(bool(x) for x in sp)
    for name, choices in (("recompute", RECOMPUTES), ("schedule", SCHEDULES), ("precision", TRAIN_PRECISIONS)):
        v = _str_list(name, getattr(args, name), choices)
        if v is not None:
            kw[name] = v
    if args.offload is not None:
        from sim.cost.plan import normalize_offload

        modes = tuple(dict.fromkeys(normalize_offload(t) for t in str(args.offload).split(",") if t.strip()))
        if not modes:
            raise InputError("offload", args.offload, "needs at least one value")
        kw["offload"] = modes
    v = _str_list("offload-device", args.offload_device, OFFLOAD_DEVICES)
    if v is not None:
        kw["offload_device"] = v
    for name in ("max_tp", "max_cp", "max_vp", "max_mbs"):
        v = getattr(args, name)
        if v < 1 or v > 1 << 16:
            raise InputError(name.replace("_", "-"), v, "must be in [1, 65536]")
        kw[name] = v
    return SearchSpace(**kw)  # type: ignore[arg-type]


def settings_from_args(args: argparse.Namespace, formats: list[str] | None = None):
    """The framework the plans assume: ``--framework``, else the one ``--export`` launches
    (the search then holds only plans that framework runs), else the default profile."""
    from planner.exports import framework_of_formats
    from planner.plans.recommend import Settings

    framework = args.framework if args.framework is not None else (framework_of_formats(formats) if formats else None)
    return Settings.from_framework(framework, attention=args.attention, moe_imbalance=args.moe_imbalance,
                                   moe_dispatcher=args.moe_dispatcher, nccl=args.nccl)


def export_mismatches(args: argparse.Namespace, formats: list[str]) -> dict[str, tuple[str, str]]:
    """Formats whose launched framework is not the ``--framework`` the plans assume:
    ``{format: ("family" | "profile", reason)}``.  Another family (Megatron vs FSDP stacks) runs
    other mechanisms than were priced: such formats are skipped, and when every format is one,
    the command is refused.  Another profile of the same family (torchtitan-compile's plans
    exported as a torchtitan TOML) is written with a warning."""
    from planner.exports import FORMAT_FRAMEWORK
    from sim.cost.framework import get_framework

    if args.framework is None or not formats:
        return {}
    fw = get_framework(args.framework)
    out: dict[str, tuple[str, str]] = {}
    for fmt in formats:
        launched = get_framework(FORMAT_FRAMEWORK[fmt])
        if launched.id == fw.id:
            continue
        if launched.family != fw.family:
            out[fmt] = ("family", f"--export {fmt} launches {launched.id} ({launched.family} family), not the "
                                  f"--framework {fw.id} ({fw.family} family) the plans assume")
        else:
            out[fmt] = ("profile", f"the plans assume --framework {fw.id}; the {fmt} files launch {launched.id}'s "
                                   "settings (catalogs/frameworks.yaml): align the framework's options by hand")
    if formats and all(out.get(f, ("",))[0] == "family" for f in formats):
        launched = get_framework(FORMAT_FRAMEWORK[formats[0]])
        raise InputError("framework", args.framework,
                         f"conflicts with --export {args.export}: that launches {launched.id} ({launched.family} "
                         f"family); drop --framework (the export's framework is then searched) or export a "
                         f"{fw.family} format")
    return out


def gbs_from_args(args: argparse.Namespace, seq_len: int) -> tuple[int, str | None]:
    if args.gbs is not None and args.batch_tokens is not None:
        raise InputError("gbs", args.gbs, "give --gbs or --batch-tokens, not both")
    if args.gbs is not None:
        if args.gbs < 1 or args.gbs > 1 << 30:
            raise InputError("gbs", args.gbs, "must be in [1, 2^30]")
        return args.gbs, None
    tokens = args.batch_tokens if args.batch_tokens is not None else conventions().default_tokens_per_step
    if not math.isfinite(tokens) or tokens < seq_len or tokens > 1 << 40:
        raise InputError("batch-tokens", tokens, f"must be at least one sequence ({seq_len} tokens)")
    gbs = default_global_batch(seq_len, tokens)
    note = None if args.batch_tokens is not None else \
        f"--gbs not given: assumed {gbs} sequences ({gbs * seq_len:,} tokens) per step"
    return gbs, note


def _short_strategy(s: str) -> str:
    keep = []
    for part in s.split(","):
        k, _, v = part.partition("=")
        if k in ("gbs", "seq"):
            continue
        keep.append(part)
    return " ".join(keep)


def _mfu_cell(p: dict) -> str:
    """MFU in the table: over the bf16 peak, fp8 plans over the fp8 peak (labelled); never a
    figure above 100%."""
    fp8 = p["precision"] == "fp8"
    v = float(p["mfu_of_precision_peak"] if fp8 else p["mfu"])
    text = ">100%" if v > 1 else f"{v:.1%}"
    return f"{text + (' fp8' if fp8 else ''):>10}"


def print_table(out: dict) -> None:
    from planner.report import mfu_text

    lines = [f"{out['model']} on {out['num_gpus']} x {out['gpu']} ({out['nic']}, {out['topology']}), "
             f"gbs {out['gbs']} x {out['seq_len']} tokens, objective: {out['objective']['kind']}",
             f"searched {out['candidates_considered']:,} candidates in {out['search_time_s']:.2f} s "
             f"({out['timings_s'].get('total_s', out['search_time_s']):.2f} s with re-ranking and explanation): "
             f"{out['candidates_evaluated']:,} fit and were timed, {out['rejected_total']:,} rejected",
             f"frameworks: {', '.join(out['frameworks_searched'])}"
             + "".join(f" (not {k}: {v})" for k, v in out["frameworks_skipped"].items())
             + f"; precision: {', '.join(out['precisions_searched'])}; memory headroom: {out['memory_headroom']['why']}",
             f"ranking: {out['ranking']['note']}", ""]
    if out["plans"]:
        obj = out["objective"]["kind"]
        extra_head = {"time": "  time to train", "cost": "  cost to train"}.get(obj, "")
        lines.append(f"{'#':>2}  {'step time':>10}  {'80% band':>19}  {'tokens/s':>11}  {'MFU':>10}  {'TFLOP/s':>7}  "
                     f"{'memory (dev)':>14}{extra_head}  {'framework':<18} {'prec':<4}  strategy")
        for p in out["plans"]:
            mem = f"{p['memory_device_bytes'] / GIB:.1f}/{p['memory_capacity_bytes'] / GIB:.0f} GiB"  # device level
            extra = ""
            if obj == "time" and "time_to_train_s" in p:
                extra = f"  {p['time_to_train_s'] / 86400:>10.2f} d"
            elif obj == "cost" and "cost_to_train_usd" in p:
                extra = f"  ${p['cost_to_train_usd']:>12,.0f}"
            elif obj == "cost":
                extra = f"  ${p['usd_per_million_tokens']:.3f}/Mtok"
            gpus = f" [{p['num_gpus']} GPUs]" if p["num_gpus"] != out["num_gpus"] else ""
            band = f"{fmt_s(p['step_time_s_low'])}..{fmt_s(p['step_time_s_high'])}"
            mfu = _mfu_cell(p)
            lines.append(f"{p['rank']:>2}  {fmt_s(p['step_time_s']):>10}  {band:>19}  {p['tokens_per_s']:>11,.0f}  "
                         f"{mfu}  {p['model_tflops_per_gpu']:>7.0f}  {mem:>14}{extra}  {p['framework']:<18} "
                         f"{p['precision']:<4}  {_short_strategy(p['strategy'])}{gpus}")
        top = out["plans"][0]
        u = top["uncertainty"]
        like = "all published runs" if u["class"] == "all" else f"published {u['class']} runs"
        spread = "published runs" if u["spread_class"] == "all" else f"published {u['spread_class']} runs"
        lines.append(f"#1: {fmt_s(top['step_time_s'])} per step to plan with (the model's {fmt_s(top['model_step_time_s'])} "
                     f"{u['bias']:+.1%}, the bias of {like}), 80% band "
                     f"{fmt_s(top['step_time_s_low'])} .. {fmt_s(top['step_time_s_high'])} (from {u['runs']} {spread}); "
                     f"MFU {mfu_text(top)}, {top['model_tflops_per_gpu']:.0f} model TFLOP/s per GPU; runs in "
                     f"{top['framework']}")
        alt = out.get("fp8_alternative") or {}
        if alt:
            lines.append(f"alternative: {alt['line']}")
        lines.append("")
        lines.append("why #1:")
    else:
        lines.append("no plan fits.")
    for line in out["explanation"].get("lines", []):
        lines.append(f"  {line}")
    if out["suggestions"]:
        lines.append("what would fit (each verified by re-running the search):")
        for sgg in out["suggestions"]:
            lines.append(f"  {sgg['what']}: {_short_strategy(sgg['best_strategy'])} ({sgg['framework']}), step "
                         f"{fmt_s(sgg['step_time_s'])}, {sgg['memory_device_bytes'] / GIB:.1f} GiB (device)")
    for w in out["warnings"]:
        lines.append(f"warning: {w}")
    gap = out.get("framework_gap") or {}
    if gap and not gap.get("gap"):
        lines.append(f"framework: {gap['framework']} can run the overall best plan")
    if out["plans"]:
        lines.append(f"reproduce: {out['reproduce']}")
        fmts = out.get("export_formats") or []
        if fmts:
            lines.append(f"launch #1: --export {fmts[0]} (formats that run {out['plans'][0]['framework']}: "
                         f"{', '.join(fmts)})")
    if out.get("recipe"):
        r = out["recipe"]
        lines.append(f"your recipe ({r['recipe']}): {_short_strategy(r['strategy'])}, step {fmt_s(r['step_time_s'])}"
                     + (f"; the best plan is {r['best_speedup']:.2f}x faster" if r.get("best_speedup") else "")
                     + ("" if r["fits_memory"] else " (does not fit in memory)"))
        if out.get("framework"):
            lines.append(f"   (with the {out['framework']} framework profile the plans assume)")
    print("\n".join(lines))


def cmd_recommend(args: argparse.Namespace) -> int:
    from planner.commands.cmd_import import apply_recipe, recipe_report
    from planner.report import run_choices
    from planner.exports import LaunchSpec, formats_of, job_name, parse_formats, render, write
    from planner.commands.inputs import cluster_from_args, model_from_args, seq_len_from_args
    from planner.plans.recommend import ObjectiveSpec, recommend

    if args.keep is not None and args.recipe is None:
        raise InputError("keep", args.keep, "pins the settings of a --recipe; give --recipe FILE")
    imported = apply_recipe(args, command="recommend")
    model = model_from_args(args)
    check_model_flags(args, model)
    cluster = cluster_from_args(args)
    seq_len = seq_len_from_args(args) or DEFAULT_SEQ_LEN
    gbs, note = gbs_from_args(args, seq_len)
    space = space_from_args(args)
    formats = parse_formats(args.export) if args.export is not None else []
    mismatched = export_mismatches(args, formats)
    settings = settings_from_args(args, formats)
    if args.out is not None and not formats:
        raise InputError("out", args.out, "needs --export FORMAT")
    if args.out is not None:
        check_folder("out", args.out)  # before the search, not after it
    if args.tokens is not None and (not math.isfinite(args.tokens) or args.tokens <= 0 or args.tokens > 1e18):
        raise InputError("tokens", args.tokens, "must be a positive number of tokens")
    if args.rerank is not None and not 0 <= args.rerank <= 100:
        raise InputError("rerank", args.rerank, "must be in [0, 100]")
    budget = DEFAULT_RERANK_PASSES if args.rerank_budget is None else args.rerank_budget
    if not 0 <= budget <= 10**9:
        raise InputError("rerank-budget", budget, "must be a number of event-engine passes in [0, 10^9]")
    if args.memory_headroom is not None and not (math.isfinite(args.memory_headroom)
                                                 and 0 <= args.memory_headroom < 1):
        raise InputError("memory-headroom", args.memory_headroom, "must be a fraction in [0, 1)")
    if args.workers is not None and not 1 <= args.workers <= 64:
        raise InputError("workers", args.workers, "must be in [1, 64]")
    objective = ObjectiveSpec(kind=args.objective, tokens=args.tokens)
    rec = recommend(model, cluster, gbs=gbs, seq_len=seq_len, space=space, objective=objective, settings=settings,
                    top=args.top, rerank=args.rerank, rerank_budget=budget, min_gpus=args.min_gpus,
                    tie_tolerance=args.tie_tolerance, suggest=not args.no_suggest, workers=args.workers,
                    memory_headroom=args.memory_headroom)
    if note:
        rec.warnings.insert(0, note)
    out = rec.to_dict()
    if imported is not None:
        best_s = float(out["plans"][0]["step_time_s"]) if out["plans"] else None
        out["recipe"] = recipe_report(imported, best_s, cluster=cluster, choices=run_choices(args))
        out["recipe"]["ignored_costly"] = [k.key for k in imported.recipe.ignored if k.cost == "yes"]
    if rec.best is not None:
        b = rec.best
        model_flag = f"--recipe {args.recipe}" if imported is not None and args.recipe else f"--model {args.model}"
        out["reproduce"] = (f"planner simulate {model_flag} --gpu {args.gpu} --num-gpus {b.num_gpus}"
                            f"{_cluster_flags(args)} --strategy {b.strategy.to_string()} --engine {b.engine} "
                            f"--framework {b.framework}" + _override_flags(args))
        out["export_formats"] = formats_of(b.framework)

    exports: dict[str, object] = {}
    if formats:
        best = rec.best
        if best is None:
            raise InputError("export", args.export, "no plan fits, nothing to export")
        steps = None
        if args.tokens:
            steps = math.ceil(args.tokens / best.strategy.tokens_per_step)
        spec = LaunchSpec(model=model, strategy=best.strategy, num_gpus=best.num_gpus,
                          gpus_per_node=best.cluster.gpus_per_node, gpu=best.cluster.gpu.id,
                          attention=best.plan.attention, cuda_graph_scope=best.plan.cuda_graph_scope,
                          job_name=job_name(model, best.num_gpus), steps=steps,
                          time_limit_s=best.step_time_s * steps if steps else None)
        for fmt in formats:
            if mismatched.get(fmt, (None,))[0] == "family":
                exports[fmt] = {"files": [], "warnings": [f"skipped: {mismatched[fmt][1]}"], "skipped": True}
                continue
            try:
                if args.out is not None:
                    paths, warns = write(fmt, spec, args.out)
                    exports[fmt] = {"files": [str(p) for p in paths], "warnings": warns}
                else:
                    r = render(fmt, spec)
                    exports[fmt] = {"files": r.files, "warnings": r.warnings}
            except InputError as exc:
                if len(formats) == 1 or exc.field != "export":
                    raise
                # several frameworks' formats: the ones that cannot carry the plan are skipped, said why
                exports[fmt] = {"files": [], "warnings": [f"skipped: {exc.message}"], "skipped": True}
                continue
            if fmt in mismatched:
                exports[fmt]["warnings"].append(mismatched[fmt][1])  # type: ignore[union-attr]
        out["exports"] = exports

    if args.json:
        print_json(out)
        return 0
    print_table(out)
    for fmt, info in exports.items():
        for w in info["warnings"]:  # type: ignore[index]
            print(f"export {fmt}: warning: {w}")
        files = info["files"]  # type: ignore[index]
        if isinstance(files, dict):
            for name, text in files.items():
                print(f"\n===== {fmt}: {name} =====\n{text}", end="")
        else:
            print(f"export {fmt}: wrote {', '.join(files)}")
    return 0


def _override_flags(args: argparse.Namespace) -> str:
    """The run overrides the user gave (``sim.engines.run.RunChoices``), for the `planner simulate` line."""
    out = []
    for flag in ("attention", "moe_dispatcher", "moe_imbalance", "nccl"):
        v = getattr(args, flag, None)
        if v is not None:
            out.append(f" --{flag.replace('_', '-')} {v}")
    return "".join(out)


def _cluster_flags(args: argparse.Namespace) -> str:
    """The cluster flags the user gave, for the `planner simulate` line."""
    import shlex

    out = []
    for flag in ("gpus_per_node", "nvlink_domain", "nic", "nics_per_node", "seq_len", "server", "sockets",
                 "pcie_switches", "cpu", "p2p", "nvlink_bridge"):
        v = getattr(args, flag, None)
        if v is not None:
            out.append(f"--{flag.replace('_', '-')} {shlex.quote(str(v))}")
    if getattr(args, "topology", "fat-tree") != "fat-tree":
        out.append(f"--topology {shlex.quote(str(args.topology))}")
    if getattr(args, "oversubscription", 1.0) != 1.0:
        out.append(f"--oversubscription {args.oversubscription}")
    if getattr(args, "tree_levels", 2) != 2:
        out.append(f"--tree-levels {args.tree_levels}")
    return "".join(" " + f for f in out)

