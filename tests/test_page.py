"""The chat page `serve` answers at GET /, used in a real headless Chromium (the system's
package, driven by playwright): a message sent, the reply streamed with its tokens shaded by
origin and its statistics shown, an error shown for a bad schema, a long prompt's reading shown
while the reply waits for it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.server import fixture_server_args, running_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = Path(os.environ.get("SPRINTER_EDGE_SHOTS", tempfile.gettempdir()))  # screenshots, to look at
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def page_server(fixture_target_path: Path, fixture_draft_path: Path, tmp_path_factory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("page") / "server.log"
    args = fixture_server_args(fixture_target_path, fixture_draft_path, 24)
    with running_server([a if a != "sd" else "auto" for a in args], log) as base:
        yield base


def test_the_page_is_served_whole(page_server: str) -> None:
    r = httpx.get(page_server + "/", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "__METHODS__" not in html and '"lookup"' in html  # the methods filled in
    assert "http://" not in html and "https://" not in html  # nothing fetched from elsewhere


@contextlib.contextmanager
def ready_page(page_server: str) -> Iterator[Any]:
    """The chat page in the system's chromium, once it says the server is ready."""
    from playwright import sync_api

    if CHROMIUM is None:
        pytest.fail("the system's chromium is missing: apt-get install chromium (.ci/run installs it)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = browser.new_page()
            page.goto(page_server + "/")
            page.wait_for_function("document.getElementById('status').textContent.includes('ready')",
                                   timeout=120_000)
            yield page
        finally:
            browser.close()


@pytest.mark.slow
def test_chat_in_a_browser(page_server: str, tmp_path: Path) -> None:
    with ready_page(page_server) as page:
        page.select_option("#method", "lookup")
        page.fill("#prompt", "Repeat after me: one two three four five six seven eight.")
        page.click("#send")
        reply = page.locator(".msg.assistant").last
        reply.locator(".stats").filter(has_text="tok/s").wait_for(timeout=120_000)
        spans = reply.locator(".text span")
        assert spans.count() > 0
        origins = set(spans.evaluate_all("els => els.map(e => e.dataset.origin)"))
        assert origins <= {"target", "bonus", "resampled", "accepted", "copied", "guided", "forced"}
        assert "target" in origins or "bonus" in origins
        stats = reply.locator(".stats").inner_text()
        assert "lookup" in stats and "plain decoding" in stats  # speed-up from the cost table
        page.screenshot(path=str(SHOTS / "reply.png"))

        page.fill("#schema", '{"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}')
        page.fill("#prompt", "Give me a JSON object.")
        page.click("#send")
        error = page.locator(".msg.assistant").last.locator(".text.error")
        error.wait_for(timeout=60_000)
        page.screenshot(path=str(SHOTS / "error.png"))
        assert "response_format" in error.inner_text()


@pytest.mark.slow
def test_the_page_shows_the_prompt_read(page_server: str) -> None:
    """A long prompt: the reply's line says "reading the prompt N/M" until the reply comes (every
    text the line was given is recorded, however fast the read)."""
    with ready_page(page_server) as page:
        page.evaluate("""() => {
            window.statsSeen = [];
            new MutationObserver((records) => {
              for (const r of records) {
                if (!r.target.classList || !r.target.classList.contains("stats")) continue;
                for (const n of r.addedNodes) {
                  if (n.nodeType === Node.TEXT_NODE) window.statsSeen.push(n.data);
                }
              }
            }).observe(document.getElementById("log"), { childList: true, subtree: true });
        }""")
        page.select_option("#method", "ar")
        page.fill("#max-tokens", "4")
        page.fill("#prompt", "Page: " + " ".join(str(i) for i in range(160)))  # over n_batch tokens
        page.click("#send")
        reply = page.locator(".msg.assistant").last
        reply.locator(".stats").filter(has_text="tok/s").wait_for(timeout=120_000)
        seen = page.evaluate("window.statsSeen")
        reads = [s for s in seen if s.startswith("reading the prompt ")]
        assert len(reads) >= 3, seen
        done, total = reads[-1].removeprefix("reading the prompt ").split()[0].split("/")
        assert int(done) == int(total) > 512
        assert "reading the prompt" not in reply.locator(".stats").inner_text()
