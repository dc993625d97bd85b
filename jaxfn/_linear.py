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

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _rule
from ._arguments import DIFF, dtype_kind
from ._jax_private import HI_PRIMITIVE, HI_ZERO, SHAPED_ARRAY, batched_aval, is_gradient_accumulator

# forward_map(residuals, tangents) -> tangents out; backward_map(residuals, cotangents) -> one
# cotangent (or None) per tangent; a cotangent of None is a zero one.
Map = Callable[[tuple[Any, ...], tuple[Any, ...]], Any]


def tangents(
    name: str, forward_map: Map, backward_map: Map, residuals: tuple[Any, ...], tangents: tuple[Any, ...], out: Any
) -> tuple[Any, ...]:
    """``forward_map(residuals, tangents)``, transposed by ``backward_map``; ``out``: the
    tangents' shapes and dtypes (one per output tangent)."""
    # each output's own type (inside jax.shard_map, the mesh axes it varies over too), as a tangent
    out_avals = tuple((o if isinstance(o, SHAPED_ARRAY) else jax.typeof(o)).to_tangent_aval() for o in out)
    linear = _Linear(name, forward_map, backward_map, _avals(residuals), _avals(tangents), out_avals)
    return tuple(linear(tuple(residuals), tuple(tangents)))


def _avals(values: Any) -> tuple[Any, ...]:
    return tuple(jax.typeof(v) for v in values)


def zeros(aval: Any) -> Any:
    """A zero tangent or cotangent for a value of this aval (float0 for one that is not
    differentiated, an integer say); ``_primitive`` makes its zeros here too."""
    if dtype_kind(aval.dtype) == DIFF:
        return jnp.zeros(aval.shape, aval.dtype)
    return np.zeros(aval.shape, jax.dtypes.float0)


def _instantiate(values: Any, avals: Any) -> tuple[Any, ...]:
    return tuple(zeros(a) if isinstance(v, HI_ZERO) else v for v, a in zip(values, avals))


class Name:
    """A hijax primitive's only parameter: equal to itself alone (each rule its own primitive;
    ``_primitive`` names its primitives with it too)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


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
        (residuals, ts), (d_residuals, d_ts) = primals, tangents
        out = self(residuals, ts)
        out_tangents = self(residuals, _instantiate(d_ts, self.in_avals[1]))
        moved = [i for i, d in enumerate(d_residuals) if not isinstance(d, HI_ZERO)]
        if moved:  # the map is not linear in its residuals: their tangents go through its operations
            on = _rule.of_chosen(self._on_residuals(ts), residuals, moved)
            chosen = tuple(residuals[i] for i in moved)
            extra = jax.jvp(on, chosen, tuple(d_residuals[i] for i in moved))[1]
            out_tangents = tuple(a + b for a, b in zip(out_tangents, extra))
        return out, out_tangents

    def lin(self, perturbed: Any, residuals: Any, ts: Any) -> tuple[Any, Any]:
        # jax.linearize of a linearized program: the tangent function is ``jvp``'s, on the primals kept
        return self(residuals, ts), (tuple(residuals), tuple(ts))

    def linearized(self, primals: Any, d_residuals: Any, d_ts: Any) -> tuple[Any, ...]:
        if all(isinstance(t, HI_ZERO) for t in (*d_residuals, *d_ts)):  # nothing moves: zero, as JAX expects
            return tuple(HI_ZERO(a.to_tangent_aval()) for a in self.out_aval)
        return self.jvp(primals, (d_residuals, d_ts))[1]

    def _on_residuals(self, ts: Any) -> Callable[..., tuple[Any, ...]]:
        """The map as a function of its residuals, the tangents fixed."""
        return lambda *residuals: tuple(self.forward_map(tuple(residuals), tuple(ts)))

    def vjp_fwd(self, perturbed: Any, residuals: Any, ts: Any) -> tuple[Any, Any]:
        return self(residuals, ts), (tuple(residuals), tuple(ts))

    def vjp_bwd_retval(self, saved: Any, cotangents: Any) -> tuple[Any, Any]:
        residuals, ts = saved
        cts = tuple(None if isinstance(c, HI_ZERO) else c for c in cotangents)
        grads = self.backward_map(residuals, cts) if any(c is not None for c in cts) else (None,) * len(ts)
        t_grads = tuple(zeros(a) if g is None else g for g, a in zip(grads, self.in_avals[1]))
        which = [i for i, a in enumerate(self.in_avals[0]) if jnp.issubdtype(a.dtype, jnp.inexact)]
        res_grads = [zeros(a) for a in self.in_avals[0]]
        if which and any(c is not None for c in cts):
            on = _rule.of_chosen(self._on_residuals(ts), residuals, which)
            _, pullback = jax.vjp(on, *[residuals[i] for i in which])
            for i, g in zip(which, pullback(_instantiate(cotangents, self.out_aval))):
                res_grads[i] = g
        return tuple(res_grads), t_grads

    def batch(self, axis_data: Any, args: Any, dims: Any) -> tuple[Any, Any]:
        (residuals, ts), (r_dims, t_dims) = args, dims
        if all(d is None for d in (*r_dims, *t_dims)):  # JAX may ask even when nothing is batched
            return self(residuals, ts), (None,) * len(self.out_aval)
        size = axis_data.size
        front = lambda values, ds: tuple(v if d is None else jnp.moveaxis(v, d, 0) for v, d in zip(values, ds))
        residuals, ts = front(residuals, r_dims), front(ts, t_dims)
        r_axes = [None if d is None else 0 for d in r_dims]
        t_axes = [None if d is None else 0 for d in t_dims]
        vmap = lambda f, in_axes: jax.vmap(
            f, in_axes=in_axes, out_axes=0, axis_size=size, axis_name=getattr(axis_data, "name", None)
        )
        forward_map, backward_map = self.forward_map, self.backward_map

        def batched_forward(residuals: Any, ts: Any) -> Any:
            return vmap(lambda r, t: tuple(forward_map(tuple(r), tuple(t))), (r_axes, t_axes))(
                list(residuals), list(ts)
            )

        def batched_backward(residuals: Any, cts: Any) -> Any:
            present = [i for i, c in enumerate(cts) if c is not None]

            def one(r: Any, given: Any) -> Any:
                full: list[Any] = [None] * len(cts)
                for i, c in zip(present, given):
                    full[i] = c
                grads = backward_map(tuple(r), tuple(full))
                return [zeros(a) if g is None else g for g, a in zip(grads, self.in_avals[1])]

            grads = vmap(one, (r_axes, 0))(list(residuals), [cts[i] for i in present])
            # a tangent that is not batched gets the sum over the batch, as JAX's own batching gives
            return [g if a == 0 else g.sum(0) for g, a in zip(grads, t_axes)]

        batched = lambda avals, axes: tuple(a if d is None else _batched(a, size) for a, d in zip(avals, axes))
        linear = _Linear(
            self.name,
            batched_forward,
            batched_backward,
            batched(self.in_avals[0], r_axes),
            batched(self.in_avals[1], t_axes),
            tuple(_batched(a, size) for a in self.out_aval),
        )
        return linear(residuals, ts), (0,) * len(self.out_aval)


def _batched(aval: Any, size: int) -> Any:
    return batched_aval(aval, size)
