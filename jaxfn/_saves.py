"""Named saves: every array a forward saves crosses to backward under a stable name,
``"<function>.<save>"``, that JAX's checkpoint policies select by, and ``jaxfn.saved`` reports
what a call keeps.

The name is JAX's own ``jax.ad_checkpoint.checkpoint_name`` on the residual, so
``jax.checkpoint(f, policy=jax.checkpoint_policies.save_only_these_names("linear.input"))``
keeps that residual and recomputes the rest, and the offload policies move it to host memory
where the backend can. Outside a checkpoint the name is an identity that leaves the compiled
program unchanged. The save is a name given to ``ctx.save_for_backward`` (``input``), a position
(``0``) or a ``ctx`` attribute (``scale``), then its key path inside a saved pytree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
from collections.abc import Callable
from typing import Any

import jax
from jax.ad_checkpoint import checkpoint_name

from . import _jax_private
from ._context import Remainder
from ._errors import AutogradFunctionTypeError, error, type_name
from ._split import split

_COLLECTING = threading.local()
# Every jaxfn save name seen, with its function, save and whether it last was an input passed
# through: JAX caches traces (jax.checkpoint's among them), so a report may see a name whose
# forward did not run again.
_KNOWN: dict[str, tuple[str, str, bool]] = {}


def available() -> bool:
    """Whether saves are named here (not on jax 0.10 with ``jax_remat3`` on, where JAX's
    ``checkpoint_name`` fails under ``jax.vmap``)."""
    return _jax_private.checkpoint_name_batches(_jax_private.remat3())


def passed_through(saved: list[Any], inputs: Any) -> list[bool]:
    """Per saved array, whether it is one of ``inputs`` (read before an outer differentiation's
    outputs replace saved outputs: an input forward returns unchanged stays an input)."""
    ids = {id(a) for a in inputs}
    return [id(a) in ids for a in saved]


def named(saved: list[Any], remainder: Remainder, passed: list[bool]) -> list[Any]:
    """The residuals of one call, each under its name, ``"<function>.<save>"`` (both read from
    ``remainder``; ``passed``: per residual, whether it is an input passed through); recorded
    when ``saved`` is reporting."""
    if not available():
        return saved  # jax 0.10 with jax_remat3 on: JAX's checkpoint_name fails under vmap, so no names
    names = [f"{remainder.state.function}.{save}" for save in remainder.save_names]
    records = getattr(_COLLECTING, "records", None)
    for name, save, is_input in zip(names, remainder.save_names, passed):
        entry = _KNOWN[name] = (remainder.state.function, save, is_input)
        if records is not None:
            records.setdefault(name, []).append(entry)
    return [checkpoint_name(value, name) for value, name in zip(saved, names)]


@dataclasses.dataclass(frozen=True)
class Residual:
    """One array a differentiation keeps for its backward pass."""

    function: str  # the jaxfn function that saved it ("" for JAX's own residuals)
    save: str  # its save name in that function, or JAX's description of it
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    kind: str  # "input": an argument passed through unchanged; "new": an array computed in the call


class Report(tuple):
    """``jaxfn.saved``'s rows (``Residual``), with a table as its ``str`` and ``nbytes`` in all."""

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self)

    def __str__(self) -> str:
        lines = ["| function | save | shape | dtype | bytes | kind |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {r.function or '(JAX)'} | {r.save} | {r.shape} | {r.dtype} | {r.nbytes:,} | {r.kind} |" for r in self
        ]
        lines.append(f"| all | | | | {self.nbytes:,} | |")
        return "\n".join(lines)


def saved(f: Callable[..., Any], *args: Any, **kwargs: Any) -> Report:
    """Every residual JAX keeps to differentiate `f` at these arguments, each jaxfn save named.

    Read from JAX's own saved-residual report (what `jax.ad_checkpoint.print_saved_residuals`
    prints): per residual, the function, save name, shape, dtype, bytes, and whether it is an
    input passed through or a new array. Under `jax.checkpoint` with a policy, only what the
    policy keeps is listed. (Zero-size residuals, such as the ones that tell a jaxfn backward its
    trace, hold nothing and are left out.)

    `f` is differentiated with respect to the array leaves of its arguments (arrays inside
    tuples, lists and dicts too); Python numbers and every other value are passed to `f` as they
    are, as a real call passes them, and are not differentiated (a JAX constant such a value
    becomes may be listed as `"from a literal"`).

    Args:
      f: the function to differentiate, calling jaxfn functions or not.
      *args: `f`'s positional arguments.
      **kwargs: `f`'s keyword arguments.

    Returns:
      A tuple of rows, one per residual, each with `function` (`""` for JAX's own residuals),
        `save` (the save name, `"input"` in `"linear.input"`), `shape`, `dtype`, `nbytes` and
        `kind` (`"input"` or `"new"`); its `str` is a Markdown table and its `nbytes` the total.

    >>> import jax, jax.numpy as jnp, jaxfn
    >>> def forward(ctx, x):
    ...     ctx.save_for_backward(x=x)
    ...     return jnp.sin(x)
    >>> sin = jaxfn.autograd_function(forward, lambda ctx, g: g * jnp.cos(ctx.saved_variables.x), name="sin")
    >>> report = jaxfn.saved(lambda x: sin(x).sum(), jnp.ones(3))
    >>> [(r.shape, r.kind) for r in report]
    [((3,), 'input')]
    """
    if not callable(f):
        raise error(
            AutogradFunctionTypeError,
            "saved",
            f"jaxfn.saved takes the function first, then its arguments (jaxfn.saved(f, x)), but got {type_name(f)} "
            "as the function",
        )
    differentiated, arrays = _arrays_only(f, args, kwargs)
    previous = getattr(_COLLECTING, "records", None)  # a report made inside f has its own records
    records: dict[str, list[tuple[str, str, bool]]] = {}
    _COLLECTING.records = records
    try:
        rows = _jax_private.saved_residuals(differentiated, *arrays[0], **arrays[1])
    finally:
        _COLLECTING.records = previous
    report = []
    for aval, description in rows:
        nbytes = aval.size * aval.dtype.itemsize  # a PRNG key's dtype gives its key data's
        if not nbytes:
            continue  # a zero-size residual (jaxfn's token telling a backward its trace) holds nothing
        name = _jax_private.residual_name(description)
        if name in _KNOWN:  # a jaxfn save (every name recorded is known too)
            entries = records.get(name)  # this call's saves under the name, in order; else a cached trace's
            function, save, passthrough = entries.pop(0) if entries else _KNOWN[name]
        else:
            function, save, passthrough = "", description, _jax_private.residual_is_argument(description)
            if _jax_private.residual_of_custom_vjp_in(description, "jaxfn"):
                save = "output of a jaxfn function"  # kept by the operation that reads it
        kind = "input" if passthrough else "new"
        report.append(Residual(function, save, tuple(aval.shape), str(aval.dtype), nbytes, kind))
    return Report(report)


def _arrays_only(f: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Callable[..., Any], Any]:
    """``f`` as a function of the array leaves of a call's arguments only, with the call's other
    values (Python numbers, strings, objects) passed as they are (the one ``Split``); and those
    arguments, each other value replaced by ``None`` (an empty pytree: JAX sees no leaf there)."""
    arrays, parts = split((args, kwargs))
    masked = parts.join(arrays, python_values=False)

    def differentiated(*given_args: Any, **given_kwargs: Any) -> Any:
        call_args, call_kwargs = parts.join(jax.tree_util.tree_leaves((given_args, given_kwargs)))
        return f(*call_args, **call_kwargs)

    with contextlib.suppress(TypeError, ValueError):  # JAX names an argument by f's parameters ("from the argument x")
        differentiated.__signature__ = inspect.signature(f)  # type: ignore[attr-defined]
    return differentiated, masked
