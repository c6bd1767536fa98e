"""Wall time of each command at the limits of ``sim.base.limits`` (docs/interface.md "Limits").

Every command must answer within about a minute on a 2-core machine for inputs inside the
limits (or report its progress), and refuse what lies beyond them at once.  Each case runs the
CLI in a subprocess and prints its wall time, exit status and the last stderr line::

    python scripts/bench_limits.py            # all cases (several minutes)
    python scripts/bench_limits.py event goodput
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _deep_model(layers: int) -> str:
    path = Path(tempfile.mkdtemp()) / f"deep-{layers}.yaml"
    path.write_text(f"name: deep-{layers}\nnum_layers: {layers}\nhidden_size: 1024\nnum_attention_heads: 16\n"
                    "ffn_hidden_size: 4096\nffn_type: gelu\nvocab_size: 51200\n", encoding="utf-8")
    return str(path)


CASES: dict[str, list[tuple[str, list[str]]]] = {
    "event": [  # ~480,000 pieces: 2 stages x 120,000 micro-batches x 2 passes
        ("event engine at the piece limit", ["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus",
                                             "16", "--strategy", "tp=8,pp=2,mbs=1,gbs=120000", "--engine", "event"]),
        ("event engine beyond it", ["simulate", "--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "16",
                                    "--strategy", "tp=8,pp=2,mbs=1,gbs=8000000", "--engine", "event"]),
    ],
    "layers": [
        ("recommend, 65,536 layers", ["recommend", "--model", "@deep", "--gpu", "h100-80gb", "--num-gpus", "64"]),
    ],
    "gpus": [
        ("simulate analytic, 2^20 GPUs", ["simulate", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus",
                                          "1048576", "--strategy", "tp=8,pp=8,mbs=1,gbs=32768", "--engine", "analytic"]),
        ("recommend, 32,768 GPUs (progress)", ["recommend", "--model", "llama3-70b", "--gpu", "h100-80gb",
                                               "--num-gpus", "32768"]),
    ],
    "goodput": [
        ("goodput, 16,384 GPUs, 60 seeds", ["goodput", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus",
                                            "16384", "--seeds", "60"]),
        ("goodput beyond the event limit", ["goodput", "--model", "llama3-70b", "--gpu", "h100-80gb", "--num-gpus",
                                            "16384", "--seeds", "5000"]),
    ],
    "schedule": [
        ("schedule, 64 nodes, 200,000 jobs", ["schedule", "--nodes", "64", "--generate", "200000"]),
        ("schedule, 100,000 nodes (hopeless)", ["schedule", "--nodes", "100000", "--generate", "2000",
                                                "--policy", "fifo"]),
    ],
}


def run(label: str, argv: list[str]) -> None:
    argv = [_deep_model(1 << 16) if a == "@deep" else a for a in argv]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "planner.cli", *argv, "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    dt = time.perf_counter() - t0
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    print(f"{label:<40} {dt:7.1f} s  exit {proc.returncode}  {last[:150]}", flush=True)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        for label, argv in CASES[name]:
            run(label, argv)
