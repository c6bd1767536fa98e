"""Turning command-line flags into the core's frozen specs (shared by every subcommand)."""

from __future__ import annotations

import argparse
import math
import shlex

from sim.cost.calibration import load_calibration
from sim.data.catalog import get_gpu
from sim.net.clusters import cluster_from_catalog
from sim.base.errors import InputError
from sim.data.models import load_model
from sim.cost.offload import with_host
from sim.data.hardware import PLACEMENTS, TOPOLOGIES, Cluster
from sim.data.specs import DEFAULT_SEQ_LEN, Model
from sim.base.units import GIB


def add_model_args(p: argparse.ArgumentParser, *, required: bool = True, recipe: bool = False) -> None:
    """``--model``; with ``recipe`` it may come from ``--recipe`` instead (checked by
    ``planner.commands.cmd_import.apply_recipe``)."""
    p.add_argument("--model", required=required and not recipe, default=None if required else "gpt3-175b",
                   help="catalog id, a model YAML/JSON file, or a Hugging Face config.json"
                        + ("; default: the --recipe's model" if recipe else ""))


def add_recipe_script_args(p: argparse.ArgumentParser) -> None:
    """How a launch-script recipe is run: the arguments and environment its caller passes."""
    g = p.add_argument_group("launch-script recipe")
    g.add_argument("--recipe-args", default=None, metavar="WORDS",
                   help="the positional arguments the launch script is run with ($1, $2, ...; one quoted string, "
                        "split as the shell splits it), e.g. a harness's 'bash pretrain.sh DATA 8 1 0 ...'")
    g.add_argument("--recipe-env", action="append", default=None, metavar="NAME=VALUE",
                   help="an environment variable the launch script reads (repeat for several); "
                        "its own assignments still win")


def recipe_script_from_args(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """(positional arguments, environment) of ``--recipe-args`` / ``--recipe-env``."""
    words: list[str] = []
    if getattr(args, "recipe_args", None):
        try:
            words = shlex.split(args.recipe_args)
        except ValueError as exc:
            raise InputError("recipe-args", args.recipe_args, f"is not shell words: {exc}") from None
    env: dict[str, str] = {}
    for item in getattr(args, "recipe_env", None) or []:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier():
            raise InputError("recipe-env", item, "must be NAME=VALUE with NAME a shell variable name")
        env[name] = value
    return words, env


def add_cluster_args(p: argparse.ArgumentParser, *, required: bool = True, recipe: bool = False) -> None:
    """The cluster flags; with ``recipe`` ``--num-gpus`` (and ``--gpus-per-node``) may come
    from ``--recipe`` (a launch script's nodes and GPUs per node)."""
    g = p.add_argument_group("cluster")
    g.add_argument("--gpu", required=required, default=None if required else "a100-80gb", help="GPU catalog id")
    g.add_argument("--num-gpus", type=int, required=required and not recipe, default=None if required else 1024,
                   help="GPUs in the job" + ("; default: what the --recipe states" if recipe else ""))
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
    g.add_argument("--seq-len", type=int, default=None, help=f"tokens per sequence (default {DEFAULT_SEQ_LEN})")
    g.add_argument("--host-dram-gib", type=float, default=None,
                   help="host memory per node for offloading, GiB (default: catalogs/offload.yaml, 2 TB)")
    pc = p.add_argument_group("PCIe server (PCIe cards only; docs/pcie.md)")
    pc.add_argument("--server", default=None, help="a PCIe server design of catalogs/servers.yaml (its GPU slots "
                    "set the node size); default: the design for the node size, else one described by the flags below")
    pc.add_argument("--sockets", type=int, default=None, help="describe your own server: CPU sockets (1-2; default "
                    "1 up to 4 GPUs per node, else 2), GPUs split evenly over them")
    pc.add_argument("--pcie-switches", type=int, default=None, help="describe your own server: PCIe switches "
                    "(default 0: every GPU on a CPU root port), split evenly over the sockets, GPUs evenly over them")
    pc.add_argument("--cpu", default=None, help="host CPU of catalogs/hosts.yaml (memory and socket-link bandwidth); "
                    "default: the design's")
    pc.add_argument("--p2p", default=None, choices=("pcie", "none"), help="peer-to-peer over PCIe: pcie (peer DMA) "
                    "or none (staged through host memory); default: the card's (GeForce: none with the stock driver)")
    pc.add_argument("--nvlink-bridge", type=int, default=None, metavar="N", help="GPUs per NVLink/Infinity Fabric "
                    "bridge (0 = no bridges); default: the card's (A100/H100 PCIe, H100 NVL: 2; MI210: 4)")


def _gpu_and_nic_from_args(args: argparse.Namespace):
    """The ``--gpu`` record and the default NIC; with ``--calibration`` the profile's device,
    which ``--gpu`` must name (profile id, device id or base GPU; else one-line ``InputError``
    on ``gpu``), and its measured NIC when it has one."""
    calibration = getattr(args, "calibration", None)
    if calibration is None:
        return get_gpu(args.gpu), None
    cal = load_calibration(calibration)
    cal.check_gpu(args.gpu)
    return cal.gpu, cal.nic


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    """The cluster the cluster flags describe (``sim.net.clusters.cluster_from_catalog`` defaults);
    with ``--calibration`` the profile's device and, unless ``--nic`` is given, its measured
    NIC (``sim.engines.run.resolve`` puts the rest of the profile on the plan: the device each rank
    sees, measured links and host rates)."""
    gpu, measured_nic = _gpu_and_nic_from_args(args)
    nic = measured_nic if args.nic is None and measured_nic is not None else args.nic
    cl = cluster_from_catalog(gpu, args.num_gpus, gpus_per_node=args.gpus_per_node,
                              nvlink_domain=args.nvlink_domain, nic=nic, nics_per_node=args.nics_per_node,
                              topology=args.topology, oversubscription=args.oversubscription,
                              tree_levels=args.tree_levels, placement=args.placement, **server_args(args))
    dram = args.host_dram_gib
    if dram is not None:
        if not math.isfinite(dram) or dram <= 0 or dram > 1 << 24:
            raise InputError("host-dram-gib", dram, "must be a positive number of GiB")
        cl = with_host(cl, host_dram_bytes=dram * GIB)
    return cl


def server_args(args: argparse.Namespace) -> dict[str, object]:
    """The PCIe server flags as ``cluster_from_catalog`` keywords (absent flags: None)."""
    return {k: getattr(args, k) for k in ("server", "sockets", "pcie_switches", "cpu", "p2p", "nvlink_bridge")}


def model_from_args(args: argparse.Namespace) -> Model:
    """``--model`` (a ``Model`` already when ``--recipe`` supplied the architecture)."""
    if isinstance(args.model, Model):
        return args.model
    return load_model(args.model)


def seq_len_from_args(args: argparse.Namespace) -> int | None:
    if args.seq_len is None:
        return None
    if args.seq_len < 1 or args.seq_len > (1 << 26):
        raise InputError("seq-len", args.seq_len, "must be in [1, 67108864]")
    return args.seq_len
