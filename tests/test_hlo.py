"""Under jit, jaxfn compiles to the same computation as a hand-written jax.custom_vjp.

Checked on exactly the functions the benchmark (benchmarks/bench.py) times.
"""

import collections
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench  # noqa: E402


def _opcodes(relu):
    args = ((jnp.ones((20, 8)), jnp.ones((8, 3))), jnp.ones((16, 20)), jnp.ones((16, 3)))
    text = jax.jit(bench.make_step(relu)).lower(*args).compile().as_text()
    return collections.Counter(re.findall(r" = \S+ (\w[\w-]*)\(", text))


@pytest.mark.parametrize("forward_mode", [False, True])
def test_training_step_compiles_to_the_same_hlo_as_custom_vjp(forward_mode):
    got, want = _opcodes(bench.make_jaxfn_relu(forward_mode)), _opcodes(bench.make_custom_vjp_relu())
    assert sum(want.values()) > 10
    assert got == want
    assert _opcodes(bench.plain_relu) != want  # the comparison can tell different programs apart
