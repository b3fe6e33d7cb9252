"""Advisory locks on directories (fcntl.flock): one writer at a time, released if it dies.

The lock file holds "<pid> on <host>" of its holder, so that a refused launch can name it.
"""

from __future__ import annotations

import errno
import os
import socket

from fedjax_pals.experiment.workdir import WorkdirLockedError


def holder_text() -> str:
    """What a lock file says about its holder: "<pid> on <host>"."""
    return f"{os.getpid()} on {socket.gethostname()}"


def acquire(path: str, what: str, holder_kind: str = "process") -> int:
    """Takes the exclusive lock `path` (created if missing); returns its descriptor.

    Args:
      path: the lock file.
      what: the locked thing for the error, e.g. "the sweep workdir runs/x".
      holder_kind: what the error calls the holder ("in use by another <holder_kind>").

    Raises:
      WorkdirLockedError: another process holds it (naming its pid and host).
    """
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise
        raise WorkdirLockedError(
            f"{what} is in use by another {holder_kind} (process {holder} holds {path}); wait for "
            "it to finish, or choose another --workdir."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{holder_text()}\n".encode(), 0)
    return fd


def release(fd: int | None) -> None:
    """Releases a lock taken by `acquire` (closing the descriptor releases the flock)."""
    if fd is not None:
        os.close(fd)
