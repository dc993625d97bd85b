"""``forward_mode=True``: one ``jax.custom_jvp`` whose tangent rule is the transpose of backward.

A correct backward is linear in its cotangents, so ``jax.linear_transpose`` of it is the
forward-mode derivative. JAX's reverse mode transposes that tangent rule back, which gives
exactly the user's backward: ``jax.grad`` keeps the user's gradients (a straight-through
estimator stays straight-through), and ``jax.jvp``, ``jax.jacfwd`` and ``jax.linearize`` work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from . import _arguments, _gradients, _outputs
from ._context import Context
from ._errors import AutogradFunctionTypeError, prefix

_NOT_LINEAR = (
    "{name} has forward_mode=True, so its backward must be linear in grad_output (its transpose "
    "is the forward-mode derivative), but {what}. Backwards that ignore, square or clip "
    "grad_output (gradient clipping, say) cannot serve forward mode: build such a function "
    "without forward_mode=True."
)


def build(fn: Any, args: _arguments.Arguments) -> Callable[..., Any]:
    """The ``jax.custom_jvp`` for one call of ``fn`` (an AutogradFunction)."""

    @jax.custom_jvp
    def primal(*arrays: Any) -> Any:
        return fn._primal(args, arrays)

    def jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        perturbed = [not isinstance(t, SymbolicZero) for t in tangents]
        ctx, out, info = fn._run_forward(args, primals, perturbed)
        avals = _arguments.shape_dtypes(primals)
        wanted = [i for i, flag in enumerate(perturbed) if flag]
        outs = [i for i, flag in enumerate(info.differentiable) if flag]
        pullback = _pullback(fn, args, ctx, info, avals, perturbed, wanted, outs)
        examples = [jnp.zeros(info.avals[i].shape, info.avals[i].dtype) for i in outs]
        _check_linear(fn.name, pullback, examples)
        try:
            out_tangents = jax.linear_transpose(pullback, *examples)([tangents[i] for i in wanted])
        except NotImplementedError as err:
            raise AutogradFunctionTypeError(
                _NOT_LINEAR.format(name=prefix(fn.name), what=f"transposing it failed: {err}")
            ) from err
        return out, jax.tree_util.tree_unflatten(info.treedef, _all_tangents(info, outs, out_tangents))

    primal.defjvp(jvp, symbolic_zeros=True)
    return primal


def _pullback(fn, args, ctx, info, avals, perturbed, wanted, outs) -> Callable[..., list[Any]]:
    """Backward as a function of the differentiable outputs' cotangents only."""
    saved, static = ctx.to_residuals()

    def pullback(*cotangents: Any) -> list[Any]:
        leaves: list[Any] = [SymbolicZero(None)] * len(info.avals)  # type: ignore[arg-type]
        for i, ct in zip(outs, cotangents):
            leaves[i] = ct
        backward_ctx = Context.from_residuals(saved, static)
        grad_outputs = _outputs.grad_outputs(
            info, jax.tree_util.tree_unflatten(info.treedef, leaves), backward_ctx.materialize_grads
        )
        grads = fn._run_backward(backward_ctx, grad_outputs)
        cts = _gradients.to_cotangents(fn.name, args, grads, avals, perturbed)
        return [jnp.zeros(avals[i].shape, avals[i].dtype) if cts[i] is None else cts[i] for i in wanted]

    return pullback


def _check_linear(name: str, pullback: Callable[..., list[Any]], examples: list[Any]) -> None:
    """Refuse a backward with an output that does not depend on grad_output and is not zero.

    ``jax.linear_transpose`` would silently read such an output as zero.
    """
    closed = jax.make_jaxpr(pullback)(*examples)
    jaxpr = closed.jaxpr
    dependent = set(map(id, jaxpr.invars))
    produced_by: dict[int, Any] = {}
    for eqn in jaxpr.eqns:
        if any(id(v) in dependent for v in eqn.invars if not _is_literal(v)):
            dependent.update(map(id, eqn.outvars))
        for v in eqn.outvars:
            produced_by[id(v)] = eqn
    for position, var in enumerate(jaxpr.outvars):
        if id(var) not in dependent and not _is_zero(var, produced_by):
            raise AutogradFunctionTypeError(
                _NOT_LINEAR.format(
                    name=prefix(name),
                    what=f"its gradient number {position} (of the differentiated inputs) does not depend on "
                    "grad_output and is not zero",
                )
            )


def _is_literal(var: Any) -> bool:
    return type(var).__name__ == "Literal"


def _is_zero(var: Any, produced_by: dict[int, Any]) -> bool:
    """Whether ``var`` is a literal zero, possibly broadcast, reshaped or converted."""
    if _is_literal(var):
        return bool(np.all(np.asarray(var.val) == 0))
    eqn = produced_by.get(id(var))
    if eqn is None or eqn.primitive.name not in ("broadcast_in_dim", "convert_element_type", "reshape", "copy"):
        return False
    return _is_zero(eqn.invars[0], produced_by)


def _all_tangents(info: _outputs.Outputs, outs: list[int], out_tangents: tuple[Any, ...]) -> list[Any]:
    """One tangent per output leaf: the transposed ones, zeros (float0 for integers) elsewhere."""
    tangents = []
    by_leaf = dict(zip(outs, out_tangents))
    for i, aval in enumerate(info.avals):
        if i in by_leaf:
            tangents.append(by_leaf[i])
        elif jnp.issubdtype(aval.dtype, jnp.inexact):
            tangents.append(jnp.zeros(aval.shape, aval.dtype))
        else:
            tangents.append(np.zeros(aval.shape, jax.dtypes.float0))
    return tangents
