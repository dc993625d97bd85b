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
import struct
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
    values, remainder = ctx.to_residuals(lambda leaf: True)
    leaves = [np.asarray(v) if isinstance(v, jax.Array) else v for v in values]  # JAX arrays if host code made some
    bare = dataclasses.replace(remainder.state, non_differentiable=[])  # keeps no output of this call
    return dataclasses.replace(remainder, state=bare), leaves


# How a value saved on ctx by a host forward crosses to backward. Everything numeric crosses
# exactly: an array of a dtype JAX holds as it is (a float32 array; a float64 one with x64 on) as
# an array; a NumPy scalar, or an array JAX would narrow or can't hold (float64 with x64 off,
# datetime, strings, records), as its raw bytes; a Python number as its 64-bit bytes. Any other
# Python value (a str, None, an object) is kept on the host per call (``KEPT``): a value forward
# computes from this call's data (a branch it took) is this call's own, never the probe's.


@dataclasses.dataclass(frozen=True)
class Number:
    kind: type  # int, float, complex or bool


@dataclasses.dataclass(frozen=True)
class PerCall:
    """An object forward kept on ctx, held on the host for this call's backward (``KEPT``)."""


@dataclasses.dataclass(frozen=True)
class Raw:
    dtype: np.dtype
    shape: tuple[int, ...]
    scalar: bool  # a NumPy scalar, handed back as one


PACKED = {bool: "<?", int: "<q", float: "<d", complex: "<dd"}


def carry(value: Any) -> Any:
    if type(value) in PACKED:
        return Number(type(value))
    if not isinstance(value, (np.ndarray, np.generic)) or value.dtype == object:
        return PerCall()  # kept per call: a Python value forward computes from the data is this call's own
    numeric = jnp.issubdtype(value.dtype, np.number) or value.dtype == np.bool_
    if isinstance(value, np.generic) or not numeric or jax.dtypes.canonicalize_dtype(value.dtype) != value.dtype:
        return Raw(value.dtype, tuple(np.shape(value)), isinstance(value, np.generic))
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
            for key in self._read:
                self._entries.pop(key, None)
            self._read.clear()
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
    if isinstance(carry, PerCall):
        return jax.ShapeDtypeStruct((8,), np.uint8)
    if isinstance(carry, Number):
        return jax.ShapeDtypeStruct((struct.calcsize(PACKED[carry.kind]),), np.uint8)
    if isinstance(carry, Raw):
        return jax.ShapeDtypeStruct((carry.dtype.itemsize * int(np.prod(carry.shape)),), np.uint8)
    return carry


def send(name: str, value: Any, carry: Any) -> np.ndarray:
    """Runs on the host after forward: a saved value as the array that crosses to backward."""
    if isinstance(carry, PerCall):
        return _pack(name, KEPT.keep(value))
    if isinstance(carry, Number):
        if type(value) is not carry.kind:
            raise error(AutogradFunctionTypeError, name, changed(value, f"a Python {carry.kind.__name__}"))
        return _pack(name, value)
    if isinstance(carry, Raw):
        if not isinstance(value, (np.ndarray, np.generic)) or (value.dtype, value.shape) != (carry.dtype, carry.shape):
            raise error(
                AutogradFunctionTypeError,
                name,
                changed(value, f"a NumPy value of dtype {carry.dtype} and shape {carry.shape}"),
            )
        return np.frombuffer(np.ascontiguousarray(value).tobytes(), np.uint8).copy()
    return conform(name, "saved value", value, carry, exact=True)


def receive(name: str, carry: Any, values: Any) -> Any:
    """Runs on the host before backward: a saved value as forward saved it."""
    raw = np.asarray(next(values))
    if isinstance(carry, PerCall):
        return KEPT.get(name, _unpack(int, raw))
    if isinstance(carry, Number):
        return _unpack(carry.kind, raw)
    if isinstance(carry, Raw):
        array = np.frombuffer(raw.astype(np.uint8).tobytes(), carry.dtype).reshape(carry.shape).copy()
        return array[()] if carry.scalar else array
    return raw


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


def _pack(name: str, value: Any) -> np.ndarray:
    try:
        packed = struct.pack(PACKED[type(value)], *((value.real, value.imag) if type(value) is complex else (value,)))
    except struct.error:
        raise error(
            AutogradFunctionTypeError,
            name,
            f"a host forward (host=True) saved the Python number {value!r} on ctx, which does not fit 64 bits; "
            "save it as a NumPy array or a string",
        ) from None
    return np.frombuffer(packed, np.uint8).copy()


def _unpack(kind: type, raw: np.ndarray) -> Any:
    values = struct.unpack(PACKED[kind], np.asarray(raw, np.uint8).tobytes())
    return complex(*values) if kind is complex else values[0]


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
