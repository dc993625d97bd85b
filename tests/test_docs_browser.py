"""The built site, read as a reader reads it: served over HTTP and opened in headless Chromium.

The site is built into a temporary folder, served by ``python -m http.server`` on 127.0.0.1 (a free
port the server picks itself), and each page is opened by Debian's Chromium (``--headless
--dump-dom``: the page's DOM after it has loaded, scripts run). Every wait is bounded, the server
and the browser are always stopped, and the browser's profile and home stay in the temporary
folder. Skipped, saying why, where Chromium or mkdocs is missing.

Layout is measured the same way: a copy of a page, beside it in the built site, ends with a script
that, once the page has loaded in a window 1280 or 390 px wide, writes into the DOM that Chromium
dumps how many screen lines each code block takes against the lines it has, how many boxes each
table cell's code takes, and the page's widths.
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
    "From PyTorch, line by line",
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
    for title in ("1. Linear + cross-entropy", "9. Three PyTorch ports", "autograd_function", "shard_map"):
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
        ("gallery/", "deq_fixed_point_memory.png"),
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


# Run in the page once it has loaded: how every code block and every table's code sits on the screen,
# written into the DOM as JSON (<pre id="jaxfn-layout">) for --dump-dom to carry out. A code block
# wraps when its text occupies more screen lines than it has lines (a Range's boxes, one top per
# screen line); a table cell's code is split when its inline box has more than one rectangle.
_MEASURE = """
<script>
window.addEventListener("load", function () {
  setTimeout(function () {
    function lines(code) {
      var range = document.createRange();
      range.selectNodeContents(code);
      var tops = {};
      Array.prototype.forEach.call(range.getClientRects(), function (r) {
        if (r.height > 0 && r.width > 0) { tops[Math.round(r.top)] = true; }
      });
      return Object.keys(tops).length;
    }
    var report = {blocks: [], cells: []};
    document.querySelectorAll(".md-typeset pre > code").forEach(function (code) {
      var text = code.textContent.replace(/\\n$/, "");
      report.blocks.push({text: text.slice(0, 60), lines: text.split("\\n").length, shown: lines(code),
                          whiteSpace: getComputedStyle(code).whiteSpace});
    });
    document.querySelectorAll(".md-typeset table code").forEach(function (code) {
      report.cells.push({text: code.textContent.slice(0, 60), rects: code.getClientRects().length});
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
    """What ``_MEASURE`` reports for ``page`` (a folder of the site: "", "faq/") in a window
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


# pages whose code blocks and tables are checked, with the fewest code blocks and table code each has
LAYOUT_PAGES = [
    ("", 5, 10),
    ("from-pytorch-line-by-line/", 10, 60),
    ("porting-pytorch/", 5, 40),
    ("faq/", 20, 0),
    ("gallery/", 1, 3),
    ("gallery/pytorch-ports/", 6, 0),
    ("performance/", 1, 0),
    ("api/autograd_function/", 2, 0),
]


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("page, blocks, cells", LAYOUT_PAGES, ids=[p.strip("/") or "home" for p, *_ in LAYOUT_PAGES])
def test_code_never_wraps_and_table_cells_never_split_an_identifier(site, tmp_path, page, blocks, cells, width):
    """docs/stylesheets/extra.css: a code block keeps its lines (a long one scrolls sideways inside
    the block), code in a table cell stays on one line (a wide table scrolls inside its box), and
    the page itself never scrolls sideways; at a desktop width and a phone's."""
    layout = _layout(site, page, tmp_path, width)
    page = f"{page or 'the home page'} at {width} px"
    assert len(layout["blocks"]) >= blocks, f"{page}: found {len(layout['blocks'])} code blocks, expected {blocks}"
    assert len(layout["cells"]) >= cells, f"{page}: found {len(layout['cells'])} code cells, expected {cells}"
    wrapped = [b for b in layout["blocks"] if b["whiteSpace"] != "pre" or b["shown"] > b["lines"]]
    assert not wrapped, f"{page}: {len(wrapped)} of {len(layout['blocks'])} code blocks wrap: {wrapped[:3]}"
    split = [c for c in layout["cells"] if c["rects"] != 1]
    assert not split, f"{page}: {len(split)} of {len(layout['cells'])} table cells split their code: {split[:5]}"
    assert layout["page"]["scroll"] <= layout["page"]["client"], f"{page}: the page scrolls sideways: {layout['page']}"
