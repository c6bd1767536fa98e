"""Real torch.distributed workloads that measure a machine and calibrate the simulator.

See docs/validate.md.  ``validate`` sits on top of ``sim``: it may import ``sim`` but nothing
in ``sim`` or ``planner`` imports it (``planner.commands.cmd_validate`` only lazily).  Only the ranks
(``worker``, ``runtime``, ``timing``, ``memstats``, ``model``, ``workloads``, ``microbench``)
import torch; ``rankenv`` only inside ``pick_device``.
"""
