"""``jaxfn.gradcheck``: does a backward agree with central finite differences, and where not."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path, tree_unflatten

from ._arguments import DIFF, dtype_kind, leaf_kind
from ._errors import AutogradFunctionValueError, GradcheckError, error, gradcheck_of
from ._function import AutogradFunction


def gradcheck(
    fn: Callable[..., Any],
    *args: Any,
    eps: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    order: int | None = None,
    raise_exception: bool | None = None,
    check_forward_ad: bool | None = None,
    check_batched_grad: bool | None = None,
    **kwargs: Any,
) -> bool:
    """Check the gradients of `fn` (its custom backward) against central finite differences.

    Every floating-point or complex leaf of every argument is checked (arrays of any precision,
    bfloat16 and float8 included, and Python and NumPy float scalars: they are the values to
    check), through every differentiable output (outputs marked non-differentiable, integer
    outputs and Python values are left out), in float64 / complex128: x64 is switched on with
    JAX's own context manager for the check only, so the setting in force before (global or a
    `jax.enable_x64` context) is back afterwards. Integer, boolean and other arguments are
    passed through unchanged. Complex leaves follow JAX's convention: the derivative along a
    direction `d` is `Re(sum(grad * d))`, checked along real and imaginary directions. A
    call with nothing to check (no floating leaf, or no differentiable output) raises.

    Cost: the outputs are reduced to one scalar with a fixed random cotangent; then each
    differentiable leaf is checked along one random direction (two evaluations of `fn` and
    one gradient). Only a leaf that fails is located element by element, with one batched
    (`vmap`) set of finite differences over its elements. So a passing check of inputs with
    thousands of elements costs a handful of calls. `order=2` repeats the check for the
    derivative of backward (reverse over reverse), at about twice the cost.

    An option that is also a parameter of `fn` is refused as ambiguous: pass the function's own
    through a `lambda`.

    Args:
      fn: a jaxfn function, or any JAX-differentiable callable.
      *args: the positional arguments to call `fn` with.
      eps: the finite-difference step (default `1e-6`).
      atol: the absolute tolerance (default `1e-5`): a gradient passes where
        `|analytical - numerical| <= atol + rtol * |numerical|`.
      rtol: the relative tolerance (default `1e-3`), as in the formula of `atol`.
      order: 1 (the default) checks backward; 2 also checks the derivative of backward.
      raise_exception: raise on failure (the default, `True`), or return `False`.
      check_forward_ad: also check forward mode (a `jvp` rule, or the one `forward_mode=True`
        derives): each leaf's directional derivative from `jax.jvp` against finite differences.
      check_batched_grad: also check the function under `jax.vmap`: the outputs and gradients of
        a batch of three inputs (`x` and two nearby points) against the same computed one
        example at a time (a `vmap` rule, and backward under `vmap`).
      **kwargs: the keyword arguments to call `fn` with.

    Returns:
      `True` when every check passes (`False` on failure with `raise_exception=False`).

    Raises:
      GradcheckError: naming the parameter (and pytree key path), the worst element's index,
        the analytical and numerical values, and the tolerance; or saying that nothing could
        be checked, or that an option is also a parameter of `fn`.
      AutogradFunctionError: for an `order` other than 1 or 2.

    >>> import jax.numpy as jnp, jaxfn
    >>> square = jaxfn.autograd_function(lambda ctx, x: (ctx.save_for_backward(x), x**2)[1],
    ...                                  lambda ctx, g: g * 2 * ctx.saved_tensors[0])
    >>> jaxfn.gradcheck(square, jnp.array([1.0, 2.0]))
    True
    """
    options = {
        "eps": eps,
        "atol": atol,
        "rtol": rtol,
        "order": order,
        "raise_exception": raise_exception,
        "check_forward_ad": check_forward_ad,
        "check_batched_grad": check_batched_grad,
    }
    _refuse_ambiguous_options(fn, [name for name, value in options.items() if value is not None])
    eps, atol, rtol = 1e-6 if eps is None else eps, 1e-5 if atol is None else atol, 1e-3 if rtol is None else rtol
    order, raise_exception = 1 if order is None else order, True if raise_exception is None else raise_exception
    if order not in (1, 2):
        raise error(AutogradFunctionValueError, gradcheck_of(_name(fn)), f"order must be 1 or 2, but got {order!r}")
    try:
        with jax.enable_x64(True):  # JAX's context manager: restores whatever setting (or context) was in force
            return _gradcheck(
                fn, args, kwargs, eps, atol, rtol, order, bool(check_forward_ad), bool(check_batched_grad)
            )
    except GradcheckError:
        if raise_exception:
            raise
        return False


def _refuse_ambiguous_options(fn: Callable[..., Any], given: list[str]) -> None:
    """An option given to gradcheck that is also a parameter of ``fn`` could mean either."""
    target = _jaxfn_function(fn)
    try:
        signature = target._definition.signature if target is not None else inspect.signature(fn)
    except (TypeError, ValueError):
        return
    clash = [name for name in given if name in signature.parameters]
    if clash:
        raise error(
            GradcheckError,
            gradcheck_of(_name(fn)),
            f"{', '.join(map(repr, clash))} is both an option of gradcheck and a parameter of the function, so it "
            "is ambiguous here; pass the function's value through a lambda (gradcheck(lambda x: f(x, eps=1e-5), x, "
            "eps=1e-6))",
        )


def _gradcheck(fn, args, kwargs, eps, atol, rtol, order, forward_ad=False, batched_grad=False) -> bool:
    who = gradcheck_of(_name(fn))  # what every message opens with
    with_paths, treedef = tree_flatten_with_path((args, kwargs))
    leaves = [_as_checked(leaf) for _, leaf in with_paths]
    floating = [i for i, leaf in enumerate(leaves) if leaf_kind(leaf) == DIFF]
    checked = [i for i in floating if np.size(leaves[i])]  # a zero-size leaf has no element to check
    labels = _labels(fn, args, [path for path, _ in with_paths])
    if not checked:
        raise error(GradcheckError, who, _EMPTY_INPUTS if floating else _NO_INPUTS)
    rng = np.random.default_rng(0)

    def call(diff: list[Any]) -> Any:
        full = list(leaves)
        for i, value in zip(checked, diff):
            full[i] = value
        call_args, call_kwargs = tree_unflatten(treedef, full)
        return fn(*call_args, **call_kwargs)

    x0 = [leaves[i] for i in checked]
    select = _outputs_to_check(fn, args, kwargs, leaves, treedef)
    checked_labels = [f"'{labels[i]}'" for i in checked]
    out_shapes = jax.eval_shape(lambda diff: select(call(diff)), x0)
    if not out_shapes:
        raise error(
            GradcheckError,
            who,
            "there is nothing to check: no output is floating-point or complex and differentiable with at least "
            "one element, so no gradient flows back",
        )
    inputs = sum(2 * np.size(x) if jnp.iscomplexobj(x) else np.size(x) for x in x0)
    outputs = sum(2 * np.prod(o.shape) if jnp.iscomplexobj(o) else np.prod(o.shape) for o in out_shapes)
    # Every input differentiated, then each one alone (the others held constant): a backward may
    # branch on ctx.needs_input_grad, and each pattern a user's jax.grad can make is checked.
    alone = [[k] for k in range(len(x0))] if len(x0) > 1 else []
    for which in [list(range(len(x0))), *alone]:
        restricted = functools.partial(_restricted, lambda diff: select(call(diff)), x0, which)
        sub_x0 = [x0[k] for k in which]
        sub_labels = [checked_labels[k] + (_ALONE if len(which) == 1 and alone else "") for k in which]
        if inputs * outputs <= JACOBIAN_ENTRIES and max(inputs, outputs) <= JACOBIAN_SIDE:
            _check_jacobian(restricted, sub_x0, sub_labels, eps, atol, rtol, who)
        else:  # too large for the full Jacobian: each leaf along a random direction (PyTorch's fast mode)
            cotangent = _random_like(rng, out_shapes)
            scalar = lambda diff, f=restricted, c=cotangent: _vdot(c, f(diff))  # noqa: E731
            _check(scalar, sub_x0, sub_labels, eps, atol, rtol, rng, "", who)
    if order == 2:
        cotangent = _random_like(rng, out_shapes)
        scalar = lambda diff: _vdot(cotangent, select(call(diff)))  # noqa: E731
        u = _random_like(rng, x0)
        second = lambda diff: _vdot(u, jax.grad(scalar)(diff))  # noqa: E731
        _check(second, x0, checked_labels, eps, atol, rtol, rng, " of the backward (order=2)", who)
    if forward_ad:
        cotangent = _random_like(rng, out_shapes)
        scalar = lambda diff: _vdot(cotangent, select(call(diff)))  # noqa: E731
        _check_forward(scalar, x0, checked_labels, eps, atol, rtol, rng, who)
    if batched_grad:
        _check_batched(lambda diff: select(call(diff)), x0, checked_labels, out_shapes, atol, rtol, rng, who)
    return True


_ALONE = " (differentiated alone, the other inputs held constant)"
_NO_INPUTS = (
    "there is nothing to check: no argument has a floating-point or complex leaf (Python and NumPy floats count; "
    "integers, booleans and other values are passed through), so no gradient was compared"
)
_EMPTY_INPUTS = (
    "there is nothing to check: every floating-point or complex leaf of the arguments has zero size (a shape "
    "with a 0 in it), so there is no element to compare; give at least one argument a non-empty shape"
)


def _restricted(f: Callable[[list[Any]], Any], x0: list[Any], which: list[int], diff: list[Any]) -> Any:
    """``f`` of the inputs ``which`` only; the others are the constants ``x0``, so JAX does not
    differentiate them (their needs_input_grad is False)."""
    full = list(x0)
    for k, value in zip(which, diff):
        full[k] = value
    return f(full)


# Up to this many entries (inputs x outputs, real and imaginary parts counted apart), the whole
# Jacobian is compared element by element, as PyTorch's gradcheck does; above (or with more than
# JACOBIAN_SIDE inputs or outputs), each input leaf is checked along a random direction
# (PyTorch's fast mode).
JACOBIAN_ENTRIES = 1 << 22
JACOBIAN_SIDE = 8192  # and at most this many inputs or outputs: one VJP per output, one pair of calls per input
_CHUNK = 1 << 20  # entries computed per vmapped batch


def _check_jacobian(call, x0, labels, eps, atol, rtol, who) -> None:
    """Every element of the Jacobian of the real view of ``call``: backward's against central
    finite differences. Complex inputs and outputs are split into real and imaginary parts,
    so JAX's convention for complex gradients is checked as a real Jacobian."""
    parts = [(k, part) for k, x in enumerate(x0) for part in (("real", "imag") if jnp.iscomplexobj(x) else (None,))]
    r0 = [jnp.real(x0[k]) if part == "real" else jnp.imag(x0[k]) if part == "imag" else x0[k] for k, part in parts]

    def as_complex(real_parts: list[Any]) -> list[Any]:
        leaves: list[Any] = [None] * len(x0)
        for (k, part), value in zip(parts, real_parts):
            leaves[k] = value if part is None else (value if part == "real" else leaves[k] + 1j * value)
        return leaves

    def flat(real_parts: list[Any]) -> Any:
        outs = call(as_complex(real_parts))
        pieces = [p for o in outs for p in ((jnp.real(o), jnp.imag(o)) if jnp.iscomplexobj(o) else (o,))]
        return jnp.concatenate([jnp.ravel(p).astype(jnp.float64) for p in pieces])

    size = int(jax.eval_shape(flat, r0).shape[0])
    _, pullback = jax.vjp(flat, r0)
    inputs = sum(int(np.size(r)) for r in r0)
    analytical = _batched(lambda e: pullback(e)[0], size, (size,), _CHUNK // max(inputs, size))
    for j, ((k, part), r) in enumerate(zip(parts, r0)):
        n = int(np.size(r))

        def column(d, j=j):
            shifted = lambda step: [x + step * d if i == j else x for i, x in enumerate(r0)]  # noqa: E731
            return (flat(shifted(eps)) - flat(shifted(-eps))) / (2 * eps)

        numerical = _one_by_one(column, n, np.shape(r))  # (n, size)
        ana = np.asarray(analytical[j]).reshape(size, n).T  # (n, size)
        _compare(labels[k], part, np.shape(r), ana, np.asarray(numerical), atol, rtol, who)


def _batched(f, n: int, shape: tuple, chunk: int) -> Any:
    """``vmap(f)`` over the n unit vectors of ``shape`` (made ``chunk`` at a time, so memory stays
    bounded), concatenated (a pytree of arrays)."""
    chunk = max(1, chunk)
    pieces = []
    for start in range(0, n, chunk):
        rows = np.zeros((min(chunk, n - start), n), np.float64)
        rows[np.arange(len(rows)), np.arange(start, start + len(rows))] = 1.0
        pieces.append(jax.vmap(f)(jnp.asarray(rows.reshape((len(rows), *shape)))))
    return jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *pieces)


def _one_by_one(f, n: int, shape: tuple) -> Any:
    """``f`` over the n unit vectors of ``shape``, one at a time (``lax.map``, not ``vmap``): finite
    differences stay independent of the function's batching (a user's vmap rule is checked apart,
    by ``check_batched_grad``)."""
    return np.asarray(jax.lax.map(f, jnp.eye(n, dtype=jnp.float64).reshape((n, *shape))))


def _compare(label: str, part, shape: tuple, analytical: np.ndarray, numerical: np.ndarray, atol, rtol, who) -> None:
    """Raise naming the worst disagreement between two (input element, output) Jacobian blocks."""
    finite = np.isfinite(analytical) & np.isfinite(numerical)
    excess = np.where(finite, np.abs(analytical - numerical) - (atol + rtol * np.abs(numerical)), np.inf)
    if not np.any(excess > 0):
        return
    element, output = np.unravel_index(int(np.argmax(excess)), excess.shape)
    index = tuple(int(i) for i in np.unravel_index(element, shape)) if shape else ()
    a, n = analytical[element, output], numerical[element, output]
    where = "" if part is None else f" of its {part} part"
    raise error(
        GradcheckError,
        who,
        f"the gradient for {label} disagrees with finite differences; worst at index {index}{where} (output "
        f"element {int(output)}): analytical {a:.6g}, numerical {n:.6g} (|difference| {abs(a - n):.3g} > atol "
        f"{atol:g} + rtol {rtol:g} * |numerical|); {int(np.sum(np.any(excess > 0, axis=1)))} of "
        f"{excess.shape[0]} elements disagree",
    )


def _check(scalar, x0, labels, eps, atol, rtol, rng, what, who) -> None:
    """Each leaf along one random direction; a failing leaf located element by element."""
    analytical = jax.grad(scalar)(x0)
    for k, (label, leaf) in enumerate(zip(labels, x0)):
        direction = _random_like(rng, leaf)
        numerical = float(_central(scalar, x0, k, direction, eps))
        expected = float(jnp.sum(analytical[k] * direction).real)  # JAX's convention: Re(sum(g * d))
        if not (np.isfinite(expected) and np.isfinite(numerical)) or abs(expected - numerical) > atol + rtol * abs(
            numerical
        ):
            _locate(scalar, x0, k, analytical[k], label, eps, atol, rtol, what, who)


def _check_forward(scalar, x0, labels, eps, atol, rtol, rng, who) -> None:
    """Forward mode: each leaf's directional derivative (``jax.jvp``) along one random direction
    against finite differences; a failing leaf located element by element."""
    for k, (label, leaf) in enumerate(zip(labels, x0)):
        direction = _random_like(rng, leaf)
        expected = float(_directional(scalar, x0, k, direction))
        numerical = float(_central(scalar, x0, k, direction, eps))
        if not (np.isfinite(expected) and np.isfinite(numerical)) or abs(expected - numerical) > atol + rtol * abs(
            numerical
        ):
            analytical = _along_basis(lambda d, k=k: _directional(scalar, x0, k, d), x0[k])
            _locate(scalar, x0, k, analytical, label, eps, atol, rtol, " in forward mode (jvp)", who)


def _directional(scalar, x0, k, direction):
    """The derivative of ``scalar`` at ``x0`` along ``direction`` in leaf ``k``, by ``jax.jvp``."""
    tangents = [direction if i == k else jnp.zeros_like(leaf) for i, leaf in enumerate(x0)]
    return jax.jvp(scalar, (x0,), (tangents,))[1]


def _along_basis(along, leaf) -> Any:
    """``along`` of every unit vector of ``leaf`` (one at a time, as ``_one_by_one``), in JAX's
    gradient convention for complex leaves (Re(g * 1) and Re(g * i) give the real and minus the
    imaginary part)."""
    size, shape = int(np.size(leaf)), np.shape(leaf)
    basis = jnp.eye(size, dtype=leaf.dtype).reshape((size, *shape))
    values = jax.lax.map(along, basis).reshape(shape)
    if jnp.iscomplexobj(leaf):
        values = values - 1j * jax.lax.map(along, 1j * basis).reshape(shape)
    return values


def _check_batched(f, x0, labels, out_shapes, atol, rtol, rng, who) -> None:
    """``f`` and its gradient under ``jax.vmap`` over three inputs against the same, one at a time."""
    points = [x0] + [[x + 1e-3 * _random_like(rng, x) for x in x0] for _ in range(2)]
    stacked = [jnp.stack(leaves) for leaves in zip(*points)]
    cotangent = _random_like(rng, out_shapes)
    scalar = lambda diff: _vdot(cotangent, f(diff))  # noqa: E731
    for what, g in (("the output", f), ("the gradient", jax.grad(scalar))):
        batched = jax.vmap(g)(stacked)
        one_by_one = [g(point) for point in points]
        names = labels if what == "the gradient" else [f"output {i}" for i in range(len(one_by_one[0]))]
        for k, name in enumerate(names):
            _compare_batched(
                what, name, np.asarray(batched[k]), [np.asarray(o[k]) for o in one_by_one], atol, rtol, who
            )


def _compare_batched(what: str, name: str, batched: np.ndarray, one_by_one: list[np.ndarray], atol, rtol, who) -> None:
    expected = np.stack(one_by_one)
    if batched.shape != expected.shape:
        raise error(
            GradcheckError,
            who,
            f"{what} for {name} under jax.vmap has shape {batched.shape}, but computed one example at a time it has "
            f"{expected.shape}; check the function's vmap rule",
        )
    finite = np.isfinite(batched) & np.isfinite(expected)
    excess = np.where(finite, np.abs(batched - expected) - (atol + rtol * np.abs(expected)), np.inf)
    excess = np.where(np.isnan(batched) & np.isnan(expected), -1, excess)
    if not np.any(excess > 0):
        return
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), excess.shape))
    raise error(
        GradcheckError,
        who,
        f"{what} for {name} under jax.vmap disagrees with the same computed one example at a time; worst at batch "
        f"element {worst[0]}, index {worst[1:]}: batched {batched[worst]:.6g}, one at a time {expected[worst]:.6g} "
        f"(|difference| {abs(batched[worst] - expected[worst]):.3g} > atol {atol:g} + rtol {rtol:g} * |value|); "
        "check the function's vmap rule, or its backward under vmap",
    )


def _locate(scalar, x0, k, analytical, label, eps, atol, rtol, what, who) -> None:
    """Finite differences for every element of leaf ``k``; raise naming the worst one."""
    size = int(np.size(x0[k]))
    numerical = _along_basis(lambda d: _central(scalar, x0, k, d, eps), x0[k])
    analytical, numerical = np.asarray(analytical), np.asarray(numerical)
    finite = np.isfinite(analytical) & np.isfinite(numerical)
    excess = np.where(finite, np.abs(analytical - numerical) - (atol + rtol * np.abs(numerical)), np.inf)
    worst = np.unravel_index(int(np.argmax(excess)), np.shape(excess)) if np.ndim(excess) else ()
    index = tuple(int(i) for i in worst)
    raise error(
        GradcheckError,
        who,
        f"the gradient{what} for {label} disagrees with finite differences; worst at index {index}: "
        f"analytical {analytical[worst]:.6g}, numerical {numerical[worst]:.6g} (|difference| "
        f"{abs(analytical[worst] - numerical[worst]):.3g} > atol {atol:g} + rtol {rtol:g} * |numerical|); "
        f"{int(np.sum(excess > 0))} of {size} elements disagree",
    )


def _central(scalar, x0, k, direction, eps):
    """The central difference of ``scalar`` at ``x0`` along ``direction`` in leaf ``k``."""

    def shifted(step):
        return [leaf + step * direction if i == k else leaf for i, leaf in enumerate(x0)]

    return (scalar(shifted(eps)) - scalar(shifted(-eps))) / (2 * eps)


def _as_checked(leaf: Any) -> Any:
    """A leaf as gradcheck passes it: floating values (arrays of any precision, Python and NumPy
    scalars) in float64 or complex128; everything else as given."""
    if isinstance(leaf, (float, complex)) or (isinstance(leaf, np.generic) and np.iscomplexobj(leaf)):
        leaf = np.asarray(leaf)
    elif isinstance(leaf, np.generic) and leaf_kind(np.asarray(leaf)) == DIFF:
        leaf = np.asarray(leaf)
    if leaf_kind(leaf) == DIFF:
        return jnp.asarray(leaf, jnp.complex128 if jnp.iscomplexobj(leaf) else jnp.float64)
    return leaf


def _outputs_to_check(fn, args, kwargs, leaves, treedef) -> Callable[[Any], list[Any]]:
    """From an output, the arrays to check: floating or complex, and (for a jaxfn function) not
    marked non-differentiable. Python values and integer arrays are left out."""
    target = _jaxfn_function(fn)
    flags = None if target is None else _output_flags(target, *tree_unflatten(treedef, leaves))

    def select(out: Any) -> list[Any]:
        out_leaves = jax.tree_util.tree_leaves(out)
        keep = flags if flags is not None and len(flags) == len(out_leaves) else [True] * len(out_leaves)
        return [leaf for leaf, k in zip(out_leaves, keep) if k and _is_inexact_array(leaf) and np.size(leaf)]

    return select


def _output_flags(target: AutogradFunction, args: tuple, kwargs: dict) -> list[bool]:
    """One per output leaf: whether it carries a gradient (False for a Python value), from forward's
    output description, never by rebuilding its pytree around flags (a user's node may refuse them)."""
    info = target.outputs(*args, **kwargs)
    flags = iter(info.differentiable)
    return [next(flags) if array else False for array in info.is_array]


def _is_inexact_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray)) and dtype_kind(value.dtype) == DIFF


def _random_like(rng: np.random.Generator, tree: Any, differentiable: Any = None) -> Any:
    """Random values shaped like each floating or complex leaf of ``tree``; None elsewhere."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    flags = [True] * len(leaves)
    if differentiable is not None:
        flags = [flag is True for flag in jax.tree_util.tree_leaves(differentiable, is_leaf=lambda v: v is None)]
        flags = flags if len(flags) == len(leaves) else [True] * len(leaves)
    drawn = []
    for leaf, flag in zip(leaves, flags):
        dtype = getattr(leaf, "dtype", None)
        if not flag or dtype is None or dtype_kind(dtype) != DIFF:
            drawn.append(None)
        elif jnp.issubdtype(dtype, jnp.complexfloating):
            drawn.append(jnp.asarray(rng.standard_normal(leaf.shape) + 1j * rng.standard_normal(leaf.shape), dtype))
        else:
            drawn.append(jnp.asarray(rng.standard_normal(leaf.shape), dtype))
    return jax.tree_util.tree_unflatten(treedef, drawn)


def _vdot(weights: Any, values: Any) -> Any:
    """The sum over matching leaves of Re<weight, value>, skipping outputs without a weight."""
    pairs = zip(jax.tree_util.tree_leaves(weights, is_leaf=lambda x: x is None), jax.tree_util.tree_leaves(values))
    return sum((jnp.vdot(w, v.astype(w.dtype)).real for w, v in pairs if w is not None), jnp.zeros((), jnp.float64))


def _labels(fn: Callable[..., Any], args: tuple, paths: list[tuple]) -> list[str]:
    """A name for each leaf: the parameter's name (from fn's signature) and its key path."""
    names = _positional_names(fn, len(args))
    labels = []
    for path in paths:
        (top, key, *rest) = path
        if top.idx == 1:  # a keyword argument
            head = str(key.key)
        else:
            head = names[key.idx] if key.idx < len(names) else f"args[{key.idx}]"
        labels.append(head + keystr(tuple(rest)))
    return labels


def _name(fn: Callable[..., Any]) -> str:
    """What gradcheck's messages call ``fn``: a jaxfn function's ``name``, else its ``__name__``."""
    target = _jaxfn_function(fn)
    if target is not None:
        return target.name
    function = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(function, "__name__", None) or type(fn).__name__


def _jaxfn_function(fn: Callable[..., Any]) -> AutogradFunction | None:
    """The jaxfn function behind ``fn`` (itself, or a ``jaxfn.Function``'s ``.apply``), if any."""
    if isinstance(fn, AutogradFunction):
        return fn
    owner = getattr(fn, "__self__", None)
    return (
        owner._jaxfn
        if isinstance(owner, type) and isinstance(getattr(owner, "_jaxfn", None), AutogradFunction)
        else None
    )


def _positional_names(fn: Callable[..., Any], count: int) -> list[str]:
    jaxfn_function = _jaxfn_function(fn)
    try:
        if jaxfn_function is None:
            parameters = list(inspect.signature(fn).parameters.values())
        else:
            parameters = list(jaxfn_function._definition.signature.parameters.values())[1:]  # after ctx
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:count]
