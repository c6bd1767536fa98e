"""Shared test helpers.  ``cluster`` builds catalog clusters with the defaults every entry point
uses (``sim.net.clusters.cluster_from_catalog``); tests import it (``from tests.conftest import cluster``)."""

from __future__ import annotations

import pytest

from sim.net.clusters import cluster_from_catalog
from sim.data.hardware import Cluster


def cluster(gpu: str = "a100-80gb", n: int = 8, *, gpn: int | None = None, domain: int | None = None,
            nic: str | None = None, nics: int | None = None, topology: str = "fat-tree", o: float = 1.0,
            **rest: object) -> Cluster:
    """``n`` GPUs of catalog id ``gpu``; ``gpn`` GPUs per node and ``domain`` per NVLink domain
    (default: the GPU's usual server), ``nic`` / ``nics`` per node, ``topology``, ``o``
    (oversubscription)."""
    return cluster_from_catalog(gpu, n, gpus_per_node=gpn, nvlink_domain=domain, nic=nic, nics_per_node=nics,
                                topology=topology, oversubscription=o, **rest)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def loso_rows():
    """(rows, skipped) of ``planner check-published --loso``: computed once per test session
    (each fit source is refitted without its data; tens of seconds) for every test that reads it."""
    from planner.fitting.published import compare_all

    return compare_all(loso=True, with_skipped=True)
