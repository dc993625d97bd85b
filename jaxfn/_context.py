"""The context object ``ctx`` that forward and backward share, and how it crosses to backward.

A context belongs to one trace of forward. What it holds crosses to backward in two parts:
JAX arrays as ``custom_vjp`` residuals, everything else (numbers, strings, flags) as a static
remainder that ``jaxfn._function`` keeps per trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax

from ._errors import (
    AutogradFunctionTypeError,
    AutogradFunctionValueError,
    ContextAttributeError,
    ContextKeyError,
    prefix,
    unknown_name,
)


class SavedVariables(Mapping):
    """What forward saved with ``ctx.save_for_backward(name=value)``: a read-only mapping.

    Read a value as ``saved.name`` (R's ``s$name``) or ``saved["name"]``.
    """

    __slots__ = ("_function", "_values")

    def __init__(self, function: str, values: dict[str, Any]):
        object.__setattr__(self, "_function", function)
        object.__setattr__(self, "_values", dict(values))

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise ContextKeyError(self._unknown(name)) from None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise ContextAttributeError(self._unknown(name)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AutogradFunctionTypeError(
            f"{prefix(self._function)}: ctx.saved_variables is read-only; "
            "save values in forward with ctx.save_for_backward(name=value)."
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"SavedVariables({', '.join(self._values)})"

    def _unknown(self, name: str) -> str:
        return f"{prefix(self._function)}: " + unknown_name("ctx.saved_variables", name, self._values)


class NeedsInputGrad(Sequence):
    """Whether JAX differentiates with respect to each parameter, in this trace.

    By name as an attribute (R: ``ctx.needs_input_grad.input``) or key
    (``ctx.needs_input_grad["input"]``), or by position (PyTorch: ``ctx.needs_input_grad[0]``,
    ``a, b = ctx.needs_input_grad``). ``"input" in ctx.needs_input_grad`` asks for a name.
    """

    __slots__ = ("_function", "_flags")

    def __init__(self, function: str, flags: dict[str, bool]):
        object.__setattr__(self, "_function", function)
        object.__setattr__(self, "_flags", dict(flags))

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            try:
                return self._flags[key]
            except KeyError:
                raise ContextKeyError(self._unknown(key)) from None
        return tuple(self._flags.values())[key]

    def __getattr__(self, name: str) -> bool:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._flags[name]
        except KeyError:
            raise ContextAttributeError(self._unknown(name)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AutogradFunctionTypeError(f"{prefix(self._function)}: ctx.needs_input_grad is read-only.")

    def __contains__(self, item: object) -> bool:
        return item in self._flags if isinstance(item, str) else item in self._flags.values()

    def __len__(self) -> int:
        return len(self._flags)

    def keys(self):
        return self._flags.keys()

    def __repr__(self) -> str:
        return "NeedsInputGrad(" + ", ".join(f"{k}={v}" for k, v in self._flags.items()) + ")"

    def _unknown(self, name: str) -> str:
        return f"{prefix(self._function)}: " + unknown_name("ctx.needs_input_grad", name, self._flags)


class Context:
    """The ``ctx`` handed to forward and backward of one call (see ``jaxfn.autograd_function``)."""

    _OWN_NAMES = frozenset(
        {
            "save_for_backward",
            "saved_variables",
            "saved_tensors",
            "needs_input_grad",
            "mark_non_differentiable",
            "set_materialize_grads",
            "mark_dirty",
            "materialize_grads",
        }
    )

    def __init__(self, function: str, needs_input_grad: dict[str, bool], inputs: Sequence[Any] = ()):
        state = {
            "function": function,
            "needs": needs_input_grad,
            "inputs": list(inputs),  # this call's array inputs, for mark_dirty
            "in_forward": True,
            "positional": (),
            "named": {},
            "attrs": {},
            "non_differentiable": [],
            "materialize": True,
        }
        object.__setattr__(self, "_jaxfn", state)

    # -- forward-only methods --------------------------------------------------------------
    def save_for_backward(self, *values: Any, **named: Any) -> None:
        """Save values for backward: by name (R) as ``saved_variables``, or by position
        (PyTorch) as ``saved_tensors``. A later call replaces what an earlier one saved."""
        self._forward_only("save_for_backward")
        self._jaxfn["positional"] = values
        self._jaxfn["named"] = named

    def mark_non_differentiable(self, *outputs: Any) -> None:
        """Declare outputs (the very arrays forward returns) that carry no gradient."""
        self._forward_only("mark_non_differentiable")
        self._jaxfn["non_differentiable"].extend(outputs)

    def set_materialize_grads(self, value: bool) -> None:
        """With ``False``, cotangents that carry no gradient reach backward as ``None``."""
        self._forward_only("set_materialize_grads")
        self._jaxfn["materialize"] = bool(value)

    def mark_dirty(self, *inputs: Any) -> None:
        """Accepted for ported code: JAX arrays are immutable, so an "in-place" forward returns
        the updated array. Checks that each argument is one of this call's array inputs."""
        self._forward_only("mark_dirty")
        ids = {id(x) for x in self._jaxfn["inputs"]}
        for position, value in enumerate(inputs):
            if id(value) not in ids:
                raise AutogradFunctionValueError(
                    f"{prefix(self._jaxfn['function'])}: ctx.mark_dirty() takes this call's array "
                    f"inputs, but argument {position} is a {type(value).__name__} that is not one of them."
                )

    # -- read in backward ------------------------------------------------------------------
    @property
    def saved_variables(self) -> SavedVariables:
        """The values saved by name, as a read-only mapping with attribute access."""
        return SavedVariables(self._jaxfn["function"], self._jaxfn["named"])

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        """The values saved by position (or, if none were, those saved by name, in order)."""
        return tuple(self._jaxfn["positional"]) or tuple(self._jaxfn["named"].values())

    @property
    def needs_input_grad(self) -> NeedsInputGrad:
        """Per parameter, whether JAX differentiates with respect to it in this trace."""
        return NeedsInputGrad(self._jaxfn["function"], self._jaxfn["needs"])

    @property
    def materialize_grads(self) -> bool:
        return self._jaxfn["materialize"]

    # -- user attributes -------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN_NAMES or name == "_jaxfn":
            raise AutogradFunctionTypeError(
                f"{prefix(self._jaxfn['function'])}: ctx.{name} belongs to the context and can't be "
                "overwritten; store your value under another name."
            )
        self._jaxfn["attrs"][name] = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_jaxfn":
            raise AttributeError(name)
        try:
            return self._jaxfn["attrs"][name]
        except KeyError:
            raise ContextAttributeError(
                f"{prefix(self._jaxfn['function'])}: "
                + unknown_name("ctx", name, self._jaxfn["attrs"])
                + " Set attributes on ctx in forward to read them in backward."
            ) from None

    def __delattr__(self, name: str) -> None:
        self.__getattr__(name)
        del self._jaxfn["attrs"][name]

    def _forward_only(self, method: str) -> None:
        if not self._jaxfn["in_forward"]:
            raise AutogradFunctionTypeError(
                f"{prefix(self._jaxfn['function'])}: ctx.{method}() can only be called in forward."
            )

    # -- crossing from forward to backward -------------------------------------------------
    def to_residuals(self) -> tuple[list[Any], tuple[Any, ...]]:
        """What the context holds, split into JAX arrays (residuals) and a static remainder."""
        state = self._jaxfn
        names = (tuple(state["named"]), tuple(state["attrs"]))  # in the user's order (JAX sorts dicts)
        held = (state["positional"], tuple(state["named"].values()), tuple(state["attrs"].values()))
        leaves, treedef = jax.tree_util.tree_flatten(held)
        is_array = tuple(isinstance(leaf, jax.Array) for leaf in leaves)
        arrays = [leaf for leaf, array in zip(leaves, is_array) if array]
        statics = [None if array else leaf for leaf, array in zip(leaves, is_array)]
        return arrays, (state["function"], state["needs"], state["materialize"], names, treedef, is_array, statics)

    @classmethod
    def from_residuals(cls, arrays: list[Any], static: tuple[Any, ...]) -> Context:
        """The backward-side context, rebuilt from ``to_residuals``'s two parts."""
        function, needs, materialize, (named_keys, attr_keys), treedef, is_array, statics = static
        arrays_iter = iter(arrays)
        leaves = [next(arrays_iter) if array else leaf for leaf, array in zip(statics, is_array)]
        positional, named, attrs = jax.tree_util.tree_unflatten(treedef, leaves)
        ctx = cls(function, needs)
        ctx._jaxfn.update(
            in_forward=False,
            positional=positional,
            named=dict(zip(named_keys, named)),
            attrs=dict(zip(attr_keys, attrs)),
            materialize=materialize,
        )
        return ctx
