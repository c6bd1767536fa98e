"""The vTrain measurements (Bang et al., MICRO'24; MIT licence, catalogs/reference/vtrain/):
1,549 Megatron-DeepSpeed iteration times on A100, as plans of this project.

The single-node rows (small models, 0.2-1.3 B, where host-side dispatch rather than the GPU
bounds many ops) calibrate one framework constant, ``host_op_floor_s``; the even-numbered
multi-node rows (3.6-175 B on 64-512 GPUs) calibrate how GEMM efficiency grows with size
(``gemm_sustained_fraction``), the odd-numbered ones are held out and only tested.  Per the
data's README: GPT decoder, 4h GeLU MLP, tied embeddings, GPT-2 vocabulary padded to 50,304,
fp16, full recomputation, non-interleaved 1F1B.

Cluster: 8 A100 80GB per node on NVLink, and 800 Gb/s of InfiniBand per node, i.e. four HDR
200 Gb/s HCAs (vTrain repository, commit f8dda84, ``config/validation/multi/*.json``:
``"inter_node_bandwidth": 800``, documented in ``src/config.py`` as "Total bandwidth of
inter-node communication in Gbps"; ``"use_gradient_bucket": false``, i.e. no overlap of the
data-parallel reduction).
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass

from sim.data.catalog import catalog_dir, get_gpu, get_nic
from sim.net.clusters import cluster_from_catalog
from sim.cost.framework import apply_framework, get_framework
from sim.cost.plan import Plan
from sim.data.specs import Model, Strategy

VOCAB_PADDED = 50304  # 50,257 padded by Megatron to a multiple of 128
NICS_PER_NODE = 4  # 800 Gb/s per node of HDR 200 Gb/s HCAs (module docstring)


@dataclass(frozen=True, slots=True)
class VtrainRow:
    plan: Plan
    measured_step_time_s: float


@functools.cache
def load_vtrain(which: str) -> tuple[VtrainRow, ...]:
    """``which``: ``single`` or ``multi``."""
    path = catalog_dir() / "reference" / "vtrain" / f"ground_truth_{which}.csv"
    fw = get_framework("megatron-deepspeed")
    gpu, nic = get_gpu("a100-80gb"), get_nic("ib-hdr-200")
    out = []
    with open(path, encoding="utf-8-sig", newline="") as fh:
        for r in csv.DictReader(fh):
            h, n = int(r["hidden size"]), int(r["# GPUs"])
            model = Model(name=f"gpt-h{h}", num_layers=int(r["# layers"]), hidden_size=h,
                          num_attention_heads=int(r["attention heads"]), ffn_hidden_size=4 * h,
                          vocab_size=VOCAB_PADDED, tied_embeddings=True, linear_bias=True)
            cluster = cluster_from_catalog(gpu, n, gpus_per_node=8, nic=nic, nics_per_node=NICS_PER_NODE)
            strategy = Strategy(tp=int(r["tensor parallelism"]), pp=int(r["pipeline parallelism"]),
                                dp=int(r["data parallelism"]), mbs=int(r["micro batch"]), gbs=int(r["global batch"]),
                                seq_len=int(r["sequence length"]), recompute="full", precision="fp16",
                                dp_overlap=fw.dp_overlap)
            plan = Plan(**apply_framework({"model": model, "cluster": cluster, "strategy": strategy}, fw)).checked()
            out.append(VtrainRow(plan, float(r["iteration time (ms)"]) / 1e3))
    return tuple(out)
