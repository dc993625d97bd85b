"""Binding a call's arguments to forward's parameters, and splitting them into leaves.

Every argument is a pytree. Its leaves are one of three kinds:
  * DIFF: a JAX or NumPy array of a floating or complex dtype (differentiable);
  * ARRAY: any other JAX or NumPy array (integer, boolean): passed through, never differentiated;
  * STATIC: everything else (Python numbers, strings, functions...): handed to forward as is.
Only DIFF and ARRAY leaves are given to JAX; STATIC leaves stay on the Python side.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path, tree_unflatten

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
    owners: tuple[int, ...]  # one per leaf: the position of its parameter
    paths: tuple[str, ...]  # one per leaf: 'params['w']'-style, for messages
    statics: tuple[Any, ...]  # one per leaf: the value of a STATIC leaf, else None
    arrays: tuple[Any, ...]  # the values of the DIFF and ARRAY leaves, in leaf order

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


def context_parameter(function: Any) -> inspect.Parameter | None:
    """The first positional parameter of ``function`` (where the context goes), if any."""
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            return parameter
        return None
    return None


def bind(name: str, signature: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Forward's parameters (after the context) bound to a call, defaults applied."""
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
    names = tuple(bound)
    with_paths, treedef = tree_flatten_with_path(tuple(bound.values()))
    kinds, owners, paths, statics, arrays = [], [], [], [], []
    for path, leaf in with_paths:
        kind = leaf_kind(leaf)
        kinds.append(kind)
        owners.append(path[0].idx)
        paths.append(names[path[0].idx] + keystr(path[1:]))
        statics.append(leaf if kind == STATIC else None)
        if kind != STATIC:
            arrays.append(leaf)
    return Arguments(names, treedef, tuple(kinds), tuple(owners), tuple(paths), tuple(statics), tuple(arrays))


def call_forward(forward: Any, signature: inspect.Signature, ctx: Any, names: tuple[str, ...], values: list[Any]) -> Any:
    """Call the user's forward with ``ctx`` and the parameter values, as Python would bind them."""
    ctx_name = next(iter(signature.parameters))
    bound = inspect.BoundArguments(signature, {ctx_name: ctx, **dict(zip(names, values))})  # type: ignore[arg-type]
    return forward(*bound.args, **bound.kwargs)
