"""Frozen settings of asynchronous parameter-server training (``dp_impl=parameter-server``).

Where the parameter-server (PS) tasks of TensorFlow's ``ParameterServerStrategy`` run and how the
variables are spread over them; ``sim.engines.parameter_server`` prices a step with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.base.checks import choice, positive_int
from sim.base.errors import InputError
from sim.data.hardware import Link

PS_PLACEMENTS: tuple[str, ...] = ("colocated", "dedicated")
# even: tf.distribute.experimental.partitioners.MinSizePartitioner(max_shards=num_ps) splits every
# variable larger than num_ps x min_shard_bytes over all PS; round-robin: no partitioner, each
# whole variable on task (count % num_ps) in creation order (ParameterServerStrategyV2 default)
PS_PARTITIONS: tuple[str, ...] = ("even", "round-robin")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParameterServers:
    """The PS side of an asynchronous plan.

    ``placement``: ``colocated`` runs one PS task on each of ``num_ps`` worker nodes (their NICs
    carry the worker's and the PS's traffic), ``dedicated`` puts the PS tasks on ``num_ps`` CPU
    hosts with ``nics_per_host`` adapters of ``nic`` each (``None``: the cluster's NIC).
    ``num_ps`` ``None``: one per worker node.  ``partition``: ``PS_PARTITIONS``.
    ``step_time_cv``: the coefficient of variation of one worker's step time (stragglers,
    jitter; 0 = identical workers), which a synchronous step pays as the expected maximum over
    its workers and asynchronous training does not.
    """

    num_ps: int | None = None
    placement: str = "colocated"
    partition: str = "even"
    nic: Link | None = None
    nics_per_host: int = 1
    step_time_cv: float = 0.0

    def __post_init__(self) -> None:
        if self.num_ps is not None:
            positive_int("num-ps", self.num_ps, limit=1 << 20)
        choice("ps-placement", self.placement, PS_PLACEMENTS)
        choice("ps-partition", self.partition, PS_PARTITIONS)
        positive_int("ps-nics-per-host", self.nics_per_host, limit=64)
        if self.nics_per_host != 1 and self.placement != "dedicated":
            raise InputError("ps-nics-per-host", self.nics_per_host, "needs --ps-placement dedicated (colocated PS "
                                                                    "tasks use the worker nodes' interface)")
        if self.nic is not None and self.placement != "dedicated":
            raise InputError("ps-nic", self.nic.id, "needs --ps-placement dedicated (colocated PS tasks use the "
                                                     "worker nodes' NICs)")
        if isinstance(self.step_time_cv, bool) or not isinstance(self.step_time_cv, (int, float)) \
                or not 0.0 <= self.step_time_cv <= 10.0:
            raise InputError("step-time-cv", self.step_time_cv, "must be a number in [0, 10]")
