"""The default builder: one ``jax.custom_vjp`` for one call's static structure.

JAX may trace ``fwd`` of one call several times (once per set of differentiated arguments)
before an earlier trace's ``bwd`` runs, and it keeps only the latest trace's residual tree
structure. So each trace's static state goes into ``traces``, and the trace's index travels as
the shape of a zero-size residual, ``(0, index)``: shapes are static, so each ``bwd`` reads its
own trace's state. Under ``jit`` the zero-size residual is dead code and is removed.

Higher order: when ``fwd`` runs on another trace's tracers, an outer differentiation may later
differentiate its output (``jax.grad`` of ``jax.grad``, also through a ``jit`` between them). The
output then goes through ``_tie.tie``, whose derivative is this same custom rule's, so the outer
derivative of the output is backward's, as PyTorch gives, and not that of forward's operations.
With ``jax_custom_vjp3`` on, whose custom_vjp refuses the ``jax.jvp`` the tie's rule makes, the
tie is a second ``jax.custom_vjp`` instead (the same rule over one more input, ``out``, whose
primal is the identity and whose cotangent is zero), which costs a trace of the identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.core import Tracer
from jax.custom_derivatives import CustomVJPPrimal

from . import _arguments, _jax_private, _rule, _saves, _tie
from ._arguments import Arguments
from ._context import Context
from ._outputs import Outputs


def build(definition: _rule.Definition, args: Arguments) -> Callable[..., Any]:
    """``call(*arrays)``: the function's full output, through a ``jax.custom_vjp`` over the arrays.

    ``args`` is the call without its arrays (``Arguments.structure``): the rule keeps no
    reference to a call's arrays.
    """
    traces: list[tuple[Any, ...]] = []
    infos: list[Outputs] = []  # the output's description, from whichever trace ran last

    @jax.custom_vjp
    def primal(*arrays: Any) -> Any:
        out, info = _rule.primal(definition, args, arrays)
        infos.append(info)
        return tuple(out)

    def fwd(*primals: CustomVJPPrimal) -> tuple[Any, Any]:
        arrays = [p.value for p in primals]
        perturbed = [p.perturbed for p in primals]
        ctx, out, info = _rule.run_forward(definition, args, arrays, perturbed)
        infos.append(info)
        saved, remainder = ctx.to_residuals()
        saved = _saves.named(definition.name, saved, remainder, arrays)
        traces.append((remainder, info, _arguments.shape_dtypes(arrays), perturbed))
        token = np.zeros((0, len(traces) - 1), np.uint8)  # before the call below traces its own fwd
        if any(isinstance(a, Tracer) for a in arrays):
            if _jax_private.custom_vjp3():  # JAX's hijax custom_vjp refuses the jvp that the tie needs
                out = tied(tuple(arrays), tuple(out))
            else:
                out = _tie.tie(primal, tuple(arrays), tuple(out))  # an outer differentiation goes through backward
        return tuple(out), (saved, token)

    def bwd(residuals: Any, cotangents: Any) -> tuple[Any, ...]:
        saved, token = residuals
        remainder, info, avals, perturbed = traces[token.shape[1]]
        ctx = Context.from_residuals(saved, remainder)
        return tuple(_rule.run_backward(definition, args, ctx, info, list(cotangents), avals, perturbed))

    primal.defvjp(fwd, bwd, symbolic_zeros=True)

    @jax.custom_vjp
    def tied(arrays: tuple[Any, ...], out: tuple[Any, ...]) -> tuple[Any, ...]:
        return out  # the tie as a custom_vjp: the same rule over one more input, out, whose cotangent is zero

    tied.defvjp(lambda arrays, out: fwd(*arrays), lambda res, cts: (bwd(res, cts), None), symbolic_zeros=True)

    def call(*arrays: Any) -> Any:
        out = primal(*arrays)
        return infos[-1].rebuild(out)

    return call
