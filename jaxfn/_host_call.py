"""Calling host (NumPy) code from JAX with ``jax.pure_callback``, its exceptions kept intact.

When JAX runs a callback at once (an eager call, an un-jitted ``jax.grad`` or ``jax.vjp``,
an un-jitted ``jax.vmap``), an exception raised in it reaches Python as a ``JaxRuntimeError``
whose text holds a traceback. ``HostCall`` keeps the exception object itself for the bind that
ran it, and ``bind`` raises that very object (same type, whole message, ``KeyboardInterrupt``
included). Under ``jax.jit`` the callback runs when the compiled program does, after ``bind``
has returned, so JAX raises its own error at the user's call of the jitted function.

A ``HostCall`` is stable (one per function, signature and thread), so JAX's cache of compiled
callbacks hits on every eager call; ``armed`` is set only while its own thread's bind runs, so
a jitted program that runs it later keeps nothing alive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from . import _jax_private, _rule

ONCE = (
    "it runs code on the host (host=True: NumPy or SciPy code, or a PyTorch Function through "
    "jaxfn.from_torch), which JAX can differentiate only through the custom backward, once; a second "
    "derivative (jax.grad of jax.grad, jax.hessian) or forward mode can't go through it; write forward and "
    "backward in JAX operations (port it) for higher derivatives"
)


@dataclasses.dataclass(eq=False, slots=True)  # compared by identity, as JAX's cache of callbacks keys it
class HostCall:
    """A host function as ``jax.pure_callback`` calls it: on NumPy arrays, with jaxfn's anomaly
    checks on where they were when its call was traced (it runs later, elsewhere), keeping what
    it raises while armed."""

    run: Callable[..., Any]
    anomaly: bool
    armed: bool = False
    raised: BaseException | None = None

    def __call__(self, *arrays: Any) -> Any:
        try:
            with _jax_private.anomaly_context(self.anomaly):  # the rule's own checks, as traced
                return self.run(*map(np.asarray, arrays))  # pure_callback may hand it JAX arrays
        except BaseException as err:
            if self.armed:
                self.raised = err
            raise


def bind(name: str, host: HostCall, specs: Any, *arrays: Any) -> Any:
    """``host(*arrays)`` through ``jax.pure_callback`` (once per batch element under ``vmap``).

    Its derivative is refused in jaxfn's words; an exception raised in host code while JAX runs
    the callback at once is raised again as itself.
    """

    host.armed, host.raised = True, None
    try:
        given = _rule.nondifferentiable(name, ONCE, arrays)  # a derivative through host code: refused
        results = jax.pure_callback(host, specs, *given, vmap_method="sequential")
        # inside jax.shard_map, each result made to vary over every manual axis an input varies over
        # (pure_callback types its results as not varying, though host code computes them per device
        # from what it is given; a cotangent typed so is refused where its input varies)
        axes = frozenset().union(*map(_rule.varying_axes, arrays))
        results = [_rule.varying(r, axes) for r in results] if axes else results
        if all(isinstance(r, jax.Array) and not isinstance(r, Tracer) for r in results):
            jax.block_until_ready(results)  # run at once: an asynchronous device reports here, not later
        return results
    except Exception:  # JAX's wrapper of what the callback raised (JaxRuntimeError; a ValueError on jax 0.10)
        if host.raised is None:
            raise
        raised = host.raised
    finally:
        host.armed, host.raised = False, None
    raise raised  # the host code's own exception, outside the except clause: no JaxRuntimeError chained to it
