"""Finding JAX tracers that Python objects hold, where JAX can't see them.

JAX sees arrays only as pytree leaves. A tracer kept in an object's attributes, in what a
function closes over, or deep in containers escapes its trace unseen; ``_context`` refuses such
objects saved on ``ctx``, and ``_traced`` refuses differentiated values that forward, backward or
a function passed as an argument hold.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

_PLAIN = (int, float, complex, bool, str, bytes, type(None))


def holds_tracer(value: Any, wanted: Callable[[Tracer], bool] | None = None) -> bool:
    """Whether an object holds a JAX tracer (one that ``wanted`` accepts) anywhere: in containers,
    attributes (``__dict__``, ``__slots__``), pytree children, object arrays, or what a function,
    partial or bound method closes over; at any depth, each object once (cycles end), without
    recursion."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Tracer):
            if wanted is None or wanted(item):
                return True
            continue
        if isinstance(item, _OPAQUE) or id(item) in seen:
            continue
        seen.add(id(item))
        stack.extend(_parts(item))
    return False


# Not walked: a module's or class's namespace is not an object's own state (it would be the whole program).
_OPAQUE = (*_PLAIN, type, types.ModuleType, jax.Array)


def _parts(value: Any) -> list[Any]:
    """The objects ``value`` holds directly."""
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
