"""Eager calls: outside any JAX trace, forward runs as the Python says, op by op, every call.

Nothing differentiates an eager call, so only forward runs, as in PyTorch's ``Function.apply``:
it sees the current values of everything it reads (globals, closures, clocks, random numbers),
and jaxfn never reads user code to decide anything. A compiled call is what a user asks for,
with ``jit=True`` (``Compiled``): ``jax.jit``'s semantics, keyed strictly on static values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from . import _jax_private, _keys, _rule, _split
from ._arguments import Arguments
from ._errors import AutogradFunctionTypeError, error, type_name


def call(definition: _rule.Definition, args: Arguments) -> Any:
    """Forward's output for one eager call, op by op (also a traced call inside
    ``_rule.plain_forward``, where forward's operations are what JAX transposes)."""
    out, info = _rule.primal(definition, args, args.arrays)
    return info.rebuild(out)


class Compiled:
    """``jit=True``: each call signature compiled once with ``jax.jit``.

    The signature is the arguments' pytree structure, their static values (keyed strictly:
    ``1``, ``1.0``, ``True`` and ``-0.0`` differ, as ``jax.jit``'s ``==`` would not tell) and each
    array's shape and dtype, which ``jax.jit`` keys itself. Python state forward reads is read
    when a signature is traced, as with ``jax.jit``. Python values in the output are those of
    the trace, carried in the output's pytree structure, so each compiled program keeps its own.
    """

    def __init__(self, definition: _rule.Definition, traced: Callable[[Arguments], Any]):
        self._definition = definition
        self._traced = traced
        self._jitted = keeping_python_values(jax.jit(self._run, static_argnums=0))
        self._arrays_only = keeping_python_values(jax.jit(self._run_arrays))

    def fast_call(self, args: tuple[Any, ...]) -> Any:
        """The call whose arguments are one concrete JAX array per parameter, passed by position:
        ``jax.jit`` alone keys it (the arrays' shapes and dtypes are the whole signature). MISS
        for any other call."""
        positional = self._definition.positional
        if positional is None or len(args) != len(positional) or not _jax_private.concrete_arrays_outside_traces(args):
            return MISS
        return self._arrays_only(*args)

    def _run_arrays(self, *arrays: Any) -> Any:
        return box_python_values(self._traced(self._definition.bind(arrays, {})))

    def __call__(self, args: Arguments) -> Any:
        key = _Signature(args.structure(), _signature_key(self._definition.name, args))
        return self._jitted(key, args.arrays)

    def _run(self, key: _Signature, arrays: tuple[Any, ...]) -> Any:
        return box_python_values(self._traced(dataclasses.replace(key.args, arrays=tuple(arrays))))


@jax.tree_util.register_static
class _Apart:
    """What a jitted call's output holds besides its arrays (a ``_split.Split``), as a pytree node
    with no children: it rides in the output's structure, which ``jax.jit`` keeps per compiled
    program. Compared and hashed by identity (``object``'s own), so the parts may hold any value,
    hashable or not."""

    __slots__ = ("parts",)

    def __init__(self, parts: _split.Split):
        self.parts = parts


def box_python_values(out: Any) -> Any:
    """``out``'s JAX arrays, and the rest kept apart, as a jitted function returns them (one array
    as it is: the common case, with nothing kept apart)."""
    if isinstance(out, jax.Array):
        return out
    arrays, parts = _split.split(out, lambda leaf: isinstance(leaf, jax.Array))
    return arrays, _Apart(parts)


def keeping_python_values(jitted: Callable[..., Any]) -> Callable[..., Any]:
    """A jitted function that returns ``box_python_values``, returning the output whole again."""

    def call(*args: Any) -> Any:
        out = jitted(*args)
        if isinstance(out, jax.Array):
            return out
        arrays, apart = out
        return apart.parts.join(arrays)

    return call


MISS = object()


@dataclasses.dataclass(frozen=True, slots=True)
class _Signature:
    """A static argument of ``jax.jit``: one call's structure, hashed and compared by its strict key."""

    args: Arguments = dataclasses.field(compare=False)
    key: Any


def _signature_key(name: str, args: Arguments) -> Any:
    """The call's strict key (``_keys.split_key``); where it has none, refused naming the value."""
    try:
        return _keys.split_key(args, args.kinds)
    except _keys.Unkeyable as err:
        (leaf,) = err.args
        raise error(
            AutogradFunctionTypeError,
            name,
            f"with jit=True each static argument is part of the compiled call's key, as for jax.jit's static "
            f"arguments, so it must be hashable, but '{args.paths[leaf]}' is {type_name(args.statics[leaf])}, which "
            "is not; pass a hashable value (a tuple, a frozen dataclass), or drop jit=True to run forward op by op",
        ) from None
    except TypeError:
        unhashable = [n for n, child in zip(args.names, args.treedef.children()) if not _hashable(child)]
        raise error(
            AutogradFunctionTypeError,
            name,
            "with jit=True the arguments' pytree structure is part of the compiled call's key, as for jax.jit, so "
            f"the static data of its pytree nodes must be hashable, but that of '{unhashable[0]}' is not; make the "
            "node's static (aux) data hashable (a tuple, not a list or dict), or drop jit=True",
        ) from None


def _hashable(treedef: Any) -> bool:
    try:
        hash(_keys.structure_key(treedef))
    except TypeError:
        return False
    return True
