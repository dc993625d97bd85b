"""Gradients that autodiff gets wrong at a point: the norm at the origin and ``x * log(x)`` at 0.

``jnp.sqrt(jnp.sum(x**2))`` has gradient ``x / |x|``, which autodiff evaluates as ``0 / 0 = NaN``
at the origin; ``0`` is the norm's smallest subgradient there. ``x * log(x)`` written safely as
``jnp.where(x > 0, x * jnp.log(x), 0)`` still gets a NaN gradient at 0 (the untaken branch's
``0 * -inf``). Its true one-sided derivative at 0 is ``-inf``; the backward here returns the
derivative at the smallest normal float (``log(tiny) + 1``), which is exact for every ``x >= tiny``
and finite at 0. A group-lasso regression started at zero shows what the NaN does to training:

    python examples/gallery/nan_free_gradients.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _gallery import Parser, machine, markdown_table, positive_int
from jax.scipy.special import entr, xlogy

import jaxfn


# --8<-- [start:function]
def _norm_forward(ctx, x):
    norm = jnp.sqrt(jnp.sum(x**2))
    ctx.save_for_backward(x=x, norm=norm)
    return norm


def _norm_backward(ctx, grad_output):
    saved = ctx.saved_variables
    safe = jnp.where(saved.norm > 0, saved.norm, 1)
    return grad_output * jnp.where(saved.norm > 0, saved.x / safe, 0)  # 0: the minimal subgradient


safe_norm = jaxfn.autograd_function(_norm_forward, _norm_backward, name="safe_norm")


def _xlogx_forward(ctx, x):
    ctx.save_for_backward(x=x)
    return jnp.where(x > 0, x * jnp.log(jnp.where(x > 0, x, 1)), 0)


def _xlogx_backward(ctx, grad_output):
    x = ctx.saved_variables.x
    return grad_output * (jnp.log(jnp.maximum(x, jnp.finfo(x.dtype).tiny)) + 1)


xlogx = jaxfn.autograd_function(_xlogx_forward, _xlogx_backward, name="xlogx")
# --8<-- [end:function]


def plain_norm(x):
    return jnp.sqrt(jnp.sum(x**2))


def plain_xlogx(x):
    return jnp.where(x > 0, x * jnp.log(x), 0)


def gradient_rows():
    """Gradients at the bad point and at an ordinary one, plain autodiff beside jaxfn."""
    zero, point = jnp.zeros(2, jnp.float32), jnp.array([3.0, 4.0], jnp.float32)
    half = jnp.float32(0.5)
    rows = []
    for label, f, x in [
        ("`jnp.sqrt(jnp.sum(x**2))`", plain_norm, zero),
        ("`jnp.linalg.norm(x)`", jnp.linalg.norm, zero),
        ("jaxfn `safe_norm`", safe_norm, zero),
        ("`jnp.sqrt(jnp.sum(x**2))`", plain_norm, point),
        ("jaxfn `safe_norm`", safe_norm, point),
        ("`jnp.where(x > 0, x * jnp.log(x), 0)`", plain_xlogx, jnp.float32(0)),
        ("`jax.scipy.special.xlogy(x, x)`", lambda x: xlogy(x, x), jnp.float32(0)),
        ("`-jax.scipy.special.entr(x)`", lambda x: -entr(x), jnp.float32(0)),
        ("jaxfn `xlogx`", xlogx, jnp.float32(0)),
        ("`jnp.where(x > 0, x * jnp.log(x), 0)`", plain_xlogx, half),
        ("jaxfn `xlogx`", xlogx, half),
    ]:
        rows.append([label, _show(x), _show(f(x)), _show(jax.grad(f)(x))])
    return rows


def _show(value):
    text = ", ".join(f"{float(v):.4g}" for v in jnp.ravel(value))
    return f"[{text}]" if jnp.ndim(value) else text


def regression_data(samples=64, groups=8, size=4, seed=0):
    """A regression whose true weights are zero in half of the groups (what group lasso is for)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, groups * size))
    true_weight = rng.standard_normal(groups * size) * np.repeat(np.arange(groups) % 2 == 0, size)
    y = x @ true_weight + 0.1 * rng.standard_normal(samples)
    return jnp.asarray(x, np.float32), jnp.asarray(y, np.float32)


def group_lasso_loss(norm, groups=8, penalty=0.1):
    def loss(weight, x, y):
        per_group = jax.vmap(norm)(weight.reshape(groups, -1))
        return jnp.mean((x @ weight - y) ** 2) + penalty * jnp.sum(per_group)

    return loss


def train(norm, steps=200, learning_rate=0.05):
    """Gradient descent from zero weights (the usual start); the loss after every step."""
    x, y = regression_data()
    loss = group_lasso_loss(norm)

    def step(weight, _):
        value, grad = jax.value_and_grad(loss)(weight, x, y)
        return weight - learning_rate * grad, value

    _, losses = jax.lax.scan(step, jnp.zeros(x.shape[1], jnp.float32), None, length=steps)
    return losses


def main(argv=None):
    parser = Parser(__file__, __doc__)
    parser.add_argument("--steps", type=positive_int, default=200, help="gradient-descent steps of the regression")
    a = parser.parse_args(argv)
    print(f"{machine()}\n")
    print(markdown_table(["function", "x", "f(x)", "jax.grad(f)(x)"], gradient_rows()))
    curves = {"plain autodiff": jax.jit(train, static_argnums=(0, 1))(plain_norm, a.steps)}
    curves["jaxfn safe_norm"] = jax.jit(train, static_argnums=(0, 1))(safe_norm, a.steps)
    marks = sorted({0, 1, 10, a.steps // 2, a.steps - 1})
    rows = [[name] + [f"{float(curve[i]):.4f}" for i in marks] for name, curve in curves.items()]
    print(f"\ngroup-lasso regression from zero weights, loss before step (of {a.steps}):\n")
    print(markdown_table(["norm"] + [str(i) for i in marks], rows))


if __name__ == "__main__":
    main()
