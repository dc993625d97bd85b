"""Gradient clipping inside the graph: clip each example's cotangent at a layer to a maximum norm.

``clip_gradient(x, max_norm)`` is the identity going forward; going back it rescales each row
(example) of the incoming cotangent to norm at most ``max_norm``, so one outlier cannot dominate
the update of everything before the layer. That backward is deliberately *not linear* in
``grad_output`` (``backward(2 g) != 2 backward(g)`` once clipping is active). Forward mode needs
the transpose of a linear backward, so this function belongs in the default (reverse-only)
mode; ``forward_mode=True`` refuses it with an error, shown below:

    python examples/gallery/gradient_clipping.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _gallery import Parser, machine, markdown_table, positive_float

import jaxfn


# --8<-- [start:function]
def _forward(ctx, x, max_norm=1.0):
    ctx.save_for_backward(max_norm=max_norm)
    return x


def clip_rows(grad_output, max_norm):
    """Each row of ``grad_output`` rescaled to norm at most ``max_norm`` (rows within it unchanged)."""
    norms = jnp.sqrt(jnp.sum(grad_output**2, axis=-1, keepdims=True))
    return grad_output * (max_norm / jnp.maximum(norms, max_norm))


def _backward(ctx, grad_output):
    return {"x": clip_rows(grad_output, ctx.saved_variables.max_norm)}


clip_gradient = jaxfn.autograd_function(_forward, _backward, name="clip_gradient")
clip_gradient_forward_mode = jaxfn.autograd_function(_forward, _backward, name="clip_gradient", forward_mode=True)
# --8<-- [end:function]


def regression(samples=6, features=4, outliers=(1, 4), seed=0):
    """Inputs, weights and targets where a few targets are 100x off (the outliers)."""
    rng = np.random.default_rng(seed)
    x, weight = rng.standard_normal((samples, features)), rng.standard_normal((features, features))
    y = rng.standard_normal((samples, features))
    y[list(outliers)] *= 100
    return tuple(jnp.asarray(a, np.float32) for a in (x, weight, y))


def loss(layer, x, weight, y):
    """Squared error of a linear layer applied after ``layer`` (the clip sits on its input)."""
    return 0.5 * jnp.sum((layer(x) @ weight - y) ** 2)


def norm_rows(max_norm):
    """Per-example cotangent norms arriving at the layer (plain) and passed on by clip_gradient."""
    x, weight, y = regression()
    plain = jax.jit(jax.grad(loss, argnums=1), static_argnums=0)(lambda x: x, x, weight, y)
    clipped = jax.jit(jax.grad(loss, argnums=1), static_argnums=0)(lambda x: clip_gradient(x, max_norm), x, weight, y)
    norms = lambda g: jnp.sqrt(jnp.sum(g**2, axis=1))
    return [[i, f"{float(a):.2f}", f"{float(b):.2f}"] for i, (a, b) in enumerate(zip(norms(plain), norms(clipped)))]


def nonlinearity(max_norm):
    """max |backward(2 g) - 2 backward(g)| for a cotangent g with some rows past max_norm."""
    x, weight, y = regression()
    _, pullback = jax.vjp(lambda x: clip_gradient(x, max_norm), x)
    g = jax.grad(loss, argnums=1)(lambda x: x, x, weight, y)
    return float(jnp.max(jnp.abs(pullback(2 * g)[0] - 2 * pullback(g)[0])))


def forward_mode_errors(max_norm):
    """What ``jax.jvp`` and ``jax.grad`` say to each mode of the function (the messages, or 'no error')."""
    x, weight, y = regression()
    cases = {
        "jax.jvp, default mode": lambda: jax.jvp(lambda x: clip_gradient(x, max_norm), (x,), (x,)),
        "jax.jvp, forward_mode=True": lambda: jax.jvp(lambda x: clip_gradient_forward_mode(x, max_norm), (x,), (x,)),
        "jax.grad, forward_mode=True": lambda: jax.grad(loss, argnums=1)(
            lambda x: clip_gradient_forward_mode(x, max_norm), x, weight, y
        ),
    }
    messages = {}
    for name, case in cases.items():
        try:
            case()
            messages[name] = "no error"
        except jaxfn.AutogradFunctionError as error:
            messages[name] = f"{type(error).__name__}: {error}"
    return messages


def main(argv=None):
    parser = Parser(__file__, __doc__)
    parser.add_argument(
        "--max-norm", type=positive_float, default=25.0, help="largest norm of an example's cotangent passed on"
    )
    a = parser.parse_args(argv)
    print(f"{machine()}\n")
    print(f"per-example cotangent norms at the layer, max_norm = {a.max_norm} (examples 1 and 4 have 100x targets)\n")
    print(markdown_table(["example", "arriving (plain autodiff)", "passed on by clip_gradient"], norm_rows(a.max_norm)))
    print(f"\nnot linear: max |backward(2 g) - 2 backward(g)| = {nonlinearity(a.max_norm):.3f}\n")
    for name, message in forward_mode_errors(a.max_norm).items():
        print(f"{name}:\n    {message}\n")


if __name__ == "__main__":
    main()
