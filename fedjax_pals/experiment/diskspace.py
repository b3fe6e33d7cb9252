"""A full disk (or a full quota) as one error naming what could not be written and the space.

Every file a run writes is written whole (temporary file, then rename; orbax commits a
checkpoint only once it is complete), so a write that fails for lack of space damages
nothing: the same command resumes the run from its last checkpoint once space is freed.
`DiskFullError` says so, with the path and the space it needed and found.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil

from fedjax_pals.experiment.errors import WorkdirError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXT = ("no space left on device", "disk quota exceeded")


class DiskFullError(WorkdirError):
    """No space (or quota) left to write a run's file; nothing written before is damaged."""


def is_disk_full(error: BaseException | None) -> bool:
    """True for ENOSPC / EDQUOT, also when wrapped (orbax and tensorstore re-raise it)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _NO_SPACE:
            return True
        if any(text in str(error).lower() for text in _NO_SPACE_TEXT):
            return True
        error = error.__cause__ or error.__context__
    return False


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if nbytes < 1024 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024


def _existing_dir(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def tree_size(path: str) -> int:
    """Bytes of the files under `path` (0 if it does not exist)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def disk_full_error(path: str, needed: int | None = None) -> DiskFullError:
    """The one-line error for a failed write of `path` (needing about `needed` bytes)."""
    where = _existing_dir(os.path.dirname(os.path.abspath(path)) or ".")
    try:
        free = f"{_size(shutil.disk_usage(where).free)} free on its file system"
    except OSError:
        free = "free space unknown"
    need = f", about {_size(needed)} needed" if needed else ""
    return DiskFullError(
        f"no space left to write {path} ({free}{need}); nothing written so far is damaged: free "
        "some space and run the same command again to resume."
    )


def as_disk_full(error: BaseException, path: str, needed: int | None = None):
    """`error` as a `DiskFullError` naming `path` when it is a full disk, else `error`."""
    if isinstance(error, DiskFullError) or not is_disk_full(error):
        return error
    filename = getattr(error, "filename", None)
    if isinstance(filename, str) and not os.path.basename(filename).startswith(".tmp"):
        path = filename
    converted = disk_full_error(path, needed)
    converted.__cause__ = error
    return converted


@contextlib.contextmanager
def writing(path: str, needed: int | None = None):
    """Turns a full disk while writing `path` into `DiskFullError` naming it."""
    try:
        yield
    except Exception as error:
        converted = as_disk_full(error, path, needed)
        if converted is error:
            raise
        raise converted from error


def checkpoint_size(workdir: str) -> int | None:
    """Bytes of the largest checkpoint in `<workdir>/checkpoints` (what the next one needs)."""
    directory = os.path.join(os.fspath(workdir), "checkpoints")
    try:
        entries = [os.path.join(directory, name) for name in os.listdir(directory)]
    except OSError:
        return None
    return max([tree_size(e) for e in entries if os.path.isdir(e)], default=0) or None


def run_disk_full(error: BaseException, workdir) -> BaseException:
    """A run's error as a `DiskFullError` naming its workdir (or the file) when the disk is
    full; the space needed is that of a checkpoint of the run."""
    if not is_disk_full(error):
        return error
    workdir = os.fspath(workdir)
    return as_disk_full(error, workdir, needed=checkpoint_size(workdir))


@contextlib.contextmanager
def run_writes(workdir):
    """Turns a full disk during a run in `workdir` into `DiskFullError` (see `run_disk_full`)."""
    try:
        yield
    except Exception as error:
        converted = run_disk_full(error, workdir)
        if converted is error:
            raise
        raise converted from error
