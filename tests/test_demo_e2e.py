"""The demo in a real browser: `wedlm-hf demo` in a subprocess on a free loopback port, serving the embedded
checkpoint, driven by Playwright in headless Debian Chromium with every request off the machine blocked (the page
must work offline).

Screenshots go to pytest's temporary folder only; `scripts/demo_screenshot.py` refreshes the ones in docs/. Skips
only when Playwright, Gradio or the browser is missing (`.ci/install_browser.sh` installs them).
"""

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
from local_server import free_port
from test_demo_logic import save_tiny_checkpoint
from patience import PATIENCE_S

import wedlm_hf
from wedlm_hf.demo.engine import load_generation_config
from wedlm_hf.demo.logic import EXAMPLES, checkpoint_defaults

REPO = Path(__file__).resolve().parents[1]
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
NEW_CODE = next(example for example in EXAMPLES if example.label.startswith("New Python code"))
VERDICT = re.compile(r"WeDLM x(\d+\.\d\d) vs AR \(tokens/s\) · (\d+\.\d\d) tokens/forward · (.+)")
LOOPBACK = {"127.0.0.1", "localhost"}
PATIENCE_MS = PATIENCE_S * 1000

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (.ci/install_browser.sh)")
pytest.importorskip("gradio", reason="gradio is not installed (.ci/install_browser.sh)")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no browser at {CHROMIUM} (.ci/install_browser.sh installs it)", allow_module_level=True)



def _wait_until_serving(server: subprocess.Popen, url: str, timeout: float = PATIENCE_S) -> None:
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
def demo_url():
    checkpoint = wedlm_hf.DEFAULT_MODEL
    port = free_port()
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
    page.locator("#run").wait_for(timeout=PATIENCE_MS)
    yield page
    context.close()


def _text(page, selector: str) -> str:
    return page.locator(selector).inner_text()


def test_lossless_toggle_makes_both_sides_agree(page):
    page.locator("#lossless input[type=checkbox]").check()
    _run(page, NEW_CODE.prompt)  # code diverges without lossless (above)
    wedlm = page.locator("#wedlm-output textarea").input_value()
    assert wedlm and wedlm == page.locator("#ar-output textarea").input_value()
    assert _text(page, "#verdict").endswith("identical to AR")


def test_empty_prompt_gives_a_message_not_a_traceback(page):
    page.locator("#prompt textarea").fill("   ")
    page.locator("#run").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Type a prompt first", timeout=PATIENCE_MS)
    assert "Traceback" not in page.content()


def _run(page, prompt: str | None = None) -> None:
    """Click Generate (after typing `prompt`, if given) and wait for this run, not the last one, to be done."""
    if prompt is not None:
        page.locator("#prompt textarea").fill(prompt)
    page.locator("#run").click()
    sync_api.expect(page.locator("#status")).not_to_contain_text("Done", timeout=PATIENCE_MS)
    sync_api.expect(page.locator("#status")).to_contain_text("Done", timeout=PATIENCE_MS)


def test_page_says_what_wedlm_is_and_starts_from_the_checkpoint_defaults(page):
    assert page.locator('a[href="https://arxiv.org/abs/2512.22737"]').count() == 1
    assert "3.5M-parameter toy" in page.locator("body").inner_text()
    values, note = checkpoint_defaults(load_generation_config(wedlm_hf.DEFAULT_MODEL))
    for name, value in values.items():
        shown = page.locator(f"#slider-{name.replace('_', '-')} input[type=number]").input_value()
        assert float(shown) == pytest.approx(value), name
    assert values["entropy_threshold"] == 1.0 and values["pos_penalty_factor"] == 0.05  # not the library's 0.4 / 0.02
    assert _text(page, "#defaults") == note


def test_choosing_another_model_resets_the_sliders_to_its_defaults(page, tmp_path):
    tiny = save_tiny_checkpoint(tmp_path / "tiny")  # its generation config sets no WeDLM knobs
    model = page.locator("#model input")
    model.fill(str(tiny))
    model.press("Enter")
    sync_api.expect(page.locator("#defaults")).to_contain_text("library defaults", timeout=PATIENCE_MS)
    threshold = page.locator("#slider-entropy-threshold input[type=number]")
    sync_api.expect(threshold).to_have_value("0.4")
    assert page.locator("#slider-pos-penalty-factor input[type=number]").input_value() == "0.02"


def test_counting_prompt_decodes_in_parallel_identically_to_ar(page, tmp_path):
    page.locator("#examples").get_by_text(EXAMPLES[0].label).click()
    sync_api.expect(page.locator("#prompt textarea")).to_have_value(EXAMPLES[0].prompt)
    _run(page)
    wedlm_stats = _text(page, "#wedlm-stats")
    per_forward = float(re.search(r"([\d.]+) tokens/forward", wedlm_stats).group(1))
    assert per_forward > 1, wedlm_stats
    assert re.search(r"1\.00 tokens/forward", _text(page, "#ar-stats"))
    assert page.locator("#wedlm-output textarea").input_value() == page.locator("#ar-output textarea").input_value()
    verdict = VERDICT.search(_text(page, "#verdict"))
    assert verdict, _text(page, "#verdict")
    assert float(verdict[1]) > 0 and float(verdict[2]) == per_forward and verdict[3] == "identical to AR"
    assert page.locator("#step-view .wd-commit").count() > 0  # the step view rendered its grid
    assert page.locator("#step-view .wd-tok").count() > 0
    assert page.blocked == []  # nothing on the page reaches for the internet
    page.screenshot(path=str(tmp_path / "counting.png"), full_page=True)


def test_code_run_reports_where_it_diverges_and_its_step_view_fits_the_page(page, tmp_path):
    page.locator("#examples").get_by_text(NEW_CODE.label).click()
    _run(page)
    verdict = VERDICT.search(_text(page, "#verdict"))
    assert verdict and re.fullmatch(r"diverges from AR at token \d+", verdict[3]), _text(page, "#verdict")
    wedlm = page.locator("#wedlm-output textarea").input_value()
    ar = page.locator("#ar-output textarea").input_value()
    assert wedlm != ar
    box = page.locator("#step-view")
    for selector in ("#step-view", "#step-view .wd-bands", "#step-view .wd-line"):
        scroll, client = page.locator(selector).evaluate("e => [e.scrollWidth, e.clientWidth]")
        assert scroll <= client + 1, (selector, scroll, client)  # wrapped inside its box, no horizontal scrolling
    assert box.locator(".wd-band-title").count() >= 2  # 64 tokens of code do not fit one band
    page.screenshot(path=str(tmp_path / "code.png"), full_page=True)


def test_a_new_or_invalid_run_clears_the_last_output(page):
    _run(page, COUNTING_PROMPT)
    assert _text(page, "#verdict") and page.locator("#step-view .wd-tok").count() > 0
    page.locator("#prompt textarea").fill("  ")
    page.locator("#run").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Type a prompt first", timeout=PATIENCE_MS)
    for selector in ("#wedlm-output textarea", "#ar-output textarea"):
        assert page.locator(selector).input_value() == ""
    for selector in ("#wedlm-stats", "#ar-stats", "#verdict", "#step-view"):
        assert _text(page, selector).strip() == "", selector


def test_bad_model_gives_a_message(page, tmp_path):
    model = page.locator("#model input")
    model.fill(str(tmp_path / "no-such-model"))
    model.press("Enter")
    page.locator("#run").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Could not load model", timeout=PATIENCE_MS)
    assert "Traceback" not in page.content()


def test_stop_cancels_a_long_generation(page):
    for slider, value in (("max-new-tokens", "256"), ("entropy-threshold", "0")):  # 256 forwards on each side
        number = page.locator(f"#slider-{slider} input[type=number]")
        number.fill(value)
        number.press("Enter")
    page.locator("#run").click()
    sync_api.expect(page.locator("#wedlm-stats")).to_contain_text("running", timeout=PATIENCE_MS)
    page.locator("#stop").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Stopped", timeout=PATIENCE_MS)
    assert "256 tokens" not in _text(page, "#ar-stats")
    page.locator("#prompt textarea").fill("1, 2,")  # the queue is free again: the next run finishes
    page.locator("#run").click()
    sync_api.expect(page.locator("#status")).to_contain_text("Done", timeout=PATIENCE_MS)
