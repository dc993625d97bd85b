"""Forward mode: one ``jax.custom_jvp`` whose tangents are the user's ``jvp`` or, with
``forward_mode=True``, the transpose of backward; reverse mode is backward either way.

The tangents come out of ``_linear.tangents``, whose transpose is the user's backward, so where
JAX transposes this rule (``jax.grad``, also under ``jax.checkpoint``) it runs backward itself:
``forward_mode=True`` and a jvp rule never change what ``jax.grad`` returns. The rule on one
call's flat arrays (``jvp_rule``) is the one both forward-mode builders use: this module's
``jax.custom_jvp`` and ``_primitive``'s hijax primitive.

Derived tangents. A correct backward is linear in its cotangents, so its transpose is the
forward-mode derivative. The gate rests on JAX's own transposition: jaxfn transposes backward
with ``jax.linear_transpose``, which fails on anything that is not linear in grad_output
(``g * g``, ``abs``, ``clip``, a comparison of ``g``, a ``while_loop`` JAX can't reverse), and
adds the checks JAX does not make (``_check_offset``), where tangents are computed (never under
``jax.grad``):

* a cast of a value computed from grad_output to an integer or boolean dtype, which JAX
  transposes to zero (a quantizer's ``g.astype(int)``);
* a constant term: ``jax.linear_transpose`` transposes ``g + c`` as if ``c`` were not there, so
  backward at zero cotangents (its offset) must be zero (an infinite derivative, ``0 * inf``, is
  no constant term). Where forward's saved values are concrete (no outer ``jit``), the offset is
  computed on them; unless backward calls back into Python (``pure_callback``,
  ``debug.callback``: never run on made-up values), it is also computed on probe values standing
  in for the saved arrays (seeded normal values, their negation, ones), so a term that does not
  vanish for every value of them is refused under ``jit`` as eagerly.

What the probes can't see: an offset that is zero for each probe value and non-zero for the
real ones (``g + relu(r - 100)`` under ``jit``), which is a backward that is wrong for some
inputs and not for others; the README names it. Nested jaxfn functions that backward calls on
grad_output are transposed through their forward's operations (``_rule.plain_forward``), as
their value is what backward computes; in reverse mode they keep their own backward.

The user's jvp reads the context forward left for it (``ctx.save_for_forward``, attributes),
whose arrays cross as the tangent map's residuals beside backward's saved arrays, so nothing
crosses into it from the trace that made it but through them.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import ClosedJaxpr, Var, jaxpr_as_fun

from . import _arguments, _jax_private, _linear, _outputs, _rule, _tie
from ._arguments import DIFF, Arguments
from ._context import Context
from ._errors import AutogradFunctionError, AutogradFunctionTypeError, error, type_name
from ._outputs import Described, Outputs

# What JAX raises when a function needs concrete values of a traced array.
_NEEDS_VALUES = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
    jax.errors.NonConcreteBooleanIndexError,
)

NOT_LINEAR = (
    "it has forward_mode=True, so its backward must be linear in grad_output (its transpose is the "
    "forward-mode derivative), but {what}. Backwards that ignore, square, clip or shift grad_output "
    "(gradient clipping, say) cannot serve forward mode: build such a function without forward_mode=True"
)


def build(definition: _rule.Definition, args: Arguments) -> Callable[..., Any]:
    """``call(*arrays)``: the function's full output, through a ``jax.custom_jvp`` over the arrays."""
    rule = _rule.Rule(definition, args)
    forward_mode = jvp_rule(rule, derive=True)
    primal = jax.custom_jvp(rule.primal)

    def jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        # an outer trace differentiates through this rule too (a tie: survives a loop's partial eval)
        again = _tie.again_on(arrays_out, primals)
        given = [None if isinstance(t, SymbolicZero) else t for t in tangents]
        out, described, computed = forward_mode(primals, given, again)
        # one tangent per array output: the map's, zeros (float0 for integers) elsewhere
        return (tuple(out), described), (_linear.instantiate(computed, described.info.avals), described)

    primal.defjvp(jvp, symbolic_zeros=True)

    def arrays_out(*arrays: Any) -> tuple[Any, ...]:
        return primal(*arrays)[0]

    def call(*arrays: Any) -> Any:
        out, described = primal(*arrays)
        return described.info.rebuild(out)

    return call


def jvp_rule(rule: _rule.Rule, derive: bool) -> Callable[..., Any]:
    """Forward mode on one call's flat arrays, as both forward-mode builders use it (this module's
    ``jax.custom_jvp``, ``_primitive``'s hijax primitive): ``jvp(primals, tangents, again=None) ->
    (outputs, Described(info), tangents out)`` runs ``rule``'s forward (``tangents``: None where
    JAX differentiates nothing; ``again``: see ``_rule.outputs_again``) and returns one tangent
    per array output (None where the output is not differentiable), through ``_linear.tangents``,
    whose transpose is the rule's backward. The tangent map is the user's jvp; without one,
    backward transposed where ``derive``, else refused where a tangent is computed (reverse mode,
    which transposes the map, never computes one)."""
    definition, args = rule.definition, rule.args

    def jvp(primals: tuple[Any, ...], tangents: list[Any], again: Any = None) -> tuple[list[Any], Described, list[Any]]:
        perturbed = [t is not None for t in tangents]
        out, info, residuals = rule.forward(primals, perturbed, again, for_jvp=definition.jvp is not None)
        wanted = [i for i, flag in enumerate(perturbed) if flag]
        outs = [i for i, flag in enumerate(info.differentiable) if flag]
        # the tangent map's residuals, flat: the rule's (backward's saved arrays, the jvp's view, the token)
        flat, layout = jax.tree.flatten(residuals)
        avals = tuple(_arguments.shape_dtypes(primals))

        def backward(residuals: tuple[Any, ...], cotangents: tuple[Any, ...]) -> list[Any]:
            """The user's backward: the transpose of the tangent map (JAX's reverse mode)."""
            per_output = _rule.replaced([None] * len(info.avals), outs, cotangents)  # None: none flows
            cts = rule.backward(layout.unflatten(residuals), per_output)
            return [cts[i] for i in wanted]

        def user_jvp(residuals: tuple[Any, ...], given: tuple[Any, ...]) -> list[Any]:
            """The tangent map: the user's jvp, on the context forward left for it."""
            full = _rule.replaced([None] * len(primals), wanted, given)
            ctx = rule.jvp_context(layout.unflatten(residuals))
            return run_jvp(definition, args, ctx, avals, full, info)

        def derived(residuals: tuple[Any, ...], given: tuple[Any, ...]) -> list[Any]:
            """The tangent map: backward transposed, gated (its checks run where tangents are made)."""

            def pullback(*cotangents: Any) -> list[Any]:  # backward, zeros (not None) where it gives none
                cts = backward(residuals, cotangents)
                return [_rule.zeros_like(primals[i]) if ct is None else ct for i, ct in zip(wanted, cts)]

            examples = [_rule.zeros_like(out[i]) for i in outs]
            with _rule.plain_forward(), _jax_private.anomaly_context(False):
                transpose = _transposing(definition.name, jax.linear_transpose, pullback, *examples)
                out_tangents = _transposing(definition.name, transpose, list(given), needs_values=())
                _check_offset(definition.name, pullback, examples, [args.array_paths[i] for i in wanted])
            return list(out_tangents)

        def refused(residuals: tuple[Any, ...], given: tuple[Any, ...]) -> list[Any]:
            """No tangent map: forward mode refused, where a tangent is computed."""
            raise error(AutogradFunctionTypeError, definition.name, _rule.FORWARD_MODE_HELP)

        tangent_map = user_jvp if definition.jvp is not None else derived if derive else refused
        given = tuple(tangents[i] for i in wanted)
        computed = _linear.tangents(definition.name, tangent_map, backward, tuple(flat), given, [out[i] for i in outs])
        return out, Described(info), _rule.replaced([None] * len(out), outs, computed)

    return jvp


def _transposing(name: str, step: Callable[..., Any], *args: Any, needs_values: tuple = _NEEDS_VALUES) -> Any:
    """``step(*args)``, a step of transposing backward (``jax.linear_transpose``, which traces
    it; then the transpose, where a non-linear operation fails), its failure said in jaxfn's
    words: a host function that ran on grad_output is named; a need for concrete values (an
    error of ``needs_values``, or one that caused a jaxfn function's error) is refused as such;
    another jaxfn function's error is its own; any other failure is JAX's refusal to transpose."""
    try:
        return step(*args)
    except Exception as err:  # noqa: BLE001 - any failure to transpose is reported in jaxfn's words
        cause = err.__cause__ if isinstance(err, AutogradFunctionError) else err  # backward's own, named
        hosts = _rule.hosts_in_plain_forward()  # host functions that ran here: JAX can't transpose host code
        if hosts and not isinstance(err, AutogradFunctionError):
            raise error(AutogradFunctionTypeError, hosts[0], _rule.HOST_IN_GATE) from err
        if isinstance(cause, needs_values):
            what = (
                f"it needs the concrete value of grad_output ({type(cause).__name__}), which a linear function "
                "never does"
            )
            raise error(AutogradFunctionTypeError, name, NOT_LINEAR.format(what=what)) from None
        if isinstance(err, AutogradFunctionError):
            raise  # a jaxfn function that backward calls said what is wrong, naming itself
        raise error(AutogradFunctionTypeError, name, NOT_LINEAR.format(what=_failure(err))) from err


def _failure(err: Exception) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if _jax_private.refused_transpose_of_product(err):
        text = "it combines two values computed from grad_output (a product, a comparison, a select on it)"
    elif _jax_private.refused_transpose_of_custom_vjp(err):
        text = (
            "it calls a jax.custom_vjp function on grad_output, which JAX can't transpose; write that helper in "
            "plain JAX operations or as a jaxfn function"
        )
    return f"JAX can't transpose it as a linear function of grad_output ({type(err).__name__}: {text[:300]})"


def _check_offset(name: str, pullback: Callable[..., Any], examples: list[Any], names: list[str]) -> None:
    """Refuse a backward whose value at zero cotangents is not zero (an affine ``g + c``, or a
    constant gradient): on the arrays backward reads (forward's saved values, constants) where
    they are concrete, and on probe values standing in for every one of them. The values are
    computed in a thread of their own, where no JAX trace is active (JAX's trace state is per
    thread), so they are concrete under ``jit`` too and nothing reaches the compiled program."""
    if not all(np.abs(np.zeros((), e.dtype)) == 0 for e in examples):
        return  # float8_e8m0fnu has no zero: there is no zero cotangent to try (the README says so)
    closed = jax.make_jaxpr(pullback)(*examples)
    cast = _cast_of_grad_output(closed.jaxpr, set(closed.jaxpr.invars))
    if cast is not None:
        what = (
            f"it casts a value computed from grad_output to {cast} (an integer or boolean), which JAX transposes "
            "to zero, so the forward-mode derivative would silently lose that term"
        )
        raise error(AutogradFunctionTypeError, name, NOT_LINEAR.format(what=what))
    # not inside jax.shard_map, whose collectives and varying casts run only there (a known limit:
    # a constant term is not seen there); not on made-up values where backward calls back into Python
    if _jax_private.inside_shard_map() or _jax_private.uses_mesh_axes(closed.jaxpr):
        return
    real = [] if any(isinstance(c, Tracer) for c in closed.consts) else [list(closed.consts)]  # where concrete
    probes = ("normal", "negated", "ones") if not _jax_private.calls_back(closed.jaxpr) else ()
    zeros = [np.zeros(np.shape(e), e.dtype) for e in examples]
    x64 = _jax_private.x64()  # a setting of this thread (jax.enable_x64 as a context), carried over

    def check() -> None:  # in a thread of its own: no outer trace there; its refusal is raised again here
        with jax.enable_x64(x64):
            for consts in real + [_probe(closed.consts, k) for k in probes]:
                for where, value in zip(names, jaxpr_as_fun(ClosedJaxpr(closed.jaxpr, consts))(*zeros)):
                    if np.any((np.asarray(value) != 0) & np.isfinite(value)):  # 0 * inf: no constant term
                        what = (
                            f"its gradient for '{where}' is not zero when grad_output is zero (it has a constant "
                            "term, as in g + c, or does not depend on grad_output)"
                        )
                        raise error(AutogradFunctionTypeError, name, NOT_LINEAR.format(what=what))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(check).result()


def _cast_of_grad_output(jaxpr: Any, linear: set[Any]) -> Any:
    """The integer or boolean dtype a value computed from ``linear`` variables is turned into in
    ``jaxpr`` (and in the jaxprs it calls with its own inputs, as a jit, a scan or a cond's
    branches do), or None: JAX transposes such a cast to zero without calling it non-linear. A
    cast inside a while loop's body is seen where its result leaves the body as an integer only."""
    for eqn in jaxpr.eqns:
        inputs = [isinstance(v, Var) and v in linear for v in eqn.invars]
        if not any(inputs):
            continue
        subs = _jax_private.sub_jaxprs(eqn.params)
        for out in eqn.outvars:
            dtype = out.aval.dtype
            if jnp.issubdtype(dtype, jnp.inexact):
                linear.add(out)
            elif not subs and dtype != jax.dtypes.float0:  # an operation (not a loop's counter) made it
                return dtype
        for sub in subs:
            skipped = _jax_private.sub_jaxpr_operands(eqn, sub)
            if skipped is None:  # a layout of its inputs not known (a while loop's): seen where results leave
                continue
            found = _cast_of_grad_output(sub, {v for v, flag in zip(sub.invars, inputs[skipped:]) if flag})
            if found is not None:
                return found
    return None


def _probe(consts: list[Any], kind: str) -> list[Any]:
    """Stand-ins for the arrays backward reads, whatever they hold (under ``jit`` nobody knows)."""
    rng = np.random.default_rng(0)
    return [_stand_in(rng, c, kind) if isinstance(c, jax.Array) else c for c in consts]


def _stand_in(rng: np.random.Generator, const: Any, kind: str) -> Any:
    shape, dtype = tuple(np.shape(const)), const.dtype
    if jnp.issubdtype(dtype, jax.dtypes.extended):  # PRNG keys: some keys
        return jax.random.split(jax.random.key(0), max(1, int(np.prod(shape)))).reshape(shape)
    if jnp.issubdtype(dtype, jnp.bool_) or jnp.issubdtype(dtype, jnp.integer):  # random, zeros, ones
        normal = rng.random(shape) < 0.5 if jnp.issubdtype(dtype, jnp.bool_) else rng.integers(0, 3, shape)
        return jnp.asarray({"normal": normal, "negated": np.zeros(shape), "ones": np.ones(shape)}[kind], dtype)
    normal = rng.standard_normal(shape)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        normal = normal + 1j * rng.standard_normal(shape)
    return jnp.asarray({"normal": normal, "negated": -normal, "ones": np.ones(shape)}[kind], dtype)


def run_jvp(
    definition: _rule.Definition,
    args: Arguments,
    ctx: Context,
    primals: Any,
    tangents: list[Any],
    info: Outputs,
    xp: Any = jnp,
) -> list[Any]:
    """The user's jvp rule, one step on every path (the traced tangent map, the vmap-rule
    primitive, a host callback on NumPy, ``xp=np``): ``jvp(ctx, *tangents)`` on the context
    forward left for it, handed one tangent per argument (PyTorch's count: each ``*args`` element
    apart) in the argument's structure: the tangent of each float/complex leaf (``tangents``: one
    per array input, None where none moves; zeros there, or None with
    ``ctx.set_materialize_grads(False)``), None for every other leaf. Its return is read back as
    one tangent per differentiable output array, checked and cast to its output's dtype."""
    assert definition.jvp is not None  # called only for a function with a jvp rule
    per_array = [
        (xp.zeros(primal.shape, primal.dtype) if tangent is None and ctx.materialize_grads else tangent)
        if args.kinds[position] == DIFF
        else None
        for position, primal, tangent in zip(args.array_positions, primals, tangents)
    ]
    handed = args.by_slot(args.parameters(per_array))
    returned = _rule.call_user(definition.name, "jvp", definition.jvp, (ctx, *handed), _rule.jvp_takes(args))
    leaves = _outputs.per_leaf(definition.name, info, info.is_sequence, returned, "jvp", "tangent")
    array_leaves = [leaf for leaf, is_array in zip(leaves, info.is_array) if is_array]
    per_output = enumerate(zip(array_leaves, info.avals, info.differentiable))
    return [_out_tangent(definition.name, index, tangent, aval, xp) for index, (tangent, aval, d) in per_output if d]


def _out_tangent(name: str, index: int, tangent: Any, aval: Any, xp: Any) -> Any:
    """The tangent of output array ``index`` as the user's jvp returned it, checked and cast
    (zeros for None)."""
    if tangent is None:
        return xp.zeros(aval.shape, aval.dtype)
    if not isinstance(tangent, (jax.Array, np.ndarray, np.generic, int, float, complex)):
        raise error(
            AutogradFunctionTypeError,
            name,
            f"jvp must return one tangent per output, an array, but for output {index} it returned "
            f"{type_name(tangent)}; return an array shaped as that output (or None for a zero tangent)",
        )
    check_dtype(name, f"jvp must return one tangent per output, but the tangent of output {index}", tangent, aval)
    shape = jnp.shape(tangent)
    if shape != tuple(aval.shape):
        raise error(
            AutogradFunctionTypeError,
            name,
            f"jvp must return one tangent per output, of the output's shape, but the tangent of output {index} "
            f"has shape {shape} where the output has {tuple(aval.shape)}; return a tangent shaped as forward's "
            "output",
        )
    return xp.asarray(tangent, aval.dtype)


def check_dtype(name: str, who: str, value: Any, aval: Any) -> None:
    """A rule's array for an output (a jvp's tangent, a vmap rule's output) against that output's
    dtype, as backward's gradients are checked: another float is cast to it; a complex value for
    a real output, or an integer or boolean for a float one, is refused (``who`` starts the
    sentence)."""
    dtype = jnp.result_type(value)
    if jnp.issubdtype(aval.dtype, jnp.inexact) and not jnp.issubdtype(dtype, jnp.inexact):
        what = f"is {dtype}, an integer or boolean dtype, where the output is {aval.dtype}"
    elif jnp.issubdtype(dtype, jnp.complexfloating) and not jnp.issubdtype(aval.dtype, jnp.complexfloating):
        what = f"is {dtype} where the output is real ({aval.dtype}), so its imaginary part would be lost"
    else:
        return
    raise error(AutogradFunctionTypeError, name, f"{who} {what}; return it in the output's dtype ({aval.dtype})")
