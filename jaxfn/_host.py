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
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _arguments, _gradients, _host_values, _jax_private, _rule
from ._arguments import DIFF, STATIC, Arguments
from ._context import Context
from ._errors import AutogradFunctionError, AutogradFunctionTypeError, error, reraise_from_callback, type_name

_NUMBERS = (int, float, complex, bool, np.generic)


@dataclasses.dataclass(frozen=True, eq=False)
class _Probe:
    """What the host forward returns and saves, learnt once per input signature."""

    out_treedef: Any
    out_specs: tuple[jax.ShapeDtypeStruct, ...]
    saved_treedef: Any  # of (positional, named values, attribute values)
    saved_names: tuple[tuple[str, ...], tuple[str, ...]]
    saved_carries: tuple[Any, ...]  # how each saved leaf crosses to backward: see _host_values.carry
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
        flags = tuple(ctx.needs_input_grad[n] for n in args.names)
        probe = _probe_for(name, forward, signature, args, flags, output, probes)
        host = functools.partial(_host_forward, name, forward, signature, args, flags, probe)
        specs = (*probe.out_specs, *[s for s in map(_host_values.carried_spec, probe.saved_carries) if s is not None])
        results = _callback(name, host, specs, *args.arrays)
        outs, saved = results[: len(probe.out_specs)], results[len(probe.out_specs) :]
        ctx.save_for_backward(*saved)
        ctx.probe, ctx.args, ctx.flags = probe, args.structure(), flags
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
        host = functools.partial(
            _host_backward, name, backward, args, ctx.flags, probe, treedef, leaves, inputs, wanted
        )
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
    try:
        return call(*arrays)
    except jax.errors.JaxRuntimeError as err:  # run at once (no jit), a backward under jax.grad too
        reraise_from_callback(err)
        raise


def _probe_for(name, forward, signature, args, flags, output, probes) -> _Probe:
    """The shapes of what the host forward returns and saves, learnt once per signature."""
    shapes = tuple((tuple(np.shape(a)), str(a.dtype)) for a in args.arrays)
    key = (args.treedef, args.kinds, shapes, tuple(flags), _jax_private.x64())
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
    specs = tuple(_host_values.spec(leaf) for leaf in out_leaves)
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
    return _Probe(
        out_treedef,
        specs,
        saved_treedef,
        (tuple(state.named), tuple(ctx._attrs)),
        tuple(_host_values.carry(name, leaf) for leaf in saved_leaves),
        state.materialize,
        tuple(i for i, leaf in enumerate(out_leaves) if id(leaf) in marked),
    )


def _host_forward(name, forward, signature, args, flags, probe, *arrays) -> tuple[Any, ...]:
    """Runs on the host: the user's forward on NumPy arrays; its output and saved values."""
    ctx, out = _run_host_forward(name, forward, signature, args, flags, arrays)
    out_leaves = jax.tree_util.tree_leaves(out)
    state = ctx._state
    held = (state.positional, tuple(state.named.values()), tuple(ctx._attrs.values()))
    saved_leaves = jax.tree_util.tree_leaves(held)
    if len(out_leaves) != len(probe.out_specs) or len(saved_leaves) != len(probe.saved_carries):
        raise error(
            AutogradFunctionTypeError,
            name,
            "a host forward (host=True) must return and save the same structure on every call, but this call "
            "differs from the first one of this signature; return and save values of fixed shapes",
        )
    results = [_host_values.conform(name, "output", leaf, spec) for leaf, spec in zip(out_leaves, probe.out_specs)]
    for value, carry in zip(saved_leaves, probe.saved_carries):
        results.extend(_host_values.send(name, value, carry))
    return tuple(results)


def _host_backward(name, backward, args, flags, probe, treedef, leaves, inputs, wanted, *values) -> tuple[Any, ...]:
    """Runs on the host: the user's backward on NumPy arrays; one input-shaped gradient per wanted array,
    checked as any backward's gradients are (``_gradients``), in NumPy."""
    values = tuple(np.asarray(v) for v in values)  # callbacks may hand over JAX arrays
    n_saved = sum(_host_values.carried_spec(c) is not None for c in probe.saved_carries)
    saved, grads_in = iter(values[:n_saved]), iter(values[n_saved:])
    saved_leaves = [_host_values.receive(carry, saved) for carry in probe.saved_carries]
    positional, named, attrs = jax.tree_util.tree_unflatten(probe.saved_treedef, saved_leaves)
    ctx = Context(name, dict(zip(args.names, flags)))
    ctx._state.positional, ctx._state.named = positional, dict(zip(probe.saved_names[0], named))
    ctx._state.materialize = probe.materialize
    for key, value in zip(probe.saved_names[1], attrs):
        ctx._attrs[key] = value
    ctx._end_forward()
    grad_outputs = jax.tree_util.tree_unflatten(treedef, [None if v is None else next(grads_in) for v in leaves])
    returned = backward(ctx, *grad_outputs)
    by_name = _gradients.by_parameter(name, args, returned)
    every = [args.kinds[p] == DIFF for p in args.array_positions]
    cotangents = _gradients.to_cotangents(name, args, by_name, list(inputs), every, asarray=np.asarray)
    return tuple(
        np.zeros(inputs[i].shape, inputs[i].dtype) if cotangents[i] is None else np.asarray(cotangents[i])
        for i in wanted
    )


def _by_parameter(args: Arguments, per_array: list[Any]) -> dict[str, Any]:
    """Per-array gradients as jaxfn's dict form, keyed by parameter name."""
    leaves: list[Any] = [None] * len(args.kinds)
    for position, grad in zip(args.array_positions, per_array):
        leaves[position] = grad
    values = jax.tree_util.tree_unflatten(
        args.treedef, [None if k == STATIC else v for k, v in zip(args.kinds, leaves)]
    )
    return dict(zip(args.names, values))
