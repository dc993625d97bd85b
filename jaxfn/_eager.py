"""Eager calls: outside any JAX trace, forward runs as the Python says, op by op, every call.

Nothing differentiates an eager call, so only forward runs, as in PyTorch's ``Function.apply``:
it sees the current values of everything it reads (globals, closures, clocks, random numbers),
and jaxfn never reads user code to decide anything. A compiled call is what a user asks for,
with ``jit=True`` (``Compiled``): ``jax.jit``'s semantics, keyed strictly on static values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from . import _jax_private, _keys, _rule
from ._arguments import STATIC, Arguments
from ._errors import AutogradFunctionTypeError, error, type_name


def call(definition: _rule.Definition, args: Arguments) -> Any:
    """Forward's output for one eager call, op by op."""
    out, info = _rule.primal(definition, args, args.arrays)
    return info.rebuild(out)


class Compiled:
    """``jit=True``: each call signature compiled once with ``jax.jit``.

    The signature is the arguments' pytree structure, their static values (keyed strictly:
    ``1``, ``1.0``, ``True`` and ``-0.0`` differ, as ``jax.jit``'s ``==`` would not tell) and each
    array's shape and dtype, which ``jax.jit`` keys itself. Python state forward reads is read
    when a signature is traced, as with ``jax.jit``. Python values in the output are those of
    the trace, put back in place.
    """

    def __init__(self, definition: _rule.Definition, traced: Callable[[Arguments], Any]):
        self._definition = definition
        self._traced = traced
        self._outputs: dict[Any, Any] = {}  # per signature: the output's treedef and Python values
        self._jitted = jax.jit(self._run, static_argnums=0)
        self._arrays_only = jax.jit(self._run_arrays)
        self._fast = definition.positional is not None  # until an output holds a Python value

    def fast_call(self, args: tuple[Any, ...]) -> Any:
        """The call whose arguments are one concrete JAX array per parameter, passed by position,
        where every output is an array: ``jax.jit`` alone keys it (the arrays' shapes and dtypes
        are the whole signature). MISS for any other call."""
        if not self._fast or len(args) != len(self._definition.positional or ()):
            return MISS
        for a in args:
            if not isinstance(a, jax.Array):
                return MISS
        if not _jax_private.outside_traces(args):
            return MISS
        try:
            return self._arrays_only(*args)
        except _PythonOutput:
            self._fast = False
            return MISS

    def _run_arrays(self, *arrays: Any) -> Any:
        out = self._traced(self._definition.bind(arrays, {}))
        if not all(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(out)):
            raise _PythonOutput
        return out

    def __call__(self, args: Arguments) -> Any:
        key = _Signature(args.structure(), _signature_key(self._definition.name, args))
        arrays = self._jitted(key, args.arrays)
        treedef, statics = self._outputs[key]
        leaves = iter(arrays)
        return jax.tree_util.tree_unflatten(treedef, [next(leaves) if s is _ARRAY else s for s in statics])

    def _run(self, key: _Signature, arrays: tuple[Any, ...]) -> list[Any]:
        args = key.args
        out = self._traced(Arguments(args.names, args.treedef, args.kinds, args.statics, tuple(arrays), args.varargs))
        leaves, treedef = jax.tree_util.tree_flatten(out)
        is_array = [isinstance(leaf, jax.Array) for leaf in leaves]
        self._outputs[key] = (treedef, tuple(_ARRAY if a else leaf for leaf, a in zip(leaves, is_array)))
        return [leaf for leaf, a in zip(leaves, is_array) if a]


_ARRAY = object()  # marks an array leaf of a compiled call's output
MISS = object()


class _PythonOutput(Exception):
    """A compiled call's output holds a Python value: it needs the keyed path, which keeps them."""


class _Signature:
    """A static argument of ``jax.jit``: one call's structure, hashed and compared by its strict key."""

    __slots__ = ("args", "key", "_hash")

    def __init__(self, args: Arguments, key: Any):
        self.args, self.key, self._hash = args, key, hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Signature) and self.key == other.key


def _signature_key(name: str, args: Arguments) -> Any:
    statics = []
    for position, (value, kind) in enumerate(zip(args.statics, args.kinds)):
        if kind == STATIC:
            statics.append(_static_key(name, args, position, value))
    return _keys.structure_key(args.treedef), args.kinds, tuple(statics)


def _static_key(name: str, args: Arguments, position: int, value: Any) -> Any:
    """A static value's strict key; for other hashable values (a function, a frozen config), the
    value itself, compared with ``==`` as ``jax.jit`` compares static arguments."""
    try:
        return _keys.value_key(value)
    except _keys.Unkeyable:
        pass
    try:
        hash(value)
    except TypeError:
        raise error(
            AutogradFunctionTypeError,
            name,
            f"with jit=True each static argument is part of the compiled call's key, as for jax.jit's static "
            f"arguments, so it must be hashable, but '{args.paths[position]}' is {type_name(value)}, which is not; "
            "pass a hashable value (a tuple, a frozen dataclass), or drop jit=True to run forward op by op",
        ) from None
    return type(value), value
