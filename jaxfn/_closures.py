"""SPEC section 15 in one place: what a call's functions close over, made pytrees of what they
hold, so that the values being differentiated there get their gradients.

Two cases, one entry (``of``). A function passed as an argument that holds traced values becomes
a ``_tracers.Closure``, a callable pytree whose leaves are those values; backward's gradient for
the argument is theirs. A value forward or backward (plain functions) closes over that holds
values being differentiated becomes a parameter after forward's own, named as the code names it,
so ``ctx.needs_input_grad.<name>`` asks for it and backward returns its gradient by that name. A
differentiated value held any other way is refused, in jaxfn's words.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import jax

from . import _arguments, _context, _jax_private, _rule, _tracers
from ._errors import AutogradFunctionTypeError, error

CLOSURE_HELP = (
    "forward or backward (or a value passed to it as an argument) reads a value that JAX is tracing from "
    "outside its arguments (it closes over a value being differentiated, or keeps one from another trace), "
    "but a custom rule can only give gradients for its own parameters, so that gradient would be lost; pass "
    "the value to the function as an argument instead (a function passed as an argument may close over it: "
    "its closed-over values get gradients, from backward's gradient for that argument)"
)


def of(
    definition: _rule.Definition,
    arguments: _arguments.Arguments,
    user: tuple[Any, ...],
    parameters: bool,
) -> tuple[_rule.Definition, _arguments.Arguments]:
    """One traced call's definition and arguments with what its functions close over made
    parameters. ``user``: the user's forward and backward as given, then their jvp and vmap rules
    (or None); ``parameters``: whether what forward and backward close over may become parameters
    (not for a function with a jvp or vmap rule, setup_context or host code: there it is refused)."""
    if parameters:
        definition, arguments = _closed_over(definition, arguments, user)
    arguments = _in_arguments(definition.name, arguments)
    _refuse_hidden(definition.name, arguments, user)
    return definition, arguments


def _in_arguments(name: str, arguments: _arguments.Arguments) -> _arguments.Arguments:
    """The arguments with each function that holds traced values made a ``_tracers.Closure``
    (unchanged if none: a function holding nothing traced is handed to forward as it is, SPEC
    section 2). Every traced value is a leaf, not only those being differentiated (a value ``jit``
    traces, a loop's index, a key): then no value of another trace reaches the rule's own traces."""
    closures = {}
    for i, value in enumerate(arguments.statics):  # None at an array leaf
        if callable(value):
            held = _tracers.tracers_in(value)
            if held:
                closures[i] = _tracers.Closure.holding(value, held, name, arguments.paths[i])
    return arguments.replacing(closures) if closures else arguments


VMAP_RULE_HELP = (
    "it has a vmap rule, so it runs as one JAX primitive, whose forward, backward and rules can read only the "
    "function's arguments, but one of them reads a value that JAX is tracing (under jax.jit, jax.vmap, lax.scan or "
    "a differentiation) from outside its arguments; pass that value to the function as an argument (the vmap rule "
    "then gets its batch dimension in in_dims, and backward returns its gradient)"
)


def _refuse_hidden(name: str, arguments: _arguments.Arguments, user: tuple[Any, ...]) -> None:
    """A value being differentiated that the user's functions, or the call's static values, still
    hold (not the call's own arrays, which now include what was made parameters and closures)
    would lose its gradient: refused. With a vmap rule (``user[3]``), any traced value held is
    refused: the primitive would carry it out of its trace."""
    held = [f for f in user if not _tracers.holds_nothing(f)]
    if not held and all(arguments.is_array):  # the common call: nothing to look inside
        return
    primitive = user[3] is not None
    if _tracers.holds_tracer((held, arguments.statics), _outside(arguments, every_trace=primitive)):
        raise error(AutogradFunctionTypeError, name, VMAP_RULE_HELP if primitive else CLOSURE_HELP)


def _outside(arguments: _arguments.Arguments, every_trace: bool = False) -> Callable[[Any], bool]:
    """Whether a tracer is a value being differentiated (any traced value, ``every_trace``) other
    than the call's own arrays (which a function may hold: a method of a module holding its own
    parameters, a closure reading an argument)."""
    own = {id(a) for a in arguments.arrays}
    if every_trace:
        return lambda tracer: id(tracer) not in own
    return lambda tracer: _jax_private.is_differentiating_tracer(tracer) and id(tracer) not in own


def _closed_over(
    definition: _rule.Definition, arguments: _arguments.Arguments, user: tuple[Any, ...]
) -> tuple[_rule.Definition, _arguments.Arguments]:
    """The values forward and backward close over that hold values being differentiated, as
    parameters: for this call, forward and backward are copies that read the call's values there
    (``_tracers.with_cells``); forward keeps them on ctx for backward. Unchanged (so refused
    later) where that can't be done."""
    unchanged = (definition, arguments)
    forward, backward = _undecorated(user[0]), _undecorated(user[1])
    if forward is None or backward is None:  # a decorator jaxfn can't see through: refused
        return unchanged
    wanted = _jax_private.is_differentiating_tracer  # a value only jit or vmap traces is read as before
    closed = _tracers.cells_holding(forward, wanted)
    for name, value in _tracers.cells_holding(backward, wanted).items():
        if closed.setdefault(name, value) is not value:
            return unchanged  # two different values under one name: refused
    if not closed:
        return unchanged
    outside = _outside(arguments)
    clash = [name for name in closed if name in arguments.names and _tracers.holds_tracer(closed[name], outside)]
    if clash:  # the value can't be named as a parameter: said, not the generic refusal
        raise error(
            AutogradFunctionTypeError,
            definition.name,
            f"forward or backward closes over '{clash[0]}', which holds a value being differentiated, and "
            f"'{clash[0]}' is also a parameter of forward, so its gradient can't be named; rename the "
            "closed-over variable, or pass the value as an argument",
        )
    if set(closed) & set(arguments.names):
        return unchanged
    for name, value in closed.items():  # an array or a pytree (an Equinox module) is a parameter as it is
        if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(value)) and not isinstance(value, jax.Array):
            if not callable(value):  # an object JAX can't see into: refused
                return unchanged
            closed[name] = _tracers.Closure.holding(value, _tracers.tracers_in(value), definition.name, name)

    def forward_reading(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        read = {name: kwargs.pop(name) for name in closed}
        setattr(ctx, _context.CLOSED_OVER, read)  # crosses to backward as saved values do
        return _tracers.with_cells(forward, read)(ctx, *args, **kwargs)

    def backward_reading(ctx: Any, *grad_outputs: Any) -> Any:
        return _tracers.with_cells(backward, getattr(ctx, _context.CLOSED_OVER))(ctx, *grad_outputs)

    functools.update_wrapper(forward_reading, forward)
    functools.update_wrapper(backward_reading, user[1])  # the backward as given: once_differentiable's mark too
    forward_reading.__signature__ = _with_keyword_only(inspect.signature(forward), closed)  # type: ignore[attr-defined]
    return _rule.Definition.of(definition.name, forward_reading, backward_reading), arguments.replacing({}, closed)


def _undecorated(function: Any) -> Any:
    """The plain function under ``jaxfn.once_differentiable`` (whose mark the rule reads); the
    function itself if undecorated; None under another decorator (whose code jaxfn can't copy)."""
    if getattr(function, _rule.ONCE_DIFFERENTIABLE, False):
        function = getattr(function, "__wrapped__", function)
    return None if hasattr(function, "__wrapped__") else function


def _with_keyword_only(signature: inspect.Signature, names: Iterable[str]) -> inspect.Signature:
    """``signature`` with keyword-only parameters ``names`` added (after its own keyword-only
    parameters, before a ``**kwargs``: a signature's parameters are in the order of their kinds,
    and a stable sort keeps it)."""
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in names]
    return signature.replace(parameters=sorted([*signature.parameters.values(), *added], key=lambda p: p.kind))
