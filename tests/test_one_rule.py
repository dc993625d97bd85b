"""Reverse mode is backward, always: in every builder, under every transformation, at every order.

Each gradient is compared with what backward returns (written out by hand here), and each higher
order with a reference ``jax.custom_vjp`` written JAX's way (its fwd calls the function itself),
never with jaxfn's own output.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxfn
from jaxfn import _jax_private

W = jnp.array([2.0, 3.0, 4.0])
X = jnp.array([1.7, 2.2, -3.4])


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# -- one function per builder, all with the same forward and backward ------------------------------
# forward: x ** 3, saving its own output; backward: grad_output * 5 * output (deliberately not the
# derivative of forward, so that a result through forward's operations shows)


def _cube_forward(ctx, x):
    out = x**3
    ctx.save_for_backward(out)
    return out


def _cube_backward(ctx, g):
    (out,) = ctx.saved_tensors
    return g * 5.0 * out


BUILDERS = {
    "default": {},
    "forward_mode": {"forward_mode": True},
    "jvp rule": {"jvp": lambda ctx, t: t * 7.0},
    "vmap rule": {"vmap": lambda info, in_dims, x: (x**3, in_dims[0])},
}


@jax.custom_vjp
def _cube_reference(x):
    return x**3


def _cube_reference_fwd(x):
    out = _cube_reference(x)  # JAX's way: fwd calls the function, so every order goes through bwd
    return out, out


_cube_reference.defvjp(_cube_reference_fwd, lambda out, g: (g * 5.0 * out,))


def _cube(builder):
    return jaxfn.autograd_function(_cube_forward, _cube_backward, name="cube", **BUILDERS[builder])


def _value(f):
    return lambda x: jax.value_and_grad(f)(x)[0]


DEPTHS = {
    "grad": lambda f: jax.grad(f),
    "grad of the value of value_and_grad": lambda f: jax.grad(_value(f)),
    "grad of the value, nested twice": lambda f: jax.grad(_value(_value(f))),
    "grad of grad": lambda f: jax.grad(jax.grad(f)),
    "grad of grad of grad": lambda f: jax.grad(jax.grad(jax.grad(f))),
}


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_every_order_goes_through_backward_as_a_reference_custom_vjp(builder, depth, transform):
    f = _cube(builder)
    _close(transform(DEPTHS[depth](f))(1.5), DEPTHS[depth](_cube_reference)(1.5))


POLICIES = {
    "no checkpoint": lambda f: f,
    "checkpoint": jax.checkpoint,
    "checkpoint, dots saveable": lambda f: jax.checkpoint(f, policy=jax.checkpoint_policies.dots_saveable),
    "checkpoint, nothing saveable": lambda f: jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("builder", [*BUILDERS, "host"])
def test_grad_is_backward_under_checkpoint_vmap_and_a_remat_scan(builder, policy):
    if builder == "host":  # NumPy code through callbacks (its backward is once-differentiable)
        f = jaxfn.autograd_function(_cube_forward, _cube_backward, name="cube", host=True)
    else:
        f = _cube(builder)
    loss = POLICIES[policy](lambda x: (f(x) * W).sum())
    want = W * 5.0 * X**3  # what backward returns
    _close(jax.grad(loss)(X), want)
    _close(jax.jit(jax.grad(loss))(X), want)
    _close(jax.vmap(jax.grad(loss))(jnp.stack([X, X])), jnp.stack([want, want]))

    def scanned(cube):  # a remat'd scan body holding the function
        body = lambda carry, w: (carry + cube(carry) * w, None)
        return lambda x: lax.scan(POLICIES[policy](body), x, W[:2])[0].sum()

    x = jnp.array([0.3, -0.2, 0.1])
    _close(jax.grad(scanned(f))(x), jax.grad(scanned(_cube_reference))(x), 1e-4)
    _close(jax.jit(jax.grad(scanned(f)))(x), jax.grad(scanned(_cube_reference))(x), 1e-4)


BATCHINGS = {
    "vmap": lambda f: jax.vmap(f),
    "vmap, jit": lambda f: jax.jit(jax.vmap(f)),
    "vmap over axis 1": lambda f: lambda x: jax.vmap(f, in_axes=1, out_axes=1)(x),
    "vmap of vmap": lambda f: jax.vmap(jax.vmap(f)),
}


@pytest.mark.parametrize("batching", BATCHINGS)
@pytest.mark.parametrize("builder", BUILDERS)
def test_grad_of_a_batched_call_is_backward(builder, batching):
    """jax.grad outside jax.vmap: the batched call (a user's vmap rule, or JAX's batching of the
    rules) is differentiated through backward, never through the vmap rule's own operations."""
    f, reference = BATCHINGS[batching](_cube(builder)), BATCHINGS[batching](_cube_reference)
    xs = jnp.stack([X, X * 0.5]) * 0.5
    xs = xs[None] if batching == "vmap of vmap" else xs
    _close(jax.grad(lambda x: (f(x) * 2.0).sum())(xs), 2.0 * 5.0 * xs**3)  # what backward returns
    twice = lambda f: jax.grad(lambda x: jax.grad(lambda x: f(x).sum())(x).sum())
    _close(twice(f)(xs), twice(reference)(xs), 1e-4)


@pytest.mark.parametrize("builder", [b for b in BUILDERS if b != "default"])
def test_forward_mode_of_a_batched_call_is_the_rules_batched(builder):
    f = _cube(builder)
    xs = jnp.stack([X, X * 0.5])
    if builder == "vmap rule":  # no forward-mode rule: refused, as for the call itself
        with pytest.raises(jaxfn.AutogradFunctionError, match="'cube': it was differentiated in forward mode"):
            jax.jvp(jax.vmap(f), (xs,), (jnp.ones_like(xs),))
        return
    tangent = jax.jvp(jax.vmap(f), (xs,), (jnp.ones_like(xs),))[1]
    _close(tangent, 7.0 * jnp.ones_like(xs) if builder == "jvp rule" else 5.0 * xs**3)  # the jvp rule, or backward's


SECOND_ORDER_POLICIES = {
    **POLICIES,
    "checkpoint, everything saveable": lambda f: jax.checkpoint(f, policy=jax.checkpoint_policies.everything_saveable),
    "checkpoint, the save by name": lambda f: jax.checkpoint(
        f, policy=jax.checkpoint_policies.save_only_these_names("cube.0")
    ),
}


@pytest.mark.parametrize("policy", SECOND_ORDER_POLICIES)
@pytest.mark.parametrize("builder", BUILDERS)
def test_a_saved_output_is_differentiated_through_backward_at_second_order_under_checkpoint(builder, policy):
    def loss(cube):
        return SECOND_ORDER_POLICIES[policy](lambda x: (cube(x) * cube(2.0 * x)).sum())

    twice = lambda cube: jax.grad(lambda x: jax.grad(loss(cube))(x).sum())
    _close(twice(_cube(builder))(X * 0.3), twice(_cube_reference)(X * 0.3), 1e-4)
    _close(jax.jit(twice(_cube(builder)))(X * 0.3), twice(_cube_reference)(X * 0.3), 1e-4)


LOOPS = {
    "scan": lambda cube: lambda x: lax.scan(lambda c, _: (c + cube(c) * 0.5, None), x, None, length=2)[0],
    "fori_loop": lambda cube: lambda x: lax.fori_loop(0, 2, lambda i, c: c + cube(c) * 0.5, x),
    "scan, one step": lambda cube: lambda x: lax.scan(lambda c, _: (cube(c), None), x, None, length=1)[0],
}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("builder", BUILDERS)
def test_second_order_through_a_loop_goes_through_backward(builder, loop):
    twice = lambda cube: jax.grad(lambda x: jax.grad(lambda x: LOOPS[loop](cube)(x).sum())(x).sum())
    x = X * 0.3
    _close(twice(_cube(builder))(x), twice(_cube_reference)(x), 1e-4)
    _close(jax.jit(twice(_cube(builder)))(x), twice(_cube_reference)(x), 1e-4)


# -- what JAX's transposition would drop -----------------------------------------------------------


def _quantizer(**options):
    def forward(ctx, x):
        return jnp.round(x)

    def backward(ctx, g):  # a term that a cast to an integer and back makes, as quantizers do
        return g.astype(jnp.int32).astype(g.dtype) + g

    return jaxfn.autograd_function(forward, backward, name="quantize", **options)


@pytest.mark.parametrize("policy", POLICIES)
def test_forward_mode_true_never_changes_what_grad_returns(policy):
    want = W.astype(jnp.int32).astype(W.dtype) + W
    for options in ({}, {"forward_mode": True}):
        f = _quantizer(**options)
        loss = POLICIES[policy](lambda x, f=f: (f(x) * W).sum())
        _close(jax.grad(loss)(X), want)
        _close(jax.jit(jax.grad(loss))(X), want)


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_forward_mode_refuses_a_cast_of_grad_output_that_jax_would_transpose_to_zero(transform):
    f = _quantizer(forward_mode=True)
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'quantize': .*casts a value computed from grad_output"):
        transform(lambda x, t: jax.jvp(f, (x,), (t,)))(X, jnp.ones(3))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_jvp_rule_never_stands_in_for_a_straight_through_backward(policy):
    called = []

    def backward(ctx, g):
        called.append(True)
        return jnp.clip(g, -1.0, 1.0) * 5.0

    sign = jaxfn.autograd_function(
        lambda ctx, x: jnp.sign(x), backward, name="sign", jvp=lambda ctx, t: jnp.zeros_like(t)
    )
    loss = POLICIES[policy](lambda x: (sign(x) * W).sum())
    _close(jax.grad(loss)(X), jnp.full(3, 5.0))
    assert called
    assert float(jax.jvp(sign, (X,), (jnp.ones(3),))[1].sum()) == 0.0  # forward mode is the jvp rule


# -- jaxfn functions inside backward, host code, anomaly detection ---------------------------------


def test_jaxfn_functions_inside_backward_keep_their_backward_at_second_order_in_forward_mode():
    inner = jaxfn.autograd_function(lambda ctx, x: x * 2.0, lambda ctx, g: g * 3.0, name="inner", forward_mode=True)

    @jax.custom_vjp
    def inner_reference(x):
        return x * 2.0

    inner_reference.defvjp(lambda x: (inner_reference(x), None), lambda _, g: (g * 3.0,))

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return jnp.sin(x)

    def make(helper):
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return helper(g * jnp.cos(x))

        return backward

    outer = jaxfn.autograd_function(forward, make(inner), name="outer", forward_mode=True)

    @jax.custom_vjp
    def outer_reference(x):
        return jnp.sin(x)

    outer_reference.defvjp(lambda x: (outer_reference(x), x), lambda x, g: (inner_reference(g * jnp.cos(x)),))
    _close(jax.grad(jax.grad(outer))(0.3), jax.grad(jax.grad(outer_reference))(0.3))
    _close(jax.jit(jax.grad(jax.grad(outer)))(0.3), jax.grad(jax.grad(outer_reference))(0.3))


def _host_inside_backward():
    double = jaxfn.autograd_function(
        lambda ctx, x: np.asarray(x) * 2.0, lambda ctx, g: np.asarray(g) * 2.0, name="double", host=True
    )

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return jnp.sin(x)

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return double(g) * jnp.cos(x)

    return jaxfn.autograd_function(forward, backward, name="outer", forward_mode=True)


def test_a_host_function_inside_a_forward_mode_backward_works_in_reverse_mode():
    f = _host_inside_backward()
    _close(jax.jit(jax.grad(f))(0.3), 2.0 * jnp.cos(0.3))
    _close(jax.grad(f)(0.3), 2.0 * jnp.cos(0.3))


def test_a_host_function_inside_a_forward_mode_backward_is_refused_in_forward_mode_for_what_it_is():
    f = _host_inside_backward()
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'double': it is a host=True function .* can't transpose"):
        jax.jvp(f, (0.3,), (1.0,))


def test_detect_anomaly_composes_with_forward_mode():
    f = jaxfn.autograd_function(lambda ctx, x: x * 2.0, lambda ctx, g: g * 2.0, name="f", forward_mode=True)
    with jaxfn.detect_anomaly():
        _close(jax.jvp(f, (1.0,), (1.0,))[1], 2.0)
        _close(jax.jit(lambda x: jax.jvp(f, (x,), (1.0,))[1])(1.0), 2.0)
        _close(jax.grad(f)(1.0), 2.0)


def test_the_constant_term_check_never_runs_a_callback_on_made_up_values():
    seen = []

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2.0

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        jax.debug.callback(lambda v: seen.append(np.asarray(v).copy()), x)
        return g * 2.0

    f = jaxfn.autograd_function(forward, backward, name="f", forward_mode=True)
    x = jnp.array([0.5, 1.5])
    jax.block_until_ready(jax.jit(lambda x: jax.jvp(f, (x,), (jnp.ones(2),)))(x))
    jax.effects_barrier()
    for value in seen:
        _close(value, x)


# -- saved outputs of a while_loop forward ---------------------------------------------------------


def test_saved_outputs_of_a_while_loop_forward_have_a_second_derivative():
    def forward(ctx, x):  # Newton's method for the cube root, as solvers ported from custom_vjp code do
        step = lambda c: (c[0] - (c[0] ** 3 - x) / (3 * c[0] ** 2), c[1] + 1)
        z = lax.while_loop(lambda c: c[1] < 30, step, (jnp.ones_like(x), 0))[0]
        ctx.save_for_backward(z)
        return z

    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return g / (3 * z**2)

    cube_root = jaxfn.autograd_function(forward, backward, name="cube_root")
    want = jax.grad(jax.grad(lambda x: x ** (1 / 3)))(8.0)
    _close(jax.grad(jax.grad(cube_root))(8.0), want)
    _close(jax.jit(jax.grad(jax.grad(cube_root)))(8.0), want)


# -- refusals in jaxfn's words ---------------------------------------------------------------------


def test_forward_mode_under_jit_is_refused_in_jaxfn_words():
    f = jaxfn.autograd_function(lambda ctx, x: x * 2.0, lambda ctx, g: g * 2.0, name="double")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'double': it was differentiated in forward mode"):
        jax.jit(lambda x, t: jax.jvp(f, (x,), (t,)))(1.0, 1.0)


def test_an_output_that_depends_on_needs_input_grad_is_refused_under_scan_and_grad():
    def forward(ctx, x, y):
        return x * y if ctx.needs_input_grad.x else (x * y)[None]

    f = jaxfn.autograd_function(forward, lambda ctx, g: (g, g), name="shifty")
    loss = lambda x: lax.scan(lambda c, _: (f(c, 2.0).sum(), None), x, None, length=2)[0]
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'shifty': forward's output must be the same whatever"):
        jax.grad(loss)(1.0)


SHIFTY_TRANSFORMS = {
    "grad": lambda loss: jax.grad(loss),
    "jit(grad)": lambda loss: jax.jit(jax.grad(loss)),
    "grad of scan": lambda loss: jax.grad(lambda x: lax.scan(lambda c, _: (loss(c), None), x, None, length=2)[0]),
    "jit(grad(checkpoint))": lambda loss: jax.jit(jax.grad(jax.checkpoint(loss))),
    "vmap(grad)": lambda loss: lambda x: jax.vmap(jax.grad(loss))(jnp.stack([x, x + 1.0]))[0],
    "jvp": lambda loss: lambda x: jax.jvp(loss, (x,), (jnp.float32(1.0),))[1],
}


def _shifty_vmap(info, dims, x, y):
    return (x * y)[None], 1


SHIFTY_BUILDERS = {
    "default": {},
    "forward_mode": {"forward_mode": True},
    "jvp rule": {"jvp": lambda ctx, tx, ty: tx * 2.0},
    "vmap rule": {"vmap": _shifty_vmap},
    "vmap rule, forward_mode": {"vmap": _shifty_vmap, "forward_mode": True},
    "vmap rule, jvp rule": {"vmap": _shifty_vmap, "jvp": lambda ctx, tx, ty: tx * 2.0},
}


@pytest.mark.parametrize("transform", SHIFTY_TRANSFORMS)
@pytest.mark.parametrize("builder", SHIFTY_BUILDERS)
def test_an_output_that_depends_on_needs_input_grad_is_refused_or_right_in_every_builder(builder, transform):
    """Where JAX traces forward both with nothing and with something differentiated, the difference
    is refused in jaxfn's words (never JAX's structure error or a bare assertion); where it traces
    only one, the result is the plain function's."""

    def forward(ctx, x, y):
        return x * y if ctx.needs_input_grad.x else (x * y)[None]

    options = SHIFTY_BUILDERS[builder]
    f = jaxfn.autograd_function(forward, lambda ctx, g: (g * 2.0, None), name="shifty", **options)
    if transform == "jvp" and builder in ("default", "vmap rule"):
        pytest.skip("reverse mode only: forward mode is refused there (tested elsewhere)")
    run = SHIFTY_TRANSFORMS[transform]
    try:
        got = run(lambda x: f(x, 2.0).sum())(jnp.float32(1.5))
    except jaxfn.AutogradFunctionError as err:
        assert "'shifty': forward's output must be the same whatever is differentiated" in str(err), str(err)
        return
    _close(got, run(lambda x: (x * 2.0).sum())(jnp.float32(1.5)))


def test_a_vmap_rule_giving_a_tuple_of_out_dims_for_one_output_is_named():
    f = jaxfn.autograd_function(
        lambda ctx, x: x * 2, lambda ctx, g: g * 2, name="f", vmap=lambda info, d, x: (x * 2, (0,))
    )
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'f': vmap must return out_dims .* \(0,\)"):
        jax.vmap(f)(jnp.ones((3, 2)))


@pytest.mark.parametrize(
    "returned, what",
    [(lambda t: t * (2 + 1j), "complex64 where the output is real"), (lambda t: jnp.ones(t.shape, int), "an integer")],
    ids=["complex for real", "integer for float"],
)
def test_a_jvp_or_vmap_rule_result_of_the_wrong_dtype_is_named(returned, what):
    f = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 2, name="f", jvp=lambda ctx, t: returned(t))
    with pytest.raises(jaxfn.AutogradFunctionError, match=rf"'f': jvp must return one tangent per output, .*{what}"):
        jax.jvp(f, (X.astype(jnp.float32),), (jnp.ones(3, jnp.float32),))
    g = jaxfn.autograd_function(
        lambda ctx, x: x * 2, lambda ctx, g: g * 2, name="g", vmap=lambda info, d, x: (returned(x), d[0])
    )
    with pytest.raises(jaxfn.AutogradFunctionError, match=rf"'g': vmap must return forward's outputs, .*{what}"):
        jax.vmap(g)(jnp.ones((2, 3), jnp.float32))


def test_an_extended_dtype_whose_tangent_is_itself_is_differentiated():
    """Which leaves are differentiated follows JAX's tangent types: Flax's fp8 fm32 scales (whose
    gradient fp8 training uses to pass amax values back) are; PRNG keys (tangent float0) are not."""
    fm32 = pytest.importorskip("flax.linen.fp8_ops", reason="Flax's fp8 ops give the fm32 dtype").fm32
    seen = {}

    def forward(ctx, x, scale, key):
        seen.update(scale=ctx.needs_input_grad.scale, key=ctx.needs_input_grad.key)
        return x * 2.0

    def backward(ctx, g):
        return {"x": g * 2.0, "scale": jnp.max(jnp.abs(g)).astype(jnp.float32).astype(fm32)}

    f = jaxfn.autograd_function(forward, backward, name="scaled")

    @jax.custom_vjp
    def reference(x, scale):
        return x * 2.0

    reference.defvjp(
        lambda x, s: (x * 2.0, None), lambda _, g: (g * 2.0, jnp.max(jnp.abs(g)).astype(jnp.float32).astype(fm32))
    )
    x, scale, key = jnp.array([1.0, -3.0, 2.0]), jnp.ones((), fm32), jax.random.key(0)
    loss = lambda x, s: (f(x, s, key) * W).sum()
    want = jax.grad(lambda x, s: (reference(x, s) * W).sum(), argnums=1, allow_int=True)(x, scale)
    for transform in (lambda g: g, jax.jit):
        got = transform(jax.grad(loss, argnums=1, allow_int=True))(x, scale)
        as_float = lambda a: float(lax.convert_element_type(a, jnp.float32))
        assert got.dtype == fm32 and as_float(got) == as_float(want) == 4.0  # max |grad_output| = max |W|
    assert seen == {"scale": True, "key": False}


def test_an_upgrade_flag_jax_lacks_is_off_where_not_yet_added_and_on_where_retired(monkeypatch):
    assert _jax_private.upgrade_flag("jax_no_such_upgrade") is False  # a JAX jaxfn knows: not yet added
    monkeypatch.setattr(_jax_private, "jax_version", lambda: (_jax_private.NEWEST_KNOWN_JAX[0], 99))
    assert _jax_private.upgrade_flag("jax_no_such_upgrade") is True  # a newer JAX: retired, the new path is on
    with jax.custom_vjp3(False) if hasattr(jax, "custom_vjp3") else contextlib.nullcontext():
        assert _jax_private.custom_vjp3() is bool(jax.config.jax_custom_vjp3)  # a flag JAX has is read as is


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_keyword_only_parameter_may_be_left_out_of_a_tuple_of_gradients(transform):
    """PyTorch's forward can't take keyword-only parameters, so a ported backward returns one
    gradient per positional parameter: the keyword-only ones are taken as None where they are
    not differentiated, and refused where they are (their gradient would be lost silently)."""

    def forward(ctx, x, *, scale):
        ctx.save_for_backward(scale=scale)
        return x * scale

    f = jaxfn.autograd_function(forward, lambda ctx, g: (g * ctx.saved_variables.scale,), name="scaled")
    _close(transform(jax.grad(lambda x: f(x, scale=3.0).sum()))(X), jnp.full(3, 3.0))
    _close(transform(jax.grad(lambda x, s: f(x, scale=s).sum()))(X, jnp.float32(3.0)), jnp.full(3, 3.0))
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'scaled': backward returned 1 gradient, leaving out the keyword-only parameter 'scale', but it is "
        r"being differentiated \(ctx.needs_input_grad.scale is True\)",
    ):
        transform(jax.grad(lambda x, s: f(x, scale=s).sum(), argnums=1))(X, jnp.float32(3.0))
    g = jaxfn.autograd_function(forward, lambda ctx, g: (), name="empty")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'empty': backward returned 0 gradients for 2 parameters"):
        jax.grad(lambda x: g(x, scale=3.0).sum())(X)


@pytest.mark.parametrize("builder", BUILDERS)
def test_saves_are_named_in_every_builder_and_a_checkpoint_policy_keeps_them_by_name(builder):
    """forward_mode's saves carried no names, so checkpoint policies skipped them silently."""
    from jaxfn import _saves

    if not _saves.available():
        pytest.skip("no save names on jax 0.10 with jax_remat3 on")
    f = _cube(builder)
    report = jaxfn.saved(lambda x: (f(x) * W).sum(), X)
    assert [(r.function, r.save) for r in report if r.function] == [("cube", "0")]
    policy = jax.checkpoint_policies.save_only_these_names("cube.0")
    loss = jax.checkpoint(lambda x: (f(x) * W).sum(), policy=policy)
    _close(jax.grad(loss)(X), W * 5.0 * X**3)


# -- batched calls with a vmap rule, and jvp rules reading saved outputs (found by probing) ---------


def _sin_saving_output(**options):
    """forward sin(x), saving its output for backward and for a jvp rule; both use the surrogate
    derivative 2x + out (not cos x), so that a result through forward's operations shows."""

    def forward(ctx, x):
        out = jnp.sin(x)
        ctx.save_for_backward(x, out)
        ctx.save_for_forward(x, out)
        return out

    def backward(ctx, g):
        x, out = ctx.saved_tensors
        return g * (2.0 * x + out)

    return jaxfn.autograd_function(forward, backward, name="s", **options)


@jax.custom_vjp
def _sin_reference(x):
    return jnp.sin(x)


_sin_reference.defvjp(lambda x: (_sin_reference(x), (x, _sin_reference(x))), lambda r, g: (g * (2.0 * r[0] + r[1]),))

_JVP = lambda ctx, t: t * (2.0 * ctx.saved_tensors[0] + ctx.saved_tensors[1])
_SIN_VMAP = lambda info, in_dims, x: (jnp.sin(x), in_dims[0])


@pytest.mark.parametrize(
    "options",
    [{"jvp": _JVP}, {"jvp": _JVP, "vmap": _SIN_VMAP}, {"forward_mode": True}],
    ids=["jvp rule", "jvp and vmap rules", "forward_mode"],
)
def test_a_jvp_rule_reading_a_saved_output_goes_through_the_rules_at_second_order(options):
    f, x = _sin_saving_output(**options), jnp.float32(0.7)
    want = jax.grad(jax.grad(_sin_reference))(x)
    _close(jax.grad(lambda x: jax.jvp(f, (x,), (jnp.float32(1.0),))[1])(x), want)
    _close(jax.jacfwd(jax.jacfwd(f))(x), want)
    _close(jax.hessian(f)(x), want)


def _with_unbatched_output(vmap=True):
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w, w**2

    def backward(ctx, ga, gc):  # gc * x: straight through to x
        x, w = ctx.saved_tensors
        return ga * w + gc * x, ga * x + gc * 2 * w

    rule = lambda info, in_dims, x, w: ((jnp.moveaxis(x, in_dims[0], 0) * w, w**2), (0, None))
    return jaxfn.autograd_function(forward, backward, name="f", **({"vmap": rule} if vmap else {}))


def test_a_vmap_rule_output_that_is_not_batched_shares_its_gradient_over_the_batch():
    xs, w = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), jnp.array([0.5, -1.0])
    loss = lambda f: lambda x: (lambda a, c: a.sum() + c.sum())(*jax.vmap(f, in_axes=(0, None))(x, w))
    per_example = jax.vmap(jax.grad(lambda xi: (lambda a, c: a.sum() + c.sum())(*_with_unbatched_output()(xi, w))))
    _close(jax.grad(loss(_with_unbatched_output()))(xs), per_example(xs))
    if not _jax_private.custom_vjp3():  # JAX's hijax custom_vjp counts such an output once per element (known limit)
        _close(jax.grad(loss(_with_unbatched_output(vmap=False)))(xs), per_example(xs))
    batched = lambda x, w: jax.vmap(_with_unbatched_output(), in_axes=(0, None), out_axes=(0, None))(x, w)
    grad_w = lambda x: jax.grad(lambda w: batched(x, w)[1].sum())(w)
    _close(grad_w(xs[:0]), 2.0 * w)  # an empty batch: the rule alone gives the unbatched output


def test_needs_input_grad_is_exact_for_a_batched_call_and_at_second_order_under_checkpoint():
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    def backward(ctx, g):
        x, w = ctx.saved_tensors
        assert not ctx.needs_input_grad.w, "w is not differentiated here"
        return g * w, None

    xs, w = jnp.ones((2, 3)), jnp.array([1.0, 2.0, 3.0])
    for options in ({"vmap": lambda info, d, x, w: (jnp.moveaxis(x, d[0], 0) * w, 0)}, {}):
        f = jaxfn.autograd_function(forward, backward, name="f", **options)
        _close(jax.grad(lambda x, f=f: jax.vmap(f, in_axes=(0, None))(x, w).sum())(xs), jnp.stack([w, w]))
    if _jax_private.remat3():  # JAX's remat3 hands a closed-over constant a tangent (known limit)
        return
    f = jaxfn.autograd_function(forward, backward, name="f", forward_mode=True)
    twice = jax.grad(lambda x: jax.grad(lambda x: jax.checkpoint(lambda x: f(x, w) * f(2 * x, w))(x).sum())(x).sum())
    _close(twice(xs[0]), 4.0 * w**2)


def test_the_value_of_a_batched_call_is_the_vmap_rules_under_every_transformation():
    f = jaxfn.autograd_function(
        lambda ctx, x: x**3, lambda ctx, g: g, name="f", vmap=lambda info, d, x: (x**3 + 100.0, d[0])
    )
    xs, want = jnp.array([1.0, 2.0]), jnp.array([101.0, 108.0])
    _close(jax.vmap(f)(xs), want)
    _close(jax.vjp(jax.vmap(f), xs)[0], want)
    _close(jax.value_and_grad(lambda x: jax.vmap(f)(x).sum())(xs)[0], want.sum())
    _close(jax.jit(jax.value_and_grad(lambda x: jax.vmap(f)(x).sum()))(xs)[0], want.sum())


def test_a_vmap_rule_jax_cant_differentiate_still_gives_gradients_through_backward():
    def host_sin(info, in_dims, x):  # a batched kernel on the host: JAX has no derivative for it
        shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.pure_callback(lambda v: np.sin(v).astype(v.dtype), shape, x, vmap_method="expand_dims"), in_dims[0]

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return jnp.sin(x)

    f = jaxfn.autograd_function(forward, lambda ctx, g: g * jnp.cos(ctx.saved_tensors[0]), name="f", vmap=host_sin)
    xs = jnp.array([1.0, 2.0])
    _close(jax.grad(lambda x: jax.vmap(f)(x).sum())(xs), jnp.cos(xs))


def test_linearize_of_linearize_in_forward_mode():
    for options in ({"forward_mode": True}, {"forward_mode": True, "vmap": lambda info, d, x: (x * 2.0, d[0])}):
        f = jaxfn.autograd_function(lambda ctx, x: x * 2.0, lambda ctx, g: g * 2.0, name="f", **options)
        outer = jax.linearize(lambda x, f=f: jax.linearize(f, x)[1](jnp.float32(1.0)), jnp.float32(3.0))
        _close(outer[0], 2.0)


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_forward_mode_refuses_a_cast_of_grad_output_inside_a_cond_branch(transform):
    def backward(ctx, g):
        return lax.cond(True, lambda g: (g * 1000).astype(jnp.int32).astype(g.dtype) / 1000, lambda g: g, g)

    f = jaxfn.autograd_function(lambda ctx, x: x * 1.0, backward, name="quant_in_cond", forward_mode=True)
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'quant_in_cond': .*casts a value computed from grad"):
        transform(lambda x, t: jax.jvp(f, (x,), (t,)))(X, jnp.ones(3))


def test_an_integer_output_a_vmap_rule_returns_unbatched_has_no_tangent():
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w, jnp.argmax(w)

    def backward(ctx, g, gi):
        x, w = ctx.saved_tensors
        return g * w, g * x

    rule = lambda info, d, x, w: ((jnp.moveaxis(x, d[0], 0) * w, jnp.argmax(w)), (0, None))
    f = jaxfn.autograd_function(forward, backward, name="f", vmap=rule, forward_mode=True)
    xb, w = jnp.arange(6.0).reshape(2, 3), jnp.array([0.5, 2.0, 1.0])
    (_, index), (_, tangent) = jax.jvp(lambda w: jax.vmap(f, in_axes=(0, None))(xb, w), (w,), (jnp.ones(3),))
    assert int(index[0]) == 1 and tangent.dtype == jax.dtypes.float0
    _close(jax.grad(lambda w: jax.vmap(f, in_axes=(0, None))(xb, w)[0].sum())(w), xb.sum(0))


def test_a_batched_aval_outside_shard_map_moves_no_mesh_axis_onto_the_batch_axis():
    """On an Explicit mesh an input sharded over 'd' on its first axis must not declare the new
    batch axis sharded (a vmap of a forward-mode rule then refused consistent inputs)."""
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("d",), axis_types=(AxisType.Explicit,))
    seen = []

    def inside(x):
        seen.append(_jax_private.batched_aval(jax.typeof(x), 5))
        return x

    with jax.set_mesh(mesh):
        jax.jit(inside)(jax.device_put(jnp.ones((2, 3)), P("d")))
    assert seen[0].shape == (5, 2, 3) and seen[0].sharding.spec[0] is None
