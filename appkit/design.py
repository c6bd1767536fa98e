"""A cluster design as the app's user states it, and how it becomes the core's specs.

A ``Design`` holds exactly what the sidebar shows: ``None`` means "the GPU's usual server"
(the same defaults as the CLI's cluster flags, built by ``planner.commands.inputs.cluster_from_args``
so the app and ``planner simulate`` never disagree).  Bad input raises ``InputError``;
``widget_for_error`` says next to which widget the message belongs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import PurePath

import yaml

from sim.net.clusters import cluster_from_catalog
from sim.data.conventions import conventions
from sim.base.errors import InfeasibleError, InputError
from sim.data.modelio import MAX_FILE_BYTES, model_from_dict
from sim.data.hardware import Cluster
from sim.data.specs import DEFAULT_SEQ_LEN, TRAIN_PRECISIONS, Model

"""Token budget when none is given: ~20 tokens per parameter (Hoffmann et al. 2022, Chinchilla,
Table 3: compute-optimal training).  Only a default; users set their own budget."""

MODEL_SUFFIXES: tuple[str, ...] = ("json", "yaml", "yml")

# Widgets the sidebar draws, by key (ui.py uses the same keys).
WIDGETS: tuple[str, ...] = ("model", "gpu", "num_gpus", "gpus_per_node", "nvlink_domain", "nic",
                            "nics_per_node", "topology", "oversubscription", "server", "p2p", "seq_len", "gbs",
                            "token_budget", "pricing", "framework", "fp8", "memory_headroom", "strategy", "rerank")

_STRATEGY_KEYS = frozenset({"strategy", "tp", "pp", "dp", "cp", "ep", "vp", "mbs", "zero", "sp",
                            "recompute", "precision", "schedule", "attention", "tp_overlap",
                            "dp_overlap", "fsdp"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Design:
    """One what-if: model, cluster and training job.

    ``gpus_per_node``, ``nvlink_domain``, ``nic`` and ``nics_per_node`` default (``None``) to
    the GPU's usual server; ``gbs`` (sequences) to the recommender's choice (or the STRATEGY
    string's); ``token_budget_tokens`` to ``DEFAULT_TOKENS_PER_PARAM`` tokens per parameter;
    ``strategy`` (a STRATEGY string) to "recommend one".  ``rerank=False`` ranks with the
    analytic model only (faster; ``planner recommend --rerank 0``).  ``server`` and ``p2p``
    (PCIe cards only) are ``--server`` and ``--p2p``.  ``precisions`` are the training
    precisions the search may use (``--precision``); ``None`` is ``planner recommend``'s
    default, the GPU's own (bf16; fp16 where it has no bf16), because fp8 changes the numerics
    and is searched only when the user opts in.  ``framework`` restricts the search to the
    plans one framework profile runs (``--framework``); ``None`` is the recommender's default.
    ``memory_headroom`` is the fraction of GPU memory (device level, as ``nvidia-smi``) a plan
    keeps free (``--memory-headroom``); ``None`` is the memory model's measured error
    (``planner.fitting.uncertainty.memory_headroom``).
    """

    model: Model
    model_ref: str  # catalog id or uploaded file name (what the user picked)
    gpu: str
    num_gpus: int
    gpus_per_node: int | None = None
    nvlink_domain: int | None = None
    nic: str | None = None
    nics_per_node: int | None = None
    topology: str = "fat-tree"
    oversubscription: float = 1.0
    seq_len: int = DEFAULT_SEQ_LEN
    gbs: int | None = None
    token_budget_tokens: float | None = None
    strategy: str | None = None
    pricing: str = "owned"  # owned (capex depreciation + energy) | cloud (GPU-hours x list price)
    rerank: bool = True  # re-rank the top plans with the event engine, as `planner recommend` does
    server: str | None = None  # PCIe cards: a servers.yaml design (None: the default for the node size)
    p2p: str | None = None  # PCIe cards: pcie | none (None: the card's)
    precisions: tuple[str, ...] | None = None  # searched precisions (None: the GPU's own); fp8 only when asked for
    framework: str | None = None  # a catalogs/frameworks.yaml profile; None: the recommender's default
    memory_headroom: float | None = None  # fraction of GPU memory kept free; None: the measured default

    def __post_init__(self) -> None:
        if self.pricing not in ("owned", "cloud"):
            raise InputError("pricing", self.pricing, "must be owned or cloud")
        _int_field("num_gpus", self.num_gpus)
        for name in ("gpus_per_node", "nvlink_domain", "nics_per_node", "gbs"):
            if getattr(self, name) is not None:
                _int_field(name, getattr(self, name))
        _int_field("seq_len", self.seq_len, limit=1 << 26)
        if self.token_budget_tokens is not None:
            t = self.token_budget_tokens
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
                raise InputError("token_budget", t, "must be a positive number of tokens")
        if self.strategy is not None and not self.strategy.strip():
            raise InputError("strategy", self.strategy, "is empty; leave it off to get a recommendation")
        if self.precisions is not None and (not self.precisions or any(p not in TRAIN_PRECISIONS
                                                                        for p in self.precisions)):
            raise InputError("precision", ",".join(self.precisions), f"must be some of {', '.join(TRAIN_PRECISIONS)}")
        h = self.memory_headroom
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h)
                              or not 0 <= h < 1):
            raise InputError("memory-headroom", h, "must be a fraction in [0, 1)")

    @property
    def token_budget(self) -> float:
        """Tokens to train: the given budget, else 20 per parameter (Chinchilla)."""
        if self.token_budget_tokens is not None:
            return float(self.token_budget_tokens)
        return conventions().tokens_per_parameter * self.model.num_params

    @property
    def label(self) -> str:
        """Short name for the compare view, e.g. ``512 x h100-80gb, ib-ndr-400 fat-tree``."""
        nic = self.nic or "default NIC"
        over = f" {self.oversubscription:g}:1" if self.oversubscription != 1 else ""
        return f"{self.model.name}: {self.num_gpus} x {self.gpu}, {nic} {self.topology}{over}"

    def cache_key(self) -> str:
        """A stable text key for caches (the frozen fields' repr)."""
        return repr(self)

    def recommend_key(self) -> str:
        """Key of what the recommendation depends on (not the token budget, pricing or a
        fixed strategy): changing those does not re-run the search."""
        return repr(replace(self, token_budget_tokens=None, pricing="owned", strategy=None))

    def with_(self, **changes: object) -> "Design":
        return replace(self, **changes)


def _int_field(name: str, value: object, *, limit: int = 1 << 30) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(name, value, "must be an integer")
    if value < 1 or value > limit:
        raise InputError(name, value, f"must be in [1, {limit}]")


def cluster_of(design: Design) -> Cluster:
    """The ``Cluster`` of a design, with the CLI's defaults (``sim.net.clusters.cluster_from_catalog``)."""
    return cluster_from_catalog(design.gpu, design.num_gpus, gpus_per_node=design.gpus_per_node,
                                nvlink_domain=design.nvlink_domain, nic=design.nic,
                                nics_per_node=design.nics_per_node, topology=design.topology,
                                oversubscription=float(design.oversubscription), server=design.server,
                                p2p=design.p2p)


def model_from_upload(file_name: str, data: bytes) -> Model:
    """Parse an uploaded model file in memory: a Hugging Face ``config.json`` or the project's
    YAML/JSON model schema (``sim.data.modelio``).

    Raises ``InputError('model', file_name, ...)`` for an oversized, binary, non-UTF-8 or
    unparsable file; malformed content raises ``sim.data.modelio``'s errors (``model.<key>``).
    """
    name = PurePath(str(file_name or "model")).name or "model"
    suffix = PurePath(name).suffix.lower().lstrip(".")
    if suffix not in MODEL_SUFFIXES:
        raise InputError("model", name, f"upload a .json or .yaml file (got .{suffix or '?'})")
    if len(data) > MAX_FILE_BYTES:
        raise InputError("model", name, f"is {len(data)} bytes; files over {MAX_FILE_BYTES} bytes are rejected")
    if b"\x00" in data:
        raise InputError("model", name, "is a binary file, not YAML or JSON text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError("model", name, f"is not UTF-8 text (byte {exc.start})") from None
    try:
        doc = json.loads(text) if suffix == "json" else yaml.safe_load(text)
    except Exception as exc:  # JSONDecodeError, YAMLError, RecursionError
        kind = "JSON" if suffix == "json" else "YAML"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError("model", name, f"is not valid {kind}: {first}") from None
    return model_from_dict(doc, where=name)


def widget_for_error(exc: InputError, design: Design | None = None) -> str | None:
    """The sidebar widget an ``InputError`` is about (a key of ``WIDGETS``), or ``None``.

    Strategy keys go to the STRATEGY field when the user fixed one; ``gbs`` goes to the
    global-batch field unless the STRATEGY string sets it.
    """
    field = str(exc.field)
    if isinstance(exc, InfeasibleError) and design is not None and design.strategy is not None:
        return "strategy"  # the fixed strategy does not fit this model and cluster
    head = field.split(".", 1)[0].split("[", 1)[0]
    if head in ("model", "moe"):
        return "model"
    if head in ("seq_len", "seq-len", "seq"):
        return "seq_len"
    if head in ("token_budget", "tokens"):
        return "token_budget"
    if head in ("pricing", "gpu-price-usd", "usd-per-gpu-hour"):
        return "pricing"
    if head == "framework":
        return "framework"
    if head in ("memory-headroom", "memory_headroom"):
        return "memory_headroom"
    if head == "precision" and (design is None or design.strategy is None):
        return "fp8"  # the searched precisions (a fixed strategy's precision= is the strategy's)
    if head == "gbs":
        fixed = design is not None and design.strategy is not None
        if fixed and "gbs" in _strategy_keys(design.strategy or ""):
            return "strategy"
        return "gbs"
    if head in _STRATEGY_KEYS or field.startswith("strategy"):
        return "strategy" if design is None or design.strategy is not None else None
    if head in ("gpu", "nic", "num_gpus", "gpus_per_node", "nvlink_domain", "nics_per_node", "topology",
                "oversubscription"):
        return head
    if head in ("tree_levels", "link"):
        return "topology"
    if head in ("server", "sockets", "pcie-switches", "cpu", "nvlink-bridge"):
        return "server"
    if head == "p2p":
        return "p2p"
    if head == "nvlink-domain":
        return "nvlink_domain"
    return None


def _strategy_keys(text: str) -> set[str]:
    out = set()
    for part in text.split(","):
        key = part.partition("=")[0].strip().lower()
        out.add({"global_batch": "gbs"}.get(key, key))
    return out


def error_text(exc: BaseException) -> str:
    """One line for the user: ``field = value: message`` for input errors."""
    if isinstance(exc, InputError):
        value = exc.value
        shown = value if isinstance(value, str) else repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return f"{exc.field} = {shown}: {exc.message}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
