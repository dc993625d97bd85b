"""Proving that a backward is linear in its cotangents, from its jaxpr.

``forward_mode=True`` uses the transpose of backward as the forward-mode derivative. That is
right only if backward is *linear* in grad_output, and JAX's transposition does not check it
(an affine ``g + c`` is transposed as if ``c`` were not there). So jaxfn reads backward's jaxpr
and gives every value one of three states:

  * ``ZERO``: a known zero (a literal zero, broadcast or converted);
  * ``CONST``: does not depend on grad_output;
  * ``LINEAR``: a linear function of grad_output.

Each primitive has a rule (``add`` of two linear values is linear, ``mul`` of a linear value by
a constant is linear, ``mul`` of two linear values is not, ...). A primitive without a rule
applied to a linear value, a linear value combined with a non-zero constant (affine), or a
gradient that is a non-zero constant, is refused. The check is sound: it never accepts a
backward that is not linear. Calls (``jit``, ``custom_jvp``/``custom_vjp`` functions, such as
other jaxfn functions), ``cond``, ``scan`` and ``while`` are looked inside.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ._arguments import is_inexact

ZERO, CONST, LINEAR = "zero", "constant", "linear"


class NotLinear(Exception):
    """Backward is not (provably) linear in grad_output; the message says where."""


# Linear in their one array operand (every other operand must not depend on grad_output).
_UNARY = {
    "neg", "reduce_sum", "broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims", "copy", "copy_p",
    "rev", "slice", "real", "imag", "conj", "cumsum", "reduce_window_sum", "fft",
    "convert_element_type", "dynamic_slice", "gather", "sharding_constraint", "device_put", "mesh_cast",
    "reshard", "pvary", "pbroadcast", "all_gather", "all_gather_invariant", "ppermute", "all_to_all",
    "psum_scatter", "reduce_scatter", "optimization_barrier", "tile", "split",
}  # fmt: skip
# One output per operand, each linear in its own operand (collectives over several arrays).
_ELEMENTWISE_MULTI = {"psum", "psum_invariant", "pmean", "psum2"}
# Linear when every operand that may carry grad_output is linear or zero: sums of linear terms.
_ADDITIVE = {"add", "add_any", "sub", "concatenate", "complex", "pad", "dynamic_update_slice", "scatter_add",
             "scatter-add", "scatter", "select_n"}  # fmt: skip
# Which operands must not depend on grad_output, for the primitives above that have such operands.
_CONST_OPERANDS = {
    "dynamic_slice": lambda n: range(1, n),
    "gather": lambda n: range(1, n),
    "dynamic_update_slice": lambda n: range(2, n),
    "scatter_add": lambda n: [1],
    "scatter-add": lambda n: [1],
    "scatter": lambda n: [1],
    "select_n": lambda n: [0],
}
# Linear in one operand when the others do not depend on grad_output.
_PRODUCT = {"mul", "dot_general", "conv_general_dilated"}
_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "remat": "jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr", "custom_jvp_call": "call_jaxpr",
          "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr", "custom_lin": None}  # fmt: skip
# Functions with their own derivative rules: proven linear by their primal computation, and
# transposed through it too (``transposable``), never through their custom rule.
_CUSTOM = {"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "call_hi_primitive"}


def check(closed_jaxpr: Any, output_names: list[str]) -> None:
    """Raise NotLinear unless every output of ``closed_jaxpr`` is linear in all its inputs, or zero.

    ``output_names`` name the outputs (the differentiated parameters) for the message.
    """
    jaxpr = closed_jaxpr.jaxpr
    states = _run(jaxpr, [_const_state(c) for c in closed_jaxpr.consts], [LINEAR] * len(jaxpr.invars), False)
    for name, state in zip(output_names, states):
        if state == CONST:
            raise NotLinear(f"its gradient for '{name}' does not depend on grad_output and is not zero")


def _run(jaxpr: Any, const_states: list[str], in_states: list[str], in_body: bool) -> list[str]:
    """The state of each output of ``jaxpr``; ``in_body``: inside a loop or branch body."""
    env: dict[Any, str] = {}
    for var, state in zip(jaxpr.constvars, const_states):
        env[var] = state
    for var, state in zip(jaxpr.invars, in_states):
        env[var] = state
    for eqn in jaxpr.eqns:
        states = [_read(env, v) for v in eqn.invars]
        for var, state in zip(eqn.outvars, _rule(eqn, states, in_body)):
            env[var] = state
    return [_read(env, v) for v in jaxpr.outvars]


def _read(env: dict[Any, str], var: Any) -> str:
    if hasattr(var, "val"):  # a Literal
        return _value_state(var.val)
    return env[var]


def _const_state(value: Any) -> str:
    """A constant the jaxpr closes over. A JAX array (a residual saved by forward, say) is some
    constant, whatever its value: under jit it is a tracer whose value nobody knows, so reading
    a zero eagerly would make the verdict depend on the data and on jit."""
    return CONST if isinstance(value, jax.Array) else _value_state(value)


def _value_state(value: Any) -> str:
    try:
        return ZERO if np.size(value) <= 1_000_000 and not np.any(np.asarray(value)) else CONST
    except Exception:  # a value NumPy can't read (a PRNG key): some constant
        return CONST


def _rule(eqn: Any, states: list[str], in_body: bool) -> list[str]:
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if LINEAR not in states:
        # 0 * c is zero only if c is finite: known only when c is a zero too
        if all(s == ZERO for s in states) and name in _UNARY | _ADDITIVE | _PRODUCT:
            return [ZERO] * n_out
        return [CONST] * n_out
    if name in _CUSTOM and in_body:
        raise NotLinear(
            _message(
                eqn,
                "calls a function with a custom derivative rule on grad_output inside a loop or branch, where "
                "jaxfn can't transpose around that rule; call it outside the loop or branch",
            )
        )
    if name in _CALLS or name == "call_hi_primitive":
        return _call(eqn, states, in_body)
    if name == "cond":
        return _cond(eqn, states)
    if name in ("scan", "while"):
        return _loop(eqn, states)
    if name == "gather" and _fills_with_nonzero(eqn):
        raise NotLinear(
            _message(
                eqn,
                "fills out-of-bounds positions with a non-zero value (jnp.take's default mode='fill' uses NaN); "
                "use mode='clip' or fill_value=0",
            )
        )
    fixed = list(_CONST_OPERANDS.get(name, lambda n: [])(len(states)))
    if any(states[i] == LINEAR for i in fixed):
        raise NotLinear(_message(eqn, "uses a value computed from grad_output as an index or a condition"))
    operands = [s for i, s in enumerate(states) if i not in fixed]
    if name in _UNARY:
        if name == "convert_element_type" and not _inexact(eqn.outvars[0]):
            raise NotLinear(_message(eqn, "converts a value computed from grad_output to a non-floating dtype"))
        if sum(s == LINEAR for s in operands) != 1 or CONST in operands[1:]:
            raise NotLinear(_message(eqn, "combines grad_output with another operand"))
        return [LINEAR] * n_out
    if name in _ELEMENTWISE_MULTI:
        return [LINEAR if s == LINEAR else s for s in states]
    if name in _ADDITIVE:
        if CONST in operands:
            raise NotLinear(_message(eqn, "adds a term that does not depend on grad_output (the backward is affine)"))
        return [LINEAR] * n_out
    if name in _PRODUCT:
        if states.count(LINEAR) > 1:
            raise NotLinear(_message(eqn, "multiplies two values computed from grad_output"))
        return [LINEAR] * n_out
    if name in ("div", "triangular_solve"):  # linear in the numerator; in b of a x = b
        if states[0 if name == "triangular_solve" else 1] == LINEAR:
            raise NotLinear(_message(eqn, "divides by a value computed from grad_output"))
        return [LINEAR] * n_out
    if name == "custom_linear_solve":  # x = A^-1 b: linear in b, A given by constant operands
        n_consts = sum(eqn.params["const_lengths"])
        if LINEAR in states[:n_consts]:
            raise NotLinear(_message(eqn, "solves with a matrix computed from grad_output"))
        return [LINEAR] * n_out
    if name == "integer_pow" and eqn.params.get("y") == 1:
        return [LINEAR] * n_out
    raise NotLinear(_message(eqn, "is applied to a value computed from grad_output, and it is not linear"))


def _fills_with_nonzero(eqn: Any) -> bool:
    if "FILL_OR_DROP" not in str(eqn.params.get("mode", "")):
        return False
    fill = eqn.params.get("fill_value")
    return fill is None or fill != 0  # None means NaN for inexact dtypes


def _inner(eqn: Any) -> Any:
    """The jaxpr a call-like equation runs: its own parameter, or (jax_custom_vjp3's
    ``call_hi_primitive``) the primal function its rule object traced."""
    if eqn.primitive.name == "call_hi_primitive":
        return getattr(getattr(eqn.params.get("_prim"), "traced", None), "jaxpr", None)
    param = _CALLS.get(eqn.primitive.name)
    return eqn.params.get(param) if param else None


def _call(eqn: Any, states: list[str], in_body: bool) -> list[str]:
    inner = _inner(eqn)
    if inner is None:
        raise NotLinear(_message(eqn, "is a call jaxfn can't look inside"))
    jaxpr, consts = (inner.jaxpr, inner.consts) if hasattr(inner, "consts") else (inner, [])
    return _run(jaxpr, [_const_state(c) for c in consts], states, in_body)


def _cond(eqn: Any, states: list[str]) -> list[str]:
    if states[0] == LINEAR:
        raise NotLinear(_message(eqn, "branches on a value computed from grad_output"))
    results = [_run(b.jaxpr, [_const_state(c) for c in b.consts], states[1:], True) for b in eqn.params["branches"]]
    return [_join(eqn, column) for column in zip(*results)]


def _loop(eqn: Any, states: list[str]) -> list[str]:
    """``scan`` and ``while``: the carry's state is iterated to a fixed point."""
    p = eqn.params
    if eqn.primitive.name == "scan":
        n_consts, n_carry = p["num_consts"], p["num_carry"]
        body, consts, carry, xs = (
            p["jaxpr"],
            states[:n_consts],
            states[n_consts : n_consts + n_carry],
            states[n_consts + n_carry :],
        )
        for _ in range(4):
            out = _run(body.jaxpr, [_const_state(c) for c in body.consts], consts + carry + xs, True)
            new = [_join(eqn, pair) for pair in zip(carry, out[:n_carry])]
            if new == carry:
                return carry + out[n_carry:]
            carry = new
        raise NotLinear(_message(eqn, "has a loop jaxfn could not analyse"))
    cond_n, body_n = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, carry = states[:cond_n], states[cond_n : cond_n + body_n], states[cond_n + body_n :]
    for _ in range(4):
        cond, body = p["cond_jaxpr"], p["body_jaxpr"]
        if LINEAR in _run(cond.jaxpr, [_const_state(c) for c in cond.consts], cond_consts + carry, True):
            raise NotLinear(_message(eqn, "loops on a condition computed from grad_output"))
        out = _run(body.jaxpr, [_const_state(c) for c in body.consts], body_consts + carry, True)
        new = [_join(eqn, pair) for pair in zip(carry, out)]
        if new == carry:
            return carry
        carry = new
    raise NotLinear(_message(eqn, "has a loop jaxfn could not analyse"))


def _join(eqn: Any, states: Any) -> str:
    """The state of a value that is one of ``states`` (branches of a cond, loop iterations)."""
    kinds = set(states)
    if LINEAR in kinds and CONST in kinds:
        raise NotLinear(
            _message(eqn, "gives a value computed from grad_output on one path and a non-zero constant on another")
        )
    return LINEAR if LINEAR in kinds else CONST if CONST in kinds else ZERO


def _inexact(var: Any) -> bool:
    return is_inexact(var.aval.dtype)


def _message(eqn: Any, what: str) -> str:
    return f"the operation '{eqn.primitive.name}' in backward {what}"


def transposable(closed_jaxpr: Any) -> Any:
    """A function evaluating ``closed_jaxpr`` with calls inlined, and functions that have custom
    derivative rules replaced by their primal computation: the computation ``check`` proved
    linear, so that JAX's reverse mode transposes exactly that, never a custom rule."""

    def run(*args: Any) -> list[Any]:
        return _evaluate(closed_jaxpr.jaxpr, closed_jaxpr.consts, args)

    return run


def _evaluate(jaxpr: Any, consts: Any, args: Any) -> list[Any]:
    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return var.val if hasattr(var, "val") else env[var]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        inner = _inner(eqn)
        if inner is not None:
            inner_jaxpr, inner_consts = (inner.jaxpr, inner.consts) if hasattr(inner, "consts") else (inner, [])
            outs = _evaluate(inner_jaxpr, inner_consts, values)
        else:
            bound = eqn.primitive.get_bind_params(eqn.params)  # (subfuns, params) before jax 0.10
            subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *values, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for var, value in zip(eqn.outvars, outs):
            if type(var).__name__ != "DropVar":
                env[var] = value
    return [read(v) for v in jaxpr.outvars]
