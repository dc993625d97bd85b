"""Builder for functions with a user ``vmap`` rule: one JAX hijax primitive per call structure,
carrying reverse mode, forward mode and batching rules together.

``jax.custom_vjp`` can carry a backward only, and ``jax.custom_jvp`` batches forward's own
operations; JAX's hijax primitive (``jax.experimental.hijax``, named in ``_jax_private``) holds
an implementation (``expand``), reverse mode (``vjp_fwd``/``vjp_bwd_retval``), forward mode
(``jvp``, ``lin``/``linearized``) and batching (``batch``) in one primitive. Functions with a
``jvp`` rule and no ``vmap`` rule are ``_forward_mode``'s.

The rules, each on one call's flat arrays (``_Rules``):

* ``primal``: forward's outputs (``_rule.Rule.primal``);
* ``fwd``/``bwd``: reverse mode, from the user's backward through ``_rule.Rule``
  (forward's context crosses as residuals, its static part per trace in ``_rule.Traces``);
* ``jvp``: forward mode as ``_forward_mode`` builds it (``_forward_mode.jvp_rule``, one rule for
  both forward-mode builders): the user's ``jvp(ctx, *tangents)``, reading what forward saved
  with ``ctx.save_for_forward``; or, with ``forward_mode=True``, backward transposed; or none
  (forward mode refused in jaxfn's words where a tangent is computed). Its tangents go through
  ``_linear``, whose transpose is the user's backward: where JAX transposes the jvp (``jax.grad``
  under ``jax.checkpoint``), reverse mode is still backward;
* ``vmap``: the user's ``vmap(info, in_dims, *args)``; without one, the batched call is a new
  primitive whose rules are the rules above under ``jax.vmap`` (JAX batches forward, backward
  and jvp's operations; gradients of a batched call still come from backward).

Where a rule runs on another trace's tracers (``jax.hessian``, ``jax.grad`` of ``jax.grad``),
its output, and each saved value that is an output, is the primitive applied again, so that
the outer trace differentiates it through these rules too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from . import _forward_mode, _jax_private, _linear, _outputs, _rule, _tie
from ._arguments import Arguments
from ._errors import AutogradFunctionTypeError, ContextAttributeError, error, type_name, unknown_name
from ._outputs import Described, Outputs

# jax.experimental.hijax's names, kept with their JAX versions in _jax_private
_BASE, _Zero = _jax_private.HI_PRIMITIVE, _jax_private.HI_ZERO


@dataclasses.dataclass(frozen=True)
class VmapInfo:
    """What a user's ``vmap(info, in_dims, *args)`` rule gets first, as in PyTorch.

    ``batch_size``: the size of the mapped axis. ``randomness``: always ``"error"``: JAX has no
    global randomness mode; random values come from key arguments, and ``in_dims`` says whether
    a key is batched.
    """

    batch_size: int
    randomness: str = "error"
    function: str = dataclasses.field(default="vmap", repr=False, compare=False)  # for messages

    def __getattr__(self, name: str) -> Any:  # only for names it lacks: said, listing those it has
        if name.startswith("__"):
            raise AttributeError(name)
        raise error(ContextAttributeError, self.function, unknown_name("vmap's info", name, _INFO_NAMES))


_INFO_NAMES = ("batch_size", "randomness")


@dataclasses.dataclass(frozen=True)
class _Rules:
    """One call's rules, on flat tuples of arrays (see the module docstring)."""

    name: str
    primal: Callable[..., tuple[tuple[Any, ...], Described]]  # primal(*arrays) -> (outs, their description)
    fwd: Callable[..., tuple[tuple[Any, ...], Any]]  # fwd(perturbed, *arrays, again=None) -> (outs, residuals)
    bwd: Callable[..., list[Any]]  # bwd(residuals, cts: None where none flows) -> per input: a cotangent or None
    # jvp(primals, tangents: None where none moves, again=None) -> (outs, Described, per output: a tangent
    # or None), _forward_mode.jvp_rule's; without forward mode (forward_mode False) its tangents are refused
    jvp: Callable[..., tuple[Any, Any, Any]]
    forward_mode: bool  # the user's jvp rule, or derived from backward: JAX refuses jax.linearize otherwise
    vmap: Callable[..., tuple[Any, Any]] | None  # vmap(size, dims, *arrays) -> (outs, out_dims)


class _Primitive(_BASE):
    """One call structure's primitive; the rules are ``_Rules``."""

    def __init__(self, rules: _Rules, in_avals: tuple[Any, ...], out_avals: tuple[Any, ...]):
        self.in_avals = tuple(in_avals)
        self.out_aval = tuple(out_avals)
        self.params = {"jaxfn": _linear.Name(rules.name)}
        self.rules = rules
        super().__init__()

    def expand(self, *arrays: Any) -> tuple[Any, ...]:
        return self.rules.primal(*arrays)[0]

    def vjp_fwd(self, perturbed: Any, *arrays: Any) -> tuple[Any, Any]:
        return self.rules.fwd(tuple(bool(p) for p in perturbed), *arrays, again=self._again_on(arrays))

    def vjp_bwd_retval(self, residuals: Any, cotangents: Any) -> tuple[Any, ...]:
        grads = self.rules.bwd(residuals, [None if isinstance(c, _Zero) else c for c in cotangents])
        return _linear.instantiate(grads, self.in_avals)

    def jvp(self, primals: Any, tangents: Any) -> tuple[Any, Any]:
        # the tangents through _linear: where JAX transposes them (jax.grad under jax.checkpoint),
        # the transpose is backward, never the jvp rule's own operations
        given = [None if isinstance(t, _Zero) else t for t in tangents]
        out, _, computed = self.rules.jvp(tuple(primals), given, again=self._again_on(primals))
        # a symbolic zero where no tangent is computed
        return tuple(out), tuple(
            _Zero(a.to_tangent_aval()) if t is None else t for t, a in zip(computed, self.out_aval)
        )

    def lin(self, perturbed: Any, *primals: Any) -> tuple[Any, Any]:
        # jax.linearize: the tangent function is the jvp rule on the primals, kept as residuals
        if not self.rules.forward_mode:  # refused now, not when the tangent function runs
            raise error(AutogradFunctionTypeError, self.rules.name, _rule.FORWARD_MODE_HELP)
        return tuple(self(*primals)), tuple(primals)

    def linearized(self, primals: Any, *tangents: Any) -> tuple[Any, ...]:
        # one tangent array per output, as JAX reads them: zeros where none moves (float0 for an
        # integer output)
        moving = not all(isinstance(t, _Zero) for t in tangents)
        out = self.jvp(primals, tangents)[1] if moving else (None,) * len(self.out_aval)
        return _linear.instantiate(out, self.out_aval)

    def batch(self, axis_data: Any, arrays: Any, dims: Any) -> tuple[Any, Any]:
        if not jax.tree.leaves(dims):  # JAX may ask even when nothing is batched
            return self(*arrays), (None,) * len(self.out_aval)
        on = _linear.Batch(axis_data, dims)
        user_rule = self.rules.vmap
        if user_rule is not None and (on.size == 0 or not any(isinstance(a, Tracer) for a in arrays)):
            # nothing differentiates it (an empty batch: the rule alone)
            return user_rule(on.size, tuple(dims), *arrays)
        front = on.front(arrays)
        generic = _Primitive(_batched_rules(self, on), on.avals(self.in_avals, on.axes), on.avals(self.out_aval))
        if user_rule is None:
            out = generic(*front)
            return out, (0,) * len(out)
        # an outer trace may differentiate the batched outputs: through the rules batched (so through
        # backward, or the jvp rule), never through the user's vmap rule's own operations, which are
        # run on values no differentiation traces (its own derivative is never asked for)
        out, out_dims = user_rule(on.size, tuple(dims), *jax.lax.stop_gradient(tuple(arrays)))
        at_front = tuple(o if d in (None, 0) else jnp.moveaxis(o, d, 0) for o, d in zip(out, out_dims))

        def rules_batched(*front: Any) -> tuple[Any, ...]:  # an unbatched output: the batch's mean (each
            # element's cotangent a share of the one output's, as when broadcast and summed)
            return tuple(o if d is not None else _mean(o) for o, d in zip(generic(*front), out_dims))

        tied = _tie.tie(rules_batched, front, at_front)
        return tied, tuple(None if d is None else 0 for d in out_dims)

    def _again_on(self, arrays: Any) -> Callable[[Any], tuple[Any, ...]] | None:
        """A rule's ``again`` for these arrays: on an outer trace's tracers, the outputs (and saved
        outputs) an outer differentiation sees are this primitive applied again; else None."""
        if any(isinstance(a, Tracer) for a in arrays):
            return lambda out: tuple(self(*arrays))
        return None


def _mean(batched: Any) -> Any:
    """The batch's mean (an integer or boolean output, never differentiated: its first element)."""
    return batched.mean(0) if jnp.issubdtype(batched.dtype, jnp.inexact) else batched[0]


def _batched_rules(unbatched: _Primitive, on: _linear.Batch) -> _Rules:
    """The rules of a batched call, each of ``unbatched``'s rules under ``on.vmap`` (inputs
    batched at axis 0 or not at all; outputs and residuals batched at axis 0)."""
    rules, axes = unbatched.rules, on.axes

    def fwd(perturbed: tuple[bool, ...], *arrays: Any, again: Any = None) -> Any:
        def one(*arrays: Any) -> Any:  # outputs and saved outputs an outer differentiation sees: the call
            # again (under this vmap: batched by these rules, so through backward at every order)
            return rules.fwd(perturbed, *arrays, again=None if again is None else unbatched._again_on(arrays))

        return on.vmap(one, in_axes=axes)(*arrays)

    def jvp(primals: tuple[Any, ...], tangents: list[Any], again: Any = None) -> Any:
        def one(primals: tuple[Any, ...], tangents: list[Any]) -> Any:  # a tangent is batched as its primal
            inner = None if again is None else unbatched._again_on(primals)  # the call again, batched
            return rules.jvp(primals, tangents, again=inner)

        return on.vmap(one, in_axes=(axes, list(axes)))(primals, tangents)

    primal = on.vmap(rules.primal, in_axes=axes)
    return dataclasses.replace(rules, primal=primal, fwd=fwd, bwd=on.backward(rules.bwd, 0, axes), jvp=jvp, vmap=None)


def build(definition: _rule.Definition, args: Arguments, forward_mode: bool = False) -> Callable[..., Any]:
    """``call(*arrays)``: the function's full output, through one primitive over the arrays.

    ``forward_mode``: derive the jvp rule from backward where the user gave none. ``args`` is the
    call without its arrays.
    """
    rule = _rule.Rule(definition, args)  # every builder's rule: reverse mode from the user's backward
    jvp = _forward_mode.jvp_rule(rule, derive=forward_mode)

    def call(*arrays: Any) -> Any:
        shapes, output = jax.eval_shape(rule.primal, *arrays)  # the output's description rides along
        info = output.info

        def fwd(perturbed: tuple[bool, ...], *arrays: Any, again: Any = None) -> tuple[tuple[Any, ...], Any]:
            out, _, residuals = rule.forward(arrays, perturbed, again)
            return tuple(out), residuals

        vmap = _user_vmap(definition, args, info)
        has_forward_mode = forward_mode or definition.jvp is not None
        rules = _Rules(definition.name, rule.primal, fwd, rule.backward, jvp, has_forward_mode, vmap)
        in_avals = tuple(jax.typeof(a) for a in arrays)
        out_avals = tuple(map(_jax_private.aval_of, shapes))  # inside shard_map: varying as forward's outputs
        return info.rebuild(_Primitive(rules, in_avals, out_avals)(*arrays))

    return call


def _user_vmap(definition: _rule.Definition, args: Arguments, info: Outputs) -> Callable[..., Any]:
    """The user's ``vmap(info, in_dims, *args)`` rule, PyTorch's contract: ``in_dims`` has one
    entry per argument (a dim or None per array leaf, None for other leaves); it returns the
    outputs and ``out_dims`` (one per output, or one int for all)."""
    name = definition.name
    vmap = definition.vmap
    assert vmap is not None  # this builder's functions have one
    names = ", ".join(args.slot_name(slot) for slot in args.slots)  # what it must take, for call_user's message
    takes = f"info, in_dims and one value per argument of forward, as in PyTorch: vmap(info, in_dims, {names})"

    def rule(size: int, dims: tuple[Any, ...], *arrays: Any) -> tuple[Any, Any]:
        in_dims = tuple(args.by_slot(args.parameters(dims)))  # per slot: a dim or None per array leaf, None elsewhere
        handed = (VmapInfo(size, function=name), in_dims, *args.by_slot(args.values(arrays)))
        returned = _rule.call_user(name, "vmap", vmap, handed, takes)
        if not isinstance(returned, tuple) or len(returned) != 2:
            raise error(
                AutogradFunctionTypeError,
                name,
                f"vmap must return a pair (outputs, out_dims), as in PyTorch, but it returned {type_name(returned)}",
            )
        out, out_dims = returned
        if not info.is_sequence and isinstance(out_dims, (tuple, list)):
            raise error(
                AutogradFunctionTypeError,
                name,
                f"vmap must return out_dims as forward's output is structured: one int (or None) for its one "
                f"output, but it returned {type_name(out_dims)} {out_dims!r}; return the int itself (for instance "
                "0, not (0,))",
            )
        out_leaves = _outputs.per_leaf(name, info, info.is_sequence, out, "vmap", "output")
        if out_dims is None or isinstance(out_dims, int):
            dim_leaves = [out_dims] * len(out_leaves)
        else:
            dim_leaves = _outputs.per_leaf(name, info, info.is_sequence, out_dims, "vmap", "out_dim")
        arrays_out, dims_out = [], []
        for index, (leaf, dim, is_array) in enumerate(zip(out_leaves, dim_leaves, info.is_array)):
            if not is_array:
                continue
            if dim is not None and (not isinstance(dim, (int, np.integer)) or isinstance(dim, bool)):
                raise error(
                    AutogradFunctionTypeError,
                    name,
                    f"vmap's out_dims must give an int (or None) per output, as in PyTorch, but for output {index} "
                    f"it gave {type_name(dim)} ({dim!r}); return the axis of the batch as an int",
                )
            dim = None if dim is None else int(dim)
            aval = info.avals[len(arrays_out)]
            shape = tuple(jnp.shape(leaf)) if leaf is not None else None
            # dim: an axis of the output (not wrapped around)
            if dim is not None and shape is not None and -len(shape) <= dim < len(shape):
                dim = dim % len(shape)
                ok = shape[dim] == size and shape[:dim] + shape[dim + 1 :] == tuple(aval.shape)
            else:
                ok = dim is None and shape == tuple(aval.shape)
            if not ok:
                raise error(
                    AutogradFunctionTypeError,
                    name,
                    f"vmap's output {index} must be forward's output {tuple(aval.shape)} with a batch axis of size "
                    f"{size} at its out_dim ({dim}), but it has shape {shape}; return the batched outputs and where "
                    "their batch axis is (None for an output that is not batched)",
                )
            # (leaf is not None here: a missing output has no shape, refused above)
            _forward_mode.check_dtype(name, f"vmap must return forward's outputs, but its output {index}", leaf, aval)
            arrays_out.append(jnp.asarray(leaf, aval.dtype))
            dims_out.append(dim)
        return tuple(arrays_out), tuple(dims_out)

    return rule
