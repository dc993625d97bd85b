"""Eager calls mean what the Python says (SPEC section 9); ``jit=True`` is jax.jit's semantics."""

import dataclasses
import functools
import gc
import pickle
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import StaticNode

import jaxfn

ROUNDS = 5  # more calls than any cache of old needed to switch to a compiled copy


def _power_forward(ctx, x, power, *, offset=0.0):
    ctx.power = power
    return x**power + offset


def _no_backward(ctx, g):
    return None


SCALE = 2.0


def _scaled_forward(ctx, x):
    return x * SCALE


def _double_backward(ctx, g):
    return g * 2


def test_same_results_eager_jit_true_and_under_jit():
    power = jaxfn.autograd_function(_power_forward, _no_backward, name="power")
    compiled = jaxfn.autograd_function(_power_forward, _no_backward, name="power", jit=True)
    under_jit = jax.jit(lambda x, p, offset: power(x, p, offset=offset), static_argnums=1)
    x = jnp.linspace(-1.0, 1.0, 5)
    for f in (power, compiled, under_jit):
        for _ in range(2):
            np.testing.assert_allclose(f(x, 3, offset=1.0), x**3 + 1.0, rtol=1e-12)


def test_forward_runs_once_per_eager_call():
    calls = []

    def forward(ctx, x):
        calls.append(1)
        return x * 2

    f = jaxfn.autograd_function(forward, _double_backward, name="counted")
    for _ in range(ROUNDS):
        f(jnp.ones(3))
    assert len(calls) == ROUNDS


# Each forward below reaches state that changes between calls through a different Python idiom;
# the old eager cache (which read user code to decide when a compiled copy was safe) missed these.
_STATE = {"scale": 1.0}


def _other_forward(ctx, x):
    return x * _STATE["scale"]


_OTHER = jaxfn.autograd_function(_other_forward, _double_backward, name="other")


@jax.custom_vjp
def _vjp_helper(x):
    return x * _STATE["scale"]


_vjp_helper.defvjp(lambda x: (_vjp_helper(x), None), lambda r, g: (g,))


@jax.custom_jvp
def _jvp_helper(x):
    return x * _STATE["scale"]


_jvp_helper.defjvp(lambda p, t: (_jvp_helper(*p), t[0]))


class _Scaler:
    def __init__(self):
        self.scale = _STATE["scale"]


def _with_default(x, box=[]):  # noqa: B006 - the idiom under test
    box.append(1)
    return x * len(box)


@pytest.mark.parametrize(
    "forward",
    [
        lambda ctx, x: _OTHER(x),  # another jaxfn function
        lambda ctx, x: _vjp_helper(x),  # a jax.custom_vjp helper
        lambda ctx, x: _jvp_helper(x),  # a jax.custom_jvp helper
        lambda ctx, x: x * _Scaler().scale,  # a class constructor
    ],
    ids=["jaxfn", "custom_vjp", "custom_jvp", "constructor"],
)
def test_forward_sees_current_state_on_every_call(forward):
    """Each call gives what calling forward's Python directly gives then (a custom_vjp helper's
    own caching is JAX's: with jax_custom_vjp3 on, JAX traces such a helper once)."""
    f = jaxfn.autograd_function(forward, _double_backward, name="stateful")
    try:
        for scale in range(1, ROUNDS + 1):
            _STATE["scale"] = float(scale)
            assert float(f(jnp.ones(()))) == float(forward(None, jnp.ones(())))
    finally:
        _STATE["scale"] = 1.0


def test_forward_drawing_random_numbers_draws_fresh_ones_every_call():
    f = jaxfn.autograd_function(
        lambda ctx, x: x * np.random.default_rng().uniform(1.0, 2.0), _double_backward, name="random"
    )
    assert len({float(f(jnp.ones(()))) for _ in range(ROUNDS)}) == ROUNDS


def test_forward_with_a_helpers_mutable_default_counts_every_call():
    f = jaxfn.autograd_function(lambda ctx, x: _with_default(x), _double_backward, name="default")
    start = len(_with_default.__defaults__[0])
    got = [float(f(jnp.ones(()))) for _ in range(ROUNDS)]
    assert got == [float(start + i + 1) for i in range(ROUNDS)]


def test_forward_reading_a_rebound_global_sees_the_new_value():
    global SCALE
    f = jaxfn.autograd_function(_scaled_forward, _double_backward, name="scaled")
    try:
        for scale in range(1, ROUNDS + 1):
            SCALE = float(scale)
            assert float(f(jnp.ones(()))) == scale
    finally:
        SCALE = 2.0


def test_an_exception_in_forward_reaches_the_caller_on_every_call():
    calls = []

    def forward(ctx, x):
        calls.append(1)
        if len(calls) % 2 == 0:
            raise RuntimeError(f"call {len(calls)} failed")
        return x + 1

    f = jaxfn.autograd_function(forward, _no_backward, name="flaky")
    for i in range(1, 2 * ROUNDS + 1):
        if i % 2 == 0:
            with pytest.raises(RuntimeError, match=f"call {i} failed"):
                f(jnp.ones(2))
        else:
            np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])


def test_value_dependent_forwards_work_eagerly():
    f = jaxfn.autograd_function(lambda ctx, x: x[x > 0], _no_backward, name="positive")
    np.testing.assert_allclose(f(jnp.array([-1.0, 2.0, 3.0])), [2.0, 3.0])
    g = jaxfn.autograd_function(lambda ctx, x: x * 2 if float(x.sum()) > 0 else -x, _no_backward, name="branch")
    assert float(g(jnp.ones(()))) == 2.0 and float(g(-jnp.ones(()))) == 1.0


# -- jit=True ------------------------------------------------------------------------------------


def test_jit_true_traces_forward_once_per_signature():
    calls = []

    def forward(ctx, x, c):
        calls.append(1)
        return x * c

    f = jaxfn.autograd_function(forward, _no_backward, name="jitted", jit=True)
    for _ in range(ROUNDS):
        np.testing.assert_allclose(f(jnp.ones(3), 2.0), [2.0] * 3)
    assert len(calls) == 1
    f(jnp.ones(4), 2.0)  # a new shape: a new signature
    assert len(calls) == 2
    for _ in range(ROUNDS):
        np.testing.assert_allclose(f(jnp.ones(3), c=2.0), [2.0] * 3)
    assert len(calls) == 2  # keyword or positional: the same signature


@pytest.mark.parametrize("values", [(1, 1.0, True, np.float32(1), np.int8(1)), (0.0, -0.0)])
def test_jit_true_keys_statics_that_compare_equal_apart(values):
    f = jaxfn.autograd_function(lambda ctx, x, c: (x * c, c), _no_backward, name="keys", jit=True)
    for value in values * 2:
        out, back = f(jnp.ones(2), value)
        assert type(back) is type(value) and repr(back) == repr(value)
        np.testing.assert_allclose(out, np.ones(2) * value)
        assert np.signbit(np.asarray(out)).all() == np.signbit(value)


def test_jit_true_reads_python_state_when_a_signature_is_traced():
    global SCALE
    f = jaxfn.autograd_function(_scaled_forward, _double_backward, name="scaled", jit=True)
    try:
        assert float(f(jnp.ones(()))) == 2.0
        SCALE = 5.0
        assert float(f(jnp.ones(()))) == 2.0  # jax.jit's documented semantics
        assert float(f(jnp.ones(2))[0]) == 5.0  # a new signature is traced with the new value
    finally:
        SCALE = 2.0


def test_jit_true_keeps_python_outputs_and_pytree_arguments():
    def forward(ctx, params, n, label):
        return {"y": params["w"] * n, "n": n, "label": label}

    f = jaxfn.autograd_function(forward, _no_backward, name="mixed", jit=True)
    for _ in range(2):
        out = f({"w": jnp.ones(2)}, 3, label="a")
        assert out["n"] == 3 and type(out["n"]) is int and out["label"] == "a"
        np.testing.assert_allclose(out["y"], [3.0, 3.0])


def test_jit_true_function_with_python_outputs_on_the_all_array_call():
    f = jaxfn.autograd_function(lambda ctx, x: (x + 1, "tag"), _no_backward, name="tagged", jit=True)
    for _ in range(3):
        y, tag = f(jnp.ones(2))
        assert tag == "tag"
        np.testing.assert_allclose(y, [2.0, 2.0])


def test_jit_true_refuses_an_unhashable_static_argument():
    f = jaxfn.autograd_function(lambda ctx, x, table: x * table[0], _no_backward, name="table", jit=True)
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'table': with jit=True each static argument .* but 'table' is an? ndarray, which is not; pass a "
        r"hashable value .* or drop jit=True",
    ):
        f(jnp.ones(2), np.array(["a", "b"]))


def test_jit_true_keys_hashable_objects_by_equality_as_jax_jit_does():
    @dataclasses.dataclass(frozen=True)
    class Config:
        scale: float

    calls = []

    def forward(ctx, x, cfg):
        calls.append(1)
        return x * cfg.scale

    f = jaxfn.autograd_function(forward, _no_backward, name="config", jit=True)
    assert float(f(jnp.ones(()), Config(2.0))) == 2.0
    assert float(f(jnp.ones(()), Config(2.0))) == 2.0
    assert float(f(jnp.ones(()), Config(3.0))) == 3.0
    assert len(calls) == 2


def test_jit_true_on_a_function_class_and_gradients():
    class Cube(jaxfn.Function):
        jit = True

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x**2

    np.testing.assert_allclose(Cube.apply(jnp.full(2, 2.0)), [8.0, 8.0])
    np.testing.assert_allclose(jax.grad(lambda x: Cube.apply(x).sum())(jnp.full(2, 2.0)), [12.0, 12.0])


def test_jit_true_follows_the_x64_mode():
    f = jaxfn.autograd_function(lambda ctx, x: x * 2.0, _no_backward, name="x64", jit=True)
    with jax.enable_x64(False):
        assert f(np.ones(2)).dtype == jnp.float32
    with jax.enable_x64(True):
        assert f(np.ones(2)).dtype == jnp.float64


# -- both modes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, True])
def test_concurrent_eager_calls_from_threads(jit):
    power = jaxfn.autograd_function(_power_forward, _no_backward, name="power", jit=jit)
    errors = []

    def work(seed):
        try:
            for i in range(40):
                n = 1 + (seed + i) % 5
                np.testing.assert_allclose(power(jnp.full(n, 2.0), 2), jnp.full(n, 4.0))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


@pytest.mark.parametrize("jit", [False, True])
def test_functions_pickle_before_and_after_eager_calls(jit):
    f = jaxfn.autograd_function(_scaled_forward, _double_backward, name="scaled", jit=jit)
    again = pickle.loads(pickle.dumps(f))
    for _ in range(ROUNDS):
        f(jnp.ones(2))
    after = pickle.loads(pickle.dumps(f))
    for g in (again, after):
        assert g.name == "scaled" and g.jit == jit
        np.testing.assert_allclose(g(jnp.ones(2)), [2.0, 2.0])
        np.testing.assert_allclose(jax.grad(lambda x, g=g: g(x).sum())(jnp.ones(2)), [2.0, 2.0])


class _Holder:
    def __init__(self):
        self.scale = 3.0


def test_static_arguments_are_not_kept_alive():
    f = jaxfn.autograd_function(lambda ctx, x, holder: x * holder.scale, _no_backward, name="held")
    holder = _Holder()
    ref = weakref.ref(holder)
    for _ in range(ROUNDS):
        f(jnp.ones(2), holder)
    del holder
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("jit", [False, True])
def test_a_failing_forward_leaves_the_function_working(jit):
    calls = []

    def forward(ctx, x):
        calls.append(1)
        if len(calls) == 1:
            return "not an array"
        return x + 1

    f = jaxfn.autograd_function(forward, _no_backward, name="flaky", jit=jit)
    with pytest.raises(jaxfn.AutogradFunctionError, match="forward must return arrays"):
        f(jnp.ones(2))
    for _ in range(ROUNDS):
        np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])


@pytest.mark.parametrize("jit", [False, True])
def test_traced_calls_go_through_backward(jit):
    f = jaxfn.autograd_function(lambda ctx, x, p: x**p, lambda ctx, g: {"x": g * 2}, name="power", jit=jit)
    assert float(jax.grad(lambda x: f(x, 2))(3.0)) == 2.0  # backward ran, not forward's own math
    np.testing.assert_allclose(jax.jit(lambda x: f(x, 2))(jnp.full(2, 3.0)), [9.0, 9.0])
    np.testing.assert_allclose(jax.vmap(lambda x: f(x, 2))(jnp.full(2, 3.0)), [9.0, 9.0])


def test_partial_and_keyword_calls_bind_as_python_does():
    power = jaxfn.autograd_function(_power_forward, _no_backward, name="power")
    square = functools.partial(power, power=2)
    np.testing.assert_allclose(square(jnp.full(2, 3.0), offset=1.0), [10.0, 10.0])


def test_jit_true_python_outputs_belong_to_each_compiled_program():
    f = jaxfn.autograd_function(lambda ctx, x: (x * 2, x.shape[0], str(x.dtype)), _no_backward, name="meta", jit=True)
    g = jaxfn.autograd_function(lambda ctx, x, k: tuple(x * k), _no_backward, name="split", jit=True)
    for n, dtype in ((2, jnp.float32), (3, jnp.float32), (2, jnp.bfloat16), (2, jnp.float32)):
        _, size, name = f(jnp.ones(n, dtype))
        assert (size, name) == (n, jnp.dtype(dtype).name)
        assert len(g(jnp.ones(n), 2)) == n


@pytest.mark.parametrize(
    "values",
    [(np.float32, jnp.float32), (np.datetime64(1, "s"), np.datetime64(1000, "ms")), (np.timedelta64(1, "D"),)],
    ids=["classes that compare equal", "datetimes", "timedelta"],
)
def test_jit_true_hands_forward_the_static_value_it_was_given(values):
    f = jaxfn.autograd_function(lambda ctx, x, k: (x, repr(k)), _no_backward, name="given", jit=True)
    for value in values * 2:
        assert f(jnp.ones(1), value)[1] == repr(value)


def test_jit_true_refuses_unhashable_pytree_static_data():
    f = jaxfn.autograd_function(lambda ctx, node: node.value * 2, _no_backward, name="node", jit=True)
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'node': with jit=True .* but that of 'node' is not; make"):
        f(StaticNode(jnp.ones(2), {"a": 1}))
    np.testing.assert_allclose(f(StaticNode(jnp.ones(2), ("a", 1))), [2.0, 2.0])
