"""Cluster economics and operations: from one simulated step to a whole training campaign.

Modules (each one concept; data in ``catalogs/``, formulas cited in each docstring):

* ``records``         typed access to the economics catalogs (errors name file, record, key)
* ``prices``          ``catalogs/prices.yaml``: switches, NICs, links, servers, power, energy
* ``bom``             the network bill of materials from ``sim.net.topology.topology_metrics``
* ``power``           GPU/host/network power at the simulated utilisation, PUE, energy
* ``strategy``        the plan to cost: given, ``planner.plans.recommend``'s best, or a small search
* ``tco``             capital cost, cloud alternative, time/energy/cost to train a token budget
* ``failures``        ``catalogs/failures.yaml`` (Llama 3 incident counts) -> rates, MTBF
* ``storage``         ``catalogs/storage.yaml``: checkpoint size, write/restore times
* ``goodput``         Young/Daly checkpoint interval and the analytic goodput
* ``campaign``        simpy simulation of a training campaign with failures and spares
* ``scheduler``       simpy simulation of a shared cluster (FIFO, EASY backfill, priority)
* ``traces``          job trace files and a synthetic job generator
* ``input_pipeline``  can storage, host CPUs and PCIe feed the training step?
* ``comm_reduction``  local SGD / DiLoCo, gradient compression, asynchronous pipelines
* ``sweep``           design-space sweeps and the Pareto front of time vs cost

The CLI lives in ``planner/commands/cmd_economics.py``; the user guide in ``docs/economics.md``.
"""
