"""The manual can't go stale: every Python block of README.md runs, in order, as a reader would.

Blocks share one namespace, which starts with the example arrays a reader has at hand (``x``,
``w``, ``b`` for the seeds' ``linear``, and tangents ``dx``, ``dw``, ``db``). The blocks of the
"Inside Equinox, Flax NNX and Optax" section form a program of their own, skipped when those
optional packages are absent.
"""

import importlib.util
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn

README = Path(__file__).resolve().parent.parent / "README.md"
ECOSYSTEM = "### Inside Equinox, Flax NNX and Optax"


def _blocks():
    """(section heading, code) for each ```python block, in order."""
    heading, found = "", []
    lines = README.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("#"):
            heading = lines[i]
        if lines[i].strip() == "```python":
            j = lines.index("```", i + 1)
            found.append((heading, "\n".join(lines[i + 1 : j])))
            i = j
        i += 1
    return found


def _prelude():
    keys = jax.random.split(jax.random.key(0), 6)
    x, w, b = (jax.random.normal(k, s) for k, s in zip(keys[:3], [(4, 3), (2, 3), (2,)]))
    dx, dw, db = (jax.random.normal(k, s) for k, s in zip(keys[3:], [(4, 3), (2, 3), (2,)]))
    return {"jax": jax, "jnp": jnp, "np": np, "jaxfn": jaxfn, "x": x, "w": w, "b": b, "dx": dx, "dw": dw, "db": db}


def _run(blocks):
    namespace = _prelude()
    for number, (heading, code) in enumerate(blocks):
        try:
            exec(compile(code, f"README.md block {number} ({heading})", "exec"), namespace)
        except Exception as err:  # noqa: BLE001 - name the block that broke
            raise AssertionError(f"README block {number} under {heading!r} failed: {err!r}\n{code}") from err
    return namespace


def test_readme_blocks_run():
    blocks = [(h, c) for h, c in _blocks() if h != ECOSYSTEM]
    assert len(blocks) >= 8
    namespace = _run(blocks)
    assert isinstance(namespace["linear"], jaxfn.AutogradFunction)


def test_readme_ecosystem_blocks_run():
    for package in ("equinox", "flax", "optax"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed")
    blocks = [(h, c) for h, c in _blocks() if h == ECOSYSTEM]
    assert len(blocks) == 3
    _run(blocks)


def test_the_quickstart_commands_are_the_two_the_guide_promises():
    quickstart = README.read_text().split("## Quickstart")[1].split("\n## ")[0]
    commands = re.findall(r"```bash\n(.*?)\n```", quickstart, re.S)
    assert commands == [
        "python3 -m venv .venv && .venv/bin/pip install -e '.[examples]' && .venv/bin/python examples/two_layer_net.py",
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest",
    ]
