"""The demo in a real browser: `wedlm-hf demo` in a subprocess on a free loopback port, driven by Playwright in
headless Debian Chromium with every request off the machine blocked (the page must work offline).

Uses the embedded checkpoint once it exists, else a tiny random WeDLM model with a peaky head. Saves the page to
docs/demo.png. Skips only when Playwright, Gradio or the browser is missing (`.ci/install_browser.sh` installs them).
"""

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
from test_demo_logic import save_tiny_checkpoint

import wedlm_hf

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "docs" / "demo.png"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
COUNTING_PROMPT = "1, 2, 3, 4, 5, 6, 7, 8,"
LOOPBACK = {"127.0.0.1", "localhost"}

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (.ci/install_browser.sh)")
pytest.importorskip("gradio", reason="gradio is not installed (.ci/install_browser.sh)")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no browser at {CHROMIUM} (.ci/install_browser.sh installs it)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_serving(server: subprocess.Popen, url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the demo exited with {server.returncode}:\n{server.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the demo did not answer at {url} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def demo_url(tmp_path_factory):
    embedded = Path(wedlm_hf.DEFAULT_MODEL)
    if (embedded / "config.json").exists():
        checkpoint = embedded
    else:
        checkpoint = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-wedlm"))
    port = _free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "wedlm_hf.cli", "demo", "--model", str(checkpoint), "--port", str(port)]
    server = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_until_serving(server, url)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, demo_url):
    """A fresh page of the demo with every request that leaves the machine aborted (and listed in `page.blocked`)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    blocked: list[str] = []

    def offline(route):
        if urlparse(route.request.url).hostname in LOOPBACK:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", offline)
    page = context.new_page()
    page.blocked = blocked
    page.goto(demo_url)
    page.locator("#run").wait_for(timeout=30_000)
    yield page
    context.close()


def _text(page, selector: str) -> str:
    return page.locator(selector).inner_text()


def test_lossless_toggle_makes_both_sides_agree(page):
    page.locator("#prompt textarea").fill(COUNTING_PROMPT)
    page.locator("#lossless input[type=checkbox]").check()
    page.locator("#run").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Done", timeout=60_000)
    wedlm = page.locator("#wedlm-output textarea").input_value()
    assert wedlm and wedlm == page.locator("#ar-output textarea").input_value()
    page.locator("#lossless input[type=checkbox]").uncheck()


def test_empty_prompt_gives_a_message_not_a_traceback(page):
    page.locator("#prompt textarea").fill("   ")
    page.locator("#run").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Type a prompt first", timeout=20_000)
    assert "Traceback" not in page.content()


def test_counting_prompt_decodes_in_parallel(page):
    page.locator("#prompt textarea").fill(COUNTING_PROMPT)
    page.locator("#run").click()
    for side in ("#wedlm-stats", "#ar-stats"):
        sync_api.expect(page.locator(side)).to_contain_text("tokens/forward", timeout=60_000)
    sync_api.expect(page.locator("#status")).to_contain_text("Done", timeout=10_000)

    wedlm_stats = _text(page, "#wedlm-stats")
    per_forward = float(re.search(r"([\d.]+) tokens/forward", wedlm_stats).group(1))
    assert per_forward > 1, wedlm_stats
    assert re.search(r"1\.00 tokens/forward", _text(page, "#ar-stats"))
    assert page.locator("#wedlm-output textarea").input_value()
    assert page.locator("#ar-output textarea").input_value()
    assert page.locator("#step-view .wd-commit").count() > 0  # the step view rendered its grid
    assert page.locator("#step-view .wd-tok").count() > 0
    SCREENSHOT.parent.mkdir(exist_ok=True)
    assert page.blocked == []  # nothing on the page reaches for the internet
    page.screenshot(path=str(SCREENSHOT), full_page=True)


def test_bad_model_gives_a_message(page, tmp_path):
    model = page.locator("#model input")
    model.fill(str(tmp_path / "no-such-model"))
    model.press("Enter")
    page.locator("#run").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Could not load model", timeout=20_000)
    assert "Traceback" not in page.content()


def test_stop_cancels_a_long_generation(page):
    for slider, value in (("max-new-tokens", "256"), ("entropy-threshold", "0")):  # 256 forwards on each side
        number = page.locator(f"#slider-{slider} input[type=number]")
        number.fill(value)
        number.press("Enter")
    page.locator("#run").click()
    sync_api.expect(page.locator("#wedlm-stats")).to_contain_text("running", timeout=20_000)
    page.locator("#stop").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Stopped", timeout=10_000)
    assert "256 tokens" not in _text(page, "#ar-stats")
    page.locator("#prompt textarea").fill("1, 2,")  # the queue is free again: the next run finishes
    page.locator("#run").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Done", timeout=60_000)
