"""Host (NumPy) buffers that a CPU device can use without copying them."""

from __future__ import annotations

import numpy as np

# A NumPy buffer at this alignment goes onto a CPU device without a copy (XLA's minimum
# alignment for zero-copy host buffers); NumPy itself aligns to 16 bytes.
HOST_ALIGNMENT = 64


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous NumPy array whose buffer is 64-byte aligned."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + HOST_ALIGNMENT, np.uint8)
    offset = (-raw.ctypes.data) % HOST_ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def is_aligned(x: np.ndarray) -> bool:
    return x.ctypes.data % HOST_ALIGNMENT == 0
