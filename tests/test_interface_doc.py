"""docs/interface.md (the user-facing copy of the CLI contract) names only flags, strategy keys
and JSON keys that exist: every `--flag` is an option of some `planner` command, every key of
the STRATEGY paragraph parses, and every key of the simulate JSON table is in the output."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from planner.cli import build_parser, main
from sim.cost.plan import parse_strategy

DOC = (Path(__file__).resolve().parents[1] / "docs" / "interface.md").read_text()
SAMPLE = {"gbs": "8", "offload_device": "cpu", "recompute": "full", "precision": "bf16", "schedule": "1f1b", "offload": "none", "fp8_recipe": "delayed",
          "order": "tp-cp-dp-pp", "dp_impl": "ddp"}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    out = set()
    for action in parser._actions:
        out.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _options(sub)
    return out


def test_every_flag_named_exists():
    known = _options(build_parser())
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", DOC))
    assert named, "the doc names flags"
    assert named <= known, sorted(named - known)


def test_every_strategy_key_named_parses():
    para = DOC[DOC.index("`STRATEGY` is comma-separated"):DOC.index("Example: `tp=8")]
    groups = re.findall(r"`([a-z_, ]+)`\s*\(", para)  # each key is followed by its description
    keys = {k.strip() for g in groups for k in g.split(",")} - {""}
    assert {"tp", "pp", "dp", "cp", "ep", "vp", "mbs", "gbs", "zero", "sp", "recompute", "precision",
            "schedule", "etp"} <= keys
    for key in sorted(keys):
        value = SAMPLE.get(key, "1")
        text = {"dp": "dp=8", "sp": "tp=2,sp=1", "etp": "tp=2,etp=1", "vp": "pp=2,vp=1", "layout": "pp=2,layout=Et|tL",
                "recompute_num_layers": "recompute=full,recompute_num_layers=1",
                "recompute_method": "recompute=full,recompute_num_layers=1,recompute_method=block",
                "offload_num_layers": "zero=1,offload=activations,offload_num_layers=1"}.get(key, f"{key}={value}")
        parse_strategy(text, num_gpus=8)  # an unknown key is an InputError


def test_simulate_json_has_every_key_of_the_table(capsys):
    table = DOC[DOC.index("`--json` prints one JSON object with at least"):DOC.index("## `planner recommend`")]
    keys = [k for k, what in re.findall(r"^\| `([a-z_]+)` \| (.*)$", table, flags=re.M) if "only" not in what]
    assert len(keys) >= 9
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "8",
                 "--strategy", "mbs=1,gbs=8", "--engine", "analytic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(keys) <= set(out), sorted(set(keys) - set(out))
    assert {"compute_s", "exposed_comm_s", "bubble_s"} <= set(out["breakdown"])
    assert {"step_time_s_low", "step_time_s_high", "uncertainty"} <= set(out)
