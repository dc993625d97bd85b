"""Forward's outputs, backward's return forms, and how gradients are checked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn

X = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
W = jnp.array([0.5, -1.0, 2.0])


def _mul_forward(ctx, x, w):
    ctx.save_for_backward(x=x, w=w)
    return x * w


def _mul(backward, name="mul"):
    return jaxfn.autograd_function(_mul_forward, backward, name=name)


def _plain_grads():
    return jax.grad(lambda x, w: (x * w).sum(), (0, 1))(X, W)


@pytest.mark.parametrize(
    "backward",
    [
        lambda ctx, g: {"x": g * ctx.saved_variables.w, "w": g * ctx.saved_variables.x},  # dict (R)
        lambda ctx, g: (g * ctx.saved_variables.w, g * ctx.saved_variables.x),  # tuple (PyTorch)
        lambda ctx, g: [g * ctx.saved_variables.w, g * ctx.saved_variables.x],  # list
    ],
    ids=["dict", "tuple", "list"],
)
def test_return_forms(maybe_jit, backward):
    # w's gradient has the (2, 3) shape of the product: it is summed down to w's (3,)
    got = maybe_jit(jax.grad(lambda x, w: _mul(backward)(x, w).sum(), (0, 1)))(X, W)
    for g, r in zip(got, _plain_grads()):
        np.testing.assert_allclose(g, r)


def test_missing_keys_and_none_mean_zero():
    got = jax.grad(lambda x, w: _mul(lambda ctx, g: {"x": g * ctx.saved_variables.w})(x, w).sum(), (0, 1))(X, W)
    np.testing.assert_allclose(got[0], _plain_grads()[0])
    np.testing.assert_allclose(got[1], jnp.zeros(3))
    got = jax.grad(lambda x, w: _mul(lambda ctx, g: (None, g * ctx.saved_variables.x))(x, w).sum(), (0, 1))(X, W)
    np.testing.assert_allclose(got[0], jnp.zeros((2, 3)))
    np.testing.assert_allclose(got[1], _plain_grads()[1])
    for nothing in ({}, (None, None), [None, None]):  # "no gradient", said (a bare None is refused)
        got = jax.grad(lambda x, nothing=nothing: _mul(lambda ctx, g: nothing)(x, W).sum())(X)
        np.testing.assert_allclose(got, jnp.zeros((2, 3)))


def _builders():
    """One function per builder, each with the backward given: default (custom_vjp), forward_mode=True,
    a jvp rule, a vmap rule, host code (NumPy)."""

    def forward(ctx, x, w):
        ctx.save_for_backward(x=x, w=w)
        return x * w

    def jvp(ctx, x_t, w_t):
        s = ctx.saved_variables
        return x_t * s.w + s.x * w_t

    def vmap(info, in_dims, x, w):
        return made["vmap"](jnp.moveaxis(x, in_dims[0], 0), w), 0

    def host_forward(ctx, x, w):
        assert isinstance(x, np.ndarray)
        return x * w

    def make(backward):
        made.update(
            default=jaxfn.autograd_function(forward, backward, name="nothing"),
            forward_mode=jaxfn.autograd_function(forward, backward, forward_mode=True, name="nothing"),
            jvp=jaxfn.autograd_function(forward, backward, jvp=jvp, name="nothing"),
            vmap=jaxfn.autograd_function(forward, backward, vmap=vmap, name="nothing"),
            host=jaxfn.autograd_function(host_forward, backward, host=True, name="nothing"),
        )
        return made

    made = {}
    return make


BUILDERS = ["default", "forward_mode", "jvp", "vmap", "host"]


@pytest.mark.parametrize("builder", BUILDERS)
def test_a_bare_none_from_backward_is_refused_in_every_builder(builder, maybe_jit):
    called = []

    def forgetful(ctx, g):  # the return is missing
        called.append(True)
        g * ctx.saved_variables.w if ctx.saved_variables else g

    f = _builders()(forgetful)[builder]
    compiled_host = builder == "host" and maybe_jit is jax.jit  # JAX reports the host's error at the call
    with pytest.raises(
        jax.errors.JaxRuntimeError if compiled_host else jaxfn.AutogradFunctionError,
        match=r"jaxfn: 'nothing': backward returned None \(what a backward without a return statement gives\), but a "
        r"gradient is asked for its inputs.*return the gradients: a tuple with one entry per parameter, a dict keyed "
        r"by parameter name.*\(return \{\} or \(None, None\) for no gradient\)",
    ) as info:
        maybe_jit(jax.grad(lambda x, w: f(x, w).sum(), (0, 1)))(X, W)
    assert (compiled_host or isinstance(info.value, TypeError)) and called
    if builder in ("forward_mode", "jvp", "vmap"):  # under vmap and reverse over forward too
        with pytest.raises(jaxfn.AutogradFunctionError, match=r"'nothing': backward returned None"):
            jax.vmap(jax.grad(lambda x, w: f(x, w).sum()), (0, None))(X, W)


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("nothing", [{}, (None, None), [None, None], {"x": None}], ids=["dict", "tuple", "list", "key"])
def test_no_gradient_said_with_a_dict_or_nones_gives_zeros_in_every_builder(builder, nothing, maybe_jit):
    called = []

    def backward(ctx, g):
        called.append(True)
        return nothing

    f = _builders()(backward)[builder]
    got = maybe_jit(jax.grad(lambda x, w: f(x, w).sum(), (0, 1)))(X, W)
    reference = jax.grad(lambda x, w: jax.lax.stop_gradient(x * w).sum(), (0, 1))(X, W)  # no gradient flows
    for g, r in zip(got, reference):
        np.testing.assert_array_equal(g, r)
    assert called


def test_from_torch_keeps_pytorchs_own_rule_for_a_none_gradient():
    torch = pytest.importorskip("torch")

    class Ignore(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad_output):
            return None  # PyTorch: no gradient for the one input

    f = jaxfn.from_torch(Ignore)
    np.testing.assert_array_equal(jax.grad(lambda x: f(x).sum())(W), np.zeros(3))


def test_bare_array_for_one_parameter():
    f = jaxfn.autograd_function(lambda ctx, x: x * 3, lambda ctx, g: g * 3)
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(W), [3.0, 3.0, 3.0])


def test_backward_actually_runs_straight_through_estimator(maybe_jit):
    """A straight-through estimator: autodiff would give zero, backward gives the identity."""
    called = []

    def backward(ctx, g):
        called.append(True)
        return g

    sign = jaxfn.autograd_function(lambda ctx, x: jnp.sign(x), backward, name="sign_ste")
    x = jnp.array([-1.5, 0.3, 2.0])
    np.testing.assert_allclose(maybe_jit(jax.grad(lambda x: (sign(x) * x).sum()))(x), x + jnp.sign(x))
    assert called
    np.testing.assert_allclose(jax.grad(lambda x: (jnp.sign(x) * x).sum())(x), jnp.sign(x))  # autodiff differs


def test_gradient_dtype_cast_to_input():
    f = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: (g * 2).astype(jnp.float64), name="f")
    x32 = jnp.ones(3, jnp.float32)
    g = jax.grad(lambda x: f(x).sum())(x32)
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, 2.0)


def test_complex_follows_jax_convention():
    # f(z) = z^2: backward returns grad_output * f'(z), without conjugation
    f = jaxfn.autograd_function(
        lambda ctx, z: (ctx.save_for_backward(z), z**2)[1], lambda ctx, g: g * 2 * ctx.saved_tensors[0]
    )
    z = jnp.array([1.0 + 2.0j, -0.5 + 0.1j])
    loss = lambda f: lambda z: jnp.abs(f(z)).sum()  # noqa: E731
    np.testing.assert_allclose(jax.grad(loss(f))(z), jax.grad(loss(lambda z: z**2))(z), rtol=1e-12)


def test_output_forms():
    def forward(ctx, x):
        return {"double": x * 2, "pair": (x + 1, 3.0)}  # a pytree; a Python number stays a Python number

    seen = []

    def backward(ctx, g):
        seen.append(jax.tree_util.tree_structure(g, is_leaf=lambda v: v is None))
        assert g["pair"][1] is None  # a Python value gets no cotangent
        return g["double"] * 2 + g["pair"][0]

    f = jaxfn.autograd_function(forward, backward)
    out = f(jnp.ones(2))
    assert type(out["pair"][1]) is float and out["pair"][1] == 3.0
    inside_jit = []
    jax.jit(lambda x: inside_jit.append(type(f(x)["pair"][1])) or x)(jnp.ones(2))
    assert inside_jit == [float]  # also under jit
    got = jax.grad(lambda x: f(x)["double"].sum() + f(x)["pair"][0].sum())(jnp.ones(2))
    np.testing.assert_allclose(got, [3.0, 3.0])
    expected = jax.tree_util.tree_structure({"double": 0, "pair": (0, None)}, is_leaf=lambda v: v is None)
    assert seen and seen[0] == expected


def test_one_grad_output_per_tuple_element():
    def forward(ctx, x):
        return x * 2, (x * 3, x * 4)

    def backward(ctx, g_first, g_rest):
        return g_first * 2 + g_rest[0] * 3 + g_rest[1] * 4

    f = jaxfn.autograd_function(forward, backward)
    got = jax.grad(lambda x: sum(jnp.sum(o) for o in jax.tree_util.tree_leaves(f(x))))(jnp.ones(2))
    np.testing.assert_allclose(got, [9.0, 9.0])


def test_gradient_for_pytree_parameter_with_none_subtree():
    def forward(ctx, params, x):
        ctx.save_for_backward(params=params, x=x)
        return params["a"] * x + params["b"]["c"]

    def backward(ctx, g):
        s = ctx.saved_variables
        return {"params": {"a": g * s.x, "b": None}}

    f = jaxfn.autograd_function(forward, backward)
    params = {"a": jnp.array(2.0), "b": {"c": jnp.array(1.0)}}
    got = jax.grad(lambda p: f(p, jnp.array([1.0, 3.0])).sum())(params)
    np.testing.assert_allclose(got["a"], 4.0)
    np.testing.assert_allclose(got["b"]["c"], 0.0)


def test_output_differentiable_flags_each_array_leaf_and_gives_none_for_python_values():
    """What the docstring says: a bool per array output (False where marked non-differentiable or
    an integer), None for a Python value in the output (it gave the Python value itself)."""

    def forward(ctx, x):
        ctx.mark_non_differentiable(y := x * 3)
        return x * 2, y, 3, "a", jnp.arange(2)

    f = jaxfn.autograd_function(forward, lambda ctx, *gs: gs[0] * 2, name="f")
    assert f.output_differentiable(jnp.ones(2)) == (True, False, None, None, False)
