"""The README can't go stale: its Python blocks run, in order, as a reader would, with nothing else.

Blocks share one namespace, which starts empty: each block imports and makes what it uses (the
manual's pages are checked the same way by ``tests/test_docs.py``). The README stays short (at most
200 lines), and its Quickstart gives the two commands the guide promises.
"""

import re
from pathlib import Path

import jaxfn

README = Path(__file__).resolve().parent.parent / "README.md"


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


def test_readme_blocks_run():
    blocks = _blocks()
    assert len(blocks) >= 1
    namespace = {"__name__": "readme"}
    for number, (heading, code) in enumerate(blocks):
        try:
            exec(compile(code, f"README.md block {number} ({heading})", "exec"), namespace)
        except Exception as err:  # noqa: BLE001 - name the block that broke
            raise AssertionError(f"README block {number} under {heading!r} failed: {err!r}\n{code}") from err
    assert isinstance(namespace["linear"], jaxfn.AutogradFunction)


def test_the_readme_fits_on_a_screen_or_two():
    assert len(README.read_text().splitlines()) <= 200


def test_the_quickstart_commands_are_the_two_the_guide_promises():
    quickstart = README.read_text().split("## Quickstart")[1].split("\n## ")[0]
    commands = re.findall(r"```bash\n(.*?)\n```", quickstart, re.S)
    assert commands == [
        "python3 -m venv .venv && .venv/bin/pip install -e '.[examples]' && .venv/bin/python examples/two_layer_net.py",
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest -n 2",
    ]
