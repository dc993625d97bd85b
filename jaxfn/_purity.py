"""What an eager call's result can depend on besides its arrays, for ``_eager``'s rule.

* ``key``: a call's static structure and values, keyed strictly (``1``, ``1.0`` and ``True``
  differ; so do ``0.0`` and ``-0.0``), with the x64 mode and the arrays' types; None when a
  static value is not an immutable value.
* ``outside_reads``: what forward reads by name (globals, closure cells, attributes of a user's
  module or class), to be checked unchanged (``unchanged``) before each compiled call; None when
  one of them is a mutable object or a function with hidden state (random numbers, clocks).
"""

from __future__ import annotations

import builtins
import dis
import enum
import inspect
import os
import struct
import sys
import sysconfig
import types
from typing import Any

import jax
import numpy as np
from jax._src import config as _config

from ._arguments import STATIC, Arguments


class Uncacheable(Exception):
    pass


def key(name: str, args: Arguments) -> Any:
    """The cache key of a call, or None where a static value is not an immutable value."""
    try:
        statics = tuple(value_key(s) for s, kind in zip(args.statics, args.kinds) if kind == STATIC)
        structure = _structure_key(args.treedef)
    except Uncacheable:
        return None
    arrays = tuple(a.aval if isinstance(a, jax.Array) else (a.shape, a.dtype, "numpy") for a in args.arrays)
    return name, settings(), structure, args.kinds, statics, arrays


def x64() -> bool:
    """Whether 64-bit types are on (a result's dtype depends on it)."""
    return _config.enable_x64.value


def settings() -> Any:
    """The JAX settings a trace depends on (x64, dtype and rank promotion, PRNG implementation
    and more), as ``jax.jit`` keys its own cache on them: part of every key."""
    return _config.trace_context()


def _structure_key(treedef: Any) -> Any:
    """The treedef, with the static data of custom pytree nodes keyed strictly (1 and 1.0 differ)."""
    node_type, _ = treedef.node_data() or (None, None)
    children = treedef.children()
    if node_type in (tuple, list, None) and all(child.num_nodes == 1 for child in children):
        return treedef  # a tuple or list of leaves: equality is exact
    return treedef, _aux_key(treedef)


def _aux_key(treedef: Any) -> Any:
    node_type, data = treedef.node_data() or (None, None)
    return node_type, _static_data_key(data), tuple(_aux_key(child) for child in treedef.children())


def _static_data_key(data: Any) -> Any:
    if isinstance(data, (tuple, list)):
        return type(data), tuple(_static_data_key(d) for d in data)
    return value_key(data)


def value_key(value: Any) -> Any:
    """A key that tells apart values Python calls equal (1, 1.0, True; 0.0, -0.0)."""
    kind = type(value)
    if value is None or kind in (int, bool, str, bytes):
        return kind, value
    if kind is float:
        return kind, struct.pack("<d", value)  # every bit: -0.0 and -nan too
    if kind is complex:
        return kind, struct.pack("<dd", value.real, value.imag)
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return kind, value.dtype.str, value.tobytes()
    if isinstance(value, np.dtype):
        if value.metadata:
            raise Uncacheable  # NumPy leaves metadata out of equality and of every spelling
        return np.dtype, value.str, repr(value), value.isalignedstruct  # a record's fields, a subarray's shape
    if isinstance(value, enum.Enum):
        try:
            return kind, value.name, value_key(value.value)  # a Flag's unnamed members have name None
        except Uncacheable:
            if value.name is None:
                raise
            return kind, value.name
    if isinstance(value, type):
        return type, value
    raise Uncacheable


# -- what forward reads by name --------------------------------------------------------------
MISSING = object()
_SAFE_TYPES = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type, np.ufunc, jax.Array)


def outside_reads(functions: tuple[Any, ...], statics: tuple[Any, ...] = ()) -> tuple[tuple[Any, str, Any], ...] | None:
    """The values the user's ``functions`` (forward, setup_context) and the user functions they
    reach by name (helpers, a decorator's wrapped function) read by name from their globals and
    closures, and through the call's static arguments that are classes or enum members
    (``cfg.scale``), to check before each compiled call; None if one of them is a mutable object
    or can't be followed (then forward never compiles).

    An attribute may be read in any of these functions (forward passes ``cfg`` to a helper that
    reads ``cfg.scale``), so attributes are recorded for the names of all of them: the functions
    reached are found first, growing until recording their reads reaches no new one."""
    reached = list(functions)
    while True:
        if len(reached) > _CALLS:
            return None  # too many functions to follow: run op by op rather than guess
        if not all(isinstance(f, types.FunctionType) for f in reached):
            return None  # a bound method or callable object may read its own mutable state
        codes = [_names(f.__code__) for f in reached]
        if any(c[1] & _HIDDEN_STATE or not all(map(_library, c[2])) for c in codes):
            return None  # hidden state (random numbers, clocks), or a local `import settings`
        names = set().union(*(c[1] for c in codes))
        reads: list[tuple[Any, str, Any]] = []
        for function, (global_names, _, _) in zip(reached, codes):
            if not _add_function_reads(function, global_names, names, reads):
                return None
        for value in statics:
            if not _add_attribute_reads(value, names, reads, depth=_DEPTH):
                return None
        known = {id(f) for f in reached}
        new = {id(v): v for _, _, v in reads if _user_function(v) and id(v) not in known}
        if not new:
            return tuple(reads)
        reached.extend(new.values())


# Names of functions with hidden state (random numbers, clocks): a forward calling one never compiles.
_HIDDEN_STATE = {"random", "rand", "randn", "randint", "default_rng", "getrandbits", "urandom", "uuid1", "uuid4",
                 "time", "time_ns", "perf_counter", "monotonic", "now", "today", "shuffle", "permutation",
                 # reads jaxfn can't follow by name: through strings, namespaces or the environment
                 "getattr", "globals", "vars", "locals", "eval", "exec", "environ", "getenv", "__dict__",
                 "modules", "attrgetter", "methodcaller", "builtins", "__builtins__", "import_module",
                 "__import__"}  # fmt: skip
_DEPTH = 4  # attribute chains followed: settings.model.layer.scale
# Libraries whose module attributes are functions and constants, not a user's settings.
_LIBRARIES = {"jax", "jaxlib", "jaxfn", "numpy", "scipy", "ml_dtypes", "math", "cmath", "functools", "operator"}


_CALLS = 8  # user functions followed from forward: a decorator's wrapper, the helpers it calls


def _add_function_reads(function: types.FunctionType, global_names: set[str], names: set[str], reads: list) -> bool:
    """Record what ``function`` reads from its globals (and builtins, which can be patched) and
    closure cells; False if one is a mutable object."""
    if not _add_reads(function.__globals__, sorted(global_names), names, reads, depth=_DEPTH):
        return False
    builtins_ = vars(builtins)
    missing = [name for name in sorted(global_names) if name not in function.__globals__]
    reads.extend((builtins_, name, builtins_.get(name, MISSING)) for name in missing)
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if not _immutable(value) or not _add_attribute_reads(value, names, reads, depth=_DEPTH):
            return False
        reads.append((cell, "", value))
    return True


def _user_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType) and not _library(value.__module__)


def _add_reads(namespace: Any, candidates: list[str], names: set[str], reads: list, depth: int) -> bool:
    """Record ``namespace[name]`` for each candidate name (a missing one as MISSING: defining it
    later changes what forward reads); False if one is a mutable object."""
    for name in candidates:
        value = namespace.get(name, MISSING)
        if value is not MISSING and (not _immutable(value) or not _add_attribute_reads(value, names, reads, depth)):
            return False
        reads.append((namespace, name, value))
    return True


def _add_attribute_reads(value: Any, names: set[str], reads: list, depth: int) -> bool:
    """For a user's module, class or enum member (and each one inside a tuple), also record the
    attributes forward may read from it (``config.scale``, ``MyFunction.k``, ``Mode.A.factor``):
    they can be rebound."""
    if isinstance(value, (tuple, frozenset)):
        if type(value) not in (tuple, frozenset) and not _add_attribute_reads(type(value), names, reads, depth):
            return False  # a namedtuple's class attributes
        return all(_add_attribute_reads(v, names, reads, depth) for v in value)
    if isinstance(value, types.ModuleType):
        if _library(value.__name__, value):
            return True
        return depth > 0 and _add_reads(vars(value), sorted(names), names, reads, depth - 1)
    if isinstance(value, (type, enum.Enum)):
        if _library(type(value).__module__ if isinstance(value, enum.Enum) else value.__module__):
            return True
        # deeper than _DEPTH: not followed, so never compiled
        return depth > 0 and _add_reads(_Attributes(value), sorted(names), names, reads, depth - 1)
    return True


def _library(name: str | None, module: Any = None) -> bool:
    """Whether a module (``module``, or the one named ``name``) is a library's (jax, numpy,
    Python's own), whose attributes are functions and constants, not a user's settings. A user's
    module that shares a standard module's name (``test``, ``trace``) is not: its file lies
    outside Python's own folder."""
    root = (name or "").split(".")[0]
    if root in _LIBRARIES:
        return True
    if root not in sys.stdlib_module_names:
        return False
    module = module if module is not None else sys.modules.get(name or "")
    if module is None:
        return False
    file = getattr(module, "__file__", None)
    return file is None or os.path.realpath(file).startswith(_STDLIB)


_STDLIB = tuple({os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")})


class _Attributes:
    """The attributes of a class (through its bases) or of an enum member, with a dict's ``get``.

    A member's own attributes are read from its ``__dict__`` and its class's statically, so a
    method read twice is the very same object (``getattr`` would make a new bound method)."""

    __slots__ = ("owner",)

    def __init__(self, owner: Any):
        self.owner = owner

    def get(self, name: str, default: Any) -> Any:
        if isinstance(self.owner, type):
            return getattr(self.owner, name, default)
        own = getattr(self.owner, "__dict__", {})
        return own[name] if name in own else inspect.getattr_static(type(self.owner), name, default)


_GLOBAL_LOADS = {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"}


def _names(code: types.CodeType) -> tuple[set[str], set[str], set[str]]:
    """The global names ``code`` (and code nested in it) reads, every name it uses (globals and
    attributes), and the modules it imports."""
    instructions = list(dis.get_instructions(code))
    global_names = {i.argval for i in instructions if i.opname in _GLOBAL_LOADS}
    imported = {i.argval for i in instructions if i.opname == "IMPORT_NAME"}
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner_globals, inner, inner_imports = _names(const)
            global_names |= inner_globals
            names |= inner
            imported |= inner_imports
    return global_names, names, imported


def _immutable(value: Any) -> bool:
    if isinstance(value, _SAFE_TYPES) or value is None:
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(v) for v in value)
    try:
        value_key(value)
        return True
    except Uncacheable:
        pass
    module = type(value).__module__ or ""
    return module.split(".")[0] in ("jax", "jaxlib", "jaxfn") and callable(value)  # jitted and custom functions


def lookup(where: Any, name: str) -> Any:
    if not isinstance(where, types.CellType):  # a module's or class's namespace
        return where.get(name, MISSING)
    try:
        return where.cell_contents
    except ValueError:
        return MISSING


def unchanged(reads: tuple[tuple[Any, str, Any], ...]) -> bool:
    """Whether every value recorded by ``outside_reads`` is still the very same object."""
    for where, name, value in reads:
        if lookup(where, name) is not value:
            return False
    return True
