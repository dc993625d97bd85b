"""One split of a pytree into its arrays and its Python values, and the join back.

A call's arguments (``_arguments.Arguments``), forward's output (``_outputs.Outputs``), what ctx
holds (``_context.Remainder``), the arguments of a closure's call (``_tracers.Closure``) and the
output of a jitted call (``_eager``) all cross JAX the same way: the arrays go where JAX sees them,
and the rest (the structure, and the value of every leaf that is not an array) stays in Python.
Each of those is a ``Split`` with what it needs added.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_flatten, tree_flatten_with_path, tree_unflatten


def is_array(leaf: Any) -> bool:
    """Whether a leaf is an array JAX can take (a JAX array or tracer, or a NumPy array)."""
    return isinstance(leaf, (jax.Array, np.ndarray))


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """A pytree with its arrays taken out: its structure and the Python value at every other leaf."""

    treedef: Any
    is_array: tuple[bool, ...]  # one per leaf
    statics: tuple[Any, ...]  # one per leaf: the value of a leaf that is not an array, else None

    def join(self, arrays: Iterable[Any], *, python_values: bool = True) -> Any:
        """The pytree with ``arrays`` at its array leaves, in order, and its Python values (or None,
        with ``python_values=False``) at the others."""
        arrays = iter(arrays)
        statics = self.statics if python_values else itertools.repeat(None)
        return tree_unflatten(self.treedef, [next(arrays) if a else s for a, s in zip(self.is_array, statics)])


def split(tree: Any, array: Callable[[Any], bool] = is_array) -> tuple[list[Any], Split]:
    """``tree``'s array leaves (``array(leaf)``), in order, and the rest as a ``Split``."""
    leaves, treedef = tree_flatten(tree)
    flags = tuple([array(leaf) for leaf in leaves])
    arrays, statics = take(leaves, flags)
    return arrays, Split(treedef, flags, statics)


def split_with_paths(tree: Any, array: Callable[[Any], bool] = is_array) -> tuple[list[Any], Split, list[tuple]]:
    """``split``, and every leaf's key path (for names and messages)."""
    arrays, parts = split(tree, array)
    return arrays, parts, [path for path, _ in tree_flatten_with_path(tree)[0]]


def take(leaves: list[Any], flags: tuple[bool, ...]) -> tuple[list[Any], tuple[Any, ...]]:
    """For leaves already flattened: those flagged as arrays, and every leaf's Python value (None
    at an array), a ``Split``'s ``statics``."""
    arrays = [leaf for leaf, flag in zip(leaves, flags) if flag]
    return arrays, tuple([None if flag else leaf for leaf, flag in zip(leaves, flags)])
