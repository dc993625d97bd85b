"""Under jit, jaxfn compiles to the same computation as a hand-written jax.custom_vjp.

Checked on exactly the functions the benchmark (benchmarks/seeds.py) times: both take them from
tests/seeds.py.
"""

import collections
import re

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
