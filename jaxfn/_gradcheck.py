"""``jaxfn.gradcheck``: does a backward agree with central finite differences, and where not."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path, tree_unflatten

from ._arguments import DIFF, dtype_kind, leaf_kind
from ._errors import GRADCHECK, AutogradFunctionValueError, GradcheckError, error
from ._function import AutogradFunction


def gradcheck(
    fn: Callable[..., Any],
    *args: Any,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    order: int = 1,
    raise_exception: bool = True,
    **kwargs: Any,
) -> bool:
    """Check the gradients of ``fn`` (its custom backward) against central finite differences.

    Every floating-point or complex leaf of every argument is checked (arrays of any precision,
    bfloat16 and float8 included, and Python and NumPy float scalars: they are the values to
    check), through every differentiable output (outputs marked non-differentiable, integer
    outputs and Python values are left out), in float64 / complex128: x64 is switched on with
    JAX's own context manager for the check only, so the setting in force before (global or a
    ``jax.enable_x64`` context) is back afterwards. Integer, boolean and other arguments are
    passed through unchanged. Complex leaves follow JAX's convention: the derivative along a
    direction ``d`` is ``Re(sum(grad * d))``, checked along real and imaginary directions. A
    call with nothing to check (no floating leaf, or no differentiable output) raises.

    Cost: the outputs are reduced to one scalar with a fixed random cotangent; then each
    differentiable leaf is checked along one random direction (two evaluations of ``fn`` and
    one gradient). Only a leaf that fails is located element by element, with one batched
    (``vmap``) set of finite differences over its elements. So a passing check of inputs with
    thousands of elements costs a handful of calls. ``order=2`` repeats the check for the
    derivative of backward (reverse over reverse), at about twice the cost.

    Args:
      fn: a jaxfn function, or any JAX-differentiable callable.
      *args, **kwargs: the arguments to call ``fn`` with.
      eps: the finite-difference step.
      atol, rtol: a gradient passes where ``|analytical - numerical| <= atol + rtol * |numerical|``.
      order: 1 checks backward; 2 also checks the derivative of backward.
      raise_exception: raise on failure (the default), or return False.

    Returns:
      True when every check passes (False on failure with ``raise_exception=False``).

    Raises:
      GradcheckError: naming the parameter (and pytree key path), the worst element's index,
        the analytical and numerical values, and the tolerance; or saying that nothing could
        be checked.

    >>> import jax.numpy as jnp, jaxfn
    >>> square = jaxfn.autograd_function(lambda ctx, x: (ctx.save_for_backward(x), x**2)[1],
    ...                                  lambda ctx, g: g * 2 * ctx.saved_tensors[0])
    >>> jaxfn.gradcheck(square, jnp.array([1.0, 2.0]))
    True
    """
    if order not in (1, 2):
        raise error(AutogradFunctionValueError, GRADCHECK, f"order must be 1 or 2, but got {order!r}")
    try:
        with _enable_x64(True):  # JAX's context manager: restores whatever setting (or context) was in force
            return _gradcheck(fn, args, kwargs, eps, atol, rtol, order)
    except GradcheckError:
        if raise_exception:
            raise
        return False


def _enable_x64(value: bool) -> Any:
    manager = getattr(jax, "enable_x64", None)  # public since jax 0.7; experimental before
    if manager is None:
        from jax.experimental import enable_x64 as manager
    return manager(value)


def _gradcheck(fn, args, kwargs, eps, atol, rtol, order) -> bool:
    with_paths, treedef = tree_flatten_with_path((args, kwargs))
    leaves = [_as_checked(leaf) for _, leaf in with_paths]
    checked = [i for i, leaf in enumerate(leaves) if leaf_kind(leaf) == DIFF]
    labels = _labels(fn, args, [path for path, _ in with_paths])
    if not checked:
        raise error(
            GradcheckError,
            GRADCHECK,
            "there is nothing to check: no argument has a floating-point or complex leaf (Python and NumPy "
            "floats count; integers, booleans and other values are passed through), so no gradient was compared",
        )
    rng = np.random.default_rng(0)

    def call(diff: list[Any]) -> Any:
        full = list(leaves)
        for i, value in zip(checked, diff):
            full[i] = value
        call_args, call_kwargs = tree_unflatten(treedef, full)
        return fn(*call_args, **call_kwargs)

    x0 = [leaves[i] for i in checked]
    cotangent = _random_like(rng, jax.eval_shape(call, x0), _differentiable_outputs(fn, args, kwargs, leaves, treedef))
    if not any(w is not None for w in jax.tree_util.tree_leaves(cotangent, is_leaf=lambda w: w is None)):
        raise error(
            GradcheckError,
            GRADCHECK,
            "there is nothing to check: no output is floating-point or complex and differentiable, so no "
            "gradient flows back",
        )
    scalar = lambda diff: _vdot(cotangent, call(diff))  # noqa: E731
    _check(scalar, x0, [labels[i] for i in checked], eps, atol, rtol, rng, "")
    if order == 2:
        u = _random_like(rng, x0)
        second = lambda diff: _vdot(u, jax.grad(scalar)(diff))  # noqa: E731
        _check(second, x0, [labels[i] for i in checked], eps, atol, rtol, rng, " of the backward (order=2)")
    return True


def _check(scalar, x0, labels, eps, atol, rtol, rng, what) -> None:
    """Each leaf along one random direction; a failing leaf located element by element."""
    analytical = jax.grad(scalar)(x0)
    for k, (label, leaf) in enumerate(zip(labels, x0)):
        direction = _random_like(rng, leaf)
        numerical = float(_central(scalar, x0, k, direction, eps))
        expected = float(jnp.sum(analytical[k] * direction).real)  # JAX's convention: Re(sum(g * d))
        if abs(expected - numerical) > atol + rtol * abs(numerical):
            _locate(scalar, x0, k, analytical[k], label, eps, atol, rtol, what)


def _locate(scalar, x0, k, analytical, label, eps, atol, rtol, what) -> None:
    """Finite differences for every element of leaf ``k``; raise naming the worst one."""
    size, shape = int(np.size(x0[k])), np.shape(x0[k])
    basis = jnp.eye(size, dtype=x0[k].dtype).reshape((size, *shape))
    along = jax.vmap(lambda d: _central(scalar, x0, k, d, eps))
    numerical = along(basis).reshape(shape)
    if jnp.iscomplexobj(x0[k]):  # Re(g * 1) and Re(g * i) give the real and (minus) imaginary parts
        numerical = numerical - 1j * along(1j * basis).reshape(shape)
    analytical, numerical = np.asarray(analytical), np.asarray(numerical)
    excess = np.abs(analytical - numerical) - (atol + rtol * np.abs(numerical))
    worst = np.unravel_index(int(np.argmax(excess)), np.shape(excess)) if np.ndim(excess) else ()
    index = tuple(int(i) for i in worst)
    raise error(
        GradcheckError,
        GRADCHECK,
        f"the gradient{what} for '{label}' disagrees with finite differences; worst at index {index}: "
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


def _differentiable_outputs(fn, args, kwargs, leaves, treedef) -> Any:
    """For a jaxfn function, which outputs carry a gradient (marked ones do not); else None."""
    target = _jaxfn_function(fn)
    if target is None:
        return None
    call_args, call_kwargs = tree_unflatten(treedef, leaves)
    return target.output_differentiable(*call_args, **call_kwargs)


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
