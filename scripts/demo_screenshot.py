"""Regenerate the demo's screenshots in docs/: the page after a counting run (docs/demo.png) and after a code run
(docs/demo-code.png), on the embedded checkpoint, in headless Chromium with every off-machine request blocked.

    python scripts/demo_screenshot.py [--out docs] [--model PATH_OR_ID]

Needs the demo extra, Playwright and /usr/bin/chromium (`.ci/install_browser.sh`). The tests never write into the
repository; this script is how the committed screenshots are refreshed. It prints each run's verdict line.
"""

import argparse
import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from wedlm_hf.demo.app import build_app, launch  # noqa: E402
from wedlm_hf.demo.logic import EXAMPLES  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
SHOTS = {"demo.png": EXAMPLES[0], "demo-code.png": EXAMPLES[2]}
"""File name -> the example prompt run before the screenshot: counting, and Python code from the training data."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    parser.add_argument("--model", default=None, help="model preselected in the page (default: the embedded one)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"no browser at {CHROMIUM}: run .ci/install_browser.sh", file=sys.stderr)
        return 1
    port = _free_port()
    app = build_app(args.model)
    launch(app, "127.0.0.1", port, block=False)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.route(
                "**/*",
                lambda route: route.continue_()
                if urlparse(route.request.url).hostname in ("127.0.0.1", "localhost")
                else route.abort(),
            )
            page.goto(f"http://127.0.0.1:{port}/")
            for name, example in SHOTS.items():
                page.locator("#examples").get_by_text(example.label).click()
                expect(page.locator("#prompt textarea")).to_have_value(example.prompt)
                page.locator("#run").click()
                expect(page.locator("#status")).not_to_contain_text("Done", timeout=10_000)  # the earlier run's
                expect(page.locator("#status")).to_contain_text("Done", timeout=120_000)
                expect(page.locator("#verdict")).to_contain_text("vs AR", timeout=10_000)
                page.screenshot(path=str(args.out / name), full_page=True)
                print(f"{args.out / name}: {page.locator('#verdict').inner_text()}")
            browser.close()
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
