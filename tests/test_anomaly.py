"""jaxfn.detect_anomaly: the function, output or parameter, first bad index and pass that made a
NaN/Inf, eagerly and under jit, scan and vmap; off, the compiled program is unchanged."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn


def _sqrt_forward(ctx, x):
    ctx.save_for_backward(x)
    return jnp.sqrt(x)


sqrt = jaxfn.autograd_function(_sqrt_forward, lambda ctx, g: g / (2 * jnp.sqrt(ctx.saved_tensors[0])), name="sqrt")
log = jaxfn.autograd_function(
    lambda ctx, x: (ctx.save_for_backward(x), jnp.log(x))[1], lambda ctx, g: g / ctx.saved_tensors[0], name="log"
)
scale = jaxfn.autograd_function(
    lambda ctx, params, x: (ctx.save_for_backward(x=x, w=params["w"]), x * params["w"])[1],
    lambda ctx, g: {"params": {"w": g * ctx.saved_variables.x}, "x": g * ctx.saved_variables.w},
    name="scale",
)


def net(params, x):
    return log(scale(params, sqrt(x)) + 1.0).sum()


PARAMS = {"w": jnp.array([1.0, 2.0, 3.0])}
GOOD = jnp.array([1.0, 4.0, 9.0])
ZERO_AT_1 = jnp.array([1.0, 0.0, 9.0])  # sqrt's backward: inf at index 1
NEGATIVE_AT_2 = jnp.array([1.0, 4.0, -9.0])  # sqrt's forward: nan at index 2

BACKWARD = r"'sqrt': backward returned a non-finite gradient for 'x' \(inf at index \(1,\)\)"
FORWARD = r"'sqrt': forward returned a non-finite value in its output \(nan at index \(2,\)\)"


@pytest.mark.parametrize(
    "transform",
    [lambda f: f, jax.jit],
    ids=["eager", "jit"],
)
@pytest.mark.parametrize("x, message", [(ZERO_AT_1, BACKWARD), (NEGATIVE_AT_2, FORWARD)], ids=["backward", "forward"])
def test_names_the_function_output_or_parameter_and_index(transform, x, message):
    grad = transform(jax.grad(net, argnums=1))
    np.testing.assert_array_equal(np.isfinite(grad(PARAMS, x)), np.isfinite(grad(PARAMS, x)))  # off: no error
    with pytest.raises(jaxfn.AutogradFunctionError, match=message):
        with jaxfn.detect_anomaly():
            jax.block_until_ready(grad(PARAMS, x))


def test_under_scan_and_vmap():
    xs = jnp.stack([GOOD, ZERO_AT_1])

    def scanned(params, xs):
        return jax.lax.scan(lambda c, x: (c + net(params, x), None), 0.0, xs)[0]

    for f in (jax.jit(jax.grad(scanned, argnums=1)), jax.jit(jax.vmap(jax.grad(net, argnums=1), in_axes=(None, 0)))):
        with pytest.raises(jaxfn.AutogradFunctionError, match=BACKWARD):
            with jaxfn.detect_anomaly():
                jax.block_until_ready(f(PARAMS, xs))


def test_a_pytree_parameter_and_a_dict_output():
    buggy = jaxfn.autograd_function(  # its gradient for w divides by (x - 2): inf where x is 2
        lambda ctx, params, x: (ctx.save_for_backward(x=x), x * params["w"])[1],
        lambda ctx, g: {"params": {"w": g * ctx.saved_variables.x / (ctx.saved_variables.x - 2)}},
        name="scale",
    )
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'scale': backward returned a non-finite gradient for "
        r"'params\['w'\]' \(inf at index \(1,\)\)",
    ):
        with jaxfn.detect_anomaly():
            jax.grad(lambda p: buggy(p, jnp.array([1.0, 2.0, 3.0])).sum())(PARAMS)
    both = jaxfn.autograd_function(lambda ctx, x: {"a": x, "b": jnp.log(x)}, lambda ctx, g: g["a"], name="both")
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'both': forward returned a non-finite value in "
        r"output\['b'\] \(-inf at index \(0,\)\)",
    ):
        with jaxfn.detect_anomaly():
            both(jnp.array([0.0, 1.0]))


def test_off_the_compiled_program_is_unchanged_and_on_it_is_traced_again():
    grad = jax.jit(jax.grad(net, argnums=1))
    before = grad.lower(PARAMS, GOOD).as_text()
    with jaxfn.detect_anomaly():
        during = grad.lower(PARAMS, GOOD).as_text()
        jax.block_until_ready(grad(PARAMS, GOOD))  # finite: no error
    after = grad.lower(PARAMS, GOOD).as_text()
    assert before == after and "callback" not in before
    assert during != before and "callback" in during


def test_set_detect_anomaly_for_a_whole_program():
    grad = jax.jit(jax.grad(net, argnums=1))
    np.testing.assert_array_equal(np.isinf(grad(PARAMS, ZERO_AT_1)), [False, True, False])  # traced with it off
    jaxfn.set_detect_anomaly(True)
    try:
        with pytest.raises(jax.errors.JaxRuntimeError, match=BACKWARD):  # JAX's error, jaxfn's words inside
            jax.block_until_ready(grad(PARAMS, ZERO_AT_1))
        with pytest.raises(jaxfn.AutogradFunctionError, match=BACKWARD):  # eagerly: jaxfn's own error
            jax.grad(net, argnums=1)(PARAMS, ZERO_AT_1)
    finally:
        jaxfn.set_detect_anomaly(False)
    assert np.isinf(grad(PARAMS, ZERO_AT_1)[1])


def test_host_functions_are_checked_too():
    def forward(ctx, x):
        ctx.save_for_backward(x=x)
        with np.errstate(divide="ignore"):
            return np.log(x)

    host_log = jaxfn.autograd_function(forward, lambda ctx, g: g / ctx.saved_variables.x, host=True, name="host_log")
    for call in (host_log, jax.jit(host_log)):
        with pytest.raises(
            jaxfn.AutogradFunctionError,
            match=r"'host_log': forward returned a non-finite value in "
            r"its output \(-inf at index \(1,\)\)",
        ):
            with jaxfn.detect_anomaly():
                jax.block_until_ready(call(jnp.array([1.0, 0.0])))

    def sqrt_backward(ctx, g):
        with np.errstate(divide="ignore"):
            return g / (2 * np.sqrt(ctx.saved_variables.x))

    host_sqrt = jaxfn.autograd_function(
        lambda ctx, x: (ctx.save_for_backward(x=x), np.sqrt(x))[1], sqrt_backward, host=True, name="host_sqrt"
    )
    backward = r"'host_sqrt': backward returned a non-finite gradient for 'x' \(inf at index \(0,\)\)"
    with pytest.raises(jaxfn.AutogradFunctionError, match=backward):
        with jaxfn.detect_anomaly():
            jax.block_until_ready(jax.jit(jax.grad(lambda x: host_sqrt(x).sum()))(jnp.array([0.0, 1.0])))


@pytest.mark.parametrize(
    "x, what",
    [
        (jnp.array([1.0, jnp.inf], jnp.bfloat16), r"inf at index \(1,\)"),
        (jnp.array([1 + 1j, jnp.nan]), r"nan at index \(1,\)"),
        (jnp.float32(jnp.nan), r"nan at index \(\)"),
        (jnp.zeros((0, 3)), None),
    ],
    ids=["bfloat16", "complex", "scalar", "empty"],
)
def test_dtypes_scalars_and_empty_arrays(x, what):
    double = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 2, name="double")
    for call in (double, jax.jit(double)):
        if what is None:
            with jaxfn.detect_anomaly():
                assert jax.block_until_ready(call(x)).shape == x.shape
            continue
        with pytest.raises(
            jaxfn.AutogradFunctionError,
            match=r"'double': forward returned a non-finite value in its "
            r"output \(" + what,
        ):
            with jaxfn.detect_anomaly():
                jax.block_until_ready(call(x))


def test_the_environment_switch_turns_it_on_for_the_whole_program():
    code = (
        "import jax, jax.numpy as jnp, jaxfn\n"
        "f = jaxfn.autograd_function(lambda ctx, x: jnp.log(x), lambda ctx, g: g, name='log')\n"
        "try:\n"
        "    f(jnp.array([0.0]))\n"
        "except jaxfn.AutogradFunctionError as err:\n"
        "    print(str(err).split(';')[0])\n"
    )
    env = {**os.environ, "JAXFN_DETECT_ANOMALY": "1", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "jaxfn: 'log': forward returned a non-finite value in its output (-inf at index (0,))"


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_grad_output_already_non_finite_is_blamed_on_what_comes_after(transform):
    double = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 2, name="double")
    grad = transform(jax.grad(lambda x: jnp.log(double(x) * 0).sum()))  # log(0): nan on the way back
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"^jaxfn: 'double': grad_output was already nan \(at index \(0,\)\) when it reached backward, so "
        r"the non-finite value comes from after this function",
    ):
        with jaxfn.detect_anomaly():  # under jit: the error leaving the block is jaxfn's own
            jax.block_until_ready(grad(jnp.ones(2)))


def test_a_grad_output_already_non_finite_is_blamed_on_what_comes_after_with_finite_differences():
    """The grad_output check runs on every builder's backward, finite differences' too (it was
    never run there: the non-finite value was reported as backward's)."""
    double = jaxfn.autograd_function(lambda ctx, x: np.asarray(x) * 2, "finite_differences", host=True, name="double")
    grad = jax.grad(lambda x: jnp.log(double(x) * 0).sum())  # log(0): nan on the way back
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"^jaxfn: 'double': grad_output was already nan"):
        with jaxfn.detect_anomaly():
            jax.block_until_ready(grad(jnp.ones(2)))
