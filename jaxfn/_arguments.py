"""Binding a call's arguments to forward's parameters, and splitting them into leaves.

Every argument is a pytree. Its leaves are one of three kinds:
  * DIFF: a JAX or NumPy array of an inexact dtype in JAX's sense (float64 down to bfloat16,
    float8 and float4, complex): differentiable;
  * ARRAY: any other numeric JAX or NumPy array (integer, boolean, typed PRNG keys): passed
    through, never differentiated;
  * STATIC: everything else (Python numbers, strings, functions, NumPy arrays of strings or
    objects...): handed to forward as is.
Only DIFF and ARRAY leaves are given to JAX; STATIC leaves stay on the Python side.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import keystr, tree_flatten, tree_flatten_with_path, tree_unflatten

from ._errors import AutogradFunctionTypeError, error

DIFF, ARRAY, STATIC = "differentiable", "array", "static"

_KIND_OF_DTYPE: dict[Any, str] = {}  # a cache: classifying a dtype costs more than a look-up


def is_inexact(dtype: Any) -> bool:
    """Whether ``dtype`` is differentiable in JAX's dtype lattice (bfloat16 and float8 included)."""
    return dtype_kind(dtype) == DIFF


def dtype_kind(dtype: Any) -> str:
    """DIFF, ARRAY or STATIC for an array of this dtype."""
    kind = _KIND_OF_DTYPE.get(dtype)
    if kind is None:
        kind = _KIND_OF_DTYPE[dtype] = _classify(dtype)
    return kind


def _classify(dtype: Any) -> str:
    if jnp.issubdtype(dtype, jax.dtypes.extended):  # typed PRNG keys
        return ARRAY
    if jnp.issubdtype(dtype, jnp.inexact):  # JAX's lattice knows the ml_dtypes floats
        return DIFF
    if jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        return ARRAY
    return STATIC  # strings, objects, datetimes: not something JAX can hold


def leaf_kind(leaf: Any) -> str:
    """DIFF, ARRAY or STATIC, for one leaf of an argument."""
    if isinstance(leaf, (jax.Array, np.ndarray)):
        return dtype_kind(leaf.dtype)
    return STATIC


@dataclasses.dataclass(frozen=True, eq=False)
class Arguments:
    """One call's arguments, split into the arrays JAX sees and everything else."""

    names: tuple[str, ...]  # forward's parameters, after the context
    treedef: Any  # of the tuple of all parameter values, in order
    kinds: tuple[str, ...]  # one per leaf
    statics: tuple[Any, ...]  # one per leaf: the value of a STATIC leaf, else None
    arrays: tuple[Any, ...]  # the values of the DIFF and ARRAY leaves, in leaf order
    varargs: str | None = None  # the name of forward's *args parameter, if any

    # Derived from the structure alone, and only when needed (not on the eager fast path).
    @functools.cached_property
    def owners(self) -> tuple[int, ...]:
        """One per leaf: the position of its parameter."""
        return tuple(i for i, child in enumerate(self.treedef.children()) for _ in range(child.num_leaves))

    @functools.cached_property
    def paths(self) -> tuple[str, ...]:
        """One per leaf: 'params['w']'-style, for messages."""
        skeleton = tree_unflatten(self.treedef, [None] * self.treedef.num_leaves)
        with_paths, _ = tree_flatten_with_path(skeleton, is_leaf=lambda x: x is None)
        return tuple(self.names[path[0].idx] + keystr(path[1:]) for path, _ in with_paths)

    @functools.cached_property
    def slots(self) -> tuple[tuple[int, int | None], ...]:
        """The arguments as PyTorch counts them: (parameter, None), or (parameter, i) for each
        element of a ``*args`` parameter. A tuple returned by backward has one entry per slot."""
        slots: list[tuple[int, int | None]] = []
        for position, (name, child) in enumerate(zip(self.names, self.treedef.children())):
            if name == self.varargs:
                slots.extend((position, i) for i in range(len(child.children())))
            else:
                slots.append((position, None))
        return tuple(slots)

    def slot_name(self, slot: tuple[int, int | None]) -> str:
        position, index = slot
        return self.names[position] + ("" if index is None else f"[{index}]")

    def structure(self) -> Arguments:
        """The same call without its array values, to keep in closures without holding arrays."""
        return dataclasses.replace(self, arrays=())

    @functools.cached_property
    def array_positions(self) -> tuple[int, ...]:
        """The leaf index of each entry of ``arrays``."""
        return tuple(i for i, kind in enumerate(self.kinds) if kind != STATIC)

    def values(self, arrays: tuple[Any, ...] | list[Any]) -> list[Any]:
        """The parameter values, with ``arrays`` put back in place of the array leaves."""
        leaves = list(self.statics)
        for position, array in zip(self.array_positions, arrays):
            leaves[position] = array
        return list(tree_unflatten(self.treedef, leaves))

    def needs_input_grad(self, perturbed: Any) -> tuple[dict[str, bool], tuple[bool, ...]]:
        """From one flag per array, the flags per parameter name and per slot (see ``slots``)."""
        by_leaf = [False] * len(self.kinds)
        for leaf, flag in zip(self.array_positions, perturbed):
            by_leaf[leaf] = bool(flag)
        by_name = dict.fromkeys(self.names, False)
        leaf = 0
        per_slot = []
        for position, child in enumerate(self.treedef.children()):
            counts = [c.num_leaves for c in child.children()] if self.names[position] == self.varargs else None
            flags = by_leaf[leaf : leaf + child.num_leaves]
            by_name[self.names[position]] = any(flags)
            if counts is None:
                per_slot.append(any(flags))
            else:
                starts = np.cumsum([0, *counts])
                per_slot.extend(any(flags[s:e]) for s, e in zip(starts[:-1], starts[1:]))
            leaf += child.num_leaves
        return by_name, tuple(per_slot)


def shape_dtypes(arrays: Any) -> list[jax.ShapeDtypeStruct]:
    """The shape and dtype of each array leaf, as backward checks them."""
    return [jax.ShapeDtypeStruct(jnp.shape(a), a.dtype if hasattr(a, "dtype") else jnp.result_type(a)) for a in arrays]


def context_parameter(function: Any) -> inspect.Parameter | None:
    """The first positional parameter of ``function`` (where the context goes), if any."""
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            return parameter
        return None
    return None


def positional_names(signature: inspect.Signature) -> tuple[str, ...] | None:
    """Forward's parameter names after the context, if all are plain positional-or-keyword."""
    parameters = list(signature.parameters.values())[1:]
    if all(p.kind is p.POSITIONAL_OR_KEYWORD for p in parameters):
        return tuple(p.name for p in parameters)
    return None


def varargs_name(signature: inspect.Signature) -> str | None:
    """The name of forward's ``*args`` parameter, if it has one."""
    return next((p.name for p in signature.parameters.values() if p.kind is p.VAR_POSITIONAL), None)


def bind(
    name: str, signature: inspect.Signature, args: tuple, kwargs: dict, fast: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """Forward's parameters (after the context) bound to a call, defaults applied.

    ``fast`` (from ``positional_names``) skips ``Signature.bind`` for the common call that
    passes every parameter positionally.
    """
    if fast is not None and not kwargs and len(args) == len(fast):
        return dict(zip(fast, args))
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError as err:
        raise error(AutogradFunctionTypeError, name, f"it was called with the wrong arguments: {err}") from None
    bound.apply_defaults()
    values = dict(bound.arguments)
    del values[next(iter(signature.parameters))]  # the context
    return values


def split(bound: dict[str, Any], varargs: str | None = None) -> Arguments:
    """Split bound parameter values into array leaves and static leaves."""
    leaves, treedef = tree_flatten(tuple(bound.values()))
    kinds = tuple(map(leaf_kind, leaves))
    statics = tuple(leaf if kind == STATIC else None for leaf, kind in zip(leaves, kinds))
    arrays = tuple(leaf for leaf, kind in zip(leaves, kinds) if kind != STATIC)
    return Arguments(tuple(bound), treedef, kinds, statics, arrays, varargs)


def call_forward(
    forward: Any, signature: inspect.Signature, ctx: Any, names: tuple[str, ...], values: list[Any]
) -> Any:
    """Call the user's forward with ``ctx`` and the parameter values, as Python would bind them."""
    ctx_name = next(iter(signature.parameters))
    bound = inspect.BoundArguments(signature, {ctx_name: ctx, **dict(zip(names, values))})  # type: ignore[arg-type]
    return forward(*bound.args, **bound.kwargs)
