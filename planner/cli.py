"""The ``planner`` command line.  Bad input exits 2 with one line naming field and value."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from sim.base.errors import InputError
from sim.base.jsonout import print_json
from sim.base.outpaths import check_file
from sim.cost.plan import ATTENTION_IMPLS, MOE_DISPATCHERS, SELECTIVE_POLICIES
from sim.base.units import GIB, fmt_s

from planner import progress
from planner.commands import cmd_check, cmd_economics, cmd_import, cmd_recommend, cmd_validate
from planner.commands.argcheck import check_model_flags, check_not_empty, typed_message

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """A flag argparse rejected; its message already names the flag and the value."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line (no usage dump) and exit status 2."""

    def error(self, message: str) -> "NoReturn":  # type: ignore[name-defined]  # noqa: F821
        raise UsageError(message.replace("\n", " "))


def one_line(text: str) -> str:
    """Make an error message one printable line: control and separator characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _fmt_bytes(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _band_text(out: dict) -> str:
    u = out.get("uncertainty")
    if not u:
        return ""
    if u["class"].startswith("calibration "):  # a measured machine: no published-run bias
        return (f"   (80% band {fmt_s(out['step_time_s_low'])} .. {fmt_s(out['step_time_s_high'])}: the spread of "
                f"published runs around the {u['class']} model)")
    like = "all published runs" if u["class"] == "all" else f"published {u['class']} runs"
    return (f"   (80% band {fmt_s(out['step_time_s_low'])} .. {fmt_s(out['step_time_s_high'])}; the model's "
            f"{fmt_s(out['model_step_time_s'])} {u['bias']:+.1%}, the bias of {like})")


def print_step_summary(out: dict, *, model: str, gpu: str, num_gpus: int) -> None:
    b = out["breakdown"]
    mem = out["memory"]
    from planner.report import mfu_text

    fw = out.get("framework") or "no framework profile runs it"
    lines = [
        f"{model} on {num_gpus} x {gpu}   [{out['engine']} engine, framework {fw}]",
        f"strategy           {out['strategy']}",
        f"step time          {fmt_s(out['step_time_s'])}" + _band_text(out),
        f"throughput         {out['tokens_per_s']:,.0f} tokens/s ({out['tokens_per_s_per_gpu']:,.0f} per GPU)",
        f"MFU                {mfu_text(out)}   ({out['model_tflops_per_gpu']:.0f} model TFLOP/s per GPU; "
        f"HFU {out['hfu']:.1%})",
        f"memory (peak GPU)  device {_fmt_bytes(out['memory_device_bytes'])} of {_fmt_bytes(out['memory_capacity_bytes'])}"
        f"  -> {'fits' if out['fits_memory'] else 'DOES NOT FIT'}  (stage {mem['stage']} peaks)",
        f"   allocated {_fmt_bytes(out['memory_peak_bytes'])} (max_memory_allocated), reserved "
        f"{_fmt_bytes(out['memory_reserved_bytes'])} (max_memory_reserved), device {_fmt_bytes(out['memory_device_bytes'])} "
        "(nvidia-smi)",
        f"   weights {_fmt_bytes(mem['weights_bytes'])}, grads {_fmt_bytes(mem['gradients_bytes'])}, "
        f"optimizer {_fmt_bytes(mem['optimizer_bytes'])}, activations {_fmt_bytes(mem['activations_bytes'])}, "
        f"temporaries {_fmt_bytes(mem.get('temporaries_bytes', 0.0))}, context/NCCL/allocator {_fmt_bytes(mem['reserve_bytes'])}",
    ]
    stages = out.get("memory_by_stage") or []
    if len(stages) > 1:
        lines.append("   per stage (device): " + ", ".join(
            f"{x['stage']}: {_fmt_bytes(x['memory_device_bytes'])}" for x in stages))
    off = out.get("offload")
    if off:
        lines.append(f"offload            {off['mode']} to {off['device']}: host memory {_fmt_bytes(out['host_memory_bytes'])} "
                     f"of {_fmt_bytes(out['host_memory_capacity_bytes'])} per node"
                     + (f", NVMe {_fmt_bytes(mem['nvme_bytes'])}" if mem.get("nvme_bytes") else ""))
        lines.append(f"   per GPU per step: {off['h2d_bytes_per_step'] / GIB:.1f} GiB to the GPU ({fmt_s(off['h2d_s'])}), "
                     f"{off['d2h_bytes_per_step'] / GIB:.1f} GiB to the host ({fmt_s(off['d2h_s'])}) "
                     f"at {off['host_link_bytes_per_s'] / 1e9:.1f} GB/s each way")
    lines.append("where the time goes:")
    total = out["step_time_s"]
    parts = {**b, "overhead_s": b.get("overhead_s", 0.0) - b.get("calibration_s", 0.0)}
    for key in ("compute_s", "exposed_tp_s", "exposed_cp_s", "exposed_ep_s", "exposed_pp_s", "exposed_dp_s",
                "exposed_offload_s", "bubble_s", "optimizer_s", "overhead_s", "calibration_s"):
        v = parts.get(key, 0.0)
        if v > 0 or key in ("compute_s", "bubble_s") or (key == "calibration_s" and v):
            label = "unmodelled (bias)" if key == "calibration_s" else \
                key[:-2].replace("exposed_", "exposed ").replace("_", " ")
            lines.append(f"   {label:<17} {fmt_s(v):>11}  {v / total:6.1%}")
    if b.get("recompute_s"):
        lines.append(f"   (recompute inside compute: {fmt_s(b['recompute_s'])})")
    dp = out.get("dataparallel")
    if dp:
        lines.append(f"DataParallel       {dp['step_time_s']:.3f} s; DDP on this machine {dp['ddp_step_time_s']:.3f} s "
                     f"-> switching to DDP is {dp['ddp_speedup']:.2f}x faster")
    ps = out.get("parameter_server")
    if ps:
        lines.append(f"parameter servers  {ps['workers']} workers x {ps['gpus_per_worker']} GPUs, {ps['num_ps']} PS "
                     f"({ps['placement']}): {ps['updates_per_s']:.2f} updates/s, bound by {ps['bottleneck']}; "
                     f"synchronous all-reduce {ps['sync_step_time_s']:.3f} s per global batch -> async is "
                     f"{ps['speedup_vs_sync']:.2f}x its throughput; staleness {ps['staleness_updates']:.0f} updates")
    srv = out.get("server")
    if srv:
        lines.append(f"server             {srv['design']}: {srv['sockets']} socket(s) {srv['cpu']}, "
                     f"{srv['pcie_switches']} PCIe switch(es), GPUs on {srv['gpu_link']}, p2p {srv['p2p']}"
                     + (f", NVLink bridges {srv['nvlink_bridges']}" if srv["nvlink_bridges"] else ""))
        for dim, b in srv["bottlenecks"].items():
            lines.append(f"   {dim} collectives bound by {b['link']}: {b['bytes_per_s'] / 1e9:.1f} GB/s per flow")
    for w in out["warnings"]:
        lines.append(f"warning: {w}")
    print("\n".join(lines))


# ------------------------------------------------------------------------- commands


def cmd_simulate(args: argparse.Namespace) -> int:
    from planner.commands.cmd_import import apply_recipe
    from planner.commands.inputs import cluster_from_args, model_from_args, seq_len_from_args
    from planner.report import priced, run_choices
    from sim.engines.run import resolve
    from sim.engines.simulate import simulate_run

    imported = apply_recipe(args, command="simulate")  # --recipe: the flags it states
    model = model_from_args(args)
    check_model_flags(args, model)
    cluster = cluster_from_args(args)
    whatif = _whatif_from_args(args)
    if args.trace is not None:
        check_file("trace", args.trace)
    run = resolve(model, cluster, args.strategy, run_choices(args), seq_len=seq_len_from_args(args))
    engine, note = _engine_for(args, run.plan, whatif)
    result = simulate_run(run, engine=engine, trace_path=args.trace, whatif=whatif,
                          explicit_ranks=args.explicit_ranks)
    out = priced(run, result)
    if note:
        out["warnings"] = [note] + list(out["warnings"])
    if imported is not None:
        out["recipe"] = {"path": imported.recipe.path, "format": imported.recipe.format,
                         "ignored_costly": [k.key for k in imported.recipe.ignored if k.cost == "yes"],
                         "warnings": list(imported.recipe.warnings)}
        out["warnings"] = list(out["warnings"]) + [f"recipe: {w}" for w in imported.recipe.warnings]
    if args.json:
        print_json(out)
    else:
        print_step_summary(out, model=model.name, gpu=cluster.gpu.id, num_gpus=cluster.num_gpus)
    return 0


def _engine_for(args: argparse.Namespace, plan, whatif) -> tuple[str, str | None]:
    """``--engine``, else the event engine unless the step is beyond what it schedules in about a
    minute (``sim.base.limits.EVENT_MAX_PIECES``) and nothing asked for it (what-ifs, a trace,
    explicit ranks): then the analytic engine, with a warning saying so."""
    from sim.engines.event.scenario import event_pieces
    from sim.base.limits import EVENT_MAX_PIECES

    if args.engine is not None:
        return args.engine, None
    needs_event = args.explicit_ranks or args.trace is not None or whatif is not None
    pieces = event_pieces(plan, explicit=args.explicit_ranks)
    if needs_event or pieces <= EVENT_MAX_PIECES:
        return "event", None
    return "analytic", (f"analytic engine: the event engine would schedule {pieces:,} pieces (limit "
                        f"{EVENT_MAX_PIECES:,}, about a minute on 2 cores: docs/interface.md Limits)")


def _whatif_from_args(args: argparse.Namespace) -> "object | None":
    from sim.engines.event.whatif import WhatIf, parse_layers_per_stage, parse_slow_link, parse_straggler

    if not (args.straggler or args.slow_link or args.layers_per_stage is not None):
        return None
    return WhatIf(stragglers=tuple(parse_straggler(x) for x in args.straggler),
                  slow_links=tuple(parse_slow_link(x) for x in args.slow_link),
                  layers_per_stage=(parse_layers_per_stage(args.layers_per_stage)
                                    if args.layers_per_stage is not None else None))


def _framework_records() -> list[dict]:
    """Framework profiles (catalogs/frameworks.yaml) as ``planner catalog`` lists them."""
    from dataclasses import asdict

    from sim.cost.framework import list_frameworks

    return [{**asdict(fw), "aliases": list(fw.aliases)} for fw in list_frameworks()]


def cmd_catalog(args: argparse.Namespace) -> int:
    from sim.data.catalog import catalog_records

    kinds = ("gpus", "links", "models", "frameworks", "hosts", "servers") if args.kind == "all" else (args.kind,)
    data = {k: (_framework_records() if k == "frameworks" else catalog_records(k)) for k in kinds}
    if args.json:
        print_json(data)
        return 0
    for k in kinds:
        print(f"{k}:")
        for rec in data[k]:
            aliases = rec.get("aliases") or []
            extra = f"  (aliases: {', '.join(aliases)})" if aliases else ""
            print(f"  {rec['id']:<22} {rec.get('name', '')}{extra}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from planner.commands.inputs import add_cluster_args, add_model_args, add_recipe_script_args
    from planner.commands.ps_args import add_ps_args

    parser = _Parser(prog="planner", description="Cluster design planner and simulator for large-model training")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("simulate", help="predict one training step of a model, cluster and strategy")
    add_model_args(p, recipe=True)
    add_cluster_args(p, recipe=True)
    p.add_argument("--strategy", default=None, help="e.g. tp=8,pp=16,mbs=1,gbs=1536,sp=1,recompute=selective "
                   "(required unless --recipe)")
    p.add_argument("--recipe", default=None, metavar="FILE",
                   help="a Megatron-LM / NeMo / Megatron-Bridge / torchtitan / DeepSpeed recipe: its model, strategy, "
                        "framework and cluster (flags given here win; `planner import FILE` shows the reading)")
    add_recipe_script_args(p)
    p.add_argument("--engine", choices=("analytic", "event"), default=None,
                   help="event: discrete-event simulation (default, unless the step is beyond its limit: "
                        "docs/interface.md Limits); analytic: closed forms, fast")
    p.add_argument("--framework", default=None,
                   help="framework profile (catalogs/frameworks.yaml, `planner catalog frameworks`); default: the "
                        "first of megatron-core, torchtitan, megatron-deepspeed that runs the strategy")
    p.add_argument("--attention", choices=ATTENTION_IMPLS, default=None,
                   help="attention kernel: flash (the GPU's best fused kernel), flash2 (FlashAttention-2), "
                        "flex (FlexAttention, torchtitan / Automodel), unfused (default: the framework profile's)")
    p.add_argument("--recompute-policy", choices=SELECTIVE_POLICIES, default=None,
                   help="what recompute=selective recomputes (default: the framework profile's; attention: "
                        "Korthikanti et al. 2022; op: torchtitan; mlp_up/mlp/moe_act/mla_up_proj: Megatron-Core "
                        "--recompute-modules)")
    p.add_argument("--moe-dispatcher", choices=MOE_DISPATCHERS, default=None,
                   help="MoE token dispatch: alltoall (NCCL), allgather, deepep (fused kernels); default: the profile's")
    p.add_argument("--moe-imbalance", type=float, default=None,
                   help="routed tokens of the busiest expert-parallel rank / the mean (default 1: balanced routing)")
    p.add_argument("--nccl", default=None, metavar="RELEASE",
                   help="the NCCL release the run uses, e.g. 2.20.3: its NVLS buffers per communicator and whether "
                        "it sets NVLS up across nodes (default: the GPU generation's, catalogs/runtime.yaml)")
    p.add_argument("--trace", default=None, help="write a Chrome trace-event JSON of the step (event engine)")
    w = p.add_argument_group("what-ifs (event engine)")
    w.add_argument("--explicit-ranks", action="store_true",
                   help="simulate every data-parallel replica instead of one rank per pipeline stage")
    w.add_argument("--straggler", action="append", default=[], metavar="RANK:PCT",
                   help="GPU RANK computes PCT%% slower (repeatable), e.g. 17:20")
    w.add_argument("--slow-link", action="append", default=[], metavar="TARGET:PCT",
                   help="links run PCT%% slower (100 = half bandwidth; repeatable); TARGET: scale-up, "
                        "host, scale-out, gpu:N, nic:N, node:N or leaf:N, e.g. node:3:100")
    w.add_argument("--layers-per-stage", default=None, metavar="N,N,...",
                   help="transformer layers of each pipeline stage, e.g. 22,26,26,22")
    p.add_argument("--calibration", default=None, help="calibration profile (file or name)")
    add_ps_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("catalog", help="list catalog ids")
    p.add_argument("kind", nargs="?", default="all",
                   choices=("all", "gpus", "links", "models", "frameworks", "hosts", "servers"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_catalog)

    for module in (cmd_recommend, cmd_check, cmd_validate, cmd_economics, cmd_import):  # subcommands in their own modules
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
            return EXIT_BAD_INPUT
        check_not_empty(args, argv)
        with progress.reporting(f"planner {args.command}"):  # long work reports on stderr
            return int(args.func(args) or 0)
    except InputError as exc:  # named by the flag the user typed (planner.commands.argcheck)
        text = typed_message(exc, argv, getattr(args, "flag_names", None))
        print(f"error: {one_line(text)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except UsageError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ValueError, OverflowError) as exc:  # input that slipped past the checks
        print(f"error: invalid input: {type(exc).__name__}: {one_line(str(exc))}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001  never a traceback for users
        print(f"error: internal: {type(exc).__name__}: {one_line(str(exc))}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
