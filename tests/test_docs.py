"""The documentation site can't go stale: every page's Python runs as written, as a reader would.

Each page of ``docs/`` (``docs/**/*.md``) is read as it is: its ```python blocks run in order, in
one namespace per page that starts empty, so every page defines what it uses (imports, arrays).
Blocks that are not Python (shell commands, a SLURM script, R code, printed output) are fenced as
```bash, ```r or plain ```; no block may hide from this test under another Python tag. The
"Inside Equinox, Flax NNX and Optax" page is skipped when those optional packages are absent (the
test extra installs them), and so is the page of host functions without SciPy.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NEEDS = {"ecosystem.md": ("equinox", "flax", "optax"), "host.md": ("scipy",)}
LANGUAGES = {"python", "bash", "r", ""}  # the fences a page may use


def _pages():
    return sorted(DOCS.rglob("*.md"))


def _fences(path):
    """(language, first line number, code) of each fenced block, in order."""
    found, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        match = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if match:
            indent, language = match.groups()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            body = [line[len(indent) :] for line in lines[i + 1 : end]]
            found.append((language, indent, i + 2, "\n".join(body)))
            i = end
        i += 1
    return found


def _python_pages():
    return [p for p in _pages() if any(lang == "python" for lang, *_ in _fences(p))]


def _id(path):
    return str(path.relative_to(DOCS))


def test_the_site_has_its_pages_and_their_code():
    names = {_id(p) for p in _pages()}
    for page in (
        "index.md",
        "porting-r.md",
        "porting-pytorch.md",
        "forward-mode.md",
        "gradcheck.md",
        "host.md",
        "ecosystem.md",
        "multi-process.md",
        "performance.md",
        "faq.md",
        "gallery/index.md",
        "gallery/linear-cross-entropy.md",
        "api/autograd_function.md",
    ):
        assert page in names
    assert len(_python_pages()) >= 9


@pytest.mark.parametrize("path", _pages(), ids=_id)
def test_every_block_is_fenced_as_python_or_as_not_python(path):
    for language, indent, line, _ in _fences(path):
        assert language in LANGUAGES, f"{_id(path)}:{line}: a ```{language} block (use python, bash, r or plain)"
        if language == "python":
            assert not indent, f"{_id(path)}:{line}: an indented python block (this test runs top-level ones)"


@pytest.mark.parametrize("path", _python_pages(), ids=_id)
def test_every_python_block_of_the_page_runs_in_order(path):
    for package in NEEDS.get(_id(path), ()):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed")
    namespace = {"__name__": "docs_page"}
    blocks = [(line, code) for language, _, line, code in _fences(path) if language == "python"]
    for number, (line, code) in enumerate(blocks):
        try:
            exec(compile(code, f"docs/{_id(path)}:{line}", "exec"), namespace)
        except Exception as err:  # noqa: BLE001 - name the block that broke
            raise AssertionError(f"docs/{_id(path)} block {number} (line {line}) failed: {err!r}\n{code}") from err


def build_site(site_dir: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of this checkout into ``site_dir`` (bounded in time)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strictly(tmp_path):
    """No broken link, missing anchor, page left out of the navigation or unresolved API name."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs or mkdocstrings is not installed (pip install -e '.[docs]')")
    done = build_site(tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "api" / "autograd_function" / "index.html").is_file()
