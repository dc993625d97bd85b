"""Closures get gradients: a function passed as an argument that closes over values being
differentiated reaches forward and backward as a callable pytree whose leaves are those values
(``jaxfn._tracers.Closure``); backward returns its gradient as that pytree's cotangent.

Each case is checked against plain autodiff of the same math (the reference never goes through
jaxfn), eagerly, under ``jit``, ``vmap`` and ``scan``, and at second order."""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from seeds import StaticNode

import jaxfn


def _apply_forward(ctx, fn, x):
    ctx.save_for_backward(fn=fn, x=x)
    return fn(x)


def _apply_backward(ctx, grad_output):
    s = ctx.saved_variables
    _, pull = jax.vjp(lambda fn, x: fn(x), s.fn, s.x)
    grad_fn, grad_x = pull(grad_output)
    return {"fn": grad_fn, "x": grad_x}


CUSTOM_VJP3 = os.environ.get("JAX_CUSTOM_VJP3", "").lower() in ("1", "true")
apply = jaxfn.autograd_function(_apply_forward, _apply_backward, name="apply")
apply_fm = jaxfn.autograd_function(_apply_forward, _apply_backward, name="apply_fm", forward_mode=True)
W = jnp.array([[0.3, -0.2, 0.5], [0.1, 0.4, -0.3], [-0.2, 0.1, 0.2]])
B = jnp.array([0.1, -0.1, 0.05])
X = jnp.array([0.5, -1.0, 2.0])


def _layer(w, b, z):
    return jnp.tanh(w @ z + b)


class _Layer:  # a callable object holding its parameters (not a pytree)
    def __init__(self, w, b):
        self.w, self.b = w, b

    def __call__(self, z):
        return _layer(self.w, self.b, z)


# Each way to hand forward a function closing over (w, b).
MAKERS = {
    "closure": lambda w, b: lambda z: _layer(w, b, z),
    "partial": lambda w, b: functools.partial(_layer, w, b),
    "object": _Layer,
    "bound method": lambda w, b: _Layer(w, b).__call__,
}


def _loss(f, make):
    return lambda w, b, x: jnp.sum(f(make(w, b), x) ** 2)


def _plain(w, b, x):
    return jnp.sum(_layer(w, b, x) ** 2)


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
@pytest.mark.parametrize("f", [apply, apply_fm], ids=["default", "forward_mode"])
def test_a_closed_over_value_gets_its_gradient(maybe_jit, make, f):
    got = maybe_jit(jax.grad(_loss(f, make), (0, 1, 2)))(W, B, X)
    want = jax.grad(_plain, (0, 1, 2))(W, B, X)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-6)


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_under_vmap_the_closed_over_values_are_batched(maybe_jit, make):
    ws = jnp.stack([W, 2 * W, -W])
    xs = jnp.stack([X, -X, 0.5 * X])
    got = maybe_jit(jax.vmap(jax.grad(_loss(apply, make), (0, 2)), (0, None, 0)))(ws, B, xs)
    want = jax.vmap(jax.grad(_plain, (0, 2)), (0, None, 0))(ws, B, xs)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-6)


def test_in_a_scan_body(maybe_jit):
    def steps(f):
        def run(w, b, x):
            def body(z, _):
                return f(lambda v: _layer(w, b, v), z), None

            return jnp.sum(lax.scan(body, x, None, length=4)[0] ** 2)

        return run

    plain = steps(lambda fn, z: fn(z))
    got = maybe_jit(jax.grad(steps(apply), (0, 1, 2)))(W, B, X)
    for g, r in zip(got, jax.grad(plain, (0, 1, 2))(W, B, X)):
        np.testing.assert_allclose(g, r, rtol=1e-6)


def test_second_order_goes_through_backward(maybe_jit):
    loss = _loss(apply, MAKERS["closure"])
    got = maybe_jit(jax.jacrev(jax.grad(loss)))(W, B, X)
    np.testing.assert_allclose(got, jax.hessian(_plain)(W, B, X), rtol=1e-5, atol=1e-7)
    fm = _loss(apply_fm, MAKERS["closure"])
    np.testing.assert_allclose(maybe_jit(jax.hessian(fm))(W, B, X), jax.hessian(_plain)(W, B, X), rtol=1e-5, atol=1e-7)


def test_forward_mode_of_a_closure(maybe_jit):
    loss = _loss(apply_fm, MAKERS["closure"])
    tangent = jnp.ones_like(W)
    got = maybe_jit(lambda w, t: jax.jvp(lambda w: loss(w, B, X), (w,), (t,)))(W, tangent)
    want = jax.jvp(lambda w: _plain(w, B, X), (W,), (tangent,))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_needs_input_grad_names_the_function_and_forward_receives_a_callable_pytree():
    seen = {}

    def forward(ctx, fn, x):
        seen["type"], seen["leaves"] = type(fn).__name__, len(jax.tree_util.tree_leaves(fn))
        ctx.save_for_backward(fn=fn, x=x)
        return fn(x)

    def backward(ctx, grad_output):
        seen["needs"] = (ctx.needs_input_grad.fn, ctx.needs_input_grad.x)
        if ctx.needs_input_grad.fn:
            return _apply_backward(ctx, grad_output)
        s = ctx.saved_variables  # fn may be the plain function here (it holds nothing traced)
        return {"x": jax.vjp(s.fn, s.x)[1](grad_output)[0]}

    f = jaxfn.autograd_function(forward, backward, name="f")
    jax.grad(lambda w: jnp.sum(f(lambda z: _layer(w, B, z), X)))(W)
    assert seen == {"type": "Closure", "leaves": 1, "needs": (True, False)}  # B is a constant here
    got = jax.grad(lambda x: jnp.sum(f(lambda z: _layer(W, B, z), x)))(X)
    assert seen == {"type": "function", "leaves": 1, "needs": (False, True)}  # holds no traced value: as given
    np.testing.assert_allclose(got, jax.grad(lambda x: jnp.sum(_layer(W, B, x)))(X), rtol=1e-6)
    got = jax.jit(lambda w, x: jax.grad(lambda x: jnp.sum(f(lambda z: _layer(w, B, z), x)))(x))(W, X)
    assert seen == {"type": "Closure", "leaves": 1, "needs": (False, True)}  # traced by jit, not differentiated
    np.testing.assert_allclose(got, jax.grad(lambda x: jnp.sum(_layer(W, B, x)))(X), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(f(jnp.sin, x)))(X), jnp.cos(X), rtol=1e-6)


def test_a_function_argument_keeps_its_attributes_and_runs_eagerly_as_given():
    seen = []

    def forward(ctx, fn, x):
        seen.append((fn.__name__, fn.scale))
        return fn(x)

    def scaled(z):
        return z * scaled.scale

    scaled.scale = 3.0
    f = jaxfn.autograd_function(forward, lambda ctx, g: {"x": g * 3.0}, name="f")
    np.testing.assert_allclose(jax.grad(lambda x: f(scaled, x).sum())(X), 3.0)
    np.testing.assert_allclose(f(scaled, X), 3.0 * X)  # eager: the function itself
    assert set(seen) == {("scaled", 3.0)} and len(seen) >= 2  # jax_custom_vjp3 traces forward twice


def test_closures_over_integers_and_keys_are_converted_too(maybe_jit):
    """A loop index or a PRNG key a function holds is a leaf too (never differentiated): the
    function can be saved and called in backward after the loop's trace has ended."""

    def loss(w, x, key):
        noise = jax.random.normal(key, x.shape)
        body = lambda i, c: c + jnp.sum(apply(lambda z: jnp.tanh(w * z) * i + noise * 0.0, x))  # noqa: E731
        return lax.fori_loop(0, 3, body, 0.0)

    def plain(w, x, key):
        return sum(jnp.sum(jnp.tanh(w * x) * i) for i in range(3))

    key = jax.random.key(0)
    np.testing.assert_allclose(maybe_jit(jax.grad(loss))(0.7, X, key), jax.grad(plain)(0.7, X, key), rtol=1e-6)
    only_int = jax.jit(lambda n, x: jax.grad(lambda x: apply(lambda z: jnp.sin(z) * n, x).sum())(x))  # n traced
    np.testing.assert_allclose(only_int(3, X), 3 * jnp.cos(X), rtol=1e-6)


def test_a_tuple_backward_returns_the_closure_s_gradient_in_its_slot():
    def backward(ctx, grad_output):
        grads = _apply_backward(ctx, grad_output)
        return grads["fn"], grads["x"]

    f = jaxfn.autograd_function(_apply_forward, backward, name="f")
    got = jax.grad(_loss(f, MAKERS["closure"]), (0, 1))(W, B, X)
    for g, r in zip(got, jax.grad(_plain, (0, 1))(W, B, X)):
        np.testing.assert_allclose(g, r, rtol=1e-6)


def test_a_backward_without_the_closure_s_gradient_is_refused_for_each_form():
    """PyTorch silently gives no gradient to what a function argument closes over; jaxfn refuses."""
    for returned in ({"x": None}, (None, None)):
        f = jaxfn.autograd_function(_apply_forward, lambda ctx, g, r=returned: r, name="f")
        with pytest.raises(jaxfn.AutogradFunctionError, match=r"'f': 'fn' is a function that closes over values"):
            jax.grad(_loss(f, MAKERS["closure"]))(W, B, X)
    zeros = jaxfn.autograd_function(  # zeros are a gradient: said, not assumed
        _apply_forward, lambda ctx, g: {"fn": jax.tree.map(jnp.zeros_like, ctx.saved_variables.fn)}, name="f"
    )
    np.testing.assert_allclose(jax.grad(_loss(zeros, MAKERS["closure"]))(W, B, X), 0.0)


def test_a_wrong_gradient_structure_for_the_closure_is_refused():
    f = jaxfn.autograd_function(_apply_forward, lambda ctx, g: {"fn": jnp.ones(3)}, name="f")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'f': backward returned an array .* for 'fn'"):
        jax.grad(_loss(f, MAKERS["closure"]))(W, B, X)


def _closing_layer(w, b, name="layer", **options):
    """A jaxfn function made where it is used, whose forward and backward close over w and b."""

    def forward(ctx, x):
        ctx.save_for_backward(x=x)
        return jnp.tanh(w @ x + b)

    def backward(ctx, grad_output):
        x = ctx.saved_variables.x
        pre = grad_output * (1 - jnp.tanh(w @ x + b) ** 2)
        grads = {"x": w.T @ pre}
        if ctx.needs_input_grad.w:  # a closed-over value counts as a parameter, by its name
            grads["w"] = jnp.outer(pre, x)
        if ctx.needs_input_grad.b:
            grads["b"] = pre
        return grads

    return jaxfn.autograd_function(forward, backward, name=name, **options)


def _closing_loss(w, b, x, **options):
    return jnp.sum(_closing_layer(w, b, **options)(x) ** 2)


@pytest.mark.parametrize("options", [{}, {"forward_mode": True}], ids=["default", "forward_mode"])
def test_values_forward_and_backward_close_over_get_their_gradient(maybe_jit, options):
    """SPEC section 15: what forward or backward closes over that is being differentiated is a
    parameter after forward's own, named as the code names it."""
    loss = functools.partial(_closing_loss, **options)
    _check(maybe_jit(jax.grad(loss, (0, 1, 2)))(W, B, X), jax.grad(_plain, (0, 1, 2))(W, B, X))
    if CUSTOM_VJP3 and maybe_jit is jax.jit:  # JAX's new custom_vjp refuses a closed-over jit tracer (b, below)
        return
    _check(maybe_jit(jax.grad(loss, 2))(W, B, X), jax.grad(_plain, 2)(W, B, X))  # needs_input_grad.w False
    ws = jnp.stack([W, -W])
    _check(
        maybe_jit(jax.vmap(jax.grad(loss), (0, None, None)))(ws, B, X),
        jax.vmap(jax.grad(_plain), (0, None, None))(ws, B, X),
    )
    _check(maybe_jit(jax.jacrev(jax.grad(loss)))(W, B, X), jax.hessian(_plain)(W, B, X))


def test_a_closed_over_layer_and_a_tuple_backward():
    def loss(w, b, x):
        layer = lambda z: _layer(w, b, z)  # noqa: E731

        def forward(ctx, x):
            ctx.save_for_backward(x)
            return layer(x)

        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            if ctx.needs_input_grad.layer:
                _, pull = jax.vjp(lambda layer, x: layer(x), layer, x)
                grad_layer, grad_x = pull(grad_output)
                return {"x": grad_x, "layer": grad_layer}  # a closed-over value: by name
            return (jax.vjp(layer, x)[1](grad_output)[0],)  # a tuple: forward's own parameters

        return jnp.sum(jaxfn.autograd_function(forward, backward, name="f")(x) ** 2)

    _check(jax.jit(jax.grad(loss, (0, 1, 2)))(W, B, X), jax.grad(_plain, (0, 1, 2))(W, B, X))
    _check(jax.grad(loss, 2)(W, B, X), jax.grad(_plain, 2)(W, B, X))


def test_a_tuple_counts_forward_s_parameters_alone():
    """PyTorch's `a, = ctx.needs_input_grad` and a tuple of gradients count forward's own
    parameters, whether or not a closed-over value is being differentiated in this call."""
    seen = []

    def loss(w, x):
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return w * jnp.sin(x)

        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            (needs_x,) = ctx.needs_input_grad
            seen.append((needs_x, ctx.needs_input_grad.w))
            return (
                (grad_output * w * jnp.cos(x),)
                if not ctx.needs_input_grad.w
                else {
                    "x": grad_output * w * jnp.cos(x),
                    "w": jnp.sum(grad_output * jnp.sin(x)),
                }
            )

        return jnp.sum(jaxfn.autograd_function(forward, backward, name="scale")(x))

    _check(jax.grad(loss, (0, 1))(2.0, X), (jnp.sum(jnp.sin(X)), 2.0 * jnp.cos(X)))
    _check(jax.grad(loss, 1)(2.0, X), 2.0 * jnp.cos(X))
    assert seen == [(True, True), (True, False)]

    def extra(w, x):
        f = jaxfn.autograd_function(lambda ctx, x: w * x, lambda ctx, g: (g * w, jnp.sum(g)), name="scale")
        return jnp.sum(f(x))

    for argnums in (0, 1):  # the same refusal whether or not w is differentiated
        with pytest.raises(jaxfn.AutogradFunctionError, match=r"'scale': backward returned 2 gradients for 1"):
            jax.grad(extra, argnums)(2.0, X)


def test_a_closed_over_equinox_module_once_differentiable_and_a_value_also_passed():
    eqx = pytest.importorskip("equinox")

    class Layer(eqx.Module):
        w: jax.Array

        def __call__(self, z):
            return jnp.tanh(self.w @ z)

    def loss(w, x):
        layer = Layer(w)  # a pytree: its leaves are the parameter's

        def forward(ctx, x):
            ctx.save_for_backward(x=x)
            return layer(x)

        @jaxfn.once_differentiable
        def backward(ctx, g):
            x = ctx.saved_variables.x
            d = g * (1 - jnp.tanh(layer.w @ x) ** 2)
            return {"x": layer.w.T @ d, "layer": Layer(jnp.outer(d, x))}

        return jnp.sum(jaxfn.autograd_function(forward, backward, name="f")(x))

    plain = lambda w, x: jnp.sum(jnp.tanh(w @ x))  # noqa: E731
    for transform in (lambda f: f, jax.jit):
        _check(transform(jax.grad(loss, (0, 1)))(W, X), jax.grad(plain, (0, 1))(W, X))

    def backward_reads_the_argument(w, x):  # backward reads x, the same value forward takes as z
        f = jaxfn.autograd_function(
            lambda ctx, z: w * jnp.sin(z), lambda ctx, g: {"z": g * w * jnp.cos(x), "w": jnp.sum(g * jnp.sin(x))}
        )
        return jnp.sum(f(x))

    with pytest.raises(jaxfn.AutogradFunctionError, match=r"closes over 'x'"):
        jax.grad(backward_reads_the_argument, (0, 1))(2.0, X)


@pytest.mark.skipif(CUSTOM_VJP3, reason="JAX's new custom_vjp refuses any closed-over tracer (Known limits)")
def test_a_closed_over_object_or_list_read_only_under_jit_works_as_before():
    class Config:
        def __init__(self, scale):
            self.scale = scale

    def loss(w, x):
        cfg, log = Config(w), [w]

        def forward(ctx, x):
            ctx.save_for_backward(x=x)
            log.append(1)
            return cfg.scale * jnp.sin(x)

        def backward(ctx, g):
            return {"x": g * cfg.scale * jnp.cos(ctx.saved_variables.x)}

        return jnp.sum(jaxfn.autograd_function(forward, backward, name="scale")(x))

    _check(jax.jit(jax.grad(loss, 1))(2.0, X), 2.0 * jnp.cos(X))
    _check(
        jax.vmap(jax.grad(loss, 1), (0, None))(jnp.array([1.0, 2.0]), X), jnp.outer(jnp.array([1.0, 2.0]), jnp.cos(X))
    )


def test_a_backward_without_the_gradient_of_a_closed_over_value_is_refused():
    def loss(w, x):
        f = jaxfn.autograd_function(lambda ctx, x: w * x, lambda ctx, g: {"x": g * w}, name="scale")
        return jnp.sum(f(x))

    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'scale': forward or backward closes over 'w', which"):
        jax.grad(loss)(2.0, X)
    np.testing.assert_allclose(jax.grad(loss, 1)(2.0, X), 2.0)  # w not differentiated: nothing needed


def test_a_gradient_for_a_closed_over_value_not_differentiated_is_dropped():
    def loss(w, x):
        def forward(ctx, x):
            ctx.save_for_backward(x=x)
            return w * x

        def backward(ctx, g):
            return {"x": g * w, "w": jnp.sum(g * ctx.saved_variables.x)}  # "w" whether or not it is asked for

        return jnp.sum(jaxfn.autograd_function(forward, backward, name="scale")(x))

    np.testing.assert_allclose(jax.grad(loss, 1)(2.0, X), 2.0)
    np.testing.assert_allclose(jax.grad(loss, 0)(2.0, X), jnp.sum(X))


def test_closures_of_a_rule_with_a_jvp_rule_are_still_refused():
    """A jvp rule would need the closed-over value's tangent, which it has no parameter for: such
    a function keeps the refusal (pass the value, or a function holding it, as an argument)."""

    def make(w):
        return jaxfn.autograd_function(
            lambda ctx, x: x * w, lambda ctx, g: {"x": g * w}, jvp=lambda ctx, t: t * w, name="scale"
        )

    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'scale': forward or backward .*a function passed as an argument may close over it",
    ):
        jax.grad(lambda w: jnp.sum(make(w)(X)))(2.0)


def test_an_equinox_module_and_its_method():
    eqx = pytest.importorskip("equinox")

    class Layer(eqx.Module):
        w: jax.Array
        b: jax.Array

        def __call__(self, z):
            return _layer(self.w, self.b, z)

        def double(self, z):
            return 2 * _layer(self.w, self.b, z)

    def loss(w, b, x):
        layer = Layer(w, b)
        return jnp.sum(apply(layer, x) ** 2) + jnp.sum(apply(layer.double, x))

    def plain(w, b, x):
        return _plain(w, b, x) + jnp.sum(2 * _layer(w, b, x))

    for transform in (lambda f: f, jax.jit):
        got = transform(jax.grad(loss, (0, 1, 2)))(W, B, X)
        for g, r in zip(got, jax.grad(plain, (0, 1, 2))(W, B, X)):
            np.testing.assert_allclose(g, r, rtol=1e-6)
    grads = eqx.filter_grad(lambda layer, x: jnp.sum(apply(layer, x) ** 2))(Layer(W, B), X)
    np.testing.assert_allclose(grads.w, jax.grad(_plain)(W, B, X), rtol=1e-6)


def test_a_flax_nnx_module_s_method():
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)

    def loss(params, x):
        return jnp.sum(apply(nnx.merge(graphdef, params).__call__, x) ** 2)

    def plain(params, x):
        return jnp.sum(nnx.merge(graphdef, params)(x) ** 2)

    for transform in (lambda f: f, jax.jit):
        got = transform(jax.grad(loss))(params, X)
        want = jax.grad(plain)(params, X)
        for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(g, r, rtol=1e-6)
    got = nnx.grad(lambda m, x: jnp.sum(apply(m.__call__, x) ** 2))(model, X)
    want = nnx.grad(lambda m, x: jnp.sum(m(x) ** 2))(model, X)
    np.testing.assert_allclose(got["kernel"][...], want["kernel"][...], rtol=1e-6)


def _check(got, want):
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-7)


def test_closures_inside_a_dict_and_as_varargs(maybe_jit):
    def forward(ctx, fns, x, *more):
        ctx.save_for_backward(fns, x, *more)
        return fns["a"](x) + sum(fn(x) for fn in more)

    def backward(ctx, grad_output):
        fns, x, *more = ctx.saved_tensors
        _, pull = jax.vjp(lambda fns, x, *more: fns["a"](x) + sum(fn(x) for fn in more), fns, x, *more)
        return pull(grad_output)

    f = jaxfn.autograd_function(forward, backward, name="f")
    loss = lambda w, b, x: f({"a": lambda z: jnp.tanh(w @ z)}, x, lambda z: b * z, lambda z: w[0] * z).sum()  # noqa: E731
    plain = lambda w, b, x: (jnp.tanh(w @ x) + b * x + w[0] * x).sum()  # noqa: E731
    _check(maybe_jit(jax.grad(loss, (0, 1, 2)))(W, B, X), jax.grad(plain, (0, 1, 2))(W, B, X))


@pytest.mark.parametrize("policy", [None, "nothing_saveable", "everything_saveable"])
def test_under_checkpoint(maybe_jit, policy):
    loss = _loss(apply, MAKERS["closure"])
    checkpointed = jax.checkpoint(loss, policy=policy and getattr(jax.checkpoint_policies, policy))
    _check(maybe_jit(jax.grad(checkpointed, (0, 1, 2)))(W, B, X), jax.grad(_plain, (0, 1, 2))(W, B, X))


def test_a_closure_called_with_keywords_and_returning_a_tuple():
    def forward(ctx, fn, x):
        ctx.save_for_backward(fn=fn, x=x)
        a, b = fn(x, scale=2.0)
        return a + b

    def backward(ctx, grad_output):
        s = ctx.saved_variables
        return jax.vjp(lambda fn, x: sum(fn(x, scale=2.0)), s.fn, s.x)[1](grad_output)

    f = jaxfn.autograd_function(forward, backward, name="f")
    loss = lambda w, x: f(lambda z, scale: (jnp.tanh(w @ z) * scale, z * w[0]), x).sum()  # noqa: E731
    plain = lambda w, x: (jnp.tanh(w @ x) * 2.0 + x * w[0]).sum()  # noqa: E731
    _check(jax.jit(jax.grad(loss, (0, 1)))(W, X), jax.grad(plain, (0, 1))(W, X))


def test_a_closure_over_a_value_also_passed_as_an_argument(maybe_jit):
    """A scan carry that the step function closes over and that is also the argument: both paths
    of its gradient (through the function and through the argument) add up."""

    def steps(f):
        def run(w, x):
            body = lambda c, _: (f(lambda z: jnp.tanh(w @ z + c), c), None)  # noqa: E731
            return lax.scan(body, x, None, length=3)[0].sum()

        return run

    _check(maybe_jit(jax.grad(steps(apply), (0, 1)))(W, X), jax.grad(steps(lambda fn, z: fn(z)), (0, 1))(W, X))


def test_a_jaxfn_function_inside_the_closure(maybe_jit):
    loss = lambda w, b, x: jnp.sum(apply(lambda z: apply(lambda y: _layer(w, b, y), z), x) ** 2)  # noqa: E731
    _check(maybe_jit(jax.grad(loss, (0, 1, 2)))(W, B, X), jax.grad(_plain, (0, 1, 2))(W, B, X))


def _jvp_rule(ctx, tangent_fn, tangent_x):
    s = ctx.saved_variables
    return jax.jvp(lambda fn, x: fn(x), (s.fn, s.x), (tangent_fn, tangent_x))[1]


def _forward_for_jvp(ctx, fn, x):
    ctx.save_for_forward(fn=fn, x=x)
    return _apply_forward(ctx, fn, x)


def _vmap_rule(info, in_dims, fn, x):
    return jax.vmap(apply, in_dims)(fn, x), 0


BUILDERS = {
    "jvp rule": jaxfn.autograd_function(_forward_for_jvp, _apply_backward, jvp=_jvp_rule, name="f"),
    "vmap rule": jaxfn.autograd_function(_apply_forward, _apply_backward, vmap=_vmap_rule, name="f"),
    "jit=True": jaxfn.autograd_function(_apply_forward, _apply_backward, jit=True, name="f"),
}


@pytest.mark.parametrize("f", BUILDERS.values(), ids=BUILDERS.keys())
def test_in_every_builder(maybe_jit, f):
    loss = _loss(f, MAKERS["closure"])
    _check(maybe_jit(jax.grad(loss, (0, 1, 2)))(W, B, X), jax.grad(_plain, (0, 1, 2))(W, B, X))
    ws = jnp.stack([W, -W])
    _check(
        maybe_jit(jax.vmap(jax.grad(loss), (0, None, None)))(ws, B, X),
        jax.vmap(jax.grad(_plain), (0, None, None))(ws, B, X),
    )


def test_jvp_rule_and_linearize_of_a_closure():
    tangent = jnp.ones_like(W)
    want = jax.jvp(lambda w: _plain(w, B, X), (W,), (tangent,))
    loss = _loss(BUILDERS["jvp rule"], MAKERS["closure"])
    _check(jax.jvp(lambda w: loss(w, B, X), (W,), (tangent,)), want)
    _check(jax.linearize(lambda w: _loss(apply_fm, MAKERS["partial"])(w, B, X), W)[1](tangent), want[1])


def _apply_backward_any_fn(ctx, grad_output):
    """``_apply_backward``, also where ``fn`` holds nothing being traced (gradcheck holds ``w``
    fixed while it checks ``x``): then ``fn`` is the plain function, with no gradient of its own."""
    s = ctx.saved_variables
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(s.fn)):
        return {"x": jax.vjp(s.fn, s.x)[1](grad_output)[0]}
    return _apply_backward(ctx, grad_output)


def test_gradcheck_of_a_closure():
    apply_any = jaxfn.autograd_function(_apply_forward, _apply_backward_any_fn, name="apply")
    assert jaxfn.gradcheck(lambda w, x: apply_any(lambda z: jnp.tanh(w @ z), x), W, X)


def test_a_closure_called_in_backward_with_new_shapes_works_or_says_why():
    """The closure is traced at each signature while its values are being traced (in forward); a
    call in backward with shapes forward never used must trace it again, which jax 0.10 allows
    and jax 0.12 refuses (the values' trace has ended): then jaxfn's error names the function."""

    def forward(ctx, fn, x):
        ctx.save_for_backward(fn=fn, x=x)
        return fn(x)

    def backward(ctx, grad_output):
        s = ctx.saved_variables
        _, pull = jax.vjp(lambda fn: fn(jnp.stack([s.x, s.x]))[0], s.fn)  # a (2, 3) input, new here
        (grad_fn,) = pull(grad_output)
        return {"fn": grad_fn, "x": jax.vjp(s.fn, s.x)[1](grad_output)[0]}

    f = jaxfn.autograd_function(forward, backward, name="f")
    loss = lambda w, x: jnp.sum(f(lambda z: jnp.tanh(z @ w.T), x))  # noqa: E731
    try:
        got = jax.grad(loss, (0, 1))(W, X)
    except jaxfn.AutogradFunctionError as err:
        assert "'f': 'fn' is a function closing over traced values, and it was called with arguments" in str(err)
        assert "float64[2,3]" in str(err)
    else:
        _check(got, jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w.T)), (0, 1))(W, X))


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_closure_keeps_nothing_alive_after_the_call(transform):
    """A closure's program is traced with jax.make_jaxpr, whose cache holds the traced function
    weakly: after the call, neither the user's function nor its traced values are kept (JAX's
    closure_convert cache kept every call's, with its tracers and arrays)."""
    import gc
    import weakref

    made = []

    class Tag:
        pass

    def loss(w, x):
        fn = lambda z: jnp.tanh(w @ z)  # noqa: E731
        fn.tag = Tag()
        made.append(weakref.ref(fn.tag))
        return jnp.sum(apply(fn, x) ** 2)

    for scale in range(5):
        transform(jax.grad(loss))(W * scale, X)
    gc.collect()
    assert made and all(ref() is None for ref in made)


def test_a_host_function_taking_a_closure_under_jit():
    """A host forward calling a function argument: under jit its probe runs on example arrays
    while jit traces, and the closure runs on them at once."""
    f = jaxfn.autograd_function(lambda ctx, fn, x: np.asarray(fn(x)), "finite_differences", host=True, name="f")
    loss = lambda w, x: f(lambda z: jnp.tanh(w * z), x).sum()  # noqa: E731
    want = jax.grad(lambda w, x: jnp.tanh(w * x).sum(), (0, 1))(X, X)
    for transform in (lambda g: g, jax.jit):
        _check(transform(jax.grad(loss, (0, 1)))(X, X), want)


SHARDED = """
import jax, jax.numpy as jnp, numpy as np, jaxfn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
def forward(ctx, fn, x):
    ctx.save_for_backward(fn=fn, x=x)
    return fn(x)
def backward(ctx, g):
    s = ctx.saved_variables
    grad_fn, grad_x = jax.vjp(lambda fn, x: fn(x), s.fn, s.x)[1](g)
    return {"fn": grad_fn, "x": grad_x}
apply = jaxfn.autograd_function(forward, backward, name="apply")
def hsin_forward(ctx, x):
    ctx.save_for_backward(x=x)
    return np.sin(x)
hsin = jaxfn.autograd_function(hsin_forward, lambda ctx, g: g * np.cos(ctx.saved_variables.x), host=True)
fdsin = jaxfn.autograd_function(lambda ctx, x: np.sin(x), "finite_differences", host=True)
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.device_put(jnp.linspace(-1, 1, 32).reshape(8, 4), NamedSharding(mesh, P("d")))
w = jnp.array([0.5, -2.0, 1.5, 0.2])  # replicated, closed over; the batch is sharded
def loss(f):
    body = lambda w, x: jax.lax.psum(jnp.sum(f(lambda z: jnp.tanh(w * z), x)), "d")
    return lambda w, x: jax.shard_map(body, mesh=mesh, in_specs=(P(), P("d")), out_specs=P())(w, x)
for transform in (lambda f: f, jax.jit):
    got = transform(jax.grad(loss(apply), (0, 1)))(w, x)
    want = jax.grad(loss(lambda fn, x: fn(x)), (0, 1))(w, x)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5)
def scaled(w, x):  # forward and backward close over w, replicated
    def forward(ctx, x):
        ctx.save_for_backward(x=x)
        return w * jnp.sin(x)
    def backward(ctx, g):
        x = ctx.saved_variables.x
        return {"x": g * w * jnp.cos(x), "w": jnp.sum(g * jnp.sin(x))}
    return jax.lax.psum(jaxfn.autograd_function(forward, backward, name="scaled")(x).sum(), "d")
total = jax.shard_map(scaled, mesh=mesh, in_specs=(P(), P("d")), out_specs=P())
got = jax.grad(total, (0, 1))(2.0, x)
np.testing.assert_allclose(got[0], jnp.sum(jnp.sin(x)), rtol=1e-5)
np.testing.assert_allclose(got[1], 2.0 * jnp.cos(x), rtol=1e-5)
for f in (hsin, fdsin):  # host code inside shard_map: its results vary per device
    total = jax.shard_map(lambda x: jax.lax.psum(f(x).sum(), "d"), mesh=mesh, in_specs=P("d"), out_specs=P())
    np.testing.assert_allclose(jax.jit(jax.grad(total))(x), jnp.cos(x), atol=1e-4)
print("OK")
"""


@pytest.mark.slow
def test_inside_shard_map_a_closure_over_a_replicated_value_and_host_code():
    import os

    from seeds import run_on_8_devices

    result = run_on_8_devices(SHARDED, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


_OUTSIDE: dict = {}


def test_a_differentiated_value_read_from_outside_arguments_and_closure_is_refused_eagerly():
    """A module-level value forward reads at call time (known limit: under jit JAX raises its own
    UnexpectedTracerError after the call); eagerly JAX refuses inside the call, in jaxfn's words."""

    def forward(ctx, x):
        return x * _OUTSIDE["w"]

    f = jaxfn.autograd_function(forward, lambda ctx, g: {"x": g}, name="reads_outside")

    def loss(w, x):
        _OUTSIDE["w"] = w
        return f(x).sum()

    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'reads_outside': .*reads a value that JAX is tracing"):
        jax.grad(loss)(jnp.float32(3.0), jnp.ones(2))
    _OUTSIDE.clear()


def test_a_closed_over_value_named_as_a_parameter_of_forward_is_named():
    def loss(x):
        def forward(ctx, x):
            ctx.save_for_backward(x=x)
            return jnp.sin(x)

        def backward(ctx, g):
            assert x is not None  # reads loss's x, differentiated, under forward's parameter's name
            return {"x": g * jnp.cos(ctx.saved_variables.x)}

        return jaxfn.autograd_function(forward, backward, name="clash")(2.0 * x).sum()

    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'clash': forward or backward closes over 'x'.*also a "):
        jax.grad(loss)(jnp.array([0.3, -1.2, 0.7]))


def test_a_closure_called_in_backward_with_other_python_values_is_named_or_right():
    """On jax 0.12 a closure's program can't be traced again after forward's trace ended: the
    message names the arguments, Python values too; on jax 0.10 the call works."""

    def forward(ctx, fn, x):
        ctx.save_for_backward(fn=fn, x=x)
        return fn(x, 1.0)

    def backward(ctx, g):
        s = ctx.saved_variables
        _, pull = jax.vjp(lambda fn, x: fn(x, 2.0) / 2.0, s.fn, s.x)
        fn_grad, x_grad = pull(g)
        return {"fn": fn_grad, "x": x_grad}

    f = jaxfn.autograd_function(forward, backward, name="twice_called")
    x = jnp.array([1.0, 2.0])
    loss = lambda w, x: f(lambda z, k: w * z * k, x).sum()
    try:
        got = jax.grad(loss, (0, 1))(0.4, x)
    except jaxfn.AutogradFunctionError as err:
        assert re.search(r"\(float\d+\[2\], 2\.0\)", str(err)) and "the same Python values" in str(err)
    else:
        want = jax.grad(lambda w, x: (w * x).sum(), (0, 1))(0.4, x)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_a_function_argument_keeps_one_program_per_strict_call_key():
    """A function argument holding a traced value is traced once per call signature, keyed
    strictly: a pytree node with static data 1 and one with 1.0 are two signatures (keyed by
    ``==`` they shared the program traced for 1, a silent wrong value)."""

    def forward(ctx, x, g):
        return g(StaticNode(x, 1)) + g(StaticNode(x, 1.0))

    f = jaxfn.autograd_function(forward, lambda ctx, grad: {"x": grad}, name="f")

    def run(w):
        g = lambda node: node.value * (2.0 if isinstance(node.static, float) else 3.0) * w  # noqa: E731
        return f(jnp.ones(2), g).sum()

    assert float(jax.jit(run)(1.0)) == 10.0  # (3 + 2) * 2 elements


_HELD_BY_A_VMAP_RULE_FUNCTION = {
    "jit": lambda make, w, x: jax.jit(lambda w, x: make(w)(x))(w, x),
    "jit(grad)": lambda make, w, x: jax.jit(jax.grad(lambda w, x: make(w)(x).sum(), 1))(w, x),
    "jit(vmap over x)": lambda make, w, x: jax.jit(lambda w, x: jax.vmap(make(w))(x))(w, x[:, None]),
    "vmap over w": lambda make, w, x: jax.vmap(lambda w: make(w)(x))(jnp.stack([w, w])),
    "scan": lambda make, w, x: lax.scan(lambda c, w: (c + make(w)(x).sum(), None), 0.0, jnp.stack([w, w]))[0],
    "grad over w": lambda make, w, x: jax.grad(lambda w: make(w)(x).sum())(w),
}


@pytest.mark.parametrize("how", _HELD_BY_A_VMAP_RULE_FUNCTION)
def test_a_function_with_a_vmap_rule_that_closes_over_a_traced_value_is_refused_in_jaxfn_words(how):
    """A vmap rule makes the function one JAX primitive, which can't carry a value of another trace
    (JAX's "No constant handler" or UnexpectedTracerError otherwise): refused under every trace,
    with the fix (an argument); the same function taking the value as an argument works."""

    def make(w):
        def forward(ctx, x):
            return x * w

        def vmap(info, in_dims, x):
            return x * w, in_dims[0]

        return jaxfn.autograd_function(forward, lambda ctx, g: g * w, vmap=vmap, name="scaled")

    w, x = jnp.array([1.5, -0.4, 2.0]), jnp.array([0.3, 1.2, -0.7])
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"^jaxfn: 'scaled': it has a vmap rule, .*pass that value"):
        _HELD_BY_A_VMAP_RULE_FUNCTION[how](make, w, x)
    as_argument = jaxfn.autograd_function(
        lambda ctx, w, x: x * w, lambda ctx, g: (None, g), vmap=lambda info, dims, w, x: (x * w, 0), name="scaled"
    )
    np.testing.assert_allclose(jax.jit(as_argument)(w, x), w * x)
