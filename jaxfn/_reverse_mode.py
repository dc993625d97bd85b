"""The default builder: one ``jax.custom_vjp`` for one call's static structure.

JAX may trace ``fwd`` of one call several times (once per set of differentiated arguments)
before an earlier trace's ``bwd`` runs, and it keeps only the latest trace's residual tree
structure. So each trace's static state goes into ``traces``, and the trace's index travels as
the shape of a zero-size residual, ``(0, index)``: shapes are static, so each ``bwd`` reads its
own trace's state. Under ``jit`` the zero-size residual is dead code and is removed.

Higher order: when ``fwd`` runs on another trace's tracers, an outer differentiation may later
differentiate its output (``jax.grad`` of ``jax.grad``, also through a ``jit`` between them). The
output then goes through ``tied(arrays, out)``: the same rule over one more input, ``out``
itself, whose primal is ``out`` (nothing is traced again) and whose cotangent is zero, so the
outer derivative of the output is backward's, as PyTorch gives, and not that of forward's
operations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.core import Tracer
from jax.custom_derivatives import CustomVJPPrimal

from . import _arguments, _rule, _saves
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
            out = tied(tuple(arrays), tuple(out))  # an outer differentiation goes through backward too
        return tuple(out), (saved, token)

    def bwd(residuals: Any, cotangents: Any) -> tuple[Any, ...]:
        saved, token = residuals
        remainder, info, avals, perturbed = traces[token.shape[1]]
        ctx = Context.from_residuals(saved, remainder)
        return tuple(_rule.run_backward(definition, args, ctx, info, list(cotangents), avals, perturbed))

    primal.defvjp(fwd, bwd, symbolic_zeros=True)

    @jax.custom_vjp
    def tied(arrays: tuple[Any, ...], out: tuple[Any, ...]) -> tuple[Any, ...]:
        return out

    def tied_fwd(arrays: tuple[CustomVJPPrimal, ...], out: tuple[CustomVJPPrimal, ...]) -> tuple[Any, Any]:
        return fwd(*arrays)

    def tied_bwd(residuals: Any, cotangents: Any) -> tuple[Any, Any]:
        return bwd(residuals, cotangents), None  # out's own dependence on the inputs is forward's: cut

    tied.defvjp(tied_fwd, tied_bwd, symbolic_zeros=True)

    def call(*arrays: Any) -> Any:
        out = primal(*arrays)
        return infos[-1].rebuild(out)

    return call
