"""Binding a call's arguments to forward's parameters, and splitting them into leaves.

Every argument is a pytree. Its leaves are one of three kinds:
  * DIFF: a JAX or NumPy array of a floating or complex dtype (differentiable);
  * ARRAY: any other JAX or NumPy array (integer, boolean): passed through, never differentiated;
  * STATIC: everything else (Python numbers, strings, functions...): handed to forward as is.
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

from ._errors import AutogradFunctionTypeError, prefix

DIFF, ARRAY, STATIC = "differentiable", "array", "static"


def leaf_kind(leaf: Any) -> str:
    """DIFF, ARRAY or STATIC, for one leaf of an argument."""
    if isinstance(leaf, (jax.Array, np.ndarray)):
        return DIFF if np.issubdtype(leaf.dtype, np.inexact) else ARRAY
    return STATIC


@dataclasses.dataclass(frozen=True, eq=False)
class Arguments:
    """One call's arguments, split into the arrays JAX sees and everything else."""

    names: tuple[str, ...]  # forward's parameters, after the context
    treedef: Any  # of the tuple of all parameter values, in order
    kinds: tuple[str, ...]  # one per leaf
    statics: tuple[Any, ...]  # one per leaf: the value of a STATIC leaf, else None
    arrays: tuple[Any, ...]  # the values of the DIFF and ARRAY leaves, in leaf order

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

    def structure(self) -> Arguments:
        """The same call without its array values, to keep in closures without holding arrays."""
        return dataclasses.replace(self, arrays=())

    def array_positions(self) -> list[int]:
        """The leaf index of each entry of ``arrays``."""
        return [i for i, kind in enumerate(self.kinds) if kind != STATIC]

    def values(self, arrays: tuple[Any, ...] | list[Any]) -> list[Any]:
        """The parameter values, with ``arrays`` put back in place of the array leaves."""
        leaves = list(self.statics)
        for position, array in zip(self.array_positions(), arrays):
            leaves[position] = array
        return list(tree_unflatten(self.treedef, leaves))

    def static_key(self) -> tuple[Any, ...]:
        """What identifies this call apart from its arrays' values (raises if unhashable)."""
        key = (self.treedef, self.kinds, self.statics)
        hash(key)
        return key


def shape_dtypes(arrays: Any) -> list[jax.ShapeDtypeStruct]:
    """The shape and dtype of each array leaf (Python scalars included), as backward checks them."""
    return [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in arrays]


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
        raise AutogradFunctionTypeError(f"{prefix(name)} was called with the wrong arguments: {err}.") from None
    bound.apply_defaults()
    values = dict(bound.arguments)
    del values[next(iter(signature.parameters))]  # the context
    return values


def split(bound: dict[str, Any]) -> Arguments:
    """Split bound parameter values into array leaves and static leaves."""
    leaves, treedef = tree_flatten(tuple(bound.values()))
    kinds = tuple(map(leaf_kind, leaves))
    statics = tuple(leaf if kind == STATIC else None for leaf, kind in zip(leaves, kinds))
    arrays = tuple(leaf for leaf, kind in zip(leaves, kinds) if kind != STATIC)
    return Arguments(tuple(bound), treedef, kinds, statics, arrays)


def call_forward(
    forward: Any, signature: inspect.Signature, ctx: Any, names: tuple[str, ...], values: list[Any]
) -> Any:
    """Call the user's forward with ``ctx`` and the parameter values, as Python would bind them."""
    ctx_name = next(iter(signature.parameters))
    bound = inspect.BoundArguments(signature, {ctx_name: ctx, **dict(zip(names, values))})  # type: ignore[arg-type]
    return forward(*bound.args, **bound.kwargs)
