"""The eager fast path: a compiled forward per static signature, bounded, and always correct."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn
from jaxfn import _eager


def _power_forward(ctx, x, power, *, offset=0.0):
    ctx.power = power
    return x**power + offset


power = jaxfn.autograd_function(_power_forward, lambda ctx, g: None, name="power")


def test_same_results_eager_jit_and_op_by_op():
    x = jnp.linspace(-1.0, 1.0, 5)
    eager = power(x, 3, offset=1.0)
    jitted = jax.jit(lambda x: power(x, 3, offset=1.0))(x)
    op_by_op = power._call(
        jaxfn._arguments.split(jaxfn._arguments.bind("power", power._signature, (x, 3), {"offset": 1.0}))
    )
    np.testing.assert_allclose(eager, x**3 + 1.0, rtol=1e-12)
    np.testing.assert_allclose(jitted, eager, rtol=1e-12)
    np.testing.assert_allclose(op_by_op, eager, rtol=1e-12)


def test_static_values_shapes_and_dtypes_each_get_their_entry():
    f = jaxfn.autograd_function(_power_forward, lambda ctx, g: None, name="power")
    x = jnp.arange(4.0)
    np.testing.assert_allclose(f(x, 2), x**2)
    np.testing.assert_allclose(f(x, 3), x**3)  # a different static value: not the cached power 2
    np.testing.assert_allclose(f(x[:2], 2), x[:2] ** 2)
    assert f(x.astype(jnp.float32), 2).dtype == jnp.float32
    np.testing.assert_allclose(f(x, 2, offset=5.0), x**2 + 5.0)
    assert len(f._eager) == 5
    np.testing.assert_allclose(f(x, 2), x**2)
    assert len(f._eager) == 5  # served from the cache


def test_value_dependent_forward_still_works_eagerly():
    def forward(ctx, x):
        if float(x.sum()) > 0:  # needs a concrete value: can't be compiled
            return x * 2
        return -x

    f = jaxfn.autograd_function(forward, lambda ctx, g: None, name="branchy")
    np.testing.assert_allclose(f(jnp.ones(3)), 2 * jnp.ones(3))
    np.testing.assert_allclose(f(-jnp.ones(3)), jnp.ones(3))
    np.testing.assert_allclose(f(jnp.ones(3)), 2 * jnp.ones(3))
    assert list(f._eager._entries.values()) == [_eager._EAGER_ONLY]


def test_cache_is_bounded():
    f = jaxfn.autograd_function(_power_forward, lambda ctx, g: None, name="power")
    f._eager.max_entries = 4
    for n in range(1, 12):
        np.testing.assert_allclose(f(jnp.ones(n), 2), jnp.ones(n))
    assert len(f._eager) == 4


def test_unhashable_static_values_skip_the_cache():
    f = jaxfn.autograd_function(lambda ctx, x, opts: x * opts.get("scale", 1), lambda ctx, g: None)

    class Unhashable(dict):
        __hash__ = None

    np.testing.assert_allclose(f(jnp.ones(2), Unhashable(scale=3)), [3.0, 3.0])
    assert len(f._eager) == 0


def test_a_failing_forward_leaves_no_entry():
    calls = []

    def forward(ctx, x):
        calls.append(1)
        if len(calls) == 1:
            return "not an array"
        return x + 1

    f = jaxfn.autograd_function(forward, lambda ctx, g: None, name="flaky")
    with pytest.raises(jaxfn.AutogradFunctionError):
        f(jnp.ones(2))
    assert len(f._eager) == 0
    np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])


def test_traced_calls_do_not_use_the_cache():
    f = jaxfn.autograd_function(_power_forward, lambda ctx, g: {"x": g * 2}, name="power")
    assert float(jax.grad(lambda x: f(x, 2))(3.0)) == 2.0  # backward ran: not the cached primal
    jax.jit(lambda x: f(x, 2))(jnp.ones(2))
    assert len(f._eager) == 0
