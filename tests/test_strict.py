"""Strict, bounded inputs (issue 26), one section per kind: nothing hangs (work estimated and
bounded, or reported as it goes), nothing impossible is priced silently, messages name what the
user wrote, output paths that cannot be written are bad input, JSON is strict."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import simpy
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import progress
from planner.cli import main
from sim.base import limits
from sim.data.catalog import ENV_VAR, catalog_dir, get_model
from sim.net.clusters import cluster_from_catalog
from sim.base.errors import InfeasibleError, InputError
from sim.engines.event.engine import Engine
from sim.engines.event.resources import LinkTable
from sim.engines.event.scenario import Scenario, event_pieces
from sim.cost.costs import step_costs
from sim.base.jsonout import dumps, to_jsonable
from sim.net.network import Network
from sim.base.outpaths import check_file, check_folder
from sim.cost.plan import check_feasible, parse_strategy, vp_fits, vp_split
from sim.data.specs import Strategy
from tests.test_event_fixtures import tiny_plan

ROOT = Path(__file__).resolve().parent.parent


def _call(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _bad(argv: list[str]) -> str:
    code, _, err = _call(argv)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "internal" not in err and "Traceback" not in err, err
    return lines[0]


SIM = ["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--engine", "analytic"]


# ----------------------------------------------------------------------------- 1. nothing hangs


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 400), pp=st.integers(1, 48))
def test_vp_fits_is_the_brute_force_answer(layers: int, pp: int) -> None:
    """The interleaving hint, now O(pp + sqrt(layers)), lists exactly the vp that split evenly."""
    pp = min(pp, layers)
    m = replace(get_model("llama3-8b"), num_layers=layers)
    s = Strategy(pp=pp, dp=1, gbs=pp)
    brute = [v for v in range(2, layers + 1) if vp_split(m, s, vp=v) is not None and pp * v <= layers]
    assert vp_fits(m, s, shown=10**9) == (brute, False)


def test_vp_hint_on_a_very_deep_model_is_short_and_bounded() -> None:
    m = replace(get_model("llama3-8b"), num_layers=60000)
    cl = cluster_from_catalog("h100-80gb", 16)
    s = Strategy(pp=2, vp=7, dp=8, gbs=64, schedule="interleaved")
    with pytest.raises(InfeasibleError) as exc:
        check_feasible(m, cl, s)
    assert exc.value.field == "vp" and ", ...}" in exc.value.message and len(exc.value.message) < 400


def test_layer_count_is_bounded() -> None:
    with pytest.raises(InputError) as exc:
        replace(get_model("llama3-8b"), num_layers=limits.MAX_LAYERS + 1)
    assert exc.value.field == "model.num_layers" and str(limits.MAX_LAYERS) in exc.value.message


@settings(max_examples=25, deadline=None)
@given(p=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2]), k=st.integers(1, 3), v=st.sampled_from([1, 2]),
       zero=st.sampled_from([0, 1, 3]), layers=st.integers(1, 3),
       schedule=st.sampled_from(["1f1b", "interleaved", "zero-bubble"]), explicit=st.booleans())
def test_event_pieces_counts_the_pieces_the_engine_runs(p, dp, k, v, zero, layers, schedule, explicit) -> None:
    """The event engine's cost estimate bounds the pieces it schedules (one compute entry each)
    from above, within a factor of two (the embedding/head piece counted in every chunk)."""
    if p == 1:
        v, schedule = 1, "1f1b"
    if v == 1 and schedule == "interleaved":
        schedule = "1f1b"
    if v > 1 and schedule == "1f1b":
        schedule = "interleaved"
    plan = tiny_plan(p=p, m=p * k, v=v, dp=dp, zero=zero, layers_per_chunk=layers, schedule=schedule)
    net = Network(plan.cluster)
    eng = Engine(Scenario(plan, step_costs(plan, net), net, explicit=explicit), LinkTable(net))
    eng.run()
    pieces = sum(e.cat == "compute" for e in eng.log)
    assert pieces <= event_pieces(plan, explicit=explicit) <= 2 * pieces


def test_event_engine_beyond_its_limit_is_refused_or_replaced() -> None:
    argv = SIM[:-2] + ["--strategy", "tp=8,pp=2,mbs=1,gbs=2000000", "--json"]
    code, out, err = _call(argv)  # no --engine: the analytic engine, said in warnings
    assert code == 0, err
    d = json.loads(out)
    assert d["engine"] == "analytic" and any("event engine would schedule" in w for w in d["warnings"])
    line = _bad(argv + ["--engine", "event"])
    assert line.startswith("error: --engine=event:") and f"{limits.EVENT_MAX_PIECES:,}" in line
    line = _bad(argv + ["--trace", "/tmp/never-written.json"])  # a trace needs the event engine
    assert "--engine" not in line.split(":")[1] and "limit" in line


def _count_events(spec, seed=0) -> int:
    from planner.economics.campaign import simulate_campaign

    envs = []
    orig = simpy.Environment.__init__

    def init(self, *a, **kw):
        orig(self, *a, **kw)
        envs.append(self)

    simpy.Environment.__init__ = init
    try:
        simulate_campaign(spec, seed=seed)
    finally:
        simpy.Environment.__init__ = orig
    return next(envs[-1]._eid)


@pytest.mark.parametrize("days,per_day,interval,spares,repair_s", [
    (30, 5, 3600, 4, 86400),  # healthy
    (30, 50, 600, 4, 86400),  # spares run out: the job waits
    (1, 5000, 30, 4, 86400),  # hopeless, bounded by the spares
    (30, 100, 300, 1000, 86400),
])
def test_campaign_event_estimate_tracks_the_simulation(days, per_day, interval, spares, repair_s) -> None:
    from planner.economics.campaign import CampaignSpec, FailureMode, campaign_events

    rate = per_day / 86400.0
    spec = CampaignSpec(work_s=days * 86400.0, interval_s=interval, write_s=20.0, restart_s=300.0, restore_s=60.0,
                        modes=(FailureMode(name="gpu", rate_per_s=0.7 * rate, needs_node=True),
                               FailureMode(name="net", rate_per_s=0.3 * rate, needs_node=False)),
                        num_spares=spares, repair_s=repair_s)
    ratio = campaign_events(spec) / _count_events(spec)
    assert 0.8 <= ratio <= 1.5, ratio


def test_goodput_campaigns_beyond_the_limit_are_refused_with_the_limit() -> None:
    line = _bad(["goodput", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus", "16384", "--seeds", "5000"])
    assert line.startswith("error: --seeds=5000:") and f"{limits.CAMPAIGN_MAX_EVENTS:,}" in line


def test_schedule_counts_its_work_and_stops_at_the_limit(monkeypatch) -> None:
    monkeypatch.setattr(limits, "SCHEDULE_MAX_WORK", 20_000)
    line = _bad(["schedule", "--nodes", "512", "--generate", "300", "--policy", "fifo"])
    assert line.startswith("error: --generate=300:") and "20,000" in line and "jobs were done" in line


def test_progress_goes_to_stderr_only_while_reporting() -> None:
    buf = io.StringIO()
    progress.tick("searching", 1, 2, "layouts")  # no report active: nothing, anywhere
    with progress.reporting("planner x", stream=buf, after_s=0.0, every_s=0.0):
        progress.start("searching")
        progress.tick("searching", 1, 4, "layouts")
        with progress.silenced():
            progress.tick("searching", 2, 4, "layouts")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planner x: searching 25% (1/4 layouts)") and "left" in lines[0]


# ----------------------------------------------------------------------------- 3. nothing impossible priced silently


@pytest.mark.parametrize("nics,nic,needle", [
    ("64", "ib-ndr-400", "at most 4 per GPU"),
    ("16", "ib-ndr-400", "PCIe gen5 x16"),
])
def test_nics_per_node_beyond_the_server_are_refused(nics, nic, needle) -> None:
    line = _bad(SIM + ["--strategy", "tp=8", "--nics-per-node", nics, "--nic", nic])
    assert line.startswith(f"error: --nics-per-node={nics}:") and needle in line


def test_more_nics_than_gpus_within_the_bounds_is_priced_with_a_warning() -> None:
    code, out, err = _call(SIM + ["--strategy", "tp=8", "--nics-per-node", "16", "--nic", "eth-100", "--json"])
    assert code == 0, err
    assert any("striped over 2 NICs" in w for w in json.loads(out)["warnings"])


def test_a_named_servers_nic_ports_bound_the_count() -> None:
    line = _bad(["simulate", "--model", "llama3-8b", "--gpu", "l40s-48gb", "--num-gpus", "16", "--strategy", "tp=8",
                 "--nics-per-node", "9", "--engine", "analytic"])
    assert "holds 8 scale-out NIC ports" in line


def test_default_nics_follow_the_node_size() -> None:
    assert cluster_from_catalog("a100-80gb", 64, gpus_per_node=4).nics_per_node == 4
    assert cluster_from_catalog("a100-80gb", 64).nics_per_node == 8


@pytest.mark.parametrize("flag,value", [("--moe-imbalance", "2"), ("--moe-dispatcher", "deepep")])
def test_moe_flags_on_a_dense_model_are_refused(flag, value) -> None:
    for cmd in (SIM + ["--strategy", "tp=8"], ["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb",
                                                "--num-gpus", "16"]):
        line = _bad(cmd + [flag, value])
        assert line.startswith(f"error: {flag}=") and "no experts" in line


def test_fp8_recipe_without_fp8_is_refused() -> None:
    with pytest.raises(InputError) as exc:
        parse_strategy("tp=8,fp8_recipe=mxfp8", num_gpus=16)
    assert exc.value.field == "fp8_recipe" and "precision=fp8" in exc.value.message
    assert parse_strategy("tp=8,precision=fp8,fp8_recipe=mxfp8", num_gpus=16).fp8_recipe == "mxfp8"


@pytest.mark.parametrize("argv", [
    SIM + ["--strategy", "tp=8", "--framework", ""],
    SIM + ["--strategy", "tp=8", "--framework", "  "],
    ["check-published", "--ids", ","],
    ["check-published", "--ids", ""],
])
def test_empty_values_are_refused(argv) -> None:
    assert "error: " in _bad(argv)


def test_framework_of_another_family_than_the_export_is_refused() -> None:
    line = _bad(["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16",
                 "--framework", "megatron-core", "--export", "torchtitan"])
    assert line.startswith("error: --framework=megatron-core: conflicts with --export torchtitan")


def test_framework_of_the_same_family_exports_with_a_warning() -> None:
    code, out, err = _call(["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16",
                            "--framework", "torchtitan-compile", "--export", "torchtitan", "--rerank", "0",
                            "--no-suggest", "--json"])
    assert code == 0, err
    assert any("torchtitan-compile" in w for w in json.loads(out)["exports"]["torchtitan"]["warnings"])


def test_flags_that_do_not_apply_are_refused() -> None:
    base = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "64"]
    assert "with --mode local-sgd" in _bad(["comm-reduce", *base, "--strategy", "tp=8", "--mode", "compress",
                                            "--ratio", "4", "--sync-every", "3"])
    assert _bad(["goodput", *base, "--seq-len", "0", "--no-simulation"]).startswith("error: --seq-len=0:")


# A profile the validate loop wrote, mutated one value at a time.
BAD_VALUES = st.sampled_from([True, False, 2.5, -1, 0, float("nan"), float("inf"), "x", None, [], {}, 1e300])
PROFILE_KEYS = st.sampled_from([
    ("host", "ranks_per_host"), ("host", "host_cores"), ("host", "threads_per_rank"), ("host", "num_nodes"),
    ("host", "device_type"), ("host", "compute_dtype"), ("efficiency", "kernel_overhead_s"),
    ("efficiency", "attention_fwd_vs_matmul"), ("memory", "workspace_bytes"), ("memory", "fragmentation_fraction"),
    ("memory", "nccl_bytes"), ("device", "hbm_tb_per_s"), ("device", "hbm_gib"), ("device", "nics_per_node"),
    ("device", "hbm_efficiency"), ("fit", "kernel_overhead_s"), ("schema_version",), ("id",)])


@functools.cache
def _profile_text() -> str:
    from sim.cost.calibration import list_calibrations, load_calibration

    base = yaml.safe_load(Path(load_calibration(list_calibrations()[0]).path).read_text(encoding="utf-8"))
    return json.dumps(base)


@settings(max_examples=60, deadline=None)
@given(key=PROFILE_KEYS, bad=BAD_VALUES)
def test_calibration_profiles_are_validated_like_catalogs(key, bad) -> None:
    from sim.cost.calibration import calibration_from_dict

    data = json.loads(_profile_text())
    node = data
    for k in key[:-1]:
        node = node[k]
    node[key[-1]] = bad
    try:
        cal = calibration_from_dict(data, path="/x/prof.yaml")
    except InputError as exc:
        assert str(exc.field).startswith(("calibration", "gpu[")), exc.field
        return
    # accepted: the value is a valid one for that key, kept with its type
    if key[0] == "host" and key[-1] in ("ranks_per_host", "host_cores", "threads_per_rank", "num_nodes"):
        optional = key[-1] in ("threads_per_rank", "num_nodes")
        assert (bad is None and optional) or (isinstance(bad, int) and not isinstance(bad, bool) and bad >= 1)
    for v in list(cal.memory.values()) + list(cal.efficiency.values()):
        assert math.isfinite(v)


def test_json_output_is_strict() -> None:
    obj = {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": np.float64("nan"), "d": np.int64(3),
           "e": np.array([1.0, np.nan]), "f": (1, 2), "g": Path("/x"), 4: {True: None}}
    text = dumps(obj)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": [None, None, 1.5], "c": None, "d": 3, "e": [1.0, None], "f": [1, 2],
                                "g": "/x", "4": {"True": None}}
    assert to_jsonable(np.bool_(True)) is True


def test_check_published_json_has_no_nan() -> None:
    code, out, err = _call(["check-published", "--ids", "megatron-sc21-t1-gpt1.7b-32gpu", "--json"])
    assert code == 0, err
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))


# ----------------------------------------------------------------------------- 4. messages name what the user wrote


def test_errors_name_the_flag_as_typed() -> None:
    assert _bad(SIM[:-4] + ["--num-gpus", "0", "--strategy", "tp=8"]).startswith("error: --num-gpus=0:")
    assert _bad(SIM[:-4] + ["--num-gpus=0", "--strategy", "tp=8"]).startswith("error: --num-gpus=0:")
    assert _bad(["schedule", "--nodes", "4", "--generate", "0"]).startswith("error: --generate=0:")
    assert _bad(SIM + ["--strategy", "tp=8", "--sockets", "2"]).startswith("error: --sockets=2:")


def _catalog_copy(tmp_path: Path, file: str, edit) -> None:
    shutil.copytree(catalog_dir(), tmp_path / "c")
    p = tmp_path / "c" / file
    data = yaml.safe_load(p.read_text(encoding="utf-8"))
    edit(data)
    p.write_text(yaml.safe_dump(data), encoding="utf-8")


@pytest.mark.parametrize("file,record,key,value", [
    ("gpus.yaml", "h100-80gb", "hbm_tb_per_s", 1e300),
    ("gpus.yaml", "h100-80gb", "dense_tflops", {"bf16": 1e300}),
    ("gpus.yaml", "h100-80gb", "hbm_efficiency", 1.5),
    ("gpus.yaml", "h100-80gb", "pcie_lanes", 64),
    ("links.yaml", "ib-ndr-400", "gbit_per_s_per_direction", 1e300),
])
def test_catalog_errors_name_the_file_and_key(tmp_path, monkeypatch, file, record, key, value) -> None:
    def edit(data):
        next(r for r in data["records"] if r["id"] == record)[key] = value
    _catalog_copy(tmp_path, file, edit)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "c"))
    line = _bad(SIM + ["--strategy", "tp=8"])
    assert f"[{record}].{key}" in line and file in line


def test_a_malformed_fitted_efficiency_names_its_file_and_key(tmp_path, monkeypatch) -> None:
    _catalog_copy(tmp_path, "efficiency.yaml", lambda d: d["fitted"]["scale_out"].update(bandwidth_efficiency=-1))
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "c"))
    line = _bad(SIM + ["--strategy", "tp=8"])
    assert "efficiency.fitted.scale_out.bandwidth_efficiency" in line and "efficiency.yaml" in line


@pytest.mark.parametrize("path,value", [
    (("strategy", "global_batch"), "1024"),
    (("strategy", "tp"), 2.5),
    (("num_gpus", ), True),
    (("model", "layers"), None),
    (("measured", "mfu"), float("nan")),
    (("hardware", ), "h100"),
])
def test_reference_rows_are_checked_naming_file_row_and_field(path, value) -> None:
    from planner.fitting.refcheck import check_row
    from planner.fitting.published import load_runs

    row = json.loads(json.dumps(load_runs("published")[0]))
    node = row
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    with pytest.raises(InputError) as exc:
        check_row(row, file="published_runs.yaml", index=0)
    assert exc.value.field.startswith(f"run[{row['id']}].{path[0]}") and "published_runs.yaml" in exc.value.message


def test_the_shipped_reference_rows_pass_the_check() -> None:
    from planner.fitting.reference import load_reference

    assert len(load_reference()) > 100


# ----------------------------------------------------------------------------- 5. output paths


@pytest.mark.parametrize("path,needle", [
    ("/proc/planner-trace.json", "virtual proc"),
    ("/sys/planner-trace.json", "virtual sysfs"),
    ("/nonexistent-folder/t.json", "does not exist"),
    ("/tmp", "is a folder"),
    ("/dev/full", "No space left"),
])
def test_a_trace_that_cannot_be_written_is_bad_input(path, needle) -> None:
    line = _bad(["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--strategy", "tp=8",
                 "--trace", path])
    assert line.startswith(f"error: --trace={path}:") and needle in line


@pytest.mark.parametrize("path", ["/proc/planner-out", "/sys/kernel/planner-out", "/etc/passwd"])
def test_an_export_folder_that_cannot_be_written_is_refused_before_the_search(path) -> None:
    line = _bad(["recommend", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--export",
                 "megatron", "--out", path])
    assert line.startswith(f"error: --out={path}:")


def test_output_checks_accept_writable_places_and_create_nothing(tmp_path) -> None:
    assert check_file("out", tmp_path / "x.json") == tmp_path / "x.json"
    assert check_folder("out", tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists() and not (tmp_path / "x.json").exists()
    assert check_file("out", "/dev/null")


PATHS = st.sampled_from(["/proc/x.json", "/sys/x", "/nonexistent/x/y.json", "/tmp", "/dev/full", "/etc/passwd/x",
                         "", " ", "/proc/self/status", "/dev/null"])


@settings(max_examples=30, deadline=None)
@given(path=PATHS, cmd=st.sampled_from(["trace", "fit-out"]))
def test_output_paths_fuzz_never_internal(path, cmd, tmp_path_factory) -> None:
    if cmd == "trace":
        argv = ["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16", "--strategy", "tp=8",
                "--trace", path]
    else:
        meas = tmp_path_factory.mktemp("m") / "measurements.json"
        meas.write_text(json.dumps({"workloads": [], "microbench": [], "env": {}}), encoding="utf-8")
        argv = ["validate", "fit", str(meas), "--out", path]
    code, _, err = _call(argv)
    assert code in (0, 2) and "internal" not in err and "Traceback" not in err, err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
