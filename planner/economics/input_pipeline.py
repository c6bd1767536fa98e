"""Can the input pipeline feed the training step?  Storage, host CPUs and PCIe vs demand.

Demand: the simulated step consumes ``tokens_per_s`` (whole cluster).  Three supply stages,
each converted to tokens per second for the whole cluster:

* **Storage read**: ``tier.bytes_per_s(num_nodes, read) / bytes_per_token_storage``.  Pre-
  tokenised data stores ``uint16`` token ids when the vocabulary fits in 65,536 ids and
  ``int32`` otherwise (Megatron-LM's indexed datasets choose the dtype by vocabulary size);
  raw text takes ``text_bytes_per_token`` (~4 bytes of English per token).
* **Host CPU** (tokenisation/decoding; skipped for pre-tokenised data unless given):
  ``nodes * host_bytes_per_s_per_node / host_bytes_per_token`` (the ``tokenizer`` record of
  ``catalogs/storage.yaml``: Hugging Face tokenizers, >= 50 MB/s of text per server).  For
  images or video, give the decode rate and bytes per token of your pipeline.
* **Host-to-GPU PCIe**: every data-parallel (x context-parallel) replica receives its share
  of the batch; each GPU's PCIe x16 link (``sim.net.fabric.pcie_x16_bytes_per_s``) carries
  ``bytes_per_token_device`` per token (``catalogs/conventions.yaml``: int64 input ids +
  labels = 16 B for text), so the
  cluster supply is ``dp * cp * pcie / bytes_per_token_device``.

``data_bound`` is set when the slowest stage supplies less than the step consumes; the step
would then stretch to ``tokens_per_step / min(supply)``.  Known error: assumes perfect
prefetching (no stalls when supply exceeds demand) and ignores shuffling/random-read
penalties of small files on object stores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.data.conventions import conventions
from sim.base.errors import InputError
from sim.data.hardware import Cluster
from sim.data.specs import Model, Strategy
from sim.net.fabric import pcie_x16_bytes_per_s

from planner.economics.storage import DEFAULT_STORAGE, load_storage



@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineReport:
    tokens_per_s_needed: float
    supply_tokens_per_s: dict[str, float]  # stage -> tokens/s (absent: stage not used)
    bound_by: str
    headroom: float  # min supply / demand
    data_bound: bool
    storage: str
    bytes_per_token_storage: float
    bytes_per_token_device: float
    warnings: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, object]:
        return {"tokens_per_s_needed": self.tokens_per_s_needed, "supply_tokens_per_s": dict(self.supply_tokens_per_s),
                "bound_by": self.bound_by, "headroom": self.headroom, "data_bound": self.data_bound,
                "storage": self.storage, "bytes_per_token_storage": self.bytes_per_token_storage,
                "bytes_per_token_device": self.bytes_per_token_device, "warnings": list(self.warnings)}


def _positive(name: str, v: float | None) -> None:
    if v is not None and not (0 < v < 1e30):
        raise InputError(name, v, "must be a positive finite number")


def input_pipeline(model: Model, cluster: Cluster, strategy: Strategy, tokens_per_s: float, *,
                   storage: str = DEFAULT_STORAGE, pretokenized: bool = True,
                   bytes_per_token_storage: float | None = None,
                   bytes_per_token_device: float | None = None,
                   host_bytes_per_s_per_node: float | None = None,
                   host_bytes_per_token: float | None = None) -> PipelineReport:
    """Compare the step's token demand with what each input stage supplies (module docstring)."""
    if bytes_per_token_device is None:
        bytes_per_token_device = conventions().device_bytes_per_token
    for name, v in (("bytes-per-token-storage", bytes_per_token_storage),
                    ("bytes-per-token-device", bytes_per_token_device),
                    ("host-bytes-per-s-per-node", host_bytes_per_s_per_node),
                    ("host-bytes-per-token", host_bytes_per_token), ("tokens_per_s", tokens_per_s)):
        _positive(name, v)
    cat = load_storage()
    tier = cat.get(storage)
    tok = cat.tokenizer
    nodes = cluster.num_nodes
    if bytes_per_token_storage is None:
        if pretokenized:
            bytes_per_token_storage = 2.0 if model.vocab_size <= conventions().uint16_vocab_limit else 4.0
        else:
            bytes_per_token_storage = tok.text_bytes_per_token
    supply = {"storage": tier.bytes_per_s(nodes, write=False) / bytes_per_token_storage}
    if not pretokenized or host_bytes_per_s_per_node is not None:
        rate = host_bytes_per_s_per_node if host_bytes_per_s_per_node is not None else tok.text_bytes_per_s_per_node
        per_tok = host_bytes_per_token if host_bytes_per_token is not None else tok.text_bytes_per_token
        supply["host_cpu"] = nodes * rate / per_tok
    replicas = strategy.dp * strategy.cp
    supply["pcie"] = replicas * pcie_x16_bytes_per_s(cluster.gpu.pcie_generation) / bytes_per_token_device
    bound = min(supply, key=lambda k: supply[k])
    headroom = supply[bound] / tokens_per_s
    warnings = []
    if headroom < 1.0:
        warnings.append(f"data loading bounds the step: {bound} supplies {supply[bound]:,.0f} tokens/s, "
                        f"the step consumes {tokens_per_s:,.0f} ({headroom:.0%})")
    elif headroom < 2.0:
        warnings.append(f"little headroom in the input pipeline: {bound} supplies only {headroom:.1f}x the demand")
    return PipelineReport(tokens_per_s_needed=tokens_per_s, supply_tokens_per_s=supply, bound_by=bound,
                          headroom=headroom, data_bound=headroom < 1.0, storage=tier.id,
                          bytes_per_token_storage=bytes_per_token_storage,
                          bytes_per_token_device=bytes_per_token_device, warnings=tuple(warnings))
