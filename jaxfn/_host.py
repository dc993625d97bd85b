"""``host=True``: a forward and backward written in NumPy/SciPy, as a rule every builder takes.

``HostFunction.rule`` is the user's rule transformed: its forward, backward and jvp are callbacks
into the host code, and it goes to the same builders as any rule (``_reverse_mode``,
``_forward_mode`` for a jvp rule, ``_primitive`` for a vmap rule), which give it reverse mode
through backward, named saves, anomaly checks and the output's description. What is particular
to host code:

* the user's forward and backward run on the host, through ``jax.pure_callback`` (``_host_call``:
  once per batch element under ``vmap``, exceptions raised again as themselves when JAX runs
  them at once), each with the user's own ``ctx`` made there; a second derivative is refused in
  jaxfn's words;
* ``pure_callback`` must know the shapes and dtypes of what comes back before anything runs:
  forward is probed once per signature on arrays of ones, or (if it fails there, a singular
  matrix say) on seeded standard-normal arrays, and the output is checked against ``output=``
  when the user declares it;
* what the host forward saves crosses exactly (``_host_values``: a float64 saved with x64 off is
  not narrowed), as the saved arrays of the traced rule's own context;
* an eager call (outside any trace) runs forward directly on NumPy arrays, with no callback.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _anomaly, _context, _forward_mode, _host_values, _jax_private, _keys, _outputs, _rule, _split
from ._arguments import DIFF, STATIC, Arguments, dtype_kind
from ._context import Context, Remainder
from ._errors import AutogradFunctionError, AutogradFunctionTypeError, error, type_name
from ._host_call import HostCall, bind
from ._outputs import Outputs

_NUMBERS = (int, float, complex, bool, np.generic)


@dataclasses.dataclass(frozen=True, eq=False)
class _Probe:
    """What the host forward returns and saves for one signature, learnt once. The traced forward
    keeps it on its context (a static value, kept per trace) for its backward and jvp."""

    args: Arguments  # the call's structure (no arrays)
    avals: tuple[jax.ShapeDtypeStruct, ...]  # its arrays' shapes and dtypes, as JAX holds them
    flags: tuple[bool, ...]  # needs_input_grad, one per array
    info: Outputs  # every output leaf is an array
    remainder: Remainder  # the static part of forward's ctx
    carries: tuple[Any, ...]  # how each saved leaf crosses to backward (_host_values.carry)
    calls: threading.local = dataclasses.field(default_factory=threading.local)  # this probe's HostCalls, per thread

    @functools.cached_property
    def carried(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        """What forward's callback sends to backward's: the saved values as they cross, or, where
        none carries data (``None``, an empty list; or only zero-size arrays, which XLA may drop),
        a receipt (a scalar) after them, so that backward's callback always depends on forward's:
        under ``jit(grad)`` JAX would otherwise drop a forward whose outputs are unused, and
        backward would read the probe's saves (and miss its errors)."""
        specs = tuple(map(_host_values.carried_spec, self.carries))
        return specs if any(math.prod(s.shape) for s in specs) else (*specs, jax.ShapeDtypeStruct((), np.uint8))


class HostFunction:
    """A host forward and backward (``definition``) and the output the user declared (or None).

    ``rule`` is what a builder takes for a traced call; ``eager(args)`` is the call outside any
    trace.
    """

    def __init__(self, definition: _rule.Definition, output: Any = None):
        self.definition = definition
        self.output = output
        for path, leaf in jax.tree_util.tree_flatten_with_path(output)[0]:
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                raise error(
                    AutogradFunctionTypeError,
                    definition.name,
                    f"output= declares what the host forward returns as a jax.ShapeDtypeStruct per output array (a "
                    f"pytree of them like forward's output), but output{jax.tree_util.keystr(path)} is "
                    f"{type_name(leaf)} ({leaf!r}); write, for instance, jax.ShapeDtypeStruct((3,), jnp.float32)",
                )
        self._probes: dict[Any, _Probe] = {}

    # -- the two calls -----------------------------------------------------------------------
    def eager(self, args: Arguments) -> Any:
        """Forward's output for one call outside any trace: forward runs directly on NumPy arrays
        (no probe: an output whose shape depends on the values is fine here, as in PyTorch), and
        whatever it raises propagates untouched."""
        # the arrays as host code sees them: NumPy arrays of the dtypes JAX holds them in
        dtypes = _numpy_dtypes(self.definition.name, args, args.arrays)
        arrays = [np.asarray(a).astype(d, copy=False) for a, d in zip(args.arrays, dtypes)]
        _, out, marked = _rule.forward_with_context(self.definition, args, arrays, (False,) * len(arrays))
        info = _outputs_of(self.definition.name, out, marked, self.output)
        outputs = _check_outputs(self.definition.name, info, out)
        if _anomaly.enabled():
            _anomaly.outputs(self.definition.name, info.rebuild(outputs))
        return info.rebuild([jnp.asarray(a) for a in outputs])

    def outputs(self, args: Arguments) -> Outputs:
        """The description of a call's output (what ``_rule.primal`` returns for other functions),
        from the probe: forward's NumPy code never sees a tracer. Every leaf is an array."""
        return self._probe(args, args.arrays, (False,) * len(args.arrays)).info

    @functools.cached_property
    def rule(self) -> _rule.Definition:
        """The host function as a rule that every builder takes, as it takes a user's: forward,
        backward and (if the user gave one) jvp are callbacks into the host code.

        forward runs the host forward (``_host_forward``) and keeps what it saved, carried as
        arrays (``_host_values``), on its own context, with the probe; backward hands them and
        the grad_outputs JAX gives to the host backward, and returns its gradients by parameter;
        jvp runs forward and the user's jvp on the host. The user's own ``ctx`` lives on the host."""
        definition = self.definition

        def forward(ctx: Context, *given: Any, **named: Any) -> Any:
            call = definition.bind(given, named)
            probe = self._probe(call.structure(), call.arrays, _context.perturbed(ctx))  # no tracers kept
            # when nothing is differentiated, nothing saved crosses
            specs = (*probe.info.avals, *probe.carried) if any(probe.flags) else probe.info.avals
            results = self._on_host(probe, specs, call.arrays, _host_forward)
            outs = results[: len(probe.info.avals)]
            # each saved value under the name the host forward gave it, as the traced rule names saves
            # (hsin.cosx, hsin.0), then the receipt, if any (_Probe.carried)
            ctx.save_for_backward(**dict(zip((*probe.remainder.save_names, "receipt"), results[len(outs) :])))
            ctx.jaxfn_host = probe
            if definition.jvp is not None:
                ctx.save_for_forward(*call.arrays)  # what jvp reads (never a residual of backward)
            ctx.mark_non_differentiable(*(o for o, d in zip(outs, probe.info.differentiable) if not d))
            ctx.set_materialize_grads(False)  # grad_outputs JAX does not give stay None: not sent
            return probe.info.rebuild(list(outs))

        def backward(ctx: Context, *grad_outputs: Any) -> Any:
            probe = ctx.jaxfn_host
            info = probe.info
            given = _outputs.grad_output_leaves(definition.name, info, info.is_sequence, grad_outputs)
            present = tuple(d and g is not None for d, g in zip(info.differentiable, given))
            sent = [*ctx.saved_tensors, *(g for g, p in zip(given, present) if p)]  # the saves, then grad_outputs
            specs = tuple(aval for aval, flag in zip(probe.avals, probe.flags) if flag)
            grads = iter(self._on_host(probe, specs, sent, _host_backward, present) if specs else ())
            per_array = [next(grads) if flag else None for flag in probe.flags]
            return dict(zip(probe.args.names, probe.args.parameters(per_array)))

        def jvp(ctx: Context, *tangents: Any) -> Any:
            probe = ctx.jaxfn_host
            by_array = probe.args.per_array_from_slots(tangents)
            present = tuple(t is not None for t in by_array)
            given = [t for t in by_array if t is not None]
            out = self._on_host(probe, probe.info.avals, [*ctx.saved_tensors, *given], _host_jvp, present)
            return probe.info.rebuild(list(out))

        forward.__signature__ = definition.signature  # type: ignore[attr-defined]
        return dataclasses.replace(
            definition, forward=forward, backward=backward, jvp=jvp if definition.jvp is not None else None
        )

    # -- probes and callbacks ----------------------------------------------------------------
    def _probe(self, args: Arguments, arrays: Any, flags: tuple[bool, ...]) -> _Probe:
        """The probe of this signature (its strict key, its arrays' shapes and dtypes as JAX holds
        them, flags, x64), run once; on each call where the call has no key. Under ``jax.export``
        refused first (before the probe, which can't run on symbolic shapes)."""
        if _jax_private.inside_export():
            raise error(AutogradFunctionTypeError, self.definition.name, _EXPORT)
        dtypes = _numpy_dtypes(self.definition.name, args, arrays)
        avals = tuple(jax.ShapeDtypeStruct(np.shape(a), d) for a, d in zip(arrays, dtypes))
        try:
            key = (_keys.split_key(args, args.kinds), avals, flags, _jax_private.x64())
        except (_keys.Unkeyable, TypeError):
            key = None
        probe = self._probes.get(key) or _run_probe(self.definition, args, avals, flags, self.output)
        if key is not None:
            self._probes[key] = probe
        return probe

    def _on_host(self, probe: _Probe, specs: Any, arrays: Any, run: Callable[..., Any], *extra: Any) -> Any:
        """``run(definition, probe, *extra, *arrays)`` on the host, its results of ``specs``: through
        this thread's stable ``HostCall`` of it (JAX's cache of compiled callbacks hits)."""
        calls = probe.calls.__dict__.setdefault("by_run", {})  # this thread's
        anomaly = _anomaly.enabled()  # read when the call is traced; the callback runs later, elsewhere
        key = (run, anomaly, *extra)
        if key not in calls:
            calls[key] = HostCall(functools.partial(run, self.definition, probe, *extra), anomaly)
        return bind(self.definition.name, calls[key], specs, *arrays)


def _numpy_dtypes(name: str, args: Arguments, arrays: Any) -> list[Any]:
    """The dtypes host code sees ``arrays`` in: those JAX holds them in. An array of one of JAX's
    own dtypes (a PRNG key array, jax.random.key) has no NumPy form: refused, naming the argument."""
    dtypes = [jax.dtypes.canonicalize_dtype(a.dtype, allow_extended_dtype=True) for a in arrays]
    for position, array, dtype in zip(args.array_positions, arrays, dtypes):
        if jnp.issubdtype(array.dtype, jax.dtypes.extended):  # JAX's own (a key), as _arguments classifies it
            raise error(
                AutogradFunctionTypeError,
                name,
                f"argument '{args.paths[position]}' is an array of JAX's own dtype {dtype} (a PRNG key array, as "
                "jax.random.key makes), but host code (host=True) runs on NumPy arrays, which cannot hold it; pass "
                "jax.random.key_data(key) (its uint32 data, a NumPy array on the host), or draw the random values "
                "before the call and pass them",
            )
    return dtypes


# -- on the host ---------------------------------------------------------------------------------
def _host_forward(definition: _rule.Definition, probe: _Probe, *arrays: Any):
    """Runs in the callback: forward's outputs, and (where an array is differentiated) what it
    saved, as they cross."""
    ctx, out, _ = _rule.forward_with_context(definition, probe.args, list(arrays), probe.flags)
    results = _check_outputs(definition.name, probe.info, out)
    if any(probe.flags):
        remainder, leaves = _host_values.split(ctx)
        if remainder.treedef != probe.remainder.treedef:  # the treedef holds the save and attribute names too
            names = [", ".join(map(repr, r.save_names)) or "nothing" for r in (remainder, probe.remainder)]
            raise error(AutogradFunctionTypeError, definition.name, _CHANGED.format("save", "saved", *names))
        results.extend(_host_values.send(definition.name, leaf, carry) for leaf, carry in zip(leaves, probe.carries))
        results.extend(np.zeros(s.shape, s.dtype) for s in probe.carried[len(leaves) :])  # the receipt, if any
    return tuple(results)


_CHANGED = (
    "a host forward (host=True) must {0} the same structure on every call, but this call {1} {2}, where the "
    "first one of this signature {1} {3}; return and save values of fixed structures and shapes (a value "
    "that is None on some calls is a leaf missing from the structure: save a placeholder of fixed shape)"
)


def _check_outputs(name: str, info: Outputs, out: Any) -> list[np.ndarray]:
    """A host forward's output leaves as JAX will hold them, checked against what the probe (or,
    eagerly, this very run) described."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    if treedef != info.treedef:
        raise error(AutogradFunctionTypeError, name, _CHANGED.format("return", "returned", treedef, info.treedef))
    return [_host_values.conform(name, "output", leaf, spec) for leaf, spec in zip(leaves, info.avals)]


def _host_backward(definition: _rule.Definition, probe: _Probe, present: tuple[bool, ...], *values: Any):
    """Runs in the callback: the rule's own backward step (``_rule.run_backward``) on NumPy arrays,
    with a context rebuilt from what forward's callback sent (the receipt, if any, left unread);
    one input-shaped gradient per differentiated array."""
    saved = [_host_values.receive(definition.name, c, v) for c, v in zip(probe.carries, values)]
    ctx = Context.from_residuals(saved, probe.remainder)
    given = iter(values[len(probe.carried) :])
    cotangents = [next(given) if p else None for p in present]
    avals, flags = list(probe.avals), list(probe.flags)
    grads = _rule.run_backward(definition, probe.args, ctx, probe.info, cotangents, avals, flags, xp=np)
    return tuple(np.zeros(a.shape, a.dtype) if g is None else g for g, a, flag in zip(grads, avals, flags) if flag)


def _host_jvp(definition: _rule.Definition, probe: _Probe, present: tuple[bool, ...], *values: Any):
    """Runs in the callback: forward with a fresh context, then the user's jvp reading what it
    saved (``ctx.save_for_forward``) and its attributes, its tangents handed over and read back as
    the traced rule's are (``_forward_mode.run_jvp``); one tangent per output array."""
    args, info = probe.args, probe.info
    arrays, given = values[: len(present)], iter(values[len(present) :])
    ctx, out, _ = _rule.forward_with_context(definition, args, list(arrays), present)
    _check_outputs(definition.name, info, out)
    tangents = [next(given) if flag else None for flag in present]
    computed = iter(_forward_mode.run_jvp(definition, args, _context.for_jvp(ctx), arrays, tangents, info, np))
    return tuple(next(computed) if d else np.zeros(a.shape, a.dtype) for d, a in zip(info.differentiable, info.avals))


# -- the probe ---------------------------------------------------------------------------------
def _run_probe(definition: _rule.Definition, args: Arguments, avals: Any, flags: Any, output: Any) -> _Probe:
    """Run the host forward on arrays of ones, or (if it fails there) on seeded standard-normal
    arrays, of the shapes and dtypes ``avals``, and describe what it returns and saves."""
    failures: list[Exception] = []
    for fill in (np.ones, np.random.default_rng(0).standard_normal):  # normal arrays only if forward fails on ones
        candidate = [fill(a.shape).astype(a.dtype) for a in avals]
        try:
            with np.errstate(all="ignore"):
                ctx, out, marked = _rule.forward_with_context(definition, args, candidate, flags)
        except AutogradFunctionError:
            raise
        except Exception as err:  # noqa: BLE001 - reported below with what the probe is for
            if failures and (type(err), str(err)) == (type(failures[0]), str(failures[0])):
                # the user's own exception, as an eager call raises it, with what jaxfn ran to get it
                note = _PROBED.format(name=definition.name, ones=_described_call(args, avals, "ones"))
                if note not in getattr(err, "__notes__", ()):
                    err.add_note(note)
                raise
            failures.append(err)
            continue
        # what forward returned (checked), and how what it saved crosses to backward
        info = _outputs_of(definition.name, out, marked, output)
        remainder, saved = _host_values.split(ctx)
        return _Probe(args.structure(), avals, tuple(flags), info, remainder, tuple(map(_host_values.carry, saved)))
    first, last = failures
    raise error(
        AutogradFunctionTypeError,
        definition.name,
        "under a JAX transformation a host forward (host=True) is run once per input signature on example "
        "arrays to learn the shapes of what it returns and saves: jaxfn ran "
        f"forward({_described_call(args, avals, 'ones')}), then forward({_described_call(args, avals, 'normal')}) "
        f"(seeded standard-normal values), and it failed on both ({type(first).__name__}: {first}; "
        f"{type(last).__name__}: {last}); make forward accept such inputs (it may branch on them; the Python "
        "values are the call's own), or call it outside transformations, where forward runs on the values given",
    ) from last


_EXPORT = (
    "it runs code on the host (host=True: NumPy or SciPy code, or a PyTorch Function through jaxfn.from_torch), "
    "but jax.export serializes a program to run without this Python process, and JAX can't serialize a call "
    "back into Python; export the JAX code around it and call this function beside the exported program, or "
    "write forward and backward in JAX operations (port it) to export it"
)


_PROBED = (
    "jaxfn: '{name}': this was raised by the host forward (host=True) on example arrays jaxfn made, not on your "
    "values: under a JAX transformation jaxfn runs forward once per input signature to learn the shapes of what "
    "it returns and saves, as forward({ones}) and then on seeded standard-normal values, and it raised this on "
    "both; if forward needs valid data (a positive-definite matrix, say), make it return outputs of the right "
    "shapes on such inputs too (catch the error and return zeros), or call it outside transformations"
)


def _described_call(args: Arguments, avals: Any, kind: str) -> str:
    """The probe's call as jaxfn made it: each array as ``ones((3,), float32)``, each Python value as given."""
    shown = [_Shown(f"{kind}({a.shape}, {a.dtype.name})") for a in avals]
    return ", ".join(f"{name}={value!r}" for name, value in zip(args.names, args.values(shown)))


class _Shown(str):
    """An array in a message: ``repr`` is its description."""

    __repr__ = str.__str__


def _outputs_of(name: str, out: Any, marked: list[Any], output: Any) -> Outputs:
    """What a host forward returned (``marked``: the outputs it marked non-differentiable), checked
    and described (all an eager call needs: no backward)."""
    leaves, parts = _split.split(out, lambda leaf: True)  # every leaf an array
    for leaf in leaves or [out]:  # out itself where it holds no leaf (None, an empty tuple): refused too
        numeric = isinstance(leaf, (np.ndarray, *_NUMBERS)) and dtype_kind(np.asarray(leaf).dtype) != STATIC
        if not (leaves and numeric):
            what = f"a NumPy array of dtype {leaf.dtype}" if isinstance(leaf, np.ndarray) else type_name(leaf)
            raise error(
                AutogradFunctionTypeError,
                name,
                f"a host forward (host=True) must return NumPy arrays or numbers, but it returned {what}",
            )
    specs = tuple(_host_values.spec(leaf) for leaf in leaves)
    if output is not None:  # what the user declared
        declared, declared_treedef = jax.tree_util.tree_flatten(output)
        differs = any(tuple(d.shape) != s.shape or np.dtype(d.dtype) != s.dtype for d, s in zip(declared, specs))
        if declared_treedef != parts.treedef or differs:
            raise error(
                AutogradFunctionTypeError,
                name,
                f"output= declares {[(tuple(d.shape), str(d.dtype)) for d in declared]}, but the host forward "
                f"returned {[(s.shape, str(s.dtype)) for s in specs]}; declare what forward returns",
            )
    ids = _outputs.check_marked(name, leaves, marked)
    differentiable = tuple(id(leaf) not in ids and dtype_kind(s.dtype) == DIFF for leaf, s in zip(leaves, specs))
    return Outputs(parts.treedef, parts.is_array, parts.statics, specs, differentiable, isinstance(out, (tuple, list)))
