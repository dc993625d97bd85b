"""``jaxfn.gradcheck``: does a backward agree with central finite differences, and where not."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path, tree_unflatten

from ._arguments import DIFF, leaf_kind
from ._errors import GradcheckError


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

    Every floating-point leaf of every argument is checked, through every floating output, in
    float64 (x64 is switched on for the check only and restored after; float32 inputs are
    upcast). Static and integer arguments are passed through and skipped.

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
        the analytical and numerical values, and the tolerance.

    >>> import jax.numpy as jnp, jaxfn
    >>> square = jaxfn.autograd_function(lambda ctx, x: (ctx.save_for_backward(x), x**2)[1],
    ...                                  lambda ctx, g: g * 2 * ctx.saved_tensors[0])
    >>> jaxfn.gradcheck(square, jnp.array([1.0, 2.0]))
    True
    """
    if order not in (1, 2):
        raise ValueError(f"jaxfn.gradcheck: order must be 1 or 2, got {order!r}.")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        return _gradcheck(fn, args, kwargs, eps, atol, rtol, order)
    except GradcheckError:
        if raise_exception:
            raise
        return False
    finally:
        jax.config.update("jax_enable_x64", previous)


def _gradcheck(fn, args, kwargs, eps, atol, rtol, order) -> bool:
    with_paths, treedef = tree_flatten_with_path((args, kwargs))
    leaves = [_upcast(leaf) for _, leaf in with_paths]
    checked = [i for i, leaf in enumerate(leaves) if leaf_kind(leaf) == DIFF and not jnp.iscomplexobj(leaf)]
    labels = _labels(fn, args, [path for path, _ in with_paths])
    rng = np.random.default_rng(0)

    def call(diff: list[Any]) -> Any:
        full = list(leaves)
        for i, value in zip(checked, diff):
            full[i] = value
        call_args, call_kwargs = tree_unflatten(treedef, full)
        return fn(*call_args, **call_kwargs)

    x0 = [leaves[i] for i in checked]
    cotangent = _random_like(rng, jax.eval_shape(call, x0))
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
        direction = jnp.asarray(rng.standard_normal(np.shape(leaf)))
        numerical = float(_central(scalar, x0, k, direction, eps))
        expected = float(jnp.vdot(analytical[k], direction))
        if abs(expected - numerical) > atol + rtol * abs(numerical):
            _locate(scalar, x0, k, analytical[k], label, eps, atol, rtol, what)


def _locate(scalar, x0, k, analytical, label, eps, atol, rtol, what) -> None:
    """Finite differences for every element of leaf ``k``; raise naming the worst one."""
    size = int(np.size(x0[k]))
    basis = jnp.eye(size, dtype=x0[k].dtype).reshape((size, *np.shape(x0[k])))
    numerical = jax.vmap(lambda d: _central(scalar, x0, k, d, eps))(basis).reshape(np.shape(x0[k]))
    analytical, numerical = np.asarray(analytical), np.asarray(numerical)
    excess = np.abs(analytical - numerical) - (atol + rtol * np.abs(numerical))
    worst = np.unravel_index(int(np.argmax(excess)), np.shape(excess)) if np.ndim(excess) else ()
    index = tuple(int(i) for i in worst)
    raise GradcheckError(
        f"jaxfn.gradcheck: the gradient{what} for '{label}' disagrees with finite differences; "
        f"worst at index {index}: analytical {analytical[worst]:.6g}, numerical {numerical[worst]:.6g} "
        f"(|difference| {abs(analytical[worst] - numerical[worst]):.3g} > atol {atol:g} + rtol {rtol:g} * "
        f"|numerical|); {int(np.sum(excess > 0))} of {size} elements disagree."
    )


def _central(scalar, x0, k, direction, eps):
    """The central difference of ``scalar`` at ``x0`` along ``direction`` in leaf ``k``."""

    def shifted(step):
        return [leaf + step * direction if i == k else leaf for i, leaf in enumerate(x0)]

    return (scalar(shifted(eps)) - scalar(shifted(-eps))) / (2 * eps)


def _upcast(leaf: Any) -> Any:
    if leaf_kind(leaf) == DIFF:
        return jnp.asarray(leaf, jnp.complex128 if jnp.iscomplexobj(leaf) else jnp.float64)
    return leaf


def _random_like(rng: np.random.Generator, tree: Any) -> Any:
    def draw(leaf):
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            return None
        return jnp.asarray(rng.standard_normal(leaf.shape), leaf.dtype)

    return jax.tree_util.tree_map(draw, tree)


def _vdot(weights: Any, values: Any) -> Any:
    """The sum over matching leaves of <weight, value>, skipping non-floating outputs."""
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


def _positional_names(fn: Callable[..., Any], count: int) -> list[str]:
    from ._function import AutogradFunction

    target = fn
    if isinstance(fn, AutogradFunction):
        target = fn.forward
    elif getattr(getattr(fn, "__self__", None), "_jaxfn", None) is not None:  # jaxfn.Function.apply
        target = fn.__self__._jaxfn.forward
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return []
    if target is not fn:
        parameters = parameters[1:]  # the context
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:count]
