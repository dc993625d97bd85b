"""``host=True``: forward and backward written in NumPy/SciPy, run through ``jax.pure_callback``.

The user's forward and backward take and return NumPy arrays. jaxfn wraps them in a JAX-side
forward and backward (then built like any other jaxfn function):

* the JAX-side forward calls the host forward through ``jax.pure_callback``, which returns the
  output *and* every numeric value the host forward saved on ``ctx`` (carried to backward as
  residuals, as arrays);
* the JAX-side backward calls the host backward through ``jax.pure_callback`` with those values
  and the grad_outputs, and gets one input-shaped gradient per differentiable array argument;
* ``pure_callback`` needs the shapes and dtypes of what comes back before anything runs: jaxfn
  derives them once per input signature by running the host forward on arrays of ones
  (``probe``), or takes the output's from ``output=`` when the user declares it;
* under ``vmap`` the host functions are called once per batch element (``vmap_method=
  "sequential"``), so any NumPy code works batched;
* neither host function can be differentiated by JAX: the first derivative goes through the
  custom backward, and a second one is refused in jaxfn's words.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import struct
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _arguments, _gradients, _purity, _rule
from ._arguments import DIFF, STATIC, Arguments
from ._context import Context
from ._errors import AutogradFunctionError, AutogradFunctionTypeError, error, type_name

_NUMBERS = (int, float, complex, bool, np.generic)


@dataclasses.dataclass(frozen=True, eq=False)
class _Probe:
    """What the host forward returns and saves, learnt once per input signature."""

    out_treedef: Any
    out_specs: tuple[jax.ShapeDtypeStruct, ...]
    saved_treedef: Any  # of (positional, named values, attribute values)
    saved_names: tuple[tuple[str, ...], tuple[str, ...]]
    saved_specs: tuple[jax.ShapeDtypeStruct | None, ...]  # None: a static leaf, kept from the probe
    saved_statics: tuple[Any, ...]  # a static leaf's value; a packed Python number's type
    saved_scalars: tuple[bool, ...]  # a Python number: handed back to backward as one
    materialize: bool
    non_differentiable: tuple[int, ...]  # output leaf positions marked by the host forward


def wrap(
    name: str, forward: Callable[..., Any], backward: Callable[..., Any], output: Any
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The JAX-side forward and backward for a host (NumPy) forward and backward."""
    _rule.check_definition(name, "forward", forward)
    _rule.check_definition(name, "backward", backward)
    signature = inspect.signature(forward)
    probes: dict[Any, _Probe] = {}
    varargs = _arguments.varargs_name(signature)

    def jax_forward(ctx: Context, *call_args: Any, **call_kwargs: Any) -> Any:
        bound = _arguments.bind(name, signature, call_args, call_kwargs)
        args = _arguments.split(bound, varargs)
        flags = [ctx.needs_input_grad[n] for n in args.names]
        probe = _probe_for(name, forward, signature, args, flags, output, probes)
        host = functools.partial(_host_forward, name, forward, signature, args, flags, probe)
        specs = (*probe.out_specs, *[s for s in probe.saved_specs if s is not None])
        results = _callback(name, host, specs, *args.arrays)
        outs, saved = results[: len(probe.out_specs)], results[len(probe.out_specs) :]
        ctx.save_for_backward(*saved)
        ctx.probe, ctx.args = probe, args.structure()
        ctx.input_specs = tuple(jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in args.arrays)
        out = jax.tree_util.tree_unflatten(probe.out_treedef, list(outs))
        marked = [leaf for i, leaf in enumerate(jax.tree_util.tree_leaves(out)) if i in probe.non_differentiable]
        ctx.mark_non_differentiable(*marked)
        return out

    def jax_backward(ctx: Context, *grad_outputs: Any) -> Any:
        probe, args = ctx.probe, ctx.args
        saved, inputs = ctx.saved_tensors, ctx.input_specs
        wanted = [i for i, p in enumerate(args.array_positions) if args.kinds[p] == DIFF]
        specs = tuple(inputs[i] for i in wanted)
        leaves, treedef = jax.tree_util.tree_flatten(grad_outputs, is_leaf=lambda v: v is None)
        present = [leaf for leaf in leaves if leaf is not None]
        host = functools.partial(_host_backward, name, backward, args, probe, treedef, leaves, wanted, specs)
        grads = _callback(name, host, specs, *saved, *present)
        per_array: list[Any] = [None] * len(inputs)
        for i, g in zip(wanted, grads):
            per_array[i] = g
        return _by_parameter(args, per_array)

    jax_forward.__signature__ = signature  # type: ignore[attr-defined]
    jax_forward.__name__ = getattr(forward, "__name__", "forward")
    return jax_forward, jax_backward


_ONCE = (
    "it runs NumPy code on the host (host=True), which JAX can differentiate only through the custom "
    "backward, once; a second derivative (jax.grad of jax.grad, jax.hessian) or forward mode can't go "
    "through it; write forward and backward in JAX operations for higher derivatives"
)


def _callback(name: str, host: Callable[..., Any], specs: Any, *arrays: Any) -> Any:
    """``jax.pure_callback`` (called once per batch element under ``vmap``), whose derivative is
    refused in jaxfn's words rather than JAX's."""

    @jax.custom_jvp
    def call(*arrays: Any) -> Any:
        return jax.pure_callback(host, specs, *arrays, vmap_method="sequential")

    def refuse(primals: Any, tangents: Any) -> Any:
        raise error(AutogradFunctionTypeError, name, _ONCE)

    call.defjvp(refuse)
    return call(*arrays)


def _probe_for(name, forward, signature, args, flags, output, probes) -> _Probe:
    """The shapes of what the host forward returns and saves, learnt once per signature."""
    shapes = tuple((tuple(np.shape(a)), str(a.dtype)) for a in args.arrays)
    key = (args.treedef, args.kinds, shapes, tuple(flags), _purity.x64())
    try:
        hash((key, args.statics))
        key = (key, args.statics)
    except TypeError:
        key = None
    if key is not None and key in probes:
        return probes[key]
    ctx, out = _probe_run(name, forward, signature, args, flags)
    probe = _describe(name, ctx, out, output)
    if key is not None:
        probes[key] = probe
    return probe


def _probe_run(name, forward, signature, args, flags) -> tuple[Context, Any]:
    """Run the host forward on arrays of ones, or (if it fails there, a singular matrix say) on
    seeded standard-normal arrays; raise naming both failures otherwise."""
    rng = np.random.default_rng(0)
    candidates = [
        [np.ones(np.shape(a), _numpy_dtype(a.dtype)) for a in args.arrays],
        [rng.standard_normal(np.shape(a)).astype(_numpy_dtype(a.dtype)) for a in args.arrays],
    ]
    failures = []
    for arrays in candidates:
        try:
            return _run_host_forward(name, forward, signature, args, flags, arrays)
        except AutogradFunctionError:
            raise
        except Exception as err:  # noqa: BLE001 - reported below with what the probe is for
            failures.append(f"{type(err).__name__}: {err}")
    raise error(
        AutogradFunctionTypeError,
        name,
        "a host forward (host=True) is run once per input signature on example arrays (ones, then seeded "
        "standard-normal values) to learn the shapes of what it returns and saves, but it failed on both "
        f"({'; '.join(failures)}); make forward accept such inputs (it may branch on them)",
    )


def _numpy_dtype(dtype: Any) -> Any:
    return np.dtype(dtype) if not jnp.issubdtype(dtype, jax.dtypes.extended) else np.uint32


def _run_host_forward(name, forward, signature, args, flags, arrays) -> tuple[Context, Any]:
    ctx = Context(name, dict(zip(args.names, flags)))
    values = args.values([np.asarray(a) for a in arrays])
    with np.errstate(all="ignore"):
        out = _arguments.call_forward(forward, signature, ctx, args.names, values)
    ctx._end_forward()
    return ctx, out


def _describe(name: str, ctx: Context, out: Any, output: Any) -> _Probe:
    out_leaves, out_treedef = jax.tree_util.tree_flatten(out)
    for leaf in out_leaves:
        if not isinstance(leaf, (np.ndarray, *_NUMBERS)):
            raise error(
                AutogradFunctionTypeError,
                name,
                f"a host forward (host=True) must return NumPy arrays or numbers, but it returned {type_name(leaf)}",
            )
    specs = tuple(_spec(leaf) for leaf in out_leaves)
    if output is not None:
        declared, declared_treedef = jax.tree_util.tree_flatten(output)
        if declared_treedef != out_treedef or any(
            tuple(d.shape) != s.shape or np.dtype(d.dtype) != s.dtype for d, s in zip(declared, specs)
        ):
            raise error(
                AutogradFunctionTypeError,
                name,
                f"output= declares {[(tuple(d.shape), str(d.dtype)) for d in declared]}, but the host forward "
                f"returned {[(s.shape, str(s.dtype)) for s in specs]}; declare what forward returns",
            )
    marked = {id(x) for x in ctx._state.non_differentiable}
    state = ctx._state
    held = (state.positional, tuple(state.named.values()), tuple(ctx._attrs.values()))
    saved_leaves, saved_treedef = jax.tree_util.tree_flatten(held)
    numeric = [isinstance(v, (np.ndarray, *_NUMBERS)) and not isinstance(v, str) for v in saved_leaves]
    scalars = [type(v) in _PACKED for v in saved_leaves]
    return _Probe(
        out_treedef,
        specs,
        saved_treedef,
        (tuple(state.named), tuple(ctx._attrs)),
        tuple(_packed_spec(v) if p else _spec(v) if n else None for v, n, p in zip(saved_leaves, numeric, scalars)),
        tuple(type(v) if p else None if n else v for v, n, p in zip(saved_leaves, numeric, scalars)),
        tuple(scalars),
        state.materialize,
        tuple(i for i, leaf in enumerate(out_leaves) if id(leaf) in marked),
    )


# Python numbers saved on ctx cross to backward as their exact bytes (no 32-bit rounding).
_PACKED = {bool: "<?", int: "<q", float: "<d", complex: "<dd"}


def _packed_spec(value: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((struct.calcsize(_PACKED[type(value)]),), np.uint8)


def _pack(name: str, value: Any) -> np.ndarray:
    fmt = _PACKED[type(value)]
    try:
        packed = struct.pack(fmt, *((value.real, value.imag) if type(value) is complex else (value,)))
    except struct.error:
        raise error(
            AutogradFunctionTypeError,
            name,
            f"a host forward (host=True) saved the Python number {value!r} on ctx, which does not fit 64 bits; "
            "save it as a NumPy array or a string",
        ) from None
    return np.frombuffer(packed, np.uint8).copy()


def _unpack(kind: type, raw: np.ndarray) -> Any:
    values = struct.unpack(_PACKED[kind], np.asarray(raw, np.uint8).tobytes())
    return complex(*values) if kind is complex else values[0]


def _spec(value: Any) -> jax.ShapeDtypeStruct:
    array = np.asarray(value)
    return jax.ShapeDtypeStruct(array.shape, jax.dtypes.canonicalize_dtype(array.dtype))


def _host_forward(name, forward, signature, args, flags, probe, *arrays) -> tuple[Any, ...]:
    """Runs on the host: the user's forward on NumPy arrays; its output and saved values."""
    ctx, out = _run_host_forward(name, forward, signature, args, flags, arrays)
    out_leaves = jax.tree_util.tree_leaves(out)
    state = ctx._state
    held = (state.positional, tuple(state.named.values()), tuple(ctx._attrs.values()))
    saved_leaves = jax.tree_util.tree_leaves(held)
    if len(out_leaves) != len(probe.out_specs) or len(saved_leaves) != len(probe.saved_specs):
        raise error(
            AutogradFunctionTypeError,
            name,
            "a host forward (host=True) must return and save the same structure on every call, but this call "
            "differs from the first one of this signature; return and save values of fixed shapes",
        )
    results = [_conform(name, "output", leaf, spec) for leaf, spec in zip(out_leaves, probe.out_specs)]
    for value, spec, static, packed in zip(saved_leaves, probe.saved_specs, probe.saved_statics, probe.saved_scalars):
        if packed and type(value) in _PACKED:
            results.append(_pack(name, value))
        elif spec is not None:
            results.append(_conform(name, "saved value", value, spec))
        elif (type(value), repr(value)) != (type(static), repr(static)):
            raise error(
                AutogradFunctionTypeError,
                name,
                f"a host forward (host=True) saved {value!r} on ctx where the first call of this signature saved "
                f"{static!r}; values that are not numbers or arrays can't change from call to call (they are kept "
                "from that first call), so save a number or an array instead",
            )
    return tuple(results)


def _conform(name: str, what: str, value: Any, spec: jax.ShapeDtypeStruct) -> np.ndarray:
    array = np.asarray(value)
    if array.shape != tuple(spec.shape):
        raise error(
            AutogradFunctionTypeError,
            name,
            f"a host forward (host=True) must give each {what} the same shape on every call, but one has shape "
            f"{array.shape} where the first call of this signature gave {tuple(spec.shape)}",
        )
    return array.astype(spec.dtype)


def _host_backward(name, backward, args, probe, treedef, leaves, wanted, specs, *values) -> tuple[Any, ...]:
    """Runs on the host: the user's backward on NumPy arrays; one input-shaped gradient per wanted array."""
    values = tuple(np.asarray(v) for v in values)  # callbacks may hand over JAX arrays
    n_saved = sum(s is not None for s in probe.saved_specs)
    saved, grads_in = list(values[:n_saved]), iter(values[n_saved:])
    saved_iter = iter(saved)
    saved_leaves = [
        (_unpack(static, next(saved_iter)) if scalar else next(saved_iter)) if spec is not None else static
        for spec, static, scalar in zip(probe.saved_specs, probe.saved_statics, probe.saved_scalars)
    ]
    positional, named, attrs = jax.tree_util.tree_unflatten(probe.saved_treedef, saved_leaves)
    ctx = Context(name, dict.fromkeys(args.names, True))
    ctx._state.positional, ctx._state.named = positional, dict(zip(probe.saved_names[0], named))
    ctx._state.materialize = probe.materialize
    for key, value in zip(probe.saved_names[1], attrs):
        ctx._attrs[key] = value
    ctx._end_forward()
    grad_outputs = jax.tree_util.tree_unflatten(treedef, [None if v is None else next(grads_in) for v in leaves])
    returned = backward(ctx, *grad_outputs)
    by_name = _gradients.by_parameter(name, args, returned)
    per_leaf = _per_leaf(args, by_name)
    results = []
    for i, spec in zip(wanted, specs):
        grad = per_leaf[args.array_positions[i]]
        results.append(np.zeros(spec.shape, spec.dtype) if grad is None else _sum_to(name, args, i, grad, spec))
    return tuple(results)


def _per_leaf(args: Arguments, by_name: dict[str, Any]) -> list[Any]:
    """The gradient pytrees by parameter, as one entry per leaf of the arguments."""
    per_leaf: list[Any] = []
    for position, child in enumerate(args.treedef.children()):
        grad = by_name.get(args.names[position])
        if grad is None:
            per_leaf.extend([None] * child.num_leaves)
        elif child.num_leaves == 1 and child.num_nodes == 1:
            per_leaf.append(grad)
        else:
            per_leaf.extend(child.flatten_up_to(grad))
    return per_leaf


def _sum_to(name: str, args: Arguments, i: int, grad: Any, spec: jax.ShapeDtypeStruct) -> np.ndarray:
    grad = np.asarray(grad)
    shape = tuple(spec.shape)
    if grad.shape != shape:
        if not _gradients.broadcasts_to(shape, grad.shape):
            where = args.paths[args.array_positions[i]]
            raise error(
                AutogradFunctionTypeError,
                name,
                f"the host backward returned a gradient for '{where}' with shape {grad.shape}, but '{where}' has "
                f"shape {shape}",
            )
        grad = _gradients.sum_to_shape(grad, shape)  # summed as for any backward: one rule, NumPy or JAX
    return grad.astype(spec.dtype)


def _by_parameter(args: Arguments, per_array: list[Any]) -> dict[str, Any]:
    """Per-array gradients as jaxfn's dict form, keyed by parameter name."""
    leaves: list[Any] = [None] * len(args.kinds)
    for position, grad in zip(args.array_positions, per_array):
        leaves[position] = grad
    values = jax.tree_util.tree_unflatten(
        args.treedef, [None if k == STATIC else v for k, v in zip(args.kinds, leaves)]
    )
    return dict(zip(args.names, values))
