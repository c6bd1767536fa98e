"""The whole loop on this machine: `planner validate all --quick --json` (measure with
torch.distributed/gloo, fit a profile from the microbenchmarks, predict the held-out workloads).

This is the one heavy test (about three minutes on two cores).  It checks the interface
(docs/interface.md: `median_abs_error`, `workloads` with `name`, `measured_step_time_s`,
`predicted_step_time_s`), that the suite covers DDP, FSDP, TP, PP and a 2x2 mesh on two model
sizes, and the accuracy.  The target is a median error of 25% (docs/validate.md reports the
measured numbers); the assertion (30%) leaves headroom for a machine shared with other jobs,
and a run over it is repeated once before it fails (timing noise lengthens every measured step
of one run at once; a regression fails both).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# serial: wall-clock CPU measurements of real multi-rank training; `make test` runs these after the parallel phase (pyproject markers)
pytestmark = pytest.mark.serial

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
MAX_MEDIAN_ERROR = 0.30


def _validate_all(out_dir: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "validate", "all", "--quick", "--json",
                           "--out", str(out_dir)], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.timeout(1800)
def test_validate_all_quick_json(tmp_path):
    t0 = time.monotonic()
    out = _validate_all(tmp_path / "run1")
    wall = time.monotonic() - t0
    rows = out["workloads"]
    for r in rows:
        assert {"name", "measured_step_time_s", "predicted_step_time_s"} <= set(r)
        assert r["measured_step_time_s"] > 0 and r["predicted_step_time_s"] > 0
    kinds = {r["kind"] for r in rows}
    assert {"ddp", "fsdp", "tp", "pp", "mesh"} <= kinds
    assert len({r["model"] for r in rows}) == 2
    assert any("interleaved" in r["strategy"] for r in rows) and any("gpipe" in r["strategy"] for r in rows)
    assert Path(out["profile_path"]).exists()
    first = out["median_abs_error"]
    if first > MAX_MEDIAN_ERROR:
        # The measured side is wall-clock CPU time on a machine shared with other jobs: a slow
        # spell lengthens every measured step at once (errors all negative).  On this 2-core
        # machine the median has ranged 0.16-0.38 across recent CI runs; a real
        # regression of the model or the fit fails a second, independent run as well.
        out = _validate_all(tmp_path / "run2")
    assert out["median_abs_error"] <= MAX_MEDIAN_ERROR, json.dumps(
        {"first_run_median": round(first, 3), **{r["name"]: round(r["error"], 3) for r in out["workloads"]}})
    print(f"\nvalidate all --quick: median |error| {out['median_abs_error']:.1%} in {wall:.0f} s")
