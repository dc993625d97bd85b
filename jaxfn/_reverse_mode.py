"""The default builder: one ``jax.custom_vjp`` for one call's static structure.

Reverse mode is the rule's own (``_rule.Rule``, which ``_primitive`` uses too): each trace's
static state (the context's remainder, the output's description) is kept in ``_rule.Traces`` and
found again by ``bwd`` through a zero-size residual.

Higher order: when ``fwd`` runs on another trace's tracers, an outer differentiation may later
differentiate its output (``jax.grad`` of ``jax.grad``, also through a ``jit`` between them). The
output then goes through ``_tie.tie``, whose derivative is this same custom rule's, so the outer
derivative of the output is backward's, as PyTorch gives, and not that of forward's operations.
With ``jax_custom_vjp3`` on, whose custom_vjp refuses the ``jax.jvp`` the tie's rule makes, the
tie is a second ``jax.custom_vjp`` instead (the same rule over one more input, ``out``, whose
primal is the identity and whose cotangent is zero), which costs a trace of the identity.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
from jax.custom_derivatives import CustomVJPPrimal

from . import _jax_private, _rule, _tie
from ._arguments import Arguments
from ._outputs import Described

# JAX's custom_vjp reads the signature of its three functions (inspect.signature) on every call,
# to name arguments in its messages. Each function's own signature, read once per ``def`` (its
# code object; this module's annotations are strings, the same for every closure of a def) and set
# as ``__signature__``, makes that a look-up.
_SIGNATURES: dict[Any, inspect.Signature] = {}


def _signed(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, with its own signature kept on it (read again where it has defaults, which
    differ between closures of one def)."""
    if function.__defaults__ is None and function.__kwdefaults__ is None:  # type: ignore[attr-defined]
        signature = _SIGNATURES.get(function.__code__)
        if signature is None:
            signature = _SIGNATURES[function.__code__] = inspect.signature(function)
    else:
        signature = inspect.signature(function)
    function.__signature__ = signature  # type: ignore[attr-defined]
    return function


def build(definition: _rule.Definition, args: Arguments) -> Callable[..., Any]:
    """``call(*arrays)``: the function's full output, through a ``jax.custom_vjp`` over the arrays.

    ``args`` is the call without its arrays (``Arguments.structure``): the rule keeps no
    reference to a call's arrays.
    """
    rule = _rule.Rule(definition, args)

    @jax.custom_vjp
    @_signed
    def primal(*arrays: Any) -> Any:
        return rule.primal(*arrays)

    def fwd(*primals: CustomVJPPrimal) -> tuple[Any, Any]:
        arrays = [p.value for p in primals]
        again = _tie.again_on(arrays_out, arrays)  # an outer differentiation goes through backward
        if again is not None and _jax_private.custom_vjp3():  # JAX's hijax custom_vjp refuses the tie's jvp
            # out's own derivative (forward's operations) is never used: stopped, so never traced
            again = lambda out: tied()(tuple(arrays), tuple(jax.lax.stop_gradient(o) for o in out))
        out, info, residuals = rule.forward(arrays, [p.perturbed for p in primals], again)  # its trace's token first
        return (tuple(out), Described(info)), residuals

    def bwd(residuals: Any, cotangents: Any) -> tuple[Any, ...]:
        return tuple(rule.backward(residuals, cotangents[0]))

    primal.defvjp(_signed(fwd), _signed(bwd), symbolic_zeros=True)

    def arrays_out(*arrays: Any) -> tuple[Any, ...]:
        return primal(*arrays)[0]

    def tied() -> Any:  # made when needed: only jax_custom_vjp3 needs it
        @jax.custom_vjp
        def tied(arrays: tuple[Any, ...], out: tuple[Any, ...]) -> tuple[Any, ...]:
            return out  # the tie as a custom_vjp: the same rule over one more input, out, whose cotangent is zero

        def tied_fwd(arrays: Any, out: Any) -> tuple[Any, Any]:
            (out, _), residuals = fwd(*arrays)
            return out, residuals

        tied.defvjp(tied_fwd, lambda res, cts: (bwd(res, (cts, None)), None), symbolic_zeros=True)
        return tied

    def call(*arrays: Any) -> Any:
        out, described = primal(*arrays)
        return described.info.rebuild(out)

    return call
