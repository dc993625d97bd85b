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

import collections
import dataclasses
import inspect
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import (
    DictKey,
    FlattenedIndexKey,
    GetAttrKey,
    SequenceKey,
    keystr,
    tree_flatten,
    tree_flatten_with_path,
    tree_structure,
    tree_unflatten,
)

from . import _jax_private
from ._errors import AutogradFunctionTypeError, error, type_name
from ._split import Split, take
from ._tracers import Closure

DIFF, ARRAY, STATIC = "differentiable", "array", "static"


def _classify(dtype: Any) -> str:
    """DIFF, ARRAY or STATIC for an array of this dtype (DIFF: differentiable in JAX's dtype
    lattice, bfloat16 and float8 included)."""
    if jnp.issubdtype(dtype, jax.dtypes.extended):  # JAX's own tangent types decide: a PRNG key has none,
        return DIFF if _jax_private.has_tangent(dtype) else ARRAY  # Flax's fp8 fm32 scales are their own
    if jnp.issubdtype(dtype, jnp.inexact):  # JAX's lattice knows the ml_dtypes floats
        return DIFF
    if jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        return ARRAY
    return STATIC  # strings, objects, datetimes: not something JAX can hold


class _Kinds(dict[Any, str]):
    """A cache of ``_classify``: classifying a dtype costs more than a look-up."""

    def __missing__(self, dtype: Any) -> str:
        self[dtype] = kind = _classify(dtype)
        return kind


dtype_kind = _Kinds().__getitem__  # DIFF, ARRAY or STATIC for an array of this dtype (``_classify``), cached


def leaf_kind(leaf: Any) -> str:
    """DIFF, ARRAY or STATIC, for one leaf of an argument."""
    return dtype_kind(leaf.dtype) if isinstance(leaf, (jax.Array, np.ndarray)) else STATIC


class _cached:  # noqa: N801 - used as a decorator, like functools.cached_property
    """``functools.cached_property`` without its lock (Python 3.11 takes one on every read): the
    value, computed on first read, is kept in the instance's ``__dict__``."""

    def __init__(self, compute: Any):
        self.compute, self.name = compute, compute.__name__
        self.__doc__ = compute.__doc__

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


@dataclasses.dataclass(frozen=True, eq=False)
class Arguments(Split):
    """One call's arguments: the ``Split`` of the tuple of its parameter values, in order, into
    the arrays JAX sees (DIFF and ARRAY leaves) and everything else."""

    names: tuple[str, ...]  # forward's parameters, after the context
    kinds: tuple[str, ...]  # one per leaf
    arrays: tuple[Any, ...]  # the values of the DIFF and ARRAY leaves, in leaf order
    varargs: str | None = None  # the name of forward's *args parameter, if any
    implicit: tuple[str, ...] = ()  # the last names: values forward or backward closes over (SPEC 15)

    # Derived from the structure alone, and only when needed (not on the eager fast path).
    @_cached
    def paths(self) -> tuple[str, ...]:
        """One per leaf: 'params['w']'-style, for messages. From the call's own values where this
        ``Arguments`` holds them, else from the structure alone (``key_paths``): never by
        rebuilding the user's pytree nodes around placeholders they may refuse."""
        if self.arrays or not self.array_positions:
            with_paths, _ = tree_flatten_with_path(tuple(self.values(self.arrays)))
            key_paths_ = [path for path, _ in with_paths]
        else:
            key_paths_ = key_paths(self.treedef)
        return tuple(self.names[path[0].idx] + keystr(tuple(path[1:])) for path in key_paths_)

    @_cached
    def array_paths(self) -> tuple[str, ...]:
        """One per entry of ``arrays``: its ``paths`` entry (its name in messages)."""
        return tuple(self.paths[i] for i in self.array_positions)

    @_cached
    def closed_over(self) -> dict[int, str]:
        """The leaves that are values a function argument closes over (``in_closures``), or that
        forward or backward closes over (``implicit``), each with its parameter's name: backward
        must return their gradient."""
        owners = [name for name, child in zip(self.names, self.treedef.children()) for _ in range(child.num_leaves)]
        return {leaf: name for leaf, name in enumerate(owners) if name in self.implicit or leaf in self.in_closures}

    @_cached
    def in_closures(self) -> frozenset[int]:
        """The leaves inside a ``_tracers.Closure``: values a function reads through its program."""
        found, pending = set(), [(self.treedef, 0)]
        while pending:
            treedef, first = pending.pop()
            data = treedef.node_data()
            if data is not None and data[0] is Closure:
                found.update(range(first, first + treedef.num_leaves))
                continue
            for child in treedef.children():
                pending.append((child, first))
                first += child.num_leaves
        return frozenset(found)

    @_cached
    def slots(self) -> tuple[tuple[int, int | None], ...]:
        """The arguments as PyTorch counts them: (parameter, None), or (parameter, i) for each
        element of a ``*args`` parameter; not what forward or backward closes over (``implicit``,
        by name only). A tuple returned by backward has one entry per slot."""
        children = self.treedef.children()
        return tuple(
            (position, index)
            for position, name in enumerate(self.names)
            if name not in self.implicit  # a closed-over value is named, never counted (SPEC 15)
            for index in (range(len(children[position].children())) if name == self.varargs else (None,))
        )

    def slot_name(self, slot: tuple[int, int | None]) -> str:
        position, index = slot
        return self.names[position] + ("" if index is None else f"[{index}]")

    def structure(self) -> Arguments:
        """The same call without its array values, to keep in closures without holding arrays."""
        copy = object.__new__(Arguments)  # dataclasses.replace, without its cost on every traced call
        copy.__dict__.update(self.__dict__, arrays=())  # what is derived from the structure alone is kept too
        return copy

    @_cached
    def array_positions(self) -> tuple[int, ...]:
        """The leaf index of each entry of ``arrays``."""
        return tuple(i for i, array in enumerate(self.is_array) if array)

    def values(self, arrays: tuple[Any, ...] | list[Any]) -> list[Any]:
        """The parameter values, with ``arrays`` put back in place of the array leaves."""
        return list(self.join(arrays))

    def parameters(self, per_array: Any) -> list[Any]:
        """One value per array leaf (a gradient, a tangent, None) in the arguments' structure, one
        per parameter, None at every other leaf."""
        return list(self.join(per_array, python_values=False))

    def by_slot(self, parameters: list[Any]) -> list[Any]:
        """Per-parameter values, one per slot (each element of a ``*args`` parameter apart)."""
        return [parameters[p] if i is None else parameters[p][i] for p, i in self.slots]

    def from_slots(self, per_slot: Any) -> dict[str, Any]:
        """One value per slot as {parameter name: value} (a tuple for a ``*args`` parameter); the
        inverse of ``by_slot``."""
        values: dict[str, Any] = {}
        for (position, index), value in zip(self.slots, per_slot):
            name = self.names[position]
            values[name] = value if index is None else (*values.get(name, ()), value)
        return values

    def per_array_from_slots(self, per_slot: Any) -> list[Any]:
        """One value per slot, each in its argument's structure (a jvp's tangents), as one value per
        array (the inverse of ``by_slot(parameters(...))``): read through the arguments' structure,
        so a ``None`` argument (a node with no leaf) never shifts the values after it."""
        by_name = self.from_slots(per_slot)
        by_leaf: list[Any] = []
        for name, child in zip(self.names, self.treedef.children()):
            value = by_name.get(name, () if name == self.varargs else None)
            by_leaf += [None] * child.num_leaves if value is None else child.flatten_up_to(value)
        return [by_leaf[p] for p in self.array_positions]

    def replacing(self, leaves: dict[int, Any], implicit: dict[str, Any] | None = None) -> Arguments:
        """The same call with some leaves (by index) replaced, and ``implicit`` values added as
        parameters after the others, split again (a replacement may be a pytree node whose leaves
        are arrays)."""
        arrays = iter(self.arrays)
        values = [leaves.get(i, next(arrays) if a else s) for i, (a, s) in enumerate(zip(self.is_array, self.statics))]
        bound = dict(zip(self.names, tree_unflatten(self.treedef, values)))
        implicit = implicit or {}
        return dataclasses.replace(split({**bound, **implicit}, self.varargs), implicit=self.implicit + tuple(implicit))

    @property
    def has_containers(self) -> bool:
        """Whether some parameter is a pytree node (a dict, list, dataclass...), not one bare leaf:
        a tuple of n leaves has n + 1 nodes, so this costs two attribute reads."""
        return self.treedef.num_nodes != len(self.kinds) + 1

    def needs_input_grad(self, perturbed: Any) -> tuple[dict[str, bool], tuple[bool, ...]]:
        """From one flag per array, the flags per parameter name and per slot (see ``slots``)."""
        by_leaf = [False] * len(self.kinds)
        for leaf, flag in zip(self.array_positions, perturbed):
            by_leaf[leaf] = bool(flag)
        if self.varargs is None and not self.has_containers and not self.implicit:  # one leaf per parameter
            return dict(zip(self.names, by_leaf)), tuple(by_leaf)
        flags = iter(by_leaf)
        by_name: dict[str, bool] = {}
        per_slot: list[bool] = []
        for name, child in zip(self.names, self.treedef.children()):
            parts = child.children() if name == self.varargs else [child]  # its slots
            slots = [any([*itertools.islice(flags, part.num_leaves)]) for part in parts]
            by_name[name] = any(slots)
            if name not in self.implicit:  # a closed-over value: by name only
                per_slot += slots
        return by_name, tuple(per_slot)


def shape_dtypes(arrays: Any) -> list[jax.ShapeDtypeStruct]:
    """The shape and dtype of each array leaf, as backward checks them."""
    return [jax.ShapeDtypeStruct(jnp.shape(a), a.dtype if hasattr(a, "dtype") else jnp.result_type(a)) for a in arrays]


def context_parameter(function: Any) -> inspect.Parameter | None:
    """The first positional parameter of ``function`` (where the context goes), if any."""
    first = next(iter(inspect.signature(function).parameters.values()), None)
    return first if first is not None and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD) else None


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
        raise error(AutogradFunctionTypeError, name, _wrong_arguments(signature, args, kwargs, err)) from None
    bound.apply_defaults()
    values = dict(bound.arguments)
    del values[next(iter(signature.parameters))]  # the context
    return values


def _wrong_arguments(signature: inspect.Signature, args: tuple, kwargs: dict, err: TypeError) -> str:
    """What ``bind`` says for a call forward's signature refuses. One positional argument too
    many, which would fit if forward's first parameter were not the context, is the mark of a
    forward written without ctx (``def forward(x)``): say that the first parameter is the context."""
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return f"it was called with the wrong arguments: {err}"
    first = next(iter(signature.parameters))
    count = len(args)
    return (
        f"it was called with the wrong arguments: {err}: {count} for forward{signature}, which takes "
        f"{count - 1} after its first parameter {first!r}, and that one is always the context (jaxfn passes ctx "
        f"first, as R torch and PyTorch do); if forward was written without ctx, make ctx its first parameter "
        f"(forward(ctx, ...)), or keep it without ctx in PyTorch 2's form and add setup_context(ctx, inputs, "
        f"output) (autograd_function(..., setup_context=...), or a setup_context static method of a jaxfn.Function)"
    )


def split(bound: dict[str, Any], varargs: str | None = None) -> Arguments:
    """Split bound parameter values into array leaves and static leaves."""
    leaves, treedef = tree_flatten(tuple(bound.values()))
    kinds = tuple(map(leaf_kind, leaves))
    is_array = tuple([kind != STATIC for kind in kinds])
    arrays, statics = take(leaves, is_array)
    return Arguments(treedef, is_array, statics, tuple(bound), kinds, tuple(arrays), varargs)


def is_real_number(value: Any) -> bool:
    """Whether ``value`` is one real number: a Python, NumPy or JAX scalar (not a bool or a string)."""
    if isinstance(value, (bool, str, bytes)) or np.ndim(value) != 0:
        return False
    return any(np.issubdtype(np.asarray(value).dtype, kind) for kind in (np.integer, np.floating))


def is_torch_tensor(value: Any) -> bool:
    """Whether ``value`` is a PyTorch tensor (read from its type: torch is never imported here)."""
    kind = type(value)
    return kind.__name__ in ("Tensor", "Parameter") and kind.__module__.split(".")[0] == "torch"


def refuse_foreign_arrays(function: str, args: Arguments) -> None:
    """A PyTorch tensor (or another library's array) passed where JAX arrays go would reach forward
    as a static value and fail far from its cause: refused, naming the argument."""
    for leaf, value in enumerate(args.statics):  # None at an array
        if is_torch_tensor(value):
            raise error(
                AutogradFunctionTypeError,
                function,
                f"argument '{args.paths[leaf]}' is a torch.Tensor, but a jaxfn function takes JAX or NumPy arrays; "
                "pass jnp.asarray(t.detach().cpu().numpy()) (jaxfn.from_torch runs a PyTorch Function on JAX arrays)",
            )


def key_paths(treedef: Any) -> list[tuple[Any, ...]]:
    """One key path per leaf of ``treedef``, from the structure alone.

    Python's containers give their keys from their type and aux data. Another node (a
    registered class) gives its own keys when it can be rebuilt around placeholder leaves; a
    node whose unflatten refuses them (it checks or converts its children) is keyed by
    position, ``[0]``, ``[1]``..., below which the keys of its children go on as usual.
    """
    if treedef.num_nodes == 1:
        return [()] if treedef.num_leaves == 1 else []
    children = treedef.children()
    node_type, aux = treedef.node_data()
    keys = _container_keys(node_type, aux, len(children))
    if keys is None:
        whole = _placeholder_paths(treedef)
        if whole is not None:
            return whole
        keys = [FlattenedIndexKey(i) for i in range(len(children))]
    return [(key, *path) for key, child in zip(keys, children) for path in key_paths(child)]


def _container_keys(node_type: type, aux: Any, count: int) -> list[Any] | None:
    if node_type in (tuple, list):
        return [SequenceKey(i) for i in range(count)]
    if node_type in (dict, collections.OrderedDict):
        return [DictKey(k) for k in aux]
    if node_type is collections.defaultdict:
        return [DictKey(k) for k in aux[1]]
    fields = getattr(node_type, "_fields", None)
    if issubclass(node_type, tuple) and fields is not None:  # a namedtuple
        return [GetAttrKey(field) for field in fields]
    return None


class _Placeholder:
    """A leaf standing in for a value, to read a node's keys from an instance of it."""


def _placeholder_paths(treedef: Any) -> list[tuple[Any, ...]] | None:
    placeholders = [_Placeholder() for _ in range(treedef.num_leaves)]
    try:
        tree = tree_unflatten(treedef, placeholders)
    except Exception:  # noqa: BLE001 - a node that refuses placeholders is keyed by position instead
        return None
    with_paths, _ = tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, _Placeholder))
    if len(with_paths) != len(placeholders) or any(a is not b for (_, a), b in zip(with_paths, placeholders)):
        return None
    return [path for path, _ in with_paths]


def refuse_writes(function: str, names: tuple[str, ...], values: list[Any], before: tuple[list[Any], Any]) -> None:
    """Raise if forward changed a container it was handed (a key added to a dict, an element
    appended to or replaced in a list, an attribute of a registered dataclass set): ``values``
    are the parameter values forward received, ``before`` their ``tree_flatten`` when it
    received them (taken after they were built, so a node's unflatten that converts its
    children is not mistaken for a write)."""
    handed, handed_treedef = before
    now, treedef = tree_flatten(tuple(values))
    if treedef == handed_treedef and all(a is b for a, b in zip(now, handed)):
        return
    handed_leaves = iter(handed)
    for position, child in enumerate(handed_treedef.children()):
        mine = list(itertools.islice(handed_leaves, child.num_leaves))
        if tree_structure(values[position]) != child:
            what = f"'{names[position]}' ({type_name(values[position])}) gained or lost an entry"
            raise error(AutogradFunctionTypeError, function, _WRITTEN.format(what=what))
        replaced = [path for (path, a), b in zip(tree_flatten_with_path(values[position])[0], mine) if a is not b]
        if replaced:
            what = f"the value at '{names[position]}{keystr(replaced[0])}' was replaced"
            raise error(AutogradFunctionTypeError, function, _WRITTEN.format(what=what))


_WRITTEN = (
    "forward must leave its arguments as it received them, but {what} while forward ran: jaxfn hands forward "
    "copies of its pytree arguments (dicts, lists, dataclasses), so a write into one never reaches the caller; "
    "return the new value as an output of forward instead"
)
