"""Eager calls mean what the Python says (SPEC section 9): a compiled copy only where nobody can tell."""

import builtins
import collections
import dataclasses
import enum
import functools
import gc
import math
import operator
import pickle
import sys
import threading
import types
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn
from jaxfn import _eager

ROUNDS = 4  # enough calls of one key to get past tracing and validation to the compiled copy


def _power_forward(ctx, x, power, *, offset=0.0):
    ctx.power = power
    return x**power + offset


def _no_backward(ctx, g):
    return None


def _fill_forward(ctx, x, value):
    return jnp.full(x.shape, value)


SCALE = 2.0


def _scaled_forward(ctx, x):
    return x * SCALE


def _double_backward(ctx, g):
    return g * 2


def test_same_results_eager_jit_and_op_by_op():
    power = jaxfn.autograd_function(_power_forward, _no_backward, name="power")
    x = jnp.linspace(-1.0, 1.0, 5)
    for _ in range(ROUNDS):
        np.testing.assert_allclose(power(x, 3, offset=1.0), x**3 + 1.0, rtol=1e-12)
    assert power._eager.states() == ["compiled"]
    np.testing.assert_allclose(jax.jit(lambda x: power(x, 3, offset=1.0))(x), x**3 + 1.0, rtol=1e-12)


def test_first_call_runs_op_by_op_then_traces_then_compiles():
    calls = []

    def forward(ctx, x):
        calls.append(1)
        return x * 2

    f = jaxfn.autograd_function(forward, _no_backward, name="double")
    x = jnp.ones(3)
    f(x)
    assert f._eager.states() == ["seen"]
    f(x)
    assert f._eager.states() == ["traced"]
    f(x)
    # forward appends to a list it closes over: it reads mutable state, so it never compiles
    assert f._eager.states() == ["op by op"]
    for _ in range(3):
        np.testing.assert_allclose(f(x), 2 * x)
    assert len(calls) == 6  # once per call, as in PyTorch


@pytest.mark.parametrize("values", [(1, 1.0, True, np.float32(1), np.int8(1)), (0.0, -0.0)])
def test_statics_that_compare_equal_get_their_own_result(values):
    fill = jaxfn.autograd_function(_fill_forward, _no_backward, name="fill")
    x = jnp.ones(2)
    expected = {i: jnp.full(x.shape, v) for i, v in enumerate(values)}
    for _ in range(ROUNDS):
        for i, value in enumerate(values):
            got = fill(x, value)
            assert got.dtype == expected[i].dtype, (value, got.dtype)
            np.testing.assert_array_equal(got, expected[i])
            assert np.array_equal(np.signbit(got), np.signbit(expected[i]))


def test_forward_drawing_from_numpy_random_draws_fresh_values_every_call():
    def forward(ctx, x):
        return x + np.random.standard_normal(x.shape)

    f = jaxfn.autograd_function(forward, _no_backward, name="noisy")
    results = [np.asarray(f(jnp.zeros(3))) for _ in range(6)]
    assert len({r.tobytes() for r in results}) == 6
    assert f._eager.states() == ["op by op"]


def test_forward_reading_a_mutated_object_argument_sees_the_current_state():
    class Config:
        scale = 1.0

    config = Config()
    f = jaxfn.autograd_function(lambda ctx, x, cfg: x * cfg.scale, _no_backward, name="scaled")
    for scale in [1.0, 2.0, 3.0, 4.0, 5.0]:
        config.scale = scale
        np.testing.assert_allclose(f(jnp.ones(2), config), [scale, scale])
    assert len(f._eager) == 0  # an object argument is not cached at all


def test_forward_reading_a_rebound_global_sees_the_new_value():
    global SCALE
    f = jaxfn.autograd_function(_scaled_forward, _double_backward, name="scaled")
    try:
        for _ in range(ROUNDS):
            np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])
        assert f._eager.states() == ["compiled"]
        SCALE = 5.0
        np.testing.assert_allclose(f(jnp.ones(2)), [5.0, 5.0])
    finally:
        SCALE = 2.0
    np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])


def test_forward_closing_over_a_mutable_object_never_compiles():
    table = np.ones(2)
    f = jaxfn.autograd_function(lambda ctx, x: x * table, _no_backward, name="lookup")
    for value in [1.0, 2.0, 3.0, 4.0, 5.0]:
        table[:] = value
        np.testing.assert_allclose(f(jnp.ones(2)), [value, value])


def test_constant_arguments_inside_jit_do_not_use_the_eager_path():
    def outer(y):
        f = jaxfn.autograd_function(lambda ctx, x: x * y, lambda ctx, g: g * y, name="times_y")
        return f(jnp.ones(2))  # constant arguments, but forward reads the traced y

    jitted = jax.jit(outer)
    if jax.config.jax_custom_vjp3:  # JAX's new custom_vjp refuses any closed-over tracer (README, Known limits)
        with pytest.raises(jaxfn.AutogradFunctionError, match=r"'times_y': forward or backward reads a value"):
            jitted(2.0)
    else:
        for y in [2.0, 3.0, 4.0]:
            np.testing.assert_allclose(jitted(y), [y, y])
    for transform in (jax.grad, lambda f: jax.jit(jax.grad(f))):
        with pytest.raises(jaxfn.AutogradFunctionError, match=r"'times_y': forward or backward reads a value"):
            transform(lambda y: outer(y).sum())(3.0)


@pytest.mark.parametrize(
    "forward, expected",
    [
        (lambda ctx, x: x[x > 0] * 2, lambda x: x[x > 0] * 2),
        (lambda ctx, x: x.at[x > 0].set(0.0), lambda x: jnp.where(x > 0, 0.0, x)),
        (lambda ctx, x: x * 2 if float(x.sum()) > 0 else -x, lambda x: x * 2 if float(x.sum()) > 0 else -x),
        (lambda ctx, x: x[: int(x[0])], lambda x: x[: int(x[0])]),
    ],
    ids=["boolean index", "boolean .at", "branch on a value", "shape from a value"],
)
def test_value_dependent_forwards_run_op_by_op(forward, expected):
    f = jaxfn.autograd_function(forward, _no_backward, name="value_dependent")
    for x in [jnp.array([2.0, -1.0, 3.0]), jnp.array([1.0, 2.0, -3.0]), jnp.array([-2.0, -1.0, 0.5])] * 2:
        np.testing.assert_allclose(f(x), expected(x))


def test_value_dependent_forward_runs_once_on_its_first_call():
    calls = []

    def forward(ctx, x):
        calls.append(1)
        return x[x > 0]

    f = jaxfn.autograd_function(forward, _no_backward, name="positive")
    f(jnp.array([1.0, -1.0]))
    assert len(calls) == 1


def test_concurrent_eager_calls_from_threads():
    power = jaxfn.autograd_function(_power_forward, _no_backward, name="power")
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


def test_functions_pickle_before_and_after_eager_calls():
    f = jaxfn.autograd_function(_scaled_forward, _double_backward, name="scaled")
    again = pickle.loads(pickle.dumps(f))
    for _ in range(ROUNDS):
        f(jnp.ones(2))
    after = pickle.loads(pickle.dumps(f))
    for g in (again, after):
        assert g.name == "scaled"
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


def test_a_function_re_created_in_a_loop_shares_its_compiled_forward():
    x = jnp.ones(4)
    for _ in range(2 * ROUNDS):
        f = jaxfn.autograd_function(_scaled_forward, _double_backward, name="scaled_in_loop")
        np.testing.assert_allclose(f(x), 2 * x)
    assert _eager.path_for(_scaled_forward).states()[-1] == "compiled"


def test_cache_is_bounded():
    power = jaxfn.autograd_function(_power_forward, _no_backward, name="power_bounded")
    path = power._eager
    old, path.max_entries = path.max_entries, 4
    try:
        for n in range(1, 12):
            np.testing.assert_allclose(power(jnp.ones(n), 2), jnp.ones(n))
        assert len(path) <= 4
    finally:
        path.max_entries = old


def test_a_failing_forward_leaves_the_function_working():
    calls = []

    def forward(ctx, x):
        calls.append(1)
        if len(calls) == 1:
            return "not an array"
        return x + 1

    f = jaxfn.autograd_function(forward, _no_backward, name="flaky")
    with pytest.raises(jaxfn.AutogradFunctionError):
        f(jnp.ones(2))
    for _ in range(ROUNDS):
        np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])


def test_traced_calls_do_not_use_the_eager_path():
    def forward(ctx, x, power):
        return x**power

    f = jaxfn.autograd_function(forward, lambda ctx, g: {"x": g * 2}, name="power_traced")
    assert float(jax.grad(lambda x: f(x, 2))(3.0)) == 2.0  # backward ran: not the cached primal
    jax.jit(lambda x: f(x, 2))(jnp.ones(2))
    jax.vmap(lambda x: f(x, 2))(jnp.ones(2))
    assert len(f._eager) == 0


def test_forward_branching_on_numpy_random_never_compiles():
    def forward(ctx, x):
        return x * 2.0 if np.random.rand() < 0.5 else x * 3.0

    f = jaxfn.autograd_function(forward, _no_backward, name="coin")
    np.random.seed(0)
    got = {float(f(jnp.ones(1))[0]) for _ in range(40)}
    assert got == {2.0, 3.0}


settings = types.ModuleType("user_settings")  # a user's config module
settings.scale = 2.0


class _Scaled(jaxfn.Function):
    k = 2.0

    @staticmethod
    def forward(ctx, x):
        return x * _Scaled.k * settings.scale

    @staticmethod
    def backward(ctx, g):
        return g


def test_attributes_of_a_user_module_or_class_are_re_checked():
    try:
        for _ in range(ROUNDS):
            np.testing.assert_allclose(_Scaled.apply(jnp.ones(2)), [4.0, 4.0])
        settings.scale = 5.0
        np.testing.assert_allclose(_Scaled.apply(jnp.ones(2)), [10.0, 10.0])
        _Scaled.k = 3.0
        np.testing.assert_allclose(_Scaled.apply(jnp.ones(2)), [15.0, 15.0])
    finally:
        settings.scale, _Scaled.k = 2.0, 2.0


def test_x64_mode_is_part_of_the_key():
    f = jaxfn.autograd_function(lambda ctx, x: x * 1.5, _no_backward, name="widen")
    x = np.arange(3, dtype=np.int32)
    with jax.enable_x64(False):
        for _ in range(ROUNDS):
            assert f(jnp.asarray(x)).dtype == jnp.float32
    with jax.enable_x64(True):
        assert f(jnp.asarray(x)).dtype == jnp.float64


@functools.partial(jax.tree_util.register_dataclass, data_fields=["x"], meta_fields=["sign"])
@dataclasses.dataclass
class _Signed:
    x: jax.Array
    sign: float


def test_static_pytree_fields_that_compare_equal_get_their_own_result():
    f = jaxfn.autograd_function(lambda ctx, p: p.x * math.copysign(1.0, p.sign), _no_backward, name="signed")
    for _ in range(ROUNDS):
        for sign, want in ((0.0, 1.0), (-0.0, -1.0)):
            np.testing.assert_allclose(f(_Signed(jnp.ones(2), sign)), [want, want])


def test_nan_and_negative_nan_are_different_keys():
    f = jaxfn.autograd_function(lambda ctx, x, v: x * math.copysign(1.0, v), _no_backward, name="nan_sign")
    for _ in range(ROUNDS):
        np.testing.assert_allclose(f(jnp.ones(1), float("nan")), [1.0])
        np.testing.assert_allclose(f(jnp.ones(1), -float("nan")), [-1.0])


class _BaseSettings:
    k = 2.0


class _Settings(_BaseSettings):
    pass


deep = types.ModuleType("user_deep_settings")
deep.model = types.ModuleType("user_deep_settings.model")
deep.model.layer = types.ModuleType("user_deep_settings.model.layer")
deep.model.layer.scale = 2.0
SCALES = {"G": 2.0}


@pytest.mark.parametrize(
    "forward, rebind, restore",
    [
        (
            lambda ctx, x: x * _Settings.k,
            lambda: setattr(_BaseSettings, "k", 5.0),
            lambda: setattr(_BaseSettings, "k", 2.0),
        ),
        (
            lambda ctx, x: x * deep.model.layer.scale,
            lambda: setattr(deep.model.layer, "scale", 5.0),
            lambda: setattr(deep.model.layer, "scale", 2.0),
        ),
        (
            lambda ctx, x: x * getattr(settings, "scale"),  # noqa: B009 - the point: a read by string
            lambda: setattr(settings, "scale", 5.0),
            lambda: setattr(settings, "scale", 2.0),
        ),
        (
            lambda ctx, x: x * globals()["SCALE"],
            lambda: globals().__setitem__("SCALE", 5.0),
            lambda: globals().__setitem__("SCALE", 2.0),
        ),
    ],
    ids=["inherited class attribute", "attribute three deep", "getattr", "globals()"],
)
def test_reads_through_bases_chains_and_namespaces_follow_the_python(forward, rebind, restore):
    f = jaxfn.autograd_function(forward, _no_backward, name="reads")
    try:
        for _ in range(ROUNDS):
            np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])
        rebind()
        np.testing.assert_allclose(f(jnp.ones(2)), [5.0, 5.0])
    finally:
        restore()


class _Config:
    scale = 2.0

    class Inner:
        k = 2.0


class _Mode(enum.Enum):
    A = "a"


_Mode.A.factor = 2.0
CONFIGS = (_Config,)
stdlib_named = types.ModuleType("tabnanny")  # a user's module that shares a standard module's name
stdlib_named.__file__ = "/home/user/project/tabnanny.py"
stdlib_named.scale = 2.0


def _times_scale(x, cfg):
    return x * cfg.scale


def _late_forward(ctx, x, _):
    try:
        return x * LATE_SCALE  # noqa: F821 - defined by the test, after the compiled copy is made
    except NameError:
        return x * 2.0


@pytest.mark.parametrize(
    "forward, static, rebind, restore",
    [
        (
            lambda ctx, x, cfg: x * cfg.scale,
            _Config,
            lambda: setattr(_Config, "scale", 5.0),
            lambda: setattr(_Config, "scale", 2.0),
        ),
        (
            lambda ctx, x, cfg: _times_scale(x, cfg),
            _Config,
            lambda: setattr(_Config, "scale", 5.0),
            lambda: setattr(_Config, "scale", 2.0),
        ),
        (
            lambda ctx, x, cfg: x * cfg.Inner.k,
            _Config,
            lambda: setattr(_Config.Inner, "k", 5.0),
            lambda: setattr(_Config.Inner, "k", 2.0),
        ),
        (
            lambda ctx, x, mode: x * mode.factor,
            _Mode.A,
            lambda: setattr(_Mode.A, "factor", 5.0),
            lambda: setattr(_Mode.A, "factor", 2.0),
        ),
        (
            lambda ctx, x, _: x * CONFIGS[0].scale,
            None,
            lambda: setattr(_Config, "scale", 5.0),
            lambda: setattr(_Config, "scale", 2.0),
        ),
        (
            lambda ctx, x, _: x * stdlib_named.scale,
            None,
            lambda: setattr(stdlib_named, "scale", 5.0),
            lambda: setattr(stdlib_named, "scale", 2.0),
        ),
        (
            _late_forward,
            None,
            lambda: globals().__setitem__("LATE_SCALE", 5.0),
            lambda: globals().pop("LATE_SCALE"),
        ),
    ],
    ids=[
        "class argument",
        "class argument read by a helper",
        "class inside a class argument",
        "enum member argument",
        "tuple of classes",
        "module with a standard module's name",
        "global defined later",
    ],  # fmt: skip
)
def test_reads_through_static_arguments_and_later_globals_follow_the_python(forward, static, rebind, restore):
    f = jaxfn.autograd_function(forward, _no_backward, name="reads")
    try:
        for _ in range(ROUNDS):
            np.testing.assert_allclose(f(jnp.ones(2), static), [2.0, 2.0])
        rebind()
        for _ in range(ROUNDS):
            np.testing.assert_allclose(f(jnp.ones(2), static), [5.0, 5.0])
    finally:
        restore()


def _rescaled(fn):
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        return fn(ctx, *args)

    return wrapper


@_rescaled
def _decorated_forward(ctx, x, _):
    return x * SCALE


def _scale_helper(x):
    return x * SCALE


class _Named(collections.namedtuple("_Named", "a")):
    k = 2.0


NAMED = _Named(1.0)
_Chain = type("_Chain", (), {"a": type("_A", (), {"b": type("_B", (), {"c": type("_C", (), {"d": 2.0})})})})


@pytest.mark.parametrize(
    "forward, rebind, restore",
    [
        (_decorated_forward, lambda: globals().__setitem__("SCALE", 5.0), lambda: globals().__setitem__("SCALE", 2.0)),
        (
            lambda ctx, x, _: _scale_helper(x),
            lambda: globals().__setitem__("SCALE", 5.0),
            lambda: globals().__setitem__("SCALE", 2.0),
        ),
        (lambda ctx, x, _: x * NAMED.k, lambda: setattr(_Named, "k", 5.0), lambda: setattr(_Named, "k", 2.0)),
        (
            lambda ctx, x, _: x * sys.modules[__name__].SCALE,
            lambda: globals().__setitem__("SCALE", 5.0),
            lambda: globals().__setitem__("SCALE", 2.0),
        ),
        (
            lambda ctx, x, _: x * operator.attrgetter("scale")(settings),
            lambda: setattr(settings, "scale", 5.0),
            lambda: setattr(settings, "scale", 2.0),
        ),
        (
            lambda ctx, x, _: x * abs(-2.0),
            lambda: setattr(builtins, "abs", lambda v: 5.0),
            lambda: setattr(builtins, "abs", _ABS),
        ),
        (
            lambda ctx, x, c: x * c.a.b.c.d,
            lambda: setattr(_Chain.a.b.c, "d", 5.0),
            lambda: setattr(_Chain.a.b.c, "d", 2.0),
        ),
    ],
    ids=[
        "decorated forward",
        "helper's global",
        "namedtuple class attribute",
        "sys.modules",
        "attrgetter",
        "patched builtin",
        "five attributes deep",
    ],  # fmt: skip
)
def test_reads_through_wrappers_helpers_and_namespaces_follow_the_python(forward, rebind, restore):
    f = jaxfn.autograd_function(forward, _no_backward, name="reads")
    try:
        for _ in range(ROUNDS):
            np.testing.assert_allclose(f(jnp.ones(2), _Chain), [2.0, 2.0])
        rebind()
        np.testing.assert_allclose(f(jnp.ones(2), _Chain), [5.0, 5.0])
    finally:
        restore()


_ABS = abs


def test_a_module_imported_inside_forward_is_read_afresh(tmp_path, monkeypatch):
    (tmp_path / "user_config_module.py").write_text("scale = 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def forward(ctx, x):
        import user_config_module

        return x * user_config_module.scale

    f = jaxfn.autograd_function(forward, _no_backward, name="imports")
    for _ in range(ROUNDS):
        np.testing.assert_allclose(f(jnp.ones(2)), [2.0, 2.0])
    sys.modules["user_config_module"].scale = 5.0
    np.testing.assert_allclose(f(jnp.ones(2)), [5.0, 5.0])
    monkeypatch.delitem(sys.modules, "user_config_module")


def test_jax_settings_are_part_of_the_key():
    f = jaxfn.autograd_function(lambda ctx, x, y: x + y, _no_backward, name="promotes")
    x, y = jnp.ones(3), jnp.ones((2, 3))
    for _ in range(ROUNDS):
        assert f(x, y).shape == (2, 3)
    with jax.numpy_rank_promotion("raise"):  # as forward's Python would: refused
        with pytest.raises(ValueError, match="could not be broadcast"):
            f(x, y)
    with jax.numpy_dtype_promotion("strict"):
        with pytest.raises(Exception, match="no available implicit dtype promotion path"):  # noqa: PT011
            f(x, jnp.ones(3, jnp.int32))


def test_record_dtypes_with_different_fields_are_different_keys():
    def forward(ctx, x, dtype):
        return x * len(dtype.names[0])

    f = jaxfn.autograd_function(forward, _no_backward, name="records")
    for _ in range(ROUNDS):
        np.testing.assert_allclose(f(jnp.ones(1), np.dtype([("a", "<f4")])), [1.0])
        np.testing.assert_allclose(f(jnp.ones(1), np.dtype([("bb", "<f4")])), [2.0])


class _Bits(enum.IntFlag):
    A = 1


@pytest.mark.parametrize(
    "first, second, read",
    [
        (_Bits(4), _Bits(8), int),  # unnamed members of a flag: name None for both
        (np.dtype(("f8", (2,))), np.dtype(("f4", (4,))), lambda d: d.shape[0]),  # both print as |V16
        (np.dtype("f4", metadata={"s": 2}), np.dtype("f4", metadata={"s": 3}), lambda d: d.metadata["s"]),
    ],
    ids=["flag values", "subarray dtypes", "dtype metadata"],
)
def test_static_values_that_look_alike_get_their_own_result(first, second, read):
    f = jaxfn.autograd_function(lambda ctx, x, v: x * read(v), _no_backward, name="alike")
    for _ in range(ROUNDS):
        np.testing.assert_allclose(f(jnp.ones(1), first), [read(first)])
        np.testing.assert_allclose(f(jnp.ones(1), second), [read(second)])
