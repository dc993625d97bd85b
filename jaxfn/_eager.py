"""The eager fast path: a compiled forward per static signature, for calls outside any trace.

Called outside ``jit``/``grad``/``vmap`` (no argument is a tracer), a jaxfn function is not being
differentiated, so only its forward runs. Running it op by op costs one dispatch per operation,
as a hand-written ``jax.custom_vjp`` does; instead jaxfn compiles the forward once per key and
calls the compiled version. The key is the call's static structure (pytree structure, static
argument values) and each array's shape, dtype and weak type. The cache is an LRU of
``MAX_ENTRIES`` compiled forwards, so calls with ever-new shapes do not grow memory without limit.
A forward that needs concrete values (``if float(x.sum()) > 0:``) cannot be compiled: its key
is remembered as eager-only and it runs op by op, as it would in PyTorch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import jax

MAX_ENTRIES = 128

# What JAX raises when a forward needs a concrete value under jit.
_NEEDS_VALUES = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
)

_EAGER_ONLY = object()


class EagerCache:
    """Compiled forwards of one jaxfn function, keyed by static structure and array types."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[Any, Any] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def call(self, args: Any, forward: Callable[[Any, tuple[Any, ...]], Any], fallback: Callable[[], Any]) -> Any:
        """``forward(args, arrays)`` compiled and cached, or ``fallback()`` where it can't be."""
        key = _key(args)
        if key is None:
            return fallback()
        entry = self._entries.get(key)
        if entry is _EAGER_ONLY:
            self._entries.move_to_end(key)
            return fallback()
        if entry is None:
            structure = args.structure()
            entry = jax.jit(lambda *arrays: forward(structure, arrays))
            try:
                out = entry(*args.arrays)
            except _NEEDS_VALUES:
                self._store(key, _EAGER_ONLY)
                return fallback()
            self._store(key, entry)
            return out
        self._entries.move_to_end(key)
        return entry(*args.arrays)

    def _store(self, key: Any, entry: Any) -> None:
        self._entries[key] = entry
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


def outside_traces(arrays: tuple[Any, ...]) -> bool:
    """Whether no array is a tracer: nothing is transforming this call."""
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def _key(args: Any) -> Any:
    """The cache key of a call, or None where a static value is unhashable."""
    try:
        static = args.static_key()
    except TypeError:
        return None
    types = tuple((a.shape, a.dtype, getattr(a, "weak_type", False)) for a in args.arrays)
    return static, types
