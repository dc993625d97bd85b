"""``jaxfn.from_torch``: an existing ``torch.autograd.Function`` run inside JAX programs as host code.

The original is wrapped as a ``host=True`` function, so it runs wherever host functions do
(``jit``, ``grad``, ``vmap``, ``scan``) on the same callbacks and probes (``_host``). The host
forward calls the Function's own ``apply`` with PyTorch's autograd on, on tensors that require
grad where JAX differentiates the argument, and keeps that call's graph on ``ctx`` as a Python
object (kept per call, ``_host_values.KEPT``); the host backward runs ``torch.autograd.grad`` on
it, so the Function's own backward runs with its own ``ctx`` (``needs_input_grad``,
``saved_tensors``, ``mark_dirty``, ``set_materialize_grads``: PyTorch's semantics, not a copy of
them). A ``jvp`` static method serves ``jax.jvp`` through PyTorch's forward-mode AD; a ``vmap``
static method (or ``generate_vmap_rule``) serves ``jax.vmap`` through ``torch.func.vmap``, one
callback for the whole batch.

PyTorch is imported here only, when ``from_torch`` is first called. Arrays cross by DLPack
(``torch.from_dlpack``, ``np.from_dlpack``): outputs without a copy; each input is copied once
(a differentiated one when the Function gets its clone), since a Function may write its input in
place (``mark_dirty``) and JAX's buffers must not change.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from ._errors import AutogradFunctionTypeError, error, type_name
from ._function import AutogradFunction
from ._outputs import grad_output_leaves
from ._split import split

_NEEDS_TORCH = (
    "jaxfn.from_torch runs a PyTorch Function, so it needs PyTorch, but importing torch failed ({err}); install "
    "it (pip install 'jaxfn[torch]', or pip install torch==2.13.0 for the CPU build)"
)


def torch_module(name: str) -> Any:
    """``torch``, imported on first use; an error naming ``name`` where it is not installed."""
    try:
        return importlib.import_module("torch")
    except ImportError as err:
        raise error(AutogradFunctionTypeError, name, _NEEDS_TORCH.format(err=err)) from err


@contextlib.contextmanager
def forward_ad(torch: Any) -> Iterator[Any]:
    """PyTorch's forward-mode AD, at one dual level; its first use loads decompositions through the
    deprecated ``torch.jit.script``, whose DeprecationWarning is PyTorch's business, not the user's."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`torch.jit.script` is deprecated", DeprecationWarning)
        with torch.autograd.forward_ad.dual_level():
            yield torch.autograd.forward_ad


def is_torch_function(value: Any) -> bool:
    """Whether ``value`` is a ``torch.autograd.Function`` subclass (False where torch is not imported)."""
    torch = _imported_torch()
    return torch is not None and isinstance(value, type) and issubclass(value, torch.autograd.Function)


def _imported_torch() -> Any:
    return sys.modules.get("torch")


def from_torch(function: Any, *, name: str | None = None) -> AutogradFunction:
    """Run an existing PyTorch `torch.autograd.Function` inside JAX programs, with its own backward.

    The Function runs as host code (`host=True`): under `jax.jit`, `jax.grad`, `jax.vmap` and
    `lax.scan`, JAX calls it through `jax.pure_callback`, and `jax.grad` runs its own `backward`
    through PyTorch's autograd (so `ctx.needs_input_grad`, `ctx.saved_tensors`, nested Functions
    and `mark_dirty` behave as in PyTorch). Both forms work: `forward(ctx, ...)`, and
    `forward(...)` with `setup_context(ctx, inputs, output)`. A `jvp` static method serves
    `jax.jvp` (through PyTorch's forward-mode AD), and a `vmap` static method (or
    `generate_vmap_rule = True`) serves `jax.vmap` (through `torch.func.vmap`); without one,
    `jax.vmap` calls the Function once per batch element. Arrays become CPU tensors (by DLPack)
    and back; other arguments pass as they are. Use it to run the original in the JAX program
    before its port is written, and to check the port with [`compare`][jaxfn.compare].

    Args:
      function: a subclass of `torch.autograd.Function`.
      name: what error messages call it; default the class's name.

    Returns:
      An [`AutogradFunction`][jaxfn.AutogradFunction] called as the Function's `apply` is.

    Raises:
      AutogradFunctionError: if PyTorch is not installed, or `function` is not a
        `torch.autograd.Function` subclass.
    """
    default = getattr(function, "__name__", None) or getattr(type(function), "__name__", "function")
    name = str(name if name is not None else default)
    torch = torch_module(name)
    if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
        if isinstance(function, torch.autograd.Function):
            got = f"an instance of {type(function).__name__}"
        elif isinstance(function, type):
            got = f"the class {function.__module__}.{function.__qualname__}, which is not one"
            if issubclass(function, torch.nn.Module):
                got += " (an nn.Module: wrap its computation in a Function, or port it)"
        else:
            got = type_name(function)
        raise error(
            AutogradFunctionTypeError,
            name,
            f"jaxfn.from_torch takes a torch.autograd.Function subclass (the class itself, not its apply or an "
            f"instance), but it got {got}; pass the class, as jaxfn.from_torch(MyFunction)",
        )
    base = torch.autograd.Function
    original = _Original(torch, function, name)
    forward = _with_signature(original.forward, _parameters(function, base))
    jvp = original.jvp if function.jvp is not base.jvp else None
    batches = function.vmap is not base.vmap or bool(getattr(function, "generate_vmap_rule", False))
    batches = batches and function.setup_context is not base.setup_context  # torch.func needs it
    made = AutogradFunction(forward, original.backward, name=name, host=True, jvp=jvp, vmap=None)
    if batches:
        made = AutogradFunction(
            forward, original.backward, name=name, host=True, jvp=jvp, vmap=_Batched(made, original)
        )
    made.torch_function = function  # type: ignore[attr-defined]  # what jaxfn.compare runs as the original
    return made


def _parameters(function: Any, base: Any) -> list[inspect.Parameter]:
    """The Function's forward parameters, without ctx (the ctx-first form's first)."""
    parameters = list(inspect.signature(function.forward).parameters.values())
    if function.setup_context is base.setup_context:
        parameters = parameters[1:]
    return parameters


def _with_signature(run: Any, parameters: list[inspect.Parameter]) -> Any:
    """``run(ctx, *args, **kwargs)`` with the signature ``(ctx, <the Function's parameters>)``."""

    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        return run(ctx, *args, **kwargs)

    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY)
    forward.__signature__ = inspect.Signature([ctx, *parameters])  # type: ignore[attr-defined]
    return forward


class _Call:
    """One call's PyTorch graph, kept on the host forward's ctx until its backward runs."""

    __slots__ = ("inputs", "outputs", "args", "kwargs", "out", "sequence")

    def __init__(self, inputs: list[Any], out: Any, args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.inputs, self.args, self.kwargs = inputs, args, kwargs
        self.outputs, self.out = split(out, lambda leaf: True)  # out: the output's structure
        self.sequence = isinstance(out, (tuple, list))  # one grad_output per element


class _Original:
    """The PyTorch Function's calls, on NumPy arrays (the host side of ``from_torch``)."""

    def __init__(self, torch: Any, function: Any, name: str):
        self.torch, self.function, self.name = torch, function, name

    def tensor(self, value: Any, requires_grad: bool = False) -> Any:
        return _tensor(self.torch, value, requires_grad)

    def given(self, tensor: Any) -> Any:
        """What the Function gets for an input: a differentiated leaf's clone (it may write it in place)."""
        return tensor.clone() if getattr(tensor, "requires_grad", False) else tensor

    def array(self, value: Any) -> Any:
        return _array(self.torch, value)

    def forward(self, ctx: Any, *args: Any, **kwargs: Any) -> Any:
        torch = self.torch
        flags = list(ctx.needs_input_grad)
        tensors = [self.tensor(a, _differentiable(a) and f) for a, f in zip(args, flags)]
        named = {k: self.tensor(v, _differentiable(v) and ctx.needs_input_grad[k]) for k, v in kwargs.items()}
        grad = any(getattr(t, "requires_grad", False) for t in (*tensors, *named.values()))
        with torch.enable_grad() if grad else torch.no_grad():
            out = self.function.apply(*map(self.given, tensors), **{k: self.given(v) for k, v in named.items()})
        leaves, treedef = jax.tree_util.tree_flatten(out)
        arrays = [self.array(leaf) for leaf in leaves]
        ctx.torch_call = _Call([*tensors, *named.values()], out, args, kwargs)
        if grad:
            cut = [a for a, t in zip(arrays, leaves) if isinstance(t, torch.Tensor) and not t.requires_grad]
            ctx.mark_non_differentiable(*cut)
        ctx.set_materialize_grads(False)  # PyTorch's engine materializes, as the Function asks it to
        return jax.tree_util.tree_unflatten(treedef, arrays)

    def backward(self, ctx: Any, *grad_outputs: Any) -> Any:
        torch = self.torch
        call: _Call = ctx.torch_call
        flat = grad_output_leaves(self.name, call.out, call.sequence, grad_outputs)  # through the output's structure
        for index, (o, g) in enumerate(zip(call.outputs, flat)):  # a gradient PyTorch can't carry: refused
            if g is not None:
                self.refuse_numpy_output(
                    index, o, "a gradient reaches", "autograd can't differentiate it and the gradient would be lost"
                )
        # PyTorch's complex gradients are the conjugates of JAX's (its backward takes and gives
        # conj(cotangent)): conjugated in and out, so the pullback is JAX's
        pairs = [
            (o, self.tensor(np.conj(g) if np.iscomplexobj(g) else np.asarray(g)))
            for o, g in zip(call.outputs, flat)
            if g is not None and isinstance(o, torch.Tensor) and o.requires_grad
        ]
        wanted = [t for t in call.inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        grads: list[Any] = [None] * len(wanted)
        if pairs and wanted:
            outs, given = zip(*pairs)
            # retain_graph: JAX may run this backward again on the same call (jax.jacrev, a pullback
            # called twice); the graph goes with the call's kept outputs
            grads = list(torch.autograd.grad(outs, wanted, given, allow_unused=True, retain_graph=True))
        by_input = iter(grads)
        returned = [
            _conj(self.array(next(by_input))) if isinstance(t, torch.Tensor) and t.requires_grad else None
            for t in call.inputs
        ]
        return tuple(returned)

    def refuse_numpy_output(self, index: int, output: Any, what: str, why: str) -> None:
        """A float NumPy array the Function returned, where a derivative reaches it: PyTorch gives it
        none, so it would be lost (zero); refused, naming the output."""
        if isinstance(output, np.ndarray) and np.issubdtype(output.dtype, np.inexact):
            raise error(
                AutogradFunctionTypeError,
                self.name,
                f"{what} output {index}, which its PyTorch forward returned as a NumPy array (dtype {output.dtype}), "
                f"not a torch.Tensor, so PyTorch's {why}; return a tensor (torch.from_numpy(...)), or don't "
                "differentiate through it",
            )

    def jvp(self, ctx: Any, *tangents: Any) -> Any:
        torch = self.torch
        call: _Call = ctx.torch_call
        args, kwargs = call.args, call.kwargs
        with forward_ad(torch) as dual:
            duals = [
                dual.make_dual(self.tensor(a), self.tensor(np.asarray(t)))
                if _differentiable(a) and t is not None
                else self.tensor(a)
                for a, t in zip(args, tangents)
            ]
            out = self.function.apply(*duals, **{k: self.tensor(v) for k, v in kwargs.items()})
            leaves, treedef = jax.tree_util.tree_flatten(out)
            for index, leaf in enumerate(leaves):  # a tangent PyTorch can't carry: refused, not taken as zero
                self.refuse_numpy_output(index, leaf, "forward mode reaches", "forward-mode AD gives it no tangent")
            tangents_out = [
                self.array(dual.unpack_dual(leaf).tangent) if isinstance(leaf, torch.Tensor) else None
                for leaf in leaves
            ]
        return jax.tree_util.tree_unflatten(treedef, tangents_out)

    def batched(self, in_dims: tuple[Any, ...], *args: Any) -> list[Any]:
        """The Function under ``torch.func.vmap`` (its vmap rule): its tensor outputs batched at axis
        0; its other output leaves (a Python number, unbatched: ``torch.func.vmap`` takes tensors
        only) as the Function returned them, and ``None`` outputs dropped, as everywhere."""
        tensors = [self.tensor(a) for a in args]
        returned: list[Any] = []

        def tensor_leaves(*given: Any) -> tuple[Any, ...]:
            returned[:] = jax.tree_util.tree_leaves(self.function.apply(*given))
            return tuple(leaf for leaf in returned if isinstance(leaf, self.torch.Tensor))

        with self.torch.no_grad():
            batched = iter(self.torch.func.vmap(tensor_leaves, in_dims=in_dims, out_dims=0)(*tensors))
        return [self.array(next(batched)) if isinstance(leaf, self.torch.Tensor) else leaf for leaf in returned]


# ml_dtypes' types NumPy's DLPack can't carry, by torch's name for them: the integer type of their bits
_BITS = {"bfloat16": np.int16, "float8_e4m3fn": np.int8, "float8_e5m2": np.int8}


def _conj(value: Any) -> Any:
    return np.conj(value) if isinstance(value, np.ndarray) and np.iscomplexobj(value) else value


def _differentiable(value: Any) -> bool:
    return isinstance(value, np.ndarray) and jax.numpy.issubdtype(value.dtype, jax.numpy.inexact)  # bfloat16 too


class _Batched:
    """The jaxfn ``vmap`` rule of a Function with its own: one callback over the whole batch."""

    def __init__(self, unbatched: AutogradFunction, original: _Original):
        self.unbatched, self.original = unbatched, original

    def __call__(self, info: Any, in_dims: tuple[Any, ...], *args: Any) -> Any:
        examples = [_unbatched_spec(a, d) for a, d in zip(args, in_dims)]
        description = self.unbatched.outputs(*examples)
        specs = [jax.ShapeDtypeStruct((info.batch_size, *s.shape), s.dtype) for s in description.avals]
        arrays = [a for a in args if isinstance(a, (jax.Array, np.ndarray))]
        dims = tuple(in_dims)

        def host(*values: Any) -> Any:
            it = iter(values)
            full = [np.asarray(next(it)) if isinstance(a, (jax.Array, np.ndarray)) else a for a in args]
            outs = self.original.batched(dims, *full)
            # an unbatched leaf (a Python number) is the same for every element of the batch
            return tuple(np.broadcast_to(np.asarray(o).astype(s.dtype), s.shape) for o, s in zip(outs, specs))

        outs = jax.pure_callback(host, tuple(specs), *arrays, vmap_method="sequential")
        return description.rebuild(list(outs)), 0


def _unbatched_spec(value: Any, dim: Any) -> Any:
    if not isinstance(value, (jax.Array, np.ndarray)) or dim is None:
        return value
    shape = tuple(np.shape(value))
    return np.zeros(shape[:dim] + shape[dim + 1 :], value.dtype)  # what the probe reads: shape and dtype


def tensor_of(torch: Any, value: Any, requires_grad: bool = False) -> Any:
    """A NumPy or JAX array as a new CPU tensor, by ``from_torch``'s one conversion (bfloat16 and
    float8 by their bits); other values as they are. ``jaxfn.compare`` crosses its arrays here."""
    if isinstance(value, (jax.Array, np.ndarray)):
        value = np.array(value)  # a copy: the original may write its input in place
    return _tensor(torch, value, requires_grad)


def array_of(torch: Any, value: Any) -> Any:
    """A tensor as a NumPy array, by ``from_torch``'s one conversion (bfloat16 and float8 by their
    bits); other values as they are."""
    return _array(torch, value)


def _tensor(torch: Any, value: Any, requires_grad: bool) -> Any:
    """A tensor of ``value`` (other values as they are). A differentiated one is a leaf on JAX's
    buffer, without a copy (autograd refuses writes into a leaf; the Function gets a clone);
    any other is a copy, since a Function may write its input in place (``mark_dirty``) and
    JAX's buffers, even those NumPy calls writable, must not change."""
    if not isinstance(value, np.ndarray):
        return value
    array = value if requires_grad else np.array(value)
    bits = _BITS.get(array.dtype.name)
    if bits is not None:  # bfloat16, float8: ml_dtypes' NumPy types, which NumPy's DLPack can't carry
        tensor = torch.from_numpy(np.array(array).view(bits)).view(getattr(torch, array.dtype.name))
    elif array.dtype != np.bool_ and array.size:
        tensor = torch.from_dlpack(array)
    else:
        tensor = torch.from_numpy(np.array(array))
    return tensor.requires_grad_() if requires_grad else tensor


def _array(torch: Any, value: Any) -> Any:
    """A tensor as NumPy's array (ml_dtypes' types by their bits); other values as they are."""
    if not isinstance(value, torch.Tensor):
        return value
    tensor = value.detach().resolve_conj().resolve_neg()
    name = str(tensor.dtype).removeprefix("torch.")
    if name in _BITS:  # back as ml_dtypes' NumPy type, by its bits
        bits = {np.int16: torch.int16, np.int8: torch.int8}[_BITS[name]]
        return tensor.cpu().contiguous().view(bits).numpy().view(jax.numpy.dtype(name))
    try:
        return np.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError):  # bool, or a layout DLPack can't carry
        return tensor.numpy()
