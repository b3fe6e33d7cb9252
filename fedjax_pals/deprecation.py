"""How an interface change reaches a user's module: a warning first, then a refusal.

A change to what a user's method, feature, data set, partition, model or backend must declare
would break every module written for the interface before it. Such a change goes in with
`warn`: for one minor version the old form still works and warns (naming the fix and the
version that will refuse it), and CHANGELOG.md says what changed; the version after refuses.
The version number says when an extension's interface changes (`fedjax_pals.__version__`,
CHANGELOG.md: a minor version for each change of that interface).
"""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class FedjaxPalsDeprecationWarning(FutureWarning):
    """A user's module uses a form of the extension interface that a later version refuses.

    A FutureWarning (shown by default), not a DeprecationWarning (hidden outside __main__):
    the code it is about is a researcher's own module, not a library's."""


def _user_stacklevel() -> int:
    """The stacklevel of the first caller outside fedjax_pals (the user's line)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def warn(message: str, *, refused_in: str) -> None:
    """Warns (FedjaxPalsDeprecationWarning, at the user's line) that `message`'s form is
    refused from version `refused_in`."""
    warnings.warn(
        f"{message} fedjax_pals {refused_in} will refuse it (CHANGELOG.md).",
        FedjaxPalsDeprecationWarning,
        stacklevel=_user_stacklevel(),
    )
