"""``planner import FILE`` and the ``--recipe`` hook of ``simulate`` and ``recommend``.

``planner import`` prints what a training recipe means to the planner (``planner.recipes``):
the model, the framework profile, the strategy, the pipeline layout and, one per line, every key
it ignored with whether that key changes what a step costs.  ``apply_recipe`` turns a recipe
into the inputs the command-line flags would give (model, strategy string, GPU count, GPUs per
node, sequence length, framework, kernels), leaving every flag the user gave as it is, so
``simulate --recipe`` and ``recommend --recipe`` run the same code as with flags.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from sim.base.errors import InputError
from sim.base.jsonout import print_json
from sim.data.layout import format_layout, rank_chunks
from sim.engines.run import RunChoices
from sim.data.specs import Model, Strategy

from planner.recipes.base import Recipe

# what `recommend --keep` can pin, and the recommend flag each one sets
KEEPABLE: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "vp", "mbs", "zero", "sp", "recompute", "schedule",
                             "offload", "offload_device", "precision")


def register(sub: argparse._SubParsersAction) -> None:
    from planner.commands.inputs import add_cluster_args, add_recipe_script_args

    p = sub.add_parser("import", help="read a Megatron-LM, NeMo / Megatron-Bridge, torchtitan or DeepSpeed recipe")
    p.add_argument("recipe", metavar="FILE", help="a launch script or args file, a YAML config, a torchtitan TOML "
                   "or a DeepSpeed JSON")
    p.add_argument("--model", default=None, help="the model (catalog id, model file or Hugging Face config.json) "
                   "when the recipe names none or to replace its architecture")
    add_cluster_args(p, required=False, recipe=True)
    add_recipe_script_args(p)
    p.set_defaults(gpu=None, num_gpus=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_import)


@dataclass(slots=True)
class Imported:
    recipe: Recipe
    model: Model | None
    num_gpus: int | None
    strategy: Strategy | None
    missing: str = ""  # why no strategy (no model, no GPU count)


def load(path: str, *, model_arg: str | None, num_gpus: int | None, seq_len: int | None,
         script_args: list[str] | None = None, script_env: dict[str, str] | None = None) -> Imported:
    """Read ``path`` (a launch script run with ``script_args`` in ``script_env``); the strategy
    when the model and the GPU count are known."""
    from planner.recipes import read_recipe, resolve
    from sim.data.models import load_model

    model = load_model(model_arg) if model_arg is not None else None
    recipe = read_recipe(path, model=model, script_args=script_args or (), script_env=script_env)
    model = model or recipe.model
    n = num_gpus or recipe.num_gpus
    if n is None and recipe.dp is not None:  # torchtitan degrees / DeepSpeed batch identity
        st = recipe.settings
        n = recipe.dp * int(st.get("tp", 1)) * int(st.get("pp", 1)) * int(st.get("cp", 1))  # type: ignore[call-overload]
    if model is None:
        return Imported(recipe=recipe, model=None, num_gpus=n, strategy=None, missing=recipe.model_note)
    if n is None:
        return Imported(recipe=recipe, model=model, num_gpus=None, strategy=None,
                        missing="the recipe states no GPU count: give --num-gpus")
    return Imported(recipe=recipe, model=model, num_gpus=n, strategy=resolve(recipe, model=model, num_gpus=n,
                                                                             seq_len=seq_len))


def cmd_import(args: argparse.Namespace) -> int:
    from planner.commands.inputs import recipe_script_from_args, seq_len_from_args

    words, env = recipe_script_from_args(args)
    imp = load(args.recipe, model_arg=args.model, num_gpus=args.num_gpus, seq_len=seq_len_from_args(args),
               script_args=words, script_env=env)
    from planner.recipes import summary

    out = summary(imp.recipe, imp.strategy, model=imp.model, num_gpus=imp.num_gpus)
    if imp.missing:
        out["strategy_missing"] = imp.missing
    if imp.strategy is not None and imp.strategy.pipeline_layout is not None:
        out["pipeline_layout_canonical"] = format_layout(imp.strategy.pipeline_layout)
    if args.json:
        print_json(out)
        return 0
    print_import(imp)
    return 0


def _layout_lines(s: Strategy) -> list[str]:
    assert s.pipeline_layout is not None
    rows = rank_chunks(s.pipeline_layout, s.pp)
    out = []
    for i, row in enumerate(rows):
        cells = []
        for ch in row:
            parts = []
            for sym, name in (("E", "embedding"), ("t", "layers"), ("m", "MTP"), ("L", "loss")):
                n = ch.count(sym)
                if n:
                    parts.append(f"{n} {name}" if sym in "tm" else name)
            cells.append("+".join(parts) or "(empty)")
        out.append(f"   rank {i:>3}: " + " | ".join(cells))
    return out


def print_import(imp: Imported) -> None:
    r = imp.recipe
    lines = [f"recipe             {r.path}",
             f"format             {r.dialect} [{r.format}; key names of {r.versions}]",
             f"framework          {r.framework}",
             f"model              {imp.model.name if imp.model else '(none)'}  ({r.model_note})"]
    if imp.num_gpus:
        lines.append(f"GPUs               {imp.num_gpus}" + (f" ({r.gpus_per_node} per node)" if r.gpus_per_node else ""))
    if imp.strategy is not None:
        s = imp.strategy
        lines.append(f"strategy           {s.to_string()}")
        lines.append(f"   degrees tp={s.tp} pp={s.pp} vp={s.vp} cp={s.cp} dp={s.dp} ep={s.ep} etp={s.expert_tp}; "
                     f"micro-batch {s.mbs}, global batch {s.gbs} ({s.num_microbatches} micro-batches), "
                     f"sequence {s.seq_len}")
        zero = {0: "none", 1: "ZeRO-1 / distributed optimizer", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}[s.zero]
        lines.append(f"   sharding {zero}" + (f" (HSDP over {s.dp_shard})" if s.dp_shard else "")
                     + f"; sequence parallel {'on' if s.sp else 'off'}; recompute {s.recompute}"
                     + (f" ({s.recompute_method}" + (f", {s.recompute_num_layers} layers" if s.recompute_num_layers else "")
                        + ")" if s.recompute_method else "")
                     + f"; offload {s.offload}" + (f" ({s.offload_num_layers} layers)" if s.offload_num_layers else ""))
        overlaps = [n for n in ("tp_overlap", "dp_overlap", "pp_overlap", "ep_overlap", "cuda_graphs") if getattr(s, n)]
        lines.append(f"   precision {s.precision}" + (f" ({s.fp8_recipe})" if s.precision == "fp8" else "")
                     + (", fp8 parameters" if s.fp8_params else "")
                     + f"; schedule {s.schedule}; overlaps: {', '.join(overlaps) or 'none'}")
        if s.pipeline_layout is not None:
            lines.append(f"pipeline layout    {format_layout(s.pipeline_layout)}  (from {r.layout})")
            lines += _layout_lines(s)
        elif r.layout:
            lines.append(f"pipeline layout    the default split (from {r.layout})")
    else:
        lines.append(f"strategy           not resolved: {imp.missing}")
    if r.plan:
        lines.append("kernels            " + ", ".join(f"{k}={v}" for k, v in r.plan.items()))
    ign = r.ignored
    lines.append(f"ignored keys ({len(ign)}; changes cost: yes = not modelled, may move the step time or memory):")
    for k in ign:
        val = k.value if not isinstance(k.value, (list, dict)) else json.dumps(k.value)[:60]
        lines.append(f"   {k.key} = {val}   changes cost: {k.cost}" + (f" ({k.note})" if k.note else ""))
    for w in r.warnings:
        lines.append(f"warning: {w}")
    print("\n".join(lines))


def apply_recipe(args: argparse.Namespace, *, command: str) -> Imported | None:
    """With ``--recipe``: fill in the flags the user did not give from the recipe (module
    docstring) and return what was read; without it, check the flags the recipe would supply."""
    from planner.commands.inputs import recipe_script_from_args, seq_len_from_args

    path = getattr(args, "recipe", None)
    words, env = recipe_script_from_args(args)
    if path is None:
        if words or env:
            raise InputError("recipe-args" if words else "recipe-env", args.recipe_args if words else
                             ",".join(args.recipe_env), "needs --recipe FILE (the launch script it is passed to)")
        if args.model is None:
            raise InputError("model", None, "is required (or --recipe FILE)")
        if args.num_gpus is None:
            raise InputError("num-gpus", None, "is required (or a --recipe that states the cluster)")
        if command == "simulate" and args.strategy is None:
            raise InputError("strategy", None, "is required (or --recipe FILE)")
        return None
    imp = load(path, model_arg=args.model, num_gpus=args.num_gpus, seq_len=seq_len_from_args(args),
               script_args=words, script_env=env)
    if imp.strategy is None or imp.model is None:
        raise InputError("recipe", path, imp.missing)
    r, s = imp.recipe, imp.strategy
    args.model = imp.model
    args.num_gpus = imp.num_gpus
    n = imp.num_gpus or 0
    if args.gpus_per_node is None and r.gpus_per_node and (n <= r.gpus_per_node or n % r.gpus_per_node == 0):
        args.gpus_per_node = min(r.gpus_per_node, n)
    if args.seq_len is None:
        args.seq_len = s.seq_len
    if getattr(args, "framework", None) is None:
        args.framework = r.framework
    for key, flag in (("attention", "attention"), ("selective_policy", "recompute_policy"),
                      ("moe_dispatcher", "moe_dispatcher")):
        if key in r.plan and getattr(args, flag, None) is None and hasattr(args, flag):
            setattr(args, flag, r.plan[key])
    if command == "simulate":
        if args.strategy is None:  # --strategy given with --recipe: the recipe's model and cluster, that strategy
            args.strategy = s.to_string()
    else:
        if args.gbs is None and getattr(args, "batch_tokens", None) is None:
            args.gbs = s.gbs
        if args.precision is None:  # the recipe's numerics stay unless asked
            args.precision = s.precision
        keep = [k.strip().lower() for k in str(args.keep or "").split(",") if k.strip()]
        if keep == ["all"]:
            keep = list(KEEPABLE)
        for k in keep:
            if k not in KEEPABLE:
                raise InputError("keep", k, f"must be one of {', '.join(KEEPABLE)} or all")
            value = getattr(s, k) if k != "etp" else s.expert_tp
            if k == "sp":
                value = int(s.sp)
            if k == "offload_device":
                args.offload_device = value
                continue
            setattr(args, k, str(value))
        if "vp" in keep and s.pipeline_layout is not None:
            raise InputError("keep", "vp", "the recipe's pipeline layout is not searched; keep pp and vp without it "
                             "or simulate the recipe (`planner simulate --recipe`)")
    return imp


def recipe_report(imp: Imported, best_step_time_s: float | None, *, cluster, choices: RunChoices) -> dict:
    """The recipe's own plan priced as ``planner simulate --recipe`` prices it (``sim.engines.run.resolve``
    with the recipe's framework and overrides, the calibrated estimate), for ``recommend
    --recipe``; ``best_step_time_s`` is the best plan's calibrated estimate."""
    from planner.report import priced
    from sim.engines.run import resolve
    from sim.engines.simulate import simulate_run

    assert imp.strategy is not None and imp.model is not None
    run = resolve(imp.model, cluster, imp.strategy, choices)
    res = priced(run, simulate_run(run))
    out = {"recipe": imp.recipe.path, "strategy": imp.strategy.to_string(), "framework": run.framework.id,
           "step_time_s": res["step_time_s"], "fits_memory": res["fits_memory"],
           "memory_device_bytes": res["memory_device_bytes"]}
    if best_step_time_s:
        out["best_speedup"] = float(res["step_time_s"]) / best_step_time_s
    return out
