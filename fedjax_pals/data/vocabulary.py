"""LEAF's character vocabulary for its Shakespeare task (next-character prediction).

``LEAF_LETTERS`` is ``ALL_LETTERS`` of LEAF's ``models/utils/language_utils.py`` (Caldas et
al., "LEAF: A Benchmark for Federated Settings", 2018): 80 symbols, a character's class being
its position. LEAF's ``word_to_indices`` maps a character outside it to -1; here such a
character is refused by `encode` or dropped by `in_vocabulary`, never silently an index.
"""

from __future__ import annotations

import numpy as np

LEAF_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
NUM_LEAF_LETTERS = len(LEAF_LETTERS)  # 80

_INDEX = np.full(256, -1, np.int32)
_INDEX[[ord(c) for c in LEAF_LETTERS]] = np.arange(NUM_LEAF_LETTERS, dtype=np.int32)


def in_vocabulary(text: str) -> str:
    """`text` without the characters outside LEAF's vocabulary."""
    return "".join(c for c in text if ord(c) < 256 and _INDEX[ord(c)] >= 0)


def encode(text: str) -> np.ndarray:
    """The LEAF indices of the characters of `text` (int32).

    Raises:
      ValueError: a character outside the vocabulary (named).
    """
    codes = np.frombuffer(text.encode("latin-1", errors="replace"), np.uint8)
    indices = _INDEX[codes] if len(text) == len(codes) else np.full(1, -1)
    if indices.size and indices.min() < 0:
        bad = next(c for c in text if ord(c) >= 256 or _INDEX[ord(c)] < 0)
        raise ValueError(f"character {bad!r} is not in LEAF's 80-symbol vocabulary")
    return indices.astype(np.int32)


def decode(indices) -> str:
    """The text of LEAF indices."""
    return "".join(LEAF_LETTERS[int(i)] for i in np.asarray(indices).ravel())
