"""A black box's gradient by ``backward="finite_differences"`` against ``scipy.optimize.approx_fprime``.

The same NumPy/SciPy function, differentiated two ways: jaxfn's ``jax.jit(jax.grad(f))`` of
``autograd_function(forward, "finite_differences", host=True)`` (central differences, in one
host call), and ``scipy.optimize.approx_fprime`` (forward differences, SciPy's default step
``sqrt(eps)``). Per gradient: how many times the function ran, how many host calls JAX made
(``jax.pure_callback`` callbacks), the time (median of repeats, after a first call that compiles
and probes), and the largest error against the analytic gradient, relative to its largest entry:

    python benchmarks/finite_differences.py                 # the markdown table
    python benchmarks/finite_differences.py --sizes 10      # n = 10 only

The functions: SciPy's Rosenbrock (``scipy.optimize.rosen``, microseconds a run: the overhead per
run shows), and the end value of a linear ODE ``y' = -(diag(k) + C) y`` solved by
``scipy.integrate.solve_ivp`` (DOP853, rtol 1e-10; milliseconds a run: the runs dominate),
differentiated with respect to the n rates ``k``, whose analytic gradient comes from
``jax.scipy.linalg.expm``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy
import scipy.integrate
import scipy.optimize

import jaxfn

jax.config.update("jax_enable_x64", True)


class Counted:
    """A NumPy function of one vector, counting its runs."""

    def __init__(self, function):
        self.function, self.runs = function, 0

    def __call__(self, x):
        self.runs += 1
        return self.function(x)


def rosenbrock(n: int):
    x = np.linspace(-1.2, 1.4, n)
    return Counted(scipy.optimize.rosen), x, scipy.optimize.rosen_der(x), 30


def ode(n: int, t_end: float = 1.0):
    rng = np.random.default_rng(0)
    coupling = rng.standard_normal((n, n)) * 0.1 / np.sqrt(n)
    y0, weights = rng.standard_normal(n), rng.standard_normal(n)

    def end_value(k):
        matrix = -(np.diag(k) + coupling)
        solved = scipy.integrate.solve_ivp(
            lambda t, y: matrix @ y, (0.0, t_end), y0, method="DOP853", rtol=1e-10, atol=1e-12
        )
        return float(weights @ solved.y[:, -1])

    def closed_form(k):
        return weights @ jax.scipy.linalg.expm(-(jnp.diag(k) + coupling) * t_end) @ y0

    k = np.linspace(0.5, 2.0, n)
    return Counted(end_value), k, np.asarray(jax.grad(closed_form)(jnp.asarray(k))), 3


class HostCalls:
    """Counts the callbacks ``jax.pure_callback`` runs (wraps it while the benchmark runs)."""

    def __init__(self):
        self.count = 0
        self._original = jax.pure_callback

        def counting(callback, *args, **kwargs):
            def counted(*arrays):
                self.count += 1
                return callback(*arrays)

            return self._original(counted, *args, **kwargs)

        jax.pure_callback = counting


def _per_gradient(gradient, function: Counted, calls: HostCalls, repeats: int) -> tuple[float, int, int, np.ndarray]:
    """Median seconds, runs and host calls of one gradient, after a first call."""
    value = np.asarray(gradient())
    times = []
    for _ in range(repeats):
        function.runs, calls.count = 0, 0
        start = time.perf_counter()
        value = np.asarray(gradient())
        times.append(time.perf_counter() - start)
    return statistics.median(times), function.runs, calls.count, value


def compare(make, n: int, calls: HostCalls) -> list[tuple]:
    """The two rows of one function and size: jaxfn's and approx_fprime's."""
    function, x, exact, repeats = make(n)
    black_box = jaxfn.autograd_function(
        lambda ctx, x: np.asarray(function(x)), "finite_differences", host=True, name=make.__name__
    )
    grad, xj = jax.jit(jax.grad(black_box)), jnp.asarray(x)
    start = time.perf_counter()
    grad(xj).block_until_ready()  # compiles, and probes forward once
    first = time.perf_counter() - start
    ours = _per_gradient(lambda: grad(xj).block_until_ready(), function, calls, repeats)
    theirs = _per_gradient(lambda: scipy.optimize.approx_fprime(x, function), function, calls, repeats)
    scale = np.max(np.abs(exact))
    return [
        (make.__name__, n, method, runs, host, seconds * 1e3, np.max(np.abs(value - exact)) / scale, note)
        for method, (seconds, runs, host, value), note in (
            ('jaxfn `"finite_differences"`, `jit(grad)`', ours, f"{first * 1e3:.0f} ms"),
            ("`scipy.optimize.approx_fprime`", theirs, "-"),
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100])
    sizes = parser.parse_args().sizes
    print(
        f"Python {platform.python_version()}, jax {jax.__version__}, scipy {scipy.__version__}, "
        f"numpy {np.__version__}, {platform.machine()}, float64\n"
    )
    print("| function | n | gradient by | runs of f | host calls | time per gradient | error | first call |")
    print("|---|---|---|---|---|---|---|---|")
    calls = HostCalls()
    table = [row for make in (rosenbrock, ode) for n in sizes for row in compare(make, n, calls)]
    for name, n, method, runs, host, ms, error, first in table:
        print(f"| {name} | {n} | {method} | {runs} | {host} | {ms:.2f} ms | {error:.1e} | {first} |")


if __name__ == "__main__":
    main()
