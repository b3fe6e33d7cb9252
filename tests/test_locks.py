"""Leases between hosts: a holder on another host that died is taken over within the stated
bound, a live one never. Another host is a process under another hostname (a UTS namespace,
which needs root; CI runs as root) on the same file system, as a requeued shard meets it."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from fedjax_pals.experiment import locks
from fedjax_pals.experiment.errors import WorkdirLockedError

LEASE = 2.0  # seconds: short, so that the tests wait little

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="another hostname needs a UTS namespace: root and unshare",
)

HOLDER = (
    "import sys, time\n"
    "from fedjax_pals.experiment import locks\n"
    "locks.Lease(sys.argv[1], 'the shard', lease_seconds=float(sys.argv[2])).acquire()\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


def _hold_on_another_host(path):
    """A process on host 'node2' that holds the lease `path` and keeps its heartbeat."""
    holder = subprocess.Popen(
        ["unshare", "--uts", "sh", "-c", 'hostname node2 && exec "$0" "$@"', sys.executable,
         "-c", HOLDER, str(path), str(LEASE)],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    assert "host=node2" in path.read_text()
    return holder


@needs_root
def test_a_dead_holder_on_another_host_is_taken_over_within_the_stated_bound(tmp_path, capfd):
    path = tmp_path / "shard-0-of-2.lock"
    holder = _hold_on_another_host(path)
    holder.kill()  # the node died: no release, no more heartbeats
    holder.wait()
    start = time.monotonic()
    lease = locks.Lease(str(path), "shard 0/2", lease_seconds=LEASE).acquire()
    waited = time.monotonic() - start
    try:
        # At least a lease lifetime (filelock watches it unrefreshed that long), at most the
        # bound, plus a poll's slack at load.
        assert LEASE * 0.9 <= waited <= locks.REMOTE_WAIT_LEASES * LEASE + 2.0, waited
        assert f"pid={os.getpid()}" in path.read_text()
        assert "waiting up to 3 s" in capfd.readouterr().err
    finally:
        lease.release()


@needs_root
def test_a_live_holder_on_another_host_is_never_taken_over(tmp_path):
    path = tmp_path / "shard-0-of-2.lock"
    holder = _hold_on_another_host(path)
    try:
        start = time.monotonic()
        with pytest.raises(WorkdirLockedError, match=r"process \d+ on node2 holds .* within 3 s"):
            locks.Lease(str(path), "shard 0/2", lease_seconds=LEASE).acquire()
        assert time.monotonic() - start >= locks.REMOTE_WAIT_LEASES * LEASE * 0.9
        assert holder.poll() is None and "host=node2" in path.read_text()
    finally:
        holder.kill()
        holder.wait()


def test_a_live_holder_on_this_host_is_refused_at_once(tmp_path):
    path = tmp_path / "run.lock"
    held = locks.Lease(str(path), "the sweep", lease_seconds=LEASE).acquire()
    try:
        start = time.monotonic()
        with pytest.raises(WorkdirLockedError, match=f"process {os.getpid()} on "):
            locks.Lease(str(path), "the sweep", lease_seconds=LEASE).acquire()
        assert time.monotonic() - start < LEASE  # no wait for a holder on this host
    finally:
        held.release()
