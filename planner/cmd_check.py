"""``planner check-published``: predicted vs published step time, MFU/HFU and memory."""

from __future__ import annotations

import argparse
import json
import math


def _pct(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1%}"


def _frac(x: float | None) -> str:
    return "" if x is None else f"{x:.1%}"


def cmd_check_published(args: argparse.Namespace) -> int:
    from planner.published import compare_all, load_runs, summary
    from sim.errors import InputError

    ids = None
    if args.ids:
        ids = [i.strip() for i in args.ids.split(",") if i.strip()]
        known = {r["id"] for r in load_runs()}
        for i in ids:
            if i not in known:
                raise InputError("ids", i, "unknown run id; see `planner check-published --list`")
    if args.list:
        for r in load_runs():
            print(r["id"])
        return 0
    rows = compare_all(engine=args.engine, ids=ids)
    summ = summary(rows)
    if args.json:
        print(json.dumps({"runs": [r.as_dict() for r in rows], "summary": summ}, indent=2))
        return 0
    head = (f"{'run':<58} {'pub s':>8} {'pred s':>8} {'err':>7}  {'util (src def)':>18}  "
            f"{'mem GiB pub/pred':>17} {'err':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        d = r.as_dict()
        if d["published_hfu"] is not None and d["published_mfu"] is None:
            util = f"HFU {_frac(d['published_hfu'])}/{_frac(d['predicted_hfu'])}"
        elif d["published_mfu"] is not None:
            util = f"MFU {_frac(d['published_mfu'])}/{_frac(d['predicted_mfu'])}"
        else:
            util = f"MFU -/{_frac(d['predicted_mfu'])}"
        mem = ""
        if d["published_memory_bytes"] is not None:
            mem = f"{d['published_memory_bytes'] / 2**30:.1f}/{d['predicted_memory_bytes'] / 2**30:.1f}"
        print(f"{d['id'][:58]:<58} {d['published_step_time_s']:8.3f} {d['predicted_step_time_s']:8.3f} "
              f"{_pct(d['step_time_error']):>7}  {util:>18}  {mem:>17} {_pct(d['memory_error']):>7}")
    print("-" * len(head))
    print(f"step time: median |error| {summ['median_abs_step_error']:.1%}, mean {summ['mean_abs_step_error']:.1%}, "
          f"worst {summ['max_abs_step_error']:.1%} over {summ['num_runs']} runs")
    if summ["num_memory_rows"]:
        print(f"memory:    median |error| {summ['median_abs_memory_error']:.1%}, worst "
              f"{summ['max_abs_memory_error']:.1%} over {summ['num_memory_rows']} runs that publish it")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-published",
                       help="simulate every published reference run and compare with its source")
    p.add_argument("--engine", choices=("analytic", "event"), default="analytic")
    p.add_argument("--ids", default=None, help="comma-separated run ids (default: all)")
    p.add_argument("--list", action="store_true", help="list the reference run ids")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check_published)
