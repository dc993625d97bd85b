"""Faults found in review: zero-size gradcheck inputs, arrays hidden in objects saved on ctx,
pytree nodes that refuse None, and writes into forward's container arguments."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn

# -- 1. gradcheck on zero-size inputs ------------------------------------------------------


def _mul():
    def forward(ctx, x, y):
        ctx.save_for_backward(x=x, y=y)
        return x * y

    def backward(ctx, g):
        s = ctx.saved_variables
        return {"x": g * s.y, "y": g * s.x}

    return jaxfn.autograd_function(forward, backward, name="mul")


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_gradcheck_with_only_zero_size_leaves_has_nothing_to_check(shape):
    with pytest.raises(
        jaxfn.GradcheckError, match="every floating-point or complex leaf of the arguments has zero size"
    ):
        jaxfn.gradcheck(_mul(), jnp.ones(shape), jnp.ones(shape))
    assert not jaxfn.gradcheck(_mul(), jnp.ones(shape), jnp.ones(shape), raise_exception=False)


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_gradcheck_skips_zero_size_leaves_beside_non_empty_ones(shape):
    called = []

    def forward(ctx, x, empty):
        return x * 2 + empty.sum()

    def backward(ctx, g):
        called.append(True)
        return {"x": 2 * g, "empty": jnp.zeros(shape)}

    f = jaxfn.autograd_function(forward, backward, name="add_empty")
    assert jaxfn.gradcheck(f, jnp.ones(3), jnp.ones(shape))
    assert called
    wrong = jaxfn.autograd_function(forward, lambda ctx, g: {"x": 3 * g}, name="wrong")
    with pytest.raises(jaxfn.GradcheckError, match="the gradient for 'x' disagrees"):
        jaxfn.gradcheck(wrong, jnp.ones(3), jnp.ones(shape))


def test_gradcheck_with_only_zero_size_outputs_has_nothing_to_check():
    f = jaxfn.autograd_function(lambda ctx, x: x[:0], lambda ctx, g: jnp.zeros(3).at[:0].set(g), name="empty_out")
    with pytest.raises(jaxfn.GradcheckError, match="differentiable with at least one element"):
        jaxfn.gradcheck(f, jnp.ones(3))


# -- 2. arrays hidden in objects saved on ctx ----------------------------------------------


@dataclasses.dataclass(slots=True)
class Slotted:
    w: object


class Plain:
    def __init__(self, inner):
        self.inner = inner


class PrivateSlots:
    __slots__ = ("__hidden",)

    def __init__(self, value):
        self.__hidden = value


def _deep(x):
    value = x
    for _ in range(50):
        value = Plain({"k": [Slotted((value,))]})
    return value


def _cycle(x):
    outer = Plain(None)
    outer.inner = [outer, Slotted(outer), x]
    return outer


HIDERS = {
    "slots": Slotted,
    "private slots": PrivateSlots,
    "deep": _deep,
    "cycle": _cycle,
    "closure": lambda x: lambda: x * 2,
    "object array": lambda x: np.array([None, Plain(x)], dtype=object)[1:],
}


@pytest.mark.parametrize("how", ["save_for_backward", "attribute"])
@pytest.mark.parametrize("hider", list(HIDERS))
def test_arrays_hidden_in_objects_on_ctx_are_refused(how, hider):
    def forward(ctx, x):
        obj = HIDERS[hider](x)
        if how == "attribute":
            ctx.obj = obj
        else:
            ctx.save_for_backward(obj)
        return x * 2

    f = jaxfn.autograd_function(forward, lambda ctx, g: 2 * g, name="hides")
    where = "ctx.obj" if how == "attribute" else r"ctx.saved_tensors\[0\]"
    with pytest.raises(
        jaxfn.AutogradFunctionError, match=f"'hides': {where} is an? .* that holds arrays JAX is tracing"
    ):
        jax.jit(jax.grad(lambda x: f(x).sum()))(jnp.ones(3))


def test_objects_without_arrays_on_ctx_still_work():
    def forward(ctx, x):
        ctx.obj = _cycle(3.0)
        ctx.config = Slotted({"scale": 2.0})
        return x * ctx.config.w["scale"]

    f = jaxfn.autograd_function(forward, lambda ctx, g: g * ctx.config.w["scale"], name="plain_objects")
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: f(x).sum()))(jnp.ones(3)), 2 * np.ones(3))


# -- 3. pytree nodes that refuse None ------------------------------------------------------


@jax.tree_util.register_pytree_node_class
class Strict:
    """A node whose unflatten accepts arrays only, as some libraries' nodes do."""

    def __init__(self, w, b):
        self.w, self.b = w, b

    def tree_flatten(self):
        return (self.w, self.b), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        assert all(isinstance(c, jnp.ndarray) for c in children)
        return cls(*children)


@jax.tree_util.register_pytree_node_class
class Converting(Strict):
    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*(jnp.asarray(c) for c in children))


def _affine(backward=None):
    def forward(ctx, p, x):
        ctx.save_for_backward(p=p, x=x)
        return p.w * x + p.b

    def default_backward(ctx, g):
        s = ctx.saved_variables
        return {"p": type(s.p)(g * s.x, g), "x": g * s.p.w}

    return jaxfn.autograd_function(forward, backward or default_backward, name="affine")


@pytest.mark.parametrize("node", [Strict, Converting])
@pytest.mark.parametrize("transform", ["grad", "jit_grad"])
def test_a_node_that_refuses_none_as_an_argument(node, transform):
    p, x = node(jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, 0.0, -1.0])), jnp.array([2.0, 3.0, 4.0])
    plain = lambda p, x: (p.w * x + p.b).sum()  # noqa: E731
    wrap = jax.jit if transform == "jit_grad" else (lambda f: f)
    got = wrap(jax.grad(lambda p, x: _affine()(p, x).sum(), argnums=(0, 1)))(p, x)
    want = jax.grad(plain, argnums=(0, 1))(p, x)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b)
    got_x = wrap(jax.grad(lambda x: _affine()(p, x).sum()))(x)  # p held constant: its gradient is dropped
    np.testing.assert_allclose(got_x, jax.grad(plain, argnums=1)(p, x))
    assert jaxfn.gradcheck(_affine(), p, x)


@pytest.mark.parametrize("transform", ["grad", "jit_grad"])
def test_a_none_subtree_in_the_gradient_of_such_a_node(transform):
    def backward(ctx, g):
        s = ctx.saved_variables
        return {"p": Strict(None, g), "x": g * s.p.w}  # no gradient for p.w

    p, x = Strict(jnp.ones(3), jnp.zeros(3)), jnp.full(3, 2.0)
    wrap = jax.jit if transform == "jit_grad" else (lambda f: f)
    got = wrap(jax.grad(lambda p: _affine(backward)(p, x).sum()))(p)
    np.testing.assert_allclose(got.w, np.zeros(3))
    np.testing.assert_allclose(got.b, np.ones(3))


WRONG_NODE_GRADIENTS = {
    "tuple": (lambda g: (g, g), r"gradient for 'p' with pytree structure PyTreeDef\(\(\*, \*\)\), but 'p' has"),
    "array": (lambda g: g, "for 'p', but that part of 'p' is a Strict, a pytree with 2 leaves"),
    "shape": (lambda g: Strict(g[:2], None), r"gradient for 'p\[<flat index 0>\]' with shape \(2,\)"),
}


@pytest.mark.parametrize("wrong", list(WRONG_NODE_GRADIENTS))
@pytest.mark.parametrize("transform", ["grad", "jit_grad"])
def test_wrong_gradients_for_such_a_node_name_the_parameter(wrong, transform):
    p, x = Strict(jnp.ones(3), jnp.zeros(3)), jnp.full(3, 2.0)
    gradient, message = WRONG_NODE_GRADIENTS[wrong]
    f = _affine(lambda ctx, g: {"p": gradient(g)})
    wrap = jax.jit if transform == "jit_grad" else (lambda f: f)
    with pytest.raises(jaxfn.AutogradFunctionError, match=message):
        wrap(jax.grad(lambda p: f(p, x).sum()))(p)


def test_grad_outputs_such_a_node_refuses_are_an_error():
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return Strict(x * 2, x * 3)

    f = jaxfn.autograd_function(forward, lambda ctx, g: 2 * g.w, name="node_out")
    with pytest.raises(
        jaxfn.AutogradFunctionError, match="'node_out': backward receives its grad_outputs .* refused None"
    ):
        jax.grad(lambda x: f(x).w.sum())(jnp.ones(3))
    materialized = jaxfn.autograd_function(lambda ctx, x: Strict(x * 2, x * 3), lambda ctx, g: 2 * g.w + 3 * g.b)
    np.testing.assert_allclose(jax.grad(lambda x: materialized(x).w.sum())(jnp.ones(3)), 2 * np.ones(3))


# -- 4. writes into forward's container arguments ------------------------------------------


def _adds_key(ctx, d):
    d["extra"] = d["x"] * 2
    return d["x"] * 3


def _appends(ctx, items):
    items.append(1.0)
    return items[0] * 3


def _replaces(ctx, d):
    d["x"] = d["x"] * 2
    return d["x"]


WRITERS = {
    "adds a key": (_adds_key, lambda x: {"x": x}, r"'d' \(a dict\) gained or lost an entry"),
    "appends": (_appends, lambda x: [x], r"'items' \(a list\) gained or lost an entry"),
    "replaces": (_replaces, lambda x: {"x": x}, r"the value at 'd\['x'\]' was replaced"),
}


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("transform", ["eager", "jit", "grad", "jit_grad"])
def test_writes_into_container_arguments_are_refused(writer, transform):
    forward, make, where = WRITERS[writer]
    f = jaxfn.autograd_function(forward, lambda ctx, g: None, name="writes")
    call = {
        "eager": lambda x: f(make(x)),
        "jit": jax.jit(lambda x: f(make(x))),
        "grad": jax.grad(lambda x: f(make(x)).sum()),
        "jit_grad": jax.jit(jax.grad(lambda x: f(make(x)).sum())),
    }[transform]
    message = (
        f"'writes': forward must leave its arguments as it received them, but {where} while forward ran: jaxfn "
        r"hands forward copies of its pytree arguments .* return the new value as an output of forward instead"
    )
    with pytest.raises(jaxfn.AutogradFunctionError, match=message):
        call(jnp.ones(3))


def test_a_failed_write_leaves_the_function_working():
    calls = []

    def forward(ctx, d):
        if not calls:
            d["extra"] = 1.0
        calls.append(True)
        return d["x"] * 3

    f = jaxfn.autograd_function(forward, lambda ctx, g: {"d": {"x": 3 * g}}, name="once")
    d = {"x": jnp.ones(3)}
    with pytest.raises(jaxfn.AutogradFunctionError, match="gained or lost an entry"):
        f(d)
    assert set(d) == {"x"}
    np.testing.assert_allclose(jax.grad(lambda x: f({"x": x}).sum())(jnp.ones(3)), 3 * np.ones(3))


def test_reading_container_arguments_is_fine(maybe_jit):
    def forward(ctx, params, x, scale=None):
        ctx.save_for_backward(w=params["w"], x=x)
        return params["w"] * x

    def backward(ctx, g):
        s = ctx.saved_variables
        return {"params": {"w": g * s.x}, "x": g * s.w}

    f = jaxfn.autograd_function(forward, backward, name="reads")
    got = maybe_jit(jax.grad(lambda w, x: f({"w": w}, x).sum(), argnums=(0, 1)))(jnp.ones(3), jnp.full(3, 2.0))
    want = jax.grad(lambda w, x: (w * x).sum(), argnums=(0, 1))(jnp.ones(3), jnp.full(3, 2.0))
    np.testing.assert_allclose(got, want)


def test_a_node_whose_unflatten_converts_a_python_value_is_not_a_write(maybe_jit):
    f = _affine(lambda ctx, g: {"x": g * ctx.saved_variables.p.w})
    p = Converting(jnp.array([1.0, 2.0]), 0.5)  # b: a Python float, which unflatten makes an array
    got = maybe_jit(jax.grad(lambda x: f(p, x).sum()))(jnp.ones(2))
    np.testing.assert_allclose(got, [1.0, 2.0])
