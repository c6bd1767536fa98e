"""The one check of output paths: every file or folder a command writes (``--trace``, ``--out``,
exports, calibration profiles, validate's results).

A path that cannot be written -- a missing parent folder, a read-only or virtual file system
(``/proc``, ``/sys``), a folder where a file is expected, a full device -- is bad input: an
``InputError`` naming the flag and the path (exit status 2, one line), raised *before* the
command spends its time (``check_file``, ``check_folder``) and again if the write itself fails
(``write_text``, ``writing``).  Writability is tested by creating, then removing, an unnamed
temporary file in the folder, so what the checks accept is what the operating system allows
(permission bits, root on a read-only mount, a virtual file system that refuses new files).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Iterator

from sim.base.errors import InputError


def _reason(exc: OSError) -> str:
    if exc.errno == errno.EROFS:
        return "read-only file system"
    return exc.strerror or type(exc).__name__


# Kernel file systems whose files are interfaces, not storage: writing a result there is a mistake
# (and, as root, can change a kernel setting), whatever the permission bits say.
_VIRTUAL_FS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
                         "bpf", "pstore", "efivarfs", "fusectl", "binfmt_misc", "mqueue", "hugetlbfs", "devpts"})


def _fs_type(path: Path) -> str | None:
    """The type of the file system holding ``path`` (Linux ``/proc/self/mounts``; None elsewhere)."""
    try:
        lines = Path("/proc/self/mounts").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, parts[2]
    return kind


def _check_storage(field: str, shown: str, path: Path) -> None:
    kind = _fs_type(path)
    if kind in _VIRTUAL_FS:
        raise InputError(field, shown, f"cannot write: {path} is on the virtual {kind} file system")


def _probe_folder(field: str, shown: str, folder: Path) -> None:
    """Create and remove a temporary file in ``folder`` (the OS decides what is writable)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise InputError(field, shown, f"cannot write in {folder}: {_reason(exc)}") from None


def check_file(field: str, path: str | os.PathLike) -> Path:
    """``path`` as a ``Path`` if a file can be written there, else ``InputError`` on ``field``:
    its folder must exist and take new files; an existing file must open for writing."""
    shown = str(path)
    if not shown.strip():
        raise InputError(field, shown, "needs a file path")
    p = Path(shown).expanduser()
    if p.is_dir():
        raise InputError(field, shown, "is a folder; give a file path")
    parent = p.absolute().parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise InputError(field, shown, f"cannot write: the folder {parent} {what}")
    _check_storage(field, shown, p if p.exists() else parent)
    if p.exists():
        try:
            with open(p, "r+b"):
                pass
        except OSError as exc:
            raise InputError(field, shown, f"cannot write: {_reason(exc)}") from None
    else:
        _probe_folder(field, shown, parent)
    return p


def check_folder(field: str, path: str | os.PathLike) -> Path:
    """``path`` as a ``Path`` if files can be written into it, creating it (and missing parents)
    when asked to write; else ``InputError`` on ``field``.  Nothing is created here: the nearest
    existing ancestor must be a folder that takes new entries."""
    shown = str(path)
    if not shown.strip():
        raise InputError(field, shown, "needs a folder path")
    p = Path(shown).expanduser()
    if p.exists() and not p.is_dir():
        raise InputError(field, shown, "exists and is not a folder")
    probe = p.absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(field, shown, f"cannot create: {probe} is not a folder")
    _check_storage(field, shown, probe)
    _probe_folder(field, shown, probe)
    return p


def make_folder(field: str, path: str | os.PathLike) -> Path:
    """``check_folder``, then create the folder (with its parents)."""
    p = check_folder(field, path)
    with writing(field, path):
        p.mkdir(parents=True, exist_ok=True)
    return p


@contextlib.contextmanager
def writing(field: str, path: str | os.PathLike) -> Iterator[None]:
    """Turn an ``OSError`` raised while writing ``path`` into an ``InputError`` on ``field``."""
    try:
        yield
    except OSError as exc:
        raise InputError(field, str(path), f"cannot write: {_reason(exc)}") from None


def write_text(field: str, path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` (UTF-8), checked first (``check_file``)."""
    p = check_file(field, path)
    with writing(field, path):
        p.write_text(text, encoding="utf-8")
    return p
