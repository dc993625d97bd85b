"""The one split of a pytree into its arrays and its Python values (jaxfn._split), which a call's
arguments, forward's output, ctx, a closure's call and a jitted call's output share."""

import jax
import jax.numpy as jnp
import numpy as np

import jaxfn
from jaxfn import _split


def test_split_takes_the_arrays_in_order_and_join_puts_them_back():
    tree = {"w": jnp.ones(2), "name": "relu", "n": 3, "rest": [np.zeros(1), None, 2.5]}
    arrays, parts = _split.split(tree)
    assert [a.shape for a in arrays] == [(1,), (2,)]  # leaf order: dict keys sorted
    assert parts.is_array == (False, False, True, False, True)  # n, name, rest[0], rest[2], w (None: no leaf)
    assert parts.statics[:2] == (3, "relu") and parts.statics[2] is None
    again = parts.join([jnp.full(1, 7.0), jnp.full(2, 5.0)])
    assert again["name"] == "relu" and again["n"] == 3 and again["rest"][2] == 2.5
    assert again["rest"][1] is None
    np.testing.assert_array_equal(again["w"], [5.0, 5.0])
    np.testing.assert_array_equal(again["rest"][0], [7.0])


def test_join_without_python_values_puts_none_there():
    arrays, parts = _split.split((jnp.ones(2), "x", 4))
    assert parts.join(["g"], python_values=False) == ("g", None, None)


def test_split_follows_the_given_test_of_an_array_and_gives_paths():
    arrays, parts, paths = _split.split_with_paths(
        {"a": jnp.ones(1), "b": np.ones(1)}, lambda leaf: isinstance(leaf, jax.Array)
    )
    assert len(arrays) == 1 and parts.is_array == (True, False)
    assert [jax.tree_util.keystr(p) for p in paths] == ["['a']", "['b']"]


def test_every_crossing_is_a_split():
    from jaxfn._arguments import Arguments
    from jaxfn._context import Remainder
    from jaxfn._outputs import Outputs

    assert all(issubclass(kind, _split.Split) for kind in (Arguments, Outputs, Remainder))


def test_a_jitted_call_keeps_its_python_values_per_compiled_program():
    def forward(ctx, x, label):
        return {"y": x * 2.0, "label": label, "size": x.shape[0]}

    def backward(ctx, g):
        return {"x": g["y"] * 2.0}

    f = jaxfn.autograd_function(forward, backward, jit=True)
    out = f(jnp.ones(3), "a")
    assert out["label"] == "a" and out["size"] == 3
    out = f(jnp.ones(5), "b")
    assert out["label"] == "b" and out["size"] == 5
    np.testing.assert_allclose(out["y"], 2.0 * np.ones(5))
