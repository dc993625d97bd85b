"""The built site, read as a reader reads it: served over HTTP and opened in headless Chromium.

The site is built into a temporary folder, served by ``python -m http.server`` on 127.0.0.1 (a free
port the server picks itself), and each page is opened by Debian's Chromium (``--headless
--dump-dom``: the page's DOM after it has loaded, scripts run). Every wait is bounded, the server
and the browser are always stopped, and the browser's profile and home stay in the temporary
folder. Skipped, saying why, where Chromium or mkdocs is missing.
"""

import html.parser
import importlib.util
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
        yield f"http://127.0.0.1:{port.group(1)}/", log
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        server.stdout.close()


def _open(url, tmp_path):
    """The page's DOM as headless Chromium has it once the page has loaded."""
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
    page.feed(dom.decode())
    return page


@pytest.mark.slow
def test_the_navigation_lists_the_pages(site, tmp_path):
    base, _ = site
    page = _open(base, tmp_path)
    assert "Getting started" in " ".join(page.text)
    missing = [title for title in NAV if title not in page.nav]
    assert not missing, f"not in the navigation: {missing}; it lists {page.nav}"
    for title in ("1. Linear + cross-entropy", "8. Transformer block", "autograd_function", "shard_map"):
        assert title in page.nav


@pytest.mark.slow
def test_the_api_page_of_autograd_function_shows_its_signature(site, tmp_path):
    base, _ = site
    text = " ".join("".join(_open(base + "api/autograd_function/", tmp_path).text).split())
    assert re.search(r"autograd_function\( forward: Callable\[\.\.\., Any\], backward: Callable\[\.\.\., Any\],", text)
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
    base, log = site
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
