"""Checking what backward returns, and turning it into one cotangent per array leaf."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from ._arguments import DIFF, STATIC, Arguments
from ._errors import AutogradFunctionTypeError, AutogradFunctionValueError, a, error, raise_all, type_name


def by_parameter(
    function: str, args: Arguments, returned: Any, keyword_only: tuple[str, ...], differentiated: Mapping[str, bool]
) -> dict[str, Any]:
    """Backward's return value as {parameter name: gradient pytree or None}.

    A tuple/list has one entry per argument as PyTorch counts them (``args.slots``: each
    element of a ``*args`` parameter is one); extra trailing ``None`` entries are ignored, as
    PyTorch ignores them, and entries for forward's keyword-only parameters (``keyword_only``,
    which PyTorch's forward can't have) may be left out where they are not ``differentiated``
    (by name): leaving out one that is would drop its gradient silently.
    """
    names, slots = args.names, args.slots
    if returned is None:
        raise error(AutogradFunctionTypeError, function, _returned_none(args))
    own = _own_children(args)
    if isinstance(returned, Mapping) and (own is None or set(returned) <= set(names)):
        unknown = [key for key in returned if key not in names]
        if unknown:
            raise error(
                AutogradFunctionTypeError,
                function,
                f"backward returned gradients for {', '.join(map(repr, unknown))}, but "
                + (
                    f"the only parameter of '{function}' is {names[0]!r}"
                    if len(names) == 1
                    else f"the parameters of '{function}' are {', '.join(map(repr, names))}"
                )
                + "; key the dict by forward's parameter names",
            )
        return dict(returned)
    if isinstance(returned, (tuple, list)) and not (own == len(returned) and len(returned) != 1):
        return args.from_slots(_per_slot(function, args, returned, keyword_only, differentiated))
    if len(slots) == 1:
        return args.from_slots([returned])
    raise error(
        AutogradFunctionTypeError,
        function,
        "backward must return a dict keyed by parameter name, a tuple/list with one entry per parameter, or a bare "
        f"array (one-parameter functions only), but it returned {describe(returned)} for a function with "
        f"{len(slots)} parameters ({', '.join(map(args.slot_name, slots))})",
    )


def _returned_none(args: Arguments) -> str:
    """The sentence for a bare None from backward: what a backward without a return statement gives."""
    count = len(args.slots)
    nones = "(" + ", ".join(["None"] * count) + ("," if count == 1 else "") + ")"
    return (
        "backward returned None (what a backward without a return statement gives), but a gradient is asked "
        f"for its input{'s' * (count != 1)}, and zeros would train nothing in silence; return the gradients: a "
        "tuple with one entry per parameter, a dict keyed by parameter name, or a bare array for a one-parameter "
        f"function (return {{}} or {nones} for no gradient)"
    )


def _own_children(args: Arguments) -> int | None:
    """For a one-argument call whose argument is a pytree node, not a single leaf: its number of
    children. Such a call's backward may return that argument's own gradient: a dict (not keyed by
    parameter name), or a tuple/list of that length (not one). None for any other call, whose dict
    or tuple/list is keyed by parameter name or slot."""
    if len(args.slots) != 1:
        return None
    position, index = args.slots[0]
    child = args.treedef.children()[position]
    child = child if index is None else child.children()[index]
    return len(child.children()) if child.num_nodes > 1 else None


def _per_slot(
    function: str, args: Arguments, returned: tuple | list, keyword_only: tuple[str, ...], differentiated: Mapping
) -> list[Any]:
    count = len(args.slots)
    positional = sum(args.names[position] not in keyword_only for position, _ in args.slots)
    if positional <= len(returned) < count:  # keyword-only gradients left out: None
        wanted = [name for name in map(args.slot_name, args.slots[len(returned) :]) if differentiated.get(name)]
        if wanted:
            raise error(
                AutogradFunctionTypeError,
                function,
                f"backward returned {len(returned)} gradient{'s' * (len(returned) != 1)}, leaving out the keyword-only "
                f"parameter{'s' * (len(wanted) != 1)} {', '.join(map(repr, wanted))}, but "
                + ("it is" if len(wanted) == 1 else "they are")
                + f" being differentiated (ctx.needs_input_grad.{wanted[0]} is True), so its gradient would be "
                "lost; return it in the tuple (one entry per parameter, keyword-only ones last in forward's order) "
                "or return a dict keyed by parameter name",
            )
        returned = (*returned, *[None] * (count - len(returned)))
    if len(returned) < count or any(g is not None for g in returned[count:]):
        listed = ", ".join(map(args.slot_name, args.slots)) or "none"
        raise error(
            AutogradFunctionTypeError,
            function,
            f"backward returned {len(returned)} gradient{'s' * (len(returned) != 1)} for {count} "
            f"parameter{'s' * (count != 1)} ({listed}); return one entry per parameter (None for no gradient), "
            "or a dict keyed by name (where forward or backward closes over a value being differentiated, a dict "
            "gives its gradient too, by the name the code gives it)",
        )
    return list(returned[:count])


def to_cotangents(
    function: str,
    args: Arguments,
    grads: dict[str, Any],
    avals: list[Any],
    wanted: list[bool],
    asarray: Callable[[Any], Any],
) -> list[Any]:
    """One cotangent (or None) per array leaf of ``args``, checked against its input.

    ``avals[i]`` is the shape and dtype of the i-th array leaf and ``wanted[i]`` whether JAX
    differentiates it; gradients for the others are checked but dropped, so cost nothing.
    ``asarray`` makes each gradient an array: ``np.asarray`` for a host backward (``host=True``),
    whose gradients stay NumPy arrays.
    """
    per_leaf: list[Any] = [None] * len(args.kinds)
    problems = _Problems()
    for position, name in enumerate(args.names):
        _spread(args, position, grads.get(name), per_leaf, problems)
    cotangents = []
    for leaf, aval, want in zip(args.array_positions, avals, wanted):
        name = args.closed_over.get(leaf) if want else None
        if name is not None and grads.get(name) is None:
            missing = (AutogradFunctionTypeError, _closure_without_gradient(name, name in args.implicit))
            if missing not in problems:  # once per function, not per value it holds
                problems.append(missing)
        grad = per_leaf[leaf]
        checked = None if grad is None else _check_leaf(args, leaf, grad, aval, problems, asarray)
        cotangents.append(checked if want else None)
    raise_all(problems, function)
    return cotangents


def _closure_without_gradient(name: str, implicit: bool) -> str:
    if implicit:
        return (
            f"forward or backward closes over '{name}', which holds values being differentiated, so its gradient "
            f"is needed (it counts as a parameter after forward's own, named '{name}'), but backward returned none "
            f"for it; return it keyed by that name ({{'{name}': ...}}, the structure of '{name}'), or pass "
            f"'{name}' to the function as an argument"
        )
    return (
        f"'{name}' is a function that closes over values being differentiated, so its gradient (the gradient "
        f"of those values) is needed, but backward returned none for it; return the gradient "
        f"of '{name}' as a pytree like '{name}' itself, from jax.vjp: _, pull = jax.vjp(lambda f: f(x), "
        f"{name}); (grad_{name},) = pull(grad_output) (or jax.tree.map(jnp.zeros_like, {name}) if no gradient "
        "flows through it)"
    )


class _Problems(list[tuple[type, str]]):
    """The problems of one backward's return, each (kind, sentence): all are raised together."""

    def add(self, sentence: str, kind: type = AutogradFunctionTypeError) -> None:
        """Note one problem (a type error unless ``kind`` says otherwise), and give no cotangent."""
        self.append((kind, sentence))


def _spread(args: Arguments, position: int, grad: Any, per_leaf: list[Any], problems: _Problems) -> None:
    """Put the gradient pytree of one parameter into ``per_leaf``, matching its structure.

    The gradient is matched against the parameter's treedef node by node; nothing is rebuilt,
    so a user's pytree node whose unflatten refuses placeholders (or None) is never asked to
    hold one. A node of another structure ends the match: one problem for the parameter, naming its whole
    structure (leaves matched before it are still checked)."""
    name, parameters = args.names[position], args.treedef.children()
    pending = [(grad, parameters[position], sum(child.num_leaves for child in parameters[:position]))]
    while pending:
        g, treedef, first = pending.pop()
        if g is None or isinstance(g, SymbolicZero):
            continue
        if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # one leaf of the parameter
            if args.kinds[first] != STATIC:
                per_leaf[first] = g
                continue
            problems.add(
                f"backward returned a gradient for '{args.paths[first]}', but it is a static "
                f"argument ({type_name(args.statics[first])}), not an array, so it can't have one; return "
                f"None for it, or pass a floating-point jnp array to make it differentiable."
            )
            continue
        data = treedef.node_data()  # (type, aux data): a node here, never a leaf (a None's type is NoneType)
        if isinstance(g, dict) and data[0] is dict and set(g) <= set(data[1]):
            g = {key: g.get(key) for key in data[1]}  # the keys its dict input has and it lacks: None (no gradient)
        children, node = jax.tree_util.tree_flatten(g, is_leaf=lambda x, g=g: x is not g)  # one level of g
        if node.num_nodes == 1 and node.num_leaves == 1 and data[0] is type(None):  # a value where None was given
            problems.add(
                f"backward returned {describe(g)} for '{name}', but that part of '{name}' is None, not an array, "
                "so it can't have a gradient; return None for it, or pass a floating-point jnp array to make it "
                "differentiable."
            )
            continue
        if node.num_nodes == 1 and node.num_leaves == 1:  # an array (or value) for a whole subtree
            n, kind = treedef.num_leaves, a(data[0].__name__)
            problems.add(
                f"backward returned {describe(g)} for '{name}', but that part of '{name}' is "
                f"{kind}, a pytree with {n} lea{'f' if n == 1 else 'ves'}; return a gradient of "
                "the same structure, or pass the array inside it to the function instead (a Flax nnx.Param p: "
                "p[...])"
            )
            continue
        subtrees = treedef.children()
        try:  # the same node (type and aux data), with as many children
            same = len(children) == len(subtrees) and node.node_data() == data
        except (TypeError, ValueError):  # aux data that can't be compared (an array): a different node
            same = False
        if not same:
            return problems.add(
                f"backward returned a gradient for '{name}' with pytree structure "
                f"{jax.tree_util.tree_structure(grad)}, but '{name}' has structure {parameters[position]}; return the "
                "same structure (None for no gradient)."
            )
        pending.extend(zip(children, subtrees, itertools.accumulate((t.num_leaves for t in subtrees), initial=first)))


def describe(value: Any) -> str:
    """A value as messages name it: 'an array of shape (3,) and dtype float32', 'a str'."""
    if isinstance(value, (jax.Array, np.ndarray)):
        return f"an array of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type_name(value)


_GRADIENTS = (jax.Array, np.ndarray, np.generic, int, float, complex)  # the types a gradient may have (bool aside)


def _check_leaf(
    args: Arguments, leaf: int, grad: Any, primal: Any, problems: _Problems, asarray: Callable[[Any], Any]
) -> Any:
    """The gradient of leaf ``leaf`` of ``args``, summed to its shape and cast to its dtype; or
    None, for a gradient that is refused (noted in ``problems``) or a leaf that is never
    differentiated (an integer, boolean or key array): its gradient is dropped (PyTorch's ports
    return zeros for an index), but a value that can't be a gradient for it (not an array, or of
    a shape that does not broadcast to it) is refused, as a mistake."""
    differentiable = args.kinds[leaf] == DIFF
    same = isinstance(grad, jax.Array) and grad.dtype == primal.dtype and grad.shape == tuple(primal.shape)
    if same and differentiable and asarray is jnp.asarray:
        return grad  # the common case: nothing to convert or check (and the leaf's name is never read)
    where, shape, dtype = args.paths[leaf], tuple(primal.shape), primal.dtype
    never = f"an array of dtype {dtype}, which is never differentiated"
    if not isinstance(grad, _GRADIENTS) or isinstance(grad, bool):
        but = (
            "a gradient must be an array (or None)." if differentiable else f"'{where}' is {never}; return None for it"
        )
        return problems.add(f"backward returned {describe(grad)} as the gradient for '{where}', but {but}")
    if not differentiable:
        if not broadcasts_to(shape, tuple(np.shape(grad))):
            problems.add(
                f"backward returned a gradient of shape {tuple(np.shape(grad))} for '{where}', but '{where}' has "
                f"shape {shape} and is {never}; return None for it",
                AutogradFunctionValueError,
            )
        return None
    got = f"backward returned a gradient for '{where}' with"
    if not isinstance(grad, (jax.Array, np.ndarray, np.generic)):
        grad = asarray(grad)  # a Python number: the dtype JAX gives it
    if not jnp.issubdtype(grad.dtype, jnp.inexact):  # checked before asarray: an object array can't be one
        return problems.add(
            f"{got} dtype {grad.dtype}, but '{where}' has dtype {dtype}; a gradient must be floating-point."
        )
    if jnp.issubdtype(grad.dtype, jnp.complexfloating) and not jnp.issubdtype(dtype, jnp.complexfloating):
        return problems.add(
            f"{got} complex dtype {grad.dtype}, but '{where}' is real ({dtype}); "
            "return the real part (jnp.real) if that is the gradient you mean."
        )
    grad = asarray(grad)
    if grad.shape != shape:
        if not broadcasts_to(shape, grad.shape):
            return problems.add(
                f"{got} shape {grad.shape}, but '{where}' has shape {shape}, so the shapes do not match "
                f"(and {shape} does not broadcast to {grad.shape}).",
                AutogradFunctionValueError,
            )
        grad = sum_to_shape(grad, shape)
    return grad if grad.dtype == dtype else grad.astype(dtype)


def broadcasts_to(shape: tuple[Any, ...], target: tuple[Any, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``target``; dimensions may be symbolic (``jax.export``)."""
    return len(shape) <= len(target) and all(s == t or s == 1 for s, t in zip(reversed(shape), reversed(target)))


def sum_to_shape(grad: Any, shape: tuple[int, ...]) -> Any:
    """Sum a broadcast gradient down to the input's shape, as PyTorch does."""
    lead = grad.ndim - len(shape)
    broadcast = tuple(lead + i for i, size in enumerate(shape) if size == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=tuple(range(lead)) + broadcast).reshape(shape)
