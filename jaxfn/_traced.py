"""A call under a JAX transformation: the check before a builder runs, the builder's custom rule,
and JAX's refusals said in jaxfn's words.

Every mode's builder (``_reverse_mode``, ``_forward_mode``, ``host=True``) is called here the same
way: ``build(definition, args)`` gives ``call(*arrays)``, the function's full output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from . import _arguments, _eager, _jax_private, _reverse_mode, _rule, _tracers
from ._errors import AutogradFunctionError, AutogradFunctionTypeError, error

_CLOSURE_HELP = (
    "forward or backward (or a value passed to it as an argument) reads a value that JAX is tracing from "
    "outside its arguments (it closes over a value being differentiated, or keeps one from another trace), "
    "but a custom rule can only give gradients for its own parameters, so that gradient would be lost; pass "
    "the value to the function as an argument instead (a function passed as an argument may close over it: "
    "its closed-over values get gradients, from backward's gradient for that argument)"
)


def call(
    build: Callable[..., Any],
    definition: _rule.Definition,
    arguments: _arguments.Arguments,
    user: tuple[Any, ...],
    forward_mode: bool = True,
    host: bool = False,
) -> Any:
    """One traced call through ``build``'s custom rule; ``user``: the user's functions (forward,
    backward), checked for differentiated values they hold; ``forward_mode``: whether the
    function has a forward-mode rule (else ``jax.jvp`` on it is refused here, in jaxfn's words,
    also where JAX would refuse only when a ``jit`` around it compiles); ``host``: whether its
    forward is host code (which forward mode's gate can't transpose)."""
    arguments = _closures(definition.name, arguments)
    statics = [v for v, array in zip(arguments.statics, arguments.is_array) if not array]
    held = [f for f in user if not _tracers.holds_nothing(f)]
    if held or statics:
        own = {id(a) for a in arguments.arrays}  # a method of a module holding its own parameters: fine

        def differentiated(tracer: Any) -> bool:
            return _jax_private.is_differentiating_tracer(tracer) and id(tracer) not in own

        if _tracers.holds_tracer((held, statics), differentiated):
            raise error(AutogradFunctionTypeError, definition.name, _CLOSURE_HELP)
    if not forward_mode and any(_jax_private.is_forward_mode_tracer(a) for a in arguments.arrays):
        raise error(AutogradFunctionTypeError, definition.name, _rule.FORWARD_MODE_HELP)
    if _rule.in_plain_forward():  # forward mode's gate transposes through this call's forward
        if host:  # runs as itself (on saved values only, it needs no transpose), noted for the message
            _rule.note_host_in_plain_forward(definition.name)
        else:
            out, info = _rule.primal(definition, arguments, arguments.arrays)
            return info.rebuild(out)
    rule = build(definition, arguments.structure())  # keeps no reference to the arrays
    arrays = _rule.vary_together(arguments, arguments.arrays)
    try:
        try:
            return rule(*arrays)
        except NotImplementedError as err:
            if not _jax_private.refused_in_eager_shard_map(err):
                raise
        # inside an un-jitted jax.shard_map: JAX takes the call under jit (Python outputs kept)
        return _eager.keeping_python_values(jax.jit(lambda *a: _eager.box_python_values(rule(*a))))(*arrays)
    except AutogradFunctionError:
        raise
    except Exception as err:  # noqa: BLE001 - JAX's own refusals, said in jaxfn's words
        explanation = _explain(err)
        if explanation is None:
            raise
        raise error(AutogradFunctionTypeError, definition.name, explanation) from err


def _closures(name: str, arguments: _arguments.Arguments) -> _arguments.Arguments:
    """The arguments with each function that holds traced values made a ``_tracers.Closure``, a
    callable pytree whose leaves are those values (SPEC section 15); unchanged if none (a function
    holding nothing traced is handed to forward as it is, section 2). Every traced value is a
    leaf, not only those being differentiated (a value ``jit`` traces, a loop's index, a key): then
    no value of another trace reaches the rule's own traces."""
    closures = {}
    for i, (kind, value) in enumerate(zip(arguments.kinds, arguments.statics)):
        if kind == _arguments.STATIC and callable(value):
            held = _tracers.tracers_in(value)
            if held:
                closures[i] = _tracers.Closure.holding(value, held, name, arguments.paths[i])
    return arguments.replacing(closures) if closures else arguments


def _explain(err: Exception) -> str | None:
    """jaxfn's words for a JAX refusal that a user of a jaxfn function can meet; None for others."""
    if _jax_private.refused_forward_mode(err):
        return _rule.FORWARD_MODE_HELP
    if _jax_private.refused_closure(err):
        return _CLOSURE_HELP
    if _jax_private.refused_fwd_output(err):
        return _reverse_mode.OUTPUT_DIFFERS
    return None
