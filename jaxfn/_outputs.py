"""Forward's outputs: checking them, and handing their cotangents to backward."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.tree_util import keystr, tree_flatten_with_path, tree_unflatten

from ._errors import AutogradFunctionTypeError, prefix


@dataclasses.dataclass(frozen=True, eq=False)
class Outputs:
    """The static description of forward's outputs, carried to backward."""

    treedef: Any
    avals: tuple[jax.ShapeDtypeStruct, ...]  # one per leaf
    differentiable: tuple[bool, ...]  # one per leaf
    is_sequence: bool  # a tuple/list output: one grad_output per element

    @property
    def count(self) -> int:
        """How many grad_outputs backward receives."""
        return self.treedef.num_children if self.is_sequence else 1


def check(function: str, out: Any, non_differentiable: list[Any]) -> tuple[Any, Outputs]:
    """Forward's output with Python numbers made arrays, and its description; raises if bad."""
    if out is None:
        raise AutogradFunctionTypeError(
            f"{prefix(function)}: forward returned None; it must return an array, a tuple/list of "
            "arrays or a pytree of arrays (did it miss a return statement?)."
        )
    with_paths, treedef = tree_flatten_with_path(out)
    leaves = [_as_array(function, path, leaf) for path, leaf in with_paths]
    marked = {id(x) for x in non_differentiable}
    found = {id(leaf) for leaf in leaves if id(leaf) in marked}
    if len(found) != len(marked):
        raise AutogradFunctionTypeError(
            f"{prefix(function)}: ctx.mark_non_differentiable() takes arrays that forward returns, "
            f"but {len(marked) - len(found)} of its arguments are not among forward's outputs; pass the "
            "very arrays you return."
        )
    differentiable = tuple(id(leaf) not in marked and jnp.issubdtype(leaf.dtype, jnp.inexact) for leaf in leaves)
    avals = tuple(jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype) for leaf in leaves)
    info = Outputs(treedef, avals, differentiable, isinstance(out, (tuple, list)))
    return tree_unflatten(treedef, leaves), info


def _as_array(function: str, path: tuple, leaf: Any) -> Any:
    if isinstance(leaf, jax.Array):
        return leaf
    if isinstance(leaf, (np.ndarray, np.generic, bool, int, float, complex)):
        return jnp.asarray(leaf)
    where = f"output{keystr(path)}" if path else "its output"
    raise AutogradFunctionTypeError(
        f"{prefix(function)}: forward must return arrays (a tuple/list or pytree of them; Python numbers "
        f"are made arrays), but {where} is a {type(leaf).__name__}."
    )


def grad_outputs(info: Outputs, cotangents: Any, materialize: bool) -> list[Any]:
    """The grad_output arguments for backward: zeros (or None) where no gradient flows."""
    leaves = info.treedef.flatten_up_to(cotangents)
    handed = [
        ct if differentiable and not isinstance(ct, SymbolicZero) else _no_gradient(aval, materialize)
        for ct, aval, differentiable in zip(leaves, info.avals, info.differentiable)
    ]
    tree = tree_unflatten(info.treedef, handed)
    return list(tree) if info.is_sequence else [tree]


def _no_gradient(aval: jax.ShapeDtypeStruct, materialize: bool) -> Any:
    return jnp.zeros(aval.shape, aval.dtype) if materialize else None
