"""Turning command-line flags into the core's frozen specs (shared by every subcommand)."""

from __future__ import annotations

import argparse
import math

from sim.calibration import load_calibration
from sim.catalog import cluster_from_catalog, get_gpu
from sim.errors import InputError
from sim.modelio import load_model
from sim.offload import with_host
from sim.specs import PLACEMENTS, TOPOLOGIES, Cluster, Model


def add_model_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--model", required=required, default=None if required else "gpt3-175b",
                   help="catalog id, a model YAML/JSON file, or a Hugging Face config.json")


def add_cluster_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--gpu", required=required, default=None if required else "a100-80gb", help="GPU catalog id")
    g.add_argument("--num-gpus", type=int, required=required, default=None if required else 1024)
    g.add_argument("--gpus-per-node", type=int, default=None, help="default: the GPU's usual server")
    g.add_argument("--nvlink-domain", type=int, default=None,
                   help="GPUs per NVLink domain; default --gpus-per-node if given, else the GPU's usual domain")
    g.add_argument("--nic", default=None, help="scale-out adapter id; default: the GPU's usual server NIC")
    g.add_argument("--nics-per-node", type=int, default=None)
    g.add_argument("--topology", default="fat-tree", help="|".join(TOPOLOGIES))
    g.add_argument("--oversubscription", type=float, default=1.0,
                   help="leaf downlink:uplink ratio for tree/fat-tree (1 = non-blocking)")
    g.add_argument("--tree-levels", type=int, default=2)
    g.add_argument("--placement", default="block", help="|".join(PLACEMENTS) + ": how the job takes GPUs from "
                   "NVLink domains larger than a node (block: the same whole number of nodes from each, so "
                   "equal groups stay inside one domain; packed: fill each domain in turn)")
    g.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 2048)")
    g.add_argument("--host-dram-gib", type=float, default=None,
                   help="host memory per node for offloading, GiB (default: catalogs/offload.yaml, 2 TB)")


def _gpu_and_nic_from_args(args: argparse.Namespace):
    """The ``--gpu`` record and the default NIC; with ``--calibration`` the profile's device,
    which ``--gpu`` must name (profile id, device id or base GPU; else one-line ``InputError``
    on ``gpu``), and its measured NIC when it has one."""
    calibration = getattr(args, "calibration", None)
    if calibration is None:
        gpu = get_gpu(args.gpu)
        return gpu, None
    cal = load_calibration(calibration)
    cal.check_gpu(args.gpu)
    return cal.gpu, cal.nic


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    """The cluster the cluster flags describe (``sim.catalog.cluster_from_catalog`` defaults);
    with ``--calibration`` the profile's device and, unless ``--nic`` is given, its measured NIC."""
    gpu, measured_nic = _gpu_and_nic_from_args(args)
    nic = measured_nic if args.nic is None and measured_nic is not None else args.nic
    cl = cluster_from_catalog(gpu, args.num_gpus, gpus_per_node=args.gpus_per_node,
                              nvlink_domain=args.nvlink_domain, nic=nic, nics_per_node=args.nics_per_node,
                              topology=args.topology, oversubscription=args.oversubscription,
                              tree_levels=args.tree_levels, placement=args.placement)
    dram = getattr(args, "host_dram_gib", None)
    if dram is not None:
        if not math.isfinite(dram) or dram <= 0 or dram > 1 << 24:
            raise InputError("host-dram-gib", dram, "must be a positive number of GiB")
        cl = with_host(cl, host_dram_bytes=dram * 2**30)
    return cl


def model_from_args(args: argparse.Namespace) -> Model:
    return load_model(args.model)


def seq_len_from_args(args: argparse.Namespace) -> int | None:
    if args.seq_len is None:
        return None
    if args.seq_len < 1 or args.seq_len > (1 << 26):
        raise InputError("seq-len", args.seq_len, "must be in [1, 67108864]")
    return args.seq_len
