"""Conventions and counting rules (``catalogs/conventions.yaml``), each with its source.

``conventions()`` is read once per catalog file version.  ``default_global_batch`` turns the
default tokens per step into sequences, the one rule every command and the app use when the
user gives no batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.data.catalog import catalog_document, file_version
from sim.base.records import Record

FILE = "conventions.yaml"


@dataclass(frozen=True, kw_only=True, slots=True)
class Conventions:
    tokens_per_parameter: float  # compute-optimal token budget per parameter (Chinchilla)
    default_tokens_per_step: int  # global batch in tokens when none is given
    device_bytes_per_token: float  # host-to-GPU bytes per token of a text batch
    uint16_vocab_limit: int  # vocabularies up to this many ids store tokens as uint16
    attention_backward_per_forward: float  # FLOPs of a fused attention backward / forward


def conventions() -> Conventions:
    return _load(file_version(FILE))


@functools.cache
def _load(_version: tuple[str, int, int]) -> Conventions:
    doc = Record(catalog_document(FILE), where="conventions", file=FILE)
    train, inp, flops = doc.mapping("training"), doc.mapping("input"), doc.mapping("flops")
    return Conventions(tokens_per_parameter=train.req("tokens_per_parameter", positive=True),
                       default_tokens_per_step=train.integer("default_tokens_per_step"),
                       device_bytes_per_token=inp.req("device_bytes_per_token", positive=True),
                       uint16_vocab_limit=inp.integer("uint16_vocab_limit"),
                       attention_backward_per_forward=flops.req("attention_backward_per_forward", positive=True))


def default_global_batch(seq_len: int, tokens_per_step: float | None = None) -> int:
    """Sequences per step for ``tokens_per_step`` (default: the catalog's), at least one."""
    tokens = conventions().default_tokens_per_step if tokens_per_step is None else tokens_per_step
    return max(1, round(tokens / seq_len))
