"""The built site, read as a reader reads it: served over HTTP and opened in headless Chromium.

The site is built into a temporary folder, served by ``python -m http.server`` on 127.0.0.1 (a free
port the server picks itself), and each page is opened by Debian's Chromium (``--headless
--dump-dom``: the page's DOM after it has loaded, scripts run). Every wait is bounded, the server
and the browser are always stopped, and the browser's profile and home stay in the temporary
folder. Skipped, saying why, where Chromium or mkdocs is missing.

Layout is measured the same way: a copy of a page, beside it in the built site, ends with a script
that, once the page has loaded in a 1280 px wide window, writes each code block's and table's
widths (``scrollWidth`` against ``clientWidth``) into the DOM that Chromium dumps.
"""

import html.parser
import importlib.util
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from test_docs import build_site

ROOT = Path(__file__).resolve().parent.parent
NAV = [
    "Getting started",
    "Porting from R torch",
    "Porting from PyTorch",
    "Guarantees",
    "Eager calls and jit=True",
    "Forward mode",
    "gradcheck",
    "Host functions",
    "Named saves and anomaly detection",
    "Inside Equinox, Flax and Optax",
    "Multi-process and shard_map",
    "Performance",
    "Gallery",
    "Known limits",
    "FAQ and troubleshooting",
    "API reference",
    "Changelog",
]


class _Page(html.parser.HTMLParser):
    """The primary navigation's entries, the images, and the text of a page's DOM."""

    def __init__(self):
        super().__init__()
        self.nav, self.images, self.text = [], [], []
        self._stack = []  # (tag, in primary nav, is a nav entry)
        self._entry = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        in_nav = bool(self._stack and self._stack[-1][1]) or "md-nav--primary" in classes
        entry = in_nav and "md-nav__link" in classes
        if tag == "img":
            self.images.append(attrs)
            return
        if tag in ("br", "hr", "input", "meta", "link", "source", "wbr"):
            return
        if entry and self._entry is None:
            self._entry = []
        self._stack.append((tag, in_nav, entry))

    def handle_endtag(self, tag):
        while self._stack:
            open_tag, _, entry = self._stack.pop()
            if entry and self._entry is not None:
                self.nav.append(" ".join("".join(self._entry).split()))
                self._entry = None
            if open_tag == tag:
                break

    def handle_data(self, data):
        self.text.append(data)
        if self._entry is not None:
            self._entry.append(data)


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(base URL, the server's request log) of the built site, served while the tests run."""
    if _chromium() is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); .ci/run installs it")
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs or mkdocstrings is not installed (pip install -e '.[docs]')")
    tmp = tmp_path_factory.mktemp("site")
    built = build_site(tmp / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    log = tmp / "server.log"
    with open(log, "wb") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(tmp / "site")],
            stdout=subprocess.PIPE,
            stderr=log_file,
            start_new_session=True,
        )
    try:
        with selectors.DefaultSelector() as selector:  # "Serving HTTP on 127.0.0.1 port N ...", within 30 s
            selector.register(server.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=30), "the HTTP server did not start within 30 s"
        line = server.stdout.readline().decode()
        port = re.search(r"port (\d+)", line)
        assert port, f"the HTTP server said {line!r}"
        yield f"http://127.0.0.1:{port.group(1)}/", log, tmp / "site"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        server.stdout.close()


def _open(url, tmp_path, window=None):
    """The page's DOM as headless Chromium has it once the page has loaded (``page.dom``: as text),
    in a window of ``window`` (width, height) pixels where given."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
    }
    browser = subprocess.Popen(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            f"--user-data-dir={home / 'profile'}",
            f"--crash-dumps-dir={home / 'crashes'}",
            *([f"--window-size={window[0]},{window[1]}"] if window else []),
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        dom, errors = browser.communicate(timeout=120)
    finally:
        if browser.poll() is None:
            os.killpg(browser.pid, signal.SIGKILL)
            browser.communicate(timeout=10)
    assert browser.returncode == 0, errors.decode(errors="replace")[-2000:]
    page = _Page()
    page.dom = dom.decode()
    page.feed(page.dom)
    return page


@pytest.mark.slow
def test_the_navigation_lists_the_pages(site, tmp_path):
    base, _, _ = site
    page = _open(base, tmp_path)
    assert "Getting started" in " ".join(page.text)
    missing = [title for title in NAV if title not in page.nav]
    assert not missing, f"not in the navigation: {missing}; it lists {page.nav}"
    for title in ("1. Linear + cross-entropy", "8. Transformer block", "autograd_function", "shard_map"):
        assert title in page.nav


@pytest.mark.slow
def test_the_api_page_of_autograd_function_shows_its_signature(site, tmp_path):
    base, _, _ = site
    text = " ".join("".join(_open(base + "api/autograd_function/", tmp_path).text).split())
    backward = (
        r"backward: \(? ?Callable\[\.\.\., Any\] \| Literal\[['\"]finite_differences['\"]\] ?\)?,"  # black wraps it
    )
    found = re.search(r"autograd_function\( forward: Callable\[\.\.\., Any\], " + backward, text)
    assert found, text[text.find("autograd_function( forward") :][:300]
    for parameter in ("forward_mode: bool = False", "host: bool = False", "jit: bool = False", "-> AutogradFunction"):
        assert parameter in text


@pytest.mark.slow
@pytest.mark.parametrize(
    "page, image",
    [
        ("gallery/linear-cross-entropy/", "linear_cross_entropy_memory.png"),
        ("gallery/transformer-block/", "transformer_block.png"),
    ],
)
def test_a_gallery_page_shows_its_plot(site, tmp_path, page, image):
    base, log, _ = site
    images = [img for img in _open(base + page, tmp_path).images if img.get("src", "").endswith(image)]
    assert images, f"no <img> of {image} on {page}"
    assert images[0].get("alt"), "the plot has no alt text"
    url = urllib.parse.urljoin(base + page, images[0]["src"])
    path = urllib.parse.urlparse(url).path
    assert f'"GET {path} HTTP/1.1" 200' in log.read_text(), f"the browser did not load {path} (status 200)"
    with urllib.request.urlopen(url, timeout=30) as response:  # and it is the PNG
        assert response.status == 200
        assert response.headers["Content-Type"] == "image/png"
        assert response.read(8) == b"\x89PNG\r\n\x1a\n"


# Run in the page once it has loaded: every code block's and table's widths, and the page's, written
# into the DOM as JSON (<pre id="jaxfn-layout">) for --dump-dom to carry out.
_MEASURE = """
<script>
window.addEventListener("load", function () {
  setTimeout(function () {
    function wide(el) { return el.scrollWidth > el.clientWidth + 1; }
    var column = document.querySelector(".md-content__inner").getBoundingClientRect();
    var report = {blocks: [], tables: [], column: [column.left, column.right]};
    document.querySelectorAll(".md-typeset pre > code").forEach(function (code) {
      report.blocks.push({text: code.textContent.slice(0, 60), scroll: code.scrollWidth,
                          client: code.clientWidth, overflows: wide(code) || wide(code.parentElement)});
    });
    document.querySelectorAll(".md-typeset table").forEach(function (table) {
      var box = table.closest(".md-typeset__scrollwrap") || table.parentElement;
      var right = table.getBoundingClientRect().right;
      report.tables.push({text: table.textContent.trim().slice(0, 60), scroll: box.scrollWidth,
                          client: box.clientWidth, overflows: wide(box) || wide(table) || right > column.right + 1});
    });
    report.page = {scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth};
    var out = document.createElement("pre");
    out.id = "jaxfn-layout";
    out.textContent = JSON.stringify(report);
    document.body.appendChild(out);
  }, 50);
});
</script>
"""


def _layout(site, page, tmp_path, width=1280):
    """The widths ``_MEASURE`` reports for ``page`` (a folder of the site: "", "faq/") in a window
    ``width`` pixels wide: a copy of the page with the script appended is opened beside it."""
    base, _, root = site
    source = root / page / "index.html"
    copy = root / page / "_layout.html"
    copy.write_text(source.read_text().replace("</body>", _MEASURE + "</body>", 1))
    try:
        dom = _open(base + page + "_layout.html", tmp_path, window=(width, 900)).dom
    finally:
        copy.unlink()
    found = re.search(r'<pre id="jaxfn-layout">(.*?)</pre>', dom, re.DOTALL)
    assert found, f"the layout script did not report on {page or 'the home page'} (did the page load?)"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "page, blocks",
    [("", 5), ("faq/", 20), ("api/autograd_function/", 2), ("api/gradcheck/", 2), ("performance/", 1)],
    ids=["home", "faq", "api-autograd_function", "api-gradcheck", "performance-tables"],
)
def test_no_code_block_or_table_overflows_at_1280_px(site, tmp_path, page, blocks):
    """Long lines wrap (docs/stylesheets/extra.css) or are short: no code block scrolls sideways,
    no table is wider than the text column, and the page itself is not wider than the window."""
    layout = _layout(site, page, tmp_path)
    page = page or "the home page"
    assert len(layout["blocks"]) >= blocks, f"{page}: found {len(layout['blocks'])} code blocks, expected {blocks}"
    wide = [b for b in layout["blocks"] if b["overflows"]]
    assert not wide, f"{page}: {len(wide)} of {len(layout['blocks'])} code blocks overflow: {wide}"
    wide = [t for t in layout["tables"] if t["overflows"]]
    assert not wide, f"{page}: {len(wide)} of {len(layout['tables'])} tables overflow: {wide}"
    assert layout["page"]["scroll"] <= layout["page"]["client"], f"{page}: the page scrolls sideways: {layout['page']}"
