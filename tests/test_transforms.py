"""jaxfn functions inside vmap, scan, checkpoint, nested calls, and higher-order derivatives."""

import dataclasses
import functools
import os
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads
from seeds import linear, my_relu, plain_linear_free, run_on_8_devices  # noqa: F401  (see seeds.py)

import jaxfn


def _sin_forward(ctx, x):
    ctx.save_for_backward(x=x)
    return jnp.sin(x)


def _sin_backward(ctx, g):
    return g * jnp.cos(ctx.saved_variables.x)


my_sin = jaxfn.autograd_function(_sin_forward, _sin_backward, name="my_sin")
X = jnp.array([0.1, 0.7, -1.3])


@pytest.mark.parametrize("in_axes", [(0, 0, 0), (0, None, None), (None, 0, None), (None, None, 0)])
def test_vmap_all_or_some_arguments(maybe_jit, in_axes):
    k = jax.random.split(jax.random.key(3), 3)
    xs, ws, bs = jax.random.normal(k[0], (6, 5, 3)), jax.random.normal(k[1], (6, 4, 3)), jax.random.normal(k[2], (6, 4))
    args = [a if ax == 0 else a[0] for a, ax in zip((xs, ws, bs), in_axes)]

    def loss(f):
        return lambda x, w, b: (f(x, w, b) ** 2).sum()

    got = maybe_jit(jax.vmap(jax.grad(loss(linear), (0, 1, 2)), in_axes))(*args)
    want = jax.vmap(jax.grad(loss(plain_linear_free), (0, 1, 2)), in_axes)(*args)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-10)
    out = jax.vmap(linear, in_axes)(*args)
    np.testing.assert_allclose(out, jax.vmap(plain_linear_free, in_axes)(*args), rtol=1e-12)


def test_reverse_over_reverse(maybe_jit):
    np.testing.assert_allclose(maybe_jit(jax.grad(jax.grad(my_sin)))(0.4), -jnp.sin(0.4), rtol=1e-12)
    hess = maybe_jit(jax.jacrev(jax.grad(lambda x: my_sin(x).sum())))(X)
    np.testing.assert_allclose(hess, jnp.diag(-jnp.sin(X)), rtol=1e-12, atol=1e-15)
    check_grads(my_sin, (X,), order=2, modes=["rev"])


@pytest.mark.parametrize(
    "forward_over_reverse",
    [
        lambda f: jax.hessian(lambda x: f(x).sum())(X),
        lambda f: jax.jvp(jax.grad(lambda x: f(x).sum()), (X,), (jnp.ones(3),)),
    ],
    ids=["hessian", "jvp of grad"],
)
def test_forward_over_reverse_is_refused_in_the_default_mode_naming_the_fixes(forward_over_reverse):
    """The gradient's own derivative goes through backward (SPEC section 12), which the default mode
    has in reverse mode only: forward over reverse is refused in jaxfn's words."""
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'my_sin': it was differentiated in forward mode .*jax.hessian.* second derivatives as "
        r"jax.jacrev\(jax.jacrev\(f\)\).*forward_mode=True",
    ):
        forward_over_reverse(my_sin)
    sin_fm = jaxfn.autograd_function(my_sin.forward, my_sin.backward, name="my_sin", forward_mode=True)
    np.testing.assert_allclose(jax.hessian(lambda x: sin_fm(x).sum())(X), jnp.diag(-jnp.sin(X)), atol=1e-15)
    np.testing.assert_allclose(jax.jacrev(jax.jacrev(lambda x: my_sin(x).sum()))(X), jnp.diag(-jnp.sin(X)), atol=1e-15)


def _ste_round(forward_mode):
    called = []

    def backward(ctx, g):
        called.append(True)
        return g

    return jaxfn.autograd_function(lambda ctx, x: jnp.round(x), backward, name="ste", forward_mode=forward_mode), called


@pytest.mark.parametrize("forward_mode", [False, True])
def test_the_output_of_an_inner_differentiation_is_differentiated_through_backward(maybe_jit, forward_mode):
    """jax.grad of value_and_grad's value equals jax.grad (SPEC section 12): the straight-through
    gradient, never forward's own math (round's derivative, 0)."""
    ste, called = _ste_round(forward_mode)
    f = lambda x: (ste(x) * jnp.array([3.0, -2.0])).sum()
    x = jnp.array([1.3, 0.2])
    outer = maybe_jit(jax.grad(lambda x: jax.value_and_grad(f)(x)[0]))(x)
    np.testing.assert_allclose(outer, [3.0, -2.0])
    np.testing.assert_allclose(outer, jax.grad(f)(x))
    assert called


def test_second_and_third_reverse_derivatives_match_plain_math(maybe_jit):
    square = lambda f: lambda x: f(x) * f(x)
    for order in (2, 3):
        got, want = square(my_sin), square(jnp.sin)
        for _ in range(order):
            got, want = jax.grad(got), jax.grad(want)
        np.testing.assert_allclose(maybe_jit(got)(0.7), want(0.7), rtol=1e-10)


CLOSURE_WITHOUT_GRADIENT = r"'apply': 'fn' is a function that closes over values being differentiated, so its gradient"


def test_a_function_argument_closing_over_a_differentiated_value_needs_its_gradient(maybe_jit):
    """Its closed-over values get gradients (tests/test_closures.py); a backward that returns none
    for it would silently drop them, so that is refused, naming the parameter."""
    apply = jaxfn.autograd_function(lambda ctx, x, fn: fn(x), lambda ctx, g: {"x": g}, name="apply")
    with pytest.raises(jaxfn.AutogradFunctionError, match=CLOSURE_WITHOUT_GRADIENT):
        maybe_jit(jax.grad(lambda w: apply(X, lambda y: y * w).sum()))(2.0)
    with pytest.raises(jaxfn.AutogradFunctionError, match=CLOSURE_WITHOUT_GRADIENT):
        maybe_jit(jax.grad(lambda w: apply(X, functools.partial(jnp.multiply, w)).sum()))(2.0)
    not_differentiated = jax.jit(lambda w: apply(X, lambda y: y * w))  # converted: no gradient needed
    np.testing.assert_allclose(not_differentiated(2.0), 2 * X)

    class Adder:  # a callable object holding the value
        def __init__(self, w):
            self.w = w

        def __call__(self, z):
            return z + self.w

    with pytest.raises(jaxfn.AutogradFunctionError, match=CLOSURE_WITHOUT_GRADIENT):
        maybe_jit(jax.grad(lambda w: apply(X, Adder(w)).sum()))(2.0)


def test_a_differentiated_value_in_a_passed_function_s_defaults_or_attributes_is_found(maybe_jit):
    """Besides its closure, a function holds values in its defaults, keyword-only defaults and
    attributes (functools.wraps' __wrapped__ among them): each is checked."""
    apply = jaxfn.autograd_function(lambda ctx, x, fn: fn(x), lambda ctx, g: {"x": g}, name="apply")

    def by_default(w):
        return lambda y, scale=w: y * scale

    def by_keyword_default(w):
        def fn(y, *, scale=w):
            return y * scale

        return fn

    def by_wrapped(w):
        @functools.wraps(lambda y: y * w)
        def fn(y):
            return y * 2.0

        return fn

    def by_attribute(w):
        fn = lambda y: y * 2.0  # noqa: E731
        fn.scale = w
        return fn

    for make in (by_default, by_keyword_default, by_wrapped, by_attribute):
        with pytest.raises(jaxfn.AutogradFunctionError, match=CLOSURE_WITHOUT_GRADIENT):
            maybe_jit(jax.grad(lambda w, make=make: apply(X, make(w)).sum()))(2.0)
        np.testing.assert_allclose(maybe_jit(jax.grad(lambda x, make=make: apply(x, make(3.0)).sum()))(X), 1.0)


def test_methods_of_a_module_holding_the_parameters_it_passes_are_accepted(maybe_jit):
    """forward and backward as bound methods of a pytree module whose differentiated field is also
    passed as an argument (Equinox and Flax style): no value is closed over that is not an argument."""

    @functools.partial(jax.tree_util.register_dataclass, data_fields=["w"], meta_fields=["p"])
    @dataclasses.dataclass
    class Layer:
        w: jax.Array
        p: int = 2

        def forward(self, ctx, x, w):
            ctx.save_for_backward(x, w)
            return (x * w) ** self.p

        def backward(self, ctx, g):
            x, w = ctx.saved_tensors
            d = self.p * (x * w) ** (self.p - 1)
            return g * d * w, g * d * x

        def __call__(self, x):
            return jaxfn.autograd_function(self.forward, self.backward, name="layer")(x, self.w)

    layer, x = Layer(jnp.array([1.0, 2.0])), jnp.array([0.5, 1.5])
    got = maybe_jit(jax.grad(lambda layer, x: layer(x).sum()))(layer, x)
    np.testing.assert_allclose(got.w, jax.grad(lambda w: ((x * w) ** 2).sum())(layer.w), rtol=1e-12)


def test_scan(maybe_jit):
    def step(f):
        def body(carry, x):
            carry = f(carry * x)
            return carry, carry.sum()

        return lambda c, xs: lax.scan(body, c, xs)[1].sum()

    xs = jnp.linspace(0.5, 1.5, 4)[:, None] * jnp.ones((4, 3))
    got = maybe_jit(jax.grad(step(my_sin), (0, 1)))(X, xs)
    want = jax.grad(step(jnp.sin), (0, 1))(X, xs)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-10)


def test_checkpoint(maybe_jit):
    f = jax.checkpoint(lambda x: (my_relu(my_sin(x) * 3) ** 2).sum())
    got = maybe_jit(jax.grad(f))(X)
    np.testing.assert_allclose(got, jax.grad(lambda x: (jax.nn.relu(jnp.sin(x) * 3) ** 2).sum())(X), rtol=1e-12)


def test_nested_functions():
    """A jaxfn function called inside another's forward and backward."""

    def forward(ctx, x):
        ctx.save_for_backward(x=x)
        return my_sin(x) ** 2

    def backward(ctx, g):
        x = ctx.saved_variables.x
        return g * 2 * my_sin(x) * jnp.cos(x)

    sin2 = jaxfn.autograd_function(forward, backward, name="sin2")
    got = jax.jit(jax.grad(lambda x: sin2(x).sum()))(X)
    np.testing.assert_allclose(got, jax.grad(lambda x: (jnp.sin(x) ** 2).sum())(X), rtol=1e-12)
    # and the outer backward is differentiable (reverse over reverse) through the inner function
    hess = jax.jacrev(jax.grad(lambda x: sin2(x).sum()))(X)
    np.testing.assert_allclose(hess, jax.hessian(lambda x: (jnp.sin(x) ** 2).sum())(X), rtol=1e-10, atol=1e-14)


def test_class_style_function():
    class MySin(jaxfn.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return jnp.sin(x)

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return grad_output * jnp.cos(x)

    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: MySin.apply(x).sum()))(X), jnp.cos(X), rtol=1e-12)

    class Broken(jaxfn.Function):
        @staticmethod
        def forward(ctx, x):
            return "no"

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(jaxfn.AutogradFunctionError, match="'Broken': forward must return arrays"):
        Broken.apply(X)

    class NoMethods(jaxfn.Function):
        pass

    with pytest.raises(TypeError, match="'NoMethods': a jaxfn.Function subclass needs static methods"):
        NoMethods.apply(X)


SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import sys; sys.path.insert(0, "tests")
    from seeds import my_relu
    assert jax.device_count() == 8, jax.devices()
    kx, ky, k1, k2 = jax.random.split(jax.random.key(0), 4)
    x, y = jax.random.normal(kx, (64, 100)), jax.random.normal(ky, (64, 10))
    w1, w2 = jax.random.normal(k1, (100, 32)), jax.random.normal(k2, (32, 10))
    loss = lambda w1, w2, x, y: ((my_relu(x @ w1) @ w2 - y) ** 2).sum()
    grad = jax.jit(jax.grad(loss, (0, 1)))
    single = grad(w1, w2, x, y)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    shard = NamedSharding(mesh, P("data"))
    xs, ys = jax.device_put(x, shard), jax.device_put(y, shard)
    sharded = grad(w1, w2, xs, ys)
    assert len(xs.sharding.device_set) == 8
    for a, b in zip(single, sharded):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)
    print("OK", float(jnp.abs(single[0] - sharded[0]).max()))
    """
)


@pytest.mark.slow
def test_data_parallel_jit_over_8_devices_matches_one_device():
    result = run_on_8_devices(SHARDED, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("OK")


def test_a_pullback_keeps_no_reference_to_the_call_arrays():
    import gc
    import weakref

    f = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 2, name="double")
    x = jnp.ones(1000) + 1.0
    ref = weakref.ref(x)
    _, pullback = jax.vjp(f, x)  # the pullback keeps the custom_vjp rule alive
    del x
    gc.collect()
    assert ref() is None
    np.testing.assert_allclose(pullback(jnp.ones(1000))[0], 2.0)


@pytest.mark.parametrize("save_only_what_is_needed", [False, True])
def test_mixed_second_derivatives_across_inputs(maybe_jit, save_only_what_is_needed):
    """The inner level differentiates x, the outer y (and the other way round): each level's
    backward sees its own needs_input_grad."""

    def forward(ctx, x, y):
        needs = ctx.needs_input_grad
        ctx.save_for_backward(x=x if needs.y or not save_only_what_is_needed else None, y=y)
        return x * y * y

    def backward(ctx, g):
        s, needs = ctx.saved_variables, ctx.needs_input_grad
        return {"x": g * s.y * s.y if needs.x else None, "y": g * 2 * s.x * s.y if needs.y else None}

    mul = jaxfn.autograd_function(forward, backward, name="mul")
    plain = lambda x, y: x * y * y
    for inner, outer in ((0, 1), (1, 0)):

        def second(f, inner=inner, outer=outer):
            def first(*xy):
                return jax.grad(f, argnums=inner)(*xy)

            return jax.grad(first, argnums=outer)

        np.testing.assert_allclose(maybe_jit(second(mul))(2.0, 3.0), second(plain)(2.0, 3.0), rtol=1e-12)
