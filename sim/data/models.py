"""A model by name: a catalog id or alias, a project YAML/JSON file or a Hugging Face
``config.json`` (``load_model``, what ``--model`` and the app take).  The file formats are
parsed by ``sim.data.modelio``, the catalog's models looked up in ``sim.data.catalog``."""

from __future__ import annotations

import os
from pathlib import Path

from sim.data import catalog
from sim.base.errors import InputError, printable_value
from sim.data.modelio import model_from_dict, read_structured_file
from sim.data.specs import Model


def load_model(spec: str | os.PathLike[str]) -> Model:
    """Return the model named by ``spec``.

    Parameters
    ----------
    spec
        A catalog id or alias (``llama3-70b``, case-insensitive), a path to a YAML/JSON file in
        the project schema, a Hugging Face ``config.json``, or a directory holding one.

    Raises
    ------
    InputError
        Unknown id, missing or unreadable file, malformed content (field ``model...``).
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise InputError("model", printable_value(spec), "must be a catalog id or a file path")
    text = spec.strip()
    if not text:
        raise InputError("model", printable_value(spec), "is empty; give a catalog id or a file path")
    if catalog.has_model(text):
        return catalog.get_model(text)
    path = Path(text).expanduser()
    try:
        exists = path.exists()
        is_dir = exists and path.is_dir()
    except (OSError, ValueError):
        exists = is_dir = False
    if not exists:
        known = ", ".join(model_id for model_id, _ in catalog.list_models())
        raise InputError("model", printable_value(spec),
                         f"is neither a catalog model nor an existing file; known models: {known}")
    if is_dir:
        if not (path / "config.json").is_file():
            raise InputError("model", printable_value(spec), "is a directory without a config.json")
        path = path / "config.json"
    data = read_structured_file(path, field="model")
    default_name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return model_from_dict(data, where=str(path), default_name=default_name or "model")
