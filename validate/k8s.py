"""A Kubeflow ``PyTorchJob`` (training-operator v1) that runs a measurement job on Kubernetes.

The operator sets ``PET_NNODES``/``PET_NODE_RANK``/``PET_MASTER_ADDR``/``PET_NPROC_PER_NODE``,
which ``torchrun`` reads; rank 0 writes ``/results/results.json`` (a PVC when ``results_pvc``
is given) and prints it to its log.

What each pod asks for:

* GPUs: ``nvidia.com/gpu`` limits (the NVIDIA device plugin);
* RDMA for multi-node jobs: without an RDMA device in the pod, NCCL finds no InfiniBand/RoCE
  HCA and falls back to TCP sockets, and the inter-node link it measures is the pod network.
  RDMA devices are extended resources of an RDMA device plugin, named by the cluster's admin:
  ``rdma/rdma_shared_device_a`` is the Mellanox/NVIDIA k8s-rdma-shared-dev-plugin's (and the
  NVIDIA Network Operator's) default name, SR-IOV setups use names like ``nvidia.com/rdma``
  (``rdma_resource``).  RDMA memory registration pins pages, so the container gets the
  ``IPC_LOCK`` capability; ``host_network`` puts the pod on the node's network (RoCE without
  a secondary CNI);
* ``/dev/shm`` as a memory-backed ``emptyDir``: NCCL's intra-node shared-memory transport
  and the DataLoader need more than the container runtime's 64 MiB default.
"""

from __future__ import annotations

import json

import yaml

DEFAULT_RDMA_RESOURCE = "rdma/rdma_shared_device_a"


def parse_rdma_resource(text: str | None) -> tuple[str, int] | None:
    """``NAME`` or ``NAME=COUNT`` (``none`` or empty: no RDMA request)."""
    if text is None or text.strip().lower() in ("", "none", "off"):
        return None
    name, _, count = text.strip().partition("=")
    n = int(count) if count else 1
    if not name or "/" not in name or n < 1:
        raise ValueError(f"rdma resource {text!r}: must be NAME[=COUNT] with a vendor/resource name, COUNT >= 1")
    return name, n


def pytorchjob_manifest(job: dict, *, name: str = "planner-validate", image: str, nodes: int = 1,
                        nproc_per_node: int = 1, gpus_per_node: int = 0, cpus_per_node: int | None = None,
                        namespace: str = "default", results_pvc: str | None = None,
                        rdma_resource: str | None = DEFAULT_RDMA_RESOURCE, host_network: bool = False) -> str:
    """The ``ConfigMap`` holding the job and the ``PyTorchJob`` (module docstring).  RDMA is
    requested for GPU jobs on several nodes (``rdma_resource``: ``NAME[=COUNT]``, ``none``)."""
    job_text = json.dumps(job)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-job", "namespace": namespace},
          "data": {"job.json": job_text}}
    resources: dict[str, dict[str, object]] = {"limits": {}, "requests": {}}
    if gpus_per_node:
        resources["limits"]["nvidia.com/gpu"] = gpus_per_node
    rdma = parse_rdma_resource(rdma_resource) if gpus_per_node and nodes > 1 else None
    if rdma is not None:
        resources["limits"][rdma[0]] = rdma[1]
        resources["requests"][rdma[0]] = rdma[1]
    if cpus_per_node:
        resources["requests"]["cpu"] = cpus_per_node
        resources["limits"]["cpu"] = cpus_per_node
    cmd = ("torchrun --max-restarts=0 -m validate.worker /etc/validate/job.json /results"
           " && if [ -f /results/results.json ]; then cat /results/results.json; fi")
    results_vol: dict[str, object] = ({"name": "results", "persistentVolumeClaim": {"claimName": results_pvc}}
                                      if results_pvc else {"name": "results", "emptyDir": {}})
    env = [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if rdma is not None:
        env.append({"name": "NCCL_IB_DISABLE", "value": "0"})  # use the HCA (never silently TCP)

    def replica(count: int) -> dict[str, object]:
        container: dict[str, object] = {
            "name": "pytorch", "image": image, "command": ["bash", "-c", cmd], "env": env, "resources": resources,
            "volumeMounts": [{"name": "job", "mountPath": "/etc/validate"},
                             {"name": "results", "mountPath": "/results"},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
        }
        if rdma is not None:
            container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
        pod: dict[str, object] = {
            "containers": [container],
            "volumes": [{"name": "job", "configMap": {"name": f"{name}-job"}}, results_vol,
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        }
        if host_network:
            pod["hostNetwork"] = True
            pod["dnsPolicy"] = "ClusterFirstWithHostNet"
        return {"replicas": count, "restartPolicy": "Never", "template": {"spec": pod}}

    specs: dict[str, object] = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    pj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
          "metadata": {"name": name, "namespace": namespace},
          "spec": {"nprocPerNode": str(nproc_per_node),
                   "runPolicy": {"cleanPodPolicy": "Running",
                                 "activeDeadlineSeconds": int(job.get("timeout_s", 900)) + 120},
                   "pytorchReplicaSpecs": specs}}
    return yaml.safe_dump_all([cm, pj], sort_keys=False)
