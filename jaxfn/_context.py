"""The context object ``ctx`` that forward and backward share, and how it crosses to backward.

A context belongs to one trace of forward. Its own state lives in a small typed holder
(``_State``); the user's attributes (``ctx.power = 3``) live apart from it, in a dict. What the
context holds crosses to backward in two parts: JAX arrays as residuals of the custom rule,
everything else (numbers, strings, flags) as a static remainder kept per trace.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from . import _tracers
from ._errors import (
    AutogradFunctionError,
    AutogradFunctionTypeError,
    ContextAttributeError,
    ContextIndexError,
    ContextKeyError,
    error,
    type_name,
    unknown_name,
)
from ._split import Split, split_with_paths


class _View:
    """What ``SavedVariables`` and ``NeedsInputGrad`` share: a context's values by name
    (``_jaxfn_names``) and by position (``_jaxfn_positions``), read-only; an unknown name, or a
    position past the end, raises naming the view (``_jaxfn_what``). Every name of the view's own
    starts with ``_jaxfn``, so a saved value or a parameter named ``_names`` reads as the user's."""

    __slots__ = ("_jaxfn_function", "_jaxfn_names", "_jaxfn_positions", "_jaxfn_replaced")
    _jaxfn_what: str  # the view as messages name it
    _jaxfn_per: str  # what one position stands for
    _jaxfn_read_only: str  # the sentence for setting a value
    __iter__: Callable[[], Iterator[Any]]  # each view's own

    def __init__(
        self, function: str, names: Mapping[str, Any], positions: tuple[Any, ...], replaced: tuple[str, ...] = ()
    ):
        for slot, value in zip(_View.__slots__, (function, dict(names), positions, replaced)):
            object.__setattr__(self, slot, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)  # Python's protocol look-ups (copy, pickle) stay silent
        return self._jaxfn_named(name, ContextAttributeError)

    def __setattr__(self, name: Any, value: Any = None) -> None:
        raise error(AutogradFunctionTypeError, self._jaxfn_function, self._jaxfn_read_only)

    __setitem__ = __setattr__  # view[name] = value, as view.name = value: refused

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def keys(self) -> Any:
        return self._jaxfn_names.keys()

    def _jaxfn_named(self, name: Any, kind: type[AutogradFunctionError]) -> Any:
        try:
            return self._jaxfn_names[name]
        except KeyError:
            raise error(kind, self._jaxfn_function, self._jaxfn_unknown(name)) from None

    def _jaxfn_at(self, index: Any) -> Any:
        _check_position(self, len(self._jaxfn_positions), index)
        return self._jaxfn_positions[index]

    def _jaxfn_unknown(self, name: str) -> str:
        return unknown_name(self._jaxfn_what, name, self._jaxfn_names)

    def _jaxfn_hint(self) -> str:
        return ""

    def __reduce__(self) -> Any:  # copy and pickle make the same view (its slots are read-only)
        return type(self), (self._jaxfn_function, self._jaxfn_names, self._jaxfn_positions, self._jaxfn_replaced)


class SavedVariables(_View, Mapping):
    """What forward saved with ``ctx.save_for_backward(name=value)``: a read-only mapping.

    Read a value as ``saved.name`` (R's ``s$name``) or ``saved["name"]``; ``saved[i]`` is the
    i-th value saved (as R indexes a list), the same as ``ctx.saved_tensors[i]``.

    Iterating over it, and ``len``, follow how forward saved: after a save by name
    (``save_for_backward(x=x)``), a mapping's names, as R's named list and ``dict`` give; after
    PyTorch's positional save (``save_for_backward(a, b)``), where there are no names, the values
    in order, so PyTorch's ``a, b = ctx.saved_variables`` (the old name of ``saved_tensors``)
    works. ``keys()`` is always the names (none after a positional save), so ``dict(saved)`` is
    the saves by name either way.
    """

    __slots__ = ()
    _jaxfn_what = "ctx.saved_variables"
    _jaxfn_per = "value saved"
    _jaxfn_read_only = "ctx.saved_variables is read-only; save values in forward with ctx.save_for_backward(name=value)"

    def __getitem__(self, name: Any) -> Any:
        return self._jaxfn_at(name) if isinstance(name, int) else self._jaxfn_named(name, ContextKeyError)

    __delitem__ = _View.__setattr__  # del saved[name]: refused as setting one is

    def __iter__(self) -> Iterator[Any]:
        return iter(self._jaxfn_names or self._jaxfn_positions)  # the names; after a positional save, the values

    def __repr__(self) -> str:
        return f"SavedVariables({', '.join(self._jaxfn_names)})"

    def _jaxfn_unknown(self, name: str) -> str:
        hint = ""
        if name in self._jaxfn_replaced:  # R code saving one value per call
            hint = (
                f" ('{name}' was saved by an earlier ctx.save_for_backward call, and each call replaces what the "
                "earlier ones saved: save everything in one call, ctx.save_for_backward(a=a, b=b))"
            )
        elif not self._jaxfn_names and self._jaxfn_positions:  # saved by position (PyTorch's form)
            hint = (
                f" (forward saved {len(self._jaxfn_positions)} value(s) by position: read them as "
                "ctx.saved_tensors[i], or save by name, ctx.save_for_backward(x=x))"
            )
        return super()._jaxfn_unknown(name).removesuffix(".") + hint  # error() ends the sentence again


class SavedTensors(tuple):
    """``ctx.saved_tensors``: a tuple, whose position past the end is named as the context's own are."""

    _jaxfn_function: str
    _jaxfn_what = "ctx.saved_tensors"
    _jaxfn_per = "value saved"

    def __new__(cls, function: str, values: tuple[Any, ...]) -> SavedTensors:
        saved = super().__new__(cls, values)
        saved._jaxfn_function = function
        return saved

    def __reduce__(self) -> Any:  # copied or pickled as the plain tuple it is
        return (tuple, (tuple(self),))

    def __getitem__(self, key: Any) -> Any:
        _check_position(self, len(self), key)
        return tuple.__getitem__(self, key)

    def _jaxfn_hint(self) -> str:
        return (
            " (in backward: what forward saved with ctx.save_for_backward; in a jvp rule: what it saved "
            "with ctx.save_for_forward)"
        )


# a container for JAX as the tuple it is (tree_map, jit arguments), its children unflattened as a tuple
jax.tree_util.register_pytree_node(
    SavedTensors,
    lambda saved: (tuple(saved), None),
    lambda _, values: tuple(values),  # type: ignore[arg-type, return-value]
)


class NeedsInputGrad(_View, Sequence):
    """Whether JAX differentiates with respect to each parameter, in this trace.

    By name as an attribute (R: ``ctx.needs_input_grad.input``) or key
    (``ctx.needs_input_grad["input"]``), or by position (PyTorch: ``ctx.needs_input_grad[0]``,
    ``a, b = ctx.needs_input_grad``; one entry per argument, so a ``*args`` parameter counts
    once per element). ``"input" in ctx.needs_input_grad`` asks for a name.
    """

    __slots__ = ()
    _jaxfn_what = "ctx.needs_input_grad"
    _jaxfn_per = "argument of forward after ctx"
    _jaxfn_read_only = "ctx.needs_input_grad is read-only"

    def __getitem__(self, key: Any) -> Any:
        return self._jaxfn_named(key, ContextKeyError) if isinstance(key, str) else self._jaxfn_at(key)

    def __iter__(self) -> Iterator[bool]:
        return iter(self._jaxfn_positions)

    def __contains__(self, item: object) -> bool:
        return item in self._jaxfn_names if isinstance(item, str) else item in self._jaxfn_positions

    def __repr__(self) -> str:
        return "NeedsInputGrad(" + ", ".join(f"{k}={v}" for k, v in self._jaxfn_names.items()) + ")"

    def _jaxfn_hint(self) -> str:
        names = ", ".join(map(repr, self._jaxfn_names)) or "none"
        return (
            f" (the parameters are {names}; each element of a *args parameter counts as one); or ask by name, "
            "ctx.needs_input_grad.<name>"
        )


def _check_position(view: Any, count: int, index: Any) -> None:
    """Refuse an int ``index`` past the end of a view's ``count`` entries, one ``view._jaxfn_per``
    something, naming the view (``view._jaxfn_what``) and what it holds (``view._jaxfn_hint()``)."""
    if isinstance(index, int) and not -count <= index < count:
        positions = f"positions are 0 to {count - 1}" if count > 1 else ("it has none", "the only position is 0")[count]
        entries = f"{count} entr{'y' if count == 1 else 'ies'}"
        raise error(
            ContextIndexError,
            view._jaxfn_function,
            f"{view._jaxfn_what}[{index}] is out of range: it has {entries}, one per {view._jaxfn_per}, so {positions}"
            + view._jaxfn_hint(),
        )


class Marked(list):
    """The outputs forward marked with ``ctx.mark_non_differentiable``, and how messages name each
    (``named``, by id): its argument position, and the parameter of forward it is, if it is one."""

    def __init__(self) -> None:
        super().__init__()
        self.named: dict[int, str] = {}


def _marked_name(position: int, value: Any, parameters: tuple[Sequence[str], Sequence[Any]]) -> str:
    """'argument 1 (forward's input 'order')': a value given to ``mark_non_differentiable``; where
    the same array fills several of forward's parameters (``f(x, x)``), every one: "forward's input
    'x' or 'y', the same array"."""
    filled = []
    for name, given in zip(*parameters):
        paths = jax.tree_util.tree_flatten_with_path(given, is_leaf=lambda leaf: leaf is value)[0]
        filled += [f"'{name}{jax.tree_util.keystr(path)}'" for path, leaf in paths if leaf is value]
    if filled:
        same = f"{', '.join(filled[:-1])} or {filled[-1]}, the same array" if filled[1:] else filled[0]
        return f"argument {position} (forward's input {same})"
    what = f"an array of shape {tuple(value.shape)}" if hasattr(value, "shape") else type_name(value)
    return f"argument {position} ({what})"


# Values saved by one call of save_for_backward or save_for_forward: by position, and by name.
_Saves = tuple[tuple[Any, ...], Mapping[str, Any]]


@dataclasses.dataclass(slots=True)
class _State:
    """The context's own state, apart from the user's attributes. The fields after ``replaced``
    are forward's own: a copy past forward (``holding``) starts without them."""

    function: str
    needs: NeedsInputGrad
    saved: _Saves = ((), {})  # by save_for_backward
    materialize: bool = True
    replaced: tuple[str, ...] = ()  # names an earlier save_for_backward saved and a later one dropped
    in_forward: bool = False  # True from the context's making until forward returns (end_forward)
    inputs: Sequence[Any] = ()  # this call's array inputs, for mark_dirty
    perturbed: tuple[bool, ...] = ()  # per array input: whether JAX differentiates it
    parameters: tuple[Sequence[str], Sequence[Any]] = ((), ())  # forward's, by name, while it runs
    forward_saved: _Saves = ((), {})  # by save_for_forward: what a user's jvp reads
    non_differentiable: Marked = dataclasses.field(default_factory=Marked)

    def holding(self, saved: _Saves = ((), {})) -> _State:
        """A copy past forward holding these saved values: none for the part kept per trace, the
        saved values again for backward or a jvp rule."""
        return _State(self.function, self.needs, saved, self.materialize, self.replaced)


@dataclasses.dataclass(frozen=True, eq=False)
class Remainder(Split):
    """The static part of a context, kept per trace: everything but its arrays (the ``Split`` of
    what it holds, and its own state)."""

    state: _State
    save_names: tuple[str, ...]  # one per array: "<save><path>" (a position, a name or an attribute)


class Context:
    """The `ctx` handed to forward and backward of one call.

    jaxfn makes one per call and trace ([`autograd_function`][jaxfn.autograd_function]); you
    don't construct it. In forward, save values
    (`save_for_backward`, `save_for_forward`), set attributes (`ctx.power = 3`: any value, read
    back in backward) and mark outputs (`mark_non_differentiable`, `set_materialize_grads`); in
    backward (and a `jvp` rule) read them back, with `needs_input_grad`. The forward-only methods
    raise `AutogradFunctionError` once forward has returned, and so does setting an attribute
    whose name is one of the context's own.

    >>> import jax, jax.numpy as jnp, jaxfn
    >>> def forward(ctx, x, power):
    ...     ctx.save_for_backward(x=x)            # R style; ctx.save_for_backward(x) for saved_tensors
    ...     ctx.power = power                     # any attribute reaches backward
    ...     return x**power
    >>> def backward(ctx, grad_output):
    ...     assert ctx.needs_input_grad.x and not ctx.needs_input_grad.power
    ...     x = ctx.saved_variables.x
    ...     return {"x": grad_output * ctx.power * x ** (ctx.power - 1)}
    >>> power = jaxfn.autograd_function(forward, backward)
    >>> float(jax.grad(lambda x: power(x, 3))(2.0))
    12.0
    """

    __slots__ = ("_state", "_attrs")

    def __init__(
        self,
        function: str,
        needs_input_grad: dict[str, bool],
        needs_by_position: tuple[bool, ...],
        inputs: Sequence[Any] = (),
        perturbed: tuple[bool, ...] = (),
    ):
        needs = NeedsInputGrad(function, needs_input_grad, needs_by_position)
        self._hold(_State(function, needs, in_forward=True, inputs=inputs, perturbed=perturbed), {})

    def _hold(self, state: _State, attrs: dict[str, Any]) -> Context:
        """Set the context's state and attributes (past ``__setattr__``, which guards the user's)."""
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_attrs", attrs)
        return self

    # -- forward-only methods --------------------------------------------------------------
    def save_for_backward(self, *values: Any, **named: Any) -> None:
        """Save values for backward: by name (R) as `saved_variables`, or by position
        (PyTorch) as `saved_tensors`. A later call replaces what an earlier one saved.

        Values may be arrays, pytrees, Python values or `None`: JAX arrays cross to backward as
        residuals (each named `"<function>.<save>"` for `jax.checkpoint` policies), everything
        else as it is. Forward only.

        Args:
          *values: values saved by position, read back as `ctx.saved_tensors`.
          **named: values saved by name, read back as `ctx.saved_variables.name`.
        """
        self._forward_only("save_for_backward")
        state = self._state
        # the names dropped, for the message if backward asks for one
        state.replaced = tuple(dict.fromkeys([n for n in (*state.replaced, *state.saved[1]) if n not in named]))
        state.saved = (values, named)

    def save_for_forward(self, *values: Any, **named: Any) -> None:
        """Save values for a `jvp` rule (PyTorch's `ctx.save_for_forward`): jvp reads them as
        `ctx.saved_tensors` (by position) and `ctx.saved_variables` (by name). A later call
        replaces what an earlier one saved. Forward only.

        Args:
          *values: values saved by position, read in jvp as `ctx.saved_tensors`.
          **named: values saved by name, read in jvp as `ctx.saved_variables.name`.
        """
        self._forward_only("save_for_forward")
        self._state.forward_saved = (values, named)

    def mark_non_differentiable(self, *outputs: Any) -> None:
        """Declare outputs (the very values forward returns) that carry no gradient.

        Their `grad_output` reaches backward as zeros (`None` with `set_materialize_grads(False)`),
        and `jaxfn.gradcheck` leaves them out. Forward only.

        Args:
          *outputs: output arrays, the very objects forward returns.
        """
        self._forward_only("mark_non_differentiable")
        marked = self._state.non_differentiable  # a forward's state holds a Marked (copies are past forward)
        for position, value in enumerate(outputs):
            marked.append(value)
            marked.named.setdefault(id(value), _marked_name(position, value, self._state.parameters))

    def set_materialize_grads(self, value: bool) -> None:
        """With `False`, cotangents that carry no gradient reach backward as `None`.

        Forward only; a `jvp` rule then gets `None` for the tangents JAX does not give.

        Args:
          value: `True` (the default): zeros; `False`: `None`.
        """
        self._forward_only("set_materialize_grads")
        if not isinstance(value, (bool, np.bool_)):  # "False" would switch nothing off
            raise error(
                AutogradFunctionTypeError,
                self._state.function,
                f"ctx.set_materialize_grads() takes True or False, as in PyTorch, but got {type_name(value)} "
                f"({value!r})",
            )
        self._state.materialize = bool(value)

    def mark_dirty(self, *inputs: Any) -> None:
        """Accepted for ported code: JAX arrays are immutable, so an "in-place" forward returns
        the updated array. Checks that each argument is one of this call's array inputs.

        Args:
          *inputs: array inputs of this call, the very objects forward received.
        """
        self._forward_only("mark_dirty")
        ids = {id(x) for x in self._state.inputs}
        for position, value in enumerate(inputs):
            if id(value) not in ids:
                raise error(
                    AutogradFunctionTypeError,
                    self._state.function,
                    f"ctx.mark_dirty() takes this call's array inputs, but its argument {position} is "
                    + ("an array" if hasattr(value, "shape") else type_name(value))
                    + " that is not one of them; pass the very arrays forward received (JAX arrays are immutable: "
                    "x += 1 or x.at[i].set(v) makes a new array, so mark the input and return the new one)",
                )

    # -- read in backward ------------------------------------------------------------------
    @property
    def saved_variables(self) -> SavedVariables:
        """The values saved by name, as a read-only mapping with attribute access.

        `saved.name` (R's `s$name`) or `saved["name"]`; `saved[i]` is the i-th value saved (as R
        indexes a list), the same as `ctx.saved_tensors[i]`; `keys()`, `in`, `len` and iteration
        as for a dict. An unknown name raises `AutogradFunctionError` listing the saved names.
        """
        return SavedVariables(self._state.function, self._state.saved[1], self.saved_tensors, self._state.replaced)

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        """The values saved by position (or, if none were, those saved by name, in order)."""
        positional, named = self._state.saved
        return SavedTensors(self._state.function, tuple(positional) or tuple(named.values()))

    @property
    def needs_input_grad(self) -> NeedsInputGrad:
        """Per parameter, whether JAX differentiates with respect to it in this trace.

        Read by name as an attribute (R: `ctx.needs_input_grad.input`) or key
        (`ctx.needs_input_grad["input"]`), or by position (PyTorch: `ctx.needs_input_grad[0]`,
        `a, b = ctx.needs_input_grad`; one entry per argument, each `*args` element apart).
        `"input" in ctx.needs_input_grad` asks for a name. Read-only.
        """
        return self._state.needs

    @property
    def materialize_grads(self) -> bool:
        """Whether cotangents that carry no gradient reach backward as zeros (else `None`)."""
        return self._state.materialize

    # -- user attributes -------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN_NAMES:
            raise error(
                AutogradFunctionTypeError,
                self._state.function,
                f"ctx.{name} belongs to the context and can't be overwritten; store your value under another name",
            )
        self._attrs[name] = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN_NAMES:
            raise AttributeError(name)  # Python's protocol look-ups, and slots not yet set
        try:
            return self._attrs[name]
        except KeyError:
            close = difflib.get_close_matches(name, sorted(_OWN_NAMES - set(Context.__slots__)), n=1)
            hint = f" Did you mean ctx.{close[0]}?" if close else ""
            hint += " Set attributes on ctx in forward to read them in backward."
            raise error(
                ContextAttributeError, self._state.function, unknown_name("ctx", name, self._attrs) + hint
            ) from None

    def __delattr__(self, name: str) -> None:
        self.__getattr__(name)
        del self._attrs[name]

    def _forward_only(self, method: str) -> None:
        if not self._state.in_forward:
            raise error(
                AutogradFunctionTypeError, self._state.function, f"ctx.{method}() can only be called in forward"
            )

    def _bind_parameters(self, names: Sequence[str], values: Sequence[Any]) -> None:
        """Forward's parameters by name, while it runs (what ``mark_non_differentiable`` names)."""
        self._state.parameters = (names, values)

    # -- crossing from forward to backward -------------------------------------------------
    def to_residuals(
        self, crosses: Callable[[Any], bool] = lambda leaf: isinstance(leaf, jax.Array)
    ) -> tuple[list[Any], Remainder]:
        """What the context holds, split into the values that cross as residuals (JAX arrays; for a
        host forward, every value) and a static remainder; each residual named (``save_names``)."""
        state = self._state
        positional, named = state.saved
        # each name in its leaves' paths, in the user's order (JAX sorts a dict's keys, not an OrderedDict's)
        held = (positional, collections.OrderedDict(named), collections.OrderedDict(self._attrs))
        arrays, parts, paths = split_with_paths(held, crosses)
        for path, leaf in zip(paths, parts.statics):
            if leaf is not None and _tracers.holds_tracer(leaf):
                raise error(AutogradFunctionTypeError, state.function, _hidden_tracer(path, leaf))
        save_names = tuple(_save_name(path) for path, array in zip(paths, parts.is_array) if array)
        return arrays, Remainder(parts.treedef, parts.is_array, parts.statics, state.holding(), save_names)

    @classmethod
    def from_residuals(cls, arrays: list[Any], remainder: Remainder) -> Context:
        """The backward-side context, rebuilt from ``to_residuals``'s two parts."""
        positional, named, attrs = remainder.join(arrays)
        return cls.__new__(cls)._hold(remainder.state.holding((positional, dict(named))), dict(attrs))


# The context's own names, derived from the class: none of them can be set as an attribute.
_OWN_NAMES = frozenset(name for name in dir(Context) if not name.startswith("__")) | set(Context.__slots__)


def _save_name(path: tuple) -> str:
    """A held array's name: its position (``0``), save name (``input``) or attribute (``scale``),
    then its key path inside a saved pytree (``params.w``). ``path[0]`` is its group: saved by
    position, saved by name, or an attribute."""
    parts = [_key_text(key) for key in path[1:]]
    if path[0].idx == 2 and parts[0] == CLOSED_OVER and parts[1:]:  # named as the parameter it became
        return ".".join(parts[1:])
    return ".".join(parts)


CLOSED_OVER = "jaxfn_closed_over"  # the ctx attribute holding what forward and backward close over (SPEC 15)


def _key_text(key: Any) -> str:
    """One step of a key path, as a name part: ``params.w``, ``layers.0`` (no quotes or brackets,
    which JAX's residual report and policy names keep as written)."""
    return next((str(getattr(key, a)) for a in ("key", "idx", "name") if hasattr(key, a)), str(key))


def _hidden_tracer(path: tuple, leaf: Any) -> str:
    """The sentence for an array hidden inside an object that JAX can't see into (held at ``path``)."""
    where = ("ctx.saved_tensors[{}]", "saved value '{}'", "ctx.{}")[path[0].idx].format(_key_text(path[1]))
    return (
        f"{where} is {type_name(leaf)} that holds arrays JAX is tracing, but JAX carries arrays from forward to "
        "backward only as pytree leaves, so they would leak out of this trace; save the arrays themselves "
        + (
            "and rebuild the function in backward"
            if callable(leaf)
            else f"(ctx.save_for_backward(w=obj.w)) or register {type(leaf).__name__} as a pytree "
            "(jax.tree_util.register_dataclass)"
        )
    )


def end_forward(ctx: Context) -> list[Any]:
    """Close forward's part of ``ctx`` (its forward-only methods refuse from now on); the outputs
    forward marked non-differentiable. What the rule and the host builder call after forward."""
    ctx._state.in_forward = False
    return ctx._state.non_differentiable


def for_jvp(ctx: Context) -> Context:
    """The context a user's ``jvp`` reads: what forward saved with ``ctx.save_for_forward`` as
    its saved values, and forward's attributes."""
    return Context.__new__(Context)._hold(ctx._state.holding(ctx._state.forward_saved), dict(ctx._attrs))


def perturbed(ctx: Context) -> tuple[bool, ...]:
    """Per array input of the call, whether JAX differentiates it (finer than ``needs_input_grad``,
    which is per argument): what a host function's probe is keyed by. Forward only."""
    return ctx._state.perturbed


def needs_by_name(ctx: Context) -> dict[str, bool]:
    """``ctx.needs_input_grad`` by parameter name, as a dict."""
    return ctx._state.needs._jaxfn_names
