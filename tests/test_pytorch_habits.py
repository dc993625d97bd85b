"""PyTorch habits in ported code, each met by a message naming the function, the argument or method,
and the fix: tensor methods on JAX and NumPy arrays (their spelling from one table), PyTorch's
keywords, a Python flag that jax.jit traced (named, with static_argnames), a boolean-mask
compaction under jit (a fixed size), and values given to mark_non_differentiable that forward
does not return (named)."""

import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn
from jaxfn import _pytorch_names

X = jnp.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]])


# With jax_custom_vjp3 on, JAX traces forward as a jit of its own, so which transformation traced a
# flag is not known there: the message gives every fix and claims none (never a wrong one).
KNOWN = os.environ.get("JAX_CUSTOM_VJP3", "").lower() not in ("1", "true")


def _none_claimed(name):
    return (
        rf"its argument '{name}', but '{name}' is traced .*jnp\.where.*static where jax\.jit is applied.*"
        r"unbatched where jax\.vmap is"
    )


def _raises(kind, match, call):
    with pytest.raises(kind, match=match) as info:
        call()
    assert isinstance(info.value, jaxfn.AutogradFunctionError)
    return info.value


def _grad(f, *args):
    return jax.grad(lambda x: f(x, *args).sum())


# -- PyTorch's tensor methods on JAX arrays ----------------------------------------------------------

# (the PyTorch expression on x, the method named, the JAX spelling the message gives)
METHODS = {
    "data": (lambda x: x.data * 2, "data", r"x itself"),
    "cpu": (lambda x: x.cpu(), "cpu", r"x itself"),
    "detach": (lambda x: x.detach(), "detach", r"jax\.lax\.stop_gradient\(x\)"),
    "le": (lambda x: x * x.le(0), "le", r"x <= y"),
    "t": (lambda x: x.t(), "t", r"x\.T"),
    "sum_to_size": (lambda x: x.sum_to_size(3), "sum_to_size", r"keepdims=True.*jaxfn sums it down"),
    "masked_select": (lambda x: x.masked_select(x > 0), "masked_select", r"jnp\.nonzero\(mask, size=n"),
    "dim": (lambda x: x * x.dim(), "dim", r"x\.ndim"),
    "numel": (lambda x: x * x.numel(), "numel", r"x\.size"),
    "unsqueeze": (lambda x: x.unsqueeze(0), "unsqueeze", r"jnp\.expand_dims\(x, d\)"),
    "permute": (lambda x: x.permute(1, 0), "permute", r"x\.transpose\(dims\)"),
    "contiguous": (lambda x: x.contiguous(), "contiguous", r"x itself"),
    "new_zeros": (lambda x: x + x.new_zeros(x.shape), "new_zeros", r"jnp\.zeros\(shape, x\.dtype\)"),
    "expand": (lambda x: x.expand(2, 3), "expand", r"jnp\.broadcast_to\(x, shape\)"),
    "index_select": (lambda x: x.index_select(0, jnp.array([1, 0])), "index_select", r"jnp\.take\(x, index, axis=d\)"),
    "masked_fill": (lambda x: x.masked_fill(x < 0, 0.0), "masked_fill", r"jnp\.where\(mask, value, x\)"),
    "clamp": (lambda x: x.clamp(min=0), "clamp", r"jnp\.clip\(x, lo, hi\)"),
    "clamp_min": (lambda x: x.clamp_min(0), "clamp_min", r"jnp\.maximum\(x, lo\)"),
    "float": (lambda x: x.float(), "float", r"x\.astype\(jnp\.float32\)"),
    "double": (lambda x: x.double(), "double", r"x\.astype\(jnp\.float64\)"),
    "long": (lambda x: x * x.long(), "long", r"x\.astype\(jnp\.int64\)"),
    "bool": (lambda x: x * x.bool(), "bool", r"x\.astype\(bool\)"),
    "to": (lambda x: x.to(jnp.float32), "to", r"x\.astype\(dtype\)"),
    "type_as": (lambda x: x.type_as(x), "type_as", r"x\.astype\(y\.dtype\)"),
    "norm": (lambda x: x * x.norm(), "norm", r"jnp\.linalg\.norm\(x, axis=d\)"),
    "pow": (lambda x: x.pow(2), "pow", r"x \*\* p"),
    "exp": (lambda x: x.exp(), "exp", r"jnp\.exp\(x\)"),
    "abs": (lambda x: x.abs(), "abs", r"jnp\.abs\(x\)"),
    "sign": (lambda x: x.sign(), "sign", r"jnp\.sign\(x\)"),
}


def _forward_doing(expression):
    return lambda ctx, x: expression(x)


@pytest.mark.parametrize("habit", list(METHODS))
def test_a_pytorch_method_in_forward_names_the_function_the_method_and_its_jax_spelling(habit):
    expression, method, spelling = METHODS[habit]
    f = jaxfn.autograd_function(_forward_doing(expression), lambda ctx, g: g, name="ported")
    match = rf"^jaxfn: 'ported': forward used \.{method}, a PyTorch tensor method, on a JAX array, which has no "
    match += rf"\.{method}; write .*{spelling}"
    for call in (lambda: f(X), lambda: jax.jit(f)(X), lambda: _grad(f)(X)):  # eager, traced, differentiated
        err = _raises(AttributeError, match, call)
        assert isinstance(err, jaxfn.AutogradFunctionError) and isinstance(err.__cause__, AttributeError)


@pytest.mark.parametrize("habit", ["le", "t", "clamp_min", "dim"])
def test_a_pytorch_method_in_backward_is_named_as_backward(habit, maybe_jit):
    expression, method, spelling = METHODS[habit]
    f = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: expression(g), name="ported")
    _raises(
        AttributeError,
        rf"^jaxfn: 'ported': backward used \.{method},.*write .*{spelling}",
        lambda: maybe_jit(_grad(f))(X),
    )


def test_in_place_methods_say_arrays_are_immutable_and_spell_the_update():
    for method, spelling in (
        ("mul_", r"x \* y"),
        ("add_", r"x \+ y"),
        ("clamp_", r"jnp\.clip"),
        ("zero_", r"jnp\.zeros_like\(x\)"),
    ):
        f = jaxfn.autograd_function(lambda ctx, x, m=method: getattr(x, m)(0.0), lambda ctx, g: g, name="inplace")
        _raises(
            AttributeError,
            rf"'inplace': forward used \.{method}, PyTorch's in-place tensor method, on a JAX array.*JAX arrays are "
            rf"immutable: write x = {spelling}.* and return the new array",
            lambda f=f: f(X),
        )


@pytest.mark.parametrize(
    "expression, keyword, fix",
    [
        (lambda x: x.sum(dim=0), "dim", r"sum\(\), which JAX and NumPy call axis=; write sum\(\.\.\., axis=\.\.\.\)"),
        (
            lambda x: x.sum(0, keepdim=True),
            "keepdim",
            r"sum\(\), which JAX and NumPy call keepdims=; write sum\(\.\.\., keepdims=",
        ),
        (lambda x: x.max(dim=1), "dim", r"max\(\).*axis=.*x\.argmax\(axis=d\) the indices"),
        (lambda x: jnp.mean(x, dim=1), "dim", r"mean\(\).*axis="),
        (lambda x: x.std(unbiased=False), "unbiased", r"std\(\).*ddof=.*unbiased=False ddof=0"),
    ],
    ids=["dim", "keepdim", "max", "jnp.mean", "unbiased"],
)
def test_pytorch_keywords_are_named_with_their_jax_spelling(expression, keyword, fix, maybe_jit):
    f = jaxfn.autograd_function(_forward_doing(expression), lambda ctx, g: g, name="axes")
    err = _raises(
        TypeError, rf"^jaxfn: 'axes': forward passed PyTorch's keyword {keyword}= to {fix}", lambda: maybe_jit(f)(X)
    )
    assert isinstance(err.__cause__, TypeError)


def test_size_called_as_a_method_says_shape():
    def forward(ctx, x):
        return x * x.size(0)

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, name="sized")
    _raises(TypeError, r"'sized': forward called x\.size\(\), PyTorch's tensor method.*write x\.shape", lambda: f(X))


def test_methods_in_jvp_and_vmap_rules_name_the_rule():
    f = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 2, jvp=lambda ctx, t: t.mul(2), name="j")
    _raises(AttributeError, r"'j': jvp used \.mul, .*write x \* y", lambda: jax.jvp(f, (X,), (X,)))
    g = jaxfn.autograd_function(
        lambda ctx, x: x * 2, lambda ctx, g: g * 2, vmap=lambda info, dims, x: (x.double(), dims[0]), name="v"
    )
    _raises(AttributeError, r"'v': vmap used \.double, .*x\.astype\(jnp\.float64\)", lambda: jax.vmap(g)(X))


# -- on a host function's NumPy arrays ----------------------------------------------------------------


def test_host_code_gets_numpy_spellings_and_data_is_named_as_a_memoryview():
    cases = [
        (
            lambda z: z.data.cpu(),
            r"used \.cpu, a PyTorch tensor method, on a memoryview \(what \.data gives on a "
            r"NumPy array.*write x itself, without \.data",
        ),
        (lambda z: z * z.le(0), r"used \.le, .*on a NumPy array \(host code gets NumPy arrays\).*write x <= y"),
        (lambda z: z.float(), r"used \.float, .*on a NumPy array.*write x\.astype\(np\.float32\)"),
        (lambda z: z.clone(), r"used \.clone, .*on a NumPy array.*write x\.copy\(\)"),
        (lambda z: z.mul_(2), r"used \.mul_, PyTorch's in-place tensor method, on a NumPy array.*x\[\.\.\.\] = x \* y"),
        (lambda z: z.data * 2, r"computed with a memoryview.*drop \.data"),
    ]
    for expression, match in cases:
        f = jaxfn.autograd_function(_forward_doing(expression), lambda ctx, g: g, host=True, name="host")
        _raises((AttributeError, TypeError), r"^jaxfn: 'host': forward " + match, lambda f=f: f(X))
        _raises((AttributeError, TypeError), r"^jaxfn: 'host': forward " + match, lambda f=f: jax.jit(f)(X))


def test_host_backward_gets_the_numpy_spelling_too():
    f = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g.sign() * 2, host=True, name="hostb")
    _raises(
        AttributeError, r"'hostb': backward used \.sign, .*on a NumPy array.*write np\.sign\(x\)", lambda: _grad(f)(X)
    )


# -- what is not a habit passes through unchanged ----------------------------------------------------


def test_other_attribute_and_type_errors_pass_through_unchanged():
    typo = jaxfn.autograd_function(lambda ctx, x: x.smu(), lambda ctx, g: g, name="typo")
    with pytest.raises(AttributeError) as info:
        typo(X)
    assert not isinstance(info.value, jaxfn.AutogradFunctionError)

    holder = types.SimpleNamespace()  # a table name on an object that is no array: the user's own
    other = jaxfn.autograd_function(lambda ctx, x: x * holder.cpu(), lambda ctx, g: g, name="other")
    with pytest.raises(AttributeError) as info:
        other(X)
    assert not isinstance(info.value, jaxfn.AutogradFunctionError)

    def own(x, scale):
        return x * scale

    keyword = jaxfn.autograd_function(lambda ctx, x: own(x, dim=0), lambda ctx, g: g, name="own")
    with pytest.raises(TypeError) as info:
        keyword(X)
    assert not isinstance(info.value, jaxfn.AutogradFunctionError)


def test_the_table_spells_every_method_and_in_place_ones_are_derived():
    for method, (jax_spelling, numpy_spelling) in _pytorch_names.METHODS.items():
        assert jax_spelling and (numpy_spelling is None or numpy_spelling), method
        assert not hasattr(jnp.ones(1), method) or method in ("size", "copy", "clone", *_pytorch_names._SAME_NAME), (
            method
        )
    assert _pytorch_names._method_help("forward", "sigmoid_", jnp.ones(1)).count("jax.nn.sigmoid(x)") == 1
    assert _pytorch_names._method_help("forward", "nosuch", jnp.ones(1)) is None
    # a name with its own row (requires_grad_) gets that row, not the in-place reading of requires_grad
    own = _pytorch_names._method_help("forward", "requires_grad_", jnp.ones(1))
    assert "nothing: JAX differentiates what jax.grad is asked for" in own and "in-place" not in own, own
    assert _pytorch_names._method_help("forward", "cpu", [1.0]) is None  # a list: not an array


# -- a Python flag traced by jax.jit ------------------------------------------------------------------


def _pact_forward(ctx, x, alpha, num_bits, inplace):
    if inplace:  # a Python flag in PyTorch
        return x
    scale = 2 ** int(num_bits) - 1
    return jnp.round(jnp.clip(x, 0, alpha) * scale) / scale


_pact = jaxfn.autograd_function(_pact_forward, lambda ctx, g: (g, None, None, None), name="pact")


def test_a_flag_traced_by_jit_is_named_with_static_argnames():
    _raises(
        TypeError,
        r"^jaxfn: 'pact': forward used the value of an array as a Python bool \(.*\): its argument 'inplace', but "
        r"'inplace' is traced \(bool\[\]\).*Python flag or number passed through jax\.jit.*mark it static where "
        r"jax\.jit is applied: jax\.jit\(f, static_argnames=\('inplace',\)\).*static_argnums"
        if KNOWN
        else _none_claimed("inplace"),
        lambda: jax.jit(lambda x, b, i: _pact(x, 1.0, b, i))(X, 4, True),
    )
    err = _raises(
        TypeError,
        r"'pact': forward read the concrete value of an array .*: its argument 'num_bits', but 'num_bits' is traced "
        r"\(int64\[\]\).*static_argnames=\('num_bits',\)"
        if KNOWN
        else _none_claimed("num_bits"),
        lambda: jax.jit(lambda x, b: jax.grad(lambda x: _pact(x, 1.0, b, False).sum())(x))(X, 4),
    )
    assert "if it is a value being differentiated" not in str(err)  # an integer is never one
    assert isinstance(err.__cause__, jax.errors.ConcretizationTypeError)  # JAX's own, which names jit's argument


def test_with_the_flags_static_the_port_runs_and_keyword_flags_are_named_too():
    step = jax.jit(lambda x, b, i: _pact(x, 1.0, b, i), static_argnames=("b", "i"))
    expected = np.round(np.clip(np.asarray(X), 0, 1.0) * 15) / 15
    np.testing.assert_allclose(step(X, 4, False), expected)
    _raises(
        TypeError,
        r"its argument 'inplace'.*static_argnames=\('inplace',\)",
        lambda: jax.jit(lambda x, i: _pact(x, 1.0, num_bits=4, inplace=i))(X, True),
    )


def test_a_traced_float_scalar_is_named_with_both_fixes():
    def forward(ctx, x, alpha):
        return x * 2 if alpha else x

    f = jaxfn.autograd_function(forward, lambda ctx, g: (g, None), name="alpha")
    _raises(
        TypeError,
        r"its argument 'alpha'.*static_argnames=\('alpha',\).*; if it is a value being differentiated, keep it an "
        r"array instead: jnp\.where"
        if KNOWN
        else _none_claimed("alpha"),
        lambda: jax.jit(f)(X, 0.5),
    )


def test_a_flag_is_named_only_when_known():
    def derived(ctx, x, a, b):
        return x if a > b else -x  # the bool of a value computed from two flags: which one is not known

    def array_valued(ctx, x, a, b):
        return x if x.sum() > 0 else -x

    for forward in (derived, array_valued):
        f = jaxfn.autograd_function(forward, lambda ctx, g: (g, None, None), name="unnamed")
        err = _raises(
            TypeError,
            r"'unnamed': forward used the value of an array as a Python bool",
            lambda f=f: jax.jit(f)(X, 2, 3),
        )
        assert "its argument" not in str(err)
        assert "static_argnames=('name',)" in str(err)  # the general fix, for a flag passed through jit

    def first(ctx, x, a, b):
        return x if a else -x

    f = jaxfn.autograd_function(first, lambda ctx, g: (g, None, None), name="first")  # one value given twice:
    _raises(TypeError, r"its argument 'a'", lambda: jax.jit(lambda x, a: f(x, a, a))(X, True))  # forward reads a


def test_a_flag_in_eager_calls_and_under_grad_alone_runs():
    np.testing.assert_allclose(_pact(X, 1.0, 4, True), X)
    np.testing.assert_allclose(_grad(_pact, 1.0, 4, True)(X), np.ones(X.shape))


# -- a boolean-mask compaction under jit ---------------------------------------------------------------


def test_a_compaction_under_jit_gets_the_fixed_size_fix_and_the_fix_runs():
    positives = jaxfn.autograd_function(lambda ctx, x: x[x > 0], lambda ctx, g: g, name="positives")
    _raises(
        TypeError,
        r"'positives': forward indexed an array with a boolean mask.*jnp\.where.*for a compaction whose rows are the "
        r"output.*pad it: \(i,\) = jnp\.nonzero\(mask, size=n, fill_value=0\)",
        lambda: jax.jit(positives)(X.ravel()),
    )

    def fixed_size(ctx, x):  # the fix the message gives: a fixed size, padded with zeros
        mask = x > 0
        (i,) = jnp.nonzero(mask, size=x.size, fill_value=0)
        ctx.save_for_backward(i=i, count=mask.sum())
        return jnp.where(jnp.arange(x.size) < mask.sum(), x[i], 0)

    def backward(ctx, g):
        s = ctx.saved_variables
        kept = jnp.where(jnp.arange(g.size) < s.count, g, 0)
        return jnp.zeros(g.size, g.dtype).at[s.i].add(kept)

    padded = jaxfn.autograd_function(fixed_size, backward, name="padded")
    x = X.ravel()
    positive = np.asarray(x)[np.asarray(x) > 0]
    np.testing.assert_allclose(jax.jit(padded)(x), np.concatenate([positive, np.zeros(x.size - positive.size)]))
    np.testing.assert_allclose(
        jax.jit(jax.grad(lambda x: (padded(x) * jnp.arange(1.0, 7.0)).sum()))(x),
        jax.grad(lambda x: (jnp.where(x > 0, x, 0)[jnp.argsort(x <= 0, stable=True)] * jnp.arange(1.0, 7.0)).sum())(x),
    )


# -- compactions whose output's size depends on the values, under jit -----------------------------------


@pytest.mark.parametrize(
    "expression, called",
    [
        (lambda x: x[jnp.nonzero(x > 0)], r"jnp\.nonzero"),
        (lambda x: x[jnp.where(x > 0)], r"jnp\.where"),
        (lambda x: jnp.argwhere(x > 0).sum() * x, r"jnp\.argwhere"),
        (lambda x: jnp.flatnonzero(x > 0).sum() * x, r"jnp\.flatnonzero"),
        (lambda x: x[(x > 0).nonzero()], r"x\.nonzero"),
        (lambda x: jnp.unique(x), r"jnp\.unique"),
    ],
    ids=["nonzero", "where", "argwhere", "flatnonzero", "method", "unique"],
)
def test_a_compaction_function_under_jit_gets_the_fixed_size_fix(expression, called):
    f = jaxfn.autograd_function(_forward_doing(expression), lambda ctx, g: g, name="compact")
    err = _raises(
        TypeError,
        rf"^jaxfn: 'compact': forward called {called}, whose output's size depends on the values.*give it a fixed "
        rf"size n.*{called}\(\.\.\., size=n, fill_value=\.\.\.\).*jnp\.where\(jnp\.arange\(n\) < count",
        lambda: jax.jit(f)(X),
    )
    assert "static_argnames" not in str(err)
    assert isinstance(err.__cause__, jax.errors.ConcretizationTypeError)


# -- a flag traced by jax.vmap or a loop, with no jit -----------------------------------------------------


def _flagged(ctx, x, flag):
    return x * 2.0 if flag else x


def _steps(ctx, x, n):
    for _ in range(n):
        x = x * 2.0
    return x


def test_a_flag_batched_by_vmap_is_told_in_axes_none_not_static_argnames():
    f = jaxfn.autograd_function(_flagged, lambda ctx, g: (g, None), name="flagged")
    err = _raises(
        TypeError,
        r"^jaxfn: 'flagged': forward used the value of an array as a Python bool.*: its argument 'flag', but "
        r"jax\.vmap batches 'flag'.*in_axes=None for it.*jnp\.where\(condition, a, b\) or jax\.lax\.cond"
        if KNOWN
        else _none_claimed("flag"),
        lambda: jax.vmap(f)(jnp.stack([X, X]), jnp.array([True, False])),
    )
    assert "static_argnames" not in str(err) or not KNOWN


def test_a_loop_index_as_a_flag_is_told_a_python_loop_or_jnp_where_not_static_argnames():
    f = jaxfn.autograd_function(_steps, lambda ctx, g: (g, None), name="steps")
    for loop in (
        lambda: jax.lax.fori_loop(0, 3, lambda i, c: f(c, i), X),
        lambda: jax.lax.scan(lambda c, i: (f(c, i), None), X, jnp.arange(3)),
    ):
        err = _raises(
            TypeError,
            r"^jaxfn: 'steps': forward used the value of an array as a Python int.*: its argument 'n', but 'n' is "
            r"traced by a JAX loop.*jnp\.where\(condition, a, b\) or jax\.lax\.cond.*loop in Python"
            if KNOWN
            else _none_claimed("n"),
            loop,
        )
        assert "static_argnames" not in str(err) or not KNOWN


def test_a_flag_jit_traced_is_still_told_static_argnames_through_a_loop_or_vmap():
    f = jaxfn.autograd_function(_flagged, lambda ctx, g: (g, None), name="flagged")
    for call in (  # jit's argument, closed over by a loop body; unbatched (in_axes=None) under vmap
        lambda: jax.jit(lambda x, b: jax.lax.fori_loop(0, 2, lambda i, c: f(c, b), x))(X, True),
        lambda: jax.jit(jax.vmap(f, in_axes=(0, None)))(jnp.stack([X, X]), True),
    ):
        _raises(TypeError, r"its argument 'flag', but 'flag' is traced.*static_argnames=\('flag',\)", call)


def test_a_flag_whose_transformation_is_not_known_gets_every_fix_none_claimed():
    f = jaxfn.autograd_function(_flagged, lambda ctx, g: (g, None), name="flagged")
    err = _raises(
        TypeError,
        r"its argument 'flag', but 'flag' is traced \(bool\[\]\).*jnp\.where.*static where jax\.jit is applied.*"
        r"unbatched where jax\.vmap is",
        lambda: jax.vmap(jax.jit(lambda x, b: f(x, b)))(jnp.stack([X, X]), jnp.array([True, False])),
    )
    assert "batches 'flag'" not in str(err) and "mark it static" not in str(err)


# -- PyTorch's keywords only on JAX's and NumPy's own functions -------------------------------------------


@pytest.mark.parametrize(
    "expression, keyword, called",
    [
        (lambda x: jnp.flip(x, dims=(0,)), "dims", "flip"),
        (lambda x: jnp.linalg.norm(x, dim=1), "dim", "norm"),
        (lambda x: (x > 0).sum(dim=1), "dim", "sum"),
    ],
    ids=["flip dims", "linalg.norm", "method of an expression"],
)
def test_pytorch_keywords_on_jax_functions_outside_jnp_are_named(expression, keyword, called):
    f = jaxfn.autograd_function(_forward_doing(expression), lambda ctx, g: g, name="axes")
    _raises(
        TypeError,
        rf"^jaxfn: 'axes': forward passed PyTorch's keyword {keyword}= to {called}\(\), which JAX and NumPy call axis=",
        lambda: f(X),
    )


def test_a_users_own_helpers_keyword_is_theirs_even_named_like_a_jnp_function():
    def split(v, d):  # named as jnp.split, and a nested one as jnp.take: the user's own
        return v[:d]

    def forward(ctx, x):
        def take(v, k):
            return v[:k]

        return split(x, dim=1) + take(x, dim=1)

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, name="own_helper")
    with pytest.raises(TypeError, match="unexpected keyword argument 'dim'") as info:
        f(X)
    assert not isinstance(info.value, jaxfn.AutogradFunctionError)

    def with_dim(v, dim):  # the user's own function with a dim parameter works
        return v.sum(axis=dim)

    works = jaxfn.autograd_function(lambda ctx, x: with_dim(x, dim=1), lambda ctx, g: g, name="own_dim")
    np.testing.assert_allclose(works(X), np.asarray(X).sum(axis=1))


# -- PyTorch methods whose JAX and NumPy namesakes mean something else --------------------------------------


@pytest.mark.parametrize(
    "expression, method, fix",
    [
        (lambda x: x.view(-1), r"view\(-1\)", r"x\.reshape\(-1\)"),
        (lambda x: x.view(3, 2), r"view\(3, 2\)", r"x\.reshape\(3, 2\)"),
        (lambda x: x.view(x.shape[0], -1), r"view\(x\.shape\[0\], -1\)", r"x\.reshape\(x\.shape\[0\], -1\)"),
        (lambda x: x[None].transpose(0, 1), r"transpose\(0, 1\)", r"jnp\.swapaxes\(x\[None\], 0, 1\)"),
        (lambda x: x.flatten(1), r"flatten\(1\)", r"x\.reshape\(x\.shape\[0\], -1\)"),
    ],
    ids=["view(-1)", "view(3, 2)", "view(shape)", "transpose", "flatten"],
)
def test_a_pytorch_method_with_a_jax_namesake_is_spelled(expression, method, fix, maybe_jit):
    f = jaxfn.autograd_function(_forward_doing(expression), lambda ctx, g: g, name="namesake")
    _raises(
        (TypeError, ValueError),  # the kind of the error the array method raised
        rf"^jaxfn: 'namesake': forward called \.{method} as PyTorch's tensor method .* on a JAX array, whose "
        rf"\..*; write {fix}\.",
        lambda: maybe_jit(f)(X),
    )


def test_a_pytorch_method_with_a_numpy_namesake_in_host_code_is_spelled_for_numpy():
    for expression, fix in (
        (lambda z: z.view(-1), r"z\.reshape\(-1\)"),
        (lambda z: (lambda y: y.transpose(0, 2))(z[None]), r"np\.swapaxes\(y, 0, 2\)"),
        (lambda z: z.flatten(1), r"z\.reshape\(z\.shape\[0\], -1\)"),
    ):
        f = jaxfn.autograd_function(_forward_doing(expression), lambda ctx, g: g, host=True, name="host")
        _raises(
            (TypeError, ValueError),
            rf"^jaxfn: 'host': forward called .*on a NumPy array.*write {fix}\.",
            lambda f=f: f(X),
        )


def test_a_namesakes_own_use_passes_through_unchanged():
    for expression in (lambda x: x.view("no such dtype"), lambda x: x.transpose(2, 0)):
        f = jaxfn.autograd_function(_forward_doing(expression), lambda ctx, g: g, name="own_use")
        with pytest.raises((TypeError, ValueError)) as info:
            f(X)
        assert not isinstance(info.value, jaxfn.AutogradFunctionError)
    works = jaxfn.autograd_function(lambda ctx, x: x.transpose(1, 0).view(x.dtype), lambda ctx, g: g, name="ok")
    assert works(X).shape == (3, 2)


# -- mark_non_differentiable given an array that fills two parameters ---------------------------------------


def test_mark_non_differentiable_names_every_parameter_the_same_array_fills():
    def forward(ctx, x, y):
        ctx.mark_non_differentiable(y)
        return x * 2

    f = jaxfn.autograd_function(forward, lambda ctx, g: (g, None), name="same")
    _raises(
        TypeError,
        r"^jaxfn: 'same': ctx\.mark_non_differentiable\(\) takes values that forward returns, but its argument 0 "
        r"\(forward's input 'x' or 'y', the same array\) is not among forward's outputs",
        lambda: f(X, X),
    )
    _raises(TypeError, r"its argument 0 \(forward's input 'y'\)", lambda: f(X, X + 1))


# -- a second probe's cases: the keyword each function takes, the error's kind, what jit can see --


@pytest.mark.parametrize(
    "expression, called, spelled",
    [
        (lambda x: jnp.tensordot(x, x.T, dims=1), "tensordot", "axes"),
        (lambda x: jnp.rot90(x, dims=(0, 1)), "rot90", "axes"),
        (lambda x: jax.lax.sort(x, dim=0), "sort", "dimension"),
    ],
    ids=["tensordot", "rot90", "lax.sort"],
)
def test_a_pytorch_keyword_is_spelled_as_the_called_function_takes_it(expression, called, spelled):
    f = jaxfn.autograd_function(_forward_doing(expression), lambda ctx, g: g, name="kw")
    _raises(TypeError, rf"keyword dims?= to {called}\(\), which JAX and NumPy call {spelled}=", lambda: f(X))


def test_a_pytorch_keyword_to_a_function_with_no_axis_keyword_is_left_as_python_says():
    f = jaxfn.autograd_function(
        lambda ctx, x: jax.tree_util.tree_map(lambda v: v * 2, x, dim=1), lambda ctx, g: g, name="kw"
    )
    with pytest.raises(TypeError, match=r"tree_map\(\) got an unexpected keyword argument 'dim'") as info:
        f(X)
    assert not isinstance(info.value, jaxfn.AutogradFunctionError)


def test_a_translated_error_keeps_the_kind_of_the_users_error():
    f = jaxfn.autograd_function(lambda ctx, x: x.transpose(0, 2), lambda ctx, g: g, host=True, name="kind")
    with pytest.raises(ValueError, match=r"'kind': forward called \.transpose\(0, 2\)"):  # NumPy raised a ValueError
        f(jnp.ones((2, 3, 4)))


def test_a_flag_traced_by_eval_shape_is_not_told_jits_static_argnames():
    def forward(ctx, x, flag):
        return x * 2.0 if flag else x

    f = jaxfn.autograd_function(forward, lambda ctx, g: (g, None), name="flagged")
    err = _raises(TypeError, _none_claimed("flag"), lambda: jax.eval_shape(f, X, True))
    assert "mark it static where jax.jit is applied: jax.jit(f" not in str(err)


def _flag_forward(ctx, x, flag):
    return x * 2.0 if flag else x


class _Flagged(jaxfn.Function):
    forward = staticmethod(_flag_forward)

    @staticmethod
    def backward(ctx, g):
        return g, None


def test_static_argnames_finds_a_flag_passed_by_position():
    """A jaxfn function's signature is forward's without ctx, so jax.jit maps a static name to its position."""
    f = jaxfn.autograd_function(_flag_forward, lambda ctx, g: (g, None), name="flagged")
    for call in (f, _Flagged.apply):
        np.testing.assert_allclose(jax.jit(call, static_argnames=("flag",))(X, True), 2 * X)
        np.testing.assert_allclose(jax.grad(lambda x, call=call: call(x, True).sum())(X), jnp.ones_like(X))


def test_a_pytorch_method_called_inside_an_installed_library_is_not_respelled(tmp_path, monkeypatch):
    library = tmp_path / "site-packages"
    library.mkdir()
    (library / "torchish_helpers.py").write_text("def to_numpy(t):\n    return t.detach().cpu().numpy()\n")
    monkeypatch.syspath_prepend(str(library))
    import torchish_helpers

    f = jaxfn.autograd_function(lambda ctx, x: torchish_helpers.to_numpy(x), lambda ctx, g: g, host=True, name="lib")
    with pytest.raises(AttributeError, match="detach") as info:
        f(jnp.arange(3.0))
    assert not isinstance(info.value, jaxfn.AutogradFunctionError)
