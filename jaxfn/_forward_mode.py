"""``forward_mode=True``: one ``jax.custom_jvp`` whose tangent rule is the transpose of backward.

A correct backward is linear in its cotangents, so its transpose is the forward-mode
derivative. jaxfn first proves that backward is linear (``_linearity``: an affine or non-linear
backward is refused, never transposed), then transposes it with JAX's reverse mode: for a
linear function, the VJP at any point is its transpose, and reverse mode knows how to go through
other custom functions (``jax.custom_vjp``, other jaxfn functions) that backward may call.
JAX's reverse mode transposes the tangent rule back, which gives exactly the user's backward:
``jax.grad`` keeps the user's gradients (a straight-through estimator stays straight-through).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from . import _arguments, _linearity, _rule
from ._arguments import DIFF, Arguments, dtype_kind
from ._context import Context
from ._errors import AutogradFunctionTypeError, error
from ._outputs import Outputs

# What JAX raises when a function needs concrete values of a traced array.
_NEEDS_VALUES = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
    jax.errors.NonConcreteBooleanIndexError,
)

NOT_LINEAR = (
    "it has forward_mode=True, so its backward must be linear in grad_output (its transpose is the "
    "forward-mode derivative), but {what}. Backwards that ignore, square, clip or shift grad_output "
    "(gradient clipping, say) cannot serve forward mode: build such a function without forward_mode=True"
)


def build(definition: _rule.Definition, args: Arguments) -> Callable[..., Any]:
    """``call(*arrays)``: the function's full output, through a ``jax.custom_jvp`` over the arrays."""
    infos: list[Outputs] = []

    @jax.custom_jvp
    def primal(*arrays: Any) -> Any:
        out, info = _rule.primal(definition, args, arrays)
        infos.append(info)
        return tuple(out)

    def jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        perturbed = [not isinstance(t, SymbolicZero) for t in tangents]
        ctx, out, info = _rule.run_forward(definition, args, primals, perturbed)
        infos.append(info)
        wanted = [i for i, flag in enumerate(perturbed) if flag]
        outs = [i for i, flag in enumerate(info.differentiable) if flag]
        pullback = _pullback(definition, args, ctx, info, primals, perturbed, wanted, outs)
        examples = [_rule.zeros_like(out[i]) for i in outs]
        try:
            closed = jax.make_jaxpr(pullback)(*examples)
        except _NEEDS_VALUES as err:
            what = (
                f"it needs the concrete value of grad_output ({type(err).__name__}), which a linear function never does"
            )
            raise error(AutogradFunctionTypeError, definition.name, NOT_LINEAR.format(what=what)) from None
        try:
            _linearity.check(closed, [args.paths[args.array_positions[i]] for i in wanted])
        except _linearity.NotLinear as err:
            raise error(AutogradFunctionTypeError, definition.name, NOT_LINEAR.format(what=err)) from None
        try:
            _, transpose = jax.vjp(_linearity.transposable(closed), *examples)  # linear: its VJP is its transpose
            out_tangents = transpose([tangents[i] for i in wanted])
        except Exception as err:  # noqa: BLE001 - any failure to transpose is reported in jaxfn's words
            raise error(
                AutogradFunctionTypeError, definition.name, NOT_LINEAR.format(what=f"transposing it failed: {err}")
            ) from err
        return tuple(out), tuple(_all_tangents(info, outs, out_tangents))

    primal.defjvp(jvp, symbolic_zeros=True)

    def call(*arrays: Any) -> Any:
        out = primal(*arrays)
        return infos[-1].rebuild(out)

    return call


def _pullback(definition, args, ctx, info, primals, perturbed, wanted, outs) -> Callable[..., list[Any]]:
    """Backward as a function of the differentiable outputs' cotangents only."""
    saved, remainder = ctx.to_residuals()
    avals = _arguments.shape_dtypes(primals)

    def pullback(*cotangents: Any) -> list[Any]:
        per_output: list[Any] = [SymbolicZero(None)] * len(info.avals)  # type: ignore[arg-type]
        for i, ct in zip(outs, cotangents):
            per_output[i] = ct
        backward_ctx = Context.from_residuals(saved, remainder)
        cts = _rule.run_backward(definition, args, backward_ctx, info, per_output, avals, perturbed)
        return [_rule.zeros_like(primals[i]) if cts[i] is None else cts[i] for i in wanted]

    return pullback


def _all_tangents(info: Outputs, outs: list[int], out_tangents: Any) -> list[Any]:
    """One tangent per array output: the transposed ones, zeros (float0 for integers) elsewhere."""
    by_output = dict(zip(outs, out_tangents))
    tangents = []
    for i, aval in enumerate(info.avals):
        if i in by_output:
            tangents.append(by_output[i])
        elif dtype_kind(aval.dtype) == DIFF:
            tangents.append(jnp.zeros(aval.shape, aval.dtype))
        else:
            tangents.append(np.zeros(aval.shape, jax.dtypes.float0))
    return tangents
