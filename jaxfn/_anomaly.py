"""Anomaly detection: with it on, every jaxfn function checks forward's outputs and backward's
gradients for NaN and Inf, and names the function, the output or parameter, and the first bad
index, as PyTorch's ``torch.autograd.detect_anomaly`` names the Function whose backward failed.

Values that are concrete (an eager call, an un-jitted ``jax.grad``) are checked in Python at
once. Under a trace (``jit``, ``scan``, ``vmap``) the device finds each array's first non-finite
element (its index and value) and a ``jax.debug.callback`` raises in the host when there is one
(chosen over ``checkify``, which would need the user's whole program wrapped in
``checkify.checkify``). JAX reports a failed callback as its own runtime error at the call of the
compiled program; inside ``with jaxfn.detect_anomaly():`` that error is replaced by jaxfn's. The
setting is one of JAX's config states that ``jax.jit`` keys its cache on, so a program traced with
it off is traced again with it on, and with it off nothing is added to the program.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from . import _jax_private
from ._errors import AutogradFunctionTypeError, AutogradFunctionValueError, error, type_name

_RAISED: list[BaseException] = []  # what the callbacks raised, newest last (callbacks run in XLA's threads)


def _not_an_anomaly(record: logging.LogRecord) -> bool:
    """A logging filter: drops the records of an anomaly a callback raised."""
    return not (record.exc_info and isinstance(record.exc_info[1], AutogradFunctionValueError))


def _quiet(on: bool) -> None:
    for name in _jax_private.CALLBACK_LOGGERS:  # JAX's log of a failed callback: jaxfn's error says it all
        (logging.getLogger(name).addFilter if on else logging.getLogger(name).removeFilter)(_not_an_anomaly)


def enabled() -> bool:
    """Whether anomaly detection is on here (the context manager, the global switch or
    ``JAXFN_DETECT_ANOMALY=1``)."""
    return _jax_private.anomaly_on()


def set_detect_anomaly(mode: bool) -> None:
    """Switch anomaly detection on or off for the whole program.

    As PyTorch's `torch.autograd.set_detect_anomaly`. (`JAXFN_DETECT_ANOMALY=1` in the
    environment switches it on at import.) Programs `jax.jit` traced before are traced again.

    Args:
      mode: `True` to check every jaxfn function's outputs and gradients for NaN and Inf (as
        inside [`detect_anomaly`][jaxfn.detect_anomaly]), `False` to stop.

    >>> import jaxfn
    >>> jaxfn.set_detect_anomaly(False)
    """
    if not isinstance(mode, (bool, np.bool_)):  # "off" would switch it on
        raise error(
            AutogradFunctionTypeError,
            "set_detect_anomaly",
            f"jaxfn.set_detect_anomaly() takes True or False, but got {type_name(mode)} ({mode!r})",
        )
    _jax_private.set_anomaly(bool(mode))
    _quiet(bool(mode))


@contextlib.contextmanager
def detect_anomaly() -> Iterator[None]:
    """A context manager: inside, every jaxfn function checks its values for NaN and Inf.

    Forward's outputs and backward's gradients are checked eagerly and under
    `jit`/`scan`/`vmap`; a bad one raises `AutogradFunctionError` naming the function, the
    output or parameter, the first bad index, and whether forward or backward produced it, as
    PyTorch's `torch.autograd.detect_anomaly` names the Function whose backward failed. A
    grad_output that is already NaN/Inf when it reaches a backward is reported as coming from
    after that function (from the operations that use its output), not as backward's fault.
    Outside, nothing is added to any program.

    Under `jit` the check runs inside the compiled program (a `jax.debug.callback`), and JAX
    reports a failed callback as its own `jax.errors.JaxRuntimeError` (jaxfn's sentence in its
    text), when the program runs, outside any jaxfn code. The error that leaves this `with`
    block is jaxfn's own `AutogradFunctionError`: so put the `try`/`except` around the block,
    not inside it (with `set_detect_anomaly(True)` alone, there is no block, and the error stays
    JAX's).

    >>> import jax, jax.numpy as jnp, jaxfn
    >>> log = jaxfn.autograd_function(lambda ctx, x: (ctx.save_for_backward(x), jnp.log(x))[1],
    ...                               lambda ctx, g: g / ctx.saved_tensors[0], name="log")
    >>> with jaxfn.detect_anomaly():
    ...     try:
    ...         jax.grad(lambda x: log(x).sum())(jnp.array([1.0, 0.0]))
    ...     except jaxfn.AutogradFunctionError as err:
    ...         print(str(err).split(";")[0])
    jaxfn: 'log': forward returned a non-finite value in its output (-inf at index (1,))
    """
    del _RAISED[:]
    _quiet(True)  # JAX's own log of the failed callback, with internal frames
    try:
        with _jax_private.anomaly_context(True):
            yield
    except jax.errors.JaxRuntimeError as err:  # JAX's report of a failed callback: the error it raised, if jaxfn's
        raised = next((r for r in reversed(_RAISED) if _jax_private.reports_callback_error(err, r)), None)
        if raised is None:
            raise
        raise raised from None
    finally:
        _quiet(enabled())  # still on outside only where an outer context or the global switch is


def outputs(name: str, out: Any) -> None:
    """Check forward's output (any pytree), each leaf named as in messages."""
    with_paths = jax.tree_util.tree_flatten_with_path(out)[0]  # a path is empty only where out is one array
    check(name, "forward", [(f"output{jax.tree_util.keystr(p)}" if p else "its output", x) for p, x in with_paths])


def grad_outputs(name: str, grad_outputs: Sequence[Any]) -> None:
    """Check the grad_outputs backward is about to get: a NaN/Inf there comes from after this
    function (a ``log(0)`` downstream), so it is reported as that, not as backward's fault."""
    labels = ["grad_output"] if len(grad_outputs) == 1 else [f"grad_output {i}" for i in range(len(grad_outputs))]
    with_paths = [
        (label + jax.tree_util.keystr(path), leaf)
        for label, g in zip(labels, grad_outputs)
        for path, leaf in jax.tree_util.tree_flatten_with_path(g)[0]
    ]
    check(name, "grad_output", with_paths)


def check(name: str, role: str, labeled: list[tuple[str, Any]]) -> None:
    """Check each (label, value) for NaN/Inf: at once where concrete, else in the program.

    ``role``: "forward" (a value is an output), "backward" (a gradient for a parameter) or
    "grad_output" (a cotangent arriving at backward).
    """
    for label, value in labeled:
        if not hasattr(value, "dtype") or not jnp.issubdtype(value.dtype, jnp.inexact) or not np.size(value):
            continue  # not a floating-point array, or an empty one: nothing in it can be NaN
        xp = jnp if isinstance(value, Tracer) else np  # concrete values (host code's too) on the host, at once
        flat = xp.ravel(value)
        first = xp.argmin(xp.isfinite(flat))  # the first non-finite element, if there is one
        report = functools.partial(_report, name, role, label, np.shape(value))
        if xp is jnp:
            jax.debug.callback(report, first, flat[first])
        else:
            report(first, flat[first])


def _report(name: str, role: str, label: str, shape: tuple[int, ...], first: Any, value: Any) -> None:
    """Raise the error for ``value``, at flat index ``first``, if it is not finite; the error kept
    first, for ``detect_anomaly`` to find behind JAX's runtime error (the last few)."""
    if np.isfinite(value):
        return
    index = tuple(int(i) for i in np.unravel_index(int(first), shape))
    raised = error(AutogradFunctionValueError, name, _sentence(role, label, np.asarray(value), index))
    _RAISED.append(raised)
    del _RAISED[:-16]
    raise raised


def _sentence(role: str, label: str, bad: Any, index: tuple) -> str:
    what = "nan" if np.isnan(bad) else str(bad)
    if role == "grad_output":
        return (
            f"{label} was already {what} (at index {index}) when it reached backward, so the non-finite value "
            "comes from after this function, from the operations that use its output "
            "(a log or sqrt of 0, a division by 0 there; jnp.where does not stop a NaN gradient from its "
            "unselected branch); backward is not its source"
        )
    if role == "forward":
        return (
            f"forward returned a non-finite value in {label} ({what} at index {index}); look at forward's formula "
            "for that output at that index (a log or division of 0, an overflow, inf - inf), or at the inputs it got"
        )
    return (
        f"backward returned a non-finite gradient for '{label}' ({what} at index {index}); look at backward's "
        "formula for that parameter at that index (a division by 0, the derivative of sqrt or log at 0, "
        "inf * 0), or at the grad_output it got"
    )


if os.environ.get("JAXFN_DETECT_ANOMALY", "").lower() in ("1", "true", "yes", "on"):
    set_detect_anomaly(True)
