"""Forward's outputs: checking them, keeping Python values apart, and handing cotangents to backward.

An output is any pytree. Its array leaves (JAX arrays, and NumPy numeric arrays, made JAX
arrays) are what the custom rule returns to JAX; every other leaf (a Python number, a string, a
small object) is kept on the Python side and put back in place, unchanged, also under ``jit``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.tree_util import keystr, tree_flatten_with_path

from ._arguments import DIFF, STATIC, dtype_kind
from ._errors import AutogradFunctionTypeError, error, type_name
from ._split import Split, take


@dataclasses.dataclass(frozen=True, eq=False)
class Outputs(Split):
    """The static description of forward's outputs, carried to backward: the output's ``Split``
    and what its arrays are."""

    avals: tuple[jax.ShapeDtypeStruct, ...]  # one per array leaf
    differentiable: tuple[bool, ...]  # one per array leaf
    is_sequence: bool  # a tuple/list output: one grad_output per element
    function: str = "forward"  # the jaxfn function's name, for messages

    rebuild = Split.join  # the output pytree from its array leaves, Python values put back in place

    def same_arrays_as(self, other: Outputs) -> bool:
        """Whether two traces of forward gave the same output structure and arrays (Python values
        may be new objects each trace: only where they are counts)."""
        return self.treedef == other.treedef and self.is_array == other.is_array and self.avals == other.avals


@jax.tree_util.register_static
class Described:
    """Forward's output description riding inside a custom rule's output, as a pytree node with
    no leaves (as Equinox's ``Static``): the rule returns ``(arrays, Described(info))`` and its
    caller reads the description of the very trace that made the arrays, with no side list. Two
    are equal where their arrays are (JAX compares a fwd's output tree with its primal's; Python
    values may be new objects in each trace)."""

    __slots__ = ("info",)

    def __init__(self, info: Outputs):
        self.info = info

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Described) and self.info.same_arrays_as(other.info)

    def __hash__(self) -> int:
        return hash((self.info.treedef, self.info.is_array, self.info.avals))


def check(function: str, out: Any, non_differentiable: list[Any]) -> tuple[list[Any], Outputs]:
    """Forward's array leaves and the description of its output; raises if it is not valid."""
    if out is None:
        raise error(
            AutogradFunctionTypeError,
            function,
            "forward returned None, but it must return an array, a tuple/list of arrays or a pytree of arrays "
            "(did it miss a return statement?)",
        )
    if isinstance(out, jax.Array) and not non_differentiable:  # the common case: one array
        aval = jax.ShapeDtypeStruct(out.shape, out.dtype)
        return [out], Outputs(_ONE_LEAF, (True,), (None,), (aval,), (dtype_kind(out.dtype) == DIFF,), False, function)
    with_paths, treedef = tree_flatten_with_path(out)
    leaves = [leaf for _, leaf in with_paths]
    marked = check_marked(function, leaves, non_differentiable)
    for path, leaf in with_paths:
        if isinstance(leaf, np.ndarray) and dtype_kind(leaf.dtype) == STATIC:
            where = f"output{keystr(path)}" if path else "its output"
            raise error(
                AutogradFunctionTypeError,
                function,
                f"forward returned a NumPy array of dtype {leaf.dtype} as {where}, but JAX can only hold numeric "
                "arrays; return it as a Python list or object, or convert it to numbers",
            )
    is_array = tuple([isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves])
    arrays, statics = take(leaves, is_array)
    if not arrays:
        what = f"its output is {type_name(out)}" if not with_paths or with_paths[0][1] is out else "it has none"
        raise error(
            AutogradFunctionTypeError,
            function,
            f"forward must return arrays (an array, a tuple/list or pytree of them, with Python values beside them "
            f"if you like), but {what}",
        )
    differentiable = tuple(id(a) not in marked and dtype_kind(a.dtype) == DIFF for a in arrays)
    arrays = [a if isinstance(a, jax.Array) else jnp.asarray(a) for a in arrays]
    avals = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays)
    return arrays, Outputs(treedef, is_array, statics, avals, differentiable, isinstance(out, (tuple, list)), function)


_ONE_LEAF = jax.tree_util.tree_structure(0)  # the structure of an output that is one array


def check_marked(function: str, leaves: list[Any], non_differentiable: list[Any]) -> set[int]:
    """The ids of the outputs forward marked with ``ctx.mark_non_differentiable``; raises where a
    value marked is not one of forward's output ``leaves``, naming each by its argument position
    (and the input of forward it is, if one)."""
    marked = {id(x) for x in non_differentiable}
    found = {id(leaf) for leaf in leaves if id(leaf) in marked}
    if len(found) == len(marked):
        return marked
    named = getattr(non_differentiable, "named", {})  # _context.Marked: how each was given
    missing = {id(x): named.get(id(x), f"argument ({type_name(x)})") for x in non_differentiable if id(x) not in found}
    inputs = any("forward's input" in where for where in missing.values())
    raise error(
        AutogradFunctionTypeError,
        function,
        f"ctx.mark_non_differentiable() takes values that forward returns, but its {' and '.join(missing.values())} "
        + ("is" if len(missing) == 1 else "are")
        + " not among forward's outputs"
        + (" (an input is not an output unless forward returns it)" if inputs else "")
        + "; pass the very arrays you return",
    )


def grad_outputs(info: Outputs, cotangents: list[Any], materialize: bool, xp: Any = jnp) -> list[Any]:
    """The grad_output arguments for backward: zeros (or None) where no gradient flows.

    ``cotangents`` has one entry per array leaf (None or a symbolic zero where none flows). Python
    values in the output get ``None``. ``xp``: ``numpy`` for a host backward, whose zeros are NumPy's.
    """
    if info.treedef is _ONE_LEAF and info.differentiable == (True,) and _flows(cotangents[0]):
        return [cotangents[0]]  # the common case: one array output, with a gradient
    per_array = [
        ct if differentiable and _flows(ct) else _no_gradient(aval, materialize, xp)
        for ct, aval, differentiable in zip(cotangents, info.avals, info.differentiable)
    ]
    try:
        tree = info.join(per_array, python_values=False)
    except Exception as err:  # noqa: BLE001 - a user's pytree node that refuses None, said in jaxfn's words
        if all(info.is_array) and not any(a is None for a in per_array):
            raise
        raise error(
            AutogradFunctionTypeError, info.function, _REFUSES_NONE.format(treedef=info.treedef, err=type(err).__name__)
        ) from err
    return list(tree) if info.is_sequence else [tree]


def _flows(cotangent: Any) -> bool:
    return cotangent is not None and not isinstance(cotangent, SymbolicZero)


def grad_output_leaves(name: str, info: Split, is_sequence: bool, grad_outputs: tuple[Any, ...]) -> list[Any]:
    """backward's grad_outputs (one per element of a tuple/list output, else one) as one per
    output leaf, None where none flows: the inverse of ``grad_outputs``, for backwards that hand
    them on (host code, finite differences, a PyTorch Function)."""
    given = grad_outputs if is_sequence else grad_outputs[0]
    return per_leaf(name, info, is_sequence, given, "backward", "grad_output")


def per_leaf(name: str, info: Split, is_sequence: bool, returned: Any, role: str, what: str) -> list[Any]:
    """``returned`` (one value per output, in forward's output structure ``info``: grad_outputs as
    backward gets them, a jvp's tangents, a vmap rule's outputs; None for a whole output) as one
    value per output leaf, read through the output's structure: a ``None`` the output holds is a
    node with no leaf, never mistaken for a missing value."""
    parts = [(info.treedef, returned)]
    if is_sequence:
        children = info.treedef.children()
        if not isinstance(returned, (tuple, list)) or len(returned) != len(children):
            raise error(
                AutogradFunctionTypeError,
                name,
                f"forward returns {len(children)} outputs, so {role} must return a tuple of {len(children)} "
                f"{what}s (None for an output without one), but it returned {type_name(returned)}"
                + (f" of length {len(returned)}" if isinstance(returned, (tuple, list)) else ""),
            )
        parts = list(zip(children, returned))
    leaves: list[Any] = []
    for index, (treedef, value) in enumerate(parts):
        try:
            leaves.extend([None] * treedef.num_leaves if value is None else treedef.flatten_up_to(value))
        except (TypeError, ValueError):
            raise error(
                AutogradFunctionTypeError,
                name,
                f"{role}'s {what} for output {index} must have that output's structure ({treedef}), but it is "
                f"{type_name(value)}; return {what}s in the structure forward returns",
            ) from None
    return leaves


_REFUSES_NONE = (
    "backward receives its grad_outputs in the structure of forward's output, with None where no gradient "
    "flows (a Python value, or any output with ctx.set_materialize_grads(False)), but a pytree node of the "
    "output, {treedef}, refused None when rebuilt ({err}); return arrays in that node only, or let its unflatten "
    "accept None"
)


def _no_gradient(aval: jax.ShapeDtypeStruct, materialize: bool, xp: Any) -> Any:
    if not materialize or jnp.issubdtype(aval.dtype, jax.dtypes.extended):
        return None  # a PRNG key has no zeros
    return xp.zeros(aval.shape, aval.dtype)
