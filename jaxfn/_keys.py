"""Strict keys for static values: ``1``, ``1.0``, ``True`` and ``np.float32(1)`` differ, and so
do ``0.0`` and ``-0.0``, though Python calls them equal.

``jit=True`` keys its compiled calls on them (``jax.jit`` keys static arguments by ``==``, which
would hand a call with ``1.0`` the program traced for ``1``); ``host=True`` keys its probes on
them, and a function argument closing over traced values (``_tracers.Closure``) its programs.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np


class Unkeyable(Exception):
    """A value with no strict key: not an immutable value (a list, an object, a function)."""


def value_key(value: Any) -> Any:
    """A hashable key that tells apart values Python calls equal (1, 1.0, True; 0.0, -0.0)."""
    kind = type(value)
    if value is None or kind in (int, bool, str, bytes):
        return kind, value
    if kind in (float, complex):
        return kind, np.asarray(value).tobytes()  # every bit: -0.0 and -nan too
    if isinstance(value, np.generic) and value.dtype.kind in "biufcmM":  # datetimes: the dtype names the unit
        return kind, value.dtype.str, value.tobytes()
    if isinstance(value, np.dtype):
        if value.metadata:
            raise Unkeyable  # NumPy leaves metadata out of equality and of every spelling
        return np.dtype, value.str, repr(value), value.isalignedstruct  # a record's fields, a subarray's shape
    if isinstance(value, enum.Enum):
        try:
            return kind, value.name, value_key(value.value)  # a Flag's unnamed members have name None
        except Unkeyable:
            if value.name is None:
                raise
            return kind, value.name
    if isinstance(value, type):
        return type, id(value), value  # by identity: np.float32 and jnp.float32 compare equal
    if isinstance(value, tuple) and kind is tuple:  # not a namedtuple: its class may compare fields differently
        return kind, tuple(value_key(v) for v in value)
    raise Unkeyable


def static_key(value: Any) -> Any:
    """A static argument's key: ``value_key``, or, for another hashable value (a function, a frozen
    config), the value itself, compared with ``==`` as ``jax.jit`` compares static arguments.
    Raises ``Unkeyable`` for an unhashable value."""
    try:
        return value_key(value)
    except Unkeyable:
        try:
            hash(value)
        except TypeError:
            raise Unkeyable from None
        return type(value), value


def structure_key(treedef: Any) -> Any:
    """A treedef with the static data of custom pytree nodes keyed strictly (``1`` and ``1.0`` differ)."""
    node_type, _ = treedef.node_data() or (None, None)
    if node_type in (tuple, list, None) and all(child.num_nodes == 1 for child in treedef.children()):
        return treedef  # a tuple or list of leaves: equality is exact
    return treedef, _aux_key(treedef)


def _aux_key(treedef: Any) -> Any:
    node_type, data = treedef.node_data() or (None, None)
    return node_type, _data_key(data), tuple(_aux_key(child) for child in treedef.children())


def _data_key(data: Any) -> Any:
    if isinstance(data, (tuple, list)):
        return type(data), tuple(_data_key(d) for d in data)
    try:
        return value_key(data)
    except Unkeyable:
        return type(data), data  # hashable aux data JAX already compares with ==


def split_key(parts: Any, kinds: Any = None) -> Any:
    """The strict key of a ``_split.Split`` (a call's arguments, a closure's call): its structure
    (``structure_key``), which leaves are arrays (or ``kinds``, finer), and the ``static_key`` of
    each leaf's Python value; its arrays' shapes and dtypes are not in it. Raises
    ``Unkeyable(leaf index)`` for a Python value with no key, ``TypeError`` for an unhashable
    structure."""
    statics = []
    for leaf, value in enumerate(parts.statics):  # None at an array leaf: told apart by the flags
        try:
            statics.append(static_key(value))
        except Unkeyable:
            raise Unkeyable(leaf) from None
    structure = structure_key(parts.treedef)
    hash(structure)
    return structure, parts.is_array if kinds is None else kinds, tuple(statics)
