"""CompilationCounter counts XLA compilations through jax.monitoring events."""

import jax
import jax.numpy as jnp

import fedjax_pals as fjp


def test_a_new_program_counts_once_and_a_cached_call_not_at_all():
    counter = fjp.engine.CompilationCounter()
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.2345)
    seven, eight = jnp.ones(7), jnp.ones(8)
    with counter.track():
        f(seven)
    assert counter.compilations == 1 and counter.compile_seconds > 0
    with counter.track():
        f(seven)
    assert counter.compilations == 1
    with counter.track():
        f(eight)  # a new shape is a new program
    assert counter.compilations == 2


def test_only_work_inside_track_is_counted_and_nested_counters_both_count():
    outer, inner = fjp.engine.CompilationCounter(), fjp.engine.CompilationCounter()
    three = jnp.ones(3)
    jax.jit(lambda x: x - 0.5)(three)
    assert outer.compilations == 0
    with outer.track():
        with inner.track():
            jax.jit(lambda x: x * 0.25)(three)
    assert (outer.compilations, inner.compilations) == (1, 1)
