"""Eager calls: forward runs as the Python says, and a compiled copy only where nobody can tell.

Outside any trace (no JAX transformation is active and no argument is a tracer), nothing
differentiates a call, so only forward runs. As in PyTorch, it runs op by op, once per call.
jaxfn replaces it with a compiled copy only when that cannot change a result. The rule, per
*key* (the call's pytree structure, its static argument values, and each array's shape and
dtype):

1. A key is cacheable only if every static argument is an immutable value: a number, string,
   bytes, ``None``, NumPy scalar, dtype, type or enum member. Keys tell apart values that
   compare equal (``1``, ``1.0``, ``True``, ``np.float32(1)``; ``0.0`` and ``-0.0``). Any other
   static argument (an object, a list, a function) means op by op, every time, and nothing is
   kept.
2. The first call of a key runs op by op. The second traces forward (forward's Python runs
   once, as the call's run) and evaluates the trace. The third traces it again: if the two
   traces are identical, constants included, and forward reads nothing by name from outside
   that could change (see ``_purity.outside_reads``), the trace is compiled and used from then on.
   Otherwise (a forward that draws from ``np.random``, reads a mutable object, or needs
   concrete values) the key runs op by op for good.
3. Before each compiled call, the values forward reads by name (and the attributes it may read
   through a user's module, class or enum member, static arguments included) are checked to be
   the same objects; if one was rebound, the key is validated again. The compiled copy computes
   what ``jax.jit`` of forward does: XLA's fusion may change the last bit of a float.

The bookkeeping is guarded by a lock, so eager calls are safe from several threads. Compiled
copies are shared by every ``AutogradFunction`` built from the same ``forward`` function, so a
function re-created inside a loop does not compile again.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import weakref
from typing import Any

import jax
import numpy as np
from jax._src import core as _jax_core
from jax._src.array import ArrayImpl as _ARRAY_IMPL  # concrete arrays' class, named without starting a backend
from jax.core import Tracer
from jax.extend.core import jaxpr_as_fun

from . import _purity, _rule
from ._arguments import STATIC, Arguments
from ._errors import AutogradFunctionError

MAX_ENTRIES = 128


# The cheapest test of "no JAX transformation is active"; JAX has no public API for it.
_trace_state_clean = _jax_core.trace_state_clean
MISS = object()


def outside_traces(arrays: tuple[Any, ...]) -> bool:
    """Whether no JAX transformation is active and no array is a tracer."""
    return _trace_state_clean() and not any(isinstance(a, Tracer) for a in arrays)


class _OpByOp:
    """A key that always runs op by op."""


_OP_BY_OP = _OpByOp()
_SEEN = object()  # called once, op by op


@dataclasses.dataclass(frozen=True, eq=False)
class _Traced:
    jaxpr: Any
    info: Any


class _Compiled:
    """A validated key's compiled forward, with what forward reads by name from outside."""

    __slots__ = ("run", "info", "reads", "single")

    def __init__(self, run: Any, info: Any, reads: tuple[tuple[Any, str, Any], ...]):
        self.run, self.info, self.reads = run, info, reads  # reads: (namespace, name, value)
        self.single = info.single_array

    def still_valid(self) -> bool:
        return _purity.unchanged(self.reads)

    def __call__(self, arrays: Any) -> Any:
        out = self.run(*arrays)
        return out[0] if self.single else self.info.rebuild(out)


class EagerPath:
    """The eager calls of every jaxfn function built from one ``forward``."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._fast: dict[Any, _Compiled] = {}  # compiled entries of calls whose arguments are all arrays
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def states(self) -> list[str]:
        """Each key's state, oldest first: 'seen', 'traced', 'compiled' or 'op by op' (for tests)."""
        names = {_OpByOp: "op by op", _Traced: "traced", _Compiled: "compiled"}
        return [names.get(type(entry), "seen") for entry in list(self._entries.values())]

    def fast_call(self, definition: _rule.Definition, args: tuple[Any, ...]) -> Any:
        """The compiled forward for a call whose arguments are all concrete JAX arrays passed
        positionally, one per parameter, when that key is compiled and still valid; else MISS.

        This skips binding and splitting the arguments: it is the common eager call.
        """
        if not self._fast:
            return MISS
        for a in args:
            if type(a) is not _ARRAY_IMPL:
                return MISS
        entry = self._fast.get((definition.name, _purity.settings(), tuple([a.aval for a in args])))
        if entry is None or not _trace_state_clean() or not entry.still_valid():
            return MISS
        return entry(args)

    def call(self, definition: _rule.Definition, args: Arguments) -> Any:
        """Forward's output for one eager call, op by op or compiled, as the rule above says."""
        key = _purity.key(definition.name, args)
        if key is None:
            return _op_by_op(definition, args)
        entry = self._get(key)
        if type(entry) is _Compiled and entry.still_valid():
            return entry(args.arrays)
        if entry is None:
            self._put(key, _SEEN)
            return _op_by_op(definition, args)
        if entry is _OP_BY_OP:
            return _op_by_op(definition, args)
        return self._trace(key, entry, definition, args)

    def _trace(self, key: Any, entry: Any, definition: _rule.Definition, args: Arguments) -> Any:
        try:
            closed, info = _trace(definition, args)
        except AutogradFunctionError:
            raise  # a bad output: op by op would raise the same
        except Exception:  # noqa: BLE001 - a forward that can't be traced (needs values): run it as Python does
            self._put(key, _OP_BY_OP)
            return _op_by_op(definition, args)
        if type(entry) is _Traced:
            reads = _purity.outside_reads(definition.user_functions, _static_values(args))
            if not _same_trace(entry, closed, info) or reads is None:
                self._put(key, _OP_BY_OP)
            else:
                compiled = _Compiled(jax.jit(jaxpr_as_fun(closed)), info, reads)
                self._put(key, compiled, _fast_key(definition, args))
                return compiled(args.arrays)
        else:
            self._put(key, _Traced(closed, info))
        return info.rebuild(jaxpr_as_fun(closed)(*args.arrays))

    def _get(self, key: Any) -> Any:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def _put(self, key: Any, entry: Any, fast_key: Any = None) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            # The fast table holds exactly the compiled entries of all-array calls still in the LRU.
            self._fast = {k: e for k, e in self._fast.items() if e is not entry and _held(self._entries, e)}
            if fast_key is not None:
                self._fast[fast_key] = entry


_PATHS: weakref.WeakKeyDictionary[Any, EagerPath] = weakref.WeakKeyDictionary()
_PATHS_LOCK = threading.Lock()


def path_for(forward: Any) -> EagerPath:
    """The eager path shared by every jaxfn function built from ``forward``."""
    if not _weakrefable(forward):
        return EagerPath()
    with _PATHS_LOCK:
        path = _PATHS.get(forward)
        if path is None:
            path = _PATHS[forward] = EagerPath()
        return path


def _weakrefable(value: Any) -> bool:
    try:
        weakref.ref(value)
    except TypeError:
        return False
    return True


def _held(entries: collections.OrderedDict[Any, Any], entry: Any) -> bool:
    return any(e is entry for e in entries.values())


def _fast_key(definition: _rule.Definition, args: Arguments) -> Any:
    """The key ``fast_call`` looks up, for a call whose arguments are one JAX array per parameter."""
    simple = definition.positional is not None and len(args.names) == len(definition.positional)
    if not simple or len(args.kinds) != len(args.names) or not all(type(a) is _ARRAY_IMPL for a in args.arrays):
        return None
    if args.treedef != jax.tree_util.tree_structure(tuple(args.arrays)):
        return None
    return definition.name, _purity.settings(), tuple(a.aval for a in args.arrays)


def _static_values(args: Arguments) -> tuple[Any, ...]:
    return tuple(value for value, kind in zip(args.statics, args.kinds) if kind == STATIC)


def _op_by_op(definition: _rule.Definition, args: Arguments) -> Any:
    out, info = _rule.primal(definition, args, args.arrays)
    return info.rebuild(out)


def _trace(definition: _rule.Definition, args: Arguments) -> tuple[Any, Any]:
    infos = []
    structure = args.structure()

    def forward(*arrays: Any) -> Any:
        out, info = _rule.primal(definition, structure, arrays)
        infos.append(info)
        return out

    closed = jax.make_jaxpr(forward)(*args.arrays)
    return closed, infos[-1]


def _same_trace(traced: _Traced, closed: Any, info: Any) -> bool:
    """Whether two traces of forward are identical, constants and Python outputs included."""
    a, b = traced.jaxpr, closed
    if str(a.jaxpr) != str(b.jaxpr) or len(a.consts) != len(b.consts) or not traced.info.same_as(info):
        return False
    return all(_same_value(x, y) for x, y in zip(a.consts, b.consts))


def _same_value(x: Any, y: Any) -> bool:
    try:
        x, y = np.asarray(x), np.asarray(y)
    except Exception:  # noqa: BLE001 - not readable as NumPy (a PRNG key): only identity counts
        return x is y
    return x.dtype == y.dtype and x.shape == y.shape and bool(np.all((x == y) | ((x != x) & (y != y))))
