"""A synchronous step waits for its slowest rank: GPU-to-GPU speed spread at scale.

GPUs of one SKU in one cluster do not run equally fast: manufacturing variation and each
chip's power management give every GPU its own sustained clock under load.  Sinha et al.
("Not All GPUs Are Created Equal: Characterizing Variability in Large-Scale, Accelerator-Rich
Systems", SC'22, arXiv:2208.11035) measured over 90% of the GPUs of five clusters (Summit,
Vortex, Frontera, Longhorn and Corona: NVIDIA and AMD GPUs, air and water cooled) over 18,800
GPU-hours: "8% (max 22%)
average performance variation" between GPUs of the same SKU for compute-bound kernels
(SGEMM, ResNet, BERT), regardless of vendor and cooling, with outliers up to 1.5x slower than
the median.  Operators drain the outliers (health checks before a large job); the spread that
is left is the box-plot whisker span the paper reports, which for a normal population is
``2 * 2.698 sigma`` (Q1 - 1.5 IQR to Q3 + 1.5 IQR): ``sigma = 8% / 5.4 = 1.48%`` of the median
speed (``catalogs/efficiency.yaml`` ``rank_variability``).

Every rank of a training step synchronises with every other at least once per step (the
data-parallel reduction, FSDP's per-layer gathers, the pipeline's chain of sends, each
tensor-parallel collective inside its group), so the step runs at the pace of the slowest
GPU of the job: with per-GPU speeds ``1 - sigma z_i`` the slowest of ``N`` takes
``1 + sigma E[max_N z]`` times the median GPU's compute time.  ``E[max_N z]`` of ``N`` standard
normals is taken by Blom's approximation ``Phi^-1((N - 0.375) / (N + 0.25))`` (Blom 1958;
exact 0 at ``N = 1``, within 0.03 of the exact value from ``N = 2`` to ``10^4``): 1.43 at 8
GPUs, 3.03 at 512, 3.79 at 8,192.  The factor applies to GPU work (kernels and memory-bound
passes), not to link-bound communication.

Known error: the spread is taken from V100/MI60 fleets (no published H100/B200 fleet study
reports a comparable per-GPU distribution); dynamic per-step jitter (OS noise, network
congestion, thermal drift) is not in it, so this is a lower bound of what straggling costs.
"""

from __future__ import annotations

import functools
from statistics import NormalDist


@functools.lru_cache(maxsize=None)
def expected_max_standard_normal(n: int) -> float:
    """``E[max]`` of ``n`` independent standard normals by Blom's plotting position
    ``Phi^-1((n - 0.375)/(n + 0.25))``; 0 for ``n <= 1``."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def slowest_rank_factor(num_ranks: int, sigma: float) -> float:
    """How much longer the slowest of ``num_ranks`` GPUs takes for the same work than the
    median GPU, when per-GPU speed has relative standard deviation ``sigma`` (module
    docstring): ``1 + sigma * E[max of num_ranks standard normals]``."""
    return 1.0 + sigma * expected_max_standard_normal(int(num_ranks))
