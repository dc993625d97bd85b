"""The documentation site can't go stale: every page's Python runs as written, as a reader would.

Each page of ``docs/`` (``docs/**/*.md``) is read as it is: its ```python blocks run in order, in
one namespace per page that starts empty, so every page defines what it uses (imports, arrays).
Blocks that are not Python (shell commands, a SLURM script, R code, printed output) are fenced as
```bash, ```r or plain ```; no block may hide from this test under another Python tag. The
"Inside Equinox, Flax NNX and Optax" page is skipped when those optional packages are absent (the
test extra installs them), and so is the page of host functions without SciPy.

A page may include code from the repository the way the site does (``pymdownx.snippets``, paths from
the repository's root): a line ``--8<-- "examples/gallery/x.py:function"`` in a block stands for
the lines between ``# --8<-- [start:function]`` and ``# --8<-- [end:function]`` in that file, and
the test runs the block with those lines in its place, as the reader sees it.
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
NEEDS = {
    "ecosystem.md": ("equinox", "flax", "optax"),
    "host.md": ("scipy",),
    "from-pytorch.md": ("optax",),
    "porting-pytorch.md": ("torch",),
    "gallery/pytorch-ports.md": ("scipy",),
}
LANGUAGES = {"python", "bash", "r", ""}  # the fences a page may use


SNIPPET = re.compile(r'^(\s*)-{1,}8<-{1,}\s+"([^"]+)"\s*$')  # --8<-- "path" or "path:section"
SECTION = re.compile(r"-{1,}8<-{1,}\s+\[\s*(start|end)\s*:\s*([a-z][-_0-9a-z]*)\s*\]")  # a section marker


def included(spec: str) -> list[str]:
    """The lines ``--8<-- "spec"`` puts in a page: a whole file, or one section of it, without the
    section markers (as pymdownx.snippets does with this site's settings)."""
    path, _, section = spec.partition(":")
    lines = (ROOT / path).read_text().splitlines()
    if section:
        bounds = [i for i, line in enumerate(lines) if (m := SECTION.search(line)) and m.group(2) == section]
        assert len(bounds) == 2, f"{path}: section {section!r} needs one start and one end marker, found {len(bounds)}"
        lines = lines[bounds[0] + 1 : bounds[1]]
    return [line for line in lines if not SECTION.search(line)]


def _page_lines(path):
    """The page's lines with every snippet include replaced by what it includes (indented as the include)."""
    lines = []
    for line in path.read_text().splitlines():
        match = SNIPPET.match(line)
        if match:
            indent, spec = match.groups()
            lines += [indent + text if text else text for text in included(spec)]
        else:
            lines.append(line)
    return lines


def _pages():
    return sorted(DOCS.rglob("*.md"))


def _fences(path):
    """(language, indent, first line number, code) of each fenced block, in order, includes expanded
    (line numbers count the expanded lines)."""
    found, lines, i = [], _page_lines(path), 0
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


# What reStructuredText leaves as literal text once Markdown renders it: a role (:class:`X`) or a
# paragraph ending in "::" that announced a literal block. The API pages render docstrings as
# Markdown (Google style, ```python fences), so neither may appear there.
REST_LEFTOVERS = re.compile(r":(class|func|meth|attr|data|mod|exc|obj):`|::[ \t]*$", re.MULTILINE)
# Methods that carry a context from forward to backward inside jaxfn: public names, not API.
INTERNALS = ("from_residuals", "to_residuals")


def _api_objects():
    """(page, object path, mkdocstrings filters) of every ``::: jaxfn.X`` of docs/api/*.md."""
    import yaml  # mkdocs's dependency

    config = (ROOT / "mkdocs.yml").read_text()
    default = re.search(r"^\s+filters: (\[.*\])\s*$", config, re.MULTILINE)
    default_filters = yaml.safe_load(default.group(1)) if default else ["!^_[^_]"]
    found = []
    for page in sorted((DOCS / "api").glob("*.md")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            match = re.match(r"^::: (jaxfn\.\w+)\s*$", line)
            if not match:
                continue
            block = []
            for following in lines[i + 1 :]:
                if following.strip() and not following.startswith(" "):
                    break
                block.append(following)
            options = (yaml.safe_load("\n".join(block)) or {}).get("options", {}) if block else {}
            found.append((page.name, match.group(1), options.get("filters", default_filters)))
    return found


def _shown(name, filters):
    """Whether mkdocstrings shows a member of this name under these filters ("!regex" hides)."""
    shown = True
    for pattern in filters:
        hide = pattern.startswith("!")
        if re.search(pattern[1:] if hide else pattern, name):
            shown = not hide
    return shown


def test_every_public_parameter_is_documented():
    """Each function, method and class of the API pages documents every parameter of its signature
    in Google style (Args:), and no docstring shown there is reStructuredText."""
    griffe = pytest.importorskip("griffe", reason="griffe comes with the docs extra (pip install -e '.[docs]')")
    package = griffe.load("jaxfn", search_paths=[str(ROOT)], docstring_parser="google")
    objects = _api_objects()
    assert {path for _, path, _ in objects} >= {f"jaxfn.{name}" for name in __import__("jaxfn").__all__}
    problems = []
    for page, path, filters in objects:
        top = package[path.split(".", 1)[1]]
        members = [top]
        if top.is_class:
            members += [m for name, m in top.members.items() if _shown(name, filters) and m.docstring is not None]
        for obj in members:
            where = f"api/{page}: {obj.path}"
            text = obj.docstring.value if obj.docstring else ""
            if REST_LEFTOVERS.search(text):
                problems.append(f"{where}: reStructuredText in the docstring: {REST_LEFTOVERS.search(text).group(0)!r}")
            if not obj.is_function:
                continue
            documented = {
                item.name.lstrip("*")
                for section in obj.docstring.parsed
                if section.kind.value == "parameters"
                for item in section.value
            }
            for parameter in obj.parameters:
                if parameter.name not in ("self", "cls") and parameter.name not in documented:
                    problems.append(f"{where}: parameter {parameter.name!r} is not in its Args")
    assert not problems, "\n".join(problems)


def test_the_api_reference_reads_as_rendered_markdown(tmp_path):
    """The built API pages show no reStructuredText markup and none of jaxfn's internals."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs or mkdocstrings is not installed (pip install -e '.[docs]')")
    import html

    done = build_site(tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    pages = sorted((tmp_path / "site" / "api").glob("*/index.html"))
    assert len(pages) == len(list((DOCS / "api").glob("*.md")))
    for page in pages:
        article = re.search(r"<article\b.*?</article>", page.read_text(), re.DOTALL)
        assert article, f"{page}: no <article>"
        text = html.unescape(re.sub(r"<[^>]+>", "", article.group(0)))
        name = page.parent.name
        assert ":::" not in text, f"api/{name}: a mkdocstrings directive was left as text"
        leftover = REST_LEFTOVERS.search(text)
        assert not leftover, f"api/{name}: reStructuredText shown literally: {leftover.group(0)!r}"
        for internal in INTERNALS:
            assert internal not in text, f"api/{name}: the internal method {internal} is listed"
        assert "Usage template:" not in text or name == "autograd_function"
    reference = (tmp_path / "site" / "api" / "autograd_function" / "index.html").read_text()
    assert re.search(r"Usage template:</p>\s*<div class=\"[^\"]*highlight\"", reference), "the template is not code"
    for parameter in ("jvp", "vmap"):
        row = rf"<td>\s*<code>{parameter}</code>\s*</td>"
        assert re.search(row, reference), f"{parameter} is not in the Parameters table"


GALLERY_PAGES = sorted(p for p in (DOCS / "gallery").glob("*.md") if p.name != "index.md")


@pytest.mark.parametrize("path", GALLERY_PAGES, ids=_id)
def test_every_gallery_page_opens_with_its_function_included_from_its_script(path):
    """A gallery page shows the code its script measures, included so that it can't drift: its
    first code block includes a section of ``examples/gallery/<page name>.py`` that exists there
    (one start and one end marker) and builds a jaxfn function; the page names the script."""
    script = f"examples/gallery/{path.stem.replace('-', '_')}.py"
    assert (ROOT / script).is_file(), f"{_id(path)}: no script {script}"
    text = path.read_text()
    assert f"`{script}`" in text, f"{_id(path)}: the page does not name its script {script}"
    first_block = re.search(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert first_block, f"{_id(path)}: no python block"
    specs = [m.group(2) for line in first_block.group(1).splitlines() if (m := SNIPPET.match(line))]
    assert specs and all(spec.startswith(f"{script}:") for spec in specs), (
        f'{_id(path)}: the first block should include --8<-- "{script}:<section>", found {specs}'
    )
    code = "\n".join(line for spec in specs for line in included(spec))
    builds = "jaxfn.autograd_function(" in code or "(jaxfn.Function):" in code
    assert builds, f"{_id(path)}: the included section builds no jaxfn function"


def test_a_snippet_section_is_what_lies_between_its_markers(tmp_path, monkeypatch):
    source = tmp_path / "x.py"
    lines = ["a = 0", "# --8<-- [start:f]", "b = 1", "# --8<-- [start:g]", "c = 2"]
    lines += ["# --8<-- [end:g]", "# --8<-- [end:f]"]
    source.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert included("x.py:f") == ["b = 1", "c = 2"]
    assert included("x.py:g") == ["c = 2"]
    assert included("x.py") == ["a = 0", "b = 1", "c = 2"]
    with pytest.raises(AssertionError, match="section 'h' needs one start and one end marker, found 0"):
        included("x.py:h")


# What a user does not have: the project's contract file and its seed examples (internal documents)
INTERNAL_CITATIONS = re.compile(r"\bSPEC\b|(?i:\bthe spec\b|\bseeds\b)")


@pytest.mark.parametrize(
    "path", [*_pages(), ROOT / "README.md"], ids=lambda p: p.name if p.name == "README.md" else _id(p)
)
def test_no_user_page_cites_internal_documents(path):
    """A page says the rule itself, never "SPEC section 4", "the spec is silent" or "the seeds'"."""
    text = "\n".join(_page_lines(path)) if path.suffix == ".md" and path.name != "README.md" else path.read_text()
    found = [
        f"line {number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if INTERNAL_CITATIONS.search(line)
    ]
    assert not found, f"{path.name} cites documents users do not have:\n" + "\n".join(found)
