#!/usr/bin/env python3
"""Run the scripts ``--export tensorflow`` writes, for real, on this machine's CPU.

    .venv/bin/python scripts/tf_export_smoke.py --tf-python /path/to/python-with-tensorflow [--out DIR]

TensorFlow is an optional extra (``pip install 'cluster-planner[tensorflow]'``); the planner
itself never imports it, so the interpreter that runs the exported scripts may be another one.
For a tiny dense model (2 layers, hidden 64, GQA, SwiGLU) it exports and runs:

1. ``MirroredStrategy`` (one replica on the CPU), 2 micro-batches accumulated, selective
   recomputation, bf16 policy;
2. the same with ``mixed_float16`` (LossScaleOptimizer) and full recomputation;
3. ``MultiWorkerMirroredStrategy``: 2 worker processes on localhost (the ``TF_CONFIG`` of
   ``tf_configs.json`` with local ports; TensorFlow falls back from NCCL to its CPU
   collectives), ``bytes_per_pack`` > 0;
4. ``ParameterServerStrategy``: a chief, 2 workers and 2 PS tasks on localhost, asynchronous;

and checks that the Keras model creates the variables ``sim.engines.parameter_server.keras_variables``
lists, in that order (what the PS sharding model assumes).  Exit status 0 when all pass.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.exports import LaunchSpec, write  # noqa: E402
from sim.data.modelio import model_from_dict  # noqa: E402
from sim.engines.parameter_server import keras_variables  # noqa: E402
from sim.cost.plan import parse_strategy  # noqa: E402
from sim.data.psspecs import ParameterServers  # noqa: E402

TINY = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2,
        "ffn_hidden_size": 128, "ffn_type": "swiglu", "vocab_size": 256}
# (directory, strategy, GPUs, parameter servers)
CASES = [
    ("mirrored", "dp=1,mbs=2,gbs=4,seq=32,recompute=selective,dp_overlap=0", 1, None),
    ("mirrored-fp16", "dp=1,mbs=2,gbs=2,seq=32,recompute=full,precision=fp16,dp_overlap=0", 1, None),
    ("multiworker", "dp=2,mbs=2,gbs=8,seq=32,dp_overlap=1", 2, None),
    ("parameter-server", "dp=2,mbs=2,gbs=4,seq=32,dp_impl=parameter-server,dp_overlap=0", 2,
     ParameterServers(num_ps=2, placement="dedicated")),
]
ENV = {"CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def run_tasks(tf_python: str, d: Path, timeout_s: float) -> tuple[int, str]:
    """Every task of ``d/tf_configs.json`` as a local process (or the lone script); returns the
    exit status and the output of the process that reports (the chief, else the workers)."""
    cfg_path = d / "tf_configs.json"
    if not cfg_path.exists():
        r = subprocess.run([tf_python, "train_keras.py"], cwd=d, env={**os.environ, **ENV}, capture_output=True,
                           text=True, timeout=timeout_s)
        return r.returncode, r.stdout + r.stderr
    cfg = json.loads(cfg_path.read_text())
    cluster = next(iter(cfg.values()))["cluster"]
    local = {kind: [f"localhost:{_free_port()}" for _ in members] for kind, members in cluster.items()}
    procs = {}
    for name, c in cfg.items():
        env = {**os.environ, **ENV, "TF_CONFIG": json.dumps({"cluster": local, "task": c["task"]})}
        procs[name] = subprocess.Popen([tf_python, "train_keras.py"], cwd=d, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
    reporters = [n for n in procs if n.startswith("chief")] or list(procs)
    status, text = 0, ""
    try:
        for n in reporters:
            out, _ = procs[n].communicate(timeout=timeout_s)
            status |= procs[n].returncode
            text += f"--- {n} (exit {procs[n].returncode})\n{out}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return status, text


def check_variables(tf_python: str, d: Path, model) -> tuple[bool, str]:
    code = ("import train_keras as t; m = t.build_model(); "
            "print(__import__('json').dumps([list(v.shape) for v in m.trainable_variables]))")
    r = subprocess.run([tf_python, "-c", code], cwd=d, env={**os.environ, **ENV}, capture_output=True, text=True,
                       timeout=300)
    if r.returncode:
        return False, r.stderr[-2000:]
    shapes = json.loads(r.stdout.strip().splitlines()[-1])
    want = [[v.cols] if v.rows == 1 else [v.rows, v.cols] for v in keras_variables(model)]
    return shapes == want, f"keras {shapes[:6]}... vs planner {want[:6]}..."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tf-python", required=True, help="a Python interpreter that can import tensorflow")
    ap.add_argument("--out", default=None, help="where to write the exports (default: a temporary directory)")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    args = ap.parse_args()
    model = model_from_dict(TINY)
    root = Path(args.out or tempfile.mkdtemp(prefix="tf-export-smoke-"))
    failed = 0
    for name, text, n, ps in CASES:
        d = root / name
        s = parse_strategy(text, num_gpus=n)
        write("tensorflow", LaunchSpec(model=model, strategy=s, num_gpus=n, gpus_per_node=1, steps=3,
                                       parameter_servers=ps), d)
        status, out = run_tasks(args.tf_python, d, args.timeout_s)
        losses = [ln for ln in out.splitlines() if "loss" in ln and ("step" in ln or "updates" in ln)]
        print(f"{name:<18} exit {status}  {losses[-1] if losses else '(no loss printed)'}")
        if status or not losses:
            failed += 1
            print(out[-3000:])
    ok, why = check_variables(args.tf_python, root / "mirrored", model)
    print(f"{'variables':<18} {'match' if ok else 'DIFFER'} sim.engines.parameter_server.keras_variables" + ("" if ok else f": {why}"))
    return 1 if failed or not ok else 0


if __name__ == "__main__":
    sys.exit(main())
