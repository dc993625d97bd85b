"""Under jit, jaxfn compiles to the same computation as a hand-written jax.custom_vjp.

Checked on exactly the functions the benchmark (benchmarks/seeds.py) times: both take them from
tests/seeds.py.
"""

import collections
import os
import re
import sys

import jax
import jax.numpy as jnp
import pytest
import seeds


def _opcodes(relu):
    args = ((jnp.ones((20, 8)), jnp.ones((8, 3))), jnp.ones((16, 20)), jnp.ones((16, 3)))
    text = jax.jit(seeds.make_step(relu)).lower(*args).compile().as_text()
    return collections.Counter(re.findall(r" = \S+ (\w[\w-]*)\(", text))


@pytest.mark.parametrize("forward_mode", [False, True])
def test_training_step_compiles_to_the_same_hlo_as_custom_vjp(forward_mode):
    got, want = _opcodes(seeds.make_jaxfn_relu(forward_mode)), _opcodes(seeds.make_custom_vjp_relu())
    assert sum(want.values()) > 10
    assert got == want
    assert _opcodes(seeds.plain_relu) != want  # the comparison can tell different programs apart


def test_the_benchmark_reports_the_same_optimized_program_and_can_tell_programs_apart():
    """benchmarks/bench.py's row 1 column 'same optimized program as custom_vjp' (instruction for
    instruction, result types included) says yes for jaxfn in both modes and no for plain autodiff."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    import bench

    per_step, hlo, same = bench.compiled_step(64, 1)
    assert same == {"jaxfn": True, "jaxfn forward_mode": True, "custom_vjp": True, "plain autodiff": False}
    assert all(wall > 0 and cpu > 0 for wall, cpu in per_step.values())
    assert hlo["jaxfn"] == hlo["custom_vjp"] != hlo["plain autodiff"]


def test_the_trace_benchmark_contenders_compute_plain_autodiff_s_gradient():
    """benchmarks/bench.py's row 2b times three ReLUs; each must be the ReLU, gradient included."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    import bench

    x = jnp.linspace(-2.0, 2.0, 8)  # not 0, where plain clip and the rule choose different subgradients
    want = jax.grad(lambda x: (seeds.plain_relu(x) * 0.5 + x).sum())(x)
    for name, make in bench.TRACE_CONTENDERS.items():
        relu = make()
        got = jax.jit(jax.grad(lambda x, relu=relu: (relu(x) * 0.5 + x).sum()))(x)
        assert jnp.allclose(got, want), name


def test_a_signature_kept_on_a_rule_s_function_is_that_function_s_own():
    """_reverse_mode keeps each custom_vjp function's signature on it (JAX reads it on every call),
    read once per def: every closure of a def gets that def's signature, and a closure with
    defaults (which differ between closures) its own."""
    import inspect

    from jaxfn import _reverse_mode

    def make(scale):
        def fwd(*primals):
            return primals, scale

        def with_default(*primals, how=scale):
            return primals

        return fwd, with_default

    def other(residuals, cotangents):
        return cotangents

    for function in (*make(1), *make(2), other):
        want = inspect.signature(function)
        assert _reverse_mode._signed(function) is function
        assert inspect.signature(function) == want and function.__signature__ == want
    assert str(_reverse_mode._signed(make(3)[1]).__signature__) == "(*primals, how=3)"
