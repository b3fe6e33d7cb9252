"""Locks on directories: one writer at a time, released (or taken over) if it dies.

`acquire`: an advisory fcntl.flock, for a run's workdir (one host writes a run; closing the
descriptor releases it).
`Lease`: a lock that also holds between hosts of a shared file system, for sweeps and their
shards (filelock's NFS-safe lease). Both name their holder ("<pid> on <host>") when they refuse.
"""

from __future__ import annotations

import errno
import os
import socket
import sys

from fedjax_pals.experiment.errors import WorkdirLockedError


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


# -- leases: locks that hold on a shared file system ------------------------------------------

# A lease's holder refreshes it every third of this; a peer on another host may take it over
# once it has seen no refresh for this long (a holder on the same host that has died is taken
# over at once: filelock checks its pid).
LEASE_SECONDS = 30.0
# How long a taker waits for a holder on another host, in lease lifetimes: filelock takes a
# lease over only once this process has itself watched it unrefreshed for a whole lifetime (on
# its own clock), so a job requeued on another node must wait that long for its dead
# predecessor's lease; the rest is a heartbeat's slack. A live holder is refused after it.
REMOTE_WAIT_LEASES = 1.5


def _lease_fields(path: str) -> dict[str, str]:
    """The fields of a filelock marker file ("pid=...", "host=..." lines); {} if unreadable."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    fields = (line.partition("=") for line in lines)
    return {key.strip(): value.strip() for key, sep, value in fields if sep}


def _lease_holder(path: str) -> str:
    """The "<pid> on <host>" of a filelock marker file."""
    fields = _lease_fields(path)
    return f"{fields.get('pid', '?')} on {fields.get('host', '?')}" if fields else "unknown"


class Lease:
    """An exclusive lock that holds across the hosts of a shared (NFS) file system.

    flock/fcntl locks on NFS are node-local under common mount options (`local_lock=`), so
    two hosts could both hold one. This is filelock's `SoftFileLease`: the lock file's
    existence is the lock, created atomically; a heartbeat thread refreshes it while it is
    held; a holder on this host that died (SIGKILL, OOM) is taken over at once, one on another
    host once its lease has gone unrefreshed for `lease_seconds`. Correctness of a sharded
    sweep does not rest on it (shards are disjoint by construction): it turns a second job on
    the same shard into a one-line refusal.
    """

    def __init__(self, path: str, what: str, *, lease_seconds: float = LEASE_SECONDS):
        from filelock import SoftFileLease

        self.path = path
        self.what = what
        self._lease = SoftFileLease(path, lease_duration=lease_seconds, on_compromise=self._lost)

    def _lost(self, compromise) -> None:
        print(
            f"warning: lost the lock {self.path} ({getattr(compromise, 'reason', compromise)}); "
            "another job may be running the same shard.",
            file=sys.stderr,
            flush=True,
        )

    def acquire(self, wait_seconds: float = 0.0) -> "Lease":
        """Takes the lease, waiting up to `wait_seconds` for it.

        Raises:
          WorkdirLockedError: another live process holds it (naming its pid and host).
        """
        from filelock import Timeout

        try:
            self._lease.acquire(timeout=wait_seconds)
            return self
        except Timeout:
            pass
        host = _lease_fields(self.path).get("host")
        remote_wait = REMOTE_WAIT_LEASES * self._lease.lease_duration
        if host not in (None, socket.gethostname()):
            # A holder on another host: alive, or dead with its lease not yet expired (a shard
            # requeued on another node finds its predecessor's). Wait for the expiry.
            print(
                f"note: {self.what} is held by process {_lease_holder(self.path)}; waiting up to "
                f"{remote_wait:g} s: a holder on another host that died is taken over once its "
                "lease expires.",
                file=sys.stderr,
                flush=True,
            )
            try:
                self._lease.acquire(timeout=remote_wait)
                return self
            except Timeout:
                pass
        raise WorkdirLockedError(
            f"{self.what} is in use by another process (process {_lease_holder(self.path)} "
            f"holds {self.path}); wait for it to finish. A holder on this host that died is "
            f"taken over at once, one on another host within {remote_wait:g} s of its last "
            "heartbeat (this one still refreshes its lease)."
        ) from None

    def release(self) -> None:
        self._lease.release()
