"""Patch-and-restore of an attribute, for the harnesses that look inside PyTorch while it runs
(the memory tracker's contexts in ``validate.memtrack``, the inductor scheduler in
``validate.compiled_traffic``)."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def replaced(owner, name: str, replacement):  # noqa: ANN001
    """``owner.name`` is ``replacement`` inside the block, its own value again after it."""
    original = vars(owner).get(name, getattr(owner, name))  # a class keeps its descriptor (a property) as is
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)
