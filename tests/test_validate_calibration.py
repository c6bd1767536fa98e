"""sim.cost.calibration: loading profiles, standing in for catalog hardware, the CLI hook, layering."""

import ast
import json
from pathlib import Path

import pytest

from sim.cost.calibration import calibration_dir, dump_profile, list_calibrations, load_calibration
from sim.base.errors import InputError
from tests.test_validate_fit import ENV, synthetic_records
from validate.profile import fit_profile

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def profile(tmp_path):
    prof = fit_profile(synthetic_records(), ENV, profile_id="cpu-test")
    return dump_profile(prof, tmp_path / "cpu-test.yaml", header="synthetic")


@pytest.fixture
def model_file(tmp_path):
    p = tmp_path / "gpt-s.yaml"
    p.write_text("name: gpt-s\nnum_layers: 4\nhidden_size: 256\nnum_attention_heads: 4\n"
                 "ffn_hidden_size: 1024\nffn_type: gelu\nvocab_size: 4096\n", encoding="utf-8")
    return p


def test_committed_profiles_load_and_carry_provenance():
    names = list_calibrations()
    assert names, f"no profile committed in {calibration_dir()}"
    for name in names:
        cal = load_calibration(name)
        assert cal.source and "planner validate" in cal.source
        assert cal.gpu.source and cal.scale_up is not None and cal.scale_up.source
        text = Path(cal.path).read_text(encoding="utf-8")
        assert text.startswith("#"), "profiles start with a provenance header"


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(InputError) as exc:
        load_calibration("no-such-profile")
    assert exc.value.field == "calibration" and "known:" in str(exc.value)


@pytest.mark.parametrize("text,field", [
    ("{", "calibration"),
    ("schema_version: 1\nid: x\n", "calibration.device"),
    ("schema_version: 7\nid: x\n", "calibration.schema_version"),
    ("- 1\n- 2\n", "calibration.file"),
])
def test_malformed_profiles_fail_with_the_field(tmp_path, text, field):
    p = tmp_path / "bad.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as exc:
        load_calibration(str(p))
    assert exc.value.field == field


def test_element_size_and_core_sharing(profile):
    cal = load_calibration(str(profile))
    g = cal.gpu
    two = cal.device_for(2)  # as measured: 2 ranks on 2 cores, fp32 = 2x the model's bf16 bytes
    assert two.peak_flops_per_s("bf16") == pytest.approx(g.peak_flops_per_s("bf16"))
    assert two.hbm_bytes_per_s == pytest.approx(g.hbm_bytes_per_s / 2)
    four = cal.device_for(4)  # 4 ranks time-share the 2 measured ranks' cores
    assert four.peak_flops_per_s("bf16") == pytest.approx(g.peak_flops_per_s("bf16") / 2)
    assert four.hbm_bytes_per_s == pytest.approx(g.hbm_bytes_per_s / 4)
    assert cal.device_for(1).peak_flops_per_s("bf16") == pytest.approx(g.peak_flops_per_s("bf16"))


def test_apply_plan_puts_the_plan_on_the_measured_links(profile):
    """Two calibrated ranks: ring all-reduce = S/B + 2 alpha with the fitted B and alpha."""
    from sim.data.catalog import get_model, get_nic
    from sim.net.network import Network
    from sim.cost.plan import Plan
    from sim.data.hardware import Cluster
    from sim.data.specs import Strategy

    cal = load_calibration(str(profile))
    gpu = cal.gpu
    cluster = Cluster(gpu=gpu, num_gpus=2, nic=get_nic(gpu.default_nic), gpus_per_node=2, nvlink_domain=2,
                      nics_per_node=1)
    plan = Plan(model=get_model("llama3-8b"), cluster=cluster, strategy=Strategy(dp=2, gbs=2, seq_len=512))
    applied = cal.apply_plan(plan)
    assert applied.cluster.gpu.id == "cpu-test" and applied.cluster.scale_up == cal.scale_up
    net = Network(applied.cluster, **cal.network_kwargs(applied.cluster))
    B, a = cal.scale_up.bytes_per_s_per_direction, cal.scale_up.latency_s
    S = 8e6
    assert net.collective_time_s("all_reduce", [0, 1], S) == pytest.approx(S / B + 2 * a, rel=1e-6)


def _planner(*argv):
    from planner.cli import main

    return main(list(argv))


def test_simulate_cli_uses_the_profile(profile, model_file, capsys):
    """``--gpu <profile id> --calibration <profile>`` simulates on the measured device and says so."""
    base = ["simulate", "--model", str(model_file), "--num-gpus", "2",
            "--seq-len", "256", "--strategy", "dp=2,mbs=2,gbs=4", "--json"]
    assert _planner(*base, "--gpu", "a100-80gb") == 0
    plain = json.loads(capsys.readouterr().out)
    assert _planner(*base, "--gpu", "cpu-test", "--calibration", str(profile)) == 0
    cal = json.loads(capsys.readouterr().out)
    assert cal["gpu"] == "cpu-test"
    assert cal["step_time_s"] > 10 * plain["step_time_s"]  # a CPU, not an A100
    assert 0 < cal["step_time_s"] < 10
    assert _planner(*base[:-1], "--gpu", "cpu-test", "--calibration", str(profile)) == 0
    assert "on 2 x cpu-test" in capsys.readouterr().out


def test_simulate_cli_gpu_that_does_not_match_the_profile_is_one_line_exit_2(profile, model_file, capsys):
    rc = _planner("simulate", "--model", str(model_file), "--gpu", "a100-80gb", "--num-gpus", "2",
                  "--strategy", "dp=2", "--calibration", str(profile))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("error: --gpu") and "a100-80gb" in err and "cpu-test" in err and "Traceback" not in err


def test_simulate_cli_unknown_profile_is_one_line_exit_2(model_file, capsys):
    rc = _planner("simulate", "--model", str(model_file), "--gpu", "no-such-profile", "--num-gpus", "2",
                  "--strategy", "dp=2", "--calibration", "no-such-profile")
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "calibration" in err and "no-such-profile" in err


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level?) for every import in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, id(node) in top))
    return out


def test_layers_sim_and_planner_never_import_validate():
    """validate/ sits on top of sim/; sim/ never imports it and planner/ only lazily, inside
    the validate command functions (so the planner works without torch)."""
    for pkg in ("sim", "planner"):
        for f in sorted((ROOT / pkg).glob("*.py")):
            for mod, top in _imports(f):
                if mod == "validate" or mod.startswith("validate."):
                    assert pkg == "planner" and f.name == "cmd_validate.py" and not top, f"{f}: imports {mod}"
    for f in sorted((ROOT / "sim").glob("*.py")):
        assert all(not m.startswith("torch") for m, _ in _imports(f)), f"{f} imports torch"


def test_gpt_parameter_count_matches_the_simulator():
    pytest.importorskip("torch")
    from validate.model import GPT, ModelConfig, num_params
    from validate.suite import MEDIUM, SMALL

    for cfg in (SMALL, MEDIUM, ModelConfig(num_layers=3, hidden_size=96, num_heads=3, ffn_hidden_size=200,
                                           vocab_size=1000, seq_len=16)):
        assert num_params(GPT(cfg)) == cfg.to_sim_model().num_params


def test_fit_compare_and_launchers_do_not_need_torch():
    """Only the ranks import torch: fitting, comparing and writing Slurm/Kubernetes jobs work
    on a machine without it."""
    import subprocess
    import sys

    code = ("import sys, validate.specs, validate.fit, validate.fit_links, validate.profile, validate.compare, "
            "validate.suite, validate.launch, validate.slurm, validate.k8s, validate.rankenv, validate.layouts, "
            "validate.synthetic, planner.commands.cmd_validate; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
