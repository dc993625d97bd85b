"""Gradient reversal (domain-adversarial training, Ganin & Lempitsky 2015): identity forward, ``-lambda * g`` back.

``reverse_gradient(x, lambda_)`` sits between a feature extractor and a domain classifier: the
classifier learns to tell the domains apart while the features receive the *reversed* gradient,
so they learn to hide the domain. ``lambda_`` is a static argument (a Python number), kept as is
under ``jit`` and ``vmap``; a new value retraces, so pass an array if it changes every step.

    python examples/gallery/gradient_reversal.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _gallery import Parser, machine, markdown_table

import jaxfn


# --8<-- [start:function]
def _forward(ctx, x, lambda_=1.0):
    ctx.save_for_backward(lambda_=lambda_)  # a static value: kept as is, not a residual
    return x


def _backward(ctx, grad_output):
    return {"x": -ctx.saved_variables.lambda_ * grad_output}


reverse_gradient = jaxfn.autograd_function(_forward, _backward, name="reverse_gradient")
# --8<-- [end:function]


def transform_rows(lambda_):
    """d/dx vdot(reverse_gradient(x, lambda_), c) = -lambda_ * c, under each transform; and the forward."""
    x, c = jnp.array([1.0, 2.0, 3.0], jnp.float32), jnp.array([1.0, 2.0, 3.0], jnp.float32)
    xs, cs = jnp.stack([x, 2 * x]), jnp.stack([c, -c])
    grad = jax.grad(lambda x, c: jnp.vdot(reverse_gradient(x, lambda_), c))
    cases = {  # name: (what it computes, what it should give)
        "eager `jax.grad`": (lambda: grad(x, c), -lambda_ * c),
        "`jax.jit(jax.grad)`": (lambda: jax.jit(grad)(x, c), -lambda_ * c),
        "`jax.vmap(jax.grad)`, 2 examples": (lambda: jax.vmap(grad)(xs, cs), -lambda_ * cs),
        "`jax.jit(jax.vmap(jax.grad))`": (lambda: jax.jit(jax.vmap(grad))(xs, cs), -lambda_ * cs),
        "`jax.vmap` forward": (lambda: jax.vmap(lambda x: reverse_gradient(x, lambda_))(xs), xs),
    }
    rows = []
    for name, (case, want) in cases.items():
        got = case()
        rows.append([name, _show(got), _show(want), bool(jnp.allclose(got, want))])
    return rows


def _show(array):
    return str(jnp.asarray(array).tolist())


def _task_loss(features, head, label):
    return jnp.mean((features @ head - label) ** 2)


def _domain_loss(features, domain_head, domain):
    logits = features @ domain_head
    return jnp.mean(jnp.logaddexp(0, logits) - domain * logits)


def domain_adversarial_loss(encoder, head, domain_head, x, label, domain, lambda_):
    """The task loss plus the domain loss seen through the gradient reversal layer."""
    features = jnp.tanh(x @ encoder)
    return _task_loss(features, head, label) + _domain_loss(reverse_gradient(features, lambda_), domain_head, domain)


def encoder_gradient_parts(encoder, head, domain_head, x, label, domain):
    """The encoder's gradients from the task loss and from the domain loss, by plain autodiff."""
    task = jax.grad(lambda e: _task_loss(jnp.tanh(x @ e), head, label))(encoder)
    return task, jax.grad(lambda e: _domain_loss(jnp.tanh(x @ e), domain_head, domain))(encoder)


def dann_inputs(samples=16, features=5, hidden=4, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(features, hidden), (hidden,), (hidden,), (samples, features), (samples,)]
    arrays = [rng.standard_normal(shape) for shape in shapes] + [rng.uniform(size=samples) < 0.5]
    return tuple(jnp.asarray(a, np.float32) for a in arrays)


def dann_rows(lambdas):
    """The encoder's gradient through the layer equals task gradient - lambda * domain gradient."""
    args = dann_inputs()
    task, domain = jax.jit(encoder_gradient_parts)(*args)
    rows = []
    for lambda_ in lambdas:
        grad = jax.jit(jax.grad(domain_adversarial_loss), static_argnums=6)(*args, lambda_)
        error = float(jnp.max(jnp.abs(grad - (task - lambda_ * domain))))
        rows.append([lambda_, f"{error:.1e}", f"{float(jnp.max(jnp.abs(grad))):.3f}"])
    return rows


def main(argv=None):
    parser = Parser(__file__, __doc__)
    parser.add_argument("--lambda", dest="lambda_", type=float, default=0.5, help="the reversal's scale, lambda_")
    a = parser.parse_args(argv)
    print(f"{machine()}\n")
    print(f"x = [1, 2, 3], c = [1, 2, 3] (and [2, 4, 6], [-1, -2, -3] batched), lambda_ = {a.lambda_}\n")
    print(markdown_table(["transform", "got", "expected", "equal"], transform_rows(a.lambda_)))
    print("\nDANN encoder gradient under jit vs plain autodiff's task_grad - lambda * domain_grad\n")
    header = ["lambda_", "max abs difference", "max abs gradient"]
    print(markdown_table(header, dann_rows([0.0, a.lambda_, 1.0])))


if __name__ == "__main__":
    main()
