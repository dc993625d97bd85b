"""The tangent map of every forward-mode rule: linear in the tangents, transposed by backward.

A forward-mode rule (the user's ``jvp``, or the one ``forward_mode=True`` derives from backward)
returns its tangents through ``tangents(...)``: one JAX primitive whose value is the rule's
tangent map and whose transpose is the user's backward. JAX transposes a forward-mode rule where
it needs reverse mode from it: ``jax.grad`` of a ``jax.custom_jvp`` (``forward_mode=True``), and
``jax.grad`` under ``jax.checkpoint`` or a remat'd scan (every builder with a forward-mode rule).
Without this primitive JAX would transpose the rule's own operations, dropping what its
transposition drops (a cast of grad_output to an integer and back) or putting a jvp in place of
a straight-through backward. With it, reverse mode is backward wherever JAX transposes.

The map's residuals are arrays it is not linear in (forward's saved values, or the primals): an
outer differentiation of them goes through the map's and backward's operations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _rule
from ._arguments import DIFF, dtype_kind
from ._jax_private import HI_PRIMITIVE, HI_ZERO, batch_axis, batched_aval, is_gradient_accumulator

# forward_map(residuals, tangents) -> tangents out; backward_map(residuals, cotangents) -> one
# cotangent (or None) per tangent; a cotangent of None is a zero one.
Map = Callable[[tuple[Any, ...], tuple[Any, ...]], Any]


def tangents(
    name: str, forward_map: Map, backward_map: Map, residuals: tuple[Any, ...], tangents: tuple[Any, ...], out: Any
) -> tuple[Any, ...]:
    """``forward_map(residuals, tangents)``, transposed by ``backward_map``; ``out``: the outputs
    whose tangents these are (one per output tangent)."""
    # each output's own type (inside jax.shard_map, the mesh axes it varies over too), as a tangent
    out_avals = tuple(a.to_tangent_aval() for a in _avals(out))
    linear = _Linear(name, forward_map, backward_map, _avals(residuals), _avals(tangents), out_avals)
    return tuple(linear(tuple(residuals), tuple(tangents)))


def _avals(values: Any) -> tuple[Any, ...]:
    return tuple(jax.typeof(v) for v in values)


def zeros(aval: Any) -> Any:
    """A zero tangent or cotangent for a value of this aval (float0 for one that is not
    differentiated, an integer say); ``_primitive`` and ``_forward_mode`` make their zeros here too."""
    if dtype_kind(aval.dtype) == DIFF:
        return jnp.zeros(aval.shape, aval.dtype)
    # broadcast by JAX from a scalar, as JAX makes its own float0 zeros: a NumPy float0 array is no
    # constant that a traced program may hold (a linearized tangent function's, say)
    return jax.lax.broadcast(np.zeros((), jax.dtypes.float0), aval.shape)


def instantiate(values: Any, avals: Any) -> tuple[Any, ...]:
    """The values, with zeros for symbolic zeros and None (``_primitive``'s tangents too)."""
    return tuple(zeros(a) if v is None or isinstance(v, HI_ZERO) else v for v, a in zip(values, avals))


class Name:
    """A hijax primitive's only parameter: equal to itself alone (each rule its own primitive;
    ``_primitive`` names its primitives with it too)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Batch:
    """One batch rule of a hijax primitive (this module's, ``_primitive``'s): the values at their
    batch ``dims`` (a tuple of them, or of tuples of them: a primitive's inputs) moved to axis 0
    (``axes``, in the same structure: 0, or None for a value not batched), and ``vmap``,
    ``jax.vmap`` over that axis with every output at axis 0. ``spmd``: whether the batch's
    ``spmd_axis_name`` is kept (``_primitive``'s rules keep it, the tangent map does not)."""

    def __init__(self, axis_data: Any, dims: Any, spmd: bool = True):
        self.size, name, spmd_name = batch_axis(axis_data)
        self.dims = tuple(dims)
        self.axes = jax.tree.map(lambda d: 0, self.dims)  # a None dim is no leaf: kept as None
        self.vmap = functools.partial(
            jax.vmap, out_axes=0, axis_size=self.size, axis_name=name, spmd_axis_name=spmd_name if spmd else None
        )

    def front(self, values: Any) -> Any:
        return jax.tree.map(lambda v, d: v if d in (None, 0) else jnp.moveaxis(v, d, 0), values, self.dims)

    def avals(self, avals: Any, axes: Any = None) -> Any:
        """The avals batched at ``axes`` (every one where None)."""
        axes = jax.tree.map(lambda a: 0, avals) if axes is None else axes
        return jax.tree.map(lambda a, d: a if d is None else batched_aval(a, self.size), avals, axes)

    def backward(self, backward: Map, res_axes: Any, axes: Any) -> Map:
        """``backward`` (residuals, cotangents -> one cotangent or None per input) under ``vmap``:
        the residuals batched at ``res_axes``, the cotangents given at axis 0 (None where none
        flows); an input not batched (``axes``) gets the sum over the batch, as JAX's own batching
        gives."""

        def batched(residuals: Any, cotangents: tuple[Any, ...]) -> list[Any]:
            grads = self.vmap(backward, in_axes=(res_axes, 0))(residuals, tuple(cotangents))  # a None stays None
            return [g if g is None or a == 0 else g.sum(0) for g, a in zip(grads, axes)]

        return batched


class _Linear(HI_PRIMITIVE):
    """``forward_map`` on (residuals, tangents); its transpose is ``backward_map``."""

    def __init__(self, name: str, forward_map: Map, backward_map: Map, res_avals: Any, t_avals: Any, out_avals: Any):
        self.in_avals = (tuple(res_avals), tuple(t_avals))
        self.out_aval = tuple(out_avals)
        self.params = {"jaxfn_tangents": Name(name)}
        self.name, self.forward_map, self.backward_map = name, forward_map, backward_map
        super().__init__()

    def expand(self, residuals: Any, tangents: Any) -> tuple[Any, ...]:
        return tuple(self.forward_map(tuple(residuals), tuple(tangents)))

    def transpose(self, cotangents: Any, residuals: Any, tangents: Any) -> None:
        cts = tuple(None if isinstance(c, HI_ZERO) else c for c in cotangents)
        if all(c is None for c in cts):
            return
        for accumulator, grad in zip(tangents, self.backward_map(tuple(residuals), cts)):
            if grad is not None and is_gradient_accumulator(accumulator):
                accumulator.accum(grad)

    def jvp(self, primals: Any, tangents: Any) -> tuple[Any, Any]:
        return self(*primals), self.linearized(primals, *tangents)

    def vjp_fwd(self, perturbed: Any, residuals: Any, ts: Any) -> tuple[Any, Any]:
        return self(residuals, ts), (tuple(residuals), tuple(ts))

    # jax.linearize of a linearized program: the tangent function runs on the primals kept
    lin = vjp_fwd

    def linearized(self, primals: Any, d_residuals: Any, d_ts: Any) -> tuple[Any, ...]:
        if all(isinstance(t, HI_ZERO) for t in (*d_residuals, *d_ts)):  # nothing moves: zero, as JAX expects
            return tuple(HI_ZERO(a.to_tangent_aval()) for a in self.out_aval)
        residuals, ts = primals
        out_tangents = self(residuals, instantiate(d_ts, self.in_avals[1]))
        moved = [i for i, d in enumerate(d_residuals) if not isinstance(d, HI_ZERO)]
        if moved:  # the map is not linear in its residuals: their tangents go through its operations
            chosen = (tuple(residuals[i] for i in moved), tuple(d_residuals[i] for i in moved))
            extra = jax.jvp(self._on_residuals(ts, residuals, moved), *chosen)[1]
            out_tangents = tuple(a + b for a, b in zip(out_tangents, extra))
        return out_tangents

    def _on_residuals(self, ts: Any, residuals: Any, which: list[int]) -> Callable[..., tuple[Any, ...]]:
        """The map as a function of its residuals at ``which``, the tangents and other residuals fixed."""
        on = lambda *residuals: tuple(self.forward_map(tuple(residuals), tuple(ts)))
        return _rule.of_chosen(on, residuals, which)

    def vjp_bwd_retval(self, saved: Any, cotangents: Any) -> tuple[Any, Any]:
        residuals, ts = map(tuple, saved)
        cts = tuple(None if isinstance(c, HI_ZERO) else c for c in cotangents)
        flows = any(c is not None for c in cts)
        grads = self.backward_map(residuals, cts) if flows else (None,) * len(ts)
        which = [i for i, a in enumerate(self.in_avals[0]) if flows and jnp.issubdtype(a.dtype, jnp.inexact)]
        res_grads: list[Any] = [None] * len(residuals)
        if which:
            _, pullback = jax.vjp(self._on_residuals(ts, residuals, which), *[residuals[i] for i in which])
            res_grads = _rule.replaced(res_grads, which, pullback(instantiate(cotangents, self.out_aval)))
        return instantiate(res_grads, self.in_avals[0]), instantiate(grads, self.in_avals[1])

    def batch(self, axis_data: Any, args: Any, dims: Any) -> tuple[Any, Any]:
        if not jax.tree.leaves(dims):  # JAX may ask even when nothing is batched
            return self(*args), (None,) * len(self.out_aval)
        on = Batch(axis_data, dims, spmd=False)  # dims: the residuals', the tangents'
        forward_map = on.vmap(self.forward_map, in_axes=on.axes)  # called with tuples, as expand does
        backward_map = on.backward(self.backward_map, *on.axes)
        res_avals, t_avals = on.avals(self.in_avals, on.axes)
        linear = _Linear(self.name, forward_map, backward_map, res_avals, t_avals, on.avals(self.out_aval))
        return linear(*on.front(args)), (0,) * len(self.out_aval)
