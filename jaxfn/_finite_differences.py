"""Derivatives of host code that has none, by central differences (``backward="finite_differences"``).

A black box written as a host forward (a simulator, a SciPy routine) gets a backward and a jvp
rule made from forward itself; they are a rule like any user's (``_rule.Definition``), so the
host builder runs them through its own callbacks, probe and checks (``_host``, ``_primitive``):

* forward is wrapped to keep its arguments on ``ctx`` (``ctx.jaxfn_finite_differences``), so they
  cross to backward exactly, as any value a host forward saves does;
* backward, in one host call, runs forward at ``x + h`` and ``x - h`` for each element of each
  input JAX differentiates (``ctx.needs_input_grad``: the others cost nothing) and contracts the
  differences with ``grad_output``: 2n runs of forward for n elements;
* the jvp rule, in one host call, runs forward at ``x + s·t`` and ``x - s·t``: 2 runs per tangent;
* the step of an element ``x`` is ``cbrt(eps)·max(1, |x|)``, ``eps`` the larger machine epsilon of
  its dtype and of the floating outputs' (an output rounded coarser than the input, float16 from
  float32, rounds the differences at its own precision), which balances a central difference's
  truncation error (``h²``) against its rounding error (``eps/h``): both are about ``eps^(2/3)``,
  relative to the function's scale. Along a tangent ``t`` the step ``s`` is the largest that moves
  no element by more than its own step.

Each perturbed run of forward gets a fresh context (``_rule.forward_with_context``), as a call
does. Integer inputs are never perturbed; integer outputs carry no gradient, so their values at
the perturbed points are not read. Complex inputs and outputs are refused when a derivative is
asked for.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _outputs, _rule, _split
from ._arguments import DIFF, Arguments
from ._context import Context
from ._errors import AutogradFunctionTypeError, AutogradFunctionValueError, error

FINITE_DIFFERENCES = "finite_differences"
SAVED = "jaxfn_finite_differences"  # the ctx attribute holding forward's arguments for backward and jvp


def definition(
    name: str,
    backward: str,
    host: bool,
    forward: Callable[..., Any],
    setup_context: Callable[..., Any] | None,
    jvp: Callable[..., Any] | None,
    vmap: Callable[..., Any] | None,
) -> _rule.Definition:
    """The rule of ``autograd_function(forward, "finite_differences", host=True)``: ``forward``
    keeping its arguments, a backward and (unless the user gives one) a jvp by central differences."""
    _check_request(name, backward, host)

    def differences_backward(ctx: Context, *grad_outputs: Any) -> dict[str, Any]:
        return _backward(user, ctx, grad_outputs)

    def differences_jvp(ctx: Context, *tangents: Any) -> Any:
        return _jvp(user, ctx, tangents)

    user = _rule.Definition.of(name, forward, differences_backward, setup_context, jvp, vmap)

    def keeping_forward(ctx: Context, *given: Any, **named: Any) -> Any:
        out = user.forward(ctx, *given, **named)
        needs = tuple(ctx.needs_input_grad)
        if any(needs):  # a derivative is asked for: refuse what central differences can't give
            _check_real(name, user.bind(given, named), needs, out)
        setattr(ctx, SAVED, (given, named))
        return out

    keeping_forward.__signature__ = user.signature  # type: ignore[attr-defined]
    return dataclasses.replace(user, forward=keeping_forward, jvp=user.jvp or differences_jvp)


def _check_request(name: str, backward: str, host: bool) -> None:
    if backward != FINITE_DIFFERENCES:
        close = difflib.get_close_matches(backward, [FINITE_DIFFERENCES], n=1, cutoff=0.6)
        fix = (
            f"did you mean {FINITE_DIFFERENCES!r}?"
            if close
            else f"pass a backward function, or {FINITE_DIFFERENCES!r} (with host=True) to differentiate a host "
            "forward by central differences"
        )
        raise error(
            AutogradFunctionValueError,
            name,
            f"backward must be a function backward(ctx, *grad_outputs) or the string {FINITE_DIFFERENCES!r}, but "
            f"it is the string {backward!r}; {fix}",
        )
    if not host:
        raise error(
            AutogradFunctionTypeError,
            name,
            f"backward={FINITE_DIFFERENCES!r} differentiates a host forward (NumPy code, host=True) by running it "
            "at perturbed inputs, but host is False; pass host=True (host = True on a jaxfn.Function), or, for a "
            "forward written in JAX operations, differentiate the plain function with JAX's own autodiff",
        )


def _check_real(name: str, args: Arguments, needs: tuple[bool, ...], out: Any) -> None:
    """Central differences perturb real inputs and difference real outputs."""
    wanted = _wanted(args, needs)
    complex_inputs = [
        args.paths[p] for p, a, w in zip(args.array_positions, args.arrays, wanted) if w and np.iscomplexobj(a)
    ]
    if complex_inputs or any(np.iscomplexobj(leaf) for leaf in jax.tree_util.tree_leaves(out)):
        what = f"input '{complex_inputs[0]}'" if complex_inputs else "an output of forward"
        raise error(
            AutogradFunctionTypeError,
            name,
            f"backward={FINITE_DIFFERENCES!r} perturbs real floating-point inputs and differences real outputs, "
            f"but {what} is complex; pass and return the real and imaginary parts as separate real arrays",
        )


def _wanted(args: Arguments, needs: tuple[bool, ...]) -> list[bool]:
    """Per array: whether it is a float leaf of an argument JAX differentiates (``needs``: one
    flag per argument as ``ctx.needs_input_grad`` counts them, each ``*args`` element apart)."""
    per_leaf: list[bool] = []
    flags = iter(needs)
    for position, child in enumerate(args.treedef.children()):
        parts = child.children() if args.names[position] == args.varargs else [child]
        for part in parts:
            per_leaf += [next(flags)] * part.num_leaves
    return [per_leaf[p] and args.kinds[p] == DIFF for p in args.array_positions]


def _steps(x: np.ndarray, outputs_eps: float) -> np.ndarray:
    """Each element's step: ``cbrt(eps)·max(1, |x|)``, ``eps`` the larger of ``x``'s dtype's and
    the outputs' (``outputs_eps``) machine epsilon (in float64)."""
    eps = max(float(jnp.finfo(x.dtype).eps), outputs_eps)
    return np.cbrt(eps) * np.maximum(1.0, np.abs(x.astype(np.float64)))


def _eps(leaves: Any) -> float:
    """The largest machine epsilon among the floating arrays of ``leaves`` (0 if none)."""
    floats = [leaf.dtype for leaf in jax.tree_util.tree_leaves(leaves) if jnp.issubdtype(leaf.dtype, jnp.floating)]
    return max((float(jnp.finfo(dtype).eps) for dtype in floats), default=0.0)


def _run(user: _rule.Definition, args: Arguments, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], Any]:
    """Forward's output leaves at ``arrays`` (a fresh context, as for a call), and the output with
    its leaves as they are (its structure: None in it is a node with no leaf)."""
    _, out, _ = _rule.forward_with_context(user, args, arrays, [False] * len(arrays))
    return [np.array(leaf) for leaf in jax.tree_util.tree_leaves(out)], out  # copies: a forward may return its input


def _backward(user: _rule.Definition, ctx: Context, grad_outputs: tuple[Any, ...]) -> dict[str, Any]:
    """The gradient by central differences: per element of each differentiated input, forward at
    ``x ± h``, the difference contracted with the cotangents; by parameter name."""
    given, named = getattr(ctx, SAVED)
    args = user.bind(given, named)
    arrays = [np.asarray(a) for a in args.arrays]
    read = _Cotangents(user.name, grad_outputs)
    wanted = _wanted(args, tuple(ctx.needs_input_grad))
    outputs_eps = _eps([np.asarray(g) for g in jax.tree_util.tree_leaves(grad_outputs)])  # the outputs' dtypes
    grads = [_gradient(user, args, arrays, k, read, outputs_eps) if w else None for k, w in enumerate(wanted)]
    return dict(zip(args.names, args.parameters(grads)))


class _Cotangents:
    """backward's grad_outputs as one cotangent per output leaf (float64; None where none flows),
    read through the structure of the first perturbed run's output, as the rule reads a jvp's
    tangents (``_outputs.per_leaf``); every later run must return that structure."""

    def __init__(self, name: str, grad_outputs: tuple[Any, ...]):
        self.name, self.grad_outputs = name, grad_outputs
        self.treedef: Any = None
        self.leaves: list[Any] = []

    def __call__(self, out: Any) -> list[Any]:
        treedef = jax.tree_util.tree_structure(out)
        if self.treedef is None:
            _, structure = _split.split(out, lambda leaf: True)
            sequence = isinstance(out, (tuple, list))  # one grad_output per element
            leaves = _outputs.grad_output_leaves(self.name, structure, sequence, self.grad_outputs)
            self.treedef, self.leaves = treedef, [None if g is None else np.asarray(g, np.float64) for g in leaves]
        elif treedef != self.treedef:
            raise error(AutogradFunctionTypeError, self.name, _CHANGED)
        return self.leaves


def _gradient(
    user: _rule.Definition, args: Arguments, arrays: list[np.ndarray], k: int, read: _Cotangents, outputs_eps: float
) -> np.ndarray:
    """The gradient for input ``k``: 2 runs of forward per element."""
    x = arrays[k]
    steps = _steps(x, outputs_eps)
    ups = (x.astype(np.float64) + steps).astype(x.dtype)
    downs = (x.astype(np.float64) - steps).astype(x.dtype)
    widths = ups.astype(np.float64) - downs.astype(np.float64)  # the steps as the dtype holds them
    gradient = np.empty(x.size)
    for j in range(x.size):
        runs = []
        for moved in (ups, downs):
            perturbed = x.copy()
            perturbed.flat[j] = moved.flat[j]
            runs.append(_run(user, args, [perturbed if i == k else a for i, a in enumerate(arrays)]))
        (up, up_out), (down, down_out) = runs
        read(down_out)
        gradient[j] = _contract(user.name, read(up_out), up, down) / widths.flat[j]
    return gradient.reshape(x.shape).astype(x.dtype)


def _contract(name: str, cotangents: list[Any], up: list[np.ndarray], down: list[np.ndarray]) -> float:
    """``Σ cotangent · (up - down)`` over the real floating outputs (integer ones carry no gradient;
    ``cotangents``: float64, None where none flows)."""
    if len(up) != len(cotangents) or len(down) != len(cotangents):
        raise error(AutogradFunctionTypeError, name, _CHANGED)
    total = 0.0
    for ct, u, d in zip(cotangents, up, down):
        if ct is None or not jnp.issubdtype(u.dtype, jnp.floating):
            continue
        if u.shape != ct.shape or d.shape != ct.shape:
            raise error(AutogradFunctionTypeError, name, _CHANGED)
        total += float(np.vdot(ct, u.astype(np.float64, copy=False) - d.astype(np.float64, copy=False)))
    return total


_CHANGED = (
    f"backward={FINITE_DIFFERENCES!r} runs forward at perturbed inputs, and each run must return outputs of "
    "the structure and shapes of the call's, but a perturbed run returned others; make forward's output "
    "structure and shapes depend on its inputs' shapes only"
)


def _jvp(user: _rule.Definition, ctx: Context, tangents: tuple[Any, ...]) -> Any:
    """The tangent of forward's output along ``tangents`` (one per argument): forward at ``x ± s·t``."""
    given, named = getattr(ctx, SAVED)
    args = user.bind(given, named)
    arrays = [np.asarray(a) for a in args.arrays]
    slots = args.from_slots(tangents)  # a *args parameter with no element has no slot: ()
    by_leaf = args.treedef.flatten_up_to(tuple(slots.get(n, () if n == args.varargs else None) for n in args.names))
    moved = [
        (k, np.asarray(by_leaf[p], np.float64))
        for k, p in enumerate(args.array_positions)
        if args.kinds[p] == DIFF and by_leaf[p] is not None
    ]

    def runs(step: float) -> tuple[tuple[list[np.ndarray], Any], tuple[list[np.ndarray], Any]]:
        ups, downs = list(arrays), list(arrays)
        for k, t in moved:
            x = arrays[k].astype(np.float64)
            ups[k], downs[k] = (x + step * t).astype(arrays[k].dtype), (x - step * t).astype(arrays[k].dtype)
        return _run(user, args, ups), _run(user, args, downs)

    step = _step_along(arrays, moved, 0.0)
    (up, up_out), (down, _) = runs(step)
    coarser = _step_along(arrays, moved, _eps(up))
    if coarser > step:  # outputs rounded coarser than the inputs: again, at the step for their precision
        step = coarser
        (up, up_out), (down, _) = runs(step)
    if len(up) != len(down) or any(u.shape != d.shape for u, d in zip(up, down)):
        raise error(AutogradFunctionTypeError, user.name, _CHANGED)
    out = [
        ((u.astype(np.float64) - d.astype(np.float64)) / (2 * step)).astype(u.dtype)
        if jnp.issubdtype(u.dtype, jnp.floating)
        else None
        for u, d in zip(up, down)
    ]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(up_out), out)


def _step_along(arrays: list[np.ndarray], moved: list[tuple[int, np.ndarray]], outputs_eps: float) -> float:
    """The largest ``s`` with ``s·|t| <= cbrt(eps)·max(1, |x|)`` for every element (1 if ``t`` is 0):
    along a unit tangent, the step backward takes for that element."""
    steps = [_steps(arrays[k], outputs_eps) for k, _ in moved]
    ratios = [float(np.min(h[t != 0] / np.abs(t[t != 0]))) for h, (_, t) in zip(steps, moved) if np.any(t != 0)]
    return min(ratios) if ratios else 1.0
