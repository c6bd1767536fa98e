"""Flags of asynchronous parameter-server training (``sim.data.psspecs.ParameterServers``), shared by
``planner simulate`` and ``planner comm-reduce --mode parameter-server``."""

from __future__ import annotations

import argparse

from sim.data.catalog import get_nic
from sim.data.psspecs import PS_PARTITIONS, PS_PLACEMENTS, ParameterServers


def add_ps_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parameter servers (--framework tf-parameter-server, dp_impl=parameter-server)")
    g.add_argument("--num-ps", type=int, default=None, help="PS tasks (default: one per worker node)")
    g.add_argument("--ps-placement", choices=PS_PLACEMENTS, default="colocated",
                   help="colocated: a PS task on each worker node (default); dedicated: CPU hosts of their own")
    g.add_argument("--ps-partition", choices=PS_PARTITIONS, default="even",
                   help="even: MinSizePartitioner over all PS (default); round-robin: whole variables, no partitioner")
    g.add_argument("--ps-nic", default=None, help="NIC of a dedicated PS host (default: the cluster's NIC)")
    g.add_argument("--ps-nics-per-host", type=int, default=1, help="bonded NICs of a dedicated PS host (default 1)")
    g.add_argument("--step-time-cv", type=float, default=0.0,
                   help="coefficient of variation of a worker's step time (stragglers): what a synchronous step "
                        "waits for and asynchronous training does not (default 0)")


def ps_from_args(args: argparse.Namespace) -> ParameterServers:
    return ParameterServers(num_ps=args.num_ps, placement=args.ps_placement, partition=args.ps_partition,
                            nic=get_nic(args.ps_nic) if args.ps_nic is not None else None,
                            nics_per_host=args.ps_nics_per_host, step_time_cv=args.step_time_cv)
