"""The workdir's error class, below both the workdir and the disk-space checks that raise it."""


class WorkdirError(ValueError):
    """A workdir that cannot be used: not writable, or holding another run."""
