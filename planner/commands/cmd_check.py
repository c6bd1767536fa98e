"""``planner check-published``: predicted vs published step time, MFU/HFU and memory.

Every reference row the project ships (``catalogs/reference/``: the 30 published runs and the
81-run development set); ``--loso`` predicts each source with the model fitted without that
source's data (``planner.fitting.published.compare_all(loso=True)``).  The table ends with the figures
per source and overall; rows that cannot be simulated are listed with the reason.
"""

from __future__ import annotations

import argparse
import math

from sim.base.jsonout import print_json
from sim.base.units import GIB

from planner.commands.argcheck import id_list


def _pct(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1%}"


def _frac(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"


def _util(d: dict) -> str:
    if d["published_hfu"] is not None and d["published_mfu"] is None:
        return f"HFU {_frac(d['published_hfu'])}/{_frac(d['predicted_hfu'])}"
    if d["published_mfu"] is not None:
        return f"MFU {_frac(d['published_mfu'])}/{_frac(d['predicted_mfu'])}"
    return f"MFU -/{_frac(d['predicted_mfu'])}"


def cmd_check_published(args: argparse.Namespace) -> int:
    from planner.fitting.published import compare_all, load_runs, summary, summary_by_source
    from planner.fitting.uncertainty import band_coverage, residual_rows
    from sim.base.errors import InputError

    file = None if args.file == "all" else args.file
    known = [r["id"] for r in load_runs(file)]
    if args.list:
        for i in known:
            print(i)
        return 0
    ids = id_list("ids", args.ids)  # an empty list is bad input, not "every run"
    if ids is not None:
        for i in ids:
            if i not in known:
                raise InputError("ids", i, "unknown run id; see `planner check-published --list`")
    rows, skipped = compare_all(engine=args.engine, ids=ids, file=file, with_skipped=True, loso=args.loso)
    summ, by_source = summary(rows), summary_by_source(rows)
    residuals = residual_rows(rows)
    if len({r.source for r in residuals}) > 1:  # band coverage (planner.fitting.uncertainty): LOSO with --loso
        cov = band_coverage(residuals, loso=args.loso)
        summ.update(band_coverage=cov["coverage"], band_coverage_by_class=cov["by_class"],
                    band_coverage_by_family=cov["by_family"], band_coverage_by_mix=cov["by_mix"],
                    estimate=cov["estimate"])
    if args.json:
        print_json({"loso": bool(args.loso), "runs": [r.as_dict() for r in rows], "summary": summ,
                    "sources": by_source, "skipped": [s.as_dict() for s in skipped]})
        return 0
    head = (f"{'run':<58} {'pub s':>9} {'pred s':>9} {'err':>7}  {'util (src def)':>18}  "
            f"{'mem GiB pub/pred':>17} {'err':>7}")
    print(("leave-one-source-out: each source predicted by the fit without its data\n" if args.loso else "") + head)
    print("-" * len(head))
    for r in rows:
        d = r.as_dict()
        mem = ""
        if d["published_memory_bytes"] is not None:
            mem = f"{d['published_memory_bytes'] / GIB:.1f}/{d['predicted_memory_bytes'] / GIB:.1f}"
        pub = "OOM" if d["published_out_of_memory"] else f"{d['published_step_time_s']:9.3f}"
        print(f"{d['id'][:58]:<58} {pub:>9} {d['predicted_step_time_s']:9.3f} "
              f"{_pct(d['step_time_error']):>7}  {_util(d):>18}  {mem:>17} {_pct(d['memory_error']):>7}")
    print("-" * len(head))
    print(f"{'source':<36} {'runs':>4} {'median':>7} {'p90':>7} {'max':>7} {'signed':>7}   {'memory runs':>11} "
          f"{'median':>7}")
    for src, s in list(by_source.items()) + [("all", summ)]:
        print(f"{src[:36]:<36} {s['num_runs']:>4} {_frac(s['median_abs_step_error']):>7} "
              f"{_frac(s['p90_abs_step_error']):>7} {_frac(s['max_abs_step_error']):>7} "
              f"{_pct(s['signed_median_step_error']):>7}   "
              f"{s['num_memory_rows']:>11} {_frac(s['median_abs_memory_error']) if s['num_memory_rows'] else '':>7}")
    if "band_coverage" in summ:
        by = ", ".join(f"{k} {v['coverage']:.0%} of {v['runs']}" for k, v in summ["band_coverage_by_class"].items())
        print(f"80% band coverage ({'leave-one-source-out' if args.loso else 'in-sample'}): "
              f"{summ['band_coverage']:.0%} overall; {by}")
    print(f"signed median step error (predicted/published - 1): {_pct(summ['signed_median_step_error'])}")
    print(f"runs that ran but the memory model says do not fit: {summ['num_ran_predicted_out_of_memory']} of "
          f"{len(rows)}")
    if "estimate" in summ:  # the number planner simulate/recommend show: the model x the bias of runs like it
        e = summ["estimate"]
        print(f"calibrated estimate ({'bias fitted without the scored source' if args.loso else 'in-sample'}): "
              f"median {_frac(e['median_abs_step_error'])}, p90 {_frac(e['p90_abs_step_error'])}, "
              f"max {_frac(e['max_abs_step_error'])}, signed {_pct(e['signed_median_step_error'])}")
    for s in skipped:
        print(f"not simulated: {s.run_id}: {s.reason}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-published",
                       help="simulate every reference run and compare with its source")
    p.add_argument("--engine", choices=("analytic", "event"), default="analytic")
    p.add_argument("--loso", action="store_true",
                   help="leave one source out: predict each source with the model fitted without its data")
    p.add_argument("--file", choices=("all", "published", "dev"), default="all",
                   help="which reference file (default: both)")
    p.add_argument("--ids", default=None, help="comma-separated run ids (default: all)")
    p.add_argument("--list", action="store_true", help="list the reference run ids")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check_published)
