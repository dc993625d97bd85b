"""Finding JAX tracers that Python objects hold, where JAX can't see them.

JAX sees arrays only as pytree leaves. A tracer kept in an object's attributes, in what a
function closes over, or deep in containers escapes its trace unseen; ``_context`` refuses such
objects saved on ``ctx``, and ``_closures`` refuses differentiated values that forward or backward
hold. A function passed as an argument that holds them becomes a ``Closure``: a callable pytree
whose leaves are those values (closure conversion, as ``jax.closure_convert`` does it).
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from . import _jax_private, _keys, _split
from ._errors import AutogradFunctionTypeError, error


def holds_tracer(value: Any, wanted: Callable[[Tracer], bool] | None = None) -> bool:
    """Whether an object holds a JAX tracer (one that ``wanted`` accepts) anywhere: in containers,
    attributes (``__dict__``, ``__slots__``), pytree children, object arrays, or what a function,
    partial or bound method closes over; at any depth."""
    return next(_tracers(value, wanted), None) is not None


def holds_nothing(function: Any) -> bool:
    """Whether ``function`` is None or a plain function that holds nothing (no closed-over value,
    default or attribute): the common user function, which ``holds_tracer`` need not walk."""
    return function is None or (type(function) is types.FunctionType and not _parts(function))


def tracers_in(value: Any, wanted: Callable[[Tracer], bool] | None = None) -> list[Tracer]:
    """The tracers (those ``wanted`` accepts) an object holds, each once, in the order found."""
    return list(_tracers(value, wanted))


def _tracers(value: Any, wanted: Callable[[Tracer], bool] | None) -> Iterator[Tracer]:
    """Each object once (cycles end), without recursion."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, Tracer):
            if wanted is None or wanted(item):
                yield item
        elif not isinstance(item, _OPAQUE):
            stack.extend(reversed(_parts(item)))


def cells_holding(function: Any, wanted: Callable[[Tracer], bool]) -> dict[str, Any]:
    """What a plain function closes over that holds tracers ``wanted`` accepts: by the name its
    code gives each (``co_freevars``). Empty for anything but a plain function."""
    cells = _cells(function).items()
    return {name: cell.cell_contents for name, cell in cells if holds_tracer(cell.cell_contents, wanted)}


def with_cells(function: Any, values: dict[str, Any]) -> Any:
    """A copy of a plain function whose closure reads ``values`` (by name) in place of what it
    closes over; the function itself where it closes over none of them."""
    closed = _cells(function, empty=True)
    if not set(closed) & set(values):
        return function
    cells = tuple(types.CellType(values[n]) if n in values else c for n, c in closed.items())
    copy = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__, cells)
    copy.__kwdefaults__, copy.__qualname__ = function.__kwdefaults__, function.__qualname__
    copy.__dict__.update(function.__dict__)
    return copy


@jax.tree_util.register_pytree_node_class
class Closure:
    """A function holding traced values, as a callable pytree whose leaves are those values: a
    custom rule sees them as inputs (so they get gradients, from backward's cotangent for this
    pytree), and calling it runs the function with its leaves in their place.

    At each new signature (the shapes and dtypes of the arrays it is called with, and its other
    arguments) the function is traced once (closure conversion, as ``jax.closure_convert`` does
    it), and the values it reads that are this closure's ``held`` tracers (by identity) are given
    ``values`` instead: the leaves this instance was rebuilt with (the custom rule's own tracers,
    or backward's residuals). The traced program is kept on ``held``, shared by every rebuilt
    instance, so a later call (in backward, when the trace that made the held tracers has ended
    and JAX refuses to touch them) runs it without reading them.
    """

    __slots__ = ("function", "held", "values")

    def __init__(self, function: Callable[..., Any], held: _Held, values: tuple[Any, ...]):
        self.function, self.held, self.values = function, held, tuple(values)

    @classmethod
    def holding(cls, function: Callable[..., Any], tracers: list[Tracer], name: str, parameter: str) -> Closure:
        return cls(function, _Held(tuple(tracers), name, parameter), tuple(tracers))

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, _Held]]:
        return self.values, (self.function, self.held)

    @classmethod
    def tree_unflatten(cls, static: tuple[Any, _Held], values: Any) -> Closure:
        return cls(*static, tuple(values))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if all(a is b for a, b in zip(self.values, self.held.tracers)):
            return self.function(*args, **kwargs)  # where it was made: nothing to replace
        arrays, parts = _split.split((args, kwargs))
        try:
            key: Any = (_keys.split_key(parts), tuple(map(jax.typeof, arrays)))
        except (_keys.Unkeyable, TypeError):
            key = None
        program = self.held.programs.get(key)  # None is never a key: an unkeyable call traces again
        if program is None:
            program = self.held.trace(self.function, arrays, parts)
            if key is not None:
                self.held.programs[key] = program
        jaxpr, reads, out_tree = program
        consts = [self.values[r] if isinstance(r, int) else r[0] for r in reads]
        traced = any(isinstance(v, Tracer) for v in (*consts, *arrays))
        # concrete values (host code, a probe under jit): run now, not staged into a trace around
        with contextlib.nullcontext() if traced else jax.ensure_compile_time_eval():
            return jax.tree_util.tree_unflatten(out_tree, _jax_private.run_traced(jaxpr, consts, arrays))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name not in _NAMING or name in Closure.__slots__:  # protocols; before __init__
            raise AttributeError(name)
        return getattr(self.function, name)  # the function's own attributes (its name, another method)

    def __repr__(self) -> str:
        return f"Closure({self.function!r}, {len(self.values)} values)"


# A function's attributes that name or describe it, read through a Closure as from the function.
_NAMING = frozenset({"__name__", "__qualname__", "__module__", "__doc__", "__wrapped__", "__self__", "__func__"})


class _Held:
    """What a ``Closure`` was made holding (its tracers; the function and parameter it was passed
    to, for messages) and its programs, one per signature: static, equal only to itself."""

    __slots__ = ("tracers", "function", "parameter", "programs")

    def __init__(self, tracers: tuple[Tracer, ...], function: str, parameter: str):
        self.tracers, self.function, self.parameter = tracers, function, parameter
        self.programs: dict[Any, tuple[Any, list[Any], Any]] = {}

    def trace(self, function: Callable[..., Any], arrays: list[Any], parts: _split.Split) -> tuple[Any, list[Any], Any]:
        """``function`` traced for one signature (its call's ``arrays`` and the rest, ``parts``): its
        program; for each value the program reads from outside, the index of the held tracer it
        is, or (a value that is not held) that value in a 1-tuple; and the output's structure."""

        def on_arrays(*arrays: Any) -> Any:
            args, kwargs = parts.join(arrays)
            return function(*args, **kwargs)

        try:
            jaxpr, consts, out_tree = _jax_private.traced(on_arrays, arrays)
        except jax.errors.UnexpectedTracerError as err:
            others = [repr(v) for v, array in zip(parts.statics, parts.is_array) if not array]
            shapes = ", ".join([*(str(jax.typeof(a).str_short()) for a in arrays), *others]) or "no arguments"
            raise error(
                AutogradFunctionTypeError,
                self.function,
                f"'{self.parameter}' is a function closing over traced values, and it was called with arguments "
                f"({shapes}) it had not been called with while those values were being traced (in forward), so "
                "JAX can no longer read them; call it in forward with arguments of the same shapes and the same "
                "Python values, or pass the values themselves as arguments",
            ) from err
        index = {id(t): i for i, t in enumerate(self.tracers)}
        return jaxpr, [index[id(c)] if id(c) in index else (c,) for c in consts], out_tree


# Not walked: a module's or class's namespace is not an object's own state (it would be the whole program).
_OPAQUE = (int, float, complex, bool, str, bytes, type(None), type, types.ModuleType, jax.Array)


def _parts(value: Any) -> list[Any]:
    """The objects ``value`` holds directly."""
    if isinstance(value, Closure):  # the tracers it was made with are replaced where it is called
        return list(value.values)
    if type(value) is types.FunctionType:  # a function (no subclasses exist): no slots, not a pytree node
        cells = [cell.cell_contents for cell in _cells(value).values()]  # its closure, defaults and attributes
        return [*cells, *(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values(), *value.__dict__.values()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    if isinstance(value, Mapping):
        return [*value.keys(), *value.values()]
    if isinstance(value, np.ndarray):
        return list(value.flat) if value.dtype == object else []
    attributes = getattr(value, "__dict__", None)
    parts = list(attributes.values()) if isinstance(attributes, dict) else []
    parts.extend(getattr(value, slot, None) for cls in type(value).__mro__ for slot in _slot_names(cls))
    if isinstance(value, functools.partial):
        parts.extend([value.func, *value.args, *value.keywords.values()])
    elif isinstance(value, types.MethodType):
        parts.extend([value.__func__, value.__self__])
    children = jax.tree_util.tree_leaves(value, is_leaf=lambda x: x is not value)  # a registered pytree node
    if len(children) != 1 or children[0] is not value:
        parts.extend(children)
    return parts


def _cells(function: Any, empty: bool = False) -> dict[str, types.CellType]:
    """A plain function's closure, by the name its code gives each cell (``co_freevars``): the
    cells filled, or with ``empty`` every one; empty for anything but a plain function."""
    if type(function) is not types.FunctionType or not function.__closure__:
        return {}
    cells = zip(function.__code__.co_freevars, function.__closure__)
    return {name: cell for name, cell in cells if empty or cell != _EMPTY_CELL}


_EMPTY_CELL = types.CellType()  # a cell not yet filled, which can't be read


def _slot_names(cls: type) -> tuple[str, ...]:
    """The attribute names of the ``__slots__`` a class itself declares, private names mangled."""
    slots = cls.__dict__.get("__slots__", ())
    slots = (slots,) if isinstance(slots, str) else tuple(slots)
    return tuple(f"_{cls.__name__.lstrip('_')}{s}" if s.startswith("__") and not s.endswith("__") else s for s in slots)
