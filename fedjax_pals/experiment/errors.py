"""The workdir's error classes, below the workdir, the locks and the disk-space checks that
raise them (so none of those imports another for its errors)."""


class WorkdirError(ValueError):
    """A workdir that cannot be used: not writable, or holding another run."""


class WorkdirLockedError(WorkdirError):
    """Another launch is writing the workdir."""
