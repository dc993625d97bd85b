"""The context: saving, attributes, needs_input_grad, marks, and per-trace isolation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn


def test_saved_variables_is_a_read_only_mapping_with_attribute_access():
    seen = {}

    def forward(ctx, x, y):
        ctx.save_for_backward(x=x, y=y, n=3, nothing=None)
        return x * y

    def backward(ctx, grad_output):
        s = ctx.saved_variables
        seen.update(
            keys=list(s.keys()),
            length=len(s),
            has_x="x" in s,
            has_z="z" in s,
            iterated=list(s),
            n=s.n,
            n_by_key=s["n"],
            nothing=s.nothing,
            hasattr_z=hasattr(s, "z"),
        )
        with pytest.raises(TypeError, match="read-only"):
            s.x = 1
        return grad_output * s["y"], grad_output * s.x

    f = jaxfn.autograd_function(forward, backward, name="mul")
    x, y = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
    gx, gy = jax.grad(lambda x, y: f(x, y).sum(), (0, 1))(x, y)
    np.testing.assert_allclose(gx, y)
    np.testing.assert_allclose(gy, x)
    assert seen == dict(
        keys=["x", "y", "n", "nothing"],
        length=4,
        has_x=True,
        has_z=False,
        iterated=["x", "y", "n", "nothing"],
        n=3,
        n_by_key=3,
        nothing=None,
        hasattr_z=False,
    )


def test_saved_tensors_pytorch_style(maybe_jit):
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    def backward(ctx, grad_output):
        x, y = ctx.saved_tensors
        return grad_output * y, grad_output * x

    f = jaxfn.autograd_function(forward, backward)
    x, y = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
    gx, gy = maybe_jit(jax.grad(lambda x, y: f(x, y).sum(), (0, 1)))(x, y)
    np.testing.assert_allclose(gx, y)
    np.testing.assert_allclose(gy, x)


def test_attributes_on_ctx_reach_backward(maybe_jit):
    def forward(ctx, x, power):
        ctx.power = power
        ctx.x = x
        ctx.label = {"name": "cube", "arr": np.arange(3)}
        return x**power

    def backward(ctx, grad_output):
        assert isinstance(ctx.power, int) and ctx.label["name"] == "cube"
        assert isinstance(ctx.label["arr"], np.ndarray)
        return grad_output * ctx.power * ctx.x ** (ctx.power - 1), None

    f = jaxfn.autograd_function(forward, backward, name="power")
    x = jnp.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(maybe_jit(jax.grad(lambda x: f(x, 3).sum()))(x), 3 * x**2)


@pytest.mark.parametrize("own", ["save_for_backward", "saved_variables", "needs_input_grad", "saved_tensors"])
def test_own_names_cannot_be_overwritten(own):
    def forward(ctx, x):
        setattr(ctx, own, 1)
        return x

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, name="f")
    with pytest.raises(jaxfn.AutogradFunctionError, match=f"'f': ctx.{own} belongs to the context"):
        f(jnp.ones(2))
    with pytest.raises(TypeError):
        f(jnp.ones(2))


def test_unknown_names_list_the_names_that_exist():
    def forward(ctx, input, weight):
        ctx.save_for_backward(input=input, weight=weight)
        ctx.scale = 2
        return input * weight

    def backward_saved(ctx, g):
        return {"input": ctx.saved_variables.inptu}

    def backward_key(ctx, g):
        return {"input": ctx.saved_variables["inptu"]}

    def backward_needs(ctx, g):
        return {"weight": g if ctx.needs_input_grad.wieght else None}

    def backward_needs_key(ctx, g):
        return {"weight": g if ctx.needs_input_grad["wieght"] else None}

    def backward_attr(ctx, g):
        return {"input": g * ctx.scael}

    x = jnp.ones(2)
    cases = [
        (
            backward_saved,
            AttributeError,
            r"ctx.saved_variables has no 'inptu'; the names it has are: 'input', 'weight'",
        ),
        (backward_key, KeyError, r"ctx.saved_variables has no 'inptu'; the names it has are: 'input', 'weight'"),
        (
            backward_needs,
            AttributeError,
            r"ctx.needs_input_grad has no 'wieght'; the names it has are: 'input', 'weight'",
        ),
        (backward_needs_key, KeyError, r"ctx.needs_input_grad has no 'wieght'"),
        (backward_attr, AttributeError, r"ctx has no 'scael'; the names it has are: 'scale'"),
    ]
    for backward, kind, match in cases:
        f = jaxfn.autograd_function(forward, backward, name="mul")
        with pytest.raises(kind, match=match) as info:
            jax.grad(lambda x, f=f: f(x, x).sum())(x)
        assert isinstance(info.value, jaxfn.AutogradFunctionError)
        assert "'mul'" in str(info.value)


def test_needs_input_grad_by_index_and_name_in_forward_too():
    seen = []

    def forward(ctx, a, b):
        seen.append(("forward", ctx.needs_input_grad[0], ctx.needs_input_grad[1], "a" in ctx.needs_input_grad))
        return a * b

    def backward(ctx, g):
        a_flag, b_flag = ctx.needs_input_grad
        seen.append(("backward", a_flag, b_flag, len(ctx.needs_input_grad)))
        return (g if a_flag else None), g

    f = jaxfn.autograd_function(forward, backward)
    jax.grad(lambda b: f(1.0, b))(2.0)  # a is a static Python float
    # JAX may also trace the primal alone (jax_custom_vjp3 does), with no flag set
    assert ("forward", False, True, True) in seen
    assert seen[-1] == ("backward", False, True, 2)


def test_mark_non_differentiable(maybe_jit):
    seen = []

    def forward(ctx, x):
        values = jnp.sort(x)
        order = jnp.argsort(x).astype(x.dtype)  # a float output marked non-differentiable
        ctx.mark_non_differentiable(order)
        ctx.save_for_backward(order=order)
        return values, order

    def backward(ctx, grad_values, grad_order):
        seen.append(grad_order)
        idx = ctx.saved_variables.order.astype(jnp.int32)
        return jnp.zeros_like(grad_values).at[idx].set(grad_values)

    sort = jaxfn.autograd_function(forward, backward, name="sort")
    x = jnp.array([3.0, 1.0, 2.0])
    # the loss uses the marked output: nothing flows back through it
    got = maybe_jit(jax.grad(lambda x: (sort(x)[0] * jnp.arange(3.0)).sum() + (sort(x)[1] ** 2).sum()))(x)
    want = jax.grad(lambda x: (jnp.sort(x) * jnp.arange(3.0)).sum())(x)
    np.testing.assert_allclose(got, want)
    assert all(np.all(np.asarray(g) == 0) and g.shape == (3,) for g in seen if not isinstance(g, jax.core.Tracer))


def test_integer_outputs_are_non_differentiable_and_get_usable_zeros():
    seen = []

    def forward(ctx, x):
        return x * 2, jnp.argmax(x)

    def backward(ctx, grad_x, grad_index):
        seen.append((grad_index.shape, grad_index.dtype))
        return grad_x * 2 + grad_index  # usable in arithmetic

    f = jaxfn.autograd_function(forward, backward)
    g = jax.grad(lambda x: f(x)[0].sum())(jnp.array([1.0, 5.0]))
    np.testing.assert_allclose(g, [2.0, 2.0])
    assert seen == [((), jnp.argmax(jnp.ones(2)).dtype)]


@pytest.mark.parametrize("materialize", [True, False])
def test_set_materialize_grads(materialize):
    seen = []

    def forward(ctx, x):
        ctx.set_materialize_grads(materialize)
        return x * 2, x * 3

    def backward(ctx, g2, g3):
        seen.append((g2 is None, g3 is None))
        total = 0.0
        if g2 is not None:
            total = total + g2 * 2
        if g3 is not None:
            total = total + g3 * 3
        return total

    f = jaxfn.autograd_function(forward, backward)
    g = jax.grad(lambda x: f(x)[0].sum())(jnp.ones(2))  # the second output is unused
    np.testing.assert_allclose(g, [2.0, 2.0])
    assert seen == [(False, not materialize)]


def test_mark_dirty_accepts_inputs_and_rejects_others():
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x + 1  # "in place": the updated array is returned

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, name="add_")
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(jnp.ones(2)), [1.0, 1.0])

    def bad(ctx, x):
        ctx.mark_dirty(x * 2)
        return x

    g = jaxfn.autograd_function(bad, lambda ctx, grad: grad, name="bad_")
    with pytest.raises(TypeError, match=r"'bad_': ctx.mark_dirty\(\) takes this call's array inputs"):
        g(jnp.ones(2))


def test_forward_only_methods_refused_in_backward():
    def backward(ctx, g):
        ctx.save_for_backward(g)
        return g

    f = jaxfn.autograd_function(lambda ctx, x: x * 1, backward, name="f")
    with pytest.raises(TypeError, match=r"'f': ctx.save_for_backward\(\) can only be called in forward"):
        jax.grad(lambda x: f(x).sum())(jnp.ones(2))


def test_each_backward_sees_its_own_forward_trace():
    """One jitted function, pulled back w.r.t. different arguments, first pullback called last."""

    def forward(ctx, x, y):
        ctx.which = "x" if ctx.needs_input_grad.x else "y"  # static: differs between traces
        ctx.save_for_backward(x=x, y=y)
        return x * y

    def backward(ctx, g):
        s = ctx.saved_variables
        return {"x": g * s.y} if ctx.which == "x" else {"y": g * s.x}

    f = jax.jit(jaxfn.autograd_function(forward, backward, name="mul"))
    x, y = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
    _, pullback_x = jax.vjp(lambda x: f(x, y), x)
    _, pullback_y = jax.vjp(lambda y: f(x, y), y)
    np.testing.assert_allclose(pullback_y(jnp.ones(2))[0], x)
    np.testing.assert_allclose(pullback_x(jnp.ones(2))[0], y)


def test_needs_input_grad_out_of_range_is_an_index_error_naming_the_parameters():
    def backward(ctx, g):
        assert list(ctx.needs_input_grad) == [True, False] and ctx.needs_input_grad[-1] is False
        return g * ctx.needs_input_grad[2]

    f = jaxfn.autograd_function(lambda ctx, x, y: x * y, backward, name="mul")
    with pytest.raises(
        IndexError,
        match=r"'mul': ctx.needs_input_grad\[2\] is out of range: it has 2 entries, one per argument of forward "
        r"after ctx, so positions are 0 to 1 \(the parameters are 'x', 'y'.*ctx.needs_input_grad.<name>",
    ) as info:
        jax.grad(lambda x: f(x, jnp.ones(2)).sum())(jnp.ones(2))
    assert isinstance(info.value, jaxfn.AutogradFunctionError)


def test_saved_variables_after_positional_saves_unpacks_as_pytorch_does():
    seen = {}

    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)  # PyTorch style: by position
        return a * b

    def backward(ctx, g):
        s = ctx.saved_variables
        a, b = s  # PyTorch's old name of saved_tensors
        seen.update(length=len(s), keys=list(s.keys()), as_dict=dict(s))
        with pytest.raises(IndexError, match=r"ctx.saved_variables\[2\] is out of range: it has 2 entries"):
            s[2]
        return g * b, g * a

    f = jaxfn.autograd_function(forward, backward, name="mul")
    x, y = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
    gx, gy = jax.jit(jax.grad(lambda x, y: f(x, y).sum(), (0, 1)))(x, y)
    np.testing.assert_allclose(gx, y)
    np.testing.assert_allclose(gy, x)
    assert seen == dict(length=2, keys=[], as_dict={})  # by-name saves iterate names (see the test above)


def test_saved_tensors_is_a_tuple_to_jax_copy_and_pickle():
    import copy
    import pickle

    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    def backward(ctx, g):
        x, y = jax.tree_util.tree_map(lambda v: v * 1.0, ctx.saved_tensors)  # a container of two leaves
        both = jax.jit(lambda saved: saved[0] + saved[1])(ctx.saved_tensors)  # a jit argument
        assert copy.copy(ctx.saved_tensors) == tuple(ctx.saved_tensors)
        assert isinstance(ctx.saved_tensors, tuple)
        return g * y + 0.0 * both, g * x

    f = jaxfn.autograd_function(forward, backward, name="mul")
    got = jax.grad(lambda x, y: f(x, y).sum(), (0, 1))(jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]))
    np.testing.assert_allclose(got[0], [3.0, 4.0])
    np.testing.assert_allclose(got[1], [1.0, 2.0])
    assert pickle.loads(pickle.dumps(jaxfn._context.SavedTensors("f", (1, 2)))) == (1, 2)


def test_a_static_forward_taking_self_as_its_context_works_as_in_old_pytorch_code():
    class Exp(jaxfn.Function):
        @staticmethod
        def forward(self, x):
            out = jnp.exp(x)
            self.save_for_backward(out)
            return out

        @staticmethod
        def backward(self, g):
            (out,) = self.saved_tensors
            return g * out

    x = jnp.array([0.5, 1.0])
    np.testing.assert_allclose(jax.grad(lambda x: Exp.apply(x).sum())(x), jnp.exp(x), rtol=1e-6)


def test_saved_variables_and_needs_input_grad_copy_and_pickle_as_themselves():
    """A backward may copy the views (copy.copy, copy.deepcopy, pickle): each gives the same view
    (they recursed without end before)."""
    import copy
    import pickle

    def forward(ctx, x, y):
        ctx.save_for_backward(x=x)
        return x * y

    def backward(ctx, grad):
        saved, needs = copy.copy(ctx.saved_variables), copy.deepcopy(ctx.needs_input_grad)
        assert list(pickle.loads(pickle.dumps(needs))) == list(needs) == [True, False]
        return {"x": grad * 2 * saved.x}

    f = jaxfn.autograd_function(forward, backward, name="f")
    assert float(jax.grad(lambda x: f(x, 3.0))(2.0)) == 4.0


def test_saves_and_parameters_named_with_an_underscore_read_as_the_users():
    """ctx.saved_variables.<name> and ctx.needs_input_grad.<name> give the user's value for any
    name, also one like a private attribute (``_names``, ``_what``: the views' own read those)."""

    def forward(ctx, _what, _per):
        ctx.save_for_backward(_hint=_what, _names=_per, _function=_what)
        return _what * _per

    def backward(ctx, g):
        s, n = ctx.saved_variables, ctx.needs_input_grad
        assert n._what is True and n._per is False
        assert all(isinstance(v, jax.Array) for v in (s._hint, s._names, s._function))
        return {"_what": g * s._names}

    f = jaxfn.autograd_function(forward, backward, name="f")
    assert float(jax.grad(f)(jnp.array(2.0), jnp.array(3.0))) == 3.0


def test_needs_input_grad_with_setup_context_refuses_a_name_that_is_no_parameter():
    """PyTorch 2's form: forward is wrapped to take ctx, and the wrapper's own free names (forward,
    setup_context) are no parameters: ctx.needs_input_grad.forward is refused, as in the plain form,
    while a value the user's backward closes over answers False."""
    scale = jnp.float32(3.0)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward_forward_name(ctx, g):
        return g * ctx.needs_input_grad.forward

    def backward_closed(ctx, g):
        assert ctx.needs_input_grad.scale is False
        return g * scale

    def forward(x):
        return x * scale

    x = jnp.ones(2)
    f = jaxfn.autograd_function(forward, backward_forward_name, setup_context=setup_context, name="mul")
    unknown = r"'mul': .*ctx.needs_input_grad has no 'forward'; the names it has are: 'scale', 'x'"
    with pytest.raises(AttributeError, match=unknown):
        jax.grad(lambda x: f(x).sum())(x)
    g = jaxfn.autograd_function(forward, backward_closed, setup_context=setup_context, name="mul")
    assert jnp.allclose(jax.grad(lambda x: g(x).sum())(x), 3.0 * jnp.ones(2))
