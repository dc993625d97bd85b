"""The tie: ``tie(rule, arrays, out)`` is ``out``, whose derivative with respect to ``arrays`` is
``rule``'s (a custom rule over ``arrays``) and with respect to ``out`` zero.

A builder's fwd computes forward's output with forward's own operations. When an outer
transformation may differentiate that output again (``jax.grad`` of ``jax.grad``, also through a
``jit`` between them), the output passes through the tie, so that the outer derivative is
backward's, as PyTorch gives, and not that of forward's operations. The tie is one JAX primitive
(public extension API: ``jax.extend.core.Primitive`` and the rule tables of
``jax.interpreters``): binding it stages one equation and traces nothing, it lowers to nothing,
and only a differentiation of it calls ``jax.jvp`` of ``rule``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.core import Tracer
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir  # batching: not_mapped is None there

from . import _rule

_tie_p = Primitive("jaxfn_tie")
_tie_p.multiple_results = True


def tie(rule: Callable[..., tuple[Any, ...]], arrays: tuple[Any, ...], out: tuple[Any, ...]) -> tuple[Any, ...]:
    """``out``, differentiated as ``rule(*arrays)`` (see the module docstring)."""
    return tuple(_tie_p.bind(*arrays, *out, count=len(arrays), rule=rule))


def again_on(rule: Callable[..., tuple[Any, ...]], arrays: Any) -> Callable[[Any], tuple[Any, ...]] | None:
    """A builder's ``again`` (``_rule.outputs_again``) for these arrays: on an outer trace's
    tracers, forward's outputs tied to ``rule`` (the builder's own custom function of the arrays),
    so that an outer differentiation goes through it; else None."""
    if not any(isinstance(a, Tracer) for a in arrays):
        return None
    return lambda out: tie(rule, tuple(arrays), tuple(out))


def _identity(*values: Any, count: int, rule: Any) -> tuple[Any, ...]:
    return tuple(values[count:])


def _jvp(primals: Any, tangents: Any, *, count: int, rule: Any) -> tuple[list[Any], list[Any]]:
    arrays, out = tuple(primals[:count]), tuple(primals[count:])
    which = [i for i, t in enumerate(tangents[:count]) if type(t) is not ad.Zero]  # only these: the rule's
    if not which:  # needs_input_grad sees exactly what is differentiated
        return list(tie(rule, arrays, out)), [ad.Zero(jax.typeof(o).to_tangent_aval()) for o in out]

    on = _rule.of_chosen(lambda *merged: tuple(rule(*merged)), arrays, which)
    _, out_tangents = jax.jvp(on, tuple(arrays[i] for i in which), tuple(tangents[i] for i in which))
    # the tie's own value (the rule's could differ: a user's vmap rule is its value), tied again, so a
    # differentiation further out meets the rule again and every order goes through backward
    return list(tie(rule, arrays, out)), list(out_tangents)


def _batch(values: Any, dims: Any, *, count: int, rule: Any) -> tuple[tuple[Any, ...], list[int]]:
    size = next(v.shape[d] for v, d in zip(values, dims) if d is not None)
    at_front = [v if d is None else jnp.moveaxis(v, d, 0) for v, d in zip(values, dims)]
    arrays, out = at_front[:count], at_front[count:]
    out = [o if d is not None else jnp.broadcast_to(o, (size, *jnp.shape(o))) for o, d in zip(out, dims[count:])]
    axes = tuple(None if d is None else 0 for d in dims[:count])
    batched_rule = jax.vmap(rule, in_axes=axes, out_axes=0, axis_size=size)
    return tie(batched_rule, tuple(arrays), tuple(out)), [0] * len(out)


_tie_p.def_impl(_identity)
_tie_p.def_abstract_eval(lambda *avals, count, rule: avals[count:])
ad.primitive_jvps[_tie_p] = _jvp
batching.primitive_batchers[_tie_p] = _batch
mlir.register_lowering(_tie_p, mlir.lower_fun(_identity, multiple_results=True))
