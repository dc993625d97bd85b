"""Finding JAX tracers that Python objects hold, where JAX can't see them.

JAX sees arrays only as pytree leaves. A tracer kept in an object's attributes, in what a
function closes over, or deep in containers escapes its trace unseen; ``_context`` refuses such
objects saved on ``ctx``, and ``_traced`` refuses differentiated values that forward or backward
hold. A function passed as an argument that holds them becomes a ``Closure``: a callable pytree
whose leaves are those values (closure conversion, as ``jax.closure_convert`` does it).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

_PLAIN = (int, float, complex, bool, str, bytes, type(None))


def holds_tracer(value: Any, wanted: Callable[[Tracer], bool] | None = None) -> bool:
    """Whether an object holds a JAX tracer (one that ``wanted`` accepts) anywhere: in containers,
    attributes (``__dict__``, ``__slots__``), pytree children, object arrays, or what a function,
    partial or bound method closes over; at any depth."""
    return next(_tracers(value, wanted), None) is not None


def tracers_in(value: Any, wanted: Callable[[Tracer], bool] | None = None) -> list[Tracer]:
    """The tracers (those ``wanted`` accepts) an object holds, each once, in the order found."""
    return list(_tracers(value, wanted))


def _tracers(value: Any, wanted: Callable[[Tracer], bool] | None) -> Iterator[Tracer]:
    """Each object once (cycles end), without recursion."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen or (isinstance(item, _OPAQUE) and not isinstance(item, Tracer)):
            continue
        seen.add(id(item))
        if isinstance(item, Tracer):
            if wanted is None or wanted(item):
                yield item
            continue
        stack.extend(reversed(_parts(item)))


@jax.tree_util.register_pytree_node_class
class Closure:
    """A function holding values being differentiated, as a callable pytree whose leaves are
    those values: a custom rule sees them as inputs (so they get gradients, from backward's
    cotangent for this pytree), and calling it runs the function with its leaves in their place.

    The function is traced at each call (``jax.closure_convert``), and the values it reads that
    are this closure's ``held`` tracers (by identity) are replaced by ``values``, the leaves this
    instance was rebuilt with: the custom rule's own tracers, or backward's residuals.
    """

    __slots__ = ("function", "held", "values")

    def __init__(self, function: Callable[..., Any], held: _Held, values: tuple[Any, ...]):
        self.function, self.held, self.values = function, held, tuple(values)

    @classmethod
    def holding(cls, function: Callable[..., Any], tracers: list[Tracer]) -> Closure:
        return cls(function, _Held(tuple(tracers)), tuple(tracers))

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, _Held]]:
        return self.values, (self.function, self.held)

    @classmethod
    def tree_unflatten(cls, static: tuple[Any, _Held], values: Any) -> Closure:
        return cls(*static, tuple(values))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if all(a is b for a, b in zip(self.values, self.held.tracers)):
            return self.function(*args, **kwargs)  # where it was made: nothing to replace
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        is_array = [isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves]
        statics = [None if array else leaf for leaf, array in zip(leaves, is_array)]

        def on_arrays(*arrays: Any) -> Any:
            it = iter(arrays)
            args_, kwargs_ = jax.tree_util.tree_unflatten(
                treedef, [next(it) if a else s for a, s in zip(is_array, statics)]
            )
            return self.function(*args_, **kwargs_)

        arrays = [leaf for leaf, array in zip(leaves, is_array) if array]
        converted, hoisted = jax.closure_convert(on_arrays, *arrays)
        index = {id(t): i for i, t in enumerate(self.held.tracers)}
        return converted(*arrays, *(self.values[index[id(h)]] if id(h) in index else h for h in hoisted))

    def __repr__(self) -> str:
        return f"Closure({self.function!r}, {len(self.values)} values)"


class _Held:
    """The tracers a ``Closure`` was made holding: static (equal only to itself, by identity)."""

    __slots__ = ("tracers",)

    def __init__(self, tracers: tuple[Tracer, ...]):
        self.tracers = tracers

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


# Not walked: a module's or class's namespace is not an object's own state (it would be the whole program).
_OPAQUE = (*_PLAIN, type, types.ModuleType, jax.Array)


def _parts(value: Any) -> list[Any]:
    """The objects ``value`` holds directly."""
    if isinstance(value, Closure):  # the tracers it was made with are replaced where it is called
        return list(value.values)
    if type(value) is types.FunctionType:  # a function (no subclasses exist): no slots, not a pytree node
        return _function_parts(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    if isinstance(value, Mapping):
        return [*value.keys(), *value.values()]
    if isinstance(value, np.ndarray):
        return list(value.flat) if value.dtype == object else []
    parts: list[Any] = []
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        parts.extend(attributes.values())
    for cls in type(value).__mro__:
        for slot in _slot_names(cls):
            parts.append(getattr(value, slot, None))
    if isinstance(value, functools.partial):
        parts.extend([value.func, *value.args, *value.keywords.values()])
    elif isinstance(value, types.MethodType):
        parts.extend([value.__func__, value.__self__])
    children = jax.tree_util.tree_leaves(value, is_leaf=lambda x: x is not value)  # a registered pytree node
    if len(children) != 1 or children[0] is not value:
        parts.extend(children)
    return parts


def _function_parts(function: types.FunctionType) -> list[Any]:
    """What a function holds: its closure's cells, its defaults and its attributes."""
    parts: list[Any] = [cell.cell_contents for cell in function.__closure__ or () if cell != _EMPTY_CELL]
    if function.__defaults__:
        parts.extend(function.__defaults__)
    if function.__kwdefaults__:
        parts.extend(function.__kwdefaults__.values())
    if function.__dict__:
        parts.extend(function.__dict__.values())
    return parts


_EMPTY_CELL = types.CellType()  # a cell not yet filled, which can't be read


def _slot_names(cls: type) -> tuple[str, ...]:
    """The attribute names of the ``__slots__`` a class itself declares, private names mangled."""
    slots = cls.__dict__.get("__slots__", ())
    slots = (slots,) if isinstance(slots, str) else tuple(slots)
    return tuple(f"_{cls.__name__.lstrip('_')}{s}" if s.startswith("__") and not s.endswith("__") else s for s in slots)
