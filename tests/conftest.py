"""Settings for the whole test suite (read before any test module imports JAX).

Every program a test compiles goes into JAX's persistent compilation cache when one is set
(scripts/test.sh and CI point $JAX_COMPILATION_CACHE_DIR at .cache/jax), not only those that
took JAX's default 1 s to compile: tests build many identical small programs through fresh
`jax.jit` objects (a new engine, a new closure, another test file on the same pytest worker,
a child process), and JAX's in-memory caches are keyed on the function object, so each of
those compiled again; the persistent cache is keyed on the program. The launchers already use
0 (`fedjax_pals.runtime.CACHE_MIN_COMPILE_SECONDS`); this gives the pytest workers, and the
child processes that inherit their environment, the same. A value set by the caller wins.
A cache hit still reports `/jax/core/compile/backend_compile_duration`, so the tests that count
compilations (`fjp.engine.CompilationCounter`) count the same.
"""

import os

os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
