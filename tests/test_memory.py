"""experiments.benchmarks.memory: the resident set and its high-water mark, resettable."""

import numpy as np
import pytest

from experiments.benchmarks import memory


@pytest.mark.skipif(not memory.reset_peak_rss(), reason="needs /proc/self/clear_refs (Linux)")
def test_the_peak_sees_an_allocation_and_a_reset_brings_it_back_to_the_present():
    before = memory.rss_mib()
    block = np.ones(256 * 2**20 // 8)  # 256 MiB, touched
    assert memory.peak_rss_mib() >= before + 200
    del block
    assert memory.reset_peak_rss()
    # A stale peak (ru_maxrss keeps the freed block) would still show the 256 MiB.
    assert memory.peak_rss_mib() < before + 100
    assert memory.rss_mib() <= memory.peak_rss_mib()
