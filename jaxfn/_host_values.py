"""How values cross between a host forward or backward (``host=True``, NumPy) and JAX.

A host forward's output leaves become JAX arrays of the shapes and dtypes the probe learnt
(``spec``, ``conform``). What it saves on ``ctx`` crosses to backward as any context does
(``Context.to_residuals`` / ``from_residuals``: ``split``), each saved leaf exactly
(``carry``, ``send``, ``receive``): JAX never narrows it. Any other Python object forward keeps
on ``ctx`` (a SciPy factorization, a torch graph) is kept per call on the host (``KEPT``), as
PyTorch keeps it, and only its key crosses.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._context import Context, Remainder
from ._errors import AutogradFunctionTypeError, error, type_name


def split(ctx: Context) -> tuple[Remainder, list[Any]]:
    """A host forward's context: its static remainder, and every value it holds as a host value,
    each named as the traced rule names a save (``remainder.save_names``: ``cosx``, ``0``, ``scale``)."""
    values, remainder = ctx.to_residuals(lambda leaf: True)  # its state keeps no output of this call (holding)
    # JAX arrays where host code made some
    return remainder, [np.asarray(v) if isinstance(v, jax.Array) else v for v in values]


# How a value saved on ctx by a host forward crosses to backward. Everything numeric crosses
# exactly: an array of a dtype JAX holds as it is (a float32 array; a float64 one with x64 on) as
# an array (its ``spec``); anything else as the raw bytes of a NumPy value (``Raw``): a NumPy
# scalar, or an array JAX would narrow or can't hold (float64 with x64 off, datetime, strings,
# records), as itself; a Python number as a 64-bit one. Any other Python value (a str, None, an
# object) is kept on the host per call (``KEPT``) and only its key crosses: a value forward
# computes from this call's data (a branch it took) is this call's own, never the probe's.


@dataclasses.dataclass(frozen=True)
class Raw:
    """A saved value that crosses as the bytes of a NumPy value of ``dtype`` and ``shape``."""

    dtype: np.dtype
    shape: tuple[int, ...]
    kind: type  # as backward gets it: np.ndarray, np.generic (a NumPy scalar), a Python number's type, or Kept


NUMBERS = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}


def carry(value: Any) -> Any:
    if type(value) in NUMBERS:
        return Raw(np.dtype(NUMBERS[type(value)]), (), type(value))
    if not isinstance(value, (np.ndarray, np.generic)) or value.dtype == object:
        return Raw(np.dtype(np.int64), (), Kept)  # kept per call: a Python value forward computes from the data
    numeric = jnp.issubdtype(value.dtype, np.number) or value.dtype == np.bool_
    scalar = isinstance(value, np.generic)
    if scalar or not numeric or jax.dtypes.canonicalize_dtype(value.dtype) != value.dtype:
        return Raw(value.dtype, tuple(np.shape(value)), np.generic if scalar else np.ndarray)
    return spec(value)


class Kept:
    """Objects host forwards kept on ctx, by key, until their backward has run, as PyTorch keeps a
    Function's ctx until backward frees it.

    An entry lives until a backward has read it and a later host forward keeps something (a
    ``jax.jacrev`` runs one backward per row before any forward runs again, so all of them find
    it); entries no backward reads (a ``jax.vjp`` whose pullback is never called) are dropped
    oldest first beyond ``limit``. A backward that finds its entry gone raises, naming the function.
    """

    def __init__(self, limit: int = 65536):
        self.limit = limit
        self._entries: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._read: set[int] = set()
        self._keys = itertools.count(1)
        self._lock = threading.Lock()

    def keep(self, value: Any) -> int:
        with self._lock:
            while self._read:  # what backwards have read: freed
                self._entries.pop(self._read.pop(), None)
            while len(self._entries) >= self.limit:
                self._entries.popitem(last=False)
            key = next(self._keys)
            self._entries[key] = value
            return key

    def get(self, name: str, key: int) -> Any:
        with self._lock:
            if key not in self._entries:
                raise error(AutogradFunctionTypeError, name, _GONE)
            self._read.add(key)
            return self._entries[key]


KEPT = Kept()

_GONE = (
    "its host backward (host=True) reads a Python object its forward kept on ctx, but that object was freed: "
    "jaxfn keeps such objects per call until that call's backward has run and another host forward has started "
    "(as PyTorch frees a graph after backward), or drops the oldest beyond KEPT.limit calls whose backward never "
    "ran; call the pullback before calling the function again, or save arrays instead of objects"
)


def carried_spec(carry: Any) -> jax.ShapeDtypeStruct:
    if isinstance(carry, Raw):
        return jax.ShapeDtypeStruct((carry.dtype.itemsize * int(np.prod(carry.shape)),), np.uint8)
    return carry


def send(name: str, value: Any, carry: Any) -> np.ndarray:
    """Runs on the host after forward: a saved value as the array that crosses to backward."""
    if not isinstance(carry, Raw):
        return conform(name, "saved value", value, carry, exact=True)
    if carry.kind is Kept:
        value = KEPT.keep(value)
    elif carry.kind in NUMBERS:
        if type(value) is not carry.kind:
            raise error(AutogradFunctionTypeError, name, changed(value, f"a Python {carry.kind.__name__}"))
        if type(value) is int and not -(2**63) <= value < 2**63:
            raise error(
                AutogradFunctionTypeError,
                name,
                f"a host forward (host=True) saved the Python number {value!r} on ctx, which does not fit 64 bits; "
                "save it as a NumPy array or a string",
            )
    elif not isinstance(value, (np.ndarray, np.generic)) or (value.dtype, value.shape) != (carry.dtype, carry.shape):
        raise error(
            AutogradFunctionTypeError,
            name,
            changed(value, f"a NumPy value of dtype {carry.dtype} and shape {carry.shape}"),
        )
    return np.frombuffer(np.asarray(value, carry.dtype).tobytes(), np.uint8).copy()


def receive(name: str, carry: Any, value: np.ndarray) -> Any:
    """Runs on the host before backward: a saved value as forward saved it."""
    if not isinstance(carry, Raw):
        return value
    array = np.frombuffer(value.tobytes(), carry.dtype).reshape(carry.shape).copy()
    if carry.kind is np.ndarray:
        return array
    if carry.kind is Kept:
        return KEPT.get(name, int(array[()]))
    return array[()] if carry.kind is np.generic else carry.kind(array[()])


def changed(value: Any, first: str) -> str:
    return (
        f"a host forward (host=True) saved {_short(value)} on ctx where the first call of this signature saved "
        f"{first}; saved numbers and arrays must keep their kind, dtype and shape from call to call (they cross "
        "to backward as arrays of that first call's type), so save numbers and arrays of fixed kinds and shapes"
    )


def _short(value: Any) -> str:
    if isinstance(value, (np.ndarray, np.generic)):
        return f"a NumPy value of dtype {value.dtype} and shape {np.shape(value)}"
    return repr(value) if len(repr(value)) < 60 else type_name(value)


def spec(value: Any) -> jax.ShapeDtypeStruct:
    array = np.asarray(value)
    return jax.ShapeDtypeStruct(array.shape, jax.dtypes.canonicalize_dtype(array.dtype))


def conform(name: str, what: str, value: Any, spec: jax.ShapeDtypeStruct, exact: bool = False) -> np.ndarray:
    """``value`` as an array of ``spec``'s shape and dtype: an output as JAX would hold it, a saved
    value (``exact``) only if it has that very dtype."""
    array = np.asarray(value)
    if array.shape != tuple(spec.shape):
        raise error(
            AutogradFunctionTypeError,
            name,
            f"under a JAX transformation (jit, grad, vmap...) JAX must know the shape of a host forward's output "
            f"before it runs, so jaxfn ran forward once on example arrays of this call's shapes (ones, or seeded "
            f"standard-normal values) and it returned shape {tuple(spec.shape)}, but on this call's values it "
            f"returned shape {array.shape}: the output's shape depends on the input values (a boolean-mask "
            f"selection x[mask], np.nonzero, np.unique); return a fixed size instead (pad to the largest size the "
            f"output can have, as jnp.nonzero(mask, size=n, fill_value=0) does, and return the count beside it), "
            f"or call the function outside transformations, where forward runs directly on the values"
            if what == "output"
            else f"a host forward (host=True) must give each {what} the same shape on every call, but one has shape "
            f"{array.shape} where the first call of this signature gave {tuple(spec.shape)}",
        )
    if (array.dtype if exact else jax.dtypes.canonicalize_dtype(array.dtype)) != spec.dtype:
        raise error(
            AutogradFunctionTypeError,
            name,
            f"a host forward (host=True) must give each {what} the same dtype on every call, but one has dtype "
            f"{array.dtype} where the first call of this signature gave {spec.dtype}",
        )
    return array.astype(spec.dtype)
