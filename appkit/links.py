"""A design in the page's address, so it can be bookmarked and sent to a colleague.

Every sidebar input is bound to a URL query parameter named like its widget key
(``?gpu=h100-80gb&num_gpus=512&nic=ib-ndr-400``; Streamlit's ``bind="query-params"``, values
equal to the default are left out).  What a widget cannot hold travels here:

* an uploaded model file: ``model_file`` (its name) and ``model_data`` (the bytes,
  zlib-compressed, URL-safe base64; a Hugging Face ``config.json`` is ~1 KB of address);
* the plan shown: ``plan`` (``1`` .. ``5``, the recommender's rank, or ``yours``).

Streamlit drops a bound value its widget cannot take (an unknown GPU, a number out of range)
without a word; ``ignored_values`` finds them so the page can say so once.
"""

from __future__ import annotations

import base64
import binascii
import math
import zlib
from typing import Any, Mapping

from sim.base.errors import InputError

MAX_LINK_MODEL_CHARS = 8000  # longer addresses are cut by some mail clients and proxies
MAX_MODEL_BYTES = 1 << 20  # a decoded model file larger than this is not a model file


def encode_upload(data: bytes) -> str | None:
    """``model_data`` for an uploaded file, or ``None`` when it would make the address too long."""
    text = base64.urlsafe_b64encode(zlib.compress(data, 9)).decode("ascii").rstrip("=")
    return text if len(text) <= MAX_LINK_MODEL_CHARS else None


def decode_upload(text: str) -> bytes:
    """The file bytes of ``model_data``; ``InputError('model_data', ...)`` when the address
    was cut or edited."""
    if not isinstance(text, str) or not text or len(text) > MAX_LINK_MODEL_CHARS:
        raise InputError("model_data", _short(text), "is not a model file this app put in a link")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        out = zlib.decompressobj()
        data = out.decompress(raw, MAX_MODEL_BYTES)
        if out.unconsumed_tail or not out.eof:
            raise ValueError("truncated or too large")
    except (binascii.Error, ValueError, zlib.error):
        raise InputError("model_data", _short(text), "is not a model file this app put in a link "
                         "(was the address cut short?)") from None
    return data


def _short(text: Any) -> str:
    s = str(text)
    return s if len(s) <= 24 else s[:21] + "..."


def _same(raw: str, value: Any) -> bool:
    """Whether the widget took the address's value ``raw``."""
    if value is None:
        return raw == ""
    if isinstance(value, bool):
        return raw.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return math.isclose(float(raw), float(value), rel_tol=1e-12)
        except ValueError:
            return False
    return raw == str(value)


def ignored_values(query: Mapping[str, Any], values: Mapping[str, Any]) -> list[str]:
    """``key = value`` for each address parameter of a bound widget (``values``: widget key ->
    the value it shows) that the widget did not take."""
    out = []
    for key, raw in query.items():
        if key not in values:
            continue
        raw = raw[-1] if isinstance(raw, list) else raw
        if not _same(str(raw), values[key]):
            out.append(f"{key} = {_short(raw)}")
    return out
