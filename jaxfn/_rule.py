"""The rule every builder shares: run forward with a fresh context; run backward and turn its
result into one cotangent per array input.

``Definition`` is a user's function pair as jaxfn reads it (names, signatures). The builders
(``_reverse_mode`` for ``jax.custom_vjp``, ``_forward_mode`` for ``jax.custom_jvp``) and the
eager path call only the functions here; none of them reaches back into ``AutogradFunction``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from . import _anomaly, _arguments, _context, _gradients, _jax_private, _outputs, _pytorch_names, _saves
from ._arguments import DIFF, Arguments
from ._context import Context
from ._errors import AutogradFunctionTypeError, error, type_name


@dataclasses.dataclass(frozen=True, eq=False)
class Definition:
    """A forward and a backward, with what jaxfn reads from their signatures once."""

    name: str
    forward: Callable[..., Any]
    backward: Callable[..., Any]
    signature: inspect.Signature
    positional: tuple[str, ...] | None  # forward's parameter names when all are plain positional
    varargs: str | None  # forward's *args parameter
    once_differentiable: bool  # backward may not be differentiated again
    jvp: Callable[..., Any] | None = None  # the user's jvp(ctx, *tangents), if any
    vmap: Callable[..., Any] | None = None  # the user's vmap(info, in_dims, *args), if any
    keyword_only: tuple[str, ...] = ()  # forward's keyword-only parameters
    closed_names: tuple[str, ...] = ()  # what forward and backward close over: needs_input_grad says False

    @classmethod
    def of(
        cls,
        name: str,
        forward: Callable[..., Any],
        backward: Callable[..., Any],
        setup_context: Callable[..., Any] | None = None,
        jvp: Callable[..., Any] | None = None,
        vmap: Callable[..., Any] | None = None,
    ) -> Definition:
        check_definition(name, "backward", backward)
        if jvp is not None:
            check_definition(name, "jvp", jvp)
        if vmap is not None:
            _check_callable(name, "vmap", vmap, " vmap(info, in_dims, *args)")
        users = (forward, backward, setup_context)  # what the user wrote: their free names, not a wrapper's
        if setup_context is None:
            check_definition(name, "forward", forward)
        else:
            forward = _with_setup_context(name, forward, setup_context)
        signature = inspect.signature(forward)
        return cls(
            name,
            forward,
            backward,
            signature,
            _arguments.positional_names(signature),
            _arguments.varargs_name(signature),
            bool(getattr(backward, ONCE_DIFFERENTIABLE, False)),
            jvp,
            vmap,
            keyword_only=tuple(n for n, p in signature.parameters.items() if p.kind is p.KEYWORD_ONLY),
            closed_names=_free_names(users, signature),
        )

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Arguments:
        """One call's arguments, bound to forward's parameters and split into leaves."""
        bound = _arguments.bind(self.name, self.signature, args, kwargs, self.positional)
        arguments = _arguments.split(bound, self.varargs)
        if not all(arguments.is_array):
            _arguments.refuse_foreign_arrays(self.name, arguments)
        return arguments


def _free_names(functions: tuple[Any, ...], signature: inspect.Signature) -> tuple[str, ...]:
    """The names the user's functions close over (not forward's parameters): a value forward or
    backward closes over is a parameter where it is differentiated (SPEC section 15), so
    ``ctx.needs_input_grad.<name>`` is False, not an error, where it is not."""
    codes = (getattr(inspect.unwrap(function), "__code__", None) for function in functions)
    names = dict.fromkeys(name for code in codes if code is not None for name in code.co_freevars)
    return tuple(n for n in names if n not in signature.parameters)


class Traces:
    """What each trace of a builder's fwd keeps for its bwd, found again through a token.

    JAX may trace one call's fwd several times (once per set of differentiated arguments) before
    an earlier trace's bwd runs, and keeps only the latest trace's residual tree structure. So a
    trace's static state goes here, and the trace's index travels as the shape of a zero-size
    residual, ``(0, index)``: shapes are static, so each bwd reads its own trace's state. The
    token is a NumPy constant (no equation in the program; under ``jit`` it is removed), and
    under ``vmap`` it gains leading axes, so the index is its last dimension.
    """

    def __init__(self) -> None:
        self._entries: list[Any] = []

    def token(self, entry: Any) -> np.ndarray:
        """Keep ``entry`` for this trace; the residual that finds it again."""
        self._entries.append(entry)
        return _token(len(self._entries) - 1)

    def __getitem__(self, token: Any) -> Any:
        return self._entries[token.shape[-1]]


@functools.cache
def _token(index: int) -> np.ndarray:
    """The zero-size array whose last dimension is ``index`` (read-only, so shared by every trace)."""
    token = np.zeros((0, index), np.uint8)
    token.flags.writeable = False
    return token


_PLAIN = threading.local()


@contextlib.contextmanager
def plain_forward() -> Iterator[None]:
    """Inside: jaxfn functions called under a trace run their forward's operations, with no
    custom rule, so that JAX transposes them as plain code (forward mode's gate transposes a
    backward through the jaxfn functions it calls, as their value is what backward computes).
    A host function can't run so: it runs as itself, and is noted (``hosts_in_plain_forward``) to
    name it if JAX then fails to transpose it."""
    previous = getattr(_PLAIN, "hosts", [])
    _PLAIN.hosts = []
    try:
        with _jax_private.plain_forward_context(True):  # a setting jax.jit keys its cache on
            yield
    finally:
        _PLAIN.hosts = previous


def note_host_in_plain_forward(name: str) -> None:
    """A host function ran inside ``plain_forward`` (on grad_output JAX can't transpose it)."""
    _PLAIN.hosts.append(name)


def hosts_in_plain_forward() -> list[str]:
    """The host functions that ran inside this thread's ``plain_forward``, in order."""
    return list(getattr(_PLAIN, "hosts", []))


HOST_IN_GATE = (
    "it is a host=True function (NumPy code) called on grad_output inside the backward of a forward_mode=True "
    "function, whose forward mode transposes that backward; JAX can't transpose host code, so that function "
    "can't derive forward mode from its backward (its reverse mode, jax.grad, works; a host call on saved values "
    "alone is fine); give the outer function its own jvp rule, or drop forward_mode=True there"
)


def vary_together(args: Arguments, arrays: tuple[Any, ...]) -> tuple[Any, ...]:
    """Inside ``jax.shard_map``: the differentiable arrays made to vary over every manual axis
    that any input varies over.

    A replicated (unvarying) parameter used with a per-device batch gets a per-device
    cotangent from backward, while JAX expects the cross-device sum for it. Marking the
    parameter varying (``lax.pcast(..., to="varying")``) before the custom rule sees it makes
    JAX's own transpose of that cast insert the sum, exactly as for plain JAX code.
    """
    every = frozenset().union(*map(varying_axes, arrays))
    if not every:
        return arrays
    # not what a function argument closes over: its program casts it where it read it (so jax.vjp
    # of the function in backward gives the cross-device sum itself)
    cast = [args.kinds[i] == DIFF and i not in args.in_closures for i in args.array_positions]
    return tuple(varying(a, every) if flag else a for a, flag in zip(arrays, cast))


def of_chosen(function: Callable[..., Any], arrays: Any, which: list[int]) -> Callable[..., Any]:
    """``function(*arrays)`` as a function of the arrays at positions ``which`` alone, the others fixed."""

    def on(*chosen: Any) -> Any:
        return function(*replaced(arrays, which, chosen))

    return on


def replaced(arrays: Any, which: list[int], values: Any) -> list[Any]:
    """``arrays`` as a list, with those at positions ``which`` set to ``values``."""
    merged = list(arrays)
    for i, value in zip(which, values):
        merged[i] = value
    return merged


def zeros_like(array: Any) -> Any:
    """Zeros of ``array``'s shape and dtype, varying over the same manual axes (in ``shard_map``)."""
    array = array if hasattr(array, "dtype") else jnp.asarray(array)
    return varying(jnp.zeros(jnp.shape(array), array.dtype), varying_axes(array))


def varying(array: Any, axes: frozenset[str]) -> Any:
    """``array`` made to vary over ``axes`` too (``lax.pcast``), where it does not already."""
    missing = axes - varying_axes(array)
    return jax.lax.pcast(array, tuple(sorted(missing)), to="varying") if missing else array


def varying_axes(array: Any) -> frozenset[str]:
    """The manual mesh axes ``array`` varies over (empty outside ``jax.shard_map``)."""
    aval = jax.typeof(array)
    manual = getattr(aval, "manual_axis_type", None)  # jax >= 0.10
    return frozenset(manual.varying) if manual is not None else frozenset(getattr(aval, "vma", ()))


class Rule:
    """One call structure's rule on flat arrays, as every builder uses it.

    ``primal(*arrays) -> (outputs, Described(info))``: forward alone, what a call that nothing
    differentiates needs. ``forward(arrays, perturbed, again=None, for_jvp=False) -> (outputs,
    info, residuals)`` runs the user's forward with a fresh context whose arrays cross as
    residuals (named, ``_saves``) and whose static part is kept per trace (``Traces``; ``again``:
    see ``outputs_again``; ``for_jvp``: the context a user's jvp reads crosses too, for
    ``jvp_context``); its output must be as the primal's last, or it is refused in jaxfn's words
    (JAX's custom rules would fail on it, or assert). ``backward(residuals, cotangents) -> one
    cotangent or None per array input`` runs the user's backward on the context rebuilt.
    """

    def __init__(self, definition: Definition, args: Arguments):
        self.definition, self.args = definition, args
        self._traces = Traces()
        self._primal_info: _outputs.Outputs | None = None  # the primal's last: only to check forward's against it

    def primal(self, *arrays: Any) -> tuple[tuple[Any, ...], _outputs.Described]:
        out, self._primal_info = primal(self.definition, self.args, arrays)
        return tuple(out), _outputs.Described(self._primal_info)

    def forward(
        self, arrays: Any, perturbed: Any, again: Any = None, for_jvp: bool = False
    ) -> tuple[list[Any], _outputs.Outputs, Any]:
        ctx, out, info = run_forward(self.definition, self.args, arrays, perturbed)
        if self._primal_info is not None and not self._primal_info.same_arrays_as(info):
            raise error(AutogradFunctionTypeError, self.definition.name, OUTPUT_DIFFERS)
        saved, remainder = ctx.to_residuals()
        # what the user's jvp reads (ctx.save_for_forward, attributes), its arrays as residuals too:
        # nothing crosses into the tangent map from this trace but through them
        view, view_remainder = _context.for_jvp(ctx).to_residuals() if for_jvp else ([], None)
        passed = _saves.passed_through(saved, arrays)
        if again is not None:  # outputs an outer differentiation sees; saved outputs become them too
            out, (saved, view) = outputs_again(again, out, saved, view)
        named = _saves.named(saved, remainder, passed)
        by_id = {id(a): n for a, n in zip(saved, named)}  # an array saved for both is kept once
        state = (remainder, view_remainder, info, _arguments.shape_dtypes(arrays), perturbed, varying_per_array(arrays))
        return out, info, (named, [by_id.get(id(a), a) for a in view], self._traces.token(state))

    def backward(self, residuals: Any, cotangents: Any) -> list[Any]:
        saved, _, token = residuals
        remainder, _, info, avals, perturbed, varying = self._traces[token]
        ctx = Context.from_residuals(saved, remainder)
        return run_backward(self.definition, self.args, ctx, info, list(cotangents), avals, list(perturbed), varying)

    def jvp_context(self, residuals: Any) -> Context:
        """The context a user's jvp reads, from ``forward``'s residuals (with ``for_jvp``)."""
        _, view, token = residuals
        _, view_remainder, *_ = self._traces[token]
        return Context.from_residuals(list(view), view_remainder)


def run_forward(
    definition: Definition, args: Arguments, arrays: Any, perturbed: Any
) -> tuple[Context, list[Any], _outputs.Outputs]:
    """Call the user's forward on one trace's arrays, with a fresh context.

    ``perturbed`` has one flag per array: whether JAX differentiates with respect to it.
    Returns the context, forward's array outputs and the description of its output.
    """
    # JAX may hand a custom rule a Python scalar for a weak-typed input: make every input an array,
    # or forward's output could look like a Python value (with no gradient).
    arrays = [a if isinstance(a, jax.Array) else jnp.asarray(a) for a in arrays]
    ctx, out, non_differentiable = forward_with_context(definition, args, arrays, perturbed)
    out_arrays, info = _outputs.check(definition.name, out, non_differentiable)
    if _anomaly.enabled():
        _anomaly.outputs(definition.name, out)
    return ctx, out_arrays, info


def forward_with_context(
    definition: Definition, args: Arguments, arrays: Any, perturbed: Any
) -> tuple[Context, Any, list[Any]]:
    """The user's forward on ``arrays`` (JAX arrays, or NumPy ones for host code) with a fresh
    context: the context, forward's output as returned, and the outputs it marked
    non-differentiable."""
    by_name, by_position = args.needs_input_grad(perturbed)
    flags = tuple(map(bool, perturbed))
    if definition.closed_names:  # a closed-over value not made a parameter in this call: not differentiated
        by_name = {**dict.fromkeys(definition.closed_names, False), **by_name}
    ctx = Context(definition.name, by_name, inputs=arrays, needs_by_position=by_position, perturbed=flags)
    values = args.values(arrays)
    # forward gets copies of its dicts, lists...: a write into one would be lost, so it is refused
    before = jax.tree_util.tree_flatten(tuple(values)) if args.has_containers else None
    ctx._bind_parameters(args.names, values)  # forward's parameters by name while it runs (messages)
    if definition.positional is not None:  # every parameter plain positional (so no *args): in order
        given, named = (ctx, *values), None
    else:  # as Python binds them
        ctx_name = next(iter(definition.signature.parameters))
        parameters = {ctx_name: ctx, **dict(zip(args.names, values))}
        bound = inspect.BoundArguments(definition.signature, parameters)  # type: ignore[arg-type]
        given, named = bound.args, bound.kwargs
    out = _pytorch_names.call(definition.name, "forward", definition.forward, given, named, (args.names, values))
    if before is not None:
        _arguments.refuse_writes(definition.name, args.names, values, before)
    return ctx, out, _context.end_forward(ctx)


def outputs_again(
    again: Callable[[list[Any]], Any], out: list[Any], *saved: list[Any]
) -> tuple[list[Any], list[list[Any]]]:
    """Forward's outputs as an outer differentiation must see them (``again(out)``: the same values,
    differentiated through the custom rule, so through backward at every order), and each list of
    saved arrays with each saved output replaced by that (PyTorch differentiates a saved output
    through its function's backward too)."""
    seen = list(again(out))
    by_id = {id(o): s for o, s in zip(out, seen)}
    return seen, [[by_id.get(id(a), a) for a in values] for values in saved]


def primal(definition: Definition, args: Arguments, arrays: Any) -> tuple[list[Any], _outputs.Outputs]:
    """Forward's array outputs alone: what a call that nothing differentiates needs."""
    _, out, info = run_forward(definition, args, arrays, [False] * len(arrays))
    return out, info


def run_backward(
    definition: Definition,
    args: Arguments,
    ctx: Context,
    info: _outputs.Outputs,
    cotangents: list[Any],
    avals: list[Any],
    wanted: list[bool],
    varying: tuple[frozenset[str], ...] | None = None,
    xp: Any = jnp,
) -> list[Any]:
    """Call the user's backward on one cotangent per array output (None where none flows); one
    cotangent (or None) per array input, checked against that input. ``wanted[i]``: whether JAX
    differentiates input i; ``varying`` (inside ``jax.shard_map``): the mesh axes each input varies
    over (``varying_per_array``); ``xp``: ``numpy`` where a host backward runs (host code sees
    NumPy arrays only)."""
    grad_outputs = _outputs.grad_outputs(info, cotangents, ctx.materialize_grads, xp)
    if _anomaly.enabled():  # a NaN arriving from downstream is not backward's
        _anomaly.grad_outputs(definition.name, grad_outputs)
    if definition.once_differentiable and xp is jnp:  # on the host, nothing differentiates backward
        # what backward reads (the context's arrays, the grad_outputs) passed through ``nondifferentiable``:
        # any differentiation of backward reaches the refusal, naming the function
        saved, remainder = ctx.to_residuals()
        saved, grad_outputs = nondifferentiable(definition.name, _DIFFERENTIATED_AGAIN, (saved, grad_outputs))
        ctx = Context.from_residuals(saved, remainder)
    takes = f"ctx and {len(grad_outputs)} grad_output argument(s), one per output of forward"
    returned = call_user(definition.name, "backward", definition.backward, (ctx, *grad_outputs), takes, "accept")
    if isinstance(returned, dict) and definition.closed_names:  # a closed-over value not differentiated here
        returned = {k: v for k, v in returned.items() if k in args.names or k not in definition.closed_names}
    grads = _gradients.by_parameter(
        definition.name, args, returned, definition.keyword_only, _context.needs_by_name(ctx)
    )
    cotangents = _gradients.to_cotangents(definition.name, args, grads, avals, wanted, xp.asarray)
    if varying:
        _check_varying(definition.name, args, cotangents, varying)
    if _anomaly.enabled():
        _anomaly.check(definition.name, "backward", list(zip(args.array_paths, cotangents)))
    return cotangents


def varying_per_array(arrays: Any) -> tuple[frozenset[str], ...] | None:
    """Inside ``jax.shard_map``, the mesh axes each array varies over, for ``run_backward``; else None."""
    return tuple(map(varying_axes, arrays)) if _jax_private.inside_shard_map() else None


def _check_varying(name: str, args: Arguments, cotangents: list[Any], varying: tuple[frozenset[str], ...]) -> None:
    """Inside ``jax.shard_map`` a gradient must vary over the mesh axes its input varies over: one
    that does not was summed over devices already (a ``lax.psum`` in backward), which JAX refuses
    with its own words (jaxfn's sum over devices would count it once per device)."""
    for path, cotangent, axes in zip(args.array_paths, cotangents, varying):
        missing = axes - varying_axes(cotangent) if cotangent is not None else frozenset()
        if missing:
            raise error(
                AutogradFunctionTypeError,
                name,
                f"inside jax.shard_map, '{path}' is used with values varying over the mesh axes {sorted(axes)} (a "
                "replicated input is cast to vary with them), but backward returned a gradient for it that does not "
                f"vary over {sorted(missing)} (summed over devices already, with "
                "lax.psum, or computed from replicated values alone); backward returns each device's share, and "
                "JAX sums a replicated input's over devices: drop the psum, or make the share vary "
                "(jax.lax.pcast(g, axes, to='varying'))",
            )


OUTPUT_DIFFERS = (
    "forward's output must be the same whatever is differentiated, but it differs between a trace where "
    "no input is differentiated and one where some are (its shapes, dtypes or structure depend on "
    "ctx.needs_input_grad); return the same output in every case, and use needs_input_grad only to choose "
    "what to save"
)


FORWARD_MODE_HELP = (
    "it was differentiated in forward mode (jax.jvp, jax.jacfwd, jax.linearize, or jax.hessian and jax.jvp of "
    "jax.grad, which differentiate its gradient in forward mode), but it defines a backward (reverse mode) only, "
    "and jax.custom_vjp refuses forward mode. Use reverse mode (jax.grad, jax.vjp, jax.jacrev; second "
    "derivatives as jax.jacrev(jax.jacrev(f))), or build it with jaxfn.autograd_function(forward, backward, "
    "forward_mode=True) (or forward_mode = True on a jaxfn.Function) so that the same backward also gives "
    "forward mode, or give it its own jvp rule (jvp=..., or a jvp static method, as in PyTorch)"
)

ONCE_DIFFERENTIABLE = "_jaxfn_once_differentiable"

_DIFFERENTIATED_AGAIN = (
    "its backward is marked jaxfn.once_differentiable, but JAX is differentiating it again (jax.grad "
    "of jax.grad, jax.hessian, or forward mode over a gradient); remove the decorator if backward is "
    "written in JAX operations, or differentiate only once"
)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def nondifferentiable(name: str, sentence: str, values: Any) -> Any:
    """``values`` (a pytree of arrays), unchanged; differentiating through them raises jaxfn's
    error naming ``name`` with ``sentence``, where a tangent is not zero (a value JAX does not
    differentiate passes: host code on saved values, say). Made once, as Equinox's
    ``nondifferentiable``: what host calls and ``once_differentiable`` backwards pass through."""
    return values


def _refuse_tangents(name: str, sentence: str, primals: Any, tangents: Any) -> Any:
    (values,), (given,) = primals, tangents
    is_zero = lambda t: isinstance(t, SymbolicZero)
    if not all(map(is_zero, jax.tree_util.tree_leaves(given, is_leaf=is_zero))):
        raise error(AutogradFunctionTypeError, name, sentence)
    return values, given


nondifferentiable.defjvp(_refuse_tangents, symbolic_zeros=True)


_SETUP_TAKES = "(ctx, inputs, output), as in PyTorch: the context, the tuple of forward's inputs and its output"


def _with_setup_context(name: str, forward: Callable[..., Any], setup_context: Callable[..., Any]) -> Any:
    """PyTorch 2's form, ``forward(*args)`` plus ``setup_context(ctx, inputs, output)``, as one
    ``forward(ctx, *args)``: forward runs, then setup_context saves what backward needs."""
    _check_callable(name, "forward", forward)
    _check_callable(name, "setup_context", setup_context)
    signature = inspect.signature(forward)
    if next(iter(signature.parameters), None) == "ctx":
        raise error(
            AutogradFunctionTypeError,
            name,
            "setup_context is given, so forward must not take ctx (PyTorch 2's form is forward(*args) and "
            "setup_context(ctx, inputs, output)), but forward's first parameter is ctx; drop ctx from forward, or "
            "drop setup_context and save values in forward",
        )

    def forward_with_context(ctx: Context, *args: Any, **kwargs: Any) -> Any:
        output = forward(*args, **kwargs)
        call_user(name, "setup_context", setup_context, (ctx, (*args, *kwargs.values()), output), _SETUP_TAKES)
        return output

    parameters = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY), *signature.parameters.values()]
    forward_with_context.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    forward_with_context.__name__ = getattr(forward, "__name__", "forward")
    return forward_with_context


def call_user(
    name: str, role: str, function: Callable[..., Any], arguments: tuple[Any, ...], takes: str, must: str = "take"
) -> Any:
    """``function(*arguments)``, a user's function (backward, jvp, vmap, setup_context); where its
    signature can't take them, the error names it and what it must take (``must``: the verb,
    ``takes``: what), not Python's words about a lambda. Nothing is checked before the call: the
    common call costs nothing more."""
    try:
        return _pytorch_names.call(name, role, function, arguments)
    except TypeError:
        signature = _refusing_signature(function, arguments)
        if signature is None:  # the rule's own TypeError, or no signature to read (a builtin)
            raise
        raise error(
            AutogradFunctionTypeError, name, f"{role} must {must} {takes}, but its signature is {signature}"
        ) from None


def _refusing_signature(function: Callable[..., Any], arguments: tuple[Any, ...]) -> inspect.Signature | None:
    """``function``'s signature where it can't take ``arguments``; None where it can, or has none."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*arguments)
    except TypeError:
        return signature
    return None


def jvp_takes(args: Arguments) -> str:
    """What a user's jvp rule must take, for ``call_user``'s message."""
    slots = ", ".join(f"t_{args.slot_name(slot)}" for slot in args.slots)
    return f"ctx and one tangent per argument of forward, as in PyTorch: jvp(ctx, {slots})"


def check_definition(name: str, role: str, function: Any) -> None:
    """A forward or backward must be callable and take the context first."""
    _check_callable(name, role, function, " taking ctx first")
    try:
        has_ctx = _arguments.context_parameter(function) is not None
        first_two = tuple(inspect.signature(function).parameters)[:2]
    except (TypeError, ValueError):  # no signature to read (some builtins): trust the caller
        return
    # a method of a jaxfn.Function written without @staticmethod: (self, ctx, ...); old PyTorch code's
    # static forward(self, x), self being the context, is fine
    if first_two in (("self", "ctx"), ("self", "context")):
        raise error(
            AutogradFunctionTypeError,
            name,
            f"{role}'s first parameter is 'self', but {role} takes the context first and no instance: in a "
            f"jaxfn.Function (as in PyTorch) forward and backward are static methods; write @staticmethod above "
            f"def {role}(ctx, ...), without self",
        )
    if not has_ctx:
        raise error(
            AutogradFunctionTypeError,
            name,
            f"{role} must take the context as its first parameter, as in {role}(ctx, ...), but its signature is "
            f"{inspect.signature(function)}",
        )


def _check_callable(name: str, role: str, function: Any, form: str = "") -> None:
    """The user's ``role`` must be a function (of the ``form`` named in the message)."""
    if not callable(function):
        raise error(AutogradFunctionTypeError, name, f"{role} must be a function{form}, but got {type_name(function)}")
